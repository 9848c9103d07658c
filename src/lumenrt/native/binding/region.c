/* lumenrt.native._core.Region: a block of memory that the other types are built in.
 *
 * Ownership: a Region owns its mapping, one of
 *   - anonymous shared (Region.anonymous): our mmap, shared with children forked later;
 *   - a named POSIX shm segment (create_shm / attach_shm): r->shm's mapping; the creator owns the
 *     name and unlinks it on close, an attacher only unmaps (lrt/shm.h);
 *   - a file descriptor such as a memfd (map_fd): our mmap; the descriptor stays the caller's,
 *     who keeps or closes it.
 *
 * Invariants
 *   1. data != NULL exactly while the mapping is live; region_release_memory() unmaps once and
 *      sets data = NULL, so close() then dealloc never unmap twice.
 *   2. exports counts live buffer exports (memoryviews, and the export that every Ring, SlabPool,
 *      BumpArena, Latches and Notifier holds). close() refuses with BufferError while exports > 0,
 *      as mmap does, so memory is never unmapped under a live user.
 *   3. Every export holds a reference to the Region (PyBuffer_FillInfo), so tp_dealloc only runs
 *      with exports == 0.
 */
#include <sys/mman.h>

#include "internal.h"

typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t size;
    int is_shm;
    lrt_shm shm;
    Py_ssize_t exports;
    PyObject *weakreflist;
} RegionObject;

static PyObject *region_alloc(void) {
    RegionObject *r = PyObject_New(RegionObject, &lrtpy_region_type);
    if (!r) return NULL;
    r->data = NULL;
    r->size = 0;
    r->is_shm = 0;
    memset(&r->shm, 0, sizeof r->shm);
    r->exports = 0;
    r->weakreflist = NULL;
    return (PyObject *)r;
}

/* A Region over a new shared mapping of `size` bytes (fd -1: anonymous). */
static PyObject *region_map(Py_ssize_t size, int flags, int fd) {
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    RegionObject *r = (RegionObject *)region_alloc();
    if (!r) {
        munmap(p, (size_t)size);
        return NULL;
    }
    r->data = p;
    r->size = size;
    return (PyObject *)r;
}

static PyObject *region_anonymous(PyObject *cls, PyObject *arg) {
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (size <= 0) return PyErr_Format(PyExc_ValueError, "size must be > 0, got %zd", size);
    return region_map(size, MAP_SHARED | MAP_ANONYMOUS, -1);
}

static PyObject *region_shm(PyObject *args, int create) {
    const char *name;
    Py_ssize_t size = 0;
    if (create ? !PyArg_ParseTuple(args, "sn", &name, &size) : !PyArg_ParseTuple(args, "s", &name)) return NULL;
    if (create && size <= 0) return PyErr_Format(PyExc_ValueError, "size must be > 0, got %zd", size);
    RegionObject *r = (RegionObject *)region_alloc();
    if (!r) return NULL;
    int rc = create ? lrt_shm_create(name, (uint64_t)size, &r->shm) : lrt_shm_attach(name, &r->shm);
    if (rc != LRT_OK) {
        Py_DECREF(r);
        if (rc == LRT_EINVAL)
            return PyErr_Format(PyExc_ValueError, "shm name %R: 1-%d characters of [A-Za-z0-9._-]",
                                PyTuple_GET_ITEM(args, 0), LRT_SHM_NAME_MAX);
        return lrtpy_raise_rc(rc, create ? "create shared memory" : "attach shared memory");
    }
    r->is_shm = 1;
    r->data = r->shm.data;
    r->size = (Py_ssize_t)r->shm.data_bytes;
    return (PyObject *)r;
}

/* map_fd(fd, size): a shared mapping of an open descriptor (a memfd that worker processes receive at
 * spawn). Nothing is named, so nothing needs unlinking after a crash: the memory goes with the last
 * mapping and descriptor. The descriptor stays the caller's. */
static PyObject *region_map_fd(PyObject *cls, PyObject *args) {
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "in", &fd, &size)) return NULL;
    if (size <= 0) return PyErr_Format(PyExc_ValueError, "size must be > 0, got %zd", size);
    return region_map(size, MAP_SHARED, fd);
}

static PyObject *region_create_shm(PyObject *cls, PyObject *args) { return region_shm(args, 1); }
static PyObject *region_attach_shm(PyObject *cls, PyObject *args) { return region_shm(args, 0); }

static void region_release_memory(RegionObject *r) {
    if (!r->data) return;
    if (r->is_shm) lrt_shm_close(&r->shm);
    else munmap(r->data, (size_t)r->size);
    r->data = NULL;
}

static PyObject *region_close(RegionObject *self, PyObject *unused) {
    if (self->exports > 0)
        return PyErr_Format(PyExc_BufferError, "cannot close a Region with %zd live views/users", self->exports);
    region_release_memory(self);
    Py_RETURN_NONE;
}

static void region_dealloc(RegionObject *self) {
    if (self->weakreflist) PyObject_ClearWeakRefs((PyObject *)self);
    region_release_memory(self);
    PyObject_Free(self);
}

static int region_getbuffer(RegionObject *self, Py_buffer *view, int flags) {
    if (!self->data) {
        PyErr_SetString(PyExc_ValueError, "Region is closed");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 0, flags) < 0) return -1;
    self->exports++;
    return 0;
}

static void region_releasebuffer(RegionObject *self, Py_buffer *view) { self->exports--; }

static PyBufferProcs region_as_buffer = {(getbufferproc)region_getbuffer, (releasebufferproc)region_releasebuffer};

static PyObject *region_get_name(RegionObject *self, void *c) {
    if (!self->is_shm) Py_RETURN_NONE;
    return PyUnicode_FromString(self->shm.name);
}
static PyObject *region_get_size(RegionObject *self, void *c) { return PyLong_FromSsize_t(self->size); }
static PyObject *region_get_owner(RegionObject *self, void *c) { return PyBool_FromLong(!self->is_shm || self->shm.owner); }
static PyObject *region_get_closed(RegionObject *self, void *c) { return PyBool_FromLong(self->data == NULL); }
static PyObject *region_get_address(RegionObject *self, void *c) { return PyLong_FromVoidPtr(self->data); }

static PyGetSetDef region_getset[] = {
    {"name", (getter)region_get_name, NULL, "shm segment name, or None for an anonymous region", NULL},
    {"size", (getter)region_get_size, NULL, "usable bytes", NULL},
    {"owner", (getter)region_get_owner, NULL, "True if closing this Region unlinks the segment", NULL},
    {"closed", (getter)region_get_closed, NULL, "True once closed", NULL},
    {"address", (getter)region_get_address, NULL, "address of the first byte in this process", NULL},
    {NULL}};

static PyMethodDef region_methods[] = {
    {"anonymous", (PyCFunction)region_anonymous, METH_O | METH_CLASS,
     "anonymous(size) -> Region: zeroed memory shared with children forked later"},
    {"create_shm", (PyCFunction)region_create_shm, METH_VARARGS | METH_CLASS,
     "create_shm(name, size) -> Region: create a named POSIX shared-memory segment (this process owns it)"},
    {"map_fd", (PyCFunction)region_map_fd, METH_VARARGS | METH_CLASS,
     "map_fd(fd, size) -> Region: a shared mapping of an open descriptor (e.g. a memfd); the descriptor stays yours"},
    {"attach_shm", (PyCFunction)region_attach_shm, METH_VARARGS | METH_CLASS,
     "attach_shm(name) -> Region: map a segment created by another process (never unlinks it)"},
    {"close", (PyCFunction)region_close, METH_NOARGS,
     "Unmap; the owner of a shm segment also unlinks it. BufferError while views exist."},
    {NULL}};

PyTypeObject lrtpy_region_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Region",
    .tp_basicsize = sizeof(RegionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A block of memory (anonymous shared mapping or named shm segment) exporting the buffer protocol.",
    .tp_dealloc = (destructor)region_dealloc,
    .tp_as_buffer = &region_as_buffer,
    .tp_methods = region_methods,
    .tp_getset = region_getset,
    .tp_weaklistoffset = offsetof(RegionObject, weakreflist),
};

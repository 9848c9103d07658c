/* lumenrt.native._core: the thin CPython binding over the native core (native/).
 *
 * Ownership: a Region owns its mapping (anonymous shared, a named shm segment, or a file descriptor
 * such as a memfd: map_fd maps it, and the caller keeps or closes the descriptor) and
 * exports it through the buffer protocol; every Ring/SlabPool/BumpArena/Notifier holds a buffer
 * export of its Region, so the memory cannot be unmapped while they exist (Region.close() raises
 * BufferError then, as mmap does). The lrt_* handles are freed in tp_dealloc.
 *
 * Hot calls (try_push, try_pop, push/pop that need not wait) never release the GIL and allocate
 * only the result object. Calls that must wait release the GIL and sleep on the futex with exactly
 * the caller's timeout (untimed sleeps are cheaper, see ring.h); the handles are interruptible, so a
 * signal ends the sleep with LRT_EINTR, the binding runs Python's handlers (Ctrl-C raises
 * KeyboardInterrupt) and goes back to waiting until the deadline.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include "lrt/lrt.h"


static PyObject *LrtError, *RingClosed, *PoolExhausted;

static PyObject *raise_rc(int rc, const char *what) {
    if (rc == LRT_CLOSED) return PyErr_Format(RingClosed, "%s: ring is closed", what);
    if (rc == LRT_EXHAUSTED) return PyErr_Format(PoolExhausted, "%s: %s", what, lrt_strerror(rc));
    if (rc == LRT_ESYS) {
        int e = errno;
        return PyErr_Format(LrtError, "%s: %s (%s)", what, lrt_strerror(rc), strerror(e));
    }
    if (rc == LRT_EINVAL) return PyErr_Format(PyExc_ValueError, "%s: %s", what, lrt_strerror(rc));
    if (rc == LRT_ENOENT) return PyErr_Format(PyExc_FileNotFoundError, "%s: %s", what, lrt_strerror(rc));
    if (rc == LRT_EEXIST) return PyErr_Format(PyExc_FileExistsError, "%s: %s", what, lrt_strerror(rc));
    return PyErr_Format(LrtError, "%s: %s", what, lrt_strerror(rc));
}

/* Tiny FASTCALL argument parser: positional then keyword, by name. */
static int parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
                 int n_names, int n_required, PyObject **out, const char *fname) {
    for (int i = 0; i < n_names; i++) out[i] = NULL;
    if (nargs > n_names) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n_names, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            int found = 0;
            for (int i = 0; i < n_names; i++) {
                if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                    if (out[i]) {
                        PyErr_Format(PyExc_TypeError, "%s() got multiple values for '%s'", fname, names[i]);
                        return -1;
                    }
                    out[i] = args[nargs + k];
                    found = 1;
                    break;
                }
            }
            if (!found) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
                return -1;
            }
        }
    }
    for (int i = 0; i < n_required; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

static int as_u64(PyObject *o, uint64_t *v, const char *field) {
    if (!o) return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(o);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", field);
        return -1;
    }
    *v = x;
    return 0;
}

static int as_u32(PyObject *o, uint32_t *v, const char *field) {
    uint64_t x = 0;
    if (!o) return 0;
    if (as_u64(o, &x, field) < 0 || x > UINT32_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**32)", field);
        return -1;
    }
    *v = (uint32_t)x;
    return 0;
}

/* timeout_s: None = forever (-1), number >= 0 seconds. */
static int as_timeout_ns(PyObject *o, int64_t *ns) {
    if (!o || o == Py_None) {
        *ns = -1;
        return 0;
    }
    double s = PyFloat_AsDouble(o);
    if (s == -1.0 && PyErr_Occurred()) return -1;
    if (!(s >= 0)) {
        PyErr_SetString(PyExc_ValueError, "timeout_s must be >= 0 or None");
        return -1;
    }
    *ns = s > 9e9 ? -1 : (int64_t)(s * 1e9);
    return 0;
}

/* ================================ Item ===================================================== */

typedef struct {
    PyObject_HEAD
    lrt_desc d;
} ItemObject;

static PyTypeObject ItemType;

static PyObject *item_new(const lrt_desc *d) {
    ItemObject *it = PyObject_New(ItemObject, &ItemType);
    if (it) it->d = *d;
    return (PyObject *)it;
}

#define ITEM_GET(name, expr)                                                                   \
    static PyObject *item_get_##name(ItemObject *self, void *c) { return PyLong_FromUnsignedLongLong(expr); }
ITEM_GET(request_id, self->d.request_id)
ITEM_GET(slot, self->d.slot)
ITEM_GET(nbytes, self->d.nbytes)
ITEM_GET(t_ns, self->d.t_ns)
ITEM_GET(aux0, self->d.aux[0])
ITEM_GET(aux1, self->d.aux[1])
ITEM_GET(aux2, self->d.aux[2])
ITEM_GET(kind, self->d.kind)
ITEM_GET(flags, self->d.flags)

static PyGetSetDef item_getset[] = {
    {"request_id", (getter)item_get_request_id, NULL, "caller's request id", NULL},
    {"slot", (getter)item_get_slot, NULL, "arena slot index", NULL},
    {"nbytes", (getter)item_get_nbytes, NULL, "payload size in bytes", NULL},
    {"t_ns", (getter)item_get_t_ns, NULL, "timestamp (CLOCK_MONOTONIC ns) set by the producer", NULL},
    {"aux0", (getter)item_get_aux0, NULL, "free word", NULL},
    {"aux1", (getter)item_get_aux1, NULL, "free word", NULL},
    {"aux2", (getter)item_get_aux2, NULL, "free word", NULL},
    {"kind", (getter)item_get_kind, NULL, "message kind", NULL},
    {"flags", (getter)item_get_flags, NULL, "flags (bit 31 reserved)", NULL},
    {NULL}};

static PyObject *item_repr(ItemObject *self) {
    return PyUnicode_FromFormat("Item(request_id=%llu, slot=%u, nbytes=%u, t_ns=%llu, aux0=%llu, kind=%u)",
                                (unsigned long long)self->d.request_id, self->d.slot, self->d.nbytes,
                                (unsigned long long)self->d.t_ns, (unsigned long long)self->d.aux[0],
                                self->d.kind);
}

static PyObject *item_richcompare(PyObject *a, PyObject *b, int op) {
    if (!PyObject_TypeCheck(b, &ItemType) || (op != Py_EQ && op != Py_NE)) Py_RETURN_NOTIMPLEMENTED;
    int eq = memcmp(&((ItemObject *)a)->d, &((ItemObject *)b)->d, sizeof(lrt_desc)) == 0;
    if (op == Py_NE) eq = !eq;
    return PyBool_FromLong(eq);
}

static PyTypeObject ItemType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Item",
    .tp_basicsize = sizeof(ItemObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A descriptor popped from a ring (56 bytes; fields are converted on access).",
    .tp_getset = item_getset,
    .tp_repr = (reprfunc)item_repr,
    .tp_richcompare = item_richcompare,
};

/* ================================ Region =================================================== */

typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t size;
    int is_shm;
    lrt_shm shm;
    Py_ssize_t exports;
    PyObject *weakreflist;
} RegionObject;

static PyTypeObject RegionType;

static PyObject *region_alloc(void) {
    RegionObject *r = PyObject_New(RegionObject, &RegionType);
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
        return raise_rc(rc, create ? "create shared memory" : "attach shared memory");
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

static PyTypeObject RegionType = {
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

/* A writable, 64-byte-aligned window [offset, offset+need) of any buffer exporter. */
static int get_window(PyObject *buf, Py_ssize_t offset, Py_buffer *view, char **base, size_t *avail) {
    if (PyObject_GetBuffer(buf, view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) return -1;
    if (offset < 0 || offset >= view->len) {
        PyErr_Format(PyExc_ValueError, "offset %zd outside the buffer of %zd bytes", offset, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    *base = (char *)view->buf + offset;
    *avail = (size_t)(view->len - offset);
    if ((uintptr_t)*base % LRT_CACHELINE) {
        PyErr_Format(PyExc_ValueError, "offset %zd: memory must be %u-byte aligned", offset, LRT_CACHELINE);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ================================ Ring ===================================================== */

typedef struct {
    PyObject_HEAD
    lrt_ring *r;
    Py_buffer view;
    PyObject *kind_name;
} RingObject;

static PyTypeObject RingType;

static PyObject *ring_wrap(lrt_ring *r, Py_buffer *view) {
    RingObject *o = PyObject_New(RingObject, &RingType);
    if (!o) {
        lrt_ring_free(r);
        PyBuffer_Release(view);
        return NULL;
    }
    o->r = r;
    lrt_ring_set_interruptible(r, 1);
    o->view = *view;
    o->kind_name = PyUnicode_FromString(lrt_ring_kind_name(lrt_ring_get_kind(r)));
    if (!o->kind_name) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

static PyObject *ring_create(PyObject *cls, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "kind", "capacity", "offset", "shared", "spin_iters", "yield_iters", NULL};
    PyObject *buf;
    const char *kind;
    unsigned long long capacity;
    Py_ssize_t offset = 0;
    int shared = 1, spin = -1, yield = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsK|npii", kwlist, &buf, &kind, &capacity, &offset, &shared,
                                     &spin, &yield))
        return NULL;
    int k = lrt_ring_kind_from_name(kind);
    if (k < 0) return PyErr_Format(PyExc_ValueError, "kind '%s': expected one of mpmc, spsc, naive, batched", kind);
    if (capacity < 2 || (capacity & (capacity - 1)) || capacity > (1ull << 32))
        return PyErr_Format(PyExc_ValueError, "capacity %llu: must be a power of two in [2, 2**32]", capacity);
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    if (avail < lrt_ring_required_bytes(capacity)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "buffer: a ring of capacity %llu needs %zu bytes, %zu available",
                            capacity, lrt_ring_required_bytes(capacity), avail);
    }
    lrt_ring_config cfg = {.kind = (uint32_t)k, .flags = shared ? LRT_RING_PSHARED : 0, .capacity = capacity,
                           .spin_iters = spin, .yield_iters = yield};
    lrt_ring *r;
    int rc = lrt_ring_create(base, avail, &cfg, &r);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return raise_rc(rc, "Ring.create");
    }
    return ring_wrap(r, &view);
}

static PyObject *ring_attach(PyObject *cls, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "offset", NULL};
    PyObject *buf;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|n", kwlist, &buf, &offset)) return NULL;
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    lrt_ring *r;
    int rc = lrt_ring_attach(base, avail, &r);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return raise_rc(rc, "Ring.attach");
    }
    return ring_wrap(r, &view);
}

static void ring_dealloc(RingObject *self) {
    lrt_ring_free(self->r);
    PyBuffer_Release(&self->view);
    Py_XDECREF(self->kind_name);
    PyObject_Free(self);
}

static const char *const PUSH_NAMES[] = {"request_id", "slot", "nbytes", "t_ns", "aux0",
                                         "aux1",       "aux2", "kind",   "timeout_s"};
#define N_DESC_ARGS 8

static int desc_from_args(PyObject **a, lrt_desc *d) {
    memset(d, 0, sizeof *d);
    if (as_u64(a[0], &d->request_id, "request_id") < 0 || as_u32(a[1], &d->slot, "slot") < 0 ||
        as_u32(a[2], &d->nbytes, "nbytes") < 0 || as_u64(a[3], &d->t_ns, "t_ns") < 0 ||
        as_u64(a[4], &d->aux[0], "aux0") < 0 || as_u64(a[5], &d->aux[1], "aux1") < 0 ||
        as_u64(a[6], &d->aux[2], "aux2") < 0 || as_u32(a[7], &d->kind, "kind") < 0)
        return -1;
    return 0;
}

static PyObject *ring_try_push(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[N_DESC_ARGS];
    lrt_desc d;
    if (parse(args, nargs, kwnames, PUSH_NAMES, N_DESC_ARGS, 1, a, "try_push") < 0 || desc_from_args(a, &d) < 0)
        return NULL;
    int rc = lrt_ring_try_push(self->r, &d);
    if (rc == LRT_OK) Py_RETURN_TRUE;
    if (rc == LRT_FULL) Py_RETURN_FALSE;
    return raise_rc(rc, "try_push");
}

/* Wait with the GIL released; after a signal, run Python's handlers and wait for the rest of the
 * time. Returns an lrt status, or `error_rc` with a Python exception set. */
typedef int (*wait_fn)(RingObject *, void *, int64_t);

static int wait_released(RingObject *self, wait_fn fn, void *arg, int64_t timeout_ns, int error_rc) {
    uint64_t deadline = timeout_ns < 0 ? UINT64_MAX : lrt_now_ns() + (uint64_t)timeout_ns;
    for (;;) {
        int64_t left = -1;
        if (deadline != UINT64_MAX) {
            uint64_t now = lrt_now_ns();
            if (now >= deadline) return LRT_TIMEOUT;
            left = (int64_t)(deadline - now);
        }
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = fn(self, arg, left);
        Py_END_ALLOW_THREADS
        if (rc != LRT_EINTR) return rc;
        if (PyErr_CheckSignals() < 0) return error_rc; /* e.g. KeyboardInterrupt */
    }
}

static int push_fn(RingObject *self, void *arg, int64_t ns) { return lrt_ring_push(self->r, arg, ns); }

static PyObject *ring_push(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[N_DESC_ARGS + 1];
    lrt_desc d;
    int64_t timeout_ns;
    if (parse(args, nargs, kwnames, PUSH_NAMES, N_DESC_ARGS + 1, 1, a, "push") < 0 || desc_from_args(a, &d) < 0 ||
        as_timeout_ns(a[N_DESC_ARGS], &timeout_ns) < 0)
        return NULL;
    int rc = lrt_ring_try_push(self->r, &d);
    if (rc == LRT_FULL && timeout_ns != 0) {
        rc = wait_released(self, push_fn, &d, timeout_ns, 1);
        if (rc == 1) return NULL;
    }
    if (rc == LRT_OK) Py_RETURN_TRUE;
    if (rc == LRT_FULL || rc == LRT_TIMEOUT) Py_RETURN_FALSE;
    return raise_rc(rc, "push");
}

static PyObject *ring_try_pop(RingObject *self, PyObject *unused) {
    lrt_desc d;
    int rc = lrt_ring_try_pop(self->r, &d);
    if (rc == LRT_OK) return item_new(&d);
    if (rc == LRT_EMPTY) Py_RETURN_NONE;
    return raise_rc(rc, "try_pop");
}

static int pop_fn(RingObject *self, void *arg, int64_t ns) { return lrt_ring_pop(self->r, arg, ns); }

static const char *const POP_NAMES[] = {"timeout_s"};

static PyObject *ring_pop(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[1];
    int64_t timeout_ns;
    if (parse(args, nargs, kwnames, POP_NAMES, 1, 0, a, "pop") < 0 || as_timeout_ns(a[0], &timeout_ns) < 0)
        return NULL;
    lrt_desc d;
    int rc = lrt_ring_try_pop(self->r, &d);
    if (rc == LRT_EMPTY && timeout_ns != 0) {
        rc = wait_released(self, pop_fn, &d, timeout_ns, 1);
        if (rc == 1) return NULL;
    }
    if (rc == LRT_OK) return item_new(&d);
    if (rc == LRT_EMPTY || rc == LRT_TIMEOUT) Py_RETURN_NONE;
    return raise_rc(rc, "pop");
}

#define POP_CHUNK 64
typedef struct {
    lrt_desc *out;
    int max_n;
    int got;
} pop_many_arg;

static int pop_many_fn(RingObject *self, void *arg, int64_t ns) {
    pop_many_arg *p = arg;
    int n = lrt_ring_pop_many(self->r, p->out, p->max_n, ns);
    if (n > 0) {
        p->got = n;
        return LRT_OK;
    }
    return n;
}

static const char *const POP_MANY_NAMES[] = {"max_n", "timeout_s", "latches", "signal"};

/* Completions to deliver before a pop: latch indices taken out of a Python list. */
#define SIGNAL_CHUNK 256
typedef struct {
    lrt_latch *at[SIGNAL_CHUNK];
    int n;
    int pshared;
} signal_batch;

static int signal_collect(PyObject *latches, PyObject *signal, signal_batch *b);
static void signal_deliver(signal_batch *b) {
    for (int i = 0; i < b->n; i++) lrt_latch_set(b->at[i], b->pshared);
    b->n = 0;
}

typedef struct {
    pop_many_arg pop;
    signal_batch *signals;
} pop_signal_arg;

/* First call with the GIL released: set the latches, then take or wait. Waking the callers only
 * now, when this thread no longer holds the GIL, lets them run at once instead of sleeping on the
 * GIL until this worker blocks. */
static int pop_signal_fn(RingObject *self, void *arg, int64_t ns) {
    pop_signal_arg *p = arg;
    if (p->signals->n) signal_deliver(p->signals);
    return pop_many_fn(self, &p->pop, ns);
}

static PyObject *ring_pop_many(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[4];
    int64_t timeout_ns;
    if (parse(args, nargs, kwnames, POP_MANY_NAMES, 4, 1, a, "pop_many") < 0 || as_timeout_ns(a[1], &timeout_ns) < 0)
        return NULL;
    Py_ssize_t max_n = PyLong_AsSsize_t(a[0]);
    if (max_n == -1 && PyErr_Occurred()) return NULL;
    if (max_n <= 0) return PyErr_Format(PyExc_ValueError, "max_n must be > 0, got %zd", max_n);
    lrt_desc buf[POP_CHUNK];
    int first = max_n < POP_CHUNK ? (int)max_n : POP_CHUNK;
    int n;
    PyObject *signal = (a[3] && a[3] != Py_None) ? a[3] : NULL;
    if (signal && PyList_GET_SIZE(signal) > 0) {
        signal_batch sb;
        if (signal_collect(a[2], signal, &sb) < 0) return NULL;
        pop_signal_arg p = {{buf, first, 0}, &sb};
        int rc;
        if (timeout_ns == 0) {
            Py_BEGIN_ALLOW_THREADS rc = pop_signal_fn(self, &p, 0);
            Py_END_ALLOW_THREADS
        } else {
            rc = wait_released(self, pop_signal_fn, &p, timeout_ns, 1);
            if (sb.n) { /* not delivered: the wait ended before the first attempt (a signal) */
                signal_deliver(&sb);
            }
            if (rc == 1) return NULL;
        }
        n = rc == LRT_OK ? p.pop.got : rc;
    } else {
        n = lrt_ring_pop_many(self->r, buf, first, 0);
        if (n == LRT_EMPTY && timeout_ns != 0) {
            pop_many_arg p = {buf, first, 0};
            int rc = wait_released(self, pop_many_fn, &p, timeout_ns, 1);
            if (rc == 1) return NULL;
            n = rc == LRT_OK ? p.got : rc;
        }
    }
    if (n == LRT_EMPTY || n == LRT_TIMEOUT) return PyList_New(0);
    if (n < 0) return raise_rc(n, "pop_many");
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (;;) {
        for (int i = 0; i < n; i++) {
            PyObject *it = item_new(&buf[i]);
            if (!it || PyList_Append(list, it) < 0) {
                Py_XDECREF(it);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(it);
        }
        Py_ssize_t left = max_n - PyList_GET_SIZE(list);
        if (left <= 0 || n < first) break;
        first = left < POP_CHUNK ? (int)left : POP_CHUNK;
        n = lrt_ring_pop_many(self->r, buf, first, 0);
        if (n <= 0) break;
    }
    return list;
}

typedef struct {
    lrt_desc *out;
    int max_n;
    int got;
    lrt_hold *hold;
} pop_hold_arg;

static int pop_hold_fn(RingObject *self, void *arg, int64_t ns) {
    pop_hold_arg *p = arg;
    int n = lrt_ring_pop_many_hold(self->r, p->out, p->max_n, ns, p->hold);
    if (n > 0) {
        p->got = n;
        return LRT_OK;
    }
    return n;
}

static const char *const POP_HOLD_NAMES[] = {"max_n", "hold", "hold_offset", "timeout_s"};

/* pop_many_hold(max_n, hold, hold_offset=0, timeout_s=None) -> (list[Item], first_position) */
static PyObject *ring_pop_many_hold(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[4];
    int64_t timeout_ns;
    if (parse(args, nargs, kwnames, POP_HOLD_NAMES, 4, 2, a, "pop_many_hold") < 0 || as_timeout_ns(a[3], &timeout_ns) < 0)
        return NULL;
    Py_ssize_t max_n = PyLong_AsSsize_t(a[0]);
    if (max_n == -1 && PyErr_Occurred()) return NULL;
    if (max_n <= 0 || max_n > POP_CHUNK) return PyErr_Format(PyExc_ValueError, "max_n must be in [1, %d]", POP_CHUNK);
    Py_ssize_t offset = a[2] ? PyLong_AsSsize_t(a[2]) : 0;
    if (offset == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(a[1], offset, &view, &base, &avail) < 0) return NULL;
    lrt_hold *hold = (lrt_hold *)base;
    if (avail < sizeof(lrt_hold) || hold->capacity == 0 || avail < lrt_hold_required_bytes(hold->capacity)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "hold: no initialised hold at offset %zd", offset);
    }
    lrt_desc buf[POP_CHUNK];
    uint32_t first_pos = hold->pos;
    pop_hold_arg p = {buf, (int)max_n, 0, hold};
    int rc = pop_hold_fn(self, &p, 0);
    if (rc == LRT_EMPTY && timeout_ns != 0) rc = wait_released(self, pop_hold_fn, &p, timeout_ns, 1);
    PyBuffer_Release(&view);
    if (rc == 1) return NULL;
    if (rc == LRT_EMPTY || rc == LRT_TIMEOUT) return Py_BuildValue("([]I)", first_pos);
    if (rc != LRT_OK) return raise_rc(rc, "pop_many_hold");
    PyObject *list = PyList_New(p.got);
    for (int i = 0; list && i < p.got; i++) {
        PyObject *it = item_new(&buf[i]);
        if (!it) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, it);
    }
    if (!list) return NULL;
    return Py_BuildValue("(NI)", list, first_pos);
}

static PyObject *ring_close(RingObject *self, PyObject *unused) {
    lrt_ring_close(self->r);
    Py_RETURN_NONE;
}

static PyObject *ring_recover(RingObject *self, PyObject *unused) {
    lrt_desc lost[LRT_MAX_AGENTS * 2];
    int n;
    Py_BEGIN_ALLOW_THREADS n = lrt_ring_recover(self->r, lost, LRT_MAX_AGENTS * 2);
    Py_END_ALLOW_THREADS
    if (n < 0) return raise_rc(n, "recover");
    if (n > LRT_MAX_AGENTS * 2) n = LRT_MAX_AGENTS * 2;
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *it = item_new(&lost[i]);
        if (!it) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, it);
    }
    return list;
}

static PyObject *ring_stats(RingObject *self, PyObject *unused) {
    lrt_ring_stats s;
    lrt_ring_get_stats(self->r, &s);
    return Py_BuildValue("{s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:I}", "kind", self->kind_name, "capacity",
                         s.capacity, "len", s.len, "pushed", s.pushed, "popped", s.popped, "futex_waits",
                         s.futex_waits, "futex_wakes", s.futex_wakes, "tombstones", s.tombstones, "released",
                         s.released, "closed", s.closed ? Py_True : Py_False, "agents", s.agents);
}

static Py_ssize_t ring_len(RingObject *self) { return (Py_ssize_t)lrt_ring_len(self->r); }
static PyObject *ring_get_capacity(RingObject *self, void *c) { return PyLong_FromUnsignedLongLong(lrt_ring_capacity(self->r)); }
static PyObject *ring_get_kind(RingObject *self, void *c) { return Py_NewRef(self->kind_name); }
static PyObject *ring_get_closed(RingObject *self, void *c) { return PyBool_FromLong(lrt_ring_is_closed(self->r)); }

static PyObject *ring_get_spin_ns(RingObject *self, void *c) { return PyLong_FromLongLong(lrt_ring_spin_ns(self->r)); }
static int ring_set_spin_ns(RingObject *self, PyObject *v, void *c) {
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "spin_ns cannot be deleted");
        return -1;
    }
    long long ns = PyLong_AsLongLong(v);
    if (ns == -1 && PyErr_Occurred()) return -1;
    if (ns < 0) {
        PyErr_Format(PyExc_ValueError, "spin_ns must be >= 0, got %lld", ns);
        return -1;
    }
    lrt_ring_set_spin_ns(self->r, ns);
    return 0;
}

static PyObject *ring_push_wait(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

static PyMethodDef ring_methods[] = {
    {"create", (PyCFunction)(void (*)(void))ring_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "create(buffer, kind, capacity, offset=0, shared=True, spin_iters=-1, yield_iters=-1) -> Ring\n"
     "Initialise a ring of `kind` (mpmc, spsc, naive, batched) in buffer[offset:]."},
    {"attach", (PyCFunction)(void (*)(void))ring_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(buffer, offset=0) -> Ring: use a ring created in buffer[offset:] (possibly by another process)."},
    {"try_push", (PyCFunction)(void (*)(void))ring_try_push, METH_FASTCALL | METH_KEYWORDS,
     "try_push(request_id, slot=0, nbytes=0, t_ns=0, aux0=0, aux1=0, aux2=0, kind=0) -> bool: False if full."},
    {"push", (PyCFunction)(void (*)(void))ring_push, METH_FASTCALL | METH_KEYWORDS,
     "push(request_id, slot=0, nbytes=0, t_ns=0, aux0=0, aux1=0, aux2=0, kind=0, timeout_s=None) -> bool"},
    {"try_pop", (PyCFunction)ring_try_pop, METH_NOARGS, "try_pop() -> Item | None. RingClosed once closed and drained."},
    {"pop", (PyCFunction)(void (*)(void))ring_pop, METH_FASTCALL | METH_KEYWORDS,
     "pop(timeout_s=None) -> Item | None (None on timeout). RingClosed once closed and drained."},
    {"pop_many", (PyCFunction)(void (*)(void))ring_pop_many, METH_FASTCALL | METH_KEYWORDS,
     "pop_many(max_n, timeout_s=None, latches=None, signal=None) -> list[Item]: wait for one, then take up to\n"
     "max_n available ([] on timeout). `signal`: a list of latch indices to set (then emptied) once the GIL is\n"
     "released, before taking: a worker completes its last batch as it goes back to wait."},
    {"push_wait", (PyCFunction)(void (*)(void))ring_push_wait, METH_FASTCALL | METH_KEYWORDS,
     "push_wait(request_id, slot=0, nbytes=0, t_ns=0, aux0=0, aux1=0, aux2=0, kind=0, *, latches, latch,\n"
     "spin_ns=0) -> bool\n"
     "With the GIL released: try to push once (False at once if full), then wait for latches[latch] to be set\n"
     "(spinning up to spin_ns, then sleeping). A signal handler that raises leaves the request in flight."},
    {"pop_many_hold", (PyCFunction)(void (*)(void))ring_pop_many_hold, METH_FASTCALL | METH_KEYWORDS,
     "pop_many_hold(max_n, hold, hold_offset=0, timeout_s=None) -> (list[Item], first_position)\n"
     "pop_many that records each Item in the hold at hold[hold_offset:] before the ring lets it go."},
    {"close", (PyCFunction)ring_close, METH_NOARGS, "Refuse pushes, wake all waiters; pops drain what is left."},
    {"recover", (PyCFunction)ring_recover, METH_NOARGS,
     "Repair after dead processes; returns the Items that dead consumers had taken but not finished."},
    {"stats", (PyCFunction)ring_stats, METH_NOARGS, "Counters: len, pushed, popped, futex_waits, futex_wakes, ..."},
    {NULL}};

static PyGetSetDef ring_getset[] = {
    {"capacity", (getter)ring_get_capacity, NULL, "elements", NULL},
    {"kind", (getter)ring_get_kind, NULL, "mpmc, spsc, naive or batched", NULL},
    {"closed", (getter)ring_get_closed, NULL, "True once close() was called", NULL},
    {"spin_ns", (getter)ring_get_spin_ns, (setter)ring_set_spin_ns,
     "this handle's timed spin before a blocking call sleeps (ns; 0 = sleep at once)", NULL},
    {NULL}};

static PySequenceMethods ring_as_sequence = {.sq_length = (lenfunc)ring_len};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Ring",
    .tp_basicsize = sizeof(RingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bounded ring of descriptors in caller-given (possibly shared) memory.",
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_as_sequence = &ring_as_sequence,
};

/* ================================ SlabPool ================================================= */

typedef struct {
    PyObject_HEAD
    lrt_slab *s;
    Py_buffer view;
    Py_ssize_t offset; /* of the pool inside the buffer */
    PyObject *mv;      /* memoryview of the whole buffer, sliced by view() */
} SlabObject;

static PyTypeObject SlabType;

static PyObject *slab_wrap(PyObject *buf, lrt_slab *s, Py_buffer *view, Py_ssize_t offset) {
    SlabObject *o = PyObject_New(SlabObject, &SlabType);
    if (!o) {
        lrt_slab_free_handle(s);
        PyBuffer_Release(view);
        return NULL;
    }
    o->s = s;
    o->view = *view;
    o->offset = offset;
    o->mv = PyMemoryView_FromObject(buf);
    if (!o->mv) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

static PyObject *slab_create(PyObject *cls, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "slot_bytes", "n_slots", "offset", NULL};
    PyObject *buf;
    unsigned long long slot_bytes, n_slots;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OKK|n", kwlist, &buf, &slot_bytes, &n_slots, &offset)) return NULL;
    if (slot_bytes == 0 || n_slots == 0 || n_slots >= 0xffffffffull)
        return PyErr_Format(PyExc_ValueError, "slot_bytes and n_slots must be > 0 (n_slots < 2**32 - 1)");
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    size_t need = lrt_slab_required_bytes(slot_bytes, n_slots);
    if (avail < need) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "buffer: %llu slots of %llu bytes need %zu bytes, %zu available",
                            n_slots, slot_bytes, need, avail);
    }
    lrt_slab *s;
    int rc = lrt_slab_create(base, avail, slot_bytes, n_slots, &s);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return raise_rc(rc, "SlabPool.create");
    }
    return slab_wrap(buf, s, &view, offset);
}

static PyObject *slab_attach(PyObject *cls, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "offset", NULL};
    PyObject *buf;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|n", kwlist, &buf, &offset)) return NULL;
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    lrt_slab *s;
    int rc = lrt_slab_attach(base, avail, &s);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return raise_rc(rc, "SlabPool.attach");
    }
    return slab_wrap(buf, s, &view, offset);
}

static void slab_dealloc(SlabObject *self) {
    Py_XDECREF(self->mv);
    lrt_slab_free_handle(self->s);
    PyBuffer_Release(&self->view);
    PyObject_Free(self);
}

static PyObject *slab_try_alloc(SlabObject *self, PyObject *unused) {
    int64_t i = lrt_slab_alloc(self->s);
    if (i < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(i);
}

static PyObject *slab_alloc(SlabObject *self, PyObject *unused) {
    int64_t i = lrt_slab_alloc(self->s);
    if (i >= 0) return PyLong_FromLongLong(i);
    return PyErr_Format(PoolExhausted, "slab pool exhausted: all %llu slots of %llu bytes are in use",
                        (unsigned long long)lrt_slab_n_slots(self->s), (unsigned long long)lrt_slab_slot_bytes(self->s));
}

static int slab_index(SlabObject *self, PyObject *arg, int64_t *out) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0 || (uint64_t)i >= lrt_slab_n_slots(self->s)) {
        PyErr_Format(PyExc_IndexError, "slot %lld out of range [0, %llu)", i,
                     (unsigned long long)lrt_slab_n_slots(self->s));
        return -1;
    }
    *out = i;
    return 0;
}

static PyObject *slab_free(SlabObject *self, PyObject *arg) {
    int64_t i;
    if (slab_index(self, arg, &i) < 0) return NULL;
    int rc = lrt_slab_free(self->s, i);
    if (rc == LRT_EDOUBLEFREE) return PyErr_Format(PyExc_ValueError, "slot %lld is not allocated (double free?)", (long long)i);
    if (rc != LRT_OK) return raise_rc(rc, "free");
    Py_RETURN_NONE;
}

static PyObject *slab_offset_of(SlabObject *self, PyObject *arg) {
    int64_t i;
    if (slab_index(self, arg, &i) < 0) return NULL;
    return PyLong_FromUnsignedLongLong((uint64_t)self->offset + lrt_slab_offset(self->s, i));
}

static PyObject *slab_view(SlabObject *self, PyObject *arg) {
    int64_t i;
    if (slab_index(self, arg, &i) < 0) return NULL;
    Py_ssize_t start = self->offset + (Py_ssize_t)lrt_slab_offset(self->s, i);
    PyObject *lo = PyLong_FromSsize_t(start), *hi = PyLong_FromSsize_t(start + (Py_ssize_t)lrt_slab_slot_bytes(self->s));
    if (!lo || !hi) {
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        return NULL;
    }
    PyObject *sl = PySlice_New(lo, hi, NULL);
    Py_DECREF(lo);
    Py_DECREF(hi);
    if (!sl) return NULL;
    PyObject *v = PyObject_GetItem(self->mv, sl);
    Py_DECREF(sl);
    return v;
}

static PyObject *slab_stats(SlabObject *self, PyObject *unused) {
    lrt_slab_stats s;
    lrt_slab_get_stats(self->s, &s);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "slot_bytes", s.slot_bytes, "n_slots", s.n_slots,
                         "allocated", s.allocated, "freed", s.freed, "in_use", s.in_use, "high_water",
                         s.high_water, "exhausted", s.exhausted);
}

static PyObject *slab_get_slot_bytes(SlabObject *self, void *c) { return PyLong_FromUnsignedLongLong(lrt_slab_slot_bytes(self->s)); }
static PyObject *slab_get_n_slots(SlabObject *self, void *c) { return PyLong_FromUnsignedLongLong(lrt_slab_n_slots(self->s)); }

static PyMethodDef slab_methods[] = {
    {"create", (PyCFunction)(void (*)(void))slab_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "create(buffer, slot_bytes, n_slots, offset=0) -> SlabPool (slot_bytes rounded up to 64)"},
    {"attach", (PyCFunction)(void (*)(void))slab_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(buffer, offset=0) -> SlabPool created in buffer[offset:] (possibly by another process)"},
    {"try_alloc", (PyCFunction)slab_try_alloc, METH_NOARGS, "try_alloc() -> int | None (None when exhausted)"},
    {"alloc", (PyCFunction)slab_alloc, METH_NOARGS, "alloc() -> int; raises PoolExhausted at once when none is free"},
    {"free", (PyCFunction)slab_free, METH_O, "free(slot): ValueError on a double free"},
    {"offset_of", (PyCFunction)slab_offset_of, METH_O, "offset_of(slot) -> byte offset of the slot in the buffer"},
    {"view", (PyCFunction)slab_view, METH_O, "view(slot) -> writable memoryview of the slot (no copy)"},
    {"stats", (PyCFunction)slab_stats, METH_NOARGS, "allocated, freed, in_use, high_water, exhausted"},
    {NULL}};

static PyGetSetDef slab_getset[] = {
    {"slot_bytes", (getter)slab_get_slot_bytes, NULL, "bytes per slot (a multiple of 64)", NULL},
    {"n_slots", (getter)slab_get_n_slots, NULL, "number of slots", NULL},
    {NULL}};

static PyTypeObject SlabType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.SlabPool",
    .tp_basicsize = sizeof(SlabObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Fixed-size, cache-line-aligned slots with a lock-free free list, usable across processes.",
    .tp_dealloc = (destructor)slab_dealloc,
    .tp_methods = slab_methods,
    .tp_getset = slab_getset,
};

/* ================================ BumpArena ================================================ */

typedef struct {
    PyObject_HEAD
    lrt_bump *b;
    Py_buffer view;
    Py_ssize_t offset;
    PyObject *mv;
} BumpObject;

static PyTypeObject BumpType;

static PyObject *bump_wrap(PyObject *buf, lrt_bump *b, Py_buffer *view, Py_ssize_t offset) {
    BumpObject *o = PyObject_New(BumpObject, &BumpType);
    if (!o) {
        lrt_bump_free_handle(b);
        PyBuffer_Release(view);
        return NULL;
    }
    o->b = b;
    o->view = *view;
    o->offset = offset;
    o->mv = PyMemoryView_FromObject(buf);
    if (!o->mv) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

static PyObject *bump_create(PyObject *cls, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "capacity_bytes", "offset", NULL};
    PyObject *buf;
    unsigned long long cap;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OK|n", kwlist, &buf, &cap, &offset)) return NULL;
    if (cap == 0) return PyErr_Format(PyExc_ValueError, "capacity_bytes must be > 0");
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    if (avail < lrt_bump_required_bytes(cap)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "buffer: an arena of %llu bytes needs %zu bytes, %zu available", cap,
                            lrt_bump_required_bytes(cap), avail);
    }
    lrt_bump *b;
    int rc = lrt_bump_create(base, avail, cap, &b);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return raise_rc(rc, "BumpArena.create");
    }
    return bump_wrap(buf, b, &view, offset);
}

static PyObject *bump_attach(PyObject *cls, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "offset", NULL};
    PyObject *buf;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|n", kwlist, &buf, &offset)) return NULL;
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    lrt_bump *b;
    int rc = lrt_bump_attach(base, avail, &b);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return raise_rc(rc, "BumpArena.attach");
    }
    return bump_wrap(buf, b, &view, offset);
}

static void bump_dealloc(BumpObject *self) {
    Py_XDECREF(self->mv);
    lrt_bump_free_handle(self->b);
    PyBuffer_Release(&self->view);
    PyObject_Free(self);
}

static PyObject *bump_alloc(BumpObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"size", "align", NULL};
    unsigned long long size, align = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|K", kwlist, &size, &align)) return NULL;
    int64_t off = lrt_bump_alloc(self->b, size, align);
    if (off == LRT_EINVAL) return PyErr_Format(PyExc_ValueError, "align %llu: must be a power of two <= 4096", align);
    if (off < 0) {
        lrt_bump_stats s;
        lrt_bump_get_stats(self->b, &s);
        return PyErr_Format(PoolExhausted, "bump arena exhausted: %llu bytes asked, %llu of %llu used", size,
                            (unsigned long long)s.used_bytes, (unsigned long long)s.capacity_bytes);
    }
    return PyLong_FromLongLong(self->offset + off);
}

static PyObject *bump_reset(BumpObject *self, PyObject *unused) {
    lrt_bump_reset(self->b);
    Py_RETURN_NONE;
}

static PyObject *bump_stats(BumpObject *self, PyObject *unused) {
    lrt_bump_stats s;
    lrt_bump_get_stats(self->b, &s);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "capacity_bytes", s.capacity_bytes, "used_bytes", s.used_bytes,
                         "high_water_bytes", s.high_water_bytes, "allocations", s.allocations, "resets", s.resets,
                         "exhausted", s.exhausted);
}

static PyMethodDef bump_methods[] = {
    {"create", (PyCFunction)(void (*)(void))bump_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "create(buffer, capacity_bytes, offset=0) -> BumpArena"},
    {"attach", (PyCFunction)(void (*)(void))bump_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(buffer, offset=0) -> BumpArena"},
    {"alloc", (PyCFunction)(void (*)(void))bump_alloc, METH_VARARGS | METH_KEYWORDS,
     "alloc(size, align=64) -> byte offset in the buffer; PoolExhausted when it does not fit"},
    {"reset", (PyCFunction)bump_reset, METH_NOARGS, "Free everything at once (O(1))."},
    {"stats", (PyCFunction)bump_stats, METH_NOARGS, "capacity, used, high water, allocations, resets, exhausted"},
    {NULL}};

static PyTypeObject BumpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.BumpArena",
    .tp_basicsize = sizeof(BumpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A per-worker bump arena with O(1) reset (one allocating owner).",
    .tp_dealloc = (destructor)bump_dealloc,
    .tp_methods = bump_methods,
};

/* ================================ Latches ================================================== */

typedef struct {
    PyObject_HEAD
    char *base;
    Py_ssize_t n;
    int pshared;
    Py_buffer view;
} LatchesObject;

static PyTypeObject LatchesType;

static PyObject *latches_make(PyObject *args, PyObject *kw, int create) {
    static char *kwlist[] = {"buffer", "n", "offset", "shared", NULL};
    PyObject *buf;
    Py_ssize_t n, offset = 0;
    int shared = create ? 0 : 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "On|np", kwlist, &buf, &n, &offset, &shared)) return NULL;
    if (n <= 0 || n > (Py_ssize_t)UINT32_MAX) return PyErr_Format(PyExc_ValueError, "n must be in [1, 2**32), got %zd", n);
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    if (avail < lrt_latch_required_bytes((uint32_t)n)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "buffer: %zd latches need %zu bytes, %zu available", n,
                            lrt_latch_required_bytes((uint32_t)n), avail);
    }
    LatchesObject *o = PyObject_New(LatchesObject, &LatchesType);
    if (!o) {
        PyBuffer_Release(&view);
        return NULL;
    }
    o->base = base;
    o->n = n;
    o->pshared = shared;
    o->view = view;
    if (create)
        for (Py_ssize_t i = 0; i < n; i++) lrt_latch_reset(lrt_latch_at(base, (uint32_t)i));
    return (PyObject *)o;
}

static PyObject *latches_create(PyObject *cls, PyObject *args, PyObject *kw) { return latches_make(args, kw, 1); }
static PyObject *latches_attach(PyObject *cls, PyObject *args, PyObject *kw) { return latches_make(args, kw, 0); }

static void latches_dealloc(LatchesObject *self) {
    PyBuffer_Release(&self->view);
    PyObject_Free(self);
}

static lrt_latch *latch_of(LatchesObject *self, PyObject *index) {
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= self->n) {
        PyErr_Format(PyExc_IndexError, "latch %zd out of range [0, %zd)", i, self->n);
        return NULL;
    }
    return lrt_latch_at(self->base, (uint32_t)i);
}

static PyObject *latches_reset(LatchesObject *self, PyObject *index) {
    lrt_latch *l = latch_of(self, index);
    if (!l) return NULL;
    lrt_latch_reset(l);
    Py_RETURN_NONE;
}

static PyObject *latches_set(LatchesObject *self, PyObject *index) {
    lrt_latch *l = latch_of(self, index);
    if (!l) return NULL;
    return PyBool_FromLong(lrt_latch_set(l, self->pshared));
}

static PyObject *latches_is_set(LatchesObject *self, PyObject *index) {
    lrt_latch *l = latch_of(self, index);
    if (!l) return NULL;
    return PyBool_FromLong(lrt_latch_is_set(l));
}

/* Wait with the GIL released, running signal handlers between sleeps. 1 = set, 0 = timed out,
 * -1 = a handler raised. */
static int latch_wait_released(lrt_latch *l, int pshared, int64_t spin_ns, int64_t timeout_ns) {
    uint64_t deadline = timeout_ns < 0 ? UINT64_MAX : lrt_now_ns() + (uint64_t)timeout_ns;
    for (;;) {
        int64_t left = -1;
        if (deadline != UINT64_MAX) {
            uint64_t now = lrt_now_ns();
            left = now >= deadline ? 0 : (int64_t)(deadline - now);
        }
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = lrt_latch_wait(l, pshared, spin_ns, left);
        Py_END_ALLOW_THREADS
        if (rc == LRT_OK) return 1;
        if (rc == LRT_TIMEOUT) return 0;
        if (PyErr_CheckSignals() < 0) return -1;
    }
}

static int as_spin_ns(PyObject *o, int64_t *ns) {
    *ns = 0;
    if (!o) return 0;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "spin_ns must be >= 0, got %lld", v);
        return -1;
    }
    *ns = v;
    return 0;
}

static const char *const LATCH_WAIT_NAMES[] = {"index", "timeout_s", "spin_ns"};

static PyObject *latches_wait(LatchesObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[3];
    int64_t timeout_ns, spin_ns;
    if (parse(args, nargs, kwnames, LATCH_WAIT_NAMES, 3, 1, a, "wait") < 0 || as_timeout_ns(a[1], &timeout_ns) < 0 ||
        as_spin_ns(a[2], &spin_ns) < 0)
        return NULL;
    lrt_latch *l = latch_of(self, a[0]);
    if (!l) return NULL;
    int rc = latch_wait_released(l, self->pshared, spin_ns, timeout_ns);
    if (rc < 0) return NULL;
    return PyBool_FromLong(rc);
}

static Py_ssize_t latches_len(LatchesObject *self) { return self->n; }

static PyMethodDef latches_methods[] = {
    {"create", (PyCFunction)(void (*)(void))latches_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "create(buffer, n, offset=0, shared=False) -> Latches: n latches in buffer[offset:], all reset"},
    {"attach", (PyCFunction)(void (*)(void))latches_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(buffer, n, offset=0, shared=True) -> Latches made by create (possibly in another process)"},
    {"reset", (PyCFunction)latches_reset, METH_O, "reset(i): pending again (the submitter, before pushing)"},
    {"set", (PyCFunction)latches_set, METH_O, "set(i) -> bool: mark done; True if a sleeper was woken"},
    {"is_set", (PyCFunction)latches_is_set, METH_O, "is_set(i) -> bool"},
    {"wait", (PyCFunction)(void (*)(void))latches_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(index, timeout_s=None, spin_ns=0) -> bool (False on timeout), with the GIL released"},
    {NULL}};

static PySequenceMethods latches_as_sequence = {.sq_length = (lenfunc)latches_len};

static PyTypeObject LatchesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Latches",
    .tp_basicsize = sizeof(LatchesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Completion latches, one per request record: set once by the completer, waited on by the caller.",
    .tp_dealloc = (destructor)latches_dealloc,
    .tp_methods = latches_methods,
    .tp_as_sequence = &latches_as_sequence,
};

static int signal_collect(PyObject *latches, PyObject *signal, signal_batch *b) {
    b->n = 0;
    if (!latches || !PyObject_TypeCheck(latches, &LatchesType)) {
        PyErr_SetString(PyExc_TypeError, "pop_many: signal needs latches=<Latches>");
        return -1;
    }
    if (!PyList_Check(signal)) {
        PyErr_SetString(PyExc_TypeError, "pop_many: signal must be a list of latch indices");
        return -1;
    }
    LatchesObject *lo = (LatchesObject *)latches;
    b->pshared = lo->pshared;
    Py_ssize_t total = PyList_GET_SIZE(signal);
    for (Py_ssize_t i = 0; i < total; i++) {
        lrt_latch *l = latch_of(lo, PyList_GET_ITEM(signal, i));
        if (!l) return -1;
        if (b->n == SIGNAL_CHUNK) { /* more than a chunk: the rest are set now, GIL held (rare) */
            lrt_latch_set(l, lo->pshared);
            continue;
        }
        b->at[b->n++] = l;
    }
    return PyList_SetSlice(signal, 0, total, NULL);
}

static const char *const PUSH_WAIT_NAMES[] = {"request_id", "slot", "nbytes", "t_ns", "aux0", "aux1",
                                              "aux2",       "kind", "latches", "latch", "spin_ns"};

typedef struct {
    const lrt_desc *d;
    lrt_latch *latch;
    int pshared;
    int64_t spin_ns;
} push_wait_arg;

static PyObject *ring_push_wait(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[N_DESC_ARGS + 3];
    lrt_desc d;
    int64_t spin_ns;
    if (parse(args, nargs, kwnames, PUSH_WAIT_NAMES, N_DESC_ARGS + 3, 1, a, "push_wait") < 0 ||
        desc_from_args(a, &d) < 0 || as_spin_ns(a[N_DESC_ARGS + 2], &spin_ns) < 0)
        return NULL;
    if (!a[N_DESC_ARGS] || !PyObject_TypeCheck(a[N_DESC_ARGS], &LatchesType) || !a[N_DESC_ARGS + 1]) {
        PyErr_SetString(PyExc_TypeError, "push_wait: latches=<Latches> and latch=<index> are required");
        return NULL;
    }
    LatchesObject *lo = (LatchesObject *)a[N_DESC_ARGS];
    lrt_latch *l = latch_of(lo, a[N_DESC_ARGS + 1]);
    if (!l) return NULL;
    int rc, done = 0;
    Py_BEGIN_ALLOW_THREADS rc = lrt_ring_try_push(self->r, &d);
    if (rc == LRT_OK) done = lrt_latch_wait(l, lo->pshared, spin_ns, -1) == LRT_OK;
    Py_END_ALLOW_THREADS
    if (rc == LRT_FULL) Py_RETURN_FALSE;
    if (rc != LRT_OK) return raise_rc(rc, "push_wait");
    if (!done) { /* interrupted by a signal: run the handlers, then keep waiting */
        if (PyErr_CheckSignals() < 0) return NULL;
        if (latch_wait_released(l, lo->pshared, spin_ns, -1) < 0) return NULL;
    }
    Py_RETURN_TRUE;
}

/* ================================ Notifier ================================================= */

typedef struct {
    PyObject_HEAD
    lrt_notifier *n;
    Py_buffer view;
} NotifierObject;

static PyTypeObject NotifierType;

static PyObject *notifier_make(PyObject *args, PyObject *kw, int attach) {
    static char *kwlist_c[] = {"buffer", "offset", NULL};
    static char *kwlist_a[] = {"buffer", "fd", "offset", NULL};
    PyObject *buf;
    Py_ssize_t offset = 0;
    int fd = -1;
    if (attach ? !PyArg_ParseTupleAndKeywords(args, kw, "Oi|n", kwlist_a, &buf, &fd, &offset)
               : !PyArg_ParseTupleAndKeywords(args, kw, "O|n", kwlist_c, &buf, &offset))
        return NULL;
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    lrt_notifier *n;
    int rc = attach ? lrt_notifier_attach(base, avail, fd, &n) : lrt_notifier_create(base, avail, &n);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return raise_rc(rc, attach ? "Notifier.attach" : "Notifier.create");
    }
    NotifierObject *o = PyObject_New(NotifierObject, &NotifierType);
    if (!o) {
        lrt_notifier_free(n);
        PyBuffer_Release(&view);
        return NULL;
    }
    o->n = n;
    o->view = view;
    return (PyObject *)o;
}

static PyObject *notifier_create(PyObject *cls, PyObject *args, PyObject *kw) { return notifier_make(args, kw, 0); }
static PyObject *notifier_attach(PyObject *cls, PyObject *args, PyObject *kw) { return notifier_make(args, kw, 1); }

static void notifier_dealloc(NotifierObject *self) {
    lrt_notifier_free(self->n);
    PyBuffer_Release(&self->view);
    PyObject_Free(self);
}

static PyObject *notifier_notify(NotifierObject *self, PyObject *unused) {
    int rc = lrt_notifier_notify(self->n);
    if (rc < 0) return raise_rc(rc, "notify");
    return PyBool_FromLong(rc);
}
static PyObject *notifier_arm(NotifierObject *self, PyObject *unused) {
    lrt_notifier_arm(self->n);
    Py_RETURN_NONE;
}
static PyObject *notifier_drain(NotifierObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(lrt_notifier_drain(self->n));
}
static PyObject *notifier_fileno(NotifierObject *self, PyObject *unused) { return PyLong_FromLong(lrt_notifier_fd(self->n)); }
static PyObject *notifier_stats(NotifierObject *self, PyObject *unused) {
    lrt_notifier_stats s;
    lrt_notifier_get_stats(self->n, &s);
    return Py_BuildValue("{s:K,s:K,s:K}", "notify_calls", s.notify_calls, "writes", s.writes, "arms", s.arms);
}

static PyMethodDef notifier_methods[] = {
    {"create", (PyCFunction)(void (*)(void))notifier_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "create(buffer, offset=0) -> Notifier with a new eventfd; the state needs NOTIFIER_BYTES bytes"},
    {"attach", (PyCFunction)(void (*)(void))notifier_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(buffer, fd, offset=0) -> Notifier sharing state and eventfd (fd is dup'ed)"},
    {"notify", (PyCFunction)notifier_notify, METH_NOARGS,
     "Producer: wake the loop if it is armed (True: wrote the eventfd; False: no system call)."},
    {"arm", (PyCFunction)notifier_arm, METH_NOARGS, "Consumer: about to sleep; re-check the ring after this."},
    {"drain", (PyCFunction)notifier_drain, METH_NOARGS, "Consumer: read the eventfd counter (0 if nothing)."},
    {"fileno", (PyCFunction)notifier_fileno, METH_NOARGS, "The eventfd, for loop.add_reader()."},
    {"stats", (PyCFunction)notifier_stats, METH_NOARGS, "notify_calls, writes, arms"},
    {NULL}};

static PyTypeObject NotifierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Notifier",
    .tp_basicsize = sizeof(NotifierObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An eventfd that wakes an event loop only when it is armed (asleep).",
    .tp_dealloc = (destructor)notifier_dealloc,
    .tp_methods = notifier_methods,
};

/* ================================ module =================================================== */

static PyObject *m_ring_required_bytes(PyObject *m, PyObject *arg) {
    unsigned long long cap = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSize_t(lrt_ring_required_bytes(cap));
}
static PyObject *m_slab_required_bytes(PyObject *m, PyObject *args) {
    unsigned long long sb, n;
    if (!PyArg_ParseTuple(args, "KK", &sb, &n)) return NULL;
    return PyLong_FromSize_t(lrt_slab_required_bytes(sb, n));
}
static PyObject *m_bump_required_bytes(PyObject *m, PyObject *arg) {
    unsigned long long cap = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSize_t(lrt_bump_required_bytes(cap));
}
static PyObject *m_clean_stale_shm(PyObject *m, PyObject *arg) {
    const char *prefix = PyUnicode_AsUTF8(arg);
    if (!prefix) return NULL;
    enum { MAXR = 256 };
    char *names = PyMem_Calloc(MAXR, LRT_SHM_NAME_MAX + 1);
    if (!names) return PyErr_NoMemory();
    int n;
    Py_BEGIN_ALLOW_THREADS n = lrt_shm_clean_stale(prefix, names, MAXR);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyMem_Free(names);
        if (n == LRT_EINVAL) return PyErr_Format(PyExc_ValueError, "prefix %R: characters of [A-Za-z0-9._-]", arg);
        return raise_rc(n, "clean_stale_shm");
    }
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < n && i < MAXR; i++) {
        PyObject *s = PyUnicode_FromString(names + (size_t)i * (LRT_SHM_NAME_MAX + 1));
        if (!s || PyList_Append(list, s) < 0) Py_CLEAR(list);
        Py_XDECREF(s);
    }
    PyMem_Free(names);
    return list;
}
static PyObject *m_unlink_shm(PyObject *m, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    int rc = lrt_shm_unlink_name(name);
    if (rc == LRT_OK) Py_RETURN_TRUE;
    if (rc == LRT_ENOENT) Py_RETURN_FALSE;
    return raise_rc(rc, "unlink_shm");
}
static PyObject *m_process_alive(PyObject *m, PyObject *args) {
    int pid;
    unsigned long long st = 0;
    if (!PyArg_ParseTuple(args, "i|K", &pid, &st)) return NULL;
    return PyBool_FromLong(lrt_process_alive(pid, st));
}
static PyObject *m_hold_required_bytes(PyObject *m, PyObject *arg) {
    unsigned long cap = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (cap == 0 || cap > (1u << 20)) return PyErr_Format(PyExc_ValueError, "hold capacity must be in [1, 2**20]");
    return PyLong_FromSize_t(lrt_hold_required_bytes((uint32_t)cap));
}
static PyObject *m_hold_init(PyObject *m, PyObject *args) {
    PyObject *buf;
    Py_ssize_t offset;
    unsigned int cap;
    if (!PyArg_ParseTuple(args, "OnI", &buf, &offset, &cap)) return NULL;
    if (cap == 0 || cap > (1u << 20)) return PyErr_Format(PyExc_ValueError, "hold capacity must be in [1, 2**20]");
    Py_buffer view;
    char *base;
    size_t avail;
    if (get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    if (avail < lrt_hold_required_bytes(cap)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "hold of %u entries needs %zu bytes", cap, lrt_hold_required_bytes(cap));
    }
    lrt_hold_init((lrt_hold *)base, cap);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}
/* Linux: `sig` is sent to this process when the thread that created it exits (its parent's death). */
static PyObject *m_set_parent_death_signal(PyObject *m, PyObject *arg) {
    long sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred()) return NULL;
    if (prctl(PR_SET_PDEATHSIG, (unsigned long)sig, 0, 0, 0) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *m_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromUnsignedLongLong(lrt_now_ns()); }

static PyMethodDef module_methods[] = {
    {"ring_required_bytes", m_ring_required_bytes, METH_O, "ring_required_bytes(capacity) -> bytes"},
    {"slab_required_bytes", m_slab_required_bytes, METH_VARARGS, "slab_required_bytes(slot_bytes, n_slots) -> bytes"},
    {"bump_required_bytes", m_bump_required_bytes, METH_O, "bump_required_bytes(capacity_bytes) -> bytes"},
    {"clean_stale_shm", m_clean_stale_shm, METH_O,
     "clean_stale_shm(prefix) -> names unlinked: segments prefix* whose owner process is gone"},
    {"unlink_shm", m_unlink_shm, METH_O, "unlink_shm(name) -> bool: unlink by name (False if absent)"},
    {"process_alive", m_process_alive, METH_VARARGS, "process_alive(pid, starttime=0) -> bool (zombies are dead)"},
    {"hold_required_bytes", m_hold_required_bytes, METH_O, "hold_required_bytes(capacity) -> bytes"},
    {"hold_init", m_hold_init, METH_VARARGS, "hold_init(buffer, offset, capacity): every entry finished"},
    {"set_parent_death_signal", m_set_parent_death_signal, METH_O,
     "set_parent_death_signal(sig): prctl(PR_SET_PDEATHSIG): sig arrives when the creating thread exits"},
    {"now_ns", m_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (same clock as time.monotonic_ns)"},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "lumenrt.native._core",
                                       "Thin binding over the lumenrt native core.", -1, module_methods};

PyMODINIT_FUNC PyInit__core(void) {
    PyTypeObject *types[] = {&ItemType, &RegionType, &RingType, &SlabType, &BumpType, &NotifierType, &LatchesType};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    LrtError = PyErr_NewException("lumenrt.native.LrtError", PyExc_RuntimeError, NULL);
    RingClosed = PyErr_NewException("lumenrt.native.RingClosed", LrtError, NULL);
    PoolExhausted = PyErr_NewException("lumenrt.native.PoolExhausted", LrtError, NULL);
    if (PyModule_AddObjectRef(m, "LrtError", LrtError) < 0 || PyModule_AddObjectRef(m, "RingClosed", RingClosed) < 0 ||
        PyModule_AddObjectRef(m, "PoolExhausted", PoolExhausted) < 0 ||
        PyModule_AddObjectRef(m, "Item", (PyObject *)&ItemType) < 0 ||
        PyModule_AddObjectRef(m, "Region", (PyObject *)&RegionType) < 0 ||
        PyModule_AddObjectRef(m, "Ring", (PyObject *)&RingType) < 0 ||
        PyModule_AddObjectRef(m, "SlabPool", (PyObject *)&SlabType) < 0 ||
        PyModule_AddObjectRef(m, "BumpArena", (PyObject *)&BumpType) < 0 ||
        PyModule_AddObjectRef(m, "Notifier", (PyObject *)&NotifierType) < 0 ||
        PyModule_AddObjectRef(m, "Latches", (PyObject *)&LatchesType) < 0 ||
        PyModule_AddIntConstant(m, "LATCH_STRIDE", LRT_LATCH_STRIDE) < 0 ||
        PyModule_AddIntConstant(m, "NOTIFIER_BYTES", LRT_NOTIFIER_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "MAX_AGENTS", LRT_MAX_AGENTS) < 0 ||
        PyModule_AddIntConstant(m, "CACHELINE", LRT_CACHELINE) < 0 ||
        PyModule_AddObjectRef(m, "HOLD_DONE", PyLong_FromUnsignedLongLong(LRT_HOLD_DONE)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

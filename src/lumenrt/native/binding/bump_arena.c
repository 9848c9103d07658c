/* lumenrt.native._core.BumpArena: a per-worker bump arena with O(1) reset (native/src/bump.c).
 *
 * Ownership: like SlabPool, a BumpArena holds the export `view` (the window its lrt_bump handle
 * points into) and `mv`, a memoryview of the whole buffer; tp_dealloc drops mv, frees the handle,
 * then releases view.
 *
 * Invariants
 *   1. One allocating owner (the native arena takes no lock): alloc and reset are called by one
 *      thread; other processes may only read the counters (stats).
 *   2. alloc returns an offset in the caller's buffer (self->offset + the arena's own offset), never
 *      a pointer, so it means the same in every process that maps the buffer.
 *   3. Nothing here blocks or releases the GIL.
 */
#include "internal.h"

typedef struct {
    PyObject_HEAD
    lrt_bump *b;
    Py_buffer view;
    Py_ssize_t offset;
    PyObject *mv;
} BumpObject;

static PyObject *bump_wrap(PyObject *buf, lrt_bump *b, Py_buffer *view, Py_ssize_t offset) {
    BumpObject *o = PyObject_New(BumpObject, &lrtpy_bump_arena_type);
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
    if (lrtpy_get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    if (avail < lrt_bump_required_bytes(cap)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "buffer: an arena of %llu bytes needs %zu bytes, %zu available", cap,
                            lrt_bump_required_bytes(cap), avail);
    }
    lrt_bump *b;
    int rc = lrt_bump_create(base, avail, cap, &b);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return lrtpy_raise_rc(rc, "BumpArena.create");
    }
    return bump_wrap(buf, b, &view, offset);
}

static PyObject *bump_attach(PyObject *cls, PyObject *args, PyObject *kw) {
    PyObject *buf;
    Py_ssize_t offset;
    Py_buffer view;
    char *base;
    size_t avail;
    if (lrtpy_attach_window(args, kw, &buf, &offset, &view, &base, &avail) < 0) return NULL;
    lrt_bump *b;
    int rc = lrt_bump_attach(base, avail, &b);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return lrtpy_raise_rc(rc, "BumpArena.attach");
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
        return PyErr_Format(lrtpy_pool_exhausted, "bump arena exhausted: %llu bytes asked, %llu of %llu used", size,
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

PyTypeObject lrtpy_bump_arena_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.BumpArena",
    .tp_basicsize = sizeof(BumpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A per-worker bump arena with O(1) reset (one allocating owner).",
    .tp_dealloc = (destructor)bump_dealloc,
    .tp_methods = bump_methods,
};

/* lumenrt.native._core.SlabPool: fixed-size, cache-line-aligned slots with a lock-free free list
 * (native/src/slab.c), usable across processes.
 *
 * Ownership: a SlabPool holds two exports of its buffer: `view`, the window the lrt_slab handle
 * points into, and `mv`, a memoryview of the whole buffer that view(slot) slices. tp_dealloc drops
 * mv, frees the handle, then releases view. A slot's memoryview (view(slot)) holds its own export,
 * so the memory outlives the pool while such a view lives.
 *
 * Invariants
 *   1. Slot numbers are checked against n_slots before any native call (IndexError otherwise).
 *   2. Offsets handed out (offset_of, view) are offsets in the caller's buffer, not in the pool:
 *      self->offset (where the pool starts) plus the slot's offset inside the pool.
 *   3. alloc/try_alloc/free never block and keep the GIL; a double free is refused (ValueError) by
 *      the pool's state words, never entered into the free list twice.
 */
#include "internal.h"

typedef struct {
    PyObject_HEAD
    lrt_slab *s;
    Py_buffer view;
    Py_ssize_t offset; /* of the pool inside the buffer */
    PyObject *mv;      /* memoryview of the whole buffer, sliced by view() */
} SlabObject;

static PyObject *slab_wrap(PyObject *buf, lrt_slab *s, Py_buffer *view, Py_ssize_t offset) {
    SlabObject *o = PyObject_New(SlabObject, &lrtpy_slab_pool_type);
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
    if (lrtpy_get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
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
        return lrtpy_raise_rc(rc, "SlabPool.create");
    }
    return slab_wrap(buf, s, &view, offset);
}

static PyObject *slab_attach(PyObject *cls, PyObject *args, PyObject *kw) {
    PyObject *buf;
    Py_ssize_t offset;
    Py_buffer view;
    char *base;
    size_t avail;
    if (lrtpy_attach_window(args, kw, &buf, &offset, &view, &base, &avail) < 0) return NULL;
    lrt_slab *s;
    int rc = lrt_slab_attach(base, avail, &s);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return lrtpy_raise_rc(rc, "SlabPool.attach");
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
    return PyErr_Format(lrtpy_pool_exhausted, "slab pool exhausted: all %llu slots of %llu bytes are in use",
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
    if (rc != LRT_OK) return lrtpy_raise_rc(rc, "free");
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

PyTypeObject lrtpy_slab_pool_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.SlabPool",
    .tp_basicsize = sizeof(SlabObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Fixed-size, cache-line-aligned slots with a lock-free free list, usable across processes.",
    .tp_dealloc = (destructor)slab_dealloc,
    .tp_methods = slab_methods,
    .tp_getset = slab_getset,
};

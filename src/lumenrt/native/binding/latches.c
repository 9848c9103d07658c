/* lumenrt.native._core.Latches: completion latches, one per request record (lrt/latch.h): reset
 * by the submitter before it pushes, set once by the completer, waited on by the caller.
 *
 * Ownership: a Latches object holds an export of its buffer (`view`) from creation until
 * tp_dealloc; `base` points into it. create() resets all n latches, attach() touches none, so a
 * process that attaches never disturbs requests in flight.
 *
 * Invariants
 *   1. An index is checked against n before its latch is touched (lrtpy_latch_of: IndexError).
 *   2. pshared (process-shared or process-private futex operations) is fixed per object at
 *      creation: create() defaults to private (one process), attach() to shared.
 *   3. wait() releases the GIL for every native wait and runs signal handlers between them, with
 *      the caller's deadline kept (lrtpy_latch_wait_released); set() and is_set() never block.
 */
#include "internal.h"

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
    if (lrtpy_get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    if (avail < lrt_latch_required_bytes((uint32_t)n)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "buffer: %zd latches need %zu bytes, %zu available", n,
                            lrt_latch_required_bytes((uint32_t)n), avail);
    }
    LatchesObject *o = PyObject_New(LatchesObject, &lrtpy_latches_type);
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

lrt_latch *lrtpy_latch_of(LatchesObject *self, PyObject *index) {
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= self->n) {
        PyErr_Format(PyExc_IndexError, "latch %zd out of range [0, %zd)", i, self->n);
        return NULL;
    }
    return lrt_latch_at(self->base, (uint32_t)i);
}

static PyObject *latches_reset(LatchesObject *self, PyObject *index) {
    lrt_latch *l = lrtpy_latch_of(self, index);
    if (!l) return NULL;
    lrt_latch_reset(l);
    Py_RETURN_NONE;
}

static PyObject *latches_set(LatchesObject *self, PyObject *index) {
    lrt_latch *l = lrtpy_latch_of(self, index);
    if (!l) return NULL;
    return PyBool_FromLong(lrt_latch_set(l, self->pshared));
}

static PyObject *latches_is_set(LatchesObject *self, PyObject *index) {
    lrt_latch *l = lrtpy_latch_of(self, index);
    if (!l) return NULL;
    return PyBool_FromLong(lrt_latch_is_set(l));
}

/* Wait with the GIL released, running signal handlers between sleeps. 1 = set, 0 = timed out,
 * -1 = a handler raised. */
int lrtpy_latch_wait_released(lrt_latch *l, int pshared, int64_t spin_ns, int64_t timeout_ns) {
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

static const char *const LATCH_WAIT_NAMES[] = {"index", "timeout_s", "spin_ns"};

static PyObject *latches_wait(LatchesObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[3];
    int64_t timeout_ns, spin_ns;
    if (lrtpy_parse(args, nargs, kwnames, LATCH_WAIT_NAMES, 3, 1, a, "wait") < 0 ||
        lrtpy_as_timeout_ns(a[1], &timeout_ns) < 0 || lrtpy_as_spin_ns(a[2], &spin_ns) < 0)
        return NULL;
    lrt_latch *l = lrtpy_latch_of(self, a[0]);
    if (!l) return NULL;
    int rc = lrtpy_latch_wait_released(l, self->pshared, spin_ns, timeout_ns);
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

PyTypeObject lrtpy_latches_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Latches",
    .tp_basicsize = sizeof(LatchesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Completion latches, one per request record: set once by the completer, waited on by the caller.",
    .tp_dealloc = (destructor)latches_dealloc,
    .tp_methods = latches_methods,
    .tp_as_sequence = &latches_as_sequence,
};

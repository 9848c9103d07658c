/* lumenrt.native._core: what every type shares: the exceptions, lrt status -> Python exception,
 * the FASTCALL argument parser, integer/timeout conversions and buffer windows.
 *
 * Invariants
 *   1. Each lrt status maps to one Python exception class, defined here: LRT_CLOSED -> RingClosed,
 *      LRT_EXHAUSTED -> PoolExhausted, LRT_EINVAL -> ValueError, LRT_ENOENT -> FileNotFoundError,
 *      LRT_EEXIST -> FileExistsError, anything else -> LrtError (LRT_ESYS adds errno's text).
 *   2. lrtpy_parse() never takes a reference: out[] borrows from args, which the caller's frame
 *      keeps alive for the duration of the call.
 *   3. A window returned by lrtpy_get_window() is writable, starts on a cache line and lies inside
 *      the export in `view`; on failure no export is left behind.
 */
#include "internal.h"

/* Created by PyInit__core; these references are held for the life of the process (single-phase
 * init, m_size -1: one module object per process). */
PyObject *lrtpy_lrt_error, *lrtpy_ring_closed, *lrtpy_pool_exhausted;

PyObject *lrtpy_raise_rc(int rc, const char *what) {
    if (rc == LRT_CLOSED) return PyErr_Format(lrtpy_ring_closed, "%s: ring is closed", what);
    if (rc == LRT_EXHAUSTED) return PyErr_Format(lrtpy_pool_exhausted, "%s: %s", what, lrt_strerror(rc));
    if (rc == LRT_ESYS) {
        int e = errno;
        return PyErr_Format(lrtpy_lrt_error, "%s: %s (%s)", what, lrt_strerror(rc), strerror(e));
    }
    if (rc == LRT_EINVAL) return PyErr_Format(PyExc_ValueError, "%s: %s", what, lrt_strerror(rc));
    if (rc == LRT_ENOENT) return PyErr_Format(PyExc_FileNotFoundError, "%s: %s", what, lrt_strerror(rc));
    if (rc == LRT_EEXIST) return PyErr_Format(PyExc_FileExistsError, "%s: %s", what, lrt_strerror(rc));
    return PyErr_Format(lrtpy_lrt_error, "%s: %s", what, lrt_strerror(rc));
}

/* Tiny FASTCALL argument parser: positional then keyword, by name. */
int lrtpy_parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
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

int lrtpy_as_u64(PyObject *o, uint64_t *v, const char *field) {
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

int lrtpy_as_u32(PyObject *o, uint32_t *v, const char *field) {
    uint64_t x = 0;
    if (!o) return 0;
    if (lrtpy_as_u64(o, &x, field) < 0 || x > UINT32_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**32)", field);
        return -1;
    }
    *v = (uint32_t)x;
    return 0;
}

int lrtpy_check_max_agents(long long v, uint32_t *out) {
    if (v < 0 || v > LRT_RING_MAX_AGENTS) {
        PyErr_Format(PyExc_ValueError,
                     "max_agents %lld: must be in [1, %d] (threads that may use the ring at once), or 0 for "
                     "the default (%d)",
                     v, LRT_RING_MAX_AGENTS, LRT_RING_DEFAULT_AGENTS);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* timeout_s: None = forever (-1), number >= 0 seconds. */
int lrtpy_as_timeout_ns(PyObject *o, int64_t *ns) {
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

int lrtpy_as_spin_ns(PyObject *o, int64_t *ns) {
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

/* A writable, 64-byte-aligned window [offset, offset+need) of any buffer exporter. */
int lrtpy_get_window(PyObject *buf, Py_ssize_t offset, Py_buffer *view, char **base, size_t *avail) {
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

int lrtpy_attach_window(PyObject *args, PyObject *kw, PyObject **buf, Py_ssize_t *offset, Py_buffer *view,
                        char **base, size_t *avail) {
    static char *kwlist[] = {"buffer", "offset", NULL};
    *offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|n", kwlist, buf, offset)) return -1;
    return lrtpy_get_window(*buf, *offset, view, base, avail);
}

/* lumenrt.native._core.Ring: the calls that pop in batches or tie a ring call to completion state.
 *   pop_many       wait for one descriptor, then take up to max_n; optionally first set the latches
 *                  of the caller's previous batch (`signal`) once the GIL is released
 *   pop_many_hold  pop_many that records each descriptor in a hold (lrt_hold, ring.h) first
 *   push_wait      push, then wait for the request's latch, all with the GIL released
 *
 * Invariants
 *   1. pop_many `signal`: once signal_collect() has succeeded the list is emptied and every latch it
 *      named is set exactly once: past the first SIGNAL_CHUNK at collection (GIL held), the rest by
 *      the first native attempt with the GIL released, or, if the wait ended before that attempt
 *      (its deadline had already passed), right after it with the GIL held.
 *   2. Only the first take of pop_many may wait; further chunks of POP_CHUNK are taken without
 *      waiting until max_n are taken or the ring has fewer left.
 *   3. pop_many_hold holds its export of the hold's buffer for the call only; the native core writes
 *      each descriptor to the hold before the ring gives its cell up, so a killed consumer's
 *      requests are in the ring (recover) or in the hold, never lost silently.
 *   4. push_wait on a signal: the request stays pushed (in flight); handlers run with the GIL held,
 *      and the wait goes on unless one raised. Then the caller gets the exception, and the latch
 *      is still set later by whoever completes the request.
 *
 * Sizes, chosen and not measured: POP_CHUNK 64 descriptors (3.5 KiB of stack) per native call,
 * SIGNAL_CHUNK 256 latch pointers (2 KiB of stack) delivered without the GIL.
 */
#include "internal.h"

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

static int signal_collect(PyObject *latches, PyObject *signal, signal_batch *b) {
    b->n = 0;
    if (!latches || !PyObject_TypeCheck(latches, &lrtpy_latches_type)) {
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
        lrt_latch *l = lrtpy_latch_of(lo, PyList_GET_ITEM(signal, i));
        if (!l) return -1;
        if (b->n == SIGNAL_CHUNK) { /* more than a chunk: the rest are set now, GIL held (rare) */
            lrt_latch_set(l, lo->pshared);
            continue;
        }
        b->at[b->n++] = l;
    }
    return PyList_SetSlice(signal, 0, total, NULL);
}

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

PyObject *lrtpy_ring_pop_many(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[4];
    int64_t timeout_ns;
    if (lrtpy_parse(args, nargs, kwnames, POP_MANY_NAMES, 4, 1, a, "pop_many") < 0 ||
        lrtpy_as_timeout_ns(a[1], &timeout_ns) < 0)
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
            rc = lrtpy_wait_released(self, pop_signal_fn, &p, timeout_ns, 1);
            if (sb.n) { /* not delivered: the wait ended before the first attempt (deadline passed) */
                signal_deliver(&sb);
            }
            if (rc == 1) return NULL;
        }
        n = rc == LRT_OK ? p.pop.got : rc;
    } else {
        n = lrt_ring_pop_many(self->r, buf, first, 0);
        if (n == LRT_EMPTY && timeout_ns != 0) {
            pop_many_arg p = {buf, first, 0};
            int rc = lrtpy_wait_released(self, pop_many_fn, &p, timeout_ns, 1);
            if (rc == 1) return NULL;
            n = rc == LRT_OK ? p.got : rc;
        }
    }
    if (n == LRT_EMPTY || n == LRT_TIMEOUT) return PyList_New(0);
    if (n < 0) return lrtpy_raise_rc(n, "pop_many");
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (;;) {
        for (int i = 0; i < n; i++) {
            PyObject *it = lrtpy_item_new(&buf[i]);
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
PyObject *lrtpy_ring_pop_many_hold(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[4];
    int64_t timeout_ns;
    if (lrtpy_parse(args, nargs, kwnames, POP_HOLD_NAMES, 4, 2, a, "pop_many_hold") < 0 ||
        lrtpy_as_timeout_ns(a[3], &timeout_ns) < 0)
        return NULL;
    Py_ssize_t max_n = PyLong_AsSsize_t(a[0]);
    if (max_n == -1 && PyErr_Occurred()) return NULL;
    if (max_n <= 0 || max_n > POP_CHUNK) return PyErr_Format(PyExc_ValueError, "max_n must be in [1, %d]", POP_CHUNK);
    Py_ssize_t offset = a[2] ? PyLong_AsSsize_t(a[2]) : 0;
    if (offset == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    char *base;
    size_t avail;
    if (lrtpy_get_window(a[1], offset, &view, &base, &avail) < 0) return NULL;
    lrt_hold *hold = (lrt_hold *)base;
    if (avail < sizeof(lrt_hold) || hold->capacity == 0 || avail < lrt_hold_required_bytes(hold->capacity)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "hold: no initialised hold at offset %zd", offset);
    }
    lrt_desc buf[POP_CHUNK];
    uint32_t first_pos = hold->pos;
    pop_hold_arg p = {buf, (int)max_n, 0, hold};
    int rc = pop_hold_fn(self, &p, 0);
    if (rc == LRT_EMPTY && timeout_ns != 0) rc = lrtpy_wait_released(self, pop_hold_fn, &p, timeout_ns, 1);
    PyBuffer_Release(&view);
    if (rc == 1) return NULL;
    if (rc == LRT_EMPTY || rc == LRT_TIMEOUT) return Py_BuildValue("([]I)", first_pos);
    if (rc != LRT_OK) return lrtpy_raise_rc(rc, "pop_many_hold");
    PyObject *list = PyList_New(p.got);
    for (int i = 0; list && i < p.got; i++) {
        PyObject *it = lrtpy_item_new(&buf[i]);
        if (!it) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, it);
    }
    if (!list) return NULL;
    return Py_BuildValue("(NI)", list, first_pos);
}

static const char *const PUSH_WAIT_NAMES[] = {"request_id", "slot", "nbytes", "t_ns", "aux0", "aux1",
                                              "aux2",       "kind", "latches", "latch", "spin_ns"};

PyObject *lrtpy_ring_push_wait(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[N_DESC_ARGS + 3];
    lrt_desc d;
    int64_t spin_ns;
    if (lrtpy_parse(args, nargs, kwnames, PUSH_WAIT_NAMES, N_DESC_ARGS + 3, 1, a, "push_wait") < 0 ||
        lrtpy_desc_from_args(a, &d) < 0 || lrtpy_as_spin_ns(a[N_DESC_ARGS + 2], &spin_ns) < 0)
        return NULL;
    if (!a[N_DESC_ARGS] || !PyObject_TypeCheck(a[N_DESC_ARGS], &lrtpy_latches_type) || !a[N_DESC_ARGS + 1]) {
        PyErr_SetString(PyExc_TypeError, "push_wait: latches=<Latches> and latch=<index> are required");
        return NULL;
    }
    LatchesObject *lo = (LatchesObject *)a[N_DESC_ARGS];
    lrt_latch *l = lrtpy_latch_of(lo, a[N_DESC_ARGS + 1]);
    if (!l) return NULL;
    int rc, done = 0;
    Py_BEGIN_ALLOW_THREADS rc = lrt_ring_try_push(self->r, &d);
    if (rc == LRT_OK) done = lrt_latch_wait(l, lo->pshared, spin_ns, -1) == LRT_OK;
    Py_END_ALLOW_THREADS
    if (rc == LRT_FULL) Py_RETURN_FALSE;
    if (rc != LRT_OK) return lrtpy_raise_rc(rc, "push_wait");
    if (!done) { /* interrupted by a signal: run the handlers, then keep waiting */
        if (PyErr_CheckSignals() < 0) return NULL;
        if (lrtpy_latch_wait_released(l, lo->pshared, spin_ns, -1) < 0) return NULL;
    }
    Py_RETURN_TRUE;
}

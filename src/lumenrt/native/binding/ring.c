/* lumenrt.native._core.Ring: a bounded ring of descriptors in caller-given (possibly shared)
 * memory: creation, push/pop, close, recovery and counters. The calls that pop in batches or tie
 * a ring to latches or a hold are in ring_batch.c.
 *
 * Invariants
 *   1. A Ring holds an export of the buffer it lives in (self->view) from ring_wrap() until
 *      ring_dealloc(), which frees the lrt_ring handle first and releases the export last.
 *   2. Every handle is interruptible (lrt_ring_set_interruptible): a signal ends a native sleep with
 *      LRT_EINTR instead of being absorbed, so Ctrl-C reaches Python during a wait.
 *   3. try_push/try_pop, and push/pop that succeed at once, keep the GIL and never sleep; only a
 *      call that must wait enters lrtpy_wait_released(), which releases the GIL around each native
 *      wait and keeps the caller's deadline across signals.
 *   4. error_rc (1) is positive and so never an lrt status (LRT_OK is 0, every other status is
 *      negative): a caller can tell "a signal handler raised" from any result of the ring.
 */
#include "internal.h"

static PyObject *ring_wrap(lrt_ring *r, Py_buffer *view) {
    RingObject *o = PyObject_New(RingObject, &lrtpy_ring_type);
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
    static char *kwlist[] = {"buffer", "kind",        "capacity",   "offset", "shared",
                             "spin_iters", "yield_iters", "max_agents", NULL};
    PyObject *buf;
    const char *kind;
    unsigned long long capacity;
    Py_ssize_t offset = 0;
    int shared = 1, spin = -1, yield = -1;
    long long max_agents = 0;
    uint32_t agents;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsK|npiiL", kwlist, &buf, &kind, &capacity, &offset, &shared,
                                     &spin, &yield, &max_agents))
        return NULL;
    int k = lrt_ring_kind_from_name(kind);
    if (k < 0) return PyErr_Format(PyExc_ValueError, "kind '%s': expected one of mpmc, spsc, naive, batched", kind);
    if (capacity < 2 || (capacity & (capacity - 1)) || capacity > (1ull << 32))
        return PyErr_Format(PyExc_ValueError, "capacity %llu: must be a power of two in [2, 2**32]", capacity);
    if (lrtpy_check_max_agents(max_agents, &agents) < 0) return NULL;
    Py_buffer view;
    char *base;
    size_t avail;
    if (lrtpy_get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    size_t need = lrt_ring_required_bytes_agents(capacity, agents);
    if (avail < need) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError,
                            "buffer: a ring of capacity %llu and max_agents %u needs %zu bytes, %zu available",
                            capacity, agents ? agents : LRT_RING_DEFAULT_AGENTS, need, avail);
    }
    lrt_ring_config cfg = {.kind = (uint32_t)k, .flags = shared ? LRT_RING_PSHARED : 0, .capacity = capacity,
                           .spin_iters = spin, .yield_iters = yield, .max_agents = agents};
    lrt_ring *r;
    int rc = lrt_ring_create(base, avail, &cfg, &r);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return lrtpy_raise_rc(rc, "Ring.create");
    }
    return ring_wrap(r, &view);
}

static PyObject *ring_attach(PyObject *cls, PyObject *args, PyObject *kw) {
    PyObject *buf;
    Py_ssize_t offset;
    Py_buffer view;
    char *base;
    size_t avail;
    if (lrtpy_attach_window(args, kw, &buf, &offset, &view, &base, &avail) < 0) return NULL;
    lrt_ring *r;
    int rc = lrt_ring_attach(base, avail, &r);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return lrtpy_raise_rc(rc, "Ring.attach");
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

int lrtpy_desc_from_args(PyObject **a, lrt_desc *d) {
    memset(d, 0, sizeof *d);
    if (lrtpy_as_u64(a[0], &d->request_id, "request_id") < 0 || lrtpy_as_u32(a[1], &d->slot, "slot") < 0 ||
        lrtpy_as_u32(a[2], &d->nbytes, "nbytes") < 0 || lrtpy_as_u64(a[3], &d->t_ns, "t_ns") < 0 ||
        lrtpy_as_u64(a[4], &d->aux[0], "aux0") < 0 || lrtpy_as_u64(a[5], &d->aux[1], "aux1") < 0 ||
        lrtpy_as_u64(a[6], &d->aux[2], "aux2") < 0 || lrtpy_as_u32(a[7], &d->kind, "kind") < 0)
        return -1;
    return 0;
}

static PyObject *ring_try_push(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[N_DESC_ARGS];
    lrt_desc d;
    if (lrtpy_parse(args, nargs, kwnames, PUSH_NAMES, N_DESC_ARGS, 1, a, "try_push") < 0 ||
        lrtpy_desc_from_args(a, &d) < 0)
        return NULL;
    int rc = lrt_ring_try_push(self->r, &d);
    if (rc == LRT_OK) Py_RETURN_TRUE;
    if (rc == LRT_FULL) Py_RETURN_FALSE;
    return lrtpy_raise_rc(rc, "try_push");
}

int lrtpy_wait_released(RingObject *self, lrtpy_wait_fn fn, void *arg, int64_t timeout_ns, int error_rc) {
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
    if (lrtpy_parse(args, nargs, kwnames, PUSH_NAMES, N_DESC_ARGS + 1, 1, a, "push") < 0 ||
        lrtpy_desc_from_args(a, &d) < 0 || lrtpy_as_timeout_ns(a[N_DESC_ARGS], &timeout_ns) < 0)
        return NULL;
    int rc = lrt_ring_try_push(self->r, &d);
    if (rc == LRT_FULL && timeout_ns != 0) {
        rc = lrtpy_wait_released(self, push_fn, &d, timeout_ns, 1);
        if (rc == 1) return NULL;
    }
    if (rc == LRT_OK) Py_RETURN_TRUE;
    if (rc == LRT_FULL || rc == LRT_TIMEOUT) Py_RETURN_FALSE;
    return lrtpy_raise_rc(rc, "push");
}

static PyObject *ring_try_pop(RingObject *self, PyObject *unused) {
    lrt_desc d;
    int rc = lrt_ring_try_pop(self->r, &d);
    if (rc == LRT_OK) return lrtpy_item_new(&d);
    if (rc == LRT_EMPTY) Py_RETURN_NONE;
    return lrtpy_raise_rc(rc, "try_pop");
}

static int pop_fn(RingObject *self, void *arg, int64_t ns) { return lrt_ring_pop(self->r, arg, ns); }

static const char *const POP_NAMES[] = {"timeout_s"};

static PyObject *ring_pop(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[1];
    int64_t timeout_ns;
    if (lrtpy_parse(args, nargs, kwnames, POP_NAMES, 1, 0, a, "pop") < 0 || lrtpy_as_timeout_ns(a[0], &timeout_ns) < 0)
        return NULL;
    lrt_desc d;
    int rc = lrt_ring_try_pop(self->r, &d);
    if (rc == LRT_EMPTY && timeout_ns != 0) {
        rc = lrtpy_wait_released(self, pop_fn, &d, timeout_ns, 1);
        if (rc == 1) return NULL;
    }
    if (rc == LRT_OK) return lrtpy_item_new(&d);
    if (rc == LRT_EMPTY || rc == LRT_TIMEOUT) Py_RETURN_NONE;
    return lrtpy_raise_rc(rc, "pop");
}

static PyObject *ring_close(RingObject *self, PyObject *unused) {
    lrt_ring_close(self->r);
    Py_RETURN_NONE;
}

static PyObject *ring_recover(RingObject *self, PyObject *unused) {
    /* at most one lost descriptor per agent entry (lrt_ring_recover) */
    int max_lost = (int)lrt_ring_max_agents(self->r);
    lrt_desc *lost = PyMem_Malloc((size_t)max_lost * sizeof(lrt_desc));
    if (!lost) return PyErr_NoMemory();
    int n;
    Py_BEGIN_ALLOW_THREADS n = lrt_ring_recover(self->r, lost, max_lost);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyMem_Free(lost);
        return lrtpy_raise_rc(n, "recover");
    }
    if (n > max_lost) n = max_lost;
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *it = lrtpy_item_new(&lost[i]);
        if (!it) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, it);
    }
    PyMem_Free(lost);
    return list;
}

static PyObject *ring_stats(RingObject *self, PyObject *unused) {
    lrt_ring_stats s;
    lrt_ring_get_stats(self->r, &s);
    return Py_BuildValue("{s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:I,s:I,s:I}", "kind", self->kind_name,
                         "capacity", s.capacity, "len", s.len, "pushed", s.pushed, "popped", s.popped,
                         "futex_waits", s.futex_waits, "futex_wakes", s.futex_wakes, "tombstones", s.tombstones,
                         "released", s.released, "closed", s.closed ? Py_True : Py_False, "agents", s.agents,
                         "max_agents", s.max_agents, "agent_words", s.agent_words);
}

static Py_ssize_t ring_len(RingObject *self) { return (Py_ssize_t)lrt_ring_len(self->r); }
static PyObject *ring_get_capacity(RingObject *self, void *c) { return PyLong_FromUnsignedLongLong(lrt_ring_capacity(self->r)); }
static PyObject *ring_get_max_agents(RingObject *self, void *c) { return PyLong_FromUnsignedLong(lrt_ring_max_agents(self->r)); }
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

static PyMethodDef ring_methods[] = {
    {"create", (PyCFunction)(void (*)(void))ring_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "create(buffer, kind, capacity, offset=0, shared=True, spin_iters=-1, yield_iters=-1, max_agents=0) -> Ring\n"
     "Initialise a ring of `kind` (mpmc, spsc, naive, batched) in buffer[offset:] (ring_required_bytes(capacity,\n"
     "max_agents) bytes), whose agent table holds max_agents threads at once (0: DEFAULT_AGENTS)."},
    {"attach", (PyCFunction)(void (*)(void))ring_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(buffer, offset=0) -> Ring: use a ring created in buffer[offset:] (possibly by another process)."},
    {"try_push", (PyCFunction)(void (*)(void))ring_try_push, METH_FASTCALL | METH_KEYWORDS,
     "try_push(request_id, slot=0, nbytes=0, t_ns=0, aux0=0, aux1=0, aux2=0, kind=0) -> bool: False if full."},
    {"push", (PyCFunction)(void (*)(void))ring_push, METH_FASTCALL | METH_KEYWORDS,
     "push(request_id, slot=0, nbytes=0, t_ns=0, aux0=0, aux1=0, aux2=0, kind=0, timeout_s=None) -> bool"},
    {"try_pop", (PyCFunction)ring_try_pop, METH_NOARGS, "try_pop() -> Item | None. RingClosed once closed and drained."},
    {"pop", (PyCFunction)(void (*)(void))ring_pop, METH_FASTCALL | METH_KEYWORDS,
     "pop(timeout_s=None) -> Item | None (None on timeout). RingClosed once closed and drained."},
    {"pop_many", (PyCFunction)(void (*)(void))lrtpy_ring_pop_many, METH_FASTCALL | METH_KEYWORDS,
     "pop_many(max_n, timeout_s=None, latches=None, signal=None) -> list[Item]: wait for one, then take up to\n"
     "max_n available ([] on timeout). `signal`: a list of latch indices to set (then emptied) once the GIL is\n"
     "released, before taking: a worker completes its last batch as it goes back to wait."},
    {"push_wait", (PyCFunction)(void (*)(void))lrtpy_ring_push_wait, METH_FASTCALL | METH_KEYWORDS,
     "push_wait(request_id, slot=0, nbytes=0, t_ns=0, aux0=0, aux1=0, aux2=0, kind=0, *, latches, latch,\n"
     "spin_ns=0) -> bool\n"
     "With the GIL released: try to push once (False at once if full), then wait for latches[latch] to be set\n"
     "(spinning up to spin_ns, then sleeping). A signal handler that raises leaves the request in flight."},
    {"pop_many_hold", (PyCFunction)(void (*)(void))lrtpy_ring_pop_many_hold, METH_FASTCALL | METH_KEYWORDS,
     "pop_many_hold(max_n, hold, hold_offset=0, timeout_s=None) -> (list[Item], first_position)\n"
     "pop_many that records each Item in the hold at hold[hold_offset:] before the ring lets it go."},
    {"close", (PyCFunction)ring_close, METH_NOARGS, "Refuse pushes, wake all waiters; pops drain what is left."},
    {"recover", (PyCFunction)ring_recover, METH_NOARGS,
     "Repair after dead processes; returns the Items that dead consumers had taken but not finished."},
    {"stats", (PyCFunction)ring_stats, METH_NOARGS, "Counters: len, pushed, popped, futex_waits, futex_wakes, ..."},
    {NULL}};

static PyGetSetDef ring_getset[] = {
    {"capacity", (getter)ring_get_capacity, NULL, "elements", NULL},
    {"max_agents", (getter)ring_get_max_agents, NULL, "threads that may use the ring at once (its agent table)", NULL},
    {"kind", (getter)ring_get_kind, NULL, "mpmc, spsc, naive or batched", NULL},
    {"closed", (getter)ring_get_closed, NULL, "True once close() was called", NULL},
    {"spin_ns", (getter)ring_get_spin_ns, (setter)ring_set_spin_ns,
     "this handle's timed spin before a blocking call sleeps (ns; 0 = sleep at once)", NULL},
    {NULL}};

static PySequenceMethods ring_as_sequence = {.sq_length = (lenfunc)ring_len};

PyTypeObject lrtpy_ring_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Ring",
    .tp_basicsize = sizeof(RingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bounded ring of descriptors in caller-given (possibly shared) memory.",
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_as_sequence = &ring_as_sequence,
};

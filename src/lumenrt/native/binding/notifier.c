/* lumenrt.native._core.Notifier: an eventfd that wakes an event loop only when it is armed
 * (asleep); the arm/notify handshake is native (lrt/notifier.h).
 *
 * Ownership: the lrt_notifier handle owns its eventfd (created by create(), a dup of the caller's
 * by attach(); the caller keeps its own descriptor) and closes it in lrt_notifier_free(). The
 * object holds an export of the buffer with the state word (`view`) from creation until
 * tp_dealloc, which frees the handle first and releases the export last.
 *
 * Invariants
 *   1. Nothing here waits or releases the GIL: notify() writes the eventfd only when the loop was
 *      armed; drain() reads it and returns 0 when there is nothing (the eventfd that create()
 *      makes is non-blocking, and attach() dups one, which shares that flag).
 *   2. fileno() lends the handle's descriptor to loop.add_reader(); it stays valid while this
 *      Notifier lives.
 */
#include "internal.h"

typedef struct {
    PyObject_HEAD
    lrt_notifier *n;
    Py_buffer view;
} NotifierObject;

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
    if (lrtpy_get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
    lrt_notifier *n;
    int rc = attach ? lrt_notifier_attach(base, avail, fd, &n) : lrt_notifier_create(base, avail, &n);
    if (rc != LRT_OK) {
        PyBuffer_Release(&view);
        return lrtpy_raise_rc(rc, attach ? "Notifier.attach" : "Notifier.create");
    }
    NotifierObject *o = PyObject_New(NotifierObject, &lrtpy_notifier_type);
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
    if (rc < 0) return lrtpy_raise_rc(rc, "notify");
    return PyBool_FromLong(rc);
}
static PyObject *notifier_arm(NotifierObject *self, PyObject *unused) {
    lrt_notifier_arm(self->n);
    Py_RETURN_NONE;
}
static PyObject *notifier_disarm(NotifierObject *self, PyObject *unused) {
    return PyBool_FromLong(lrt_notifier_disarm(self->n));
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
    {"disarm", (PyCFunction)notifier_disarm, METH_NOARGS,
     "Consumer: awake and about to wait on the ring itself (producers skip the system call). "
     "True: it was armed; arm() again when done waiting, then re-check the ring."},
    {"drain", (PyCFunction)notifier_drain, METH_NOARGS, "Consumer: read the eventfd counter (0 if nothing)."},
    {"fileno", (PyCFunction)notifier_fileno, METH_NOARGS, "The eventfd, for loop.add_reader()."},
    {"stats", (PyCFunction)notifier_stats, METH_NOARGS, "notify_calls, writes, arms"},
    {NULL}};

PyTypeObject lrtpy_notifier_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Notifier",
    .tp_basicsize = sizeof(NotifierObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An eventfd that wakes an event loop only when it is armed (asleep).",
    .tp_dealloc = (destructor)notifier_dealloc,
    .tp_methods = notifier_methods,
};

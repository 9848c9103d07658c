/* lumenrt.native._core: the module-level functions. Sizes of the structures (ring, slab, bump,
 * hold), named shared-memory housekeeping, process checks, hold initialisation and the clock.
 *
 * Invariants
 *   1. clean_stale_shm() reports at most MAXR names per call (256: a bound on the report, not
 *      measured), while lrt_shm_clean_stale() unlinks every stale segment regardless, so a longer
 *      list only loses names from the report. The name buffer is PyMem-owned here and freed on
 *      every path.
 *   2. Only clean_stale_shm() (a scan of /dev/shm) releases the GIL; the others make at most a few
 *      system calls and keep it.
 *   3. A hold has 1 to 2**20 entries; hold_init() writes inside an export that it releases before
 *      returning.
 */
#include <sys/prctl.h>

#include "internal.h"

static PyObject *m_ring_required_bytes(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"capacity", "max_agents", NULL};
    unsigned long long cap;
    long long max_agents = 0;
    uint32_t agents;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|L", kwlist, &cap, &max_agents)) return NULL;
    if (lrtpy_check_max_agents(max_agents, &agents) < 0) return NULL;
    return PyLong_FromSize_t(lrt_ring_required_bytes_agents(cap, agents));
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
        return lrtpy_raise_rc(n, "clean_stale_shm");
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
    return lrtpy_raise_rc(rc, "unlink_shm");
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
    if (lrtpy_get_window(buf, offset, &view, &base, &avail) < 0) return NULL;
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

PyMethodDef lrtpy_module_functions[] = {
    {"ring_required_bytes", (PyCFunction)(void (*)(void))m_ring_required_bytes, METH_VARARGS | METH_KEYWORDS,
     "ring_required_bytes(capacity, max_agents=0) -> bytes: a ring of `capacity` elements whose agent table\n"
     "holds max_agents threads (0: DEFAULT_AGENTS)"},
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

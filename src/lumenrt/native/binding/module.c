/* lumenrt.native._core: the thin CPython binding over the native core (native/). This file holds
 * only the module definition and PyInit__core; each type lives in its own file and internal.h
 * lists them and the rules they share (ownership of buffers, the GIL, errors).
 *
 * Invariants
 *   1. Single-phase init (m_size -1): one module object per process, so the exception objects and
 *      static types are process-wide and never freed.
 *   2. Every type is readied before the module object exists; a failure at any step returns NULL
 *      with the exception set and leaves no half-built module behind (it is released).
 *   3. RingClosed and PoolExhausted subclass LrtError (a RuntimeError): `except LrtError` catches
 *      every error the native core reports that has no builtin Python equivalent.
 *
 * Initialisation order
 *   1. PyType_Ready every type.
 *   2. Create the module object.
 *   3. Create LrtError, then its subclasses RingClosed and PoolExhausted.
 *   4. Add the exceptions, the types and the constants.
 */
#include "internal.h"

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "lumenrt.native._core",
                                       "Thin binding over the lumenrt native core.", -1, lrtpy_module_functions};

PyMODINIT_FUNC PyInit__core(void) {
    PyTypeObject *types[] = {&lrtpy_item_type,       &lrtpy_region_type,     &lrtpy_ring_type,
                             &lrtpy_slab_pool_type,  &lrtpy_bump_arena_type, &lrtpy_notifier_type,
                             &lrtpy_latches_type};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    lrtpy_lrt_error = PyErr_NewException("lumenrt.native.LrtError", PyExc_RuntimeError, NULL);
    lrtpy_ring_closed = PyErr_NewException("lumenrt.native.RingClosed", lrtpy_lrt_error, NULL);
    lrtpy_pool_exhausted = PyErr_NewException("lumenrt.native.PoolExhausted", lrtpy_lrt_error, NULL);
    if (PyModule_AddObjectRef(m, "LrtError", lrtpy_lrt_error) < 0 ||
        PyModule_AddObjectRef(m, "RingClosed", lrtpy_ring_closed) < 0 ||
        PyModule_AddObjectRef(m, "PoolExhausted", lrtpy_pool_exhausted) < 0 ||
        PyModule_AddObjectRef(m, "Item", (PyObject *)&lrtpy_item_type) < 0 ||
        PyModule_AddObjectRef(m, "Region", (PyObject *)&lrtpy_region_type) < 0 ||
        PyModule_AddObjectRef(m, "Ring", (PyObject *)&lrtpy_ring_type) < 0 ||
        PyModule_AddObjectRef(m, "SlabPool", (PyObject *)&lrtpy_slab_pool_type) < 0 ||
        PyModule_AddObjectRef(m, "BumpArena", (PyObject *)&lrtpy_bump_arena_type) < 0 ||
        PyModule_AddObjectRef(m, "Notifier", (PyObject *)&lrtpy_notifier_type) < 0 ||
        PyModule_AddObjectRef(m, "Latches", (PyObject *)&lrtpy_latches_type) < 0 ||
        PyModule_AddIntConstant(m, "LATCH_STRIDE", LRT_LATCH_STRIDE) < 0 ||
        PyModule_AddIntConstant(m, "NOTIFIER_BYTES", LRT_NOTIFIER_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "MAX_AGENTS", LRT_RING_MAX_AGENTS) < 0 ||
        PyModule_AddIntConstant(m, "DEFAULT_AGENTS", LRT_RING_DEFAULT_AGENTS) < 0 ||
        PyModule_AddIntConstant(m, "CACHELINE", LRT_CACHELINE) < 0 ||
        PyModule_AddObjectRef(m, "HOLD_DONE", PyLong_FromUnsignedLongLong(LRT_HOLD_DONE)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

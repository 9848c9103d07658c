/* lumenrt.native._core: what the binding's files share (not part of any public API).
 *
 * The module is built from one file per Python type (see CMakeLists.txt at the repository root):
 *   module.c      the module definition and PyInit__core (exceptions, types, constants)
 *   common.c      the exceptions, lrt status -> Python exception, FASTCALL argument parsing,
 *                 integer/timeout conversion, buffer windows
 *   item.c        Item          region.c     Region          slab_pool.c   SlabPool
 *   ring.c        Ring (create, push/pop, close, recover, stats)
 *   ring_batch.c  Ring.pop_many, Ring.pop_many_hold, Ring.push_wait (batches, latches, holds)
 *   bump_arena.c  BumpArena     latches.c    Latches         notifier.c    Notifier
 *   functions.c   the module-level functions (sizes, shm names, processes, holds, clock)
 *
 * Rules every file keeps
 *   1. Names shared between files start with lrtpy_ and are hidden (C_VISIBILITY_PRESET in
 *      CMakeLists.txt), so the module does not export them; everything else is static to its file.
 *   2. Ownership: a Region owns its mapping; every object built over a buffer (Ring, SlabPool,
 *      BumpArena, Latches, Notifier) holds a Py_buffer export of it from creation until its
 *      tp_dealloc, which frees the lrt_* handle first and releases the export last, so the memory
 *      cannot be unmapped under a live handle (Region.close() raises BufferError meanwhile).
 *   3. The GIL: hot calls (try_push, try_pop, push/pop that need not wait) keep it and allocate only
 *      the result. A call that must wait releases it and sleeps with exactly the caller's timeout;
 *      a signal ends the sleep (LRT_EINTR), Python's handlers run with the GIL held, and the wait
 *      goes on until the original deadline unless a handler raised.
 *   4. Errors: a function that fails returns NULL (or -1) with a Python exception set. An lrt
 *      status becomes an exception through lrtpy_raise_rc(), unless the call raises a more precise
 *      one itself (a double free is a ValueError; an exhausted pool or arena, a bad shm name or
 *      prefix, a bad alignment get messages that name the sizes or the argument).
 */
#ifndef LRTPY_INTERNAL_H
#define LRTPY_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "lrt/lrt.h"

/* ---- common.c: exceptions, argument conversion, buffer windows ---------------------------- */

/* lumenrt.native.LrtError (a RuntimeError) and its subclasses; created by PyInit__core. */
extern PyObject *lrtpy_lrt_error, *lrtpy_ring_closed, *lrtpy_pool_exhausted;

/* Raise the Python exception for lrt status `rc` ("what: reason") and return NULL. */
PyObject *lrtpy_raise_rc(int rc, const char *what);

/* FASTCALL arguments: positional then keyword, matched by name into out[0..n_names); the first
 * n_required must be given. 0, or -1 with TypeError set. */
int lrtpy_parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
                int n_names, int n_required, PyObject **out, const char *fname);

/* Conversions of an optional argument (NULL: absent, leaves *v as it is / the default). 0 or -1
 * with ValueError naming `field`. */
int lrtpy_as_u64(PyObject *o, uint64_t *v, const char *field);
int lrtpy_as_u32(PyObject *o, uint32_t *v, const char *field);
int lrtpy_as_timeout_ns(PyObject *o, int64_t *ns); /* timeout_s: None/absent = forever (-1) */
int lrtpy_as_spin_ns(PyObject *o, int64_t *ns);    /* spin_ns >= 0; absent = 0 */
/* max_agents: an int in [0, LRT_RING_MAX_AGENTS] (0: the default table); ValueError naming it. */
int lrtpy_check_max_agents(long long v, uint32_t *out);

/* A writable, cache-line-aligned window buf[offset:] (*base, *avail bytes). On success the caller
 * owns `view` and must PyBuffer_Release it (or keep it for the lifetime of a handle). */
int lrtpy_get_window(PyObject *buf, Py_ssize_t offset, Py_buffer *view, char **base, size_t *avail);

/* The (buffer, offset=0) arguments every type's ``attach`` takes, and the window they name
 * (lrtpy_get_window: the same ownership of `view`). */
int lrtpy_attach_window(PyObject *args, PyObject *kw, PyObject **buf, Py_ssize_t *offset, Py_buffer *view,
                        char **base, size_t *avail);

/* ---- the types ----------------------------------------------------------------------------- */

extern PyTypeObject lrtpy_item_type, lrtpy_region_type, lrtpy_ring_type, lrtpy_slab_pool_type,
    lrtpy_bump_arena_type, lrtpy_latches_type, lrtpy_notifier_type;

/* item.c: a new Item holding a copy of *d. */
PyObject *lrtpy_item_new(const lrt_desc *d);

/* ring.c / ring_batch.c */
typedef struct {
    PyObject_HEAD
    lrt_ring *r;      /* freed in tp_dealloc, before `view` is released */
    Py_buffer view;   /* export of the memory the ring lives in */
    PyObject *kind_name;
} RingObject;

/* The descriptor fields, in the order of the push methods' arguments. */
#define N_DESC_ARGS 8
int lrtpy_desc_from_args(PyObject **a, lrt_desc *d);

/* Wait with the GIL released; after a signal, run Python's handlers and wait for the rest of the
 * time. Returns an lrt status, or `error_rc` (not an lrt status) with a Python exception set. */
typedef int (*lrtpy_wait_fn)(RingObject *, void *, int64_t);
int lrtpy_wait_released(RingObject *self, lrtpy_wait_fn fn, void *arg, int64_t timeout_ns, int error_rc);

PyObject *lrtpy_ring_pop_many(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *lrtpy_ring_pop_many_hold(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *lrtpy_ring_push_wait(RingObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* latches.c */
typedef struct {
    PyObject_HEAD
    char *base;       /* latch 0, inside `view` */
    Py_ssize_t n;
    int pshared;      /* futex words shared between processes */
    Py_buffer view;   /* released in tp_dealloc */
} LatchesObject;

/* The latch at Python index `index`, or NULL with IndexError/TypeError set. */
lrt_latch *lrtpy_latch_of(LatchesObject *self, PyObject *index);
/* Wait with the GIL released, running signal handlers between sleeps. 1 = set, 0 = timed out,
 * -1 = a handler raised. */
int lrtpy_latch_wait_released(lrt_latch *l, int pshared, int64_t spin_ns, int64_t timeout_ns);

/* ---- functions.c ---------------------------------------------------------------------------- */

extern PyMethodDef lrtpy_module_functions[];

#endif

/* lumenrt native core: shared definitions.
 *
 * The core is plain C11 (no Python.h). Every structure that lives in a caller-given memory region
 * is position independent (offsets, never pointers) so that the same region works for threads of one
 * process and for processes that map the same POSIX shared-memory segment.
 */
#ifndef LRT_COMMON_H
#define LRT_COMMON_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LRT_CACHELINE 64u

/* Status codes. 0 is success; every error is negative so `rc < 0` tests for failure. */
enum {
    LRT_OK = 0,
    LRT_EMPTY = -1,      /* try_pop on an empty ring */
    LRT_FULL = -2,       /* try_push on a full ring */
    LRT_TIMEOUT = -3,    /* a blocking call reached its deadline */
    LRT_CLOSED = -4,     /* ring closed: pushes refused, pops refused once drained */
    LRT_EINVAL = -5,     /* bad argument (capacity not a power of two, size too small, ...) */
    LRT_EBADREGION = -6, /* attach: the region holds no valid structure of this kind/version */
    LRT_EXHAUSTED = -7,  /* slab pool or bump arena has no room */
    LRT_EDOUBLEFREE = -8,/* slab slot freed twice or never allocated */
    LRT_EAGENTS = -9,    /* more live threads use one ring than its agent table holds */
    LRT_EMISUSE = -10,   /* spsc ring used by a second live producer or consumer */
    LRT_ESYS = -11,      /* a system call failed; errno holds the cause */
    LRT_EEXIST = -12,    /* shared-memory segment already exists */
    LRT_ENOENT = -13,    /* shared-memory segment does not exist */
    LRT_EINTR = -14,     /* an interruptible wait was interrupted by a signal (lrt_ring_set_interruptible) */
};

/* Human-readable text for a status code (static storage, never NULL). */
const char *lrt_strerror(int rc);

/* CLOCK_MONOTONIC in nanoseconds (vDSO: no system call with the tsc clocksource). Same clock as
 * Python's time.monotonic_ns(). */
uint64_t lrt_now_ns(void);

/* The 56-byte descriptor carried by every ring element. The ring never interprets it, except
 * `flags & LRT_DESC_TOMBSTONE`, which the ring itself sets on a cell repaired after a producer died
 * mid-push; such a cell is skipped and never returned. */
typedef struct lrt_desc {
    uint64_t request_id;
    uint32_t slot;       /* arena slot index holding the payload (caller-defined) */
    uint32_t nbytes;     /* payload size in bytes (caller-defined) */
    uint64_t t_ns;       /* a timestamp, e.g. enqueue time, CLOCK_MONOTONIC ns (caller-defined) */
    uint64_t aux[3];     /* free words for the caller (model id, deadline, batch index, ...) */
    uint32_t kind;       /* caller-defined message kind */
    uint32_t flags;      /* bit 31 reserved by the ring (LRT_DESC_TOMBSTONE) */
} lrt_desc;

#define LRT_DESC_TOMBSTONE 0x80000000u

_Static_assert(sizeof(lrt_desc) == 56, "descriptor must leave 8 bytes of a cache line for the sequence");

#ifdef __cplusplus
}
#endif
#endif

/* lumenrt native core: internals shared by the ring implementations.
 *
 * Region layout of a ring (all offsets from the region start, every block on its own cache line):
 *
 *   lrt_ring_hdr   immutable config | tail (producers) | head (consumers) | wait masks + closed |
 *                  counters | mutex (mutex kinds) / spsc owners | agents[LRT_MAX_AGENTS]
 *   lrt_cell[capacity]  8-byte sequence + 56-byte descriptor = one cache line each
 *
 * Agents. Each thread that touches a ring owns one entry of agents[] (looked up through a
 * thread-local cache, registered on first use: the only system calls are at registration). An
 * agent holds
 *   - its own futex words (pop_word, push_word): a sleeper is woken individually (wake-one, no
 *     thundering herd), and a dead sleeper costs at most one wasted FUTEX_WAKE, after which the bit
 *     that named it is gone;
 *   - MPMC claim records (push_claim, pop_claim = position + 1 while between claiming a cell and
 *     publishing/releasing it), which let lrt_ring_recover() repair a cell left half-done by a
 *     process killed in that window.
 */
#ifndef LRT_INTERNAL_H
#define LRT_INTERNAL_H

#include <stdatomic.h>
#include <pthread.h>
#include "lrt/ring.h"

#if defined(__x86_64__) || defined(__i386__)
#define LRT_CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define LRT_CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define LRT_CPU_RELAX() ((void)0)
#endif

#define LRT_ALIGNED __attribute__((aligned(64)))
#define LRT_RING_MAGIC 0x4c525452494e4731ull /* "LRTRING1" */
#define LRT_RING_VERSION 1u

/* agents[i].owner while one recoverer resolves a dead agent: only the CAS winner touches it. */
#define LRT_OWNER_RECLAIMING UINT64_MAX

/* Set in a cell's sequence while lrt_ring_recover() rewrites it; consumers read it as "not ready". */
#define LRT_SEQ_REPAIR (1ull << 63)

typedef struct lrt_agent {
    _Atomic uint64_t owner;      /* (pid << 32) | tid; 0 = free */
    _Atomic uint64_t starttime;  /* owner's process start time, to tell a reused pid */
    _Atomic uint64_t push_claim; /* MPMC: position + 1 claimed and not yet published, else 0 */
    _Atomic uint64_t pop_claim;  /* MPMC: position + 1 claimed and not yet released, else 0 */
    _Atomic uint32_t pop_word;   /* futex this agent sleeps on in pop; bumped by the waker */
    _Atomic uint32_t push_word;  /* futex this agent sleeps on in push */
    uint8_t pad_[LRT_CACHELINE - 40];
} lrt_agent;
_Static_assert(sizeof(lrt_agent) == LRT_CACHELINE, "one agent per cache line");

typedef struct lrt_cell {
    _Atomic uint64_t seq; /* MPMC: Vyukov sequence; unused by the other kinds */
    lrt_desc d;
} lrt_cell;
_Static_assert(sizeof(lrt_cell) == LRT_CACHELINE, "one cell per cache line");

typedef struct lrt_ring_hdr {
    /* immutable after create */
    uint64_t magic;
    uint32_t version;
    uint32_t kind;
    uint64_t capacity;
    uint64_t uid;         /* random id: keys the thread-local agent cache */
    uint32_t flags;
    int32_t spin_iters;
    int32_t yield_iters;
    uint32_t pad0_;

    LRT_ALIGNED _Atomic uint64_t tail; /* next position a producer claims */
    LRT_ALIGNED _Atomic uint64_t head; /* next position a consumer claims */

    /* Read by every push (pop_mask) and pop (push_mask) after a fence; written only when a thread
     * goes to sleep or is woken, so this line stays shared-clean while the ring is busy. */
    LRT_ALIGNED _Atomic uint64_t pop_mask;  /* bit i: agent i sleeps (or is about to) in pop */
    _Atomic uint64_t push_mask;             /* bit i: agent i sleeps in push */
    _Atomic uint32_t closed;
    _Atomic uint64_t pop_spin_mask; /* bit i: agent i is in its timed pop spin (a push wakes no one) */

    /* slow-path counters */
    LRT_ALIGNED _Atomic uint64_t futex_waits;
    _Atomic uint64_t futex_wakes;
    _Atomic uint64_t tombstones;
    _Atomic uint64_t released;

    /* NAIVE / BATCHED: the one lock. SPSC: the agents that own each end. */
    LRT_ALIGNED pthread_mutex_t mtx;
    _Atomic int32_t spsc_producer; /* agent index, -1 = none */
    _Atomic int32_t spsc_consumer;

    LRT_ALIGNED lrt_agent agents[LRT_MAX_AGENTS];
} lrt_ring_hdr;

_Static_assert(offsetof(lrt_ring_hdr, tail) % LRT_CACHELINE == 0, "tail on its own line");
_Static_assert(offsetof(lrt_ring_hdr, head) - offsetof(lrt_ring_hdr, tail) >= LRT_CACHELINE,
               "head and tail on separate cache lines");
_Static_assert(offsetof(lrt_ring_hdr, pop_mask) - offsetof(lrt_ring_hdr, head) >= LRT_CACHELINE,
               "wait masks off the head line");
_Static_assert(sizeof(lrt_ring_hdr) % LRT_CACHELINE == 0, "cells start on a cache line");
_Static_assert(LRT_MAX_AGENTS <= 64, "wait masks are 64-bit");

/* Process-local handle. */
struct lrt_ring {
    lrt_ring_hdr *hdr;
    lrt_cell *cells;
    uint64_t mask;
    uint32_t kind;
    int futex_private;
    int interruptible;
    int64_t spin_ns; /* this handle's timed spin before sleeping (lrt_ring_set_spin_ns); 0 = none */
    /* SPSC: each end caches the other end's position to avoid touching its line. */
    LRT_ALIGNED uint64_t prod_cached_head;
    LRT_ALIGNED uint64_t cons_cached_tail;
};

/* agents.c */
int lrt_agent_index(lrt_ring *r);               /* this thread's agent (registers on first use) */
int lrt_agent_alive(const lrt_agent *a);        /* slow: reads /proc */
int lrt_agent_thread_alive(const lrt_agent *a); /* slow: the owning thread itself still runs */
/* Free agent i, which the caller owns in state LRT_OWNER_RECLAIMING (claims resolved). */
/* Returns 1 if the agent was in its timed spin: pushes may have skipped waking sleepers because of
 * it, so the caller wakes them all (lrt_wake_all). */
int lrt_agent_release(lrt_ring_hdr *h, int i);
void lrt_wake_one(lrt_ring *r, _Atomic uint64_t *mask, int pop_side);
void lrt_wake_all(lrt_ring *r);
int lrt_futex_wait(lrt_ring *r, _Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns);

/* Called after a push (pop side) or a pop (push side) has published: wake one sleeper if any.
 * seq_cst fence: pairs with the sleeper's fetch_or on the mask followed by its re-check of the
 * ring (Dekker): either the sleeper sees our element or we see its bit. */
static inline void lrt_after_push(lrt_ring *r) {
    atomic_thread_fence(memory_order_seq_cst);
    /* A consumer still in its timed spin will take this element (it re-checks the ring after it
     * stops spinning, see wait_loop), so a sleeper is left asleep: no system call, and no idle
     * worker woken only to find the ring empty again. */
    if (atomic_load_explicit(&r->hdr->pop_spin_mask, memory_order_relaxed) != 0) return;
    if (atomic_load_explicit(&r->hdr->pop_mask, memory_order_relaxed) != 0)
        lrt_wake_one(r, &r->hdr->pop_mask, 1);
}
static inline void lrt_after_pop(lrt_ring *r, int n_freed) {
    atomic_thread_fence(memory_order_seq_cst);
    /* n cells freed: up to n producers can proceed */
    for (int i = 0; i < n_freed && atomic_load_explicit(&r->hdr->push_mask, memory_order_relaxed) != 0; i++)
        lrt_wake_one(r, &r->hdr->push_mask, 0);
}

/* kind-specific try operations (ring_mpmc.c, ring_spsc.c, ring_mutex.c) */
int lrt_mpmc_try_push(lrt_ring *r, const lrt_desc *d);
int lrt_mpmc_try_pop(lrt_ring *r, lrt_desc *out, lrt_hold *hold);
int lrt_mpmc_recover(lrt_ring *r, lrt_desc *lost, int max_lost);
int lrt_mpmc_stalled(const lrt_ring *r, int pop_side);
int lrt_spsc_try_push(lrt_ring *r, const lrt_desc *d);
int lrt_spsc_try_pop_many(lrt_ring *r, lrt_desc *out, int max_n, lrt_hold *hold);
int lrt_mutex_init(lrt_ring_hdr *h);
int lrt_mutex_try_push(lrt_ring *r, const lrt_desc *d);
int lrt_mutex_try_pop_many(lrt_ring *r, lrt_desc *out, int max_n, lrt_hold *hold);

/* Record a popped descriptor in the consumer's hold before the ring gives its cell up. */
static inline void lrt_hold_put(lrt_hold *h, const lrt_desc *d) {
    if (!h) return;
    h->entries[h->pos % h->capacity] = *d;
    /* release: the entry is complete before the caller's release store of the cell, which a
     * supervisor orders after the consumer's death (it reads after waitpid) */
    atomic_store_explicit((_Atomic uint32_t *)&h->pos, h->pos + 1, memory_order_release);
}

#endif

/* lumenrt native core: bounded rings, one interface over four implementations.
 *
 *   LRT_RING_MPMC     lock-free multi-producer multi-consumer (Vyukov), any number of threads/processes
 *   LRT_RING_SPSC     lock-free single-producer single-consumer
 *   LRT_RING_NAIVE    one robust process-shared mutex; pop_many takes the lock once per element
 *   LRT_RING_BATCHED  the same mutex ring, but pop_many drains up to N elements per lock acquisition
 *
 * A ring lives entirely in a caller-given region (lrt_ring_required_bytes_agents()), initialised once
 * by lrt_ring_create() and mapped by any number of lrt_ring_attach() calls, in this process or in
 * others that map the same shared memory. The lrt_ring handle is process-local and is freed by
 * lrt_ring_free(); the region belongs to the caller, who must keep it mapped while handles exist.
 *
 * Blocking calls (push, pop, pop_many) spin, then yield, then sleep on a futex. No system call is
 * made on the path where the ring is neither empty nor full: a producer enters the kernel only when a
 * consumer is really asleep (and vice versa), as counted by lrt_ring_stats.futex_wakes.
 *
 * Timeouts are in nanoseconds: timeout_ns < 0 waits forever, 0 behaves like the try_ call. An
 * untimed sleep is cheaper than a timed one: on the 2-core VM this was developed on, a timed futex
 * wait added ~3.5 us to the wake-up (p50 7.2 us vs 3.7 us, C producer and consumer processes).
 */
#ifndef LRT_RING_H
#define LRT_RING_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lrt_ring_kind {
    LRT_RING_MPMC = 1,
    LRT_RING_SPSC = 2,
    LRT_RING_NAIVE = 3,
    LRT_RING_BATCHED = 4,
} lrt_ring_kind;

/* Agents: the threads (across all processes) that may use one ring at the same time. Each thread
 * registers once per ring, lazily, on its first call, and holds its entry of the ring's agent table
 * until it is recycled: the entry of a dead process by lrt_ring_recover(), the entry of an exited
 * thread on the next registration that finds the table full. A call made by one thread more than
 * the table holds fails with LRT_EAGENTS. The table's size (max_agents) is chosen at create:
 * lrt_ring_config.max_agents, 0 for LRT_RING_DEFAULT_AGENTS, at most LRT_RING_MAX_AGENTS. It costs
 * 64 bytes of region per entry; the wake-up check after every push and pop reads one 64-bit word
 * per 64 entries in use (registered at some time: entries are taken lowest first), so a table
 * larger than the threads that really use it costs memory only. */
#define LRT_RING_DEFAULT_AGENTS 64
#define LRT_RING_MAX_AGENTS 4096

/* Flags for lrt_ring_config.flags */
#define LRT_RING_PSHARED 0x1u /* region is shared between processes (futexes must not be private) */

typedef struct lrt_ring_config {
    uint32_t kind;        /* lrt_ring_kind */
    uint32_t flags;       /* LRT_RING_* */
    uint64_t capacity;    /* elements, power of two, >= 2 */
    int32_t spin_iters;   /* busy polls before yielding; < 0 = default for the kind */
    int32_t yield_iters;  /* sched_yield polls before sleeping; < 0 = default for the kind */
    uint32_t max_agents;  /* agent table entries; 0 = LRT_RING_DEFAULT_AGENTS, <= LRT_RING_MAX_AGENTS */
    uint32_t reserved_;   /* 0 */
} lrt_ring_config;

typedef struct lrt_ring lrt_ring;

typedef struct lrt_ring_stats {
    uint64_t capacity;
    uint64_t len;
    uint64_t pushed;         /* elements pushed since create (tail position) */
    uint64_t popped;         /* elements popped since create (head position) */
    uint64_t futex_waits;    /* times a thread went to sleep */
    uint64_t futex_wakes;    /* FUTEX_WAKE system calls made */
    uint64_t tombstones;     /* cells repaired after a producer died mid-push */
    uint64_t released;       /* cells repaired after a consumer died mid-pop */
    uint32_t closed;
    uint32_t agents;         /* registered agent entries */
    uint32_t max_agents;     /* entries in the agent table */
    uint32_t agent_words;    /* 64-entry words of the table in use so far (read by every wake check) */
} lrt_ring_stats;

/* Region bytes for a ring of `capacity` elements and an agent table of `max_agents` entries (0: the
 * default); SIZE_MAX for a capacity or table that lrt_ring_create refuses. */
size_t lrt_ring_required_bytes_agents(uint64_t capacity, uint32_t max_agents);
/* lrt_ring_required_bytes_agents(capacity, LRT_RING_DEFAULT_AGENTS) */
size_t lrt_ring_required_bytes(uint64_t capacity);

/* Initialise a ring in `region` (at least lrt_ring_required_bytes_agents(capacity, max_agents),
 * 64-byte aligned) and return a handle in *out. LRT_EINVAL for a bad config (capacity not a power of
 * two in [2, 2**32], unknown kind, max_agents above LRT_RING_MAX_AGENTS) or a region too small. */
int lrt_ring_create(void *region, size_t region_bytes, const lrt_ring_config *cfg, lrt_ring **out);
/* Map a handle onto a region already initialised by lrt_ring_create (possibly in another process). */
int lrt_ring_attach(void *region, size_t region_bytes, lrt_ring **out);
/* Free the process-local handle (the region is the caller's). */
void lrt_ring_free(lrt_ring *r);

/* This handle's timed spin: a blocking call that finds the ring empty (full) polls it for up to
 * spin_ns before sleeping, after the kind's spin_iters/yield_iters. Process-local, so each consumer
 * chooses (0, the default, sleeps at once). Worth it where a wake-up costs more than the gap
 * between requests: see lrt/latch.h. */
void lrt_ring_set_spin_ns(lrt_ring *r, int64_t spin_ns);
int64_t lrt_ring_spin_ns(const lrt_ring *r);

int lrt_ring_try_push(lrt_ring *r, const lrt_desc *d);
int lrt_ring_push(lrt_ring *r, const lrt_desc *d, int64_t timeout_ns);
int lrt_ring_try_pop(lrt_ring *r, lrt_desc *out);
int lrt_ring_pop(lrt_ring *r, lrt_desc *out, int64_t timeout_ns);
/* Wait (up to timeout_ns) for at least one element, then take every element available up to
 * max_n without waiting further. Returns the count (> 0) or a negative status. */
int lrt_ring_pop_many(lrt_ring *r, lrt_desc *out, int max_n, int64_t timeout_ns);

/* Interruptible handles return LRT_EINTR from a blocking call whose sleep a signal interrupted
 * (so that a language runtime can run its signal handlers, then call again); by default the wait
 * simply goes on. Per handle, not shared. */
void lrt_ring_set_interruptible(lrt_ring *r, int on);

/* A per-consumer record of the descriptors it has popped and not finished, kept in memory that a
 * supervisor can read after the consumer dies (shared memory). lrt_ring_pop_many_hold() writes
 * each popped descriptor to entries[pos % capacity] (and advances pos) BEFORE the ring gives the
 * cell up, so at every instant a popped descriptor is either still claimed in the ring (reported by
 * lrt_ring_recover) or in the hold: a consumer killed anywhere cannot take a request silently.
 * The consumer marks an entry finished by setting its request_id to LRT_HOLD_DONE. One writer. */
#define LRT_HOLD_DONE UINT64_MAX
typedef struct lrt_hold {
    uint32_t capacity; /* entries; the consumer keeps fewer than this many unfinished at once */
    uint32_t pos;      /* next entry to write (mod capacity) */
    uint8_t pad_[56];
    lrt_desc entries[];
} lrt_hold;
size_t lrt_hold_required_bytes(uint32_t capacity);
void lrt_hold_init(lrt_hold *h, uint32_t capacity); /* every entry LRT_HOLD_DONE */

/* lrt_ring_pop_many, recording each popped descriptor in `hold` first (see lrt_hold). */
int lrt_ring_pop_many_hold(lrt_ring *r, lrt_desc *out, int max_n, int64_t timeout_ns, lrt_hold *hold);

/* Refuse further pushes and wake every waiter. Elements already in the ring can still be popped;
 * once it is drained, pops return LRT_CLOSED. Idempotent. */
void lrt_ring_close(lrt_ring *r);
int lrt_ring_is_closed(const lrt_ring *r);

uint64_t lrt_ring_len(const lrt_ring *r);
uint64_t lrt_ring_capacity(const lrt_ring *r);
uint32_t lrt_ring_max_agents(const lrt_ring *r);
lrt_ring_kind lrt_ring_get_kind(const lrt_ring *r);
void lrt_ring_get_stats(const lrt_ring *r, lrt_ring_stats *out);

/* Repair after dead processes (slow path, makes system calls). For every agent whose process is
 * gone: an MPMC cell it had claimed for a push but never published becomes a tombstone that
 * consumers skip; a cell it had claimed for a pop but never released is released, and its
 * descriptor is copied to lost[] (up to max_lost) so the owner can fail that request; its wait
 * registrations are dropped and its entry freed. Returns the number of lost descriptors (at most
 * one per agent entry, so at most lrt_ring_max_agents(); it may exceed max_lost) or a negative
 * status. Blocking pops and pushes call this by themselves when they
 * find the ring stalled by an unpublished claim. */
int lrt_ring_recover(lrt_ring *r, lrt_desc *lost, int max_lost);

const char *lrt_ring_kind_name(lrt_ring_kind kind);
int lrt_ring_kind_from_name(const char *name); /* kind, or LRT_EINVAL */

#ifdef __cplusplus
}
#endif
#endif

/* lumenrt native core: internals shared by the ring implementations.
 *
 * Region layout of a ring (all offsets from the region start, every block on its own cache line):
 *
 *   lrt_ring_hdr   immutable config | tail (producers) | head (consumers) | closed + words in use |
 *                  counters | mutex (mutex kinds) / spsc owners
 *   lrt_wait_word waits[nwords]   wait masks: 64 agents per word, two words per cache line
 *   lrt_agent agents[max_agents]  one cache line each
 *   lrt_cell cells[capacity]      8-byte sequence + 56-byte descriptor = one cache line each
 *
 * where nwords = ceil(max_agents / 64) and max_agents is chosen at create (lrt_ring_config).
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
 *
 * Wait masks. Agent i is bit i % 64 of word i / 64 of three masks: pop (asleep, or about to be, in
 * a pop), push (in a push) and spin (in its timed pop spin). The check every push and pop makes
 * (lrt_after_push, lrt_after_pop) reads only the words in use:
 *   W1. words_used never decreases, and is >= i / 64 + 1 once agent i has registered: registration
 *       raises it (seq_cst RMW; or reads it raised already) before the agent can set any bit. So a
 *       check that reads words_used after its fence sees every word in which a bit set before the
 *       sleeper's fence can lie (the same fence pair as the bit itself, below).
 *   W2. Registration takes the lowest free entry, so words_used counts, in words of 64, the most
 *       entries held at once (entries of exited threads included until they are reused): a table
 *       larger than its users costs memory only. A table of at most 64 entries has one word, read
 *       directly (words_used is not read): the check is a fence and two loads of one cache line,
 *       as it was before tables grew.
 *   W3. Each word pairs with the check exactly as a single mask did (Dekker: the sleeper's RMW on
 *       its word then fence, against the checker's fence then load of that word), so every
 *       invariant stated for one mask (agents.c, ring.c) holds word by word; nothing compares or
 *       updates two words together.
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
#define LRT_RING_VERSION 2u /* 2: agent table of max_agents entries and wait words after the header */

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

/* One 64-agent word of each wait mask (see "Wait masks" at the top). Read by every push (pop,
 * spin) and pop (push) after a fence; written only when a thread goes to sleep, spins or is woken,
 * so its line stays shared-clean while the ring is busy. */
enum { LRT_WAIT_POP = 0, LRT_WAIT_PUSH = 1, LRT_WAIT_SPIN = 2 };
typedef struct lrt_wait_word {
    /* [LRT_WAIT_POP] bit b: agent 64k + b sleeps (or is about to) in pop;
     * [LRT_WAIT_PUSH] ... sleeps in push; [LRT_WAIT_SPIN] ... is in its timed pop spin (a push
     * wakes no one while a bit is set) */
    _Atomic uint64_t m[3];
    uint64_t pad_;
} lrt_wait_word;
_Static_assert(sizeof(lrt_wait_word) == 32, "two wait words per cache line");

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
    uint32_t max_agents;  /* entries of agents[]; the wait masks have ceil(max_agents / 64) words */

    LRT_ALIGNED _Atomic uint64_t tail; /* next position a producer claims */
    LRT_ALIGNED _Atomic uint64_t head; /* next position a consumer claims */

    /* Read by every push and pop; written once (closed) or at the registration of an agent in a
     * word not used before (words_used), so this line stays shared-clean. */
    LRT_ALIGNED _Atomic uint32_t closed;
    _Atomic uint32_t words_used; /* wait-mask words that may hold a bit (W1); 1 at create */

    /* slow-path counters */
    LRT_ALIGNED _Atomic uint64_t futex_waits;
    _Atomic uint64_t futex_wakes;
    _Atomic uint64_t tombstones;
    _Atomic uint64_t released;

    /* NAIVE / BATCHED: the one lock. SPSC: the agents that own each end. */
    LRT_ALIGNED pthread_mutex_t mtx;
    _Atomic int32_t spsc_producer; /* agent index, -1 = none */
    _Atomic int32_t spsc_consumer;
} lrt_ring_hdr;

_Static_assert(offsetof(lrt_ring_hdr, tail) % LRT_CACHELINE == 0, "tail on its own line");
_Static_assert(offsetof(lrt_ring_hdr, head) - offsetof(lrt_ring_hdr, tail) >= LRT_CACHELINE,
               "head and tail on separate cache lines");
_Static_assert(offsetof(lrt_ring_hdr, closed) - offsetof(lrt_ring_hdr, head) >= LRT_CACHELINE,
               "closed off the head line");
_Static_assert(sizeof(lrt_ring_hdr) % LRT_CACHELINE == 0, "wait words start on a cache line");
_Static_assert(LRT_RING_MAX_AGENTS % 64 == 0 && LRT_RING_MAX_AGENTS <= (1 << 20), "agent indices fit");

static inline uint32_t lrt_wait_words(uint32_t max_agents) { return (max_agents + 63) / 64; }
/* Bytes of the wait words, whole cache lines. */
static inline size_t lrt_wait_bytes(uint32_t max_agents) {
    size_t b = (size_t)lrt_wait_words(max_agents) * sizeof(lrt_wait_word);
    return (b + LRT_CACHELINE - 1) & ~(size_t)(LRT_CACHELINE - 1);
}

/* Process-local handle. The pointers and sizes are derived from the header's immutable fields. */
struct lrt_ring {
    lrt_ring_hdr *hdr;
    lrt_wait_word *waits; /* [nwords] */
    lrt_agent *agents;    /* [max_agents] */
    lrt_cell *cells;
    uint64_t mask;
    uint32_t max_agents;
    uint32_t nwords;
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
int lrt_agent_release(lrt_ring *r, int i);
/* Wake one sleeper of mask `which` (LRT_WAIT_POP or LRT_WAIT_PUSH); 1 if one was woken. */
int lrt_wake_one(lrt_ring *r, int which);
void lrt_wake_all(lrt_ring *r);
int lrt_futex_wait(lrt_ring *r, _Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns);

/* This agent's word and bit in the wait masks. */
static inline lrt_wait_word *lrt_wait_word_of(const lrt_ring *r, int agent) { return &r->waits[agent >> 6]; }
static inline uint64_t lrt_wait_bit(int agent) { return 1ull << (agent & 63); }

/* Words of the wait masks that may hold a bit (W1, W2): call after the fence. */
static inline uint32_t lrt_words_in_use(const lrt_ring *r) {
    if (r->nwords == 1) return 1;
    uint32_t n = atomic_load_explicit(&r->hdr->words_used, memory_order_relaxed);
    return n < r->nwords ? n : r->nwords; /* never past the table, whatever the region says */
}

/* Some bit of mask `which` is set in the first n words. */
static inline int lrt_any_waiting(const lrt_ring *r, uint32_t n, int which) {
    for (uint32_t k = 0; k < n; k++)
        if (atomic_load_explicit(&r->waits[k].m[which], memory_order_relaxed) != 0) return 1;
    return 0;
}

/* Called after a push (pop side) or a pop (push side) has published: wake one sleeper if any.
 * seq_cst fence: pairs with the sleeper's fetch_or on its mask word followed by its re-check of
 * the ring (Dekker, word by word: W3): either the sleeper sees our element or we see its bit. */
static inline void lrt_after_push(lrt_ring *r) {
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t n = lrt_words_in_use(r);
    /* A consumer still in its timed spin will take this element (it re-checks the ring after it
     * stops spinning, see wait_loop), so a sleeper is left asleep: no system call, and no idle
     * worker woken only to find the ring empty again. */
    if (lrt_any_waiting(r, n, LRT_WAIT_SPIN)) return;
    if (lrt_any_waiting(r, n, LRT_WAIT_POP)) lrt_wake_one(r, LRT_WAIT_POP);
}
static inline void lrt_after_pop(lrt_ring *r, int n_freed) {
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t n = lrt_words_in_use(r);
    /* n cells freed: up to n producers can proceed */
    for (int i = 0; i < n_freed && lrt_any_waiting(r, n, LRT_WAIT_PUSH); i++)
        if (!lrt_wake_one(r, LRT_WAIT_PUSH)) break;
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

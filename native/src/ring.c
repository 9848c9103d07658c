/* lumenrt native core: the ring interface — create/attach, dispatch by kind, blocking waits.
 *
 * Waiting (pop side; the push side mirrors it with the push mask and push_word):
 *   1. try; if the ring is empty, poll spin_iters times with a CPU pause, then yield_iters times with
 *      sched_yield (only now, with the ring really empty, may system calls happen);
 *   2. read my futex word w, set my bit in the pop mask (in my word of it: internal.h "Wait masks";
 *      seq_cst RMW + fence), try once more — a push that published before my bit was visible is
 *      seen here (Dekker pair with lrt_after_push);
 *   3. futex_wait(word, w, remaining); clear my bit; go to 2 until an element, close or deadline.
 * A wake-up between 2 and 3 bumps the word, so futex_wait returns at once: nothing is lost.
 *
 * Shutdown order
 *   1. lrt_ring_close(): closed = 1 (seq_cst), then wake every sleeper of both sides;
 *   2. pushes now return LRT_CLOSED; pops return what is left, then LRT_CLOSED;
 *   3. the caller frees handles (lrt_ring_free) and only then unmaps/unlinks the region.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Spin defaults: none. Measured on the 2-core VM this was developed on (one-way handoff to a
 * sleeping consumer process, 200 us apart, p50): no spin 3.3 us; 256 pauses 9.5 us; 4 sched_yield
 * 9.6 us — a consumer that burns CPU before sleeping gets woken on its own idle vCPU (a slow IPI)
 * instead of next to its producer. 2-producer/2-consumer throughput was also higher without spin
 * (4.1M vs 2.3M items/s), spinners stealing the producers' cores. On machines with spare cores a
 * short spin can pay off: measure with `benchmarks/queues.py --spin-iters N`. */
#define LRT_DEFAULT_SPIN 0
#define LRT_DEFAULT_YIELD 0

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

const char *lrt_ring_kind_name(lrt_ring_kind kind) {
    switch (kind) {
    case LRT_RING_MPMC: return "mpmc";
    case LRT_RING_SPSC: return "spsc";
    case LRT_RING_NAIVE: return "naive";
    case LRT_RING_BATCHED: return "batched";
    }
    return "unknown";
}

int lrt_ring_kind_from_name(const char *name) {
    for (int k = LRT_RING_MPMC; k <= LRT_RING_BATCHED; k++)
        if (strcmp(name, lrt_ring_kind_name((lrt_ring_kind)k)) == 0) return k;
    return LRT_EINVAL;
}

/* Offsets of the blocks after the header (internal.h, region layout). */
static size_t agents_offset(uint32_t max_agents) { return sizeof(lrt_ring_hdr) + lrt_wait_bytes(max_agents); }
static size_t cells_offset(uint32_t max_agents) {
    return agents_offset(max_agents) + (size_t)max_agents * sizeof(lrt_agent);
}

size_t lrt_ring_required_bytes_agents(uint64_t capacity, uint32_t max_agents) {
    if (max_agents == 0) max_agents = LRT_RING_DEFAULT_AGENTS;
    /* refused by create anyway; never overflow */
    if (capacity > (1ull << 32) || max_agents > LRT_RING_MAX_AGENTS) return SIZE_MAX;
    return cells_offset(max_agents) + (size_t)capacity * sizeof(lrt_cell);
}

size_t lrt_ring_required_bytes(uint64_t capacity) {
    return lrt_ring_required_bytes_agents(capacity, LRT_RING_DEFAULT_AGENTS);
}

static int make_handle(void *region, lrt_ring **out) {
    lrt_ring *r = NULL;
    if (posix_memalign((void **)&r, LRT_CACHELINE, sizeof(*r)) != 0) return LRT_ESYS;
    memset(r, 0, sizeof(*r));
    r->hdr = (lrt_ring_hdr *)region;
    r->max_agents = r->hdr->max_agents;
    r->nwords = lrt_wait_words(r->max_agents);
    r->waits = (lrt_wait_word *)((char *)region + sizeof(lrt_ring_hdr));
    r->agents = (lrt_agent *)((char *)region + agents_offset(r->max_agents));
    r->cells = (lrt_cell *)((char *)region + cells_offset(r->max_agents));
    r->mask = r->hdr->capacity - 1;
    r->kind = r->hdr->kind;
    r->futex_private = !(r->hdr->flags & LRT_RING_PSHARED);
    *out = r;
    return LRT_OK;
}

int lrt_ring_create(void *region, size_t region_bytes, const lrt_ring_config *cfg, lrt_ring **out) {
    if (!region || !cfg || !out || ((uintptr_t)region % LRT_CACHELINE) != 0) return LRT_EINVAL;
    uint64_t cap = cfg->capacity;
    if (cap < 2 || (cap & (cap - 1)) != 0 || cap > (1ull << 32)) return LRT_EINVAL;
    if (cfg->kind < LRT_RING_MPMC || cfg->kind > LRT_RING_BATCHED) return LRT_EINVAL;
    uint32_t max_agents = cfg->max_agents ? cfg->max_agents : LRT_RING_DEFAULT_AGENTS;
    if (max_agents > LRT_RING_MAX_AGENTS) return LRT_EINVAL;
    if (region_bytes < lrt_ring_required_bytes_agents(cap, max_agents)) return LRT_EINVAL;

    lrt_ring_hdr *h = (lrt_ring_hdr *)region;
    /* header, wait words and agent table: every mask bit clear, every entry free */
    memset(h, 0, cells_offset(max_agents));
    int mutex_kind = cfg->kind == LRT_RING_NAIVE || cfg->kind == LRT_RING_BATCHED;
    h->version = LRT_RING_VERSION;
    h->kind = cfg->kind;
    h->capacity = cap;
    h->max_agents = max_agents;
    atomic_init(&h->words_used, 1);
    h->flags = cfg->flags;
    h->uid = splitmix64(lrt_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)region);
    h->spin_iters = cfg->spin_iters >= 0 ? cfg->spin_iters : LRT_DEFAULT_SPIN;
    h->yield_iters = cfg->yield_iters >= 0 ? cfg->yield_iters : LRT_DEFAULT_YIELD;
    atomic_init(&h->spsc_producer, -1);
    atomic_init(&h->spsc_consumer, -1);
    lrt_cell *cells = (lrt_cell *)((char *)region + cells_offset(max_agents));
    for (uint64_t i = 0; i < cap; i++) {
        atomic_init(&cells[i].seq, i);
        memset(&cells[i].d, 0, sizeof(cells[i].d));
    }
    if (mutex_kind && lrt_mutex_init(h) != 0) return LRT_ESYS;
    /* release: attachers that acquire the magic see a fully initialised header */
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, LRT_RING_MAGIC, memory_order_release);
    return make_handle(region, out);
}

int lrt_ring_attach(void *region, size_t region_bytes, lrt_ring **out) {
    if (!region || !out || ((uintptr_t)region % LRT_CACHELINE) != 0) return LRT_EINVAL;
    if (region_bytes < sizeof(lrt_ring_hdr)) return LRT_EBADREGION;
    lrt_ring_hdr *h = (lrt_ring_hdr *)region;
    if (atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != LRT_RING_MAGIC ||
        h->version != LRT_RING_VERSION || h->kind < LRT_RING_MPMC || h->kind > LRT_RING_BATCHED ||
        h->capacity < 2 || (h->capacity & (h->capacity - 1)) != 0 || h->capacity > (1ull << 32) ||
        h->max_agents == 0 || h->max_agents > LRT_RING_MAX_AGENTS ||
        region_bytes < lrt_ring_required_bytes_agents(h->capacity, h->max_agents))
        return LRT_EBADREGION;
    return make_handle(region, out);
}

void lrt_ring_free(lrt_ring *r) { free(r); }

/* ---- non-blocking operations --------------------------------------------------------------- */

static int kind_try_push(lrt_ring *r, const lrt_desc *d) {
    switch (r->kind) {
    case LRT_RING_MPMC: return lrt_mpmc_try_push(r, d);
    case LRT_RING_SPSC: return lrt_spsc_try_push(r, d);
    default: return lrt_mutex_try_push(r, d);
    }
}

static int kind_try_pop_many(lrt_ring *r, lrt_desc *out, int max_n, lrt_hold *hold) {
    int n = 0, rc = LRT_EMPTY;
    switch (r->kind) {
    case LRT_RING_SPSC: return lrt_spsc_try_pop_many(r, out, max_n, hold);
    case LRT_RING_BATCHED: return lrt_mutex_try_pop_many(r, out, max_n, hold);
    case LRT_RING_NAIVE: /* one lock acquisition per element: the naive baseline */
        while (n < max_n && (rc = lrt_mutex_try_pop_many(r, out + n, 1, hold)) == 1) n++;
        break;
    default:
        while (n < max_n && (rc = lrt_mpmc_try_pop(r, out + n, hold)) == LRT_OK) n++;
        break;
    }
    return n > 0 ? n : (rc == LRT_OK || rc == 1 ? LRT_EMPTY : rc);
}

int lrt_ring_try_push(lrt_ring *r, const lrt_desc *d) {
    if (atomic_load_explicit(&r->hdr->closed, memory_order_relaxed)) return LRT_CLOSED;
    int rc = kind_try_push(r, d);
    if (rc == LRT_OK) lrt_after_push(r);
    return rc;
}

static int try_pop_many(lrt_ring *r, lrt_desc *out, int max_n, lrt_hold *hold) {
    /* acquire: read closed before looking at the ring, so "closed and empty" is never reported
     * while an element pushed before close() is still in the ring */
    uint32_t closed = atomic_load_explicit(&r->hdr->closed, memory_order_acquire);
    int n = kind_try_pop_many(r, out, max_n, hold);
    if (n > 0) {
        lrt_after_pop(r, n);
        return n;
    }
    return (n == LRT_EMPTY && closed) ? LRT_CLOSED : n;
}

int lrt_ring_try_pop(lrt_ring *r, lrt_desc *out) {
    int n = try_pop_many(r, out, 1, NULL);
    return n > 0 ? LRT_OK : n;
}

/* ---- blocking operations ------------------------------------------------------------------- */

#define STALL_SLICE_NS 2000000 /* 2 ms: how often a sleeper re-checks a ring stalled by a dead claim */

static int wait_loop(lrt_ring *r, int pop_side, lrt_desc *out, int max_n, const lrt_desc *in,
                     int64_t timeout_ns, lrt_hold *hold) {
    lrt_ring_hdr *h = r->hdr;
#define ATTEMPT() (pop_side ? try_pop_many(r, out, max_n, hold) : lrt_ring_try_push(r, in))
#define RETRY(rc) (pop_side ? (rc) == LRT_EMPTY : (rc) == LRT_FULL)
    int rc = ATTEMPT();
    if (!RETRY(rc) || timeout_ns == 0) return rc;
    uint64_t deadline = timeout_ns < 0 ? UINT64_MAX : lrt_now_ns() + (uint64_t)timeout_ns;

    for (int i = 0; i < h->spin_iters; i++) {
        LRT_CPU_RELAX();
        rc = ATTEMPT();
        if (!RETRY(rc)) return rc;
        if ((i & 63) == 63 && lrt_now_ns() >= deadline) return LRT_TIMEOUT;
    }
    if (r->spin_ns > 0) { /* timed spin: polls for up to spin_ns, reading the clock every 16 */
        /* Pop side: this agent's bit is in pop_spin_mask while it spins, so that pushes skip
         * waking sleepers (a dead spinner's bit is cleared by recovery, which then wakes all).
         * Leaving: clear the bit (seq_cst RMW), fence, then the sleep protocol below re-checks the
         * ring before sleeping — Dekker with lrt_after_push's fence + load of pop_spinners: a push
         * that saw us spinning is seen by that re-check. One that found work while others sleep
         * and more is waiting passes the wake on (the push skipped it). */
        int spin_agent = pop_side ? lrt_agent_index(r) : -1;
        uint64_t spin_bit = spin_agent >= 0 ? lrt_wait_bit(spin_agent) : 0;
        _Atomic uint64_t *spin_word =
            spin_agent >= 0 ? &lrt_wait_word_of(r, spin_agent)->m[LRT_WAIT_SPIN] : NULL;
        if (spin_bit) atomic_fetch_or(spin_word, spin_bit);
        uint64_t spin_end = lrt_now_ns() + (uint64_t)r->spin_ns;
        if (spin_end > deadline) spin_end = deadline;
        for (unsigned i = 1;; i++) {
            LRT_CPU_RELAX();
            rc = ATTEMPT();
            if (!RETRY(rc)) break;
            if ((i & 15u) == 0 && lrt_now_ns() >= spin_end) break;
        }
        if (spin_bit) {
            atomic_fetch_and(spin_word, ~spin_bit);
            atomic_thread_fence(memory_order_seq_cst);
            if (!RETRY(rc) && lrt_ring_len(r) > 0 && lrt_any_waiting(r, lrt_words_in_use(r), LRT_WAIT_POP))
                lrt_wake_one(r, LRT_WAIT_POP);
        }
        if (!RETRY(rc)) return rc;
        if (lrt_now_ns() >= deadline) return LRT_TIMEOUT;
    }
    for (int i = 0; i < h->yield_iters; i++) {
        sched_yield();
        rc = ATTEMPT();
        if (!RETRY(rc)) return rc;
        if (lrt_now_ns() >= deadline) return LRT_TIMEOUT;
    }

    int ai = lrt_agent_index(r);
    if (ai < 0) return ai;
    lrt_agent *a = &r->agents[ai];
    uint64_t bit = lrt_wait_bit(ai);
    _Atomic uint64_t *mask = &lrt_wait_word_of(r, ai)->m[pop_side ? LRT_WAIT_POP : LRT_WAIT_PUSH];
    _Atomic uint32_t *word = pop_side ? &a->pop_word : &a->push_word;
    for (;;) {
        uint32_t w = atomic_load_explicit(word, memory_order_acquire);
        atomic_fetch_or(mask, bit);
        atomic_thread_fence(memory_order_seq_cst); /* pairs with the fence in lrt_after_push/pop */
        rc = ATTEMPT();
        if (!RETRY(rc)) {
            atomic_fetch_and(mask, ~bit);
            return rc;
        }
        uint64_t now = lrt_now_ns();
        if (now >= deadline) {
            atomic_fetch_and(mask, ~bit);
            return LRT_TIMEOUT;
        }
        int64_t slice = deadline == UINT64_MAX ? -1 : (int64_t)(deadline - now);
        int stalled = r->kind == LRT_RING_MPMC && lrt_mpmc_stalled(r, pop_side);
        if (stalled && (slice < 0 || slice > STALL_SLICE_NS)) slice = STALL_SLICE_NS;
        int woke = lrt_futex_wait(r, word, w, slice);
        int interrupted = woke != 0 && errno == EINTR;
        atomic_fetch_and(mask, ~bit);
        if (interrupted && r->interruptible) return LRT_EINTR;
        /* A producer that died between claiming and publishing stalls every pop behind it;
         * repair it (slow path). Dead consumers are left to the owner's lrt_ring_recover(), which
         * reports the descriptors they held. */
        if (stalled && pop_side && lrt_mpmc_stalled(r, pop_side)) lrt_ring_recover(r, NULL, -1);
    }
#undef ATTEMPT
#undef RETRY
}

void lrt_ring_set_spin_ns(lrt_ring *r, int64_t spin_ns) { r->spin_ns = spin_ns > 0 ? spin_ns : 0; }
int64_t lrt_ring_spin_ns(const lrt_ring *r) { return r->spin_ns; }

int lrt_ring_push(lrt_ring *r, const lrt_desc *d, int64_t timeout_ns) {
    return wait_loop(r, 0, NULL, 0, d, timeout_ns, NULL);
}

int lrt_ring_pop_many(lrt_ring *r, lrt_desc *out, int max_n, int64_t timeout_ns) {
    if (max_n <= 0 || !out) return LRT_EINVAL;
    return wait_loop(r, 1, out, max_n, NULL, timeout_ns, NULL);
}

int lrt_ring_pop_many_hold(lrt_ring *r, lrt_desc *out, int max_n, int64_t timeout_ns, lrt_hold *hold) {
    if (max_n <= 0 || !out || (hold && hold->capacity == 0)) return LRT_EINVAL;
    return wait_loop(r, 1, out, max_n, NULL, timeout_ns, hold);
}

size_t lrt_hold_required_bytes(uint32_t capacity) {
    return sizeof(lrt_hold) + (size_t)capacity * sizeof(lrt_desc);
}

void lrt_hold_init(lrt_hold *h, uint32_t capacity) {
    memset(h, 0, lrt_hold_required_bytes(capacity));
    h->capacity = capacity;
    for (uint32_t i = 0; i < capacity; i++) h->entries[i].request_id = LRT_HOLD_DONE;
}

int lrt_ring_pop(lrt_ring *r, lrt_desc *out, int64_t timeout_ns) {
    int n = lrt_ring_pop_many(r, out, 1, timeout_ns);
    return n > 0 ? LRT_OK : n;
}

/* ---- state ------------------------------------------------------------------------------- */

void lrt_ring_close(lrt_ring *r) {
    atomic_store(&r->hdr->closed, 1);
    lrt_wake_all(r);
}

void lrt_ring_set_interruptible(lrt_ring *r, int on) { r->interruptible = on != 0; }

int lrt_ring_is_closed(const lrt_ring *r) { return (int)atomic_load(&r->hdr->closed); }

uint64_t lrt_ring_len(const lrt_ring *r) {
    uint64_t head = atomic_load_explicit(&r->hdr->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->hdr->tail, memory_order_relaxed);
    int64_t n = (int64_t)(tail - head);
    if (n < 0) return 0;
    return (uint64_t)n > r->hdr->capacity ? r->hdr->capacity : (uint64_t)n;
}

uint64_t lrt_ring_capacity(const lrt_ring *r) { return r->hdr->capacity; }
uint32_t lrt_ring_max_agents(const lrt_ring *r) { return r->max_agents; }
lrt_ring_kind lrt_ring_get_kind(const lrt_ring *r) { return (lrt_ring_kind)r->kind; }

void lrt_ring_get_stats(const lrt_ring *r, lrt_ring_stats *s) {
    const lrt_ring_hdr *h = r->hdr;
    memset(s, 0, sizeof(*s));
    s->capacity = h->capacity;
    s->len = lrt_ring_len(r);
    s->pushed = atomic_load(&((lrt_ring_hdr *)h)->tail);
    s->popped = atomic_load(&((lrt_ring_hdr *)h)->head);
    s->futex_waits = atomic_load(&((lrt_ring_hdr *)h)->futex_waits);
    s->futex_wakes = atomic_load(&((lrt_ring_hdr *)h)->futex_wakes);
    s->tombstones = atomic_load(&((lrt_ring_hdr *)h)->tombstones);
    s->released = atomic_load(&((lrt_ring_hdr *)h)->released);
    s->closed = atomic_load(&((lrt_ring_hdr *)h)->closed);
    for (uint32_t i = 0; i < r->max_agents; i++) s->agents += atomic_load(&r->agents[i].owner) != 0;
    s->max_agents = r->max_agents;
    s->agent_words = r->nwords == 1 ? 1 : atomic_load(&((lrt_ring_hdr *)h)->words_used);
}

int lrt_ring_recover(lrt_ring *r, lrt_desc *lost, int max_lost) {
    if (r->kind == LRT_RING_MPMC) return lrt_mpmc_recover(r, lost, max_lost);
    /* Other kinds hold no claims: a dead process leaves them consistent (single-store commits
     * under a robust mutex, or a single-writer index). Only its agent entry is freed. */
    int spinner_died = 0;
    for (int i = 0; i < (int)r->max_agents; i++) {
        lrt_agent *a = &r->agents[i];
        uint64_t o = atomic_load(&a->owner);
        if (o == 0 || o == LRT_OWNER_RECLAIMING || lrt_agent_alive(a)) continue;
        if (atomic_compare_exchange_strong(&a->owner, &o, LRT_OWNER_RECLAIMING))
            spinner_died |= lrt_agent_release(r, i);
    }
    if (spinner_died) lrt_wake_all(r);
    return 0;
}

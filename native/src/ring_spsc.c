/* lumenrt native core: single-producer single-consumer ring (Lamport's ring with cached indices).
 *
 * Invariants
 *   1. Only the producer writes tail, only the consumer writes head; 0 <= tail - head <= capacity.
 *   2. Each end caches the other end's index in its process-local handle and re-reads it only when
 *      the cached value says full (producer) or empty (consumer), so the busy path touches the
 *      other end's cache line once per lap instead of once per element.
 *   3. One live producer and one live consumer at a time, enforced: the first agent to push (pop)
 *      owns that end; another agent is refused with LRT_EMISUSE while the owner lives and takes
 *      over when it is dead (a producer killed mid-stream leaves the ring consistent: a cell is
 *      only visible after the single release store of tail).
 */
#include "internal.h"

static int claim_end(lrt_ring *r, _Atomic int32_t *end) {
    int32_t cur = atomic_load_explicit(end, memory_order_relaxed);
    int ai = lrt_agent_index(r);
    if (ai < 0) return ai;
    if (cur == ai) return LRT_OK;
    if (cur >= 0 && (uint32_t)cur < r->max_agents && lrt_agent_thread_alive(&r->agents[cur]))
        return LRT_EMISUSE;
    return atomic_compare_exchange_strong(end, &cur, ai) ? LRT_OK : LRT_EMISUSE;
}

int lrt_spsc_try_push(lrt_ring *r, const lrt_desc *d) {
    lrt_ring_hdr *h = r->hdr;
    int rc = claim_end(r, &h->spsc_producer);
    if (rc != LRT_OK) return rc;
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    if ((int64_t)(tail - r->prod_cached_head) >= (int64_t)h->capacity || tail < r->prod_cached_head) {
        /* acquire: pairs with the consumer's release of head, so the cell is free to overwrite */
        r->prod_cached_head = atomic_load_explicit(&h->head, memory_order_acquire);
        if (tail - r->prod_cached_head >= h->capacity) return LRT_FULL;
    }
    lrt_cell *c = &r->cells[tail & r->mask];
    c->d = *d;
    /* release: publishes the descriptor to the consumer's acquire of tail */
    atomic_store_explicit(&h->tail, tail + 1, memory_order_release);
    return LRT_OK;
}

int lrt_spsc_try_pop_many(lrt_ring *r, lrt_desc *out, int max_n, lrt_hold *hold) {
    lrt_ring_hdr *h = r->hdr;
    int rc = claim_end(r, &h->spsc_consumer);
    if (rc != LRT_OK) return rc;
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    int64_t avail = (int64_t)(r->cons_cached_tail - head);
    if (avail < max_n) { /* the cache shows fewer than asked: look at the producer's end again */
        /* acquire: pairs with the producer's release of tail */
        r->cons_cached_tail = atomic_load_explicit(&h->tail, memory_order_acquire);
        avail = (int64_t)(r->cons_cached_tail - head);
        if (avail <= 0) return LRT_EMPTY;
    }
    int n = avail < max_n ? (int)avail : max_n;
    for (int i = 0; i < n; i++) {
        out[i] = r->cells[(head + (uint64_t)i) & r->mask].d;
        lrt_hold_put(hold, &out[i]);
    }
    /* release: the copies above are done before the producer may reuse the cells */
    atomic_store_explicit(&h->head, head + (uint64_t)n, memory_order_release);
    return n;
}

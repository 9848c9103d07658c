/* lumenrt native core: bounded MPMC ring after Dmitry Vyukov's "Bounded MPMC queue"
 * (1024cores.net, 2010): every cell carries a sequence number; a producer may fill cell
 * pos & mask when seq == pos and publishes with seq = pos + 1; a consumer may take it when
 * seq == pos + 1 and hands it back with seq = pos + capacity.
 *
 * Invariants
 *   1. tail and head only grow; 0 <= tail - head <= capacity (tail counts claims, some of which
 *      may not be published yet).
 *   2. A cell's seq takes the values p, p + 1, p + cap, p + cap + 1, ... for the positions p that map
 *      to it; it never returns to an earlier value, so a compare-and-swap on seq cannot suffer ABA.
 *   3. Between winning the CAS on tail (head) and publishing (releasing) the cell, the winner's
 *      agent records push_claim (pop_claim) = position + 1, written before the CAS and cleared,
 *      with release, after the publish. Hence a cell that is claimed and unpublished is named by the
 *      claim of its winner as long as the winner lives.
 *
 * Repair (lrt_ring_recover; slow path). For a dead agent whose push_claim names p:
 *   if tail > p, seq(p) == p and no live agent claims p, the winner of p is dead: CAS seq p ->
 *   p | REPAIR (consumers read it as not ready), mark the descriptor a tombstone, publish p + 1.
 *   Consumers skip tombstones. By invariant 3, a live winner would have been seen; if it publishes
 *   in between, the CAS fails. For a dead pop_claim naming p: if head > p, seq(p) == p + 1 and no
 *   live agent claims p, the descriptor is reported lost and the cell released (CAS p+1 -> p+cap).
 */
#include <string.h>

#include "internal.h"

static inline lrt_agent *my_agent(lrt_ring *r) {
    int ai = lrt_agent_index(r);
    return ai < 0 ? NULL : &r->agents[ai];
}

int lrt_mpmc_try_push(lrt_ring *r, const lrt_desc *d) {
    lrt_ring_hdr *h = r->hdr;
    lrt_agent *a = my_agent(r);
    if (!a) return LRT_EAGENTS;
    uint64_t pos = atomic_load_explicit(&h->tail, memory_order_relaxed);
    lrt_cell *c;
    for (;;) {
        c = &r->cells[pos & r->mask];
        /* acquire: pairs with the consumer's release that handed the cell back */
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            atomic_store_explicit(&a->push_claim, pos + 1, memory_order_relaxed);
            /* seq_cst: orders the claim record before the claim itself (invariant 3) */
            if (atomic_compare_exchange_weak_explicit(&h->tail, &pos, pos + 1, memory_order_seq_cst,
                                                      memory_order_relaxed))
                break;
        } else if (dif < 0) {
            atomic_store_explicit(&a->push_claim, 0, memory_order_relaxed);
            return LRT_FULL;
        } else {
            pos = atomic_load_explicit(&h->tail, memory_order_relaxed);
        }
    }
    c->d = *d;
    c->d.flags &= ~LRT_DESC_TOMBSTONE;
    /* release: publishes the descriptor to the consumer that acquires seq */
    atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
    /* release: a recover() that reads 0 here also sees the publish above */
    atomic_store_explicit(&a->push_claim, 0, memory_order_release);
    return LRT_OK;
}

int lrt_mpmc_try_pop(lrt_ring *r, lrt_desc *out, lrt_hold *hold) {
    lrt_ring_hdr *h = r->hdr;
    lrt_agent *a = my_agent(r);
    if (!a) return LRT_EAGENTS;
    for (;;) {
        uint64_t pos = atomic_load_explicit(&h->head, memory_order_relaxed);
        lrt_cell *c;
        for (;;) {
            c = &r->cells[pos & r->mask];
            /* acquire: pairs with the producer's release that published the cell */
            uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
            int64_t dif = (int64_t)(seq - (pos + 1));
            if (dif == 0) {
                atomic_store_explicit(&a->pop_claim, pos + 1, memory_order_relaxed);
                if (atomic_compare_exchange_weak_explicit(&h->head, &pos, pos + 1, memory_order_seq_cst,
                                                          memory_order_relaxed))
                    break;
            } else if (dif < 0) {
                atomic_store_explicit(&a->pop_claim, 0, memory_order_relaxed);
                return LRT_EMPTY;
            } else {
                pos = atomic_load_explicit(&h->head, memory_order_relaxed);
            }
        }
        *out = c->d;
        if (!(out->flags & LRT_DESC_TOMBSTONE)) lrt_hold_put(hold, out);
        /* release: hands the cell to the producer of the next lap, which acquires seq */
        atomic_store_explicit(&c->seq, pos + r->mask + 1, memory_order_release);
        atomic_store_explicit(&a->pop_claim, 0, memory_order_release);
        if (!(out->flags & LRT_DESC_TOMBSTONE)) return LRT_OK;
        lrt_after_pop(r, 1); /* a repaired cell was consumed: a producer may be waiting for room */
    }
}

int lrt_mpmc_stalled(const lrt_ring *r, int pop_side) {
    const lrt_ring_hdr *h = r->hdr;
    uint64_t head = atomic_load(&((lrt_ring_hdr *)h)->head);
    uint64_t tail = atomic_load(&((lrt_ring_hdr *)h)->tail);
    if (pop_side) return tail != head; /* claimed cells exist, yet the ring looked empty */
    return tail - head < h->capacity;  /* room exists, yet the ring looked full */
}

static int claimed_by_live_agent(const lrt_ring *r, int pop_side, uint64_t claim) {
    for (uint32_t i = 0; i < r->max_agents; i++) {
        lrt_agent *a = &r->agents[i];
        uint64_t o = atomic_load(&a->owner);
        if (o == 0 || o == LRT_OWNER_RECLAIMING) continue;
        /* acquire: pairs with the release clearing the claim after publish */
        uint64_t c = atomic_load_explicit(pop_side ? &a->pop_claim : &a->push_claim, memory_order_acquire);
        if (c == claim && lrt_agent_alive(a)) return 1;
    }
    return 0;
}

/* 1 = resolved (nothing to do or repaired), 0 = a live winner holds it: try again later. */
static int repair_push(lrt_ring *r, uint64_t p) {
    lrt_ring_hdr *h = r->hdr;
    if (atomic_load(&h->tail) <= p) return 1; /* the claim's CAS never succeeded */
    lrt_cell *c = &r->cells[p & r->mask];
    if (atomic_load(&c->seq) != p) return 1;  /* published (or long since recycled) */
    if (claimed_by_live_agent(r, 0, p + 1)) return 0;
    uint64_t expect = p;
    if (!atomic_compare_exchange_strong(&c->seq, &expect, p | LRT_SEQ_REPAIR)) return 1;
    memset(&c->d, 0, sizeof(c->d));
    c->d.flags = LRT_DESC_TOMBSTONE;
    atomic_store_explicit(&c->seq, p + 1, memory_order_release);
    atomic_fetch_add(&h->tombstones, 1);
    lrt_after_push(r);
    return 1;
}

static int repair_pop(lrt_ring *r, uint64_t p, lrt_desc *lost, int max_lost, int *n_lost) {
    lrt_ring_hdr *h = r->hdr;
    if (atomic_load(&h->head) <= p) return 1;
    lrt_cell *c = &r->cells[p & r->mask];
    if (atomic_load(&c->seq) != p + 1) return 1; /* released */
    if (claimed_by_live_agent(r, 1, p + 1)) return 0;
    lrt_desc d = c->d;
    uint64_t expect = p + 1;
    if (!atomic_compare_exchange_strong(&c->seq, &expect, p + r->mask + 1)) return 1;
    if (!(d.flags & LRT_DESC_TOMBSTONE)) {
        if (*n_lost < max_lost) lost[*n_lost] = d;
        (*n_lost)++;
    }
    atomic_fetch_add(&h->released, 1);
    lrt_after_pop(r, 1);
    return 1;
}

int lrt_mpmc_recover(lrt_ring *r, lrt_desc *lost, int max_lost) {
    int push_only = max_lost < 0; /* called from a waiting pop: repair dead producers only */
    int n_lost = 0, spinner_died = 0;
    for (int i = 0; i < (int)r->max_agents; i++) {
        lrt_agent *a = &r->agents[i];
        uint64_t o = atomic_load(&a->owner);
        if (o == 0 || o == LRT_OWNER_RECLAIMING || lrt_agent_alive(a)) continue;
        /* take the entry, so that no other recoverer resolves it (or a new owner's state) twice */
        if (!atomic_compare_exchange_strong(&a->owner, &o, LRT_OWNER_RECLAIMING)) continue;
        int done = 1;
        uint64_t pc = atomic_load(&a->push_claim);
        if (pc && repair_push(r, pc - 1)) atomic_store(&a->push_claim, 0);
        else if (pc) done = 0;
        uint64_t cc = atomic_load(&a->pop_claim);
        if (cc && push_only) done = 0;
        else if (cc && repair_pop(r, cc - 1, lost, max_lost, &n_lost)) atomic_store(&a->pop_claim, 0);
        else if (cc) done = 0;
        if (done) spinner_died |= lrt_agent_release(r, i);
        else atomic_store(&a->owner, o); /* a live winner still works on the cell: later */
    }
    if (spinner_died) lrt_wake_all(r); /* pushes skipped waking sleepers while it "spun" */
    return n_lost;
}

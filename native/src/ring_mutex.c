/* lumenrt native core: the mutex rings used as baselines (NAIVE, BATCHED).
 *
 * One process-shared, robust pthread mutex guards head, tail and the cells. Waiting uses the
 * per-agent futex words of ring.c, which act as the condition variables ("not empty", "not full"),
 * and which, unlike glibc's process-shared pthread_cond_t, stay usable after a waiter is killed.
 *
 * Invariants
 *   1. Every change commits with one store (tail + 1 after writing the cell; head + n after copying
 *      the cells out). A process killed inside the critical section therefore leaves the ring as it
 *      was before or after its operation; the next locker gets EOWNERDEAD, marks the mutex
 *      consistent and carries on.
 *   2. head and tail are atomics only so that len() may read them without the lock.
 */
#define _GNU_SOURCE /* robust mutexes */
#include <errno.h>

#include "internal.h"

int lrt_mutex_init(lrt_ring_hdr *h) {
    pthread_mutexattr_t at;
    if (pthread_mutexattr_init(&at) != 0) return -1;
    int rc = pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    if (rc == 0) rc = pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
    if (rc == 0) rc = pthread_mutex_init(&h->mtx, &at);
    pthread_mutexattr_destroy(&at);
    return rc;
}

static int lock(lrt_ring_hdr *h) {
    int rc = pthread_mutex_lock(&h->mtx);
    if (rc == EOWNERDEAD) {
        rc = pthread_mutex_consistent(&h->mtx); /* invariant 1: state is whole */
        if (rc != 0) pthread_mutex_unlock(&h->mtx);
    }
    return rc == 0 ? LRT_OK : LRT_ESYS;
}

int lrt_mutex_try_push(lrt_ring *r, const lrt_desc *d) {
    lrt_ring_hdr *h = r->hdr;
    if (lock(h) != LRT_OK) return LRT_ESYS;
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    int rc = LRT_FULL;
    if (tail - head < h->capacity) {
        r->cells[tail & r->mask].d = *d;
        /* release: the commit store is not reordered before the cell copy (invariant 1) */
        atomic_store_explicit(&h->tail, tail + 1, memory_order_release);
        rc = LRT_OK;
    }
    pthread_mutex_unlock(&h->mtx);
    return rc;
}

int lrt_mutex_try_pop_many(lrt_ring *r, lrt_desc *out, int max_n, lrt_hold *hold) {
    lrt_ring_hdr *h = r->hdr;
    if (lock(h) != LRT_OK) return LRT_ESYS;
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    uint64_t avail = tail - head;
    int n = avail < (uint64_t)max_n ? (int)avail : max_n;
    for (int i = 0; i < n; i++) {
        out[i] = r->cells[(head + (uint64_t)i) & r->mask].d;
        lrt_hold_put(hold, &out[i]);
    }
    if (n > 0) atomic_store_explicit(&h->head, head + (uint64_t)n, memory_order_release);
    pthread_mutex_unlock(&h->mtx);
    return n > 0 ? n : LRT_EMPTY;
}

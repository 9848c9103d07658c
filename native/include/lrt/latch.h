/* lumenrt native core: completion latches, one per request record, for callers that wait in a
 * thread of their own (the synchronous engine API).
 *
 * A latch is one 32-bit word in a caller-given region (LRT_LATCH_STRIDE bytes apart, so that a
 * caller spinning on its latch does not share a cache line with the next request's):
 *   0 pending        reset by the submitter before the request is pushed
 *   2 pending, a waiter sleeps on the futex
 *   1 set            by whoever completes the request, exactly once per submission
 * set() is an exchange to 1 and makes a FUTEX_WAKE only when the old value was 2, so a waiter that
 * is still spinning costs the completer no system call. wait() spins for up to spin_ns (reading the
 * word only), then CAS 0 -> 2 and sleeps; a set between the CAS and the sleep makes futex_wait
 * return at once (the word is no longer 2).
 *
 * Why spin at all: on a VM a sleeping thread takes ~10 us to wake (an IPI to an idle vCPU); a
 * caller whose request computes in tens of microseconds gets its answer sooner by polling. The
 * spin is bounded and by time, so a slow model costs at most spin_ns of CPU per request.
 */
#ifndef LRT_LATCH_H
#define LRT_LATCH_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LRT_LATCH_STRIDE 64u

typedef _Atomic uint32_t lrt_latch;

static inline size_t lrt_latch_required_bytes(uint32_t n) { return (size_t)n * LRT_LATCH_STRIDE; }
static inline lrt_latch *lrt_latch_at(void *base, uint32_t i) {
    return (lrt_latch *)((char *)base + (size_t)i * LRT_LATCH_STRIDE);
}

void lrt_latch_reset(lrt_latch *l);
/* Returns 1 if a sleeper had to be woken (one FUTEX_WAKE made), else 0. */
int lrt_latch_set(lrt_latch *l, int pshared);
int lrt_latch_is_set(const lrt_latch *l);
/* LRT_OK once set; LRT_TIMEOUT after timeout_ns (< 0: never); LRT_EINTR when a signal interrupted
 * the sleep (the caller runs its handlers and waits again). */
int lrt_latch_wait(lrt_latch *l, int pshared, int64_t spin_ns, int64_t timeout_ns);

#ifdef __cplusplus
}
#endif
#endif

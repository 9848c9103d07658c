/* lumenrt native core: completion latches (see latch.h for the states and the protocol). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "lrt/latch.h"

#define PENDING 0u
#define SET 1u
#define SLEEPER 2u

void lrt_latch_reset(lrt_latch *l) { atomic_store_explicit(l, PENDING, memory_order_relaxed); }

int lrt_latch_is_set(const lrt_latch *l) {
    return atomic_load_explicit((lrt_latch *)l, memory_order_acquire) == SET;
}

int lrt_latch_set(lrt_latch *l, int pshared) {
    if (atomic_exchange_explicit(l, SET, memory_order_acq_rel) != SLEEPER) return 0;
    syscall(SYS_futex, (uint32_t *)l, pshared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    return 1;
}

int lrt_latch_wait(lrt_latch *l, int pshared, int64_t spin_ns, int64_t timeout_ns) {
    if (lrt_latch_is_set(l)) return LRT_OK;
    if (timeout_ns == 0) return LRT_TIMEOUT;
    uint64_t start = lrt_now_ns();
    uint64_t deadline = timeout_ns < 0 ? UINT64_MAX : start + (uint64_t)timeout_ns;
    if (spin_ns > 0) {
        uint64_t spin_end = start + (uint64_t)spin_ns;
        if (spin_end > deadline) spin_end = deadline;
        for (unsigned i = 1;; i++) {
            LRT_CPU_RELAX();
            if (lrt_latch_is_set(l)) return LRT_OK;
            if ((i & 15u) == 0 && lrt_now_ns() >= spin_end) break;
        }
    }
    for (;;) {
        uint32_t expected = PENDING;
        if (!atomic_compare_exchange_strong_explicit(l, &expected, SLEEPER, memory_order_acq_rel,
                                                     memory_order_acquire) &&
            expected == SET)
            return LRT_OK;
        struct timespec ts, *tsp = NULL;
        if (deadline != UINT64_MAX) {
            uint64_t now = lrt_now_ns();
            if (now >= deadline) return lrt_latch_is_set(l) ? LRT_OK : LRT_TIMEOUT;
            uint64_t left = deadline - now;
            ts.tv_sec = (time_t)(left / 1000000000u);
            ts.tv_nsec = (long)(left % 1000000000u);
            tsp = &ts;
        }
        long rc = syscall(SYS_futex, (uint32_t *)l, pshared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, SLEEPER, tsp,
                          NULL, 0);
        if (lrt_latch_is_set(l)) return LRT_OK;
        if (rc != 0 && errno == EINTR) return LRT_EINTR;
    }
}

/* lumenrt native core: an eventfd notifier that wakes an event loop (asyncio's loop.add_reader)
 * only when it sleeps.
 *
 * The loop side arms the notifier when it has drained its completion ring, then checks the ring
 * once more (the Dekker pair below makes that check safe); producers call notify() after every
 * push, which writes the eventfd only if the notifier was armed and disarms it in the same atomic
 * exchange. While the loop is awake, notify() costs one fence and one load: no system call.
 *
 *   consumer (loop)                     producer (worker)
 *   armed = 1        (seq_cst)          push to ring     (release)
 *   fence                                fence            (seq_cst)
 *   ring empty? -> sleep in epoll       armed? -> exchange(armed, 0) == 1 -> write(eventfd)
 *
 * A loop that is about to wait for an answer itself (spinning on the ring, the inline completion)
 * disarms the notifier first: producers then skip the system call, and no wake-up is left behind
 * for an answer the loop already took. If disarm() found it armed, the loop arms it again when it
 * stops waiting, and re-checks the ring as after any arm(); if not, a producer has written the
 * eventfd already and the loop's reader re-arms when it runs.
 *
 * The state word lives in a caller-given 64-byte region so that worker processes share it; the
 * eventfd is inherited by fork or passed by the owner.
 */
#ifndef LRT_NOTIFIER_H
#define LRT_NOTIFIER_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LRT_NOTIFIER_BYTES 64u

typedef struct lrt_notifier lrt_notifier;

typedef struct lrt_notifier_stats {
    uint64_t notify_calls;  /* notify() calls */
    uint64_t writes;        /* of which wrote the eventfd (system calls) */
    uint64_t arms;
} lrt_notifier_stats;

/* Initialise the state word in region and create an eventfd (non-blocking, close-on-exec). */
int lrt_notifier_create(void *region, size_t region_bytes, lrt_notifier **out);
/* Use an existing state region and eventfd (dup'ed; the handle closes its copy). */
int lrt_notifier_attach(void *region, size_t region_bytes, int fd, lrt_notifier **out);
void lrt_notifier_free(lrt_notifier *n);
int lrt_notifier_fd(const lrt_notifier *n);

/* Producer: returns 1 if it wrote the eventfd, 0 if the loop was awake, negative on error. */
int lrt_notifier_notify(lrt_notifier *n);
/* Consumer: about to sleep; check the ring once more after this. */
void lrt_notifier_arm(lrt_notifier *n);
/* Consumer: awake and about to wait on the ring itself. Returns 1 if it was armed (arm again
 * afterwards, then re-check the ring), 0 if not (a wake-up is already pending, or the loop is in
 * its reader). */
int lrt_notifier_disarm(lrt_notifier *n);
/* Consumer: woken; empty the eventfd counter (one read, non-blocking). Returns the count read. */
uint64_t lrt_notifier_drain(lrt_notifier *n);
void lrt_notifier_get_stats(const lrt_notifier *n, lrt_notifier_stats *out);

#ifdef __cplusplus
}
#endif
#endif

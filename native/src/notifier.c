/* lumenrt native core: eventfd notifier (see notifier.h for the protocol). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "lrt/notifier.h"

#define NOTIFIER_MAGIC 0x4c52544e4f544931ull /* "LRTNOTI1" */

typedef struct notifier_state {
    _Atomic uint64_t magic;
    _Atomic uint32_t armed;
    uint32_t pad_;
    _Atomic uint64_t notify_calls;
    _Atomic uint64_t writes;
    _Atomic uint64_t arms;
} notifier_state;
_Static_assert(sizeof(notifier_state) <= LRT_NOTIFIER_BYTES, "state fits its region");

struct lrt_notifier {
    notifier_state *s;
    int fd;
};

static int make(void *region, int fd, lrt_notifier **out) {
    lrt_notifier *n = malloc(sizeof(*n));
    if (!n) return LRT_ESYS;
    n->s = region;
    n->fd = fd;
    *out = n;
    return LRT_OK;
}

int lrt_notifier_create(void *region, size_t region_bytes, lrt_notifier **out) {
    if (!region || !out || region_bytes < LRT_NOTIFIER_BYTES || ((uintptr_t)region % 8)) return LRT_EINVAL;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return LRT_ESYS;
    notifier_state *s = region;
    memset(s, 0, sizeof(*s));
    atomic_store_explicit(&s->magic, NOTIFIER_MAGIC, memory_order_release);
    int rc = make(region, fd, out);
    if (rc != LRT_OK) close(fd);
    return rc;
}

int lrt_notifier_attach(void *region, size_t region_bytes, int fd, lrt_notifier **out) {
    if (!region || !out || region_bytes < LRT_NOTIFIER_BYTES || ((uintptr_t)region % 8)) return LRT_EINVAL;
    notifier_state *s = region;
    if (atomic_load_explicit(&s->magic, memory_order_acquire) != NOTIFIER_MAGIC) return LRT_EBADREGION;
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (mine < 0) return LRT_ESYS;
    int rc = make(region, mine, out);
    if (rc != LRT_OK) close(mine);
    return rc;
}

void lrt_notifier_free(lrt_notifier *n) {
    if (!n) return;
    close(n->fd);
    free(n);
}

int lrt_notifier_fd(const lrt_notifier *n) { return n->fd; }

int lrt_notifier_notify(lrt_notifier *n) {
    notifier_state *s = n->s;
    atomic_fetch_add_explicit(&s->notify_calls, 1, memory_order_relaxed);
    /* seq_cst fence: pairs with the consumer's fence after arming (Dekker, see notifier.h) */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&s->armed, memory_order_relaxed) == 0) return 0;
    if (atomic_exchange(&s->armed, 0) == 0) return 0; /* another producer got there first */
    atomic_fetch_add_explicit(&s->writes, 1, memory_order_relaxed);
    uint64_t one = 1;
    ssize_t w = write(n->fd, &one, sizeof one);
    /* EAGAIN means the counter is saturated: the loop is already readable. */
    if (w == (ssize_t)sizeof one || errno == EAGAIN) return 1;
    atomic_store(&s->armed, 1); /* the wake-up did not happen: let the next notify try again */
    return LRT_ESYS;
}

void lrt_notifier_arm(lrt_notifier *n) {
    atomic_fetch_add_explicit(&n->s->arms, 1, memory_order_relaxed);
    atomic_store(&n->s->armed, 1);
    atomic_thread_fence(memory_order_seq_cst); /* the ring re-check that follows must not move up */
}

int lrt_notifier_disarm(lrt_notifier *n) { return (int)atomic_exchange(&n->s->armed, 0); }

uint64_t lrt_notifier_drain(lrt_notifier *n) {
    uint64_t v = 0;
    if (read(n->fd, &v, sizeof v) != (ssize_t)sizeof v) return 0;
    return v;
}

void lrt_notifier_get_stats(const lrt_notifier *n, lrt_notifier_stats *o) {
    o->notify_calls = atomic_load(&n->s->notify_calls);
    o->writes = atomic_load(&n->s->writes);
    o->arms = atomic_load(&n->s->arms);
}

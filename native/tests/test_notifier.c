#include "lrt_test.h"

#include <poll.h>
#include <unistd.h>

#include "lrt/notifier.h"

static int readable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

static void test_writes_only_when_armed(void) {
    _Alignas(64) unsigned char region[LRT_NOTIFIER_BYTES];
    lrt_notifier *n = NULL;
    CHECK_EQ(lrt_notifier_create(region, sizeof region, &n), LRT_OK);
    int fd = lrt_notifier_fd(n);
    CHECK_EQ(lrt_notifier_notify(n), 0); /* loop awake: no write */
    CHECK(!readable(fd));
    lrt_notifier_arm(n);
    CHECK_EQ(lrt_notifier_notify(n), 1);
    CHECK_EQ(lrt_notifier_notify(n), 0); /* disarmed by the first */
    CHECK(readable(fd));
    CHECK_EQ(lrt_notifier_drain(n), 1);
    CHECK(!readable(fd));
    for (int i = 0; i < 1000; i++) CHECK_EQ(lrt_notifier_notify(n), 0);
    lrt_notifier_stats s;
    lrt_notifier_get_stats(n, &s);
    CHECK_EQ(s.notify_calls, 1003);
    CHECK_EQ(s.writes, 1);
    CHECK_EQ(s.arms, 1);
    lrt_notifier *m = NULL;
    CHECK_EQ(lrt_notifier_attach(region, sizeof region, fd, &m), LRT_OK);
    lrt_notifier_arm(n);
    CHECK_EQ(lrt_notifier_notify(m), 1); /* a second handle (another process) wakes the same fd */
    CHECK(readable(fd));
    lrt_notifier_free(m);
    lrt_notifier_free(n);
}

static void test_disarmed_while_the_loop_waits_itself(void) {
    _Alignas(64) unsigned char region[LRT_NOTIFIER_BYTES];
    lrt_notifier *n = NULL;
    CHECK_EQ(lrt_notifier_create(region, sizeof region, &n), LRT_OK);
    int fd = lrt_notifier_fd(n);
    lrt_notifier_arm(n);                  /* asleep */
    CHECK_EQ(lrt_notifier_disarm(n), 1);  /* awake, waiting on the ring itself */
    CHECK_EQ(lrt_notifier_notify(n), 0);  /* the producer skips the system call */
    CHECK(!readable(fd));
    CHECK_EQ(lrt_notifier_disarm(n), 0);  /* a nested wait finds it disarmed: not its to re-arm */
    lrt_notifier_arm(n);                  /* done waiting: armed again */
    CHECK_EQ(lrt_notifier_notify(n), 1);
    CHECK_EQ(lrt_notifier_disarm(n), 0);  /* a wake-up is pending: the reader re-arms */
    CHECK(readable(fd));
    lrt_notifier_free(n);
}

int main(void) {
    RUN(test_writes_only_when_armed);
    RUN(test_disarmed_while_the_loop_waits_itself);
    return 0;
}

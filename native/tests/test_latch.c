#include "lrt_test.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lrt/latch.h"
#include "lrt/ring.h"

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void test_set_before_wait(void) {
    _Alignas(64) unsigned char region[LRT_LATCH_STRIDE * 2];
    lrt_latch *l = lrt_latch_at(region, 1);
    lrt_latch_reset(l);
    CHECK(!lrt_latch_is_set(l));
    CHECK_EQ(lrt_latch_wait(l, 0, 0, 0), LRT_TIMEOUT);
    CHECK_EQ(lrt_latch_set(l, 0), 0); /* nobody asleep: no wake */
    CHECK(lrt_latch_is_set(l));
    CHECK_EQ(lrt_latch_wait(l, 0, 0, -1), LRT_OK);
    CHECK_EQ(lrt_latch_wait(l, 0, 1000, 0), LRT_OK);
}

static void test_timeout(void) {
    _Alignas(64) unsigned char region[LRT_LATCH_STRIDE];
    lrt_latch *l = lrt_latch_at(region, 0);
    lrt_latch_reset(l);
    uint64_t t0 = lrt_now_ns();
    CHECK_EQ(lrt_latch_wait(l, 0, 100000, 2000000), LRT_TIMEOUT); /* spin 0.1 ms, then sleep */
    CHECK(lrt_now_ns() - t0 >= 2000000);
    /* the timed-out waiter left the sleeper mark: the next set makes one (wasted) wake, then the
     * latch reads set */
    CHECK_EQ(lrt_latch_set(l, 0), 1);
    CHECK(lrt_latch_is_set(l));
}

typedef struct {
    lrt_latch *latch;
    long delay_us;
    int woke;
} setter_arg;

static void *setter(void *p) {
    setter_arg *a = p;
    sleep_us(a->delay_us);
    a->woke = lrt_latch_set(a->latch, 0);
    return NULL;
}

/* A waiter that sleeps is woken by exactly one FUTEX_WAKE; one that is still spinning costs none. */
static void test_threads_sleep_and_spin(void) {
    _Alignas(64) unsigned char region[LRT_LATCH_STRIDE];
    lrt_latch *l = lrt_latch_at(region, 0);
    for (int round = 0; round < 2; round++) {
        int spin = round == 1;
        lrt_latch_reset(l);
        setter_arg a = {l, 20000, -1};
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, setter, &a), 0);
        /* round 0: no spin, so the waiter sleeps long before the set (20 ms later);
         * round 1: spins for up to 1 s, far longer than the set takes to come */
        CHECK_EQ(lrt_latch_wait(l, 0, spin ? 1000000000 : 0, -1), LRT_OK);
        CHECK_EQ(pthread_join(t, NULL), 0);
        CHECK_EQ(a.woke, spin ? 0 : 1);
    }
}

/* Across processes (a MAP_SHARED region, pshared futex): many rounds, nothing lost. */
static void test_processes_ping_pong(void) {
    const int rounds = 2000 * (int)stress_scale();
    unsigned char *region = shared_region(LRT_LATCH_STRIDE * 2);
    lrt_latch *ping = lrt_latch_at(region, 0), *pong = lrt_latch_at(region, 1);
    lrt_latch_reset(ping);
    lrt_latch_reset(pong);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < rounds; i++) {
            if (lrt_latch_wait(ping, 1, (i & 1) ? 50000 : 0, 5000000000ll) != LRT_OK) _exit(2);
            lrt_latch_reset(ping);
            lrt_latch_set(pong, 1);
        }
        _exit(0);
    }
    for (int i = 0; i < rounds; i++) {
        lrt_latch_set(ping, 1);
        CHECK_EQ(lrt_latch_wait(pong, 1, (i & 2) ? 50000 : 0, 5000000000ll), LRT_OK);
        lrt_latch_reset(pong);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    munmap(region, LRT_LATCH_STRIDE * 2);
}

/* The ring's timed spin: a pop that spins catches a push made while it spins, with no sleep. */
typedef struct {
    lrt_ring *ring;
    long delay_us;
} pusher_arg;

static void *pusher(void *p) {
    pusher_arg *a = p;
    sleep_us(a->delay_us);
    lrt_desc d = {.request_id = 7};
    CHECK_EQ(lrt_ring_push(a->ring, &d, -1), LRT_OK);
    return NULL;
}

static void test_ring_spin_ns(void) {
    size_t bytes = lrt_ring_required_bytes(8);
    void *region = NULL;
    CHECK_EQ(posix_memalign(&region, 64, bytes), 0);
    lrt_ring_config cfg = {.kind = LRT_RING_MPMC, .capacity = 8, .spin_iters = 0, .yield_iters = 0};
    lrt_ring *r = NULL;
    CHECK_EQ(lrt_ring_create(region, bytes, &cfg, &r), LRT_OK);
    CHECK_EQ(lrt_ring_spin_ns(r), 0);
    lrt_ring_set_spin_ns(r, 2000000000ll); /* 2 s: the push (5 ms later) lands during the spin */
    pusher_arg a = {r, 5000};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, pusher, &a), 0);
    lrt_desc out;
    CHECK_EQ(lrt_ring_pop(r, &out, -1), LRT_OK);
    CHECK_EQ(out.request_id, 7);
    CHECK_EQ(pthread_join(t, NULL), 0);
    lrt_ring_stats s;
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.futex_waits, 0);
    /* a timeout shorter than the spin still returns on time */
    uint64_t t0 = lrt_now_ns();
    CHECK_EQ(lrt_ring_pop(r, &out, 3000000), LRT_TIMEOUT);
    CHECK(lrt_now_ns() - t0 < 1000000000ull);
    lrt_ring_set_spin_ns(r, -5);
    CHECK_EQ(lrt_ring_spin_ns(r), 0);
    lrt_ring_free(r);
    free(region);
}

/* A push skips waking a sleeper while another consumer spins; that spinner takes the element. */
typedef struct {
    void *region;
    int64_t spin_ns;
    uint64_t got;
} popper_arg;

static void *popper(void *p) {
    popper_arg *a = p;
    lrt_ring *mine = NULL;
    CHECK_EQ(lrt_ring_attach(a->region, lrt_ring_required_bytes(8), &mine), LRT_OK); /* own handle: own spin_ns */
    lrt_ring_set_spin_ns(mine, a->spin_ns);
    lrt_desc out;
    CHECK_EQ(lrt_ring_pop(mine, &out, 5000000000ll), LRT_OK);
    a->got = out.request_id;
    lrt_ring_free(mine);
    return NULL;
}

static lrt_ring *new_ring(void **region) {
    size_t bytes = lrt_ring_required_bytes(8);
    *region = shared_region(bytes);
    lrt_ring_config cfg = {.kind = LRT_RING_MPMC, .flags = LRT_RING_PSHARED, .capacity = 8};
    lrt_ring *r = NULL;
    CHECK_EQ(lrt_ring_create(*region, bytes, &cfg, &r), LRT_OK);
    return r;
}

static void test_push_skips_wake_while_a_consumer_spins(void) {
    void *region;
    lrt_ring *r = new_ring(&region);
    popper_arg sleeper = {region, 0, 0}, spinner = {region, 3000000000ll, 0};
    pthread_t ts, tp;
    CHECK_EQ(pthread_create(&ts, NULL, popper, &sleeper), 0);
    sleep_us(20000); /* asleep */
    CHECK_EQ(pthread_create(&tp, NULL, popper, &spinner), 0);
    sleep_us(20000); /* spinning (for up to 3 s) */
    lrt_ring_stats s;
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.futex_waits, 1);
    lrt_desc d = {.request_id = 1};
    CHECK_EQ(lrt_ring_push(r, &d, -1), LRT_OK);
    CHECK_EQ(pthread_join(tp, NULL), 0);
    CHECK_EQ(spinner.got, 1);
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.futex_wakes, 0); /* the sleeper was left asleep */
    d.request_id = 2;           /* now nobody spins: the next push wakes it */
    CHECK_EQ(lrt_ring_push(r, &d, -1), LRT_OK);
    CHECK_EQ(pthread_join(ts, NULL), 0);
    CHECK_EQ(sleeper.got, 2);
    lrt_ring_free(r);
    munmap(region, lrt_ring_required_bytes(8));
}

/* A consumer process killed while spinning leaves its bit in the spin mask, so pushes skip waking
 * sleepers; recovery clears the bit and wakes them. */
static void test_dead_spinner_is_recovered(void) {
    void *region;
    lrt_ring *r = new_ring(&region);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        lrt_ring *c = NULL;
        if (lrt_ring_attach(region, lrt_ring_required_bytes(8), &c) != LRT_OK) _exit(2);
        lrt_ring_set_spin_ns(c, 60000000000ll); /* spins until killed */
        lrt_desc out;
        lrt_ring_pop(c, &out, -1);
        _exit(3);
    }
    popper_arg sleeper = {region, 0, 0};
    pthread_t ts;
    CHECK_EQ(pthread_create(&ts, NULL, popper, &sleeper), 0);
    sleep_us(50000); /* the child spins, the thread sleeps */
    kill(pid, SIGKILL);
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    lrt_desc d = {.request_id = 9};
    CHECK_EQ(lrt_ring_push(r, &d, -1), LRT_OK); /* skipped the wake: the dead bit is still there */
    sleep_us(20000);
    CHECK_EQ(sleeper.got, 0);
    CHECK_EQ(lrt_ring_recover(r, NULL, 0), 0);
    CHECK_EQ(pthread_join(ts, NULL), 0);
    CHECK_EQ(sleeper.got, 9);
    lrt_ring_free(r);
    munmap(region, lrt_ring_required_bytes(8));
}

int main(void) {
    RUN(test_set_before_wait);
    RUN(test_timeout);
    RUN(test_threads_sleep_and_spin);
    RUN(test_processes_ping_pong);
    RUN(test_ring_spin_ns);
    RUN(test_push_skips_wake_while_a_consumer_spins);
    RUN(test_dead_spinner_is_recovered);
    return 0;
}

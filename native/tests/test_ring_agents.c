/* Agent tables larger than one 64-bit wait word: create-time sizing, hundreds of threads sleeping
 * and woken on every word, exited threads recycled, and dead agents past index 64 recovered. */
#include "lrt_test.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "lrt/ring.h"

#define WAIT_NS (30ll * 1000 * 1000 * 1000) /* every blocking call: a hang turns into a failure */

static const lrt_ring_kind KINDS[] = {LRT_RING_MPMC, LRT_RING_NAIVE, LRT_RING_BATCHED}; /* many threads */

typedef struct ring_box {
    lrt_ring *r;
    void *region;
    size_t bytes;
} ring_box;

static ring_box make(lrt_ring_kind kind, uint64_t cap, uint32_t max_agents) {
    ring_box b;
    b.bytes = lrt_ring_required_bytes_agents(cap, max_agents);
    CHECK(b.bytes != SIZE_MAX);
    b.region = shared_region(b.bytes);
    lrt_ring_config cfg = {.kind = kind, .flags = LRT_RING_PSHARED, .capacity = cap, .spin_iters = -1,
                           .yield_iters = -1, .max_agents = max_agents};
    b.r = NULL;
    CHECK_EQ(lrt_ring_create(b.region, b.bytes, &cfg, &b.r), LRT_OK);
    return b;
}

static void drop(ring_box b) {
    lrt_ring_free(b.r);
    munmap(b.region, b.bytes);
}

static lrt_desc desc(uint64_t id) {
    lrt_desc d;
    memset(&d, 0, sizeof d);
    d.request_id = id;
    return d;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Bits set in one wait mask, over every word of the table. */
static int bits_set(lrt_ring *r, int which) {
    int n = 0;
    for (uint32_t k = 0; k < r->nwords; k++) n += __builtin_popcountll(atomic_load(&r->waits[k].m[which]));
    return n;
}

/* Wait (bounded) until `want` agents have set their bit in mask `which`. */
static void wait_for_bits(lrt_ring *r, int which, int want) {
    for (int i = 0; i < 30000 && bits_set(r, which) < want; i++) sleep_us(1000);
    CHECK_EQ(bits_set(r, which), want);
}

/* ---- sizing -------------------------------------------------------------------------------- */

static void test_sizes_and_limits(void) {
    /* the old call is the default table */
    CHECK_EQ(lrt_ring_required_bytes(64), lrt_ring_required_bytes_agents(64, 0));
    CHECK_EQ(lrt_ring_required_bytes(64), lrt_ring_required_bytes_agents(64, LRT_RING_DEFAULT_AGENTS));
    /* each entry is a cache line; the wait words whole cache lines */
    CHECK(lrt_ring_required_bytes_agents(64, 300) >= lrt_ring_required_bytes_agents(64, 64) + 236 * 64);
    CHECK_EQ(lrt_ring_required_bytes_agents(64, LRT_RING_MAX_AGENTS + 1), SIZE_MAX);
    CHECK_EQ(lrt_ring_required_bytes_agents((1ull << 32) + 1, 64), SIZE_MAX);

    size_t big = lrt_ring_required_bytes_agents(8, LRT_RING_MAX_AGENTS);
    void *region = shared_region(big);
    lrt_ring *r = NULL;
    lrt_ring_config cfg = {.kind = LRT_RING_MPMC, .capacity = 8, .spin_iters = -1, .yield_iters = -1};
    cfg.max_agents = LRT_RING_MAX_AGENTS + 1; /* past the limit: refused */
    CHECK_EQ(lrt_ring_create(region, big, &cfg, &r), LRT_EINVAL);
    cfg.max_agents = UINT32_MAX;
    CHECK_EQ(lrt_ring_create(region, big, &cfg, &r), LRT_EINVAL);
    cfg.max_agents = LRT_RING_MAX_AGENTS; /* a region one byte short: refused */
    CHECK_EQ(lrt_ring_create(region, big - 1, &cfg, &r), LRT_EINVAL);
    CHECK_EQ(lrt_ring_create(region, big, &cfg, &r), LRT_OK);
    CHECK_EQ(lrt_ring_max_agents(r), LRT_RING_MAX_AGENTS);
    lrt_ring_stats s;
    lrt_desc d = desc(1);
    CHECK_EQ(lrt_ring_try_push(r, &d), LRT_OK);
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.max_agents, LRT_RING_MAX_AGENTS);
    CHECK_EQ(s.agents, 1);
    CHECK_EQ(s.agent_words, 1); /* one agent: the wake checks read one word of the 64 */
    lrt_ring_free(r);
    /* attach reads the table size from the header and checks the region holds it */
    CHECK_EQ(lrt_ring_attach(region, big - 1, &r), LRT_EBADREGION);
    CHECK_EQ(lrt_ring_attach(region, big, &r), LRT_OK);
    CHECK_EQ(lrt_ring_max_agents(r), LRT_RING_MAX_AGENTS);
    CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_OK);
    CHECK_EQ(d.request_id, 1);
    lrt_ring_free(r);
    /* 0: the default */
    cfg.max_agents = 0;
    CHECK_EQ(lrt_ring_create(region, big, &cfg, &r), LRT_OK);
    CHECK_EQ(lrt_ring_max_agents(r), LRT_RING_DEFAULT_AGENTS);
    lrt_ring_free(r);
    munmap(region, big);
}

/* ---- a full table refuses one thread more; exited threads' entries are reused ------------------ */

typedef struct holder_arg {
    lrt_ring *r;
    pthread_barrier_t *registered; /* every holder has tried */
    pthread_barrier_t *release;    /* the test has looked */
    int rc;
} holder_arg;

static void *holder(void *p) {
    holder_arg *a = p;
    lrt_desc d;
    /* a blocking call registers with every kind: LRT_TIMEOUT, or LRT_EAGENTS past the table */
    a->rc = lrt_ring_pop(a->r, &d, 1);
    pthread_barrier_wait(a->registered);
    pthread_barrier_wait(a->release);
    return NULL;
}

static void live_threads_register(lrt_ring *r, int n, int *refused) {
    pthread_t t[400];
    holder_arg a[400];
    pthread_barrier_t registered, release;
    CHECK(n <= 400);
    pthread_barrier_init(&registered, NULL, (unsigned)n + 1);
    pthread_barrier_init(&release, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        a[i] = (holder_arg){.r = r, .registered = &registered, .release = &release, .rc = 99};
        CHECK_EQ(pthread_create(&t[i], NULL, holder, &a[i]), 0);
    }
    pthread_barrier_wait(&registered); /* all n alive at once, each having registered (or not) */
    *refused = 0;
    for (int i = 0; i < n; i++) {
        CHECK(a[i].rc == LRT_TIMEOUT || a[i].rc == LRT_EAGENTS);
        *refused += a[i].rc == LRT_EAGENTS;
    }
    pthread_barrier_wait(&release);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&registered);
    pthread_barrier_destroy(&release);
}

static void test_full_table_and_recycling(void) {
    for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
        ring_box b = make(KINDS[k], 16, 200);
        int refused;
        live_threads_register(b.r, 201, &refused); /* one thread more than the table */
        CHECK_EQ(refused, 1);
        /* those threads exited: 200 new ones find their entries reused */
        live_threads_register(b.r, 200, &refused);
        CHECK_EQ(refused, 0);
        live_threads_register(b.r, 150, &refused);
        CHECK_EQ(refused, 0);
        drop(b);
    }
}

/* ---- 300 sleepers, every one woken --------------------------------------------------------- */

typedef struct popper_arg {
    lrt_ring *r;
    int rc;
    uint64_t got;
} popper_arg;

static void *popper(void *p) {
    popper_arg *a = p;
    lrt_desc d;
    a->rc = lrt_ring_pop(a->r, &d, WAIT_NS);
    a->got = d.request_id;
    return NULL;
}

typedef struct pusher_arg {
    lrt_ring *r;
    uint64_t id;
    int rc;
} pusher_arg;

static void *pusher(void *p) {
    pusher_arg *a = p;
    lrt_desc d = desc(a->id);
    a->rc = lrt_ring_push(a->r, &d, WAIT_NS);
    return NULL;
}

#define N_SLEEPERS 300

/* 300 consumers asleep in pop (bits in five words); 300 pushes: each wakes a distinct sleeper, so
 * every consumer returns with exactly one element, those past bit 64 included. */
static void test_every_sleeping_consumer_is_woken(void) {
    for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
        ring_box b = make(KINDS[k], 512, N_SLEEPERS + 1); /* and this thread, which pushes */
        static pthread_t t[N_SLEEPERS];
        static popper_arg a[N_SLEEPERS];
        for (int i = 0; i < N_SLEEPERS; i++) {
            a[i] = (popper_arg){.r = b.r, .rc = 99};
            CHECK_EQ(pthread_create(&t[i], NULL, popper, &a[i]), 0);
        }
        wait_for_bits(b.r, LRT_WAIT_POP, N_SLEEPERS); /* every one asleep (or about to be) */
        lrt_ring_stats s;
        lrt_ring_get_stats(b.r, &s);
        CHECK_EQ(s.agent_words, (N_SLEEPERS + 63) / 64);
        for (uint64_t i = 0; i < N_SLEEPERS; i++) {
            lrt_desc d = desc(1000 + i);
            CHECK_EQ(lrt_ring_push(b.r, &d, WAIT_NS), LRT_OK);
        }
        static int seen[N_SLEEPERS];
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < N_SLEEPERS; i++) {
            pthread_join(t[i], NULL);
            CHECK_EQ(a[i].rc, LRT_OK);
            CHECK(a[i].got >= 1000 && a[i].got < 1000 + N_SLEEPERS);
            CHECK_EQ(seen[a[i].got - 1000]++, 0); /* exactly once */
        }
        CHECK_EQ(lrt_ring_len(b.r), 0);
        CHECK_EQ(bits_set(b.r, LRT_WAIT_POP), 0);
        drop(b);
    }
}

/* 300 producers blocked on a full ring of 8 (push bits in five words); the consumer's pops wake
 * them one by one: every element arrives exactly once. */
static void test_every_blocked_producer_is_woken(void) {
    for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
        ring_box b = make(KINDS[k], 8, N_SLEEPERS + 1);
        lrt_desc d;
        CHECK_EQ(lrt_ring_pop(b.r, &d, 1), LRT_TIMEOUT); /* this thread's entry first: index 0 */
        static pthread_t t[N_SLEEPERS];
        static pusher_arg a[N_SLEEPERS];
        for (int i = 0; i < N_SLEEPERS; i++) {
            a[i] = (pusher_arg){.r = b.r, .id = (uint64_t)i, .rc = 99};
            CHECK_EQ(pthread_create(&t[i], NULL, pusher, &a[i]), 0);
        }
        wait_for_bits(b.r, LRT_WAIT_PUSH, N_SLEEPERS - 8); /* 8 got in, the rest wait for room */
        static int seen[N_SLEEPERS];
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < N_SLEEPERS; i++) {
            CHECK_EQ(lrt_ring_pop(b.r, &d, WAIT_NS), LRT_OK);
            CHECK(d.request_id < N_SLEEPERS);
            CHECK_EQ(seen[d.request_id]++, 0);
        }
        for (int i = 0; i < N_SLEEPERS; i++) {
            pthread_join(t[i], NULL);
            CHECK_EQ(a[i].rc, LRT_OK);
        }
        CHECK_EQ(lrt_ring_try_pop(b.r, &d), LRT_EMPTY);
        drop(b);
    }
}

/* ---- 150 producers and 150 consumers at once: nothing lost, nothing twice ------------------- */

typedef struct stress {
    lrt_ring *r;
    uint64_t per_producer;
    _Atomic uint64_t count;
    _Atomic uint64_t sum;
    _Atomic int failures;
} stress;

typedef struct stress_arg {
    stress *s;
    uint64_t id;
} stress_arg;

static void *stress_producer(void *p) {
    stress_arg *a = p;
    for (uint64_t i = 0; i < a->s->per_producer; i++) {
        lrt_desc d = desc((a->id << 32) | i);
        if (lrt_ring_push(a->s->r, &d, WAIT_NS) != LRT_OK) atomic_fetch_add(&a->s->failures, 1);
    }
    return NULL;
}

static void *stress_consumer(void *p) {
    stress_arg *a = p;
    lrt_desc out[4];
    for (;;) {
        int n = lrt_ring_pop_many(a->s->r, out, 4, WAIT_NS);
        if (n == LRT_CLOSED) return NULL;
        if (n < 0) {
            atomic_fetch_add(&a->s->failures, 1);
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            atomic_fetch_add(&a->s->count, 1);
            atomic_fetch_add(&a->s->sum, out[i].request_id);
        }
    }
}

static void test_many_threads_push_and_pop(void) {
    enum { NP = 150, NC = 150 };
    for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
        ring_box b = make(KINDS[k], 16, NP + NC);
        stress s = {.r = b.r, .per_producer = 200ull * (uint64_t)stress_scale()};
        static pthread_t pt[NP], ct[NC];
        static stress_arg pa[NP], ca[NC];
        for (int i = 0; i < NC; i++) {
            ca[i] = (stress_arg){.s = &s, .id = (uint64_t)i};
            CHECK_EQ(pthread_create(&ct[i], NULL, stress_consumer, &ca[i]), 0);
        }
        for (int i = 0; i < NP; i++) {
            pa[i] = (stress_arg){.s = &s, .id = (uint64_t)i};
            CHECK_EQ(pthread_create(&pt[i], NULL, stress_producer, &pa[i]), 0);
        }
        for (int i = 0; i < NP; i++) pthread_join(pt[i], NULL);
        lrt_ring_close(b.r);
        for (int i = 0; i < NC; i++) pthread_join(ct[i], NULL);
        uint64_t expect = 0;
        for (uint64_t p = 0; p < NP; p++)
            for (uint64_t i = 0; i < s.per_producer; i++) expect += (p << 32) | i;
        CHECK_EQ(atomic_load(&s.failures), 0);
        CHECK_EQ(atomic_load(&s.count), NP * s.per_producer);
        CHECK_EQ(atomic_load(&s.sum), expect);
        drop(b);
    }
}

/* ---- dead agents past index 64 --------------------------------------------------------------- */

/* Hold the entries 0..n-1 with live threads of this process (the caller's thread is entry 0). */
typedef struct hold_set {
    pthread_t t[128];
    holder_arg a[128];
    pthread_barrier_t registered, release;
    int n;
} hold_set;

static void hold_entries(hold_set *h, lrt_ring *r, int n) {
    lrt_desc d;
    CHECK_EQ(lrt_ring_pop(r, &d, 1), LRT_TIMEOUT); /* this thread: entry 0 */
    h->n = n - 1;
    pthread_barrier_init(&h->registered, NULL, (unsigned)h->n + 1);
    pthread_barrier_init(&h->release, NULL, (unsigned)h->n + 1);
    for (int i = 0; i < h->n; i++) {
        h->a[i] = (holder_arg){.r = r, .registered = &h->registered, .release = &h->release, .rc = 99};
        CHECK_EQ(pthread_create(&h->t[i], NULL, holder, &h->a[i]), 0);
    }
    pthread_barrier_wait(&h->registered);
    lrt_ring_stats s;
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.agents, (uint32_t)n);
}

static void release_entries(hold_set *h) {
    pthread_barrier_wait(&h->release);
    for (int i = 0; i < h->n; i++) pthread_join(h->t[i], NULL);
    pthread_barrier_destroy(&h->registered);
    pthread_barrier_destroy(&h->release);
}

/* A child process takes entry 70, claims a pop, and dies holding it: recovery reports it. */
static void test_dead_consumer_past_64_is_recovered(void) {
    ring_box b = make(LRT_RING_MPMC, 8, 128);
    hold_set h;
    hold_entries(&h, b.r, 70);
    lrt_desc x = desc(77);
    CHECK_EQ(lrt_ring_try_push(b.r, &x), LRT_OK);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        lrt_ring *r = NULL;
        if (lrt_ring_attach(b.region, b.bytes, &r) != LRT_OK) _exit(3);
        int ai = lrt_agent_index(r);
        if (ai != 70) _exit(4);
        lrt_agent *a = &r->agents[ai];
        uint64_t pos = atomic_load(&r->hdr->head);
        atomic_store(&a->pop_claim, pos + 1);
        if (!atomic_compare_exchange_strong(&r->hdr->head, &pos, pos + 1)) _exit(5);
        _exit(0); /* like a SIGKILL right after the CAS */
    }
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    lrt_ring_stats s;
    lrt_ring_get_stats(b.r, &s);
    CHECK_EQ(s.agents, 71);
    lrt_desc lost[4];
    CHECK_EQ(lrt_ring_recover(b.r, lost, 4), 1);
    CHECK_EQ(lost[0].request_id, 77);
    lrt_ring_get_stats(b.r, &s);
    CHECK_EQ(s.agents, 70); /* its entry is free again */
    CHECK_EQ(s.released, 1);
    release_entries(&h);
    drop(b);
}

/* A child process that attaches to the ring, takes entry 70 (entries 0-69 held by the caller) and
 * pops: asleep until killed, or spinning for up to a minute with spin_ns set. */
static pid_t popping_child_at_70(ring_box *b, int64_t spin_ns) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        lrt_ring *r = NULL;
        lrt_desc d;
        if (lrt_ring_attach(b->region, b->bytes, &r) != LRT_OK) _exit(3);
        if (lrt_agent_index(r) != 70) _exit(4);
        if (spin_ns > 0) lrt_ring_set_spin_ns(r, spin_ns);
        lrt_ring_pop(r, &d, -1); /* until killed */
        _exit(5);
    }
    return pid;
}

/* A child asleep in pop at entry 70 is killed; the next push clears its bit, finds nobody behind
 * it (a wasted wake-up) and goes on to wake a live sleeper further on, at entry 72. */
static void test_dead_sleeper_past_64_passes_the_wake(void) {
    ring_box b = make(LRT_RING_MPMC, 8, 128);
    hold_set h;
    hold_entries(&h, b.r, 70);
    pid_t pid = popping_child_at_70(&b, 0);
    wait_for_bits(b.r, LRT_WAIT_POP, 1);
    kill(pid, SIGKILL);
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFSIGNALED(st));
    /* entry 71: a thread that registers and exits; entry 72: the live sleeper */
    pthread_t t;
    holder_arg once;
    pthread_barrier_t b1, b2;
    pthread_barrier_init(&b1, NULL, 2);
    pthread_barrier_init(&b2, NULL, 2);
    once = (holder_arg){.r = b.r, .registered = &b1, .release = &b2, .rc = 99};
    CHECK_EQ(pthread_create(&t, NULL, holder, &once), 0);
    pthread_barrier_wait(&b1);
    popper_arg sleeper = {.r = b.r, .rc = 99};
    pthread_t ts;
    CHECK_EQ(pthread_create(&ts, NULL, popper, &sleeper), 0);
    wait_for_bits(b.r, LRT_WAIT_POP, 2); /* the dead one's bit and the live one's */
    CHECK(atomic_load(&b.r->waits[1].m[LRT_WAIT_POP]) == ((1ull << (70 - 64)) | (1ull << (72 - 64))));
    lrt_desc d = desc(5);
    CHECK_EQ(lrt_ring_push(b.r, &d, WAIT_NS), LRT_OK);
    pthread_join(ts, NULL);
    CHECK_EQ(sleeper.rc, LRT_OK);
    CHECK_EQ(sleeper.got, 5);
    CHECK_EQ(bits_set(b.r, LRT_WAIT_POP), 0);
    pthread_barrier_wait(&b2);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&b1);
    pthread_barrier_destroy(&b2);
    CHECK_EQ(lrt_ring_recover(b.r, NULL, 0), 0); /* frees the dead entry */
    release_entries(&h);
    drop(b);
}

/* A child spinning in pop at entry 70 is killed: its spin bit makes pushes skip waking a sleeper
 * until recovery clears it and wakes every sleeper. */
static void test_dead_spinner_past_64_is_recovered(void) {
    ring_box b = make(LRT_RING_MPMC, 8, 128);
    hold_set h;
    hold_entries(&h, b.r, 70);
    pid_t pid = popping_child_at_70(&b, 60ll * 1000 * 1000 * 1000); /* spins until killed */
    wait_for_bits(b.r, LRT_WAIT_SPIN, 1);
    popper_arg sleeper = {.r = b.r, .rc = 99};
    pthread_t ts;
    CHECK_EQ(pthread_create(&ts, NULL, popper, &sleeper), 0); /* entry 71 */
    wait_for_bits(b.r, LRT_WAIT_POP, 1);
    kill(pid, SIGKILL);
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    lrt_desc d = desc(9);
    CHECK_EQ(lrt_ring_push(b.r, &d, WAIT_NS), LRT_OK); /* skipped the wake: the dead bit is still set */
    CHECK_EQ(bits_set(b.r, LRT_WAIT_SPIN), 1);
    CHECK_EQ(lrt_ring_recover(b.r, NULL, 0), 0);
    CHECK_EQ(bits_set(b.r, LRT_WAIT_SPIN), 0);
    pthread_join(ts, NULL);
    CHECK_EQ(sleeper.rc, LRT_OK);
    CHECK_EQ(sleeper.got, 9);
    release_entries(&h);
    drop(b);
}

int main(void) {
    RUN(test_sizes_and_limits);
    RUN(test_full_table_and_recycling);
    RUN(test_every_sleeping_consumer_is_woken);
    RUN(test_every_blocked_producer_is_woken);
    RUN(test_many_threads_push_and_pop);
    RUN(test_dead_consumer_past_64_is_recovered);
    RUN(test_dead_sleeper_past_64_passes_the_wake);
    RUN(test_dead_spinner_past_64_is_recovered);
    return 0;
}

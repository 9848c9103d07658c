/* MPMC repair after a process dies inside the claim window. The window (between winning the CAS
 * on tail/head and publishing/releasing the cell) is a few instructions wide, so these tests put a
 * child exactly there by performing the first half of the operation by hand and exiting. */
#include "lrt_test.h"

#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "lrt/ring.h"

#define CAP 8

static lrt_ring *make(void **region) {
    size_t bytes = lrt_ring_required_bytes(CAP);
    *region = shared_region(bytes);
    lrt_ring_config cfg = {.kind = LRT_RING_MPMC, .flags = LRT_RING_PSHARED, .capacity = CAP,
                           .spin_iters = -1, .yield_iters = -1};
    lrt_ring *r = NULL;
    CHECK_EQ(lrt_ring_create(*region, bytes, &cfg, &r), LRT_OK);
    return r;
}

static lrt_desc desc(uint64_t id) {
    lrt_desc d;
    memset(&d, 0, sizeof d);
    d.request_id = id;
    return d;
}

/* In a child: claim the next push (or pop) position and die without publishing (releasing). */
static void child_dies_in_window(void *region, int pop_side) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        lrt_ring *r = NULL;
        if (lrt_ring_attach(region, lrt_ring_required_bytes(CAP), &r) != LRT_OK) _exit(3);
        lrt_agent *a = &r->agents[lrt_agent_index(r)];
        _Atomic uint64_t *end = pop_side ? &r->hdr->head : &r->hdr->tail;
        uint64_t pos = atomic_load(end);
        atomic_store(pop_side ? &a->pop_claim : &a->push_claim, pos + 1);
        if (!atomic_compare_exchange_strong(end, &pos, pos + 1)) _exit(4);
        _exit(0); /* like a SIGKILL right after the CAS */
    }
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_dead_producer_claim_becomes_tombstone(void) {
    void *region;
    lrt_ring *r = make(&region);
    lrt_desc d, a = desc(1), b = desc(2);
    CHECK_EQ(lrt_ring_try_push(r, &a), LRT_OK);
    child_dies_in_window(region, 0);
    CHECK_EQ(lrt_ring_try_push(r, &b), LRT_OK); /* lands behind the dead claim */
    CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_OK);
    CHECK_EQ(d.request_id, 1);
    CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_EMPTY); /* stalled behind the dead claim */
    /* a blocking pop repairs the stall by itself and skips the tombstone */
    CHECK_EQ(lrt_ring_pop(r, &d, 5ll * 1000 * 1000 * 1000), LRT_OK);
    CHECK_EQ(d.request_id, 2);
    lrt_ring_stats s;
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.tombstones, 1);
    /* the ring keeps full capacity and order afterwards */
    for (uint64_t i = 0; i < CAP; i++) {
        lrt_desc x = desc(100 + i);
        CHECK_EQ(lrt_ring_try_push(r, &x), LRT_OK);
    }
    for (uint64_t i = 0; i < CAP; i++) {
        CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_OK);
        CHECK_EQ(d.request_id, 100 + i);
    }
    lrt_ring_free(r);
    munmap(region, lrt_ring_required_bytes(CAP));
}

static void test_dead_consumer_claim_is_reported_lost(void) {
    void *region;
    lrt_ring *r = make(&region);
    lrt_desc d, x = desc(55);
    CHECK_EQ(lrt_ring_try_push(r, &x), LRT_OK);
    child_dies_in_window(region, 1); /* takes 55 and dies holding it */
    for (uint64_t i = 0; i < CAP - 1; i++) {
        lrt_desc y = desc(i);
        CHECK_EQ(lrt_ring_try_push(r, &y), LRT_OK);
    }
    lrt_desc z = desc(999);
    CHECK_EQ(lrt_ring_try_push(r, &z), LRT_FULL); /* the held cell is not free yet */
    lrt_desc lost[4];
    CHECK_EQ(lrt_ring_recover(r, lost, 4), 1);
    CHECK_EQ(lost[0].request_id, 55);
    CHECK_EQ(lrt_ring_try_push(r, &z), LRT_OK);
    for (uint64_t i = 0; i < CAP - 1; i++) {
        CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_OK);
        CHECK_EQ(d.request_id, i);
    }
    CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_OK);
    CHECK_EQ(d.request_id, 999);
    CHECK_EQ(lrt_ring_recover(r, lost, 4), 0); /* idempotent */
    lrt_ring_free(r);
    munmap(region, lrt_ring_required_bytes(CAP));
}

static void test_live_claim_is_not_repaired(void) {
    void *region;
    lrt_ring *r = make(&region);
    /* this (live) thread claims a position by hand, as a producer preempted in the window */
    lrt_agent *a = &r->agents[lrt_agent_index(r)];
    uint64_t pos = atomic_load(&r->hdr->tail);
    atomic_store(&a->push_claim, pos + 1);
    CHECK(atomic_compare_exchange_strong(&r->hdr->tail, &pos, pos + 1));
    CHECK_EQ(lrt_ring_recover(r, NULL, 0), 0);
    lrt_ring_stats s;
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.tombstones, 0);
    /* finish the push by hand; it is delivered normally */
    lrt_cell *c = &r->cells[pos & (CAP - 1)];
    c->d = desc(31);
    atomic_store(&c->seq, pos + 1);
    atomic_store(&a->push_claim, 0);
    lrt_desc d;
    CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_OK);
    CHECK_EQ(d.request_id, 31);
    lrt_ring_free(r);
    munmap(region, lrt_ring_required_bytes(CAP));
}

static void test_dead_agents_are_freed(void) {
    void *region;
    lrt_ring *r = make(&region);
    for (int i = 0; i < 3; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            lrt_ring *m = NULL;
            lrt_desc x = desc((uint64_t)i);
            if (lrt_ring_attach(region, lrt_ring_required_bytes(CAP), &m) != LRT_OK) _exit(3);
            _exit(lrt_ring_try_push(m, &x) == LRT_OK ? 0 : 4);
        }
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    lrt_ring_stats s;
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.agents, 3);
    CHECK_EQ(lrt_ring_recover(r, NULL, 0), 0);
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.agents, 0);
    CHECK_EQ(s.len, 3);
    lrt_ring_free(r);
    munmap(region, lrt_ring_required_bytes(CAP));
}

static void test_push_only_recovery_leaves_lost_descriptor_to_owner(void) {
    void *region;
    lrt_ring *r = make(&region);
    lrt_desc x = desc(66), lost[2];
    CHECK_EQ(lrt_ring_try_push(r, &x), LRT_OK);
    child_dies_in_window(region, 1);
    CHECK_EQ(lrt_ring_recover(r, NULL, -1), 0); /* internal (push-only) recovery: keeps it */
    lrt_ring_stats s;
    lrt_ring_get_stats(r, &s);
    CHECK_EQ(s.released, 0);
    CHECK_EQ(lrt_ring_recover(r, lost, 2), 1); /* the owner gets the descriptor to fail it */
    CHECK_EQ(lost[0].request_id, 66);
    lrt_ring_free(r);
    munmap(region, lrt_ring_required_bytes(CAP));
}

static void test_hold_names_what_a_dead_consumer_had_popped(void) {
    const char *kinds[] = {"mpmc", "spsc", "naive", "batched"};
    for (int k = 0; k < 4; k++) {
        size_t bytes = lrt_ring_required_bytes(CAP);
        void *region = shared_region(bytes + lrt_hold_required_bytes(8));
        lrt_hold *hold = (lrt_hold *)((char *)region + bytes);
        lrt_hold_init(hold, 8);
        lrt_ring_config cfg = {.kind = (uint32_t)lrt_ring_kind_from_name(kinds[k]), .flags = LRT_RING_PSHARED,
                               .capacity = CAP, .spin_iters = -1, .yield_iters = -1};
        lrt_ring *r = NULL;
        CHECK_EQ(lrt_ring_create(region, bytes, &cfg, &r), LRT_OK);
        for (uint64_t i = 0; i < 3; i++) {
            lrt_desc x = desc(70 + i);
            CHECK_EQ(lrt_ring_try_push(r, &x), LRT_OK);
        }
        pid_t pid = fork();
        if (pid == 0) {
            lrt_ring *m = NULL;
            lrt_desc out[4];
            if (lrt_ring_attach(region, bytes, &m) != LRT_OK) _exit(3);
            _exit(lrt_ring_pop_many_hold(m, out, 2, -1, hold) == 2 ? 0 : 4); /* dies holding 70, 71 */
        }
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        int held = 0;
        for (uint32_t i = 0; i < hold->capacity; i++)
            if (hold->entries[i].request_id != LRT_HOLD_DONE) {
                CHECK(hold->entries[i].request_id == 70 || hold->entries[i].request_id == 71);
                held++;
            }
        CHECK_EQ(held, 2);
        CHECK_EQ(hold->pos, 2);
        lrt_desc d;
        CHECK_EQ(lrt_ring_try_pop(r, &d), LRT_OK); /* the rest is still there */
        CHECK_EQ(d.request_id, 72);
        lrt_ring_free(r);
        munmap(region, bytes + lrt_hold_required_bytes(8));
    }
}

int main(void) {
    RUN(test_dead_producer_claim_becomes_tombstone);
    RUN(test_dead_consumer_claim_is_reported_lost);
    RUN(test_live_claim_is_not_repaired);
    RUN(test_dead_agents_are_freed);
    RUN(test_push_only_recovery_leaves_lost_descriptor_to_owner);
    RUN(test_hold_names_what_a_dead_consumer_had_popped);
    return 0;
}

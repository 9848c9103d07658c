/* Slab pool tests: exhaustion, double free, counters, and a threaded stress that proves no slot is
 * handed out twice (each holder stamps its slot and checks the stamp before freeing). */
#include "lrt_test.h"

#include <pthread.h>

#include "lrt/slab.h"

static void test_alloc_all_then_exhausted(void) {
    size_t bytes = lrt_slab_required_bytes(100, 16);
    void *region = shared_region(bytes);
    lrt_slab *s = NULL;
    CHECK_EQ(lrt_slab_create(region, bytes, 100, 16, &s), LRT_OK);
    CHECK_EQ(lrt_slab_slot_bytes(s), 128); /* rounded up to cache lines */
    int seen[16] = {0};
    for (int i = 0; i < 16; i++) {
        int64_t idx = lrt_slab_alloc(s);
        CHECK(idx >= 0 && idx < 16);
        CHECK(!seen[idx]);
        seen[idx] = 1;
        CHECK_EQ((uintptr_t)lrt_slab_ptr(s, idx) % LRT_CACHELINE, 0);
        CHECK_EQ((char *)lrt_slab_ptr(s, idx) - (char *)region, (long long)lrt_slab_offset(s, idx));
    }
    CHECK_EQ(lrt_slab_alloc(s), LRT_EXHAUSTED);
    CHECK_EQ(lrt_slab_free(s, 3), LRT_OK);
    CHECK_EQ(lrt_slab_free(s, 3), LRT_EDOUBLEFREE);
    CHECK_EQ(lrt_slab_free(s, 16), LRT_EINVAL);
    CHECK_EQ(lrt_slab_alloc(s), 3);
    lrt_slab_stats st;
    lrt_slab_get_stats(s, &st);
    CHECK_EQ(st.allocated, 17);
    CHECK_EQ(st.freed, 1);
    CHECK_EQ(st.in_use, 16);
    CHECK_EQ(st.high_water, 16);
    CHECK_EQ(st.exhausted, 1);
    lrt_slab *s2 = NULL;
    CHECK_EQ(lrt_slab_attach(region, bytes, &s2), LRT_OK);
    CHECK_EQ(lrt_slab_n_slots(s2), 16);
    lrt_slab_free_handle(s2);
    lrt_slab_free_handle(s);
    munmap(region, bytes);
}

typedef struct {
    lrt_slab *s;
    int id;
    long rounds;
    long exhausted;
} arg_t;

static void *churn(void *p) {
    arg_t *a = p;
    int64_t held[8];
    unsigned seed = (unsigned)a->id * 7919u + 1;
    for (long r = 0; r < a->rounds; r++) {
        int n = (int)(rand_r(&seed) % 8) + 1, got = 0;
        for (int i = 0; i < n; i++) {
            int64_t idx = lrt_slab_alloc(a->s);
            if (idx < 0) {
                CHECK_EQ(idx, LRT_EXHAUSTED);
                a->exhausted++;
                continue;
            }
            uint64_t *w = lrt_slab_ptr(a->s, idx);
            for (int k = 0; k < 8; k++) w[k] = ((uint64_t)a->id << 32) | (uint64_t)r;
            held[got++] = idx;
        }
        for (int i = 0; i < got; i++) {
            uint64_t *w = lrt_slab_ptr(a->s, held[i]);
            for (int k = 0; k < 8; k++) CHECK_EQ(w[k], ((uint64_t)a->id << 32) | (uint64_t)r);
            CHECK_EQ(lrt_slab_free(a->s, held[i]), LRT_OK);
        }
    }
    return NULL;
}

static void test_threads_no_slot_twice_counters_balance(void) {
    const int T = 4, N = 20; /* fewer slots than 4 threads x 8: exhaustion happens too */
    size_t bytes = lrt_slab_required_bytes(64, N);
    void *region = shared_region(bytes);
    lrt_slab *s = NULL;
    CHECK_EQ(lrt_slab_create(region, bytes, 64, N, &s), LRT_OK);
    pthread_t t[4];
    arg_t a[4];
    for (int i = 0; i < T; i++) {
        a[i] = (arg_t){.s = s, .id = i, .rounds = 200000 * stress_scale()};
        pthread_create(&t[i], NULL, churn, &a[i]);
    }
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
    lrt_slab_stats st;
    lrt_slab_get_stats(s, &st);
    CHECK_EQ(st.allocated, st.freed);
    CHECK_EQ(st.in_use, 0);
    CHECK(st.high_water <= (uint64_t)N);
    long ex = 0;
    for (int i = 0; i < T; i++) ex += a[i].exhausted;
    CHECK_EQ(st.exhausted, ex);
    /* every slot is back on the free list exactly once */
    for (int i = 0; i < N; i++) CHECK(lrt_slab_alloc(s) >= 0);
    CHECK_EQ(lrt_slab_alloc(s), LRT_EXHAUSTED);
    lrt_slab_free_handle(s);
    munmap(region, bytes);
}

int main(void) {
    RUN(test_alloc_all_then_exhausted);
    RUN(test_threads_no_slot_twice_counters_balance);
    return 0;
}

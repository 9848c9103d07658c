#include "lrt_test.h"

#include "lrt/bump.h"

static void test_alignment_exhaustion_reset(void) {
    size_t bytes = lrt_bump_required_bytes(1024);
    void *region = shared_region(bytes);
    lrt_bump *b = NULL;
    CHECK_EQ(lrt_bump_create(region, bytes, 1024, &b), LRT_OK);
    int64_t o1 = lrt_bump_alloc(b, 10, 1);
    int64_t o2 = lrt_bump_alloc(b, 100, 64);
    CHECK(o1 >= 0 && o2 > o1);
    CHECK_EQ(o2 % 64, 0);
    CHECK_EQ((uintptr_t)lrt_bump_ptr(b, o2) % 64, 0);
    CHECK_EQ(lrt_bump_alloc(b, 1, 3), LRT_EINVAL);
    CHECK_EQ(lrt_bump_alloc(b, 2000, 8), LRT_EXHAUSTED);
    int64_t o3 = lrt_bump_alloc(b, 1024 - 164, 1);
    CHECK(o3 >= 0);
    CHECK_EQ(lrt_bump_alloc(b, 1, 1), LRT_EXHAUSTED);
    lrt_bump_stats s;
    lrt_bump_get_stats(b, &s);
    CHECK_EQ(s.used_bytes, 1024);
    CHECK_EQ(s.allocations, 3);
    CHECK_EQ(s.exhausted, 2);
    lrt_bump_reset(b);
    CHECK_EQ(lrt_bump_alloc(b, 10, 1), o1); /* O(1) reset: same offsets again */
    lrt_bump_get_stats(b, &s);
    CHECK_EQ(s.resets, 1);
    CHECK_EQ(s.used_bytes, 10);
    CHECK_EQ(s.high_water_bytes, 1024);
    lrt_bump *b2 = NULL;
    CHECK_EQ(lrt_bump_attach(region, bytes, &b2), LRT_OK);
    lrt_bump_free_handle(b2);
    lrt_bump_free_handle(b);
    munmap(region, bytes);
}

int main(void) {
    RUN(test_alignment_exhaustion_reset);
    return 0;
}

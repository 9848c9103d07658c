/* Minimal test harness for the native core: CHECK aborts the test with file:line. The stress
 * counts scale with LRT_STRESS_SCALE (default 1). */
#ifndef LRT_TEST_H
#define LRT_TEST_H
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);      \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
#define CHECK_EQ(a, b)                                                                      \
    do {                                                                                    \
        long long va_ = (long long)(a), vb_ = (long long)(b);                               \
        if (va_ != vb_) {                                                                   \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %lld, %s = %lld\n", __FILE__,     \
                    __LINE__, #a, va_, #b, vb_);                                            \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
#define RUN(fn)                                                                             \
    do {                                                                                    \
        fprintf(stderr, "  %-48s", #fn);                                                    \
        fn();                                                                               \
        fprintf(stderr, "ok\n");                                                            \
    } while (0)

static inline long stress_scale(void) {
    const char *s = getenv("LRT_STRESS_SCALE");
    long v = s ? atol(s) : 1;
    return v > 0 ? v : 1;
}

/* A region shared with forked children (MAP_SHARED | MAP_ANONYMOUS), page aligned. */
static inline void *shared_region(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}
#endif

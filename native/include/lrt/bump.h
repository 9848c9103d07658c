/* lumenrt native core: per-worker bump arena with O(1) reset.
 *
 * One owner (a worker thread or process) allocates; nobody frees individual blocks; reset() makes
 * the whole arena free again in O(1). Not thread-safe for allocation by design: one arena per
 * worker. The counters are atomics so another process may read them while the owner works.
 */
#ifndef LRT_BUMP_H
#define LRT_BUMP_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lrt_bump lrt_bump;

typedef struct lrt_bump_stats {
    uint64_t capacity_bytes;
    uint64_t used_bytes;        /* since the last reset */
    uint64_t high_water_bytes;  /* largest used_bytes seen */
    uint64_t allocations;       /* successful allocations since create */
    uint64_t resets;
    uint64_t exhausted;         /* allocations refused for lack of room */
} lrt_bump_stats;

size_t lrt_bump_required_bytes(uint64_t capacity_bytes);
int lrt_bump_create(void *region, size_t region_bytes, uint64_t capacity_bytes, lrt_bump **out);
int lrt_bump_attach(void *region, size_t region_bytes, lrt_bump **out);
void lrt_bump_free_handle(lrt_bump *b);

/* Offset of `size` bytes aligned to `align` (a power of two, <= 4096) from the start of the region,
 * or LRT_EXHAUSTED / LRT_EINVAL. */
int64_t lrt_bump_alloc(lrt_bump *b, uint64_t size, uint64_t align);
void lrt_bump_reset(lrt_bump *b);
void *lrt_bump_ptr(const lrt_bump *b, int64_t offset);
void lrt_bump_get_stats(const lrt_bump *b, lrt_bump_stats *out);

#ifdef __cplusplus
}
#endif
#endif

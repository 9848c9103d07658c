/* lumenrt native core: slab pool of fixed-size, cache-line-aligned slots over a caller-given region.
 *
 * Allocation and free are lock-free (a Treiber stack of slot indices whose head carries a 32-bit tag
 * against ABA), so threads and processes sharing the region allocate concurrently. Exhaustion is
 * reported at once (LRT_EXHAUSTED), never waited on. A per-slot state word catches double frees.
 * Ownership: a slot belongs to whoever allocated it until it is passed to lrt_slab_free; the pool
 * never frees a slot by itself.
 */
#ifndef LRT_SLAB_H
#define LRT_SLAB_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lrt_slab lrt_slab;

typedef struct lrt_slab_stats {
    uint64_t slot_bytes;
    uint64_t n_slots;
    uint64_t allocated;   /* successful allocations since create */
    uint64_t freed;       /* frees since create */
    uint64_t in_use;      /* allocated - freed */
    uint64_t high_water;  /* largest in_use seen */
    uint64_t exhausted;   /* allocations refused for lack of a slot */
} lrt_slab_stats;

/* Bytes of region needed; slot_bytes is rounded up to a multiple of LRT_CACHELINE. */
size_t lrt_slab_required_bytes(uint64_t slot_bytes, uint64_t n_slots);
int lrt_slab_create(void *region, size_t region_bytes, uint64_t slot_bytes, uint64_t n_slots, lrt_slab **out);
int lrt_slab_attach(void *region, size_t region_bytes, lrt_slab **out);
void lrt_slab_free_handle(lrt_slab *s);

/* Index of a free slot (>= 0), or LRT_EXHAUSTED. */
int64_t lrt_slab_alloc(lrt_slab *s);
int lrt_slab_free(lrt_slab *s, int64_t index);
void *lrt_slab_ptr(const lrt_slab *s, int64_t index);
/* Byte offset of the slot from the start of the region (for zero-copy views). */
uint64_t lrt_slab_offset(const lrt_slab *s, int64_t index);
uint64_t lrt_slab_slot_bytes(const lrt_slab *s);
uint64_t lrt_slab_n_slots(const lrt_slab *s);
void lrt_slab_get_stats(const lrt_slab *s, lrt_slab_stats *out);

#ifdef __cplusplus
}
#endif
#endif

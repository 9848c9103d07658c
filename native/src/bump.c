/* lumenrt native core: bump arena. One owner allocates (no atomics needed for correctness); the
 * counters are relaxed atomics so that other processes can read them. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lrt/bump.h"

#define BUMP_MAGIC 0x4c525442554d5031ull /* "LRTBUMP1" */
#define BUMP_HDR_BYTES 128u /* the data starts 128-aligned (so 64-aligned blocks stay aligned) */

typedef struct bump_hdr {
    uint64_t magic;
    uint64_t capacity;
    _Atomic uint64_t used;
    _Atomic uint64_t high_water;
    _Atomic uint64_t allocations;
    _Atomic uint64_t resets;
    _Atomic uint64_t exhausted;
} bump_hdr;
_Static_assert(sizeof(bump_hdr) <= BUMP_HDR_BYTES, "header fits its reserved space");

struct lrt_bump {
    bump_hdr *h;
    char *data;
};

size_t lrt_bump_required_bytes(uint64_t capacity_bytes) {
    return capacity_bytes > (1ull << 62) ? SIZE_MAX : BUMP_HDR_BYTES + capacity_bytes;
}

static int handle(void *region, lrt_bump **out) {
    lrt_bump *b = malloc(sizeof(*b));
    if (!b) return LRT_ESYS;
    b->h = region;
    b->data = (char *)region + BUMP_HDR_BYTES;
    *out = b;
    return LRT_OK;
}

int lrt_bump_create(void *region, size_t region_bytes, uint64_t capacity_bytes, lrt_bump **out) {
    if (!region || !out || ((uintptr_t)region % LRT_CACHELINE) || capacity_bytes == 0 ||
        region_bytes < lrt_bump_required_bytes(capacity_bytes))
        return LRT_EINVAL;
    bump_hdr *h = region;
    memset(h, 0, sizeof(*h));
    h->capacity = capacity_bytes;
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, BUMP_MAGIC, memory_order_release);
    return handle(region, out);
}

int lrt_bump_attach(void *region, size_t region_bytes, lrt_bump **out) {
    if (!region || !out || ((uintptr_t)region % LRT_CACHELINE)) return LRT_EINVAL;
    bump_hdr *h = region;
    if (region_bytes < sizeof(*h) ||
        atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != BUMP_MAGIC ||
        region_bytes < lrt_bump_required_bytes(h->capacity))
        return LRT_EBADREGION;
    return handle(region, out);
}

void lrt_bump_free_handle(lrt_bump *b) { free(b); }

int64_t lrt_bump_alloc(lrt_bump *b, uint64_t size, uint64_t align) {
    bump_hdr *h = b->h;
    if (align == 0 || (align & (align - 1)) || align > 4096) return LRT_EINVAL;
    uint64_t used = atomic_load_explicit(&h->used, memory_order_relaxed);
    uint64_t start = (used + align - 1) & ~(align - 1);
    if (start > h->capacity || size > h->capacity - start) {
        atomic_fetch_add_explicit(&h->exhausted, 1, memory_order_relaxed);
        return LRT_EXHAUSTED;
    }
    uint64_t end = start + size;
    atomic_store_explicit(&h->used, end, memory_order_relaxed);
    if (end > atomic_load_explicit(&h->high_water, memory_order_relaxed))
        atomic_store_explicit(&h->high_water, end, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->allocations, 1, memory_order_relaxed);
    return (int64_t)(BUMP_HDR_BYTES + start);
}

void lrt_bump_reset(lrt_bump *b) {
    atomic_store_explicit(&b->h->used, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->h->resets, 1, memory_order_relaxed);
}

void *lrt_bump_ptr(const lrt_bump *b, int64_t offset) { return (char *)b->h + offset; }

void lrt_bump_get_stats(const lrt_bump *b, lrt_bump_stats *o) {
    bump_hdr *h = b->h;
    o->capacity_bytes = h->capacity;
    o->used_bytes = atomic_load(&h->used);
    o->high_water_bytes = atomic_load(&h->high_water);
    o->allocations = atomic_load(&h->allocations);
    o->resets = atomic_load(&h->resets);
    o->exhausted = atomic_load(&h->exhausted);
}

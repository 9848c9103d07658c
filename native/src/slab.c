/* lumenrt native core: slab pool (lock-free free list over a caller-given region).
 *
 * Layout: header (1 line) | next[n_slots] (u32) | state[n_slots] (u32) | pad | slots (64-aligned)
 *
 * Invariants
 *   1. free_head = (tag << 32) | index of the first free slot, or NIL; the tag grows on every
 *      successful CAS, so a head that was popped and pushed back in between cannot be mistaken for
 *      the one we read (ABA).
 *   2. state[i] is USED exactly while slot i is handed out; free() flips it with an exchange, so a
 *      second free of the same slot is detected and refused, and never enters the list twice.
 *   3. in_use = allocated - freed at quiescence; high_water >= in_use at all times.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lrt/slab.h"

#define SLAB_MAGIC 0x4c5254534c414231ull /* "LRTSLAB1" */
#define NIL 0xffffffffu
#define STATE_FREE 0u
#define STATE_USED 1u

typedef struct slab_hdr {
    uint64_t magic;
    uint64_t slot_bytes;
    uint64_t n_slots;
    uint64_t slots_offset;
    __attribute__((aligned(64))) _Atomic uint64_t free_head;
    __attribute__((aligned(64))) _Atomic uint64_t allocated;
    _Atomic uint64_t freed;
    _Atomic uint64_t in_use;
    _Atomic uint64_t high_water;
    _Atomic uint64_t exhausted;
} slab_hdr;

struct lrt_slab {
    slab_hdr *h;
    _Atomic uint32_t *next;
    _Atomic uint32_t *state;
    char *slots;
};

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static uint64_t slots_offset(uint64_t n) {
    return round_up(sizeof(slab_hdr) + 2 * n * sizeof(uint32_t), LRT_CACHELINE);
}

size_t lrt_slab_required_bytes(uint64_t slot_bytes, uint64_t n_slots) {
    /* sizes that would overflow are refused: SIZE_MAX never fits a region */
    if (slot_bytes == 0 || n_slots == 0 || slot_bytes > (1ull << 40) || n_slots >= NIL) return SIZE_MAX;
    uint64_t slots = round_up(slot_bytes, LRT_CACHELINE);
    if (slots > (UINT64_MAX / 2) / n_slots) return SIZE_MAX;
    return (size_t)(slots_offset(n_slots) + slots * n_slots);
}

static int handle(void *region, lrt_slab **out) {
    lrt_slab *s = malloc(sizeof(*s));
    if (!s) return LRT_ESYS;
    s->h = region;
    s->next = (_Atomic uint32_t *)((char *)region + sizeof(slab_hdr));
    s->state = s->next + s->h->n_slots;
    s->slots = (char *)region + s->h->slots_offset;
    *out = s;
    return LRT_OK;
}

int lrt_slab_create(void *region, size_t region_bytes, uint64_t slot_bytes, uint64_t n_slots, lrt_slab **out) {
    if (!region || !out || ((uintptr_t)region % LRT_CACHELINE) || slot_bytes == 0 || n_slots == 0 ||
        n_slots >= NIL)
        return LRT_EINVAL;
    if (region_bytes < lrt_slab_required_bytes(slot_bytes, n_slots)) return LRT_EINVAL;
    slab_hdr *h = region;
    memset(h, 0, sizeof(*h));
    h->slot_bytes = round_up(slot_bytes, LRT_CACHELINE);
    h->n_slots = n_slots;
    h->slots_offset = slots_offset(n_slots);
    _Atomic uint32_t *next = (_Atomic uint32_t *)((char *)region + sizeof(slab_hdr));
    _Atomic uint32_t *state = next + n_slots;
    for (uint64_t i = 0; i < n_slots; i++) {
        atomic_init(&next[i], i + 1 < n_slots ? (uint32_t)(i + 1) : NIL);
        atomic_init(&state[i], STATE_FREE);
    }
    atomic_init(&h->free_head, 0);
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, SLAB_MAGIC, memory_order_release);
    return handle(region, out);
}

int lrt_slab_attach(void *region, size_t region_bytes, lrt_slab **out) {
    if (!region || !out || ((uintptr_t)region % LRT_CACHELINE)) return LRT_EINVAL;
    slab_hdr *h = region;
    if (region_bytes < sizeof(*h) ||
        atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != SLAB_MAGIC ||
        region_bytes < lrt_slab_required_bytes(h->slot_bytes, h->n_slots))
        return LRT_EBADREGION;
    return handle(region, out);
}

void lrt_slab_free_handle(lrt_slab *s) { free(s); }

int64_t lrt_slab_alloc(lrt_slab *s) {
    slab_hdr *h = s->h;
    /* acquire: pairs with the release CAS in lrt_slab_free, so next[idx] is the one it wrote */
    uint64_t head = atomic_load_explicit(&h->free_head, memory_order_acquire);
    uint32_t idx;
    for (;;) {
        idx = (uint32_t)head;
        if (idx == NIL) {
            atomic_fetch_add_explicit(&h->exhausted, 1, memory_order_relaxed);
            return LRT_EXHAUSTED;
        }
        uint32_t nxt = atomic_load_explicit(&s->next[idx], memory_order_relaxed);
        uint64_t want = (((head >> 32) + 1) << 32) | nxt;
        if (atomic_compare_exchange_weak_explicit(&h->free_head, &head, want, memory_order_acquire,
                                                  memory_order_acquire))
            break;
    }
    atomic_store_explicit(&s->state[idx], STATE_USED, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->allocated, 1, memory_order_relaxed);
    uint64_t used = atomic_fetch_add_explicit(&h->in_use, 1, memory_order_relaxed) + 1;
    uint64_t hw = atomic_load_explicit(&h->high_water, memory_order_relaxed);
    while (used > hw &&
           !atomic_compare_exchange_weak_explicit(&h->high_water, &hw, used, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
    return (int64_t)idx;
}

int lrt_slab_free(lrt_slab *s, int64_t index) {
    slab_hdr *h = s->h;
    if (index < 0 || (uint64_t)index >= h->n_slots) return LRT_EINVAL;
    uint32_t idx = (uint32_t)index;
    if (atomic_exchange_explicit(&s->state[idx], STATE_FREE, memory_order_relaxed) != STATE_USED)
        return LRT_EDOUBLEFREE;
    atomic_fetch_add_explicit(&h->freed, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&h->in_use, 1, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&h->free_head, memory_order_relaxed);
    for (;;) {
        atomic_store_explicit(&s->next[idx], (uint32_t)head, memory_order_relaxed);
        uint64_t want = (((head >> 32) + 1) << 32) | idx;
        /* release: publishes next[idx] (and the caller's last writes to the slot) to the next
         * allocator, which acquires free_head */
        if (atomic_compare_exchange_weak_explicit(&h->free_head, &head, want, memory_order_release,
                                                  memory_order_relaxed))
            return LRT_OK;
    }
}

void *lrt_slab_ptr(const lrt_slab *s, int64_t index) {
    return s->slots + (uint64_t)index * s->h->slot_bytes;
}

uint64_t lrt_slab_offset(const lrt_slab *s, int64_t index) {
    return s->h->slots_offset + (uint64_t)index * s->h->slot_bytes;
}

uint64_t lrt_slab_slot_bytes(const lrt_slab *s) { return s->h->slot_bytes; }
uint64_t lrt_slab_n_slots(const lrt_slab *s) { return s->h->n_slots; }

void lrt_slab_get_stats(const lrt_slab *s, lrt_slab_stats *o) {
    slab_hdr *h = s->h;
    o->slot_bytes = h->slot_bytes;
    o->n_slots = h->n_slots;
    o->allocated = atomic_load(&h->allocated);
    o->freed = atomic_load(&h->freed);
    o->in_use = atomic_load(&h->in_use);
    o->high_water = atomic_load(&h->high_water);
    o->exhausted = atomic_load(&h->exhausted);
}

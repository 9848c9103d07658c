/* Counts heap allocations of a process, for benchmarks/latency.py: LD_PRELOAD'ed into a server
 * started with PYTHONMALLOC=malloc (so every Python object, buffer and numpy array goes through
 * malloc), it adds one to a shared counter for every malloc, calloc, realloc, posix_memalign,
 * aligned_alloc and memalign call. The counter is the first 8 bytes of the file named by
 * LRT_ALLOC_COUNTER_FILE, mapped shared, so the benchmark reads it from its own process while the
 * server runs; without that variable nothing is counted.
 *
 * Invariants: the counting path calls no allocator (dlsym is resolved before the map is made, and
 * the map is made with open/mmap only); a call that arrives while dlsym is still resolving is
 * served from a static bootstrap buffer (glibc's dlsym may calloc). Build:
 *   gcc -O2 -shared -fPIC -o alloc_counter.so alloc_counter.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);

static uint64_t *counter;
static _Alignas(64) char bootstrap[1 << 16];
static size_t bootstrap_used;

static void *from_bootstrap(size_t n) {
    size_t at = (bootstrap_used + 15) & ~(size_t)15;
    if (at + n > sizeof bootstrap) return NULL;
    bootstrap_used = at + n;
    return bootstrap + at;
}

static int in_bootstrap(void *p) {
    return (char *)p >= bootstrap && (char *)p < bootstrap + sizeof bootstrap;
}

__attribute__((constructor)) static void init(void) {
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_free = dlsym(RTLD_NEXT, "free");
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = dlsym(RTLD_NEXT, "memalign");
    const char *path = getenv("LRT_ALLOC_COUNTER_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    void *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) counter = map;
}

static inline void count(void) {
    if (counter) __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

void *malloc(size_t n) {
    if (real_malloc == NULL) return from_bootstrap(n);
    count();
    return real_malloc(n);
}

void *calloc(size_t k, size_t n) {
    if (real_calloc == NULL) return from_bootstrap(k * n); /* static: already zero */
    count();
    return real_calloc(k, n);
}

void *realloc(void *p, size_t n) {
    if (real_realloc == NULL || in_bootstrap(p)) {
        void *q = real_malloc ? real_malloc(n) : from_bootstrap(n);
        if (q && p) {
            size_t left = (size_t)(bootstrap + sizeof bootstrap - (char *)p);
            __builtin_memcpy(q, p, n < left ? n : left);
        }
        count();
        return q;
    }
    count();
    return real_realloc(p, n);
}

void free(void *p) {
    if (p == NULL || in_bootstrap(p)) return;
    if (real_free) real_free(p);
}

int posix_memalign(void **out, size_t align, size_t n) {
    count();
    return real_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n) {
    count();
    return real_aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n) {
    count();
    return real_memalign(align, n);
}

/* lumenrt native core: status strings and the clock. */
#define _GNU_SOURCE
#include <time.h>

#include "lrt/common.h"

const char *lrt_strerror(int rc) {
    switch (rc) {
    case LRT_OK: return "ok";
    case LRT_EMPTY: return "ring is empty";
    case LRT_FULL: return "ring is full";
    case LRT_TIMEOUT: return "timed out";
    case LRT_CLOSED: return "ring is closed";
    case LRT_EINVAL: return "invalid argument";
    case LRT_EBADREGION: return "region holds no valid structure of this kind and version";
    case LRT_EXHAUSTED: return "arena exhausted";
    case LRT_EDOUBLEFREE: return "slot is not allocated (double free?)";
    case LRT_EAGENTS: return "too many threads use this ring (more than its agent table, max_agents, holds)";
    case LRT_EMISUSE: return "spsc ring already has a live producer/consumer";
    case LRT_ESYS: return "system call failed";
    case LRT_EEXIST: return "shared memory segment already exists";
    case LRT_ENOENT: return "shared memory segment does not exist";
    case LRT_EINTR: return "interrupted by a signal";
    }
    return "unknown status";
}

uint64_t lrt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

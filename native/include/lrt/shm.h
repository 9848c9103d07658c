/* lumenrt native core: named POSIX shared-memory segments with one owner.
 *
 * Lifecycle: the owner creates (O_EXCL) and is the only one that unlinks; other processes attach
 * and merely unmap. Each segment starts with a page holding a header (magic, owner pid and the
 * owner's process start time); the user region follows, page aligned. A segment whose owner is
 * gone (pid dead, zombie, or reused by a process with another start time) is stale:
 * lrt_shm_clean_stale() unlinks every such segment whose name starts with a prefix, so the next
 * start cleans up after a crashed run.
 */
#ifndef LRT_SHM_H
#define LRT_SHM_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LRT_SHM_NAME_MAX 200
#define LRT_SHM_HEADER_BYTES 4096u

typedef struct lrt_shm {
    char name[LRT_SHM_NAME_MAX + 1]; /* without the leading '/' */
    void *base;                      /* start of the mapping (the header page) */
    void *data;                      /* the user region: base + LRT_SHM_HEADER_BYTES */
    uint64_t data_bytes;
    int owner;                       /* 1 if this process created it */
} lrt_shm;

/* Names: 1..LRT_SHM_NAME_MAX characters of [A-Za-z0-9._-]. */
int lrt_shm_create(const char *name, uint64_t data_bytes, lrt_shm *out);
int lrt_shm_attach(const char *name, lrt_shm *out);
/* Unmap; if this process is the owner, also unlink. */
void lrt_shm_close(lrt_shm *s);
/* Unlink by name without mapping (no ownership check). */
int lrt_shm_unlink_name(const char *name);
/* Unlink stale segments named prefix*. Returns how many were removed, or a negative status.
 * If `removed` is not NULL, up to max_removed names are written there, one per
 * (LRT_SHM_NAME_MAX + 1) bytes. */
int lrt_shm_clean_stale(const char *prefix, char *removed, int max_removed);
/* 1 if the process `pid` started at `starttime` (clock ticks after boot, as in /proc/pid/stat)
 * is still running (not a zombie), else 0. starttime 0 skips the start-time comparison. */
int lrt_process_alive(int32_t pid, uint64_t starttime);
/* Start time of process `pid` from /proc, 0 if unknown. */
uint64_t lrt_process_starttime(int32_t pid);

#ifdef __cplusplus
}
#endif
#endif

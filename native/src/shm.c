/* lumenrt native core: named POSIX shared memory with one owner, and stale-segment cleanup.
 *
 * Lifecycle
 *   1. owner: shm_open(O_CREAT|O_EXCL), ftruncate, mmap, write the header (magic last, release);
 *   2. others: shm_open(O_RDWR), read the size from the header, mmap;
 *   3. everyone: munmap on close; only the owner (same pid as in the header) also unlinks;
 *   4. next start: lrt_shm_clean_stale() unlinks segments whose owner process is gone.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lrt/shm.h"

#define SHM_MAGIC 0x4c5254534d454731ull /* "LRTSMEG1" */

typedef struct shm_hdr {
    _Atomic uint64_t magic;
    uint64_t data_bytes;
    int32_t owner_pid;
    uint32_t pad_;
    uint64_t owner_starttime;
} shm_hdr;

static int valid_name(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > LRT_SHM_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static void slash_name(char *dst, const char *name) { snprintf(dst, LRT_SHM_NAME_MAX + 2, "/%s", name); }

uint64_t lrt_process_starttime(int32_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may contain spaces: fields resume after the last ')' */
    if (!p) return 0;
    /* after ')': field 3 (state) ... field 22 (starttime) */
    unsigned long long v = 0;
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (++field == 22) {
            v = strtoull(tok, NULL, 10);
            break;
        }
    }
    return v;
}

/* Threads listed under /proc/pid/task (the leader included), or -1 if unknown. */
static int count_threads(int32_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Dead only when sure: "no such process" (ESRCH, ENOENT), a zombie with no thread left, or a pid
 * now used by a process with another start time. Anything else (EMFILE, hidepid, a parse error)
 * answers alive, since wrongly declaring a live process dead would let recovery corrupt a ring. */
int lrt_process_alive(int32_t pid, uint64_t starttime) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno != ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 1;
    char state = p[2];
    if ((state == 'Z' || state == 'X' || state == 'x') && count_threads(pid) <= 1)
        return 0; /* exited, not yet reaped (a leader that called pthread_exit keeps threads) */
    if (starttime != 0) {
        uint64_t now = lrt_process_starttime(pid);
        if (now != 0 && now != starttime) return 0; /* pid reused */
    }
    return 1;
}

int lrt_shm_create(const char *name, uint64_t data_bytes, lrt_shm *out) {
    if (!valid_name(name) || data_bytes == 0 || !out) return LRT_EINVAL;
    char path[LRT_SHM_NAME_MAX + 2];
    slash_name(path, name);
    int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return errno == EEXIST ? LRT_EEXIST : LRT_ESYS;
    size_t total = LRT_SHM_HEADER_BYTES + data_bytes;
    if (ftruncate(fd, (off_t)total) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(path);
        errno = e;
        return LRT_ESYS;
    }
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED) {
        shm_unlink(path);
        errno = e;
        return LRT_ESYS;
    }
    shm_hdr *h = base;
    h->data_bytes = data_bytes;
    h->owner_pid = (int32_t)getpid();
    h->owner_starttime = lrt_process_starttime(h->owner_pid);
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof out->name, "%s", name);
    out->base = base;
    out->data = (char *)base + LRT_SHM_HEADER_BYTES;
    out->data_bytes = data_bytes;
    out->owner = 1;
    return LRT_OK;
}

int lrt_shm_attach(const char *name, lrt_shm *out) {
    if (!valid_name(name) || !out) return LRT_EINVAL;
    char path[LRT_SHM_NAME_MAX + 2];
    slash_name(path, name);
    int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return errno == ENOENT ? LRT_ENOENT : LRT_ESYS;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < LRT_SHM_HEADER_BYTES) {
        close(fd);
        return LRT_EBADREGION;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return LRT_ESYS;
    shm_hdr *h = base;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC ||
        h->data_bytes + LRT_SHM_HEADER_BYTES > (uint64_t)st.st_size) {
        munmap(base, (size_t)st.st_size);
        return LRT_EBADREGION;
    }
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof out->name, "%s", name);
    out->base = base;
    out->data = (char *)base + LRT_SHM_HEADER_BYTES;
    out->data_bytes = h->data_bytes;
    out->owner = 0;
    return LRT_OK;
}

void lrt_shm_close(lrt_shm *s) {
    if (!s || !s->base) return;
    shm_hdr *h = s->base;
    /* owner only, and only in the process that created it (a forked child inherits the struct) */
    int unlink_it = s->owner && h->owner_pid == (int32_t)getpid();
    munmap(s->base, LRT_SHM_HEADER_BYTES + s->data_bytes);
    if (unlink_it) lrt_shm_unlink_name(s->name);
    s->base = s->data = NULL;
}

int lrt_shm_unlink_name(const char *name) {
    if (!valid_name(name)) return LRT_EINVAL;
    char path[LRT_SHM_NAME_MAX + 2];
    slash_name(path, name);
    if (shm_unlink(path) != 0) return errno == ENOENT ? LRT_ENOENT : LRT_ESYS;
    return LRT_OK;
}

/* Owner pid from a name of the form <prefix><pid>.<anything>, or 0. */
static int32_t pid_from_name(const char *rest) {
    char *end = NULL;
    long v = strtol(rest, &end, 10);
    return (end != rest && end && *end == '.' && v > 0 && v < (1L << 31)) ? (int32_t)v : 0;
}

static int segment_stale(const char *name, size_t prefix_len) {
    char path[LRT_SHM_NAME_MAX + 2];
    slash_name(path, name);
    int fd = shm_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct stat st;
    shm_hdr h;
    memset(&h, 0, sizeof h);
    int have_hdr = fstat(fd, &st) == 0 && (uint64_t)st.st_size >= sizeof h &&
                   pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == SHM_MAGIC;
    close(fd);
    if (have_hdr) return !lrt_process_alive(h.owner_pid, h.owner_starttime);
    /* no header yet: a creator killed between shm_open and writing it, or one still creating */
    int32_t pid = pid_from_name(name + prefix_len);
    return pid > 0 && !lrt_process_alive(pid, 0);
}

int lrt_shm_clean_stale(const char *prefix, char *removed, int max_removed) {
    if (!prefix || !*prefix || !valid_name(prefix)) return LRT_EINVAL;
    size_t plen = strlen(prefix);
    DIR *d = opendir("/dev/shm");
    if (!d) return LRT_ESYS;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0 || !valid_name(e->d_name)) continue;
        if (!segment_stale(e->d_name, plen)) continue;
        if (lrt_shm_unlink_name(e->d_name) != LRT_OK) continue;
        if (removed && count < max_removed)
            snprintf(removed + (size_t)count * (LRT_SHM_NAME_MAX + 1), LRT_SHM_NAME_MAX + 1, "%.200s",
                     e->d_name); /* valid_name() bounds it to LRT_SHM_NAME_MAX */
        count++;
    }
    closedir(d);
    return count;
}

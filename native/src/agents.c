/* lumenrt native core: per-thread agents, futex waits and targeted wake-ups.
 *
 * Invariants
 *   1. An agent entry is owned by exactly one live thread, or free (owner == 0), or owned by a dead
 *      thread/process awaiting reclaim. Only lrt_ring_recover() frees the entry of a dead process
 *      (after resolving its claims); registration frees the entry of an exited thread of a live
 *      process, whose claims are necessarily 0.
 *   2. Bit i of pop_mask/push_mask is set only by agent i (before it sleeps) and cleared by anyone
 *      who wakes it, by agent i itself after waking, or by recovery. A set bit for a dead agent
 *      costs one wasted FUTEX_WAKE, then it is gone (the waker clears it and goes on to the next).
 *   3. A waker bumps the sleeper's futex word before FUTEX_WAKE; the sleeper passed the value it
 *      read before setting its bit, so a wake-up between "set bit" and "futex_wait" is never lost.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "lrt/shm.h"

/* ---- thread-local agent cache ------------------------------------------------------------- */

/* Bumped in the child after fork(): a child inherits the forking thread's cache but is a new
 * process, so every cached agent index is invalid there. */
static _Atomic uint32_t g_fork_gen = 1;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void on_fork_child(void) { atomic_fetch_add_explicit(&g_fork_gen, 1, memory_order_relaxed); }
static void install_atfork(void) { pthread_atfork(NULL, NULL, on_fork_child); }

#define TL_CACHE 8
typedef struct tl_entry {
    uint64_t uid;
    uint32_t gen;
    int32_t idx;
} tl_entry;
static _Thread_local tl_entry tl_cache[TL_CACHE];
static _Thread_local uint32_t tl_last;   /* index into tl_cache of the last hit */
static _Thread_local uint32_t tl_victim; /* round-robin eviction */

static uint64_t self_starttime(void) {
    static _Atomic uint64_t cached_st;
    static _Atomic uint32_t cached_gen;
    uint32_t gen = atomic_load(&g_fork_gen);
    if (atomic_load(&cached_gen) != gen) {
        atomic_store(&cached_st, lrt_process_starttime((int32_t)getpid()));
        atomic_store(&cached_gen, gen);
    }
    return atomic_load(&cached_st);
}

static int thread_alive(uint64_t owner) {
    pid_t pid = (pid_t)(owner >> 32), tid = (pid_t)(owner & 0xffffffffu);
    if (syscall(SYS_tgkill, pid, tid, 0) == 0) return 1;
    return errno != ESRCH; /* only "no such thread" means gone (EPERM: exists, not ours) */
}

int lrt_agent_alive(const lrt_agent *a) {
    uint64_t owner = atomic_load(&a->owner);
    if (owner == 0 || owner == LRT_OWNER_RECLAIMING) return 0;
    /* starttime is 0 between a registration's CAS and its store: then the pid alone decides */
    return lrt_process_alive((int32_t)(owner >> 32), atomic_load(&a->starttime));
}

int lrt_agent_thread_alive(const lrt_agent *a) {
    uint64_t owner = atomic_load(&a->owner);
    return lrt_agent_alive(a) && thread_alive(owner);
}

static int agent_reset(lrt_ring_hdr *h, int i) {
    uint64_t bit = 1ull << i;
    atomic_fetch_and(&h->pop_mask, ~bit);
    atomic_fetch_and(&h->push_mask, ~bit);
    int was_spinning = (atomic_fetch_and(&h->pop_spin_mask, ~bit) & bit) != 0;
    atomic_store(&h->agents[i].push_claim, 0);
    atomic_store(&h->agents[i].pop_claim, 0);
    return was_spinning;
}

int lrt_agent_release(lrt_ring_hdr *h, int i) {
    int was_spinning = agent_reset(h, i);
    atomic_store(&h->agents[i].starttime, 0);
    atomic_store(&h->agents[i].owner, 0); /* seq_cst: the reset above is visible to the next owner */
    return was_spinning;
}

static int agent_register(lrt_ring *r) {
    lrt_ring_hdr *h = r->hdr;
    uint64_t key = ((uint64_t)(uint32_t)getpid() << 32) | (uint32_t)syscall(SYS_gettid);
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int i = 0; i < LRT_MAX_AGENTS; i++) {
            if (atomic_load(&h->agents[i].owner) != key) continue;
            if (atomic_load(&h->agents[i].starttime) == self_starttime()) return i; /* cache evicted */
            lrt_ring_recover(r, NULL, -1); /* a dead process whose pid and tid we reuse: repair it */
        }
        for (int i = 0; i < LRT_MAX_AGENTS; i++) {
            uint64_t expect = 0;
            if (atomic_load(&h->agents[i].owner) == 0 &&
                atomic_compare_exchange_strong(&h->agents[i].owner, &expect, key)) {
                atomic_store(&h->agents[i].starttime, self_starttime());
                (void)agent_reset(h, i);
                return i;
            }
        }
        /* Table full: drop entries of exited threads of live processes (their claims are 0), and
         * let recovery free the entries of dead processes. */
        for (int i = 0; i < LRT_MAX_AGENTS; i++) {
            uint64_t o = atomic_load(&h->agents[i].owner);
            if (o == 0 || o == LRT_OWNER_RECLAIMING || thread_alive(o)) continue;
            if (!lrt_agent_alive(&h->agents[i])) continue; /* dead process: recovery below */
            if (atomic_load(&h->agents[i].push_claim) || atomic_load(&h->agents[i].pop_claim)) continue;
            if (atomic_compare_exchange_strong(&h->agents[i].owner, &o, LRT_OWNER_RECLAIMING) &&
                lrt_agent_release(h, i))
                lrt_wake_all(r);
        }
        /* push-only: a dead consumer's held descriptor is reported to the owner's recover() */
        lrt_ring_recover(r, NULL, -1);
    }
    return LRT_EAGENTS;
}

int lrt_agent_index(lrt_ring *r) {
    uint64_t uid = r->hdr->uid;
    uint32_t gen = atomic_load_explicit(&g_fork_gen, memory_order_relaxed);
    tl_entry *e = &tl_cache[tl_last];
    if (e->uid == uid && e->gen == gen) return e->idx;
    for (uint32_t i = 0; i < TL_CACHE; i++) {
        if (tl_cache[i].uid == uid && tl_cache[i].gen == gen) {
            tl_last = i;
            return tl_cache[i].idx;
        }
    }
    pthread_once(&g_atfork_once, install_atfork);
    int idx = agent_register(r);
    if (idx < 0) return idx;
    uint32_t v = tl_victim++ % TL_CACHE;
    tl_cache[v] = (tl_entry){.uid = uid, .gen = gen, .idx = idx};
    tl_last = v;
    return idx;
}

/* ---- futex ------------------------------------------------------------------------------- */

int lrt_futex_wait(lrt_ring *r, _Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000);
        ts.tv_nsec = (long)(timeout_ns % 1000000000);
        tsp = &ts;
    }
    atomic_fetch_add_explicit(&r->hdr->futex_waits, 1, memory_order_relaxed);
    int op = r->futex_private ? FUTEX_WAIT_PRIVATE : FUTEX_WAIT;
    return (int)syscall(SYS_futex, (uint32_t *)word, op, expected, tsp, NULL, 0);
}

static long futex_wake(lrt_ring *r, _Atomic uint32_t *word, int n) {
    atomic_fetch_add_explicit(&r->hdr->futex_wakes, 1, memory_order_relaxed);
    int op = r->futex_private ? FUTEX_WAKE_PRIVATE : FUTEX_WAKE;
    return syscall(SYS_futex, (uint32_t *)word, op, n, NULL, NULL, 0);
}

void lrt_wake_one(lrt_ring *r, _Atomic uint64_t *mask, int pop_side) {
    uint64_t m = atomic_load(mask);
    while (m) {
        int i = __builtin_ctzll(m);
        uint64_t bit = 1ull << i;
        uint64_t old = atomic_fetch_and(mask, ~bit);
        if (old & bit) {
            lrt_agent *a = &r->hdr->agents[i];
            _Atomic uint32_t *w = pop_side ? &a->pop_word : &a->push_word;
            atomic_fetch_add(w, 1);
            /* > 0: a sleeper is up and will take the element. 0: agent i had not gone to sleep
             * yet (it will see its word changed and re-check) or is dead; try the next one so a
             * dead sleeper cannot swallow the wake-up. */
            if (futex_wake(r, w, 1) > 0) return;
        }
        m = atomic_load(mask);
    }
}

void lrt_wake_all(lrt_ring *r) {
    lrt_ring_hdr *h = r->hdr;
    for (int side = 0; side < 2; side++) {
        uint64_t m = atomic_exchange(side ? &h->pop_mask : &h->push_mask, 0);
        while (m) {
            int i = __builtin_ctzll(m);
            m &= m - 1;
            _Atomic uint32_t *w = side ? &h->agents[i].pop_word : &h->agents[i].push_word;
            atomic_fetch_add(w, 1);
            futex_wake(r, w, INT_MAX);
        }
    }
}

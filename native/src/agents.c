/* lumenrt native core: per-thread agents, futex waits and targeted wake-ups.
 *
 * Invariants
 *   1. An agent entry is owned by exactly one live thread, or free (owner == 0), or owned by a dead
 *      thread/process awaiting reclaim. Only lrt_ring_recover() frees the entry of a dead process
 *      (after resolving its claims); registration frees the entry of an exited thread of a live
 *      process, whose claims are necessarily 0.
 *   2. Agent i's bit of the pop/push masks (bit i % 64 of word i / 64, internal.h "Wait masks") is
 *      set only by agent i (before it sleeps) and cleared by anyone who wakes it, by agent i itself
 *      after waking, or by recovery. A set bit for a dead agent costs one wasted FUTEX_WAKE, then
 *      it is gone (the waker clears it and goes on to the next, in this word and the following).
 *   3. A waker bumps the sleeper's futex word before FUTEX_WAKE; the sleeper passed the value it
 *      read before setting its bit, so a wake-up between "set bit" and "futex_wait" is never lost.
 *   4. Registration takes the lowest free entry and, before returning it, raises words_used to
 *      cover it (W1): no bit is ever set in a word that the wake checks do not read.
 *   5. Every loop over entries stops at the ring's own max_agents, every loop over wait words at
 *      its nwords (both from the header, checked against the region's size at attach).
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

static int agent_reset(lrt_ring *r, int i) {
    lrt_wait_word *w = lrt_wait_word_of(r, i);
    uint64_t bit = lrt_wait_bit(i);
    atomic_fetch_and(&w->m[LRT_WAIT_POP], ~bit);
    atomic_fetch_and(&w->m[LRT_WAIT_PUSH], ~bit);
    int was_spinning = (atomic_fetch_and(&w->m[LRT_WAIT_SPIN], ~bit) & bit) != 0;
    atomic_store(&r->agents[i].push_claim, 0);
    atomic_store(&r->agents[i].pop_claim, 0);
    return was_spinning;
}

int lrt_agent_release(lrt_ring *r, int i) {
    int was_spinning = agent_reset(r, i);
    atomic_store(&r->agents[i].starttime, 0);
    atomic_store(&r->agents[i].owner, 0); /* seq_cst: the reset above is visible to the next owner */
    return was_spinning;
}

/* Invariant 4: words_used covers agent i before agent i can set a bit. */
static void note_word_in_use(lrt_ring *r, int i) {
    uint32_t want = (uint32_t)(i >> 6) + 1;
    uint32_t cur = atomic_load(&r->hdr->words_used);
    while (cur < want && !atomic_compare_exchange_weak(&r->hdr->words_used, &cur, want)) {
    }
}

static int agent_register(lrt_ring *r) {
    lrt_agent *agents = r->agents;
    int n = (int)r->max_agents;
    uint64_t key = ((uint64_t)(uint32_t)getpid() << 32) | (uint32_t)syscall(SYS_gettid);
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int i = 0; i < n; i++) {
            if (atomic_load(&agents[i].owner) != key) continue;
            if (atomic_load(&agents[i].starttime) == self_starttime()) return i; /* cache evicted */
            lrt_ring_recover(r, NULL, -1); /* a dead process whose pid and tid we reuse: repair it */
        }
        for (int i = 0; i < n; i++) {
            uint64_t expect = 0;
            if (atomic_load(&agents[i].owner) == 0 &&
                atomic_compare_exchange_strong(&agents[i].owner, &expect, key)) {
                atomic_store(&agents[i].starttime, self_starttime());
                (void)agent_reset(r, i);
                note_word_in_use(r, i);
                return i;
            }
        }
        /* Table full: drop entries of exited threads of live processes (their claims are 0), and
         * let recovery free the entries of dead processes. */
        for (int i = 0; i < n; i++) {
            uint64_t o = atomic_load(&agents[i].owner);
            if (o == 0 || o == LRT_OWNER_RECLAIMING || thread_alive(o)) continue;
            if (!lrt_agent_alive(&agents[i])) continue; /* dead process: recovery below */
            if (atomic_load(&agents[i].push_claim) || atomic_load(&agents[i].pop_claim)) continue;
            if (atomic_compare_exchange_strong(&agents[i].owner, &o, LRT_OWNER_RECLAIMING) &&
                lrt_agent_release(r, i))
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

int lrt_wake_one(lrt_ring *r, int which) {
    uint32_t n = lrt_words_in_use(r);
    for (uint32_t k = 0; k < n; k++) {
        _Atomic uint64_t *mask = &r->waits[k].m[which];
        uint64_t m = atomic_load(mask);
        while (m) {
            int b = __builtin_ctzll(m);
            uint64_t bit = 1ull << b;
            uint64_t old = atomic_fetch_and(mask, ~bit);
            if (old & bit) {
                lrt_agent *a = &r->agents[(k << 6) + (uint32_t)b];
                _Atomic uint32_t *w = which == LRT_WAIT_POP ? &a->pop_word : &a->push_word;
                atomic_fetch_add(w, 1);
                /* > 0: a sleeper is up and will take the element. 0: that agent had not gone to
                 * sleep yet (it will see its word changed and re-check) or is dead; try the next
                 * one so a dead sleeper cannot swallow the wake-up. */
                if (futex_wake(r, w, 1) > 0) return 1;
            }
            m = atomic_load(mask);
        }
    }
    return 0;
}

void lrt_wake_all(lrt_ring *r) {
    /* every word of the table, not only those in use: slow path (close, recovery) */
    for (uint32_t k = 0; k < r->nwords; k++) {
        for (int which = LRT_WAIT_POP; which <= LRT_WAIT_PUSH; which++) {
            uint64_t m = atomic_exchange(&r->waits[k].m[which], 0);
            while (m) {
                int b = __builtin_ctzll(m);
                m &= m - 1;
                lrt_agent *a = &r->agents[(k << 6) + (uint32_t)b];
                _Atomic uint32_t *w = which == LRT_WAIT_POP ? &a->pop_word : &a->push_word;
                atomic_fetch_add(w, 1);
                futex_wake(r, w, INT_MAX);
            }
        }
    }
}

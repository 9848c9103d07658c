#include "lrt_test.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lrt/shm.h"

static char g_prefix[64];

static void test_create_attach_unlink(void) {
    char name[128];
    snprintf(name, sizeof name, "%s%d.a", g_prefix, (int)getpid());
    lrt_shm owner, other;
    CHECK_EQ(lrt_shm_create(name, 10000, &owner), LRT_OK);
    CHECK_EQ(lrt_shm_create(name, 10000, &other), LRT_EEXIST);
    CHECK_EQ((uintptr_t)owner.data % 4096, 0);
    memset(owner.data, 0xab, 10000);
    CHECK_EQ(lrt_shm_attach(name, &other), LRT_OK);
    CHECK_EQ(other.data_bytes, 10000);
    CHECK_EQ(((unsigned char *)other.data)[9999], 0xab);
    lrt_shm_close(&other); /* not the owner: the segment stays */
    CHECK_EQ(lrt_shm_attach(name, &other), LRT_OK);
    lrt_shm_close(&other);
    lrt_shm_close(&owner); /* owner: unlinks */
    CHECK_EQ(lrt_shm_attach(name, &other), LRT_ENOENT);
    CHECK_EQ(lrt_shm_create("bad/name", 10, &other), LRT_EINVAL);
}

static void test_stale_segment_cleaned(void) {
    char name[128];
    pid_t pid = fork();
    if (pid == 0) {
        lrt_shm s;
        snprintf(name, sizeof name, "%s%d.crash", g_prefix, (int)getpid());
        if (lrt_shm_create(name, 4096, &s) != LRT_OK) _exit(3);
        raise(SIGKILL); /* a crashed owner: never unlinks */
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st));
    snprintf(name, sizeof name, "%s%d.crash", g_prefix, (int)pid);
    lrt_shm live, probe;
    char live_name[128];
    snprintf(live_name, sizeof live_name, "%s%d.live", g_prefix, (int)getpid());
    CHECK_EQ(lrt_shm_create(live_name, 4096, &live), LRT_OK);
    CHECK_EQ(lrt_shm_attach(name, &probe), LRT_OK); /* the stale one is still there */
    lrt_shm_close(&probe);
    char removed[4][LRT_SHM_NAME_MAX + 1];
    CHECK_EQ(lrt_shm_clean_stale(g_prefix, &removed[0][0], 4), 1);
    CHECK(strcmp(removed[0], name) == 0);
    CHECK_EQ(lrt_shm_attach(name, &probe), LRT_ENOENT);
    CHECK_EQ(lrt_shm_attach(live_name, &probe), LRT_OK); /* a live owner's segment stays */
    lrt_shm_close(&probe);
    lrt_shm_close(&live);
}

static void test_process_alive(void) {
    CHECK(lrt_process_alive((int32_t)getpid(), lrt_process_starttime((int32_t)getpid())));
    CHECK(!lrt_process_alive((int32_t)getpid(), lrt_process_starttime((int32_t)getpid()) + 1));
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    usleep(100000);
    CHECK(!lrt_process_alive(pid, 0)); /* a zombie is dead */
    waitpid(pid, NULL, 0);
    CHECK(!lrt_process_alive(pid, 0));
}

int main(void) {
    snprintf(g_prefix, sizeof g_prefix, "lrtctest.%d.", (int)getpid());
    RUN(test_create_attach_unlink);
    RUN(test_stale_segment_cleaned);
    RUN(test_process_alive);
    return 0;
}

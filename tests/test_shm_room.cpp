/*
 * test_shm_room.cpp — a /dev/shm too small for the host's ranks (docker's default 64 MB with many ranks, say):
 * without ZCCL_TRANSPORT the ranks of the host fall back to TCP and the collectives are still right; with
 * ZCCL_TRANSPORT=shm communicator creation fails with ZCCL_SYSTEM_ERROR naming the bytes needed and free.
 *
 * The test makes a private mount namespace (unshare) with a 1 MiB tmpfs on /dev/shm, so it needs CAP_SYS_ADMIN
 * (root, as in CI); elsewhere it is skipped with the reason. Everything runs in forked processes with a deadline.
 */
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "zccl.h"

namespace {

constexpr int kSkip = 77;

/* In a fresh mount namespace with a 1 MiB /dev/shm: nranks ranks all-reduce; returns 0 if every check holds. */
int run_in_small_shm(int nranks, const char *transport, bool expect_init_ok) {
    if (unshare(CLONE_NEWNS) != 0) return kSkip;
    if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return kSkip;
    if (mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") != 0) return kSkip;
    if (transport) setenv("ZCCL_TRANSPORT", transport, 1);
    else unsetenv("ZCCL_TRANSPORT");
    zccl_unique_id_t id;
    if (zccl_get_unique_id(&id) != ZCCL_SUCCESS) return 10;
    for (int r = 0; r < nranks; r++) {
        if (fork() != 0) continue;
        zccl_comm_t comm;
        zccl_result_t res = zccl_comm_init_rank(&comm, nranks, id, r);
        if (!expect_init_ok) {
            const char *msg = zccl_get_last_error(nullptr);
            bool named = res == ZCCL_SYSTEM_ERROR && strstr(msg, "/dev/shm") && strstr(msg, "need");
            if (!named) fprintf(stderr, "[rank %d] expected ZCCL_SYSTEM_ERROR naming /dev/shm sizes, got %d: %s\n", r,
                                res, msg);
            _exit(named ? 0 : 1);
        }
        if (res != ZCCL_SUCCESS) {
            fprintf(stderr, "[rank %d] init failed: %s\n", r, zccl_get_last_error(nullptr));
            _exit(2);
        }
        float v[1000];
        for (int i = 0; i < 1000; i++) v[i] = (float)(i + r);
        res = zccl_allreduce(v, v, 1000, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
        int bad = res != ZCCL_SUCCESS;
        for (int i = 0; i < 1000 && !bad; i++) bad = v[i] != (float)(nranks * i + nranks * (nranks - 1) / 2);
        zccl_comm_destroy(comm);
        _exit(bad ? 3 : 0);
    }
    int worst = 0, st;
    while (wait(&st) > 0) {
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
        if (code > worst) worst = code;
    }
    return worst;
}

/* Runs fn in a child with a deadline; returns its exit code (or -1 on deadline). */
template <class F> int in_child(F fn, double deadline_s) {
    pid_t pid = fork();
    if (pid == 0) _exit(fn());
    auto t0 = std::chrono::steady_clock::now();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > deadline_s) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

TEST(ShmRoom, TooSmallFallsBackToTcp) {
    int rc = in_child([] { return run_in_small_shm(3, nullptr, true); }, 60);
    if (rc == kSkip) GTEST_SKIP() << "cannot make a private mount namespace with a small /dev/shm (needs root)";
    EXPECT_EQ(rc, 0) << "ranks on a 1 MiB /dev/shm: exit code " << rc << " (-1: deadline)";
}

TEST(ShmRoom, TooSmallWithForcedShmNamesTheSizes) {
    int rc = in_child([] { return run_in_small_shm(2, "shm", false); }, 60);
    if (rc == kSkip) GTEST_SKIP() << "cannot make a private mount namespace with a small /dev/shm (needs root)";
    EXPECT_EQ(rc, 0) << "forced shm on a 1 MiB /dev/shm: exit code " << rc << " (-1: deadline)";
}

}  // namespace

/*
 * test_init_faults.cpp — communicator creation fails at once, naming the cause, when it cannot complete (issue 17,
 * docs/faults.md "Deadlines"). Before, each of these waited for ZCCL_INIT_TIMEOUT_MS (120 s by default) in silence.
 *
 *   InitFaults.RankDyingAfterJoiningIsNamedAtOnce   3 ranks, ZCCL_INIT_TIMEOUT_MS=60000: rank 2 joins the bootstrap
 *       root and is killed while rank 1 has not joined yet. Rank 0's init must fail within 2 s of the kill with
 *       ZCCL_REMOTE_ERROR naming rank 2.
 *   InitFaults.LauncherReportsEarlyDeath   rank 2 dies before it reaches the root; the launcher's status file
 *       (ZCCL_LAUNCH_STATUS_FD, written by zcclrun) reports it: ranks 0 and 1 fail within 2 s naming rank 2.
 *   InitFaults.ZcclrunWritesTheStatusFile   zcclrun -n 2 where rank 1 exits with status 3: rank 0 (which ignores
 *       zcclrun's SIGTERM) reads "rank 1 (pid ...) exited with status 3" from its ZCCL_LAUNCH_STATUS_FD.
 *   InitFaults.WorldSizeMismatchFailsAtOnce   rank 1 passes nranks 2, ranks 0 and 2 pass 3: rank 1 is refused at
 *       once, naming the different nranks (the others go on waiting for a rank 1 with the right size, as
 *       Security.NranksMismatchIsRefused requires; the root's WARN names rank 1 as missing every 10 s).
 * Children never use GoogleTest assertions: they record what they saw in shared memory. Every group has a deadline.
 */
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Seen {
    int result[3];
    double t_return[3]; /* when init returned (parent's clock: steady_clock is system-wide) */
    char msg[3][512];
};

/* Creates an id whose root (in this process) reads the long init deadline the ranks use. */
zccl_unique_id_t make_id() {
    zccl_unique_id_t id;
    setenv("ZCCL_INIT_TIMEOUT_MS", "60000", 1);
    zccl_result_t r = zccl_get_unique_id(&id);
    unsetenv("ZCCL_INIT_TIMEOUT_MS");
    EXPECT_EQ(r, ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    return id;
}

int init_and_record(Seen *sh, int rank, int n, const zccl_unique_id_t &id) {
    zccl_comm_t comm = nullptr;
    zccl_result_t res = zccl_comm_init_rank(&comm, n, id, rank);
    sh->t_return[rank] = now_s();
    sh->result[rank] = (int)res;
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", res == ZCCL_SUCCESS ? "" : zccl_get_last_error(nullptr));
    if (res == ZCCL_SUCCESS) zccl_comm_abort(comm);
    return 0;
}

TEST(InitFaults, RankDyingAfterJoiningIsNamedAtOnce) {
    SharedMem mem(sizeof(Seen));
    Seen *sh = new (mem.data()) Seen();
    const zccl_unique_id_t id = make_id();
    Options o;
    o.deadline_s = 20;
    o.init_comm = false;
    o.id = id;
    o.expect_success = false;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("60000")}};
    std::unique_ptr<ProcessGroup> g = start_ranks(
        3,
        [sh, id](zccl_comm_t, int rank, int n) -> int {
            if (rank == 1) { /* joins much later: init cannot complete before rank 2 dies */
                sleep(6);
                return 0;
            }
            if (rank == 2) { /* joins the root, then the parent kills it */
                std::thread([&] { zccl_comm_t c; zccl_comm_init_rank(&c, n, id, rank); }).detach();
                sleep(30);
                return 9;
            }
            return init_and_record(sh, rank, n, id);
        },
        o);
    usleep(700 * 1000); /* rank 2 has joined the root by now */
    const double t_kill = now_s();
    g->kill(2, SIGKILL);
    ASSERT_TRUE(g->wait_one(0, 10.0)) << "rank 0's init still waits 10 s after rank 2 was killed";
    g->kill(1, SIGKILL);
    GroupResult res = g->wait_all();
    const double took = sh->t_return[0] - t_kill;
    printf("[   INFO   ] rank 0: init returned %s %.3f s after the kill: %s\n",
           zccl_get_error_string((zccl_result_t)sh->result[0]), took, sh->msg[0]);
    EXPECT_EQ(sh->result[0], ZCCL_REMOTE_ERROR) << sh->msg[0];
    EXPECT_LT(took, 2.0);
    EXPECT_NE(std::string(sh->msg[0]).find("rank 2"), std::string::npos) << sh->msg[0];
}

TEST(InitFaults, LauncherReportsEarlyDeath) {
    SharedMem mem(sizeof(Seen));
    Seen *sh = new (mem.data()) Seen();
    const zccl_unique_id_t id = make_id();
    int fd = memfd_create("zccl-test-status", 0);
    ASSERT_GE(fd, 0);
    Options o;
    o.deadline_s = 20;
    o.init_comm = false;
    o.id = id;
    o.expect_success = false;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("60000")}, {"ZCCL_LAUNCH_STATUS_FD", std::to_string(fd)}};
    std::unique_ptr<ProcessGroup> g = start_ranks(
        3,
        [sh, id](zccl_comm_t, int rank, int n) -> int {
            if (rank == 2) return 3; /* dies before it reaches the bootstrap root */
            return init_and_record(sh, rank, n, id);
        },
        o);
    ASSERT_TRUE(g->wait_one(2, 5.0));
    usleep(300 * 1000);
    /* What zcclrun writes when it reaps a rank that failed (tools/launch.c). */
    const std::string line = "rank 2 (pid " + std::to_string(g->pid(2)) + ") exited with status 3\n";
    const double t_report = now_s();
    ASSERT_EQ(pwrite(fd, line.data(), line.size(), 0), (ssize_t)line.size());
    GroupResult res = g->wait_all();
    close(fd);
    ASSERT_FALSE(res.deadline_exceeded) << res.report();
    for (int r = 0; r < 2; r++) {
        const double took = sh->t_return[r] - t_report;
        printf("[   INFO   ] rank %d: init returned %s %.3f s after the launcher's report: %s\n", r,
               zccl_get_error_string((zccl_result_t)sh->result[r]), took, sh->msg[r]);
        EXPECT_EQ(sh->result[r], ZCCL_REMOTE_ERROR) << sh->msg[r];
        EXPECT_LT(took, 2.0);
        EXPECT_NE(std::string(sh->msg[r]).find("rank 2 (pid"), std::string::npos) << sh->msg[r];
    }
}

TEST(InitFaults, ZcclrunWritesTheStatusFile) {
    const std::string cmd = std::string("timeout 20 ") + ZCCL_TOOLS_DIR +
                            "/zcclrun -n 2 sh -c 'trap \"\" TERM; if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 1; "
                            "cat /proc/self/fd/$ZCCL_LAUNCH_STATUS_FD' 2>/dev/null";
    FILE *p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[512] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    pclose(p);
    EXPECT_NE(std::string(buf).find("rank 1 (pid "), std::string::npos) << "rank 0 read: '" << buf << "'";
    EXPECT_NE(std::string(buf).find("exited with status 3"), std::string::npos) << "rank 0 read: '" << buf << "'";
}

TEST(InitFaults, WorldSizeMismatchFailsAtOnce) {
    SharedMem mem(sizeof(Seen));
    Seen *sh = new (mem.data()) Seen();
    const zccl_unique_id_t id = make_id();
    Options o;
    o.deadline_s = 20;
    o.init_comm = false;
    o.id = id;
    o.expect_success = false;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("60000")}};
    const double t0 = now_s();
    std::unique_ptr<ProcessGroup> g = start_ranks(
        3,
        [sh, id](zccl_comm_t, int rank, int n) -> int {
            if (rank == 1) usleep(300 * 1000); /* the others have joined with nranks 3 */
            return init_and_record(sh, rank, rank == 1 ? 2 : n, id);
        },
        o);
    ASSERT_TRUE(g->wait_one(1, 5.0)) << "rank 1 (nranks 2) was not refused within 5 s";
    g->kill(0, SIGKILL);
    g->kill(2, SIGKILL);
    g->wait_all();
    printf("[   INFO   ] rank 1: init returned %s after %.3f s: %s\n", zccl_get_error_string((zccl_result_t)sh->result[1]),
           sh->t_return[1] - t0, sh->msg[1]);
    EXPECT_EQ(sh->result[1], ZCCL_REMOTE_ERROR) << sh->msg[1];
    EXPECT_LT(sh->t_return[1] - t0, 2.5);
    EXPECT_NE(std::string(sh->msg[1]).find("nranks"), std::string::npos) << sh->msg[1];
}

}  // namespace

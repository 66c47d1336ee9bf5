/*
 * test_faults.cpp — regression tests for what zccl promises when a peer is lost (include/zccl.h, docs/architecture.md
 * "The progress engine", docs/configuration.md ZCCL_TIMEOUT_MS / ZCCL_INIT_TIMEOUT_MS).
 *
 * Covered:
 *   Faults.KilledRankMidCollectiveShm / Faults.KilledRankMidCollectiveTcp / Faults.KilledRankMidCollectiveTcpLanes
 *       4 ranks (ZCCL_TRANSPORT=shm, then tcp, then tcp striped over 2 lanes per pair, no ZCCL_TIMEOUT_MS) loop over 8 MiB float32 all-reduces; once every
 *       rank has finished a few of them (shared counter), the parent SIGKILLs rank 2 while collectives run. Every
 *       survivor must return from its collective with ZCCL_REMOTE_ERROR (ZCCL_TIMEOUT cannot fire: no deadline is
 *       set), with a zccl_get_last_error() text naming a rank other than itself (the lost rank 2, or a ring
 *       neighbour that failed and exited in turn); at least one survivor (the ring neighbours of rank 2) must name
 *       rank 2. Detection latency (kill -> return of the failing call, CLOCK_MONOTONIC in shared memory) must be at
 *       most 2 s on every survivor. No survivor may hang (group deadline) or die of a signal. Latencies and
 *       messages are printed as [   INFO   ] lines.
 *   Faults.LaterCallsFailFast
 *       Same scenario (shm): after the failure, the next zccl_allreduce on the same communicator must fail at once
 *       (< 100 ms) with an error instead of waiting again.
 *   Faults.KilledBeforeInit
 *       3 ranks, ZCCL_INIT_TIMEOUT_MS=3000; rank 2 is SIGKILLed before it calls zccl_comm_init_rank. Ranks 0 and 1
 *       must fail their init with ZCCL_TIMEOUT or ZCCL_REMOTE_ERROR within 5 s, not hang, naming rank 2 as missing.
 *   Faults.TimeoutNamesPeer
 *       2 ranks (shm, then tcp), ZCCL_TIMEOUT_MS=500; rank 1 stays alive but never calls the collective. Rank 0's
 *       allreduce must return ZCCL_TIMEOUT within 0.4..2 s with a message naming rank 1.
 *
 * Children never use GoogleTest assertions: they record what they saw in shared memory and return an exit code;
 * the parent asserts. Every group has a deadline. Total runtime: a few seconds per test (well under 30 s in all on
 * an idle 2-core machine).
 */
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

constexpr int kMsg = 512;

void copy_msg(char *dst, const char *src) {
    snprintf(dst, kMsg, "%s", src ? src : "(null)");
}

/* Ranks named in a message ("rank 3 (pid ...) has exited; rank 0 cannot ..." -> {3, 0}). */
std::set<int> ranks_named(const std::string &msg) {
    std::set<int> out;
    static const std::regex re("rank ([0-9]+)");
    for (auto it = std::sregex_iterator(msg.begin(), msg.end(), re); it != std::sregex_iterator(); ++it)
        out.insert(std::stoi((*it)[1].str()));
    return out;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Rank killed mid-collective                                                                                    */
/* ------------------------------------------------------------------------------------------------------------ */

constexpr int kKillRanks = 4;
constexpr int kVictim = 2;
constexpr int kItersBeforeKill = 3;
constexpr size_t kCount = (8u << 20) / sizeof(float); /* 8 MiB of float32 */

struct KillShared {
    std::atomic<int> iters[kKillRanks];      /* successful all-reduces per rank */
    std::atomic<int> failed[kKillRanks];     /* 1 once the rank saw its collective fail */
    double t_kill;                           /* parent: just before kill(SIGKILL) */
    double t_return[kKillRanks];             /* survivor: when the failing call returned */
    int result[kKillRanks];
    int failed_iter[kKillRanks];
    char msg[kKillRanks][kMsg];
    double second_s[kKillRanks];             /* duration of the next allreduce after the failure */
    int second_result[kKillRanks];
    char second_msg[kKillRanks][kMsg];
};

struct KillOutcome {
    GroupResult group;
    bool killed = false;
    KillShared data;
};

/* Runs the scenario; the shared data is copied out for the assertions. */
void run_kill_scenario(const char *transport, KillOutcome *out) {
    SharedMem mem(sizeof(KillShared));
    KillShared *sh = new (mem.data()) KillShared();
    for (int r = 0; r < kKillRanks; r++) {
        sh->iters[r].store(0);
        sh->failed[r].store(0);
        sh->result[r] = -1;
        sh->second_result[r] = -1;
        sh->failed_iter[r] = -1;
    }
    Options o;
    o.deadline_s = 20;
    o.env = {{"ZCCL_TRANSPORT", std::string(transport)}, {"ZCCL_TIMEOUT_MS", std::nullopt}};
    if (std::string(transport) == "tcp-lanes") /* TCP striped over 2 lanes per direction (transport/rail.h), on lo */
        o.env = {{"ZCCL_TRANSPORT", std::string("tcp")}, {"ZCCL_TIMEOUT_MS", std::nullopt},
                 {"ZCCL_SOCKET_IFNAME", std::string("=lo")}, {"ZCCL_NSOCKS_PERTHREAD", std::string("2")}};
    std::unique_ptr<ProcessGroup> g = start_ranks(
        kKillRanks,
        [sh](zccl_comm_t comm, int rank, int) -> int {
            std::vector<float> in(kCount, 1.0f), out(kCount, 0.0f);
            for (int it = 0; it < 100000; it++) {
                zccl_result_t res = zccl_allreduce(in.data(), out.data(), kCount, ZCCL_FLOAT32, ZCCL_SUM, comm,
                                                   nullptr);
                if (res == ZCCL_SUCCESS) {
                    if (out[0] != (float)kKillRanks || out[kCount - 1] != (float)kKillRanks) {
                        child_log(rank, "wrong all-reduce result at iteration %d: %g", it, (double)out[0]);
                        return 2;
                    }
                    sh->iters[rank].fetch_add(1);
                    continue;
                }
                sh->t_return[rank] = now_s();
                sh->result[rank] = (int)res;
                sh->failed_iter[rank] = it;
                copy_msg(sh->msg[rank], zccl_get_last_error(comm));
                child_log(rank, "allreduce #%d failed: %s: %s", it, zccl_get_error_string(res), sh->msg[rank]);
                /* The next call on the broken communicator must fail at once. */
                double t0 = now_s();
                zccl_result_t res2 = zccl_allreduce(in.data(), out.data(), kCount, ZCCL_FLOAT32, ZCCL_SUM, comm,
                                                    nullptr);
                sh->second_s[rank] = now_s() - t0;
                sh->second_result[rank] = (int)res2;
                copy_msg(sh->second_msg[rank], res2 == ZCCL_SUCCESS ? "" : zccl_get_last_error(comm));
                sh->failed[rank].store(1);
                return 0; /* the parent judges what was recorded */
            }
            child_log(rank, "no all-reduce failed in 100000 iterations");
            return 3;
        },
        o);
    /* Kill rank 2 once every rank has completed a few all-reduces (they keep looping, so it dies mid-call). */
    bool ready = false;
    const double until = now_s() + 15;
    while (!ready && now_s() < until) {
        ready = true;
        for (int r = 0; r < kKillRanks; r++) ready = ready && sh->iters[r].load() >= kItersBeforeKill;
        bool any_gone = false;
        for (int r = 0; r < kKillRanks && (size_t)r < g->size(); r++) any_gone = any_gone || !g->running(r);
        if (any_gone || g->size() < (size_t)kKillRanks) break;
        if (!ready) usleep(1000);
    }
    if (ready) {
        sh->t_kill = now_s();
        g->kill(kVictim, SIGKILL);
        out->killed = true;
    }
    out->group = g->wait_all();
    out->data.t_kill = sh->t_kill;
    for (int r = 0; r < kKillRanks; r++) {
        out->data.iters[r].store(sh->iters[r].load());
        out->data.failed[r].store(sh->failed[r].load());
        out->data.t_return[r] = sh->t_return[r];
        out->data.result[r] = sh->result[r];
        out->data.failed_iter[r] = sh->failed_iter[r];
        memcpy(out->data.msg[r], sh->msg[r], kMsg);
        out->data.second_s[r] = sh->second_s[r];
        out->data.second_result[r] = sh->second_result[r];
        memcpy(out->data.second_msg[r], sh->second_msg[r], kMsg);
    }
    sh->~KillShared();
}

/* Common checks on the group: the victim died of SIGKILL, survivors exited 0 (no hang, no crash). */
void check_group(const KillOutcome &k) {
    ASSERT_TRUE(k.group.setup_error.empty()) << k.group.report();
    ASSERT_TRUE(k.killed) << "the ranks did not all reach " << kItersBeforeKill
                          << " all-reduces before the kill:\n" << k.group.report();
    EXPECT_FALSE(k.group.deadline_exceeded) << "a survivor hung after rank 2 was killed:\n" << k.group.report();
    ASSERT_EQ(k.group.procs.size(), (size_t)kKillRanks);
    EXPECT_EQ(k.group.procs[kVictim].term_signal, SIGKILL) << k.group.procs[kVictim].describe();
    for (int r = 0; r < kKillRanks; r++) {
        if (r == kVictim) continue;
        const ProcStatus &p = k.group.procs[r];
        EXPECT_TRUE(p.ok()) << p.name << ": " << p.describe() << "\n" << k.group.report();
    }
}

void check_detection(const char *transport) {
    KillOutcome k;
    run_kill_scenario(transport, &k);
    check_group(k);
    if (::testing::Test::HasFatalFailure()) return;
    int name_victim = 0;
    for (int r = 0; r < kKillRanks; r++) {
        if (r == kVictim) continue;
        const KillShared &d = k.data;
        ASSERT_EQ(d.failed[r].load(), 1) << "rank " << r << " never saw its collective fail";
        const std::string msg = d.msg[r];
        const double lat = d.t_return[r] - d.t_kill;
        printf("[   INFO   ] %s: rank %d failed after %d all-reduces, %.1f ms after the kill: %s: %s\n", transport, r,
               d.failed_iter[r], lat * 1e3, zccl_get_error_string((zccl_result_t)d.result[r]), msg.c_str());
        EXPECT_EQ(d.result[r], (int)ZCCL_REMOTE_ERROR)
            << "rank " << r << " returned " << zccl_get_error_string((zccl_result_t)d.result[r])
            << " (ZCCL_TIMEOUT_MS is not set, so only ZCCL_REMOTE_ERROR fits): " << msg;
        EXPECT_LE(lat, 2.0) << "rank " << r << " took " << lat << " s to detect the loss of rank 2";
        EXPECT_GE(lat, -0.5) << "rank " << r << " failed long before rank 2 was killed: " << msg;
        std::set<int> named = ranks_named(msg);
        named.erase(r);
        EXPECT_FALSE(named.empty()) << "rank " << r << "'s error message names no peer rank: \"" << msg << "\"";
        if (named.count(kVictim)) name_victim++;
    }
    EXPECT_GE(name_victim, 1) << "no survivor's message names the killed rank 2";
}

TEST(Faults, KilledRankMidCollectiveShm) { check_detection("shm"); }

TEST(Faults, KilledRankMidCollectiveTcp) { check_detection("tcp"); }
/* The same over striped TCP lanes: a peer's death is not taken for a dead rail (no wait for a lane to move). */
TEST(Faults, KilledRankMidCollectiveTcpLanes) { check_detection("tcp-lanes"); }

TEST(Faults, LaterCallsFailFast) {
    KillOutcome k;
    run_kill_scenario("shm", &k);
    check_group(k);
    if (::testing::Test::HasFatalFailure()) return;
    for (int r = 0; r < kKillRanks; r++) {
        if (r == kVictim) continue;
        const KillShared &d = k.data;
        ASSERT_EQ(d.failed[r].load(), 1) << "rank " << r << " never saw its collective fail";
        printf("[   INFO   ] rank %d: next allreduce after the failure returned %s in %.3f ms: %s\n", r,
               zccl_get_error_string((zccl_result_t)d.second_result[r]), d.second_s[r] * 1e3, d.second_msg[r]);
        EXPECT_NE(d.second_result[r], (int)ZCCL_SUCCESS) << "rank " << r << ": allreduce on a broken communicator "
                                                            "succeeded";
        EXPECT_LT(d.second_s[r], 0.1) << "rank " << r << ": the allreduce after the failure waited "
                                      << d.second_s[r] << " s instead of failing at once: " << d.second_msg[r];
        EXPECT_NE(std::string(d.second_msg[r]), "") << "rank " << r << ": no error message";
    }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Rank killed before zccl_comm_init_rank                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

struct InitShared {
    int result[3];
    double elapsed_s[3];
    char msg[3][kMsg];
};

TEST(Faults, KilledBeforeInit) {
    SharedMem mem(sizeof(InitShared));
    InitShared *sh = new (mem.data()) InitShared();
    for (int r = 0; r < 3; r++) sh->result[r] = -1;
    zccl_unique_id_t id;
    /* The bootstrap root runs in this process: it reads the same init deadline as the ranks. */
    setenv("ZCCL_INIT_TIMEOUT_MS", "3000", 1);
    zccl_result_t idres = zccl_get_unique_id(&id);
    unsetenv("ZCCL_INIT_TIMEOUT_MS");
    ASSERT_EQ(idres, ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    Options o;
    o.deadline_s = 15;
    o.init_comm = false;
    o.id = id;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("3000")}};
    std::unique_ptr<ProcessGroup> g = start_ranks(
        3,
        [sh, id](zccl_comm_t, int rank, int n) -> int {
            if (rank == 2) { /* killed by the parent before it joins */
                sleep(30);
                return 9;
            }
            double t0 = now_s();
            zccl_comm_t comm = nullptr;
            zccl_result_t res = zccl_comm_init_rank(&comm, n, id, rank);
            sh->elapsed_s[rank] = now_s() - t0;
            sh->result[rank] = (int)res;
            copy_msg(sh->msg[rank], res == ZCCL_SUCCESS ? "" : zccl_get_last_error(nullptr));
            if (res == ZCCL_SUCCESS) {
                child_log(rank, "init succeeded without rank 2");
                zccl_comm_abort(comm);
                return 1;
            }
            return 0;
        },
        o);
    ASSERT_EQ(g->size(), 3u);
    usleep(200 * 1000);
    g->kill(2, SIGKILL);
    GroupResult res = g->wait_all();
    ASSERT_FALSE(res.deadline_exceeded) << "init hung after rank 2 was killed:\n" << res.report();
    EXPECT_EQ(res.procs[2].term_signal, SIGKILL) << res.procs[2].describe();
    for (int r = 0; r < 2; r++) {
        EXPECT_TRUE(res.procs[r].ok()) << res.report();
        printf("[   INFO   ] rank %d: init returned %s after %.3f s: %s\n", r,
               zccl_get_error_string((zccl_result_t)sh->result[r]), sh->elapsed_s[r], sh->msg[r]);
        EXPECT_TRUE(sh->result[r] == ZCCL_TIMEOUT || sh->result[r] == ZCCL_REMOTE_ERROR)
            << "rank " << r << ": init returned " << zccl_get_error_string((zccl_result_t)sh->result[r]) << ": "
            << sh->msg[r];
        EXPECT_LE(sh->elapsed_s[r], 5.0) << "rank " << r << ": init took " << sh->elapsed_s[r]
                                         << " s with ZCCL_INIT_TIMEOUT_MS=3000";
        EXPECT_NE(std::string(sh->msg[r]), "") << "rank " << r << ": no error message";
        /* The root gives up just before the ranks and tells them which rank never joined. */
        EXPECT_NE(std::string(sh->msg[r]).find("rank(s) 2"), std::string::npos)
            << "rank " << r << ": the message does not name the missing rank 2: " << sh->msg[r];
    }
    sh->~InitShared();
}

/* ------------------------------------------------------------------------------------------------------------ */
/* ZCCL_TIMEOUT_MS names the silent peer                                                                          */
/* ------------------------------------------------------------------------------------------------------------ */

struct TimeoutShared {
    std::atomic<int> done;
    int result;
    double elapsed_s;
    char msg[kMsg];
};

void check_timeout(const char *transport) {
    SharedMem mem(sizeof(TimeoutShared));
    TimeoutShared *sh = new (mem.data()) TimeoutShared();
    sh->done.store(0);
    sh->result = -1;
    Options o;
    o.deadline_s = 15;
    o.env = {{"ZCCL_TRANSPORT", std::string(transport)}, {"ZCCL_TIMEOUT_MS", std::string("500")}};
    GroupResult res = run_ranks(
        2,
        [sh](zccl_comm_t comm, int rank, int) -> int {
            if (rank == 1) { /* alive, but never calls the collective */
                const double until = now_s() + 8;
                while (!sh->done.load() && now_s() < until) usleep(1000);
                return 0;
            }
            std::vector<float> in(1024, 1.0f), out(1024, 0.0f);
            double t0 = now_s();
            zccl_result_t r = zccl_allreduce(in.data(), out.data(), in.size(), ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
            sh->elapsed_s = now_s() - t0;
            sh->result = (int)r;
            copy_msg(sh->msg, r == ZCCL_SUCCESS ? "" : zccl_get_last_error(comm));
            sh->done.store(1);
            return 0;
        },
        o);
    EXPECT_TRUE(res.all_ok()) << res.report();
    printf("[   INFO   ] %s: rank 0's allreduce returned %s after %.3f s: %s\n", transport,
           zccl_get_error_string((zccl_result_t)sh->result), sh->elapsed_s, sh->msg);
    EXPECT_EQ(sh->result, (int)ZCCL_TIMEOUT) << sh->msg;
    EXPECT_GE(sh->elapsed_s, 0.4) << "timed out before ZCCL_TIMEOUT_MS=500";
    EXPECT_LE(sh->elapsed_s, 2.0);
    EXPECT_TRUE(ranks_named(sh->msg).count(1)) << "the message does not name rank 1: " << sh->msg;
    sh->~TimeoutShared();
}

TEST(Faults, TimeoutNamesPeer) {
    check_timeout("shm");
    check_timeout("tcp");
}

/* ------------------------------------------------------------------------------------------------------------ */
/* A rank that gives up makes a peer waiting on it fail (the transport's poison op), while it stays alive          */
/* ------------------------------------------------------------------------------------------------------------ */

struct GiveUpShared {
    std::atomic<int> done;
    int result[2];
    double elapsed_s[2];
    char msg[2][kMsg];
};

/* Both ranks receive from each other (a deadlock of the caller's making). Rank 0 has ZCCL_TIMEOUT_MS=500 and gives
 * up; rank 1 has no deadline and must fail soon after with a remote error naming rank 0 — while rank 0 is still
 * alive (its exit would end rank 1's wait anyway). */
void check_give_up(const char *transport) {
    SharedMem mem(sizeof(GiveUpShared));
    GiveUpShared *sh = new (mem.data()) GiveUpShared();
    sh->done.store(0);
    sh->result[0] = sh->result[1] = -1;
    Options o;
    o.deadline_s = 20;
    o.env = {{"ZCCL_TRANSPORT", std::string(transport)}};
    o.rank_env = [](int r) { return EnvList{{"ZCCL_TIMEOUT_MS", std::string(r == 0 ? "500" : "0")}}; };
    GroupResult res = run_ranks(
        2,
        [sh](zccl_comm_t comm, int rank, int) -> int {
            std::vector<float> buf(4096, 0.0f);
            const double t0 = now_s();
            zccl_result_t r = zccl_recv(buf.data(), buf.size(), ZCCL_FLOAT32, 1 - rank, comm, nullptr);
            sh->elapsed_s[rank] = now_s() - t0;
            sh->result[rank] = (int)r;
            copy_msg(sh->msg[rank], r == ZCCL_SUCCESS ? "" : zccl_get_last_error(comm));
            if (rank == 1) sh->done.store(1);
            const double until = now_s() + 10; /* rank 0 stays alive until rank 1 is done */
            while (rank == 0 && !sh->done.load() && now_s() < until) usleep(1000);
            return 0;
        },
        o);
    EXPECT_TRUE(res.all_ok()) << res.report();
    for (int r = 0; r < 2; r++)
        printf("[   INFO   ] %s: rank %d's recv returned %s after %.3f s: %s\n", transport, r,
               zccl_get_error_string((zccl_result_t)sh->result[r]), sh->elapsed_s[r], sh->msg[r]);
    EXPECT_EQ(sh->result[0], (int)ZCCL_TIMEOUT) << sh->msg[0];
    EXPECT_EQ(sh->result[1], (int)ZCCL_REMOTE_ERROR) << sh->msg[1];
    EXPECT_TRUE(ranks_named(sh->msg[1]).count(0)) << "the message does not name rank 0: " << sh->msg[1];
    /* well before rank 0 would have given up waiting for rank 1 to finish (10 s) */
    EXPECT_LE(sh->elapsed_s[1], 5.0) << "rank 1 was not told that rank 0 gave up";
    sh->~GiveUpShared();
}

/* Rank 0 queues many all-reduces on a stream; rank 1 never calls, so the first one times out. The stream reports
 * that first error (not a later "broken" one), the operations behind it fail without running, and the next
 * operation on the broken communicator fails at once. */
TEST(Faults, StreamQueueBehindABrokenCommunicatorFailsAtOnce) {
    SharedMem mem(sizeof(std::atomic<int>));
    std::atomic<int> *done = new (mem.data()) std::atomic<int>(0);
    Options o;
    o.deadline_s = 30;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}};
    o.rank_env = [](int r) { return EnvList{{"ZCCL_TIMEOUT_MS", std::string(r == 0 ? "300" : "0")}}; };
    GroupResult res = run_ranks(
        2,
        [done](zccl_comm_t comm, int rank, int) -> int {
            if (rank == 1) { /* alive, never calls */
                const double until = now_s() + 20;
                while (!done->load() && now_s() < until) usleep(1000);
                return 0;
            }
            zccl_stream_t st = nullptr;
            ZT_OK(zccl_stream_create(&st));
            std::vector<float> in(64, 1.0f), out(64, 0.0f);
            const int queued = 20000;
            for (int i = 0; i < queued; i++)
                ZT_OK(zccl_allreduce(in.data(), out.data(), in.size(), ZCCL_FLOAT32, ZCCL_SUM, comm, st));
            zccl_result_t r = zccl_stream_synchronize(st);
            std::string msg = zccl_get_last_error(comm);
            ZT_CHECK(r == ZCCL_TIMEOUT, "synchronize returned %d: %s", (int)r, msg.c_str());
            ZT_CHECK(msg.find("no progress for 300 ms") != std::string::npos, "not the first error: %s",
                        msg.c_str());
            zccl_result_t ae = ZCCL_SUCCESS;
            ZT_OK(zccl_comm_get_async_error(comm, &ae));
            ZT_CHECK(ae == ZCCL_TIMEOUT, "async error %d", (int)ae);
            ZT_OK(zccl_stream_query(st)); /* the error was taken by synchronize */
            ZT_OK(zccl_allreduce(in.data(), out.data(), in.size(), ZCCL_FLOAT32, ZCCL_SUM, comm, st));
            r = zccl_stream_synchronize(st);
            msg = zccl_get_last_error(comm);
            ZT_CHECK(r == ZCCL_TIMEOUT && msg.find("broken by an earlier error") != std::string::npos,
                        "after the error: %d: %s", (int)r, msg.c_str());
            zccl_stream_destroy(st);
            done->store(1);
            return 0;
        },
        o);
    EXPECT_TRUE(res.all_ok()) << res.report();
}

TEST(Faults, RankThatGivesUpMakesItsPeerFailShm) { check_give_up("shm"); }

TEST(Faults, RankThatGivesUpMakesItsPeerFailTcp) { check_give_up("tcp"); }

}  // namespace

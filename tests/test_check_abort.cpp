/*
 * test_check_abort.cpp — ZCCL_CHECK mismatch detection, zccl_comm_abort from another thread, and
 * zccl_comm_get_async_error (include/zccl.h; docs/configuration.md ZCCL_CHECK).
 *
 *   CheckAbort.MismatchIsNamedOnEveryRank   3 ranks, ZCCL_CHECK=1: rank 2 passes a different count (then a different
 *       datatype, then calls broadcast where the others call all-reduce). Every rank must fail with
 *       ZCCL_INVALID_USAGE naming rank 2 and both calls, nobody may hang, and the communicator must work afterwards.
 *   CheckAbort.AbortFromAnotherThreadUnblocks   2 ranks: rank 0 blocks in an all-reduce that rank 1 never joins;
 *       another thread of rank 0 calls zccl_comm_abort after 300 ms: the blocked call must return
 *       ZCCL_REMOTE_ERROR within 1 s of the abort. Run on shm and tcp, blocking and on a stream.
 *   CheckAbort.AsyncErrorAfterPeerLoss   2 ranks: rank 1 exits; rank 0's collective fails and
 *       zccl_comm_get_async_error then reports ZCCL_REMOTE_ERROR (ZCCL_SUCCESS before); NULL arguments are rejected.
 * Children never use GoogleTest assertions; every group has a deadline.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

int fail(int rank, const std::string &what) {
    fprintf(stderr, "[rank %d] FAIL %s\n", rank, what.c_str());
    return 1;
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TEST(CheckAbort, MismatchIsNamedOnEveryRank) {
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_CHECK", std::string("1")}, {"ZCCL_TIMEOUT_MS", std::string("20000")}};
    run_ranks(3, [](zccl_comm_t comm, int rank, int) {
        std::vector<float> in(64, 1.0f), out(64);
        struct Case {
            const char *what;
            const char *must;  // text the error must contain
        } cases[] = {{"count", "count 32"}, {"datatype", "int32"}, {"collective", "zccl_broadcast"}};
        for (const Case &c : cases) {
            zccl_result_t r;
            if (rank != 2) r = zccl_allreduce(in.data(), out.data(), 64, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
            else if (!strcmp(c.what, "count"))
                r = zccl_allreduce(in.data(), out.data(), 32, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
            else if (!strcmp(c.what, "datatype"))
                r = zccl_allreduce(in.data(), out.data(), 64, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
            else
                r = zccl_broadcast(in.data(), out.data(), 64, ZCCL_FLOAT32, 0, comm, nullptr);
            const std::string msg = zccl_get_last_error(comm);
            if (r != ZCCL_INVALID_USAGE)
                return fail(rank, std::string("mismatched ") + c.what + ": expected ZCCL_INVALID_USAGE, got " +
                                      std::to_string(r) + ": " + msg);
            if (msg.find("rank 2") == std::string::npos || msg.find(c.must) == std::string::npos)
                return fail(rank, std::string("mismatch message does not name rank 2 and '") + c.must + "': " + msg);
        }
        // The communicator still works: a matching all-reduce gives the right sum.
        if (zccl_allreduce(in.data(), out.data(), 64, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS)
            return fail(rank, std::string("matching all-reduce after the mismatches failed: ") +
                                  zccl_get_last_error(comm));
        for (float v : out)
            if (v != 3.0f) return fail(rank, "wrong sum after the mismatches: " + std::to_string(v));
        return 0;
    }, o);
}

class AbortParam : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

/* The body creates (and rank 0 aborts) its own communicator, so the harness must not destroy it afterwards. */
TEST_P(AbortParam, AbortFromAnotherThreadUnblocks) {
    const std::string transport = std::get<0>(GetParam());
    const bool on_stream = std::get<1>(GetParam());
    SharedMem shm(sizeof(std::atomic<int>));
    auto *rank0_done = new (shm.data()) std::atomic<int>(0);
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    Options o;
    o.deadline_s = 30;
    o.env = {{"ZCCL_TRANSPORT", transport}};
    o.init_comm = false;
    run_ranks(2, [rank0_done, on_stream, id](zccl_comm_t, int rank, int nranks) -> int {
        zccl_comm_t comm;
        if (zccl_comm_init_rank(&comm, nranks, id, rank) != ZCCL_SUCCESS)
            return fail(rank, std::string("init: ") + zccl_get_last_error(nullptr));
        if (rank == 1) { /* never joins the collective; stays alive until rank 0 is done */
            while (rank0_done->load() == 0) usleep(10000);
            zccl_comm_abort(comm);
            return 0;
        }
        std::vector<float> buf(1 << 16, 1.0f);
        std::atomic<double> t_abort{0};
        std::thread aborter([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            t_abort = now_s();
            zccl_comm_abort(comm);
        });
        zccl_result_t r;
        zccl_stream_t st = nullptr;
        if (on_stream) {
            if (zccl_stream_create(&st) != ZCCL_SUCCESS) return fail(rank, "stream_create");
            zccl_allreduce(buf.data(), buf.data(), buf.size(), ZCCL_FLOAT32, ZCCL_SUM, comm, st);
            zccl_allreduce(buf.data(), buf.data(), buf.size(), ZCCL_FLOAT32, ZCCL_SUM, comm, st); /* stays queued */
            r = zccl_stream_synchronize(st);
        } else {
            r = zccl_allreduce(buf.data(), buf.data(), buf.size(), ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
        }
        const double t_ret = now_s();
        aborter.join();
        if (st) zccl_stream_destroy(st);
        rank0_done->store(1);
        if (r != ZCCL_REMOTE_ERROR)
            return fail(rank, "blocked all-reduce returned " + std::to_string(r) + " after abort, expected "
                              "ZCCL_REMOTE_ERROR: " + zccl_get_last_error(nullptr));
        if (t_ret - t_abort > 1.0)
            return fail(rank, "blocked call returned " + std::to_string(t_ret - t_abort) + " s after the abort");
        printf("[   INFO   ] returned %.0f ms after zccl_comm_abort\n", (t_ret - t_abort) * 1e3);
        return 0;
    }, o);
}

INSTANTIATE_TEST_SUITE_P(Transports, AbortParam,
                         ::testing::Combine(::testing::Values(std::string("shm"), std::string("tcp")),
                                            ::testing::Bool()));

TEST(CheckAbort, AsyncErrorAfterPeerLoss) {
    zccl_result_t dummy;
    EXPECT_EQ(zccl_comm_get_async_error(nullptr, &dummy), ZCCL_INVALID_ARGUMENT);
    Options o;
    o.deadline_s = 30;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}};
    o.init_comm = false;
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    run_ranks(2, [id](zccl_comm_t, int rank, int nranks) -> int {
        zccl_comm_t comm;
        if (zccl_comm_init_rank(&comm, nranks, id, rank) != ZCCL_SUCCESS) return fail(rank, "init");
        if (rank == 1) _exit(0); /* lost without a word */
        zccl_result_t e = ZCCL_INTERNAL_ERROR;
        if (zccl_comm_get_async_error(comm, nullptr) != ZCCL_INVALID_ARGUMENT) return fail(rank, "NULL accepted");
        if (zccl_comm_get_async_error(comm, &e) != ZCCL_SUCCESS || e != ZCCL_SUCCESS)
            return fail(rank, "async error before any failure: " + std::to_string(e));
        float x = 1;
        zccl_result_t r = zccl_allreduce(&x, &x, 1, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
        if (r != ZCCL_REMOTE_ERROR) return fail(rank, "all-reduce with a lost peer returned " + std::to_string(r));
        if (zccl_comm_get_async_error(comm, &e) != ZCCL_SUCCESS || e != ZCCL_REMOTE_ERROR)
            return fail(rank, "async error after the loss: " + std::to_string(e));
        zccl_comm_abort(comm);
        return 0;
    }, o);
}

}  // namespace

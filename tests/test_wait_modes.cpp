/*
 * test_wait_modes.cpp — how a waiting rank waits (ZCCL_WAIT_YIELD: 0 sleeps on its futex, 1 yields its core between
 * looks, ranks may differ) never changes a result: collectives of every size band and a rank that joins late give
 * the sums and blocks computed here, over shared memory and over TCP, with every rank waiting at once
 * (ZCCL_SPIN_US=0) so that each call goes through the wait.
 */
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

struct Case {
    const char *name, *transport, *mode; /* mode: "0", "1" or "mixed" (even ranks yield, odd ranks sleep) */
};
/* gtest prints the parameter in test names and failures: the case's name instead of its bytes. */
[[maybe_unused]] static void PrintTo(const Case &c, std::ostream *os) { *os << c.name; }

class WaitModes : public ::testing::TestWithParam<Case> {};

/* Element i of rank r's input: exact in float32 (small integers), distinct per rank and position. */
static float value(int r, size_t i) { return (float)((r + 1) * 3 + (int)(i % 97)); }

static int check_round(zccl_comm_t comm, int rank, int n, size_t count) {
    std::vector<float> in(count), out(count * n), want(count * n);
    for (size_t i = 0; i < count; i++) in[i] = value(rank, i);
    /* all-reduce */
    if (zccl_allreduce(in.data(), out.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS) {
        fprintf(stderr, "[rank %d] FAIL: allreduce of %zu: %s\n", rank, count, zccl_get_last_error(comm));
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += value(r, i);
        if (out[i] != s) {
            fprintf(stderr, "[rank %d] FAIL: allreduce of %zu: element %zu is %g, want %g\n", rank, count, i,
                    (double)out[i], (double)s);
            return 1;
        }
    }
    /* all-gather: block r is rank r's input */
    if (zccl_allgather(in.data(), out.data(), count, ZCCL_FLOAT32, comm, nullptr) != ZCCL_SUCCESS) {
        fprintf(stderr, "[rank %d] FAIL: allgather of %zu: %s\n", rank, count, zccl_get_last_error(comm));
        return 1;
    }
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            if (out[(size_t)r * count + i] != value(r, i)) {
                fprintf(stderr, "[rank %d] FAIL: allgather of %zu: block %d element %zu is %g, want %g\n", rank,
                        count, r, i, (double)out[(size_t)r * count + i], (double)value(r, i));
                return 1;
            }
    /* reduce-scatter: rank r keeps block r of the sum of every rank's n blocks */
    std::vector<float> big(count * n), mine(count);
    for (size_t i = 0; i < big.size(); i++) big[i] = value(rank, i);
    if (zccl_reduce_scatter(big.data(), mine.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS) {
        fprintf(stderr, "[rank %d] FAIL: reduce_scatter of %zu: %s\n", rank, count, zccl_get_last_error(comm));
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += value(r, (size_t)rank * count + i);
        if (mine[i] != s) {
            fprintf(stderr, "[rank %d] FAIL: reduce_scatter of %zu: element %zu is %g, want %g\n", rank, count, i,
                    (double)mine[i], (double)s);
            return 1;
        }
    }
    return 0;
}

TEST_P(WaitModes, ResultsAndALateRankDoNotDependOnHowRanksWait) {
    const Case c = GetParam();
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", c.transport}, {"ZCCL_SPIN_US", "0"}};
    const std::string mode = c.mode;
    o.rank_env = [mode](int r) {
        return EnvList{{"ZCCL_WAIT_YIELD", mode == "mixed" ? (r % 2 == 0 ? "1" : "0") : mode}};
    };
    run_ranks(4, [](zccl_comm_t comm, int rank, int n) -> int {
        /* sizes across the bands: slots, staged one-pass, single copy */
        for (size_t count : {1ul, 250ul, 16384ul, 100000ul})
            if (check_round(comm, rank, n, count)) return 1;
        /* rank 3 arrives 300 ms late: the others wait for it through several 50 ms wait rounds */
        if (rank == 3) usleep(300000);
        int32_t x = rank + 1, y = 0;
        if (zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS || y != n * (n + 1) / 2) {
            fprintf(stderr, "[rank %d] FAIL: late allreduce gave %d, want %d: %s\n", rank, y, n * (n + 1) / 2,
                    zccl_get_last_error(comm));
            return 1;
        }
        return 0;
    }, o);
}

INSTANTIATE_TEST_SUITE_P(Modes, WaitModes,
                         ::testing::Values(Case{"shm_futex", "shm", "0"}, Case{"shm_yield", "shm", "1"},
                                           Case{"shm_mixed", "shm", "mixed"}, Case{"tcp_yield", "tcp", "1"},
                                           Case{"tcp_mixed", "tcp", "mixed"}),
                         [](const ::testing::TestParamInfo<Case> &i) { return std::string(i.param.name); });

}  // namespace

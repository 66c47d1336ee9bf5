/*
 * test_invalid_calls.cpp — what every rank sees when one rank's call is invalid or differs from the others'
 * (include/zccl.h "Invalid calls", docs/faults.md "Ranks whose calls differ"). Before issue 17 each of these
 * returned ZCCL_SUCCESS on some rank with data mixed from two calls.
 *
 *   InvalidCalls.Refused/<transport>_<check>   3 ranks; one rank's call is refused by its own argument check in
 *       three shapes: a NULL receive buffer on rank 1 only (all-reduce), a root whose buffers overlap (broadcast,
 *       reduce). Then every rank calls a valid all-reduce.
 *         ZCCL_CHECK=0: the refused rank gets ZCCL_INVALID_ARGUMENT; every other rank fails that call with
 *         ZCCL_REMOTE_ERROR quoting "rank R refused" (since issue 22 also where its part did not depend on the
 *         refused rank: reduce and gather non-roots, a scatter's root); the refused rank's next call fails too.
 *         Nobody returns success from the valid all-reduce (it would pair with another rank's other call).
 *         ZCCL_CHECK=1: every rank fails the call (ZCCL_INVALID_USAGE naming the refused rank on the others) and the
 *         following all-reduce succeeds with the right sum everywhere.
 *   InvalidCalls.CountZero/<transport>_<check>   rank 2 passes count 0 where the others pass 64. ZCCL_CHECK=1: every
 *       rank fails that call with ZCCL_INVALID_USAGE naming rank 2, and the communicator stays usable. ZCCL_CHECK=0:
 *       rank 2's count-0 call succeeds (it moves nothing), the others' call and rank 2's next call fail with
 *       ZCCL_INVALID_USAGE or ZCCL_REMOTE_ERROR; no later call succeeds.
 *   InvalidCalls.Mismatch/<transport>   default settings, 3 ranks: rank 2 differs from ranks 0 and 1 in datatype
 *       (int32 vs float32), op (max vs sum), count, root, or collective. Every rank fails that call; rank 2's message
 *       names both calls (ZCCL_INVALID_USAGE when it found the mismatch itself).
 *   RefusedRooted.EveryRankFailsThatCall/<transport>_<n>   3, 4 and 5 ranks, default settings: in a reduce, gather,
 *       scatter and broadcast of root 0, the root or the last rank refuses its call (a NULL buffer), 300 ms after the
 *       others made theirs, so that a rank whose part does not need it (a gather non-root, a scatter root, the chain
 *       before it) has long finished its transfers: every other rank must fail that very call with ZCCL_REMOTE_ERROR
 *       (before issue 22 they returned ZCCL_SUCCESS and failed only at their next call).
 *   RefusedRooted.TwoClaimedRootsFailThatCall/<transport>_<n>   ranks 0 and n-1 both say they are the broadcast's
 *       root (the others say 0): every rank fails that call (before: some ranks succeeded), naming both roots or,
 *       under load, quoting a peer that failed first and closed its connections; at least one rank names both.
 * Children never use GoogleTest assertions; every group has a deadline, and ZCCL_TIMEOUT_MS turns a hang into a
 * failure well inside it.
 */
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <string>
#include <tuple>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

int fail(int rank, const std::string &what) {
    fprintf(stderr, "[rank %d] FAIL %s\n", rank, what.c_str());
    return 1;
}

bool has(const std::string &s, const std::string &what) { return s.find(what) != std::string::npos; }

Options opts(const std::string &transport, bool check) {
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_TRANSPORT", transport},
             {"ZCCL_CHECK", std::string(check ? "1" : "0")},
             {"ZCCL_TIMEOUT_MS", std::string("15000")}};
    return o;
}

/* A valid all-reduce of 64 floats (each rank contributes rank+1): returns its result and checks the sum. */
zccl_result_t valid_allreduce(zccl_comm_t comm, int rank, int n, bool *right) {
    std::vector<float> in(64, float(rank + 1)), out(64, -1.0f);
    zccl_result_t r = zccl_allreduce(in.data(), out.data(), 64, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
    *right = true;
    for (float v : out)
        if (v != float(n * (n + 1) / 2)) *right = false;
    return r;
}

enum Shape {
    NULL_RECVBUF_ALLREDUCE,
    OVERLAP_ROOT_BROADCAST,
    OVERLAP_ROOT_REDUCE,
    NULL_RECVBUF_ALLTOALL,
    OVERLAP_ROOT_GATHER,
    NULL_RECVBUF_SCATTER,
    NSHAPES
};
const char *shape_name(int s) {
    switch (s) {
    case NULL_RECVBUF_ALLREDUCE: return "all-reduce with a NULL recvbuf on rank 1";
    case OVERLAP_ROOT_BROADCAST: return "broadcast whose root's buffers overlap";
    case OVERLAP_ROOT_REDUCE: return "reduce whose root's buffers overlap";
    case NULL_RECVBUF_ALLTOALL: return "all-to-all with a NULL recvbuf on rank 1";
    case OVERLAP_ROOT_GATHER: return "gather whose root's buffers overlap";
    default: return "scatter with a NULL recvbuf on rank 1 (root 0)";
    }
}
/* The rank whose call is invalid in each shape. */
int bad_rank(int s) { return s == NULL_RECVBUF_ALLREDUCE || s == NULL_RECVBUF_ALLTOALL || s == NULL_RECVBUF_SCATTER; }

/* Rank `bad` makes the invalid call of `shape`; the others make the valid one. */
zccl_result_t shaped_call(int shape, int rank, int bad, zccl_comm_t comm) {
    static std::vector<float> buf(128, 1.0f), out(128, 0.0f);
    const bool me = rank == bad;
    switch (shape) {
    case NULL_RECVBUF_ALLREDUCE:
        return zccl_allreduce(buf.data(), me ? nullptr : out.data(), 64, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
    case OVERLAP_ROOT_BROADCAST: /* root = bad; its recvbuf starts one element into its sendbuf */
        return zccl_broadcast(buf.data(), me ? buf.data() + 1 : out.data(), 64, ZCCL_FLOAT32, bad, comm, nullptr);
    case OVERLAP_ROOT_REDUCE:
        return zccl_reduce(buf.data(), me ? buf.data() + 1 : out.data(), 64, ZCCL_FLOAT32, ZCCL_SUM, bad, comm,
                           nullptr);
    case NULL_RECVBUF_ALLTOALL: /* 3 ranks x 16 elements each way */
        return zccl_alltoall(buf.data(), me ? nullptr : out.data(), 16, ZCCL_FLOAT32, comm, nullptr);
    case OVERLAP_ROOT_GATHER: /* root = bad; its recvbuf (3 x 16) starts one element into its sendbuf, not in place */
        return zccl_gather(buf.data(), me ? buf.data() + 1 : out.data(), 16, ZCCL_FLOAT32, bad, comm, nullptr);
    default: /* root 0 sends 3 x 16; rank 1 passes a NULL recvbuf */
        return zccl_scatter(buf.data(), me ? nullptr : out.data(), 16, ZCCL_FLOAT32, 0, comm, nullptr);
    }
}

class Refused : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(Refused, EveryRankFailsNoneMixesData) {
    const std::string transport = std::get<0>(GetParam());
    const bool check = std::get<1>(GetParam());
    for (int shape = 0; shape < NSHAPES; shape++) {
        SCOPED_TRACE(shape_name(shape));
        const int bad = bad_rank(shape);
        run_ranks(3, [shape, bad, check](zccl_comm_t comm, int rank, int n) -> int {
            const std::string what = shape_name(shape);
            zccl_result_t r = shaped_call(shape, rank, bad, comm);
            std::string msg = zccl_get_last_error(comm);
            if (rank == bad && r != ZCCL_INVALID_ARGUMENT)
                return fail(rank, what + ": the refused rank got " + std::to_string(r) + ", not INVALID_ARGUMENT");
            bool right = false;
            if (check) { /* every rank fails together, nothing moved, the communicator stays usable */
                if (rank != bad && (r != ZCCL_INVALID_USAGE || !has(msg, "rank " + std::to_string(bad) + " refused")))
                    return fail(rank, what + ": expected ZCCL_INVALID_USAGE naming rank " + std::to_string(bad) +
                                          ", got " + std::to_string(r) + ": " + msg);
                zccl_result_t r2 = valid_allreduce(comm, rank, n, &right);
                if (r2 != ZCCL_SUCCESS || !right)
                    return fail(rank, what + ": the all-reduce after it failed or gave a wrong sum: " +
                                          zccl_get_last_error(comm));
                return 0;
            }
            /* Also a rank that receives nothing from the refused one (a reduce or gather non-root, a scatter's root
             * and its other receivers) fails this call: rooted collectives wait for every peer's descriptor. */
            if (rank != bad && r == ZCCL_SUCCESS)
                return fail(rank, what + ": a peer of the refused rank returned ZCCL_SUCCESS");
            /* A peer that finished first (its own call failed, then its next one) may close its connections before
             * this rank reads the refusal notice: then the error names that peer's exit instead. Both are this
             * call's failure; what may never happen is a success or a hang. */
            const bool peer_left = has(msg, "closed its connection") || has(msg, "has exited") || has(msg, "gave up");
            if (rank != bad && r != ZCCL_SUCCESS && (r != ZCCL_REMOTE_ERROR || !(has(msg, "refused") || peer_left)))
                return fail(rank, what + ": expected ZCCL_REMOTE_ERROR quoting the refusal, got " + std::to_string(r) +
                                      ": " + msg);
            zccl_result_t r2 = valid_allreduce(comm, rank, n, &right);
            msg = zccl_get_last_error(comm);
            if (r2 == ZCCL_SUCCESS)
                return fail(rank, what + ": the next all-reduce returned ZCCL_SUCCESS (sum " +
                                      std::string(right ? "right" : "WRONG: data from two calls") + ")");
            return 0;
        }, opts(transport, check));
    }
}

class CountZero : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(CountZero, RankPassingZeroIsCaughtAtThatCall) {
    const std::string transport = std::get<0>(GetParam());
    const bool check = std::get<1>(GetParam());
    run_ranks(3, [check](zccl_comm_t comm, int rank, int n) -> int {
        std::vector<float> in(64, 1.0f), out(64);
        const size_t count = rank == 2 ? 0 : 64;
        zccl_result_t r = zccl_allreduce(in.data(), out.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
        std::string msg = zccl_get_last_error(comm);
        bool right = false;
        if (check) {
            if (r != ZCCL_INVALID_USAGE || !has(msg, "rank 2") || !has(msg, "count 0"))
                return fail(rank, "expected ZCCL_INVALID_USAGE naming rank 2's count 0, got " + std::to_string(r) +
                                      ": " + msg);
            if (valid_allreduce(comm, rank, n, &right) != ZCCL_SUCCESS || !right)
                return fail(rank, std::string("the all-reduce after the mismatch failed or was wrong: ") +
                                      zccl_get_last_error(comm));
            return 0;
        }
        if (rank == 2 && r != ZCCL_SUCCESS) return fail(rank, "count 0 failed: " + msg);
        if (rank != 2 && r == ZCCL_SUCCESS) return fail(rank, "the call rank 2 did not make returned ZCCL_SUCCESS");
        zccl_result_t r2 = valid_allreduce(comm, rank, n, &right);
        if (r2 == ZCCL_SUCCESS)
            return fail(rank, std::string("the next all-reduce returned ZCCL_SUCCESS, sum ") +
                                  (right ? "right" : "WRONG"));
        return 0;
    }, opts(transport, check));
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, bool>> &i) {
    return std::get<0>(i.param) + (std::get<1>(i.param) ? "_check" : "_default");
}
INSTANTIATE_TEST_SUITE_P(Transports, Refused,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()), param_name);
INSTANTIATE_TEST_SUITE_P(Transports, CountZero,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()), param_name);

/* ---- calls that differ, default settings ------------------------------------------------------------------- */

struct MismatchCase {
    const char *name;
    const char *rank2_says; /* in rank 2's call description */
    const char *others_say; /* in the others' */
};
const MismatchCase mismatch_cases[] = {
    {"datatype", "int32", "float32"},
    {"op", "op max", "op sum"},
    {"count", "count 32", "count 64"},
    /* rooted collectives exchange every pair's descriptor: caught at that call even where no data flows */
    {"root", "zccl_broadcast(count 64, float32, root ", "different collectives"},
    {"collective", "zccl_allgather", "zccl_allreduce"},
};

zccl_result_t mismatch_call(const std::string &c, int rank, zccl_comm_t comm) {
    static std::vector<float> in(192, 1.0f), out(192, 0.0f);
    const bool odd = rank == 2;
    if (c == "datatype")
        return zccl_allreduce(in.data(), out.data(), 64, odd ? ZCCL_INT32 : ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
    if (c == "op") return zccl_allreduce(in.data(), out.data(), 64, ZCCL_FLOAT32, odd ? ZCCL_MAX : ZCCL_SUM, comm, nullptr);
    if (c == "count") return zccl_allreduce(in.data(), out.data(), odd ? 32 : 64, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
    if (c == "root") return zccl_broadcast(in.data(), out.data(), 64, ZCCL_FLOAT32, odd ? 2 : 0, comm, nullptr);
    if (odd) return zccl_allgather(in.data(), out.data(), 64, ZCCL_FLOAT32, comm, nullptr);
    return zccl_allreduce(in.data(), out.data(), 64, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
}

class Mismatch : public ::testing::TestWithParam<std::string> {};

TEST_P(Mismatch, EveryRankFailsNamingBothCalls) {
    for (const MismatchCase &mc : mismatch_cases) {
        SCOPED_TRACE(mc.name);
        Options o = opts(GetParam(), false);
        o.env.erase(o.env.begin() + 1); /* ZCCL_CHECK unset: the default */
        run_ranks(3, [mc](zccl_comm_t comm, int rank, int) -> int {
            /* One matching call first, so that the mismatch is not the communicator's first use. */
            std::vector<float> a(8, 1.0f), b(8);
            if (zccl_allreduce(a.data(), b.data(), 8, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS)
                return fail(rank, std::string("warm-up all-reduce: ") + zccl_get_last_error(comm));
            zccl_result_t r = mismatch_call(mc.name, rank, comm);
            const std::string msg = zccl_get_last_error(comm);
            if (r == ZCCL_SUCCESS) return fail(rank, std::string("mismatched ") + mc.name + " returned ZCCL_SUCCESS");
            if (r != ZCCL_INVALID_USAGE && r != ZCCL_REMOTE_ERROR)
                return fail(rank, std::string("mismatched ") + mc.name + ": unexpected result " + std::to_string(r) +
                                      ": " + msg);
            if (!has(msg, "different collectives") || !has(msg, mc.rank2_says) || !has(msg, mc.others_say))
                return fail(rank, std::string("mismatched ") + mc.name + ": the message does not name both calls ('" +
                                      mc.rank2_says + "', '" + mc.others_say + "'): " + msg);
            /* numbered as the user counts: the second collective is #2, whatever init ran before it */
            if (!has(msg, "called #2 "))
                return fail(rank, std::string("mismatched ") + mc.name + ": the message does not number the call #2 "
                                      "(the program's second collective): " + msg);
            return 0;
        }, o);
    }
}

INSTANTIATE_TEST_SUITE_P(Transports, Mismatch, ::testing::Values("shm", "tcp"));

/* ---- rooted collectives: a refused call or a second root reaches every rank at that call ---------------------- */

const char *rooted_name(int c) {
    static const char *names[] = {"reduce", "gather", "scatter", "broadcast"};
    return names[c];
}

/* Rooted collective c of root 0; `refuse` makes this rank's call invalid with a NULL buffer every rank checks. */
zccl_result_t rooted_call(int c, bool refuse, zccl_comm_t comm, int n) {
    static std::vector<float> in(5 * 16, 1.0f), out(5 * 16, 0.0f);
    float *snd = refuse ? nullptr : in.data(), *rcv = refuse ? nullptr : out.data();
    switch (c) {
    case 0: return zccl_reduce(snd, out.data(), 16, ZCCL_FLOAT32, ZCCL_SUM, 0, comm, nullptr);
    case 1: return zccl_gather(snd, out.data(), 16, ZCCL_FLOAT32, 0, comm, nullptr);
    case 2: return zccl_scatter(in.data(), rcv, 16, ZCCL_FLOAT32, 0, comm, nullptr);
    default: (void)n; return zccl_broadcast(in.data(), rcv, 16, ZCCL_FLOAT32, 0, comm, nullptr);
    }
}

class RefusedRooted : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(RefusedRooted, EveryRankFailsThatCall) {
    const std::string transport = std::get<0>(GetParam());
    const int nr = std::get<1>(GetParam());
    for (int c = 0; c < 4; c++) {
        for (int bad : {0, nr - 1}) {
            SCOPED_TRACE(std::string(rooted_name(c)) + ", refused by rank " + std::to_string(bad));
            Options o = opts(transport, false);
            run_ranks(nr, [c, bad](zccl_comm_t comm, int rank, int n) -> int {
                const std::string what = std::string(rooted_name(c)) + " refused by rank " + std::to_string(bad);
                bool right = false;
                if (valid_allreduce(comm, rank, n, &right) != ZCCL_SUCCESS || !right)
                    return fail(rank, what + ": warm-up all-reduce: " + zccl_get_last_error(comm));
                if (rank == bad) usleep(300000); /* the others' transfers are long done when it refuses */
                const zccl_result_t r = rooted_call(c, rank == bad, comm, n);
                const std::string msg = zccl_get_last_error(comm);
                if (rank == bad) {
                    if (r != ZCCL_INVALID_ARGUMENT)
                        return fail(rank, what + ": the refused rank got " + std::to_string(r) + ": " + msg);
                } else {
                    if (r == ZCCL_SUCCESS)
                        return fail(rank, what + ": a peer returned ZCCL_SUCCESS from the refused call");
                    /* The refusal's notice, or a peer that failed first and poisoned its transports before this
                     * rank read the notice: both are this call's failure. */
                    if (r != ZCCL_REMOTE_ERROR || !(has(msg, "rank " + std::to_string(bad) + " refused its call") ||
                                                    has(msg, "gave up") || has(msg, "closed its connection") ||
                                                    has(msg, "has exited")))
                        return fail(rank, what + ": expected ZCCL_REMOTE_ERROR naming the refusal, got " +
                                              std::to_string(r) + ": " + msg);
                }
                if (valid_allreduce(comm, rank, n, &right) == ZCCL_SUCCESS)
                    return fail(rank, what + ": the next all-reduce returned ZCCL_SUCCESS");
                return 0;
            }, o);
        }
    }
}

TEST_P(RefusedRooted, TwoClaimedRootsFailThatCall) {
    const std::string transport = std::get<0>(GetParam());
    const int nr = std::get<1>(GetParam());
    Options o = opts(transport, false);
    o.expect_success = false; /* exit codes: 0 named both roots, 3 failed quoting a peer that left first */
    GroupResult g = run_ranks(nr, [](zccl_comm_t comm, int rank, int n) -> int {
        bool right = false;
        if (valid_allreduce(comm, rank, n, &right) != ZCCL_SUCCESS || !right)
            return fail(rank, std::string("warm-up all-reduce: ") + zccl_get_last_error(comm));
        static std::vector<float> in(64, float(rank)), out(64, -1.0f);
        const int root = rank == n - 1 ? n - 1 : 0; /* ranks 0 and n-1 each think they are the root */
        const zccl_result_t r = zccl_broadcast(in.data(), out.data(), 64, ZCCL_FLOAT32, root, comm, nullptr);
        const std::string msg = zccl_get_last_error(comm);
        if (r == ZCCL_SUCCESS) return fail(rank, "a broadcast with two claimed roots returned ZCCL_SUCCESS");
        if (r != ZCCL_INVALID_USAGE && r != ZCCL_REMOTE_ERROR)
            return fail(rank, "two roots: unexpected result " + std::to_string(r) + ": " + msg);
        const std::string other = "root " + std::to_string(n - 1) + ")";
        if (has(msg, "different collectives") && has(msg, "root 0)") && has(msg, other)) return 0;
        /* A rank that found the mismatch, or learned it from a notice, may close its connections (fail, poison)
         * before the notice of the rank that found it reaches this one: this call's failure all the same. */
        if (r == ZCCL_REMOTE_ERROR && (has(msg, "closed its connection") || has(msg, "has exited") ||
                                       has(msg, "gave up on this communicator"))) {
            fprintf(stderr, "[rank %d] failed quoting a peer that left first: %s\n", rank, msg.c_str());
            return 3;
        }
        return fail(rank, "two roots: the message does not name both roots: " + msg);
    }, o);
    ASSERT_TRUE(g.setup_error.empty() && !g.deadline_exceeded) << g.report();
    int named = 0;
    for (const ProcStatus &p : g.procs) {
        EXPECT_TRUE(p.exited && (p.exit_code == 0 || p.exit_code == 3)) << p.name << ": " << p.describe() << "\n"
                                                                          << p.output;
        named += p.ok();
    }
    EXPECT_GE(named, 1) << "no rank named both roots:\n" << g.report();
}

std::string rooted_param(const ::testing::TestParamInfo<std::tuple<std::string, int>> &i) {
    return std::get<0>(i.param) + "_" + std::to_string(std::get<1>(i.param));
}
INSTANTIATE_TEST_SUITE_P(Transports, RefusedRooted,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(3, 4, 5)),
                         rooted_param);

}  // namespace

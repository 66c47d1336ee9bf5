/*
 * test_quant_coll.cpp — the quantized collectives (zccl_allgather_wire, zccl_reduce_scatter_wire,
 * zccl_allreduce_wire; include/zccl.h, zccl_wire_t) on forked ranks (tests/harness).
 *
 * QuantColl.EveryFormatTypeAndRankCount: one run per rank count 2..8 (odd counts with ZCCL_QUANT_BLOCK=64, even ones
 * with the default; 3 ranks also over tcp), each rank calling every wire format x {float32, float16, bfloat16} x
 * {all-gather, reduce-scatter SUM and AVG, all-reduce SUM and AVG, an all-reduce smaller than the rank count (empty
 * shards), in place and not}. Every rank computes every rank's input itself (a hash of rank, case and index, with
 * magnitudes that change from block to block), the exact result in double and the bound of zccl.h's formulas from
 * those inputs (block maxima computed here), and checks every element; each rank writes a hash of its all-gather and
 * all-reduce outputs into shared memory, and the parent asserts they are bitwise equal across ranks.
 * QuantColl.BadInput*: unsupported datatype, op, wire, a count whose wire size overflows (refused alike on every rank,
 * and the communicator still works), one rank refusing (its peers fail with ZCCL_REMOTE_ERROR quoting it), ranks
 * passing different wires (every rank fails).
 */
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "elem_math.h"
#include "harness/harness.h"
#include "harness/quant_ref.h"
#include "zccl.h"

using namespace zt;
using namespace zq;

namespace {

struct Fail {
    int rank;
    std::string *log;
};

constexpr int kMaxCases = 128;
struct Shared {
    uint64_t hash[kMaxCases][8];
    int ncases;
};

/* The reduction stage's bound R_i and exact value S_i for element j of a block whose rank-q inputs are x(q, j),
 * blocks of B from j = 0 (zccl.h, zccl_reduce_scatter_wire). */
template <class X> void rs_bound(zccl_datatype_t dt, zccl_wire_t w, int n, size_t len, size_t B, bool avg, X x,
                                 std::vector<double> &S, std::vector<double> &R) {
    S.assign(len, 0);
    R.assign(len, 0);
    std::vector<double> sabs(len, 0);
    for (int q = 0; q < n; q++)
        for (size_t b0 = 0; b0 < len; b0 += B) {
            const size_t b1 = std::min(len, b0 + B);
            const double am = amax_of(b0, b1, [&](size_t j) { return x(q, j); });
            for (size_t j = b0; j < b1; j++) {
                const double e = qbound_in(dt, w, x(q, j), am);
                S[j] += x(q, j);
                R[j] += e;
                sabs[j] += std::fabs(x(q, j)) + e;
            }
        }
    for (size_t j = 0; j < len; j++) {
        R[j] += (n - 1) * kU * sabs[j];
        if (avg) {
            S[j] /= n;
            R[j] = R[j] / n + kU * (std::fabs(S[j]) + R[j] / n);
        }
    }
}

int run_cases(zccl_comm_t comm, int rank, int n, size_t B, Shared *sh) {
    int bad = 0, cs = 0;
    auto fail = [&](const std::string &m) {
        if (bad++ < 8) child_log(rank, "%s", m.c_str());
    };
    for (zccl_wire_t w : kWires)
        for (zccl_datatype_t dt : kTypes) {
            const size_t es = esize(dt);
            const std::string tag = std::string(zccl_wire_name(w)) + "/" + dtn(dt);
            /* all-gather, out of place then in place */
            for (int inplace = 0; inplace < 2; inplace++) {
                const int c = cs;
                const size_t sc = 517 + (size_t)inplace;
                std::vector<uint8_t> in = make(dt, rank, c, sc), out(n * sc * es + 1, 0xEE);
                const void *sb = in.data();
                if (inplace) {
                    memcpy(out.data() + rank * sc * es, in.data(), sc * es);
                    sb = out.data() + rank * sc * es;
                }
                zccl_result_t res = zccl_allgather_wire(sb, out.data(), sc, dt, w, comm, NULL);
                if (res != ZCCL_SUCCESS) {
                    fail(tag + " allgather: " + zccl_get_last_error(comm));
                    return 1;
                }
                for (int r = 0; r < n; r++)
                    for (size_t b0 = 0; b0 < sc; b0 += B) {
                        const size_t b1 = std::min(sc, b0 + B);
                        const double am = amax_of(b0, b1, [&](size_t i) { return input(dt, r, c, i); });
                        for (size_t i = b0; i < b1; i++) {
                            const double x = input(dt, r, c, i), y = load(dt, out.data(), r * sc + i);
                            const double e = qbound_in(dt, w, x, am), bound = e + out_bound(dt, std::fabs(x) + e);
                            if (!(std::fabs(y - x) <= bound))
                                fail(tag + " allgather" + (inplace ? " in place" : "") + ": element " +
                                     std::to_string(r * sc + i) + " = " + std::to_string(y) + ", exact " +
                                     std::to_string(x) + ", error beyond the bound " + std::to_string(bound));
                        }
                    }
                sh->hash[cs][rank] = fnv(out.data(), n * sc * es);
                cs++;
            }
            /* reduce-scatter, SUM and AVG (AVG in place) */
            for (zccl_redop_t op : {ZCCL_SUM, ZCCL_AVG}) {
                const int c = cs;
                const size_t rc = 333;
                std::vector<uint8_t> in = make(dt, rank, c, n * rc), out(rc * es + 1, 0xEE);
                void *rb = out.data();
                if (op == ZCCL_AVG) rb = in.data() + rank * rc * es;
                zccl_result_t res = zccl_reduce_scatter_wire(in.data(), rb, rc, dt, op, w, comm, NULL);
                if (res != ZCCL_SUCCESS) {
                    fail(tag + " reduce_scatter: " + zccl_get_last_error(comm));
                    return 1;
                }
                std::vector<double> S, R;
                rs_bound(dt, w, n, rc, B, op == ZCCL_AVG, [&](int q, size_t j) { return input(dt, q, c, rank * rc + j); },
                         S, R);
                for (size_t j = 0; j < rc; j++) {
                    const double y = load(dt, rb, j), bound = R[j] + out_bound(dt, std::fabs(S[j]) + R[j]);
                    if (!(std::fabs(y - S[j]) <= bound))
                        fail(tag + " reduce_scatter op " + std::to_string(op) + ": element " + std::to_string(j) +
                             " = " + std::to_string(y) + ", exact " + std::to_string(S[j]) + ", bound " +
                             std::to_string(bound));
                }
                sh->hash[cs][rank] = 0; /* each rank has its own block: nothing to compare */
                cs++;
            }
            /* all-reduce: SUM out of place, AVG in place, and a count smaller than the rank count */
            for (int k = 0; k < 3; k++) {
                const int c = cs;
                const size_t count = k == 2 ? (size_t)n - 1 : 2001 + (size_t)n;
                const zccl_redop_t op = k == 1 ? ZCCL_AVG : ZCCL_SUM;
                std::vector<uint8_t> in = make(dt, rank, c, count), out(count * es + 1, 0xEE);
                void *rb = k == 1 ? in.data() : out.data();
                zccl_result_t res = zccl_allreduce_wire(in.data(), rb, count, dt, op, w, comm, NULL);
                if (res != ZCCL_SUCCESS) {
                    fail(tag + " allreduce: " + zccl_get_last_error(comm));
                    return 1;
                }
                const size_t L = (count + n - 1) / n;
                for (int q = 0; q * L < count; q++) {
                    const size_t s0 = q * L, len = std::min(L, count - s0);
                    std::vector<double> S, R;
                    rs_bound(dt, w, n, len, B, op == ZCCL_AVG, [&](int r, size_t j) { return input(dt, r, c, s0 + j); },
                             S, R);
                    for (size_t b0 = 0; b0 < len; b0 += B) {
                        const size_t b1 = std::min(len, b0 + B);
                        const double amz = amax_of(b0, b1, [&](size_t j) { return std::fabs(S[j]) + R[j]; });
                        for (size_t j = b0; j < b1; j++) {
                            const double e2 = qbound(w, std::fabs(S[j]) + R[j], amz);
                            const double bound = R[j] + e2 + out_bound(dt, std::fabs(S[j]) + R[j] + e2);
                            const double y = load(dt, rb, s0 + j);
                            if (!(std::fabs(y - S[j]) <= bound))
                                fail(tag + " allreduce count " + std::to_string(count) + " op " + std::to_string(op) +
                                     ": element " + std::to_string(s0 + j) + " = " + std::to_string(y) + ", exact " +
                                     std::to_string(S[j]) + ", bound " + std::to_string(bound));
                        }
                    }
                }
                sh->hash[cs][rank] = fnv(rb, count * es);
                cs++;
            }
        }
    sh->ncases = cs;
    return bad ? 1 : 0;
}

void run_matrix(int n, const char *transport) {
    const size_t B = (n & 1) ? 64 : 128; /* 128: the default */
    SharedMem mem(sizeof(Shared));
    Shared *sh = new (mem.data()) Shared();
    Options o;
    o.deadline_s = 180;
    if (n & 1) o.env.push_back({"ZCCL_QUANT_BLOCK", "64"});
    else o.env.push_back({"ZCCL_QUANT_BLOCK", std::nullopt});
    if (transport) o.env.push_back({"ZCCL_TRANSPORT", transport});
    GroupResult g = run_ranks(n, [&](zccl_comm_t comm, int rank, int nr) { return run_cases(comm, rank, nr, B, sh); }, o);
    if (!g.all_ok()) return;
    ASSERT_GT(sh->ncases, 0);
    for (int c = 0; c < sh->ncases; c++)
        for (int r = 1; r < n; r++)
            EXPECT_EQ(sh->hash[c][r], sh->hash[c][0]) << "case " << c << ": rank " << r << "'s output differs from "
                                                      << "rank 0's (they must be bitwise identical)";
}

}  // namespace

class QuantColl : public ::testing::TestWithParam<int> {};

TEST_P(QuantColl, EveryFormatTypeAndRankCount) { run_matrix(GetParam(), nullptr); }
INSTANTIATE_TEST_SUITE_P(Ranks, QuantColl, ::testing::Values(2, 3, 4, 5, 6, 7, 8));

TEST(QuantCollTcp, ThreeRanksOverTcp) { run_matrix(3, "tcp"); }

/* Every rank passes the same invalid argument: every rank gets ZCCL_INVALID_ARGUMENT naming it, nothing moved, and the
 * communicator still works (a valid quantized all-reduce follows, checked). */
TEST(QuantColl, BadInputRefusedOnEveryRankAndTheCommunicatorStillWorks) {
    Options o;
    o.deadline_s = 60;
    run_ranks(4, [](zccl_comm_t comm, int rank, int n) {
        float f[64] = {0}, g[256] = {0};
        int32_t iv[64] = {0};
        struct Case {
            const char *what, *word;
            zccl_result_t res;
        };
        auto expect = [&](zccl_result_t res, const char *what, const char *word) {
            const std::string msg = zccl_get_last_error(comm);
            if (res != ZCCL_INVALID_ARGUMENT || msg.find(word) == std::string::npos) {
                child_log(rank, "%s: got %d '%s', wanted ZCCL_INVALID_ARGUMENT naming %s", what, (int)res, msg.c_str(),
                          word);
                return false;
            }
            return true;
        };
        bool ok = true;
        ok &= expect(zccl_allreduce_wire(iv, iv, 64, ZCCL_INT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL), "int32 data",
                     "'datatype'");
        ok &= expect(zccl_reduce_scatter_wire(g, f, 64, ZCCL_FLOAT32, ZCCL_MAX, ZCCL_WIRE_INT4, comm, NULL), "op max",
                     "'op'");
        ok &= expect(zccl_allreduce_wire(f, f, 64, ZCCL_FLOAT32, ZCCL_PROD, ZCCL_WIRE_FP8E4M3, comm, NULL), "op prod",
                     "'op'");
        ok &= expect(zccl_allgather_wire(f, g, 64, ZCCL_FLOAT32, (zccl_wire_t)9, comm, NULL), "wire 9", "'wire'");
        ok &= expect(zccl_allgather_wire(f, g, SIZE_MAX / 16, ZCCL_FLOAT32, ZCCL_WIRE_INT8, comm, NULL), "huge count",
                     "'count'");
        ok &= expect(zccl_allgather_wire(f, f + 1, 32, ZCCL_FLOAT32, ZCCL_WIRE_INT8, comm, NULL), "overlap",
                     "overlap");
        for (int i = 0; i < 64; i++) f[i] = (float)(i + rank);
        zccl_result_t res = zccl_allreduce_wire(f, f, 64, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL);
        if (res != ZCCL_SUCCESS) {
            child_log(rank, "the valid call after the refused ones failed: %s", zccl_get_last_error(comm));
            return 1;
        }
        for (int i = 0; i < 64; i++) {
            const double exact = 4.0 * i + 6.0; /* sum over ranks 0..3 of i + r */
            if (std::fabs(f[i] - exact) > 2 * (4.0 * 66 / 254 + 1e-3)) {
                child_log(rank, "element %d = %g, exact %g", i, f[i], exact);
                return 1;
            }
        }
        (void)n;
        return ok ? 0 : 1;
    }, o);
}

/* One rank refuses (op max), the others call validly: the refusing rank gets ZCCL_INVALID_ARGUMENT, every other rank
 * an error quoting it; no rank returns success. */
TEST(QuantColl, OneRankRefusesAndEveryRankFails) {
    Options o;
    o.deadline_s = 60;
    run_ranks(3, [](zccl_comm_t comm, int rank, int) {
        float f[600] = {0};
        for (int i = 0; i < 600; i++) f[i] = 1.0f;
        const zccl_redop_t op = rank == 1 ? ZCCL_MAX : ZCCL_SUM;
        zccl_result_t res = zccl_allreduce_wire(f, f, 600, ZCCL_FLOAT32, op, ZCCL_WIRE_INT8, comm, NULL);
        const std::string msg = zccl_get_last_error(comm);
        if (rank == 1) {
            if (res != ZCCL_INVALID_ARGUMENT) {
                child_log(rank, "refusing rank got %d: %s", (int)res, msg.c_str());
                return 1;
            }
            return 0;
        }
        if (res == ZCCL_SUCCESS || msg.find("rank 1") == std::string::npos || msg.find("'op'") == std::string::npos) {
            child_log(rank, "peer of the refusing rank got %d: '%s' (wanted an error quoting rank 1's 'op')", (int)res,
                      msg.c_str());
            return 1;
        }
        return 0;
    }, o);
}

/* Ranks passing different wire formats of the same size (int8 and fp8 E4M3): every rank fails, none mixes formats. */
TEST(QuantColl, DifferentWiresFailOnEveryRank) {
    Options o;
    o.deadline_s = 60;
    run_ranks(2, [](zccl_comm_t comm, int rank, int) {
        float f[300], g[600];
        for (int i = 0; i < 300; i++) f[i] = (float)i;
        const zccl_wire_t w = rank == 0 ? ZCCL_WIRE_INT8 : ZCCL_WIRE_FP8E4M3;
        zccl_result_t res = zccl_allgather_wire(f, g, 300, ZCCL_FLOAT32, w, comm, NULL);
        if (res == ZCCL_SUCCESS) {
            child_log(rank, "succeeded although the ranks passed different wires");
            return 1;
        }
        child_log(rank, "failed as it should: %s", zccl_get_last_error(comm));
        return 0;
    }, o);
}

/* Counts that differ by less than the padding give the same wire size, so the call descriptors agree: the headers
 * inside the wire strings still make every rank fail, naming both calls, and the communicator stays usable. */
TEST(QuantColl, CountsThatDifferFailOnEveryRank) {
    Options o;
    o.deadline_s = 60;
    run_ranks(3, [](zccl_comm_t comm, int rank, int n) {
        std::vector<float> f(3 * 1002, 1.0f), g(3 * 1002, 0.0f);
        const size_t c = rank == 2 ? 1002 : 1001; /* int8, B = 128: both 1040 wire bytes + 16 */
        const zccl_result_t r1 = zccl_allgather_wire(f.data(), g.data(), c, ZCCL_FLOAT32, ZCCL_WIRE_INT8, comm, NULL);
        const std::string m1 = zccl_get_last_error(comm);
        const zccl_result_t r2 = zccl_reduce_scatter_wire(f.data(), g.data(), c, ZCCL_FLOAT32, ZCCL_SUM,
                                                          ZCCL_WIRE_INT8, comm, NULL);
        const zccl_result_t r3 = zccl_allreduce_wire(f.data(), g.data(), 3 * c, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_INT8,
                                                     comm, NULL);
        if (r1 != ZCCL_INVALID_USAGE || r2 != ZCCL_INVALID_USAGE || r3 != ZCCL_INVALID_USAGE ||
            m1.find("count 100") == std::string::npos) {
            child_log(rank, "got %d %d %d, '%s' (wanted ZCCL_INVALID_USAGE naming the counts on every rank)", (int)r1,
                      (int)r2, (int)r3, m1.c_str());
            return 1;
        }
        float v = 2.0f;
        if (zccl_allreduce_wire(&v, &v, 1, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL) != ZCCL_SUCCESS ||
            std::fabs(v - 2.0f * n) > 0.1f) {
            child_log(rank, "the communicator does not work after the refused calls: %s", zccl_get_last_error(comm));
            return 1;
        }
        return 0;
    }, o);
}

/* ZCCL_QUANT_BLOCK differs on one rank: every quantized call fails on every rank naming both blocks (the wire header),
 * and a full-precision call still works. */
TEST(QuantColl, DifferentBlockSizesFailOnEveryRank) {
    Options o;
    o.deadline_s = 60;
    o.rank_env = [](int rank) { return EnvList{{"ZCCL_QUANT_BLOCK", rank == 1 ? "64" : "128"}}; };
    run_ranks(2, [](zccl_comm_t comm, int rank, int) {
        std::vector<float> f(512, 1.0f), g(1024, 0.0f);
        const zccl_result_t r = zccl_allgather_wire(f.data(), g.data(), 8, ZCCL_FLOAT32, ZCCL_WIRE_INT8, comm, NULL);
        const std::string m = zccl_get_last_error(comm);
        if (r == ZCCL_SUCCESS || m.find("block") == std::string::npos) {
            child_log(rank, "got %d '%s' (wanted a failure naming the blocks)", (int)r, m.c_str());
            return 1;
        }
        float v = 1.0f;
        return zccl_allreduce(&v, &v, 1, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL) == ZCCL_SUCCESS && v == 2.0f ? 0 : 1;
    }, o);
}

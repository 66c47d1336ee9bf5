/*
 * test_quant_hier.cpp — the hierarchical quantized collectives (include/zccl_hier.h) on forked ranks
 * (tests/harness), with hosts simulated on this machine by ZCCL_HOST_ID.
 *
 * QuantHier.Layouts/<ranks>_<layout>: one run per (rank count, host layout): one host, 2 hosts contiguous, 2 hosts
 * interleaved (rank % 2), 3 and 4 hosts of 2 interleaved, and uneven hosts. Each rank first asks zccl_hier_layout
 * whether the layout is hierarchical (it must be exactly when there are 2 or more hosts of equal size 2 or more),
 * then calls every wire format x {float32, float16, bfloat16} x {all-gather out of place and in place,
 * reduce-scatter SUM and AVG in place, all-reduce SUM, AVG in place, and one smaller than the rank count}. Every
 * rank recomputes every rank's input (tests/harness/quant_ref.h), the exact result in double, and checks:
 *   - hierarchical: the all-gather is bitwise zccl_allgather_wire's and within its bound; reduce-scatter and
 *     all-reduce within zccl_hier.h's bound, computed here from the host partial sums with the hierarchical block
 *     layout (chunks of ceil(count / G), shards of ceil(C / H), blocks of B);
 *   - flat fallback: every output bitwise equal to the flat _wire call's.
 * Each rank writes a hash of its all-gather and all-reduce outputs into shared memory; the parent asserts they are
 * bitwise equal across ranks.
 * QuantHierArgs.*: every rank refusing the same bad argument (datatype, op, wire, NULL buffer, overlap, count,
 * group; before and after the layout is made) gets the error naming it and the communicator still works; CUDA
 * device memory refused; count 0 and a call on a stream over tcp; all-gathers whose counts differ fail on every rank.
 * QuantHierOneRefuses.*: one rank refusing makes every rank fail (before the layout exists and after) and leaves
 * the communicator marked broken.
 */
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/quant_ref.h"
#include "zccl.h"
#include "zccl_hier.h"

using namespace zt;
using namespace zq;

namespace {

enum Layout { ONE_HOST, TWO_CONTIG, TWO_INTERLEAVED, THREE_BY_TWO, FOUR_BY_TWO, UNEVEN };
const char *layout_name(Layout l) {
    static const char *const names[] = {"one_host", "two_contig", "two_interleaved", "three_by_two", "four_by_two",
                                        "uneven"};
    return names[l];
}
/* The simulated host of rank r of n. */
int host_of(Layout l, int r, int n) {
    switch (l) {
    case ONE_HOST: return 0;
    case TWO_CONTIG: return r < n / 2 ? 0 : 1;
    case TWO_INTERLEAVED: return r % 2;
    case THREE_BY_TWO: return r % 3;
    case FOUR_BY_TWO: return r % 4;
    default: return r == 0 ? 0 : 1; /* 1 + (n-1) ranks */
    }
}

/* The layout as zccl_hier.h numbers it: hosts by their lowest rank, local ranks in rank order. */
struct Hosts {
    int H = 0, G = 0;
    bool equal = true;
    std::vector<int> host, local;
    std::vector<std::vector<int>> members;
    Hosts(Layout l, int n) : host(n), local(n) {
        std::vector<int> idx(n + 4, -1);
        for (int r = 0; r < n; r++) {
            const int s = host_of(l, r, n);
            if (idx[s] < 0) {
                idx[s] = H++;
                members.emplace_back();
            }
            host[r] = idx[s];
            local[r] = (int)members[host[r]].size();
            members[host[r]].push_back(r);
        }
        G = (int)members[0].size();
        for (auto &m : members) equal = equal && (int)m.size() == G;
    }
    bool hierarchical() const { return H >= 2 && G >= 2 && equal; }
};

constexpr int kMaxCases = 128;
struct Shared {
    uint64_t hash[kMaxCases][8];
    int ncases;
};

/* zccl_hier.h's bound R_i and the exact S_i for `len` elements whose rank-q input is x(q, j): host partial sums,
 * blocks given by block_of(j) (consecutive indices share a block while it returns the same value). */
template <class X, class Blk>
void hier_bound(zccl_wire_t w, const Hosts &hs, int n, size_t len, X x, Blk block_of, std::vector<double> &S,
                std::vector<double> &R) {
    const int H = hs.H, G = hs.G;
    S.assign(len, 0);
    R.assign(len, 0);
    std::vector<double> a(len), p(len), sum_a(len, 0), sum_pe(len, 0);
    for (int h = 0; h < H; h++) {
        for (size_t j = 0; j < len; j++) {
            double P = 0, A = 0;
            for (int q : hs.members[h]) {
                P += x(q, j);
                A += std::fabs(x(q, j));
            }
            S[j] += P;
            a[j] = A;
            p[j] = std::fabs(P) + (G - 1) * kU * A;
            sum_a[j] += A;
        }
        for (size_t b0 = 0; b0 < len;) {
            size_t b1 = b0;
            while (b1 < len && block_of(b1) == block_of(b0)) b1++;
            const double am = amax_of(b0, b1, [&](size_t j) { return p[j]; });
            for (size_t j = b0; j < b1; j++) {
                const double e = qbound(w, p[j], am);
                R[j] += e;
                sum_pe[j] += p[j] + e;
            }
            b0 = b1;
        }
    }
    for (size_t j = 0; j < len; j++) R[j] += (G - 1) * kU * sum_a[j] + (H - 1) * kU * sum_pe[j];
    (void)n;
}
/* AVG: the sum and the bound divided by n, plus the division's rounding. */
void avg_scale(int n, double &S, double &bound) {
    S /= n;
    bound = bound / n + kU * (std::fabs(S) + bound / n);
}

int run_cases(zccl_comm_t comm, int rank, int n, const Hosts &hs, size_t B, Shared *sh) {
    int bad = 0, cs = 0;
    auto fail = [&](const std::string &m) {
        if (bad++ < 8) child_log(rank, "%s", m.c_str());
    };
    int nh = -1, ph = -1, hier = -1;
    if (zccl_hier_layout(comm, &nh, &ph, &hier) != ZCCL_SUCCESS) {
        fail(std::string("zccl_hier_layout: ") + zccl_get_last_error(comm));
        return 1;
    }
    if (hier != (int)hs.hierarchical() || nh != hs.H || ph != (hs.equal ? hs.G : 0)) {
        child_log(rank, "zccl_hier_layout: %d hosts of %d, hierarchical %d; expected %d of %d, %d", nh, ph, hier,
                  hs.H, hs.equal ? hs.G : 0, (int)hs.hierarchical());
        return 1;
    }
    const bool H2 = hs.hierarchical();
    for (zccl_wire_t w : kWires)
        for (zccl_datatype_t dt : kHierTypes) {
            const size_t es = esize(dt);
            const std::string tag = std::string(zccl_wire_name(w)) + "/" + dtn(dt);
            /* all-gather, out of place then in place; always compared with the flat call */
            for (int inplace = 0; inplace < 2; inplace++) {
                const int c = cs;
                const size_t sc = 517 + (size_t)inplace;
                std::vector<uint8_t> in = make(dt, rank, c, sc), out(n * sc * es + 1, 0xEE), flat(out.size(), 0xEE);
                const void *sb = in.data();
                if (inplace) {
                    memcpy(out.data() + rank * sc * es, in.data(), sc * es);
                    sb = out.data() + rank * sc * es;
                }
                if (zccl_allgather_hier(sb, out.data(), sc, dt, w, comm, NULL) != ZCCL_SUCCESS ||
                    zccl_allgather_wire(in.data(), flat.data(), sc, dt, w, comm, NULL) != ZCCL_SUCCESS) {
                    fail(tag + " allgather: " + zccl_get_last_error(comm));
                    return 1;
                }
                if (memcmp(out.data(), flat.data(), n * sc * es) != 0)
                    fail(tag + " allgather" + (inplace ? " in place" : "") + ": differs from zccl_allgather_wire's");
                for (int r = 0; r < n; r++)
                    for (size_t b0 = 0; b0 < sc; b0 += B) {
                        const size_t b1 = std::min(sc, b0 + B);
                        const double am = amax_of(b0, b1, [&](size_t i) { return input(dt, r, c, i); });
                        for (size_t i = b0; i < b1; i++) {
                            const double x = input(dt, r, c, i), y = load(dt, out.data(), r * sc + i);
                            const double e = qbound(w, x, am), bound = e + out_bound(dt, std::fabs(x) + e);
                            if (!(std::fabs(y - x) <= bound))
                                fail(tag + " allgather: element " + std::to_string(r * sc + i) + " = " +
                                     std::to_string(y) + ", exact " + std::to_string(x) + ", bound " +
                                     std::to_string(bound));
                        }
                    }
                sh->hash[cs][rank] = fnv(out.data(), n * sc * es);
                cs++;
            }
            /* reduce-scatter, SUM out of place and AVG in place */
            for (zccl_redop_t op : {ZCCL_SUM, ZCCL_AVG}) {
                const int c = cs;
                const size_t rc = 333;
                std::vector<uint8_t> in = make(dt, rank, c, n * rc), out(rc * es + 1, 0xEE), flat(out.size(), 0xEE);
                const std::vector<uint8_t> orig = in;
                void *rb = op == ZCCL_AVG ? in.data() + rank * rc * es : out.data();
                if (zccl_reduce_scatter_hier(in.data(), rb, rc, dt, op, w, comm, NULL) != ZCCL_SUCCESS) {
                    fail(tag + " reduce_scatter: " + zccl_get_last_error(comm));
                    return 1;
                }
                if (!H2) {
                    if (zccl_reduce_scatter_wire(orig.data(), flat.data(), rc, dt, op, w, comm, NULL) != ZCCL_SUCCESS) {
                        fail(tag + " flat reduce_scatter: " + zccl_get_last_error(comm));
                        return 1;
                    }
                    if (memcmp(rb, flat.data(), rc * es) != 0)
                        fail(tag + " reduce_scatter (flat fallback): differs from zccl_reduce_scatter_wire's");
                } else {
                    std::vector<double> S, R;
                    hier_bound(w, hs, n, rc, [&](int q, size_t j) { return input(dt, q, c, rank * rc + j); },
                               [&](size_t j) { return j / B; }, S, R);
                    for (size_t j = 0; j < rc; j++) {
                        double s = S[j], bound = R[j];
                        if (op == ZCCL_AVG) avg_scale(n, s, bound);
                        bound += out_bound(dt, std::fabs(s) + bound);
                        const double y = load(dt, rb, j);
                        if (!(std::fabs(y - s) <= bound))
                            fail(tag + " reduce_scatter op " + std::to_string(op) + ": element " + std::to_string(j) +
                                 " = " + std::to_string(y) + ", exact " + std::to_string(s) + ", bound " +
                                 std::to_string(bound));
                    }
                }
                sh->hash[cs][rank] = 0; /* each rank has its own block */
                cs++;
            }
            /* all-reduce: SUM out of place, AVG in place, and a count smaller than the rank count */
            for (int k = 0; k < 3; k++) {
                const int c = cs;
                const size_t count = k == 2 ? (size_t)n - 1 : 2001 + (size_t)n;
                const zccl_redop_t op = k == 1 ? ZCCL_AVG : ZCCL_SUM;
                std::vector<uint8_t> in = make(dt, rank, c, count), out(count * es + 1, 0xEE), flat(out.size(), 0xEE);
                const std::vector<uint8_t> orig = in;
                void *rb = k == 1 ? in.data() : out.data();
                if (zccl_allreduce_hier(in.data(), rb, count, dt, op, w, comm, NULL) != ZCCL_SUCCESS) {
                    fail(tag + " allreduce: " + zccl_get_last_error(comm));
                    return 1;
                }
                if (!H2) {
                    if (zccl_allreduce_wire(orig.data(), flat.data(), count, dt, op, w, comm, NULL) != ZCCL_SUCCESS) {
                        fail(tag + " flat allreduce: " + zccl_get_last_error(comm));
                        return 1;
                    }
                    if (memcmp(rb, flat.data(), count * es) != 0)
                        fail(tag + " allreduce (flat fallback): differs from zccl_allreduce_wire's");
                } else {
                    /* element i: chunk i / C, within it shard j / L2 of ceil(C / H), block (j % L2) / B */
                    const size_t G = (size_t)hs.G, H = (size_t)hs.H, C = (count + G - 1) / G, L2 = (C + H - 1) / H;
                    auto block_of = [&](size_t i) {
                        const size_t ch = i / C, j = i % C;
                        return (ch * H + j / L2) * (L2 / B + 2) + (j % L2) / B;
                    };
                    std::vector<double> S, R;
                    hier_bound(w, hs, n, count, [&](int q, size_t i) { return input(dt, q, c, i); }, block_of, S, R);
                    for (size_t b0 = 0; b0 < count;) {
                        size_t b1 = b0;
                        while (b1 < count && block_of(b1) == block_of(b0)) b1++;
                        const double amz = amax_of(b0, b1, [&](size_t i) { return std::fabs(S[i]) + R[i]; });
                        for (size_t i = b0; i < b1; i++) {
                            double s = S[i], bound = R[i] + qbound(w, std::fabs(S[i]) + R[i], amz);
                            if (op == ZCCL_AVG) avg_scale(n, s, bound);
                            bound += out_bound(dt, std::fabs(s) + bound);
                            const double y = load(dt, rb, i);
                            if (!(std::fabs(y - s) <= bound))
                                fail(tag + " allreduce count " + std::to_string(count) + " op " + std::to_string(op) +
                                     ": element " + std::to_string(i) + " = " + std::to_string(y) + ", exact " +
                                     std::to_string(s) + ", bound " + std::to_string(bound));
                        }
                        b0 = b1;
                    }
                }
                sh->hash[cs][rank] = fnv(rb, count * es);
                cs++;
            }
        }
    sh->ncases = cs;
    return bad ? 1 : 0;
}

struct Param {
    int n;
    Layout layout;
};

void run_matrix(const Param &p) {
    const int n = p.n;
    const size_t B = (n & 1) ? 64 : 128;
    const Hosts hs(p.layout, n);
    SharedMem mem(sizeof(Shared));
    Shared *sh = new (mem.data()) Shared();
    Options o;
    o.deadline_s = 240;
    if (n & 1) o.env.push_back({"ZCCL_QUANT_BLOCK", "64"});
    else o.env.push_back({"ZCCL_QUANT_BLOCK", std::nullopt});
    const Layout l = p.layout;
    o.rank_env = [l, n](int rank) { return EnvList{{"ZCCL_HOST_ID", "host" + std::to_string(host_of(l, rank, n))}}; };
    GroupResult g = run_ranks(
        n, [&](zccl_comm_t comm, int rank, int nr) { return run_cases(comm, rank, nr, hs, B, sh); }, o);
    if (!g.all_ok()) return;
    ASSERT_GT(sh->ncases, 0);
    for (int c = 0; c < sh->ncases; c++)
        for (int r = 1; r < n; r++)
            EXPECT_EQ(sh->hash[c][r], sh->hash[c][0]) << "case " << c << ": rank " << r << "'s output differs from "
                                                      << "rank 0's (they must be bitwise identical)";
}

}  // namespace

class QuantHier : public ::testing::TestWithParam<Param> {};

TEST_P(QuantHier, WithinTheBoundAndBitwiseEqualAcrossRanks) { run_matrix(GetParam()); }
INSTANTIATE_TEST_SUITE_P(
    Layouts, QuantHier,
    ::testing::Values(Param{2, ONE_HOST}, Param{2, TWO_CONTIG}, Param{3, UNEVEN}, Param{4, TWO_CONTIG},
                      Param{4, TWO_INTERLEAVED}, Param{5, UNEVEN}, Param{6, TWO_INTERLEAVED}, Param{6, THREE_BY_TWO},
                      Param{6, UNEVEN}, Param{7, ONE_HOST}, Param{8, TWO_CONTIG}, Param{8, FOUR_BY_TWO}),
    [](const ::testing::TestParamInfo<Param> &i) {
        return std::to_string(i.param.n) + "_" + layout_name(i.param.layout);
    });

namespace {

/* 4 ranks as 2 interleaved hosts. */
Options two_hosts(double deadline_s) {
    Options o;
    o.deadline_s = deadline_s;
    o.rank_env = [](int rank) { return EnvList{{"ZCCL_HOST_ID", rank % 2 ? "b" : "a"}}; };
    return o;
}

bool expect_refused(zccl_comm_t comm, int rank, zccl_result_t res, const char *what, const char *word) {
    const std::string msg = zccl_get_last_error(comm);
    if (res != ZCCL_INVALID_ARGUMENT || msg.find(word) == std::string::npos) {
        child_log(rank, "%s: got %d '%s', wanted ZCCL_INVALID_ARGUMENT naming %s", what, (int)res, msg.c_str(), word);
        return false;
    }
    return true;
}

/* A valid hierarchical all-reduce (SUM of i + rank over 4 ranks) and its check. */
bool valid_allreduce(zccl_comm_t comm, int rank) {
    float f[300];
    for (int i = 0; i < 300; i++) f[i] = (float)(i + rank);
    zccl_result_t res = zccl_allreduce_hier(f, f, 300, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL);
    if (res != ZCCL_SUCCESS) {
        child_log(rank, "the valid call failed: %s", zccl_get_last_error(comm));
        return false;
    }
    for (int i = 0; i < 300; i++)
        if (std::fabs(f[i] - (4.0 * i + 6.0)) > 2 * (4.0 * 303 / 254 + 1e-2)) {
            child_log(rank, "element %d = %g, exact %g", i, f[i], 4.0 * i + 6.0);
            return false;
        }
    return true;
}

bool refuse_everything(zccl_comm_t comm, int rank) {
    float f[64] = {0}, g[256] = {0};
    int32_t iv[64] = {0};
    bool ok = true;
    ok &= expect_refused(comm, rank, zccl_allreduce_hier(iv, iv, 64, ZCCL_INT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL),
                         "int32 data", "'datatype'");
    ok &= expect_refused(comm, rank,
                         zccl_reduce_scatter_hier(g, f, 16, ZCCL_FLOAT32, ZCCL_MAX, ZCCL_WIRE_INT4, comm, NULL),
                         "op max", "'op'");
    ok &= expect_refused(comm, rank, zccl_allgather_hier(f, g, 16, ZCCL_FLOAT32, (zccl_wire_t)9, comm, NULL), "wire 9",
                         "'wire'");
    ok &= expect_refused(comm, rank,
                         zccl_allreduce_hier(NULL, f, 64, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_FP8E4M3, comm, NULL),
                         "NULL sendbuf", "'sendbuf'");
    ok &= expect_refused(comm, rank, zccl_allgather_hier(f, f + 1, 16, ZCCL_FLOAT32, ZCCL_WIRE_INT8, comm, NULL),
                         "overlap", "overlap");
    ok &= expect_refused(comm, rank,
                         zccl_allgather_hier(f, g, SIZE_MAX / 16, ZCCL_FLOAT32, ZCCL_WIRE_INT8, comm, NULL),
                         "huge count", "'count'");
    zccl_group_start();
    const zccl_result_t gr = zccl_allreduce_hier(f, f, 64, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL);
    zccl_group_end();
    if (gr != ZCCL_INVALID_USAGE) {
        child_log(rank, "inside a group: got %d '%s', wanted ZCCL_INVALID_USAGE", (int)gr, zccl_get_last_error(comm));
        ok = false;
    }
    return ok;
}

}  // namespace

/* Every rank passes the same bad argument, before the layout is made (refused on comm) and after (refused on the
 * sub-communicators): every rank gets the error naming it, and the next valid call works. */
TEST(QuantHierArgs, BadArgumentsRefusedOnEveryRankAndTheCommunicatorStillWorks) {
    run_ranks(4, [](zccl_comm_t comm, int rank, int) {
        bool ok = refuse_everything(comm, rank);
        ok = ok && valid_allreduce(comm, rank);
        int hier = 0;
        ok = ok && zccl_hier_layout(comm, NULL, NULL, &hier) == ZCCL_SUCCESS && hier == 1;
        ok = ok && refuse_everything(comm, rank);
        ok = ok && valid_allreduce(comm, rank);
        /* ZCCL_WIRE_FULL: the full-precision collective (exact here) */
        float f[8];
        for (int i = 0; i < 8; i++) f[i] = (float)(i + rank);
        ok = ok && zccl_allreduce_hier(f, f, 8, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_FULL, comm, NULL) == ZCCL_SUCCESS;
        for (int i = 0; ok && i < 8; i++) ok = f[i] == (float)(4 * i + 6);
        if (!ok) child_log(rank, "failed");
        return ok ? 0 : 1;
    }, two_hosts(90));
}

/* One rank refuses (op max) while the others call validly, once as the first hierarchical call (the others are
 * making the layout) and once after it: the refusing rank gets ZCCL_INVALID_ARGUMENT, every other rank an error
 * quoting its 'op' and a communicator marked broken (zccl_comm_get_async_error); none succeeds, none hangs. */
class QuantHierOneRefuses : public ::testing::TestWithParam<bool> {};
TEST_P(QuantHierOneRefuses, EveryRankFails) {
    const bool after_setup = GetParam();
    run_ranks(4, [after_setup](zccl_comm_t comm, int rank, int) {
        if (after_setup && !valid_allreduce(comm, rank)) return 1;
        std::vector<float> f(4 * 300, 1.0f), g(300);
        const zccl_redop_t op = rank == 1 ? ZCCL_MAX : ZCCL_SUM;
        const zccl_result_t res =
            zccl_reduce_scatter_hier(f.data(), g.data(), 300, ZCCL_FLOAT32, op, ZCCL_WIRE_INT8, comm, NULL);
        const std::string msg = zccl_get_last_error(comm);
        if (rank == 1) {
            if (res == ZCCL_INVALID_ARGUMENT) return 0;
            child_log(rank, "refusing rank got %d: %s", (int)res, msg.c_str());
            return 1;
        }
        if (res == ZCCL_SUCCESS || msg.find("'op'") == std::string::npos) {
            child_log(rank, "peer of the refusing rank got %d: '%s' (wanted an error quoting rank 1's 'op')", (int)res,
                      msg.c_str());
            return 1;
        }
        zccl_result_t broken = ZCCL_SUCCESS;
        if (zccl_comm_get_async_error(comm, &broken) != ZCCL_SUCCESS || broken == ZCCL_SUCCESS) {
            child_log(rank, "the communicator is not marked broken after the failed call");
            return 1;
        }
        return 0;
    }, two_hosts(90));
}
INSTANTIATE_TEST_SUITE_P(Setup, QuantHierOneRefuses, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &i) {
                             return std::string(i.param ? "after_setup" : "first_call");
                         });

/* Over tcp, 4 ranks as 2 contiguous hosts: count-0 calls (the first of them makes the layout) succeed and move
 * nothing; a call on a zccl stream waits for that stream's queued work (a full-precision all-reduce whose result it
 * reads) and is complete when it returns. */
TEST(QuantHierArgs, CountZeroAndStreamOverTcp) {
    Options o;
    o.deadline_s = 90;
    o.env.push_back({"ZCCL_TRANSPORT", "tcp"});
    o.rank_env = [](int rank) { return EnvList{{"ZCCL_HOST_ID", rank < 2 ? "a" : "b"}}; };
    run_ranks(4, [](zccl_comm_t comm, int rank, int) {
        float f[4] = {1, 2, 3, 4};
        bool ok = zccl_allreduce_hier(f, f, 0, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL) == ZCCL_SUCCESS;
        ok = ok &&
             zccl_reduce_scatter_hier(f, f, 0, ZCCL_BFLOAT16, ZCCL_AVG, ZCCL_WIRE_INT4, comm, NULL) == ZCCL_SUCCESS;
        ok = ok && zccl_allgather_hier(f, f, 0, ZCCL_FLOAT16, ZCCL_WIRE_FP8E5M2, comm, NULL) == ZCCL_SUCCESS;
        ok = ok && f[0] == 1 && f[3] == 4;
        int hier = 0, nh = 0, ph = 0;
        ok = ok && zccl_hier_layout(comm, &nh, &ph, &hier) == ZCCL_SUCCESS && hier == 1 && nh == 2 && ph == 2;
        if (!ok) {
            child_log(rank, "count 0 or layout: %s", zccl_get_last_error(comm));
            return 1;
        }
        zccl_stream_t s = NULL;
        if (zccl_stream_create(&s) != ZCCL_SUCCESS) return 1;
        std::vector<float> v(1000), out(1000, -1.0f);
        for (int i = 0; i < 1000; i++) v[i] = (float)(i % 50) + rank;
        /* queued first: v becomes the exact sum, which the hierarchical call then reads */
        ok = zccl_allreduce(v.data(), v.data(), 1000, ZCCL_FLOAT32, ZCCL_SUM, comm, s) == ZCCL_SUCCESS &&
             zccl_allreduce_hier(v.data(), out.data(), 1000, ZCCL_FLOAT32, ZCCL_AVG, ZCCL_WIRE_INT8, comm, s) ==
                 ZCCL_SUCCESS;
        for (int i = 0; ok && i < 1000; i++) {
            const double exact = 4.0 * (i % 50) + 6.0; /* the average of four equal sums */
            /* two int8 steps of sums up to 808, over 4 (without the wait: off by 4.5 or more) */
            if (std::fabs(out[i] - exact) > 2.5) {
                child_log(rank, "element %d = %g, exact %g", i, out[i], exact);
                ok = false;
            }
        }
        if (!ok) child_log(rank, "stream call: %s", zccl_get_last_error(comm));
        zccl_stream_destroy(s);
        return ok ? 0 : 1;
    }, o);
}

/* Hierarchical all-gathers whose counts differ by less than the padding (same wire size: the steps' descriptors
 * agree): every rank fails with ZCCL_INVALID_USAGE naming the counts (each checks every string's header), and the
 * communicator still works. */
TEST(QuantHierArgs, AllgatherCountsThatDifferFailOnEveryRank) {
    Options contiguous;
    contiguous.deadline_s = 90;
    contiguous.rank_env = [](int rank) { return EnvList{{"ZCCL_HOST_ID", rank < 2 ? "a" : "b"}}; };
    run_ranks(4, [](zccl_comm_t comm, int rank, int) {
        std::vector<float> f(1002, 1.0f), g(4 * 1002, 0.0f);
        if (!valid_allreduce(comm, rank)) return 1; /* the layout is made: the steps run on the sub-communicators */
        const size_t c = rank == 2 ? 1002 : 1001;   /* int8, B = 128: both 1040 wire bytes + 16 */
        const zccl_result_t r = zccl_allgather_hier(f.data(), g.data(), c, ZCCL_FLOAT32, ZCCL_WIRE_INT8, comm, NULL);
        const std::string m = zccl_get_last_error(comm);
        /* rank 2's string is the second one gathered (local rank 0 of host 1): the message must name rank 2 */
        const char *want = rank == 2 ? "with count 1002" : "rank 2 called with count 1002";
        if (r != ZCCL_INVALID_USAGE || m.find(want) == std::string::npos) {
            child_log(rank, "got %d '%s' (wanted ZCCL_INVALID_USAGE with '%s')", (int)r, m.c_str(), want);
            return 1;
        }
        return valid_allreduce(comm, rank) ? 0 : 1;
    }, contiguous);
}

/* CUDA device memory (the fake driver's) is refused on every rank naming it, as by the _wire calls, and the
 * communicator still works. */
TEST(QuantHierArgs, DeviceMemoryRefused) {
    Options o = two_hosts(90);
    o.env.push_back({"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH});
    run_ranks(4, [](zccl_comm_t comm, int rank, int) {
        void *dev = nullptr;
        if (zccl_mem_alloc_cuda(&dev, 4096 * sizeof(float)) != ZCCL_SUCCESS) {
            child_log(rank, "zccl_mem_alloc_cuda: %s", zccl_get_last_error(comm));
            return 1;
        }
        std::vector<float> host(4096, 1.0f);
        zccl_result_t r =
            zccl_allreduce_hier(dev, host.data(), 1024, ZCCL_FLOAT32, ZCCL_SUM, ZCCL_WIRE_INT8, comm, NULL);
        bool ok = expect_refused(comm, rank, r, "device sendbuf", "device");
        r = zccl_allgather_hier(host.data(), dev, 256, ZCCL_FLOAT32, ZCCL_WIRE_INT4, comm, NULL);
        ok &= expect_refused(comm, rank, r, "device recvbuf", "device");
        ok = ok && valid_allreduce(comm, rank);
        zccl_mem_free_cuda(dev);
        return ok ? 0 : 1;
    }, o);
}

/*
 * test_zero_wire.cpp — the ZeRO building blocks over the quantized wire formats (ZeRO++'s qgZ and qwZ; the wire
 * field of zccl_bucket_options_t and zccl_zero3_options_t in include/zccl_zero.h).
 *
 * Each rank writes float32 gradients (or parameter shards) drawn from a seeded generator that every rank can
 * replay, so every rank computes the exact result in double and, from the formulas of include/zccl.h (zccl_wire_t,
 * zccl_reduce_scatter_wire, zccl_allreduce_wire, zccl_allgather_wire), the bound of each element: amax taken over
 * the element's block of B = ZCCL_QUANT_BLOCK elements counted from its shard's first element. The tests assert
 * the bound, bitwise equality across ranks where the calls promise it, padding that stays zero, and that the
 * wire really quantized (some error is a visible fraction of the bound's main term: a full-precision run fails
 * that check). Multi-process runs have deadlines.
 *
 * ZeroHpz.* (at the end): ZeRO++'s hpZ in the ZeRO-3 store (zccl_zero3_options_t.hpz) over simulated hosts
 * (ZCCL_HOST_ID per rank), with the full wire and with int8 (qwZ + hpZ).
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"
#include "zccl_zero.h"

using namespace zt;

namespace {

constexpr size_t kBlock = 32; /* ZCCL_QUANT_BLOCK in these runs: several blocks per shard */

/* The main term and the whole bound of one quantization of x in a block of magnitude amax (zccl.h). */
double main_term(zccl_wire_t w, double x, double amax) {
    switch (w) {
    case ZCCL_WIRE_INT8: return amax / 254.0;
    case ZCCL_WIRE_INT4: return amax / 14.0;
    case ZCCL_WIRE_FP8E4M3: return std::ldexp(std::fabs(x), -4) + std::ldexp(amax / 448.0, -10);
    default: return std::ldexp(std::fabs(x), -3) + std::ldexp(amax / 57344.0, -17);
    }
}
double qbound(zccl_wire_t w, double x, double amax) {
    return main_term(w, x, amax) + std::ldexp(amax, -21) + std::ldexp(1.0, -140);
}

/* A float32 gradient value, the same on every rank that replays (rank, micro-step, parameter, element): mixed
 * magnitudes so that blocks have different scales. */
float grad_value(int r, int m, int i, size_t j) {
    uint64_t h = 1469598103934665603ull ^ ((uint64_t)r << 40) ^ ((uint64_t)m << 32) ^ ((uint64_t)i << 24) ^ j;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    const double u = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
    const double scale = (i % 3 == 0) ? 1e-3 : (i % 3 == 1) ? 1.0 : 40.0;
    return (float)((u - 0.5) * scale);
}

/* Calls fn(lo, hi) for every quantization block of a vector of n elements cut in shards of `shard` elements:
 * blocks of kBlock elements counted from each shard's first element, the last one of a shard shorter. */
template <class F> void for_blocks(size_t n, size_t shard, F fn) {
    for (size_t s0 = 0; s0 < n; s0 += shard)
        for (size_t lo = s0; lo < std::min(n, s0 + shard); lo += kBlock) fn(lo, std::min({lo + kBlock, s0 + shard, n}));
}

uint64_t fnv(const void *p, size_t n, uint64_t h = 1469598103934665603ull) {
    const unsigned char *c = static_cast<const unsigned char *>(p);
    for (size_t k = 0; k < n; k++) h = (h ^ c[k]) * 1099511628211ull;
    return h;
}

/* True on every rank when h is the same on every rank (MAX of h and of ~h). */
bool same_everywhere(zccl_comm_t comm, uint64_t h) {
    uint64_t v[2] = {h, ~h}, r[2] = {0, 0};
    if (zccl_allreduce(v, r, 2, ZCCL_UINT64, ZCCL_MAX, comm, nullptr) != ZCCL_SUCCESS) return false;
    return r[0] == ~r[1];
}

const std::vector<size_t> kModel = {1000, 7, 300, 2000, 33, 999, 64, 1500, 5};

struct WireCfg {
    zccl_bucket_mode_t mode;
    zccl_wire_t wire;
    int accum;
    bool average;
};

/* One rank's run: 2 windows of cfg.accum micro-steps; after each window every element of this rank's shards (and,
 * in ALLREDUCE mode, of every bucket) is within its bound of the exact result. */
int wire_bucket_body(zccl_comm_t comm, int rank, int nranks, const WireCfg &cfg) {
    const int n = (int)kModel.size();
    zccl_bucket_options_t o = {};
    o.first_bytes = 2048;
    o.cap_bytes = 8192;
    o.mode = cfg.mode;
    o.max_in_flight = 2;
    o.average = cfg.average;
    o.wire = cfg.wire;
    zccl_bucket_plan_t plan = nullptr;
    ZT_CHILD_OK(zccl_bucket_plan_create(comm, n, kModel.data(), ZCCL_FLOAT32, &o, &plan));
    int nb = 0;
    ZT_CHILD_OK(zccl_bucket_count(plan, &nb));
    ZT_CHILD_CHECK(nb >= 3, "expected several buckets, got %d", nb);
    std::vector<int> pb((size_t)n);
    std::vector<size_t> poff((size_t)n);
    for (int i = 0; i < n; i++) ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &pb[(size_t)i], &poff[(size_t)i]));
    double worst_ratio = 0; /* largest error / main term seen: quantization must be visible */
    for (int w = 0; w < 2; w++) {
        for (int m = 0; m < cfg.accum; m++) {
            ZT_CHILD_OK(zccl_bucket_begin(plan, m == cfg.accum - 1));
            for (int i = n - 1; i >= 0; i--) {
                void *g = nullptr;
                ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, &g));
                float *d = static_cast<float *>(g);
                for (size_t j = 0; j < kModel[(size_t)i]; j++) d[j] += grad_value(rank, w * cfg.accum + m, i, j);
                ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
            }
            ZT_CHILD_OK(zccl_bucket_finish(plan));
        }
        const double div = cfg.average ? nranks : 1;
        for (int b = 0; b < nb; b++) {
            zccl_bucket_info_t I;
            ZT_CHILD_OK(zccl_bucket_info(plan, b, &I));
            /* x[q][m][e]: rank q's contribution to element e in micro-step m, as the plan sent it. ALLREDUCE mode
             * accumulates locally in float32 and communicates once, so its one contribution is that float sum. */
            const int nsend = cfg.mode == ZCCL_BUCKET_REDUCE_SCATTER ? cfg.accum : 1;
            std::vector<std::vector<std::vector<double>>> x(
                (size_t)nranks, std::vector<std::vector<double>>((size_t)nsend, std::vector<double>(I.elems, 0.0)));
            std::vector<char> is_param(I.elems, 0); /* the rest is alignment padding and gaps: zero, exactly */
            for (int k = 0; k < I.nparams; k++) {
                const int i = I.first_param - k;
                for (size_t j = 0; j < kModel[(size_t)i]; j++) is_param[poff[(size_t)i] + j] = 1;
            }
            for (int q = 0; q < nranks; q++)
                for (int k = 0; k < I.nparams; k++) {
                    const int i = I.first_param - k;
                    for (size_t j = 0; j < kModel[(size_t)i]; j++) {
                        float local = 0;
                        for (int m = 0; m < cfg.accum; m++) {
                            const float g = grad_value(q, w * cfg.accum + m, i, j);
                            if (nsend > 1) x[(size_t)q][(size_t)m][poff[(size_t)i] + j] = g;
                            else local += g;
                        }
                        if (nsend == 1) x[(size_t)q][0][poff[(size_t)i] + j] = local;
                    }
                }
            /* Per micro-step sent: the exact sum S and the reduce-scatter bound R of each element (blocks from the
             * start of each shard). */
            std::vector<double> exact(I.elems, 0.0), bound(I.elems, 0.0);
            for (int m = 0; m < nsend; m++) {
                std::vector<double> S(I.elems, 0.0), R(I.elems, 0.0);
                for (int q = 0; q < nranks; q++) {
                    const std::vector<double> &v = x[(size_t)q][(size_t)m];
                    for_blocks(I.elems, I.shard_elems, [&](size_t lo, size_t hi) {
                        double amax = 0;
                        for (size_t e = lo; e < hi; e++) amax = std::max(amax, std::fabs(v[e]));
                        for (size_t e = lo; e < hi; e++) {
                            const double E = qbound(cfg.wire, v[e], amax);
                            S[e] += v[e];
                            R[e] += E + (nranks - 1) * std::ldexp(std::fabs(v[e]) + E, -24);
                        }
                    });
                }
                for (size_t e = 0; e < I.elems; e++) {
                    S[e] /= div;
                    R[e] = R[e] / div + (cfg.average ? std::ldexp(std::fabs(S[e]), -24) : 0);
                    /* accumulating the micro-steps' shards in float32 rounds each partial sum once */
                    const double acc_round = m > 0 ? std::ldexp(std::fabs(exact[e] + S[e]) + bound[e] + R[e], -24) : 0;
                    exact[e] += S[e];
                    bound[e] += R[e] + acc_round;
                }
            }
            if (cfg.mode == ZCCL_BUCKET_ALLREDUCE) { /* the owners' results requantized for the all-gather */
                for_blocks(I.elems, I.shard_elems, [&](size_t lo, size_t hi) {
                    double amax = 0;
                    for (size_t e = lo; e < hi; e++) amax = std::max(amax, std::fabs(exact[e]) + bound[e]);
                    for (size_t e = lo; e < hi; e++) bound[e] += qbound(cfg.wire, std::fabs(exact[e]) + bound[e], amax);
                });
            }
            auto check = [&](const float *got, size_t first, size_t count, const char *what) -> int {
                for (size_t k = 0; k < count; k++) {
                    const size_t e = first + k;
                    const double err = std::fabs((double)got[k] - exact[e]);
                    ZT_CHILD_CHECK(err <= bound[e], "window %d bucket %d %s element %zu: %.9g, exact %.9g, error %.3g > "
                                   "bound %.3g", w, b, what, e, (double)got[k], exact[e], err, bound[e]);
                    if (!is_param[e])
                        ZT_CHILD_CHECK(got[k] == 0.0f, "window %d bucket %d padding element %zu is %g, not 0", w, b, e,
                                       (double)got[k]);
                    if (bound[e] > 0) worst_ratio = std::max(worst_ratio, err / bound[e]);
                }
                return 0;
            };
            if (check(static_cast<const float *>(I.shard), I.shard_offset, I.shard_elems, "shard")) return 1;
            if (cfg.mode == ZCCL_BUCKET_ALLREDUCE) {
                if (check(static_cast<const float *>(I.buffer), 0, I.elems, "all-reduced")) return 1;
                ZT_CHILD_CHECK(same_everywhere(comm, fnv(I.buffer, I.elems * sizeof(float))),
                               "window %d bucket %d: the all-reduced bucket differs between ranks", w, b);
            }
        }
    }
    /* A run that did not quantize (the full-precision wire) has errors of float rounding only, far below 5% of
     * the quantization bound. */
    ZT_CHILD_CHECK(worst_ratio > 0.05, "largest error is %.3g of its bound: was the gradient quantized at all?",
                   worst_ratio);
    if (rank == 0) child_log(rank, "%s: largest error %.3f of its bound", zccl_wire_name(cfg.wire), worst_ratio);
    zccl_bucket_plan_destroy(plan);
    return 0;
}

Options wire_options(double deadline) {
    Options o = deadline_options(deadline);
    o.env = {{"ZCCL_QUANT_BLOCK", std::to_string(kBlock)}};
    return o;
}

} // namespace

TEST(ZeroWire, BucketReduceScatterQgzWithinBoundOverMicroSteps) {
    for (zccl_wire_t w : {ZCCL_WIRE_INT4, ZCCL_WIRE_INT8, ZCCL_WIRE_FP8E4M3}) {
        SCOPED_TRACE(zccl_wire_name(w));
        WireCfg c{ZCCL_BUCKET_REDUCE_SCATTER, w, 2, w == ZCCL_WIRE_INT8};
        run_ranks(3, [&](zccl_comm_t comm, int r, int n) { return wire_bucket_body(comm, r, n, c); },
                  wire_options(90));
    }
}

TEST(ZeroWire, BucketAllReduceWithinBoundAndBitwiseEqualAcrossRanks) {
    for (zccl_wire_t w : {ZCCL_WIRE_INT8, ZCCL_WIRE_FP8E5M2}) {
        SCOPED_TRACE(zccl_wire_name(w));
        WireCfg c{ZCCL_BUCKET_ALLREDUCE, w, 2, w == ZCCL_WIRE_FP8E5M2};
        run_ranks(4, [&](zccl_comm_t comm, int r, int n) { return wire_bucket_body(comm, r, n, c); },
                  wire_options(90));
    }
}

/* The bound check is sharp enough to notice a full-precision wire: the run above fails its "quantized at all"
 * check when the wire is ZCCL_WIRE_FULL (so the quantized tests cannot pass by not quantizing). */
TEST(ZeroWire, FullWireIsNotMistakenForQuantized) {
    WireCfg c{ZCCL_BUCKET_REDUCE_SCATTER, ZCCL_WIRE_FULL, 1, false};
    Options o = wire_options(60);
    o.expect_success = false;
    GroupResult res = run_ranks(2, [&](zccl_comm_t comm, int r, int n) { return wire_bucket_body(comm, r, n, c); }, o);
    EXPECT_FALSE(res.all_ok()) << "a full-precision plan passed the quantization check";
    EXPECT_FALSE(res.deadline_exceeded);
    EXPECT_NE(res.report().find("was the gradient quantized at all"), std::string::npos) << res.report();
}

TEST(ZeroWire, BadWireIsRefusedNamingIt) {
    std::vector<size_t> numel = {100, 200};
    zccl_bucket_plan_t plan = nullptr;
    zccl_bucket_options_t o = {};
    o.wire = (zccl_wire_t)9;
    EXPECT_EQ(zccl_bucket_layout_create(2, 2, numel.data(), ZCCL_FLOAT32, &o, &plan), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("opts->wire"), std::string::npos);
    EXPECT_EQ(plan, nullptr);
    o.wire = ZCCL_WIRE_INT8;
    for (zccl_datatype_t dt : {ZCCL_FLOAT32, ZCCL_FLOAT64, ZCCL_FLOAT16, ZCCL_BFLOAT16}) {
        ASSERT_EQ(zccl_bucket_layout_create(2, 2, numel.data(), dt, &o, &plan), ZCCL_SUCCESS) << (int)dt;
        zccl_bucket_plan_destroy(plan);
    }
}

TEST(ZeroWire, RanksWithDifferentWiresFailAtCreationOnEveryRank) {
    run_ranks(3, [](zccl_comm_t comm, int rank, int) -> int {
        std::vector<size_t> numel = {100, 200, 300};
        zccl_bucket_options_t o = {};
        o.wire = rank == 1 ? ZCCL_WIRE_INT4 : ZCCL_WIRE_INT8;
        zccl_bucket_plan_t plan = nullptr;
        zccl_result_t r = zccl_bucket_plan_create(comm, 3, numel.data(), ZCCL_FLOAT32, &o, &plan);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && plan == nullptr, "plan_create returned %s, want invalid usage",
                       zccl_get_error_string(r));
        zccl_zero3_options_t zo = {};
        zo.wire = rank == 2 ? ZCCL_WIRE_FULL : ZCCL_WIRE_INT8;
        zccl_zero3_t z = nullptr;
        r = zccl_zero3_create(comm, 3, numel.data(), ZCCL_FLOAT32, &zo, &z);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && z == nullptr, "zero3_create returned %s, want invalid usage",
                       zccl_get_error_string(r));
        ZT_CHILD_CHECK(std::string(zccl_get_last_error(nullptr)).find("wires") != std::string::npos, "message: %s",
                       zccl_get_last_error(nullptr));
        return 0;
    }, deadline_options(60));
}

/* qwZ: a ZeRO-3 store gathering int8 (and fp8) shards. Every gathered layer is within one quantization of the
 * shards every rank wrote, bitwise the same on every rank, this rank's own shard included (it is decoded too),
 * while the shard the store keeps stays exact. */
TEST(ZeroWire, Zero3QwzGatherWithinOneQuantizationAndBitwiseEqual) {
    const std::vector<size_t> layers = {1000, 4003, 17, 2500};
    for (zccl_wire_t w : {ZCCL_WIRE_INT8, ZCCL_WIRE_FP8E4M3}) {
        SCOPED_TRACE(zccl_wire_name(w));
        run_ranks(3, [&](zccl_comm_t comm, int rank, int nranks) -> int {
            zccl_comm_t comm3 = nullptr;
            ZT_CHILD_OK(zccl_comm_shrink(comm, nullptr, 0, &comm3));
            zccl_zero3_options_t o = {};
            o.wire = w;
            zccl_zero3_t z = nullptr;
            ZT_CHILD_OK(zccl_zero3_create(comm3, (int)layers.size(), layers.data(), ZCCL_FLOAT32, &o, &z));
            const int L = (int)layers.size();
            auto value = [](int l, size_t idx) { return grad_value(7, l, (int)(idx / 200), idx); };
            for (int l = 0; l < L; l++) {
                void *s;
                size_t cnt, off;
                ZT_CHILD_OK(zccl_zero3_shard(z, l, &s, &cnt, &off));
                for (size_t e = 0; e < cnt; e++) static_cast<float *>(s)[e] = value(l, off + e);
            }
            double worst = 0;
            for (int step = 1; step <= 2; step++) {
                ZT_CHILD_OK(zccl_zero3_begin(z));
                for (int l = 0; l < L; l++) {
                    void *full;
                    ZT_CHILD_OK(zccl_zero3_fetch(z, l, &full));
                    const float *p = static_cast<const float *>(full);
                    const size_t P = (layers[(size_t)l] + (size_t)nranks - 1) / (size_t)nranks;
                    int bad = 0;
                    for_blocks(P * (size_t)nranks, P, [&](size_t lo, size_t hi) {
                            if (bad) return;
                            double amax = 0;
                            for (size_t e = lo; e < hi; e++) amax = std::max(amax, std::fabs((double)value(l, e)));
                            for (size_t e = lo; e < hi; e++) {
                                const double x = value(l, e), err = std::fabs((double)p[e] - x), bd = qbound(w, x, amax);
                                if (!(err <= bd)) {
                                    child_log(rank, "step %d layer %d element %zu: %.9g, want %.9g within %.3g", step, l,
                                              e, (double)p[e], x, bd);
                                    bad = 1;
                                    return;
                                }
                                worst = std::max(worst, err / bd);
                            }
                        });
                    if (bad) return 1;
                    ZT_CHILD_CHECK(same_everywhere(comm, fnv(full, P * (size_t)nranks * sizeof(float))),
                                   "step %d layer %d: the gathered layer differs between ranks", step, l);
                    ZT_CHILD_OK(zccl_zero3_release(z, l));
                }
                ZT_CHILD_OK(zccl_zero3_end(z));
            }
            for (int l = 0; l < L; l++) { /* the kept shards are untouched */
                void *s;
                size_t cnt, off;
                ZT_CHILD_OK(zccl_zero3_shard(z, l, &s, &cnt, &off));
                for (size_t e = 0; e < cnt; e++)
                    ZT_CHILD_CHECK(static_cast<float *>(s)[e] == value(l, off + e), "layer %d shard element %zu changed",
                                   l, e);
            }
            ZT_CHILD_CHECK(worst > 0.05, "largest error %.3g of its bound: were the parameters quantized?", worst);
            zccl_zero3_destroy(z);
            zccl_comm_destroy(comm3);
            return 0;
        }, wire_options(90));
    }
}

TEST(ZeroWire, Zero3BadWireIsRefused) {
    run_ranks(1, [](zccl_comm_t comm, int rank, int) -> int {
        std::vector<size_t> numel = {10};
        zccl_zero3_options_t o = {};
        o.wire = ZCCL_WIRE_INT8;
        zccl_zero3_t z = nullptr;
        zccl_result_t r = zccl_zero3_create(comm, 1, numel.data(), ZCCL_INT32, &o, &z);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT, "int32 with int8 wire: %s", zccl_get_error_string(r));
        ZT_CHILD_CHECK(std::string(zccl_get_last_error(nullptr)).find("opts->wire") != std::string::npos, "message: %s",
                       zccl_get_last_error(nullptr));
        o.wire = (zccl_wire_t)-1;
        r = zccl_zero3_create(comm, 1, numel.data(), ZCCL_FLOAT32, &o, &z);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT, "wire -1: %s", zccl_get_error_string(r));
        return 0;
    }, deadline_options(30));
}

/* ---- hpZ: hierarchical partitioning of a ZeRO-3 store (zccl_zero3_options_t.hpz) -------------------------------
 *
 * Hosts are simulated with ZCCL_HOST_ID per rank. Each step writes new shards (drawn from the step number), then
 * fetches layers 0..L-1 (forward) and L-1..0 (backward). Full wire: every fetch, forward and backward, is exactly
 * the concatenation of the shards. Quantized wire: the forward copy is within one quantization of it, and the
 * backward copy (gathered inside the host from the secondary partition) is bitwise the forward copy. Both: bitwise
 * equal on every rank; per step exactly L gathers cross the whole communicator and L are served inside the host. */

namespace {

struct HpzCfg {
    int nranks, nhosts;
    bool interleaved; /* host of rank r: r % nhosts (else r / (nranks / nhosts), contiguous) */
    zccl_wire_t wire;
    int passes = 2; /* forward, backward; 3: forward again after (the layer's third position in the step) */
};

std::string hpz_host(const HpzCfg &c, int rank) {
    const int h = c.interleaved ? rank % c.nhosts : rank / (c.nranks / c.nhosts);
    return std::string("host") + (char)('A' + h);
}

Options hpz_options(const HpzCfg &c, double deadline) {
    Options o = wire_options(deadline);
    o.rank_env = [c](int rank) { return EnvList{{"ZCCL_HOST_ID", hpz_host(c, rank)}}; };
    return o;
}

const std::vector<size_t> kHpzLayers = {1000, 4003, 17, 2500, 64};

float hpz_value(int step, int l, size_t idx) { return grad_value(step, l, (int)(idx / 200), idx); }

int hpz_body(zccl_comm_t comm, int rank, int nranks, const HpzCfg &c) {
    zccl_comm_t comm3 = nullptr;
    ZT_CHILD_OK(zccl_comm_shrink(comm, nullptr, 0, &comm3));
    const int L = (int)kHpzLayers.size();
    size_t largest = 0;
    for (size_t n : kHpzLayers) largest = std::max(largest, (n + (size_t)nranks - 1) / (size_t)nranks * (size_t)nranks * 4);
    zccl_zero3_options_t o = {};
    o.wire = c.wire;
    o.hpz = 1;
    o.max_live_bytes = largest * 5 / 2; /* prefetch runs, and pauses at the bound */
    zccl_zero3_t z = nullptr;
    ZT_CHILD_OK(zccl_zero3_create(comm3, L, kHpzLayers.data(), ZCCL_FLOAT32, &o, &z));
    const bool active = c.nhosts > 1; /* one host: the store runs without hpZ */
    std::vector<std::vector<float>> fwd((size_t)L);
    uint64_t prev_g = 0, prev_h = 0, prev_hier = 0;
    double worst = 0;
    for (int step = 1; step <= 3; step++) {
        for (int l = 0; l < L; l++) { /* new shards every step (an optimizer step) */
            void *s;
            size_t cnt, off;
            ZT_CHILD_OK(zccl_zero3_shard(z, l, &s, &cnt, &off));
            for (size_t e = 0; e < cnt; e++) static_cast<float *>(s)[e] = hpz_value(step, l, off + e);
        }
        ZT_CHILD_OK(zccl_zero3_begin(z));
        for (int pass = 0; pass < c.passes; pass++)
            for (int k = 0; k < L; k++) {
                const int l = pass == 1 ? L - 1 - k : k;
                const size_t P = (kHpzLayers[(size_t)l] + (size_t)nranks - 1) / (size_t)nranks, padded = P * (size_t)nranks;
                void *full;
                ZT_CHILD_OK(zccl_zero3_fetch(z, l, &full));
                const float *p = static_cast<const float *>(full);
                if (c.wire == ZCCL_WIRE_FULL) {
                    for (size_t e = 0; e < padded; e++)
                        ZT_CHILD_CHECK(p[e] == hpz_value(step, l, e), "step %d %s layer %d element %zu: %.9g, want the "
                                       "shards' %.9g", step, pass == 0 ? "forward" : pass == 1 ? "backward" : "second forward", l, e, (double)p[e],
                                       (double)hpz_value(step, l, e));
                } else if (pass == 0) {
                    int bad = 0;
                    for_blocks(padded, P, [&](size_t lo, size_t hi) {
                        if (bad) return;
                        double amax = 0;
                        for (size_t e = lo; e < hi; e++) amax = std::max(amax, std::fabs((double)hpz_value(step, l, e)));
                        for (size_t e = lo; e < hi; e++) {
                            const double x = hpz_value(step, l, e), err = std::fabs((double)p[e] - x);
                            const double bd = qbound(c.wire, x, amax);
                            if (!(err <= bd)) {
                                child_log(rank, "step %d forward layer %d element %zu: %.9g, want %.9g within %.3g",
                                          step, l, e, (double)p[e], x, bd);
                                bad = 1;
                                return;
                            }
                            worst = std::max(worst, err / bd);
                        }
                    });
                    if (bad) return 1;
                }
                if (pass == 0) {
                    fwd[(size_t)l].assign(p, p + padded);
                } else if (std::memcmp(p, fwd[(size_t)l].data(), padded * sizeof(float)) != 0) {
                    size_t e = 0;
                    while (std::memcmp(&p[e], &fwd[(size_t)l][e], sizeof(float)) == 0) e++;
                    child_log(rank, "step %d layer %d: the backward copy differs from the forward copy at element %zu: "
                              "%.9g, forward %.9g (want bitwise equal)", step, l, e, (double)p[e],
                              (double)fwd[(size_t)l][e]);
                    return 1;
                }
                ZT_CHILD_CHECK(same_everywhere(comm, fnv(full, padded * sizeof(float))),
                               "step %d %s layer %d: the gathered layer differs between ranks", step,
                               pass == 0 ? "forward" : pass == 1 ? "backward" : "second forward", l);
                ZT_CHILD_OK(zccl_zero3_release(z, l));
            }
        ZT_CHILD_OK(zccl_zero3_end(z));
        zccl_zero3_stats_t st;
        ZT_CHILD_OK(zccl_zero3_stats(z, &st));
        const uint64_t g = st.gathers - prev_g, h = st.hpz_gathers - prev_h;
        const uint64_t all = (uint64_t)c.passes * (uint64_t)L, want_h = active ? all - (uint64_t)L : 0;
        ZT_CHILD_CHECK(h == want_h && g - h == all - want_h, "step %d: %llu gathers, %llu of them inside the host "
                       "(hpZ), want %llu across all ranks and %llu inside the host", step, (unsigned long long)g,
                       (unsigned long long)h, (unsigned long long)(all - want_h), (unsigned long long)want_h);
        /* With a quantized wire and several ranks per host the primary gathers are zccl_allgather_hier: one per
         * layer and step, and their output is bitwise zccl_allgather_wire's of the same shards (computed here on
         * the harness's communicator, the store idle). */
        const bool hier = active && c.wire != ZCCL_WIRE_FULL && nranks / c.nhosts > 1;
        ZT_CHILD_CHECK(st.hier_gathers - prev_hier == (hier ? (uint64_t)L : 0), "step %d: %llu primary gathers "
                       "through zccl_allgather_hier, want %d", step, (unsigned long long)(st.hier_gathers - prev_hier),
                       hier ? L : 0);
        prev_hier = st.hier_gathers;
        for (int l = 0; l < L && c.wire != ZCCL_WIRE_FULL; l++) {
            const size_t P = (kHpzLayers[(size_t)l] + (size_t)nranks - 1) / (size_t)nranks;
            void *s;
            size_t cnt, off;
            ZT_CHILD_OK(zccl_zero3_shard(z, l, &s, &cnt, &off));
            std::vector<float> mine(P, 0.0f), flat(P * (size_t)nranks, -1.0f);
            std::memcpy(mine.data(), s, std::min(cnt, P) * sizeof(float));
            ZT_CHILD_OK(zccl_allgather_wire(mine.data(), flat.data(), P, ZCCL_FLOAT32, c.wire, comm, nullptr));
            ZT_CHILD_CHECK(std::memcmp(flat.data(), fwd[(size_t)l].data(), flat.size() * sizeof(float)) == 0,
                           "step %d layer %d: the store's forward gather differs from zccl_allgather_wire's output",
                           step, l);
        }
        prev_g = st.gathers;
        prev_h = st.hpz_gathers;
    }
    zccl_zero3_stats_t st;
    ZT_CHILD_OK(zccl_zero3_stats(z, &st));
    ZT_CHILD_CHECK(st.peak_live_bytes <= o.max_live_bytes, "peak live %zu > limit %zu", st.peak_live_bytes,
                   o.max_live_bytes);
    ZT_CHILD_CHECK(st.live_bytes == 0, "live bytes %zu after the steps", st.live_bytes);
    /* Steps 2-3 prefetch along the recording (pausing only where a backward position waits for its forward one). */
    ZT_CHILD_CHECK(st.prefetched >= 2u * ((uint64_t)c.passes * (uint64_t)L - 2u), "prefetch hits %llu",
                   (unsigned long long)st.prefetched);
    if (c.wire != ZCCL_WIRE_FULL)
        ZT_CHILD_CHECK(worst > 0.05, "largest error %.3g of its bound: were the parameters quantized?", worst);
    if (rank == 0)
        child_log(rank, "%d ranks on %d hosts, %s: gathers %llu (%llu inside the host, %llu through zccl_allgather_hier), "
                  "prefetched %llu, peak live %zu of %zu", nranks, c.nhosts, zccl_wire_name(c.wire),
                  (unsigned long long)st.gathers, (unsigned long long)st.hpz_gathers,
                  (unsigned long long)st.hier_gathers, (unsigned long long)st.prefetched, st.peak_live_bytes,
                  o.max_live_bytes);
    zccl_zero3_destroy(z);
    zccl_comm_destroy(comm3);
    return 0;
}

} // namespace

TEST(ZeroHpz, TwoHostsOfTwoFullWireEveryFetchIsTheShards) {
    HpzCfg c{4, 2, true, ZCCL_WIRE_FULL};
    run_ranks(c.nranks, [&](zccl_comm_t comm, int r, int n) { return hpz_body(comm, r, n, c); }, hpz_options(c, 120));
}

TEST(ZeroHpz, TwoHostsOfTwoInt8BackwardBitwiseForward) {
    HpzCfg c{4, 2, true, ZCCL_WIRE_INT8};
    run_ranks(c.nranks, [&](zccl_comm_t comm, int r, int n) { return hpz_body(comm, r, n, c); }, hpz_options(c, 120));
}

TEST(ZeroHpz, SixRanksAsTwoHostsOfThreeAndThreeHostsOfTwo) {
    for (HpzCfg c : {HpzCfg{6, 2, false, ZCCL_WIRE_FULL}, HpzCfg{6, 3, true, ZCCL_WIRE_FULL},
                     HpzCfg{6, 2, false, ZCCL_WIRE_INT8}, HpzCfg{6, 3, true, ZCCL_WIRE_INT8}}) {
        SCOPED_TRACE(std::to_string(c.nhosts) + " hosts, " + zccl_wire_name(c.wire));
        run_ranks(c.nranks, [&](zccl_comm_t comm, int r, int n) { return hpz_body(comm, r, n, c); },
                  hpz_options(c, 150));
    }
}

/* A layer fetched three times a step (forward, backward, forward again): both later positions gather inside the
 * host from the one slice of the first, bitwise the first copy. */
TEST(ZeroHpz, ThirdFetchOfALayerAlsoStaysInTheHost) {
    HpzCfg c{4, 2, false, ZCCL_WIRE_INT8, 3};
    run_ranks(c.nranks, [&](zccl_comm_t comm, int r, int n) { return hpz_body(comm, r, n, c); }, hpz_options(c, 120));
}

/* One rank per host: the secondary partition is the whole layer, the backward fetch a local copy. */
TEST(ZeroHpz, OneRankPerHostCopiesLocally) {
    for (zccl_wire_t w : {ZCCL_WIRE_FULL, ZCCL_WIRE_INT8}) {
        HpzCfg c{3, 3, true, w};
        SCOPED_TRACE(zccl_wire_name(w));
        run_ranks(c.nranks, [&](zccl_comm_t comm, int r, int n) { return hpz_body(comm, r, n, c); },
                  hpz_options(c, 120));
    }
}

/* One host: hpZ has nothing to save; the store runs as without it (every fetch gathers, none inside the host). */
TEST(ZeroHpz, OneHostRunsWithoutIt) {
    HpzCfg c{3, 1, false, ZCCL_WIRE_FULL};
    run_ranks(c.nranks, [&](zccl_comm_t comm, int r, int n) { return hpz_body(comm, r, n, c); }, hpz_options(c, 120));
}

TEST(ZeroHpz, UnequalHostsAreRefusedOnEveryRank) {
    Options o = deadline_options(60);
    o.rank_env = [](int rank) { return EnvList{{"ZCCL_HOST_ID", rank == 2 ? "hostB" : "hostA"}}; };
    run_ranks(3, [](zccl_comm_t comm, int rank, int) -> int {
        zccl_zero3_options_t zo = {};
        zo.hpz = 1;
        zccl_zero3_t z = nullptr;
        zccl_result_t r = zccl_zero3_create(comm, (int)kHpzLayers.size(), kHpzLayers.data(), ZCCL_FLOAT32, &zo, &z);
        const std::string msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT && z == nullptr, "create returned %s: %s", zccl_get_error_string(r),
                       msg.c_str());
        ZT_CHILD_CHECK(msg.find("opts->hpz needs hosts of equal size") != std::string::npos &&
                           msg.find("3 ranks are on 2 hosts of unequal sizes (host 0: 2, host 1: 1 ranks") !=
                               std::string::npos,
                       "message: %s", msg.c_str());
        /* the communicator still works: without hpZ the same store is made */
        zo.hpz = 0;
        ZT_CHILD_OK(zccl_zero3_create(comm, (int)kHpzLayers.size(), kHpzLayers.data(), ZCCL_FLOAT32, &zo, &z));
        zccl_zero3_destroy(z);
        (void)rank;
        return 0;
    }, o);
}

TEST(ZeroHpz, BadOrDifferentHpzIsRefused) {
    Options o = deadline_options(60);
    o.rank_env = [](int rank) { return EnvList{{"ZCCL_HOST_ID", rank % 2 ? "hostB" : "hostA"}}; };
    run_ranks(4, [](zccl_comm_t comm, int rank, int) -> int {
        zccl_zero3_options_t zo = {};
        zccl_zero3_t z = nullptr;
        if (rank == 0) { /* refused before anything collective, on the rank that passed it */
            zo.hpz = 2;
            zccl_result_t r = zccl_zero3_create(comm, 1, kHpzLayers.data(), ZCCL_FLOAT32, &zo, &z);
            ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT && z == nullptr, "hpz = 2: %s", zccl_get_error_string(r));
            ZT_CHILD_CHECK(std::string(zccl_get_last_error(nullptr)).find("opts->hpz = 2 must be 0") != std::string::npos,
                           "message: %s", zccl_get_last_error(nullptr));
        }
        zo.hpz = rank == 3 ? 0 : 1;
        zccl_result_t r = zccl_zero3_create(comm, (int)kHpzLayers.size(), kHpzLayers.data(), ZCCL_FLOAT32, &zo, &z);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && z == nullptr, "ranks with different hpz: %s",
                       zccl_get_error_string(r));
        ZT_CHILD_CHECK(std::string(zccl_get_last_error(nullptr)).find("hpz") != std::string::npos, "message: %s",
                       zccl_get_last_error(nullptr));
        return 0;
    }, o);
}

/* ---- error feedback for quantized gradient buckets (zccl_bucket_options_t.error_feedback) ----------------------
 *
 * ZeroWireEf.RunningSumStaysWithinOneQuantization: the mechanism's promise. Every rank sends the same (constant)
 * gradient every step with int4; after k steps the sum of the k reduced shards differs from k x the exact sum by
 * the ranks' last residuals only (each within one int4 quantization of its block) plus float32 rounding, for every
 * k up to K, while the same plan without error feedback is off by k times the same quantization error: its error at
 * K is asserted to be at least K/4 times the error feedback bound somewhere.
 * ZeroWireEf.ResidualIsSentMinusItsQuantization: the residual read back (zccl_bucket_ef_residual) is bitwise
 * g' - Q(g') with g' = this launch's bucket data + the previous residual (rounded to float32) and Q computed here
 * with quant/'s encoder and decoder over this test's own shard layout (blocks of kBlock from each shard's first
 * element), in both modes, over micro-steps and windows. */

#include "quant.h"

namespace {

/* Q(x) of one rank's contribution: shards of `shard` elements, blocks of kBlock from each shard's start, float32. */
std::vector<float> test_quantize(zccl_wire_t w, const std::vector<float> &x, size_t shard) {
    std::vector<float> q(x.size(), 0.0f);
    std::vector<uint8_t> str(zccl__quant_bytes(w, shard, kBlock) + 8);
    for (size_t s0 = 0; s0 < x.size(); s0 += shard) {
        const size_t c = std::min(shard, x.size() - s0);
        zccl__quant_encode(w, x.data() + s0, ZCCL_FLOAT32, c, kBlock, str.data());
        zccl__quant_decode(w, str.data(), c, kBlock, q.data() + s0, ZCCL_FLOAT32);
    }
    return q;
}

/* One bucket's content as this test wrote it: value(i, j) at each parameter's offset, zero elsewhere. */
template <class V> std::vector<float> bucket_image(const zccl_bucket_info_t &I, const std::vector<size_t> &poff, V value) {
    std::vector<float> g(I.elems, 0.0f);
    for (int k = 0; k < I.nparams; k++) {
        const int i = I.first_param - k;
        for (size_t j = 0; j < kModel[(size_t)i]; j++) g[poff[(size_t)i] + j] = value(i, j);
    }
    return g;
}

zccl_bucket_plan_t ef_plan(zccl_comm_t comm, zccl_bucket_mode_t mode, zccl_wire_t w, int ef) {
    zccl_bucket_options_t o = {};
    o.first_bytes = 2048;
    o.cap_bytes = 8192;
    o.mode = mode;
    o.max_in_flight = 2;
    o.wire = w;
    o.error_feedback = ef;
    zccl_bucket_plan_t plan = nullptr;
    if (zccl_bucket_plan_create(comm, (int)kModel.size(), kModel.data(), ZCCL_FLOAT32, &o, &plan) != ZCCL_SUCCESS)
        return nullptr;
    return plan;
}

/* One micro-step: every parameter's gradient += value(i, j), marked in backward order. */
template <class V> int ef_microstep(zccl_bucket_plan_t plan, int rank, bool sync, V value) {
    ZT_CHILD_OK(zccl_bucket_begin(plan, sync));
    for (int i = (int)kModel.size() - 1; i >= 0; i--) {
        void *g = nullptr;
        ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, &g));
        float *d = static_cast<float *>(g);
        for (size_t j = 0; j < kModel[(size_t)i]; j++) d[j] += value(i, j);
        ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
    }
    ZT_CHILD_OK(zccl_bucket_finish(plan));
    return 0;
}

int ef_running_sum_body(zccl_comm_t comm, int rank, int nranks) {
    constexpr int K = 24;
    const zccl_wire_t w = ZCCL_WIRE_INT4;
    double worst_ef = 0, worst_noef = 0; /* largest error / error feedback bound, at K */
    for (int ef = 1; ef >= 0; ef--) {
        zccl_bucket_plan_t plan = ef_plan(comm, ZCCL_BUCKET_REDUCE_SCATTER, w, ef);
        ZT_CHILD_CHECK(plan != nullptr, "plan_create (error_feedback %d): %s", ef, zccl_get_last_error(nullptr));
        int nb = 0;
        ZT_CHILD_OK(zccl_bucket_count(plan, &nb));
        std::vector<size_t> poff(kModel.size());
        std::vector<int> pb(kModel.size());
        for (int i = 0; i < (int)kModel.size(); i++)
            ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &pb[(size_t)i], &poff[(size_t)i]));
        /* Per bucket, per element of this rank's shard: the exact sum of one step, and the bound of what error
         * feedback leaves after any number of steps k (without the k-proportional float32 term, added below). */
        std::vector<zccl_bucket_info_t> info((size_t)nb);
        std::vector<std::vector<double>> exact((size_t)nb), resid_bd((size_t)nb), round_bd((size_t)nb), run((size_t)nb);
        for (int b = 0; b < nb; b++) {
            ZT_CHILD_OK(zccl_bucket_info(plan, b, &info[(size_t)b]));
            const zccl_bucket_info_t &I = info[(size_t)b];
            exact[(size_t)b].assign(I.shard_elems, 0.0);
            resid_bd[(size_t)b].assign(I.shard_elems, 1e-30);
            round_bd[(size_t)b].assign(I.shard_elems, 0.0);
            run[(size_t)b].assign(I.shard_elems, 0.0);
            for (int q = 0; q < nranks; q++) {
                const std::vector<float> g = bucket_image(I, poff, [&](int i, size_t j) { return grad_value(q, 0, i, j); });
                for_blocks(I.elems, I.shard_elems, [&](size_t lo, size_t hi) {
                    double amax = 0;
                    for (size_t e = lo; e < hi; e++) amax = std::max(amax, std::fabs((double)g[e]));
                    for (size_t e = lo; e < hi; e++) {
                        if (e < I.shard_offset || e >= I.shard_offset + I.shard_elems) continue;
                        const size_t k = e - I.shard_offset;
                        exact[(size_t)b][k] += g[e];
                        /* |e_q| <= (amax + max|e_q|)(1/14 + 2^-21): at most amax/13 (1 + 2^-18) */
                        resid_bd[(size_t)b][k] += amax / 13.0 * (1 + std::ldexp(1.0, -18)) + std::ldexp(1.0, -140);
                        /* per step: g' rounded to float32, the owner's float32 sum of nranks values */
                        round_bd[(size_t)b][k] += (nranks + 2) * std::ldexp(std::fabs((double)g[e]) + amax, -24);
                    }
                });
            }
        }
        for (int k = 1; k <= K; k++) {
            if (ef_microstep(plan, rank, true, [&](int i, size_t j) { return grad_value(rank, 0, i, j); })) return 1;
            for (int b = 0; b < nb; b++) {
                const zccl_bucket_info_t &I = info[(size_t)b];
                const float *sh = static_cast<const float *>(I.shard);
                for (size_t e = 0; e < I.shard_elems; e++) {
                    run[(size_t)b][e] += sh[e];
                    const double err = std::fabs(run[(size_t)b][e] - k * exact[(size_t)b][e]);
                    const double bd = resid_bd[(size_t)b][e] + k * round_bd[(size_t)b][e];
                    if (ef)
                        ZT_CHILD_CHECK(err <= bd, "error feedback, step %d bucket %d shard element %zu: running sum "
                                       "%.9g, exact %.9g, error %.3g > one quantization %.3g", k, b, e,
                                       run[(size_t)b][e], k * exact[(size_t)b][e], err, bd);
                    if (k == K) (ef ? worst_ef : worst_noef) = std::max(ef ? worst_ef : worst_noef, err / bd);
                }
            }
        }
        zccl_bucket_plan_destroy(plan);
    }
    ZT_CHILD_CHECK(worst_noef >= K / 4.0, "without error feedback the error after %d steps is only %.3g x the error "
                   "feedback bound: the test does not show the difference", K, worst_noef);
    if (rank == 0)
        child_log(rank, "int4, %d steps: largest error / one-quantization bound %.3f with error feedback, %.3f without",
                  K, worst_ef, worst_noef);
    return 0;
}

int ef_residual_body(zccl_comm_t comm, int rank, int nranks, zccl_bucket_mode_t mode, zccl_wire_t w) {
    (void)nranks;
    zccl_bucket_plan_t plan = ef_plan(comm, mode, w, 1);
    ZT_CHILD_CHECK(plan != nullptr, "plan_create: %s", zccl_get_last_error(nullptr));
    int nb = 0;
    ZT_CHILD_OK(zccl_bucket_count(plan, &nb));
    std::vector<size_t> poff(kModel.size());
    std::vector<int> pb(kModel.size());
    for (int i = 0; i < (int)kModel.size(); i++) ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &pb[(size_t)i], &poff[(size_t)i]));
    std::vector<zccl_bucket_info_t> info((size_t)nb);
    std::vector<std::vector<float>> res((size_t)nb), sent((size_t)nb);
    for (int b = 0; b < nb; b++) {
        ZT_CHILD_OK(zccl_bucket_info(plan, b, &info[(size_t)b]));
        res[(size_t)b].assign(info[(size_t)b].elems, 1.0f);
        ZT_CHILD_OK(zccl_bucket_ef_residual(plan, b, res[(size_t)b].data()));
        for (float v : res[(size_t)b]) ZT_CHILD_CHECK(v == 0.0f, "bucket %d: residual %g before the first launch", b, (double)v);
        sent[(size_t)b].assign(info[(size_t)b].elems, 0.0f);
    }
    const bool rs = mode == ZCCL_BUCKET_REDUCE_SCATTER;
    const int accum = 2;
    size_t nonzero = 0;
    for (int step = 0; step < 3 * accum; step++) {
        const bool sync = step % accum == accum - 1;
        auto value = [&](int i, size_t j) { return grad_value(rank, 100 + step, i, j); };
        if (ef_microstep(plan, rank, sync, value)) return 1;
        /* what the bucket held at its launch: this micro-step's gradients (REDUCE_SCATTER) or the window's float32
         * sum (ALLREDUCE, launched at the sync micro-step) */
        for (int b = 0; b < nb; b++) {
            const std::vector<float> g = bucket_image(info[(size_t)b], poff, value);
            for (size_t e = 0; e < g.size(); e++) sent[(size_t)b][e] = rs ? g[e] : sent[(size_t)b][e] + g[e];
        }
        if (!rs && !sync) continue;
        for (int b = 0; b < nb; b++) {
            const zccl_bucket_info_t &I = info[(size_t)b];
            std::vector<float> gp(I.elems);
            for (size_t e = 0; e < I.elems; e++) gp[e] = sent[(size_t)b][e] + res[(size_t)b][e];
            const std::vector<float> q = test_quantize(w, gp, I.shard_elems);
            std::vector<float> got(I.elems);
            ZT_CHILD_OK(zccl_bucket_ef_residual(plan, b, got.data()));
            for (size_t e = 0; e < I.elems; e++) {
                const float want = (float)((double)gp[e] - (double)q[e]);
                ZT_CHILD_CHECK(std::memcmp(&want, &got[e], sizeof want) == 0, "step %d bucket %d element %zu: residual "
                               "%.9g, want g' - Q(g') = %.9g - %.9g = %.9g", step, b, e, (double)got[e], (double)gp[e],
                               (double)q[e], (double)want);
                nonzero += got[e] != 0.0f;
            }
            res[(size_t)b] = got;
            std::fill(sent[(size_t)b].begin(), sent[(size_t)b].end(), 0.0f);
        }
    }
    ZT_CHILD_CHECK(nonzero > 1000, "only %zu nonzero residual elements: was anything quantized?", nonzero);
    ZT_CHILD_OK(zccl_bucket_begin(plan, 1));
    std::vector<float> tmp(info[0].elems);
    ZT_CHILD_CHECK(zccl_bucket_ef_residual(plan, 0, tmp.data()) == ZCCL_INVALID_USAGE,
                   "residual read in an open micro-step");
    for (int i = (int)kModel.size() - 1; i >= 0; i--) ZT_CHILD_OK(zccl_bucket_mark_unused(plan, i));
    ZT_CHILD_OK(zccl_bucket_finish(plan));
    zccl_bucket_plan_destroy(plan);
    return 0;
}

} // namespace

TEST(ZeroWireEf, RunningSumStaysWithinOneQuantization) {
    run_ranks(3, [](zccl_comm_t comm, int r, int n) { return ef_running_sum_body(comm, r, n); }, wire_options(120));
}

TEST(ZeroWireEf, ResidualIsSentMinusItsQuantization) {
    for (auto mc : {std::make_pair(ZCCL_BUCKET_REDUCE_SCATTER, ZCCL_WIRE_INT4),
                    std::make_pair(ZCCL_BUCKET_ALLREDUCE, ZCCL_WIRE_INT4),
                    std::make_pair(ZCCL_BUCKET_REDUCE_SCATTER, ZCCL_WIRE_FP8E4M3)}) {
        SCOPED_TRACE(std::string(mc.first == ZCCL_BUCKET_ALLREDUCE ? "allreduce " : "reduce-scatter ") +
                     zccl_wire_name(mc.second));
        run_ranks(3, [&](zccl_comm_t comm, int r, int n) { return ef_residual_body(comm, r, n, mc.first, mc.second); },
                  wire_options(90));
    }
}

TEST(ZeroWireEf, FullWireOrBadValueIsRefused) {
    std::vector<size_t> numel = {100, 200};
    zccl_bucket_plan_t plan = nullptr;
    zccl_bucket_options_t o = {};
    o.error_feedback = 1; /* wire left ZCCL_WIRE_FULL */
    EXPECT_EQ(zccl_bucket_layout_create(2, 2, numel.data(), ZCCL_FLOAT32, &o, &plan), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("error_feedback = 1 with opts->wire = ZCCL_WIRE_FULL"),
              std::string::npos) << zccl_get_last_error(nullptr);
    EXPECT_EQ(plan, nullptr);
    o.wire = ZCCL_WIRE_INT4;
    o.error_feedback = 2;
    EXPECT_EQ(zccl_bucket_layout_create(2, 2, numel.data(), ZCCL_FLOAT32, &o, &plan), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("must be 0 or 1"), std::string::npos);
    o.error_feedback = 1;
    ASSERT_EQ(zccl_bucket_layout_create(2, 2, numel.data(), ZCCL_FLOAT32, &o, &plan), ZCCL_SUCCESS);
    float r[1];
    EXPECT_EQ(zccl_bucket_ef_residual(plan, 0, r), ZCCL_INVALID_USAGE); /* a layout keeps no residuals */
    zccl_bucket_plan_destroy(plan);
}

TEST(ZeroWireEf, RanksDisagreeingFailAtCreationOnEveryRank) {
    run_ranks(3, [](zccl_comm_t comm, int rank, int) -> int {
        std::vector<size_t> numel = {100, 200, 300};
        zccl_bucket_options_t o = {};
        o.wire = ZCCL_WIRE_INT4;
        o.mode = ZCCL_BUCKET_REDUCE_SCATTER;
        o.error_feedback = rank == 1 ? 0 : 1;
        zccl_bucket_plan_t plan = nullptr;
        zccl_result_t r = zccl_bucket_plan_create(comm, 3, numel.data(), ZCCL_FLOAT32, &o, &plan);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && plan == nullptr, "plan_create returned %s, want invalid usage",
                       zccl_get_error_string(r));
        o.error_feedback = 0; /* and then agreeing, without it: residuals are refused */
        ZT_CHILD_OK(zccl_bucket_plan_create(comm, 3, numel.data(), ZCCL_FLOAT32, &o, &plan));
        float res[1];
        ZT_CHILD_CHECK(zccl_bucket_ef_residual(plan, 0, res) == ZCCL_INVALID_USAGE, "residual of a plan without it");
        zccl_bucket_plan_destroy(plan);
        return 0;
    }, deadline_options(60));
}

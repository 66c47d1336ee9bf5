/*
 * test_zero.cpp — the gradient bucket scheduler and the ZeRO building blocks of include/zccl_zero.h.
 *
 * Layout (no communicator): a hand-computed example of the bucketing rule, and the rule's properties on a
 * random parameter list (reverse definition order, first bucket small then cap, closure, alignment, padding to
 * nranks * align). Multi-process (tests/harness, each run with a deadline): every rank writes gradients whose
 * values are small integers chosen per (rank, micro-step, parameter, element), so every sum is exact in float64
 * and the reference is computed by the test itself; marks arrive in a different random order on every rank with
 * random pauses, and the launch log must still be 0, 1, 2, ...; the peak number of buckets in flight must stay
 * within K; all-reduce and reduce-scatter results, k-micro-step accumulation, the global norm and shard scaling
 * are compared with the reference; a parameter never marked is an error naming it. ZeRO-3: gathered layers equal
 * the shards written by every rank, later steps prefetch within the live-bytes bound, and a divergent fetch order
 * is an error on every rank (step 1) or names the step (later steps) — never a hang.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"
#include "zccl_zero.h"

using namespace zt;

namespace {


/* Gradient element j of parameter i on rank r in micro-step m: a small integer, exact in any sum here. */
double grad_value(int r, int m, int i, size_t j) { return (double)((r + 1) * ((i % 5) + 1) + (int)(j % 7) + m); }

struct Layout {
    std::vector<int> bucket;
    std::vector<size_t> off;
    std::vector<zccl_bucket_info_t> info;
};

Layout read_layout(zccl_bucket_plan_t plan, int nparams) {
    Layout L;
    int nb = 0;
    zccl_bucket_count(plan, &nb);
    L.info.resize((size_t)nb);
    for (int b = 0; b < nb; b++) zccl_bucket_info(plan, b, &L.info[(size_t)b]);
    L.bucket.resize((size_t)nparams);
    L.off.resize((size_t)nparams);
    for (int i = 0; i < nparams; i++) zccl_bucket_param_loc(plan, i, &L.bucket[(size_t)i], &L.off[(size_t)i]);
    return L;
}

TEST(ZeroLayout, HandComputedExample) {
    /* float32, first 32 B (8 elements), cap 160 B (40 elements), align 4, 2 ranks. Reverse order p4..p0:
     * p4 (3) -> bucket 0 [0,3); p3 (30) would end at 34 > 8 -> bucket 1 [0,30); p2 (5) at 32..37 <= 40;
     * p1 (20) would end at 60 > 40 -> bucket 2 [0,20); p0 (10) at 20..30. Padding to multiples of 8: 8, 40, 32. */
    const size_t numel[] = {10, 20, 5, 30, 3};
    zccl_bucket_options_t o = {};
    o.first_bytes = 32;
    o.cap_bytes = 160;
    o.align_elems = 4;
    zccl_bucket_plan_t plan = nullptr;
    ASSERT_EQ(zccl_bucket_layout_create(2, 5, numel, ZCCL_FLOAT32, &o, &plan), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    Layout L = read_layout(plan, 5);
    ASSERT_EQ(L.info.size(), 3u);
    EXPECT_EQ(L.bucket, (std::vector<int>{2, 2, 1, 1, 0}));
    EXPECT_EQ(L.off, (std::vector<size_t>{20, 0, 32, 0, 0}));
    EXPECT_EQ(L.info[0].first_param, 4);
    EXPECT_EQ(L.info[0].nparams, 1);
    EXPECT_EQ(L.info[1].first_param, 3);
    EXPECT_EQ(L.info[1].nparams, 2);
    EXPECT_EQ(L.info[2].first_param, 1);
    EXPECT_EQ(L.info[2].nparams, 2);
    const size_t used[] = {3, 37, 30}, elems[] = {8, 40, 32};
    for (int b = 0; b < 3; b++) {
        EXPECT_EQ(L.info[b].used_elems, used[b]) << "bucket " << b;
        EXPECT_EQ(L.info[b].elems, elems[b]) << "bucket " << b;
        EXPECT_EQ(L.info[b].shard_elems, elems[b] / 2) << "bucket " << b;
        EXPECT_EQ(L.info[b].buffer, nullptr);
    }
    size_t full = 0, shard = 0;
    ASSERT_EQ(zccl_bucket_buffer_bytes(plan, &full, &shard), ZCCL_SUCCESS);
    EXPECT_EQ(full, (8u + 40u + 32u) * 4u);
    EXPECT_EQ(shard, 0u);
    zccl_bucket_plan_destroy(plan);
    /* The same layout in reduce-scatter mode with K = 2: two buffers of the largest bucket, plus the shards. */
    o.mode = ZCCL_BUCKET_REDUCE_SCATTER;
    o.max_in_flight = 2;
    ASSERT_EQ(zccl_bucket_layout_create(2, 5, numel, ZCCL_FLOAT32, &o, &plan), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_bucket_buffer_bytes(plan, &full, &shard), ZCCL_SUCCESS);
    EXPECT_EQ(full, 2u * 40u * 4u);
    EXPECT_EQ(shard, (4u + 20u + 16u) * 4u);
    zccl_bucket_plan_destroy(plan);
}

TEST(ZeroLayout, RuleHoldsOnRandomModels) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 50; trial++) {
        const int n = 1 + (int)(rng() % 60), nranks = 1 + (int)(rng() % 8);
        std::vector<size_t> numel((size_t)n);
        for (auto &x : numel) x = 1 + rng() % (rng() % 4 == 0 ? 50000 : 700);
        zccl_bucket_options_t o = {};
        o.first_bytes = 1 + rng() % 4096;
        o.cap_bytes = 1 + rng() % 65536;
        o.align_elems = 1 + rng() % 16;
        const zccl_datatype_t dt = (trial % 2) ? ZCCL_FLOAT64 : ZCCL_BFLOAT16;
        const size_t es = zccl_type_size(dt);
        zccl_bucket_plan_t plan = nullptr;
        ASSERT_EQ(zccl_bucket_layout_create(nranks, n, numel.data(), dt, &o, &plan), ZCCL_SUCCESS);
        Layout L = read_layout(plan, n);
        int expect_param = n - 1;
        for (size_t b = 0; b < L.info.size(); b++) {
            const auto &I = L.info[b];
            const size_t target = (b == 0 ? o.first_bytes : o.cap_bytes) / es;
            ASSERT_EQ(I.first_param, expect_param) << "trial " << trial << " bucket " << b;
            size_t end = 0;
            for (int k = 0; k < I.nparams; k++) {
                const int i = I.first_param - k;
                ASSERT_EQ(L.bucket[(size_t)i], (int)b);
                ASSERT_EQ(L.off[(size_t)i] % o.align_elems, 0u);
                ASSERT_GE(L.off[(size_t)i], end); /* no overlap, increasing */
                end = L.off[(size_t)i] + numel[(size_t)i];
            }
            ASSERT_EQ(I.used_elems, end);
            if (I.nparams > 1) ASSERT_LE(end, target) << "bucket " << b << " exceeds its target";
            ASSERT_EQ(I.elems % ((size_t)nranks * o.align_elems), 0u);
            ASSERT_LT(I.elems - I.used_elems, (size_t)nranks * o.align_elems);
            ASSERT_EQ(I.shard_elems * (size_t)nranks, I.elems);
            /* Closure: the next parameter would have taken this bucket past its target. */
            if (b + 1 < L.info.size()) {
                const size_t nxt = numel[(size_t)(I.first_param - I.nparams)];
                const size_t start = (end + o.align_elems - 1) / o.align_elems * o.align_elems;
                ASSERT_GT(start + nxt, target) << "bucket " << b << " closed early";
            }
            expect_param -= I.nparams;
        }
        ASSERT_EQ(expect_param, -1);
        zccl_bucket_plan_destroy(plan);
    }
}

TEST(ZeroLayout, DefaultsAndErrors) {
    /* Defaults: first bucket 1 MiB, then 25 MiB. float32 parameters of 64K elements (256 KiB) each. */
    std::vector<size_t> numel(400, 65536);
    zccl_bucket_plan_t plan = nullptr;
    ASSERT_EQ(zccl_bucket_layout_create(4, 400, numel.data(), ZCCL_FLOAT32, nullptr, &plan), ZCCL_SUCCESS);
    zccl_bucket_info_t i0, i1;
    ASSERT_EQ(zccl_bucket_info(plan, 0, &i0), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_bucket_info(plan, 1, &i1), ZCCL_SUCCESS);
    EXPECT_EQ(i0.nparams, 4);   /* 4 x 256 KiB = 1 MiB */
    EXPECT_EQ(i1.nparams, 100); /* 100 x 256 KiB = 25 MiB */
    zccl_bucket_plan_destroy(plan);
    numel[2] = 0;
    EXPECT_EQ(zccl_bucket_layout_create(4, 400, numel.data(), ZCCL_FLOAT32, nullptr, &plan), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("numel[2]"), std::string::npos) << zccl_get_last_error(nullptr);
    EXPECT_EQ(plan, nullptr);
    numel[2] = 1;
    EXPECT_EQ(zccl_bucket_layout_create(4, 400, numel.data(), ZCCL_INT32, nullptr, &plan), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("datatype"), std::string::npos);
    EXPECT_EQ(zccl_bucket_layout_create(0, 400, numel.data(), ZCCL_FLOAT32, nullptr, &plan), ZCCL_INVALID_ARGUMENT);
    zccl_bucket_options_t o = {};
    o.max_in_flight = 65;
    EXPECT_EQ(zccl_bucket_layout_create(4, 400, numel.data(), ZCCL_FLOAT32, &o, &plan), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("max_in_flight"), std::string::npos);
    ASSERT_EQ(zccl_bucket_layout_create(4, 400, numel.data(), ZCCL_FLOAT32, nullptr, &plan), ZCCL_SUCCESS);
    EXPECT_EQ(zccl_bucket_begin(plan, 1), ZCCL_INVALID_USAGE); /* layout plans do not run */
    EXPECT_EQ(zccl_bucket_param_loc(plan, 400, nullptr, nullptr), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(zccl_bucket_info(plan, -1, &i0), ZCCL_INVALID_ARGUMENT);
    zccl_bucket_plan_destroy(plan);
    EXPECT_EQ(zccl_bucket_plan_create(nullptr, 400, numel.data(), ZCCL_FLOAT32, nullptr, &plan), ZCCL_INVALID_ARGUMENT);
}

/* A model of 11 parameters of mixed sizes; with these targets it forms several buckets of float64. */
const std::vector<size_t> kModel = {1000, 7, 300, 5000, 33, 2000, 1, 999, 64, 4096, 5};

struct RunCfg {
    zccl_bucket_mode_t mode;
    int K;
    int accum;       /* micro-steps per window (sync on the last) */
    int windows;
    bool average;
    bool random_order; /* marks in random order (ALLREDUCE) or reverse order shuffled within buckets (RS) */
    const std::vector<size_t> *model = &kModel;
    size_t first_bytes = 2048, cap_bytes = 16384;
    bool pauses = true; /* random short sleeps between marks */
    bool registered = true; /* bucket buffers expected in registered zccl_mem_alloc memory (ZCCL_BUCKET_REGISTER) */
};

/* One rank's run of cfg: writes gradients, marks them, checks results against the reference. */
int bucket_body(zccl_comm_t comm, int rank, int nranks, const RunCfg &cfg) {
    const std::vector<size_t> &model = *cfg.model;
    const int n = (int)model.size();
    zccl_bucket_options_t o = {};
    o.first_bytes = cfg.first_bytes;
    o.cap_bytes = cfg.cap_bytes;
    o.align_elems = 3;
    o.mode = cfg.mode;
    o.max_in_flight = cfg.K;
    o.average = cfg.average;
    zccl_bucket_plan_t plan = nullptr;
    ZT_CHILD_OK(zccl_bucket_plan_create(comm, n, model.data(), ZCCL_FLOAT64, &o, &plan));
    Layout L = read_layout(plan, n);
    const int nb = (int)L.info.size();
    ZT_CHILD_CHECK(nb >= 4, "expected several buckets, got %d", nb);
    std::mt19937 rng(1234u + 77u * (unsigned)rank);
    for (int w = 0; w < cfg.windows; w++) {
        for (int m = 0; m < cfg.accum; m++) {
            const int mstep = w * cfg.accum + m;
            ZT_CHILD_OK(zccl_bucket_begin(plan, m == cfg.accum - 1));
            std::vector<int> order;
            for (int b = 0; b < nb; b++) {
                std::vector<int> in_b;
                for (int k = 0; k < L.info[b].nparams; k++) in_b.push_back(L.info[b].first_param - k);
                if (cfg.random_order) std::shuffle(in_b.begin(), in_b.end(), rng);
                order.insert(order.end(), in_b.begin(), in_b.end());
            }
            if (cfg.random_order && cfg.mode == ZCCL_BUCKET_ALLREDUCE) std::shuffle(order.begin(), order.end(), rng);
            for (int i : order) {
                void *g = nullptr;
                ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, &g));
                double *d = static_cast<double *>(g);
                for (size_t j = 0; j < model[(size_t)i]; j++) d[j] += grad_value(rank, mstep, i, j);
                if (cfg.pauses && rng() % 4 == 0) usleep(200 + rng() % 800);
                ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
            }
            ZT_CHILD_OK(zccl_bucket_finish(plan));
            std::vector<int> log((size_t)nb + 1, -1);
            int nlog = 0;
            ZT_CHILD_OK(zccl_bucket_launch_log(plan, log.data(), nb + 1, &nlog));
            const bool communicated = cfg.mode == ZCCL_BUCKET_REDUCE_SCATTER || m == cfg.accum - 1;
            ZT_CHILD_CHECK(nlog == (communicated ? nb : 0), "launched %d buckets in micro-step %d, want %d", nlog, mstep,
                        communicated ? nb : 0);
            for (int k = 0; k < nlog; k++)
                ZT_CHILD_CHECK(log[(size_t)k] == k, "micro-step %d: launch #%d was bucket %d (want bucket order)", mstep, k, log[(size_t)k]);
        }
        /* Reference: sum over ranks and the window's micro-steps, divided by nranks when averaging. */
        const double div = cfg.average ? nranks : 1;
        auto ref = [&](int i, size_t j) {
            double s = 0;
            for (int r = 0; r < nranks; r++)
                for (int m = 0; m < cfg.accum; m++) s += grad_value(r, w * cfg.accum + m, i, j);
            return s / div;
        };
        double sumsq = 0;
        for (int i = 0; i < n; i++)
            for (size_t j = 0; j < model[(size_t)i]; j++) sumsq += ref(i, j) * ref(i, j);
        for (int b = 0; b < nb; b++) {
            zccl_bucket_info_t I;
            ZT_CHILD_OK(zccl_bucket_info(plan, b, &I));
            std::vector<double> expect(I.elems, 0.0); /* the reduced bucket, padding and gaps zero */
            for (int k = 0; k < I.nparams; k++) {
                const int i = I.first_param - k;
                for (size_t j = 0; j < model[(size_t)i]; j++) expect[L.off[(size_t)i] + j] = ref(i, j);
            }
            const double *shard = static_cast<const double *>(I.shard);
            for (size_t e = 0; e < I.shard_elems; e++)
                ZT_CHILD_CHECK(shard[e] == expect[I.shard_offset + e], "window %d bucket %d shard element %zu: %g, want %g",
                            w, b, e, shard[e], expect[I.shard_offset + e]);
            if (cfg.mode == ZCCL_BUCKET_ALLREDUCE) {
                const double *full = static_cast<const double *>(I.buffer);
                for (size_t e = 0; e < I.elems; e++)
                    ZT_CHILD_CHECK(full[e] == expect[e], "window %d bucket %d element %zu: %g, want %g", w, b, e, full[e],
                                expect[e]);
            }
        }
        double norm = 0;
        ZT_CHILD_OK(zccl_bucket_grad_norm(plan, &norm));
        ZT_CHILD_CHECK(std::fabs(norm - std::sqrt(sumsq)) <= 1e-12 * std::sqrt(sumsq), "norm %.17g, want %.17g", norm,
                    std::sqrt(sumsq));
        /* Clipping: scale the shards by 1/2 (exact) and check one element of each shard. */
        ZT_CHILD_OK(zccl_bucket_scale_shards(plan, 0.5));
        double norm2 = 0;
        ZT_CHILD_OK(zccl_bucket_grad_norm(plan, &norm2));
        ZT_CHILD_CHECK(std::fabs(norm2 - norm / 2) <= 1e-12 * norm, "after scaling by 1/2: norm %.17g, want %.17g", norm2,
                    norm / 2);
    }
    zccl_bucket_stats_t st;
    ZT_CHILD_OK(zccl_bucket_stats(plan, &st));
    ZT_CHILD_CHECK(st.peak_in_flight >= 1 && st.peak_in_flight <= cfg.K, "peak in flight %d, K = %d", st.peak_in_flight,
                cfg.K);
    const uint64_t want_launches =
        (uint64_t)nb * (uint64_t)cfg.windows * (cfg.mode == ZCCL_BUCKET_REDUCE_SCATTER ? (uint64_t)cfg.accum : 1u);
    ZT_CHILD_CHECK(st.launches == want_launches, "launches %llu, want %llu", (unsigned long long)st.launches,
                (unsigned long long)want_launches);
    /* Every rank shares this host: each bucket buffer (ALLREDUCE: one per bucket; REDUCE_SCATTER: min(K, nb) and
     * the shards' block) is registered unless ZCCL_BUCKET_REGISTER=0. */
    const int want_reg = !cfg.registered || nranks == 1 ? 0
                         : cfg.mode == ZCCL_BUCKET_ALLREDUCE ? nb : std::min(cfg.K, nb) + 1;
    ZT_CHILD_CHECK(st.registered_buffers == want_reg, "registered bucket buffers %d, want %d", st.registered_buffers,
                   want_reg);
    if (rank == 0)
        child_log(rank, "buckets %d, peak in flight %d (K %d), launches %llu, finish wait %.3f s, comm %.3f s", nb,
                  st.peak_in_flight, cfg.K, (unsigned long long)st.launches, st.finish_wait_s, st.comm_s);
    zccl_bucket_plan_destroy(plan);
    return 0;
}

TEST(ZeroBuckets, AllReduceRandomMarkOrderLaunchesInBucketOrder) {
    RunCfg c{ZCCL_BUCKET_ALLREDUCE, 2, 1, 3, false, true};
    run_ranks(3, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, deadline_options(90));
}

TEST(ZeroBuckets, AllReduceAverageK1) {
    RunCfg c{ZCCL_BUCKET_ALLREDUCE, 1, 1, 2, true, true};
    run_ranks(4, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, deadline_options(90));
}

TEST(ZeroBuckets, AllReduceAccumulatesLocallyOverMicroSteps) {
    RunCfg c{ZCCL_BUCKET_ALLREDUCE, 2, 3, 2, false, true};
    run_ranks(2, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, deadline_options(90));
}

TEST(ZeroBuckets, ReduceScatterShardsK2) {
    RunCfg c{ZCCL_BUCKET_REDUCE_SCATTER, 2, 1, 2, true, true};
    run_ranks(4, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, deadline_options(90));
}

TEST(ZeroBuckets, ReduceScatterAccumulatesShardsK1) {
    RunCfg c{ZCCL_BUCKET_REDUCE_SCATTER, 1, 3, 2, false, true};
    run_ranks(3, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, deadline_options(90));
}

/* Buckets of 32-240 KiB, at and above ZCCL_SHM_REG_MIN_BYTES, so their collectives take the registered one-pass
 * path out of the registered bucket buffers; and the same plans in ordinary memory (ZCCL_BUCKET_REGISTER=0):
 * exact results both ways. */
const std::vector<size_t> kLargeModel = {30000, 4000, 30000, 5000, 30000, 12000};

TEST(ZeroBuckets, RegisteredBucketBuffersAllReduceAndReduceScatter) {
    for (zccl_bucket_mode_t mode : {ZCCL_BUCKET_ALLREDUCE, ZCCL_BUCKET_REDUCE_SCATTER}) {
        RunCfg c{mode, 2, 2, 2, false, true};
        c.model = &kLargeModel;
        c.first_bytes = 65536;
        c.cap_bytes = 262144;
        c.pauses = false;
        run_ranks(4, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, deadline_options(90));
        c.registered = false;
        Options o = deadline_options(90);
        o.env = {{"ZCCL_BUCKET_REGISTER", std::string("0")}};
        run_ranks(3, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, o);
    }
}

/* Many small buckets (about 100), K = 3, 4 ranks, marks in random order without pauses, 4 windows. */
std::vector<size_t> random_model(unsigned seed, int n) {
    std::mt19937 rng(seed);
    std::vector<size_t> m((size_t)n);
    for (auto &x : m) x = 1 + rng() % 300;
    return m;
}

TEST(ZeroBuckets, ManySmallBucketsStress) {
    static const std::vector<size_t> model = random_model(99, 240);
    RunCfg c{ZCCL_BUCKET_ALLREDUCE, 3, 1, 4, true, true};
    c.model = &model;
    c.first_bytes = 256;
    c.cap_bytes = 2048;
    c.pauses = false;
    run_ranks(4, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, c); }, deadline_options(120));
    RunCfg rs = c;
    rs.mode = ZCCL_BUCKET_REDUCE_SCATTER;
    rs.accum = 2;
    run_ranks(4, [&](zccl_comm_t comm, int r, int n) { return bucket_body(comm, r, n, rs); }, deadline_options(120));
}

TEST(ZeroBuckets, MissingMarkNamesTheParameterAndThePlanRecovers) {
    run_ranks(3, [](zccl_comm_t comm, int rank, int nranks) -> int {
        const int n = (int)kModel.size();
        zccl_bucket_options_t o = {};
        o.first_bytes = 2048;
        o.cap_bytes = 16384;
        zccl_bucket_plan_t plan = nullptr;
        ZT_CHILD_OK(zccl_bucket_plan_create(comm, n, kModel.data(), ZCCL_FLOAT64, &o, &plan));
        int bucket5 = -1;
        ZT_CHILD_OK(zccl_bucket_param_loc(plan, 5, &bucket5, nullptr));
        ZT_CHILD_OK(zccl_bucket_begin(plan, 1));
        for (int i = n - 1; i >= 0; i--) {
            if (i == 5) continue; /* never marked */
            if (i == 2) { ZT_CHILD_OK(zccl_bucket_mark_unused(plan, i)); continue; }
            void *g;
            ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, &g));
            ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
        }
        ZT_CHILD_CHECK(zccl_bucket_mark_ready(plan, 7) == ZCCL_INVALID_USAGE, "a second mark must fail");
        zccl_result_t r = zccl_bucket_finish(plan);
        std::string msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE, "finish returned %d: %s", (int)r, msg.c_str());
        ZT_CHILD_CHECK(msg.find("parameter 5 ") != std::string::npos, "message does not name parameter 5: %s", msg.c_str());
        int log[64], nlog = 0;
        ZT_CHILD_OK(zccl_bucket_launch_log(plan, log, 64, &nlog));
        ZT_CHILD_CHECK(nlog == bucket5, "launched %d buckets, want those before bucket %d", nlog, bucket5);
        /* The plan still works: a complete micro-step, parameter 2 unused (its gradient stays zero). */
        ZT_CHILD_OK(zccl_bucket_begin(plan, 1));
        for (int i = n - 1; i >= 0; i--) {
            if (i == 2) { ZT_CHILD_OK(zccl_bucket_mark_unused(plan, i)); continue; }
            void *g;
            ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, &g));
            for (size_t j = 0; j < kModel[(size_t)i]; j++) static_cast<double *>(g)[j] += grad_value(rank, 0, i, j);
            ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
        }
        ZT_CHILD_OK(zccl_bucket_finish(plan));
        for (int i = 0; i < n; i++) {
            int b;
            size_t off;
            ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &b, &off));
            zccl_bucket_info_t I;
            ZT_CHILD_OK(zccl_bucket_info(plan, b, &I));
            const double *g = static_cast<const double *>(I.buffer) + off;
            void *gp = nullptr; /* all-reduce mode: readable in place between micro-steps */
            ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, &gp));
            ZT_CHILD_CHECK(gp == g, "grad_ptr after finish %p, bucket buffer + offset %p", gp, (const void *)g);
            for (size_t j = 0; j < kModel[(size_t)i]; j++) {
                double want = 0;
                if (i != 2)
                    for (int rr = 0; rr < nranks; rr++) want += grad_value(rr, 0, i, j);
                ZT_CHILD_CHECK(g[j] == want, "param %d element %zu: %g, want %g", i, j, g[j], want);
            }
        }
        ZT_CHILD_CHECK(zccl_bucket_finish(plan) == ZCCL_INVALID_USAGE, "finish without begin must fail");
        zccl_bucket_plan_destroy(plan);
        return 0;
    }, deadline_options(60));
}

TEST(ZeroBuckets, ReduceScatterOutOfOrderBufferUseIsAnErrorNotAHang) {
    run_ranks(2, [](zccl_comm_t comm, int rank, int) -> int {
        const int n = (int)kModel.size();
        zccl_bucket_options_t o = {};
        o.first_bytes = 2048;
        o.cap_bytes = 16384;
        o.mode = ZCCL_BUCKET_REDUCE_SCATTER;
        o.max_in_flight = 1;
        zccl_bucket_plan_t plan = nullptr;
        ZT_CHILD_OK(zccl_bucket_plan_create(comm, n, kModel.data(), ZCCL_FLOAT64, &o, &plan));
        int p_in_b1 = -1;
        for (int i = n - 1; i >= 0 && p_in_b1 < 0; i--) {
            int b;
            ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &b, nullptr));
            if (b == 1) p_in_b1 = i;
        }
        /* K = 1: bucket 1 needs bucket 0's buffer, and bucket 0 (parameter n-1, ...) is not marked: first with
         * bucket 0 holding the buffer, then (second micro-step) with nobody holding it yet — bucket 0 will need it
         * when it launches, so bucket 1 must not take it. */
        for (int variant = 0; variant < 2; variant++) {
            ZT_CHILD_OK(zccl_bucket_begin(plan, 1));
            void *g;
            if (variant == 0) ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, n - 1, &g));
            zccl_result_t r = zccl_bucket_grad_ptr(plan, p_in_b1, &g);
            std::string msg = zccl_get_last_error(nullptr);
            ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE, "variant %d: grad_ptr returned %d: %s", variant, (int)r, msg.c_str());
            ZT_CHILD_CHECK(msg.find("cannot launch before parameter " + std::to_string(n - 1)) != std::string::npos,
                        "variant %d: message: %s", variant, msg.c_str());
            /* Complete the micro-step in order; all gradients 1, so every shard element of a parameter is nranks. */
            for (int i = n - 1; i >= 0; i--) {
                ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, &g));
                for (size_t j = 0; j < kModel[(size_t)i]; j++) static_cast<double *>(g)[j] += 1.0;
                ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
            }
            ZT_CHILD_OK(zccl_bucket_finish(plan));
            Layout L = read_layout(plan, n);
            for (size_t b = 0; b < L.info.size(); b++) {
                std::vector<double> expect(L.info[b].elems, 0.0);
                for (int k = 0; k < L.info[b].nparams; k++) {
                    const int i = L.info[b].first_param - k;
                    std::fill_n(expect.begin() + (long)L.off[(size_t)i], kModel[(size_t)i], 2.0);
                }
                const double *sh = static_cast<const double *>(L.info[b].shard);
                for (size_t e = 0; e < L.info[b].shard_elems; e++)
                    ZT_CHILD_CHECK(sh[e] == expect[L.info[b].shard_offset + e], "variant %d bucket %zu element %zu: %g",
                                variant, b, e, sh[e]);
            }
        }
        ZT_CHILD_CHECK(zccl_bucket_grad_ptr(plan, 0, nullptr) == ZCCL_INVALID_ARGUMENT, "grad NULL must fail");
        void *g;
        ZT_CHILD_CHECK(zccl_bucket_grad_ptr(plan, 0, &g) == ZCCL_INVALID_USAGE, "reduce-scatter: no pointer between steps");
        zccl_bucket_plan_destroy(plan);
        return 0;
    }, deadline_options(60));
}

TEST(ZeroBuckets, RanksWithDifferentParametersFailAtCreation) {
    run_ranks(3, [](zccl_comm_t comm, int rank, int) -> int {
        std::vector<size_t> numel = kModel;
        if (rank == 2) numel[4] += 1; /* one rank disagrees */
        zccl_bucket_plan_t plan = nullptr;
        zccl_result_t r = zccl_bucket_plan_create(comm, (int)numel.size(), numel.data(), ZCCL_FLOAT64, nullptr, &plan);
        std::string msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && plan == nullptr, "create returned %d: %s", (int)r, msg.c_str());
        ZT_CHILD_CHECK(msg.find("ranks passed different parameter lists") != std::string::npos, "message: %s", msg.c_str());
        zccl_zero3_t z = nullptr;
        r = zccl_zero3_create(comm, (int)numel.size(), numel.data(), ZCCL_FLOAT32, nullptr, &z);
        msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && z == nullptr, "zero3 create returned %d: %s", (int)r, msg.c_str());
        /* The communicator still works: the same lists on every rank succeed. */
        ZT_CHILD_OK(zccl_bucket_plan_create(comm, (int)kModel.size(), kModel.data(), ZCCL_FLOAT64, nullptr, &plan));
        zccl_bucket_plan_destroy(plan);
        return 0;
    }, deadline_options(60));
}

/* ---- ZeRO-3 ------------------------------------------------------------------------------------------------ */

double param_value(int layer, size_t idx) { return layer * 100000.0 + (double)idx; }

const std::vector<size_t> kLayers = {1000, 5003, 200, 3001, 4000, 17};

int fill_shards(zccl_zero3_t z, int rank) {
    for (int l = 0; l < (int)kLayers.size(); l++) {
        void *s;
        size_t cnt, off;
        ZT_CHILD_OK(zccl_zero3_shard(z, l, &s, &cnt, &off));
        for (size_t e = 0; e < cnt; e++) static_cast<double *>(s)[e] = param_value(l, off + e);
    }
    return 0;
}

int check_layer(int rank, int l, const void *full) {
    const double *p = static_cast<const double *>(full);
    for (size_t i = 0; i < kLayers[(size_t)l]; i++)
        ZT_CHILD_CHECK(p[i] == param_value(l, i), "layer %d element %zu: %g, want %g", l, i, p[i], param_value(l, i));
    return 0;
}

TEST(Zero3, FetchGathersShardsAndPrefetchStaysWithinLiveBytes) {
    auto body = [](zccl_comm_t comm, int rank, int nranks) -> int {
        zccl_comm_t comm3 = nullptr; /* a communicator of its own, as zccl_zero.h recommends */
        ZT_CHILD_OK(zccl_comm_shrink(comm, nullptr, 0, &comm3));
        const int L = (int)kLayers.size();
        size_t largest = 0;
        for (size_t n : kLayers) largest = std::max(largest, (n + (size_t)nranks - 1) / (size_t)nranks * (size_t)nranks * 8);
        zccl_zero3_options_t o = {};
        o.max_live_bytes = largest * 5 / 2;
        zccl_zero3_t z = nullptr;
        ZT_CHILD_OK(zccl_zero3_create(comm3, L, kLayers.data(), ZCCL_FLOAT64, &o, &z));
        if (fill_shards(z, rank)) return 1;
        for (int step = 1; step <= 4; step++) {
            ZT_CHILD_OK(zccl_zero3_begin(z));
            for (int l = 0; l < L; l++) { /* forward */
                void *full;
                ZT_CHILD_OK(zccl_zero3_fetch(z, l, &full));
                if (check_layer(rank, l, full)) return 1;
                usleep(300);
                ZT_CHILD_OK(zccl_zero3_release(z, l));
            }
            for (int l = L - 1; l >= 0; l--) { /* backward */
                void *full;
                ZT_CHILD_OK(zccl_zero3_fetch(z, l, &full));
                if (check_layer(rank, l, full)) return 1;
                usleep(300);
                ZT_CHILD_OK(zccl_zero3_release(z, l));
            }
            ZT_CHILD_OK(zccl_zero3_end(z));
        }
        zccl_zero3_stats_t st;
        ZT_CHILD_OK(zccl_zero3_stats(z, &st));
        ZT_CHILD_CHECK(st.peak_live_bytes <= o.max_live_bytes, "peak live %zu > limit %zu", st.peak_live_bytes,
                    o.max_live_bytes);
        ZT_CHILD_CHECK(st.live_bytes == 0, "live bytes %zu after the steps", st.live_bytes);
        ZT_CHILD_CHECK(st.gathers == 4u * 2u * (uint64_t)L, "gathers %llu", (unsigned long long)st.gathers);
        /* One host: gathered layers come from the registered pool, unless ZCCL_BUCKET_REGISTER=0. */
        const char *regenv = getenv("ZCCL_BUCKET_REGISTER");
        const bool reg_off = regenv && !strcmp(regenv, "0");
        ZT_CHILD_CHECK(reg_off ? st.registered_allocs == 0 : st.registered_allocs >= 1,
                       "registered pool buffers %llu with ZCCL_BUCKET_REGISTER=%s", (unsigned long long)st.registered_allocs,
                       regenv ? regenv : "(unset)");
        /* Steps 2-4: every fetch but the first few of a step was issued ahead. */
        ZT_CHILD_CHECK(st.prefetched >= 3u * (2u * (uint64_t)L - 2u), "prefetch hits %llu", (unsigned long long)st.prefetched);
        if (rank == 0)
            child_log(rank, "peak live %zu of %zu bytes, prefetch hits %llu, wait %.4f s, gather %.4f s",
                      st.peak_live_bytes, o.max_live_bytes, (unsigned long long)st.prefetched, st.fetch_wait_s,
                      st.gather_s);
        zccl_zero3_destroy(z);
        zccl_comm_destroy(comm3);
        return 0;
    };
    run_ranks(3, body, deadline_options(90));
    Options o = deadline_options(90);
    o.env = {{"ZCCL_BUCKET_REGISTER", std::string("0")}};
    run_ranks(3, body, o);
}

// A transformer-like stack (8 layers of one size) under a bound of 3 layers: the pool's registered buffers are
// reused from step to step (none allocated after step 2), never more than live + idle (2 x 3 layers), and every
// gathered layer is still the right one.
TEST(Zero3, RegisteredPoolReusesBuffersAcrossSteps) {
    run_ranks(4, [](zccl_comm_t comm, int rank, int nranks) -> int {
        zccl_comm_t comm3 = nullptr;
        ZT_CHILD_OK(zccl_comm_shrink(comm, nullptr, 0, &comm3));
        const int L = 8;
        const size_t n = 9000; /* 9000 doubles: 72 KB per gathered layer */
        std::vector<size_t> layers((size_t)L, n);
        zccl_zero3_options_t o = {};
        o.max_live_bytes = 3 * ((n + (size_t)nranks - 1) / (size_t)nranks * (size_t)nranks * 8);
        zccl_zero3_t z = nullptr;
        ZT_CHILD_OK(zccl_zero3_create(comm3, L, layers.data(), ZCCL_FLOAT64, &o, &z));
        for (int l = 0; l < L; l++) {
            void *s;
            size_t cnt, off;
            ZT_CHILD_OK(zccl_zero3_shard(z, l, &s, &cnt, &off));
            for (size_t e = 0; e < cnt; e++) static_cast<double *>(s)[e] = param_value(l, off + e);
        }
        uint64_t after2 = 0;
        for (int step = 1; step <= 5; step++) {
            ZT_CHILD_OK(zccl_zero3_begin(z));
            for (int pass = 0; pass < 2; pass++)
                for (int k = 0; k < L; k++) {
                    const int l = pass == 0 ? k : L - 1 - k;
                    void *full;
                    ZT_CHILD_OK(zccl_zero3_fetch(z, l, &full));
                    const double *p = static_cast<const double *>(full);
                    for (size_t i = 0; i < n; i++)
                        ZT_CHILD_CHECK(p[i] == param_value(l, i), "step %d layer %d element %zu: %g", step, l, i, p[i]);
                    ZT_CHILD_OK(zccl_zero3_release(z, l));
                }
            ZT_CHILD_OK(zccl_zero3_end(z));
            if (step == 2) {
                zccl_zero3_stats_t s2;
                ZT_CHILD_OK(zccl_zero3_stats(z, &s2));
                after2 = s2.registered_allocs;
            }
        }
        zccl_zero3_stats_t st;
        ZT_CHILD_OK(zccl_zero3_stats(z, &st));
        ZT_CHILD_CHECK(st.registered_allocs >= 1 && st.registered_allocs <= 6, "pool buffers %llu (want 1..6)",
                       (unsigned long long)st.registered_allocs);
        ZT_CHILD_CHECK(st.registered_allocs == after2, "steps 3-5 allocated %llu more pool buffers",
                       (unsigned long long)(st.registered_allocs - after2));
        ZT_CHILD_CHECK(st.peak_live_bytes <= o.max_live_bytes, "peak live %zu > %zu", st.peak_live_bytes,
                       o.max_live_bytes);
        if (rank == 0)
            child_log(rank, "pool buffers %llu, gathers %llu, prefetched %llu", (unsigned long long)st.registered_allocs,
                      (unsigned long long)st.gathers, (unsigned long long)st.prefetched);
        zccl_zero3_destroy(z);
        zccl_comm_destroy(comm3);
        return 0;
    }, deadline_options(90));
}

TEST(Zero3, MaxLiveBelowTheLargestLayerFailsOnEveryRank) {
    run_ranks(3, [](zccl_comm_t comm, int rank, int nranks) -> int {
        /* largest layer: kLayers[1] = 5003 elements, padded to 5004 float64 = 40032 bytes on 3 ranks */
        const size_t largest = (5003 + (size_t)nranks - 1) / (size_t)nranks * (size_t)nranks * 8;
        zccl_zero3_options_t o = {};
        o.max_live_bytes = rank == 1 ? largest - 1 : largest; /* only rank 1's bound is too small */
        zccl_zero3_t z = nullptr;
        zccl_result_t r = zccl_zero3_create(comm, (int)kLayers.size(), kLayers.data(), ZCCL_FLOAT64, &o, &z);
        std::string msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(z == nullptr, "create succeeded on rank %d", rank);
        if (rank == 1) {
            ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT, "create returned %d: %s", (int)r, msg.c_str());
            const std::string want = "max_live_bytes = " + std::to_string(largest - 1) +
                                     " (opts->max_live_bytes) is below the largest gathered layer (layer 1: " +
                                     std::to_string(largest) + " bytes";
            ZT_CHILD_CHECK(msg.find(want) != std::string::npos, "message: %s", msg.c_str());
        } else {
            ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE, "create returned %d: %s", (int)r, msg.c_str());
            ZT_CHILD_CHECK(msg.find("max_live_bytes is below the largest layer") != std::string::npos, "message: %s",
                        msg.c_str());
        }
        /* exactly the largest layer is accepted on every rank */
        o.max_live_bytes = largest;
        ZT_CHILD_OK(zccl_zero3_create(comm, (int)kLayers.size(), kLayers.data(), ZCCL_FLOAT64, &o, &z));
        zccl_zero3_destroy(z);
        return 0;
    }, deadline_options(60));
}

TEST(Zero3, DivergentOrderInStepOneIsAnErrorOnEveryRank) {
    run_ranks(3, [](zccl_comm_t comm, int rank, int) -> int {
        zccl_zero3_t z = nullptr;
        ZT_CHILD_OK(zccl_zero3_create(comm, (int)kLayers.size(), kLayers.data(), ZCCL_FLOAT64, nullptr, &z));
        if (fill_shards(z, rank)) return 1;
        ZT_CHILD_OK(zccl_zero3_begin(z));
        void *full;
        ZT_CHILD_OK(zccl_zero3_fetch(z, 0, &full));
        ZT_CHILD_OK(zccl_zero3_release(z, 0));
        const int l = (rank == 1) ? 2 : 1; /* rank 1 diverges at fetch #1 */
        zccl_result_t r = zccl_zero3_fetch(z, l, &full);
        std::string msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE, "fetch returned %d: %s", (int)r, msg.c_str());
        ZT_CHILD_CHECK(msg.find("step 1, fetch #1") != std::string::npos, "message: %s", msg.c_str());
        zccl_zero3_destroy(z);
        return 0;
    }, deadline_options(60));
}

TEST(Zero3, LaterStepOrderChangeNamesTheStep) {
    run_ranks(2, [](zccl_comm_t comm, int rank, int) -> int {
        zccl_zero3_t z = nullptr;
        const int L = (int)kLayers.size();
        ZT_CHILD_OK(zccl_zero3_create(comm, L, kLayers.data(), ZCCL_FLOAT64, nullptr, &z));
        if (fill_shards(z, rank)) return 1;
        void *full;
        for (int step = 1; step <= 2; step++) {
            ZT_CHILD_OK(zccl_zero3_begin(z));
            for (int l = 0; l < L; l++) {
                ZT_CHILD_OK(zccl_zero3_fetch(z, l, &full));
                ZT_CHILD_OK(zccl_zero3_release(z, l));
            }
            ZT_CHILD_OK(zccl_zero3_end(z));
        }
        ZT_CHILD_OK(zccl_zero3_begin(z));
        ZT_CHILD_OK(zccl_zero3_fetch(z, 0, &full));
        zccl_result_t r = zccl_zero3_fetch(z, 3, &full); /* recorded: layer 1 */
        std::string msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE, "fetch returned %d: %s", (int)r, msg.c_str());
        ZT_CHILD_CHECK(msg.find("step 3, fetch #1 is layer 3") != std::string::npos, "message: %s", msg.c_str());
        ZT_CHILD_CHECK(zccl_zero3_fetch(z, 0, &full) == ZCCL_INVALID_USAGE, "fetching a held layer must fail");
        r = zccl_zero3_end(z);
        msg = zccl_get_last_error(nullptr);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && msg.find("step 3 ended after 1 fetches") != std::string::npos,
                    "end returned %d: %s", (int)r, msg.c_str());
        zccl_zero3_stats_t st;
        ZT_CHILD_OK(zccl_zero3_stats(z, &st));
        ZT_CHILD_CHECK(st.live_bytes == 0, "live bytes %zu after end", st.live_bytes);
        zccl_zero3_destroy(z);
        return 0;
    }, deadline_options(60));
}

}  // namespace

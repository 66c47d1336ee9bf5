/*
 * test_zero_offload.cpp — the CPU offload of include/zccl_zero.h (zccl_zero_offload_*): ZeRO-1 and ZeRO-2 training
 * of a small model for several optimizer steps on 3 ranks, with the optimizer offloaded to host memory and without
 * (the test's own AdamW on the plan's shard, as examples/zero_train does), both compared with a single-process
 * reference the test computes from the same gradients.
 *
 * Exactness: every gradient element is a small integer chosen per (rank, step, micro-step, parameter, element), so
 * its sum over ranks and micro-steps is exact in float32 and float64 whatever order the collectives add in, and
 * grad_scale is a power of two. The AdamW update is then the same arithmetic on the same values in the reference,
 * the offload (double arithmetic, stored in the master type) and the caller-side path, so parameters must agree
 * bit for bit (float64 and float32 parameters).
 *
 * Device path without a GPU: with the fake CUDA driver (tests/fake_cuda, ZCCL_CUDA_LIBRARY) the parameter buffers
 * and the gradient buckets are marked "device memory"; the test reduce-scatters the gradients itself on those
 * buffers, hands the device shards to zccl_zero_offload_grad_shard (device-to-host on the side stream), and the
 * step copies the updated shard host-to-device and all-gathers on device buffers. Never run on a GPU.
 */
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"
#include "zccl_zero.h"

extern "C" {
#include "kernels.h"
bool zccl__mem_cuda_built(void);
}

using namespace zt;

namespace {


const std::vector<size_t> kNumel = {37, 100, 5, 64, 19};
const int kSteps = 4, kAccum = 2;
const zccl_zero_adamw_t kHp = {0.01, 0.9, 0.999, 1e-8, 0.1, 0.125};

size_t decay_of(int i) { return kNumel[(size_t)i] * 2 / 3; } /* the "weights" part of each parameter */

double init_value(int i, size_t j) { return 0.01 * (double)((int)(j % 13) - 6) + 0.003 * i; }
/* Gradient element j of parameter i on rank r, step s, micro-step u: a small integer. */
double grad_value(int r, int s, int u, int i, size_t j) {
    return (double)(((r + 1) * (i + 2) + (int)(j % 7) * (s + 1) - 3 * u) % 11 - 5);
}

/* Parameter types: storage T, master/moment type M (zccl_zero.h "Precision"), conversions through double. */
struct F64 {
    using T = double;
    using M = double;
    static constexpr zccl_datatype_t dt = ZCCL_FLOAT64;
    static double to(T x) { return x; }
    static T from(double v) { return v; }
};
struct F32 {
    using T = float;
    using M = float;
    static constexpr zccl_datatype_t dt = ZCCL_FLOAT32;
    static double to(T x) { return x; }
    static T from(double v) { return (float)v; }
};
struct BF16 { /* bfloat16 parameters, float32 master: the mixed-precision case */
    using T = uint16_t;
    using M = float;
    static constexpr zccl_datatype_t dt = ZCCL_BFLOAT16;
    static double to(T x) { return zccl_bf16_to_float(x); }
    static T from(double v) { return zccl_float_to_bf16((float)v); }
};

/* The reference: one process, the summed gradient of every element, AdamW with the master/moments rounded to M. */
template <typename P, typename T = typename P::T, typename M = typename P::M>
std::vector<std::vector<T>> reference(int nranks, int accum) {
    std::vector<std::vector<T>> p(kNumel.size());
    std::vector<std::vector<M>> master(kNumel.size()), m(kNumel.size()), v(kNumel.size());
    for (size_t i = 0; i < kNumel.size(); i++) {
        p[i].resize(kNumel[i]);
        master[i].resize(kNumel[i]);
        m[i].assign(kNumel[i], 0);
        v[i].assign(kNumel[i], 0);
        for (size_t j = 0; j < kNumel[i]; j++) {
            p[i][j] = P::from(init_value((int)i, j));
            master[i][j] = (M)P::to(p[i][j]);
        }
    }
    for (int s = 0; s < kSteps; s++) {
        const double bc1 = 1.0 - pow(kHp.beta1, s + 1), bc2 = 1.0 - pow(kHp.beta2, s + 1);
        for (size_t i = 0; i < kNumel.size(); i++)
            for (size_t j = 0; j < kNumel[i]; j++) {
                double g = 0;
                for (int r = 0; r < nranks; r++)
                    for (int u = 0; u < accum; u++) g += grad_value(r, s, u, (int)i, j);
                g = P::to(P::from(g)) * kHp.grad_scale;
                m[i][j] = (M)(kHp.beta1 * (double)m[i][j] + (1.0 - kHp.beta1) * g);
                v[i][j] = (M)(kHp.beta2 * (double)v[i][j] + (1.0 - kHp.beta2) * g * g);
                double x = master[i][j];
                if (j < decay_of((int)i)) x -= kHp.lr * kHp.weight_decay * x;
                x -= kHp.lr * ((double)m[i][j] / bc1) / (sqrt((double)v[i][j] / bc2) + kHp.eps);
                master[i][j] = (M)x;
                p[i][j] = P::from((double)master[i][j]);
            }
    }
    return p;
}

/* Trains kSteps steps; offload on: zccl_zero_offload; off: the test's AdamW on the plan's shard + all-gather. */
template <typename P>
int train_body(zccl_comm_t comm, int rank, int nranks, zccl_bucket_mode_t mode, bool offload, int pin) {
    using T = typename P::T;
    using M = typename P::M;
    const int np = (int)kNumel.size();
    const zccl_datatype_t dt = P::dt;
    if (!offload && sizeof(M) != sizeof(T)) {
        child_log(rank, "the caller-side path keeps no separate master copy: float32 and float64 only");
        return 1;
    }
    const int accum = mode == ZCCL_BUCKET_REDUCE_SCATTER ? kAccum : 1; /* ZeRO-1: accumulation is local anyway */
    zccl_bucket_options_t bo = {};
    bo.first_bytes = 40 * sizeof(T);
    bo.cap_bytes = 120 * sizeof(T);
    bo.align_elems = 4;
    bo.mode = mode;
    bo.max_in_flight = 2;
    zccl_bucket_plan_t plan = nullptr;
    ZT_CHILD_OK(zccl_bucket_plan_create(comm, np, kNumel.data(), dt, &bo, &plan));
    int nb = 0;
    ZT_CHILD_OK(zccl_bucket_count(plan, &nb));
    ZT_CHILD_CHECK(nb >= 3, "want several buckets, got %d", nb);
    std::vector<zccl_bucket_info_t> info((size_t)nb);
    std::vector<int> pb((size_t)np);
    std::vector<size_t> poff((size_t)np);
    for (int b = 0; b < nb; b++) ZT_CHILD_OK(zccl_bucket_info(plan, b, &info[(size_t)b]));
    for (int i = 0; i < np; i++) ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &pb[(size_t)i], &poff[(size_t)i]));
    std::vector<std::vector<T>> params((size_t)nb);
    std::vector<void *> pptr((size_t)nb);
    for (int b = 0; b < nb; b++) {
        params[(size_t)b].assign(info[(size_t)b].elems, (T)0);
        pptr[(size_t)b] = params[(size_t)b].data();
    }
    for (int i = 0; i < np; i++)
        for (size_t j = 0; j < kNumel[(size_t)i]; j++)
            params[(size_t)pb[(size_t)i]][poff[(size_t)i] + j] = P::from(init_value(i, j));
    std::vector<size_t> decay((size_t)np);
    for (int i = 0; i < np; i++) decay[(size_t)i] = decay_of(i);

    zccl_zero_offload_t off = nullptr;
    std::vector<std::vector<M>> m((size_t)nb), v((size_t)nb); /* offload off: the caller's state */
    if (offload) {
        zccl_zero_offload_options_t oo = {};
        oo.pin_memory = pin;
        ZT_CHILD_OK(zccl_zero_offload_create(plan, pptr.data(), decay.data(), &oo, &off));
    } else {
        for (int b = 0; b < nb; b++) {
            m[(size_t)b].assign(info[(size_t)b].shard_elems, 0);
            v[(size_t)b].assign(info[(size_t)b].shard_elems, 0);
        }
    }
    for (int s = 0; s < kSteps; s++) {
        for (int u = 0; u < accum; u++) {
            ZT_CHILD_OK(zccl_bucket_begin(plan, u == accum - 1));
            for (int i = np - 1; i >= 0; i--) { /* backward: last parameter first */
                T *g = nullptr;
                ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, (void **)&g));
                for (size_t j = 0; j < kNumel[(size_t)i]; j++) g[j] = P::from(P::to(g[j]) + grad_value(rank, s, u, i, j));
                ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
            }
            ZT_CHILD_OK(zccl_bucket_finish(plan));
        }
        if (offload) {
            ZT_CHILD_OK(zccl_zero_offload_step(off, &kHp));
            continue;
        }
        const double bc1 = 1.0 - pow(kHp.beta1, s + 1), bc2 = 1.0 - pow(kHp.beta2, s + 1);
        for (int b = 0; b < nb; b++) {
            const zccl_bucket_info_t &bi = info[(size_t)b];
            const T *g = (const T *)bi.shard;
            T *p = params[(size_t)b].data() + bi.shard_offset;
            for (size_t k = 0; k < bi.shard_elems; k++) {
                const size_t e = bi.shard_offset + k; /* element of the bucket: which parameter, decays? */
                bool dec = false;
                for (int i = 0; i < np; i++)
                    if (pb[(size_t)i] == b && e >= poff[(size_t)i] && e < poff[(size_t)i] + decay[(size_t)i]) dec = true;
                const double gi = P::to(g[k]) * kHp.grad_scale;
                m[(size_t)b][k] = (M)(kHp.beta1 * (double)m[(size_t)b][k] + (1.0 - kHp.beta1) * gi);
                v[(size_t)b][k] = (M)(kHp.beta2 * (double)v[(size_t)b][k] + (1.0 - kHp.beta2) * gi * gi);
                double x = P::to(p[k]);
                if (dec) x -= kHp.lr * kHp.weight_decay * x;
                x -= kHp.lr * ((double)m[(size_t)b][k] / bc1) / (sqrt((double)v[(size_t)b][k] / bc2) + kHp.eps);
                p[k] = P::from(x);
            }
            ZT_CHILD_OK(zccl_allgather(p, params[(size_t)b].data(), bi.shard_elems, dt, comm, nullptr));
        }
    }
    const auto ref = reference<P>(nranks, accum);
    for (int i = 0; i < np; i++)
        for (size_t j = 0; j < kNumel[(size_t)i]; j++) {
            const T got = params[(size_t)pb[(size_t)i]][poff[(size_t)i] + j], want = ref[(size_t)i][j];
            ZT_CHILD_CHECK(memcmp(&got, &want, sizeof got) == 0, "param %d elem %zu: %.17g, reference %.17g (offload %d)",
                        i, j, P::to(got), P::to(want), (int)offload);
        }
    if (offload) {
        zccl_zero_offload_stats_t st = {};
        ZT_CHILD_OK(zccl_zero_offload_stats(off, &st));
        size_t S = 0;
        for (auto &bi : info) S += bi.shard_elems;
        ZT_CHILD_CHECK(st.steps == (uint64_t)kSteps, "steps %llu", (unsigned long long)st.steps);
        ZT_CHILD_CHECK(st.host_state_bytes == 3 * S * sizeof(M), "state bytes %zu, want %zu", st.host_state_bytes,
                    3 * S * sizeof(M));
        ZT_CHILD_CHECK(st.host_staging_bytes == S * sizeof(T), "staging bytes %zu", st.host_staging_bytes);
        ZT_CHILD_CHECK(st.pinned_bytes == 0, "pinned %zu without a CUDA driver", st.pinned_bytes);
        /* every bucket's shard was copied as its collective completed, none by the step */
        ZT_CHILD_CHECK(st.grad_copies_overlapped == (uint64_t)(kSteps * nb) && st.grad_copies_at_step == 0,
                    "copies overlapped %llu, at step %llu (want %d, 0)", (unsigned long long)st.grad_copies_overlapped,
                    (unsigned long long)st.grad_copies_at_step, kSteps * nb);
        size_t sb = 0, gb = 0;
        ZT_CHILD_OK(zccl_zero_offload_host_bytes(plan, 0, &sb, &gb));
        ZT_CHILD_CHECK(sb == st.host_state_bytes && gb == st.host_staging_bytes, "host_bytes %zu %zu", sb, gb);
        /* the window was stepped: a second step on it is refused, naming the cause */
        zccl_result_t r = zccl_zero_offload_step(off, &kHp);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && strstr(zccl_get_last_error(nullptr), "already used"),
                    "second step: %d %s", (int)r, zccl_get_last_error(nullptr));
        zccl_zero_offload_destroy(off);
    }
    zccl_bucket_plan_destroy(plan);
    return 0;
}

TEST(ZeroOffload, Zero2Float64OnAndOffMatchTheReference) {
    for (bool on : {false, true})
        run_ranks(3, [&](zccl_comm_t c, int r, int n) {
            return train_body<F64>(c, r, n, ZCCL_BUCKET_REDUCE_SCATTER, on, 1);
        }, deadline_options(90));
}

TEST(ZeroOffload, Zero1Float32OnAndOffMatchTheReference) {
    for (bool on : {false, true})
        run_ranks(3, [&](zccl_comm_t c, int r, int n) {
            return train_body<F32>(c, r, n, ZCCL_BUCKET_ALLREDUCE, on, 0);
        }, deadline_options(90));
}

TEST(ZeroOffload, Zero2Float32TwoRanks) {
    run_ranks(2, [&](zccl_comm_t c, int r, int n) {
        return train_body<F32>(c, r, n, ZCCL_BUCKET_REDUCE_SCATTER, true, 0);
    }, deadline_options(90));
}

/* Mixed precision: bfloat16 parameters and gradients, float32 master and moments on the host. */
TEST(ZeroOffload, Zero2Bfloat16WithFloat32MasterMatchesTheReference) {
    run_ranks(3, [&](zccl_comm_t c, int r, int n) {
        return train_body<BF16>(c, r, n, ZCCL_BUCKET_REDUCE_SCATTER, true, 0);
    }, deadline_options(90));
}

TEST(ZeroOffload, ArgumentErrors) {
    zccl_zero_offload_t off = nullptr;
    EXPECT_EQ(zccl_zero_offload_create(nullptr, nullptr, nullptr, nullptr, &off), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(strstr(zccl_get_last_error(nullptr), "'plan'"), nullptr);
    zccl_bucket_plan_t layout = nullptr;
    ASSERT_EQ(zccl_bucket_layout_create(2, (int)kNumel.size(), kNumel.data(), ZCCL_FLOAT32, nullptr, &layout),
              ZCCL_SUCCESS);
    void *bufs[8] = {};
    EXPECT_EQ(zccl_zero_offload_create(layout, bufs, nullptr, nullptr, &off), ZCCL_INVALID_USAGE);
    EXPECT_NE(strstr(zccl_get_last_error(nullptr), "layout"), nullptr);
    EXPECT_EQ(off, nullptr);
    EXPECT_EQ(zccl_zero_offload_step(nullptr, &kHp), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(zccl_zero_offload_host_bytes(nullptr, 0, nullptr, nullptr), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(zccl_zero_offload_destroy(nullptr), ZCCL_SUCCESS);
    zccl_bucket_plan_destroy(layout);
}

/* Wrong use is an error naming its cause, and the offload keeps working afterwards. */
TEST(ZeroOffload, UsageErrorsNameTheirCause) {
    run_ranks(2, [](zccl_comm_t comm, int rank, int) -> int {
        const int np = (int)kNumel.size();
        zccl_bucket_options_t bo = {};
        bo.mode = ZCCL_BUCKET_REDUCE_SCATTER;
        bo.first_bytes = 160;
        bo.cap_bytes = 480;
        zccl_bucket_plan_t plan = nullptr;
        ZT_CHILD_OK(zccl_bucket_plan_create(comm, np, kNumel.data(), ZCCL_FLOAT32, &bo, &plan));
        int nb = 0;
        ZT_CHILD_OK(zccl_bucket_count(plan, &nb));
        std::vector<std::vector<float>> params((size_t)nb);
        std::vector<void *> pptr((size_t)nb);
        for (int b = 0; b < nb; b++) {
            zccl_bucket_info_t bi;
            ZT_CHILD_OK(zccl_bucket_info(plan, b, &bi));
            params[(size_t)b].assign(bi.elems, 0.5f);
            pptr[(size_t)b] = params[(size_t)b].data();
        }
        zccl_zero_offload_t off = nullptr, off2 = nullptr;
        std::vector<size_t> too_many(kNumel);
        too_many[2] += 1;
        zccl_result_t r = zccl_zero_offload_create(plan, pptr.data(), too_many.data(), nullptr, &off);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(nullptr), "decay_elems[2] = 6"),
                    "decay_elems: %d %s", (int)r, zccl_get_last_error(nullptr));
        std::vector<void *> holes(pptr);
        holes[1] = nullptr;
        r = zccl_zero_offload_create(plan, holes.data(), nullptr, nullptr, &off);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(nullptr), "bucket_params[1] is NULL"),
                    "NULL bucket: %d %s", (int)r, zccl_get_last_error(nullptr));
        ZT_CHILD_OK(zccl_zero_offload_create(plan, pptr.data(), nullptr, nullptr, &off));
        r = zccl_zero_offload_create(plan, pptr.data(), nullptr, nullptr, &off2);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && strstr(zccl_get_last_error(nullptr), "already has an offload") &&
                        off2 == nullptr, "second offload: %d %s", (int)r, zccl_get_last_error(nullptr));
        r = zccl_zero_offload_step(off, &kHp);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && strstr(zccl_get_last_error(nullptr), "no gradient for bucket 0"),
                    "step before any window: %d %s", (int)r, zccl_get_last_error(nullptr));
        zccl_zero_adamw_t bad = kHp;
        bad.beta1 = 1.0;
        r = zccl_zero_offload_step(off, &bad);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(nullptr), "beta1 1"),
                    "beta1 = 1: %d %s", (int)r, zccl_get_last_error(nullptr));
        ZT_CHILD_OK(zccl_bucket_begin(plan, 1));
        r = zccl_zero_offload_step(off, &kHp);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_USAGE && strstr(zccl_get_last_error(nullptr), "micro-step of the plan is open"),
                    "step in a micro-step: %d %s", (int)r, zccl_get_last_error(nullptr));
        for (int i = np - 1; i >= 0; i--) {
            float *g = nullptr;
            ZT_CHILD_OK(zccl_bucket_grad_ptr(plan, i, (void **)&g));
            for (size_t j = 0; j < kNumel[(size_t)i]; j++) g[j] += 1.0f;
            ZT_CHILD_OK(zccl_bucket_mark_ready(plan, i));
        }
        ZT_CHILD_OK(zccl_bucket_finish(plan));
        ZT_CHILD_OK(zccl_zero_offload_step(off, &kHp)); /* works after the errors */
        /* AdamW's first step moves every element by lr (m/bc1 = g, sqrt(v/bc2) = |g|) after decay. */
        const double want = (0.5 - 0.01 * 0.1 * 0.5) - 0.01 * 0.25 / (0.25 + 1e-8); /* g = 2 ranks x 1 x 0.125 */
        for (int i = 0; i < np; i++) {
            int b;
            size_t o;
            ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &b, &o));
            ZT_CHILD_CHECK(params[(size_t)b][o] == (float)want, "param %d: %.9g, want %.9g", i,
                        (double)params[(size_t)b][o], want);
        }
        zccl_zero_offload_destroy(off);
        /* destroyed: the plan takes another offload */
        ZT_CHILD_OK(zccl_zero_offload_create(plan, pptr.data(), nullptr, nullptr, &off));
        zccl_zero_offload_destroy(off);
        zccl_bucket_plan_destroy(plan);
        return 0;
    }, deadline_options(60));
}

/* The fake driver's test hooks (tests/fake_cuda/fake_cuda.c), from the file zccl loaded. */
struct Fake {
    void (*mark)(const void *, size_t, int);
    void (*unmark)(const void *);
};
bool open_fake(Fake *f) {
    void *h = dlopen(ZCCL_FAKE_CUDA_PATH, RTLD_NOW);
    if (!h) return false;
    *(void **)&f->mark = dlsym(h, "fake_cuda_mark");
    *(void **)&f->unmark = dlsym(h, "fake_cuda_unmark");
    return f->mark && f->unmark;
}

/* ZeRO-2 with device gradients and device parameters (fake driver): the caller reduce-scatters on device buckets,
 * the offload copies device shards to the host on its side stream, steps on the CPU, copies back and all-gathers
 * on the device buffers. float32 (the fake driver runs the float32 SUM kernel). */
int fake_device_body(zccl_comm_t comm, int rank, int nranks) {
    Fake fk;
    ZT_CHILD_CHECK(open_fake(&fk), "cannot open the fake driver %s", ZCCL_FAKE_CUDA_PATH);
    const int np = (int)kNumel.size();
    zccl_bucket_options_t bo = {};
    bo.first_bytes = 160;
    bo.cap_bytes = 480;
    bo.align_elems = 4;
    bo.mode = ZCCL_BUCKET_REDUCE_SCATTER;
    zccl_bucket_plan_t plan = nullptr;
    ZT_CHILD_OK(zccl_bucket_plan_create(comm, np, kNumel.data(), ZCCL_FLOAT32, &bo, &plan));
    int nb = 0;
    ZT_CHILD_OK(zccl_bucket_count(plan, &nb));
    std::vector<zccl_bucket_info_t> info((size_t)nb);
    std::vector<int> pb((size_t)np);
    std::vector<size_t> poff((size_t)np);
    for (int b = 0; b < nb; b++) ZT_CHILD_OK(zccl_bucket_info(plan, b, &info[(size_t)b]));
    for (int i = 0; i < np; i++) ZT_CHILD_OK(zccl_bucket_param_loc(plan, i, &pb[(size_t)i], &poff[(size_t)i]));
    /* "device" buffers: host memory marked for the fake driver; the test writes them as a kernel would */
    std::vector<float *> dparams((size_t)nb), dgrad((size_t)nb), dshard((size_t)nb);
    for (int b = 0; b < nb; b++) {
        const size_t e = info[(size_t)b].elems, s = info[(size_t)b].shard_elems;
        dparams[(size_t)b] = (float *)calloc(e, sizeof(float));
        dgrad[(size_t)b] = (float *)calloc(e, sizeof(float));
        dshard[(size_t)b] = (float *)calloc(s, sizeof(float));
        fk.mark(dparams[(size_t)b], e * sizeof(float), 0);
        fk.mark(dgrad[(size_t)b], e * sizeof(float), 0);
        fk.mark(dshard[(size_t)b], s * sizeof(float), 0);
    }
    for (int i = 0; i < np; i++)
        for (size_t j = 0; j < kNumel[(size_t)i]; j++)
            dparams[(size_t)pb[(size_t)i]][poff[(size_t)i] + j] = (float)init_value(i, j);
    std::vector<size_t> decay((size_t)np);
    for (int i = 0; i < np; i++) decay[(size_t)i] = decay_of(i);
    zccl_zero_offload_t off = nullptr;
    zccl_zero_offload_options_t oo = {};
    oo.pin_memory = 1;
    if (nb > 1) { /* host and device parameter buffers mixed: refused */
        std::vector<void *> mixed(dparams.begin(), dparams.end());
        std::vector<float> host(info[1].elems);
        mixed[1] = host.data();
        zccl_result_t r = zccl_zero_offload_create(plan, mixed.data(), decay.data(), &oo, &off);
        ZT_CHILD_CHECK(r == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(nullptr), "bucket_params[1] is host"),
                    "mixed memory: %d %s", (int)r, zccl_get_last_error(nullptr));
    }
    ZT_CHILD_OK(zccl_zero_offload_create(plan, (void *const *)dparams.data(), decay.data(), &oo, &off));
    for (int s = 0; s < kSteps; s++) {
        for (int b = 0; b < nb; b++) {
            float *g = dgrad[(size_t)b];
            memset(g, 0, info[(size_t)b].elems * sizeof(float));
            for (int i = 0; i < np; i++)
                if (pb[(size_t)i] == b)
                    for (size_t j = 0; j < kNumel[(size_t)i]; j++)
                        for (int u = 0; u < kAccum; u++) g[poff[(size_t)i] + j] += (float)grad_value(rank, s, u, i, j);
            ZT_CHILD_OK(zccl_reduce_scatter(g, dshard[(size_t)b], info[(size_t)b].shard_elems, ZCCL_FLOAT32, ZCCL_SUM,
                                         comm, nullptr));
            ZT_CHILD_OK(zccl_zero_offload_grad_shard(off, b, dshard[(size_t)b]));
        }
        ZT_CHILD_OK(zccl_zero_offload_step(off, &kHp));
    }
    const auto ref = reference<F32>(nranks, kAccum);
    for (int i = 0; i < np; i++)
        for (size_t j = 0; j < kNumel[(size_t)i]; j++) {
            const float got = dparams[(size_t)pb[(size_t)i]][poff[(size_t)i] + j], want = ref[(size_t)i][j];
            ZT_CHILD_CHECK(memcmp(&got, &want, sizeof got) == 0, "param %d elem %zu: %.9g, reference %.9g", i, j,
                        (double)got, (double)want);
        }
    zccl_zero_offload_stats_t st = {};
    ZT_CHILD_OK(zccl_zero_offload_stats(off, &st));
    size_t S = 0;
    for (auto &bi : info) S += bi.shard_elems;
    ZT_CHILD_CHECK(st.params_on_device == 1, "parameters not seen as device memory");
    /* per step: one device-to-host copy per bucket (grad_shard), plus the initial read of the parameters is
     * waited for at creation (not counted) */
    ZT_CHILD_CHECK(st.device_copies == (uint64_t)(kSteps * nb), "device copies %llu, want %d",
                (unsigned long long)st.device_copies, kSteps * nb);
    ZT_CHILD_CHECK(st.host_staging_bytes == 2 * S * sizeof(float), "staging %zu, want %zu", st.host_staging_bytes,
                2 * S * sizeof(float));
    ZT_CHILD_CHECK(st.pinned_bytes == st.host_state_bytes + st.host_staging_bytes,
                "pinned %zu of %zu + %zu (the fake driver pins)", st.pinned_bytes, st.host_state_bytes,
                st.host_staging_bytes);
    zccl_zero_offload_destroy(off);
    zccl_bucket_plan_destroy(plan);
    for (int b = 0; b < nb; b++) {
        fk.unmark(dparams[(size_t)b]);
        fk.unmark(dgrad[(size_t)b]);
        fk.unmark(dshard[(size_t)b]);
        free(dparams[(size_t)b]);
        free(dgrad[(size_t)b]);
        free(dshard[(size_t)b]);
    }
    return 0;
}

TEST(ZeroOffload, FakeDeviceGradientsAndParametersMatchTheReference) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    Options o = deadline_options(120);
    o.env = {{"ZCCL_CUDA_LIBRARY", std::string(ZCCL_FAKE_CUDA_PATH)}};
    run_ranks(3, fake_device_body, o);
}

}  // namespace

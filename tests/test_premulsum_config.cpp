/*
 * test_premulsum_config.cpp — PreMulSum reductions (zccl_redop_create_premulsum) and configured / non-blocking
 * communicators (zccl_config_t, zccl_comm_init_rank_config, zccl_comm_split_config, zccl_comm_finalize).
 *
 * PreMulSum: allreduce, reduce, reduce_scatter with a handle over int32, float32, float64, float16, bfloat16, fp8
 * E4M3 and E5M2 on 1-4 ranks (shm and tcp), scalar read at creation (HOST_IMMEDIATE) and at issue (DEVICE residence
 * on host memory); inputs are chosen so that every product and sum is exact in every type, so the expected value
 * sum_r scalar * x_r is computed here exactly. Errors: a handle of another communicator, after destroy, with another
 * datatype, a device pointer that is not host memory, destroy of a built-in op; handle numbers start at 5 and are
 * reused.
 * Config: wrong size / magic / version / blocking name the field; comm_name appears in the log lines; blocking = 0:
 * creation returns ZCCL_IN_PROGRESS, collectives return ZCCL_IN_PROGRESS and zccl_comm_get_async_error reports it until
 * the creation completes (rank 2 joins 600 ms late so the others see it), then results are right; a non-blocking
 * creation that fails (init timeout) reports the error through zccl_comm_get_async_error and the handle is destroyed
 * cleanly; finalize completes queued operations.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {


/* Encodings written from the format definitions for the few exact values used here (x = 0..3 and the scalars). */
uint16_t f16_of(double v) { /* v in {0, 0.5, 1, ..., 16}, exact */
    if (v == 0) return 0;
    int e;
    double m = std::frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    return (uint16_t)(((e - 1 + 15) << 10) | (uint16_t)std::lround((m * 2 - 1) * 1024));
}
uint16_t bf16_of(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact values: the low half is zero */
}
uint8_t e4m3_of(double v) {
    if (v == 0) return 0;
    int e;
    double m = std::frexp(v, &e);
    return (uint8_t)(((e - 1 + 7) << 3) | (uint8_t)std::lround((m * 2 - 1) * 8));
}
uint8_t e5m2_of(double v) {
    if (v == 0) return 0;
    int e;
    double m = std::frexp(v, &e);
    return (uint8_t)(((e - 1 + 15) << 2) | (uint8_t)std::lround((m * 2 - 1) * 4));
}

/* Writes value v (exactly representable) as element i of a buffer of type dt. */
void put(zccl_datatype_t dt, void *buf, size_t i, double v) {
    uint8_t *b = (uint8_t *)buf;
    switch (dt) {
    case ZCCL_INT32: { int32_t x = (int32_t)v; memcpy(b + 4 * i, &x, 4); break; }
    case ZCCL_FLOAT32: { float x = (float)v; memcpy(b + 4 * i, &x, 4); break; }
    case ZCCL_FLOAT64: memcpy(b + 8 * i, &v, 8); break;
    case ZCCL_FLOAT16: { uint16_t x = f16_of(v); memcpy(b + 2 * i, &x, 2); break; }
    case ZCCL_BFLOAT16: { uint16_t x = bf16_of(v); memcpy(b + 2 * i, &x, 2); break; }
    case ZCCL_FLOAT8E4M3: b[i] = e4m3_of(v); break;
    case ZCCL_FLOAT8E5M2: b[i] = e5m2_of(v); break;
    default: break;
    }
}

/* x_r[i] = (i + r) % 4; scalar 0.5 for floating types (3 for int32). With up to 4 ranks the sum is at most 6 (in
 * steps of 0.5), exact in every type including E4M3 ([4, 8) has step 0.5) and E5M2 ([4, 8) has step 1: so for
 * E5M2 the scalar is 1 and the values stay integers). */
double scalar_of(zccl_datatype_t dt) { return dt == ZCCL_INT32 ? 3.0 : dt == ZCCL_FLOAT8E5M2 ? 1.0 : 0.5; }

int premul_body(zccl_comm_t comm, int rank, int n) {
    const zccl_datatype_t types[] = {ZCCL_INT32, ZCCL_FLOAT32, ZCCL_FLOAT64, ZCCL_FLOAT16, ZCCL_BFLOAT16,
                                     ZCCL_FLOAT8E4M3, ZCCL_FLOAT8E5M2};
    const size_t c = 37;
    for (zccl_datatype_t dt : types) {
        const size_t es = zccl_type_size(dt);
        const double sc = scalar_of(dt);
        for (int residence : {ZCCL_SCALAR_HOST_IMMEDIATE, ZCCL_SCALAR_DEVICE}) {
            std::vector<uint8_t> scal(8, 0), in((size_t)n * c * es), out((size_t)n * c * es), want((size_t)n * c * es);
            /* DEVICE residence: the value is read when the operation is issued, so write a wrong one first */
            put(dt, scal.data(), 0, residence == ZCCL_SCALAR_DEVICE ? 0.0 : sc);
            zccl_redop_t op;
            zccl_result_t res = zccl_redop_create_premulsum(&op, scal.data(), dt, (zccl_scalar_residence_t)residence, comm);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "create_premulsum dt %d: %s", dt, zccl_get_last_error(comm));
            ZT_CHILD_CHECK(op == (zccl_redop_t)5, "first handle is %d, want 5", (int)op);
            put(dt, scal.data(), 0, sc);
            for (size_t i = 0; i < (size_t)n * c; i++) {
                put(dt, in.data(), i, (double)((i + (size_t)rank) % 4));
                double s = 0;
                for (int r = 0; r < n; r++) s += sc * (double)((i + (size_t)r) % 4);
                put(dt, want.data(), i, s);
            }
            res = zccl_allreduce(in.data(), out.data(), c, dt, op, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "allreduce premulsum dt %d: %s", dt, zccl_get_last_error(comm));
            ZT_CHILD_CHECK(memcmp(out.data(), want.data(), c * es) == 0, "allreduce premulsum dt %d residence %d: wrong result", dt,
                   residence);
            /* in place */
            std::vector<uint8_t> io(in.begin(), in.begin() + (long)(c * es));
            res = zccl_allreduce(io.data(), io.data(), c, dt, op, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS && memcmp(io.data(), want.data(), c * es) == 0, "in-place allreduce premulsum dt %d", dt);
            /* reduce to the last rank */
            std::fill(out.begin(), out.end(), 0);
            res = zccl_reduce(in.data(), out.data(), c, dt, op, n - 1, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "reduce premulsum: %s", zccl_get_last_error(comm));
            ZT_CHILD_CHECK(rank != n - 1 || memcmp(out.data(), want.data(), c * es) == 0, "reduce premulsum dt %d wrong", dt);
            /* reduce-scatter: block `rank` of the full vector */
            res = zccl_reduce_scatter(in.data(), out.data(), c, dt, op, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "reduce_scatter premulsum: %s", zccl_get_last_error(comm));
            ZT_CHILD_CHECK(memcmp(out.data(), want.data() + (size_t)rank * c * es, c * es) == 0, "reduce_scatter premulsum dt %d", dt);
            /* a handle is valid for its datatype only */
            const zccl_datatype_t other = dt == ZCCL_INT32 ? ZCCL_FLOAT32 : ZCCL_INT32;
            res = zccl_allreduce(in.data(), out.data(), c, other, op, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(comm), "'op'"), "handle with another datatype: %d %s",
                   res, zccl_get_last_error(comm));
            ZT_CHILD_CHECK(zccl_redop_destroy(op, comm) == ZCCL_SUCCESS, "destroy: %s", zccl_get_last_error(comm));
            res = zccl_allreduce(in.data(), out.data(), c, dt, op, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(comm), "destroyed"),
                   "handle after destroy: %d %s", res, zccl_get_last_error(comm));
            ZT_CHILD_CHECK(zccl_redop_destroy(op, comm) == ZCCL_INVALID_ARGUMENT, "double destroy must fail");
        }
    }
    /* numbering: 5, 6; 5 reused after its destroy */
    float one = 1.0f;
    zccl_redop_t a, b, d;
    ZT_CHILD_CHECK(zccl_redop_create_premulsum(&a, &one, ZCCL_FLOAT32, ZCCL_SCALAR_HOST_IMMEDIATE, comm) == ZCCL_SUCCESS &&
               zccl_redop_create_premulsum(&b, &one, ZCCL_FLOAT32, ZCCL_SCALAR_HOST_IMMEDIATE, comm) == ZCCL_SUCCESS,
           "create two");
    ZT_CHILD_CHECK(a == 5 && b == 6, "handles %d %d, want 5 6", (int)a, (int)b);
    zccl_redop_destroy(a, comm);
    ZT_CHILD_CHECK(zccl_redop_create_premulsum(&d, &one, ZCCL_FLOAT32, ZCCL_SCALAR_HOST_IMMEDIATE, comm) == ZCCL_SUCCESS && d == 5,
           "freed number reused: got %d", (int)d);
    /* a handle of another communicator */
    zccl_comm_t other;
    ZT_CHILD_CHECK(zccl_comm_split(comm, 0, rank, &other) == ZCCL_SUCCESS, "split: %s", zccl_get_last_error(comm));
    float x = 1, y = 0;
    zccl_result_t res = zccl_allreduce(&x, &y, 1, ZCCL_FLOAT32, b, other, nullptr);
    ZT_CHILD_CHECK(res == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(other), "another communicator"),
           "handle of another communicator: %d %s", res, zccl_get_last_error(other));
    ZT_CHILD_CHECK(zccl_redop_destroy(b, other) == ZCCL_INVALID_ARGUMENT, "destroy on another communicator must fail");
    zccl_comm_destroy(other);
    /* built-in ops are not handles; device scalars that are not host memory */
    ZT_CHILD_CHECK(zccl_redop_destroy(ZCCL_SUM, comm) == ZCCL_INVALID_ARGUMENT, "destroy(ZCCL_SUM) must fail");
    res = zccl_redop_create_premulsum(&a, (void *)0x10, ZCCL_FLOAT32, ZCCL_SCALAR_DEVICE, comm);
    ZT_CHILD_CHECK(res == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(comm), "device-resident scalars need GPU memory support"),
           "device scalar: %d %s", res, zccl_get_last_error(comm));
    res = zccl_redop_create_premulsum(&a, &one, ZCCL_FLOAT32, (zccl_scalar_residence_t)7, comm);
    ZT_CHILD_CHECK(res == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(comm), "residence"), "bad residence");
    return 0;
}

/* fp8 through the collectives (the kernels are tested exhaustively in test_fp8.cpp): every op on values whose
 * results are exact in both formats. x_r[i] = 1 + (i + r) % 2 (1 or 2): sums <= 8, products <= 16, AVG (on 1, 2
 * and 4 ranks: power-of-two divisors) multiples of 1/4, all exact. */
int fp8_body(zccl_comm_t comm, int rank, int n) {
    const size_t c = 101;
    for (zccl_datatype_t dt : {ZCCL_FLOAT8E4M3, ZCCL_FLOAT8E5M2}) {
        for (zccl_redop_t op : {ZCCL_SUM, ZCCL_PROD, ZCCL_MAX, ZCCL_MIN, ZCCL_AVG}) {
            if (op == ZCCL_AVG && (n & (n - 1))) continue;
            std::vector<uint8_t> in(c), out(c), want(c);
            for (size_t i = 0; i < c; i++) {
                put(dt, in.data(), i, 1.0 + (double)((i + (size_t)rank) % 2));
                double acc = op == ZCCL_PROD ? 1 : op == ZCCL_MIN ? 1e9 : op == ZCCL_MAX ? -1e9 : 0;
                for (int r = 0; r < n; r++) {
                    const double v = 1.0 + (double)((i + (size_t)r) % 2);
                    acc = op == ZCCL_PROD ? acc * v : op == ZCCL_MAX ? std::max(acc, v) : op == ZCCL_MIN ? std::min(acc, v) : acc + v;
                }
                if (op == ZCCL_AVG) acc /= n;
                put(dt, want.data(), i, acc);
            }
            zccl_result_t res = zccl_allreduce(in.data(), out.data(), c, dt, op, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "fp8 allreduce dt %d op %d: %s", dt, op, zccl_get_last_error(comm));
            for (size_t i = 0; i < c; i++)
                ZT_CHILD_CHECK(out[i] == want[i], "fp8 allreduce dt %d op %d [%zu] = 0x%02x, want 0x%02x", dt, op, i, out[i], want[i]);
        }
    }
    return 0;
}

class PreMulSum : public ::testing::TestWithParam<std::tuple<std::string, int>> {};
TEST_P(PreMulSum, EveryTypeAndHandleRules) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::get<0>(GetParam())}, {"ZCCL_TIMEOUT_MS", std::string("60000")}};
    run_ranks(std::get<1>(GetParam()), premul_body, o);
}
TEST_P(PreMulSum, Fp8EveryOpThroughAllreduce) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::get<0>(GetParam())}, {"ZCCL_TIMEOUT_MS", std::string("60000")}};
    run_ranks(std::get<1>(GetParam()), fp8_body, o);
}
INSTANTIATE_TEST_SUITE_P(Transports, PreMulSum,
                         ::testing::Combine(::testing::Values(std::string("shm"), std::string("tcp")),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>> &i) {
                             return std::get<0>(i.param) + "_" + std::to_string(std::get<1>(i.param));
                         });

/* ---- config ------------------------------------------------------------------------------------------------ */

TEST(Config, WrongFieldsAreNamed) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    zccl_comm_t comm = nullptr;
    struct Case { const char *field; zccl_config_t cfg; } cases[] = {
        {"'magic'", ZCCL_CONFIG_INITIALIZER}, {"'size'", ZCCL_CONFIG_INITIALIZER},
        {"'version'", ZCCL_CONFIG_INITIALIZER}, {"'blocking'", ZCCL_CONFIG_INITIALIZER},
        {"'split_share'", ZCCL_CONFIG_INITIALIZER}};
    cases[0].cfg.magic = 0x12345678;
    cases[1].cfg.size = 4;
    cases[2].cfg.version = ZCCL_VERSION_CODE + 100;
    cases[3].cfg.blocking = 2;
    cases[4].cfg.split_share = -1;
    for (auto &c : cases) {
        EXPECT_EQ(zccl_comm_init_rank_config(&comm, 1, id, 0, &c.cfg), ZCCL_INVALID_ARGUMENT) << c.field;
        EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find(c.field), std::string::npos)
            << c.field << ": " << zccl_get_last_error(nullptr);
        EXPECT_EQ(comm, nullptr);
    }
    /* NULL config: the defaults; a named blocking communicator works like any other */
    zccl_config_t cfg = ZCCL_CONFIG_INITIALIZER;
    cfg.comm_name = "solo";
    ASSERT_EQ(zccl_comm_init_rank_config(&comm, 1, id, 0, &cfg), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    int x = 3, y = 0;
    EXPECT_EQ(zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr), ZCCL_SUCCESS);
    EXPECT_EQ(y, 3);
    zccl_comm_t sub = nullptr;
    zccl_config_t bad = ZCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    EXPECT_EQ(zccl_comm_split_config(comm, 0, 0, &sub, &bad), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("'magic'"), std::string::npos);
    EXPECT_EQ(zccl_comm_finalize(comm), ZCCL_SUCCESS);
    EXPECT_EQ(zccl_comm_finalize(nullptr), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(zccl_comm_destroy(comm), ZCCL_SUCCESS);
}

struct NbShared {
    int saw_in_progress[8];
};

}  // namespace
extern "C" int zccl__log_level; /* util/core.h: the parent process already read ZCCL_DEBUG, so set it here */
namespace {

/* Non-blocking creation on 3 ranks; rank 2 joins 600 ms late. */
int nb_body(int rank, int n, zccl_unique_id_t id, NbShared *sh) {
    zccl__log_level = 2; /* INFO: "rank r of n ready (... "name")" and every line tagged [name] */
    if (rank == 2) usleep(600000);
    zccl_config_t cfg = ZCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.comm_name = "nbtest";
    zccl_comm_t comm = nullptr;
    zccl_result_t res = zccl_comm_init_rank_config(&comm, n, id, rank, &cfg);
    ZT_CHILD_CHECK(res == ZCCL_IN_PROGRESS, "non-blocking init returned %d: %s", res, zccl_get_last_error(nullptr));
    ZT_CHILD_CHECK(comm != nullptr, "no handle");
    int32_t x = rank + 1, y = 0;
    int polls = 0;
    for (;;) {
        zccl_result_t ae;
        ZT_CHILD_CHECK(zccl_comm_get_async_error(comm, &ae) == ZCCL_SUCCESS, "get_async_error");
        res = zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
        if (res == ZCCL_IN_PROGRESS) {
            ZT_CHILD_CHECK(ae == ZCCL_IN_PROGRESS || ae == ZCCL_SUCCESS, "async error %d while in progress", ae);
            sh->saw_in_progress[rank] = 1;
            polls++;
            usleep(2000);
            continue;
        }
        ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "allreduce after creation: %d %s", res, zccl_get_last_error(comm));
        ZT_CHILD_CHECK(ae == ZCCL_SUCCESS || ae == ZCCL_IN_PROGRESS, "async error %d", ae);
        break;
    }
    ZT_CHILD_CHECK(y == n * (n + 1) / 2, "allreduce result %d", y);
    zccl_result_t ae;
    zccl_comm_get_async_error(comm, &ae);
    ZT_CHILD_CHECK(ae == ZCCL_SUCCESS, "async error after success: %d", ae);
    /* operations on a stream, then finalize completes them */
    zccl_stream_t st;
    zccl_stream_create(&st);
    std::vector<int32_t> v(1000, rank), w(1000);
    for (int k = 0; k < 5; k++) zccl_allreduce(v.data(), w.data(), 1000, ZCCL_INT32, ZCCL_SUM, comm, st);
    ZT_CHILD_CHECK(zccl_comm_finalize(comm) == ZCCL_SUCCESS, "finalize: %s", zccl_get_last_error(comm));
    ZT_CHILD_CHECK(zccl_stream_query(st) == ZCCL_SUCCESS, "finalize returned before the queued operations completed");
    ZT_CHILD_CHECK(w[999] == n * (n - 1) / 2, "queued allreduce result");
    zccl_stream_destroy(st);
    /* a split inherits non-blocking mode; it completes before returning */
    zccl_comm_t sub = nullptr;
    res = zccl_comm_split_config(comm, rank % 2, rank, &sub, nullptr);
    ZT_CHILD_CHECK(res == ZCCL_SUCCESS && sub, "split_config: %d %s", res, zccl_get_last_error(comm));
    zccl_comm_destroy(sub);
    ZT_CHILD_CHECK(zccl_comm_destroy(comm) == ZCCL_SUCCESS, "destroy");
    return 0;
}

TEST(Config, NonBlockingCreationAndCalls) {
    for (const char *transport : {"shm", "tcp"}) {
        SharedMem mem(sizeof(NbShared));
        NbShared *sh = new (mem.data()) NbShared();
        zccl_unique_id_t id;
        ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
        Options o;
        o.deadline_s = 60;
        o.init_comm = false;
        o.id = id;
        o.env = {{"ZCCL_TRANSPORT", std::string(transport)}};
        GroupResult r = run_ranks(3, [&](zccl_comm_t, int rank, int n) { return nb_body(rank, n, id, sh); }, o);
        EXPECT_TRUE(sh->saw_in_progress[0] || sh->saw_in_progress[1])
            << transport << ": no rank saw ZCCL_IN_PROGRESS although rank 2 joined 600 ms late";
        /* comm_name in the log lines */
        ASSERT_EQ(r.procs.size(), 3u);
        EXPECT_NE(r.procs[0].output.find("[nbtest]"), std::string::npos) << r.procs[0].output;
        EXPECT_NE(r.procs[0].output.find("ready"), std::string::npos) << r.procs[0].output;
    }
}

/* A non-blocking creation that cannot complete (one of two ranks never comes): ZCCL_IN_PROGRESS, then the init
 * timeout through zccl_comm_get_async_error; operations report the failure; destroy frees the handle. */
TEST(Config, NonBlockingCreationFailureIsReported) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    Options o;
    o.deadline_s = 60;
    o.init_comm = false;
    o.id = id;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("1500")}};
    run_ranks(1, [&](zccl_comm_t, int rank, int) {
        zccl_config_t cfg = ZCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        zccl_comm_t comm = nullptr;
        zccl_result_t res = zccl_comm_init_rank_config(&comm, 2, id, 0, &cfg); /* rank 1 never joins */
        ZT_CHILD_CHECK(res == ZCCL_IN_PROGRESS && comm, "init returned %d", res);
        zccl_result_t ae = ZCCL_IN_PROGRESS;
        const double t0 = now_s();
        while (ae == ZCCL_IN_PROGRESS && now_s() - t0 < 30) {
            zccl_comm_get_async_error(comm, &ae);
            usleep(10000);
        }
        ZT_CHILD_CHECK(ae == ZCCL_TIMEOUT || ae == ZCCL_REMOTE_ERROR, "async error %d: %s", ae, zccl_get_last_error(nullptr));
        int x = 0, y;
        res = zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
        ZT_CHILD_CHECK(res == ae && strstr(zccl_get_last_error(comm), "non-blocking creation failed"), "allreduce: %d %s", res,
               zccl_get_last_error(comm));
        ZT_CHILD_CHECK(zccl_comm_destroy(comm) == ZCCL_SUCCESS, "destroy");
        (void)rank;
        return 0;
    }, o);
}

}  // namespace

namespace {

/* In one process (so that thread sanitizer builds can run it; forked ranks are outside its model): a one-rank
 * non-blocking communicator, polled from this thread while its creation thread runs; then a group with a self
 * send/recv and an allreduce queued on a stream (run by the stream's thread), a PreMulSum allreduce, finalize. */
TEST(ConfigInProcess, NonBlockingOneRankWithGroupStreamAndPreMulSum) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    zccl_config_t cfg = ZCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.comm_name = "inproc";
    zccl_comm_t comm = nullptr;
    ASSERT_EQ(zccl_comm_init_rank_config(&comm, 1, id, 0, &cfg), ZCCL_IN_PROGRESS);
    ASSERT_NE(comm, nullptr);
    zccl_result_t ae = ZCCL_IN_PROGRESS;
    for (int i = 0; i < 10000 && ae == ZCCL_IN_PROGRESS; i++) {
        ASSERT_EQ(zccl_comm_get_async_error(comm, &ae), ZCCL_SUCCESS);
        if (ae == ZCCL_IN_PROGRESS) usleep(1000);
    }
    ASSERT_EQ(ae, ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    zccl_stream_t st;
    ASSERT_EQ(zccl_stream_create(&st), ZCCL_SUCCESS);
    int32_t a[64], b[64], c[64], d[64];
    for (int i = 0; i < 64; i++) { a[i] = i; b[i] = -1; c[i] = 2 * i; d[i] = 0; }
    ASSERT_EQ(zccl_group_start(), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_recv(b, 64, ZCCL_INT32, 0, comm, st), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_allreduce(c, d, 64, ZCCL_INT32, ZCCL_SUM, comm, st), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_send(a, 64, ZCCL_INT32, 0, comm, st), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_group_end(), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_stream_synchronize(st), ZCCL_SUCCESS) << zccl_get_last_error(comm);
    for (int i = 0; i < 64; i++) {
        ASSERT_EQ(b[i], i);
        ASSERT_EQ(d[i], 2 * i);
    }
    float scalar = 0.25f, x[16], y[16];
    for (int i = 0; i < 16; i++) x[i] = (float)i;
    zccl_redop_t op;
    ASSERT_EQ(zccl_redop_create_premulsum(&op, &scalar, ZCCL_FLOAT32, ZCCL_SCALAR_HOST_IMMEDIATE, comm), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_allreduce(x, y, 16, ZCCL_FLOAT32, op, comm, st), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_comm_finalize(comm), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_stream_query(st), ZCCL_SUCCESS);
    for (int i = 0; i < 16; i++) ASSERT_EQ(y[i], 0.25f * (float)i);
    ASSERT_EQ(zccl_redop_destroy(op, comm), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_stream_destroy(st), ZCCL_SUCCESS);
    ASSERT_EQ(zccl_comm_destroy(comm), ZCCL_SUCCESS);
}

}  // namespace

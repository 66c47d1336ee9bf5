/*
 * test_bucket_check.cpp — ZCCL_BUCKET_CHECK=1 catches writes through a gradient pointer kept past
 * zccl_bucket_mark_ready (include/zccl_zero.h; lib/zero/zero_check.c; issue 17).
 *
 *   BucketCheck.WriteBetweenMarkAndLaunch   2 ranks, all-reduce mode, three parameters in one bucket: rank 0 writes
 *       into parameter 1's region after marking it ready, before the bucket launches. With the check, rank 0's
 *       finish fails with ZCCL_INVALID_USAGE naming parameter 1 and rank 1's fails quoting it; without the check
 *       (control) both succeed and the sum is wrong, which is the silent corruption the check exists for.
 *   BucketCheck.WriteAfterCompletion   all-reduce mode: rank 0 writes into parameter 0's region after its bucket's
 *       collective completed and before finish: rank 0's finish fails naming parameter 0, and rank 1's next
 *       micro-step fails quoting it (rank 0 refused the collective rank 1 waits for).
 *   BucketCheck.WriteIntoAReusedBuffer   2 ranks, reduce-scatter mode with K = 1 buffer for two buckets: rank 0
 *       writes into bucket 0's region after its collective completed; bucket 1 then gets the same buffer. With the
 *       check, rank 0's zccl_bucket_grad_ptr for bucket 1 fails naming bucket 0's parameters, and rank 1 fails too.
 * Children never use GoogleTest assertions; every group has a deadline.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <string>

#include "harness/harness.h"
#include "zccl.h"
#include "zccl_zero.h"

using namespace zt;

namespace {

int fail(int rank, const std::string &what) {
    fprintf(stderr, "[rank %d] FAIL %s\n", rank, what.c_str());
    return 1;
}
bool has(const std::string &s, const char *w) { return s.find(w) != std::string::npos; }

constexpr size_t kNumel = 1000;

/* The all-reduce case; returns the child's exit code. check: whether ZCCL_BUCKET_CHECK is on. */
int write_between_mark_and_launch(zccl_comm_t comm, int rank, bool check) {
    const size_t numel[3] = {kNumel, kNumel, kNumel};
    zccl_bucket_options_t opt = {};
    opt.first_bytes = opt.cap_bytes = 1 << 20; /* one bucket */
    zccl_bucket_plan_t plan = nullptr;
    if (zccl_bucket_plan_create(comm, 3, numel, ZCCL_FLOAT32, &opt, &plan) != ZCCL_SUCCESS)
        return fail(rank, std::string("plan_create: ") + zccl_get_last_error(comm));
    int nb = 0;
    zccl_bucket_count(plan, &nb);
    if (nb != 1) return fail(rank, "expected one bucket, got " + std::to_string(nb));
    zccl_bucket_begin(plan, 1);
    float *g[3];
    for (int i = 0; i < 3; i++) {
        zccl_bucket_grad_ptr(plan, i, (void **)&g[i]);
        for (size_t e = 0; e < kNumel; e++) g[i][e] += 1.0f;
    }
    zccl_bucket_mark_ready(plan, 2);
    zccl_bucket_mark_ready(plan, 1);
    if (rank == 0) g[1][5] += 100.0f; /* the stale pointer: parameter 1 is already marked ready */
    zccl_bucket_mark_ready(plan, 0);
    zccl_result_t r = zccl_bucket_finish(plan);
    const std::string msg = zccl_get_last_error(comm);
    int rc = 0;
    if (check) {
        if (r == ZCCL_SUCCESS) rc = fail(rank, "finish succeeded despite the write after mark_ready");
        else if (rank == 0 && (r != ZCCL_INVALID_USAGE || !has(msg, "parameter 1 ")))
            rc = fail(rank, "expected ZCCL_INVALID_USAGE naming parameter 1, got " + std::to_string(r) + ": " + msg);
        else if (rank == 1 && !has(msg, "ZCCL_BUCKET_CHECK"))
            rc = fail(rank, "rank 1's error does not quote rank 0's check: " + msg);
    } else {
        if (r != ZCCL_SUCCESS) rc = fail(rank, "control run without the check failed: " + msg);
        zccl_bucket_grad_ptr(plan, 1, (void **)&g[1]);
        if (g[1][5] == 2.0f) rc = fail(rank, "control run: the stale write did not reach the sum (test is wrong)");
    }
    zccl_bucket_plan_destroy(plan);
    return rc;
}

TEST(BucketCheck, WriteBetweenMarkAndLaunch) {
    for (bool check : {true, false}) {
        SCOPED_TRACE(check ? "ZCCL_BUCKET_CHECK=1" : "ZCCL_BUCKET_CHECK=0 (control)");
        Options o;
        o.deadline_s = 60;
        o.env = {{"ZCCL_BUCKET_CHECK", std::string(check ? "1" : "0")}, {"ZCCL_TIMEOUT_MS", std::string("15000")}};
        run_ranks(2, [check](zccl_comm_t comm, int rank, int) { return write_between_mark_and_launch(comm, rank, check); },
                  o);
    }
}

TEST(BucketCheck, WriteAfterCompletion) {
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_BUCKET_CHECK", std::string("1")}, {"ZCCL_TIMEOUT_MS", std::string("15000")}};
    run_ranks(2, [](zccl_comm_t comm, int rank, int) -> int {
        const size_t numel[2] = {kNumel, kNumel};
        zccl_bucket_plan_t plan = nullptr;
        if (zccl_bucket_plan_create(comm, 2, numel, ZCCL_FLOAT32, nullptr, &plan) != ZCCL_SUCCESS)
            return fail(rank, std::string("plan_create: ") + zccl_get_last_error(comm));
        for (int step = 0; step < 2; step++) {
            zccl_bucket_begin(plan, 1);
            float *g[2];
            for (int i = 1; i >= 0; i--) {
                zccl_bucket_grad_ptr(plan, i, (void **)&g[i]);
                for (size_t e = 0; e < kNumel; e++) g[i][e] += 1.0f;
                zccl_bucket_mark_ready(plan, i);
            }
            usleep(300 * 1000);                            /* every bucket has completed */
            if (rank == 0 && step == 0) g[0][9] = -1.0f;   /* the stale pointer, before finish */
            zccl_result_t r = zccl_bucket_finish(plan);
            const std::string msg = zccl_get_last_error(comm);
            if (rank == 0 && step == 0) {
                if (r != ZCCL_INVALID_USAGE || !has(msg, "parameter 0 ") || !has(msg, "after its bucket's collective"))
                    return fail(rank, "expected ZCCL_INVALID_USAGE naming parameter 0, got " + std::to_string(r) +
                                          ": " + msg);
                zccl_bucket_plan_destroy(plan);
                return 0;
            }
            if (rank == 1 && step == 1) {
                if (r == ZCCL_SUCCESS) return fail(rank, "rank 1's next micro-step succeeded");
                if (!has(msg, "ZCCL_BUCKET_CHECK")) return fail(rank, "rank 1's error does not quote the check: " + msg);
            }
        }
        zccl_bucket_plan_destroy(plan);
        return 0;
    }, o);
}

TEST(BucketCheck, WriteIntoAReusedBuffer) {
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_BUCKET_CHECK", std::string("1")}, {"ZCCL_TIMEOUT_MS", std::string("15000")}};
    run_ranks(2, [](zccl_comm_t comm, int rank, int) -> int {
        const size_t numel[2] = {kNumel, kNumel};
        zccl_bucket_options_t opt = {};
        opt.first_bytes = opt.cap_bytes = kNumel * sizeof(float); /* one parameter per bucket */
        opt.mode = ZCCL_BUCKET_REDUCE_SCATTER;
        opt.max_in_flight = 1; /* one buffer: bucket 1 reuses bucket 0's */
        zccl_bucket_plan_t plan = nullptr;
        if (zccl_bucket_plan_create(comm, 2, numel, ZCCL_FLOAT32, &opt, &plan) != ZCCL_SUCCESS)
            return fail(rank, std::string("plan_create: ") + zccl_get_last_error(comm));
        int b1 = -1, b0 = -1;
        zccl_bucket_param_loc(plan, 1, &b1, nullptr);
        zccl_bucket_param_loc(plan, 0, &b0, nullptr);
        if (b1 != 0 || b0 != 1) return fail(rank, "unexpected layout: parameter 1 in bucket " + std::to_string(b1));
        zccl_bucket_begin(plan, 1);
        float *g1 = nullptr, *g0 = nullptr;
        zccl_bucket_grad_ptr(plan, 1, (void **)&g1);
        for (size_t e = 0; e < kNumel; e++) g1[e] += 1.0f;
        zccl_bucket_mark_ready(plan, 1); /* bucket 0 launches */
        usleep(300 * 1000);              /* and completes */
        if (rank == 0) g1[3] = 7.0f;     /* the stale pointer, into a buffer bucket 1 will reuse */
        zccl_result_t r = zccl_bucket_grad_ptr(plan, 0, (void **)&g0);
        std::string msg = zccl_get_last_error(comm);
        if (rank == 0) {
            if (r != ZCCL_INVALID_USAGE || !has(msg, "bucket 0") || !has(msg, "parameters 1..1"))
                return fail(rank, "expected ZCCL_INVALID_USAGE naming bucket 0's parameter, got " + std::to_string(r) +
                                      ": " + msg);
            zccl_bucket_finish(plan);
            zccl_bucket_plan_destroy(plan);
            return 0;
        }
        if (r != ZCCL_SUCCESS) return fail(rank, "grad_ptr: " + msg);
        for (size_t e = 0; e < kNumel; e++) g0[e] += 1.0f;
        zccl_bucket_mark_ready(plan, 0);
        r = zccl_bucket_finish(plan);
        msg = zccl_get_last_error(comm);
        zccl_bucket_plan_destroy(plan);
        if (r == ZCCL_SUCCESS) return fail(rank, "rank 1's finish succeeded although rank 0 gave up bucket 1");
        if (!has(msg, "ZCCL_BUCKET_CHECK")) return fail(rank, "rank 1's error does not quote rank 0's check: " + msg);
        return 0;
    }, o);
}

}  // namespace

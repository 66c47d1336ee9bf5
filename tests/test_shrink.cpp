/*
 * test_shrink.cpp — elastic training goes on after a rank is lost (zccl_comm_shrink).
 *
 * Shrink.TrainingContinuesAfterLoss (shm and tcp): 4 ranks run "training steps" — each step all-reduces (AVG) a
 * gradient vector whose values depend on (step, rank) and applies it to a parameter vector. At step 5 rank 2 exits
 * without a word. The survivors' step fails with ZCCL_REMOTE_ERROR; they call zccl_comm_shrink(excluding 2), get
 * ranks 0..2 of 3 in their old order, redo the failed step on the new communicator and finish 10 steps. Every
 * step's average is checked against the value the test computes for the ranks alive at that step, and the final
 * parameters must be identical on the survivors. Bad arguments to zccl_comm_shrink are rejected naming them.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

constexpr int kN = 1000, kSteps = 10, kLost = 2, kLossStep = 5;

float grad(int step, int old_rank, int i) { return (float)((step * 7 + old_rank * 3 + i) % 11); }

class ShrinkParam : public ::testing::TestWithParam<std::string> {};

TEST_P(ShrinkParam, TrainingContinuesAfterLoss) {
    SharedMem shm(4 * kN * sizeof(float));
    float *final_params = shm.as<float>();
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_TRANSPORT", GetParam()}};
    o.init_comm = false;
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    run_ranks(4, [id, final_params](zccl_comm_t, int rank, int nranks) -> int {
        auto fail = [rank](const std::string &w) { fprintf(stderr, "[rank %d] FAIL %s\n", rank, w.c_str()); return 1; };
        zccl_comm_t comm, old = nullptr;
        if (zccl_comm_init_rank(&comm, nranks, id, rank) != ZCCL_SUCCESS) return fail("init");
        std::vector<float> params(kN, 0.0f), g(kN);
        std::vector<int> alive = {0, 1, 2, 3};
        for (int step = 0; step < kSteps; step++) {
            if (rank == kLost && step == kLossStep) _exit(0); /* lost without a word */
            for (int i = 0; i < kN; i++) g[i] = grad(step, rank, i);
            zccl_result_t r = zccl_allreduce(g.data(), g.data(), kN, ZCCL_FLOAT32, ZCCL_AVG, comm, nullptr);
            if (r == ZCCL_REMOTE_ERROR && !old && step == kLossStep) {
                const int ex[] = {kLost};
                zccl_comm_t bad;
                if (zccl_comm_shrink(comm, ex, 1, nullptr) != ZCCL_INVALID_ARGUMENT) return fail("NULL newcomm accepted");
                const int self[] = {rank};
                if (zccl_comm_shrink(comm, self, 1, &bad) != ZCCL_INVALID_ARGUMENT ||
                    !strstr(zccl_get_last_error(nullptr), "exclude"))
                    return fail("excluding oneself not rejected naming 'exclude'");
                old = comm;
                if (zccl_comm_shrink(old, ex, 1, &comm) != ZCCL_SUCCESS)
                    return fail(std::string("shrink: ") + zccl_get_last_error(nullptr));
                int nr, nn;
                zccl_comm_rank(comm, &nr);
                zccl_comm_count(comm, &nn);
                if (nn != 3 || nr != (rank < kLost ? rank : rank - 1))
                    return fail("new rank " + std::to_string(nr) + " of " + std::to_string(nn));
                alive = {0, 1, 3};
                step--; /* redo the failed step with the survivors */
                continue;
            }
            if (r != ZCCL_SUCCESS) return fail("step " + std::to_string(step) + ": " + zccl_get_last_error(comm));
            for (int i = 0; i < kN; i++) {
                double sum = 0;
                for (int q : alive) sum += grad(step, q, i);
                const float want = (float)(sum / alive.size());
                if (std::fabs(g[i] - want) > 1e-5f * (1 + std::fabs(want)))
                    return fail("step " + std::to_string(step) + " element " + std::to_string(i) + ": " +
                                std::to_string(g[i]) + " != " + std::to_string(want));
                params[i] -= 0.1f * g[i];
            }
        }
        memcpy(final_params + (size_t)rank * kN, params.data(), kN * sizeof(float));
        zccl_comm_destroy(comm);
        if (old) zccl_comm_abort(old);
        return 0;
    }, o);
    for (int r : {1, 3})
        EXPECT_EQ(0, memcmp(final_params, final_params + (size_t)r * kN, kN * sizeof(float)))
            << "rank " << r << "'s parameters differ from rank 0's";
}

INSTANTIATE_TEST_SUITE_P(Transports, ShrinkParam, ::testing::Values(std::string("shm"), std::string("tcp")));

}  // namespace

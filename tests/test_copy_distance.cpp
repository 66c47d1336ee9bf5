/*
 * test_copy_distance.cpp — collectives on shared memory whose buffers sit at the page-offset distances where some
 * CPUs' `rep movsb` is 4-17x slow (kernels.h, zccl_kernel_rep_movsb_slow): the receive buffer's page offset 1..63
 * bytes past the send buffer's (and past the slots'). Each rank forces the detour on (zccl_kernel_rep_movsb_force),
 * so the vector copy and the single copy's pull through the bounce buffer (transport/shm.c) run on every CPU; the
 * single copy is forced for every message (ZCCL_SHM_CMA=1, ZCCL_CMA_THRESHOLD=0) in one pass and the slots alone in
 * the other. Results are checked element by element against references computed from the inputs' formula
 * (integer-valued floats: every order of summation is exact), and nothing outside an output may change.
 */
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "kernels.h"
#include "zccl.h"

using namespace zt;

namespace {

float input(int q, size_t k) { return (float)((k * 5 + (size_t)q * 11) % 53) - 26.0f; }

/* A page-aligned region with the buffer `off` bytes past its start, and guard bytes around it. */
struct Placed {
    uint8_t *base = nullptr;
    size_t bytes = 0, off = 0;
    Placed(size_t b, size_t o) : bytes(b), off(o) {
        base = (uint8_t *)aligned_alloc(4096, (b + o + 4096 + 4095) / 4096 * 4096);
        if (base) memset(base, 0xA5, (b + o + 4096 + 4095) / 4096 * 4096);
    }
    ~Placed() { free(base); }
    float *f() { return (float *)(void *)(base + off); }
    bool guards_intact() const {
        for (size_t i = 0; i < off; i++)
            if (base[i] != 0xA5) return false;
        for (size_t i = off + bytes; i < off + bytes + 256; i++)
            if (base[i] != 0xA5) return false;
        return true;
    }
};

int body(zccl_comm_t comm, int rank, int n) {
    const size_t counts[] = {300, 40000, 300001}; /* 1.2 KB .. 1.2 MB per block: below and above the slots */
    const size_t offs[][2] = {{0, 16}, {0, 60}, {4080, 0}, {8, 40}, {0, 0}}; /* float-aligned: 4-byte multiples */
    for (size_t c : counts)
        for (const auto &o : offs) {
            /* all-gather: rank q's block at q * c */
            Placed s(c * 4, o[0]), r(c * 4 * (size_t)n, o[1]);
            ZT_CHILD_CHECK(s.base && r.base, "out of memory");
            for (size_t k = 0; k < c; k++) s.f()[k] = input(rank, k);
            zccl_result_t res = zccl_allgather(s.f(), r.f(), c, ZCCL_FLOAT32, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "allgather count %zu offsets %zu,%zu: %s", c, o[0], o[1],
                           zccl_get_last_error(comm));
            size_t wrong = 0;
            for (int q = 0; q < n; q++)
                for (size_t k = 0; k < c; k++) wrong += r.f()[(size_t)q * c + k] != input(q, k);
            ZT_CHILD_CHECK(wrong == 0 && r.guards_intact(), "allgather count %zu offsets %zu,%zu: %zu wrong%s", c,
                           o[0], o[1], wrong, r.guards_intact() ? "" : ", guard bytes overwritten");

            /* all-reduce of c elements, and reduce-scatter of c per rank */
            Placed s2(c * 4 * (size_t)n, o[0]), r2(c * 4 * (size_t)n, o[1]);
            ZT_CHILD_CHECK(s2.base && r2.base, "out of memory");
            for (size_t k = 0; k < c * (size_t)n; k++) s2.f()[k] = input(rank, k);
            res = zccl_allreduce(s2.f(), r2.f(), c, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "allreduce: %s", zccl_get_last_error(comm));
            wrong = 0;
            for (size_t k = 0; k < c; k++) {
                float want = 0;
                for (int q = 0; q < n; q++) want += input(q, k);
                wrong += r2.f()[k] != want;
            }
            ZT_CHILD_CHECK(wrong == 0, "allreduce count %zu offsets %zu,%zu: %zu wrong", c, o[0], o[1], wrong);
            res = zccl_reduce_scatter(s2.f(), r2.f(), c, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "reduce_scatter: %s", zccl_get_last_error(comm));
            wrong = 0;
            for (size_t k = 0; k < c; k++) {
                float want = 0;
                for (int q = 0; q < n; q++) want += input(q, (size_t)rank * c + k);
                wrong += r2.f()[k] != want;
            }
            ZT_CHILD_CHECK(wrong == 0 && r2.guards_intact(), "reduce_scatter count %zu offsets %zu,%zu: %zu wrong",
                           c, o[0], o[1], wrong);
        }
    return 0;
}

int forced_body(zccl_comm_t comm, int rank, int n) {
    zccl_kernel_rep_movsb_force(1); /* before the first copy of this process's collectives */
    return body(comm, rank, n);
}

}  // namespace

class CopyDistance : public ::testing::TestWithParam<int> {};

TEST_P(CopyDistance, SingleCopyDetourGivesExactResults) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_CMA", std::string("1")},
             {"ZCCL_CMA_THRESHOLD", std::string("0")}, {"ZCCL_SHM_STAGED", std::string("0")}};
    run_ranks(GetParam(), forced_body, o);
}

TEST_P(CopyDistance, SlotsWithVectorCopyGiveExactResults) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_CMA", std::string("0")},
             {"ZCCL_SHM_STAGED", std::string("0")}};
    run_ranks(GetParam(), forced_body, o);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CopyDistance, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int> &i) { return std::to_string(i.param) + "ranks"; });

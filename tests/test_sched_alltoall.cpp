// The direct all-to-all, all-to-allv, gather and scatter schedules (lib/sched_alltoall.c), proven by the symbolic
// checker (lib/sched_check.c) for every rank count 1..130: each output element is the right rank's right element,
// sends and receives pair up without deadlock under rendezvous semantics, no step leaves its buffer, out-of-place
// inputs stay untouched. Then the checker must reject broken variants of the same schedules.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

extern "C" {
#include "schedule.h"
}

namespace {

zccl_sched_args_t Args(zccl_coll_t coll, int n, size_t count, bool in_place, int root) {
    zccl_sched_args_t a{};
    a.coll = coll;
    a.nranks = n;
    a.count = count;
    a.in_place = in_place;
    a.root = root;
    a.elem_size = 4;
    a.algo = ZCCL_ALGO_DIRECT;
    return a;
}

const char *Name(zccl_coll_t c) {
    switch (c) {
    case ZCCL_COLL_ALLTOALL: return "alltoall";
    case ZCCL_COLL_ALLTOALLV: return "alltoallv";
    case ZCCL_COLL_GATHER: return "gather";
    default: return "scatter";
    }
}

TEST(SchedAlltoall, CheckerProvesEveryRankCount1To130) {
    char err[512];
    int checked = 0;
    for (int n = 1; n <= 130; n++) {
        for (zccl_coll_t coll : {ZCCL_COLL_ALLTOALL, ZCCL_COLL_GATHER, ZCCL_COLL_SCATTER}) {
            for (size_t count : {size_t(1), size_t(3)}) {
                for (bool in_place : {false, true}) {
                    std::vector<int> roots = {0};
                    if (coll != ZCCL_COLL_ALLTOALL) roots = {0, n / 2, n - 1};
                    for (int root : roots) {
                        zccl_sched_args_t a = Args(coll, n, count, in_place, root);
                        ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err))
                            << Name(coll) << " n=" << n << " count=" << count << " in_place=" << in_place
                            << " root=" << root << ": " << err;
                        checked++;
                    }
                }
            }
        }
        // all-to-allv: a random matrix with empty, small and larger blocks (and a zero row/column sometimes)
        std::mt19937 rng(uint32_t(n) * 7919u);
        std::vector<size_t> m(size_t(n) * size_t(n));
        for (int rep = 0; rep < 2; rep++) {
            for (auto &x : m) x = rng() % 4 == 0 ? 0 : rng() % 5;
            if (rep == 1) for (int q = 0; q < n; q++) m[size_t(q) * n + size_t(n / 2)] = 0; // rank n/2 gets nothing
            zccl_sched_args_t a = Args(ZCCL_COLL_ALLTOALLV, n, 0, false, 0);
            a.a2av_matrix = m.data();
            ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err)) << "alltoallv n=" << n << " rep " << rep << ": " << err;
            checked++;
        }
    }
    EXPECT_GT(checked, 2000);
}

// One phase, with every transfer of a rank in it: the property that makes the schedules deadlock-free. A single
// schedule at n = 1024 is also checked (large fan-in at the gather root).
TEST(SchedAlltoall, OnePhaseAndLargeN) {
    char err[512];
    for (zccl_coll_t coll : {ZCCL_COLL_ALLTOALL, ZCCL_COLL_GATHER, ZCCL_COLL_SCATTER}) {
        zccl_sched_args_t a = Args(coll, 1024, 1, false, 3);
        ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err)) << Name(coll) << " n=1024: " << err;
        a.rank = 5;
        zccl_schedule_t s;
        ASSERT_EQ(zccl__sched_build(&a, &s), ZCCL_SUCCESS);
        EXPECT_EQ(s.nphases, 1u) << Name(coll);
        zccl__sched_free(&s);
    }
}

// The checker catches broken variants: a dropped receive, a block sent to the wrong peer's slot, and a schedule that
// splits the sends and receives into two phases in an order that deadlocks under rendezvous semantics.
void DropLastRecv(int rank, zccl_schedule_t *s) {
    if (rank != 1) return;
    for (size_t i = s->nsteps; i-- > 0;)
        if (s->steps[i].kind == ZCCL_STEP_RECV) { s->steps[i].count = 0; break; }
}
void WrongOffset(int rank, zccl_schedule_t *s) {
    if (rank != 0) return;
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == ZCCL_STEP_SEND) { s->steps[i].off = 0; break; }
}
void WrongRecvSlot(int rank, zccl_schedule_t *s) {
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == ZCCL_STEP_RECV) { s->steps[i].off += s->steps[i].count; break; }
    (void)rank;
}
void RecvsFirst(int rank, zccl_schedule_t *s) {
    // every rank: phase 0 = its receives, phase 1 = its sends -> nobody can send: deadlock
    std::vector<zccl_step_t> r, o;
    for (size_t i = 0; i < s->nsteps; i++) (s->steps[i].kind == ZCCL_STEP_RECV ? r : o).push_back(s->steps[i]);
    size_t k = 0;
    for (auto &x : r) s->steps[k++] = x;
    for (auto &x : o) s->steps[k++] = x;
    if (s->phases_cap < 2) return;
    s->phase_end[0] = uint32_t(r.size());
    s->phase_end[1] = uint32_t(s->nsteps);
    s->nphases = 2;
    (void)rank;
}

TEST(SchedAlltoall, CheckerRejectsBrokenVariants) {
    char err[512];
    zccl_sched_args_t a = Args(ZCCL_COLL_ALLTOALL, 4, 2, false, 0);
    EXPECT_FALSE(zccl__sched_check_with(&a, DropLastRecv, err, sizeof err));
    EXPECT_FALSE(zccl__sched_check_with(&a, WrongOffset, err, sizeof err));
    EXPECT_FALSE(zccl__sched_check_with(&a, RecvsFirst, err, sizeof err));
    EXPECT_NE(std::string(err).find("deadlock"), std::string::npos) << err;
    zccl_sched_args_t g = Args(ZCCL_COLL_GATHER, 5, 3, false, 2);
    EXPECT_FALSE(zccl__sched_check_with(&g, WrongRecvSlot, err, sizeof err));
    zccl_sched_args_t sc = Args(ZCCL_COLL_SCATTER, 5, 3, false, 0);
    EXPECT_FALSE(zccl__sched_check_with(&sc, WrongOffset, err, sizeof err));
}

}  // namespace

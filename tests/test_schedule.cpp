// Schedules are data: these tests run every rank's schedule symbolically (sched/sched_check.c), without processes,
// and check that each output element receives each rank's contribution exactly once, that sends and receives pair
// up in order without deadlock under rendezvous semantics, and that no step leaves its buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "schedule.h"
}

namespace {

struct Case {
    zccl_coll_t coll;
    const char *name;
    int algo;
};

const Case kColls[] = {{ZCCL_COLL_ALLREDUCE, "allreduce(ring)", ZCCL_ALGO_RING},
                       {ZCCL_COLL_ALLREDUCE, "allreduce(direct)", ZCCL_ALGO_DIRECT},
                       {ZCCL_COLL_REDUCE_SCATTER, "reduce_scatter", ZCCL_ALGO_RING},
                       {ZCCL_COLL_ALLGATHER, "allgather", ZCCL_ALGO_RING},
                       {ZCCL_COLL_BROADCAST, "broadcast", ZCCL_ALGO_RING},
                       {ZCCL_COLL_REDUCE, "reduce", ZCCL_ALGO_RING}};

zccl_sched_args_t Args(zccl_coll_t coll, int n, size_t count, bool in_place, int root, size_t chunk_bytes,
                       size_t round_bytes) {
    zccl_sched_args_t a{};
    a.coll = coll;
    a.nranks = n;
    a.rank = 0;
    a.root = root;
    a.count = count;
    a.in_place = in_place;
    a.elem_size = 4;
    a.chunk_bytes = chunk_bytes;
    a.rs_round_bytes = round_bytes;
    return a;
}

TEST(Schedule, EveryCollectiveEveryRankCountUpTo64) {
    char err[512];
    int checked = 0;
    for (const Case &c : kColls) {
        for (int n = 1; n <= 64; n = (n < 12 ? n + 1 : n * 2)) {
            // Counts below, at and above n so that empty, uneven and several-chunk blocks all occur.
            for (size_t count : {size_t(1), size_t(n - 1 > 0 ? n - 1 : 1), size_t(n), size_t(3 * n + 1)}) {
                for (bool in_place : {false, true}) {
                    std::vector<int> roots = {0};
                    if (c.coll == ZCCL_COLL_BROADCAST || c.coll == ZCCL_COLL_REDUCE) roots = {0, n / 2, n - 1};
                    for (int root : roots) {
                        // 8-byte chunks / rounds (2 float elements) force many pipeline chunks and rounds.
                        zccl_sched_args_t a = Args(c.coll, n, count, in_place, root, 8, 8);
                        a.algo = c.algo;
                        ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err))
                            << c.name << " n=" << n << " count=" << count << " in_place=" << in_place
                            << " root=" << root << ": " << err;
                        checked++;
                    }
                }
            }
        }
    }
    EXPECT_GT(checked, 500);
}

// The topology-aware ring puts ranks in any order: every algorithm must stay correct for every permutation.
TEST(Schedule, AnyRingOrder) {
    char err[512];
    std::mt19937 rng(12345);
    for (int n : {2, 3, 4, 5, 7, 8, 13}) {
        for (int trial = 0; trial < 6; trial++) {
            std::vector<int> ring(n);
            std::iota(ring.begin(), ring.end(), 0);
            std::shuffle(ring.begin(), ring.end(), rng);
            for (const Case &c : kColls)
                for (bool in_place : {false, true})
                    for (int root : {0, n - 1}) {
                        zccl_sched_args_t a = Args(c.coll, n, size_t(2 * n + 3), in_place, root, 8, 8);
                        a.algo = c.algo;
                        a.ring = ring.data();
                        ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err))
                            << c.name << " n=" << n << " trial " << trial << " root=" << root << ": " << err;
                    }
        }
    }
}

TEST(Schedule, LargeChunksSingleRound) {
    char err[512];
    for (const Case &c : kColls)
        for (int n : {2, 3, 5, 8})
            for (bool in_place : {false, true}) {
                zccl_sched_args_t a = Args(c.coll, n, 1000, in_place, n - 1, 1 << 20, 1 << 20);
                a.algo = c.algo;
                EXPECT_TRUE(zccl__sched_check(&a, err, sizeof err)) << c.name << " n=" << n << ": " << err;
            }
}

// The checker itself must fail on broken schedules, or the tests above prove nothing.
void DropLastStepOfRank1(int rank, zccl_schedule_t *s) {
    if (rank == 1 && s->nphases) s->phase_end[s->nphases - 1]--, s->nsteps--;
}
void ClearFinal(int, zccl_schedule_t *s) {
    for (size_t i = 0; i < s->nsteps; i++) s->steps[i].final = 0;
}
void ReduceTwice(int rank, zccl_schedule_t *s) {
    // Make rank 0's all-gather receive reduce instead of copy: contributions get counted twice.
    if (rank != 0) return;
    for (size_t i = s->nsteps; i-- > 0;)
        if (s->steps[i].kind == ZCCL_STEP_RECV && s->steps[i].src == ZCCL_BUF_NONE) {
            s->steps[i].src = ZCCL_BUF_RECV;
            s->steps[i].src_off = s->steps[i].off;
            return;
        }
}
void SwapPeers(int rank, zccl_schedule_t *s) {
    if (rank != 2) return;
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == ZCCL_STEP_RECV) s->steps[i].peer = (s->steps[i].peer + 2) % 4;
}

TEST(Schedule, CheckerRejectsWrongSchedules) {
    char err[512];
    zccl_sched_args_t a = Args(ZCCL_COLL_ALLREDUCE, 4, 16, false, 0, 8, 8);
    ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err)) << err;
    EXPECT_FALSE(zccl__sched_check_with(&a, DropLastStepOfRank1, err, sizeof err));
    EXPECT_FALSE(zccl__sched_check_with(&a, ClearFinal, err, sizeof err));
    EXPECT_NE(std::string(err).find("final"), std::string::npos) << err;
    EXPECT_FALSE(zccl__sched_check_with(&a, ReduceTwice, err, sizeof err));
    EXPECT_FALSE(zccl__sched_check_with(&a, SwapPeers, err, sizeof err));
    // A send with no matching receive on the other side.
    zccl_sched_args_t s = Args(ZCCL_COLL_SEND, 2, 4, false, 1, 8, 8);
    EXPECT_FALSE(zccl__sched_check(&s, err, sizeof err));
}

TEST(Schedule, PrintIsReadable) {
    zccl_sched_args_t a = Args(ZCCL_COLL_ALLREDUCE, 3, 6, false, 0, 8, 8);
    a.rank = 1;
    zccl_schedule_t s;
    ASSERT_EQ(zccl__sched_build(&a, &s), ZCCL_SUCCESS);
    char buf[4096];
    zccl__sched_print(&s, 1, buf, sizeof buf);
    std::string out(buf);
    EXPECT_NE(out.find("send(2"), std::string::npos) << out;
    EXPECT_NE(out.find("recv(0"), std::string::npos) << out;
    EXPECT_NE(out.find("final"), std::string::npos) << out;
    EXPECT_EQ(s.nphases, 4u); // 2 reduce-scatter + 2 all-gather steps
    zccl__sched_free(&s);
}

// The communicator's schedule cache (zccl__sched_get) returns the schedule zccl__sched_build gives for the same
// arguments, builds again when any builder input differs (count, rank, in_place, algorithm, the forced-algorithm
// hook), keeps the 8 most recently used, and never caches uneven-count calls.
static bool SameSchedule(const zccl_schedule_t *a, const zccl_schedule_t *b) {
    if (a->nsteps != b->nsteps || a->nphases != b->nphases || a->tmp_elems != b->tmp_elems) return false;
    if (memcmp(a->phase_end, b->phase_end, a->nphases * sizeof *a->phase_end) != 0) return false;
    for (size_t i = 0; i < a->nsteps; i++) {
        const zccl_step_t &x = a->steps[i], &y = b->steps[i];
        if (x.kind != y.kind || x.buf != y.buf || x.src != y.src || x.final != y.final || x.peer != y.peer ||
            x.off != y.off || x.src_off != y.src_off || x.count != y.count ||
            (x.kind == ZCCL_STEP_REDUCE && (x.src2 != y.src2 || x.src2_off != y.src2_off)))
            return false;
    }
    return true;
}

TEST(Schedule, CacheReturnsWhatBuildBuilds) {
    zccl_sched_cache_t cache = {};
    const zccl_schedule_t *got = nullptr;
    // 12 distinct argument sets, used twice round-robin: the second pass of the first 4 misses (LRU of 8).
    std::vector<zccl_sched_args_t> args;
    for (int i = 0; i < 12; i++) {
        zccl_sched_args_t a = Args(i % 3 == 2 ? ZCCL_COLL_ALLGATHER : ZCCL_COLL_ALLREDUCE, 4, 100 + (size_t)i * 7,
                                   i % 2 == 1, 0, 4, 64);
        a.rank = i % 4;
        a.algo = i % 4 == 3 ? ZCCL_ALGO_RABENSEIFNER : ZCCL_ALGO_RING;
        args.push_back(a);
    }
    for (int pass = 0; pass < 2; pass++)
        for (const auto &a : args) {
            ASSERT_EQ(zccl__sched_get(&cache, &a, &got), ZCCL_SUCCESS);
            zccl_schedule_t ref;
            ASSERT_EQ(zccl__sched_build(&a, &ref), ZCCL_SUCCESS);
            EXPECT_TRUE(SameSchedule(got, &ref)) << "count " << a.count << " rank " << a.rank;
            zccl__sched_free(&ref);
        }
    EXPECT_EQ(cache.misses, 24u); // 12 distinct, then each evicted before its reuse
    // Immediate reuse hits, and returns the same schedule.
    const uint64_t h0 = cache.hits;
    ASSERT_EQ(zccl__sched_get(&cache, &args[11], &got), ZCCL_SUCCESS);
    ASSERT_EQ(zccl__sched_get(&cache, &args[10], &got), ZCCL_SUCCESS);
    ASSERT_EQ(zccl__sched_get(&cache, &args[11], &got), ZCCL_SUCCESS);
    EXPECT_EQ(cache.hits, h0 + 3);
    // The forced-algorithm hook is part of the key.
    zccl__sched_force_algo(ZCCL_ALGO_DIRECT, nullptr);
    ASSERT_EQ(zccl__sched_get(&cache, &args[10], &got), ZCCL_SUCCESS);
    zccl_sched_args_t d = args[10];
    d.algo = ZCCL_ALGO_DIRECT;
    zccl_schedule_t ref;
    ASSERT_EQ(zccl__sched_build(&d, &ref), ZCCL_SUCCESS);
    EXPECT_TRUE(SameSchedule(got, &ref));
    zccl__sched_free(&ref);
    zccl__sched_force_algo(-1, nullptr);
    EXPECT_EQ(cache.hits, h0 + 3);
    // Uneven counts are never cached.
    zccl_sched_args_t v = Args(ZCCL_COLL_ALLGATHER, 2, 5, false, 0, 4, 64);
    size_t cd[4] = {5, 3, 0, 5};
    v.counts = cd;
    v.displs = cd + 2;
    v.count = 5;
    const uint64_t m0 = cache.misses;
    ASSERT_EQ(zccl__sched_get(&cache, &v, &got), ZCCL_SUCCESS);
    ASSERT_EQ(zccl__sched_get(&cache, &v, &got), ZCCL_SUCCESS);
    EXPECT_EQ(cache.misses, m0 + 2);
    zccl__sched_cache_free(&cache);
    EXPECT_EQ(cache.hits + cache.misses, 0u);
}

}  // namespace

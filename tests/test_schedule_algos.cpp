// Every algorithm x every collective it implements, proven by the symbolic checker (sched/sched_check.c) for every
// rank count 1..130 and a spread up to 1024 (ZCCL_TEST_FULL=1: every n up to 1024 and a spread up to 4096): each output element holds each
// rank's contribution exactly once, all-reduce results come from the same expression on every rank (bitwise
// identical), sends and receives pair up without deadlock, no step leaves its buffer. Then the checker must reject
// broken variants, and the alpha-beta-gamma simulator (sched/sched_cost.c) must agree with the closed forms.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "algo.h"
}

namespace {

struct AlgoCase {
    zccl_coll_t coll;
    int algo;
};

std::vector<AlgoCase> AllCases() {
    std::vector<AlgoCase> v;
    for (int algo = 0; algo < zccl__nalgos; algo++) // every row of the registry, named or not
        for (zccl_coll_t coll : {ZCCL_COLL_ALLREDUCE, ZCCL_COLL_REDUCE_SCATTER, ZCCL_COLL_ALLGATHER})
            if (zccl__algo_supports(algo, coll)) v.push_back({coll, algo});
    return v;
}

const char *CollName(zccl_coll_t c) {
    return c == ZCCL_COLL_ALLREDUCE ? "allreduce" : c == ZCCL_COLL_REDUCE_SCATTER ? "reduce_scatter" : "allgather";
}

zccl_sched_args_t Args(zccl_coll_t coll, int algo, int n, size_t count, bool in_place, size_t chunk, size_t round) {
    zccl_sched_args_t a{};
    a.coll = coll;
    a.algo = algo;
    a.nranks = n;
    a.count = count;
    a.in_place = in_place;
    a.elem_size = 4;
    a.chunk_bytes = chunk;
    a.rs_round_bytes = round;
    return a;
}

// Counts that make empty, uneven and several-chunk blocks occur, kept small where a schedule's memory grows with
// n * count per rank (reduce-scatter / all-gather buffers, the direct all-reduce's scratch) and fewer for large n.
std::vector<size_t> Counts(zccl_coll_t coll, int algo, int n, bool thorough) {
    const size_t un = size_t(n);
    if (coll != ZCCL_COLL_ALLREDUCE)
        return thorough ? std::vector<size_t>{1, 2, 5} : n <= 130 ? std::vector<size_t>{1, 3} : n <= 1024 ? std::vector<size_t>{3} : std::vector<size_t>{1};
    if (algo == ZCCL_ALGO_DIRECT) return n <= 130 ? std::vector<size_t>{1, un + 1} : std::vector<size_t>{3};
    if (thorough) return {1, un > 1 ? un - 1 : 1, un, 2 * un + 3};
    if (n <= 130) return {1, 2 * un + 3};
    if (n <= 1024) return {un + 3};
    return {37}; // n > 1024 (ZCCL_TEST_FULL): memory grows with n * count per rank
}

// Host layouts for the hierarchical schedules: one host, n hosts, and for divisors H of n a contiguous, a
// round-robin and a shuffled placement (every divisor when thorough, else H = 2 and H = n/2).
std::vector<std::vector<int>> Layouts(int n, bool thorough) {
    std::vector<std::vector<int>> v;
    v.push_back(std::vector<int>(size_t(n), 7));  // one host
    if (thorough || n % 5 == 0) {
        std::vector<int> each(static_cast<size_t>(n));  // one rank per host
        std::iota(each.begin(), each.end(), 0);
        v.push_back(each);
    }
    std::mt19937 rng{static_cast<uint32_t>(n)};
    for (int H = 2; H < n; H++) {
        if (n % H) continue;
        if (!thorough && H != 2 && H != n / 2) continue;
        const int L = n / H;
        std::vector<int> contig(static_cast<size_t>(n)), rr(static_cast<size_t>(n));
        for (int r = 0; r < n; r++) contig[size_t(r)] = 100 + r / L, rr[size_t(r)] = 50 - r % H;
        v.push_back(contig);
        if (!thorough && H != 2) continue;
        v.push_back(rr);
        if (!thorough) continue;
        std::vector<int> sh = contig;
        std::shuffle(sh.begin(), sh.end(), rng);
        v.push_back(sh);
    }
    return v;
}

// Checks every case at rank count n; returns the number of schedules checked. `thorough` (n <= 24) adds counts,
// small pieces for every count, in place for every n, every host layout; above that, in place and small
// reduce-scatter rounds run for every third n, and n > 130 checks out of place only.
int CheckAll(int n, bool thorough) {
    char err[512];
    int checked = 0;
    for (const AlgoCase &c : AllCases()) {
        // reduce-scatter / all-gather hold n * count elements per rank: n^2 in all; stop at 2048 ranks (~300 MB)
        // and the direct schedules post n-1 messages at once per rank (n^2 in flight): they are for one host anyway
        if (n > 2048 && (c.coll != ZCCL_COLL_ALLREDUCE || c.algo == ZCCL_ALGO_DIRECT)) continue;
        for (size_t count : Counts(c.coll, c.algo, n, thorough)) {
            for (bool in_place : {false, true}) {
                // in place: every n up to 24, every third n up to 130
                if (in_place && !thorough && (n > 130 || n % 3 != 0)) continue;
                // small chunks / rounds (2 elements) force pipelining and rounds; large ones one piece
                for (size_t piece : {size_t(8), size_t(1) << 20}) {
                    // small pieces matter for the pipelined tree and for reduce-scatter rounds
                    if (piece == 8 && !thorough && c.algo != ZCCL_ALGO_TREE &&
                        (count > 8 || n > 130 || c.coll != ZCCL_COLL_REDUCE_SCATTER || n % 3 != 0))
                        continue;
                    if (piece == 8 && n > 130 && c.algo == ZCCL_ALGO_TREE && count > size_t(n)) continue;
                    zccl_sched_args_t a = Args(c.coll, c.algo, n, count, in_place, piece, piece);
                    std::vector<std::vector<int>> layouts = {{}};
                    if (c.algo == ZCCL_ALGO_HIER) layouts = Layouts(n, thorough);
                    for (const auto &lay : layouts) {
                        a.host_of = lay.empty() ? nullptr : lay.data();
                        EXPECT_TRUE(zccl__sched_check(&a, err, sizeof err))
                            << zccl__algo_name(c.algo) << " " << CollName(c.coll) << " n=" << n << " count=" << count
                            << " in_place=" << in_place << " piece=" << piece << (lay.empty() ? "" : " hier layout")
                            << ": " << err;
                        if (::testing::Test::HasFailure()) return checked;
                        checked++;
                    }
                }
            }
        }
    }
    return checked;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The ZCCL_ALGO_* constants name the registry's rows in its order.
TEST(ScheduleAlgos, NamedConstantsMatchTheRegistry) {
    const struct { int id; const char *name; } named[] = {
        {ZCCL_ALGO_RING, "ring"},     {ZCCL_ALGO_RABENSEIFNER, "rabenseifner"}, {ZCCL_ALGO_RECDBL, "recdbl"},
        {ZCCL_ALGO_BRUCK, "bruck"},   {ZCCL_ALGO_TREE, "tree"},                 {ZCCL_ALGO_DIRECT, "direct"},
        {ZCCL_ALGO_HIER, "hier"}};
    for (const auto &c : named) {
        EXPECT_STREQ(zccl__algo_name(c.id), c.name);
        EXPECT_EQ(zccl__algo_from_name(c.name), c.id);
    }
    EXPECT_GE(zccl__nalgos, ZCCL_ALGO_COUNT);
    EXPECT_STREQ(zccl__algo_name(zccl__nalgos), "?");
}

TEST(ScheduleAlgos, EveryAlgorithmEveryRankCountUpTo130) {
    int checked = 0;
    auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    for (int n = 1; n <= 130; n++) {
        checked += CheckAll(n, n <= 24);
        ASSERT_FALSE(HasFailure()) << "n=" << n;
        if (n % 10 == 0)
            std::printf("[ checker ] n<=%d: %d schedules, %.2f s so far (%.2f s CPU)\n", n, checked, Seconds(t0),
                        double(std::clock() - c0) / CLOCKS_PER_SEC);
    }
    EXPECT_GT(checked, 4000);
}

// ZCCL_TEST_FULL=1: every n from 131 to 1024 and a spread up to 4096 instead (about 50 CPU-minutes);
// ZCCL_TEST_SHARD=i/k runs the n with n % k == i, so k processes can share the sweep.
TEST(ScheduleAlgos, SpreadUpTo1024) {
    std::vector<int> ns = {131, 256, 257, 513, 1024};
    if (std::getenv("ZCCL_TEST_FULL")) {
        ns.clear();
        for (int n = 131; n <= 1024; n++) ns.push_back(n);
        ns.insert(ns.end(), {2047, 2048, 4095, 4096});
    }
    int shard = 0, shards = 1;
    if (const char *sh = std::getenv("ZCCL_TEST_SHARD")) {
        ASSERT_EQ(std::sscanf(sh, "%d/%d", &shard, &shards), 2) << "ZCCL_TEST_SHARD=" << sh << ": expected i/k";
        ASSERT_TRUE(shards >= 1 && shard >= 0 && shard < shards) << "ZCCL_TEST_SHARD=" << sh;
    }
    int done = 0;
    for (int n : ns) {
        if (n % shards != shard) continue;
        done++;
        auto t0 = std::chrono::steady_clock::now();
        const std::clock_t c0 = std::clock();
        int k = CheckAll(n, false);
        ASSERT_FALSE(HasFailure()) << "n=" << n;
        std::printf("[ checker ] n=%d: %d schedules in %.2f s (%.2f s CPU)\n", n, k, Seconds(t0),
                    double(std::clock() - c0) / CLOCKS_PER_SEC);
        std::fflush(stdout);
    }
    std::printf("[ checker ] %d rank counts proven\n", done);
}

TEST(ScheduleAlgos, UnsupportedCombinationsAreRefused) {
    zccl_schedule_t s;
    zccl_sched_args_t a = Args(ZCCL_COLL_REDUCE_SCATTER, ZCCL_ALGO_TREE, 4, 8, false, 8, 8);
    EXPECT_EQ(zccl__sched_build(&a, &s), ZCCL_INVALID_ARGUMENT);
    a = Args(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_BRUCK, 4, 8, false, 8, 8);
    EXPECT_EQ(zccl__sched_build(&a, &s), ZCCL_INVALID_ARGUMENT);
    a = Args(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_COUNT, 4, 8, false, 8, 8);
    EXPECT_EQ(zccl__sched_build(&a, &s), ZCCL_INVALID_ARGUMENT);
    // hosts with different rank counts
    int hosts[5] = {0, 0, 0, 1, 1};
    a = Args(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_HIER, 5, 8, false, 8, 8);
    a.host_of = hosts;
    EXPECT_EQ(zccl__sched_build(&a, &s), ZCCL_INVALID_ARGUMENT);
    // names round-trip
    for (int i = 0; i < ZCCL_ALGO_COUNT; i++) EXPECT_EQ(zccl__algo_from_name(zccl__algo_name(i)), i);
    EXPECT_EQ(zccl__algo_from_name("nosuch"), -1);
}

// ---- the checker must reject broken variants of the new schedules ---------------------------------------------

int g_victim = 1;
void DropFirstReceive(int rank, zccl_schedule_t *s) {
    if (rank != g_victim) return;
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == ZCCL_STEP_RECV) { s->steps[i].kind = ZCCL_STEP_COPY; s->steps[i].src = s->steps[i].buf; s->steps[i].src_off = s->steps[i].off; return; }
}
void ClearFinal(int, zccl_schedule_t *s) {
    for (size_t i = 0; i < s->nsteps; i++) s->steps[i].final = 0;
}
void PlainLastReduce(int rank, zccl_schedule_t *s) {
    // the victim's last reduction (a reducing receive or a local reduce) forgets to reduce: a contribution is lost
    if (rank != g_victim) return;
    for (size_t i = s->nsteps; i-- > 0;) {
        zccl_step_t &x = s->steps[i];
        if (x.kind == ZCCL_STEP_RECV && x.src != ZCCL_BUF_NONE) {
            x.src = ZCCL_BUF_NONE;
            x.final = 0;
            return;
        }
        if (x.kind == ZCCL_STEP_REDUCE) {
            x.kind = ZCCL_STEP_COPY;
            x.final = 0;
            return;
        }
    }
}
void SwapReduceOperands(int rank, zccl_schedule_t *s) {
    // recursive doubling's canonical order broken on one rank: same value, different expression
    if (rank != g_victim) return;
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == ZCCL_STEP_REDUCE) {
            std::swap(s->steps[i].src, s->steps[i].src2);
            std::swap(s->steps[i].src_off, s->steps[i].src2_off);
            return;
        }
}
void ShiftFirstSend(int rank, zccl_schedule_t *s) {
    if (rank != g_victim) return;
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == ZCCL_STEP_SEND) {
            if (s->steps[i].off > 0) s->steps[i].off--;
            else s->steps[i].off++;
            return;
        }
}
void MergePhases(int rank, zccl_schedule_t *s) {
    // run the victim's first two phases as one: a send then reads what a receive of the same phase writes, or
    // the data it sends is not there yet
    if (rank != g_victim || s->nphases < 2) return;
    for (size_t p = 0; p + 1 < s->nphases; p++) s->phase_end[p] = s->phase_end[p + 1];
    s->nphases--;
}

TEST(ScheduleAlgos, CheckerRejectsBrokenVariants) {
    char err[512];
    struct Mut {
        zccl_sched_mutator_t f;
        const char *name;
    };
    const Mut muts[] = {{DropFirstReceive, "drop receive"},
                        {ClearFinal, "no final"},
                        {PlainLastReduce, "lost contribution"},
                        {ShiftFirstSend, "wrong element"},
                        {MergePhases, "merged phases"}};
    for (const AlgoCase &c : AllCases()) {
        for (int n : {4, 6, 7}) {
            zccl_sched_args_t a = Args(c.coll, c.algo, n, size_t(3 * n + 1), false, 8, 8);
            int hosts[8] = {0, 0, 1, 1, 2, 2, 3, 3};
            if (c.algo == ZCCL_ALGO_HIER) {
                if (n == 7) continue;
                for (int r = 0; r < n; r++) hosts[r] = r / 2;
                a.host_of = hosts;
            }
            ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err)) << err;
            for (const Mut &m : muts) {
                if (m.f == ClearFinal && c.coll == ZCCL_COLL_ALLGATHER) continue;  // copies only: nothing is final
                if (m.f == PlainLastReduce && c.coll == ZCCL_COLL_ALLGATHER) continue;
                if (m.f == MergePhases && c.coll == ZCCL_COLL_ALLGATHER && c.algo == ZCCL_ALGO_DIRECT) continue;  // one phase
                bool rejected = false;
                for (int victim = 0; victim < n && !rejected; victim++) {
                    g_victim = victim;
                    rejected = !zccl__sched_check_with(&a, m.f, err, sizeof err);
                }
                EXPECT_TRUE(rejected) << zccl__algo_name(c.algo) << " " << CollName(c.coll) << " n=" << n << ": "
                                      << m.name << " was not caught";
            }
        }
    }
    // the expression check: recursive doubling with one rank combining upper OP lower
    zccl_sched_args_t a = Args(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RECDBL, 8, 5, false, 8, 8);
    g_victim = 3;
    EXPECT_FALSE(zccl__sched_check_with(&a, SwapReduceOperands, err, sizeof err));
    EXPECT_NE(std::string(err).find("bitwise"), std::string::npos) << err;
}

// ---- alpha-beta-gamma cost ---------------------------------------------------------------------------------

TEST(ScheduleCost, SimulationMatchesClosedForms) {
    const zccl_cost_params_t p = {2e-6, 1e-9, 2e-10, 0, 0};
    char err[256];
    int compared = 0;
    for (const AlgoCase &c : AllCases()) {
        for (int n : {2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 32, 64}) {
            for (size_t count : {size_t(64), size_t(4096)}) {
                // all-reduce count divisible by the block counts so that the formulas are exact
                size_t cnt = c.coll == ZCCL_COLL_ALLREDUCE ? count * size_t(n) * 64 : count;
                zccl_sched_args_t a = Args(c.coll, c.algo, n, cnt, false, 1 << 20, 64 << 20);
                const double f = zccl__sched_cost_formula(&a, &p);
                const double sim = zccl__sched_cost(&a, &p, err, sizeof err);
                ASSERT_GE(sim, 0) << err;
                if (f < 0) continue;
                EXPECT_NEAR(sim, f, 1e-9 * f + 1e-15)
                    << zccl__algo_name(c.algo) << " " << CollName(c.coll) << " n=" << n << " count=" << cnt;
                compared++;
            }
        }
    }
    EXPECT_GT(compared, 150);
}

TEST(ScheduleCost, ShapesOfTheTradeOff) {
    const zccl_cost_params_t p = {5e-6, 1e-10, 1e-11, 0, 0};
    char err[256];
    auto cost = [&](zccl_coll_t coll, int algo, int n, size_t count) {
        zccl_sched_args_t a = Args(coll, algo, n, count, false, 1 << 20, 4 << 20);
        double t = zccl__sched_cost(&a, &p, err, sizeof err);
        EXPECT_GE(t, 0) << err;
        return t;
    };
    // tiny all-reduce on 64 ranks: log-depth algorithms beat the ring's 2(n-1) steps
    EXPECT_LT(cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RECDBL, 64, 8), cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RING, 64, 8) / 5);
    EXPECT_LT(cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_TREE, 64, 8), cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RING, 64, 8) / 3);
    // large all-reduce: the ring and Rabenseifner move 2(n-1)/n of the data, recursive doubling log2(n) times it
    const size_t big = 64u << 20;
    EXPECT_LT(cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RING, 16, big), cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RECDBL, 16, big) / 1.5);
    // the pipelined double tree is within a small factor of the ring for large messages
    EXPECT_LT(cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_TREE, 16, big), 2.5 * cost(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RING, 16, big));
    // Bruck all-gather: log steps
    EXPECT_LT(cost(ZCCL_COLL_ALLGATHER, ZCCL_ALGO_BRUCK, 100, 1), cost(ZCCL_COLL_ALLGATHER, ZCCL_ALGO_RING, 100, 1) / 5);
}

TEST(ScheduleCost, HierarchicalSavesTheSlowLinks) {
    // 4 hosts x 4 ranks, network 20x slower than shared memory: the hierarchical all-reduce must beat the flat ring
    // whose every step crosses a host boundary somewhere.
    zccl_cost_params_t p = {1e-6, 1e-10, 1e-11, 20e-6, 2e-9};
    std::vector<int> hosts(16);
    for (int r = 0; r < 16; r++) hosts[size_t(r)] = r / 4;
    char err[256];
    zccl_sched_args_t a = Args(ZCCL_COLL_ALLREDUCE, ZCCL_ALGO_RING, 16, 16u << 20, false, 1 << 20, 4 << 20);
    a.host_of = hosts.data();
    const double ring = zccl__sched_cost(&a, &p, err, sizeof err);
    a.algo = ZCCL_ALGO_HIER;
    const double hier = zccl__sched_cost(&a, &p, err, sizeof err);
    ASSERT_GT(ring, 0) << err;
    ASSERT_GT(hier, 0) << err;
    EXPECT_LT(hier, ring / 2) << "hier " << hier << " ring " << ring;
}

TEST(ScheduleCost, DeadlockAndMismatchAreReported) {
    const zccl_cost_params_t p = {1e-6, 1e-9, 0, 0, 0};
    char err[256];
    zccl_sched_args_t a = Args(ZCCL_COLL_SEND, ZCCL_ALGO_RING, 2, 4, false, 8, 8);
    a.root = 1;
    EXPECT_LT(zccl__sched_cost(&a, &p, err, sizeof err), 0);  // a send nobody receives
    EXPECT_NE(std::string(err).find("receive"), std::string::npos) << err;
}

}  // namespace

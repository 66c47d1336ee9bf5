/*
 * test_split_v.cpp — zccl_comm_split and the uneven collectives zccl_reduce_scatter_v / zccl_allgather_v.
 *
 * ScheduleV.*: the symbolic checker (sched/sched_check.c) proves the ring reduce-scatter / all-gather with uneven
 * blocks — random counts including zeros, one rank owning everything, rounds smaller than a block — for n = 1..40,
 * in and out of place, any ring order.
 * SplitV.*: forked ranks (tests/harness) over shm and tcp. Split 6 ranks by color = rank % 3 with key = -rank (so new
 * ranks reverse the old order) plus one rank with ZCCL_SPLIT_NOCOLOR; each group all-reduces values that name its
 * members and checks the sum the test computes, then the parent communicator still works. The _v collectives run with
 * counts {0, 1, 1000, 7, 0, 33333} style vectors, float32 sum and int32 max, in and out of place, against a reference
 * computed from the generator; ZCCL_CHECK=1 catches ranks passing different counts.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "harness/harness.h"
extern "C" {
#include "schedule.h"
}
#include "zccl.h"

using namespace zt;

namespace {

/* ---- symbolic proofs ------------------------------------------------------------------------------------------ */

void prove_v(zccl_coll_t coll, const std::vector<size_t> &counts, bool in_place, size_t round_elems,
             const std::vector<int> *ring) {
    const int n = (int)counts.size();
    std::vector<size_t> displs(n);
    size_t t = 0;
    for (int r = 0; r < n; r++) displs[r] = t, t += counts[r];
    zccl_sched_args_t a{};
    a.coll = coll;
    a.nranks = n;
    a.count = counts[0];
    a.in_place = in_place;
    a.elem_size = 4;
    a.chunk_bytes = 1 << 20;
    a.rs_round_bytes = round_elems * 4;
    a.algo = ZCCL_ALGO_RING;
    a.ring = ring ? ring->data() : nullptr;
    a.counts = counts.data();
    a.displs = displs.data();
    char err[512];
    std::string c;
    for (size_t x : counts) c += std::to_string(x) + ",";
    ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err))
        << (coll == ZCCL_COLL_REDUCE_SCATTER ? "reduce_scatter_v" : "allgather_v") << " n=" << n << " counts={" << c
        << "} in_place=" << in_place << " round=" << round_elems << ": " << err;
}

TEST(ScheduleV, RandomUnevenCountsUpTo40Ranks) {
    std::mt19937 rng(12345);
    for (int n = 1; n <= 40; n++) {
        for (int trial = 0; trial < 3; trial++) {
            std::vector<size_t> counts(n);
            for (int r = 0; r < n; r++) counts[r] = (rng() % 4 == 0) ? 0 : rng() % 9;
            std::vector<int> ring(n);
            for (int i = 0; i < n; i++) ring[i] = i;
            std::shuffle(ring.begin(), ring.end(), rng);
            for (bool ip : {false, true})
                for (size_t round : {size_t(1), size_t(3), size_t(1000)}) {
                    prove_v(ZCCL_COLL_REDUCE_SCATTER, counts, ip, round, trial == 2 ? &ring : nullptr);
                    prove_v(ZCCL_COLL_ALLGATHER, counts, ip, round, trial == 2 ? &ring : nullptr);
                }
        }
    }
}

TEST(ScheduleV, OneRankOwnsEverythingAndAllZeroButOne) {
    for (int n : {2, 3, 5, 8}) {
        for (int owner = 0; owner < n; owner++) {
            std::vector<size_t> counts(n, 0);
            counts[owner] = 17;
            for (bool ip : {false, true}) {
                prove_v(ZCCL_COLL_REDUCE_SCATTER, counts, ip, 4, nullptr);
                prove_v(ZCCL_COLL_ALLGATHER, counts, ip, 4, nullptr);
            }
        }
    }
}

TEST(ScheduleV, CheckerCatchesAWrongBlockLength) {
    // The checker must notice when a rank's schedule assumes different counts than its peers (the bug ZCCL_CHECK
    // guards against at run time): build rank schedules from counts that disagree in one entry.
    std::vector<size_t> counts = {3, 5, 2, 4};
    std::vector<size_t> displs = {0, 3, 8, 10};
    zccl_sched_args_t a{};
    a.coll = ZCCL_COLL_REDUCE_SCATTER;
    a.nranks = 4;
    a.elem_size = 4;
    a.rs_round_bytes = 1 << 20;
    a.counts = counts.data();
    a.displs = displs.data();
    char err[512];
    ASSERT_TRUE(zccl__sched_check(&a, err, sizeof err)) << err;
    static std::vector<size_t> bad_counts = {3, 6, 2, 4}, bad_displs = {0, 3, 9, 11};
    auto mutate = [](int rank, zccl_schedule_t *s) {
        if (rank != 1) return;
        zccl_sched_args_t b{};
        b.coll = ZCCL_COLL_REDUCE_SCATTER;
        b.nranks = 4;
        b.rank = 1;
        b.elem_size = 4;
        b.rs_round_bytes = 1 << 20;
        b.counts = bad_counts.data();
        b.displs = bad_displs.data();
        b.count = bad_counts[1];
        zccl__sched_free(s);
        zccl__sched_build(&b, s);
    };
    EXPECT_FALSE(zccl__sched_check_with(&a, mutate, err, sizeof err));
    EXPECT_NE(std::string(err), "");
}

/* ---- processes ------------------------------------------------------------------------------------------------ */

class SplitV : public ::testing::TestWithParam<std::string> {};

int rank_fail(int rank, const std::string &what, zccl_comm_t comm = nullptr) {
    fprintf(stderr, "[rank %d] FAIL %s: %s\n", rank, what.c_str(), zccl_get_last_error(comm));
    return 1;
}

TEST_P(SplitV, SplitByColorReversedKeysAndNoColor) {
    Options o;
    o.deadline_s = 90;
    o.env = {{"ZCCL_TRANSPORT", GetParam()}};
    run_ranks(7, [](zccl_comm_t comm, int rank, int nranks) -> int {
        // Rank 6 joins no group; the others split by rank % 3 with key -rank (new order reverses the old one).
        const int color = rank == 6 ? ZCCL_SPLIT_NOCOLOR : rank % 3;
        zccl_comm_t sub = reinterpret_cast<zccl_comm_t>(1);
        if (zccl_comm_split(comm, color, -rank, &sub) != ZCCL_SUCCESS) return rank_fail(rank, "split", comm);
        std::vector<int> members;
        for (int r = nranks - 2; r >= 0; r--)
            if (r % 3 == color) members.push_back(r); /* by key -r ascending = old rank descending */
        if (color == ZCCL_SPLIT_NOCOLOR) {
            if (sub != nullptr) return rank_fail(rank, "NOCOLOR rank got a communicator");
        } else {
            int nr = -1, nn = -1;
            zccl_comm_rank(sub, &nr);
            zccl_comm_count(sub, &nn);
            int want_rank = -1;
            for (size_t i = 0; i < members.size(); i++)
                if (members[i] == rank) want_rank = (int)i;
            if (nn != (int)members.size() || nr != want_rank)
                return rank_fail(rank, "new rank " + std::to_string(nr) + " of " + std::to_string(nn) + ", want " +
                                           std::to_string(want_rank) + " of " + std::to_string(members.size()));
            // Each member contributes 2^old_rank at position new_rank, and its old rank elsewhere: the sums name
            // exactly who is in the group and in which order.
            std::vector<int64_t> v(8, 0);
            v[nr] = int64_t(1) << rank;
            v[7] = rank;
            if (zccl_allreduce(v.data(), v.data(), 8, ZCCL_INT64, ZCCL_SUM, sub, nullptr) != ZCCL_SUCCESS)
                return rank_fail(rank, "allreduce on the split communicator", sub);
            int64_t sum = 0;
            for (size_t i = 0; i < members.size(); i++) {
                sum += members[i];
                if (v[i] != (int64_t(1) << members[i]))
                    return rank_fail(rank, "group member " + std::to_string(i) + " is not old rank " +
                                               std::to_string(members[i]));
            }
            if (v[7] != sum) return rank_fail(rank, "group sum " + std::to_string(v[7]) + " != " + std::to_string(sum));
            // A second split of the sub-communicator (one per member) also works: splits nest.
            zccl_comm_t solo = nullptr;
            if (zccl_comm_split(sub, nr, 0, &solo) != ZCCL_SUCCESS) return rank_fail(rank, "nested split", sub);
            int sn = 0;
            zccl_comm_count(solo, &sn);
            if (sn != 1) return rank_fail(rank, "nested split size " + std::to_string(sn));
            zccl_comm_destroy(solo);
            zccl_comm_destroy(sub);
        }
        // The parent still works, and its collectives are still in step after the split.
        int32_t x = rank, y = 0;
        if (zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS)
            return rank_fail(rank, "parent allreduce", comm);
        if (y != nranks * (nranks - 1) / 2) return rank_fail(rank, "parent sum " + std::to_string(y));
        // Bad arguments name themselves.
        zccl_comm_t c2;
        if (zccl_comm_split(comm, -5, 0, &c2) != ZCCL_INVALID_ARGUMENT || !strstr(zccl_get_last_error(nullptr), "color"))
            return rank_fail(rank, "color -5 not rejected naming 'color'");
        if (zccl_comm_split(comm, 0, 0, nullptr) != ZCCL_INVALID_ARGUMENT) return rank_fail(rank, "NULL newcomm");
        return 0;
    }, o);
}

float vgen(int rank, size_t i) { return (float)((rank * 31 + (int)(i % 97)) % 13) - 6.0f; }

TEST_P(SplitV, UnevenReduceScatterAndAllGather) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", GetParam()}, {"ZCCL_RS_ROUND_BYTES", "4K"}, {"ZCCL_CHECK", "1"}};
    run_ranks(5, [](zccl_comm_t comm, int rank, int nranks) -> int {
        for (const std::vector<size_t> &counts :
             {std::vector<size_t>{0, 1, 1000, 7, 33333}, std::vector<size_t>{5, 5, 5, 5, 6},
              std::vector<size_t>{0, 0, 0, 0, 4099}, std::vector<size_t>{0, 0, 0, 0, 0}}) {
            std::vector<size_t> displs(nranks);
            size_t total = 0;
            for (int r = 0; r < nranks; r++) displs[r] = total, total += counts[r];
            const size_t mine = counts[rank], moff = displs[rank];
            const std::string tag = "counts[4]=" + std::to_string(counts[4]);
            for (bool in_place : {false, true}) {
                // reduce-scatter-v, float32 sum: small integers, so the sum is exact in any order.
                std::vector<float> send(total + 1), recv(mine + 1, -99.0f);
                for (size_t i = 0; i < total; i++) send[i] = vgen(rank, i);
                send[total] = 1234.0f; /* guard */
                float *out = in_place ? send.data() + moff : recv.data();
                if (zccl_reduce_scatter_v(send.data(), out, counts.data(), ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) !=
                    ZCCL_SUCCESS)
                    return rank_fail(rank, "reduce_scatter_v " + tag, comm);
                for (size_t i = 0; i < mine; i++) {
                    float want = 0;
                    for (int q = 0; q < nranks; q++) want += vgen(q, moff + i);
                    if (out[i] != want)
                        return rank_fail(rank, "reduce_scatter_v " + tag + " element " + std::to_string(i) + " = " +
                                                   std::to_string(out[i]) + ", want " + std::to_string(want));
                }
                if (!in_place && recv[mine] != -99.0f) return rank_fail(rank, "reduce_scatter_v wrote past recvcount");
                if (send[total] != 1234.0f) return rank_fail(rank, "reduce_scatter_v wrote past the send buffer");
                if (!in_place)
                    for (size_t i = 0; i < total; i++)
                        if (send[i] != vgen(rank, i)) return rank_fail(rank, "reduce_scatter_v changed sendbuf");
                // all-gather-v, int32.
                std::vector<int32_t> full(total + 1, -7), part(mine);
                for (size_t i = 0; i < mine; i++) part[i] = rank * 100000 + (int32_t)i;
                const int32_t *sb = part.data();
                if (in_place) {
                    for (size_t i = 0; i < mine; i++) full[moff + i] = part[i];
                    sb = full.data() + moff;
                }
                if (zccl_allgather_v(mine ? sb : nullptr, full.data(), counts.data(), ZCCL_INT32, comm, nullptr) !=
                    ZCCL_SUCCESS)
                    return rank_fail(rank, "allgather_v " + tag, comm);
                for (int q = 0; q < nranks; q++)
                    for (size_t i = 0; i < counts[q]; i++)
                        if (full[displs[q] + i] != q * 100000 + (int32_t)i)
                            return rank_fail(rank, "allgather_v " + tag + " block " + std::to_string(q) + " element " +
                                                       std::to_string(i));
                if (full[total] != -7) return rank_fail(rank, "allgather_v wrote past the receive buffer");
            }
        }
        // On a stream, with the counts array gone before the operation runs (the call copies it).
        zccl_stream_t st;
        if (zccl_stream_create(&st) != ZCCL_SUCCESS) return rank_fail(rank, "stream");
        std::vector<int32_t> full(15);
        int32_t mine[3] = {rank, rank, rank};
        {
            std::vector<size_t> counts = {3, 3, 3, 3, 3};
            if (zccl_allgather_v(mine, full.data(), counts.data(), ZCCL_INT32, comm, st) != ZCCL_SUCCESS)
                return rank_fail(rank, "allgather_v on a stream", comm);
            counts.assign(5, 999); /* overwritten before the stream runs it */
        }
        if (zccl_stream_synchronize(st) != ZCCL_SUCCESS) return rank_fail(rank, "stream synchronize");
        zccl_stream_destroy(st);
        for (int i = 0; i < 15; i++)
            if (full[i] != i / 3) return rank_fail(rank, "stream allgather_v element " + std::to_string(i));
        // ZCCL_CHECK=1: rank 4 passes counts that differ from everyone else's; every rank must get
        // ZCCL_INVALID_USAGE (the check runs before data moves, so the communicator stays usable).
        std::vector<size_t> counts = {1, 1, 1, 1, 1};
        if (rank == 4) counts = {1, 1, 2, 1, 0};
        std::vector<float> s(5, 1.0f), r(2);
        zccl_result_t res = zccl_reduce_scatter_v(s.data(), r.data(), counts.data(), ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
        if (res != ZCCL_INVALID_USAGE || !strstr(zccl_get_last_error(nullptr), "_v"))
            return rank_fail(rank, "mismatched counts not reported (" + std::to_string(res) + ")");
        // Bad arguments.
        if (zccl_allgather_v(mine, full.data(), nullptr, ZCCL_INT32, comm, nullptr) != ZCCL_INVALID_ARGUMENT ||
            !strstr(zccl_get_last_error(nullptr), "counts"))
            return rank_fail(rank, "NULL counts not rejected naming 'counts'");
        std::vector<size_t> huge = {SIZE_MAX, 2, 0, 0, 0};
        if (zccl_reduce_scatter_v(s.data(), r.data(), huge.data(), ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) !=
            ZCCL_INVALID_ARGUMENT)
            return rank_fail(rank, "overflowing counts accepted");
        int32_t one = 1, all = 0;
        if (zccl_allreduce(&one, &all, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS || all != nranks)
            return rank_fail(rank, "communicator unusable after the rejected calls", comm);
        return 0;
    }, o);
}

INSTANTIATE_TEST_SUITE_P(Transports, SplitV, ::testing::Values("shm", "tcp"));

}  // namespace

/*
 * test_staged.cpp — the staged one-pass path (lib/core/regmem.c): all-reduce, reduce-scatter and all-gather on
 * ordinary host buffers whose vector lies within [ZCCL_SHM_STAGED_MIN_BYTES, ZCCL_SHM_STAGED_MAX_BYTES], every rank
 * on one host. Each result is checked element by element against a reference the test computes from the inputs'
 * formula (integer-valued data, so every order of summation is exact); every call must have taken the path
 * (zccl__stg_calls), and none must when the path is off; by default it is on exactly when the host has more ranks
 * than cores. Calls that differ between ranks fail on every rank.
 */
#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" uint64_t zccl__stg_calls(void); /* lib/core/regmem.h */
#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {


/* Element k of rank q's input: small integers, different per rank and position. */
double input(int q, size_t k) { return (double)((k * 7 + (size_t)q * 13) % 61) - 20.0; }

template <typename T>
double ref_reduce(zccl_redop_t op, int n, size_t k) {
    double acc = input(0, k);
    for (int q = 1; q < n; q++) {
        const double v = input(q, k);
        if (op == ZCCL_SUM || op == ZCCL_AVG) acc += v;
        else if (op == ZCCL_MAX) acc = v > acc ? v : acc;
        else if (op == ZCCL_MIN) acc = v < acc ? v : acc;
    }
    if (op == ZCCL_AVG) acc = (double)(T)(acc / n);
    return acc;
}

/* One collective of type T on this rank: in place or out of place, result checked. Returns 0 if right. */
template <typename T>
int one(zccl_comm_t comm, int rank, int n, const char *coll, zccl_datatype_t dt, zccl_redop_t op,
        size_t count, bool in_place, bool expect_staged) {
    const bool ar = !strcmp(coll, "allreduce"), rs = !strcmp(coll, "reduce_scatter");
    const size_t in_n = rs ? count * (size_t)n : count, out_n = (!ar && !rs) ? count * (size_t)n : count;
    std::vector<T> send(in_n), recv(out_n + 16, (T)-77), buf(std::max(in_n, out_n));
    for (size_t k = 0; k < in_n; k++) send[k] = (T)input(rank, (rs || ar) ? k : k + (size_t)rank * count);
    const uint64_t before = zccl__stg_calls();
    zccl_result_t res;
    T *out;
    if (ar) {
        if (in_place) {
            std::copy(send.begin(), send.end(), buf.begin());
            res = zccl_allreduce(buf.data(), buf.data(), count, dt, op, comm, nullptr);
            out = buf.data();
        } else {
            res = zccl_allreduce(send.data(), recv.data(), count, dt, op, comm, nullptr);
            out = recv.data();
        }
    } else if (rs) {
        if (in_place) {
            std::copy(send.begin(), send.end(), buf.begin());
            res = zccl_reduce_scatter(buf.data(), buf.data() + (size_t)rank * count, count, dt, op, comm, nullptr);
            out = buf.data() + (size_t)rank * count;
        } else {
            res = zccl_reduce_scatter(send.data(), recv.data(), count, dt, op, comm, nullptr);
            out = recv.data();
        }
    } else {
        if (in_place) {
            std::copy(send.begin(), send.end(), buf.begin() + (long)((size_t)rank * count));
            res = zccl_allgather(buf.data() + (size_t)rank * count, buf.data(), count, dt, comm, nullptr);
            out = buf.data();
        } else {
            res = zccl_allgather(send.data(), recv.data(), count, dt, comm, nullptr);
            out = recv.data();
        }
    }
    ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "%s count %zu: %s", coll, count, zccl_get_last_error(comm));
    const uint64_t took = zccl__stg_calls() - before;
    ZT_CHILD_CHECK(took == (expect_staged ? 1u : 0u), "%s count %zu: %llu staged calls, expected %d", coll, count,
              (unsigned long long)took, (int)expect_staged);
    size_t wrong = 0, first = 0;
    for (size_t k = 0; k < out_n; k++) {
        double want;
        if (ar) want = ref_reduce<T>(op, n, k);
        else if (rs) want = ref_reduce<T>(op, n, (size_t)rank * count + k);
        else want = input((int)(k / count), k); /* all-gather: rank k/count's element k */
        if ((double)out[k] != want && !wrong++) first = k;
    }
    if (!in_place)
        for (size_t k = out_n; k < out_n + 16; k++) wrong += recv[k] != (T)-77; /* nothing past the output */
    ZT_CHILD_CHECK(wrong == 0, "%s %s count %zu %s: %zu wrong elements, first at %zu", coll, in_place ? "in place" :
              "out of place", count, dt == ZCCL_FLOAT32 ? "float32" : "other", wrong, first);
    return 0;
}

int matrix_body(zccl_comm_t comm, int rank, int n) {
    /* Vectors (bytes) inside the default bounds [32 KiB, 4 MiB], counts not multiples of n. */
    const size_t f32_counts[] = {9001, 100003, 1048573};
    for (size_t c : f32_counts)
        for (int ip = 0; ip < 2; ip++) {
            if (one<float>(comm, rank, n, "allreduce", ZCCL_FLOAT32, ZCCL_SUM, c, ip, true)) return 1;
            const size_t per = c / (size_t)n; /* reduce-scatter / all-gather: the vector is n * count */
            if (one<float>(comm, rank, n, "reduce_scatter", ZCCL_FLOAT32, ZCCL_SUM, per, ip, true)) return 1;
            if (one<float>(comm, rank, n, "allgather", ZCCL_FLOAT32, ZCCL_SUM, per, ip, true)) return 1;
        }
    if (one<int32_t>(comm, rank, n, "allreduce", ZCCL_INT32, ZCCL_MAX, 20011, false, true)) return 1;
    if (one<int32_t>(comm, rank, n, "allreduce", ZCCL_INT32, ZCCL_MIN, 20011, true, true)) return 1;
    if (one<double>(comm, rank, n, "allreduce", ZCCL_FLOAT64, ZCCL_AVG, 40009, false, true)) return 1;
    if (one<int64_t>(comm, rank, n, "reduce_scatter", ZCCL_INT64, ZCCL_SUM, 5003, false, true)) return 1;
    /* Outside the bounds: the tuned schedule. */
    if (one<float>(comm, rank, n, "allreduce", ZCCL_FLOAT32, ZCCL_SUM, 1000, false, false)) return 1;
    if (one<float>(comm, rank, n, "allreduce", ZCCL_FLOAT32, ZCCL_SUM, (4u << 20) / 4 + 1, false, false))
        return 1;
    return 0;
}

int off_body(zccl_comm_t comm, int rank, int n) {
    if (one<float>(comm, rank, n, "allreduce", ZCCL_FLOAT32, ZCCL_SUM, 100003, false, false)) return 1;
    if (one<float>(comm, rank, n, "allgather", ZCCL_FLOAT32, ZCCL_SUM, 30001, true, false)) return 1;
    return 0;
}

int auto_on_body(zccl_comm_t comm, int rank, int n) {
    if (one<float>(comm, rank, n, "allreduce", ZCCL_FLOAT32, ZCCL_SUM, 100003, false, true)) return 1;
    if (one<float>(comm, rank, n, "reduce_scatter", ZCCL_FLOAT32, ZCCL_SUM, 30001, true, true)) return 1;
    return 0;
}

/* Rank 0 all-reduces 10000 floats, the others 12000: both inside the bounds, so every rank is on the staged path
 * and must fail naming the difference; none may return success. */
int mismatch_body(zccl_comm_t comm, int rank, int) {
    const size_t count = rank == 0 ? 10000 : 12000;
    std::vector<float> s(count, 1.0f), r(count);
    const zccl_result_t res = zccl_allreduce(s.data(), r.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
    ZT_CHILD_CHECK(res != ZCCL_SUCCESS, "a mismatched all-reduce returned success");
    const std::string msg = zccl_get_last_error(comm);
    ZT_CHILD_CHECK(msg.find("different collectives") != std::string::npos || msg.find("rank") != std::string::npos,
              "message does not name the cause: %s", msg.c_str());
    return 0;
}

}  // namespace

class Staged : public ::testing::TestWithParam<int> {};

TEST_P(Staged, MatrixMatchesReference) {
    Options o;
    o.deadline_s = 180;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_STAGED", std::string("1")}};
    run_ranks(GetParam(), matrix_body, o);
}

TEST_P(Staged, OffWhenDisabled) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_STAGED", std::string("1")},
             {"ZCCL_SHM_STAGED_MAX_BYTES", std::string("0")}};
    run_ranks(GetParam(), off_body, o);
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_STAGED", std::string("0")}};
    run_ranks(GetParam(), off_body, o);
}

/* The default (-1): on exactly when the host has more ranks than this process's cores. */
TEST_P(Staged, AutomaticFollowsRanksPerCore) {
    cpu_set_t set;
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    const bool on = GetParam() > CPU_COUNT(&set);
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}};
    run_ranks(GetParam(), on ? auto_on_body : off_body, o);
}

TEST_P(Staged, DifferentCountsFailOnEveryRank) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_STAGED", std::string("1")}};
    run_ranks(GetParam(), mismatch_body, o);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Staged, ::testing::Values(2, 3, 5),
                         [](const ::testing::TestParamInfo<int> &i) { return std::to_string(i.param) + "ranks"; });

/*
 * test_sum_order.cpp — one summation order on one host, whichever path a call takes (issue 26, item 3).
 *
 * On ranks of one host a float all-reduce or reduce-scatter can run three ways: the registered one-pass path
 * (buffers from zccl_mem_alloc registered on every rank; lib/core/regmem.c reduce_blocks), the staged one-pass path
 * (ordinary buffers; ZCCL_SHM_STAGED), or a schedule of the engine; of the schedules, "direct" adds in rank order
 * too. All three must give bitwise the same result for the same inputs, so that registering a buffer (or the host
 * having more ranks than cores, which turns the staged path on) never changes a training run's bits. The inputs
 * span 2^-20 .. 2^20 with both signs, so any other association of the sum changes last bits (the staged path summed
 * its own block first until it was changed: that order fails this test).
 *
 * For 2, 3, 4, 5 and 8 ranks, float32 and float64, SUM and AVG, all-reduce and reduce-scatter, in place and out of
 * place: (a) registered buffers, which must take the direct path (zccl__reg_direct_calls); (b) ordinary buffers on a
 * communicator with ZCCL_SHM_STAGED=1, which must take the staged path (zccl__stg_calls); (c) ordinary buffers on a
 * communicator split off with ZCCL_SHM_STAGED=0 and ZCCL_ALGO=direct, which must take neither. (a), (b), (c) equal
 * bit for bit, and equal to a rank-order sum the test computes itself in the same type.
 */
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" uint64_t zccl__stg_calls(void);          /* lib/core/regmem.h */
extern "C" uint64_t zccl__reg_direct_calls(int mem_type); /* lib/core/regmem.h; 0: host memory */
#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

/* Element k of rank q's vector: +-m * 2^e, e in [-20, 20], m in [1, 2): far from exact in any order but one. */
double input(int q, size_t k, int salt) {
    uint64_t x = ((uint64_t)(q + 1) * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)k * 0xBF58476D1CE4E5B9ull) ^
                 ((uint64_t)salt * 0x94D049BB133111EBull);
    x ^= x >> 31;
    x *= 0xD6E8FEB86657755Bull;
    x ^= x >> 29;
    const double m = 1.0 + (double)(x & 0xFFFFFF) / (double)0x1000000;
    const int e = (int)((x >> 24) % 41) - 20;
    return ((x >> 40) & 1 ? -1.0 : 1.0) * std::ldexp(m, e);
}

template <typename T>
struct Case {
    bool rs;      /* reduce-scatter, else all-reduce */
    bool avg;     /* ZCCL_AVG, else ZCCL_SUM */
    bool in_place;
};

/* The reference: rank order, in T, divided by n at the end for AVG (what zccl's kernels do). */
template <typename T>
T ref(int n, size_t k, int salt, bool avg) {
    T acc = (T)input(0, k, salt);
    for (int q = 1; q < n; q++) acc = (T)(acc + (T)input(q, k, salt));
    return avg ? (T)(acc / (T)n) : acc;
}

/* Runs one call with the given buffers (send holds the input, recv receives; the same pointer in place). */
template <typename T>
zccl_result_t call(zccl_comm_t comm, const Case<T> &c, T *send, T *recv, size_t count, int rank) {
    const zccl_datatype_t dt = sizeof(T) == 4 ? ZCCL_FLOAT32 : ZCCL_FLOAT64;
    const zccl_redop_t op = c.avg ? ZCCL_AVG : ZCCL_SUM;
    if (c.rs) return zccl_reduce_scatter(send, c.in_place ? send + (size_t)rank * count : recv, count, dt, op, comm,
                                         nullptr);
    return zccl_allreduce(send, c.in_place ? send : recv, count, dt, op, comm, nullptr);
}

enum Path { kRegistered, kStaged, kDirectSchedule };
const char *path_name(Path p) {
    return p == kRegistered ? "registered" : p == kStaged ? "staged" : "direct schedule";
}

/* One path: fills the input, runs the call, checks that the path was taken, returns the output's bytes. */
template <typename T>
int run_path(Path p, zccl_comm_t comm, const Case<T> &c, size_t count, int rank, int n, int salt,
             std::vector<T> *out) {
    const size_t in_n = c.rs ? count * (size_t)n : count;
    const size_t bytes = (in_n + count) * sizeof(T);
    T *send = nullptr, *recv = nullptr;
    void *reg = nullptr, *handle = nullptr;
    std::vector<T> plain;
    if (p == kRegistered) {
        ZT_CHILD_CHECK(zccl_mem_alloc(&reg, bytes) == ZCCL_SUCCESS, "zccl_mem_alloc: %s", zccl_get_last_error(nullptr));
        ZT_CHILD_CHECK(zccl_comm_register(comm, reg, bytes, &handle) == ZCCL_SUCCESS, "register: %s",
                       zccl_get_last_error(comm));
        send = (T *)reg;
    } else {
        plain.resize(in_n + count);
        send = plain.data();
    }
    recv = send + in_n;
    for (size_t k = 0; k < in_n; k++) send[k] = (T)input(rank, k, salt);
    const uint64_t d0 = zccl__reg_direct_calls(0), s0 = zccl__stg_calls();
    zccl_result_t res = call(comm, c, send, recv, count, rank);
    ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "%s: %s", path_name(p), zccl_get_last_error(comm));
    const uint64_t dd = zccl__reg_direct_calls(0) - d0, ds = zccl__stg_calls() - s0;
    ZT_CHILD_CHECK(dd == (p == kRegistered ? 1u : 0u) && ds == (p == kStaged ? 1u : 0u),
                   "%s: the call took %llu direct-path and %llu staged-path runs", path_name(p),
                   (unsigned long long)dd, (unsigned long long)ds);
    const T *o = c.in_place ? (c.rs ? send + (size_t)rank * count : send) : recv;
    out->assign(o, o + count);
    if (p == kRegistered) {
        ZT_CHILD_CHECK(zccl_comm_deregister(comm, handle) == ZCCL_SUCCESS, "deregister: %s", zccl_get_last_error(comm));
        zccl_mem_free(reg);
    }
    return 0;
}

template <typename T>
int one_type(zccl_comm_t staged, zccl_comm_t sched, int rank, int n) {
    const size_t count = sizeof(T) == 4 ? 30011 : 15013; /* ~120 KiB a vector: inside both one-pass paths' range */
    int salt = 0;
    for (int rs = 0; rs < 2; rs++)
        for (int avg = 0; avg < 2; avg++)
            for (int ip = 0; ip < 2; ip++) {
                const Case<T> c{rs != 0, avg != 0, ip != 0};
                const size_t cnt = c.rs ? count / (size_t)n : count;
                salt++;
                std::vector<T> a, b, d;
                if (run_path(kRegistered, staged, c, cnt, rank, n, salt, &a)) return 1;
                if (run_path(kStaged, staged, c, cnt, rank, n, salt, &b)) return 1;
                if (run_path(kDirectSchedule, sched, c, cnt, rank, n, salt, &d)) return 1;
                size_t ab = 0, ad = 0, aref = 0, first = SIZE_MAX;
                for (size_t k = 0; k < cnt; k++) {
                    const size_t g = c.rs ? (size_t)rank * cnt + k : k;
                    const T want = ref<T>(n, g, salt, c.avg);
                    if (memcmp(&a[k], &b[k], sizeof(T))) ab++, first = std::min(first, k);
                    if (memcmp(&a[k], &d[k], sizeof(T))) ad++, first = std::min(first, k);
                    if (memcmp(&a[k], &want, sizeof(T))) aref++, first = std::min(first, k);
                }
                ZT_CHILD_CHECK(ab == 0 && ad == 0 && aref == 0,
                               "%s %s %s %s, %d ranks: registered differs from staged at %zu, from the direct "
                               "schedule at %zu, from the rank-order reference at %zu of %zu elements (first %zu)",
                               sizeof(T) == 4 ? "float32" : "float64", c.rs ? "reduce-scatter" : "all-reduce",
                               c.avg ? "AVG" : "SUM", c.in_place ? "in place" : "out of place", n, ab, ad, aref, cnt,
                               first);
            }
    return 0;
}

int body(zccl_comm_t comm, int rank, int n) {
    /* The second communicator: staged path off, the direct schedule forced (settings are read at creation). */
    setenv("ZCCL_SHM_STAGED", "0", 1);
    zccl_comm_t sched = nullptr;
    ZT_CHILD_CHECK(zccl_comm_split(comm, 0, rank, &sched) == ZCCL_SUCCESS, "split: %s", zccl_get_last_error(comm));
    ZT_CHILD_CHECK(zccl_comm_set_algo(sched, "allreduce:direct;reducescatter:direct") == ZCCL_SUCCESS,
                   "set_algo: %s", zccl_get_last_error(sched));
    int bad = one_type<float>(comm, sched, rank, n) || one_type<double>(comm, sched, rank, n);
    zccl_comm_destroy(sched);
    return bad;
}

}  // namespace

class SumOrder : public ::testing::TestWithParam<int> {};

TEST_P(SumOrder, RegisteredStagedAndDirectScheduleAgreeBitwise) {
    Options o;
    o.deadline_s = 240;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_STAGED", std::string("1")}};
    run_ranks(GetParam(), body, o);
}

INSTANTIATE_TEST_SUITE_P(Ranks, SumOrder, ::testing::Values(2, 3, 4, 5, 8),
                         [](const ::testing::TestParamInfo<int> &i) { return std::to_string(i.param) + "ranks"; });

// Multi-process runs of every algorithm beyond the ring (forced with the test hook zccl__sched_force_algo, so the
// tuner's choice does not matter): results equal the test's own reference (tests/harness/data.h), every rank's
// all-reduce result is bitwise identical for inexact float sums (hashes compared across ranks in shared memory),
// and running the same call again gives the same bits. Ranks: 2..8 over shared memory, 3 and 4 over TCP; the
// hierarchical schedules get a fake host layout (2 ranks per "host" when n is even, one rank per host otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "harness/data.h"
#include "harness/harness.h"
#include "zccl.h"

extern "C" {
#include "schedule.h"
}

using namespace zt;

namespace {

constexpr int kMaxRanks = 8;

struct Shared {
    uint64_t hash[ZCCL_ALGO_COUNT][kMaxRanks]; /* inexact all-reduce result per algorithm and rank */
    long failures[kMaxRanks];
    long checks[kMaxRanks];
};

uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

struct Body {
    zccl_comm_t comm;
    int rank, n;
    Shared *sh;
    long fails = 0, checks = 0;

    void fail(const std::string &what) {
        if (fails < 10) child_log(rank, "FAIL %s", what.c_str());
        fails++;
    }
    bool ok(zccl_result_t r, const std::string &what) {
        checks++;
        if (r == ZCCL_SUCCESS) return true;
        fail(what + " returned " + zccl_get_error_string(r) + ": " + zccl_get_last_error(nullptr));
        return false;
    }

    void allreduce(int algo, zccl_datatype_t dt, zccl_redop_t op, size_t c, bool ip) {
        const size_t sz = dtype_bytes(dt);
        std::string what = std::string(zccl__algo_name(algo)) + " allreduce " + dtype_name(dt) + " " + op_name(op) +
                           " count=" + std::to_string(c) + (ip ? " in-place" : "");
        const uint64_t salt = 77 + c + (uint64_t)op * 5 + (uint64_t)dt * 11;
        std::vector<uint8_t> in(c * sz), out(c * sz, 0xEE), again(c * sz, 0xEE);
        gen_fill(in.data(), dt, pattern_for(op), salt, rank, 0, c);
        Reference ref;
        ref.compute(dt, op, salt, n, 0, c);
        std::vector<uint8_t> buf = in;
        void *o = ip ? buf.data() : out.data();
        if (!ok(zccl_allreduce(buf.data(), o, c, dt, op, comm, nullptr), what)) return;
        std::string first;
        if (ref.check(o, 0, c, &first)) fail(what + ": " + first);
        if (!ip && memcmp(buf.data(), in.data(), c * sz) != 0) fail(what + ": sendbuf changed");
    }

    void reduce_scatter(int algo, zccl_datatype_t dt, zccl_redop_t op, size_t c, bool ip) {
        const size_t sz = dtype_bytes(dt), total = c * (size_t)n;
        std::string what = std::string(zccl__algo_name(algo)) + " reduce_scatter " + dtype_name(dt) + " " +
                           op_name(op) + " recvcount=" + std::to_string(c) + (ip ? " in-place" : "");
        const uint64_t salt = 177 + c + (uint64_t)op * 5 + (uint64_t)dt * 11;
        std::vector<uint8_t> in(total * sz), out(c * sz, 0xEE);
        gen_fill(in.data(), dt, pattern_for(op), salt, rank, 0, total);
        Reference ref;
        ref.compute(dt, op, salt, n, (size_t)rank * c, c);
        std::vector<uint8_t> buf = in;
        void *o = ip ? buf.data() + (size_t)rank * c * sz : out.data();
        if (!ok(zccl_reduce_scatter(buf.data(), o, c, dt, op, comm, nullptr), what)) return;
        std::string first;
        if (ref.check(o, 0, c, &first)) fail(what + ": " + first);
        if (!ip && memcmp(buf.data(), in.data(), total * sz) != 0) fail(what + ": sendbuf changed");
    }

    void allgather(int algo, zccl_datatype_t dt, size_t c, bool ip) {
        const size_t sz = dtype_bytes(dt), total = c * (size_t)n;
        std::string what = std::string(zccl__algo_name(algo)) + " allgather " + dtype_name(dt) + " sendcount=" +
                           std::to_string(c) + (ip ? " in-place" : "");
        const uint64_t salt = 277 + c;
        std::vector<uint8_t> want(total * sz), out(total * sz, 0xEE), own(c * sz);
        for (int q = 0; q < n; q++) gen_fill(want.data() + (size_t)q * c * sz, dt, Pattern::Copy, salt, q, 0, c);
        gen_fill(own.data(), dt, Pattern::Copy, salt, rank, 0, c);
        if (ip) memcpy(out.data() + (size_t)rank * c * sz, own.data(), c * sz);
        const void *s = ip ? out.data() + (size_t)rank * c * sz : own.data();
        if (!ok(zccl_allgather(s, out.data(), c, dt, comm, nullptr), what)) return;
        std::string first;
        if (compare_elems(out.data(), want.data(), dt, total, &first)) fail(what + ": " + first);
    }

    // Inexact float32 sums (values with many significant bits, mixed signs and magnitudes): the result's bits
    // depend on the order of the additions, so equal hashes on every rank mean the same expression everywhere.
    void bitwise(int algo, zccl_redop_t op, size_t c) {
        std::vector<float> in(c), out(c), again(c);
        for (size_t i = 0; i < c; i++)
            in[i] = (float)(std::sin(1.0 + (double)i * 0.37 + rank * 1.618) * std::pow(10.0, (double)((i + (size_t)rank) % 7) - 3));
        std::string what = std::string(zccl__algo_name(algo)) + " inexact float32 " + op_name(op);
        if (!ok(zccl_allreduce(in.data(), out.data(), c, ZCCL_FLOAT32, op, comm, nullptr), what)) return;
        for (int rep = 0; rep < 2; rep++) {
            if (!ok(zccl_allreduce(in.data(), again.data(), c, ZCCL_FLOAT32, op, comm, nullptr), what)) return;
            if (memcmp(out.data(), again.data(), c * sizeof(float)) != 0) fail(what + ": a repeated run gave other bits");
        }
        // tolerance check against a double-precision sum
        double maxerr = 0;
        for (size_t i = 0; i < c; i += 97) {
            double ref = 0, mag = 0;
            for (int q = 0; q < n; q++) {
                double v = (float)(std::sin(1.0 + (double)i * 0.37 + q * 1.618) * std::pow(10.0, (double)((i + (size_t)q) % 7) - 3));
                ref += v;
                mag += std::fabs(v);
            }
            if (op == ZCCL_AVG) ref /= n, mag /= n;
            double err = std::fabs(out[i] - ref) / (mag * 1e-6 + 1e-30);
            if (err > maxerr) maxerr = err;
        }
        if (maxerr > (double)n) fail(what + ": result outside the float32 rounding bound");
        sh->hash[algo][rank] = fnv1a(out.data(), c * sizeof(float)) ^ (op == ZCCL_AVG ? 0x1234 : 0);
    }

    int run() {
        static int hosts[kMaxRanks];
        for (int r = 0; r < n; r++) hosts[r] = (n % 2 == 0) ? r / 2 : r;
        const zccl_datatype_t types[] = {ZCCL_FLOAT32, ZCCL_INT64, ZCCL_BFLOAT16, ZCCL_UINT8};
        for (int algo = 1; algo < ZCCL_ALGO_COUNT; algo++) {
            zccl__sched_force_algo(algo, hosts);
            for (size_t c : {size_t(1), size_t(7), size_t(1023), size_t(70001)}) {
                for (zccl_datatype_t dt : types) {
                    for (zccl_redop_t op : {ZCCL_SUM, ZCCL_MAX, ZCCL_AVG}) {
                        if (op == ZCCL_AVG && (dt == ZCCL_INT64 || dt == ZCCL_UINT8)) continue;
                        if (c == 70001 && dt != ZCCL_FLOAT32) continue;
                        for (bool ip : {false, true}) {
                            if (zccl__algo_supports(algo, ZCCL_COLL_ALLREDUCE)) allreduce(algo, dt, op, c, ip);
                            if (zccl__algo_supports(algo, ZCCL_COLL_REDUCE_SCATTER) && c <= 1023)
                                reduce_scatter(algo, dt, op, c, ip);
                        }
                    }
                    for (bool ip : {false, true})
                        if (zccl__algo_supports(algo, ZCCL_COLL_ALLGATHER) && c <= 1023) allgather(algo, dt, c, ip);
                }
            }
            if (zccl__algo_supports(algo, ZCCL_COLL_ALLREDUCE)) bitwise(algo, ZCCL_SUM, 50003);
        }
        // The hook really reaches the collectives: a forced hierarchical schedule with hosts of different sizes
        // must be refused (on every rank alike, before any data moves), and the communicator stays usable.
        static int uneven[kMaxRanks];
        for (int r = 0; r < n; r++) uneven[r] = r == 0 ? 0 : 1;
        if (n >= 3) {
            zccl__sched_force_algo(ZCCL_ALGO_HIER, uneven);
            float x = 1, y = 0;
            checks++;
            if (zccl_allreduce(&x, &y, 1, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) != ZCCL_INVALID_ARGUMENT)
                fail("forced hier with uneven hosts was not refused");
        }
        zccl__sched_force_algo(-1, nullptr);
        allreduce(ZCCL_ALGO_RING, ZCCL_FLOAT32, ZCCL_SUM, 7, false);
        sh->failures[rank] = fails;
        sh->checks[rank] = checks;
        return fails ? 1 : 0;
    }
};

class AlgosRuntime : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(AlgosRuntime, ResultsMatchReferenceAndAreBitwiseIdentical) {
    const std::string transport = std::get<0>(GetParam());
    const int n = std::get<1>(GetParam());
    SharedMem shm(sizeof(Shared));
    Shared *sh = shm.as<Shared>();
    memset(sh, 0, sizeof *sh);
    Options o;
    o.deadline_s = 240;
    o.env = {{"ZCCL_TRANSPORT", transport}, {"ZCCL_TIMEOUT_MS", std::string("60000")},
             {"ZCCL_INIT_TIMEOUT_MS", std::string("60000")}};
    GroupResult res = run_ranks(n, [sh](zccl_comm_t comm, int rank, int nranks) {
        Body b{comm, rank, nranks, sh};
        return b.run();
    }, o);
    long checks = 0, failures = 0;
    for (int r = 0; r < n; r++) checks += sh->checks[r], failures += sh->failures[r];
    printf("[   INFO   ] %s nranks=%d: %ld calls checked, %ld failures, wall %.1fs\n", transport.c_str(), n, checks,
           failures, res.elapsed_s);
    EXPECT_EQ(failures, 0);
    EXPECT_GT(checks, 100);
    if (!res.all_ok()) return;
    for (int algo = 1; algo < ZCCL_ALGO_COUNT; algo++) {
        if (!zccl__algo_supports(algo, ZCCL_COLL_ALLREDUCE)) continue;
        for (int r = 1; r < n; r++)
            EXPECT_EQ(sh->hash[algo][r], sh->hash[algo][0])
                << zccl__algo_name(algo) << ": rank " << r << "'s all-reduce result differs bitwise from rank 0's";
    }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, int>> &p) {
    return std::get<0>(p.param) + "_" + std::to_string(std::get<1>(p.param));
}

INSTANTIATE_TEST_SUITE_P(Shm, AlgosRuntime,
                         ::testing::Combine(::testing::Values(std::string("shm")), ::testing::Values(2, 3, 4, 5, 6, 8)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Tcp, AlgosRuntime,
                         ::testing::Combine(::testing::Values(std::string("tcp")), ::testing::Values(3, 4)),
                         param_name);

}  // namespace

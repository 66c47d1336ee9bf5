/*
 * test_alltoall.cpp — conformance of zccl_alltoall, zccl_alltoallv, zccl_gather and zccl_scatter.
 *
 * Matrix (A2aMatrix, one multi-process run per (transport, nranks); transport through ZCCL_TRANSPORT in {shm, tcp},
 * and ib where an RDMA device exists; nranks in {1, 2, 3, 5, 8}): every one of the 12 datatypes (fp8 included; no
 * arithmetic happens, so the check is bitwise) x counts {0, 1, 7, 1023} x {out of place, in place} (alltoall:
 * sendbuf == recvbuf; gather: sendbuf = recvbuf + root*count; scatter: recvbuf = sendbuf + root*count) x roots
 * {0, nranks-1} for gather and scatter; all-to-allv with uneven counts (some 0), gaps between the blocks and
 * displacements in reverse rank order; one large all-to-all (262147 elements per peer, int32) per run.
 * Every element's expected value is computed in the test from (sender rank, receiver rank, index), and the bytes
 * around every buffer (guards) must stay untouched.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

/* The byte at position b of the block rank `from` sends to rank `to`. */
uint8_t pat(int from, int to, size_t b, int salt) {
    uint64_t h = (uint64_t)from * 0x9E3779B97F4A7C15ull ^ (uint64_t)to * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)b * 0x165667B19E3779F9ull ^
                 (uint64_t)salt;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(h >> 40);
}

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;

/* A buffer with guard bytes on both sides. */
struct GBuf {
    std::vector<uint8_t> v;
    size_t n = 0;
    void reset(size_t bytes, uint8_t fill = 0xEE) {
        n = bytes;
        v.assign(bytes + 2 * kGuard, fill);
        memset(v.data(), kGuardByte, kGuard);
        memset(v.data() + kGuard + bytes, kGuardByte, kGuard);
    }
    uint8_t *p() { return v.data() + kGuard; }
    bool guards_ok() const {
        for (size_t i = 0; i < kGuard; i++)
            if (v[i] != kGuardByte || v[kGuard + n + i] != kGuardByte) return false;
        return true;
    }
};

struct Ctx {
    int rank, n, errors = 0;
    zccl_comm_t comm;
    void fail(const std::string &what) {
        if (errors++ < 8) child_log(rank, "%s", what.c_str());
    }
    void check(zccl_result_t r, const std::string &what) {
        if (r != ZCCL_SUCCESS) fail(what + " returned " + std::to_string(r) + ": " + zccl_get_last_error(comm));
    }
};

std::string desc(const char *fn, int dt, size_t c, bool inp, int root = -1) {
    return std::string(fn) + "(dt " + std::to_string(dt) + ", count " + std::to_string(c) + (inp ? ", in place" : "") +
           (root >= 0 ? ", root " + std::to_string(root) : "") + ")";
}

void test_alltoall(Ctx &x, zccl_datatype_t dt, size_t c, bool inp, int salt) {
    const size_t es = zccl_type_size(dt), blk = c * es, tot = blk * (size_t)x.n;
    GBuf s, r;
    s.reset(tot);
    r.reset(tot);
    for (int q = 0; q < x.n; q++)
        for (size_t b = 0; b < blk; b++) s.p()[(size_t)q * blk + b] = pat(x.rank, q, b, salt);
    const std::vector<uint8_t> sent(s.p(), s.p() + tot);
    uint8_t *out = inp ? s.p() : r.p();
    x.check(zccl_alltoall(c ? s.p() : nullptr, c ? out : nullptr, c, dt, x.comm, nullptr), desc("alltoall", dt, c, inp));
    for (int q = 0; q < x.n; q++)
        for (size_t b = 0; b < blk; b++)
            if (out[(size_t)q * blk + b] != pat(q, x.rank, b, salt)) {
                x.fail(desc("alltoall", dt, c, inp) + ": block from rank " + std::to_string(q) + " byte " +
                       std::to_string(b) + " wrong");
                q = x.n;
                break;
            }
    if (!inp && memcmp(s.p(), sent.data(), tot) != 0) x.fail(desc("alltoall", dt, c, inp) + ": sendbuf modified");
    if (!s.guards_ok() || !r.guards_ok()) x.fail(desc("alltoall", dt, c, inp) + ": guard bytes overwritten");
}

void test_alltoallv(Ctx &x, zccl_datatype_t dt, int salt) {
    const int n = x.n;
    const size_t es = zccl_type_size(dt);
    /* elements rank a sends rank b: 0 for some pairs, up to 37 */
    auto cnt = [&](int a, int b) -> size_t { return (size_t)((a * 7 + b * 3 + salt) % 5 == 0 ? 0 : (a + 2 * b + salt) % 37 + 1); };
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t so = 0, ro = 0;
    for (int q = n - 1; q >= 0; q--) { /* displacements in reverse rank order, with a 3-element gap after each */
        sc[q] = cnt(x.rank, q);
        sd[q] = so;
        so += sc[q] + 3;
        rc[q] = cnt(q, x.rank);
        rd[q] = ro;
        ro += rc[q] + 3;
    }
    GBuf s, r;
    s.reset(so * es);
    r.reset(ro * es, 0x5C);
    for (int q = 0; q < n; q++)
        for (size_t b = 0; b < sc[q] * es; b++) s.p()[sd[q] * es + b] = pat(x.rank, q, b, salt);
    const std::string d = "alltoallv(dt " + std::to_string(dt) + ")";
    x.check(zccl_alltoallv(s.p(), sc.data(), sd.data(), r.p(), rc.data(), rd.data(), dt, x.comm, nullptr), d);
    std::vector<bool> written(ro * es, false);
    for (int q = 0; q < n; q++)
        for (size_t b = 0; b < rc[q] * es; b++) {
            written[rd[q] * es + b] = true;
            if (r.p()[rd[q] * es + b] != pat(q, x.rank, b, salt)) {
                x.fail(d + ": block from rank " + std::to_string(q) + " byte " + std::to_string(b) + " wrong");
                break;
            }
        }
    for (size_t b = 0; b < ro * es; b++)
        if (!written[b] && r.p()[b] != 0x5C) {
            x.fail(d + ": a gap between received blocks was written");
            break;
        }
    if (!s.guards_ok() || !r.guards_ok()) x.fail(d + ": guard bytes overwritten");
}

void test_gather(Ctx &x, zccl_datatype_t dt, size_t c, bool inp, int root, int salt) {
    const size_t es = zccl_type_size(dt), blk = c * es, tot = blk * (size_t)x.n;
    const bool is_root = x.rank == root;
    GBuf s, r;
    s.reset(blk);
    r.reset(tot, 0x77);
    uint8_t *mine = (inp && is_root) ? r.p() + (size_t)root * blk : s.p();
    for (size_t b = 0; b < blk; b++) mine[b] = pat(x.rank, root, b, salt);
    x.check(zccl_gather(c ? mine : nullptr, c && is_root ? r.p() : nullptr, c, dt, root, x.comm, nullptr),
            desc("gather", dt, c, inp, root));
    if (is_root) {
        for (int q = 0; q < x.n; q++)
            for (size_t b = 0; b < blk; b++)
                if (r.p()[(size_t)q * blk + b] != pat(q, root, b, salt)) {
                    x.fail(desc("gather", dt, c, inp, root) + ": block of rank " + std::to_string(q) + " wrong");
                    q = x.n;
                    break;
                }
    } else {
        for (size_t b = 0; b < tot; b++)
            if (r.p()[b] != 0x77) {
                x.fail(desc("gather", dt, c, inp, root) + ": a non-root's recvbuf was written");
                break;
            }
    }
    if (!s.guards_ok() || !r.guards_ok()) x.fail(desc("gather", dt, c, inp, root) + ": guard bytes overwritten");
}

void test_scatter(Ctx &x, zccl_datatype_t dt, size_t c, bool inp, int root, int salt) {
    const size_t es = zccl_type_size(dt), blk = c * es, tot = blk * (size_t)x.n;
    const bool is_root = x.rank == root;
    GBuf s, r;
    s.reset(tot);
    r.reset(blk, 0x66);
    if (is_root)
        for (int q = 0; q < x.n; q++)
            for (size_t b = 0; b < blk; b++) s.p()[(size_t)q * blk + b] = pat(root, q, b, salt);
    uint8_t *out = (inp && is_root) ? s.p() + (size_t)root * blk : r.p();
    x.check(zccl_scatter(c && is_root ? s.p() : nullptr, c ? out : nullptr, c, dt, root, x.comm, nullptr),
            desc("scatter", dt, c, inp, root));
    for (size_t b = 0; b < blk; b++)
        if (out[b] != pat(root, x.rank, b, salt)) {
            x.fail(desc("scatter", dt, c, inp, root) + ": byte " + std::to_string(b) + " wrong");
            break;
        }
    if (!s.guards_ok() || !r.guards_ok()) x.fail(desc("scatter", dt, c, inp, root) + ": guard bytes overwritten");
}

int body(zccl_comm_t comm, int rank, int n) {
    Ctx x{rank, n, 0, comm};
    int salt = 0;
    for (int dt = 0; dt < ZCCL_NUM_TYPES; dt++) {
        for (size_t c : {size_t(0), size_t(1), size_t(7), size_t(1023)}) {
            for (bool inp : {false, true}) {
                test_alltoall(x, (zccl_datatype_t)dt, c, inp, ++salt);
                for (int root : {0, n - 1}) {
                    test_gather(x, (zccl_datatype_t)dt, c, inp, root, ++salt);
                    test_scatter(x, (zccl_datatype_t)dt, c, inp, root, ++salt);
                }
            }
        }
        test_alltoallv(x, (zccl_datatype_t)dt, ++salt);
    }
    test_alltoall(x, ZCCL_INT32, 262147, false, ++salt); /* 1 MiB per peer: many chunks, single copy on shm */
    test_alltoall(x, ZCCL_INT32, 262147, true, ++salt);
    return x.errors ? 1 : 0;
}

class A2aMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(A2aMatrix, EveryTypeCountPlacementRoot) {
    const std::string transport = std::get<0>(GetParam());
    const int n = std::get<1>(GetParam());
    if (transport == "ib" && access("/sys/class/infiniband", F_OK) != 0)
        GTEST_SKIP() << "no RDMA device (the IB variant runs where one exists, e.g. the soft-RoCE VM)";
    Options o;
    o.deadline_s = 240;
    o.env = {{"ZCCL_TRANSPORT", transport}, {"ZCCL_TIMEOUT_MS", std::string("60000")}};
    run_ranks(n, body, o);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, int>> &i) {
    return std::get<0>(i.param) + "_" + std::to_string(std::get<1>(i.param)) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(Transports, A2aMatrix,
                         ::testing::Combine(::testing::Values(std::string("shm"), std::string("tcp")),
                                            ::testing::Values(1, 2, 3, 5, 8)),
                         param_name);
/* IB/.../ib_<n>ranks: picked up by the soft-RoCE VM's default suites (tests/rdma/ib_guest.sh) */
INSTANTIATE_TEST_SUITE_P(IB, A2aMatrix, ::testing::Combine(::testing::Values(std::string("ib")), ::testing::Values(2, 3, 4)),
                         param_name);

/* Argument errors name the argument (in process, one rank). */
TEST(A2aArgs, ErrorsNameTheArgument) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    zccl_comm_t comm;
    ASSERT_EQ(zccl_comm_init_rank(&comm, 1, id, 0), ZCCL_SUCCESS);
    int a[8] = {0}, b[8] = {0};
    size_t one = 1, zero = 0;
    auto expect = [&](zccl_result_t r, zccl_result_t want, const char *word) {
        EXPECT_EQ(r, want) << zccl_get_last_error(comm);
        EXPECT_NE(std::string(zccl_get_last_error(comm)).find(word), std::string::npos) << zccl_get_last_error(comm);
    };
    expect(zccl_alltoall(nullptr, b, 1, ZCCL_INT32, comm, nullptr), ZCCL_INVALID_ARGUMENT, "sendbuf");
    expect(zccl_alltoall(a, nullptr, 1, ZCCL_INT32, comm, nullptr), ZCCL_INVALID_ARGUMENT, "recvbuf");
    expect(zccl_alltoall(a, b, 1, (zccl_datatype_t)12, comm, nullptr), ZCCL_INVALID_ARGUMENT, "datatype");
    expect(zccl_alltoall(a, a + 1, 2, ZCCL_INT32, comm, nullptr), ZCCL_INVALID_ARGUMENT, "overlap");
    expect(zccl_alltoall(a, b, 1, ZCCL_INT32, nullptr, nullptr), ZCCL_INVALID_ARGUMENT, "comm");
    expect(zccl_gather(a, b, 1, ZCCL_INT32, 1, comm, nullptr), ZCCL_INVALID_ARGUMENT, "root");
    expect(zccl_scatter(a, b, 1, ZCCL_INT32, -1, comm, nullptr), ZCCL_INVALID_ARGUMENT, "root");
    expect(zccl_gather(a, nullptr, 1, ZCCL_INT32, 0, comm, nullptr), ZCCL_INVALID_ARGUMENT, "recvbuf");
    expect(zccl_scatter(nullptr, b, 1, ZCCL_INT32, 0, comm, nullptr), ZCCL_INVALID_ARGUMENT, "sendbuf");
    expect(zccl_gather(nullptr, b, 1, ZCCL_INT32, 0, comm, nullptr), ZCCL_INVALID_ARGUMENT, "'sendbuf'");
    expect(zccl_scatter(a, nullptr, 1, ZCCL_INT32, 0, comm, nullptr), ZCCL_INVALID_ARGUMENT, "'recvbuf'");
    expect(zccl_alltoallv(a, nullptr, &zero, b, &one, &zero, ZCCL_INT32, comm, nullptr), ZCCL_INVALID_ARGUMENT,
           "sendcounts");
    expect(zccl_alltoallv(a, &one, &zero, b, &zero, &zero, ZCCL_INT32, comm, nullptr), ZCCL_INVALID_ARGUMENT,
           "recvcounts[0]");
    size_t huge = SIZE_MAX / 2;
    expect(zccl_alltoallv(a, &one, &huge, b, &one, &zero, ZCCL_INT32, comm, nullptr), ZCCL_INVALID_ARGUMENT, "sdispls[0]");
    expect(zccl_alltoallv(a, &one, &zero, a, &one, &zero, ZCCL_INT32, comm, nullptr), ZCCL_INVALID_ARGUMENT, "overlap");
    /* one rank: the own block is a copy */
    a[0] = 42;
    EXPECT_EQ(zccl_alltoallv(a, &one, &zero, b, &one, &zero, ZCCL_INT32, comm, nullptr), ZCCL_SUCCESS);
    EXPECT_EQ(b[0], 42);
    EXPECT_EQ(zccl_comm_destroy(comm), ZCCL_SUCCESS);
}

}  // namespace

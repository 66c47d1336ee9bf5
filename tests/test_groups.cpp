/*
 * test_groups.cpp — zccl_group_start / zccl_group_end (docs/groups.md), multi-process on shm and tcp:
 *  - an all-to-all written as grouped send/recv, in both posting orders (all receives first, or all sends first,
 *    and each rank in the order opposite to its neighbour's), self send/recv included, at 1, 1000 and 4 Mi
 *    elements per peer (16 MiB per peer: far beyond any transport buffer, so an ordering dependence would hang);
 *  - collectives and send/recv mixed in one group, nested groups, a group on a stream;
 *  - a group spanning two communicators;
 *  - errors: zccl_group_end without start, an unmatched self send (names the call), a grouped receive whose send
 *    never comes and a large grouped send whose receive never comes with ZCCL_TIMEOUT_MS set (ZCCL_TIMEOUT naming
 *    the call, no hang).
 * Expected values are computed from (sender, receiver, index) in the test.
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

int32_t val(int from, int to, size_t i) { return (int32_t)((uint32_t)from * 1000003u + (uint32_t)to * 7919u + (uint32_t)i * 31u); }


/* All-to-all as grouped send/recv. order 0: receives then sends; 1: sends then receives; 2: even ranks receive
 * first, odd ranks send first. Peers are visited in a rotated order so no two ranks post identically. */
int grouped_alltoall(zccl_comm_t comm, int rank, int n, size_t c, int order, zccl_stream_t stream) {
    std::vector<int32_t> s((size_t)n * c), r((size_t)n * c, -1);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < c; i++) s[(size_t)q * c + i] = val(rank, q, i);
    const bool recv_first = order == 0 || (order == 2 && rank % 2 == 0);
    ZT_CHILD_CHECK(zccl_group_start() == ZCCL_SUCCESS, "group_start");
    for (int pass = 0; pass < 2; pass++) {
        const bool do_recv = (pass == 0) == recv_first;
        for (int k = 0; k < n; k++) {
            const int q = (rank + k) % n;
            zccl_result_t res = do_recv ? zccl_recv(&r[(size_t)q * c], c, ZCCL_INT32, q, comm, stream)
                                        : zccl_send(&s[(size_t)q * c], c, ZCCL_INT32, q, comm, stream);
            ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "%s peer %d in group: %d %s", do_recv ? "recv" : "send", q, res,
                   zccl_get_last_error(comm));
        }
    }
    zccl_result_t res = zccl_group_end();
    ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "group_end (count %zu, order %d): %d %s", c, order, res, zccl_get_last_error(comm));
    if (stream) {
        res = zccl_stream_synchronize(stream);
        ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "synchronize: %d %s", res, zccl_get_last_error(comm));
    }
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < c; i++)
            ZT_CHILD_CHECK(r[(size_t)q * c + i] == val(q, rank, i), "count %zu order %d: from rank %d element %zu = %d, want %d", c,
                   order, q, i, r[(size_t)q * c + i], val(q, rank, i));
    return 0;
}

int body_alltoall(zccl_comm_t comm, int rank, int n) {
    for (size_t c : {size_t(1), size_t(1000), size_t(4) << 20})
        for (int order : {0, 1, 2})
            if (grouped_alltoall(comm, rank, n, c, order, nullptr)) return 1;
    /* on a stream: group_end queues the part; synchronize waits */
    zccl_stream_t st;
    ZT_CHILD_CHECK(zccl_stream_create(&st) == ZCCL_SUCCESS, "stream_create");
    int bad = grouped_alltoall(comm, rank, n, 1000, 0, st);
    zccl_stream_destroy(st);
    return bad;
}

/* Collectives and send/recv in one group; nested groups. */
int body_mixed(zccl_comm_t comm, int rank, int n) {
    const size_t c = 513;
    std::vector<float> ar(c), arout(c);
    for (size_t i = 0; i < c; i++) ar[i] = (float)(rank + 1) * (float)(i % 7);
    std::vector<int32_t> ag((size_t)n * 3, -1), mine = {rank * 10, rank * 10 + 1, rank * 10 + 2};
    std::vector<int32_t> ring_in(c, -1), ring_out(c);
    for (size_t i = 0; i < c; i++) ring_out[i] = val(rank, (rank + 1) % n, i);
    int32_t self_in = -1, self_out = 1234 + rank;
    ZT_CHILD_CHECK(zccl_group_start() == ZCCL_SUCCESS, "group_start");
    const bool ring = n > 1; /* with one rank the ring neighbour is the rank itself: the self pair below is enough */
    if (ring) ZT_CHILD_CHECK(zccl_recv(ring_in.data(), c, ZCCL_INT32, (rank - 1 + n) % n, comm, nullptr) == ZCCL_SUCCESS, "recv");
    ZT_CHILD_CHECK(zccl_allreduce(ar.data(), arout.data(), c, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) == ZCCL_SUCCESS, "ar");
    ZT_CHILD_CHECK(zccl_group_start() == ZCCL_SUCCESS, "nested group_start");
    ZT_CHILD_CHECK(zccl_allgather(mine.data(), ag.data(), 3, ZCCL_INT32, comm, nullptr) == ZCCL_SUCCESS, "ag");
    ZT_CHILD_CHECK(zccl_recv(&self_in, 1, ZCCL_INT32, rank, comm, nullptr) == ZCCL_SUCCESS, "self recv");
    ZT_CHILD_CHECK(zccl_group_end() == ZCCL_SUCCESS, "nested group_end");
    /* still inside the outer group: nothing may have run */
    ZT_CHILD_CHECK(self_in == -1 && ag[0] == -1, "the nested zccl_group_end ran operations before the outermost one");
    ZT_CHILD_CHECK(zccl_send(&self_out, 1, ZCCL_INT32, rank, comm, nullptr) == ZCCL_SUCCESS, "self send");
    if (ring) ZT_CHILD_CHECK(zccl_send(ring_out.data(), c, ZCCL_INT32, (rank + 1) % n, comm, nullptr) == ZCCL_SUCCESS, "send");
    zccl_result_t res = zccl_group_end();
    ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "group_end: %d %s", res, zccl_get_last_error(comm));
    ZT_CHILD_CHECK(self_in == 1234 + rank, "self send/recv: got %d", self_in);
    for (size_t i = 0; i < c; i++) {
        const float want = (float)(n * (n + 1) / 2) * (float)(i % 7);
        ZT_CHILD_CHECK(arout[i] == want, "allreduce[%zu] = %g, want %g", i, arout[i], want);
        ZT_CHILD_CHECK(!ring || ring_in[i] == val((rank - 1 + n) % n, rank, i), "ring recv[%zu] wrong", i);
    }
    for (int q = 0; q < n; q++)
        for (int k = 0; k < 3; k++) ZT_CHILD_CHECK(ag[(size_t)q * 3 + k] == q * 10 + k, "allgather[%d][%d] wrong", q, k);
    /* an empty group, and a group with only count-0 calls */
    ZT_CHILD_CHECK(zccl_group_start() == ZCCL_SUCCESS && zccl_group_end() == ZCCL_SUCCESS, "empty group");
    return 0;
}

/* One group over two communicators: comm and a copy made by split (same ranks, reversed order). */
int body_two_comms(zccl_comm_t comm, int rank, int n) {
    zccl_comm_t other;
    /* creating a communicator inside a group runs at once (its exchanges are not recorded in the group) */
    ZT_CHILD_CHECK(zccl_group_start() == ZCCL_SUCCESS, "group_start");
    ZT_CHILD_CHECK(zccl_comm_split(comm, 0, n - rank, &other) == ZCCL_SUCCESS, "split: %s", zccl_get_last_error(comm));
    ZT_CHILD_CHECK(zccl_group_end() == ZCCL_SUCCESS, "group_end around split: %s", zccl_get_last_error(comm));
    int orank;
    zccl_comm_rank(other, &orank);
    std::vector<int32_t> a(n), b(n), c(n), d(n, -1), e(n, -1);
    for (int q = 0; q < n; q++) { a[q] = val(rank, q, 0); b[q] = val(orank, q, 1); }
    ZT_CHILD_CHECK(zccl_group_start() == ZCCL_SUCCESS, "group_start");
    for (int q = 0; q < n; q++) {
        ZT_CHILD_CHECK(zccl_recv(&d[q], 1, ZCCL_INT32, q, comm, nullptr) == ZCCL_SUCCESS, "recv comm");
        ZT_CHILD_CHECK(zccl_recv(&e[q], 1, ZCCL_INT32, q, other, nullptr) == ZCCL_SUCCESS, "recv other");
    }
    for (int q = 0; q < n; q++) {
        ZT_CHILD_CHECK(zccl_send(&b[q], 1, ZCCL_INT32, q, other, nullptr) == ZCCL_SUCCESS, "send other");
        ZT_CHILD_CHECK(zccl_send(&a[q], 1, ZCCL_INT32, q, comm, nullptr) == ZCCL_SUCCESS, "send comm");
    }
    zccl_result_t res = zccl_group_end();
    ZT_CHILD_CHECK(res == ZCCL_SUCCESS, "group_end over two communicators: %d %s", res, zccl_get_last_error(comm));
    for (int q = 0; q < n; q++) {
        ZT_CHILD_CHECK(d[q] == val(q, rank, 0), "comm: from %d wrong", q);
        ZT_CHILD_CHECK(e[q] == val(q, orank, 1), "other: from %d wrong", q);
    }
    zccl_comm_destroy(other);
    return 0;
}

/* Errors that every rank makes alike (nothing is posted). */
int body_errors(zccl_comm_t comm, int rank, int n) {
    ZT_CHILD_CHECK(zccl_group_end() == ZCCL_INVALID_USAGE, "group_end without start must be ZCCL_INVALID_USAGE");
    ZT_CHILD_CHECK(strstr(zccl_get_last_error(comm), "no group is open"), "message: %s", zccl_get_last_error(comm));
    int32_t x = 1, y = 0;
    /* outside a group, a self send is refused naming 'peer' */
    ZT_CHILD_CHECK(zccl_send(&x, 1, ZCCL_INT32, rank, comm, nullptr) == ZCCL_INVALID_ARGUMENT &&
               strstr(zccl_get_last_error(comm), "'peer'") && strstr(zccl_get_last_error(comm), "same group"),
           "self send outside a group: %s", zccl_get_last_error(comm));
    /* unmatched self send inside a group: names call 2 */
    ZT_CHILD_CHECK(zccl_group_start() == ZCCL_SUCCESS, "start");
    ZT_CHILD_CHECK(zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr) == ZCCL_SUCCESS, "record allreduce");
    ZT_CHILD_CHECK(zccl_send(&x, 1, ZCCL_INT32, rank, comm, nullptr) == ZCCL_SUCCESS, "record self send");
    zccl_result_t res = zccl_group_end();
    const std::string m = zccl_get_last_error(comm);
    ZT_CHILD_CHECK(res == ZCCL_INVALID_USAGE && m.find("call 2 (zccl_send to peer " + std::to_string(rank)) != std::string::npos,
           "unmatched self send: %d %s", res, m.c_str());
    ZT_CHILD_CHECK(y == 0, "nothing of a refused group may run");
    /* a self pair of different sizes */
    int32_t two[2] = {0, 0};
    zccl_group_start();
    zccl_send(two, 2, ZCCL_INT32, rank, comm, nullptr);
    zccl_recv(&y, 1, ZCCL_INT32, rank, comm, nullptr);
    ZT_CHILD_CHECK(zccl_group_end() == ZCCL_INVALID_USAGE && strstr(zccl_get_last_error(comm), "differ in size"),
           "self pair of different sizes: %s", zccl_get_last_error(comm));
    /* an argument error inside a group is returned by the call itself; the group stays usable */
    zccl_group_start();
    ZT_CHILD_CHECK(zccl_send(nullptr, 1, ZCCL_INT32, (rank + 1) % n, comm, nullptr) == ZCCL_INVALID_ARGUMENT, "NULL sendbuf");
    ZT_CHILD_CHECK(zccl_group_end() == ZCCL_SUCCESS, "group after an argument error");
    /* one communicator, two streams in one group: refused, naming both calls; nothing runs */
    zccl_stream_t st;
    ZT_CHILD_CHECK(zccl_stream_create(&st) == ZCCL_SUCCESS, "stream_create");
    y = 0;
    zccl_group_start();
    zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, st);
    zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
    res = zccl_group_end();
    ZT_CHILD_CHECK(res == ZCCL_INVALID_USAGE && strstr(zccl_get_last_error(comm), "calls 1 and 2") &&
               strstr(zccl_get_last_error(comm), "different streams"),
           "two streams: %d %s", res, zccl_get_last_error(comm));
    ZT_CHILD_CHECK(zccl_stream_synchronize(st) == ZCCL_SUCCESS && y == 0, "a refused group ran");
    zccl_stream_destroy(st);
    /* the communicator still works */
    ZT_CHILD_CHECK(zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr) == ZCCL_SUCCESS && y == n, "allreduce after");
    return 0;
}

struct Shared {
    ShmBarrier bar{2};
};

/* Rank 0 posts a grouped receive (then a large grouped send) that rank 1 never matches: ZCCL_TIMEOUT naming the
 * call, within the deadline, no hang. Rank 1 stays alive meanwhile (so the error is the timeout, not a lost peer). */
int body_timeout(zccl_comm_t comm, int rank, int n, Shared *sh, bool big_send) {
    (void)n;
    if (rank == 1) {
        sh->bar.wait(60);
        return 0;
    }
    const size_t c = big_send ? (size_t)16 << 20 : 8; /* 64 MiB: beyond every transport's buffering */
    std::vector<int32_t> buf(c, 7);
    int32_t dummy = 0;
    zccl_group_start();
    zccl_recv(&dummy, 0, ZCCL_INT32, 1, comm, nullptr); /* count 0: not recorded */
    if (big_send) zccl_send(buf.data(), c, ZCCL_INT32, 1, comm, nullptr);
    else zccl_recv(buf.data(), c, ZCCL_INT32, 1, comm, nullptr);
    const double t0 = now_s();
    zccl_result_t res = zccl_group_end();
    const double dt = now_s() - t0;
    const std::string m = zccl_get_last_error(comm);
    sh->bar.wait(60);
    const std::string want = big_send ? "call 1 (zccl_send to peer 1" : "call 1 (zccl_recv from peer 1";
    ZT_CHILD_CHECK(res == ZCCL_TIMEOUT, "expected ZCCL_TIMEOUT, got %d: %s", res, m.c_str());
    ZT_CHILD_CHECK(m.find("zccl_group_end: " + want) != std::string::npos, "message does not name the call: %s", m.c_str());
    ZT_CHILD_CHECK(dt < 20, "took %.1f s", dt);
    return 0;
}

class Groups : public ::testing::TestWithParam<std::tuple<std::string, int>> {
  protected:
    void SetUp() override {
        if (std::get<0>(GetParam()) == "ib" && access("/sys/class/infiniband", F_OK) != 0)
            GTEST_SKIP() << "no RDMA device (the IB variant runs where one exists, e.g. the soft-RoCE VM)";
    }
    Options opts(double deadline = 120) {
        Options o;
        o.deadline_s = deadline;
        o.env = {{"ZCCL_TRANSPORT", std::get<0>(GetParam())}, {"ZCCL_TIMEOUT_MS", std::string("60000")}};
        return o;
    }
};

TEST_P(Groups, AllToAllAnyPostingOrder) { run_ranks(std::get<1>(GetParam()), body_alltoall, opts(200)); }
TEST_P(Groups, MixedCollectivesSelfAndNested) { run_ranks(std::get<1>(GetParam()), body_mixed, opts()); }
TEST_P(Groups, TwoCommunicators) { run_ranks(std::get<1>(GetParam()), body_two_comms, opts()); }
TEST_P(Groups, ErrorsNameTheCall) { run_ranks(std::get<1>(GetParam()), body_errors, opts()); }

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, int>> &i) {
    return std::get<0>(i.param) + "_" + std::to_string(std::get<1>(i.param)) + "ranks";
}
INSTANTIATE_TEST_SUITE_P(Transports, Groups,
                         ::testing::Combine(::testing::Values(std::string("shm"), std::string("tcp")),
                                            ::testing::Values(1, 2, 3, 4)),
                         param_name);
/* IB/.../ib_<n>ranks: picked up by the soft-RoCE VM's default suites (tests/rdma/ib_guest.sh) */
INSTANTIATE_TEST_SUITE_P(IB, Groups, ::testing::Combine(::testing::Values(std::string("ib")), ::testing::Values(2, 3, 4)),
                         param_name);

/* A collective that fails inside a group is named too: with ZCCL_CHECK=1, ranks that record different counts get
 * ZCCL_INVALID_USAGE from zccl_group_end naming the call (call 2, after a send/recv pair that succeeds). */
TEST(GroupsCheck, FailingCollectiveIsNamed) {
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_CHECK", std::string("1")}};
    run_ranks(2, [](zccl_comm_t comm, int rank, int n) {
        int32_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {0}, r = -1, s = rank;
        zccl_group_start();
        zccl_recv(&r, 1, ZCCL_INT32, 1 - rank, comm, nullptr);
        zccl_allreduce(x, y, rank == 0 ? 4 : 5, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
        zccl_send(&s, 1, ZCCL_INT32, 1 - rank, comm, nullptr);
        zccl_result_t res = zccl_group_end();
        const std::string m = zccl_get_last_error(comm);
        ZT_CHILD_CHECK(r == 1 - rank, "the send/recv of the group did not complete: %d", r);
        ZT_CHILD_CHECK(res == ZCCL_INVALID_USAGE, "expected ZCCL_INVALID_USAGE, got %d: %s", res, m.c_str());
        ZT_CHILD_CHECK(m.find("zccl_group_end: call 2 (zccl_allreduce, count " + std::to_string(rank == 0 ? 4 : 5) + ")") !=
                   std::string::npos && m.find("different collectives") != std::string::npos,
               "message: %s", m.c_str());
        (void)n;
        return 0;
    }, o);
}

class GroupTimeout : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(GroupTimeout, UnmatchedTransferTimesOutNamingTheCall) {
    SharedMem mem(sizeof(Shared));
    Shared *sh = new (mem.data()) Shared();
    const bool big = std::get<1>(GetParam());
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_TRANSPORT", std::get<0>(GetParam())}, {"ZCCL_TIMEOUT_MS", std::string("1500")}};
    run_ranks(2, [&](zccl_comm_t c, int r, int n) { return body_timeout(c, r, n, sh, big); }, o);
}
INSTANTIATE_TEST_SUITE_P(Transports, GroupTimeout,
                         ::testing::Combine(::testing::Values(std::string("shm"), std::string("tcp")),
                                            ::testing::Values(false, true)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, bool>> &i) {
                             return std::get<0>(i.param) + (std::get<1>(i.param) ? "_large_send" : "_recv");
                         });

TEST(GroupsInProcess, EndWithoutStartAndNestingDepth) {
    EXPECT_EQ(zccl_group_end(), ZCCL_INVALID_USAGE);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("zccl_group_end"), std::string::npos);
    for (int i = 0; i < 1024; i++) ASSERT_EQ(zccl_group_start(), ZCCL_SUCCESS);
    EXPECT_EQ(zccl_group_start(), ZCCL_INVALID_USAGE);
    for (int i = 0; i < 1023; i++) ASSERT_EQ(zccl_group_end(), ZCCL_SUCCESS);
    EXPECT_EQ(zccl_group_end(), ZCCL_SUCCESS); /* the outermost: an empty group */
    EXPECT_EQ(zccl_group_end(), ZCCL_INVALID_USAGE);
}

}  // namespace

/*
 * test_api_args.cpp — argument checking of every public entry point.
 *
 * Each invalid call must return ZCCL_INVALID_ARGUMENT (synchronously, also when a stream is given), leave a
 * message naming the argument in zccl_get_last_error(), crash nothing and leave the communicator usable. Count 0
 * with NULL buffers is a successful no-op. The same checks run on a 1-rank communicator inside the test process
 * and on both ranks of a forked 2-rank communicator (where they also prove that argument errors are detected
 * locally: a check that waited for the peer would desynchronise the ranks and hit the deadline).
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness/data.h"
#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

/* Collects failures as text, so that the same checks can run in the test process and in forked ranks. */
struct Checker {
    std::vector<std::string> failures;
    zccl_comm_t comm = nullptr;

    void fail(const std::string &s) { failures.push_back(s); }

    void invalid(zccl_result_t res, const std::string &call, const char *argname) {
        if (res != ZCCL_INVALID_ARGUMENT) {
            fail(call + " returned " + std::to_string((int)res) + " (" + zccl_get_error_string(res) +
                 "), expected ZCCL_INVALID_ARGUMENT");
            return;
        }
        const char *m = zccl_get_last_error(comm);
        if (!m) fail(call + ": zccl_get_last_error returned NULL");
        else if (!strstr(m, argname)) fail(call + ": last error \"" + m + "\" does not name '" + argname + "'");
    }
    void success(zccl_result_t res, const std::string &call) {
        if (res != ZCCL_SUCCESS)
            fail(call + " returned " + zccl_get_error_string(res) + ": " + zccl_get_last_error(comm));
    }
};

/* Out-of-range values are kept as int and converted only at each call: loading an enum variable that holds a
 * value outside the enum's range is undefined behaviour in C++ (UBSan -fsanitize=enum reports it). */
const int kBadTypes[] = {-1, 12, 1000};
const int kBadOps[] = {-1, 5, 1000};

/* Element counts whose byte size overflows size_t (float64), or whose total exceeds SIZE_MAX/2 (int8). */
struct Overflow {
    size_t count;
    zccl_datatype_t dt;
    const char *what;
};
const Overflow kOverflows[] = {
    {SIZE_MAX / 2, ZCCL_FLOAT64, "SIZE_MAX/2 float64"},
    {SIZE_MAX / 8 + 1, ZCCL_FLOAT64, "SIZE_MAX/8+1 float64"},
    {SIZE_MAX, ZCCL_INT32, "SIZE_MAX int32"},
    {SIZE_MAX / 2 + 1, ZCCL_INT8, "SIZE_MAX/2+1 int8 (bytes > SIZE_MAX/2)"},
};

/* Every invalid-argument case that is checked locally. Runs on every rank (symmetric), streams NULL and not. */
void check_bad_args(Checker &ck, zccl_comm_t comm, int rank, int n, zccl_stream_t stream) {
    alignas(16) uint8_t s[256] = {0}, r[256] = {0};
    const std::string sfx = stream ? " [on stream]" : "";
    const int other = (rank + 1) % n;

    /* NULL communicator */
    ck.invalid(zccl_allreduce(s, r, 4, ZCCL_FLOAT32, ZCCL_SUM, nullptr, stream), "allreduce(comm=NULL)" + sfx, "comm");
    ck.invalid(zccl_reduce_scatter(s, r, 4, ZCCL_FLOAT32, ZCCL_SUM, nullptr, stream),
               "reduce_scatter(comm=NULL)" + sfx, "comm");
    ck.invalid(zccl_allgather(s, r, 4, ZCCL_FLOAT32, nullptr, stream), "allgather(comm=NULL)" + sfx, "comm");
    ck.invalid(zccl_broadcast(s, r, 4, ZCCL_FLOAT32, 0, nullptr, stream), "broadcast(comm=NULL)" + sfx, "comm");
    ck.invalid(zccl_reduce(s, r, 4, ZCCL_FLOAT32, ZCCL_SUM, 0, nullptr, stream), "reduce(comm=NULL)" + sfx, "comm");
    ck.invalid(zccl_send(s, 4, ZCCL_FLOAT32, 0, nullptr, stream), "send(comm=NULL)" + sfx, "comm");
    ck.invalid(zccl_recv(r, 4, ZCCL_FLOAT32, 0, nullptr, stream), "recv(comm=NULL)" + sfx, "comm");
    ck.invalid(zccl_barrier(nullptr, stream), "barrier(comm=NULL)" + sfx, "comm");

    /* NULL buffers with count > 0 */
    ck.invalid(zccl_allreduce(nullptr, r, 4, ZCCL_FLOAT32, ZCCL_SUM, comm, stream), "allreduce(sendbuf=NULL)" + sfx,
               "sendbuf");
    ck.invalid(zccl_allreduce(s, nullptr, 4, ZCCL_FLOAT32, ZCCL_SUM, comm, stream), "allreduce(recvbuf=NULL)" + sfx,
               "recvbuf");
    ck.invalid(zccl_reduce_scatter(nullptr, r, 4, ZCCL_FLOAT32, ZCCL_SUM, comm, stream),
               "reduce_scatter(sendbuf=NULL)" + sfx, "sendbuf");
    ck.invalid(zccl_reduce_scatter(s, nullptr, 4, ZCCL_FLOAT32, ZCCL_SUM, comm, stream),
               "reduce_scatter(recvbuf=NULL)" + sfx, "recvbuf");
    ck.invalid(zccl_allgather(nullptr, r, 4, ZCCL_FLOAT32, comm, stream), "allgather(sendbuf=NULL)" + sfx, "sendbuf");
    ck.invalid(zccl_allgather(s, nullptr, 4, ZCCL_FLOAT32, comm, stream), "allgather(recvbuf=NULL)" + sfx, "recvbuf");
    /* broadcast: sendbuf is read on the root only; recvbuf is needed everywhere */
    ck.invalid(zccl_broadcast(nullptr, r, 4, ZCCL_FLOAT32, rank, comm, stream),
               "broadcast(sendbuf=NULL on the root)" + sfx, "sendbuf");
    ck.invalid(zccl_broadcast(s, nullptr, 4, ZCCL_FLOAT32, 0, comm, stream), "broadcast(recvbuf=NULL)" + sfx,
               "recvbuf");
    /* reduce: recvbuf is written on the root only; sendbuf is needed everywhere */
    ck.invalid(zccl_reduce(nullptr, r, 4, ZCCL_FLOAT32, ZCCL_SUM, 0, comm, stream), "reduce(sendbuf=NULL)" + sfx,
               "sendbuf");
    ck.invalid(zccl_reduce(s, nullptr, 4, ZCCL_FLOAT32, ZCCL_SUM, rank, comm, stream),
               "reduce(recvbuf=NULL on the root)" + sfx, "recvbuf");
    if (n > 1) { /* with one rank the only peer is self, whose support is checked elsewhere */
        ck.invalid(zccl_send(nullptr, 4, ZCCL_FLOAT32, other, comm, stream), "send(sendbuf=NULL)" + sfx, "sendbuf");
        ck.invalid(zccl_recv(nullptr, 4, ZCCL_FLOAT32, other, comm, stream), "recv(recvbuf=NULL)" + sfx, "recvbuf");
    }

    /* datatype out of range */
    for (int bad : kBadTypes) {
        const std::string d = "(datatype=" + std::to_string(bad) + ")" + sfx;
        ck.invalid(zccl_allreduce(s, r, 4, (zccl_datatype_t)bad, ZCCL_SUM, comm, stream), "allreduce" + d, "datatype");
        ck.invalid(zccl_reduce_scatter(s, r, 4, (zccl_datatype_t)bad, ZCCL_SUM, comm, stream), "reduce_scatter" + d,
                   "datatype");
        ck.invalid(zccl_allgather(s, r, 4, (zccl_datatype_t)bad, comm, stream), "allgather" + d, "datatype");
        ck.invalid(zccl_broadcast(s, r, 4, (zccl_datatype_t)bad, 0, comm, stream), "broadcast" + d, "datatype");
        ck.invalid(zccl_reduce(s, r, 4, (zccl_datatype_t)bad, ZCCL_SUM, 0, comm, stream), "reduce" + d, "datatype");
        ck.invalid(zccl_send(s, 4, (zccl_datatype_t)bad, other, comm, stream), "send" + d, "datatype");
        ck.invalid(zccl_recv(r, 4, (zccl_datatype_t)bad, other, comm, stream), "recv" + d, "datatype");
    }
    /* op out of range */
    for (int bad : kBadOps) {
        const std::string d = "(op=" + std::to_string(bad) + ")" + sfx;
        ck.invalid(zccl_allreduce(s, r, 4, ZCCL_FLOAT32, (zccl_redop_t)bad, comm, stream), "allreduce" + d, "op");
        ck.invalid(zccl_reduce_scatter(s, r, 4, ZCCL_FLOAT32, (zccl_redop_t)bad, comm, stream), "reduce_scatter" + d,
                   "op");
        ck.invalid(zccl_reduce(s, r, 4, ZCCL_FLOAT32, (zccl_redop_t)bad, 0, comm, stream), "reduce" + d, "op");
    }
    /* root / peer out of range */
    for (int bad : {-1, n, n + 100, INT32_MIN}) {
        const std::string d = "(root=" + std::to_string(bad) + ")" + sfx;
        ck.invalid(zccl_broadcast(s, r, 4, ZCCL_FLOAT32, bad, comm, stream), "broadcast" + d, "root");
        ck.invalid(zccl_reduce(s, r, 4, ZCCL_FLOAT32, ZCCL_SUM, bad, comm, stream), "reduce" + d, "root");
        const std::string p = "(peer=" + std::to_string(bad) + ")" + sfx;
        ck.invalid(zccl_send(s, 4, ZCCL_FLOAT32, bad, comm, stream), "send" + p, "peer");
        ck.invalid(zccl_recv(r, 4, ZCCL_FLOAT32, bad, comm, stream), "recv" + p, "peer");
    }
    /* counts whose byte size overflows (buffers are valid but small: the call must not touch them) */
    for (const Overflow &o : kOverflows) {
        const std::string d = std::string("(count=") + o.what + ")" + sfx;
        ck.invalid(zccl_allreduce(s, r, o.count, o.dt, ZCCL_SUM, comm, stream), "allreduce" + d, "count");
        ck.invalid(zccl_reduce_scatter(s, r, o.count, o.dt, ZCCL_SUM, comm, stream), "reduce_scatter" + d, "count");
        ck.invalid(zccl_allgather(s, r, o.count, o.dt, comm, stream), "allgather" + d, "count");
        ck.invalid(zccl_broadcast(s, r, o.count, o.dt, 0, comm, stream), "broadcast" + d, "count");
        ck.invalid(zccl_reduce(s, r, o.count, o.dt, ZCCL_SUM, 0, comm, stream), "reduce" + d, "count");
        ck.invalid(zccl_send(s, o.count, o.dt, other, comm, stream), "send" + d, "count");
        ck.invalid(zccl_recv(r, o.count, o.dt, other, comm, stream), "recv" + d, "count");
    }
    if (n >= 2) {
        /* per-rank size is fine (2^62+8 bytes) but nranks times it exceeds SIZE_MAX/2 */
        const size_t c = SIZE_MAX / 16 + 1;
        ck.invalid(zccl_reduce_scatter(s, r, c, ZCCL_FLOAT64, ZCCL_SUM, comm, stream),
                   "reduce_scatter(recvcount*nranks bytes > SIZE_MAX/2)" + sfx, "count");
        ck.invalid(zccl_allgather(s, r, c, ZCCL_FLOAT64, comm, stream),
                   "allgather(sendcount*nranks bytes > SIZE_MAX/2)" + sfx, "count");
    }
}

/* Entry points that take no communicator, or query one. */
void check_comm_queries(Checker &ck, zccl_comm_t comm, int rank, int n) {
    int v = -1;
    ck.invalid(zccl_comm_count(nullptr, &v), "comm_count(comm=NULL)", "comm");
    ck.invalid(zccl_comm_count(comm, nullptr), "comm_count(count=NULL)", "count");
    ck.invalid(zccl_comm_rank(nullptr, &v), "comm_rank(comm=NULL)", "comm");
    ck.invalid(zccl_comm_rank(comm, nullptr), "comm_rank(rank=NULL)", "rank");
    ck.success(zccl_comm_count(comm, &v), "comm_count");
    if (v != n) ck.fail("comm_count gave " + std::to_string(v) + ", expected " + std::to_string(n));
    ck.success(zccl_comm_rank(comm, &v), "comm_rank");
    if (v != rank) ck.fail("comm_rank gave " + std::to_string(v) + ", expected " + std::to_string(rank));
}

/* Count 0 with NULL buffers: a successful no-op for every collective (still collective: every rank calls). */
void check_count_zero(Checker &ck, zccl_comm_t comm, int rank, int n, zccl_stream_t stream) {
    const std::string sfx = stream ? " [on stream]" : "";
    for (zccl_datatype_t dt : {ZCCL_INT8, ZCCL_FLOAT64, ZCCL_BFLOAT16}) {
        const std::string d = std::string("(count=0, NULL buffers, ") + dtype_name(dt) + ")" + sfx;
        ck.success(zccl_allreduce(nullptr, nullptr, 0, dt, ZCCL_SUM, comm, stream), "allreduce" + d);
        ck.success(zccl_allreduce(nullptr, nullptr, 0, dt, ZCCL_AVG, comm, stream), "allreduce avg" + d);
        ck.success(zccl_reduce_scatter(nullptr, nullptr, 0, dt, ZCCL_MAX, comm, stream), "reduce_scatter" + d);
        ck.success(zccl_allgather(nullptr, nullptr, 0, dt, comm, stream), "allgather" + d);
        for (int root = 0; root < n; root++) {
            ck.success(zccl_broadcast(nullptr, nullptr, 0, dt, root, comm, stream), "broadcast" + d);
            ck.success(zccl_reduce(nullptr, nullptr, 0, dt, ZCCL_PROD, root, comm, stream), "reduce" + d);
        }
        /* matched pairs: rank r exchanges with r^1 (itself when it has no partner), even ranks send first */
        int peer = (rank ^ 1) < n ? (rank ^ 1) : rank;
        if (peer == rank) continue; /* sending to oneself is rejected (zccl.h), even with count 0 */
        if (rank % 2 == 0) {
            ck.success(zccl_send(nullptr, 0, dt, peer, comm, stream), "send" + d);
            ck.success(zccl_recv(nullptr, 0, dt, peer, comm, stream), "recv" + d);
        } else {
            ck.success(zccl_recv(nullptr, 0, dt, peer, comm, stream), "recv" + d);
            ck.success(zccl_send(nullptr, 0, dt, peer, comm, stream), "send" + d);
        }
    }
    if (stream) ck.success(zccl_stream_synchronize(stream), "stream_synchronize after count-0 operations");
}

/* The communicator still works after all of the above. */
void check_still_usable(Checker &ck, zccl_comm_t comm, int rank, int n) {
    std::vector<int32_t> in(33), out(33, -1);
    for (size_t i = 0; i < in.size(); i++) in[i] = (int32_t)(rank + 1) * (int32_t)(i + 1);
    ck.success(zccl_allreduce(in.data(), out.data(), in.size(), ZCCL_INT32, ZCCL_SUM, comm, nullptr),
               "allreduce after the invalid calls");
    const int32_t tri = n * (n + 1) / 2;
    for (size_t i = 0; i < in.size(); i++)
        if (out[i] != tri * (int32_t)(i + 1)) {
            ck.fail("allreduce after the invalid calls: element " + std::to_string(i) + " = " +
                    std::to_string(out[i]) + ", expected " + std::to_string(tri * (int32_t)(i + 1)));
            break;
        }
}

void all_checks(Checker &ck, zccl_comm_t comm, int rank, int n) {
    ck.comm = comm;
    check_comm_queries(ck, comm, rank, n);
    check_bad_args(ck, comm, rank, n, nullptr);
    zccl_stream_t st = nullptr;
    ck.success(zccl_stream_create(&st), "stream_create");
    if (st) {
        check_bad_args(ck, comm, rank, n, st);
        /* nothing was queued by the rejected calls */
        ck.success(zccl_stream_synchronize(st), "stream_synchronize after rejected calls");
        zccl_result_t q = zccl_stream_query(st);
        if (q != ZCCL_SUCCESS) ck.fail(std::string("stream_query after rejected calls: ") + zccl_get_error_string(q));
    }
    check_count_zero(ck, comm, rank, n, nullptr);
    if (st) check_count_zero(ck, comm, rank, n, st);
    check_still_usable(ck, comm, rank, n);
    if (st) ck.success(zccl_stream_destroy(st), "stream_destroy");
}

TEST(ApiArgs, OneRankCommunicatorInProcess) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    zccl_comm_t comm = nullptr;
    ASSERT_EQ(zccl_comm_init_rank(&comm, 1, id, 0), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    ASSERT_NE(comm, nullptr);
    Checker ck;
    all_checks(ck, comm, 0, 1);
    for (const auto &f : ck.failures) ADD_FAILURE() << f;
    EXPECT_EQ(zccl_comm_destroy(comm), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
}

TEST(ApiArgs, TwoRankCommunicator) {
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_TIMEOUT_MS", std::string("20000")}};
    run_ranks(2, [](zccl_comm_t comm, int rank, int n) {
        Checker ck;
        all_checks(ck, comm, rank, n);
        for (size_t i = 0; i < ck.failures.size() && i < 40; i++) child_log(rank, "FAIL %s", ck.failures[i].c_str());
        if (ck.failures.size() > 40) child_log(rank, "... %zu failures in all", ck.failures.size());
        return ck.failures.empty() ? 0 : 1;
    }, o);
}

TEST(ApiArgs, NoCommunicatorEntries) {
    Checker ck;
    ck.invalid(zccl_get_version(nullptr), "get_version(NULL)", "version");
    int v = 0;
    ck.success(zccl_get_version(&v), "get_version");
    EXPECT_EQ(v, ZCCL_VERSION_CODE);
    ck.invalid(zccl_get_unique_id(nullptr), "get_unique_id(NULL)", "id");
    ck.invalid(zccl_stream_create(nullptr), "stream_create(NULL)", "stream");
    ck.invalid(zccl_stream_synchronize(nullptr), "stream_synchronize(NULL)", "stream");
    zccl_result_t q = zccl_stream_query(nullptr); /* unspecified: must not crash, must not claim work in progress */
    EXPECT_TRUE(q == ZCCL_SUCCESS || q == ZCCL_INVALID_ARGUMENT) << "stream_query(NULL) returned " << q;
    ck.success(zccl_stream_destroy(nullptr), "stream_destroy(NULL)");
    ck.success(zccl_comm_destroy(nullptr), "comm_destroy(NULL)");
    ck.success(zccl_comm_abort(nullptr), "comm_abort(NULL)");
    for (const auto &f : ck.failures) ADD_FAILURE() << f;

    const size_t sizes[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    static_assert(ZCCL_NUM_TYPES == 12 && ZCCL_FLOAT8E4M3 == 10 && ZCCL_FLOAT8E5M2 == 11, "NCCL's numbering");
    for (int t = 0; t < 12; t++) EXPECT_EQ(zccl_type_size((zccl_datatype_t)t), sizes[t]) << "datatype " << t;
    EXPECT_EQ(zccl_type_size((zccl_datatype_t)-1), 0u);
    EXPECT_EQ(zccl_type_size((zccl_datatype_t)12), 0u);
    EXPECT_EQ(zccl_type_size((zccl_datatype_t)1000), 0u);
}

TEST(ApiArgs, ErrorStrings) {
    std::set<std::string> seen;
    static_assert(ZCCL_IN_PROGRESS == 7 && ZCCL_TIMEOUT == 9 && ZCCL_NUM_RESULTS == 10, "NCCL's numbering, 8 unused");
    for (int c = 0; c < ZCCL_NUM_RESULTS; c++) {
        if (c == 8) continue; /* ncclNumResults in NCCL: no result code */
        const char *s = zccl_get_error_string((zccl_result_t)c);
        ASSERT_NE(s, nullptr) << "code " << c;
        EXPECT_GT(strlen(s), 0u) << "code " << c;
        EXPECT_TRUE(seen.insert(s).second) << "code " << c << " shares its string \"" << s << "\"";
        EXPECT_STRNE(s, "unknown result") << "code " << c;
    }
    for (int c : {8, (int)ZCCL_NUM_RESULTS, 100, -1, INT32_MAX}) {
        const char *s = zccl_get_error_string((zccl_result_t)c);
        ASSERT_NE(s, nullptr) << "code " << c;
        EXPECT_STREQ(s, "unknown result") << "code " << c;
    }
    const char *m = zccl_get_last_error(nullptr);
    ASSERT_NE(m, nullptr);
}

TEST(ApiArgs, LastErrorIsPerThreadAndKeptAcrossSuccess) {
    ASSERT_EQ(zccl_get_version(nullptr), ZCCL_INVALID_ARGUMENT);
    std::string msg = zccl_get_last_error(nullptr);
    EXPECT_NE(msg.find("version"), std::string::npos) << msg;
    int v;
    ASSERT_EQ(zccl_get_version(&v), ZCCL_SUCCESS);
    EXPECT_EQ(msg, zccl_get_last_error(nullptr)) << "a successful call changed the last error";
    std::string other = "unset";
    std::thread t([&] { other = zccl_get_last_error(nullptr); });
    t.join();
    EXPECT_EQ(other, "") << "a fresh thread sees another thread's last error";
}

/* comm_init_rank argument checks: no communication is needed to reject them, so they run in the test process.
 * *comm must be set to NULL on failure. */
TEST(ApiArgs, CommInitRankArguments) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    Checker ck;
    ck.invalid(zccl_comm_init_rank(nullptr, 1, id, 0), "comm_init_rank(comm=NULL)", "comm");
    struct {
        int nranks, rank;
        const char *arg;
    } cases[] = {{0, 0, "nranks"},  {-1, 0, "nranks"}, {65537, 0, "nranks"}, {INT32_MIN, 0, "nranks"},
                 {2, 2, "rank"},    {2, -1, "rank"},   {1, 1, "rank"},       {4, 100, "rank"},
                 {2, INT32_MIN, "rank"}};
    for (const auto &c : cases) {
        zccl_comm_t comm = reinterpret_cast<zccl_comm_t>(0x1);
        std::string call =
            "comm_init_rank(nranks=" + std::to_string(c.nranks) + ", rank=" + std::to_string(c.rank) + ")";
        ck.invalid(zccl_comm_init_rank(&comm, c.nranks, id, c.rank), call, c.arg);
        if (comm != nullptr) ck.fail(call + ": *comm not set to NULL on failure");
    }
    for (const auto &f : ck.failures) ADD_FAILURE() << f;
    /* The id is still good after the rejected calls. */
    zccl_comm_t comm = nullptr;
    ASSERT_EQ(zccl_comm_init_rank(&comm, 1, id, 0), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    EXPECT_EQ(zccl_comm_destroy(comm), ZCCL_SUCCESS);
}

/* Malformed ids: an all-zero id must be rejected as ZCCL_INVALID_ARGUMENT naming the id; a random one must fail
 * (any error) within the init timeout. Run in children with a deadline, since a wrong implementation may wait. */
TEST(ApiArgs, MalformedUniqueId) {
    ProcessGroup g(30);
    EnvList env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("3000")}};
    g.spawn("zero id", []() {
        zccl_unique_id_t id;
        memset(&id, 0, sizeof id);
        zccl_comm_t comm = reinterpret_cast<zccl_comm_t>(0x1);
        zccl_result_t res = zccl_comm_init_rank(&comm, 2, id, 1);
        if (res != ZCCL_INVALID_ARGUMENT) {
            fprintf(stderr, "zero id: returned %s: %s\n", zccl_get_error_string(res), zccl_get_last_error(nullptr));
            return 1;
        }
        if (!strstr(zccl_get_last_error(nullptr), "id")) {
            fprintf(stderr, "zero id: message \"%s\" does not name the id\n", zccl_get_last_error(nullptr));
            return 2;
        }
        return comm == nullptr ? 0 : 3;
    }, env);
    g.spawn("random id", []() {
        zccl_unique_id_t id;
        uint64_t x = 0x243f6a8885a308d3ull;
        for (size_t i = 0; i < sizeof id.internal; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            id.internal[i] = (char)(x >> 56);
        }
        zccl_comm_t comm = nullptr;
        zccl_result_t res = zccl_comm_init_rank(&comm, 2, id, 1);
        if (res == ZCCL_SUCCESS) {
            fprintf(stderr, "random id: zccl_comm_init_rank succeeded\n");
            return 1;
        }
        return comm == nullptr ? 0 : 3;
    }, env);
    GroupResult r = g.wait_all();
    EXPECT_TRUE(r.all_ok()) << r.report();
}

}  // namespace

// zccl_config_check: each bad value named with its reason (counted), a misspelt name reported (not counted), and
// the limits of a numeric setting come from the one settings table (a switch takes no size suffix).
TEST(ApiArgs, ConfigCheck) {
    struct Env {
        const char *name;
        Env(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
        ~Env() { unsetenv(name); }
    };
    int ninvalid = -1;
    std::string text(zccl_config_check(nullptr, 0, &ninvalid) + 1, '\0');
    EXPECT_EQ(ninvalid, 0) << text;
    {
        Env a("ZCCL_SHM_SLOTS", "abc"), b("ZCCL_ALOG", "ring"), c("ZCCL_ALGO", "ring,^direct"), d("ZCCL_CHECK", "1K"),
            e("ZCCL_CHUNK_BYTES", "256K"), f("ZCCL_TRANSPORT", "udp");
        const size_t need = zccl_config_check(nullptr, 0, &ninvalid);
        text.assign(need + 1, '\0');
        EXPECT_EQ(zccl_config_check(&text[0], text.size(), nullptr), need);
        text.resize(need);
        EXPECT_EQ(ninvalid, 4) << text;
        EXPECT_NE(text.find("invalid: environment ZCCL_SHM_SLOTS=\"abc\" is not an integer in [2, 1024]\n"),
                  std::string::npos) << text;
        EXPECT_NE(text.find("ZCCL_ALGO"), std::string::npos) << text;
        EXPECT_NE(text.find("ZCCL_CHECK=\"1K\" is not an integer in [-1, 1]"), std::string::npos) << text;
        EXPECT_EQ(text.find("ZCCL_CHUNK_BYTES"), std::string::npos) << text; // 256K is a valid byte count
        EXPECT_NE(text.find("invalid: ZCCL_TRANSPORT=\"udp\": not one of shm, ib, tcp"), std::string::npos) << text;
        EXPECT_NE(text.find("unknown: ZCCL_ALOG=ring"), std::string::npos) << text;
        // a short buffer gets a NUL-terminated prefix and the same length back
        char small[16];
        EXPECT_EQ(zccl_config_check(small, sizeof small, nullptr), need);
        EXPECT_EQ(std::strlen(small), sizeof small - 1);
    }
}

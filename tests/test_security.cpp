/*
 * test_security.cpp — the job secret keeps strangers out, and hostile connections to the bootstrap root cannot
 * stop a job from starting.
 *
 *  - ImpostorWithWrongSecret: next to the two real ranks of a job, a third process holds a copy of the id whose
 *    secret was changed (zccl__unique_id_set_secret) and claims rank 0 or rank 1 of the same job, starting ahead
 *    of the real ranks. It must fail (ZCCL_TIMEOUT with ZCCL_INIT_TIMEOUT_MS=3000, or ZCCL_REMOTE_ERROR) within a
 *    deadline, and the real ranks must initialise and get a correct allreduce.
 *  - HostileConnectionsToRoot: raw TCP clients connect to the root's address (zccl__unique_id_address): one sends
 *    random bytes, some send nothing (one of them half-closes its side). The real ranks must still initialise and
 *    run an allreduce; the root must close the garbage connection within a few seconds, and the silent ones
 *    within its handshake timeout (socket.h: ZCCL_HANDSHAKE_MS, 5 s) plus margin.
 *  - ForgedProofIsDroppedByRoot: a client that speaks the handshake but forges the proof is dropped by the root.
 *  - DuplicateRankIsRefused / NranksMismatchIsRefused: the root refuses a second process claiming a taken rank,
 *    or one with a different nranks, with ZCCL_REMOTE_ERROR (zccl.h), and the real job still runs.
 */
#include <gtest/gtest.h>

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <new>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness/data.h"
#include "harness/harness.h"
#include "zccl.h"

/* Test hooks of lib/core/bootstrap.h (declared here: that header is C and pulls in internal headers). */
extern "C" {
zccl_result_t zccl__unique_id_set_secret(zccl_unique_id_t *id, const uint8_t secret[16]);
zccl_result_t zccl__unique_id_address(const zccl_unique_id_t *id, char *host, size_t hostlen, int *port);
}

using namespace zt;

namespace {

/* A real rank: optional delay, init, allreduce of int64 sums, check, destroy. Returns 0 on success. */
int real_rank(const zccl_unique_id_t &id, int rank, int n, double delay_s) {
    if (delay_s > 0) usleep((useconds_t)(delay_s * 1e6));
    zccl_comm_t comm = nullptr;
    zccl_result_t res = zccl_comm_init_rank(&comm, n, id, rank);
    if (res != ZCCL_SUCCESS) {
        child_log(rank, "real rank: zccl_comm_init_rank failed: %s: %s", zccl_get_error_string(res),
                  zccl_get_last_error(nullptr));
        return 10;
    }
    const size_t c = 4099;
    std::vector<int64_t> in(c), out(c, -1);
    gen_fill(in.data(), ZCCL_INT64, Pattern::Additive, 321, rank, 0, c);
    res = zccl_allreduce(in.data(), out.data(), c, ZCCL_INT64, ZCCL_SUM, comm, nullptr);
    if (res != ZCCL_SUCCESS) {
        child_log(rank, "real rank: allreduce failed: %s: %s", zccl_get_error_string(res),
                  zccl_get_last_error(nullptr));
        zccl_comm_abort(comm);
        return 11;
    }
    Reference ref;
    ref.compute(ZCCL_INT64, ZCCL_SUM, 321, n, 0, c);
    std::string first;
    if (ref.check(out.data(), 0, c, &first)) {
        child_log(rank, "real rank: wrong allreduce result: %s", first.c_str());
        zccl_comm_abort(comm);
        return 12;
    }
    res = zccl_comm_destroy(comm);
    if (res != ZCCL_SUCCESS) {
        child_log(rank, "real rank: zccl_comm_destroy failed: %s", zccl_get_last_error(nullptr));
        return 13;
    }
    return 0;
}

class ImpostorWithWrongSecret : public ::testing::TestWithParam<int> {};

TEST_P(ImpostorWithWrongSecret, IsRejectedAndRealRanksSucceed) {
    const int claimed_rank = GetParam();
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);

    ProcessGroup g(60);
    /* The impostor starts first: it must not take the rank it claims. */
    g.spawn("impostor", [id, claimed_rank]() -> int {
        zccl_unique_id_t bad = id;
        uint8_t secret[16];
        for (int i = 0; i < 16; i++) secret[i] = (uint8_t)(0xA0 + 7 * i);
        zccl_result_t res = zccl__unique_id_set_secret(&bad, secret);
        if (res != ZCCL_SUCCESS) {
            fprintf(stderr, "impostor: zccl__unique_id_set_secret failed: %s\n", zccl_get_last_error(nullptr));
            return 20;
        }
        if (memcmp(&bad, &id, sizeof id) == 0) {
            fprintf(stderr, "impostor: the id did not change\n");
            return 21;
        }
        double t0 = now_s();
        zccl_comm_t comm = nullptr;
        res = zccl_comm_init_rank(&comm, 2, bad, claimed_rank);
        double dt = now_s() - t0;
        fprintf(stderr, "impostor: zccl_comm_init_rank returned %s after %.2f s: %s\n", zccl_get_error_string(res),
                dt, zccl_get_last_error(nullptr));
        if (res == ZCCL_SUCCESS) {
            fprintf(stderr, "impostor: ADMITTED with a wrong secret\n");
            zccl_comm_abort(comm);
            return 22;
        }
        if (res != ZCCL_TIMEOUT && res != ZCCL_REMOTE_ERROR) {
            fprintf(stderr, "impostor: expected ZCCL_TIMEOUT or ZCCL_REMOTE_ERROR\n");
            return 23;
        }
        if (comm != nullptr) return 24;
        return dt < 15.0 ? 0 : 25;
    }, {{"ZCCL_INIT_TIMEOUT_MS", std::string("3000")}});
    for (int r = 0; r < 2; r++)
        g.spawn("rank " + std::to_string(r), [id, r]() { return real_rank(id, r, 2, 0.3); },
                {{"ZCCL_INIT_TIMEOUT_MS", std::string("30000")}, {"ZCCL_TIMEOUT_MS", std::string("30000")}});
    GroupResult res = g.wait_all();
    EXPECT_TRUE(res.all_ok()) << res.report();
}

INSTANTIATE_TEST_SUITE_P(ClaimedRank, ImpostorWithWrongSecret, ::testing::Values(0, 1));

/* ---- raw TCP clients -------------------------------------------------------------------------------------- */

int connect_to(const std::string &host, int port) {
    struct addrinfo hints, *ai = nullptr;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &ai) != 0 || !ai) return -1;
    int fd = -1;
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, p->ai_addr, p->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* Waits until the peer closes fd (recv returns 0 or an error other than EAGAIN), discarding anything it sends.
 * Returns the seconds it took, or -1 if still open at timeout_s. */
double wait_closed(int fd, double timeout_s) {
    double t0 = now_s();
    char buf[4096];
    for (;;) {
        double left = timeout_s - (now_s() - t0);
        if (left <= 0) return -1;
        struct pollfd p = {fd, POLLIN, 0};
        int k = poll(&p, 1, (int)(left * 1000) + 1);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) return -1;
        ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0) return now_s() - t0;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return now_s() - t0;
    }
}

TEST(Security, HostileConnectionsToRoot) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    char host[256] = {0};
    int port = -1;
    ASSERT_EQ(zccl__unique_id_address(&id, host, sizeof host, &port), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    ASSERT_GT(port, 0);

    /* Garbage: random bytes, more than any handshake message. */
    int garbage = connect_to(host, port);
    ASSERT_GE(garbage, 0) << "cannot connect to the root at " << host << ":" << port << ": " << strerror(errno);
    std::vector<uint8_t> junk(4096);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (auto &b : junk) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b = (uint8_t)x;
    }
    ASSERT_EQ(send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL), (ssize_t)junk.size());
    const double t_garbage = now_s();

    /* Silent clients: connected, sending nothing; the last one half-closes its sending side. */
    std::vector<int> silent;
    for (int i = 0; i < 4; i++) {
        int fd = connect_to(host, port);
        ASSERT_GE(fd, 0);
        silent.push_back(fd);
    }
    shutdown(silent.back(), SHUT_WR);

    /* The real job starts while all of them are connected. */
    Options o;
    o.deadline_s = 60;
    o.id = id;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("30000")}, {"ZCCL_TIMEOUT_MS", std::string("30000")}};
    std::unique_ptr<ProcessGroup> g = start_ranks(
        3, [](zccl_comm_t comm, int rank, int n) -> int {
            const size_t c = 1000;
            std::vector<float> in(c), out(c, -1.0f);
            gen_fill(in.data(), ZCCL_FLOAT32, Pattern::Additive, 99, rank, 0, c);
            zccl_result_t res = zccl_allreduce(in.data(), out.data(), c, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
            if (res != ZCCL_SUCCESS) {
                child_log(rank, "allreduce failed: %s", zccl_get_last_error(nullptr));
                return 1;
            }
            Reference ref;
            ref.compute(ZCCL_FLOAT32, ZCCL_SUM, 99, n, 0, c);
            std::string first;
            if (ref.check(out.data(), 0, c, &first)) {
                child_log(rank, "wrong result: %s", first.c_str());
                return 2;
            }
            return 0;
        },
        o);

    /* The root must drop the garbage connection promptly (it fails the HELLO check at once). */
    double closed_after = wait_closed(garbage, 8.0);
    if (closed_after >= 0) closed_after = now_s() - t_garbage;
    EXPECT_GE(closed_after, 0) << "the root did not close a connection that sent 4096 random bytes within 8 s";
    close(garbage);

    GroupResult res = g->wait_all();
    EXPECT_TRUE(res.all_ok()) << "real ranks failed while hostile clients were connected:\n" << res.report();

    /* Silent clients: closed by the root's handshake timeout (5 s) rather than kept forever. */
    const double until = now_s() + 12.0;
    for (size_t i = 0; i < silent.size(); i++) {
        double t = wait_closed(silent[i], std::max(0.1, until - now_s()));
        EXPECT_GE(t, 0) << "silent client " << i << (i + 1 == silent.size() ? " (half-closed)" : "")
                        << " still connected to the root 12 s after the job finished";
        close(silent[i]);
    }
    printf("[   INFO   ] garbage connection closed after %.3f s\n", closed_after);
}


/*
 * A client that speaks the handshake (socket.h) but does not know the secret: a valid HELLO, then a PROOF of random
 * bytes followed by a header claiming to be a rank. The root must answer the HELLO with its challenge, then drop
 * the connection without admitting it, and still admit the real ranks. (The ImpostorWithWrongSecret test above
 * stops on the client side, which detects first that the root's challenge MAC is wrong; this one reaches the
 * root's own proof check.) Protocol constants are those of util/socket.c: magic "ZCCLHELO", version 1.
 */
TEST(Security, ForgedProofIsDroppedByRoot) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    char host[256] = {0};
    int port = -1;
    ASSERT_EQ(zccl__unique_id_address(&id, host, sizeof host, &port), ZCCL_SUCCESS);

    int fd = connect_to(host, port);
    ASSERT_GE(fd, 0);
    uint8_t hello[28];
    memcpy(hello, "ZCCLHELO", 8);
    const uint8_t version_be[4] = {0, 0, 0, 1};
    memcpy(hello + 8, version_be, 4);
    for (int i = 0; i < 16; i++) hello[12 + i] = (uint8_t)(i * 37 + 11);
    ASSERT_EQ(send(fd, hello, sizeof hello, MSG_NOSIGNAL), (ssize_t)sizeof hello);
    uint8_t chal[48];
    ASSERT_TRUE(recv_exact(fd, chal, sizeof chal, 5.0))
        << "the root did not answer a well-formed HELLO with its 48-byte challenge (protocol changed?)";
    /* forged proof (32 bytes) + a header of zeros (rank 0 of 1 rank, if it were parsed) */
    std::vector<uint8_t> proof(32 + 4096, 0);
    for (int i = 0; i < 32; i++) proof[(size_t)i] = (uint8_t)(0xC0 ^ i);
    ssize_t sent = send(fd, proof.data(), proof.size(), MSG_NOSIGNAL);
    EXPECT_GT(sent, 0);
    double t = wait_closed(fd, 8.0);
    EXPECT_GE(t, 0) << "the root kept a connection whose proof was forged";
    close(fd);

    Options o;
    o.deadline_s = 60;
    o.id = id;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("30000")}, {"ZCCL_TIMEOUT_MS", std::string("30000")}};
    GroupResult r = run_ranks(2, [](zccl_comm_t comm, int rank, int n) -> int {
        int32_t v = rank + 1, out = 0;
        if (zccl_allreduce(&v, &out, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS) return 1;
        int cnt = 0;
        zccl_comm_count(comm, &cnt);
        return (out == n * (n + 1) / 2 && cnt == n) ? 0 : 2;
    }, o);
    EXPECT_TRUE(r.all_ok());
}

/* ---- joining rules: a rank taken twice, a disagreeing nranks ------------------------------------------------ */

/* Waits (polling) until flag >= v or timeout_s passes. */
bool wait_flag(const std::atomic<int> *flag, int v, double timeout_s) {
    double end = now_s() + timeout_s;
    while (flag->load() < v) {
        if (now_s() > end) return false;
        usleep(2000);
    }
    return true;
}

/* zccl.h, zccl_comm_init_rank: "ZCCL_REMOTE_ERROR (a peer disagrees on nranks, or rank used twice)". */
TEST(Security, DuplicateRankIsRefused) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    SharedMem shm(sizeof(std::atomic<int>) * 2);
    std::atomic<int> *admitted = new (shm.data()) std::atomic<int>(0);
    std::atomic<int> *refused = new ((char *)shm.data() + sizeof(std::atomic<int>)) std::atomic<int>(0);
    ProcessGroup g(60);
    const EnvList env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("20000")}, {"ZCCL_TIMEOUT_MS", std::string("20000")}};
    /* Two candidates for rank 1; rank 0 joins only once one of them was refused, so both reach the root while the
     * job is incomplete (deterministic): exactly one must be refused, with ZCCL_REMOTE_ERROR. */
    for (int k = 0; k < 2; k++)
        g.spawn("rank 1 candidate " + std::to_string(k), [id, admitted, refused]() -> int {
            zccl_comm_t comm = nullptr;
            zccl_result_t res = zccl_comm_init_rank(&comm, 2, id, 1);
            if (res != ZCCL_SUCCESS) {
                fprintf(stderr, "refused: %s: %s\n", zccl_get_error_string(res), zccl_get_last_error(nullptr));
                refused->fetch_add(1);
                return res == ZCCL_REMOTE_ERROR ? 0 : 10 + (int)res;
            }
            admitted->fetch_add(1);
            int32_t v = 2, out = 0;
            res = zccl_allreduce(&v, &out, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
            zccl_comm_destroy(comm);
            return (res == ZCCL_SUCCESS && out == 3) ? 0 : 2;
        }, env);
    g.spawn("rank 0", [id, refused]() -> int {
        if (!wait_flag(refused, 1, 20.0)) fprintf(stderr, "rank 0: no candidate was refused within 20 s\n");
        zccl_comm_t comm = nullptr;
        if (zccl_comm_init_rank(&comm, 2, id, 0) != ZCCL_SUCCESS) {
            fprintf(stderr, "rank 0: %s\n", zccl_get_last_error(nullptr));
            return 1;
        }
        int32_t v = 1, out = 0;
        zccl_result_t res = zccl_allreduce(&v, &out, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
        zccl_comm_destroy(comm);
        return (res == ZCCL_SUCCESS && out == 3) ? 0 : 2;
    }, env);
    GroupResult r = g.wait_all();
    EXPECT_TRUE(r.all_ok()) << "(exit code 10+N: refused with zccl_result_t N instead of ZCCL_REMOTE_ERROR = 6)\n"
                            << r.report();
    EXPECT_EQ(admitted->load(), 1) << "exactly one of two processes claiming rank 1 must be admitted";
    EXPECT_EQ(refused->load(), 1);
}

TEST(Security, NranksMismatchIsRefused) {
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    SharedMem shm(sizeof(std::atomic<int>) * 2);
    std::atomic<int> *started0 = new (shm.data()) std::atomic<int>(0);
    std::atomic<int> *done = new ((char *)shm.data() + sizeof(std::atomic<int>)) std::atomic<int>(0);
    ProcessGroup g(60);
    const EnvList env = {{"ZCCL_INIT_TIMEOUT_MS", std::string("20000")}, {"ZCCL_TIMEOUT_MS", std::string("20000")}};
    /* Order: rank 0 (nranks 2) reaches the root first and fixes nranks; then a process says nranks=3 and must be
     * refused; rank 1 joins only after that refusal. */
    auto real = [id](int rank, std::atomic<int> *before, std::atomic<int> *wait_for) {
        return [id, rank, before, wait_for]() -> int {
            if (wait_for && !wait_flag(wait_for, 1, 20.0)) fprintf(stderr, "rank %d: gave up waiting\n", rank);
            if (before) before->store(1);
            zccl_comm_t comm = nullptr;
            if (zccl_comm_init_rank(&comm, 2, id, rank) != ZCCL_SUCCESS) {
                fprintf(stderr, "rank %d: %s\n", rank, zccl_get_last_error(nullptr));
                return 1;
            }
            int32_t v = rank + 1, out = 0;
            zccl_result_t res = zccl_allreduce(&v, &out, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr);
            zccl_comm_destroy(comm);
            return (res == ZCCL_SUCCESS && out == 3) ? 0 : 2;
        };
    };
    g.spawn("rank 0", real(0, started0, nullptr), env);
    g.spawn("nranks=3 rank 2", [id, started0, done]() -> int {
        wait_flag(started0, 1, 20.0);
        usleep(500000); /* let rank 0's hello reach the root first */
        zccl_comm_t comm = nullptr;
        zccl_result_t res = zccl_comm_init_rank(&comm, 3, id, 2);
        fprintf(stderr, "nranks=3 rank 2: %s: %s\n", zccl_get_error_string(res), zccl_get_last_error(nullptr));
        done->store(1);
        if (res == ZCCL_SUCCESS) return 1;
        return res == ZCCL_REMOTE_ERROR ? 0 : 10 + (int)res;
    }, env);
    g.spawn("rank 1", real(1, nullptr, done), env);
    GroupResult r = g.wait_all();
    EXPECT_TRUE(r.all_ok()) << "(exit code 10+N: refused with zccl_result_t N instead of ZCCL_REMOTE_ERROR = 6)\n"
                            << r.report();
}

}  // namespace

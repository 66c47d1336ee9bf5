/*
 * test_flood.cpp — thousands of hostile connections to the bootstrap root and to the ranks' data listeners while a
 * real job initialises and runs allreduces (issue 6, security).
 *
 * Two real ranks (tests/harness start_ranks, TCP transport, everything on 127.0.0.1) and a flooder process:
 *  1. The flooder records a valid client handshake of its own: zccl__connect_auth against a fake server in the
 *     flooder (it knows the job's secret from the id, as any rank does) that answers the HELLO with a correct
 *     challenge and records every byte the client sends: HELLO, PROOF and a header that claims rank 1 of the job.
 *  2. It opens about 1000 connections to the bootstrap root: random bytes, half-open (connect and say nothing),
 *     truncated HELLOs, a valid HELLO followed by a forged PROOF, and replays of the recorded handshake (HELLO,
 *     read the root's fresh challenge, then the recorded PROOF and header). Rank 0 joins after the first 200,
 *     rank 1 after 900: the root is busy with the flood while it admits them, and a replay that the root took for
 *     rank 1 would make the real rank 1 be refused.
 *  3. Once both ranks publish their data listeners (read from the communicator's internals, lib/core/comm.h), it records
 *     a valid rank-to-rank handshake (zccl_conn_hdr_t claiming the other rank) and floods both listeners the same
 *     way, about 500 connections each, while the ranks loop on allreduces (their own TCP connections were opened
 *     by the barrier that ends init, during the root flood).
 * Asserts: every replay gets a challenge (the server really read it as a handshake) and is then closed by the
 * server (never admitted; the ranks log, at WARN for the TCP subsystem, no connection that passed the proof but
 * was refused afterwards, and the connection each admitted from its peer is the same at the end); the root and ranks never crash; every allreduce result is right and the rank count
 * stays 2 (no garbage connection took a peer's place); the ranks' descriptor count at the end is at most their
 * count after init plus their own two TCP connections and a small margin (no descriptor leak per hostile
 * connection); the test process, which hosts the root, gets its descriptors back.
 */
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "harness/data.h"
#include "harness/harness.h"
#include "zccl.h"

extern "C" {
#include "bootstrap.h" /* zccl__id_decode, struct zccl_comm, socket.h: zccl__connect_auth, handshake messages */
}

using namespace zt;

namespace {

constexpr int kRootFlood = 1000;     /* connections to the bootstrap root */
constexpr int kRank0JoinsAfter = 200;
constexpr int kRank1JoinsAfter = 900;
constexpr int kDataFlood = 500;      /* connections to each rank's data listener */
constexpr size_t kMaxHeld = 48;      /* hostile connections held open at once per target (bounded) */
constexpr int kFdSlack = 4;          /* a rank's own TCP connections (one out, one in) plus margin */

struct Shared {
    std::atomic<int> root_conns{0};      /* hostile connections the flooder made to the root so far */
    std::atomic<int> inited{0};          /* ranks whose init returned (the root has finished by then) */
    std::atomic<int> ports_ready{0};
    std::atomic<int> data_flood_started{0};
    std::atomic<int> flood_done{0};
    std::atomic<int> abort{0};           /* someone failed: everybody stops waiting */
    int data_port[2] = {0, 0};
    uint64_t comm_id = 0;
};

int count_fds() {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (struct dirent *e = readdir(d))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

bool wait_for(const std::atomic<int> &v, int at_least, double timeout_s, const Shared *S) {
    double end = now_s() + timeout_s;
    while (v.load() < at_least) {
        if (now_s() > end || S->abort.load()) return false;
        usleep(1000);
    }
    return true;
}

uint64_t xorshift(uint64_t &x) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
}

zccl_sockaddr_t loopback(int port) {
    zccl_sockaddr_t a;
    memset(&a, 0, sizeof a);
    zccl__resolve("127.0.0.1", port, &a); /* numeric: cannot fail */
    return a;
}

int tcp_connect(const zccl_sockaddr_t &a) {
    int fd = socket(a.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)&a.sa, a.len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

bool send_exact(int fd, const void *p, size_t n) {
    return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n; /* small messages into a fresh socket: sent at once */
}


/* True when the server closes fd within timeout_s (EOF or reset), discarding anything it sends. */
bool closed_by_server(int fd, double timeout_s) {
    double end = now_s() + timeout_s;
    char buf[256];
    for (;;) {
        double left = end - now_s();
        if (left <= 0) return false;
        struct pollfd p = {fd, POLLIN, 0};
        int k = poll(&p, 1, (int)(left * 1000) + 1);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) return false;
        ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0) return true;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    }
}

/*
 * Records what a real client sends: a fake server on 127.0.0.1 that reads the HELLO, answers with a correct
 * challenge (it holds the secret), then records everything until the client closes; the client is the library's
 * own zccl__connect_auth. Returns HELLO | PROOF | header, or empty on failure (reason in *err).
 */
std::vector<uint8_t> record_handshake(const uint8_t secret[ZCCL_SECRET_BYTES], const void *hdr, size_t hdr_bytes,
                                      std::string *err) {
    zccl_sockaddr_t addr = loopback(0);
    int lfd = -1;
    if (zccl__listen(&addr, &lfd) != ZCCL_SUCCESS) {
        *err = std::string("fake server: ") + zccl_get_last_error(nullptr);
        return {};
    }
    std::vector<uint8_t> rec;
    std::string server_err;
    std::thread server([&]() {
        struct pollfd p = {lfd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0) { server_err = "no client"; return; }
        int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) { server_err = "accept failed"; return; }
        uint8_t hello[ZCCL_HELLO_BYTES], nonce_c[ZCCL_NONCE_BYTES], nonce_s[ZCCL_NONCE_BYTES], chal[ZCCL_CHAL_BYTES];
        const char *why = nullptr;
        if (!recv_exact(fd, hello, sizeof hello, 5) ||
            zccl__hello_decode(hello, sizeof hello, nonce_c, &why) != ZCCL_SUCCESS) {
            server_err = std::string("bad hello: ") + (why ? why : "short");
            close(fd);
            return;
        }
        if (getrandom(nonce_s, sizeof nonce_s, 0) != (ssize_t)sizeof nonce_s) memset(nonce_s, 7, sizeof nonce_s);
        zccl__chal_encode(secret, nonce_c, nonce_s, chal);
        send_exact(fd, chal, sizeof chal);
        rec.assign(hello, hello + sizeof hello);
        uint8_t buf[4096];
        for (;;) { /* until the client closes */
            struct pollfd q = {fd, POLLIN, 0};
            if (poll(&q, 1, 5000) <= 0) break;
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) break;
            rec.insert(rec.end(), buf, buf + r);
        }
        close(fd);
    });
    int cfd = -1;
    zccl_result_t res = zccl__connect_auth(&addr, secret, hdr, hdr_bytes, zccl__now_ns() + 5000000000ull, &cfd);
    if (res == ZCCL_SUCCESS) close(cfd);
    server.join();
    close(lfd);
    if (res != ZCCL_SUCCESS) {
        *err = std::string("zccl__connect_auth to the fake server: ") + zccl_get_last_error(nullptr);
        return {};
    }
    if (!server_err.empty()) {
        *err = "fake server: " + server_err;
        return {};
    }
    if (rec.size() != ZCCL_HELLO_BYTES + ZCCL_MAC_BYTES + hdr_bytes) {
        *err = "recorded " + std::to_string(rec.size()) + " bytes, expected " +
               std::to_string(ZCCL_HELLO_BYTES + ZCCL_MAC_BYTES + hdr_bytes);
        return {};
    }
    return rec;
}

struct FloodStats {
    int conns = 0, connect_failed = 0, replays = 0, replays_challenged = 0, replays_dropped = 0;
    int forged = 0, forged_dropped = 0;
    int unanswered = 0; /* a valid HELLO got no challenge */
};

/*
 * One hostile connection of kind (i % 8) to target. Half-open and truncated connections are held (bounded by
 * kMaxHeld, oldest closed first) so the server has many handshakes in progress at once.
 * Returns false when connect() failed.
 */
bool hostile_conn(const zccl_sockaddr_t &target, int i, const std::vector<uint8_t> &replay, uint64_t &rng,
                  std::deque<int> &held, FloodStats &st) {
    int fd = tcp_connect(target);
    if (fd < 0) {
        st.connect_failed++;
        return false;
    }
    st.conns++;
    bool hold = false;
    switch (i % 8) {
    case 0:
    case 1: { /* random bytes, 1..600 of them, then close */
        uint8_t junk[600];
        size_t n = 1 + xorshift(rng) % sizeof junk;
        for (size_t k = 0; k < n; k++) junk[k] = (uint8_t)xorshift(rng);
        send_exact(fd, junk, n);
        break;
    }
    case 2:
    case 3: /* half-open: connect and say nothing */
        hold = true;
        break;
    case 4: { /* truncated HELLO: a prefix of a valid one; held open half the time */
        size_t n = 1 + xorshift(rng) % (ZCCL_HELLO_BYTES - 1);
        send_exact(fd, replay.data(), n);
        hold = (i / 8) % 2 == 0;
        break;
    }
    case 5: { /* valid HELLO, then a forged PROOF and the recorded header */
        st.forged++;
        uint8_t chal[ZCCL_CHAL_BYTES];
        if (send_exact(fd, replay.data(), ZCCL_HELLO_BYTES) && recv_exact(fd, chal, sizeof chal, 2)) {
            std::vector<uint8_t> rest(replay.begin() + ZCCL_HELLO_BYTES, replay.end());
            for (int k = 0; k < ZCCL_MAC_BYTES; k++) rest[(size_t)k] = (uint8_t)xorshift(rng);
            send_exact(fd, rest.data(), rest.size());
            if (closed_by_server(fd, 3)) st.forged_dropped++;
        } else {
            st.unanswered++;
        }
        break;
    }
    default: { /* 6, 7: replay of the recorded valid handshake */
        st.replays++;
        uint8_t chal[ZCCL_CHAL_BYTES];
        if (send_exact(fd, replay.data(), ZCCL_HELLO_BYTES) && recv_exact(fd, chal, sizeof chal, 2)) {
            st.replays_challenged++;
            send_exact(fd, replay.data() + ZCCL_HELLO_BYTES, replay.size() - ZCCL_HELLO_BYTES);
            if (closed_by_server(fd, 3)) st.replays_dropped++;
        } else {
            st.unanswered++;
        }
        break;
    }
    }
    if (hold) {
        held.push_back(fd);
        if (held.size() > kMaxHeld) {
            close(held.front());
            held.pop_front();
        }
    } else {
        close(fd);
    }
    return true;
}

void close_all(std::deque<int> &held) {
    for (int fd : held) close(fd);
    held.clear();
}

std::string describe(const char *what, const FloodStats &s) {
    char b[400];
    snprintf(b, sizeof b,
             "%s: %d connections (%d connect failures), %d replays (%d challenged, %d dropped by the server), "
             "%d forged proofs (%d dropped), %d valid HELLOs unanswered",
             what, s.conns, s.connect_failed, s.replays, s.replays_challenged, s.replays_dropped, s.forged,
             s.forged_dropped, s.unanswered);
    return b;
}

/* Every replay and forged proof was challenged (the server really ran a handshake) and then dropped. */
bool stats_ok(const FloodStats &s) {
    return s.replays > 0 && s.unanswered == 0 && s.replays_challenged == s.replays && s.replays_dropped == s.replays &&
           s.forged_dropped == s.forged;
}

int flooder(const zccl_unique_id_t &id, Shared *S) {
    zccl_id_info_t info;
    if (zccl__id_decode(&id, &info) != ZCCL_SUCCESS) {
        fprintf(stderr, "flooder: cannot decode the id: %s\n", zccl_get_last_error(nullptr));
        return 30;
    }
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    std::string err;

    /* 1. A recorded valid join of rank 1 (the layout of lib/core/bootstrap.c's root hello: rank, nranks, peer info). */
    std::vector<uint8_t> join(8 + sizeof(zccl_peer_info_t), 0);
    {
        int32_t rn[2] = {1, 2};
        zccl_peer_info_t pi;
        memset(&pi, 0, sizeof pi);
        pi.rank = 1;
        pi.pid = (int32_t)getpid();
        pi.listen = loopback(9);
        pi.loc.package = pi.loc.numa = pi.loc.core = -1;
        memcpy(join.data(), rn, sizeof rn);
        memcpy(join.data() + 8, &pi, sizeof pi);
    }
    std::vector<uint8_t> root_replay = record_handshake(info.secret, join.data(), join.size(), &err);
    if (root_replay.empty()) {
        fprintf(stderr, "flooder: could not record a root handshake: %s\n", err.c_str());
        return 31;
    }

    /* 2. The root, while the ranks join. */
    FloodStats rs;
    std::deque<int> held;
    double t0 = now_s();
    for (int i = 0; i < kRootFlood; i++) {
        /* Once rank 1 may join, the root finishes: it closes its port when a rank's init has returned. (The
         * ranks and this process are forks of the process hosting the root and inherit its listening socket, so
         * connections are still accepted by the kernel then, but nobody answers them.) */
        if (S->inited.load() > 0) break;
        const FloodStats before = rs;
        bool connected = hostile_conn(info.root, i, root_replay, rng, held, rs);
        if (i >= kRank1JoinsAfter && (!connected || rs.unanswered > before.unanswered)) {
            /* The root may have finished a moment before the ranks' init returned: give them time to say so. */
            for (int w = 0; w < 200 && S->inited.load() == 0; w++) usleep(10000);
            if (S->inited.load() > 0) {
                rs = before; /* the root was gone: not counted */
                break;
            }
        }
        if (!connected) {
            fprintf(stderr, "flooder: connect to the root failed after %d connections: %s\n", i, strerror(errno));
            return 32;
        }
        S->root_conns.store(i + 1);
    }
    close_all(held);
    S->root_conns.store(kRootFlood); /* releases rank 1 even if the root went away early */
    double t_root = now_s() - t0;

    /* 3. The data listeners, while the ranks connect to each other and run allreduces. */
    if (!wait_for(S->ports_ready, 2, 30, S)) {
        fprintf(stderr, "flooder: the ranks did not publish their listeners\n");
        return 33;
    }
    FloodStats ds[2];
    std::vector<uint8_t> data_replay[2];
    for (int r = 0; r < 2; r++) {
        zccl_conn_hdr_t h;
        memset(&h, 0, sizeof h);
        h.comm_id = S->comm_id;
        h.from_rank = 1 - r; /* claims to be the other rank */
        h.kind = ZCCL_CONN_DATA;
        data_replay[r] = record_handshake(info.secret, &h, sizeof h, &err);
        if (data_replay[r].empty()) {
            fprintf(stderr, "flooder: could not record a data handshake: %s\n", err.c_str());
            return 34;
        }
    }
    S->data_flood_started.store(1);
    t0 = now_s();
    std::deque<int> held_data[2];
    for (int i = 0; i < 2 * kDataFlood; i++) {
        int r = i % 2;
        if (!hostile_conn(loopback(S->data_port[r]), i / 2, data_replay[r], rng, held_data[r], ds[r])) {
            fprintf(stderr, "flooder: connect to rank %d's listener failed: %s\n", r, strerror(errno));
            return 35;
        }
    }
    close_all(held_data[0]);
    close_all(held_data[1]);
    double t_data = now_s() - t0;
    S->flood_done.store(1);

    fprintf(stderr, "flooder: %s in %.2f s\n", describe("root", rs).c_str(), t_root);
    fprintf(stderr, "flooder: %s; %s in %.2f s\n", describe("rank 0 listener", ds[0]).c_str(),
            describe("rank 1 listener", ds[1]).c_str(), t_data);
    int rc = 0;
    if (!stats_ok(rs) || rs.conns < kRank1JoinsAfter + 1) {
        fprintf(stderr, "flooder: FAILED at the root: a replay or forged proof was not challenged and dropped\n");
        rc = 36;
    }
    for (int r = 0; r < 2; r++)
        if (!stats_ok(ds[r]) || ds[r].conns != kDataFlood) {
            fprintf(stderr, "flooder: FAILED at rank %d: a replay or forged proof was not challenged and dropped\n", r);
            rc = 37;
        }
    return rc;
}

int rank_main(const zccl_unique_id_t &id, int rank, Shared *S) {
    const int n = 2;
#define fail(code, ...) (child_log(rank, __VA_ARGS__), S->abort.store(1), (code))
    if (!wait_for(S->root_conns, rank == 0 ? kRank0JoinsAfter : kRank1JoinsAfter, 30, S))
        return fail(40, "the flooder did not start");
    zccl_comm_t comm = nullptr;
    zccl_result_t res = zccl_comm_init_rank(&comm, n, id, rank);
    if (res != ZCCL_SUCCESS)
        return fail(41, "zccl_comm_init_rank failed under the flood: %s: %s", zccl_get_error_string(res),
                    zccl_get_last_error(nullptr));
    S->inited.fetch_add(1);
    const int fd_start = count_fds();
    /* The ranks' own connections (opened by the barrier that ends init): the same descriptors at the end. */
    pthread_mutex_lock(&comm->tc.in_mutex);
    const int in_start = comm->tc.in_fd[1 - rank];
    pthread_mutex_unlock(&comm->tc.in_mutex);
    zccl_sockaddr_t la;
    la.len = sizeof la.sa;
    getsockname(comm->listen_fd, (struct sockaddr *)&la.sa, &la.len);
    S->data_port[rank] = ntohs(((struct sockaddr_in *)&la.sa)->sin_port);
    if (rank == 0) S->comm_id = comm->tc.comm_id;
    S->ports_ready.fetch_add(1);
    if (!wait_for(S->data_flood_started, 1, 30, S)) {
        zccl_comm_abort(comm);
        return fail(42, "the data flood did not start");
    }

    /* Allreduces with checked results until the flood is over (at least 20; sizes alternate between the direct
     * algorithm and the ring). The first one opens the ranks' TCP connections, during the flood. */
    int iters = 0;
    const double t_end = now_s() + 15;
    for (;;) {
        if (S->abort.load()) break;
        /* The ranks stop together: each says whether it has seen the end of the flood, and an allreduce (MIN)
         * makes the decision the same on both. */
        int32_t mine = (iters >= 20 && S->flood_done.load()) ? 1 : 0, both = 0;
        res = zccl_allreduce(&mine, &both, 1, ZCCL_INT32, ZCCL_MIN, comm, nullptr);
        if (res != ZCCL_SUCCESS) {
            zccl_comm_abort(comm);
            return fail(44, "allreduce of the stop flag failed under the flood: %s", zccl_get_last_error(nullptr));
        }
        if (both) break;
        if (now_s() > t_end) {
            zccl_comm_abort(comm);
            return fail(43, "the flood did not end within 15 s (%d allreduces done)", iters);
        }
        const size_t c = iters % 2 ? 65536 + 3 : 515;
        std::vector<int64_t> in(c), out(c, -1);
        const uint64_t salt = 1000 + (uint64_t)iters;
        gen_fill(in.data(), ZCCL_INT64, Pattern::Additive, salt, rank, 0, c);
        res = zccl_allreduce(in.data(), out.data(), c, ZCCL_INT64, ZCCL_SUM, comm, nullptr);
        if (res != ZCCL_SUCCESS) {
            zccl_comm_abort(comm);
            return fail(44, "allreduce %d failed under the flood: %s", iters, zccl_get_last_error(nullptr));
        }
        Reference ref;
        ref.compute(ZCCL_INT64, ZCCL_SUM, salt, n, 0, c);
        std::string first;
        if (ref.check(out.data(), 0, c, &first)) {
            zccl_comm_abort(comm);
            return fail(45, "allreduce %d gave a wrong result: %s", iters, first.c_str());
        }
        int cnt = 0;
        if (zccl_comm_count(comm, &cnt) != ZCCL_SUCCESS || cnt != n) {
            zccl_comm_abort(comm);
            return fail(46, "rank count changed to %d", cnt);
        }
        iters++;
    }
    if (S->abort.load()) {
        zccl_comm_abort(comm);
        return fail(47, "stopped: another process failed");
    }
    /* Every hostile connection is closed by now; the service thread drops each on EOF. */
    int fd_end = count_fds();
    for (double until = now_s() + 5; fd_end > fd_start + kFdSlack && now_s() < until; usleep(20000))
        fd_end = count_fds();
    child_log(rank, "%d allreduces under the flood; descriptors after init %d, at the end %d", iters, fd_start,
              fd_end);
    pthread_mutex_lock(&comm->tc.in_mutex);
    const int in_end = comm->tc.in_fd[1 - rank];
    pthread_mutex_unlock(&comm->tc.in_mutex);
    if (in_end != in_start) {
        zccl_comm_abort(comm);
        return fail(50, "the connection admitted from rank %d changed from fd %d to %d", 1 - rank, in_start, in_end);
    }
    if (fd_end > fd_start + kFdSlack) {
        zccl_comm_abort(comm);
        return fail(48, "descriptor leak: %d after init, %d at the end", fd_start, fd_end);
    }
    res = zccl_comm_destroy(comm);
    if (res != ZCCL_SUCCESS) return fail(49, "zccl_comm_destroy: %s", zccl_get_last_error(nullptr));
    return 0;
#undef fail
}

}  // namespace

TEST(Flood, HostileConnectionsDuringInitAndCollectives) {
    /* The root lives in this process (zccl_get_unique_id): on loopback, and its descriptors must come back. */
    const char *old_if = getenv("ZCCL_SOCKET_IFNAME");
    std::string saved = old_if ? old_if : "";
    setenv("ZCCL_SOCKET_IFNAME", "lo", 1);
    const int parent_fds = count_fds();
    zccl_unique_id_t id;
    zccl_result_t idres = zccl_get_unique_id(&id);
    if (old_if) setenv("ZCCL_SOCKET_IFNAME", saved.c_str(), 1);
    else unsetenv("ZCCL_SOCKET_IFNAME");
    ASSERT_EQ(idres, ZCCL_SUCCESS) << zccl_get_last_error(nullptr);

    SharedMem shm(sizeof(Shared));
    Shared *S = new (shm.data()) Shared();

    Options o;
    o.deadline_s = 40;
    o.id = id;
    o.init_comm = false;
    o.env = {{"ZCCL_SOCKET_IFNAME", std::string("lo")},
             {"ZCCL_TRANSPORT", std::string("tcp")},
             {"ZCCL_INIT_TIMEOUT_MS", std::string("30000")},
             {"ZCCL_TIMEOUT_MS", std::string("20000")},
             /* Log the service thread's refusals of connections that passed the proof (TCP subsystem; the
              * handshake failures themselves are BOOT and stay quiet): there must be none. */
             {"ZCCL_DEBUG", std::string("WARN")},
             {"ZCCL_DEBUG_SUBSYS", std::string("TCP")}};
    const double t0 = now_s();
    std::unique_ptr<ProcessGroup> g =
        start_ranks(2, [id, S](zccl_comm_t, int rank, int) { return rank_main(id, rank, S); }, o);
    g->spawn("flooder", [id, S]() {
        int rc = flooder(id, S);
        if (rc) S->abort.store(1);
        return rc;
    });
    GroupResult res = g->wait_all();
    const double dt = now_s() - t0;
    EXPECT_TRUE(res.all_ok()) << res.report();
    for (const ProcStatus &p : res.procs) {
        /* Summary lines of the children (stats, descriptor counts). */
        size_t pos = 0;
        while ((pos = p.output.find("flooder: ", pos)) != std::string::npos) {
            size_t e = p.output.find('\n', pos);
            printf("[   INFO   ] %s\n", p.output.substr(pos, e - pos).c_str());
            pos = e;
        }
        pos = p.output.find("allreduces under the flood");
        if (pos != std::string::npos) {
            size_t b = p.output.rfind('\n', pos);
            size_t e = p.output.find('\n', pos);
            printf("[   INFO   ] %s\n", p.output.substr(b == std::string::npos ? 0 : b + 1, e - b - 1).c_str());
        }
    }
    for (const ProcStatus &p : res.procs) {
        /* A replay or forged proof that passed the proof check would reach service_on_conn (comm.c) and be
         * refused there as a second connection of the rank it claims, or for its header. */
        EXPECT_EQ(p.output.find("connected twice"), std::string::npos) << p.name << " admitted a replay:\n"
                                                                        << p.output;
        EXPECT_EQ(p.output.find("wrong header"), std::string::npos) << p.name << ":\n" << p.output;
    }
    EXPECT_LT(dt, 20.0) << "the flood test took too long";
    g.reset();

    /* The root exited once both ranks joined; every connection it accepted is closed. */
    int parent_end = count_fds();
    for (double until = now_s() + 3; parent_end > parent_fds && now_s() < until; usleep(20000))
        parent_end = count_fds();
    EXPECT_LE(parent_end, parent_fds) << "descriptors of the test process (which hosts the bootstrap root): "
                                      << parent_fds << " before, " << parent_end << " after";
    S->~Shared();
}

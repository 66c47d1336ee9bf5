/*
 * test_bootstrap_port.cpp — the bootstrap port cannot be stolen by a rank's own connect.
 *
 * On loopback, a connect() to a port nobody listens on can be given that very port as its source port (the kernel
 * draws source ports from net.ipv4.ip_local_port_range): TCP's simultaneous open then connects the socket to
 * itself, the connect succeeds, and the socket holds the port that rank 0 is about to bind for the bootstrap root,
 * which fails with EADDRINUSE (seen in CI: "rank 0 cannot host the bootstrap root on MASTER_PORT=44647").
 *
 *  - SelfConnectIsDroppedAndTheListenerGetsThePort: in a network namespace of its own (needs root; SKIP otherwise)
 *    whose ip_local_port_range is just {P, P+1}, a client thread runs zccl__connect_auth to 127.0.0.1:P while
 *    nothing listens there, so about every other attempt connects to itself. After 300 ms the test binds and
 *    listens on P with zccl__listen_busy (up to a second, as rank 0 does). It must get the port and then accept the client's
 *    connection from source port P+1. Without the self-connect check the client keeps the port and the bind fails.
 *  - LauncherPortIsOutsideTheEphemeralRange: zl_free_port (zcclrun, zccl-bench -np) returns free ports outside
 *    ip_local_port_range, where no connect() can take them.
 */
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

extern "C" {
#include "bootstrap.h" /* socket.h: zccl__listen, zccl__connect_auth, zccl__now_ns */
#ifdef ZCCL_TEST_HAVE_LAUNCH
int zl_free_port(const char *addr, const char *name); /* tools/launch.h */
#endif
}

namespace {

constexpr int kSkip = 77;
constexpr int kPort = 40000;

int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* In the child: a network namespace of its own with lo up and ip_local_port_range = {kPort, kPort+1}. */
int private_netns() {
    if (unshare(CLONE_NEWNET) != 0) return kSkip;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) return kSkip;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) return kSkip;
    close(s);
    char range[32];
    snprintf(range, sizeof range, "%d %d", kPort, kPort + 1);
    if (write_file("/proc/sys/net/ipv4/ip_local_port_range", range) != 0) return kSkip;
    return 0;
}

int child_body() {
    int rc = private_netns();
    if (rc != 0) return rc;
    zccl_sockaddr_t addr;
    memset(&addr, 0, sizeof addr);
    struct sockaddr_in *in = (struct sockaddr_in *)&addr.sa;
    in->sin_family = AF_INET;
    in->sin_port = htons(kPort);
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.len = sizeof *in;
    const uint8_t secret[ZCCL_SECRET_BYTES] = {1};
    std::atomic<int> client_done{0};
    std::thread client([&] {
        int fd = -1;
        /* Ends when the test's listener closes the accepted connection (the handshake then fails), or at the
         * deadline; either way this thread's own result does not matter, the listener's does. */
        if (zccl__connect_auth(&addr, secret, nullptr, 0, zccl__now_ns() + 5000000000ull, &fd) == ZCCL_SUCCESS)
            close(fd);
        client_done.store(1);
    });
    usleep(300000);
    zccl_sockaddr_t l = addr;
    int lfd = -1;
    zccl_result_t res = zccl__listen_busy(&l, &lfd, 1000); /* as rank 0 binds MASTER_PORT (comm_init.c) */
    if (res != ZCCL_SUCCESS) {
        fprintf(stderr, "listen on 127.0.0.1:%d failed: %s\n", kPort, zccl__last_error());
        client.join();
        return 2;
    }
    struct pollfd p = {lfd, POLLIN, 0};
    if (poll(&p, 1, 3000) != 1) {
        fprintf(stderr, "the client never connected to the listener\n");
        client.join();
        return 3;
    }
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    int cfd = accept(lfd, (struct sockaddr *)&peer, &plen);
    if (cfd < 0) {
        fprintf(stderr, "accept: %s\n", strerror(errno));
        client.join();
        return 4;
    }
    int peer_port = ntohs(peer.sin_port);
    close(cfd);
    close(lfd);
    client.join();
    if (peer_port != kPort + 1) {
        fprintf(stderr, "client's source port %d, expected %d\n", peer_port, kPort + 1);
        return 5;
    }
    return 0;
}

TEST(BootstrapPort, SelfConnectIsDroppedAndTheListenerGetsThePort) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        alarm(30); /* the deadline: a hung child dies of SIGALRM */
        _exit(child_body());
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st)) << "child killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (WEXITSTATUS(st) == kSkip) GTEST_SKIP() << "cannot make a network namespace with its own port range (needs root)";
    EXPECT_EQ(WEXITSTATUS(st), 0) << "(2: the port stayed taken; 3: no connection; 5: wrong source port)";
}

TEST(BootstrapPort, LauncherPortIsOutsideTheEphemeralRange) {
#ifndef ZCCL_TEST_HAVE_LAUNCH
    GTEST_SKIP() << "built without the tools (ZCCL_BUILD_TOOLS=OFF)";
#else
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) { lo = 32768; hi = 60999; }
        fclose(f);
    }
    if (lo < 11000 && hi > 64535) GTEST_SKIP() << "ip_local_port_range " << lo << "-" << hi << " leaves no room";
    for (int i = 0; i < 50; i++) {
        int port = zl_free_port("127.0.0.1", "test");
        ASSERT_GT(port, 0);
        EXPECT_TRUE(port < lo || port > hi) << "port " << port << " inside " << lo << "-" << hi;
        /* and it is free: bind it */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        EXPECT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0) << "port " << port << ": " << strerror(errno);
        close(fd);
    }
#endif
}

}  // namespace

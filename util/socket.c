/* socket.c — address selection, listening, the authenticated handshake and the accept loop (see socket.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/time.h>
#include <unistd.h>
#include "socket.h"

#define HELLO_MAGIC "ZCCLHELO"
#define PROTO_VERSION ZCCL_PROTO_VERSION
#define NONCE_BYTES ZCCL_NONCE_BYTES
#define MAC_BYTES ZCCL_MAC_BYTES
#define HELLO_BYTES ZCCL_HELLO_BYTES
#define CHAL_BYTES ZCCL_CHAL_BYTES
_Static_assert(HELLO_BYTES == 28 && CHAL_BYTES == 48, "handshake message sizes are part of the protocol");

const char *zccl__sockaddr_str(const zccl_sockaddr_t *a, char *buf, size_t len) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (a->sa.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&a->sa;
        inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
        port = ntohs(s->sin_port);
        snprintf(buf, len, "%s:%d", host, port);
    } else if (a->sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&a->sa;
        inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
        port = ntohs(s->sin6_port);
        snprintf(buf, len, "[%s]:%d", host, port);
    } else {
        snprintf(buf, len, "(family %d)", a->sa.ss_family);
    }
    return buf;
}

void zccl__sock_tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* ---- ZCCL_SOCKET_IFNAME, NCCL's grammar ---------------------------------------------------------------------- */

bool zccl__ifname_match(const char *spec, const char *name) {
    bool exclude = false, exact = false;
    if (*spec == '^') exclude = true, spec++;
    if (*spec == '=') exact = true, spec++;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    bool hit = false;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && !hit; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':'); /* NCCL allows "eth0:port"; the port part is ignored here */
        if (colon) *colon = 0;
        hit = exact ? !strcmp(tok, name) : !strncmp(tok, name, strlen(tok));
    }
    return exclude ? !hit : hit;
}

static socklen_t family_len(int family) {
    return family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

zccl_result_t zccl__pick_local_addr(const zccl_sockaddr_t *toward, zccl_sockaddr_t *out) {
    const char *spec = zccl__cfg_str(ZCCL_CFG_SOCKET_IFNAME);
    if (!*spec && toward) {
        /* Ask the kernel which source address it would use to reach the root: that interface can reach it. */
        int s = socket(toward->sa.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s >= 0) {
            zccl_sockaddr_t probe = *toward;
            if (probe.sa.ss_family == AF_INET && ((struct sockaddr_in *)&probe.sa)->sin_port == 0)
                ((struct sockaddr_in *)&probe.sa)->sin_port = htons(9);
            if (connect(s, (struct sockaddr *)&probe.sa, probe.len) == 0) {
                out->len = sizeof out->sa;
                if (getsockname(s, (struct sockaddr *)&out->sa, &out->len) == 0) {
                    close(s);
                    return ZCCL_SUCCESS;
                }
            }
            close(s);
        }
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return zccl__syserror(errno, "getifaddrs failed while choosing a socket interface");
    char tried[512] = "";
    size_t tl = 0;
    const struct ifaddrs *pick = NULL, *loopback = NULL;
    for (int pass = 0; pass < 2 && !pick; pass++) { /* pass 0: IPv4 only; pass 1: IPv6 too */
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
            int fam = i->ifa_addr->sa_family;
            if (fam != AF_INET && !(pass == 1 && fam == AF_INET6)) continue;
            if (pass == 0 && tl < sizeof tried - 40)
                tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%s", tl ? ", " : "", i->ifa_name);
            if (*spec) {
                if (zccl__ifname_match(spec, i->ifa_name)) { pick = i; break; }
                continue;
            }
            if (i->ifa_flags & IFF_LOOPBACK) { if (!loopback) loopback = i; continue; }
            if (!strncmp(i->ifa_name, "docker", 6)) continue;
            pick = i;
            break;
        }
    }
    if (!pick && !*spec) pick = loopback;
    if (!pick) {
        freeifaddrs(ifs);
        const char *var = zccl__cfg_source(ZCCL_CFG_SOCKET_IFNAME); /* the name the user set: ZCCL_* or NCCL_* */
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=%s matches no up interface with an address; tried: %s",
                           var ? var : "ZCCL_SOCKET_IFNAME", spec, tried[0] ? tried : "(none)");
    }
    memset(out, 0, sizeof *out);
    out->len = family_len(pick->ifa_addr->sa_family);
    memcpy(&out->sa, pick->ifa_addr, out->len);
    freeifaddrs(ifs);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__resolve(const char *host, int port, zccl_sockaddr_t *out) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0 || !res)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "cannot resolve host \"%s\": %s", host, gai_strerror(rc));
    /* Prefer IPv4 when a name has both, as most launchers hand out IPv4 addresses. */
    const struct addrinfo *p = res;
    for (const struct addrinfo *q = res; q; q = q->ai_next)
        if (q->ai_family == AF_INET) { p = q; break; }
    memset(out, 0, sizeof *out);
    memcpy(&out->sa, p->ai_addr, p->ai_addrlen);
    out->len = p->ai_addrlen;
    freeaddrinfo(res);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__listen(zccl_sockaddr_t *addr, int *fd_out) {
    char as[80];
    int fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return zccl__syserror(errno, "socket() for listening on %s", zccl__sockaddr_str(addr, as, sizeof as));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&addr->sa, addr->len) != 0) {
        int e = errno;
        close(fd);
        zccl_result_t r = zccl__syserror(e, "cannot bind %s (port in use, or address not local?)",
                                         zccl__sockaddr_str(addr, as, sizeof as));
        errno = e; /* callers may retry on EADDRINUSE */
        return r;
    }
    if (listen(fd, 16384) != 0) {
        int e = errno;
        close(fd);
        return zccl__syserror(e, "listen on %s", zccl__sockaddr_str(addr, as, sizeof as));
    }
    addr->len = sizeof addr->sa;
    getsockname(fd, (struct sockaddr *)&addr->sa, &addr->len);
    *fd_out = fd;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__listen_busy(zccl_sockaddr_t *addr, int *fd_out, int busy_ms) {
    const zccl_sockaddr_t want = *addr;
    zccl_result_t res = zccl__listen(addr, fd_out);
    for (int waited = 0; res != ZCCL_SUCCESS && errno == EADDRINUSE && waited < busy_ms; waited += 50) {
        usleep(50000);
        *addr = want;
        res = zccl__listen(addr, fd_out);
    }
    return res;
}

/* ---- blocking I/O with deadlines ----------------------------------------------------------------------------- */

static int ms_left(uint64_t deadline_ns) {
    if (!deadline_ns) return 1000;
    uint64_t now = zccl__now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 1000 ? 1000 : (int)ms;
}

static zccl_result_t io_all(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *what, bool is_send) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = is_send ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, (char *)buf + done, len - done, MSG_DONTWAIT);
        if (n > 0) { done += (size_t)n; continue; }
        if (n == 0 && !is_send)
            return zccl__error(ZCCL_REMOTE_ERROR, "%s: connection closed by the peer after %zu of %zu bytes", what,
                               done, len);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            int e = errno;
            if (e == ECONNRESET || e == EPIPE)
                return zccl__error(ZCCL_REMOTE_ERROR, "%s: connection reset by the peer", what);
            return zccl__syserror(e, "%s", what);
        }
        int ms = ms_left(deadline_ns);
        if (ms == 0) return zccl__error(ZCCL_TIMEOUT, "%s: timed out after %zu of %zu bytes", what, done, len);
        struct pollfd p = {fd, (short)(is_send ? POLLOUT : POLLIN), 0};
        poll(&p, 1, ms);
    }
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns, const char *what) {
    return io_all(fd, (void *)buf, len, deadline_ns, what, true);
}
zccl_result_t zccl__recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *what) {
    return io_all(fd, buf, len, deadline_ns, what, false);
}

/* ---- the proof --------------------------------------------------------------------------------------------- */

static void make_mac(const uint8_t secret[ZCCL_SECRET_BYTES], char role, const uint8_t *n1, const uint8_t *n2,
                     uint8_t mac[MAC_BYTES]) {
    uint8_t msg[1 + 2 * NONCE_BYTES];
    msg[0] = (uint8_t)role;
    memcpy(msg + 1, n1, NONCE_BYTES);
    memcpy(msg + 1 + NONCE_BYTES, n2, NONCE_BYTES);
    unsigned int len = MAC_BYTES;
    HMAC(EVP_sha256(), secret, ZCCL_SECRET_BYTES, msg, sizeof msg, mac, &len);
}

static bool mac_equal(const uint8_t *a, const uint8_t *b) {
    uint8_t d = 0; /* constant time: do not leak how many bytes matched */
    for (int i = 0; i < MAC_BYTES; i++) d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

static void fill_random(uint8_t *p, size_t n) {
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r > 0) p += r, n -= (size_t)r;
    }
}

static void set_why(const char **why, const char *text) {
    if (why) *why = text;
}

void zccl__hello_encode(const uint8_t nonce_c[NONCE_BYTES], uint8_t out[HELLO_BYTES]) {
    memcpy(out, HELLO_MAGIC, 8);
    uint32_t v = htonl(PROTO_VERSION);
    memcpy(out + 8, &v, 4);
    memcpy(out + 12, nonce_c, NONCE_BYTES);
}

zccl_result_t zccl__hello_decode(const uint8_t *buf, size_t len, uint8_t nonce_c[NONCE_BYTES], const char **why) {
    if (!buf || len != HELLO_BYTES) {
        set_why(why, "not a zccl hello (wrong length)");
        return ZCCL_INVALID_ARGUMENT;
    }
    if (memcmp(buf, HELLO_MAGIC, 8) != 0) {
        set_why(why, "not a zccl hello (bad magic)");
        return ZCCL_INVALID_ARGUMENT;
    }
    uint32_t v;
    memcpy(&v, buf + 8, 4);
    if (ntohl(v) != PROTO_VERSION) {
        set_why(why, "zccl hello of another protocol version (a different zccl release?)");
        return ZCCL_INVALID_ARGUMENT;
    }
    memcpy(nonce_c, buf + 12, NONCE_BYTES);
    return ZCCL_SUCCESS;
}

void zccl__chal_encode(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_c[NONCE_BYTES],
                       const uint8_t nonce_s[NONCE_BYTES], uint8_t out[CHAL_BYTES]) {
    memcpy(out, nonce_s, NONCE_BYTES);
    make_mac(secret, 'S', nonce_c, nonce_s, out + NONCE_BYTES);
}

zccl_result_t zccl__chal_check(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_c[NONCE_BYTES],
                               const uint8_t *chal, size_t len, uint8_t nonce_s[NONCE_BYTES], const char **why) {
    if (!chal || len != CHAL_BYTES) {
        set_why(why, "challenge of the wrong length");
        return ZCCL_INVALID_ARGUMENT;
    }
    uint8_t mac[MAC_BYTES];
    make_mac(secret, 'S', nonce_c, chal, mac);
    if (!mac_equal(mac, chal + NONCE_BYTES)) {
        set_why(why, "the server's challenge does not prove this job's secret");
        return ZCCL_INVALID_ARGUMENT;
    }
    memcpy(nonce_s, chal, NONCE_BYTES);
    return ZCCL_SUCCESS;
}

void zccl__proof_encode(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_s[NONCE_BYTES],
                        const uint8_t nonce_c[NONCE_BYTES], uint8_t out[MAC_BYTES]) {
    make_mac(secret, 'C', nonce_s, nonce_c, out);
}

bool zccl__proof_check(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_s[NONCE_BYTES],
                       const uint8_t nonce_c[NONCE_BYTES], const uint8_t *proof, size_t len) {
    if (!proof || len != MAC_BYTES) return false;
    uint8_t mac[MAC_BYTES];
    make_mac(secret, 'C', nonce_s, nonce_c, mac);
    return mac_equal(mac, proof);
}

zccl_result_t zccl__sockaddr_check(const zccl_sockaddr_t *a, const char **why) {
    const int fam = a->sa.ss_family;
    if (fam != AF_INET && fam != AF_INET6) {
        set_why(why, "address of an unknown family (neither IPv4 nor IPv6)");
        return ZCCL_INVALID_ARGUMENT;
    }
    const bool v4 = (fam == AF_INET);
    if (a->len != (v4 ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6))) {
        set_why(why, v4 ? "IPv4 address with a wrong length" : "IPv6 address with a wrong length");
        return ZCCL_INVALID_ARGUMENT;
    }
    const in_port_t port = v4 ? ((const struct sockaddr_in *)&a->sa)->sin_port
                              : ((const struct sockaddr_in6 *)&a->sa)->sin6_port;
    if (port == 0) {
        set_why(why, "address with port 0");
        return ZCCL_INVALID_ARGUMENT;
    }
    return ZCCL_SUCCESS;
}

/* True when fd's local and peer addresses are the same (a socket connected to itself). */
static bool self_connected(int fd) {
    struct sockaddr_storage l, p;
    socklen_t ll = sizeof l, pl = sizeof p;
    if (getsockname(fd, (struct sockaddr *)&l, &ll) != 0 || getpeername(fd, (struct sockaddr *)&p, &pl) != 0)
        return false;
    return ll == pl && memcmp(&l, &p, ll) == 0;
}

static __thread uint64_t connect_until;
void zccl__connect_until(uint64_t until_ns) { connect_until = until_ns; }

zccl_result_t zccl__connect_auth(const zccl_sockaddr_t *addr, const uint8_t secret[ZCCL_SECRET_BYTES],
                                 const void *hdr, size_t hdr_bytes, uint64_t deadline_ns, int *fd_out) {
    char as[80];
    zccl__sockaddr_str(addr, as, sizeof as);
    if (hdr_bytes > ZCCL_MAX_HDR_BYTES || (hdr_bytes && !hdr))
        return zccl__error(ZCCL_INTERNAL_ERROR, "connect to %s: header of %zu bytes (at most %d)", as, hdr_bytes,
                           ZCCL_MAX_HDR_BYTES);
    int fd = -1;
    uint64_t backoff_us = 1000;
    for (;;) {
        fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return zccl__syserror(errno, "socket() to connect to %s", as);
        int e;
        /* A SYN that gets no answer at all (the peer's link or interface down, a firewall that drops) would block a
         * plain connect() for the kernel's SYN retries, about 2 minutes, past any deadline: the send timeout bounds
         * it (Linux applies SO_SNDTIMEO to connect; it then fails with EINPROGRESS). */
        const uint64_t until = connect_until && (!deadline_ns || connect_until < deadline_ns) ? connect_until : deadline_ns;
        if (until) {
            const uint64_t now = zccl__now_ns();
            uint64_t left_us = until > now ? (until - now) / 1000 : 0;
            if (left_us < 1000) left_us = 1000;
            struct timeval tv = {(time_t)(left_us / 1000000), (suseconds_t)(left_us % 1000000)};
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        }
        if (connect(fd, (const struct sockaddr *)&addr->sa, addr->len) == 0) {
            if (until) { /* later writes have their own deadlines (zccl__send_all polls) */
                struct timeval none = {0, 0};
                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
            }
            if (!self_connected(fd)) break;
            /* TCP's simultaneous open on loopback: nobody listens on the port and the kernel gave this socket that
             * very port as its source, so it is connected to itself and holds the port the listener is about to
             * bind. Drop it and try again, as if refused. */
            struct linger lg = {1, 0}; /* close with a reset: no FIN exchange or TIME_WAIT keeps the port */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            e = ECONNREFUSED;
        } else {
            e = errno == EINPROGRESS ? ETIMEDOUT : errno; /* the SO_SNDTIMEO above ran out */
        }
        close(fd);
        if (e != ECONNREFUSED && e != ETIMEDOUT && e != EAGAIN && e != EINTR && e != ENETUNREACH)
            return zccl__syserror(e, "connect to %s", as);
        if (connect_until && connect_until < deadline_ns && zccl__now_ns() + backoff_us * 1000 > connect_until) {
            char m[200]; /* the caller retries after a look around: no WARN line per attempt */
            snprintf(m, sizeof m, "connect to %s: nobody accepted yet (last error: %s)", as, strerror(e));
            zccl__set_last_error(m);
            return ZCCL_TIMEOUT;
        }
        if (deadline_ns && zccl__now_ns() + backoff_us * 1000 > deadline_ns)
            return zccl__error(ZCCL_TIMEOUT, "connect to %s: nobody accepted before the deadline (last error: %s)", as,
                               strerror(e));
        usleep((useconds_t)backoff_us);
        if (backoff_us < 100000) backoff_us *= 2;
    }
    zccl__sock_tune(fd);
    uint8_t hello[HELLO_BYTES], chal[CHAL_BYTES], nonce_c[NONCE_BYTES], nonce_s[NONCE_BYTES];
    fill_random(nonce_c, NONCE_BYTES);
    zccl__hello_encode(nonce_c, hello);
    zccl_result_t res;
    char what[128];
    snprintf(what, sizeof what, "handshake with %s", as);
    ZCCL_CHECK_GOTO(zccl__send_all(fd, hello, sizeof hello, deadline_ns, what), res, fail);
    ZCCL_CHECK_GOTO(zccl__recv_all(fd, chal, sizeof chal, deadline_ns, what), res, fail);
    if (zccl__chal_check(secret, nonce_c, chal, sizeof chal, nonce_s, NULL) != ZCCL_SUCCESS) {
        res = zccl__error(ZCCL_REMOTE_ERROR, "%s: the server does not hold this job's secret (wrong unique id or "
                          "ZCCL_SECRET, or another job on that port)", what);
        goto fail;
    }
    uint8_t proof[MAC_BYTES + ZCCL_MAX_HDR_BYTES];
    zccl__proof_encode(secret, nonce_s, nonce_c, proof);
    if (hdr_bytes) memcpy(proof + MAC_BYTES, hdr, hdr_bytes);
    ZCCL_CHECK_GOTO(zccl__send_all(fd, proof, MAC_BYTES + hdr_bytes, deadline_ns, what), res, fail);
    *fd_out = fd;
    return ZCCL_SUCCESS;
fail:
    close(fd);
    return res;
}

/* ---- accept loop ------------------------------------------------------------------------------------------- */

typedef struct {
    int fd;
    int state;          /* 0: reading HELLO, 1: reading PROOF+header */
    size_t got;
    uint64_t deadline;
    uint8_t nonce_s[NONCE_BYTES], nonce_c[NONCE_BYTES];
    uint8_t buf[MAC_BYTES + ZCCL_MAX_HDR_BYTES];
    char peer[80];
} pending_t;

#define MAX_PENDING 256

static void drop(pending_t *p, const char *why) {
    ZCCL_WARN(ZCCL_LOG_BOOT, "rejected connection from %s: %s", p->peer, why);
    close(p->fd);
    p->fd = -1;
}

zccl_result_t zccl__accept_loop(int listen_fd, int stop_fd, const uint8_t secret[ZCCL_SECRET_BYTES],
                                size_t hdr_bytes, zccl_on_conn_fn on_conn, void *ctx, uint64_t deadline_ns,
                                int *ready) {
    if (hdr_bytes > ZCCL_MAX_HDR_BYTES) return zccl__error(ZCCL_INTERNAL_ERROR, "header of %zu bytes", hdr_bytes);
    pending_t *pend = calloc(MAX_PENDING, sizeof *pend);
    struct pollfd *pfd = calloc(MAX_PENDING + 2, sizeof *pfd);
    if (ready) __atomic_store_n(ready, 1, __ATOMIC_RELEASE);
    if (!pend || !pfd) {
        free(pend);
        free(pfd);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the accept loop");
    }
    for (int i = 0; i < MAX_PENDING; i++) pend[i].fd = -1;
    zccl_result_t res = ZCCL_SUCCESS;
    for (;;) {
        int np = 0;
        pfd[np++] = (struct pollfd){listen_fd, POLLIN, 0};
        if (stop_fd >= 0) pfd[np++] = (struct pollfd){stop_fd, POLLIN, 0};
        int map[MAX_PENDING];
        for (int i = 0; i < MAX_PENDING; i++)
            if (pend[i].fd >= 0) map[np - 1 - (stop_fd >= 0)] = i, pfd[np++] = (struct pollfd){pend[i].fd, POLLIN, 0};
        int timeout = 200;
        if (deadline_ns) {
            int left = ms_left(deadline_ns);
            if (left == 0) { res = zccl__error(ZCCL_TIMEOUT, "bootstrap: not every rank connected before the deadline (ZCCL_INIT_TIMEOUT_MS)"); break; }
            timeout = left < timeout ? left : timeout;
        }
        int n = poll(pfd, (nfds_t)np, timeout);
        if (n < 0 && errno != EINTR) { res = zccl__syserror(errno, "poll in the accept loop"); break; }
        if (stop_fd >= 0 && (pfd[1].revents & POLLIN)) break;
        uint64_t now = zccl__now_ns();
        /* Expire handshakes that take too long: a silent client must not hold a slot forever. */
        for (int i = 0; i < MAX_PENDING; i++)
            if (pend[i].fd >= 0 && now > pend[i].deadline) drop(&pend[i], "handshake not completed in time");
        int first = 1 + (stop_fd >= 0);
        bool stop = false;
        for (int k = first; k < np && !stop; k++) {
            if (!pfd[k].revents) continue;
            pending_t *p = &pend[map[k - first]];
            if (p->fd < 0) continue;
            size_t want = p->state == 0 ? HELLO_BYTES : MAC_BYTES + hdr_bytes;
            ssize_t r = recv(p->fd, p->buf + p->got, want - p->got, MSG_DONTWAIT);
            if (r == 0) { drop(p, "closed during handshake"); continue; }
            if (r < 0) { if (errno != EAGAIN && errno != EINTR) drop(p, strerror(errno)); continue; }
            p->got += (size_t)r;
            if (p->got < want) continue;
            if (p->state == 0) {
                const char *why = NULL;
                if (zccl__hello_decode(p->buf, p->got, p->nonce_c, &why) != ZCCL_SUCCESS) {
                    drop(p, why);
                    continue;
                }
                uint8_t chal[CHAL_BYTES];
                fill_random(p->nonce_s, NONCE_BYTES);
                zccl__chal_encode(secret, p->nonce_c, p->nonce_s, chal);
                /* 48 bytes always fit in a fresh socket's send buffer, so this does not block. */
                if (send(p->fd, chal, sizeof chal, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof chal) {
                    drop(p, "could not send the challenge");
                    continue;
                }
                p->state = 1;
                p->got = 0;
            } else {
                /* The proof first: nothing of the header is looked at before the client proved the secret. */
                if (!zccl__proof_check(secret, p->nonce_s, p->nonce_c, p->buf, MAC_BYTES)) {
                    drop(p, "wrong secret (proof does not match)");
                    continue;
                }
                int fd = p->fd;
                p->fd = -1;
                if (on_conn(ctx, fd, p->buf + MAC_BYTES, p->got - MAC_BYTES)) stop = true;
            }
        }
        if (stop) break;
        if (pfd[0].revents & POLLIN) {
            for (int burst = 0; burst < 64; burst++) {
                struct sockaddr_storage ss;
                socklen_t sl = sizeof ss;
                int fd = accept4(listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) break;
                int slot = -1;
                for (int i = 0; i < MAX_PENDING; i++)
                    if (pend[i].fd < 0) { slot = i; break; }
                zccl_sockaddr_t a = {ss, sl};
                if (slot < 0) {
                    /* Full: the oldest handshake makes room; a flood cannot block real ranks for long. */
                    slot = 0;
                    for (int i = 1; i < MAX_PENDING; i++)
                        if (pend[i].deadline < pend[slot].deadline) slot = i;
                    drop(&pend[slot], "too many handshakes in progress");
                }
                pending_t *p = &pend[slot];
                memset(p, 0, sizeof *p);
                p->fd = fd;
                p->deadline = zccl__now_ns() + (uint64_t)ZCCL_HANDSHAKE_MS * 1000000ull;
                zccl__sockaddr_str(&a, p->peer, sizeof p->peer);
                zccl__sock_tune(fd);
            }
        }
    }
    for (int i = 0; i < MAX_PENDING; i++)
        if (pend[i].fd >= 0) close(pend[i].fd);
    free(pend);
    free(pfd);
    return res;
}

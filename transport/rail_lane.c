/*
 * rail_lane.c — the lanes of a striped TCP pair (rail.h): striping a transfer over them, the replay ring and its
 * acknowledgements, and moving a lane to another rail when its rail dies.
 *
 * Send side of lane k (this rank -> peer): bytes of each transfer's part k are copied into the lane's ring
 * (LANE_RING bytes) and written from there; positions are counted from the lane's first byte: head (copied in),
 * sent (written to the current connection), acked (the receiver said it consumed them). The ring keeps [acked, head).
 * A transfer is complete once all its parts are in the rings and written to their connections (handed to the
 * kernel, as on the single-socket path), so the caller's buffer may be reused while the bytes can still be sent
 * again. The rank's waits (check_peer, about every 50 ms while it sleeps) keep reading every lane's
 * acknowledgements, so a rail that dies after a transfer completed is noticed and its bytes replayed even when no
 * transfer with that peer is in progress.
 * Receive side of lane k (peer -> this rank): bytes are consumed in stream order into the destination (or staged
 * and reduced, on element boundaries); rpos counts them. The receiver acknowledges rpos (8 bytes, little-endian, on
 * the same connection) each time LANE_RING/4 more bytes were consumed, so small messages cost no acknowledgement.
 * Moving a lane: the sender connects on the next live rail with the resume flag; the receiver adopts the new
 * connection and writes its rpos first; the sender rewinds `sent` to it and goes on. A receiver whose connection
 * failed waits (up to ZCCL_SOCKET_USER_TIMEOUT_MS) for that move instead of failing the call.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_snd_wnd (glibc's lacks it) */
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include "rail.h"

#define LANE_RING (1u << 20)
#define LANE_IO (1u << 20)

typedef struct zccl_lane {
    /* send side */
    int sfd;
    uint8_t *ring;
    uint64_t head, sent, acked;
    uint8_t abuf[8];
    int afill;
    bool resuming;     /* connected after a move: wait for the receiver's position before writing */
    bool connected;    /* has connected once (a later connection is a move) */
    bool peer_eof;     /* the receiver closed the connection after taking everything written (it left) */
    size_t part_done;  /* bytes of the current transfer's part accepted into the ring */
    uint64_t part_end; /* the stream position where that part ends, once all of it is in the ring */
    int stall_fd;      /* the connection stall_ns refers to (stalled_rail) */
    uint64_t stall_ns; /* when the kernel was first seen holding bytes of it without an acknowledgement since */
    /* receive side */
    int rfd;
    uint64_t rpos, racked;
    uint8_t aout[8];
    int aout_len, aout_done;
    size_t rpart_done;
    uint8_t *stage;
    size_t fill;
    bool broken;       /* the connection failed: waiting for the sender to move the lane */
    bool closed;       /* ... by an end of stream or reset on a healthy interface: most likely the peer left */
    uint64_t broken_ns;
    uint32_t resume_seen; /* lane 0 of a peer only: r->resume_pending[peer] last looked at */
} zccl_lane_t;

static zccl_lane_t *lanes_of(zccl_rails_t *r, int peer) { return &r->lanes[(size_t)peer * ZCCL_TCP_SOCKS_MAX]; }

zccl_result_t zccl__lanes_init(zccl_rails_t *r) {
    r->lanes = calloc((size_t)r->nranks * ZCCL_TCP_SOCKS_MAX, sizeof *r->lanes);
    if (!r->lanes) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for TCP lanes of %d ranks", r->nranks);
    for (size_t i = 0; i < (size_t)r->nranks * ZCCL_TCP_SOCKS_MAX; i++) r->lanes[i].sfd = r->lanes[i].rfd = -1;
    return ZCCL_SUCCESS;
}

void zccl__lanes_poison(zccl_rails_t *r) {
    for (size_t i = 0; r->lanes && i < (size_t)r->nranks * ZCCL_TCP_SOCKS_MAX; i++) {
        if (r->lanes[i].sfd >= 0) shutdown(r->lanes[i].sfd, SHUT_RDWR);
        if (r->lanes[i].rfd >= 0) shutdown(r->lanes[i].rfd, SHUT_RDWR);
    }
}

void zccl__lanes_free(zccl_rails_t *r) {
    /* What each lane index carried to all peers (the bytes written into its stream): which channels the transfers
     * were split over (ZCCL_TCP_STRIPE_MIN_BYTES, ZCCL_MIN/MAX_NCHANNELS); tests read this line. */
    uint64_t sent[ZCCL_TCP_SOCKS_MAX] = {0};
    int used = 0;
    for (int p = 0; r->lanes && p < r->nranks; p++)
        for (int k = 0; k < r->nsock[p]; k++) {
            sent[k] += lanes_of(r, p)[k].head;
            used = ZCCL_MAX(used, k + 1);
        }
    if (used > 1) {
        char line[ZCCL_TCP_SOCKS_MAX * 32];
        size_t o = 0;
        for (int k = 0; k < used && o < sizeof line; k++)
            o += (size_t)snprintf(line + o, sizeof line - o, "%slane %d %llu B", k ? ", " : "", k,
                                  (unsigned long long)sent[k]);
        ZCCL_INFO(ZCCL_LOG_TCP, "rank %d: TCP bytes sent per lane: %s", r->tc->rank, line);
    }
    for (size_t i = 0; r->lanes && i < (size_t)r->nranks * ZCCL_TCP_SOCKS_MAX; i++) {
        zccl_lane_t *l = &r->lanes[i];
        if (l->sfd >= 0) close(l->sfd);
        if (l->rfd >= 0) close(l->rfd);
        free(l->ring);
        free(l->stage);
    }
    free(r->lanes);
    r->lanes = NULL;
}

/* Keepalive and TCP_USER_TIMEOUT = ZCCL_SOCKET_USER_TIMEOUT_MS, as every TCP data connection (the kernel also
 * aborts a connection whose peer advertises a zero window that long, so a short value would take a receiver busy
 * elsewhere for a dead rail). A dead rail is found sooner by stalled_rail(). */
static void lane_sockopts(const zccl_rails_t *r, int fd) {
    if (r->keep_timeout_ms <= 0) return;
    const int one = 1, idle = (int)ZCCL_MAX(1, r->keep_timeout_ms / 3000), intvl = (int)ZCCL_MAX(1, r->keep_timeout_ms / 6000);
    const int cnt = 10;
    const unsigned ut = (unsigned)ZCCL_MIN(r->keep_timeout_ms, (int64_t)UINT32_MAX);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
}

/* Parts of x (1: whole on lane 0) and where part k lies: 64-byte units, the same on both sides (every input is
 * one of the settings every rank shares, or the pair's lane count, which both sides computed alike). Channels: a
 * transfer of at least ZCCL_TCP_STRIPE_MIN_BYTES uses every lane of the pair, a smaller one lane 0 only;
 * ZCCL_MAX_NCHANNELS caps and ZCCL_MIN_NCHANNELS raises that count (within the pair's lanes), and a part is never
 * smaller than 64 bytes. */
static int parts_of(const zccl_rails_t *r, const zccl_xfer_t *x) {
    const int lanes = r->nsock[x->peer];
    int s = x->bytes >= r->stripe_min ? lanes : 1;
    if (r->min_ch > s) s = ZCCL_MIN(r->min_ch, lanes);
    if (r->max_ch > 0 && s > r->max_ch) s = r->max_ch;
    return s > 1 && x->bytes >= (size_t)s * ZCCL_STRIPE_UNIT ? s : 1;
}
static void part_range(const zccl_xfer_t *x, int k, int parts, size_t *lo, size_t *hi) {
    const size_t units = x->bytes / ZCCL_STRIPE_UNIT;
    *lo = (size_t)k * units / (size_t)parts * ZCCL_STRIPE_UNIT;
    *hi = k + 1 == parts ? x->bytes : (size_t)(k + 1) * units / (size_t)parts * ZCCL_STRIPE_UNIT;
}

static bool rail_error(int err) {
    return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == ENETDOWN || err == EADDRNOTAVAIL;
}

static const zccl_rail_addr_t *my_rail(const zccl_rails_t *r, int peer, int c) {
    return &r->tc->peers[r->tc->rank].tcp.rail[r->cmine[(size_t)peer * ZCCL_RAIL_MAX + (size_t)c]];
}

/* Why lane k's rail to peer failed with err, or false if it is not the rail's fault (the peer closed). */
static bool rail_failed(const zccl_rails_t *r, int peer, int c, int err, bool eof, char *why, size_t len) {
    if (!zccl__rail_healthy(my_rail(r, peer, c), why, len)) return true;
    if (eof || !rail_error(err)) return false;
    if (err == ETIMEDOUT)
        snprintf(why, len, "nothing acknowledged for ZCCL_RAIL_TIMEOUT_MS=%lld ms: the link or the peer's interface is "
                 "down", (long long)r->rail_timeout_ms);
    else
        snprintf(why, len, "%s", strerror(err));
    return true;
}

static zccl_result_t peer_closed(const zccl_rails_t *r, int peer, bool sending, int err) {
    if (err && err != ECONNRESET && err != EPIPE)
        return zccl__syserror(err, "rank %d: %s rank %d over TCP", r->tc->rank, sending ? "send to" : "receive from", peer);
    return zccl__error(ZCCL_REMOTE_ERROR, "rank %d closed its connection while rank %d was %s it (it exited, "
                       "aborted, or gave up after an error of its own)", peer, r->tc->rank,
                       sending ? "sending to" : "receiving from");
}

/* Rail c to peer is dead: mark it, say so once, and move every send lane of the pair on it to a live rail. */
static zccl_result_t rail_dead(zccl_rails_t *r, int peer, int c, const char *why) {
    zccl_tp_comm_t *tc = r->tc;
    const size_t cb = (size_t)peer * ZCCL_RAIL_MAX;
    const int nc = r->ncommon[peer];
    char dead[64];
    zccl__rails_name(r, peer, c, dead, sizeof dead);
    if (!r->cdead[cb + (size_t)c]) {
        r->cdead[cb + (size_t)c] = 1;
        int live = 0;
        for (int i = 0; i < nc; i++) live += !r->cdead[cb + (size_t)i];
        char lv[160] = "";
        size_t l = 0;
        for (int i = 0; i < nc && l < sizeof lv; i++)
            if (!r->cdead[cb + (size_t)i]) l += (size_t)snprintf(lv + l, sizeof lv - l, "%s%s", l ? ", " : "", my_rail(r, peer, i)->ifname);
        if (live)
            ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: TCP rail %s to rank %d lost (%s); its lanes move on; live rails to rank %d: "
                      "%s", tc->rank, dead, peer, why, peer, lv);
    }
    int live = 0;
    for (int i = 0; i < nc; i++) live += !r->cdead[cb + (size_t)i];
    if (!live) {
        char all[256] = "";
        size_t l = 0;
        for (int i = 0; i < nc && l < sizeof all; i++) {
            char nm[64];
            l += (size_t)snprintf(all + l, sizeof all - l, "%s%s", i ? ", " : "", zccl__rails_name(r, peer, i, nm, sizeof nm));
        }
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d lost every TCP rail to rank %d (%s; the last, %s: %s)", tc->rank,
                           peer, all, dead, why);
    }
    zccl_lane_t *L = lanes_of(r, peer);
    for (int k = 0; k < r->nsock[peer]; k++) {
        int8_t *lr = &r->send_rail[(size_t)peer * ZCCL_TCP_SOCKS_MAX + (size_t)k];
        if (*lr != c || L[k].sfd < 0) {
            if (*lr == c) { /* not connected yet: it will connect on a live rail */
                for (int i = 1; i <= nc; i++)
                    if (!r->cdead[cb + (size_t)((c + i) % nc)]) { *lr = (int8_t)((c + i) % nc); break; }
            }
            continue;
        }
        const int old = L[k].sfd; /* closed once the lane has its new connection: the receiver, which may still see
                                     this one end, then finds the move waiting (recv_failed) */
        L[k].sfd = -1;
        for (;;) {
            int next = -1;
            for (int i = 1; i <= nc && next < 0; i++)
                if (!r->cdead[cb + (size_t)((c + i) % nc)]) next = (c + i) % nc;
            if (next < 0) {
                char all[256] = "";
                size_t l = 0;
                for (int i = 0; i < nc && l < sizeof all; i++) {
                    char nm[64];
                    l += (size_t)snprintf(all + l, sizeof all - l, "%s%s", i ? ", " : "", zccl__rails_name(r, peer, i, nm, sizeof nm));
                }
                close(old);
                return zccl__error(ZCCL_REMOTE_ERROR, "rank %d lost every TCP rail to rank %d (%s; the last, %s: %s)",
                                   tc->rank, peer, all, dead, why);
            }
            int fd = -1;
            const uint64_t deadline = zccl__now_ns() + (uint64_t)r->rail_timeout_ms * 1000000ull;
            zccl_result_t res = zccl__rails_connect(r, peer, k, next, true, deadline, &fd);
            if (res == ZCCL_SUCCESS) {
                lane_sockopts(r, fd);
                close(old);
                *lr = (int8_t)next;
                L[k].sfd = fd;
                L[k].stall_ns = 0;
                L[k].resuming = true;
                L[k].afill = 0;
                char nm[64];
                ZCCL_INFO(ZCCL_LOG_TCP, "rank %d: TCP lane %d to rank %d moved to rail %s", tc->rank, k, peer,
                          zccl__rails_name(r, peer, next, nm, sizeof nm));
                break;
            }
            char nm[64];
            /* the rail it was to move onto is lost too (two losses in a row): said as any rail's loss, once */
            ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: TCP rail %s to rank %d lost (cannot move TCP lane %d onto it: %s); its "
                      "lanes move on", tc->rank, zccl__rails_name(r, peer, next, nm, sizeof nm), peer, k,
                      zccl_get_last_error(NULL));
            if (res == ZCCL_REMOTE_ERROR) { close(old); return res; } /* the peer refused the move: it gave up */
            c = next;
            zccl__rails_name(r, peer, c, dead, sizeof dead);
            r->cdead[cb + (size_t)c] = 1;
            why = "connecting failed";
        }
    }
    return ZCCL_SUCCESS;
}

/* Lane k to peer failed (err, or eof): move it if its rail died, else fail as the single-socket path does. */
static zccl_result_t send_failed(zccl_rails_t *r, int peer, int k, int err, bool eof) {
    char why[160];
    const int c = r->send_rail[(size_t)peer * ZCCL_TCP_SOCKS_MAX + (size_t)k];
    if (!rail_failed(r, peer, c, err, eof, why, sizeof why)) return peer_closed(r, peer, true, eof ? 0 : err);
    return rail_dead(r, peer, c, why);
}

/* Reads acknowledgements, connects, and writes what the ring holds. */
static zccl_result_t lane_pump(zccl_rails_t *r, int peer, int k, bool *progressed) {
    zccl_lane_t *l = &lanes_of(r, peer)[k];
    if (l->sfd < 0) {
        if (l->head == l->sent) return ZCCL_SUCCESS;
        if (l->peer_eof) return peer_closed(r, peer, true, 0);
        /* Every listener is up before the bootstrap ends, so a rail that does not connect within ZCCL_RAIL_TIMEOUT_MS
         * does not reach the peer (a subnet both have that is not wired, a firewall): it is dead for this pair. */
        int c;
        for (;;) {
            c = r->send_rail[(size_t)peer * ZCCL_TCP_SOCKS_MAX + (size_t)k];
            const uint64_t deadline = zccl__now_ns() + (uint64_t)r->rail_timeout_ms * 1000000ull;
            zccl_result_t res = zccl__rails_connect(r, peer, k, c, l->connected, deadline, &l->sfd);
            if (res == ZCCL_SUCCESS) break;
            if (res == ZCCL_REMOTE_ERROR) return res; /* it answered and refused: it gave up */
            char why[200];
            snprintf(why, sizeof why, "cannot connect: %s", zccl_get_last_error(NULL));
            ZCCL_CHECK(rail_dead(r, peer, c, why)); /* points this lane at a live rail, or fails naming them all */
        }
        lane_sockopts(r, l->sfd);
        l->stall_ns = 0;
        l->resuming = l->connected;
        l->connected = true;
        l->afill = 0;
        char nm[64];
        ZCCL_INFO(ZCCL_LOG_TCP, "connected to rank %d over TCP socket %d on rail %s", peer, k,
                  zccl__rails_name(r, peer, c, nm, sizeof nm));
    }
    for (;;) { /* acknowledgements: cumulative positions */
        ssize_t n = recv(l->sfd, l->abuf + l->afill, sizeof l->abuf - (size_t)l->afill, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        const int err = n < 0 ? errno : 0;
        if (n <= 0 && l->sent == l->head && !l->resuming && !rail_error(err)) {
            /* Closed with nothing of ours left to write: the receiver left (a clean exit after its last call, as on
             * the single-socket path, where nobody reads this side) or gave up; only more data for it is an error. */
            close(l->sfd);
            l->sfd = -1;
            l->peer_eof = true;
            return ZCCL_SUCCESS;
        }
        if (n <= 0) return send_failed(r, peer, k, err, n == 0);
        l->afill += (int)n;
        if (l->afill < 8) continue;
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--) v = v << 8 | l->abuf[i];
        l->afill = 0;
        if (v < l->acked || v > l->head)
            return zccl__error(ZCCL_INTERNAL_ERROR, "rank %d acknowledged position %llu of TCP lane %d, outside [%llu, "
                               "%llu]", peer, (unsigned long long)v, k, (unsigned long long)l->acked,
                               (unsigned long long)l->head);
        if (l->resuming) l->sent = v, l->resuming = false;
        if (v > l->sent) l->sent = v;
        l->acked = v;
        *progressed = true;
    }
    while (!l->resuming && l->sent < l->head) {
        const size_t off = (size_t)(l->sent % LANE_RING);
        const size_t len = ZCCL_MIN(ZCCL_MIN((size_t)(l->head - l->sent), LANE_RING - off), (size_t)LANE_IO);
        ssize_t n = send(l->sfd, l->ring + off, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (n < 0) return send_failed(r, peer, k, errno, false);
        l->sent += (uint64_t)n;
        *progressed = true;
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t lanes_send(zccl_rails_t *r, zccl_xfer_t *x, bool *progressed) {
    const int p = x->peer, parts = parts_of(r, x);
    zccl_lane_t *L = lanes_of(r, p);
    if (!x->started) {
        x->started = true;
        for (int k = 0; k < parts; k++) L[k].part_done = 0;
    }
    size_t total = 0;
    for (int k = 0; k < parts; k++) {
        zccl_lane_t *l = &L[k];
        size_t lo, hi;
        part_range(x, k, parts, &lo, &hi);
        const bool was_full = l->part_done == hi - lo;
        while (l->part_done < hi - lo) { /* into the ring, as far as it has room */
            if (!l->ring && !(l->ring = malloc(LANE_RING)))
                return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a %u-byte TCP lane ring", LANE_RING);
            const size_t room = LANE_RING - (size_t)(l->head - l->acked);
            if (!room) break;
            const size_t off = (size_t)(l->head % LANE_RING);
            const size_t n = ZCCL_MIN(ZCCL_MIN(room, LANE_RING - off), hi - lo - l->part_done);
            memcpy(l->ring + off, x->src + lo + l->part_done, n);
            l->head += n;
            l->part_done += n;
            *progressed = true;
        }
        if (!was_full && l->part_done == hi - lo) l->part_end = l->head;
        total += l->part_done;
    }
    /* Only lanes with bytes to write, or whose ring is more than half full (their acknowledgements free it), cost a
     * system call here; the waits (zccl__lanes_check) read the others'. */
    for (int k = 0; k < r->nsock[p]; k++)
        if (L[k].sent < L[k].head || L[k].head - L[k].acked > LANE_RING / 2) ZCCL_CHECK(lane_pump(r, p, k, progressed));
    bool written = total == x->bytes;
    for (int k = 0; k < parts && written; k++) written = !L[k].resuming && L[k].sent >= L[k].part_end;
    x->done = total;
    x->complete = written;
    return ZCCL_SUCCESS;
}

/* The sender moved lanes of peer: adopt their new connections and tell it where each stream stands. */
static zccl_result_t adopt_moves(zccl_rails_t *r, int peer) {
    zccl_lane_t *L = lanes_of(r, peer);
    const uint32_t now = __atomic_load_n(&r->resume_pending[peer], __ATOMIC_ACQUIRE);
    if (now == L[0].resume_seen) return ZCCL_SUCCESS;
    L[0].resume_seen = now;
    for (int k = 0; k < r->nsock[peer]; k++) {
        const int fd = zccl__rails_take_resume(r, peer, k);
        if (fd < 0) continue;
        zccl_lane_t *l = &L[k];
        if (l->rfd >= 0) close(l->rfd);
        const int first = zccl__rails_take_in(r, peer, k); /* a first connection never taken is over too */
        if (first >= 0) close(first);
        l->rfd = fd;
        l->broken = l->closed = false;
        l->aout_len = l->aout_done = 0;
        lane_sockopts(r, fd);
        uint8_t pos[8];
        for (int i = 0; i < 8; i++) pos[i] = (uint8_t)(l->rpos >> (8 * i));
        ZCCL_CHECK(zccl__send_all(fd, pos, sizeof pos, zccl__now_ns() + (uint64_t)r->rail_timeout_ms * 1000000ull,
                                  "the stream position of a moved TCP lane"));
        l->racked = l->rpos;
        ZCCL_INFO(ZCCL_LOG_TCP, "rank %d: rank %d moved its TCP lane %d to another rail; resuming at byte %llu",
                  r->tc->rank, peer, k, (unsigned long long)l->rpos);
    }
    return ZCCL_SUCCESS;
}

/* Which of this rank's rails a connection runs over (its local address), or NULL. */
static const zccl_rail_addr_t *rail_of_fd(const zccl_rails_t *r, int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 || ss.ss_family != AF_INET) return NULL;
    for (int i = 0; i < r->n; i++)
        if (((const struct sockaddr_in *)&r->mine[i].addr.sa)->sin_addr.s_addr == ((struct sockaddr_in *)&ss)->sin_addr.s_addr)
            return &r->mine[i];
    return NULL;
}

/* The connection of lane k from peer failed: wait for the sender to move it unless the peer itself is gone. */
static zccl_result_t recv_failed(zccl_rails_t *r, int peer, int k, int err, bool eof) {
    zccl_lane_t *l = &lanes_of(r, peer)[k];
    char why[160];
    /* An end or a reset where this rank's interface is fine: the peer left or gave up (a sender that moves a lane
     * connects the new one before it closes the old, so a move would be waiting by now): wait briefly for one. */
    const zccl_rail_addr_t *mine = rail_of_fd(r, l->rfd);
    l->closed = (eof || err == ECONNRESET || err == EPIPE) && (!mine || zccl__rail_healthy(mine, why, sizeof why));
    close(l->rfd);
    l->rfd = -1;
    l->broken = true;
    l->broken_ns = zccl__now_ns();
    ZCCL_INFO(ZCCL_LOG_TCP, "rank %d: TCP lane %d from rank %d failed (%s); waiting for it to move the lane",
              r->tc->rank, k, peer, eof ? "closed" : strerror(err));
    return ZCCL_SUCCESS;
}

static void ack_flush(zccl_rails_t *r, int peer, int k) {
    zccl_lane_t *l = &lanes_of(r, peer)[k];
    if (l->rfd < 0) return;
    if (l->aout_done == l->aout_len && l->rpos - l->racked >= LANE_RING / 4) {
        for (int i = 0; i < 8; i++) l->aout[i] = (uint8_t)(l->rpos >> (8 * i));
        l->aout_len = 8;
        l->aout_done = 0;
        l->racked = l->rpos;
    }
    while (l->aout_done < l->aout_len) {
        ssize_t n = send(l->rfd, l->aout + l->aout_done, (size_t)(l->aout_len - l->aout_done), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0) return; /* full (try again later) or failed (the next receive sees it) */
        l->aout_done += (int)n;
    }
}

static zccl_result_t lanes_recv(zccl_rails_t *r, zccl_xfer_t *x, bool *progressed) {
    const int p = x->peer, parts = parts_of(r, x);
    zccl_tp_comm_t *tc = r->tc;
    zccl_lane_t *L = lanes_of(r, p);
    ZCCL_CHECK(adopt_moves(r, p));
    if (!x->started) {
        x->started = true;
        for (int k = 0; k < parts; k++) L[k].rpart_done = 0;
    }
    const size_t es = x->op2 ? zccl_type_size(x->dt) : 1;
    size_t total = 0;
    for (int k = 0; k < parts; k++) {
        zccl_lane_t *l = &L[k];
        size_t lo, hi;
        part_range(x, k, parts, &lo, &hi);
        total += l->rpart_done;
        if (l->rpart_done == hi - lo) continue;
        if (l->rfd < 0) {
            if (l->broken) {
                if (l->closed && zccl__now_ns() - l->broken_ns > 500000000ull)
                    return peer_closed(r, p, false, 0);
                const int64_t bound = ZCCL_MAX(r->keep_timeout_ms, 3 * r->rail_timeout_ms);
                if (zccl__now_ns() - l->broken_ns > (uint64_t)bound * 1000000ull)
                    return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: TCP lane %d from rank %d failed and rank %d did not "
                                       "move it to another rail within %lld ms (every rail to it lost, or it is gone)",
                                       tc->rank, k, p, p, (long long)bound);
                continue;
            }
            if ((l->rfd = zccl__rails_take_in(r, p, k)) < 0) continue;
            lane_sockopts(r, l->rfd);
        }
        size_t got = 0;
        if (!x->op2) {
            ssize_t n = recv(l->rfd, x->dst + lo + l->rpart_done, ZCCL_MIN(hi - lo - l->rpart_done, (size_t)LANE_IO), MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            if (n <= 0) { ZCCL_CHECK(recv_failed(r, p, k, n < 0 ? errno : 0, n == 0)); continue; }
            l->rpos += (uint64_t)n;
            l->rpart_done += (size_t)n;
            got = (size_t)n;
        } else {
            if (!l->stage && !(l->stage = malloc(tc->chunk_bytes)))
                return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a %zu-byte TCP staging buffer", tc->chunk_bytes);
            const size_t want = ZCCL_MIN(tc->chunk_bytes, hi - lo - l->rpart_done) - l->fill;
            ssize_t n = recv(l->rfd, l->stage + l->fill, want, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            if (n <= 0) { ZCCL_CHECK(recv_failed(r, p, k, n < 0 ? errno : 0, n == 0)); continue; }
            l->rpos += (uint64_t)n;
            l->fill += (size_t)n;
            const size_t whole = l->fill / es * es; /* parts start on element boundaries */
            if (whole) {
                const size_t keep = x->done;
                x->done = lo + l->rpart_done; /* zccl__xfer_deliver writes at x->done */
                zccl__xfer_deliver(x, l->stage, whole);
                x->done = keep;
                l->rpart_done += whole;
                got = whole;
            }
            if (l->fill > whole) memmove(l->stage, l->stage + whole, l->fill - whole);
            l->fill -= whole;
        }
        total += got;
        *progressed = true;
    }
    for (int k = 0; k < r->nsock[p]; k++) ack_flush(r, p, k);
    x->done = total;
    x->complete = total == x->bytes;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__lane_progress(zccl_rails_t *r, zccl_xfer_t *x, bool *progressed) {
    return x->is_send ? lanes_send(r, x, progressed) : lanes_recv(r, x, progressed);
}

int zccl__lane_wait_fd(zccl_rails_t *r, const zccl_xfer_t *x, short *events) {
    zccl_lane_t *L = lanes_of(r, x->peer);
    const int parts = x->started ? parts_of(r, x) : 1;
    for (int k = 0; k < parts; k++) {
        size_t lo, hi;
        part_range(x, k, parts, &lo, &hi);
        const zccl_lane_t *l = &L[k];
        if (x->is_send) {
            if (x->started && l->part_done == hi - lo && l->sent == l->head) continue;
            *events = (short)(POLLIN | (l->sent < l->head && !l->resuming ? POLLOUT : 0));
            return l->sfd;
        }
        if (x->started && l->rpart_done == hi - lo) continue;
        *events = POLLIN;
        return l->rfd; /* -1 while not connected or moving: the accept thread rings the doorbell */
    }
    *events = x->is_send ? POLLOUT : POLLIN;
    return -1;
}

/* Whether lane l's connection is on a dead rail: the kernel has held bytes of it (sent and unacknowledged, or not
 * sent at all) for ZCCL_RAIL_TIMEOUT_MS, no acknowledgement of any kind arrived in that time (TCP_INFO's
 * tcpi_last_ack_recv), and the reason is not the peer's closed window. Counting retransmissions alone misses a rail
 * whose segments never left: where the local interface is down or the peer's address no longer resolves, the
 * kernel fails the transmission locally, keeps the bytes unsent and counts no retransmission, so such a lane
 * (typically one that carried only small messages and got them after the cut) hung until the kernel's
 * TCP_USER_TIMEOUT (ZCCL_SOCKET_USER_TIMEOUT_MS, 30 s): 7 of 11 trials of tests/netns/rail_loss.sh took 42-50 s.
 * A peer that does not read (busy elsewhere, e.g. in a connect on another rail) closes its window: then the kernel
 * holds unsent bytes too and its zero-window probes back off (their answers can be seconds apart), so a held queue
 * with nothing in flight counts only while the peer's last advertised window is open (tcpi_snd_wnd; on a kernel
 * too old to report it, only retransmitted bytes count, as before). The bytes must be seen held at two looks
 * ZCCL_RAIL_TIMEOUT_MS apart, so data just written on a connection idle for long (whose last acknowledgement is
 * old) is not taken for a stall. */
static bool stalled_rail(const zccl_rails_t *r, zccl_lane_t *l) {
    int outq = 0;
    if (ioctl(l->sfd, SIOCOUTQ, &outq) != 0 || outq <= 0) {
        l->stall_ns = 0;
        return false;
    }
    const uint64_t now = zccl__now_ns();
    if (l->stall_fd != l->sfd || l->stall_ns == 0) {
        l->stall_fd = l->sfd;
        l->stall_ns = now;
        return false;
    }
    struct tcp_info ti;
    memset(&ti, 0, sizeof ti);
    socklen_t len = sizeof ti;
    if (getsockopt(l->sfd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
    const bool have_wnd = len >= offsetof(struct tcp_info, tcpi_snd_wnd) + sizeof ti.tcpi_snd_wnd;
    const bool in_flight = ti.tcpi_unacked > 0 && ti.tcpi_retransmits >= 2;
    const bool unsent_open = ti.tcpi_unacked == 0 && have_wnd && ti.tcpi_snd_wnd > 0;
    if ((int64_t)ti.tcpi_last_ack_recv < r->rail_timeout_ms || !(in_flight || unsent_open)) {
        l->stall_ns = now; /* acknowledgements arrive, or the peer's window is closed: the peer, not the rail */
        return false;
    }
    return now - l->stall_ns >= (uint64_t)r->rail_timeout_ms * 1000000ull;
}

zccl_result_t zccl__lanes_check(zccl_rails_t *r, int peer) {
    if (!r->lanes || r->nsock[peer] < 2) return ZCCL_SUCCESS;
    zccl_lane_t *L = lanes_of(r, peer);
    bool moved = false;
    for (int k = 0; k < r->nsock[peer]; k++) {
        if (L[k].sfd >= 0 && L[k].acked < L[k].head && stalled_rail(r, &L[k]))
            ZCCL_CHECK(send_failed(r, peer, k, ETIMEDOUT, false));
        if (L[k].sfd >= 0 && L[k].acked < L[k].head) ZCCL_CHECK(lane_pump(r, peer, k, &moved));
    }
    ZCCL_CHECK(adopt_moves(r, peer));
    for (int k = 0; k < r->nsock[peer]; k++) ack_flush(r, peer, k);
    return ZCCL_SUCCESS;
}

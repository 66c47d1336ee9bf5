/*
 * tcp.c — TCP transport between any two ranks, used between hosts (or everywhere with ZCCL_TRANSPORT=tcp).
 *
 * Each direction of a pair has its own socket: the sender connects to the receiver's listening socket when it
 * first sends, proves the job secret (socket.c) and names itself; the receiver's service thread admits it. Data
 * goes straight from the user's buffer into the socket and, for a plain receive, straight from the socket into the
 * user's buffer. A receive that reduces lands in a cache-sized staging buffer and is reduced from there into the
 * destination, so the data crosses memory once.
 *
 * A link that dies silently (a cable, a switch, a host that froze: no FIN, no reset) is found by the kernel: every
 * data socket has keepalive on and TCP_USER_TIMEOUT = ZCCL_SOCKET_USER_TIMEOUT_MS, so a connection whose sent
 * bytes or keepalive probes stay unacknowledged that long fails with ETIMEDOUT, which poll() reports at once; the
 * collective then fails naming the peer even without ZCCL_TIMEOUT_MS.
 *
 * Rails (rail.h): between ranks that share two or more sockets' worth of interface subnets, every direction of the
 * pair has S lanes instead of one socket, each over its rail (rail_lane.c: striping, acknowledgements, moving a
 * lane off a rail that died). The single-socket path below stays as it was for every other pair.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "rail.h"
#include "transport.h"

extern const zccl_transport_ops_t zccl_transport_tcp; /* defined at the end of this file */

#define TCP_MAX_IO (1u << 20) /* bytes per send/recv call: bounds the work of one progress call */

typedef struct zccl_tcp_comm {
    int *send_fd;       /* per peer: our connection to it, -1 until the first send */
    int *recv_fd;       /* per peer: its connection to us, -1 until the service thread admitted it */
    uint8_t **stage;    /* per peer: staging buffer for reducing receives */
    size_t *stage_fill; /* per peer: bytes in stage not yet delivered */
    int64_t user_timeout_ms; /* ZCCL_SOCKET_USER_TIMEOUT_MS; 0: the kernel's defaults */
    zccl_rails_t *rails;     /* NULL: this rank has no rails (rail.c); its lanes carry the striped pairs */
} tcp_comm_t;
#define TCP_OF(c) ((tcp_comm_t *)zccl__tp_state((c), &zccl_transport_tcp))

zccl_rails_t **zccl__tcp_rails_ref(zccl_tp_comm_t *tc) {
    tcp_comm_t *t = TCP_OF(tc);
    if (!t) {
        if (!(t = calloc(1, sizeof *t))) return NULL;
        zccl__tp_set_state(tc, &zccl_transport_tcp, t);
    }
    return &t->rails;
}

zccl_rails_t *zccl__tcp_rails(const zccl_tp_comm_t *tc) {
    const tcp_comm_t *t = TCP_OF(tc);
    return t ? t->rails : NULL;
}

static zccl_result_t tcp_setup(zccl_tp_comm_t *comm) {
    tcp_comm_t *t = TCP_OF(comm); /* the rails made it before the bootstrap */
    if (!t && !(t = calloc(1, sizeof *t))) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    zccl__tp_set_state(comm, &zccl_transport_tcp, t);
    size_t n = (size_t)comm->nranks;
    if (t->rails) ZCCL_CHECK(zccl__rails_plan(t->rails));
    t->send_fd = malloc(n * sizeof(int));
    t->recv_fd = malloc(n * sizeof(int));
    t->stage = calloc(n, sizeof(uint8_t *));
    t->stage_fill = calloc(n, sizeof(size_t));
    if (!t->send_fd || !t->recv_fd || !t->stage || !t->stage_fill) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    for (size_t i = 0; i < n; i++) t->send_fd[i] = t->recv_fd[i] = -1;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_SOCKET_USER_TIMEOUT_MS, &t->user_timeout_ms));
    return ZCCL_SUCCESS;
}

/* Keepalive and TCP_USER_TIMEOUT on a data socket (see the top of the file). Probes start after a third of the
 * timeout without traffic and repeat every sixth of it (at least 1 s each: the kernel counts in seconds), so an idle
 * receiving side notices within about 1.3 times the timeout; a side with unacknowledged data within the timeout. */
static void tcp_keepalive(const tcp_comm_t *t, int fd) {
    if (t->user_timeout_ms <= 0) return;
    const int one = 1, idle = (int)ZCCL_MAX(1, t->user_timeout_ms / 3000), intvl = (int)ZCCL_MAX(1, t->user_timeout_ms / 6000);
    const int cnt = 10; /* not reached: TCP_USER_TIMEOUT decides when probes have failed */
    const unsigned ut = (unsigned)ZCCL_MIN(t->user_timeout_ms, (int64_t)UINT32_MAX);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
}

static bool tcp_can_reach(const zccl_tp_comm_t *comm, int peer) { return true; }

static zccl_result_t io_error(zccl_tp_comm_t *comm, int peer, bool is_send, ssize_t n, int err) {
    if (err == ETIMEDOUT)
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: the TCP connection %s rank %d timed out: it acknowledged nothing "
                           "for ZCCL_SOCKET_USER_TIMEOUT_MS=%lld ms (link down, host unreachable or frozen)", comm->rank,
                           is_send ? "to" : "from", peer, (long long)TCP_OF(comm)->user_timeout_ms);
    if (n == 0 || err == ECONNRESET || err == EPIPE)
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d closed its connection while rank %d was %s it (it exited, "
                           "aborted, or gave up after an error of its own)", peer, comm->rank, is_send ? "sending to" : "receiving from");
    return zccl__syserror(err, "rank %d: %s rank %d over TCP", comm->rank, is_send ? "send to" : "receive from", peer);
}

static zccl_result_t tcp_send(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    tcp_comm_t *t = TCP_OF(comm);
    if (t->send_fd[x->peer] < 0) {
        const int64_t init_ms = comm->init_timeout_ms;
        zccl_conn_hdr_t h = {comm->comm_id, comm->rank, ZCCL_CONN_DATA};
        int fd;
        ZCCL_CHECK(zccl__connect_auth(&comm->peers[x->peer].listen, comm->secret, &h, sizeof h,
                                      zccl__now_ns() + (uint64_t)init_ms * 1000000ull, &fd));
        t->send_fd[x->peer] = fd;
        tcp_keepalive(t, fd);
        ZCCL_INFO(ZCCL_LOG_TCP, "connected to rank %d over TCP", x->peer);
    }
    ssize_t n = send(t->send_fd[x->peer], x->src + x->done, ZCCL_MIN(x->bytes - x->done, TCP_MAX_IO),
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ZCCL_SUCCESS;
        return io_error(comm, x->peer, true, n, errno);
    }
    x->done += (size_t)n;
    x->complete = (x->done == x->bytes);
    *progressed = true;
    return ZCCL_SUCCESS;
}

static zccl_result_t tcp_recv(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    tcp_comm_t *t = TCP_OF(comm);
    const int p = x->peer;
    if (t->recv_fd[p] < 0) {
        pthread_mutex_lock(&comm->in_mutex);
        t->recv_fd[p] = comm->in_fd[p];
        comm->in_fd[p] = -1;
        pthread_mutex_unlock(&comm->in_mutex);
        if (t->recv_fd[p] >= 0) tcp_keepalive(t, t->recv_fd[p]);
        if (t->recv_fd[p] < 0) return ZCCL_SUCCESS; /* not connected yet: the service thread rings when it is */
    }
    const int fd = t->recv_fd[p];
    if (!x->op2) {
        ssize_t n = recv(fd, x->dst + x->done, ZCCL_MIN(x->bytes - x->done, TCP_MAX_IO), MSG_DONTWAIT);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ZCCL_SUCCESS;
            return io_error(comm, p, false, n, n < 0 ? errno : 0);
        }
        x->done += (size_t)n;
    } else {
        if (!t->stage[p] && !(t->stage[p] = malloc(comm->chunk_bytes)))
            return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a %zu-byte TCP staging buffer", comm->chunk_bytes);
        size_t fill = t->stage_fill[p];
        size_t want = ZCCL_MIN(comm->chunk_bytes, x->bytes - x->done) - fill;
        ssize_t n = recv(fd, t->stage[p] + fill, want, MSG_DONTWAIT);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ZCCL_SUCCESS;
            return io_error(comm, p, false, n, n < 0 ? errno : 0);
        }
        fill += (size_t)n;
        /* Reduce whole elements now; keep a split element's bytes for the next call. */
        const size_t es = zccl_type_size(x->dt), whole = fill / es * es;
        if (whole) zccl__xfer_deliver(x, t->stage[p], whole);
        if (fill > whole) memmove(t->stage[p], t->stage[p] + whole, fill - whole);
        t->stage_fill[p] = fill - whole;
    }
    x->complete = (x->done == x->bytes);
    *progressed = true;
    return ZCCL_SUCCESS;
}

/* Pairs with two or more lanes go through rail_lane.c. */
static bool striped(const tcp_comm_t *t, int peer) { return t && t->rails && t->rails->lanes && t->rails->nsock[peer] >= 2; }

static zccl_result_t tcp_progress(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    tcp_comm_t *t = TCP_OF(comm);
    if (striped(t, x->peer)) return zccl__lane_progress(t->rails, x, progressed);
    return x->is_send ? tcp_send(comm, x, progressed) : tcp_recv(comm, x, progressed);
}

static int tcp_wait_fd(zccl_tp_comm_t *comm, const zccl_xfer_t *x, short *events) {
    tcp_comm_t *t = TCP_OF(comm);
    *events = x->is_send ? POLLOUT : POLLIN;
    if (striped(t, x->peer)) return zccl__lane_wait_fd(t->rails, x, events);
    return x->is_send ? t->send_fd[x->peer] : t->recv_fd[x->peer];
}

/* TCP sees a lost peer as EOF; striped pairs use the wait to look after their lanes (rail_lane.c). */
static zccl_result_t tcp_check_peer(zccl_tp_comm_t *comm, int peer) {
    tcp_comm_t *t = TCP_OF(comm);
    return striped(t, peer) ? zccl__lanes_check(t->rails, peer) : ZCCL_SUCCESS;
}

/* Shut every data connection down: a peer blocked receiving from us sees EOF, one sending to us an error. */
static void tcp_poison(zccl_tp_comm_t *comm) {
    tcp_comm_t *t = TCP_OF(comm);
    if (!t) return;
    for (int i = 0; t->send_fd && i < comm->nranks; i++) {
        if (t->send_fd[i] >= 0) shutdown(t->send_fd[i], SHUT_RDWR);
        if (t->recv_fd[i] >= 0) shutdown(t->recv_fd[i], SHUT_RDWR);
    }
    zccl__rails_poison(t->rails);
    pthread_mutex_lock(&comm->in_mutex);
    for (int i = 0; i < comm->nranks; i++)
        if (comm->in_fd[i] >= 0) shutdown(comm->in_fd[i], SHUT_RDWR);
    pthread_mutex_unlock(&comm->in_mutex);
}

static void tcp_teardown(zccl_tp_comm_t *comm) {
    tcp_comm_t *t = TCP_OF(comm);
    if (!t) return;
    for (int i = 0; i < comm->nranks; i++) {
        if (t->send_fd && t->send_fd[i] >= 0) close(t->send_fd[i]);
        if (t->recv_fd && t->recv_fd[i] >= 0) close(t->recv_fd[i]);
        if (t->stage) free(t->stage[i]);
    }
    free(t->send_fd);
    free(t->recv_fd);
    free(t->stage);
    free(t->stage_fill);
    zccl__rails_free(t->rails);
    free(t);
    zccl__tp_set_state(comm, &zccl_transport_tcp, NULL);
}

const zccl_transport_ops_t zccl_transport_tcp = {
    .name = "tcp",
    .link = ZCCL_LINK_NETWORK,
    .fds_per_peer = 2, /* one socket per direction */
    .comm_setup = tcp_setup,
    .can_reach = tcp_can_reach,
    .progress = tcp_progress,
    .wait_fd = tcp_wait_fd,
    .check_peer = tcp_check_peer,
    .comm_teardown = tcp_teardown,
    .poison = tcp_poison,
};

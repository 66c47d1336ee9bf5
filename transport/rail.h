/*
 * rail.h — TCP rails (transport/rail.c): the interfaces of this host that the TCP transport stripes large transfers
 * over, the sockets of each pair over them, and which of those sockets are still alive.
 *
 * A rail is an interface (NIC) with an address. At init every rank publishes, in its bootstrap record
 * (zccl_tcp_peer_info_t), one listening address per rail. After the bootstrap each pair computes the same plan from
 * the two records: the subnets both ranks have (sorted, so both sides agree), times the smaller ZCCL_NSOCKS_PERTHREAD,
 * is the pair's socket count S (at most ZCCL_TCP_SOCKS_MAX). Socket k of the direction p -> q runs over subnet
 * (k + local index of p on its host) mod (common subnets): rank i of a host starts on rail i mod R. A transfer of at
 * least ZCCL_TCP_STRIPE_MIN_BYTES is split into S contiguous parts on 64-byte boundaries (so on element boundaries
 * for every datatype, and the same on both sides whatever datatype each names); part k travels on socket k. Smaller
 * transfers travel whole on socket 0.
 *
 * The sockets of a pair are lanes (rail_lane.c): a lane is one byte stream from sender to receiver that outlives
 * the TCP connection carrying it. The sender copies what it sends into the lane's replay ring and keeps it until the
 * receiver acknowledges it (8-byte cumulative stream positions, sent back on the same connection). When the rail of
 * a lane dies (link down, address gone: TCP_INFO shows retransmitted bytes unacknowledged for ZCCL_RAIL_TIMEOUT_MS,
 * or EHOSTUNREACH/ENETUNREACH/ENETDOWN/EADDRNOTAVAIL/ETIMEDOUT, or the local interface is down), the sender
 * moves every lane of that pair on that rail to the next live rail: it connects there with the resume flag, the
 * receiver answers with the stream position it has consumed, and the sender replays from there. Bytes already
 * delivered are therefore not delivered twice, and bytes in flight on the dead rail are sent again. A rail that
 * comes back is not rejoined.
 */
#ifndef ZCCL_TRANSPORT_RAIL_H
#define ZCCL_TRANSPORT_RAIL_H

#include "transport.h"

/** Bytes of the unit that stripes are cut on: a multiple of every element size. */
#define ZCCL_STRIPE_UNIT 64

typedef struct zccl_rails {
    zccl_tp_comm_t *tc;
    int n;                                  /* this rank's rails (0: not striping) */
    int nsocks;                             /* ZCCL_NSOCKS_PERTHREAD */
    zccl_rail_addr_t mine[ZCCL_RAIL_MAX];
    int listen_fd[ZCCL_RAIL_MAX];
    pthread_t thr[ZCCL_RAIL_MAX];
    int nthr;
    int stop_pipe[2];
    size_t stripe_min;                      /* ZCCL_TCP_STRIPE_MIN_BYTES */
    int min_ch, max_ch;                     /* ZCCL_MIN_NCHANNELS / ZCCL_MAX_NCHANNELS (0: none) */
    /* Per peer, from zccl__rails_plan (nranks entries; [peer * ZCCL_TCP_SOCKS_MAX + k] for per-socket arrays). */
    int nranks;
    int *nsock;                             /* sockets per direction with the peer; < 2: the single-socket path */
    int8_t *send_rail;                      /* socket k of this rank -> peer: index into mine[] */
    int8_t *send_prail;                     /* ... and into the peer's rails */
    int *in_fd;                             /* the peer's socket k to us, filled by the accept threads (tc->in_mutex) */
    int *resume_fd;                         /* the peer's lane k moved to another rail: its new connection (ditto) */
    uint32_t *resume_pending;               /* per peer: bumped by the accept threads when a resume_fd is stored */
    /* Per peer: the subnets both have, in plan order ([peer * ZCCL_RAIL_MAX + i]), and which ones died. */
    int *ncommon;
    int8_t *cmine, *ctheirs;
    uint8_t *cdead;
    int64_t rail_timeout_ms;                /* ZCCL_RAIL_TIMEOUT_MS */
    bool poisoned;                          /* this rank gave up: moves of lanes are refused (tc->in_mutex) */
    int64_t keep_timeout_ms;                /* ZCCL_SOCKET_USER_TIMEOUT_MS: a lane's receiver waits this long for a move */
    struct zccl_lane *lanes;                /* [peer * ZCCL_TCP_SOCKS_MAX + k]: send and receive side (rail_lane.c) */
} zccl_rails_t;

/** Progress of a transfer with a striped peer (rail_lane.c). */
zccl_result_t zccl__lane_progress(zccl_rails_t *r, zccl_xfer_t *x, bool *progressed);
/** While a rank waits (check_peer): reads the lanes' acknowledgements (so a dead rail is found and its bytes are
 *  replayed), adopts lanes the peer moved, flushes acknowledgements. Errors: the last rail to peer lost. */
zccl_result_t zccl__lanes_check(zccl_rails_t *r, int peer);
/** The socket and events to wait on for x. */
int zccl__lane_wait_fd(zccl_rails_t *r, const zccl_xfer_t *x, short *events);
/** Allocates the lanes (after zccl__rails_plan). */
zccl_result_t zccl__lanes_init(zccl_rails_t *r);
/** Shuts every lane's connection down (poison) / closes them and frees the lanes. */
void zccl__lanes_poison(zccl_rails_t *r);
void zccl__lanes_free(zccl_rails_t *r);
/** Whether this rank's rail interface is still up with its address; if not, why (a sentence) into buf. */
bool zccl__rail_healthy(const zccl_rail_addr_t *a, char *buf, size_t len);
/** The live rails to every peer that lost one ("rank 1: eth0 (eth1 lost)"), "" when none did. */
void zccl__rails_live(const zccl_rails_t *r, char *buf, size_t len);

/** Computes every peer's socket plan from the bootstrap records (after the bootstrap; logs it at INFO). */
zccl_result_t zccl__rails_plan(zccl_rails_t *r);
/** Connects this rank's socket k to peer over common rail c of the pair (handshake and header as every data
 *  connection; resume: the lane moves there), giving up after deadline_ns. */
zccl_result_t zccl__rails_connect(zccl_rails_t *r, int peer, int k, int c, bool resume, uint64_t deadline_ns, int *fd_out);
/** Takes the new connection of the peer's lane k after a move, or -1. */
int zccl__rails_take_resume(zccl_rails_t *r, int peer, int k);
/** Takes the accepted socket k from peer, or -1 if it has not connected yet. */
int zccl__rails_take_in(zccl_rails_t *r, int peer, int k);
/** Stops the accept threads and closes the listeners and sockets not yet taken; frees r. */
void zccl__rails_free(zccl_rails_t *r);
/** Shuts the accepted-but-not-taken sockets down (poison). */
void zccl__rails_poison(zccl_rails_t *r);
/** "eth1 (10.200.1.0/24)" for common rail c of this rank's pair with peer. */
const char *zccl__rails_name(const zccl_rails_t *r, int peer, int c, char *buf, size_t len);

/** The TCP transport's slot for its rails (tcp.c): creates the transport's state if it has none yet. */
zccl_rails_t **zccl__tcp_rails_ref(zccl_tp_comm_t *tc);
/** The TCP transport's rails, or NULL. */
zccl_rails_t *zccl__tcp_rails(const zccl_tp_comm_t *tc);

#endif

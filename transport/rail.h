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
 * transfers travel whole on the lowest-numbered live socket.
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
    /* Per peer, from zccl__rails_plan (nranks entries; [peer * ZCCL_TCP_SOCKS_MAX + k] for per-socket arrays). */
    int nranks;
    int *nsock;                             /* sockets per direction with the peer; < 2: the single-socket path */
    int8_t *send_rail;                      /* socket k of this rank -> peer: index into mine[] */
    int8_t *send_prail;                     /* ... and into the peer's rails */
    int *in_fd;                             /* the peer's socket k to us, filled by the accept threads (tc->in_mutex) */
} zccl_rails_t;

/** Computes every peer's socket plan from the bootstrap records (after the bootstrap; logs it at INFO). */
zccl_result_t zccl__rails_plan(zccl_rails_t *r);
/** Connects this rank's socket k to peer over its rail (handshake and header as every data connection). */
zccl_result_t zccl__rails_connect(zccl_rails_t *r, int peer, int k, int *fd_out);
/** Takes the accepted socket k from peer, or -1 if it has not connected yet. */
int zccl__rails_take_in(zccl_rails_t *r, int peer, int k);
/** Stops the accept threads and closes the listeners and sockets not yet taken; frees r. */
void zccl__rails_free(zccl_rails_t *r);
/** Shuts the accepted-but-not-taken sockets down (poison). */
void zccl__rails_poison(zccl_rails_t *r);
/** "eth1 (10.200.1.0/24)" for socket k of this rank's direction to peer. */
const char *zccl__rails_sock_name(const zccl_rails_t *r, int peer, int k, bool sending, char *buf, size_t len);

/** The TCP transport's slot for its rails (tcp.c): creates the transport's state if it has none yet. */
zccl_rails_t **zccl__tcp_rails_ref(zccl_tp_comm_t *tc);
/** The TCP transport's rails, or NULL. */
zccl_rails_t *zccl__tcp_rails(const zccl_tp_comm_t *tc);

#endif

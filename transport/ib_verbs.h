/*
 * ib_verbs.h — the verbs state of one communicator for the IB transport (built only with libibverbs/librdmacm).
 *
 * Protocol of one directed channel (sender S -> receiver R), see transport/ib.c:
 *   R grants a buffer with a clear-to-send message (CTS, an RDMA SEND): grant number, address, rkey, length and
 *   the byte count of R's whole receive. At most IB_SLOTS grants are outstanding per channel.
 *   S writes exactly that many bytes there with RDMA WRITE WITH IMMEDIATE (immediate = grant number), from the
 *   user's buffer (registration cache) or from a registered staging slot; it never writes ungranted memory.
 *   R's receive completion carries the grant number; R delivers grants in order (copy or reduce from a staging
 *   slot, or nothing for a grant that pointed into the user's buffer) and grants again.
 * Rails: a rank may use several HCA ports (ZCCL_IB_HCA listing several, or every active port by default). A pair
 * uses the first min(both ranks' counts) rails; its connection has ZCCL_IB_QPS_PER_CONN QPs per rail, QP q on rail
 * q / qps at both ends (rail k to the peer's rail k), each rail with its own device context, PD, CQ and MRs.
 * Chunks and CTS messages of grant g of the direction S -> R travel on QP (g + off) % nqp, where off = qps x (S's
 * index among its host's ranks mod the pair's rails): rank i of a host starts on rail i mod R. Every QP keeps
 * enough receives posted for every message that can be in flight to it (2 * IB_SLOTS + 2), so receiver-not-ready
 * never happens in normal operation. The sender writes grant g on the QP its clear-to-send came on.
 * Failover (several rails): a rail that dies for a pair (port error, a failed work completion, a fatal QP event, or
 * the peer's notice) is dropped by both sides: its QPs go to the error state, new grants skip its QPs, the receiver
 * grants again (IB_REGRANT_MAGIC, same number, on a live QP) every grant of it that has not arrived, then sends
 * IB_SYNC_MAGIC (the rail, its grant count) on that same QP, which is also the notice to a peer that had not seen the
 * loss; the sender writes the granted-again chunks once more and counts as acknowledged every write on the dead rail
 * that the receiver did not grant again (it arrived). Each grant is delivered (copied or reduced) once.
 */
#ifndef ZCCL_IB_VERBS_H
#define ZCCL_IB_VERBS_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include "ib.h"
#include "transport.h"

#define IB_SLOTS 8                 /* grants in flight per channel */
#define IB_MAX_QPS 64              /* per connection, all rails: ZCCL_IB_QPS_PER_CONN (<= 16) x rails (<= 4) */
#define IB_MAX_RAILS ZCCL_IB_RAILS_MAX
#define IB_RQ_DEPTH (2 * IB_SLOTS + 2)
#define IB_SQ_DEPTH (2 * IB_SLOTS + 2)
#define IB_PROBE_BYTES 8192        /* connect-time probe: larger than any MTU, so it is segmented */
#define IB_PROBE_IMM 0xfffffff0u
#define IB_CTS_MAGIC 0x7a435453u   /* "zCTS" */
#define IB_REGRANT_MAGIC 0x7a524754u /* "zRGT": grant `seq` again (its rail died), on this QP */
#define IB_SYNC_MAGIC 0x7a53594eu  /* "zSYN": rail `len` died; grants below `seq` not granted again have arrived */
#define IB_MSG_BYTES 32            /* receive buffer per posted receive (a CTS message) */

/* wr_id: peer (24 bits) | kind (4) | qp (8) | index (28) */
enum { IB_K_RECV = 1, IB_K_DATA = 2, IB_K_CTS = 3, IB_K_PROBE = 4 };
static inline uint64_t ib_wrid(int peer, int kind, int qp, uint32_t idx) {
    return ((uint64_t)peer << 40) | ((uint64_t)kind << 36) | ((uint64_t)qp << 28) | (idx & 0xfffffffu);
}

typedef struct {
    uint32_t magic;
    uint32_t seq;        /* grant number in this channel */
    uint64_t addr;       /* where the sender writes */
    uint32_t rkey;
    uint32_t len;        /* bytes to write there */
    uint64_t xfer_bytes; /* the receiver's whole transfer, checked against the sender's */
} ib_cts_t;
_Static_assert(sizeof(ib_cts_t) == IB_MSG_BYTES, "CTS message size");

typedef struct {
    ib_cts_t grant[IB_SLOTS]; /* received grants, by seq % IB_SLOTS */
    bool have[IB_SLOTS];
    uint32_t next;            /* next grant to fill */
    uint64_t posted, acked;   /* bytes posted / completed in this channel since the connection started */
    uint32_t len[IB_SLOTS];
    bool busy[IB_SLOTS];      /* a write of that grant in flight (its staging slot in use): pending > 0 */
    uint8_t pending[IB_SLOTS]; /* writes of that grant posted and not completed (2 while it is written again) */
    uint8_t q[IB_SLOTS];      /* QP the grant's clear-to-send came on: its data goes there */
    uint8_t wrail[IB_SLOTS];  /* rail of the grant's last write */
    bool unacked[IB_SLOTS];   /* written, bytes not yet counted in `acked` */
    bool again[IB_SLOTS];     /* granted again after its rail died (its write must be done once more) */
    bool resend[IB_SLOTS];    /* granted again, not yet written again */
    bool regranted[IB_SLOTS]; /* a grant of that slot came again (IB_REGRANT_MAGIC): regrant_seq says which */
    uint32_t regrant_seq[IB_SLOTS]; /* its number: the first clear-to-send of that number, if it comes after (it
                                     * was in the dead rail's completion queue), is stale and ignored */
    uint32_t wseq[IB_SLOTS];  /* grant number written from that slot */
    size_t soff[IB_SLOTS];    /* offset of the grant's bytes in the send's source */
    zccl_ib_mr_entry_t *pin[IB_SLOTS];
    uint8_t pin_rail[IB_SLOTS];
    bool active;              /* a send to this peer is in progress */
    uint64_t end;             /* value of `posted` once the current send is fully written */
} ib_tx_t;

typedef struct {
    uint32_t next, delivered; /* grants issued / delivered */
    uint32_t len[IB_SLOTS];
    bool arrived[IB_SLOTS];
    bool staged[IB_SLOTS];    /* false: the grant pointed into the user's buffer */
    zccl_ib_mr_entry_t *pin[IB_SLOTS];
    uint8_t pin_rail[IB_SLOTS];
    uint8_t q[IB_SLOTS];      /* QP the grant's clear-to-send went on */
    bool gdr;                 /* the current receive lands in device memory (it cannot fail over to staging) */
    uint64_t granted;         /* bytes of the current receive granted so far */
    uint64_t bytes;           /* bytes of the current receive */
    bool active;
} ib_rx_t;

typedef struct {
    struct rdma_cm_id *id[IB_MAX_QPS];
    bool up[IB_MAX_QPS];      /* ESTABLISHED seen (and, active side, the peer's proof checked) */
    int sq_out[IB_MAX_QPS];   /* send WRs in flight per QP */
    uint8_t nonce_c[IB_MAX_QPS][ZCCL_NONCE_BYTES];
    bool used;                /* this peer is reached over IB */
    int nrails;               /* rails of this pair: min(ours, the peer's) */
    int nqp;                  /* QPs of this pair: nrails x ZCCL_IB_QPS_PER_CONN */
    int off_tx, off_rx;       /* QP offset of our grants' direction (our sends) and of the peer's sends */
    uint8_t *buf;             /* send staging | receive staging | CTS out | receive buffers */
    struct ibv_mr *mr[IB_MAX_RAILS]; /* buf registered on each rail's PD */
    ib_tx_t tx;
    ib_rx_t rx;
    int probes_done;          /* our probe writes completed */
    zccl_result_t err;        /* first failure seen on this connection */
    char errmsg[400];
    bool gone;                /* the peer disconnected or exited: what it sent before may still sit in the CQ, so
                                 a transfer with it fails only once what arrived is consumed (gone_msg says why) */
    char gone_msg[400];
    /* failover between rails (nrails > 1) */
    bool dead[IB_MAX_RAILS];  /* rail lost for this pair: its QPs are in the error state and carry nothing more */
    bool synced[IB_MAX_RAILS]; /* our grants of that rail granted again and IB_SYNC_MAGIC sent */
    bool recover;             /* a dead rail's grants still to grant again (when a send queue has room) */
    char dead_why[IB_MAX_RAILS][160];
    uint64_t regrants, rewrites; /* grants granted again / chunks written again after a rail died */
} ib_peer_t;

/* One rail: an HCA port with its own context, PD, completion queue and channel, probe buffers and registration
 * cache. Two rails on two ports of one device share the context (and its asynchronous events). */
typedef struct {
    struct rdma_cm_id *listen;
    struct ibv_context *ctx;
    char dev[32];
    int port, gid_index;
    zccl_sockaddr_t addr;
    struct ibv_pd *pd;
    struct ibv_comp_channel *cch;
    struct ibv_cq *cq;
    bool armed;
    bool own_events;          /* this rail reads its context's asynchronous events (the first rail of a device) */
    uint8_t *probe_src, *probe_dst;
    struct ibv_mr *probe_src_mr, *probe_dst_mr;
    zccl_ib_mr_cache_t cache;
    zccl_gdr_mode_t gdr;
    uint64_t tx_bytes;        /* data bytes written over this rail (completed writes) */
    uint64_t rx_bytes;        /* data bytes that arrived over this rail */
} ib_rail_t;

struct zccl_ib_comm {
    zccl_ib_knobs_t k;
    struct rdma_event_channel *ech;
    ib_rail_t rail[IB_MAX_RAILS];
    int nrails;
    int link;
    char devs[160];           /* "rxe0:1,rxe1:1", for messages */
    int epfd;                 /* several rails: an epoll descriptor over every rail's completion channel */
    int ready_fd;             /* an eventfd that is always readable: wait_fd's answer when work is pending */
    int probes_in;            /* probes peers wrote into us */
    ib_peer_t *peer;
    size_t chunk;
    int qps;                  /* ZCCL_IB_QPS_PER_CONN: QPs per rail of a connection */
    int nqp;                  /* most QPs of a connection: nrails x qps (buffers are sized for it) */
    bool cache_on;
    /* The GDR flush (ib_gdr.c): an RC QP connected to itself on the first rail, with a CQ of its own and a
     * registered host byte it reads into; flush_why says why there is none (then calls needing a flush take the
     * staged path). */
    struct ibv_cq *flush_cq;
    struct ibv_qp *flush_qp;
    uint8_t *flush_buf;
    struct ibv_mr *flush_mr;
    char flush_why[200];
    uint64_t flushes;         /* flushes completed */
    unsigned progress_calls;  /* every 256th progress() also reads the async and rdma_cm events */
    zccl_result_t dev_err;    /* device-wide failure (port down, device fatal) */
    bool up;                  /* every connection is up: from now on a rail that dies fails over (several rails) */
    bool in_recover;          /* zccl__ib_recover runs (it polls completion queues itself) */
    char dev_errmsg[400];
};
extern const zccl_transport_ops_t zccl_transport_ib; /* transport/ib.c */
#define IB_OF(c) ((struct zccl_ib_comm *)zccl__tp_state((c), &zccl_transport_ib))

/* ib.c */
/** Polls up to `max` completions and records their effect in the channels; failures go to the peer's err. */
int zccl__ib_poll_cq(zccl_tp_comm_t *comm, int max);
/** Posts receive `idx` of QP q of peer p. */
int zccl__ib_post_recv(struct zccl_ib_comm *ib, int p, int q, uint32_t idx);
/** Records the first failure of peer p (later ones are dropped). */
void zccl__ib_fail_peer(zccl_tp_comm_t *comm, int p, zccl_result_t res, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/** Reads pending async and rdma_cm events without blocking (device errors, disconnections). */
void zccl__ib_poll_events(zccl_tp_comm_t *comm);
/** Offsets into a peer's buffer. */
size_t zccl__ib_peer_buf_bytes(const struct zccl_ib_comm *ib);
uint8_t *zccl__ib_send_slot(struct zccl_ib_comm *ib, int p, uint32_t seq);
uint8_t *zccl__ib_recv_slot(struct zccl_ib_comm *ib, int p, uint32_t seq);
ib_cts_t *zccl__ib_cts_out(struct zccl_ib_comm *ib, int p, uint32_t seq);
uint8_t *zccl__ib_msg_buf(struct zccl_ib_comm *ib, int p, int q, uint32_t idx);

/** The rail of QP q of a connection. */
static inline int ib_qp_rail(const struct zccl_ib_comm *ib, int q) { return q / ib->qps; }

/** The QP of grant seq in a direction of offset off: (seq + off) % nqp, moved a rail on (same QP index within the
 *  rail) while that rail is dead for the pair; -1 when every rail is dead. One rail: (seq + off) % nqp. */
static inline int ib_grant_qp(const struct zccl_ib_comm *ib, const ib_peer_t *pe, uint32_t seq, int off) {
    return zccl__ib_grant_qp(seq, off, pe->nqp, ib->qps, pe->dead);
}

/** Whether id is one of the rails' rdma_cm listeners. */
static inline bool zccl__ib_is_listener(const struct zccl_ib_comm *ib, const struct rdma_cm_id *id) {
    for (int k = 0; k < ib->nrails; k++)
        if (id == ib->rail[k].listen) return true;
    return false;
}

/* ib_conn.c */
zccl_result_t zccl__ib_connect_all(zccl_tp_comm_t *comm, uint64_t deadline_ns);

/* ib_gdr.c */
zccl_gdr_mode_t zccl__ib_gdr_detect(struct ibv_pd *pd);
/** ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0): 1 when it fails with EBADF (dma-buf supported), else 0; why says it. */
int zccl__ib_gdr_probe_dmabuf(struct ibv_pd *pd, char *why, size_t len);
/** Registers [addr, addr+len) for local and remote write: GPU memory through dma-buf or peer memory when the
 *  build and machine allow it, host memory with ibv_reg_mr. NULL (errno set) when it cannot be registered. */
struct ibv_mr *zccl__ib_reg(struct ibv_pd *pd, zccl_gdr_mode_t gdr, void *addr, size_t len);
/** The GPUDirect mode all rails share (ZCCL_GDR_NONE when one of them cannot register device memory). */
zccl_gdr_mode_t zccl__ib_gdr_mode(const struct zccl_ib_comm *ib);
/** Opens the flush QP (a loopback RC QP on the first rail's port); on failure records why in ib->flush_why. */
void zccl__ib_flush_open(struct zccl_ib_comm *ib);
void zccl__ib_flush_close(struct zccl_ib_comm *ib);
/** Reads one byte at addr (rkey) over the flush QP and waits for it: device writes before it are then visible. */
zccl_result_t zccl__ib_flush(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, uint64_t addr, uint32_t rkey);

#endif

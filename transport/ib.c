/*
 * ib.c — InfiniBand / RoCE verbs transport: the ops table, the data path and failure handling.
 *
 * Data moves by RDMA WRITE WITH IMMEDIATE into memory the receiver granted with a clear-to-send message
 * (ib_verbs.h describes the protocol); connections are made in ib_conn.c. Nothing here blocks: progress() polls
 * the one completion queue of the communicator (bounded), then advances its transfer by at most IB_SLOTS chunks.
 * wait_fd() arms the completion channel and returns its descriptor, so a rank with nothing to do sleeps in poll().
 *
 * Failures: a work completion with an error status, an asynchronous event (port down, device fatal, QP fatal) or
 * an rdma_cm disconnection is recorded with the peer, the device and ibv_wc_status_str, and returned as
 * ZCCL_REMOTE_ERROR (the peer or the path failed: retries exhausted, remote access error, disconnect) or
 * ZCCL_SYSTEM_ERROR (local device failure) from the next progress() or check_peer() that involves that peer.
 * With several rails a pair fails over instead: a port error, a failed work completion or a fatal QP event on one
 * rail drops that rail for the pair and its chunks move to the live rails (rail_lost, recover_peer; the protocol is
 * in ib_verbs.h); only the loss of the last rail fails the pair.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "ib.h"
#include "transport.h"

#ifndef ZCCL_HAVE_IB
/* Built without libibverbs/librdmacm: the transport exists so ZCCL_TRANSPORT=ib can say why it is not there. */
bool zccl__ib_built(void) { return false; }

zccl_result_t zccl__ib_local_info(zccl_tp_comm_t *comm, zccl_ib_peer_info_t *me) {
    memset(me, 0, sizeof *me);
    if (!strcasecmp(zccl__cfg_str(ZCCL_CFG_TRANSPORT), "ib"))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TRANSPORT=ib: the IB transport is absent (zccl was built "
                           "without libibverbs/librdmacm; install rdma-core's libibverbs-dev and librdmacm-dev and "
                           "rebuild)");
    ZCCL_INFO(ZCCL_LOG_IB, "IB transport absent (built without libibverbs/librdmacm)");
    return ZCCL_SUCCESS;
}
static zccl_result_t ib_setup(zccl_tp_comm_t *comm) {
    return zccl__error(ZCCL_INTERNAL_ERROR, "IB transport absent from this build");
}
static bool ib_can_reach(const zccl_tp_comm_t *comm, int peer) { return false; }
static zccl_result_t ib_progress(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    return zccl__error(ZCCL_INTERNAL_ERROR, "IB transport absent from this build");
}
static int ib_wait_fd(zccl_tp_comm_t *comm, const zccl_xfer_t *x, short *events) { return -1; }
static zccl_result_t ib_check_peer(zccl_tp_comm_t *comm, int peer) { return ZCCL_SUCCESS; }
static void ib_teardown(zccl_tp_comm_t *comm) {}
static void ib_poison(zccl_tp_comm_t *comm) {}
static int ib_describe_rails(const zccl_tp_comm_t *comm, char *buf, size_t len) {
    if (len) buf[0] = '\0';
    return 0;
}
#else
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include "ib_verbs.h"

bool zccl__ib_built(void) { return true; }

/* ---- buffers of a peer -------------------------------------------------------------------------------------- */

/* A peer's buffer: send staging | receive staging | clear-to-send messages (one per grant slot, then one
 * IB_SYNC_MAGIC per rail) | receive buffers. */
#define IB_CTS_BUFS (IB_SLOTS + IB_MAX_RAILS)
size_t zccl__ib_peer_buf_bytes(const struct zccl_ib_comm *ib) {
    return 2 * IB_SLOTS * ib->chunk + IB_CTS_BUFS * sizeof(ib_cts_t) + (size_t)ib->nqp * IB_RQ_DEPTH * IB_MSG_BYTES;
}
uint8_t *zccl__ib_send_slot(struct zccl_ib_comm *ib, int p, uint32_t seq) {
    return ib->peer[p].buf + (size_t)(seq % IB_SLOTS) * ib->chunk;
}
uint8_t *zccl__ib_recv_slot(struct zccl_ib_comm *ib, int p, uint32_t seq) {
    return ib->peer[p].buf + (size_t)(IB_SLOTS + seq % IB_SLOTS) * ib->chunk;
}
ib_cts_t *zccl__ib_cts_out(struct zccl_ib_comm *ib, int p, uint32_t seq) {
    return (ib_cts_t *)(ib->peer[p].buf + 2 * IB_SLOTS * ib->chunk) + seq % IB_SLOTS;
}
static ib_cts_t *sync_out(struct zccl_ib_comm *ib, int p, int rail) {
    return (ib_cts_t *)(ib->peer[p].buf + 2 * IB_SLOTS * ib->chunk) + IB_SLOTS + rail;
}
uint8_t *zccl__ib_msg_buf(struct zccl_ib_comm *ib, int p, int q, uint32_t idx) {
    return ib->peer[p].buf + 2 * IB_SLOTS * ib->chunk + IB_CTS_BUFS * sizeof(ib_cts_t) +
           ((size_t)q * IB_RQ_DEPTH + idx) * IB_MSG_BYTES;
}

int zccl__ib_post_recv(struct zccl_ib_comm *ib, int p, int q, uint32_t idx) {
    struct ibv_sge sge = {(uint64_t)(uintptr_t)zccl__ib_msg_buf(ib, p, q, idx), IB_MSG_BYTES,
                          ib->peer[p].mr[ib_qp_rail(ib, q)]->lkey};
    struct ibv_recv_wr wr = {.wr_id = ib_wrid(p, IB_K_RECV, q, idx), .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(ib->peer[p].id[q]->qp, &wr, &bad);
}

void zccl__ib_fail_peer(zccl_tp_comm_t *comm, int p, zccl_result_t res, const char *fmt, ...) {
    ib_peer_t *pe = &IB_OF(comm)->peer[p];
    if (pe->err != ZCCL_SUCCESS) return;
    pe->err = res;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pe->errmsg, sizeof pe->errmsg, fmt, ap);
    va_end(ap);
    ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB connection to rank %d failed: %s", comm->rank, p, pe->errmsg);
}

/* The peer left (rdma_cm disconnect, or its process exited on this host): remembered, not yet a failure — a peer
 * that finished its part and destroyed its communicator may have sent everything we still wait for. */
static void ib_peer_gone(zccl_tp_comm_t *comm, int p, const char *fmt, ...) {
    ib_peer_t *pe = &IB_OF(comm)->peer[p];
    if (pe->gone) return;
    pe->gone = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pe->gone_msg, sizeof pe->gone_msg, fmt, ap);
    va_end(ap);
    ZCCL_INFO(ZCCL_LOG_IB, "rank %d: rank %d left: %s", comm->rank, p, pe->gone_msg);
}

/* Fails the transfers with peer p, which left while this rank still needed it. A rank that gives up disconnects all
 * its connections (ib_poison), so the first departure seen may be a bystander's reaction to another rank's death:
 * the message also names every other rank known to have left, those whose process exited first. */
static void ib_fail_gone(zccl_tp_comm_t *comm, int p) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    zccl__ib_poll_events(comm);
    char others[300] = "";
    size_t o = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < comm->nranks && o < sizeof others; r++) {
            ib_peer_t *pr = &ib->peer[r];
            if (r == p || !pr->used) continue;
            const bool exited = comm->peers[r].host_hash == comm->peers[comm->rank].host_hash &&
                                zccl__local_pid_exited(comm->peers[r].pid);
            if (pass == 0 && exited)
                o += (size_t)snprintf(others + o, sizeof others - o, "%s rank %d (pid %d, same host) has exited",
                                      o ? ";" : "", r, (int)comm->peers[r].pid);
            else if (pass == 1 && !exited && pr->gone)
                o += (size_t)snprintf(others + o, sizeof others - o, "%s rank %d disconnected too", o ? ";" : "", r);
        }
    zccl__ib_fail_peer(comm, p, ZCCL_REMOTE_ERROR, "%s%s%s", ib->peer[p].gone_msg, o ? "; also:" : "", others);
}

/* ---- failover between rails (ib_verbs.h describes the protocol) ---------------------------------------------- */

static int post_one(ib_peer_t *pe, int q, uint64_t wr_id, struct ibv_sge *sge, enum ibv_wr_opcode opcode,
                    uint32_t imm_be, uint64_t remote_addr, uint32_t rkey);
static int poll_rail(zccl_tp_comm_t *comm, int k, int max);

/* The pair's live rails (dead false) or lost ones (dead true), "rxe0:1,rxe2:1". */
static void rails_of(const struct zccl_ib_comm *ib, const ib_peer_t *pe, bool dead, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = '\0';
    for (int k = 0; k < pe->nrails && o < len; k++)
        if (pe->dead[k] == dead)
            o += (size_t)snprintf(buf + o, len - o, "%s%s:%d", o ? "," : "", ib->rail[k].dev, ib->rail[k].port);
}
/* Whether pair pe lost a rail; if so, live (or "none") and gone get its live and lost rails (len bytes each). */
static bool lost_rails(const struct zccl_ib_comm *ib, const ib_peer_t *pe, char *live, char *gone, size_t len) {
    bool lost = false;
    for (int k = 0; pe->used && k < pe->nrails; k++) lost |= pe->dead[k];
    if (!lost) return false;
    rails_of(ib, pe, false, live, len);
    if (!live[0]) snprintf(live, len, "none");
    rails_of(ib, pe, true, gone, len);
    return true;
}

/* Rail k of the connection with peer p died (why: the cause, for messages). Several rails and every connection up:
 * its QPs go to the error state (nothing more lands through them; their work requests are flushed), new grants skip
 * it, and zccl__ib_recover grants its outstanding grants again on a live QP. The last rail fails the peer. */
static void rail_lost(zccl_tp_comm_t *comm, int p, int k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void rail_lost(zccl_tp_comm_t *comm, int p, int k, const char *fmt, ...) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    ib_peer_t *pe = &ib->peer[p];
    if (k < 0 || k >= pe->nrails || pe->dead[k] || pe->err != ZCCL_SUCCESS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pe->dead_why[k], sizeof pe->dead_why[k], fmt, ap);
    va_end(ap);
    pe->dead[k] = true;
    for (int q = k * ib->qps; q < (k + 1) * ib->qps; q++) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        if (pe->id[q] && pe->id[q]->qp) ibv_modify_qp(pe->id[q]->qp, &a, IBV_QP_STATE);
    }
    char live[160];
    rails_of(ib, pe, false, live, sizeof live);
    if (!live[0]) {
        char lost[300];
        size_t o = 0;
        for (int j = 0; j < pe->nrails && o < sizeof lost; j++)
            if (j != k)
                o += (size_t)snprintf(lost + o, sizeof lost - o, "%s%s port %d (IB rail %d): %s", o ? "; " : "",
                                      ib->rail[j].dev, ib->rail[j].port, j, pe->dead_why[j]);
        zccl__ib_fail_peer(comm, p, ZCCL_REMOTE_ERROR, "rank %d lost every IB rail to rank %d (%s; the last, %s port "
                           "%d (IB rail %d): %s)", comm->rank, p, lost, ib->rail[k].dev, ib->rail[k].port, k,
                           pe->dead_why[k]);
        return;
    }
    ZCCL_WARN(ZCCL_LOG_IB, "rank %d: IB rail %s port %d (rail %d) to rank %d lost (%s); its chunks move on; live rails "
              "to rank %d: %s", comm->rank, ib->rail[k].dev, ib->rail[k].port, k, p, pe->dead_why[k], p, live);
    pe->recover = true;
}

/* Whether failover applies to peer p: several rails and every connection up (before that a failure fails init). */
static bool failover_on(const struct zccl_ib_comm *ib, const ib_peer_t *pe) { return ib->up && pe->nrails > 1; }

/* Grants again, on a live QP, the grants of peer p's dead rails that have not arrived, then sends IB_SYNC_MAGIC
 * for each such rail on the same QP (after them, in order). Waits (recover stays set) while that QP's send queue
 * lacks room. */
static void recover_peer(zccl_tp_comm_t *comm, int p) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    ib_peer_t *pe = &ib->peer[p];
    ib_rx_t *rx = &pe->rx;
    for (int k = 0; k < pe->nrails && pe->err == ZCCL_SUCCESS; k++) {
        if (!pe->dead[k] || pe->synced[k]) continue;
        /* Completions of writes that arrived before the rail's QPs went to the error state are in its queue. */
        while (poll_rail(comm, k, 64) > 0) {}
        const int c = ib_grant_qp(ib, pe, 0, 0), kc = c < 0 ? 0 : ib_qp_rail(ib, c);
        if (c < 0 || pe->err != ZCCL_SUCCESS) return;
        int need = 1;
        for (uint32_t g = rx->delivered; g != rx->next; g++)
            need += !rx->arrived[g % IB_SLOTS] && ib_qp_rail(ib, rx->q[g % IB_SLOTS]) == k;
        if (pe->sq_out[c] + need > IB_SQ_DEPTH) return; /* later: completions free room */
        for (uint32_t g = rx->delivered; g != rx->next; g++) {
            const uint32_t s = g % IB_SLOTS;
            if (rx->arrived[s] || ib_qp_rail(ib, rx->q[s]) != k) continue;
            if (!rx->staged[s]) {
                if (rx->gdr) {
                    zccl__ib_fail_peer(comm, p, ZCCL_SYSTEM_ERROR, "IB rail %s port %d (rail %d) to rank %d lost (%s) "
                                       "while grant %u pointed into device memory: a device-memory receive cannot "
                                       "move to another rail", ib->rail[k].dev, ib->rail[k].port, k, p,
                                       pe->dead_why[k], g);
                    return;
                }
                /* It pointed into the user's buffer, registered on the dead rail: it lands in staging now (a write
                 * that reached the buffer before holds the same bytes). */
                if (rx->pin[s]) zccl__ib_mr_unpin(&ib->rail[rx->pin_rail[s]].cache, rx->pin[s]), rx->pin[s] = NULL;
                rx->staged[s] = true;
            }
            ib_cts_t *m = zccl__ib_cts_out(ib, p, g);
            m->magic = IB_REGRANT_MAGIC;
            m->addr = (uint64_t)(uintptr_t)zccl__ib_recv_slot(ib, p, g);
            m->rkey = pe->mr[kc]->rkey;
            struct ibv_sge sge = {(uint64_t)(uintptr_t)m, sizeof *m, pe->mr[kc]->lkey};
            if (post_one(pe, c, ib_wrid(p, IB_K_CTS, c, g), &sge, IBV_WR_SEND, 0, 0, 0) != 0) {
                zccl__ib_fail_peer(comm, p, ZCCL_SYSTEM_ERROR, "ibv_post_send of a grant moved off IB rail %d to rank "
                                   "%d on %s: %s", k, p, ib->rail[kc].dev, strerror(errno));
                return;
            }
            pe->sq_out[c]++;
            pe->regrants++;
            rx->q[s] = (uint8_t)c;
        }
        ib_cts_t *m = sync_out(ib, p, k);
        *m = (ib_cts_t){.magic = IB_SYNC_MAGIC, .seq = rx->next, .len = (uint32_t)k};
        struct ibv_sge sge = {(uint64_t)(uintptr_t)m, sizeof *m, pe->mr[kc]->lkey};
        if (post_one(pe, c, ib_wrid(p, IB_K_CTS, c, 0), &sge, IBV_WR_SEND, 0, 0, 0) != 0) {
            zccl__ib_fail_peer(comm, p, ZCCL_SYSTEM_ERROR, "ibv_post_send of the loss of IB rail %d to rank %d on %s: "
                               "%s", k, p, ib->rail[kc].dev, strerror(errno));
            return;
        }
        pe->sq_out[c]++;
        pe->synced[k] = true;
        ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB rail %d to rank %d: %d grant%s granted again on %s (QP %d)", comm->rank, k,
                  p, need - 1, need == 2 ? "" : "s", ib->rail[kc].dev, c);
    }
    pe->recover = false;
    for (int k = 0; k < pe->nrails; k++) pe->recover |= pe->dead[k] && !pe->synced[k];
}

/* Runs the recovery of every peer that lost a rail (after completions and events were read). */
static void ib_recover(zccl_tp_comm_t *comm) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (ib->in_recover || !ib->up) return;
    ib->in_recover = true;
    for (int p = 0; p < comm->nranks; p++)
        if (ib->peer[p].used && ib->peer[p].recover && ib->peer[p].err == ZCCL_SUCCESS) recover_peer(comm, p);
    ib->in_recover = false;
}

/* The bytes of the write from tx slot s count as acknowledged (once). */
static void tx_ack(ib_tx_t *tx, uint32_t s) {
    if (!tx->unacked[s]) return;
    tx->unacked[s] = false;
    tx->acked += tx->len[s];
}

static bool ib_remote_status(enum ibv_wc_status s) {
    return s == IBV_WC_RETRY_EXC_ERR || s == IBV_WC_RNR_RETRY_EXC_ERR || s == IBV_WC_REM_ACCESS_ERR ||
           s == IBV_WC_REM_INV_REQ_ERR || s == IBV_WC_REM_OP_ERR || s == IBV_WC_REM_ABORT_ERR ||
           s == IBV_WC_WR_FLUSH_ERR || s == IBV_WC_RESP_TIMEOUT_ERR;
}

static const char *kind_name(int k) {
    return k == IB_K_RECV ? "receive" : k == IB_K_DATA ? "data write" : k == IB_K_CTS ? "clear-to-send" : "probe write";
}

/* ---- completions -------------------------------------------------------------------------------------------- */

static void on_recv(zccl_tp_comm_t *comm, const struct ibv_wc *wc, int p, int q, uint32_t idx) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    ib_peer_t *pe = &ib->peer[p];
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        const uint32_t imm = ntohl(wc->imm_data);
        if (imm == IB_PROBE_IMM) {
            ib->probes_in++;
        } else {
            ib_rx_t *rx = &pe->rx;
            const uint32_t s = imm % IB_SLOTS;
            if (imm - rx->delivered < rx->next - rx->delivered && rx->arrived[s] && wc->byte_len == rx->len[s] &&
                failover_on(ib, pe)) {
                /* written again after a rail died although it had arrived: the same bytes at the same place */
            } else if (imm - rx->delivered >= rx->next - rx->delivered || rx->arrived[s] || wc->byte_len != rx->len[s])
                zccl__ib_fail_peer(comm, p, ZCCL_REMOTE_ERROR, "rank %d wrote grant %u (%u bytes) which rank %d did "
                                   "not expect (grants %u..%u outstanding): protocol violation", p, imm, wc->byte_len,
                                   comm->rank, rx->delivered, rx->next);
            else {
                rx->arrived[s] = true;
                ib->rail[ib_qp_rail(ib, q)].rx_bytes += wc->byte_len;
            }
        }
    } else if (wc->opcode == IBV_WC_RECV) {
        ib_cts_t m;
        memcpy(&m, zccl__ib_msg_buf(ib, p, q, idx), sizeof m);
        ib_tx_t *tx = &pe->tx;
        const uint32_t s = m.seq % IB_SLOTS;
        const bool fo = failover_on(ib, pe) && wc->byte_len == sizeof m;
        if (fo && m.magic == IB_SYNC_MAGIC && m.len < (uint32_t)pe->nrails) {
            /* The peer dropped rail m.len: it granted again, before this on this QP, each grant of it that had not
             * arrived; a write on that rail of any other grant below m.seq arrived. */
            const int k = (int)m.len;
            rail_lost(comm, p, k, "rank %d reported it lost", p);
            for (uint32_t j = 0; j < IB_SLOTS; j++)
                if (tx->unacked[j] && !tx->again[j] && tx->wrail[j] == k && m.seq - 1 - tx->wseq[j] < 0x80000000u)
                    tx_ack(tx, j);
        } else if (fo && m.magic == IB_REGRANT_MAGIC && m.seq - tx->next < IB_SLOTS && m.len != 0 &&
                   m.len <= ib->chunk * 64) {
            if (tx->unacked[s] && tx->wseq[s] == m.seq - IB_SLOTS) tx_ack(tx, s);
            tx->grant[s] = m; /* not written yet (its first grant may have been lost): it goes on this QP */
            tx->have[s] = true;
            tx->q[s] = (uint8_t)q;
            tx->regranted[s] = true;
            tx->regrant_seq[s] = m.seq;
        } else if (fo && m.magic == IB_REGRANT_MAGIC && tx->next - 1 - m.seq < IB_SLOTS && tx->wseq[s] == m.seq &&
                   tx->unacked[s]) {
            tx->grant[s] = m; /* written on the dead rail and not arrived: written again, on this QP */
            tx->q[s] = (uint8_t)q;
            tx->again[s] = true;
            tx->resend[s] = true;
            tx->regranted[s] = true;
            tx->regrant_seq[s] = m.seq;
        } else if (fo && m.magic == IB_CTS_MAGIC && tx->regranted[s] && tx->regrant_seq[s] == m.seq) {
            /* The first grant of a number already granted again, read late from the dead rail's completion queue
             * (completion queues of different rails are polled in no common order): the grant again replaced it. */
            ZCCL_INFO(ZCCL_LOG_IB, "rank %d: grant %u from rank %d came on IB rail %d after its grant again: "
                      "ignored", comm->rank, m.seq, p, ib_qp_rail(ib, q));
        } else if (wc->byte_len != sizeof m || m.magic != IB_CTS_MAGIC || m.seq - tx->next >= IB_SLOTS ||
                   tx->have[s] || m.len == 0 || m.len > ib->chunk * 64)
            zccl__ib_fail_peer(comm, p, ZCCL_REMOTE_ERROR, "rank %d sent a malformed clear-to-send (%u bytes, grant "
                               "%u, magic 0x%x, expected %u..%u)", p, wc->byte_len, m.seq, m.magic, tx->next,
                               tx->next + IB_SLOTS - 1);
        else {
            /* Grant g + IB_SLOTS comes only once grant g was delivered: its write arrived. */
            if (tx->unacked[s] && tx->wseq[s] == m.seq - IB_SLOTS) tx_ack(tx, s);
            tx->grant[s] = m;
            tx->have[s] = true;
            tx->q[s] = (uint8_t)q;
        }
    }
    if (pe->dead[ib_qp_rail(ib, q)]) return; /* nothing more is received on a dead rail */
    if (pe->err == ZCCL_SUCCESS && zccl__ib_post_recv(ib, p, q, idx) != 0)
        zccl__ib_fail_peer(comm, p, ZCCL_SYSTEM_ERROR, "ibv_post_recv on %s: %s", ib->rail[ib_qp_rail(ib, q)].dev,
                           strerror(errno));
}

/* Up to `max` completions of rail k's completion queue. */
static int poll_rail(zccl_tp_comm_t *comm, int k, int max) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    ib_rail_t *r = &ib->rail[k];
    struct ibv_wc wc[16];
    int total = 0;
    while (total < max) {
        const int n = ibv_poll_cq(r->cq, 16, wc);
        if (n <= 0) {
            if (n < 0 && ib->dev_err == ZCCL_SUCCESS) {
                ib->dev_err = ZCCL_SYSTEM_ERROR;
                snprintf(ib->dev_errmsg, sizeof ib->dev_errmsg, "ibv_poll_cq on %s (rail %d) failed (%d)", r->dev, k,
                         n);
            }
            break;
        }
        total += n;
        for (int i = 0; i < n; i++) {
            const struct ibv_wc *w = &wc[i];
            const int p = (int)(w->wr_id >> 40), kind = (int)((w->wr_id >> 36) & 0xf), q = (int)((w->wr_id >> 28) & 0xff);
            const uint32_t idx = (uint32_t)(w->wr_id & 0xfffffff);
            if (p < 0 || p >= comm->nranks || !ib->peer[p].used) continue;
            ib_peer_t *pe = &ib->peer[p];
            if (kind != IB_K_RECV) pe->sq_out[q]--;
            if (kind == IB_K_DATA) { /* the write's slot and registration are free once no write of it is posted */
                ib_tx_t *tx = &pe->tx;
                const uint32_t s = idx % IB_SLOTS;
                if (tx->pending[s] > 0) tx->pending[s]--;
                tx->busy[s] = tx->pending[s] > 0;
                if (w->status == IBV_WC_SUCCESS && (tx->wseq[s] & 0xfffffffu) == idx) {
                    tx_ack(tx, s);
                    r->tx_bytes += tx->len[s];
                }
                if (!tx->busy[s] && tx->pin[s])
                    zccl__ib_mr_unpin(&ib->rail[tx->pin_rail[s]].cache, tx->pin[s]), tx->pin[s] = NULL;
                if (w->status == IBV_WC_SUCCESS) continue;
            }
            if (w->status != IBV_WC_SUCCESS && failover_on(ib, pe)) {
                /* Flushed or failed work requests of a rail already dropped are not new failures. */
                if (!pe->dead[k])
                    rail_lost(comm, p, k, "%s to its %s completed with \"%s\" (status %d, vendor error 0x%x)",
                              kind_name(kind), comm->peers[p].ib.rail[k].dev, ibv_wc_status_str(w->status),
                              (int)w->status, w->vendor_err);
                continue;
            }
            if (w->status != IBV_WC_SUCCESS) {
                char rl[24] = "";
                if (ib->nrails > 1) snprintf(rl, sizeof rl, " (IB rail %d)", k);
                zccl__ib_fail_peer(comm, p, ib_remote_status(w->status) ? ZCCL_REMOTE_ERROR : ZCCL_SYSTEM_ERROR,
                                   "%s on %s port %d%s to rank %d (its %s) completed with \"%s\" (status %d, vendor "
                                   "error 0x%x)%s", kind_name(kind), r->dev, r->port, rl, p,
                                   comm->peers[p].ib.rail[ib_qp_rail(ib, q)].dev,
                                   ibv_wc_status_str(w->status), (int)w->status, w->vendor_err,
                                   w->status == IBV_WC_RETRY_EXC_ERR ? ": the peer stopped acknowledging (exited, "
                                   "link down, or ZCCL_IB_TIMEOUT too short)" :
                                   w->status == IBV_WC_WR_FLUSH_ERR ? ": the connection was closed" :
                                   w->status == IBV_WC_LOC_QP_OP_ERR ? ": the local port may be down" : "");
                continue;
            }
            switch (kind) {
            case IB_K_RECV: on_recv(comm, w, p, q, idx); break;
            case IB_K_PROBE: pe->probes_done++; break;
            default: break;
            }
        }
    }
    return total;
}

int zccl__ib_poll_cq(zccl_tp_comm_t *comm, int max) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    int total = 0;
    for (int k = 0; k < ib->nrails; k++) total += poll_rail(comm, k, max);
    ib_recover(comm);
    return total;
}

/* The asynchronous events of rail k's device context (read by the first rail of each device). */
static void poll_rail_events(zccl_tp_comm_t *comm, int k) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    ib_rail_t *r = &ib->rail[k];
    struct pollfd pfd = {r->ctx->async_fd, POLLIN, 0};
    while (poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN)) {
        struct ibv_async_event ev;
        if (ibv_get_async_event(r->ctx, &ev) != 0) break;
        const enum ibv_event_type t = ev.event_type;
        ZCCL_INFO(ZCCL_LOG_IB, "rank %d: %s: asynchronous event \"%s\"", comm->rank, r->dev, ibv_event_type_str(t));
        bool moved = false; /* a port error on one of several rails: the pairs on it fail over */
        for (int j = 0; t == IBV_EVENT_PORT_ERR && ib->up && ib->nrails > 1 && j < ib->nrails; j++) {
            if (ib->rail[j].ctx != r->ctx || ib->rail[j].port != (int)ev.element.port_num) continue;
            moved = true;
            for (int p = 0; p < comm->nranks; p++) {
                ib_peer_t *pe = &ib->peer[p];
                if (!pe->used || j >= pe->nrails) continue;
                if (pe->nrails > 1)
                    rail_lost(comm, p, j, "asynchronous event \"%s\" on %s port %d: the link went down",
                              ibv_event_type_str(t), ib->rail[j].dev, ib->rail[j].port);
                else
                    zccl__ib_fail_peer(comm, p, ZCCL_SYSTEM_ERROR, "%s port %d (IB rail %d): asynchronous event \"%s\" "
                                       "(the link went down)", ib->rail[j].dev, ib->rail[j].port, j,
                                       ibv_event_type_str(t));
            }
        }
        if (!moved && (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_CQ_ERR)) {
            int port = r->port, rail = k; /* the port the event names, when it names one */
            for (int j = 0; t == IBV_EVENT_PORT_ERR && j < ib->nrails; j++)
                if (ib->rail[j].ctx == r->ctx && ib->rail[j].port == (int)ev.element.port_num)
                    port = ib->rail[j].port, rail = j;
            char rl[24] = "";
            if (ib->nrails > 1) snprintf(rl, sizeof rl, " (IB rail %d)", rail);
            if (ib->dev_err == ZCCL_SUCCESS) {
                ib->dev_err = ZCCL_SYSTEM_ERROR;
                snprintf(ib->dev_errmsg, sizeof ib->dev_errmsg, "%s port %d%s: asynchronous event \"%s\"%s", r->dev,
                         port, rl, ibv_event_type_str(t), t == IBV_EVENT_PORT_ERR ? " (the link went down)" : "");
            }
        } else if (t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR) {
            for (int p = 0; p < comm->nranks; p++)
                for (int q = 0; ib->peer[p].used && q < ib->peer[p].nqp; q++)
                    if (ib->peer[p].id[q] && ib->peer[p].id[q]->qp == ev.element.qp && failover_on(ib, &ib->peer[p]))
                        rail_lost(comm, p, ib_qp_rail(ib, q), "QP %d: asynchronous event \"%s\"", q,
                                  ibv_event_type_str(t));
                    else if (ib->peer[p].id[q] && ib->peer[p].id[q]->qp == ev.element.qp)
                        zccl__ib_fail_peer(comm, p, ZCCL_REMOTE_ERROR, "QP %d to rank %d on %s (rail %d): asynchronous "
                                           "event \"%s\"", q, p, ib->rail[ib_qp_rail(ib, q)].dev, ib_qp_rail(ib, q),
                                           ibv_event_type_str(t));
        }
        ibv_ack_async_event(&ev);
    }
}

void zccl__ib_poll_events(zccl_tp_comm_t *comm) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    for (int k = 0; k < ib->nrails; k++)
        if (ib->rail[k].own_events) poll_rail_events(comm, k);
    struct rdma_cm_event *ev;
    while (rdma_get_cm_event(ib->ech, &ev) == 0) {
        const bool from_peer = ev->id && !zccl__ib_is_listener(ib, ev->id);
        const int p = from_peer ? (int)((uintptr_t)ev->id->context >> 8) - 1 : -1;
        const int k = from_peer ? ib_qp_rail(ib, (int)((uintptr_t)ev->id->context & 0xff)) : 0;
        const enum rdma_cm_event_type t = ev->event;
        const int st = ev->status;
        if (t == RDMA_CM_EVENT_CONNECT_REQUEST) rdma_reject(ev->id, NULL, 0);
        const bool req = t == RDMA_CM_EVENT_CONNECT_REQUEST;
        struct rdma_cm_id *rid = ev->id;
        rdma_ack_cm_event(ev);
        if (req) { rdma_destroy_id(rid); continue; }
        if (p < 0 || p >= comm->nranks || !ib->peer[p].used) continue;
        if (ib->peer[p].dead[k]) continue; /* a dropped rail's connection: its end is no news */
        if (t == RDMA_CM_EVENT_DEVICE_REMOVAL && failover_on(ib, &ib->peer[p]))
            rail_lost(comm, p, k, "rdma_cm reports \"%s\" (status %d)", rdma_event_str(t), st);
        else if (t == RDMA_CM_EVENT_DEVICE_REMOVAL)
            zccl__ib_fail_peer(comm, p, ZCCL_SYSTEM_ERROR, "rdma_cm reports \"%s\" (status %d) for the connection "
                               "to rank %d on %s", rdma_event_str(t), st, p, ib->rail[k].dev);
        else if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_TIMEWAIT_EXIT)
            ib_peer_gone(comm, p, "rdma_cm reports \"%s\" (status %d) for the connection to rank %d on %s: the peer "
                         "exited, aborted or lost its link", rdma_event_str(t), st, p, ib->rail[k].dev);
    }
    ib_recover(comm);
}

static int reg_entry(void *ctx, void *addr, size_t len, void **handle, uint32_t *lkey, uint32_t *rkey) {
    ib_rail_t *r = ctx;
    struct ibv_mr *mr = zccl__ib_reg(r->pd, r->gdr, addr, len);
    if (!mr) return -1;
    *handle = mr;
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return 0;
}
static void dereg_entry(void *ctx, void *handle) { ibv_dereg_mr(handle); }

/* ---- setup -------------------------------------------------------------------------------------------------- */

/* The rail `rank` starts its sends on with a peer over `nrails` rails: the one paired with its GPU when it published
 * one that the pair uses; else its index among the ranks of its host (by rank order), so rank i of a host starts on
 * rail i mod R, as the TCP rails do (transport/rail.c). Both sides of a pair compute the same from the records. */
static int start_index(const zccl_tp_comm_t *comm, int rank, int nrails) {
    const int g = comm->peers[rank].ib.start_rail;
    if (g >= 0 && g < nrails) return g;
    int li = 0;
    for (int q = 0; q < rank; q++) li += comm->peers[q].host_hash == comm->peers[rank].host_hash;
    return li;
}

/* Rail k's completion channel and queue, sized for npeers connections of ib->qps QPs on it. */
static zccl_result_t rail_cq(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, int k, int npeers) {
    ib_rail_t *r = &ib->rail[k];
    if (!(r->cch = ibv_create_comp_channel(r->ctx)))
        return zccl__syserror(errno, "rank %d: ibv_create_comp_channel on %s", comm->rank, r->dev);
    int fl = fcntl(r->cch->fd, F_GETFL);
    if (fl < 0 || fcntl(r->cch->fd, F_SETFL, fl | O_NONBLOCK) != 0)
        return zccl__syserror(errno, "completion channel non-blocking");
    struct ibv_device_attr da;
    if (ibv_query_device(r->ctx, &da) != 0) return zccl__syserror(errno, "ibv_query_device on %s", r->dev);
    const long cqe = (long)npeers * ib->qps * (IB_RQ_DEPTH + IB_SQ_DEPTH) + 16;
    if (cqe > da.max_cqe)
        return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: %d IB peers x %d QPs need a completion queue of %ld entries; "
                           "%s allows %d (lower ZCCL_IB_QPS_PER_CONN)", comm->rank, npeers, ib->qps, cqe, r->dev,
                           da.max_cqe);
    if (!(r->cq = ibv_create_cq(r->ctx, (int)cqe, NULL, r->cch, 0)))
        return zccl__syserror(errno, "rank %d: ibv_create_cq of %ld entries on %s", comm->rank, cqe, r->dev);
    if (ib->epfd >= 0) {
        struct epoll_event ee = {.events = EPOLLIN, .data.u32 = (uint32_t)k};
        if (epoll_ctl(ib->epfd, EPOLL_CTL_ADD, r->cch->fd, &ee) != 0)
            return zccl__syserror(errno, "rank %d: epoll_ctl for %s's completion channel", comm->rank, r->dev);
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t ib_setup(zccl_tp_comm_t *comm) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (!ib || ib->nrails == 0 || !ib->rail[0].pd)
        return zccl__error(ZCCL_INTERNAL_ERROR, "IB transport chosen without a device");
    ib->chunk = comm->chunk_bytes;
    ib->qps = ib->k.qps_per_conn;
    ib->nqp = ib->nrails * ib->qps;
    const uint64_t deadline = zccl__now_ns() + (uint64_t)comm->init_timeout_ms * 1000000ull;
    if (!(ib->peer = calloc((size_t)comm->nranks, sizeof *ib->peer)))
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    int npeers = 0;
    for (int p = 0; p < comm->nranks; p++) {
        ib_peer_t *pe = &ib->peer[p];
        if (p == comm->rank || comm->tp[p] != &zccl_transport_ib) continue;
        pe->used = true;
        npeers++;
        const int theirs = comm->peers[p].ib.nrails;
        const int n = ZCCL_MIN(ib->nrails, theirs);
        const zccl_ib_rail_plan_t plan = zccl__ib_rail_plan(ib->nrails, theirs, ib->qps, start_index(comm, comm->rank, n),
                                                            start_index(comm, p, n));
        pe->nrails = plan.nrails;
        pe->nqp = plan.nqp;
        pe->off_tx = plan.off_tx;
        pe->off_rx = plan.off_rx;
        if (theirs != ib->nrails)
            ZCCL_INFO(ZCCL_LOG_IB, "rank %d has %d IB rail%s, this rank (%d) %d (%s): the connection uses the first "
                      "%d (fallback: the smaller count)", p, theirs, theirs > 1 ? "s" : "", comm->rank, ib->nrails,
                      ib->devs, pe->nrails);
    }
    if ((ib->ready_fd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        return zccl__syserror(errno, "eventfd");
    if (ib->nrails > 1 && (ib->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        return zccl__syserror(errno, "epoll_create1");
    for (int k = 0; k < ib->nrails; k++) ZCCL_CHECK(rail_cq(comm, ib, k, npeers));
    const size_t pb = zccl__ib_peer_buf_bytes(ib);
    for (int p = 0; p < comm->nranks; p++) {
        ib_peer_t *pe = &ib->peer[p];
        if (!pe->used) continue;
        if (!(pe->buf = aligned_alloc(4096, (pb + 4095) & ~(size_t)4095)))
            return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %zu bytes of IB buffers", pb);
        for (int k = 0; k < pe->nrails; k++)
            if (!(pe->mr[k] = ibv_reg_mr(ib->rail[k].pd, pe->buf, pb,
                                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)))
                return zccl__syserror(errno, "rank %d: ibv_reg_mr of %zu bytes for rank %d on %s (RLIMIT_MEMLOCK?)",
                                      comm->rank, pb, p, ib->rail[k].dev);
    }
    ib->cache_on = ib->k.zcopy_bytes > 0;
    for (int k = 0; k < ib->nrails; k++)
        ZCCL_CHECK(zccl__ib_mr_cache_init(&ib->rail[k].cache, 256, (size_t)4 << 30, reg_entry, dereg_entry,
                                          &ib->rail[k]));
    if (zccl__ib_gdr_mode(ib) != ZCCL_GDR_NONE) zccl__ib_flush_open(ib); /* GPUs before Hopper need it (ib_gdr.c) */
    ZCCL_CHECK(zccl__ib_connect_all(comm, deadline));
    ib->up = true;
    return ZCCL_SUCCESS;
}

static bool ib_can_reach(const zccl_tp_comm_t *comm, int peer) {
    const zccl_ib_peer_info_t *a = &comm->peers[comm->rank].ib, *b = &comm->peers[peer].ib;
    if (a->nrails <= 0 || b->nrails <= 0 || a->link != b->link) return false;
    if (a->link == 1 && a->subnet != b->subnet) return false; /* InfiniBand: another subnet needs a router */
    for (int k = 0; k < ZCCL_MIN(a->nrails, b->nrails); k++) /* rail k connects to the peer's rail k */
        if (a->rail[k].addr.sa.ss_family != b->rail[k].addr.sa.ss_family) return false;
    return true;
}

/* ---- data path ---------------------------------------------------------------------------------------------- */

static zccl_result_t peer_error(zccl_tp_comm_t *comm, int p) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (ib->peer[p].err != ZCCL_SUCCESS) zccl__ib_poll_events(comm); /* a port error explains a failed write best */
    if (ib->dev_err != ZCCL_SUCCESS)
        return zccl__error(ib->dev_err, "rank %d: cannot reach rank %d over IB: %s", comm->rank, p, ib->dev_errmsg);
    ib_peer_t *pe = &ib->peer[p];
    if (pe->err != ZCCL_SUCCESS && pe->nrails > 1)
        return zccl__error(pe->err, "rank %d: IB connection to rank %d (%d rails of %s) failed: %s", comm->rank, p,
                           pe->nrails, ib->devs, pe->errmsg);
    if (pe->err != ZCCL_SUCCESS)
        return zccl__error(pe->err, "rank %d: IB connection to rank %d (%s -> %s) failed: %s", comm->rank, p,
                           ib->rail[0].dev, comm->peers[p].ib.rail[0].dev, pe->errmsg);
    return ZCCL_SUCCESS;
}

static zccl_ib_mr_entry_t *zcopy(struct zccl_ib_comm *ib, int rail, const void *addr, size_t bytes,
                                 size_t whole) {
    if (!ib->cache_on || whole < ib->k.zcopy_bytes) return NULL;
    return zccl__ib_mr_get(&ib->rail[rail].cache, addr, bytes); /* registered on that rail's PD */
}

/* Posts one signalled work request of one scatter-gather entry on QP q of the peer (RDMA write with immediate:
 * remote_addr/rkey and imm; send: none). Returns ibv_post_send's result. */
static int post_one(ib_peer_t *pe, int q, uint64_t wr_id, struct ibv_sge *sge, enum ibv_wr_opcode opcode,
                    uint32_t imm_be, uint64_t remote_addr, uint32_t rkey) {
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = imm_be;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(pe->id[q]->qp, &wr, &bad);
}

/* A send or a receive moving on: ib_progress has checked the device and the peer and hands both in. */
typedef zccl_result_t (*ib_move_fn)(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, ib_peer_t *pe, zccl_xfer_t *x,
                                    bool *progressed);

static zccl_result_t ib_send(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, ib_peer_t *pe, zccl_xfer_t *x,
                             bool *progressed) {
    const int p = x->peer;
    ib_tx_t *tx = &pe->tx;
    if (!x->started) {
        x->started = true;
        x->t[0] = tx->posted; /* the channel's byte count when this send began */
        tx->end = tx->posted + x->bytes;
        tx->active = true;
    }
    /* Grants written on a rail that died and granted again on a live QP: written once more, through staging. */
    for (uint32_t s = 0; s < IB_SLOTS; s++) {
        if (!tx->resend[s]) continue;
        const int q = tx->q[s], k = ib_qp_rail(ib, q);
        if (pe->dead[k] || pe->sq_out[q] >= IB_SQ_DEPTH) continue;
        const ib_cts_t *g = &tx->grant[s];
        if (x->gdr)
            return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: IB rail %d to rank %d lost (%s) during a device-memory "
                               "send: its chunks cannot move to another rail", comm->rank, tx->wrail[s], p,
                               pe->dead_why[tx->wrail[s]]);
        uint8_t *slot = zccl__ib_send_slot(ib, p, tx->wseq[s]);
        memcpy(slot, x->src + tx->soff[s], g->len);
        struct ibv_sge sge = {(uint64_t)(uintptr_t)slot, g->len, pe->mr[k]->lkey};
        if (post_one(pe, q, ib_wrid(p, IB_K_DATA, q, tx->wseq[s]), &sge, IBV_WR_RDMA_WRITE_WITH_IMM,
                     htonl(tx->wseq[s]), g->addr, g->rkey) != 0)
            return zccl__syserror(errno, "rank %d: ibv_post_send of %u bytes to rank %d on %s (a chunk moved off a "
                                  "lost rail)", comm->rank, g->len, p, ib->rail[k].dev);
        pe->sq_out[q]++;
        pe->rewrites++;
        tx->pending[s]++;
        tx->busy[s] = true;
        tx->wrail[s] = (uint8_t)k;
        tx->resend[s] = false;
        tx->again[s] = false; /* a fresh write on rail k: if k dies too, its sync settles it like any other */
        *progressed = true;
    }
    for (int n = 0; n < IB_SLOTS && x->done < x->bytes; n++) {
        const uint32_t seq = tx->next, s = seq % IB_SLOTS;
        const int q = tx->q[s], k = ib_qp_rail(ib, q);
        /* A grant on a dead rail waits for the receiver to grant it again on a live one. */
        if (!tx->have[s] || tx->busy[s] || tx->resend[s] || pe->dead[k] || pe->sq_out[q] >= IB_SQ_DEPTH) break;
        const ib_cts_t *g = &tx->grant[s];
        if (g->xfer_bytes != x->bytes || g->len > x->bytes - x->done)
            return zccl__error(ZCCL_INVALID_USAGE, "rank %d expects %llu bytes from rank %d but rank %d sends %zu "
                               "(the ranks called different collectives or counts?)", p,
                               (unsigned long long)g->xfer_bytes, comm->rank, comm->rank, x->bytes);
        struct ibv_sge sge;
        zccl_ib_mr_entry_t *e = x->gdr ? zccl__ib_mr_get(&ib->rail[k].cache, x->src + x->done, g->len)
                                       : zcopy(ib, k, x->src + x->done, g->len, x->bytes);
        if (!e && x->gdr)
            return zccl__error(ZCCL_INTERNAL_ERROR, "rank %d: device memory at %p (%u bytes) for rank %d is not "
                               "registered with %s: a GDR send must not go through host memory", comm->rank,
                               (const void *)(x->src + x->done), g->len, p, ib->rail[k].dev);
        if (e) {
            sge = (struct ibv_sge){(uint64_t)(uintptr_t)(x->src + x->done), g->len, e->lkey};
        } else {
            uint8_t *slot = zccl__ib_send_slot(ib, p, seq);
            memcpy(slot, x->src + x->done, g->len);
            sge = (struct ibv_sge){(uint64_t)(uintptr_t)slot, g->len, pe->mr[k]->lkey};
        }
        if (post_one(pe, q, ib_wrid(p, IB_K_DATA, q, seq), &sge, IBV_WR_RDMA_WRITE_WITH_IMM, htonl(seq), g->addr,
                     g->rkey) != 0) {
            if (e) zccl__ib_mr_unpin(&ib->rail[k].cache, e);
            return zccl__syserror(errno, "rank %d: ibv_post_send of %u bytes to rank %d on %s", comm->rank, g->len, p,
                                  ib->rail[k].dev);
        }
        pe->sq_out[q]++;
        if (tx->unacked[s]) tx_ack(tx, s); /* cannot happen: grant seq comes only once seq - IB_SLOTS arrived */
        tx->len[s] = g->len;
        tx->busy[s] = true;
        tx->pending[s] = 1;
        tx->wseq[s] = seq;
        tx->wrail[s] = (uint8_t)k;
        tx->soff[s] = x->done;
        tx->unacked[s] = true;
        tx->again[s] = false;
        tx->pin[s] = e;
        tx->pin_rail[s] = (uint8_t)k;
        tx->have[s] = false;
        tx->next++;
        tx->posted += g->len;
        x->done += g->len;
        *progressed = true;
    }
    if (x->done == x->bytes && tx->acked >= x->t[0] + x->bytes) { /* the source may be reused */
        x->complete = true;
        tx->active = false;
        *progressed = true;
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t ib_recv(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, ib_peer_t *pe, zccl_xfer_t *x,
                             bool *progressed) {
    const int p = x->peer;
    ib_rx_t *rx = &pe->rx;
    if (!x->started) {
        x->started = true;
        rx->granted = 0;
        rx->bytes = x->bytes;
        rx->gdr = x->gdr;
        rx->active = true;
    }
    /* Deliver what arrived, in grant order. */
    while (rx->delivered != rx->next && rx->arrived[rx->delivered % IB_SLOTS]) {
        const uint32_t s = rx->delivered % IB_SLOTS;
        if (rx->staged[s]) zccl__xfer_deliver(x, zccl__ib_recv_slot(ib, p, rx->delivered), rx->len[s]);
        else x->done += rx->len[s]; /* written straight into the destination */
        if (rx->pin[s]) {
            if (x->gdr) { /* the flush reads the last landed byte (GDR with a flush runs on one rail: ib_gdr.c) */
                x->t[1] = (uint64_t)(uintptr_t)(x->dst + x->done - 1);
                x->t[2] = rx->pin[s]->rkey;
            }
            zccl__ib_mr_unpin(&ib->rail[rx->pin_rail[s]].cache, rx->pin[s]);
            rx->pin[s] = NULL;
        }
        rx->arrived[s] = false;
        rx->delivered++;
        *progressed = true;
    }
    /* Grant more: at most IB_SLOTS outstanding. */
    while (rx->granted < x->bytes && rx->next - rx->delivered < IB_SLOTS) {
        const uint32_t seq = rx->next, s = seq % IB_SLOTS;
        const int q = ib_grant_qp(ib, pe, seq, pe->off_rx), k = q < 0 ? 0 : ib_qp_rail(ib, q);
        if (q < 0 || pe->sq_out[q] >= IB_SQ_DEPTH) break;
        const uint32_t len = (uint32_t)ZCCL_MIN(ib->chunk, x->bytes - rx->granted);
        ib_cts_t *m = zccl__ib_cts_out(ib, p, seq);
        zccl_ib_mr_entry_t *e = x->gdr ? zccl__ib_mr_get(&ib->rail[k].cache, x->dst + rx->granted, len)
                              : x->op2 ? NULL : zcopy(ib, k, x->dst + rx->granted, len, x->bytes);
        if (!e && x->gdr)
            return zccl__error(ZCCL_INTERNAL_ERROR, "rank %d: device memory at %p (%u bytes) for rank %d is not "
                               "registered with %s: a GDR receive must not go through host memory", comm->rank,
                               (void *)(x->dst + rx->granted), len, p, ib->rail[k].dev);
        m->magic = IB_CTS_MAGIC;
        m->seq = seq;
        m->len = len;
        m->xfer_bytes = x->bytes;
        if (e) {
            m->addr = (uint64_t)(uintptr_t)(x->dst + rx->granted);
            m->rkey = e->rkey;
        } else {
            m->addr = (uint64_t)(uintptr_t)zccl__ib_recv_slot(ib, p, seq);
            m->rkey = pe->mr[k]->rkey;
        }
        struct ibv_sge sge = {(uint64_t)(uintptr_t)m, sizeof *m, pe->mr[k]->lkey};
        if (post_one(pe, q, ib_wrid(p, IB_K_CTS, q, seq), &sge, IBV_WR_SEND, 0, 0, 0) != 0) {
            if (e) zccl__ib_mr_unpin(&ib->rail[k].cache, e);
            return zccl__syserror(errno, "rank %d: ibv_post_send of a clear-to-send to rank %d on %s", comm->rank, p,
                                  ib->rail[k].dev);
        }
        pe->sq_out[q]++;
        rx->len[s] = len;
        rx->staged[s] = (e == NULL);
        rx->pin[s] = e;
        rx->pin_rail[s] = (uint8_t)k;
        rx->q[s] = (uint8_t)q;
        rx->arrived[s] = false;
        rx->next++;
        rx->granted += len;
        *progressed = true;
    }
    if (x->done == x->bytes) {
        if (x->gdr && x->gdr_flush) ZCCL_CHECK(zccl__ib_flush(comm, ib, x->t[1], (uint32_t)x->t[2]));
        x->complete = true;
        rx->active = false;
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t ib_progress(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (x->bytes == 0) { /* both sides skip empty transfers alike */
        x->complete = true;
        *progressed = true;
        return ZCCL_SUCCESS;
    }
    if (zccl__ib_poll_cq(comm, 64) > 0) *progressed = true;
    /* Events are also read by check_peer() when the rank stalls; reading them here too (one poll(2) in 256 calls)
     * bounds the time to notice a port error while completions of other peers keep the rank busy. */
    if ((++ib->progress_calls & 255) == 0) zccl__ib_poll_events(comm);
    ZCCL_CHECK(peer_error(comm, x->peer));
    if (ib->dev_err != ZCCL_SUCCESS) return peer_error(comm, x->peer);
    ib_peer_t *pe = &ib->peer[x->peer];
    const ib_move_fn move = x->is_send ? ib_send : ib_recv;
    if (!pe->gone) return move(comm, ib, pe, x, progressed);
    /* The peer left: take in everything that completed, let the transfer use it, and fail only if it still cannot
     * finish (a further grant or acknowledgement will never come). */
    while (zccl__ib_poll_cq(comm, 64) > 0) *progressed = true;
    zccl_result_t res = move(comm, ib, pe, x, progressed);
    if (res == ZCCL_SUCCESS && x->complete) return ZCCL_SUCCESS;
    if (res == ZCCL_SUCCESS && x->is_send && x->done == x->bytes) {
        /* Every byte was written; only acknowledgements are missing, and a receiver that finished and destroyed its
         * communicator may take its QP down before its device acknowledged the last write. Whether a peer that left
         * got the data does not change this rank's result, so the send is done (staging slots stay busy until their
         * work requests are flushed). */
        x->complete = true;
        pe->tx.active = false;
        *progressed = true;
        return ZCCL_SUCCESS;
    }
    ib_fail_gone(comm, x->peer);
    return peer_error(comm, x->peer);
}

static int ib_wait_fd(zccl_tp_comm_t *comm, const zccl_xfer_t *x, short *events) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    for (int k = 0; k < ib->nrails; k++) {
        ib_rail_t *r = &ib->rail[k];
        struct ibv_cq *c;
        void *cx;
        while (ibv_get_cq_event(r->cch, &c, &cx) == 0) {
            ibv_ack_cq_events(c, 1);
            r->armed = false;
        }
        if (!r->armed && ibv_req_notify_cq(r->cq, 0) == 0) r->armed = true;
    }
    *events = POLLIN;
    /* A completion that arrived before the CQ was armed raises no event: look once more. */
    if (zccl__ib_poll_cq(comm, 64) > 0) return ib->ready_fd;
    /* Several rails: the epoll descriptor is readable when any rail's completion channel is. */
    return ib->nrails > 1 ? ib->epfd : ib->rail[0].cch->fd;
}

static zccl_result_t ib_check_peer(zccl_tp_comm_t *comm, int peer) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (!ib || !ib->peer || !ib->peer[peer].used) return ZCCL_SUCCESS;
    zccl__ib_poll_events(comm);
    ib_peer_t *pe = &ib->peer[peer];
    if (!pe->tx.active && !pe->rx.active) return ZCCL_SUCCESS; /* nothing of ours depends on it now */
    /* A peer on this host that died is seen at once; across hosts its rdma_cm disconnect or a failed write tells. */
    if (!pe->gone && pe->err == ZCCL_SUCCESS && comm->peers[peer].host_hash == comm->peers[comm->rank].host_hash &&
        zccl__local_pid_exited(comm->peers[peer].pid))
        ib_peer_gone(comm, peer, "rank %d (pid %d, same host) has exited", peer, (int)comm->peers[peer].pid);
    /* A peer that left fails our transfer with it only if the transfer needs something more from it: a grant for a
     * send not yet fully written, or data for a receive not yet granted or arrived. A send whose every byte is
     * written but not yet acknowledged (a receiver that finished may leave before its device acknowledged the last
     * write), or a receive whose data all arrived, is completed by ib_progress in the engine's next pass. */
    if (pe->gone && pe->err == ZCCL_SUCCESS) {
        while (zccl__ib_poll_cq(comm, 64) > 0) {}
        bool needs_peer = pe->tx.active && pe->tx.posted < pe->tx.end;
        if (pe->rx.active) {
            needs_peer |= pe->rx.granted < pe->rx.bytes;
            for (uint32_t g = pe->rx.delivered; g != pe->rx.next; g++) needs_peer |= !pe->rx.arrived[g % IB_SLOTS];
        }
        if (needs_peer) ib_fail_gone(comm, peer);
    }
    return peer_error(comm, peer);
}

/* This rank gave up (a lost peer, a timeout): disconnect every connection, so each peer's rdma_cm reports
 * RDMA_CM_EVENT_DISCONNECTED at once (read by its stall check within 50 ms) and a peer waiting on this rank fails
 * instead of waiting for its deadline; the QPs move to the error state and their work requests are flushed. */
static void ib_poison(zccl_tp_comm_t *comm) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (!ib || !ib->peer) return;
    for (int p = 0; p < comm->nranks; p++)
        for (int q = 0; ib->peer[p].used && q < IB_MAX_QPS; q++)
            if (ib->peer[p].id[q] && ib->peer[p].id[q]->qp) rdma_disconnect(ib->peer[p].id[q]);
}

static void ib_teardown(zccl_tp_comm_t *comm) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (!ib) return;
    for (int p = 0; ib->peer && p < comm->nranks; p++) { /* pairs that lost a rail: what they ended on */
        const ib_peer_t *pe = &ib->peer[p];
        char live[160], gone[160];
        if (!lost_rails(ib, pe, live, gone, sizeof live)) continue;
        ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB rails to rank %d at the end: live %s (lost %s); %llu grant%s of ours "
                  "granted again, %llu chunk%s written again", comm->rank, p, live, gone,
                  (unsigned long long)pe->regrants, pe->regrants == 1 ? "" : "s", (unsigned long long)pe->rewrites,
                  pe->rewrites == 1 ? "" : "s");
    }
    if (ib->peer) {
        for (int p = 0; p < comm->nranks; p++) {
            ib_peer_t *pe = &ib->peer[p];
            for (int q = 0; q < IB_MAX_QPS; q++) {
                if (!pe->id[q]) continue;
                if (pe->id[q]->qp) rdma_destroy_qp(pe->id[q]);
                rdma_destroy_id(pe->id[q]);
            }
            for (int k = 0; k < IB_MAX_RAILS; k++)
                if (pe->mr[k]) ibv_dereg_mr(pe->mr[k]);
            free(pe->buf);
        }
        for (int k = 0; k < ib->nrails; k++) zccl__ib_mr_cache_fini(&ib->rail[k].cache);
    }
    if (ib->peer && ib->nrails > 1) { /* what each rail carried: every rail of a striped connection should have */
        char bl[400];
        size_t o = 0;
        for (int k = 0; k < ib->nrails && o < sizeof bl; k++)
            o += (size_t)snprintf(bl + o, sizeof bl - o, "%s%s port %d %llu B out %llu B in", k ? ", " : "",
                                  ib->rail[k].dev, ib->rail[k].port, (unsigned long long)ib->rail[k].tx_bytes,
                                  (unsigned long long)ib->rail[k].rx_bytes);
        ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB rail bytes: %s", comm->rank, bl);
    }
    for (int k = 0; k < IB_MAX_RAILS; k++) {
        ib_rail_t *r = &ib->rail[k];
        if (r->cq) ibv_destroy_cq(r->cq);
        if (r->cch) ibv_destroy_comp_channel(r->cch);
        if (r->probe_src_mr) ibv_dereg_mr(r->probe_src_mr);
        if (r->probe_dst_mr) ibv_dereg_mr(r->probe_dst_mr);
        if (r->pd) ibv_dealloc_pd(r->pd);
        if (r->listen) rdma_destroy_id(r->listen);
        free(r->probe_src);
        free(r->probe_dst);
    }
    zccl__ib_flush_close(ib);
    if (ib->ech) rdma_destroy_event_channel(ib->ech);
    if (ib->ready_fd >= 0) close(ib->ready_fd);
    if (ib->epfd >= 0) close(ib->epfd);
    free(ib->peer);
    free(ib);
    zccl__tp_set_state(comm, &zccl_transport_ib, NULL);
}

static int ib_describe_rails(const zccl_tp_comm_t *comm, char *buf, size_t len) {
    const struct zccl_ib_comm *ib = IB_OF(comm);
    if (!len) return ib ? ib->nrails : 0;
    buf[0] = '\0';
    if (!ib) return 0;
    size_t o = (size_t)snprintf(buf, len, "IB rail%s ", ib->nrails == 1 ? "" : "s");
    for (int k = 0; k < ib->nrails && o < len; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s:%d", k ? "," : "", ib->rail[k].dev, ib->rail[k].port);
    for (int p = 0; ib->peer && p < comm->nranks && o < len; p++) {
        char live[160], gone[160];
        if (!lost_rails(ib, &ib->peer[p], live, gone, sizeof live)) continue;
        o += (size_t)snprintf(buf + o, len - o, "; to rank %d live %s (lost %s)", p, live, gone);
    }
    return ib->nrails;
}
#endif /* ZCCL_HAVE_IB */

static zccl_result_t ib_why_unreachable(const zccl_tp_comm_t *comm, int peer, char *buf, size_t len) {
    if (comm->peers[comm->rank].ib.nrails <= 0)
        snprintf(buf, len, "no usable RDMA device on this rank (see its INFO log)");
    else if (comm->peers[peer].ib.nrails <= 0)
        snprintf(buf, len, "it has no usable RDMA device (see its INFO log)");
    else
        snprintf(buf, len, "its device is on another link layer, IB subnet or address family than this rank's");
    return ZCCL_INVALID_ARGUMENT;
}

const zccl_transport_ops_t zccl_transport_ib = {
    .name = "ib",
    .link = ZCCL_LINK_NETWORK,
    .why_unreachable = ib_why_unreachable,
    .comm_setup = ib_setup,
    .can_reach = ib_can_reach,
    .progress = ib_progress,
    .wait_fd = ib_wait_fd,
    .check_peer = ib_check_peer,
    .comm_teardown = ib_teardown,
    .poison = ib_poison,
    .describe_rails = ib_describe_rails,
};

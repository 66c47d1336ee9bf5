/*
 * notice.c — notices: a rank that refused or gave up a collective tells every peer why (notice.h).
 */
#include "notice.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "comm.h"
#include "regmem.h"

struct zccl_notice_node {
    struct zccl_notice_node *next;
    int from;
    zccl_notice_msg_t m;
};

/* A peer that cannot be told and need not be: a rank of this host that has exited (connecting to it would retry until
 * the deadline), or one that destroyed its communicator cleanly (its listener is closed; it waits for nothing and
 * keeps no mapping). */
static bool gone(struct zccl_comm *comm, int r) {
    if (comm->tc.peers[r].host_hash == comm->tc.peers[comm->rank].host_hash && zccl__local_pid_exited(comm->tc.peers[r].pid))
        return true;
    return comm->tc.tp && comm->tc.tp[r] && comm->tc.tp[r]->departed && comm->tc.tp[r]->departed(&comm->tc, r);
}

int zccl__notice_send(struct zccl_comm *comm, int kind, uint64_t seq, const char *text, int only) {
    if (comm->nranks < 2 || !comm->tc.peers || !comm->tc.tp) return 0; /* not (or no longer) connected */
    int missed = 0;
    zccl_notice_msg_t m;
    memset(&m, 0, sizeof m);
    m.seq = seq;
    m.kind = kind;
    snprintf(m.text, sizeof m.text, "%s", text ? text : "");
    /* One deadline for all peers: an unreachable host must not hold the failing rank for long; the transports'
     * poison still reaches the peers that the notice does not. */
    const uint64_t deadline = zccl__now_ns() + 2000000000ull;
    char saved[sizeof comm->async_msg];
    snprintf(saved, sizeof saved, "%s", zccl__last_error()); /* failing connects must not replace the caller's error */
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank || (only >= 0 && r != only)) continue;
        if (zccl__now_ns() > deadline) {
            missed++;
            continue;
        }
        if (gone(comm, r)) continue;
        zccl_conn_hdr_t h = {comm->tc.comm_id, comm->rank, ZCCL_CONN_NOTICE};
        int fd = -1;
        /* connect retries a refused connection (a listener not up yet, at init): give a vanished peer 300 ms. */
        const uint64_t peer_deadline = ZCCL_MIN(deadline, zccl__now_ns() + 300000000ull);
        zccl_result_t res = zccl__connect_auth(&comm->tc.peers[r].listen, comm->tc.secret, &h, sizeof h, peer_deadline, &fd);
        if (res == ZCCL_SUCCESS) {
            /* Wait for the peer's acknowledgement: once it came, the peer knows before anything this rank sends
             * afterwards reaches it (a descriptor of this rank's next call is then never taken for a mismatch). */
            char ack = 0;
            res = zccl__send_all(fd, &m, sizeof m, deadline, "notice");
            if (res == ZCCL_SUCCESS) res = zccl__recv_all(fd, &ack, 1, deadline, "notice acknowledgement");
            close(fd);
        }
        /* A peer that is leaving (its service stops before its transports mark it departed) needs no telling: a
         * deregistration, whose caller is told who was missed, gives it a moment to finish. */
        while (kind == ZCCL_NOTICE_DEREG && res != ZCCL_SUCCESS && !gone(comm, r) &&
               zccl__now_ns() < ZCCL_MIN(deadline, peer_deadline + 200000000ull))
            usleep(2000);
        if (res != ZCCL_SUCCESS && !gone(comm, r)) {
            missed++;
            ZCCL_INFO(ZCCL_LOG_COLL, "could not tell rank %d rank %d's notice (kind %d) about #%llu", r, comm->rank,
                      kind, zccl__seq_shown(comm, seq));
        }
    }
    zccl__set_last_error(saved);
    return missed;
}

void zccl__notice_refused_here(struct zccl_comm *comm, uint64_t seq) {
    pthread_mutex_lock(&comm->tc.in_mutex);
    if (comm->nrefused == comm->refused_cap) {
        size_t cap = comm->refused_cap ? 2 * comm->refused_cap : 16;
        uint64_t *p = realloc(comm->refused_here, cap * sizeof *p);
        if (p) {
            comm->refused_here = p;
            comm->refused_cap = cap;
        }
    }
    if (comm->nrefused < comm->refused_cap) comm->refused_here[comm->nrefused++] = seq;
    pthread_mutex_unlock(&comm->tc.in_mutex);
}

void zccl__notice_receive(struct zccl_comm *comm, int fd, int from) {
    struct zccl_notice_node *n = calloc(1, sizeof *n);
    zccl_result_t res = n ? zccl__recv_all(fd, &n->m, sizeof n->m, zccl__now_ns() + 2000000000ull, "notice")
                          : ZCCL_SYSTEM_ERROR;
    if (res == ZCCL_SUCCESS && n->m.kind == ZCCL_NOTICE_DEREG) { /* not kept: acted on, then acknowledged */
        zccl__reg_peer_dropped(comm, from, n->m.seq);
        free(n);
        const char ack = 1;
        zccl__send_all(fd, &ack, 1, zccl__now_ns() + 1000000000ull, "notice acknowledgement");
        close(fd);
        return;
    }
    if (res != ZCCL_SUCCESS || (n->m.kind != ZCCL_NOTICE_REFUSED && n->m.kind != ZCCL_NOTICE_GAVE_UP)) {
        ZCCL_WARN(ZCCL_LOG_COLL, "rank %d: dropped an incomplete or malformed notice from rank %d", comm->rank, from);
        close(fd);
        free(n);
        return;
    }
    n->m.text[sizeof n->m.text - 1] = '\0';
    n->from = from;
    pthread_mutex_lock(&comm->tc.in_mutex);
    n->next = comm->notices;
    comm->notices = n;
    pthread_mutex_unlock(&comm->tc.in_mutex);
    __atomic_add_fetch(&comm->notice_gen, 1, __ATOMIC_RELEASE);
    zccl__doorbell_ring(&comm->tc, comm->rank);
    const char ack = 1; /* recorded: the sender may go on */
    zccl__send_all(fd, &ack, 1, zccl__now_ns() + 1000000000ull, "notice acknowledgement");
    close(fd);
}

static bool refused_here(const struct zccl_comm *comm, uint64_t seq) {
    for (size_t i = comm->nrefused; i-- > 0;)
        if (comm->refused_here[i] == seq) return true;
    return false;
}

zccl_result_t zccl__notice_check(struct zccl_comm *comm, uint64_t seq, const char *what) {
    const uint32_t gen = __atomic_load_n(&comm->notice_gen, __ATOMIC_ACQUIRE);
    if (gen == comm->notice_seen) return ZCCL_SUCCESS;
    pthread_mutex_lock(&comm->tc.in_mutex);
    /* Drop "refused" notices of calls this rank refused too; find the earliest notice that applies to #seq. */
    struct zccl_notice_node **pp = &comm->notices, *hit = NULL;
    bool pending = false;
    while (*pp) {
        struct zccl_notice_node *n = *pp;
        if (n->m.kind == ZCCL_NOTICE_REFUSED && refused_here(comm, n->m.seq)) {
            *pp = n->next;
            free(n);
            continue;
        }
        if (n->m.seq <= seq) {
            if (!hit || n->m.seq < hit->m.seq || (n->m.seq == hit->m.seq && n->m.kind < hit->m.kind)) hit = n;
        } else {
            pending = true; /* a peer is ahead of us: it applies to a later call */
        }
        pp = &n->next;
    }
    char text[sizeof hit->m.text + 64];
    int from = -1, kind = 0;
    uint64_t nseq = 0;
    if (hit) {
        snprintf(text, sizeof text, "%s", hit->m.text);
        from = hit->from;
        kind = hit->m.kind;
        nseq = hit->m.seq;
    }
    /* Look again next time only if something is left that may apply later. */
    if (!hit && !pending) comm->notice_seen = gen;
    pthread_mutex_unlock(&comm->tc.in_mutex);
    if (!hit) return ZCCL_SUCCESS;
    comm->notice_learned = true; /* the sender told every rank: this rank need not tell them again */
    if (kind == ZCCL_NOTICE_REFUSED)
        return zccl__error(ZCCL_REMOTE_ERROR, "%s on rank %d: rank %d refused its call #%llu, so the ranks are out of "
                           "step (the communicator is unusable): %s", what, comm->rank, from,
                           zccl__seq_shown(comm, nseq), text);
    return zccl__error(ZCCL_REMOTE_ERROR, "%s on rank %d: rank %d gave up collective #%llu: %s", what, comm->rank, from,
                       zccl__seq_shown(comm, nseq), text);
}

void zccl__notice_free(struct zccl_comm *comm) {
    while (comm->notices) {
        struct zccl_notice_node *n = comm->notices;
        comm->notices = n->next;
        free(n);
    }
    free(comm->refused_here);
    comm->refused_here = NULL;
    comm->nrefused = comm->refused_cap = 0;
}

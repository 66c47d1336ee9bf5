/*
 * comm.c — the communicator object: its host identity, the service thread that admits authenticated data
 * connections from peers, the settings every rank must share, poisoning after a failure, and freeing it.
 * Creating one (init, split, shrink) is the API layer's (lib/api/comm_init.c, lib/api/comm_split.c); the steps of
 * its setup that choose transports, ring order and waiting policy are in comm_setup.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <openssl/sha.h>
#include "bootstrap.h"
#include "comm.h"
#include "regmem.h"
#include "notice.h"

uint64_t zccl__host_hash(void) {
    char buf[512] = {0};
    gethostname(buf, 255);
    size_t n = strlen(buf);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        n += fread(buf + n, 1, sizeof buf - n - 1, f);
        fclose(f);
    }
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)buf[i]) * 1099511628211ull;
    return h;
}

volatile uint64_t zccl__cma_probe_word = 0;

/* ---- the service thread: admits authenticated data connections from peers ------------------------------------ */

static int service_on_conn(void *ctx, int fd, const void *hdr, size_t hdr_bytes) {
    struct zccl_comm *comm = ctx;
    int from = -1;
    const char *why = NULL;
    if (zccl__conn_hdr_decode(hdr, hdr_bytes, comm->tc.comm_id, comm->rank, comm->nranks, &from, &why) != ZCCL_SUCCESS) {
        zccl_conn_hdr_t h = {0}; /* for the log only */
        if (hdr_bytes >= sizeof h) memcpy(&h, hdr, sizeof h);
        ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: refused a connection with a valid secret but a wrong header (communicator "
                  "%016llx, from rank %d): %s", comm->rank, (unsigned long long)h.comm_id, h.from_rank, why);
        close(fd);
        return 0;
    }
    zccl_conn_hdr_t h;
    memcpy(&h, hdr, sizeof h);
    if (h.kind == ZCCL_CONN_SHRINK) { /* a survivor announces the root of a shrunk communicator */
        zccl_shrink_msg_t m;
        const char *bad = NULL;
        if (zccl__recv_all(fd, &m, sizeof m, zccl__now_ns() + 2000000000ull, "shrink announcement") != ZCCL_SUCCESS)
            bad = "incomplete";
        else if (zccl__sockaddr_check(&m.root, &bad) != ZCCL_SUCCESS)
            bad = bad ? bad : "bad address";
        close(fd);
        if (bad) {
            ZCCL_WARN(ZCCL_LOG_INIT, "rank %d: refused a shrink announcement from rank %d: %s", comm->rank, from, bad);
            return 0;
        }
        pthread_mutex_lock(&comm->tc.in_mutex);
        comm->shrink_msg = m;
        comm->shrink_known = true;
        pthread_cond_broadcast(&comm->shrink_cv);
        pthread_mutex_unlock(&comm->tc.in_mutex);
        return 0;
    }
    if (h.kind == ZCCL_CONN_NOTICE) { /* a peer refused or gave up a collective */
        zccl__notice_receive(comm, fd, from);
        return 0;
    }
    pthread_mutex_lock(&comm->tc.in_mutex);
    bool dup = comm->tc.in_fd[from] >= 0;
    if (!dup) comm->tc.in_fd[from] = fd;
    pthread_mutex_unlock(&comm->tc.in_mutex);
    if (dup) {
        ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: rank %d connected twice; second connection refused", comm->rank, from);
        close(fd);
        return 0;
    }
    zccl__doorbell_ring(&comm->tc, comm->rank);
    return 0;
}

void *zccl__comm_service_main(void *arg) {
    struct zccl_comm *comm = arg;
    zccl__log_set_rank(comm->rank);
    zccl__accept_loop(comm->listen_fd, comm->stop_pipe[0], comm->tc.secret, sizeof(zccl_conn_hdr_t), service_on_conn,
                      comm, 0, NULL);
    return NULL;
}

/* ---- teardown ----------------------------------------------------------------------------------------------- */

void zccl__comm_poison(struct zccl_comm *comm, uint64_t seq) {
    /* The notice first: a peer that reads it fails quoting this rank's reason; one that sees the transports'
     * poison first only learns that this rank left. A rank that failed because of a peer's notice does not pass it
     * on: that peer told every rank already. */
    if (!comm->notice_learned) zccl__notice_send(comm, ZCCL_NOTICE_GAVE_UP, seq, comm->async_msg, -1);
    for (size_t t = 0; zccl__transports[t]; t++)
        if (zccl__transports[t]->poison) zccl__transports[t]->poison(&comm->tc);
}

/* Settings that shape the protocol or the schedules: ranks that disagree on one would stall at init or fail in the
 * middle of a collective with a confusing message, so every rank publishes a hash of each and init compares them. */

/* The rows marked must_match, in table order (the same on every rank running this build); at most ZCCL_CFG_MATCH_MAX. */
static size_t must_match(zccl_cfg_id_t out[ZCCL_CFG_MATCH_MAX]) {
    size_t n = 0;
    for (size_t i = 0; i < zccl__cfg_count() && n < ZCCL_CFG_MATCH_MAX; i++)
        if (zccl__cfg_at(i)->must_match) out[n++] = zccl__cfg_at(i);
    return n;
}

void zccl__comm_cfg_hashes(uint32_t out[ZCCL_CFG_MATCH_MAX]) {
    zccl_cfg_id_t m[ZCCL_CFG_MATCH_MAX];
    const size_t n = must_match(m);
    memset(out, 0, ZCCL_CFG_MATCH_MAX * sizeof *out);
    for (size_t i = 0; i < n; i++) {
        uint32_t h = 2166136261u; /* FNV-1a of the value as the rank sees it (its default when unset) */
        for (const char *p = zccl__cfg_str(m[i]); *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
        out[i] = h | 1u;
    }
}

/* Every rank holds the same table, so every rank fails alike, before any transport is set up. */
zccl_result_t zccl__comm_check_settings(struct zccl_comm *comm) {
    zccl_cfg_id_t m[ZCCL_CFG_MATCH_MAX];
    const size_t n = must_match(m);
    for (int r = 1; r < comm->nranks; r++)
        for (size_t i = 0; i < n; i++)
            if (comm->tc.peers[r].cfg_hash[i] != comm->tc.peers[0].cfg_hash[i]) {
                const char *name = m[i]->name;
                return zccl__error(ZCCL_INVALID_USAGE, "%s differs between rank 0 and rank %d (this is rank %d, where "
                                   "it is \"%s\"): it must be the same on every rank", name, r, comm->rank,
                                   zccl__cfg_str(m[i]));
            }
    return ZCCL_SUCCESS;
}

void zccl__comm_free(struct zccl_comm *comm) {
    if (!comm) return;
    if (comm->service_running) {
        if (write(comm->stop_pipe[1], "x", 1) < 0) { /* the thread also exits when the pipe closes */ }
        pthread_join(comm->service_thread, NULL);
    }
    zccl__reg_comm_gone(comm); /* before teardown: the peers' mapped regions and this comm's registrations */
    for (size_t t = 0; zccl__transports[t]; t++) zccl__transports[t]->comm_teardown(&comm->tc);
    if (comm->stop_pipe[0] >= 0) close(comm->stop_pipe[0]);
    if (comm->stop_pipe[1] >= 0) close(comm->stop_pipe[1]);
    if (comm->listen_fd >= 0) close(comm->listen_fd);
    if (comm->tc.in_fd)
        for (int i = 0; i < comm->nranks; i++)
            if (comm->tc.in_fd[i] >= 0) close(comm->tc.in_fd[i]);
    free(comm->tc.in_fd);
    free(comm->tc.peers);
    free(comm->tc.tp);
    comm->tc.peers = NULL; /* a failed non-blocking creation keeps the shell: nothing may reach through these */
    comm->tc.tp = NULL;
    free(comm->ring);
    zccl__sched_cache_free(&comm->sched_cache);
    free(comm->scratch);
    if (comm->gdr_bounce) zccl__mem_ops(ZCCL_MEM_CUDA)->free(comm->gdr_bounce);
    comm->gdr_bounce = NULL;
    zccl__mem_stage_free(&comm->mem_stage);
    free(comm->desc_in);
    free(comm->desc_mark);
    zccl__notice_free(comm);
    free(comm->tc.chunk_tmp);
    pthread_mutex_destroy(&comm->tc.in_mutex);
    pthread_mutex_destroy(&comm->exec_mutex);
    pthread_cond_destroy(&comm->shrink_cv);
    if (!comm->keep_shell) free(comm);
}

const char *zccl__comm_async_msg(zccl_comm_t comm) { return comm->async_msg; }

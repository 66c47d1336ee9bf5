/*
 * comm_split.c — new communicators from an existing one: zccl_comm_shrink (the survivors of a failure, bootstrapped
 * by the lowest surviving rank) and zccl_comm_split (colour and key, as MPI_Comm_split and ncclCommSplit).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <openssl/sha.h>
#include "api.h"
#include "bootstrap.h"
#include "comm.h"
#include "engine.h"
#include "stream.h"

ZCCL_API zccl_result_t zccl_comm_shrink(zccl_comm_t comm, const int *exclude, int nexclude, zccl_comm_t *newcomm) {
    const char *fn = "zccl_comm_shrink";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (__atomic_load_n(&comm->nb_state, __ATOMIC_ACQUIRE) == ZCCL_IN_PROGRESS)
        return ZCCL_IN_PROGRESS; /* a non-blocking creation still running */
    if (!newcomm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'newcomm' is NULL", fn);
    *newcomm = NULL;
    if (nexclude < 0 || nexclude >= comm->nranks || (nexclude > 0 && !exclude))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'nexclude' = %d must be in [0, nranks-1 = %d] with "
                           "'exclude' non-NULL when > 0", fn, nexclude, comm->nranks - 1);
    const int n = comm->nranks;
    char *out = calloc((size_t)n, 1);
    if (!out) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    zccl_result_t res = ZCCL_SUCCESS;
    for (int i = 0; i < nexclude && res == ZCCL_SUCCESS; i++) {
        const int r = exclude[i];
        if (r < 0 || r >= n || out[r])
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'exclude[%d]' = %d is out of range or listed twice", fn, i, r);
        else if (r == comm->rank)
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'exclude' lists the calling rank %d", fn, r);
        else out[r] = 1;
    }
    /* New ranks: the survivors in their old order. The lowest survivor hosts the new bootstrap root. */
    int newrank = 0, lowest = -1, nsurv = 0;
    for (int r = 0; r < n; r++) {
        if (out[r]) continue;
        if (lowest < 0) lowest = r;
        if (r == comm->rank) newrank = nsurv;
        nsurv++;
    }
    int64_t init_ms = 120000;
    if (res == ZCCL_SUCCESS) res = zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, &init_ms);
    if (res != ZCCL_SUCCESS) { /* rejected calls do not count as a shrink: survivors must agree on the number */
        free(out);
        return res;
    }
    const uint64_t deadline = zccl__now_ns() + (uint64_t)init_ms * 1000000ull;
    const uint64_t seq = ++comm->shrinks;
    zccl_id_info_t info;
    memset(&info, 0, sizeof info);
    memcpy(info.secret, comm->tc.secret, ZCCL_SECRET_BYTES);
    /* Every survivor derives the same new communicator id from the old one, this shrink's number and the set. */
    uint8_t *idbuf = malloc(16 + (size_t)n);
    if (!idbuf && res == ZCCL_SUCCESS) res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    if (idbuf) {
        uint8_t d[SHA256_DIGEST_LENGTH];
        memcpy(idbuf, &comm->tc.comm_id, 8);
        memcpy(idbuf + 8, &seq, 8);
        memcpy(idbuf + 16, out, (size_t)n);
        SHA256(idbuf, 16 + (size_t)n, d);
        memcpy(&info.comm_id, d, sizeof info.comm_id);
        free(idbuf);
    }
    if (res == ZCCL_SUCCESS && comm->rank == lowest) {
        /* Start the new root next to our listener, then tell every other survivor where it is. */
        zccl_sockaddr_t addr = comm->tc.peers[comm->rank].listen;
        if (addr.sa.ss_family == AF_INET) ((struct sockaddr_in *)&addr.sa)->sin_port = 0;
        else ((struct sockaddr_in6 *)&addr.sa)->sin6_port = 0;
        int fd = -1;
        res = zccl__listen(&addr, &fd);
        if (res == ZCCL_SUCCESS) {
            res = zccl__root_start(fd, comm->tc.secret);
            if (res != ZCCL_SUCCESS) close(fd);
        }
        info.root = addr;
        zccl_shrink_msg_t m;
        memset(&m, 0, sizeof m);
        m.shrink_seq = seq;
        m.root = addr;
        for (int r = 0; r < n && res == ZCCL_SUCCESS; r++) {
            if (out[r] || r == comm->rank) continue;
            zccl_conn_hdr_t h = {comm->tc.comm_id, comm->rank, ZCCL_CONN_SHRINK};
            int cfd;
            res = zccl__connect_auth(&comm->tc.peers[r].listen, comm->tc.secret, &h, sizeof h, deadline, &cfd);
            if (res == ZCCL_SUCCESS) {
                res = zccl__send_all(cfd, &m, sizeof m, deadline, "shrink announcement");
                close(cfd);
            }
            if (res != ZCCL_SUCCESS)
                res = zccl__error(res, "%s: cannot tell surviving rank %d where the new communicator starts (exclude "
                                  "it too if it is lost): %s", fn, r, zccl__last_error());
        }
    } else if (res == ZCCL_SUCCESS) {
        /* Wait for the lowest survivor's announcement of this shrink. */
        pthread_mutex_lock(&comm->tc.in_mutex);
        while (!(comm->shrink_known && comm->shrink_msg.shrink_seq == seq)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&comm->shrink_cv, &comm->tc.in_mutex, &ts);
            if (zccl__now_ns() > deadline) break;
        }
        bool ok = comm->shrink_known && comm->shrink_msg.shrink_seq == seq;
        info.root = comm->shrink_msg.root;
        pthread_mutex_unlock(&comm->tc.in_mutex);
        if (!ok)
            res = zccl__error(ZCCL_TIMEOUT, "%s: rank %d (the lowest survivor) did not announce the new communicator "
                              "within ZCCL_INIT_TIMEOUT_MS; do all survivors call zccl_comm_shrink with the same "
                              "'exclude' set?", fn, lowest);
    }
    free(out);
    if (res != ZCCL_SUCCESS) return res;
    ZCCL_INFO(ZCCL_LOG_INIT, "shrink #%llu: rank %d becomes rank %d of %d", (unsigned long long)seq, comm->rank,
              newrank, nsurv);
    return zccl__comm_init(newcomm, nsurv, &info, newrank);
}

/* ---- zccl_comm_split ----------------------------------------------------------------------------------------- */

typedef struct {
    int32_t color, key;
} split_entry_t;

typedef struct {
    uint32_t ok; /* 1: addr is where this group leader's bootstrap root listens; 0: the leader has none */
    uint32_t pad;
    zccl_sockaddr_t addr;
} split_root_t;

/* All-gather of `bytes` bytes per rank over comm, as one ordinary collective (same order rules, same errors). */
static zccl_result_t allgather_bytes(zccl_comm_t comm, const void *mine, void *all, size_t bytes) {
    zccl_op_t o = {.coll = ZCCL_COLL_ALLGATHER, .barrier = false, .sendbuf = mine, .recvbuf = all, .count = bytes, .dt = ZCCL_UINT8, .op = ZCCL_SUM, .root = 0, .in_place = false, .comm = comm, .vcounts = NULL};
    return zccl__op_run(&o);
}

ZCCL_API zccl_result_t zccl_comm_split(zccl_comm_t comm, int color, int key, zccl_comm_t *newcomm) {
    const char *fn = "zccl_comm_split";
    if (newcomm) *newcomm = NULL;
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    ZCCL_CHECK(zccl__comm_ready(comm, fn)); /* non-blocking creation still running: ZCCL_IN_PROGRESS */
    if (!newcomm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'newcomm' is NULL", fn);
    if (color < ZCCL_SPLIT_NOCOLOR)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'color' = %d must be >= 0 or ZCCL_SPLIT_NOCOLOR (-1)",
                           fn, color);
    if (zccl__stream_busy_with(comm))
        return zccl__error(ZCCL_INVALID_USAGE, "%s: comm has operations queued on a stream; synchronize it first, "
                           "since the split is ordered with comm's collectives", fn);
    const int n = comm->nranks;
    split_entry_t me = {color, key}, *all = calloc((size_t)n, sizeof *all);
    split_root_t *roots = calloc((size_t)n, sizeof *roots);
    int *members = malloc((size_t)n * sizeof *members);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!all || !roots || !members) res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %d ranks", fn, n);
    /* Every rank takes part in both exchanges, whatever happens locally, so no rank is left waiting. */
    int64_t init_ms = 120000;
    if (res == ZCCL_SUCCESS) res = zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, &init_ms);
    if (res != ZCCL_SUCCESS) goto out;
    res = allgather_bytes(comm, &me, all, sizeof me);
    if (res != ZCCL_SUCCESS) {
        res = zccl__error(res, "%s: exchanging colors failed: %s", fn, zccl__last_error());
        goto out;
    }
    const uint64_t seq = ++comm->splits;
    /* My group: ranks of my color, ordered by (key, old rank) — insertion sort keeps it stable and simple. */
    int nm = 0, newrank = -1;
    if (color != ZCCL_SPLIT_NOCOLOR) {
        for (int r = 0; r < n; r++) {
            if (all[r].color != color) continue;
            int i = nm++;
            while (i > 0 && all[members[i - 1]].key > all[r].key) { members[i] = members[i - 1]; i--; }
            members[i] = r;
        }
        for (int i = 0; i < nm; i++)
            if (members[i] == comm->rank) newrank = i;
    }
    /* Each group's new rank 0 starts a bootstrap root next to its listener; a second exchange tells the group where. */
    split_root_t mine = {0};
    zccl_result_t lead_res = ZCCL_SUCCESS;
    char lead_err[256] = "";
    if (newrank == 0) {
        zccl_sockaddr_t addr = comm->tc.peers[comm->rank].listen;
        if (addr.sa.ss_family == AF_INET) ((struct sockaddr_in *)&addr.sa)->sin_port = 0;
        else ((struct sockaddr_in6 *)&addr.sa)->sin6_port = 0;
        int fd = -1;
        lead_res = zccl__listen(&addr, &fd);
        if (lead_res == ZCCL_SUCCESS) {
            lead_res = zccl__root_start(fd, comm->tc.secret);
            if (lead_res != ZCCL_SUCCESS) close(fd);
        }
        if (lead_res == ZCCL_SUCCESS) {
            mine.ok = 1;
            mine.addr = addr;
        } else {
            snprintf(lead_err, sizeof lead_err, "%s", zccl__last_error());
        }
    }
    res = allgather_bytes(comm, &mine, roots, sizeof mine);
    if (res != ZCCL_SUCCESS) {
        res = zccl__error(res, "%s: exchanging bootstrap addresses failed: %s", fn, zccl__last_error());
        goto out;
    }
    if (color == ZCCL_SPLIT_NOCOLOR) goto out;
    const int leader = members[0];
    if (!roots[leader].ok) {
        res = newrank == 0 ? zccl__error(lead_res, "%s: cannot start the bootstrap root of color %d: %s", fn, color,
                                         lead_err)
                           : zccl__error(ZCCL_REMOTE_ERROR, "%s: rank %d (new rank 0 of color %d) could not start the "
                                         "group's bootstrap root", fn, leader, color);
        goto out;
    }
    const char *why = NULL;
    if (zccl__sockaddr_check(&roots[leader].addr, &why) != ZCCL_SUCCESS) {
        res = zccl__error(ZCCL_REMOTE_ERROR, "%s: rank %d sent an unusable root address: %s", fn, leader,
                          why ? why : "bad address");
        goto out;
    }
    zccl_id_info_t info;
    memset(&info, 0, sizeof info);
    memcpy(info.secret, comm->tc.secret, ZCCL_SECRET_BYTES);
    info.root = roots[leader].addr;
    { /* The new id: derived from the old one, this split's number and the color, the same on every member. */
        uint8_t idbuf[8 + 8 + 4 + 5], d[SHA256_DIGEST_LENGTH];
        memcpy(idbuf, &comm->tc.comm_id, 8);
        memcpy(idbuf + 8, &seq, 8);
        memcpy(idbuf + 16, &color, 4);
        memcpy(idbuf + 20, "split", 5);
        SHA256(idbuf, sizeof idbuf, d);
        memcpy(&info.comm_id, d, sizeof info.comm_id);
    }
    ZCCL_INFO(ZCCL_LOG_INIT, "split #%llu: rank %d joins color %d as rank %d of %d", (unsigned long long)seq,
              comm->rank, color, newrank, nm);
    res = zccl__comm_init(newcomm, nm, &info, newrank);
out:
    free(all);
    free(roots);
    free(members);
    return res;
}

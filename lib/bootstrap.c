/*
 * bootstrap.c — unique ids and the bootstrap root.
 *
 * The root is a thread of the process that created the id (zccl_get_unique_id) or of rank 0 (zccl_comm_init_env).
 * It only introduces the ranks to each other: once every rank has sent its address and host identity, each gets
 * the whole table and the root exits. Ranks then connect to each other directly, as they need to.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bootstrap.h"

#define ID_MAGIC 0x5a434944u /* "ZCID" */
#define ID_VERSION 1

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t addr_len;
    uint8_t addr[sizeof(struct sockaddr_in6)];
    uint8_t secret[ZCCL_SECRET_BYTES];
} id_layout_t;
_Static_assert(sizeof(id_layout_t) <= ZCCL_UNIQUE_ID_BYTES, "unique id layout too large");

/* What a rank sends the root after the handshake. */
typedef struct {
    int32_t rank;
    int32_t nranks;
    zccl_peer_info_t info;
} root_hello_t;

/* The root's answer: status, then on success nranks entries. */
typedef struct {
    int32_t status; /* 0 ok; 1 rank already taken; 2 nranks mismatch; 3 rank out of range */
    int32_t nranks;
} root_reply_t;

void zccl__id_encode(const zccl_sockaddr_t *root, const uint8_t secret[ZCCL_SECRET_BYTES], zccl_unique_id_t *id) {
    id_layout_t l = {0};
    l.magic = ID_MAGIC;
    l.version = ID_VERSION;
    l.addr_len = (uint16_t)root->len;
    memcpy(l.addr, &root->sa, root->len);
    memcpy(l.secret, secret, ZCCL_SECRET_BYTES);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &l, sizeof l);
}

zccl_result_t zccl__id_decode(const zccl_unique_id_t *id, zccl_id_info_t *out) {
    id_layout_t l;
    memcpy(&l, id->internal, sizeof l);
    if (l.magic != ID_MAGIC || l.version != ID_VERSION)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "argument 'id' is not a zccl unique id (bad magic or version; was "
                           "it created by zccl_get_unique_id and copied whole?)");
    sa_family_t fam;
    memcpy(&fam, l.addr, sizeof fam);
    if (!((fam == AF_INET && l.addr_len == sizeof(struct sockaddr_in)) ||
          (fam == AF_INET6 && l.addr_len == sizeof(struct sockaddr_in6))))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "argument 'id' holds a malformed root address (family %d, %u bytes)",
                           (int)fam, (unsigned)l.addr_len);
    memset(out, 0, sizeof *out);
    memcpy(&out->root.sa, l.addr, l.addr_len);
    out->root.len = l.addr_len;
    memcpy(out->secret, l.secret, ZCCL_SECRET_BYTES);
    uint8_t digest[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)id->internal, sizeof id->internal, digest);
    memcpy(&out->comm_id, digest, sizeof out->comm_id);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__unique_id_set_secret(zccl_unique_id_t *id, const uint8_t secret[16]) {
    zccl_id_info_t info;
    ZCCL_CHECK(zccl__id_decode(id, &info));
    zccl__id_encode(&info.root, secret, id);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__unique_id_address(const zccl_unique_id_t *id, char *host, size_t hostlen, int *port) {
    zccl_id_info_t info;
    ZCCL_CHECK(zccl__id_decode(id, &info));
    if (info.root.sa.ss_family == AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)&info.root.sa;
        inet_ntop(AF_INET, &s->sin_addr, host, (socklen_t)hostlen);
        *port = ntohs(s->sin_port);
    } else {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&info.root.sa;
        inet_ntop(AF_INET6, &s->sin6_addr, host, (socklen_t)hostlen);
        *port = ntohs(s->sin6_port);
    }
    return ZCCL_SUCCESS;
}

/* ---- the root ---------------------------------------------------------------------------------------------- */

typedef struct {
    int listen_fd;
    uint8_t secret[ZCCL_SECRET_BYTES];
    int nranks;      /* from the first hello; -1 before */
    int *fd;         /* per rank */
    zccl_peer_info_t *info;
    int joined;
} root_t;

static void root_refuse(int fd, int32_t status) {
    root_reply_t r = {status, 0};
    zccl__send_all(fd, &r, sizeof r, zccl__now_ns() + 1000000000ull, "bootstrap root refusal");
    close(fd);
}

static int root_on_conn(void *ctx, int fd, const void *hdr) {
    root_t *R = ctx;
    root_hello_t h;
    memcpy(&h, hdr, sizeof h);
    if (R->nranks < 0) {
        if (h.nranks < 1 || h.nranks > 65536) { root_refuse(fd, 2); return 0; }
        R->nranks = h.nranks;
        R->fd = malloc((size_t)h.nranks * sizeof(int));
        R->info = calloc((size_t)h.nranks, sizeof(zccl_peer_info_t));
        if (!R->fd || !R->info) { root_refuse(fd, 2); R->nranks = -1; return 0; }
        for (int i = 0; i < h.nranks; i++) R->fd[i] = -1;
    }
    if (h.nranks != R->nranks) {
        ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: rank %d says nranks=%d but the first rank said %d; refused", h.rank,
                  h.nranks, R->nranks);
        root_refuse(fd, 2);
        return 0;
    }
    if (h.rank < 0 || h.rank >= R->nranks) { root_refuse(fd, 3); return 0; }
    if (R->fd[h.rank] >= 0) {
        ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: rank %d joined twice; the second is refused", h.rank);
        root_refuse(fd, 1);
        return 0;
    }
    R->fd[h.rank] = fd;
    R->info[h.rank] = h.info;
    R->info[h.rank].rank = h.rank;
    return ++R->joined == R->nranks;
}

static void *root_main(void *arg) {
    root_t *R = arg;
    int64_t init_ms = 120000;
    if (zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, 1, INT64_MAX / 1000000, &init_ms) != ZCCL_SUCCESS) init_ms = 120000;
    uint64_t deadline = zccl__now_ns() + (uint64_t)init_ms * 1000000ull;
    zccl_result_t res = zccl__accept_loop(R->listen_fd, -1, R->secret, sizeof(root_hello_t), root_on_conn, R, deadline);
    close(R->listen_fd);
    if (res == ZCCL_SUCCESS) {
        root_reply_t rep = {0, R->nranks};
        for (int r = 0; r < R->nranks; r++) {
            if (zccl__send_all(R->fd[r], &rep, sizeof rep, deadline, "bootstrap root reply") != ZCCL_SUCCESS ||
                zccl__send_all(R->fd[r], R->info, (size_t)R->nranks * sizeof *R->info, deadline,
                               "bootstrap root table") != ZCCL_SUCCESS)
                ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: could not send the rank table to rank %d", r);
        }
        ZCCL_INFO(ZCCL_LOG_BOOT, "bootstrap root: %d ranks joined", R->nranks);
    } else if (R->nranks > 0) {
        char missing[256];
        size_t w = 0;
        for (int r = 0; r < R->nranks && w < sizeof missing - 16; r++)
            if (R->fd[r] < 0) w += (size_t)snprintf(missing + w, sizeof missing - w, " %d", r);
        ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: %d of %d ranks joined before the deadline; missing:%s", R->joined,
                  R->nranks, missing);
    }
    for (int r = 0; R->fd && r < R->nranks; r++)
        if (R->fd[r] >= 0) close(R->fd[r]);
    free(R->fd);
    free(R->info);
    free(R);
    return NULL;
}

zccl_result_t zccl__root_start(int listen_fd, const uint8_t secret[ZCCL_SECRET_BYTES]) {
    root_t *R = calloc(1, sizeof *R);
    if (!R) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the bootstrap root");
    R->listen_fd = listen_fd;
    R->nranks = -1;
    memcpy(R->secret, secret, ZCCL_SECRET_BYTES);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, root_main, R);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        free(R);
        return zccl__syserror(rc, "cannot start the bootstrap root thread");
    }
    return ZCCL_SUCCESS;
}

/* ---- joining ----------------------------------------------------------------------------------------------- */

zccl_result_t zccl__bootstrap_join(struct zccl_comm *comm, const zccl_id_info_t *info, const zccl_peer_info_t *me,
                                   uint64_t deadline_ns) {
    root_hello_t h;
    memset(&h, 0, sizeof h);
    h.rank = comm->rank;
    h.nranks = comm->nranks;
    h.info = *me;
    int fd;
    char as[80];
    zccl_result_t res = zccl__connect_auth(&info->root, info->secret, &h, sizeof h, deadline_ns, &fd);
    if (res != ZCCL_SUCCESS)
        return zccl__error(res, "rank %d could not join the bootstrap root at %s: %s", comm->rank,
                           zccl__sockaddr_str(&info->root, as, sizeof as), zccl__last_error());
    root_reply_t rep;
    res = zccl__recv_all(fd, &rep, sizeof rep, deadline_ns, "waiting for all ranks at the bootstrap root");
    if (res == ZCCL_SUCCESS && rep.status != 0) {
        static const char *why[] = {"", "another process already joined as this rank",
                                    "this nranks differs from the other ranks'", "rank out of range"};
        res = zccl__error(ZCCL_REMOTE_ERROR, "bootstrap root refused rank %d (nranks %d): %s", comm->rank,
                          comm->nranks, rep.status >= 1 && rep.status <= 3 ? why[rep.status] : "unknown reason");
    } else if (res == ZCCL_SUCCESS && rep.nranks != comm->nranks) {
        res = zccl__error(ZCCL_INTERNAL_ERROR, "bootstrap root answered for %d ranks, expected %d", rep.nranks,
                          comm->nranks);
    }
    if (res == ZCCL_SUCCESS)
        res = zccl__recv_all(fd, comm->peers, (size_t)comm->nranks * sizeof *comm->peers, deadline_ns,
                             "receiving the rank table from the bootstrap root");
    close(fd);
    if (res == ZCCL_TIMEOUT)
        return zccl__error(ZCCL_TIMEOUT, "rank %d: not every rank joined within ZCCL_INIT_TIMEOUT_MS (are all %d "
                           "ranks started with the same id?)", comm->rank, comm->nranks);
    return res;
}

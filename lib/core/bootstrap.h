/*
 * bootstrap.h — the unique id, the bootstrap root, and how a rank joins: every rank connects to the root (proving
 * the secret), sends its zccl_peer_info_t, and receives everyone's once all nranks have arrived.
 */
#ifndef ZCCL_BOOTSTRAP_H
#define ZCCL_BOOTSTRAP_H

#include "comm.h"

/** Decoded unique id. */
typedef struct {
    zccl_sockaddr_t root;
    uint8_t secret[ZCCL_SECRET_BYTES];
    uint64_t comm_id; /* derived from the id's bytes: equal on every rank of the communicator */
} zccl_id_info_t;

/** Validates and decodes an id (magic, version, address family and length). ZCCL_INVALID_ARGUMENT if malformed. */
zccl_result_t zccl__id_decode(const zccl_unique_id_t *id, zccl_id_info_t *out);
/** Encodes root address and secret into an id. */
void zccl__id_encode(const zccl_sockaddr_t *root, const uint8_t secret[ZCCL_SECRET_BYTES], zccl_unique_id_t *id);

/**
 * Starts the bootstrap root on an already listening socket, in a detached thread that owns listen_fd. It admits
 * ranks that prove the secret, waits for all of them (or the init deadline), hands every rank the table, exits.
 */
zccl_result_t zccl__root_start(int listen_fd, const uint8_t secret[ZCCL_SECRET_BYTES]);

/**
 * Joins the job: sends `me` to the root at info->root and fills comm->tc.peers with all ranks' entries.
 * Errors: ZCCL_TIMEOUT, ZCCL_REMOTE_ERROR (root refused: rank taken, nranks mismatch), ZCCL_SYSTEM_ERROR.
 */
zccl_result_t zccl__bootstrap_join(struct zccl_comm *comm, const zccl_id_info_t *info, const zccl_peer_info_t *me,
                                   uint64_t deadline_ns);

/* For tests: rewrite an id's secret; read its root address. */
zccl_result_t zccl__unique_id_set_secret(zccl_unique_id_t *id, const uint8_t secret[16]);
zccl_result_t zccl__unique_id_address(const zccl_unique_id_t *id, char *host, size_t hostlen, int *port);

#endif

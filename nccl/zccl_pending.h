/*
 * zccl_pending.h — TEMPORARY. The parts of zccl's public API that issue 13 part 1 (branch issue13api) adds, declared
 * here with the agreed signatures so that the NCCL layer builds against a zccl.h that does not have them yet.
 * Included only when CMake finds them missing from include/zccl.h (ZCCL_NCCL_PENDING_API). The functions are weak:
 * against a libzccl without them they are NULL at run time and the NCCL call that needs one fails with
 * ncclInvalidUsage naming it. Delete this file (and the CMake check) once issue13api is merged.
 */
#ifndef ZCCL_NCCL_PENDING_H
#define ZCCL_NCCL_PENDING_H
#include <zccl.h>

#define ZCCL_FLOAT8E4M3 ((zccl_datatype_t)10)
#define ZCCL_FLOAT8E5M2 ((zccl_datatype_t)11)

typedef enum { ZCCL_SCALAR_DEVICE = 0, ZCCL_SCALAR_HOST_IMMEDIATE = 1 } zccl_scalar_residence_t;
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    const char *comm_name;
    int split_share;
} zccl_config_t;
#define ZCCL_CONFIG_INITIALIZER {sizeof(zccl_config_t), 0x7a63636c, ZCCL_VERSION_CODE, 1, NULL, 0}

#define ZCCL_PENDING_FN __attribute__((weak))
ZCCL_PENDING_FN zccl_result_t zccl_group_start(void);
ZCCL_PENDING_FN zccl_result_t zccl_group_end(void);
ZCCL_PENDING_FN zccl_result_t zccl_alltoall(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                            zccl_comm_t comm, zccl_stream_t stream);
ZCCL_PENDING_FN zccl_result_t zccl_gather(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                          int root, zccl_comm_t comm, zccl_stream_t stream);
ZCCL_PENDING_FN zccl_result_t zccl_scatter(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                           int root, zccl_comm_t comm, zccl_stream_t stream);
ZCCL_PENDING_FN zccl_result_t zccl_redop_create_premulsum(zccl_redop_t *op, void *scalar, zccl_datatype_t datatype,
                                                          zccl_scalar_residence_t residence, zccl_comm_t comm);
ZCCL_PENDING_FN zccl_result_t zccl_redop_destroy(zccl_redop_t op, zccl_comm_t comm);
ZCCL_PENDING_FN zccl_result_t zccl_comm_init_rank_config(zccl_comm_t *comm, int nranks, zccl_unique_id_t id, int rank,
                                                         const zccl_config_t *config);
ZCCL_PENDING_FN zccl_result_t zccl_comm_split_config(zccl_comm_t comm, int color, int key, zccl_comm_t *newcomm,
                                                     const zccl_config_t *config);
ZCCL_PENDING_FN zccl_result_t zccl_comm_finalize(zccl_comm_t comm);

/* PENDING(fn): true when fn is missing from the libzccl loaded at run time. */
#define PENDING(fn) (!(fn))
#endif

/* comm_config.c — configured and non-blocking communicators, zccl_comm_finalize. */
#include "core.h"

ZCCL_API zccl_result_t zccl_comm_init_rank_config(zccl_comm_t *comm, int nranks, zccl_unique_id_t id, int rank,
                                                  const zccl_config_t *config) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_comm_init_rank_config: not implemented yet");
}

ZCCL_API zccl_result_t zccl_comm_split_config(zccl_comm_t comm, int color, int key, zccl_comm_t *newcomm,
                                              const zccl_config_t *config) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_comm_split_config: not implemented yet");
}

ZCCL_API zccl_result_t zccl_comm_finalize(zccl_comm_t comm) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_comm_finalize: not implemented yet");
}

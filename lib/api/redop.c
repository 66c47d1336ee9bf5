/* redop.c — PreMulSum reduction handles. */
#include "core.h"

ZCCL_API zccl_result_t zccl_redop_create_premulsum(zccl_redop_t *op, void *scalar, zccl_datatype_t datatype,
                                                   zccl_scalar_residence_t residence, zccl_comm_t comm) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_redop_create_premulsum: not implemented yet");
}

ZCCL_API zccl_result_t zccl_redop_destroy(zccl_redop_t op, zccl_comm_t comm) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_redop_destroy: not implemented yet");
}

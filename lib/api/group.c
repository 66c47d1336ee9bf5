/* group.c — zccl_group_start / zccl_group_end (docs/groups.md). */
#include "core.h"

ZCCL_API zccl_result_t zccl_group_start(void) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_group_start: not implemented yet");
}

ZCCL_API zccl_result_t zccl_group_end(void) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_group_end: not implemented yet");
}

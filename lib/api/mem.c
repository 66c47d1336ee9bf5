/*
 * mem.c — the public entry points of zccl-allocated, registered buffers (mechanics in lib/core/regmem.c).
 */
#include "comm.h"
#include "regmem.h"

ZCCL_API zccl_result_t zccl_mem_alloc(void **ptr, size_t bytes) {
    if (!ptr) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mem_alloc: argument 'ptr' is NULL");
    return zccl__mem_alloc(ptr, bytes ? bytes : 1);
}

ZCCL_API zccl_result_t zccl_mem_free(void *ptr) {
    if (!ptr) return ZCCL_SUCCESS;
    return zccl__mem_free(ptr);
}

ZCCL_API zccl_result_t zccl_comm_register(zccl_comm_t comm, void *buf, size_t bytes, void **handle) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_register: argument 'comm' is NULL");
    if (!buf) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_register: argument 'buf' is NULL");
    if (!handle) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_register: argument 'handle' is NULL");
    if (bytes == 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_register: argument 'bytes' is 0");
    return zccl__comm_register(comm, buf, bytes, handle);
}

ZCCL_API zccl_result_t zccl_comm_deregister(zccl_comm_t comm, void *handle) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_deregister: argument 'comm' is NULL");
    return zccl__comm_deregister(comm, handle);
}

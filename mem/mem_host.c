/*
 * mem_host.c — the host memory type: the CPU kernels of kernels/ behind the memory layer's ops table.
 */
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "mem.h"

static zccl_result_t host_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) zccl_kernel_copy(dst, src, bytes);
    return ZCCL_SUCCESS;
}

static zccl_result_t host_reduce(void *dst, const void *a, const void *b, size_t count, zccl_datatype_t dt,
                                 zccl_redop_t op, uint32_t divisor) {
    zccl_kernel_reduce(dst, a, b, count, dt, op == ZCCL_AVG ? ZCCL_SUM : op, divisor);
    return ZCCL_SUCCESS;
}

static zccl_result_t host_premul(void *dst, const void *src, size_t count, zccl_datatype_t dt, const void *scalar) {
    zccl_kernel_premul(dst, src, count, dt, scalar);
    return ZCCL_SUCCESS;
}

static zccl_result_t host_alloc(void **p, size_t bytes) {
    const size_t sz = bytes ? (bytes + 4095) & ~(size_t)4095 : 4096;
    if (posix_memalign(p, 4096, sz) != 0) {
        *p = NULL;
        return zccl__error(ZCCL_SYSTEM_ERROR, "cannot allocate %zu bytes of host memory", sz);
    }
    return ZCCL_SUCCESS;
}

static void host_free(void *p) { free(p); }

const zccl_mem_ops_t zccl__mem_host = {
    .name = "host",
    .copy = host_copy,
    .reduce = host_reduce,
    .premul = host_premul,
    .alloc = host_alloc,
    .free = host_free,
    .alloc_host = host_alloc,
    .free_host = host_free,
    .direct_step_bytes = 32768,
};

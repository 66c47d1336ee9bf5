/*
 * mem.c — the public entry points of zccl-allocated, registered buffers (mechanics in lib/core/regmem.c).
 */
#include "comm.h"
#include "regmem.h"
#include <string.h>

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

/* ---- CUDA device memory through the memory layer (mem) ---- */

ZCCL_API zccl_result_t zccl_pointer_device(const void *ptr, int *device) {
    if (!device) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_pointer_device: argument 'device' is NULL");
    *device = -1;
    zccl_mem_type_t t;
    int d = -1;
    ZCCL_CHECK(zccl__mem_query(ptr, &t, &d));
    if (t == ZCCL_MEM_CUDA) *device = d;
    return ZCCL_SUCCESS;
}

static zccl_result_t need_cuda(const char *fn) {
    const char *why = NULL;
    if (!zccl__mem_cuda_built())
        return zccl__error(ZCCL_INVALID_USAGE, "%s: this libzccl was built without the CUDA kernels (ZCCL_WITH_CUDA "
                           "found no nvcc)", fn);
    if (!zccl__mem_cuda_available(&why)) return zccl__error(ZCCL_INVALID_USAGE, "%s: no CUDA driver: %s", fn, why);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_mem_alloc_cuda(void **ptr, size_t bytes) {
    if (!ptr) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mem_alloc_cuda: argument 'ptr' is NULL");
    *ptr = NULL;
    ZCCL_CHECK(need_cuda("zccl_mem_alloc_cuda"));
    return zccl__mem_cuda.alloc(ptr, bytes ? bytes : 1);
}

ZCCL_API zccl_result_t zccl_mem_free_cuda(void *ptr) {
    if (!ptr) return ZCCL_SUCCESS;
    int dev = -1;
    ZCCL_CHECK(zccl_pointer_device(ptr, &dev));
    if (dev < 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mem_free_cuda: 'ptr' (%p) is not CUDA device memory", ptr);
    zccl__mem_cuda.free(ptr);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_mem_copy(void *dst, const void *src, size_t bytes) {
    if (!bytes) return ZCCL_SUCCESS;
    if (!dst || !src)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mem_copy: argument '%s' is NULL with bytes %zu > 0",
                           dst ? "src" : "dst", bytes);
    int dd = -1, ds = -1;
    ZCCL_CHECK(zccl_pointer_device(dst, &dd));
    ZCCL_CHECK(zccl_pointer_device(src, &ds));
    if (dd < 0 && ds < 0) {
        memcpy(dst, src, bytes);
        return ZCCL_SUCCESS;
    }
    return zccl__mem_cuda.copy(dst, src, bytes);
}

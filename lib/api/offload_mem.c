/*
 * offload_mem.c — host memory (pinned when a CUDA driver is present) and side-stream copies for the ZeRO layer's CPU
 * offload (lib/zero/zero_offload.c), over the memory layer; declared in zccl_ext.h. docs/gpu.md "CPU offload".
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_drv.h"
#include "mem.h"
#include "zccl_ext.h"

zccl_result_t zccl__offload_host_alloc(void **p, size_t bytes, int pin, int *pinned) {
    *p = NULL;
    if (pinned) *pinned = 0;
    if (bytes == 0) bytes = 1;
    const zccl_cuda_drv_t *d = pin ? zccl__cuda_drv(NULL) : NULL;
    if (d && d->cuMemAllocHost && zccl__cuda_ctx(d) == ZCCL_SUCCESS && d->cuMemAllocHost(p, bytes) == ZCU_SUCCESS) {
        memset(*p, 0, bytes);
        if (pinned) *pinned = 1;
        return ZCCL_SUCCESS;
    }
    *p = NULL;
    ZCCL_CHECK(zccl__mem_host.alloc(p, bytes));
    memset(*p, 0, bytes);
    return ZCCL_SUCCESS;
}

void zccl__offload_host_free(void *p, int pinned) {
    if (!p) return;
    const zccl_cuda_drv_t *d = pinned ? zccl__cuda_drv(NULL) : NULL;
    if (d && d->cuMemFreeHost) d->cuMemFreeHost(p);
    else zccl__mem_host.free(p);
}

zccl_result_t zccl__offload_is_device(const void *p, int *is_device) {
    zccl_mem_type_t t;
    int dev;
    *is_device = 0;
    ZCCL_CHECK(zccl__mem_query(p, &t, &dev));
    if (t == ZCCL_MEM_CUDA) {
        zccl__cuda_note_device(dev);
        *is_device = 1;
    }
    return ZCCL_SUCCESS;
}

/* The side stream: created on the first device copy, kept for the life of the process (as the memory layer's
 * own stream is), so a device-to-host copy never waits behind a collective's staging copies. */
static pthread_mutex_t side_mu = PTHREAD_MUTEX_INITIALIZER;
static CUstream side;
static int side_made;

zccl_result_t zccl__offload_copy(void *dst, const void *src, size_t bytes, int *queued) {
    if (queued) *queued = 0;
    if (bytes == 0 || dst == src) return ZCCL_SUCCESS;
    int ddev, sdev;
    ZCCL_CHECK(zccl__offload_is_device(dst, &ddev));
    ZCCL_CHECK(zccl__offload_is_device(src, &sdev));
    if (!ddev && !sdev) {
        memcpy(dst, src, bytes);
        return ZCCL_SUCCESS;
    }
    const char *why = "";
    const zccl_cuda_drv_t *d = zccl__cuda_drv(&why);
    if (!d) return zccl__error(ZCCL_INVALID_USAGE, "offload copy of %zu bytes: device memory without a CUDA driver: %s",
                               bytes, why);
    ZCCL_CHECK(zccl__cuda_ctx(d));
    pthread_mutex_lock(&side_mu);
    CUresult r = ZCU_SUCCESS;
    if (!side_made) {
        r = d->cuStreamCreate(&side, ZCU_STREAM_NON_BLOCKING);
        if (r == ZCU_SUCCESS) side_made = 1;
    }
    pthread_mutex_unlock(&side_mu);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "offload: cuStreamCreate of the side stream failed: %s",
                           zccl__cuda_errstr(r));
    r = d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, side);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "offload: cuMemcpyAsync of %zu bytes (%s %p <- %s %p) on the side stream "
                           "failed: %s", bytes, ddev ? "device" : "host", dst, sdev ? "device" : "host", src,
                           zccl__cuda_errstr(r));
    if (queued) *queued = 1;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__offload_copy_wait(void) {
    pthread_mutex_lock(&side_mu);
    const int made = side_made;
    pthread_mutex_unlock(&side_mu);
    if (!made) return ZCCL_SUCCESS;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!d) return ZCCL_SUCCESS;
    ZCCL_CHECK(zccl__cuda_ctx(d));
    CUresult r = d->cuStreamSynchronize(side);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "offload: waiting for the side stream's copies failed "
                           "(cuStreamSynchronize: %s)", zccl__cuda_errstr(r));
    return ZCCL_SUCCESS;
}

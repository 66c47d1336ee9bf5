/*
 * mem.c — which memory type a buffer is, and the type of a call (both of its buffers, checked once per call).
 */
#include "mem.h"
#include "cuda_drv.h"

const zccl_mem_ops_t *zccl__mem_ops(zccl_mem_type_t t) {
    return t == ZCCL_MEM_CUDA ? &zccl__mem_cuda : &zccl__mem_host;
}

bool zccl__mem_cuda_available(const char **why) { return zccl__cuda_drv(why) != NULL; }

zccl_result_t zccl__mem_query(const void *p, zccl_mem_type_t *type, int *device) {
    *type = ZCCL_MEM_HOST;
    if (device) *device = -1;
    if (!p) return ZCCL_SUCCESS;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!d) return ZCCL_SUCCESS; /* no CUDA here: nothing can be device memory */
    unsigned mt = 0;
    CUresult r = d->cuPointerGetAttribute(&mt, ZCU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p);
    /* Memory CUDA never saw is plain host memory; so is every buffer of a thread that never made a CUDA context
     * current (CUDA_ERROR_INVALID_CONTEXT 201, NOT_INITIALIZED 3): a program that uses no CUDA on a machine with a
     * driver must keep working. */
    if (r == ZCU_ERROR_INVALID_VALUE || r == 201 || r == 3) return ZCCL_SUCCESS;
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "cuPointerGetAttribute(%p) failed: %s", p, zccl__cuda_errstr(r));
    if (mt != ZCU_MEMORYTYPE_DEVICE) return ZCCL_SUCCESS; /* registered or pinned host memory: the CPU reaches it */
    int ord = 0;
    r = d->cuPointerGetAttribute(&ord, ZCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)p);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "cuPointerGetAttribute(%p, DEVICE_ORDINAL) failed: %s", p,
                           zccl__cuda_errstr(r));
    *type = ZCCL_MEM_CUDA;
    if (device) *device = ord;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__mem_buffer_id(const void *p, const char *what, uint64_t *id) {
    *id = 0;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!d) return zccl__error(ZCCL_SYSTEM_ERROR, "%s %p: no CUDA driver is loaded to ask for its buffer id", what, p);
    unsigned long long v = 0;
    const CUresult r = d->cuPointerGetAttribute(&v, ZCU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)p);
    if (r == ZCU_ERROR_INVALID_VALUE)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s %p is not device memory that is allocated (freed while "
                           "registered?): cuPointerGetAttribute(BUFFER_ID) does not know it", what, p);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "cuPointerGetAttribute(%p, BUFFER_ID) for %s failed: %s", p, what,
                           zccl__cuda_errstr(r));
    *id = (uint64_t)v;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__mem_call_type(const char *fn, const void *sendbuf, const void *recvbuf, zccl_mem_type_t *type) {
    *type = ZCCL_MEM_HOST;
    if (!zccl__cuda_drv(NULL)) return ZCCL_SUCCESS; /* without a driver every buffer is host memory */
    zccl_mem_type_t ts, tr;
    int ds, dr;
    ZCCL_CHECK(zccl__mem_query(sendbuf, &ts, &ds));
    ZCCL_CHECK(zccl__mem_query(recvbuf, &tr, &dr));
    if (sendbuf && recvbuf && ts != tr)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'sendbuf' is %s memory but 'recvbuf' is %s memory; both must "
                           "be host memory or both memory of one CUDA device", fn, ts == ZCCL_MEM_CUDA ? "CUDA device"
                           : "host", tr == ZCCL_MEM_CUDA ? "CUDA device" : "host");
    const zccl_mem_type_t t = (sendbuf && ts == ZCCL_MEM_CUDA) || (recvbuf && tr == ZCCL_MEM_CUDA) ? ZCCL_MEM_CUDA
                                                                                                  : ZCCL_MEM_HOST;
    if (t == ZCCL_MEM_HOST) return ZCCL_SUCCESS;
    const char *which = (sendbuf && ts == ZCCL_MEM_CUDA) ? "sendbuf" : "recvbuf";
    const int dev = (sendbuf && ts == ZCCL_MEM_CUDA) ? ds : dr;
    if (sendbuf && recvbuf && ds != dr)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'sendbuf' is on CUDA device %d but 'recvbuf' on device %d",
                           fn, ds, dr);
    if (!zccl__mem_cuda_built())
        return zccl__error(ZCCL_INVALID_USAGE, "%s: '%s' (%p) is CUDA device memory (device %d), but this libzccl "
                           "was built without the CUDA kernels (ZCCL_WITH_CUDA found no nvcc); pass host memory or "
                           "rebuild with CUDA", fn, which, which[0] == 's' ? sendbuf : (const void *)recvbuf, dev);
    zccl__cuda_note_device(dev);
    *type = ZCCL_MEM_CUDA;
    return ZCCL_SUCCESS;
}

/*
 * mem_cuda.c — the CUDA device memory type: copies with cuMemcpyAsync and reductions with the kernels of
 * kernels/cuda/ (an nvcc fatbin for sm_80, sm_90 and PTX embedded in libzccl, loaded with cuModuleLoadData and
 * launched with cuLaunchKernel), all on one internal non-blocking stream that each operation synchronises before it
 * returns (the engine then hands the bytes on). Everything goes through the dlopen'ed driver (cuda_drv.c).
 *
 * Kernel names, parameters and launch shape are the contract with kernels/cuda/zccl_kernels.cu:
 *   zccl_reduce_<dt>_<op>(void *dst, const void *a, const void *b, size_t count, uint32_t divisor)
 *   zccl_premul_<dt>(void *dst, const void *src, size_t count, uint64_t scalar_bits)
 *   zccl_copy(void *dst, const void *src, size_t bytes)
 * with <dt>, <op> the enum values of zccl.h; ZCCL_CUDA_THREADS threads per block, grid-stride loops.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mem.h"
#include "cuda_drv.h"

#define ZCCL_CUDA_THREADS 256
#define ZCCL_CUDA_MAX_BLOCKS 4096u

#ifdef ZCCL_HAVE_CUDA_KERNELS
extern const unsigned char zccl__cuda_fatbin[]; /* kernels/cuda/, embedded by CMake (cuda_fatbin.S) */
bool zccl__mem_cuda_built(void) { return true; }
#else
static const unsigned char *const zccl__cuda_fatbin = NULL;
bool zccl__mem_cuda_built(void) { return false; }
#endif

static pthread_mutex_t mod_mu = PTHREAD_MUTEX_INITIALIZER;
static CUmodule mod;
static CUstream stream;
static CUfunction f_reduce[ZCCL_NUM_TYPES][ZCCL_NUM_OPS], f_premul[ZCCL_NUM_TYPES], f_copy;
static int nsm = 0;
static int stream_dev = -1; /* the device whose primary context holds `stream` */

/* Device memory released while stream-ordered calls are pending (cuda_drv.h): kept, reused by later allocations
 * of at most its size, and given back with cuMemFree once no such call is pending. */
typedef struct kept { void *p; size_t bytes; struct kept *next; } kept_t;
static kept_t *kept_list;
typedef struct sized { void *p; size_t bytes; struct sized *next; } sized_t;
static sized_t *sizes; /* sizes of the blocks cuda_alloc handed out, for reuse */

/* The driver, a current context, the internal stream and (with kernels) the loaded module. */
static zccl_result_t ready(const zccl_cuda_drv_t **out, bool kernels) {
    const char *why = NULL;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(&why);
    if (!d) return zccl__error(ZCCL_INVALID_USAGE, "CUDA memory operation without a CUDA driver: %s", why);
    ZCCL_CHECK(zccl__cuda_ctx(d));
    zccl_result_t res = ZCCL_SUCCESS;
    pthread_mutex_lock(&mod_mu);
    if (!stream) {
        CUresult r = d->cuStreamCreate(&stream, ZCU_STREAM_NON_BLOCKING);
        if (r != ZCU_SUCCESS) {
            stream = NULL;
            res = zccl__error(ZCCL_SYSTEM_ERROR, "cuStreamCreate failed: %s", zccl__cuda_errstr(r));
        } else {
            CUdevice cd = 0;
            stream_dev = d->cuCtxGetDevice && d->cuCtxGetDevice(&cd) == ZCU_SUCCESS ? (int)cd : 0;
        }
    }
    if (res == ZCCL_SUCCESS && kernels && !mod) {
        CUresult r = ZCU_SUCCESS;
        if (!zccl__mem_cuda_built())
            res = zccl__error(ZCCL_INVALID_USAGE, "this libzccl was built without the CUDA kernels (ZCCL_WITH_CUDA "
                              "found no nvcc): no reduction on device memory");
        else if ((r = d->cuModuleLoadData(&mod, zccl__cuda_fatbin)) != ZCU_SUCCESS) {
            mod = NULL;
            res = zccl__error(ZCCL_SYSTEM_ERROR, "cannot load zccl's CUDA kernels (built for sm_80, sm_90 and PTX) on "
                              "this GPU: cuModuleLoadData: %s", zccl__cuda_errstr(r));
        } else {
            char name[64];
            for (int t = 0; t < ZCCL_NUM_TYPES && res == ZCCL_SUCCESS; t++) {
                for (int o = 0; o < ZCCL_NUM_OPS && res == ZCCL_SUCCESS; o++) {
                    snprintf(name, sizeof name, "zccl_reduce_%d_%d", t, o);
                    if ((r = d->cuModuleGetFunction(&f_reduce[t][o], mod, name)) != ZCU_SUCCESS)
                        res = zccl__error(ZCCL_INTERNAL_ERROR, "CUDA kernel %s missing: %s", name, zccl__cuda_errstr(r));
                }
                snprintf(name, sizeof name, "zccl_premul_%d", t);
                if (res == ZCCL_SUCCESS && (r = d->cuModuleGetFunction(&f_premul[t], mod, name)) != ZCU_SUCCESS)
                    res = zccl__error(ZCCL_INTERNAL_ERROR, "CUDA kernel %s missing: %s", name, zccl__cuda_errstr(r));
            }
            if (res == ZCCL_SUCCESS && (r = d->cuModuleGetFunction(&f_copy, mod, "zccl_copy")) != ZCU_SUCCESS)
                res = zccl__error(ZCCL_INTERNAL_ERROR, "CUDA kernel zccl_copy missing: %s", zccl__cuda_errstr(r));
            CUdevice dev;
            if (res == ZCCL_SUCCESS && d->cuDeviceGet(&dev, 0) == ZCU_SUCCESS)
                d->cuDeviceGetAttribute(&nsm, ZCU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
            if (res != ZCCL_SUCCESS) mod = NULL;
        }
    }
    pthread_mutex_unlock(&mod_mu);
    *out = d;
    return res;
}

static zccl_result_t sync_stream(const zccl_cuda_drv_t *d, const char *what) {
    CUresult r = d->cuStreamSynchronize(stream);
    if (r != ZCU_SUCCESS) return zccl__error(ZCCL_SYSTEM_ERROR, "%s on the GPU failed: %s", what, zccl__cuda_errstr(r));
    return ZCCL_SUCCESS;
}

/* Blocks for n work items of `per` elements per thread, grid-stride beyond the cap. */
static unsigned grid_for(size_t n, unsigned per) {
    size_t b = (n + (size_t)ZCCL_CUDA_THREADS * per - 1) / ((size_t)ZCCL_CUDA_THREADS * per);
    size_t cap = nsm > 0 ? (size_t)nsm * 8 : ZCCL_CUDA_MAX_BLOCKS;
    if (cap > ZCCL_CUDA_MAX_BLOCKS) cap = ZCCL_CUDA_MAX_BLOCKS;
    return (unsigned)(b == 0 ? 1 : b > cap ? cap : b);
}

static zccl_result_t launch(const zccl_cuda_drv_t *d, CUfunction f, const char *what, size_t n, void **params) {
    CUresult r = d->cuLaunchKernel(f, grid_for(n, 16), 1, 1, ZCCL_CUDA_THREADS, 1, 1, 0, stream, params, NULL);
    if (r != ZCU_SUCCESS) return zccl__error(ZCCL_SYSTEM_ERROR, "launching %s failed: %s", what, zccl__cuda_errstr(r));
    return sync_stream(d, what);
}

static zccl_result_t cuda_copy(void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return ZCCL_SUCCESS;
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, false));
    CUresult r = d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, stream);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "cuMemcpyAsync of %zu bytes (%p <- %p) failed: %s", bytes, dst, src,
                           zccl__cuda_errstr(r));
    return sync_stream(d, "a copy");
}

static zccl_result_t cuda_reduce(void *dst, const void *a, const void *b, size_t count, zccl_datatype_t dt,
                                 zccl_redop_t op, uint32_t divisor) {
    if (!count) return ZCCL_SUCCESS;
    if ((unsigned)dt >= ZCCL_NUM_TYPES || (unsigned)op >= ZCCL_NUM_OPS)
        return zccl__error(ZCCL_INTERNAL_ERROR, "CUDA reduce: datatype %d or op %d out of range", (int)dt, (int)op);
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, true));
    if (op == ZCCL_AVG) op = ZCCL_SUM;
    void *params[] = {&dst, &a, &b, &count, &divisor};
    return launch(d, f_reduce[dt][op], "the reduction kernel", count, params);
}

zccl_result_t zccl__mem_cuda_reduce_on(CUstream on, void *dst, const void *a, const void *b, size_t count,
                                       zccl_datatype_t dt, zccl_redop_t op, uint32_t divisor) {
    if (!count) return ZCCL_SUCCESS;
    if ((unsigned)dt >= ZCCL_NUM_TYPES || (unsigned)op >= ZCCL_NUM_OPS)
        return zccl__error(ZCCL_INTERNAL_ERROR, "CUDA reduce: datatype %d or op %d out of range", (int)dt, (int)op);
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, true));
    if (op == ZCCL_AVG) op = ZCCL_SUM;
    void *params[] = {&dst, &a, &b, &count, &divisor};
    CUresult r = d->cuLaunchKernel(f_reduce[dt][op], grid_for(count, 16), 1, 1, ZCCL_CUDA_THREADS, 1, 1, 0, on, params,
                                   NULL);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "launching the reduction kernel failed: %s", zccl__cuda_errstr(r));
    return ZCCL_SUCCESS;
}

static zccl_result_t cuda_premul(void *dst, const void *src, size_t count, zccl_datatype_t dt, const void *scalar) {
    if (!count) return ZCCL_SUCCESS;
    if ((unsigned)dt >= ZCCL_NUM_TYPES)
        return zccl__error(ZCCL_INTERNAL_ERROR, "CUDA premul: datatype %d out of range", (int)dt);
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, true));
    uint64_t bits = 0;
    memcpy(&bits, scalar, zccl_type_size(dt));
    void *params[] = {&dst, &src, &count, &bits};
    return launch(d, f_premul[dt], "the PreMulSum kernel", count, params);
}

static void remember_size(void *p, size_t bytes) {
    sized_t *z = malloc(sizeof *z);
    if (!z) return; /* only reuse is lost */
    z->p = p;
    z->bytes = bytes;
    z->next = sizes;
    sizes = z;
}

static size_t forget_size(void *p) {
    for (sized_t **z = &sizes; *z; z = &(*z)->next)
        if ((*z)->p == p) {
            sized_t *f = *z;
            const size_t b = f->bytes;
            *z = f->next;
            free(f);
            return b;
        }
    return 0;
}

/* Gives the kept blocks back once no stream-ordered call is pending; called with mod_mu held. */
static void release_kept(const zccl_cuda_drv_t *d) {
    if (!kept_list || zccl__cuda_ordered_pending() > 0) return;
    while (kept_list) {
        kept_t *k = kept_list;
        kept_list = k->next;
        d->cuMemFree((CUdeviceptr)(uintptr_t)k->p);
        free(k);
    }
}

static zccl_result_t cuda_alloc(void **p, size_t bytes) {
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, false));
    if (!bytes) bytes = 1;
    pthread_mutex_lock(&mod_mu);
    release_kept(d);
    for (kept_t **k = &kept_list; *k; k = &(*k)->next)
        if ((*k)->bytes >= bytes) { /* a block released during a stream-ordered call: reuse it */
            kept_t *f = *k;
            *k = f->next;
            *p = f->p;
            remember_size(f->p, f->bytes);
            free(f);
            pthread_mutex_unlock(&mod_mu);
            return ZCCL_SUCCESS;
        }
    pthread_mutex_unlock(&mod_mu);
    CUdeviceptr dp = 0;
    CUresult r = d->cuMemAlloc(&dp, bytes);
    if (r != ZCU_SUCCESS) {
        *p = NULL;
        return zccl__error(ZCCL_SYSTEM_ERROR, "cuMemAlloc of %zu bytes of device memory failed: %s", bytes,
                           zccl__cuda_errstr(r));
    }
    *p = (void *)(uintptr_t)dp;
    pthread_mutex_lock(&mod_mu);
    remember_size(*p, bytes);
    pthread_mutex_unlock(&mod_mu);
    return ZCCL_SUCCESS;
}

static void cuda_free(void *p) {
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!p || !d) return;
    pthread_mutex_lock(&mod_mu);
    const size_t bytes = forget_size(p);
    if (zccl__cuda_ordered_pending() > 0 && bytes) {
        kept_t *k = malloc(sizeof *k);
        if (k) {
            *k = (kept_t){p, bytes, kept_list};
            kept_list = k;
            pthread_mutex_unlock(&mod_mu);
            return;
        }
    }
    release_kept(d);
    pthread_mutex_unlock(&mod_mu);
    d->cuMemFree((CUdeviceptr)(uintptr_t)p);
}

zccl_result_t zccl__mem_cuda_prepare(int device) {
    zccl__cuda_note_device(device);
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, true));
    if (stream_dev != device)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_stream_create_cuda: the stream is on CUDA device %d, but "
                           "zccl's CUDA memory layer already works on device %d in this process (one device per process)",
                           device, stream_dev);
    return ZCCL_SUCCESS;
}

static zccl_result_t cuda_alloc_host(void **p, size_t bytes) {
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, false));
    if (!d->cuMemAllocHost) return zccl__mem_host.alloc(p, bytes); /* pageable instead of pinned */
    CUresult r = d->cuMemAllocHost(p, bytes ? bytes : 1);
    if (r != ZCU_SUCCESS) return zccl__mem_host.alloc(p, bytes);
    return ZCCL_SUCCESS;
}

static void cuda_free_host(void *p) {
    if (!p) return;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    /* which allocator made it: the driver knows pinned memory; anything else came from the fallback */
    unsigned mt = 0;
    if (d && d->cuMemFreeHost &&
        d->cuPointerGetAttribute(&mt, ZCU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) == ZCU_SUCCESS &&
        mt == ZCU_MEMORYTYPE_HOST)
        d->cuMemFreeHost(p);
    else
        zccl__mem_host.free(p);
}

/* Stream order, first form (docs/gpu.md): a call on device memory starts once everything already queued in the
 * context has run, so the caller's kernels that wrote the input are done; it returns after its own copies and kernels
 * completed, so work the caller queues afterwards sees the result. */
static zccl_result_t cuda_call_begin(void) {
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ready(&d, false));
    /* A stream-ordered call waited for its own inputs (cuda_order.c); the caller's stream now waits for it, so
     * waiting for the whole context here would never return. */
    if (zccl__cuda_in_ordered_call()) return ZCCL_SUCCESS;
    CUresult r = d->cuCtxSynchronize();
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "waiting for the GPU work queued before the call failed "
                           "(cuCtxSynchronize: %s): an earlier kernel of this process failed", zccl__cuda_errstr(r));
    return ZCCL_SUCCESS;
}

/* CUDA IPC (docs/gpu.md "CUDA IPC"): the legacy cuIpc* handles of cuMemAlloc/cudaMalloc allocations, which every
 * caching allocator hands out; memory from cuMemCreate (virtual memory management) cannot be exported this way and
 * falls back to the staged path. */
_Static_assert(sizeof(ZCUipcMemHandle) == sizeof(zccl_mem_ipc_handle_t), "CUipcMemHandle is 64 bytes");

static zccl_result_t ipc_driver(const zccl_cuda_drv_t **out) {
    ZCCL_CHECK(ready(out, false));
    const zccl_cuda_drv_t *d = *out;
    if (!d->cuMemGetAddressRange || !d->cuIpcGetMemHandle || !d->cuIpcOpenMemHandle || !d->cuIpcCloseMemHandle)
        return zccl__error(ZCCL_INVALID_USAGE, "the CUDA driver library lacks the IPC entry points "
                           "(cuMemGetAddressRange_v2, cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle)");
    return ZCCL_SUCCESS;
}

static zccl_result_t cuda_ipc_range(const void *p, void **base, size_t *bytes) {
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ipc_driver(&d));
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = d->cuMemGetAddressRange(&b, &n, (CUdeviceptr)(uintptr_t)p);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_INVALID_USAGE, "cuMemGetAddressRange(%p) failed: %s", p, zccl__cuda_errstr(r));
    *base = (void *)(uintptr_t)b;
    *bytes = n;
    return ZCCL_SUCCESS;
}

static zccl_result_t cuda_ipc_export(void *base, zccl_mem_ipc_handle_t *out) {
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ipc_driver(&d));
    ZCUipcMemHandle h;
    CUresult r = d->cuIpcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)base);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_INVALID_USAGE, "cuIpcGetMemHandle of the allocation at %p failed: %s (not from "
                           "cuMemAlloc/cudaMalloc?)", base, zccl__cuda_errstr(r));
    memcpy(out->bytes, &h, sizeof h);
    return ZCCL_SUCCESS;
}

static zccl_result_t cuda_ipc_open(const zccl_mem_ipc_handle_t *h, void **base, size_t *bytes) {
    const zccl_cuda_drv_t *d;
    ZCCL_CHECK(ipc_driver(&d));
    ZCUipcMemHandle ch;
    memcpy(&ch, h->bytes, sizeof ch);
    CUdeviceptr p = 0;
    /* Lazy peer access: a peer's buffer on another GPU becomes reachable by this context's kernels. Several ranks on
     * one GPU need nothing more (same device). */
    CUresult r = d->cuIpcOpenMemHandle(&p, ch, ZCU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "cuIpcOpenMemHandle failed: %s", zccl__cuda_errstr(r));
    CUdeviceptr b = 0;
    size_t n = 0;
    r = d->cuMemGetAddressRange(&b, &n, p);
    *base = (void *)(uintptr_t)p;
    /* The mapping's size bounds the peer's offsets; should a driver not answer for an IPC mapping, the exporter's
     * offsets (checked against its own allocation when it registered) are trusted. */
    *bytes = r == ZCU_SUCCESS ? n - (size_t)(p - b) : SIZE_MAX;
    return ZCCL_SUCCESS;
}

static void cuda_ipc_close(void *base) {
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (base && d && d->cuIpcCloseMemHandle) d->cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)base);
}

const zccl_mem_ops_t zccl__mem_cuda = {
    .name = "cuda",
    .copy = cuda_copy,
    .reduce = cuda_reduce,
    .premul = cuda_premul,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .call_begin = cuda_call_begin,
    .direct_step_bytes = (size_t)8 << 20,
    .ipc_range = cuda_ipc_range,
    .ipc_export = cuda_ipc_export,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
};

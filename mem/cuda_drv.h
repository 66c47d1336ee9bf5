/*
 * cuda_drv.h — the slice of the CUDA driver API zccl uses, reached through dlopen (cuda_drv.c) so that libzccl.so
 * needs no CUDA at load time. Types and constants are declared here with the values of cuda.h (CUDA 12/13 ABI),
 * so the layer compiles on machines without the CUDA headers.
 */
#ifndef ZCCL_CUDA_DRV_H
#define ZCCL_CUDA_DRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "zccl.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

enum {
    ZCU_SUCCESS = 0,
    ZCU_ERROR_INVALID_VALUE = 1,
    ZCU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    ZCU_POINTER_ATTRIBUTE_BUFFER_ID = 7, /* unsigned long long, unique per allocation for the process's life */
    ZCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    ZCU_MEMORYTYPE_HOST = 1,
    ZCU_MEMORYTYPE_DEVICE = 2,
    ZCU_MEMORYTYPE_ARRAY = 3,
    ZCU_MEMORYTYPE_UNIFIED = 4,
    ZCU_STREAM_NON_BLOCKING = 1,
    ZCU_EVENT_DISABLE_TIMING = 2,
    ZCU_STREAM_WAIT_VALUE_GEQ = 0,
    ZCU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    ZCU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
};

/* CUipcMemHandle: 64 opaque bytes, passed by value to cuIpcOpenMemHandle. */
typedef struct { char reserved[64]; } ZCUipcMemHandle;

/* The driver entry points, by their exported names (cuda.h maps e.g. cuMemAlloc to cuMemAlloc_v2). */
typedef struct zccl_cuda_drv {
    CUresult (*cuInit)(unsigned flags);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuPointerGetAttribute)(void *data, int attr, CUdeviceptr ptr);
    CUresult (*cuDeviceGet)(CUdevice *, int ordinal);
    CUresult (*cuDeviceGetAttribute)(int *, int attr, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);                 /* cuMemAlloc_v2 */
    CUresult (*cuMemFree)(CUdeviceptr);                            /* cuMemFree_v2 */
    CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t, CUstream);
    CUresult (*cuStreamCreate)(CUstream *, unsigned flags);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *image);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *name);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream, void **params, void **extra);
    /* Optional (NULL when the library lacks them): pinned host memory, events, stream memory operations. */
    CUresult (*cuMemAllocHost)(void **, size_t);                   /* cuMemAllocHost_v2 */
    CUresult (*cuMemFreeHost)(void *);
    CUresult (*cuEventCreate)(CUevent *, unsigned flags);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventDestroy)(CUevent);                           /* cuEventDestroy_v2 */
    CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned flags);
    CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr addr, uint32_t value, unsigned flags); /* _v2 */
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *host, unsigned flags);            /* _v2 */
    /* Optional: CUDA IPC between the processes of a host (docs/gpu.md "CUDA IPC"). */
    CUresult (*cuMemGetAddressRange)(CUdeviceptr *base, size_t *bytes, CUdeviceptr p);          /* _v2 */
    CUresult (*cuIpcGetMemHandle)(ZCUipcMemHandle *, CUdeviceptr);
    CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, ZCUipcMemHandle, unsigned flags);              /* _v2 */
    CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
    CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
    CUresult (*cuCtxGetDevice)(CUdevice *);
    /* Optional: pipelined staging (mem_pipe.c) destroys its streams with the communicator. */
    CUresult (*cuStreamDestroy)(CUstream);                                                        /* _v2 */
} zccl_cuda_drv_t;

/** The loaded driver (tries once, thread-safe; cuInit(0) included), or NULL with *why set to the reason. */
const zccl_cuda_drv_t *zccl__cuda_drv(const char **why);
/** The driver's name for an error code ("CUDA_ERROR_..." text or the number). */
const char *zccl__cuda_errstr(CUresult r);
/** Makes a context current on this thread: the primary context of the device of the last device buffer seen. */
zccl_result_t zccl__cuda_ctx(const zccl_cuda_drv_t *d);
/** Remembers the device of a call's buffers (zccl__mem_call_type). */
void zccl__cuda_note_device(int device);

/* Stream-ordered calls (cuda_order.c) and the CUDA table (mem_cuda.c) share two facts: whether this thread runs a
 * stream-ordered call now (then the call must not wait for the whole context: the caller's stream waits for this
 * call), and how many stream-ordered calls are issued and not ended (then no device memory may be released with
 * cuMemFree, which waits for the whole device on some drivers: released blocks are kept and reused until none is). */
bool zccl__cuda_in_ordered_call(void);
long zccl__cuda_ordered_pending(void);
/** Queues the reduction kernel dst = a OP b (count elements of dt) on `stream` without waiting for it
 *  (mem_pipe.c's pipelined staging; the ops table's reduce waits). Errors: launch failures, named. */
zccl_result_t zccl__mem_cuda_reduce_on(CUstream stream, void *dst, const void *a, const void *b, size_t count,
                                       zccl_datatype_t dt, zccl_redop_t op, uint32_t divisor);
/** Binds the CUDA table to `device` (its internal stream, its kernels) before any stream-ordered wait exists. */
zccl_result_t zccl__mem_cuda_prepare(int device);

#endif

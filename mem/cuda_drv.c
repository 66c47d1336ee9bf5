/*
 * cuda_drv.c — opens the CUDA driver library with dlopen on first need and resolves the entry points zccl uses.
 * libzccl.so therefore has no link-time dependency on libcuda or libcudart (tools/gpu-check and the test
 * MemLayer.LibraryLoadsWithoutCuda check it with ldd); where the library is absent every query answers "host".
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include "mem.h"
#include "cuda_drv.h"

static zccl_cuda_drv_t drv;
static const zccl_cuda_drv_t *drv_ok;
static char drv_why[512];
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int cur_device = 0;

static void *sym(void *h, const char *name, bool required, bool *missing) {
    void *p = dlsym(h, name);
    if (!p && required) {
        if (!*missing) snprintf(drv_why, sizeof drv_why, "the CUDA driver library lacks %s", name);
        *missing = true;
    }
    return p;
}

static void drv_load(void) {
    const char *file = zccl__cfg_str(ZCCL_CFG_CUDA_LIBRARY);
    if (!file || !*file) file = "libcuda.so.1";
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(drv_why, sizeof drv_why, "cannot load the CUDA driver library %s (ZCCL_CUDA_LIBRARY): %s", file,
                 dlerror());
        return;
    }
    bool miss = false;
#define REQ(field, name) *(void **)&drv.field = sym(h, name, true, &miss)
#define OPT(field, name) *(void **)&drv.field = sym(h, name, false, &miss)
    REQ(cuInit, "cuInit");
    REQ(cuGetErrorString, "cuGetErrorString");
    REQ(cuPointerGetAttribute, "cuPointerGetAttribute");
    REQ(cuDeviceGet, "cuDeviceGet");
    REQ(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    REQ(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    REQ(cuCtxGetCurrent, "cuCtxGetCurrent");
    REQ(cuCtxSetCurrent, "cuCtxSetCurrent");
    REQ(cuMemAlloc, "cuMemAlloc_v2");
    REQ(cuMemFree, "cuMemFree_v2");
    REQ(cuMemcpyAsync, "cuMemcpyAsync");
    REQ(cuStreamCreate, "cuStreamCreate");
    REQ(cuStreamSynchronize, "cuStreamSynchronize");
    REQ(cuCtxSynchronize, "cuCtxSynchronize");
    REQ(cuModuleLoadData, "cuModuleLoadData");
    REQ(cuModuleGetFunction, "cuModuleGetFunction");
    REQ(cuLaunchKernel, "cuLaunchKernel");
    OPT(cuMemAllocHost, "cuMemAllocHost_v2");
    OPT(cuMemFreeHost, "cuMemFreeHost");
    OPT(cuEventCreate, "cuEventCreate");
    OPT(cuEventRecord, "cuEventRecord");
    OPT(cuEventQuery, "cuEventQuery");
    OPT(cuEventDestroy, "cuEventDestroy_v2");
    OPT(cuStreamWaitEvent, "cuStreamWaitEvent");
    OPT(cuStreamWaitValue32, "cuStreamWaitValue32_v2");
    OPT(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    OPT(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
    OPT(cuIpcGetMemHandle, "cuIpcGetMemHandle");
    OPT(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
    OPT(cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
    OPT(cuStreamGetCtx, "cuStreamGetCtx");
    OPT(cuCtxGetDevice, "cuCtxGetDevice");
    OPT(cuStreamDestroy, "cuStreamDestroy_v2");
#undef REQ
#undef OPT
    if (miss) { dlclose(h); return; }
    CUresult r = drv.cuInit(0);
    if (r != ZCU_SUCCESS) {
        const char *s = NULL;
        drv.cuGetErrorString(r, &s);
        snprintf(drv_why, sizeof drv_why, "cuInit failed in %s: %s (%d)", file, s ? s : "unknown error", r);
        dlclose(h);
        return;
    }
    drv_ok = &drv;
}

const zccl_cuda_drv_t *zccl__cuda_drv(const char **why) {
    pthread_once(&drv_once, drv_load);
    if (!drv_ok && why) *why = drv_why;
    return drv_ok;
}

int zccl__mem_caller_gpu(void) {
    if (!__atomic_load_n(&drv_ok, __ATOMIC_ACQUIRE)) {
        const char *file = zccl__cfg_str(ZCCL_CFG_CUDA_LIBRARY);
        if (!file || !*file) file = "libcuda.so.1";
        void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (!h) return -1; /* the process does not use CUDA */
        dlclose(h);
    }
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    CUcontext c = NULL;
    CUdevice dev = 0;
    if (!d || !d->cuCtxGetDevice || d->cuCtxGetCurrent(&c) != ZCU_SUCCESS || !c || d->cuCtxGetDevice(&dev) != ZCU_SUCCESS)
        return -1;
    return (int)dev;
}

const char *zccl__cuda_errstr(CUresult r) {
    static __thread char buf[96];
    const char *s = NULL;
    if (drv_ok && drv_ok->cuGetErrorString(r, &s) == ZCU_SUCCESS && s) return s;
    snprintf(buf, sizeof buf, "CUDA error %d", r);
    return buf;
}

void zccl__cuda_note_device(int device) { __atomic_store_n(&cur_device, device, __ATOMIC_RELAXED); }

zccl_result_t zccl__cuda_ctx(const zccl_cuda_drv_t *d) {
    CUcontext c = NULL;
    if (d->cuCtxGetCurrent(&c) == ZCU_SUCCESS && c) return ZCCL_SUCCESS;
    const int dev = __atomic_load_n(&cur_device, __ATOMIC_RELAXED);
    CUdevice cd;
    CUresult r = d->cuDeviceGet(&cd, dev);
    if (r == ZCU_SUCCESS) r = d->cuDevicePrimaryCtxRetain(&c, cd);
    if (r == ZCU_SUCCESS) r = d->cuCtxSetCurrent(c);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "cannot make the primary context of CUDA device %d current: %s", dev,
                           zccl__cuda_errstr(r));
    return ZCCL_SUCCESS;
}

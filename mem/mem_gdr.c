/*
 * mem_gdr.c — the GPU's side of GPUDirect RDMA (mem_gdr.h): attributes and the dma-buf export of a device range,
 * through the dlopen'ed driver (cuda_drv.c), so a machine without CUDA answers "no driver".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "mem.h"
#include "mem_gdr.h"
#include "cuda_drv.h"

enum {
    ZCU_ATTR_PCI_BUS_ID = 33,
    ZCU_ATTR_PCI_DEVICE_ID = 34,
    ZCU_ATTR_PCI_DOMAIN_ID = 50,
    ZCU_ATTR_CC_MAJOR = 75,
    ZCU_ATTR_CC_MINOR = 76,
    ZCU_ATTR_GPU_DIRECT_RDMA_SUPPORTED = 116,
    ZCU_ATTR_DMA_BUF_SUPPORTED = 124,
    ZCU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
};
typedef CUresult (*get_handle_fn)(void *, CUdeviceptr, size_t, int, unsigned long long);

/* cuMemGetHandleForAddressRange is optional (CUDA 11.7+): looked up in the library cuda_drv.c opened. */
static get_handle_fn handle_fn(void) {
    static get_handle_fn fn;
    static int tried;
    if (!tried) {
        tried = 1;
        const char *file = zccl__cfg_str(ZCCL_CFG_CUDA_LIBRARY);
        void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (h) *(void **)&fn = dlsym(h, "cuMemGetHandleForAddressRange");
    }
    return fn;
}

void zccl__mem_gpu_gdr(int dev, zccl_gpu_gdr_t *out) {
    memset(out, 0, sizeof *out);
    out->dmabuf = out->gdr = out->cc_major = out->cc_minor = -1;
    const char *why = NULL;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(&why);
    if (!d) {
        snprintf(out->why, sizeof out->why, "no CUDA driver: %s", why ? why : "?");
        return;
    }
    out->driver = true;
    CUdevice cd = 0;
    if (d->cuDeviceGet(&cd, dev) != ZCU_SUCCESS) {
        snprintf(out->why, sizeof out->why, "CUDA device %d does not exist", dev);
        return;
    }
    int v = 0;
    if (d->cuDeviceGetAttribute(&v, ZCU_ATTR_DMA_BUF_SUPPORTED, cd) == ZCU_SUCCESS) out->dmabuf = v != 0;
    if (d->cuDeviceGetAttribute(&v, ZCU_ATTR_GPU_DIRECT_RDMA_SUPPORTED, cd) == ZCU_SUCCESS) out->gdr = v != 0;
    if (d->cuDeviceGetAttribute(&v, ZCU_ATTR_CC_MAJOR, cd) == ZCU_SUCCESS) out->cc_major = v;
    if (d->cuDeviceGetAttribute(&v, ZCU_ATTR_CC_MINOR, cd) == ZCU_SUCCESS) out->cc_minor = v;
    int dom = 0, bus = 0, pdev = 0;
    if (d->cuDeviceGetAttribute(&dom, ZCU_ATTR_PCI_DOMAIN_ID, cd) == ZCU_SUCCESS &&
        d->cuDeviceGetAttribute(&bus, ZCU_ATTR_PCI_BUS_ID, cd) == ZCU_SUCCESS &&
        d->cuDeviceGetAttribute(&pdev, ZCU_ATTR_PCI_DEVICE_ID, cd) == ZCU_SUCCESS)
        snprintf(out->busid, sizeof out->busid, "%04x:%02x:%02x.0", (unsigned)dom & 0xffff, (unsigned)bus & 0xff,
                 (unsigned)pdev & 0xff);
    out->export_entry = handle_fn() != NULL;
    snprintf(out->why, sizeof out->why, "CUDA device %d: compute capability %d.%d, dma-buf %s, GPUDirect RDMA %s%s", dev,
             out->cc_major, out->cc_minor, out->dmabuf < 0 ? "unknown" : out->dmabuf ? "yes" : "no",
             out->gdr < 0 ? "unknown" : out->gdr ? "yes" : "no",
             out->export_entry ? "" : ", no cuMemGetHandleForAddressRange (driver older than CUDA 11.7)");
}

zccl_result_t zccl__mem_gpu_dmabuf_fd(const void *p, size_t bytes, int *fd) {
    const long page = sysconf(_SC_PAGESIZE);
    if (((uintptr_t)p % (uintptr_t)page) || (bytes % (size_t)page) || !bytes)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "dma-buf export of device memory [%p, +%zu bytes): the range must be "
                           "page-aligned (%ld bytes) and non-empty", p, bytes, page);
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    get_handle_fn fn = d ? handle_fn() : NULL;
    if (!fn)
        return zccl__error(ZCCL_INVALID_USAGE, "dma-buf export of device memory at %p: the CUDA driver has no "
                           "cuMemGetHandleForAddressRange (older than CUDA 11.7, or no driver)", p);
    ZCCL_CHECK(zccl__cuda_ctx(d));
    int h = -1;
    CUresult r = fn(&h, (CUdeviceptr)(uintptr_t)p, bytes, ZCU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != ZCU_SUCCESS)
        return zccl__error(ZCCL_INVALID_USAGE, "device memory [%p, +%zu bytes) cannot be exported as a dma-buf "
                           "(cuMemGetHandleForAddressRange: %s)", p, bytes, zccl__cuda_errstr(r));
    *fd = h;
    return ZCCL_SUCCESS;
}

/*
 * ib_gdr.c — GPUDirect RDMA: registering GPU memory with the RDMA device so the NIC reads and writes it directly.
 *
 * Two kernel paths exist (NVIDIA, "GPUDirect RDMA" documentation): dma-buf, where the CUDA driver exports the
 * range as a dma-buf file descriptor (cuMemGetHandleForAddressRange, CUDA 11.7+) and the RDMA device registers it
 * with ibv_reg_dmabuf_mr (Linux 5.12+, rdma-core 34+); and the nvidia-peermem module, with which plain ibv_reg_mr
 * accepts device pointers. Detection: dma-buf when the build has CUDA's headers and libcuda.so.1 loads; else
 * peer memory when /sys/module/nvidia_peermem exists; else none, and GPU buffers would have to be staged through
 * pinned host memory.
 *
 * This code is compiled where /usr/local/cuda/include/cuda.h exists (ZCCL_HAVE_CUDA) but has only been exercised
 * on machines without a GPU, where it reports "none": no machine with both a GPU and an RDMA NIC was available.
 * libcuda is opened with dlopen, so zccl does not depend on the CUDA driver. zccl's collectives read and reduce
 * buffers on the CPU, so today only the registration is GPU-aware (see docs/ib.md).
 */
#include <stdlib.h>
#include <unistd.h>
#include "ib.h"

const char *zccl__ib_gdr_mode_name(zccl_gdr_mode_t m) {
    return m == ZCCL_GDR_DMABUF ? "dma-buf (ibv_reg_dmabuf_mr)"
         : m == ZCCL_GDR_PEERMEM ? "nvidia-peermem (ibv_reg_mr)" : "none (GPU buffers staged through host memory)";
}

#ifdef ZCCL_HAVE_IB
#include <dlfcn.h>
#include <errno.h>
#include "ib_verbs.h"
#ifdef ZCCL_HAVE_CUDA
#include <cuda.h>
typedef CUresult (*get_attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
typedef CUresult (*get_handle_fn)(void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
static get_attr_fn cu_get_attr;
static get_handle_fn cu_get_handle;
#endif

zccl_gdr_mode_t zccl__ib_gdr_detect(void) {
#ifdef ZCCL_HAVE_CUDA
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) {
        cu_get_attr = (get_attr_fn)dlsym(h, "cuPointerGetAttribute");
        cu_get_handle = (get_handle_fn)dlsym(h, "cuMemGetHandleForAddressRange");
        if (cu_get_attr && cu_get_handle) return ZCCL_GDR_DMABUF;
        if (cu_get_attr && access("/sys/module/nvidia_peermem", F_OK) == 0) return ZCCL_GDR_PEERMEM;
    }
#endif
    return ZCCL_GDR_NONE;
}

struct ibv_mr *zccl__ib_reg(struct ibv_pd *pd, zccl_gdr_mode_t gdr, void *addr, size_t len) {
    const int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
#ifdef ZCCL_HAVE_CUDA
    if (gdr != ZCCL_GDR_NONE && cu_get_attr) {
        unsigned int type = 0;
        if (cu_get_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)addr) == CUDA_SUCCESS &&
            type == CU_MEMORYTYPE_DEVICE) {
            if (gdr == ZCCL_GDR_PEERMEM) return ibv_reg_mr(pd, addr, len, flags);
            int fd = -1;
            struct ibv_mr *mr = NULL;
            errno = 0;
            if (cu_get_handle(&fd, (CUdeviceptr)(uintptr_t)addr, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ==
                CUDA_SUCCESS) {
                /* The range is page-aligned by the cache, so the dma-buf starts at addr: offset 0, iova = addr. */
                mr = ibv_reg_dmabuf_mr(pd, 0, len, (uint64_t)(uintptr_t)addr, fd, flags);
                close(fd);
            }
            /* A driver or kernel without dma-buf support: the peer-memory module, if loaded, still works. */
            if (!mr && access("/sys/module/nvidia_peermem", F_OK) == 0) mr = ibv_reg_mr(pd, addr, len, flags);
            if (!mr && !errno) errno = ENOTSUP;
            return mr; /* NULL: the caller stages through host memory */
        }
    }
#endif
    (void)gdr;
    return ibv_reg_mr(pd, addr, len, flags);
}
#endif /* ZCCL_HAVE_IB */

/*
 * ib_gdr.c — GPUDirect RDMA on an open RDMA device: the dma-buf probe and the registration of device memory
 * (issue 24; settings and the peer-memory probe are ib_gdr_probe.c's, docs/gpu.md "GPUDirect RDMA").
 *
 * Two kernel paths exist: dma-buf, where the CUDA driver exports a page-aligned device range as a dma-buf file
 * descriptor (cuMemGetHandleForAddressRange) and the RDMA device registers it with ibv_reg_dmabuf_mr (offset 0,
 * iova = the range's virtual address, so work requests use device addresses as for any MR; the MR's addr field is
 * the offset then, never an address); and the peer-memory module, with which plain ibv_reg_mr accepts device
 * pointers. The CUDA side goes through the memory layer's driver (ZCCL_CUDA_LIBRARY, so the fake driver of the tests
 * answers in the soft-RoCE VM too). zccl's verbs data path still stages device buffers through host memory
 * (pipelined, lib/core/engine_stage.c): only the probe and the registration are GPU-aware (docs/ib.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ib.h"
#include "gdr.h"
#include "mem.h"
#include "mem_gdr.h"

const char *zccl__ib_gdr_mode_name(zccl_gdr_mode_t m) {
    return m == ZCCL_GDR_DMABUF ? "dma-buf (ibv_reg_dmabuf_mr)"
         : m == ZCCL_GDR_PEERMEM ? "nvidia-peermem (ibv_reg_mr)" : "none (GPU buffers staged through host memory)";
}

#ifdef ZCCL_HAVE_IB
#include "ib_verbs.h"

/* ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0): a device that supports dma-buf gets as far as the fd and fails with EBADF;
 * one that does not fails with EOPNOTSUPP or EPROTONOSUPPORT (rxe: no dma-buf). */
int zccl__ib_gdr_probe_dmabuf(struct ibv_pd *pd, char *why, size_t len) {
    errno = 0;
    struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
    const int e = errno;
    if (mr) { /* cannot happen with fd -1; do not leak it if it does */
        ibv_dereg_mr(mr);
        snprintf(why, len, "dma-buf probe registered fd -1: treated as unsupported");
        return 0;
    }
    if (e == EBADF) { snprintf(why, len, "dma-buf supported (probe: EBADF)"); return 1; }
    snprintf(why, len, "no dma-buf on this RDMA device (probe: %s)", strerror(e ? e : EOPNOTSUPP));
    return 0;
}

zccl_gdr_mode_t zccl__ib_gdr_detect(struct ibv_pd *pd) {
    zccl_gdr_cfg_t cfg;
    if (zccl__gdr_cfg(&cfg) != ZCCL_SUCCESS) return ZCCL_GDR_NONE; /* zccl_config_describe names the bad value */
    zccl_nic_gdr_t nic = {.nic_dmabuf = -1};
    zccl__gdr_probe_peermem("/", &nic);
    nic.nic_dmabuf = pd ? zccl__ib_gdr_probe_dmabuf(pd, nic.nic_why, sizeof nic.nic_why) : -1;
    ZCCL_INFO(ZCCL_LOG_IB, "GPUDirect RDMA probe: NIC %s; %s", pd ? nic.nic_why : "not probed", nic.peermem_what);
    if (cfg.mode == 0) return ZCCL_GDR_NONE;
    if (cfg.dmabuf && nic.nic_dmabuf == 1) return ZCCL_GDR_DMABUF;
    return nic.peermem ? ZCCL_GDR_PEERMEM : ZCCL_GDR_NONE;
}

struct ibv_mr *zccl__ib_reg(struct ibv_pd *pd, zccl_gdr_mode_t gdr, void *addr, size_t len) {
    const int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    zccl_mem_type_t type = ZCCL_MEM_HOST;
    int dev = -1;
    if (gdr != ZCCL_GDR_NONE && zccl__mem_query(addr, &type, &dev) == ZCCL_SUCCESS && type == ZCCL_MEM_CUDA) {
        if (gdr == ZCCL_GDR_DMABUF) {
            int fd = -1;
            if (zccl__mem_gpu_dmabuf_fd(addr, len, &fd) == ZCCL_SUCCESS) {
                /* remote read too: the flush reads one landed byte back over a loopback QP */
                struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, len, (uint64_t)(uintptr_t)addr, fd,
                                                      flags | IBV_ACCESS_REMOTE_READ);
                const int e = errno;
                close(fd); /* the MR holds the dma-buf; the fd is not needed any more */
                if (mr) return mr;
                errno = e;
            }
        }
        /* The peer-memory module, when loaded, takes device pointers (also after a refused dma-buf). */
        zccl_nic_gdr_t nic;
        zccl__gdr_probe_peermem("/", &nic);
        if (!nic.peermem && gdr != ZCCL_GDR_PEERMEM) {
            if (!errno) errno = ENOTSUP;
            return NULL; /* the caller stages through host memory */
        }
    }
    return ibv_reg_mr(pd, addr, len, type == ZCCL_MEM_CUDA ? flags | IBV_ACCESS_REMOTE_READ : flags);
}
#endif /* ZCCL_HAVE_IB */

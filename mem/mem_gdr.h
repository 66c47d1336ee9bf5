/*
 * mem_gdr.h — what the GPU says about GPUDirect RDMA (mem_gdr.c; issue 24, docs/gpu.md "GPUDirect RDMA").
 */
#ifndef ZCCL_MEM_GDR_H
#define ZCCL_MEM_GDR_H

#include <stdbool.h>
#include "zccl.h"

typedef struct {
    bool driver;       /* libcuda loaded; when false the rest is unknown and why says it */
    int dmabuf;        /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: 1, 0, -1 unknown (the driver does not answer) */
    int gdr;           /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: 1, 0, -1 unknown */
    int cc_major, cc_minor; /* compute capability (-1 unknown) */
    bool export_entry; /* the driver exports cuMemGetHandleForAddressRange (CUDA >= 11.7) */
    char busid[32];    /* PCI bus id "dddd:bb:dd.0" from the PCI attributes; "" when the driver does not say */
    char why[160];
} zccl_gpu_gdr_t;

/** Asks CUDA device `dev` (ordinal) about GPUDirect RDMA. Never fails: unknowns are -1, the reason in why. */
void zccl__mem_gpu_gdr(int dev, zccl_gpu_gdr_t *out);

/**
 * A dma-buf file descriptor for [p, p + bytes) of device memory (cuMemGetHandleForAddressRange, DMA_BUF_FD), for
 * ibv_reg_dmabuf_mr: p and bytes must be page-aligned (else ZCCL_INVALID_ARGUMENT naming them); a driver that
 * refuses (no dma-buf support, memory that cannot be exported) is ZCCL_INVALID_USAGE naming its error. The caller
 * closes *fd once the registration exists.
 */
zccl_result_t zccl__mem_gpu_dmabuf_fd(const void *p, size_t bytes, int *fd);

#endif

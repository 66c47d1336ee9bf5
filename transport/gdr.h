/*
 * gdr.h — GPUDirect RDMA settings and probes (transport/ib_gdr_probe.c; issue 24, docs/gpu.md "GPUDirect RDMA").
 * Whether a GPU's memory may be registered with an RDMA NIC has three sides: the settings (ZCCL_GDR and NCCL's
 * NET_GDR_* names), the NIC (dma-buf registration or the peer-memory kernel module) and the GPU (its attributes;
 * the flush before Hopper). The path rule between a GPU and its NIC is topology's (zccl_topo_gdr_pair).
 */
#ifndef ZCCL_GDR_H
#define ZCCL_GDR_H

#include <stdbool.h>
#include <stddef.h>
#include "topo.h"
#include "zccl.h"

typedef struct {
    int mode;              /* ZCCL_GDR: -1 auto (the path rule decides), 0 never, 1 wherever NIC and GPU support it */
    zccl_path_t level;     /* ZCCL_NET_GDR_LEVEL */
    bool read;             /* ZCCL_NET_GDR_READ: the NIC may read device memory for sends (-1 in the row: by GPU) */
    int read_setting;      /* -1 auto (from compute capability 8.0 on), 0, 1 */
    bool dmabuf;           /* ZCCL_DMABUF_ENABLE */
    bool flush_disable;    /* ZCCL_GDR_FLUSH_DISABLE */
    int fake_peermem;      /* ZCCL_GDR_FAKE_PEERMEM (test only): 1 peer memory assumed, 2 and registrations refused */
} zccl_gdr_cfg_t;

/** The settings in force; an invalid value is ZCCL_INVALID_ARGUMENT naming the variable and what it accepts. */
zccl_result_t zccl__gdr_cfg(zccl_gdr_cfg_t *out);

typedef struct zccl_nic_gdr {
    bool peermem;          /* the peer-memory module is loaded (sysfs) */
    char peermem_what[96]; /* which file said so, or why not */
    int nic_dmabuf;        /* the RDMA device registers dma-bufs: 1, 0, -1 not probed */
    char nic_why[128];
} zccl_nic_gdr_t;

/** The peer-memory module under sysfs root `root` (normally "/"): /sys/kernel/mm/memory_peers/nv_mem/version or
 *  /sys/module/nvidia_peermem/version (or nv_peer_mem). */
void zccl__gdr_probe_peermem(const char *root, zccl_nic_gdr_t *out);

/**
 * What a rank would do with device memory on the NIC, as one sentence in buf: "gdr (dma-buf)", "gdr (peer memory)"
 * or "staged: <reason>", and whether the flush is needed (GPU before compute capability 9.0 unless
 * ZCCL_GDR_FLUSH_DISABLE). Returns true for GDR. gpu_dev: the CUDA ordinal asked about (-1: none).
 */
bool zccl__gdr_decide(const zccl_gdr_cfg_t *cfg, const zccl_nic_gdr_t *nic, int gpu_dev, bool *flush, char *buf,
                      size_t len);

/** zccl_config_describe's GDR line: settings in force and the peer-memory probe (the dma-buf probe needs an open
 *  RDMA device and is logged at INFO when a communicator opens one). */
size_t zccl__gdr_describe(char *buf, size_t len);

/* This layer's GDR rows (transport/settings.c). */
extern const zccl_cfg_desc_t zccl__set_gdr;
extern const zccl_cfg_desc_t zccl__set_net_gdr_level;
extern const zccl_cfg_desc_t zccl__set_net_gdr_read;
extern const zccl_cfg_desc_t zccl__set_dmabuf_enable;
extern const zccl_cfg_desc_t zccl__set_gdr_flush_disable;
extern const zccl_cfg_desc_t zccl__set_gdr_fake_peermem;
#define ZCCL_CFG_GDR (&zccl__set_gdr)
#define ZCCL_CFG_NET_GDR_LEVEL (&zccl__set_net_gdr_level)
#define ZCCL_CFG_NET_GDR_READ (&zccl__set_net_gdr_read)
#define ZCCL_CFG_DMABUF_ENABLE (&zccl__set_dmabuf_enable)
#define ZCCL_CFG_GDR_FLUSH_DISABLE (&zccl__set_gdr_flush_disable)
#define ZCCL_CFG_GDR_FAKE_PEERMEM (&zccl__set_gdr_fake_peermem)

#endif

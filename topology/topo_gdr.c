/*
 * topo_gdr.c — the path rule of GPUDirect RDMA (issue 24, docs/gpu.md "GPUDirect RDMA"): a GPU moves data straight
 * to and from the NIC it pairs with only when the PCIe path between them is no longer than a level (NCCL's
 * NCCL_NET_GDR_LEVEL; default PXB: GPU and NIC below one PCIe switch tree). Through the host bridge (PHB) or across
 * sockets (SYS) peer-to-peer PCIe traffic is slow or unsupported on many chipsets, and staging through host memory
 * is the better path. This file only classifies; the probes of the NIC (dma-buf, peer memory) and of the GPU
 * (attributes) are the transport's (transport/ib_gdr_probe.c).
 */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <strings.h>
#include "topo.h"

int zccl_topo_gdr_level_parse(const char *s, zccl_path_t *out) {
    static const char *const names[] = {"LOC", "PIX", "PXB", "PHB", "SYS"};
    if (!s || !*s) return -1;
    for (int i = 0; i < 5; i++)
        if (!strcasecmp(s, names[i])) { *out = (zccl_path_t)i; return 0; }
    if (!strcasecmp(s, "NODE")) { *out = ZCCL_PATH_PHB; return 0; } /* nvidia-smi's name; NCCL's PHB */
    /* NCCL's deprecated numbers: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 SYS (and anything larger: SYS) */
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end && *end == '\0' && v >= 0) { *out = v >= 4 ? ZCCL_PATH_SYS : (zccl_path_t)v; return 0; }
    return -1;
}

bool zccl_topo_gdr_pair(const zccl_topo_t *t, const zccl_topo_dev_t *gpu, zccl_path_t level, int *nic,
                        zccl_path_t *path, char *why, size_t len) {
    int nics[64];
    zccl_path_t p = ZCCL_PATH_SYS;
    const int found = zccl_topo_nearest_nics(t, gpu, nics, 64, &p, NULL);
    *nic = found ? nics[0] : -1;
    *path = p;
    if (!found) {
        snprintf(why, len, "no NIC in the topology");
        return false;
    }
    if (zccl_topo_rdma_nic_count(t) == 0) {
        snprintf(why, len, "no RDMA-capable NIC (Ethernet only)");
        return false;
    }
    if (p > level) {
        snprintf(why, len, "GPU-NIC path %s is farther than the GDR level %s (ZCCL_NET_GDR_LEVEL)",
                 zccl_topo_path_name(p), zccl_topo_path_name(level));
        return false;
    }
    snprintf(why, len, "GPU-NIC path %s within the GDR level %s", zccl_topo_path_name(p), zccl_topo_path_name(level));
    return true;
}

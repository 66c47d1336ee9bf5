/*
 * ib_gdr_probe.c — GPUDirect RDMA settings and probes (gdr.h; issue 24, docs/gpu.md "GPUDirect RDMA").
 *
 * Facts it encodes (NVIDIA's GPUDirect RDMA documentation, rdma-core, NCCL's net_ib): the NIC side supports device
 * memory through the peer-memory module (nvidia-peermem, formerly nv_peer_mem: a plain ibv_reg_mr of a device
 * pointer works) or through dma-buf (ibv_reg_dmabuf_mr, rdma-core 34 / IBVERBS_1.12, Linux 5.12: registering fd -1
 * fails with EBADF where the device supports it and with EOPNOTSUPP / EPROTONOSUPPORT where it does not); the GPU
 * side through CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (with cuMemGetHandleForAddressRange, CUDA 11.7) or
 * CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED. Data that the NIC wrote into device memory must be flushed (a
 * 1-byte RDMA read) before the GPU reads it on GPUs before Hopper; sending from device memory (the NIC reading it)
 * is used from Ampere on.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "gdr.h"
#include "mem_gdr.h"
#include "transport.h"

zccl_result_t zccl__gdr_cfg(zccl_gdr_cfg_t *out) {
    memset(out, 0, sizeof *out);
    const char *m = zccl__cfg_str(ZCCL_CFG_GDR);
    if (!strcmp(m, "auto") || !*m) out->mode = -1;
    else if (!strcmp(m, "0")) out->mode = 0;
    else if (!strcmp(m, "1")) out->mode = 1;
    else
        return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_GDR=%s: expected auto, 0 or 1", m);
    const char *lv = zccl__cfg_str(ZCCL_CFG_NET_GDR_LEVEL);
    if (zccl_topo_gdr_level_parse(lv, &out->level) != 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=%s: expected LOC, PIX, PXB, PHB, SYS or 0..4",
                           zccl__cfg_source(ZCCL_CFG_NET_GDR_LEVEL) ? zccl__cfg_source(ZCCL_CFG_NET_GDR_LEVEL)
                                                                    : "ZCCL_NET_GDR_LEVEL", lv);
    int64_t v = 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_NET_GDR_READ, &v));
    out->read_setting = (int)v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_DMABUF_ENABLE, &v));
    out->dmabuf = v != 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_GDR_FLUSH_DISABLE, &v));
    out->flush_disable = v != 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_GDR_FAKE_PEERMEM, &v));
    out->fake_peermem = (int)v;
    return ZCCL_SUCCESS;
}

void zccl__gdr_probe_peermem(const char *root, zccl_nic_gdr_t *out) {
    static const char *const files[] = {"/sys/kernel/mm/memory_peers/nv_mem/version",
                                        "/sys/module/nvidia_peermem/version", "/sys/module/nv_peer_mem/version"};
    out->peermem = false;
    int64_t fake = 0;
    if ((!root || !strcmp(root, "/")) && zccl__cfg_int(ZCCL_CFG_GDR_FAKE_PEERMEM, &fake) == ZCCL_SUCCESS && fake) {
        out->peermem = true; /* test only: the fake CUDA driver's device memory is host memory ibv_reg_mr takes */
        snprintf(out->peermem_what, sizeof out->peermem_what, "peer memory assumed (ZCCL_GDR_FAKE_PEERMEM=%d, test "
                 "only%s)", (int)fake, fake == 2 ? ", device registrations refused" : "");
        return;
    }
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s%s", root && strcmp(root, "/") ? root : "", files[i]);
        if (access(path, R_OK) == 0) {
            out->peermem = true;
            snprintf(out->peermem_what, sizeof out->peermem_what, "peer memory (%s)", files[i]);
            return;
        }
    }
    snprintf(out->peermem_what, sizeof out->peermem_what, "no peer-memory module (nvidia_peermem not loaded)");
}

bool zccl__gdr_decide(const zccl_gdr_cfg_t *cfg, const zccl_nic_gdr_t *nic, int gpu_dev, bool *flush, char *buf,
                      size_t len) {
    *flush = false;
    if (cfg->mode == 0) { snprintf(buf, len, "staged: ZCCL_GDR=0"); return false; }
    if (gpu_dev < 0) { snprintf(buf, len, "staged: no CUDA device"); return false; }
    zccl_gpu_gdr_t g;
    zccl__mem_gpu_gdr(gpu_dev, &g);
    if (!g.driver) { snprintf(buf, len, "staged: %s", g.why); return false; }
    const bool dmabuf = cfg->dmabuf && nic->nic_dmabuf == 1 && g.dmabuf == 1 && g.export_entry;
    const bool peer = nic->peermem && g.gdr != 0;
    if (!dmabuf && !peer) {
        snprintf(buf, len, "staged: neither dma-buf (NIC %s, GPU %s%s) nor peer memory (%s%s)",
                 nic->nic_dmabuf == 1 ? "yes" : nic->nic_dmabuf == 0 ? "no" : "not probed",
                 g.dmabuf == 1 ? "yes" : g.dmabuf == 0 ? "no" : "unknown", cfg->dmabuf ? "" : ", ZCCL_DMABUF_ENABLE=0",
                 nic->peermem_what, nic->peermem && g.gdr == 0 ? ", GPU says no GPUDirect RDMA" : "");
        return false;
    }
    *flush = !cfg->flush_disable && g.cc_major >= 0 && g.cc_major < 9;
    const bool read = cfg->read_setting == 1 || (cfg->read_setting == -1 && g.cc_major >= 8);
    snprintf(buf, len, "gdr (%s; %s; sends %s; flush %s)", dmabuf ? "dma-buf" : "peer memory", g.why,
             read ? "from device memory" : "staged (ZCCL_NET_GDR_READ)",
             *flush ? "after each landed receive (before Hopper)" : cfg->flush_disable ? "off (ZCCL_GDR_FLUSH_DISABLE)"
                                                                                        : "not needed");
    return true;
}

size_t zccl__gdr_describe(char *buf, size_t len) {
    zccl_gdr_cfg_t c;
    if (zccl__gdr_cfg(&c) != ZCCL_SUCCESS)
        return (size_t)snprintf(buf, len, "GPUDirect RDMA: invalid setting: %s\n", zccl__last_error());
    zccl_nic_gdr_t nic = {.nic_dmabuf = -1};
    zccl__gdr_probe_peermem("/", &nic);
    int n = snprintf(buf, len, "GPUDirect RDMA: ZCCL_GDR=%s, path level %s, dma-buf %s, flush %s; NIC: %s, dma-buf "
                     "probed when a communicator opens an RDMA device (ZCCL_DEBUG=INFO, subsystem IB); each device "
                     "call over verbs takes the GDR path when every rank can, else pipelined staging (ZCCL_DEBUG=INFO, "
                     "subsystem COLL, names it)\n",
                     c.mode < 0 ? "auto" : c.mode ? "1" : "0", zccl_topo_path_name(c.level),
                     c.dmabuf ? "enabled" : "disabled", c.flush_disable ? "disabled" : "before Hopper",
                     nic.peermem_what);
    return n > 0 ? (size_t)n : 0;
}

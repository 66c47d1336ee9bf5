/*
 * ib_gdr.c — GPUDirect RDMA on an open RDMA device: the dma-buf probe and the registration of device memory
 * (issue 24; settings and the peer-memory probe are ib_gdr_probe.c's, docs/gpu.md "GPUDirect RDMA").
 *
 * Two kernel paths exist: dma-buf, where the CUDA driver exports a page-aligned device range as a dma-buf file
 * descriptor (cuMemGetHandleForAddressRange) and the RDMA device registers it with ibv_reg_dmabuf_mr (offset 0,
 * iova = the range's virtual address, so work requests use device addresses as for any MR; the MR's addr field is
 * the offset then, never an address); and the peer-memory module, with which plain ibv_reg_mr accepts device
 * pointers. The CUDA side goes through the memory layer's driver (ZCCL_CUDA_LIBRARY, so the fake driver of the tests
 * answers in the soft-RoCE VM too).
 *
 * The GDR data path (lib/core/engine_gdr.c decides per call, ib.c moves the bytes): device allocations registered
 * once per allocation in the communicator's registration cache (the same cache as host buffers, which is per NIC),
 * and the flush: an RC QP connected to itself, over which a 1-byte RDMA READ of the last landed bytes makes the
 * NIC's earlier PCIe writes to GPU memory visible to the GPU before a kernel or the caller reads them (needed
 * before Hopper).
 */
#include <sched.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ib.h"
#include "gdr.h"
#include "mem.h"
#include "mem_gdr.h"
#include "transport.h"

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
        int64_t fake = 0;
        if (zccl__cfg_int(ZCCL_CFG_GDR_FAKE_PEERMEM, &fake) == ZCCL_SUCCESS && fake == 2) {
            errno = EPERM; /* test only: this rank's registrations of device memory are refused */
            return NULL;
        }
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

void zccl__ib_flush_close(struct zccl_ib_comm *ib) {
    if (ib->flush_qp) ibv_destroy_qp(ib->flush_qp);
    if (ib->flush_cq) ibv_destroy_cq(ib->flush_cq);
    if (ib->flush_mr) ibv_dereg_mr(ib->flush_mr);
    free(ib->flush_buf);
    ib->flush_qp = NULL;
    ib->flush_cq = NULL;
    ib->flush_mr = NULL;
    ib->flush_buf = NULL;
}

/* A loopback RC QP: INIT, then RTR with itself as destination (its own LID; on RoCE its own GID), then RTS. */
void zccl__ib_flush_open(struct zccl_ib_comm *ib) {
    const ib_rail_t *r = &ib->rail[0]; /* with several rails no call takes a flush (zccl__ib_gdr_usable) */
    const char *step = "ibv_create_cq";
    struct ibv_port_attr pa;
    if (!(ib->flush_cq = ibv_create_cq(r->ctx, 4, NULL, NULL, 0))) goto fail;
    step = "allocating its buffer";
    if (!(ib->flush_buf = aligned_alloc(64, 64))) goto fail;
    step = "ibv_reg_mr of its byte";
    if (!(ib->flush_mr = ibv_reg_mr(r->pd, ib->flush_buf, 64, IBV_ACCESS_LOCAL_WRITE))) goto fail;
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = ib->flush_cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 2;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ia.sq_sig_all = 1;
    step = "ibv_create_qp";
    if (!(ib->flush_qp = ibv_create_qp(r->pd, &ia))) goto fail;
    step = "ibv_query_port";
    if (ibv_query_port(r->ctx, (uint8_t)r->port, &pa) != 0) goto fail;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = (uint8_t)r->port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    step = "moving it to INIT";
    if (ibv_modify_qp(ib->flush_qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) goto fail;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = pa.active_mtu;
    a.dest_qp_num = ib->flush_qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = (uint8_t)r->port;
    a.ah_attr.dlid = pa.lid;
    if (ib->link == IBV_LINK_LAYER_ETHERNET || r->gid_index > 0) {
        step = "ibv_query_gid";
        if (ibv_query_gid(r->ctx, (uint8_t)r->port, r->gid_index, &a.ah_attr.grh.dgid) != 0) goto fail;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.sgid_index = (uint8_t)r->gid_index;
        a.ah_attr.grh.hop_limit = 1;
    }
    step = "moving it to RTR (connected to itself)";
    if (ibv_modify_qp(ib->flush_qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        goto fail;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    step = "moving it to RTS";
    if (ibv_modify_qp(ib->flush_qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        goto fail;
    ib->flush_why[0] = 0;
    ZCCL_INFO(ZCCL_LOG_IB, "GPUDirect RDMA flush: loopback QP %u on %s port %d", ib->flush_qp->qp_num, r->dev,
              r->port);
    return;
fail:
    snprintf(ib->flush_why, sizeof ib->flush_why, "no flush QP on %s port %d: %s failed: %s", r->dev, r->port, step,
             strerror(errno ? errno : EINVAL));
    ZCCL_INFO(ZCCL_LOG_IB, "GPUDirect RDMA: %s (calls that need the flush take the staged path)", ib->flush_why);
    zccl__ib_flush_close(ib);
}

zccl_result_t zccl__ib_flush(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, uint64_t addr, uint32_t rkey) {
    struct ibv_sge sge = {(uint64_t)(uintptr_t)ib->flush_buf, 1, ib->flush_mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(ib->flush_qp, &wr, &bad) != 0)
        return zccl__syserror(errno, "rank %d: posting the GDR flush (1-byte RDMA read at 0x%llx) on %s", comm->rank,
                              (unsigned long long)addr, ib->rail[0].dev);
    const uint64_t deadline = zccl__now_ns() + 10000000000ull;
    for (;;) {
        struct ibv_wc wc;
        const int n = ibv_poll_cq(ib->flush_cq, 1, &wc);
        if (n < 0) return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: ibv_poll_cq of the flush QP on %s failed (%d)",
                                      comm->rank, ib->rail[0].dev, n);
        if (n == 1) {
            if (wc.status != IBV_WC_SUCCESS)
                return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: the GDR flush (1-byte RDMA read at 0x%llx over the "
                                   "loopback QP on %s) completed with \"%s\"", comm->rank, (unsigned long long)addr,
                                   ib->rail[0].dev, ibv_wc_status_str(wc.status));
            ib->flushes++;
            return ZCCL_SUCCESS;
        }
        if (zccl__now_ns() > deadline)
            return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: the GDR flush on %s did not complete within 10 s",
                               comm->rank, ib->rail[0].dev);
        sched_yield();
    }
}

/* The mode every rail shares: none if a rail cannot register device memory, dma-buf only if every rail can. */
zccl_gdr_mode_t zccl__ib_gdr_mode(const struct zccl_ib_comm *ib) {
    zccl_gdr_mode_t m = ZCCL_GDR_DMABUF;
    for (int k = 0; k < ib->nrails; k++) {
        if (ib->rail[k].gdr == ZCCL_GDR_NONE) return ZCCL_GDR_NONE;
        if (ib->rail[k].gdr == ZCCL_GDR_PEERMEM) m = ZCCL_GDR_PEERMEM;
    }
    return ib->nrails > 0 ? m : ZCCL_GDR_NONE;
}

bool zccl__ib_gdr_usable(zccl_tp_comm_t *comm, bool need_flush, zccl_nic_gdr_t *nic, char *why, size_t len) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    const zccl_gdr_mode_t mode = ib ? zccl__ib_gdr_mode(ib) : ZCCL_GDR_NONE;
    zccl__gdr_probe_peermem("/", nic);
    nic->nic_dmabuf = ib && mode == ZCCL_GDR_DMABUF;
    snprintf(nic->nic_why, sizeof nic->nic_why, "%s", ib ? zccl__ib_gdr_mode_name(mode) : "no IB device");
    if (!ib || !ib->peer) { snprintf(why, len, "no IB device on this rank"); return false; }
    if (mode == ZCCL_GDR_NONE) {
        snprintf(why, len, "%s cannot register device memory (no dma-buf, %s)", ib->devs, nic->peermem_what);
        return false;
    }
    /* Data lands through every rail's NIC, and a flush orders only the writes of the NIC it reads through: with
     * several rails a GPU that needs the flush takes the staged path (a flush per rail is not built). */
    if (need_flush && ib->nrails > 1) {
        snprintf(why, len, "the flush is needed and this rank stripes over %d rails (%s): a flush per rail is not "
                 "built", ib->nrails, ib->devs);
        return false;
    }
    if (need_flush && !ib->flush_qp) { snprintf(why, len, "the flush is needed and %s", ib->flush_why); return false; }
    return true;
}

bool zccl__ib_gdr_register(zccl_tp_comm_t *comm, const void *p, size_t bytes, char *why, size_t len) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (!ib || !ib->peer) { snprintf(why, len, "no IB device on this rank"); return false; }
    void *base = (void *)p;
    size_t size = bytes;
    const zccl_mem_ops_t *m = zccl__mem_ops(ZCCL_MEM_CUDA);
    if (m && m->ipc_range && (m->ipc_range(p, &base, &size) != ZCCL_SUCCESS || !base || !size)) {
        base = (void *)p; /* the allocation is unknown: the range the call uses */
        size = bytes;
    }
    /* A range running past the end of its allocation (into another one, or unallocated memory) cannot be one
     * registration: named, and this rank says no, so every rank stages the call. */
    if ((uintptr_t)p < (uintptr_t)base || (uintptr_t)p - (uintptr_t)base > size ||
        bytes > size - ((uintptr_t)p - (uintptr_t)base)) {
        snprintf(why, len, "device buffer %p + %zu bytes runs past the end of its allocation [%p, +%zu bytes) (a "
                 "range over two allocations?): not registered with the NIC", p, bytes, base, size);
        return false;
    }
    /* The allocation's buffer id: an address freed and allocated again has a new one, and its cached registration
     * (of the old pages) must not be handed out (zccl__ib_mr_get_dev). */
    uint64_t id = 0;
    if (zccl__mem_buffer_id(p, "device buffer", &id) != ZCCL_SUCCESS) {
        snprintf(why, len, "%s", zccl__last_error());
        return false;
    }
    for (int k = 0; k < ib->nrails; k++) { /* every rail's NIC may carry part of it */
        ib_rail_t *r = &ib->rail[k];
        errno = 0;
        bool stale = false;
        zccl_ib_mr_entry_t *e = zccl__ib_mr_get_dev(&r->cache, base, size, id, &stale);
        if (stale)
            ZCCL_INFO(ZCCL_LOG_IB, "rank %d: device buffer %p was freed and reallocated since it was registered with "
                      "%s (CUDA buffer id now %llu): registered again%s", comm->rank, base, r->dev,
                      (unsigned long long)id, e ? "" : " failed");
        if (!e) {
            snprintf(why, len, "registering device memory [%p, +%zu bytes) with %s (%s) failed: %s", base, size,
                     r->dev, zccl__ib_gdr_mode_name(r->gdr),
                     errno ? strerror(errno) : "registration cache full or range pinned");
            return false;
        }
        zccl__ib_mr_unpin(&r->cache, e);
    }
    return true;
}

bool zccl__ib_gdr_held(zccl_tp_comm_t *comm, const void *p, char *what, size_t len) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    for (int k = 0; ib && ib->peer && k < ib->nrails; k++) {
        const zccl_ib_mr_entry_t *e = zccl__ib_mr_find_dev(&ib->rail[k].cache, p);
        if (e) {
            snprintf(what, len, "registered with %s for GPUDirect RDMA as CUDA device memory [0x%llx, +%llu bytes) "
                     "of buffer id %llu", ib->rail[k].dev, (unsigned long long)e->start,
                     (unsigned long long)(e->end - e->start), (unsigned long long)e->buf_id);
            return true;
        }
    }
    return false;
}

uint64_t zccl__ib_gdr_stale(zccl_tp_comm_t *comm) {
    const struct zccl_ib_comm *ib = IB_OF(comm);
    uint64_t n = 0;
    for (int k = 0; ib && ib->peer && k < ib->nrails; k++) n += ib->rail[k].cache.stale;
    return n;
}

void zccl__ib_gdr_forget(zccl_tp_comm_t *comm, const void *p, size_t bytes) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    if (ib && ib->peer)
        for (int k = 0; k < ib->nrails; k++) zccl__ib_mr_invalidate(&ib->rail[k].cache, p, bytes);
}

uint64_t zccl__ib_gdr_flushes(zccl_tp_comm_t *comm) {
    const struct zccl_ib_comm *ib = IB_OF(comm);
    return ib ? ib->flushes : 0;
}
#else
bool zccl__ib_gdr_usable(zccl_tp_comm_t *comm, bool need_flush, zccl_nic_gdr_t *nic, char *why, size_t len) {
    (void)comm, (void)need_flush, (void)nic;
    snprintf(why, len, "the IB transport is absent from this build");
    return false;
}
bool zccl__ib_gdr_register(zccl_tp_comm_t *comm, const void *p, size_t bytes, char *why, size_t len) {
    (void)comm, (void)p, (void)bytes;
    snprintf(why, len, "the IB transport is absent from this build");
    return false;
}
void zccl__ib_gdr_forget(zccl_tp_comm_t *comm, const void *p, size_t bytes) { (void)comm, (void)p, (void)bytes; }
bool zccl__ib_gdr_held(zccl_tp_comm_t *comm, const void *p, char *what, size_t len) {
    (void)comm, (void)p, (void)what, (void)len;
    return false;
}
uint64_t zccl__ib_gdr_stale(zccl_tp_comm_t *comm) { (void)comm; return 0; }
uint64_t zccl__ib_gdr_flushes(zccl_tp_comm_t *comm) { (void)comm; return 0; }
#endif /* ZCCL_HAVE_IB */

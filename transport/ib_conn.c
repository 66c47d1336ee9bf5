/*
 * ib_conn.c — IB transport connections: device and port choice, the rdma_cm listener, connect/accept carrying the
 * job secret's proof in the private data, and the connect-time probe.
 *
 * Every pair of ranks that uses IB has one connection of ZCCL_IB_QPS_PER_CONN reliable-connected QPs carrying both
 * directions; the lower rank connects, the higher accepts. A connection is declared up only after each side has
 * written one IB_PROBE_BYTES buffer into the other with RDMA WRITE WITH IMMEDIATE and seen it acknowledged, so a
 * GID type or MTU mismatch on the path (NCCL issue #426) fails at init, naming the peer, the device, the GID index
 * and the path MTU, instead of hanging the first collective.
 */
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <net/if.h>
#include <openssl/crypto.h>
#include "ib.h"

/* ---- private data (pure) ------------------------------------------------------------------------------------ */

static void req_hdr(uint64_t comm_id, int from, int to, int qp, int nqp, uint8_t out[ZCCL_NONCE_BYTES]) {
    const uint32_t f = (uint32_t)from, t = (uint32_t)to;
    const uint16_t q = (uint16_t)qp, n = (uint16_t)nqp;
    memcpy(out, &comm_id, 8);
    /* from, to, qp and nqp folded into 8 bytes: ranks are < 2^16 */
    const uint64_t w = (uint64_t)(f & 0xffff) | ((uint64_t)(t & 0xffff) << 16) | ((uint64_t)q << 32) | ((uint64_t)n << 48);
    memcpy(out + 8, &w, 8);
}

void zccl__ib_req_encode(const uint8_t secret[ZCCL_SECRET_BYTES], uint64_t comm_id, int from, int to, int qp,
                         int nqp, const uint8_t nonce_c[ZCCL_NONCE_BYTES], uint8_t out[ZCCL_IB_REQ_BYTES]) {
    const int32_t f = from;
    const uint16_t q = (uint16_t)qp, n = (uint16_t)nqp;
    memcpy(out, &comm_id, 8);
    memcpy(out + 8, &f, 4);
    memcpy(out + 12, &q, 2);
    memcpy(out + 14, &n, 2);
    memcpy(out + 16, nonce_c, ZCCL_NONCE_BYTES);
    uint8_t hdr[ZCCL_NONCE_BYTES], mac[ZCCL_MAC_BYTES];
    req_hdr(comm_id, from, to, qp, nqp, hdr);
    zccl__proof_encode(secret, hdr, nonce_c, mac);
    memcpy(out + 32, mac, 16);
}

zccl_result_t zccl__ib_req_decode(const uint8_t secret[ZCCL_SECRET_BYTES], uint64_t comm_id, int me, int nranks,
                                  int expect_nqp, const void *buf, size_t len, int *from, int *qp,
                                  uint8_t nonce_c[ZCCL_NONCE_BYTES], const char **why) {
    const char *w = NULL;
    const uint8_t *b = buf;
    uint64_t id = 0;
    int32_t f = -1;
    uint16_t q = 0, n = 0;
    if (!buf || len < ZCCL_IB_REQ_BYTES) w = "connect request shorter than the zccl private data";
    if (!w) {
        memcpy(&id, b, 8);
        memcpy(&f, b + 8, 4);
        memcpy(&q, b + 12, 2);
        memcpy(&n, b + 14, 2);
        if (id != comm_id) w = "connect request for another communicator";
        else if (f < 0 || f >= nranks || f >= me) w = "connect request from a rank that must not connect to this one";
        else if (n != expect_nqp) w = "connect request with another ZCCL_IB_QPS_PER_CONN than this rank's";
        else if (q >= n) w = "connect request for a QP index beyond the connection's";
    }
    if (!w) {
        uint8_t hdr[ZCCL_NONCE_BYTES], mac[ZCCL_MAC_BYTES];
        req_hdr(comm_id, f, me, q, n, hdr);
        zccl__proof_encode(secret, hdr, b + 16, mac);
        if (CRYPTO_memcmp(mac, b + 32, 16) != 0) w = "connect request without a valid proof of the job secret";
    }
    if (w) {
        if (why) *why = w;
        return ZCCL_INVALID_ARGUMENT;
    }
    *from = f;
    *qp = q;
    memcpy(nonce_c, b + 16, ZCCL_NONCE_BYTES);
    return ZCCL_SUCCESS;
}

#ifdef ZCCL_HAVE_IB
#include <sys/random.h>
#include "ib_verbs.h"

/* ---- device, port, GID and address ----------------------------------------------------------------------------- */

/* The IPv4 address of interface `ifname`, or of the first interface under /sys/class/infiniband/<dev>/device/net. */
static bool if_ipv4(const char *ifname, zccl_sockaddr_t *out) {
    struct ifaddrs *ifs = NULL, *i;
    bool found = false;
    if (getifaddrs(&ifs) != 0) return false;
    for (i = ifs; i && !found; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !strcmp(i->ifa_name, ifname)) {
            memset(out, 0, sizeof *out);
            memcpy(&out->sa, i->ifa_addr, sizeof(struct sockaddr_in));
            out->len = sizeof(struct sockaddr_in);
            found = true;
        }
    freeifaddrs(ifs);
    return found;
}

static bool ipoib_addr(const char *dev, zccl_sockaddr_t *out) {
    char path[256];
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/device/net", dev);
    DIR *d = opendir(path);
    if (!d) return false;
    struct dirent *e;
    bool ok = false;
    while (!ok && (e = readdir(d)))
        if (e->d_name[0] != '.') ok = if_ipv4(e->d_name, out);
    closedir(d);
    return ok;
}

/* Address rdma_cm binds for this GID: the IPv4 address it maps, the IPv6 GID itself, or the IPoIB interface's. */
static bool gid_addr(const char *dev, const struct ibv_gid_entry *g, zccl_sockaddr_t *out) {
    memset(out, 0, sizeof *out);
    if (g->gid_type != IBV_GID_TYPE_IB && zccl__ib_gid_is_ipv4(g->gid.raw)) {
        struct sockaddr_in *s = (struct sockaddr_in *)&out->sa;
        s->sin_family = AF_INET;
        memcpy(&s->sin_addr, g->gid.raw + 12, 4);
        out->len = sizeof *s;
        return true;
    }
    if (g->gid_type != IBV_GID_TYPE_IB) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&out->sa;
        s->sin6_family = AF_INET6;
        memcpy(&s->sin6_addr, g->gid.raw, 16);
        if (IN6_IS_ADDR_LINKLOCAL(&s->sin6_addr)) s->sin6_scope_id = g->ndev_ifindex;
        out->len = sizeof *s;
        return true;
    }
    return ipoib_addr(dev, out);
}

/* Every active port allowed by ZCCL_IB_HCA (at most IB_MAX_RAILS, all on the link layer of the first and, on
 * InfiniBand, on its subnet), in device enumeration order: the rank's rails, with their GIDs and the addresses
 * rdma_cm binds. On failure *why says what was seen. */
static bool pick_rails(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, zccl_ib_peer_info_t *me, char *why,
                       size_t wlen) {
    int ndev = 0;
    struct ibv_context **devs = rdma_get_devices(&ndev);
    size_t w = (size_t)snprintf(why, wlen, "no active port%s among:", ib->k.hca.n ? " allowed by ZCCL_IB_HCA" : "");
    if (!devs || ndev == 0) snprintf(why, wlen, "no RDMA device (rdma_get_devices found none)");
    for (int d = 0; devs && d < ndev; d++) {
        struct ibv_context *ctx = devs[d];
        const char *name = ibv_get_device_name(ctx->device);
        struct ibv_device_attr da;
        if (ibv_query_device(ctx, &da) != 0) continue;
        for (int port = 1; port <= da.phys_port_cnt; port++) {
            struct ibv_port_attr pa;
            const bool allowed = zccl__ib_hca_match(&ib->k.hca, name, port);
            const bool active = ibv_query_port(ctx, (uint8_t)port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
            if (w < wlen)
                w += (size_t)snprintf(why + w, wlen - w, " %s:%d(%s)", name, port,
                                      !allowed ? "excluded" : active ? "active" : "not active");
            if (!allowed || !active) continue;
            const bool roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
            if (ib->nrails > 0 && (roce ? 2 : 1) != ib->link) {
                ZCCL_INFO(ZCCL_LOG_IB, "rank %d: %s port %d left out of the IB rails: its link layer (%s) is not "
                          "the first rail's (%s)", comm->rank, name, port, roce ? "Ethernet" : "InfiniBand",
                          ib->rail[0].dev);
                continue;
            }
            if (ib->nrails == IB_MAX_RAILS) {
                ZCCL_INFO(ZCCL_LOG_IB, "rank %d: %s port %d left out of the IB rails: at most %d rails", comm->rank,
                          name, port, IB_MAX_RAILS);
                continue;
            }
            struct ibv_gid_entry ge[128];
            ssize_t ng = ibv_query_gid_table(ctx, ge, 128, 0);
            zccl_ib_gid_t g[128];
            struct ibv_gid_entry *pe[128];
            size_t n = 0;
            for (ssize_t i = 0; i < ng; i++) {
                if ((int)ge[i].port_num != port) continue;
                memcpy(g[n].raw, ge[i].gid.raw, 16);
                g[n].index = (int)ge[i].gid_index;
                g[n].type = ge[i].gid_type == IBV_GID_TYPE_ROCE_V2 ? ZCCL_IB_GID_ROCE_V2
                          : ge[i].gid_type == IBV_GID_TYPE_ROCE_V1 ? ZCCL_IB_GID_ROCE_V1 : ZCCL_IB_GID_IB;
                pe[n++] = &ge[i];
            }
            size_t pick;
            char gwhy[256];
            if (zccl__ib_gid_pick(g, n, roce, ib->k.gid_index, &pick, gwhy, sizeof gwhy) != ZCCL_SUCCESS) {
                if (w < wlen) w += (size_t)snprintf(why + w, wlen - w, " [%s:%d: %s]", name, port, gwhy);
                continue;
            }
            uint64_t prefix;
            memcpy(&prefix, g[pick].raw, 8);
            if (ib->nrails > 0 && !roce && prefix != me->subnet) {
                ZCCL_INFO(ZCCL_LOG_IB, "rank %d: %s port %d left out of the IB rails: another InfiniBand subnet than "
                          "the first rail's (%s)", comm->rank, name, port, ib->rail[0].dev);
                continue;
            }
            ib_rail_t *r = &ib->rail[ib->nrails];
            if (!gid_addr(name, pe[pick], &r->addr)) {
                if (w < wlen)
                    w += (size_t)snprintf(why + w, wlen - w, " [%s:%d: no IP address for GID index %d; rdma_cm needs "
                                          "IPoIB or the RoCE interface's address]", name, port, g[pick].index);
                continue;
            }
            r->ctx = ctx;
            snprintf(r->dev, sizeof r->dev, "%s", name);
            r->port = port;
            r->gid_index = g[pick].index;
            zccl_ib_rail_info_t *ri = &me->rail[ib->nrails];
            ri->port = port;
            ri->gid_index = r->gid_index;
            snprintf(ri->dev, sizeof ri->dev, "%s", name);
            if (ib->nrails == 0) {
                ib->link = roce ? 2 : 1;
                me->link = ib->link;
                me->subnet = roce ? 0 : prefix;
            }
            ib->nrails++;
        }
    }
    if (devs) rdma_free_devices(devs);
    size_t o = 0;
    ib->devs[0] = '\0';
    for (int k = 0; k < ib->nrails && o < sizeof ib->devs; k++)
        o += (size_t)snprintf(ib->devs + o, sizeof ib->devs - o, "%s%s:%d", k ? "," : "", ib->rail[k].dev,
                              ib->rail[k].port);
    return ib->nrails > 0;
}

/* Opens rail k: its rdma_cm listener (whose context every connection on the rail gets), PD and probe buffers. */
static zccl_result_t open_rail(zccl_tp_comm_t *comm, struct zccl_ib_comm *ib, int k, zccl_ib_peer_info_t *me) {
    ib_rail_t *r = &ib->rail[k];
    char as[80];
    zccl__sockaddr_str(&r->addr, as, sizeof as);
    if (rdma_create_id(ib->ech, &r->listen, NULL, RDMA_PS_TCP) != 0)
        return zccl__syserror(errno, "rank %d: rdma_create_id for the listener on %s", comm->rank, r->dev);
    if (rdma_bind_addr(r->listen, (struct sockaddr *)&r->addr.sa) != 0 || rdma_listen(r->listen, 128) != 0)
        return zccl__syserror(errno, "rank %d: rdma_cm cannot listen on %s (%s port %d)", comm->rank, as, r->dev,
                              r->port);
    if (r->addr.sa.ss_family == AF_INET) ((struct sockaddr_in *)&r->addr.sa)->sin_port = rdma_get_src_port(r->listen);
    else ((struct sockaddr_in6 *)&r->addr.sa)->sin6_port = rdma_get_src_port(r->listen);
    if (r->listen->verbs) r->ctx = r->listen->verbs; /* the context rdma_cm will give every connection */
    r->own_events = true;
    for (int j = 0; j < k; j++) r->own_events &= ib->rail[j].ctx != r->ctx;
    if (!(r->pd = ibv_alloc_pd(r->ctx)))
        return zccl__syserror(errno, "rank %d: ibv_alloc_pd on %s", comm->rank, r->dev);
    r->probe_src = aligned_alloc(4096, IB_PROBE_BYTES);
    r->probe_dst = aligned_alloc(4096, IB_PROBE_BYTES);
    if (!r->probe_src || !r->probe_dst) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    for (size_t i = 0; i < IB_PROBE_BYTES; i++) r->probe_src[i] = (uint8_t)(i * 131 + 7);
    memset(r->probe_dst, 0, IB_PROBE_BYTES);
    r->probe_src_mr = ibv_reg_mr(r->pd, r->probe_src, IB_PROBE_BYTES, IBV_ACCESS_LOCAL_WRITE);
    r->probe_dst_mr = ibv_reg_mr(r->pd, r->probe_dst, IB_PROBE_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!r->probe_src_mr || !r->probe_dst_mr)
        return zccl__syserror(errno, "rank %d: ibv_reg_mr of the %d-byte probe buffers on %s (RLIMIT_MEMLOCK?)",
                              comm->rank, IB_PROBE_BYTES, r->dev);
    zccl_ib_rail_info_t *ri = &me->rail[k];
    ri->addr = r->addr;
    ri->probe_addr = (uint64_t)(uintptr_t)r->probe_dst;
    ri->probe_rkey = r->probe_dst_mr->rkey;
    r->gdr = zccl__ib_gdr_detect(r->pd);
    zccl__sockaddr_str(&r->addr, as, sizeof as);
    ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB device %s port %d (%s), GID index %d, rdma_cm on %s (rail %d); GPUDirect "
              "RDMA: %s", comm->rank, r->dev, r->port, ib->link == 2 ? "RoCE" : "InfiniBand", r->gid_index, as, k,
              zccl__ib_gdr_mode_name(r->gdr));
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__ib_local_info(zccl_tp_comm_t *comm, zccl_ib_peer_info_t *me) {
    memset(me, 0, sizeof *me);
    zccl_ib_knobs_t k;
    ZCCL_CHECK(zccl__ib_knobs(&k));
    const char *tr = zccl__cfg_str(ZCCL_CFG_TRANSPORT);
    const bool forced = !strcasecmp(tr, "ib");
    if (*tr && !forced) return ZCCL_SUCCESS; /* another transport forced: leave the devices alone */
    if (k.disable) {
        if (forced) return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TRANSPORT=ib contradicts ZCCL_IB_DISABLE=1");
        ZCCL_INFO(ZCCL_LOG_IB, "IB transport disabled (ZCCL_IB_DISABLE=1)");
        return ZCCL_SUCCESS;
    }
    struct zccl_ib_comm *ib = calloc(1, sizeof *ib);
    if (!ib) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    zccl__tp_set_state(comm, &zccl_transport_ib, ib);
    ib->k = k;
    ib->ready_fd = -1;
    ib->epfd = -1;
    char why[1024];
    if (!pick_rails(comm, ib, me, why, sizeof why)) {
        memset(me, 0, sizeof *me);
        ib->nrails = 0;
        if (forced) return zccl__error(ZCCL_SYSTEM_ERROR, "ZCCL_TRANSPORT=ib but rank %d has no usable RDMA port: %s",
                                       comm->rank, why);
        if (k.hca.n) { /* the user named HCAs: that none is usable is worth a warning, not only an INFO line */
            const char *var = zccl__cfg_source(ZCCL_CFG_IB_HCA);
            ZCCL_WARN(ZCCL_LOG_IB, "%s=%s: rank %d uses no RDMA port (%s); its peers on other hosts are reached over "
                      "TCP", var ? var : "ZCCL_IB_HCA", zccl__cfg_str(ZCCL_CFG_IB_HCA), comm->rank, why);
        } else
            ZCCL_INFO(ZCCL_LOG_IB, "IB transport not used by rank %d: %s", comm->rank, why);
        return ZCCL_SUCCESS;
    }
    zccl_result_t res = ZCCL_SUCCESS;
    if (!(ib->ech = rdma_create_event_channel())) {
        res = zccl__syserror(errno, "rank %d: rdma_create_event_channel (is rdma_ucm loaded?)", comm->rank);
        goto fail;
    }
    int fl = fcntl(ib->ech->fd, F_GETFL);
    if (fl < 0 || fcntl(ib->ech->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        res = zccl__syserror(errno, "rank %d: rdma_cm event channel non-blocking", comm->rank);
        goto fail;
    }
    for (int r = 0; r < ib->nrails; r++)
        if ((res = open_rail(comm, ib, r, me)) != ZCCL_SUCCESS) goto fail;
    me->nrails = ib->nrails;
    me->start_rail = -1;
    for (int r = 0; r < ib->nrails && me->start_rail < 0; r++)
        if (zccl__gpu_nic_is(comm, ib->rail[r].dev)) me->start_rail = r;
    if (ib->nrails > 1)
        ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB rails: %d (%s); connections stripe their chunks over ZCCL_IB_QPS_PER_CONN="
                  "%d QP%s per rail%s%s%s", comm->rank, ib->nrails, ib->devs, ib->k.qps_per_conn,
                  ib->k.qps_per_conn > 1 ? "s" : "", me->start_rail >= 0 ? "; sends start on " : "",
                  me->start_rail >= 0 ? ib->rail[me->start_rail].dev : "",
                  me->start_rail >= 0 ? ", the rail paired with this rank's GPU" : "");
    return ZCCL_SUCCESS;
fail:
    memset(me, 0, sizeof *me);
    if (forced) return res;
    ZCCL_INFO(ZCCL_LOG_IB, "IB transport not used by rank %d: %s", comm->rank, zccl__last_error());
    return ZCCL_SUCCESS; /* comm teardown releases what was created */
}

/* ---- connections -------------------------------------------------------------------------------------------- */

static int id_peer(const struct rdma_cm_id *id) { return (int)((uintptr_t)id->context >> 8) - 1; }
static int id_qp(const struct rdma_cm_id *id) { return (int)((uintptr_t)id->context & 0xff); }
static void *id_ctx(int peer, int qp) { return (void *)(((uintptr_t)(peer + 1) << 8) | (uintptr_t)qp); }

static zccl_result_t make_qp(zccl_tp_comm_t *comm, struct rdma_cm_id *id, int p, int q) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    ib_rail_t *r = &ib->rail[ib_qp_rail(ib, q)];
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = r->cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = IB_SQ_DEPTH;
    a.cap.max_recv_wr = IB_RQ_DEPTH;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.sq_sig_all = 1;
    if (rdma_create_qp(id, r->pd, &a) != 0)
        return zccl__syserror(errno, "rank %d: rdma_create_qp for rank %d on %s", comm->rank, p, r->dev);
    uint8_t t = (uint8_t)ib->k.timeout;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t) != 0)
        ZCCL_WARN(ZCCL_LOG_IB, "rank %d: cannot set ZCCL_IB_TIMEOUT=%d on the QP to rank %d (%s); the rdma_cm "
                  "default applies", comm->rank, ib->k.timeout, p, strerror(errno));
    ib->peer[p].id[q] = id;
    for (uint32_t i = 0; i < IB_RQ_DEPTH; i++)
        if (zccl__ib_post_recv(ib, p, q, i) != 0)
            return zccl__syserror(errno, "rank %d: ibv_post_recv on the QP to rank %d", comm->rank, p);
    return ZCCL_SUCCESS;
}

static void conn_param(struct zccl_ib_comm *ib, struct rdma_conn_param *cp, const void *pd, uint8_t pdlen) {
    memset(cp, 0, sizeof *cp);
    cp->private_data = pd;
    cp->private_data_len = pdlen;
    cp->retry_count = (uint8_t)ib->k.retry_cnt;
    cp->rnr_retry_count = 7; /* infinite: receives are reposted as they are consumed */
}

static const char *peer_dev(const zccl_tp_comm_t *comm, int p, int rail) { return comm->peers[p].ib.rail[rail].dev; }

static zccl_result_t cm_event(zccl_tp_comm_t *comm, struct rdma_cm_event *ev) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    struct rdma_cm_id *id = ev->id;
    struct rdma_conn_param cp;
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        int from, q;
        uint8_t nonce_c[ZCCL_NONCE_BYTES];
        const char *why = "";
        /* The QP count of a pair depends on both ranks' rails: read the claimed sender first (the proof below
         * covers it) to know which count to expect. */
        int32_t claimed = -1;
        if (ev->param.conn.private_data && ev->param.conn.private_data_len >= ZCCL_IB_REQ_BYTES)
            memcpy(&claimed, (const uint8_t *)ev->param.conn.private_data + 8, 4);
        const int expect = claimed >= 0 && claimed < comm->nranks && ib->peer[claimed].used ? ib->peer[claimed].nqp
                                                                                            : ib->nqp;
        if (zccl__ib_req_decode(comm->secret, comm->comm_id, comm->rank, comm->nranks, expect,
                                ev->param.conn.private_data, ev->param.conn.private_data_len, &from, &q, nonce_c,
                                &why) != ZCCL_SUCCESS || !ib->peer[from].used || ib->peer[from].id[q]) {
            ZCCL_WARN(ZCCL_LOG_IB, "rank %d: refused an rdma_cm connection on %s: %s", comm->rank, ib->devs,
                      *why ? why : "unexpected or duplicate connection");
            rdma_reject(id, NULL, 0);
            rdma_destroy_id(id);
            return ZCCL_SUCCESS;
        }
        id->context = id_ctx(from, q);
        const ib_rail_t *rr = &ib->rail[ib_qp_rail(ib, q)];
        if (id->verbs != rr->ctx)
            return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: rank %d's connection for QP %d (rail %d) arrived on "
                               "another RDMA device than %s", comm->rank, from, q, ib_qp_rail(ib, q), rr->dev);
        zccl_result_t r = make_qp(comm, id, from, q);
        if (r != ZCCL_SUCCESS) return r;
        uint8_t nonce_s[ZCCL_NONCE_BYTES], rep[ZCCL_IB_REP_BYTES];
        if (getrandom(nonce_s, sizeof nonce_s, 0) != (ssize_t)sizeof nonce_s)
            return zccl__syserror(errno, "getrandom");
        zccl__chal_encode(comm->secret, nonce_c, nonce_s, rep);
        conn_param(ib, &cp, rep, sizeof rep);
        if (rdma_accept(id, &cp) != 0)
            return zccl__syserror(errno, "rank %d: rdma_accept of rank %d on %s", comm->rank, from, rr->dev);
        return ZCCL_SUCCESS;
    }
    const bool listener = zccl__ib_is_listener(ib, id);
    const int p = listener ? -1 : id_peer(id), q = listener ? 0 : id_qp(id);
    if (p < 0 || p >= comm->nranks) return ZCCL_SUCCESS;
    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (rdma_resolve_route(id, 5000) != 0)
            return zccl__syserror(errno, "rank %d: rdma_resolve_route to rank %d", comm->rank, p);
        return ZCCL_SUCCESS;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        ZCCL_CHECK(make_qp(comm, id, p, q));
        uint8_t req[ZCCL_IB_REQ_BYTES];
        if (getrandom(ib->peer[p].nonce_c[q], ZCCL_NONCE_BYTES, 0) != ZCCL_NONCE_BYTES)
            return zccl__syserror(errno, "getrandom");
        zccl__ib_req_encode(comm->secret, comm->comm_id, comm->rank, p, q, ib->peer[p].nqp, ib->peer[p].nonce_c[q],
                            req);
        conn_param(ib, &cp, req, sizeof req);
        if (rdma_connect(id, &cp) != 0)
            return zccl__syserror(errno, "rank %d: rdma_connect to rank %d", comm->rank, p);
        return ZCCL_SUCCESS;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
        if (p > comm->rank) { /* we connected: check the peer's proof before using the connection */
            uint8_t nonce_s[ZCCL_NONCE_BYTES];
            const char *why = "no private data";
            if (!ev->param.conn.private_data || ev->param.conn.private_data_len < ZCCL_IB_REP_BYTES ||
                zccl__chal_check(comm->secret, ib->peer[p].nonce_c[q], ev->param.conn.private_data,
                                 ZCCL_IB_REP_BYTES, nonce_s, &why) != ZCCL_SUCCESS)
                return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: the rdma_cm peer at rank %d's address did not prove "
                                   "the job secret (%s)", comm->rank, p, why);
        }
        ib->peer[p].up[q] = true;
        return ZCCL_SUCCESS;
    case RDMA_CM_EVENT_DISCONNECTED:
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: rank %d closed its IB connection during init", comm->rank, p);
    default: {
        char as[80];
        const int k = ib_qp_rail(ib, q);
        zccl__sockaddr_str(&comm->peers[p].ib.rail[k].addr, as, sizeof as);
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: IB connection %s rank %d (%s, its device %s; ours %s port "
                           "%d, GID index %d) failed at %s, status %d (%s): check that both ports are active, that "
                           "the address is routable over RDMA and that the GID types match (ZCCL_IB_GID_INDEX)",
                           comm->rank, p > comm->rank ? "to" : "from", p, as, peer_dev(comm, p, k), ib->rail[k].dev,
                           ib->rail[k].port, ib->rail[k].gid_index, rdma_event_str(ev->event), ev->status,
                           ev->status < 0 ? strerror(-ev->status) : "reject/timeout");
    }
    }
}

static zccl_result_t post_probe(zccl_tp_comm_t *comm, int p, int q) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    const int k = ib_qp_rail(ib, q);
    const ib_rail_t *r = &ib->rail[k];
    struct ibv_sge sge = {(uint64_t)(uintptr_t)r->probe_src, IB_PROBE_BYTES, r->probe_src_mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = ib_wrid(p, IB_K_PROBE, q, 0);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(IB_PROBE_IMM);
    wr.wr.rdma.remote_addr = comm->peers[p].ib.rail[k].probe_addr;
    wr.wr.rdma.rkey = comm->peers[p].ib.rail[k].probe_rkey;
    if (ibv_post_send(ib->peer[p].id[q]->qp, &wr, &bad) != 0)
        return zccl__syserror(errno, "rank %d: posting the probe write to rank %d", comm->rank, p);
    ib->peer[p].sq_out[q]++;
    return ZCCL_SUCCESS;
}

static int path_mtu(struct ibv_qp *qp) {
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (!qp || ibv_query_qp(qp, &a, IBV_QP_PATH_MTU, &ia) != 0) return -1;
    return 128 << a.path_mtu;
}

/* Path MTU of the first connected QP, for messages. */
static int mtu_any(struct zccl_ib_comm *ib, int nranks) {
    for (int p = 0; p < nranks; p++)
        if (ib->peer[p].used && ib->peer[p].id[0] && ib->peer[p].id[0]->qp) return path_mtu(ib->peer[p].id[0]->qp);
    return -1;
}

zccl_result_t zccl__ib_connect_all(zccl_tp_comm_t *comm, uint64_t deadline_ns) {
    struct zccl_ib_comm *ib = IB_OF(comm);
    int want = 0, probes_want = 0;
    for (int p = 0; p < comm->nranks; p++) {
        if (!ib->peer[p].used) continue;
        want += ib->peer[p].nqp;
        if (p <= comm->rank) continue;
        for (int q = 0; q < ib->peer[p].nqp; q++) {
            const int k = ib_qp_rail(ib, q);
            struct rdma_cm_id *id;
            if (rdma_create_id(ib->ech, &id, id_ctx(p, q), RDMA_PS_TCP) != 0)
                return zccl__syserror(errno, "rank %d: rdma_create_id for rank %d", comm->rank, p);
            ib->peer[p].id[q] = id; /* the QP comes at ROUTE_RESOLVED; teardown destroys the id either way */
            zccl_sockaddr_t src = ib->rail[k].addr;
            if (src.sa.ss_family == AF_INET) ((struct sockaddr_in *)&src.sa)->sin_port = 0;
            else ((struct sockaddr_in6 *)&src.sa)->sin6_port = 0;
            if (rdma_resolve_addr(id, (struct sockaddr *)&src.sa,
                                  (struct sockaddr *)&comm->peers[p].ib.rail[k].addr.sa, 5000) != 0)
                return zccl__syserror(errno, "rank %d: rdma_resolve_addr toward rank %d", comm->rank, p);
        }
    }
    probes_want = want;
    /* Connect: one event loop serves our connects and the peers' (the lower rank of each pair connects). */
    int up = 0;
    while (up < want) {
        if (zccl__now_ns() > deadline_ns) {
            for (int p = 0; p < comm->nranks; p++)
                for (int q = 0; ib->peer[p].used && q < ib->peer[p].nqp; q++)
                    if (!ib->peer[p].up[q])
                        return zccl__error(ZCCL_TIMEOUT, "rank %d: IB connection with rank %d (QP %d on rail %d, its "
                                           "device %s) not established within ZCCL_INIT_TIMEOUT_MS", comm->rank, p, q,
                                           ib_qp_rail(ib, q), peer_dev(comm, p, ib_qp_rail(ib, q)));
        }
        struct pollfd pfd = {ib->ech->fd, POLLIN, 0};
        poll(&pfd, 1, 100);
        struct rdma_cm_event *ev;
        while (rdma_get_cm_event(ib->ech, &ev) == 0) {
            struct rdma_cm_event copy = *ev;
            uint8_t pd[256];
            if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
                const size_t l = ZCCL_MIN(sizeof pd, (size_t)ev->param.conn.private_data_len);
                memcpy(pd, ev->param.conn.private_data, l);
                copy.param.conn.private_data = pd;
                copy.param.conn.private_data_len = (uint8_t)l;
            }
            rdma_ack_cm_event(ev);
            ZCCL_CHECK(cm_event(comm, &copy));
        }
        up = 0;
        for (int p = 0; p < comm->nranks; p++)
            for (int q = 0; ib->peer[p].used && q < ib->peer[p].nqp; q++) up += ib->peer[p].up[q];
    }
    /* Probe: one IB_PROBE_BYTES write each way on every QP, acknowledged, before the connection counts as up. */
    for (int p = 0; p < comm->nranks; p++)
        for (int q = 0; ib->peer[p].used && q < ib->peer[p].nqp; q++) ZCCL_CHECK(post_probe(comm, p, q));
    /* The probe gets the time the transport's own retries take (4 x the ACK timeout x tries) plus 5 s, within the
     * init deadline: a write whose packets are dropped may not even fail with "retry exceeded" (seen on rxe). */
    const double ack_s = 4.096e-6 * (double)(1ull << ib->k.timeout);
    const uint64_t probe_ns = (uint64_t)((4.0 * ack_s * (ib->k.retry_cnt + 1) + 5.0) * 1e9);
    const uint64_t probe_start = zccl__now_ns();
    const uint64_t probe_deadline = ZCCL_MIN(deadline_ns, probe_start + probe_ns);
    const double probe_s = (double)(probe_deadline > probe_start ? probe_deadline - probe_start : 0) / 1e9;
    int done = 0;
    while (done < probes_want || ib->probes_in < probes_want) {
        zccl__ib_poll_cq(comm, 64);
        done = 0;
        for (int p = 0; p < comm->nranks; p++) {
            ib_peer_t *pe = &ib->peer[p];
            if (!pe->used) continue;
            if (pe->err != ZCCL_SUCCESS) {
                const int mtu = path_mtu(pe->id[0] ? pe->id[0]->qp : NULL);
                return zccl__error(pe->err, "rank %d: the connect-time probe (one %d-byte RDMA write) with rank %d "
                                   "failed: %s. Path MTU %d, our %s port %d GID index %d, its %s GID index %d: check "
                                   "that every hop's MTU is at least the path MTU and that both ends use the same "
                                   "GID type (RoCE v1/v2; ZCCL_IB_GID_INDEX)", comm->rank, IB_PROBE_BYTES, p,
                                   pe->errmsg, mtu, ib->rail[0].dev, ib->rail[0].port, ib->rail[0].gid_index,
                                   peer_dev(comm, p, 0), comm->peers[p].ib.rail[0].gid_index);
            }
            done += pe->probes_done;
        }
        if (zccl__now_ns() > probe_deadline)
            return zccl__error(ZCCL_TIMEOUT, "rank %d: the connect-time IB probe (one %d-byte RDMA write each way) "
                               "did not complete within %.1f s (%d of %d writes acknowledged, %d of %d peer writes "
                               "seen) on %s port %d GID index %d, path MTU %d: a path MTU larger than some hop's or a "
                               "GID type mismatch (RoCE v1/v2, ZCCL_IB_GID_INDEX) drops packets silently",
                               comm->rank, IB_PROBE_BYTES, probe_s, done, probes_want, ib->probes_in, probes_want,
                               ib->rail[0].dev, ib->rail[0].port, ib->rail[0].gid_index, mtu_any(ib, comm->nranks));
        if (done < probes_want || ib->probes_in < probes_want) {
            struct pollfd pfd[IB_MAX_RAILS];
            for (int k = 0; k < ib->nrails; k++) {
                pfd[k] = (struct pollfd){ib->rail[k].cch->fd, POLLIN, 0};
                ibv_req_notify_cq(ib->rail[k].cq, 0);
            }
            if (zccl__ib_poll_cq(comm, 64) == 0) poll(pfd, (nfds_t)ib->nrails, 10);
            for (int k = 0; k < ib->nrails; k++) {
                struct ibv_cq *c;
                void *cx;
                while (ibv_get_cq_event(ib->rail[k].cch, &c, &cx) == 0) ibv_ack_cq_events(c, 1);
            }
        }
    }
    int used_rails = 0;
    for (int p = 0; p < comm->nranks; p++)
        if (ib->peer[p].used) used_rails = ZCCL_MAX(used_rails, ib->peer[p].nrails);
    for (int k = 0; k < used_rails; k++)
        for (size_t i = 0; i < IB_PROBE_BYTES; i++)
            if (ib->rail[k].probe_dst[i] != (uint8_t)(i * 131 + 7))
                return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: the connect-time IB probe arrived corrupted at byte "
                                   "%zu on %s (rail %d)", comm->rank, i, ib->rail[k].dev, k);
    for (int p = 0; p < comm->nranks; p++) {
        const ib_peer_t *pe = &ib->peer[p];
        if (!pe->used) continue;
        if (pe->nrails == 1)
            ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB connection to rank %d up (%d QP%s, path MTU %d, %s -> %s)",
                      comm->rank, p, pe->nqp, pe->nqp > 1 ? "s" : "", path_mtu(pe->id[0]->qp), ib->rail[0].dev,
                      peer_dev(comm, p, 0));
        else {
            char rl[200];
            size_t o = 0;
            for (int k = 0; k < pe->nrails && o < sizeof rl; k++)
                o += (size_t)snprintf(rl + o, sizeof rl - o, "%s%s -> %s", k ? ", " : "", ib->rail[k].dev,
                                      peer_dev(comm, p, k));
            ZCCL_INFO(ZCCL_LOG_IB, "rank %d: IB connection to rank %d up (%d QPs over %d rails (%s), path MTU %d); "
                      "this rank's first on %s", comm->rank, p, pe->nqp, pe->nrails, rl, path_mtu(pe->id[0]->qp),
                      ib->rail[ib_qp_rail(ib, pe->off_tx)].dev);
        }
    }
    return ZCCL_SUCCESS;
}
#endif /* ZCCL_HAVE_IB */

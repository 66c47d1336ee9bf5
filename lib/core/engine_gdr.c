/*
 * engine_gdr.c — GPUDirect RDMA for a device call over verbs (issue 24; docs/gpu.md "GPUDirect RDMA").
 *
 * The schedule is the same as for host memory and for staging: only where the bytes come from and land differs.
 * Each rank first decides whether it could run the call on its device buffers themselves (settings, NIC, GPU, the
 * flush QP where the GPU needs it, and the registration of every device allocation the call's transfers touch with
 * the NIC: its registration cache keeps them per allocation), then tells every peer in one byte and hears one byte
 * from each: only if all can does any rank take the path, otherwise all stage that call (a rank whose export was
 * refused must not leave its peers writing into memory it cannot receive into; and staged transfers are cut in
 * chunks, GDR ones are not, so the ranks must agree). Costs one small exchange per device call over verbs.
 *
 * On the path, sends and receives carry the device pointers and the gdr flag: the IB transport registers nothing
 * new and never copies them with the CPU. A receive that reduces lands in a device bounce buffer and is combined
 * with its operand by the memory layer's reduction kernel as soon as it completed (and was flushed), while the
 * phase's other transfers go on; a plain receive lands in its destination.
 */
#include <stdlib.h>
#include <string.h>
#include "engine_gdr.h"
#include "engine_stage.h"
#include "gdr.h"
#include "ib.h"
#include "mem_gdr.h"
#include "regmem.h"

#define GDR_ALIGN 256 /* receives in the bounce buffer start on kernel-friendly boundaries */

static size_t align_up(size_t v) { return (v + GDR_ALIGN - 1) & ~(size_t)(GDR_ALIGN - 1); }

static bool is_desc(const struct zccl_comm *comm, const zccl_xfer_t *x) {
    if (x->is_send) return x->src == (const uint8_t *)&comm->desc_mine;
    return comm->desc_in && x->dst == (uint8_t *)&comm->desc_in[x->peer];
}

/* The bounce bytes a phase of s needs at most: its receives that reduce, each aligned. */
static size_t bounce_need(const zccl_schedule_t *s, size_t es) {
    size_t most = 0, first = 0;
    for (size_t p = 0; p < s->nphases; p++) {
        size_t need = 0;
        for (size_t i = first; i < s->phase_end[p]; i++)
            if (s->steps[i].kind == ZCCL_STEP_RECV && s->steps[i].src != ZCCL_BUF_NONE)
                need += align_up(s->steps[i].count * es);
        if (need > most) most = need;
        first = s->phase_end[p];
    }
    return most;
}

/* Whether this rank could run the call on its device buffers; why says what decided. */
static bool local_decision(struct zccl_comm *comm, const zccl_schedule_t *s, const void *sendbuf, void *recvbuf,
                           void *scratch, size_t es, bool *flush, char *why, size_t len) {
    zccl_gdr_cfg_t cfg;
    if (zccl__gdr_cfg(&cfg) != ZCCL_SUCCESS) { snprintf(why, len, "%s", zccl__last_error()); return false; }
    if (cfg.mode == 0) { snprintf(why, len, "ZCCL_GDR=0"); return false; }
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank && comm->tc.tp[r] != &zccl_transport_ib) {
            snprintf(why, len, "rank %d is reached over %s, not verbs", r, comm->tc.tp[r]->name);
            return false;
        }
    zccl_mem_type_t t = ZCCL_MEM_HOST;
    int dev = -1;
    const void *any = sendbuf ? sendbuf : recvbuf;
    if (!any || zccl__mem_query(any, &t, &dev) != ZCCL_SUCCESS || t != ZCCL_MEM_CUDA) dev = -1;
    zccl_nic_gdr_t nic;
    memset(&nic, 0, sizeof nic);
    char d[240];
    if (!zccl__ib_gdr_usable(&comm->tc, false, &nic, d, sizeof d)) { snprintf(why, len, "%s", d); return false; }
    if (!zccl__gdr_decide(&cfg, &nic, dev, flush, d, sizeof d)) { snprintf(why, len, "%s", d); return false; }
    zccl_gpu_gdr_t g;
    zccl__mem_gpu_gdr(dev, &g);
    char rule[200] = "";
    if (cfg.mode < 0) { /* auto: the path rule between the GPU and its NIC (zccl-topo prints the same verdict) */
        const zccl_topo_t *t = zccl__comm_process_topo();
        const zccl_topo_dev_t *gpu = t && g.busid[0] ? zccl_topo_dev_by_busid(t, g.busid) : NULL;
        if (!gpu || gpu->kind != ZCCL_TOPO_DEV_GPU) {
            snprintf(why, len, "ZCCL_GDR=auto: the path rule cannot place CUDA device %d (%s%s%s) in the machine model; "
                     "ZCCL_GDR=1 skips the rule", dev, g.busid[0] ? "PCI " : "no PCI bus id", g.busid,
                     !t ? ", no topology" : "");
            return false;
        }
        int k = -1;
        zccl_path_t path;
        if (!zccl_topo_gdr_pair(t, gpu, cfg.level, &k, &path, rule, sizeof rule)) {
            snprintf(why, len, "ZCCL_GDR=auto: CUDA device %d (PCI %s): %s", dev, g.busid, rule);
            return false;
        }
    }
    if (!(cfg.read_setting == 1 || (cfg.read_setting == -1 && g.cc_major >= 8))) {
        snprintf(why, len, "sends may not read device memory (ZCCL_NET_GDR_READ=%d, compute capability %d.%d) and "
                 "GDR for receives only is not built", cfg.read_setting, g.cc_major, g.cc_minor);
        return false;
    }
    char u[240];
    if (*flush && !zccl__ib_gdr_usable(&comm->tc, true, &nic, u, sizeof u)) { snprintf(why, len, "%s", u); return false; }
    /* Every device allocation a transfer of the call touches, registered now (cached: once per allocation). */
    size_t ext[ZCCL_BUF_NONE] = {0, 0, 0};
    for (size_t i = 0; i < s->nsteps; i++) {
        const zccl_step_t *st = &s->steps[i];
        if ((st->kind == ZCCL_STEP_SEND || st->kind == ZCCL_STEP_RECV) && st->buf < ZCCL_BUF_NONE &&
            (st->off + st->count) * es > ext[st->buf])
            ext[st->buf] = (st->off + st->count) * es;
    }
    const void *base[ZCCL_BUF_NONE] = {sendbuf, recvbuf, scratch};
    if (scratch != comm->gdr_scratch && comm->gdr_scratch) /* the scratch moved: its old registration is stale */
        zccl__ib_gdr_forget(&comm->tc, comm->gdr_scratch, 1);
    comm->gdr_scratch = scratch;
    const size_t bneed = bounce_need(s, es);
    if (bneed > comm->gdr_bounce_bytes) {
        const zccl_mem_ops_t *m = zccl__mem_ops(ZCCL_MEM_CUDA);
        if (comm->gdr_bounce) {
            zccl__ib_gdr_forget(&comm->tc, comm->gdr_bounce, comm->gdr_bounce_bytes);
            m->free(comm->gdr_bounce);
            comm->gdr_bounce = NULL;
            comm->gdr_bounce_bytes = 0;
        }
        const size_t sz = (bneed + 65535) & ~(size_t)65535;
        if (m->alloc(&comm->gdr_bounce, sz) != ZCCL_SUCCESS) {
            comm->gdr_bounce = NULL;
            snprintf(why, len, "cannot allocate %zu bytes of device memory for the reductions' receives: %s", sz,
                     zccl__last_error());
            return false;
        }
        comm->gdr_bounce_bytes = sz;
    }
    for (int b = 0; b < ZCCL_BUF_NONE; b++)
        if (ext[b] && base[b] && !zccl__ib_gdr_register(&comm->tc, base[b], ext[b], d, sizeof d)) {
            snprintf(why, len, "%s", d);
            return false;
        }
    if (bneed && !zccl__ib_gdr_register(&comm->tc, comm->gdr_bounce, comm->gdr_bounce_bytes, d, sizeof d)) {
        snprintf(why, len, "%s", d);
        return false;
    }
    snprintf(why, len, "%s%s%s", d, rule[0] ? "; " : "", rule);
    return true;
}

zccl_result_t zccl__gdr_agree(struct zccl_comm *comm, const zccl_schedule_t *s, const void *sendbuf, void *recvbuf,
                              void *scratch, size_t es, zccl_gdr_call_t *out) {
    memset(out, 0, sizeof *out);
    int npeers = 0;
    for (int r = 0; r < comm->nranks; r++) npeers += r != comm->rank && comm->tc.tp[r] == &zccl_transport_ib;
    if (npeers == 0) return ZCCL_SUCCESS; /* no peer over verbs: nothing to agree on, staged */
    out->voted = true;
    bool flush = false;
    const bool mine = local_decision(comm, s, sendbuf, recvbuf, scratch, es, &flush, out->why, sizeof out->why);
    /* One byte each way with every peer over verbs (pairs are symmetric: a peer reaches us over verbs iff we reach
     * it so). A rank whose peers are not all over verbs says no, so a rank that hears yes from everyone knows that
     * every rank decided alike. */
    uint8_t vote = mine ? 1 : 0;
    uint8_t *in = calloc((size_t)comm->nranks, 1);
    zccl_xfer_t *x = calloc(2 * (size_t)npeers, sizeof *x);
    if (!in || !x) {
        free(in);
        free(x);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the GPUDirect agreement of %d peers", npeers);
    }
    size_t n = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank || comm->tc.tp[r] != &zccl_transport_ib) continue;
        x[n++] = (zccl_xfer_t){.peer = r, .is_send = true, .src = &vote, .bytes = 1, .dt = ZCCL_UINT8};
        x[n++] = (zccl_xfer_t){.peer = r, .dst = &in[r], .bytes = 1, .dt = ZCCL_UINT8};
    }
    zccl_result_t res = zccl__engine_phase(comm, x, n, 0, NULL);
    int refused = -1;
    for (int r = 0; res == ZCCL_SUCCESS && r < comm->nranks && refused < 0; r++)
        if (r != comm->rank && comm->tc.tp[r] == &zccl_transport_ib && in[r] != 1) refused = r;
    free(in);
    free(x);
    ZCCL_CHECK(res);
    out->on = mine && refused < 0;
    out->flush = out->on && flush;
    if (mine && refused >= 0)
        snprintf(out->why, sizeof out->why, "rank %d cannot take the GDR path for this call (its INFO log says why)",
                 refused);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__gdr_freed_check(struct zccl_comm *comm, const char *fn, const char *name, const void *p) {
    char what[200];
    const bool gdr = zccl__ib_gdr_held(&comm->tc, p, what, sizeof what);
    if (!gdr && !zccl__reg_held_device(comm, p, what, sizeof what)) return ZCCL_SUCCESS;
    uint64_t id = 0;
    char prev[1024];
    snprintf(prev, sizeof prev, "%s", zccl__last_error());
    const zccl_result_t q = zccl__mem_buffer_id(p, "x", &id);
    if (q != ZCCL_INVALID_ARGUMENT) { /* the driver knows it (device memory after all, or the query failed) */
        zccl__set_last_error(prev);
        return ZCCL_SUCCESS;
    }
    /* The NIC registration holds the freed pages: release them (this call is refused on every rank). */
    if (gdr) zccl__ib_gdr_forget(&comm->tc, p, 1);
    return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: '%s' %p is not device memory that is allocated (freed while "
                       "registered?): rank %d %s, and the CUDA driver no longer knows it", fn, name, p, comm->rank,
                       what);
}

typedef struct {
    const zccl_mem_ops_t *m;
    zccl_xfer_t *x;
    size_t nx;
    bool *pending; /* a receive that reduces, not yet combined */
    size_t left;
} gdr_phase_t;

static bool hook_ready(void *ctx, size_t i) {
    (void)ctx, (void)i;
    return true;
}

/* Receives that landed (and were flushed) are combined with their operand on the device. */
static zccl_result_t hook_tick(void *ctx, bool *moved, bool *busy) {
    gdr_phase_t *g = ctx;
    *busy = false;
    for (size_t i = 0; i < g->nx && g->left; i++) {
        zccl_xfer_t *x = &g->x[i];
        if (!g->pending[i] || !x->complete) continue;
        ZCCL_CHECK(g->m->reduce(x->dev_dst, x->dev_op2, x->dst, x->bytes / zccl_type_size(x->dt), x->dt, x->op,
                                x->divisor));
        g->pending[i] = false;
        g->left--;
        *moved = true;
    }
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__gdr_run_phase(struct zccl_comm *comm, zccl_mem_type_t mt, zccl_xfer_t *x, size_t nx, size_t phase,
                                  bool flush) {
    gdr_phase_t g = {.m = zccl__mem_ops(mt), .x = x, .nx = nx, .pending = calloc(nx, sizeof(bool))};
    if (!g.pending) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %zu GDR transfers", nx);
    size_t off = 0;
    for (size_t i = 0; i < nx; i++) {
        if (is_desc(comm, &x[i])) continue; /* host bytes, compared by address (engine.c) */
        x[i].gdr = true;
        if (x[i].is_send) continue;
        x[i].gdr_flush = flush;
        if (!x[i].op2) continue;
        if (off + x[i].bytes > comm->gdr_bounce_bytes) {
            free(g.pending);
            return zccl__error(ZCCL_INTERNAL_ERROR, "GDR phase %zu needs more than the %zu bounce bytes agreed", phase,
                               comm->gdr_bounce_bytes);
        }
        x[i].dev_dst = x[i].dst;
        x[i].dev_op2 = x[i].op2;
        x[i].op2 = NULL; /* the NIC writes the bounce; the kernel combines (hook_tick) */
        x[i].dst = (uint8_t *)comm->gdr_bounce + off;
        off += align_up(x[i].bytes);
        g.pending[i] = true;
        g.left++;
    }
    const zccl_phase_hooks_t h = {.ctx = &g, .ready = hook_ready, .tick = hook_tick};
    zccl_result_t res = zccl__engine_phase(comm, x, nx, phase, &h);
    if (res == ZCCL_SUCCESS) { /* the last receives completed in the loop's final pass */
        bool moved = false, busy = false;
        res = hook_tick(&g, &moved, &busy);
        if (res == ZCCL_SUCCESS && g.left)
            res = zccl__error(ZCCL_INTERNAL_ERROR, "GDR phase %zu: %zu received reductions not combined", phase, g.left);
    }
    free(g.pending);
    return res;
}

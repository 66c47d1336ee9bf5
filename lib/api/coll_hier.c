/*
 * coll_hier.c — the hierarchical quantized collectives (include/zccl_hier.h; docs/zero.md, "Hierarchical quantized
 * collectives"): the host's ranks reduce in float32 over their own sub-communicator and the ranks of equal local rank
 * on every host run the flat _wire call (coll_quant.c) between hosts, each on its slice; an all-gather passes the
 * wire strings themselves on, between hosts and then inside the host, and decodes them once at the end.
 *
 * Layout. Hosts are numbered by their lowest rank and a host's ranks get local ranks in rank order. A reduce-scatter
 * widens and permutes its blocks into the order gathered[l*H + h] (the rank of local rank l on host h), so that the
 * intra-host reduce-scatter leaves at local rank l the host's partial sums of the blocks of local rank l of every
 * host, in host order: exactly the send buffer the inter-host reduce-scatter needs for each of those ranks to end
 * with its own block. The all-gather runs the other way: the wire strings are all-gathered between hosts, then
 * inside the host (so they arrive in the same order), and every rank decodes each into its rank's place. The
 * all-reduce needs no permutation: chunk l of the vector belongs to local rank l on every host.
 *
 * Failures. A rank runs every step of a call, or refuses it on the step's communicator (zccl__coll_refuse_op): once
 * a step failed here (or the arguments were refused), the later ones are refused instead of run. So every rank
 * issues the same steps on every sub-communicator, and a rank waiting in a step always learns why its peer is not
 * coming. The sub-communicators' breakage is then copied into comm.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api.h"
#include "quant.h"
#include "zccl_ext.h"
#include "zccl_hier.h"

enum { HIER_FLAT = 1, HIER_ON = 2, HIER_FAILED = 3 };

struct zccl_hier {
    int state;
    int nhosts, per_host; /* H hosts of G ranks (per_host 0 when the hosts differ in size) */
    int host, local;      /* this rank's host and local rank */
    int *gathered;        /* HIER_ON: gathered[l * H + h] = the communicator rank of local rank l of host h: the
                             order of the blocks in the intra-host hops */
    zccl_comm_t intra;    /* the host's ranks, ranked by local rank */
    zccl_comm_t inter;    /* local rank `local` of every host, ranked by host */
    char why[512];        /* HIER_FAILED: why the sub-communicators could not be made */
    void *scratch;        /* the calls' temporaries, kept between calls (fresh pages cost more than the copies) */
    size_t scratch_bytes;
};

void zccl__hier_free(struct zccl_comm *comm, bool abort) {
    struct zccl_hier *h = comm ? comm->hier : NULL;
    if (!h) return;
    if (h->intra) (abort ? zccl_comm_abort : zccl_comm_destroy)(h->intra);
    if (h->inter) (abort ? zccl_comm_abort : zccl_comm_destroy)(h->inter);
    free(h->gathered);
    free(h->scratch);
    free(h);
    comm->hier = NULL;
}

/* The descriptor a refused step carries: the step's first collective on its communicator. */
static zccl_op_t refused_op(zccl_comm_t sub, zccl_coll_t first) {
    return (zccl_op_t){.coll = first, .comm = sub, .dt = ZCCL_UINT8, .op = ZCCL_SUM};
}

/* FNV-1a of ZCCL_HOST_ID, or the real host (the identity the transports use). Also the ZeRO-3 store's hpZ host
 * identity (zccl_ext.h). */
uint64_t zccl__host_key(zccl_comm_t comm) {
    const char *id = zccl__cfg_str(ZCCL_CFG_HOST_ID);
    if (!id || !*id) return comm->tc.peers[comm->rank].host_hash;
    uint64_t k = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) k = (k ^ *p) * 1099511628211ull;
    return k;
}

/* Numbers the hosts from every rank's key: host[r], local[r]; counts per host in cnt. Returns the host count.
 * Also the ZeRO-3 store's hpZ layout (zccl_ext.h). */
int zccl__host_layout(const uint64_t *keys, int n, int *host, int *local, int *cnt) {
    int nh = 0;
    for (int r = 0; r < n; r++) {
        host[r] = -1;
        for (int q = 0; q < r && host[r] < 0; q++)
            if (keys[q] == keys[r]) host[r] = host[q];
        if (host[r] < 0) {
            host[r] = nh;
            cnt[nh++] = 0;
        }
        local[r] = cnt[host[r]]++;
    }
    return nh;
}

/* Makes comm->hier (every rank at once: one all-gather of the host keys, then two splits and an all-gather of
 * their results when the layout is hierarchical). Leaves comm->hier NULL when an exchange on comm itself failed
 * (comm is broken then, on every rank); HIER_FAILED when the exchanges worked but a split failed on some rank. */
static zccl_result_t hier_setup(const char *fn, zccl_comm_t comm) {
    const int n = comm->nranks;
    struct zccl_hier *h = calloc(1, sizeof *h);
    uint64_t *keys = malloc((size_t)n * sizeof *keys);
    int *host = calloc((size_t)n, sizeof *host), *local = calloc((size_t)n, sizeof *local);
    int *cnt = calloc((size_t)n, sizeof *cnt);
    int32_t *oks = malloc((size_t)n * sizeof *oks);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!h || !keys || !host || !local || !cnt || !oks)
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for the host layout of %d ranks", fn, n);
    const uint64_t mine = res == ZCCL_SUCCESS ? zccl__host_key(comm) : 0;
    /* Every rank takes part in the exchanges whatever happened locally, so that none waits for another. */
    if (res == ZCCL_SUCCESS) res = zccl_allgather(&mine, keys, 1, ZCCL_UINT64, comm, NULL);
    else zccl__coll_refuse_op(refused_op(comm, ZCCL_COLL_ALLGATHER), NULL, res);
    if (res != ZCCL_SUCCESS) goto out;
    const int nh = zccl__host_layout(keys, n, host, local, cnt), G = cnt[0];
    bool equal = true;
    for (int k = 1; k < nh; k++) equal = equal && cnt[k] == G;
    h->nhosts = nh;
    h->per_host = equal ? G : 0;
    h->host = host[comm->rank];
    h->local = local[comm->rank];
    if (nh < 2 || G < 2 || !equal) {
        h->state = HIER_FLAT;
        int odd = 1;
        while (odd < nh && cnt[odd] == G) odd++;
        if (nh < 2) ZCCL_INFO(ZCCL_LOG_COLL, "%s: all %d ranks on one host: the hierarchical calls on this "
                              "communicator are the flat _wire calls", fn, n);
        else if (!equal) ZCCL_INFO(ZCCL_LOG_COLL, "%s: %d hosts of unequal sizes (host 0 has %d ranks, host %d has "
                                   "%d): the hierarchical calls on this communicator are the flat _wire calls", fn, nh,
                                   G, odd, cnt[odd]);
        else ZCCL_INFO(ZCCL_LOG_COLL, "%s: %d hosts of one rank each: the hierarchical calls on this communicator are "
                       "the flat _wire calls", fn, nh);
        goto out;
    }
    h->gathered = malloc((size_t)n * sizeof *h->gathered);
    zccl_result_t mk = h->gathered ? ZCCL_SUCCESS : zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory", fn);
    for (int r = 0; r < n && h->gathered; r++) h->gathered[local[r] * nh + host[r]] = r;
    /* Both splits are made on every rank (each is a collective of comm), then every rank learns whether all worked. */
    char why[512] = "";
    zccl_result_t r1 = zccl_comm_split(comm, h->host, comm->rank, &h->intra);
    if (r1 != ZCCL_SUCCESS) snprintf(why, sizeof why, "%s", zccl__last_error());
    zccl_result_t r2 = zccl_comm_split(comm, h->local, h->host, &h->inter);
    if (r2 != ZCCL_SUCCESS && !why[0]) snprintf(why, sizeof why, "%s", zccl__last_error());
    if (mk == ZCCL_SUCCESS && r1 == ZCCL_SUCCESS && r2 == ZCCL_SUCCESS) {
        int ri = -1, re = -1;
        zccl_comm_rank(h->intra, &ri);
        zccl_comm_rank(h->inter, &re);
        if (ri != h->local || re != h->host) {
            mk = zccl__error(ZCCL_INTERNAL_ERROR, "%s: the sub-communicators rank this rank %d (host) and %d (local), "
                             "the layout %d and %d", fn, re, ri, h->host, h->local);
            snprintf(why, sizeof why, "%s", zccl__last_error());
        }
    }
    const int32_t ok = mk == ZCCL_SUCCESS && r1 == ZCCL_SUCCESS && r2 == ZCCL_SUCCESS;
    res = zccl_allgather(&ok, oks, 1, ZCCL_INT32, comm, NULL);
    if (res != ZCCL_SUCCESS) goto out;
    int bad = -1;
    for (int r = 0; r < n && bad < 0; r++)
        if (!oks[r]) bad = r;
    if (bad < 0) {
        h->state = HIER_ON;
        ZCCL_INFO(ZCCL_LOG_COLL, "%s: %d hosts of %d ranks: this rank is local rank %d of host %d", fn, nh, G,
                  h->local, h->host);
        goto out;
    }
    h->state = HIER_FAILED;
    if (bad == comm->rank) snprintf(h->why, sizeof h->why, "%s", why);
    else snprintf(h->why, sizeof h->why, "rank %d could not make its sub-communicators (its own error says why)", bad);
    const zccl_result_t own = mk != ZCCL_SUCCESS ? mk : r1 != ZCCL_SUCCESS ? r1 : r2;
    res = zccl__error(bad == comm->rank ? own : ZCCL_REMOTE_ERROR,
                      "%s: the hierarchical layout of %d hosts of %d ranks failed: %s", fn, nh, G, h->why);
    if (h->intra) zccl_comm_destroy(h->intra);
    if (h->inter) zccl_comm_destroy(h->inter);
    h->intra = h->inter = NULL;
out:
    if (h && (res == ZCCL_SUCCESS || h->state == HIER_FAILED)) {
        comm->hier = h;
        h = NULL;
    }
    if (h) {
        if (h->intra) zccl_comm_destroy(h->intra);
        if (h->inter) zccl_comm_destroy(h->inter);
        free(h->gathered);
    }
    free(h);
    free(keys);
    free(host);
    free(local);
    free(cnt);
    free(oks);
    return res;
}

static zccl_result_t hier_get(const char *fn, zccl_comm_t comm, struct zccl_hier **out) {
    if (!comm->hier) ZCCL_CHECK(hier_setup(fn, comm));
    *out = comm->hier;
    if ((*out)->state == HIER_FAILED)
        return zccl__error(ZCCL_INVALID_USAGE, "%s: this communicator's hierarchical layout could not be made: %s",
                           fn, (*out)->why);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_hier_layout(zccl_comm_t comm, int *nhosts, int *per_host, int *hierarchical) {
    const char *fn = "zccl_hier_layout";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    ZCCL_CHECK(zccl__comm_ready(comm, fn));
    if (zccl__group_open())
        return zccl__error(ZCCL_INVALID_USAGE, "%s: cannot be part of a zccl_group_start/zccl_group_end group", fn);
    if (zccl__stream_busy_with(comm))
        return zccl__error(ZCCL_INVALID_USAGE, "%s: comm has operations queued on a stream; synchronize it first", fn);
    struct zccl_hier *h = NULL;
    zccl_result_t res = hier_get(fn, comm, &h);
    if (h) {
        if (nhosts) *nhosts = h->nhosts;
        if (per_host) *per_host = h->per_host;
        if (hierarchical) *hierarchical = h->state == HIER_ON;
    }
    return res;
}

/* ---- the calls --------------------------------------------------------------------------------------------- */

/* One step of a call: runs `call` while every earlier step worked on this rank, else refuses the step (its first
 * collective, `first`, on `sub`) with the failure so far, which it keeps. */
#define STEP(sub, first, call)                                                                                 \
    (res = res == ZCCL_SUCCESS ? (call) : zccl__coll_refuse_op(refused_op((sub), (first)), NULL, res))

/* The buffer checks before any step; on failure the caller refuses every step (refuse_all). */
static zccl_result_t check_call(const char *fn, const void *sendbuf, size_t sbytes, void *recvbuf, size_t rbytes,
                                bool in_place, size_t count) {
    if (count == 0) return ZCCL_SUCCESS;
    ZCCL_CHECK(zccl__check_buf(fn, "sendbuf", sendbuf));
    ZCCL_CHECK(zccl__check_buf(fn, "recvbuf", recvbuf));
    ZCCL_CHECK(zccl__check_overlap(fn, sendbuf, sbytes, recvbuf, rbytes, in_place));
    return zccl__check_host_mem(fn, sendbuf, recvbuf);
}

/* After a failed step: comm takes the sub-communicators' breakage, so that later calls fail on every rank alike. */
static zccl_result_t settle(zccl_comm_t comm, const struct zccl_hier *h, zccl_result_t res) {
    if (res == ZCCL_SUCCESS) return res;
    const zccl_comm_t subs[2] = {h->intra, h->inter};
    for (int k = 0; k < 2; k++) {
        const zccl_result_t a = __atomic_load_n(&subs[k]->tc.async_error, __ATOMIC_ACQUIRE);
        if (a != ZCCL_SUCCESS && __atomic_load_n(&comm->tc.async_error, __ATOMIC_ACQUIRE) == ZCCL_SUCCESS) {
            snprintf(comm->async_msg, sizeof comm->async_msg, "%s", subs[k]->async_msg);
            __atomic_store_n(&comm->tc.async_error, a, __ATOMIC_RELEASE);
        }
    }
    return res;
}

/* A call refused before its first step: on comm while the layout is not made yet (the peers make it: its first
 * exchange is an all-gather) or the calls are flat (the peers run the _wire call, whose first collective is
 * flat_first); on the sub-communicators, every step, when hierarchical. */
static zccl_result_t refuse_all(zccl_comm_t comm, zccl_stream_t stream, zccl_result_t res, zccl_coll_t flat_first,
                                const zccl_coll_t *steps, const bool *on_intra, int nsteps) {
    if (!comm || res == ZCCL_IN_PROGRESS) return res;
    struct zccl_hier *h = comm->hier;
    if (!h || h->state == HIER_FLAT)
        return zccl__coll_refuse_op(refused_op(comm, h ? flat_first : ZCCL_COLL_ALLGATHER), stream, res);
    if (h->state != HIER_ON) return res; /* every rank fails without moving anything */
    if (stream) zccl_stream_synchronize(stream);
    for (int k = 0; k < nsteps; k++) STEP(on_intra[k] ? h->intra : h->inter, steps[k], ZCCL_SUCCESS);
    return settle(comm, h, res);
}

/* Cuts n temporaries of the given sizes out of h's scratch area (grown when too small; 64-byte aligned parts).
 * False when it cannot grow: *out is left unset. */
static bool scratch_parts(struct zccl_hier *h, int n, const size_t *bytes, void **out) {
    size_t total = 0;
    for (int k = 0; k < n; k++) total += (bytes[k] + 63) & ~(size_t)63;
    if (total > h->scratch_bytes || !h->scratch) { /* never NULL, even for empty parts (memcpy's arguments) */
        void *p = NULL;
        if (posix_memalign(&p, 64, total ? total : 64) != 0) return false;
        free(h->scratch);
        h->scratch = p;
        h->scratch_bytes = total;
    }
    size_t at = 0;
    for (int k = 0; k < n; k++) {
        out[k] = (uint8_t *)h->scratch + at;
        at += (bytes[k] + 63) & ~(size_t)63;
    }
    return true;
}

/* The hierarchical calls sum inside a host in float32 before quantizing: float64 would be rounded before that sum,
 * which the bounds of zccl_hier.h do not cover; the flat _wire calls take it. */
static zccl_result_t hier_dtype_ok(const char *fn, zccl_datatype_t dt) {
    if (dt != ZCCL_FLOAT64) return ZCCL_SUCCESS;
    return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'datatype' = float64: the hierarchical quantized calls "
                       "take float32, float16 or bfloat16 (the flat _wire calls take float64)", fn);
}

ZCCL_API zccl_result_t zccl_reduce_scatter_hier(const void *sendbuf, void *recvbuf, size_t recvcount,
                                                zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire,
                                                zccl_comm_t comm, zccl_stream_t stream) {
    if (wire == ZCCL_WIRE_FULL) return zccl_reduce_scatter(sendbuf, recvbuf, recvcount, datatype, op, comm, stream);
    const char *fn = "zccl_reduce_scatter_hier";
    static const zccl_coll_t steps[2] = {ZCCL_COLL_REDUCE_SCATTER, ZCCL_COLL_ALLTOALL};
    static const bool on_intra[2] = {true, false};
    size_t total = 0, w, f32;
    zccl_result_t res = zccl__check_common(fn, comm, recvcount, (size_t)(comm ? comm->nranks : 1), datatype, 1, op,
                                           &total);
    if (res == ZCCL_SUCCESS) {
        const size_t n = (size_t)comm->nranks, rbytes = total / n;
        res = zccl__check_wire(fn, comm, wire, datatype, true, op, recvcount, n, &w);
        if (res == ZCCL_SUCCESS) res = hier_dtype_ok(fn, datatype);
        if (res == ZCCL_SUCCESS && (!zccl__mul_ok(recvcount * n, sizeof(float), &f32) || f32 > SIZE_MAX / 4))
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'recvcount' = %zu: the float32 partial sums "
                              "overflow the address space", fn, recvcount);
        if (res == ZCCL_SUCCESS)
            res = check_call(fn, sendbuf, total, recvbuf, rbytes,
                             (const char *)recvbuf == (const char *)sendbuf + (size_t)comm->rank * rbytes, recvcount);
    }
    if (res != ZCCL_SUCCESS) return refuse_all(comm, stream, res, ZCCL_COLL_ALLTOALL, steps, on_intra, 2);
    if (stream) ZCCL_CHECK(zccl_stream_synchronize(stream));
    struct zccl_hier *h = NULL;
    ZCCL_CHECK(hier_get(fn, comm, &h));
    if (h->state == HIER_FLAT)
        return zccl_reduce_scatter_wire(sendbuf, recvbuf, recvcount, datatype, op, wire, comm, NULL);
    const size_t N = (size_t)comm->nranks, H = (size_t)h->nhosts;
    const size_t es = zccl_type_size(datatype), rc = recvcount;
    const size_t sizes[3] = {N * rc * sizeof(float), H * rc * sizeof(float), rc * sizeof(float)};
    void *parts[3] = {NULL, NULL, NULL};
    const bool ok = scratch_parts(h, 3, sizes, parts);
    float *t = parts[0], *u = parts[1], *v = parts[2];
    if (!ok)
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %zu float32 partial sums", fn, (N + H + 1) * rc);
    else
        /* Position k = l*H + hh of the intra-host reduce-scatter: the block of rank gathered[k]. */
        for (size_t k = 0; k < N; k++)
            zccl__quant_widen((const char *)sendbuf + (size_t)h->gathered[k] * rc * es, datatype, rc, t + k * rc);
    STEP(h->intra, steps[0], zccl_reduce_scatter(t, u, H * rc, ZCCL_FLOAT32, ZCCL_SUM, h->intra, NULL));
    STEP(h->inter, steps[1], zccl_reduce_scatter_wire(u, v, rc, ZCCL_FLOAT32, ZCCL_SUM, wire, h->inter, NULL));
    if (res == ZCCL_SUCCESS) {
        if (op == ZCCL_AVG)
            for (size_t i = 0; i < rc; i++) v[i] = v[i] / (float)N;
        zccl__quant_narrow(v, rc, datatype, recvbuf);
    }
    return settle(comm, h, res);
}

ZCCL_API zccl_result_t zccl_allgather_hier(const void *sendbuf, void *recvbuf, size_t sendcount,
                                           zccl_datatype_t datatype, zccl_wire_t wire, zccl_comm_t comm,
                                           zccl_stream_t stream) {
    if (wire == ZCCL_WIRE_FULL) return zccl_allgather(sendbuf, recvbuf, sendcount, datatype, comm, stream);
    const char *fn = "zccl_allgather_hier";
    static const zccl_coll_t steps[2] = {ZCCL_COLL_ALLGATHER, ZCCL_COLL_ALLGATHER};
    static const bool on_intra[2] = {false, true};
    size_t total = 0, w;
    zccl_result_t res = zccl__check_common(fn, comm, sendcount, (size_t)(comm ? comm->nranks : 1), datatype, 0,
                                           ZCCL_SUM, &total);
    if (res == ZCCL_SUCCESS) {
        const size_t n = (size_t)comm->nranks, sbytes = total / n;
        res = zccl__check_wire(fn, comm, wire, datatype, false, ZCCL_SUM, sendcount, n, &w);
        if (res == ZCCL_SUCCESS) res = hier_dtype_ok(fn, datatype);
        if (res == ZCCL_SUCCESS)
            res = check_call(fn, sendbuf, sbytes, recvbuf, total,
                             (const char *)sendbuf == (const char *)recvbuf + (size_t)comm->rank * sbytes, sendcount);
    }
    if (res != ZCCL_SUCCESS) return refuse_all(comm, stream, res, ZCCL_COLL_ALLGATHER, steps, on_intra, 2);
    if (stream) ZCCL_CHECK(zccl_stream_synchronize(stream));
    struct zccl_hier *h = NULL;
    ZCCL_CHECK(hier_get(fn, comm, &h));
    if (h->state == HIER_FLAT) return zccl_allgather_wire(sendbuf, recvbuf, sendcount, datatype, wire, comm, NULL);
    const size_t N = (size_t)comm->nranks, H = (size_t)h->nhosts;
    /* The wire strings themselves travel both hops (exact copies: the one quantization is the encoding here), and
     * every rank decodes all N of them, so the output is zccl_allgather_wire's, bitwise. */
    const size_t ws = sendcount ? w : 0, blk = sendcount * zccl_type_size(datatype);
    const zccl_datatype_t idt = zccl__wire_inner_type(wire);
    const size_t sizes[3] = {ws, H * ws, N * ws};
    void *parts[3] = {NULL, NULL, NULL};
    const bool ok = scratch_parts(h, 3, sizes, parts);
    uint8_t *own = parts[0], *a = parts[1], *b = parts[2];
    if (!ok)
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %zu bytes of wire strings", fn, (N + H + 1) * ws);
    else if (sendcount)
        zccl__wire_encode(wire, sendbuf, datatype, sendcount, own);
    STEP(h->inter, steps[0], zccl_allgather(own, a, ws, idt, h->inter, NULL));
    STEP(h->intra, steps[1], zccl_allgather(a, b, H * ws, idt, h->intra, NULL));
    /* every rank sees every rank's header here, so all of them refuse a call whose counts differ alike */
    if (res == ZCCL_SUCCESS && sendcount)
        res = zccl__wire_check(fn, b, ws, N, h->gathered, (size_t)comm->rank, sendcount, wire);
    if (res == ZCCL_SUCCESS)
        /* String k = l*H + hh of b is rank gathered[k]'s (local rank l's part holds host hh's local rank l). */
        for (size_t k = 0; k < N && sendcount; k++)
            zccl__wire_decode(wire, b + k * ws, sendcount, (char *)recvbuf + (size_t)h->gathered[k] * blk, datatype);
    return settle(comm, h, res);
}

ZCCL_API zccl_result_t zccl_allreduce_hier(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                           zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm, zccl_stream_t stream) {
    if (wire == ZCCL_WIRE_FULL) return zccl_allreduce(sendbuf, recvbuf, count, datatype, op, comm, stream);
    const char *fn = "zccl_allreduce_hier";
    static const zccl_coll_t steps[3] = {ZCCL_COLL_REDUCE_SCATTER, ZCCL_COLL_ALLTOALL, ZCCL_COLL_ALLGATHER};
    static const bool on_intra[3] = {true, false, true};
    size_t bytes = 0, w, f32;
    zccl_result_t res = zccl__check_common(fn, comm, count, 1, datatype, 1, op, &bytes);
    if (res == ZCCL_SUCCESS) {
        const size_t n = (size_t)comm->nranks, L = count / n + (count % n != 0);
        res = zccl__check_wire(fn, comm, wire, datatype, true, op, L, n, &w);
        if (res == ZCCL_SUCCESS) res = hier_dtype_ok(fn, datatype);
        if (res == ZCCL_SUCCESS && (!zccl__mul_ok(count + n, sizeof(float), &f32) || f32 > SIZE_MAX / 4))
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'count' = %zu: the float32 partial sums overflow "
                              "the address space", fn, count);
        if (res == ZCCL_SUCCESS) res = check_call(fn, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf, count);
    }
    if (res != ZCCL_SUCCESS) return refuse_all(comm, stream, res, ZCCL_COLL_ALLTOALL, steps, on_intra, 3);
    if (stream) ZCCL_CHECK(zccl_stream_synchronize(stream));
    struct zccl_hier *h = NULL;
    ZCCL_CHECK(hier_get(fn, comm, &h));
    if (h->state == HIER_FLAT)
        return zccl_allreduce_wire(sendbuf, recvbuf, count, datatype, op, wire, comm, NULL);
    const size_t N = (size_t)comm->nranks, G = (size_t)h->per_host, l = (size_t)h->local;
    const size_t C = count / G + (count % G != 0), es = zccl_type_size(datatype);
    /* The gathered chunks go straight to recvbuf when they fill it exactly (sendbuf is read by then). */
    const bool direct = count == G * C;
    const size_t sizes[3] = {G * C * sizeof(float), C * sizeof(float), direct ? 0 : G * C * es};
    void *parts[3] = {NULL, NULL, NULL};
    const bool ok = scratch_parts(h, 3, sizes, parts);
    float *t = parts[0], *u = parts[1];
    uint8_t *d = direct ? (uint8_t *)recvbuf : parts[2];
    if (!ok) res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %zu float32 partial sums", fn, (G + 1) * C);
    else {
        zccl__quant_widen(sendbuf, datatype, count, t);
        memset(t + count, 0, (G * C - count) * sizeof(float));
    }
    STEP(h->intra, steps[0], zccl_reduce_scatter(t, u, C, ZCCL_FLOAT32, ZCCL_SUM, h->intra, NULL));
    STEP(h->inter, steps[1], zccl_allreduce_wire(u, u, C, ZCCL_FLOAT32, ZCCL_SUM, wire, h->inter, NULL));
    if (res == ZCCL_SUCCESS) {
        if (op == ZCCL_AVG)
            for (size_t i = 0; i < C; i++) u[i] = u[i] / (float)N;
        zccl__quant_narrow(u, C, datatype, d + l * C * es);
    }
    STEP(h->intra, steps[2], zccl_allgather(d + l * C * es, d, C, datatype, h->intra, NULL));
    if (res == ZCCL_SUCCESS && d != (uint8_t *)recvbuf) memcpy(recvbuf, d, count * es);
    return settle(comm, h, res);
}

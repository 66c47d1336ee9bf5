/*
 * zero3.c — ZeRO-3 parameter store (Rajbhandari et al., SC 2020, stage 3): every layer's parameters live as
 * shards; zccl_zero3_fetch all-gathers a layer just before it runs. Step 1 records the fetch sequence (checking
 * before each gather that all ranks fetch the same layer, so a divergence is an error, not a hang); later steps
 * issue the gathers of the next recorded positions ahead of time while the gathered bytes stay within the
 * max-live-bytes bound, in recorded order, so every rank issues the same gathers in the same order.
 *
 * Buffers belong to sequence positions, not layers: a layer fetched in forward and again in backward has two
 * positions, and the backward gather may be prefetched while the forward copy is still held.
 *
 * Where every rank shares one host (ZCCL_BUCKET_REGISTER, as for bucket plans) the gathered buffers come from a
 * pool of zccl_mem_alloc blocks registered with the store's communicator, so each layer's all-gather takes the
 * registered one-pass path; a released buffer goes back to the pool, and later steps reuse it (registering costs
 * a mapping on every peer, deregistering a message to each). The idle buffers are bounded like the live ones (the
 * layers they last held within max_live_bytes; beyond, the largest is deregistered and freed), so the store holds
 * at most about twice the bound (plus under a page per buffer), as a caching allocator reserves more than it hands
 * out.
 *
 * hpZ (opts->hpz; ZeRO++'s hierarchical partitioning, Wang et al. 2023). A layer's fetch positions of a step are
 * primary (its first recorded position) or secondary (every later one): the same on every rank, fixed by step 1's
 * recording. When a primary position's gather has completed, zccl_zero3_fetch copies this rank's slice of the
 * gathered layer (local rank j of G per host: elements [j*padded/G, (j+1)*padded/G)) into the layer's secondary
 * buffer before handing the layer out; a secondary position's gather places that slice and all-gathers in place on
 * the store's own per-host communicator (G = 1: the slice is the layer, a copy). Both communicators' collectives
 * are queued on the one store stream, which runs each operation on its own communicator in queue order; every rank
 * queues the same sequence, so the per-host gathers of a host's ranks line up as the global ones do. A secondary
 * position is never issued before its primary has been fetched in this step: prefetch pauses there (recorded order),
 * and the fetch of the primary prefetches again once the slice is in place. The secondary gathers use the pool's
 * buffers as well: they are registered with the store's communicator, not the host's, so those gathers take the
 * ordinary in-host path. With a quantized wire and G >= 2 (not float64) the primary gathers are zccl_allgather_hier,
 * bitwise zccl_allgather_wire's output with each wire string crossing once per host; its layout is made at creation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "zccl_ext.h"
#include "zccl_hier.h"
#include "zero.h"

/* A gathered-layer buffer of the pool: zccl_mem_alloc memory registered with the store's communicator. */
typedef struct z3_buf {
    struct z3_buf *next;
    void *p;
    size_t bytes; /* capacity: whole pages */
    size_t used;  /* bytes of the layer it holds or last held */
    void *reg;
} z3_buf_t;

struct zccl_zero3 {
    zccl_comm_t comm;
    bool pool_on;              /* gathered buffers from the registered pool (one host, ZCCL_BUCKET_REGISTER) */
    bool pool_fallback;        /* the pool could not grow once: INFO said so; ordinary memory since */
    z3_buf_t *busy, *idle;     /* pool buffers holding a position's layer / free for reuse */
    size_t idle_bytes;         /* idle buffers' `used` bytes, kept within max_live_bytes */
    int nranks, rank, nlayers;
    zccl_datatype_t dt;
    size_t es;
    size_t *numel, *padded, *shard; /* per layer, elements */
    void **shard_buf;               /* per layer: this rank's shard */
    size_t limit;
    zccl_wire_t wire;          /* the gathers' wire format (opts->wire) */
    bool hpz;                  /* hpZ on (opts->hpz with several hosts): secondary positions gather in the host */
    int G, local;              /* hpZ: ranks per host, this rank's local rank */
    zccl_comm_t intra;         /* hpZ: the host's ranks, ranked by local rank (split from comm, owned; NULL: G = 1) */
    bool hier;                 /* hpZ, quantized wire, G > 1, not float64: primary gathers are zccl_allgather_hier */
    void **sec;                /* hpZ, per layer: this rank's slice of the step's primary gather, padded/G elements */
    int *sec_step;             /* hpZ, per layer: the step whose primary gather filled sec (0: none yet) */
    int *first;                /* hpZ, per layer: its first recorded position, the primary one (-1: none yet) */
    zccl_stream_t stream;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open, recording;
    int step;                  /* steps begun (the open one's number) */
    int *rec, nrec, cap;       /* the recorded sequence (layer per position), growing in step 1 */
    void **pbuf;               /* per position: gathered buffer, NULL if none */
    uint64_t *ticket, *t_issue;
    int stamped;               /* positions whose gather completion was accounted, in issue order */
    int pos, next_issue;       /* fetches made in this step; positions issued in this step */
    int *held;                 /* per layer: position the caller holds, -1 */
    size_t live;
    zccl_result_t err;
    char errmsg[512];
    zccl_zero3_stats_t st;
};

static size_t layer_bytes(const struct zccl_zero3 *z, int layer) { return z->padded[layer] * z->es; }

/* hpZ: position i gathers inside the host from the secondary partition (not the layer's first position). */
static bool secondary(const struct zccl_zero3 *z, int i) { return z->hpz && z->first[z->rec[i]] < i; }

/* hpZ: bytes of a layer's secondary slice (padded/G elements). */
static size_t sec_bytes(const struct zccl_zero3 *z, int layer) { return z->padded[layer] / (size_t)z->G * z->es; }

static void set_broken(struct zccl_zero3 *z, zccl_result_t res) {
    if (z->err != ZCCL_SUCCESS) return;
    z->err = res;
    snprintf(z->errmsg, sizeof z->errmsg, "%s", zccl__last_error());
}

/* Under z->mu: account completed gathers (in issue order). */
static void stamp(struct zccl_zero3 *z) {
    const uint64_t done = zccl__stream_completed(z->stream);
    while (z->stamped < z->next_issue && z->ticket[z->stamped] <= done) {
        z->st.gather_s += (double)(zccl__now_ns() - z->t_issue[z->stamped]) * 1e-9;
        z->stamped++;
    }
}

static void on_complete(void *arg) {
    struct zccl_zero3 *z = arg;
    pthread_mutex_lock(&z->mu);
    stamp(z);
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
}

static zccl_result_t grow(struct zccl_zero3 *z, int need) {
    if (need <= z->cap) return ZCCL_SUCCESS;
    int cap = z->cap ? 2 * z->cap : 64;
    while (cap < need) cap *= 2;
    int *rec = realloc(z->rec, (size_t)cap * sizeof *rec);
    if (rec) z->rec = rec;
    void **pbuf = realloc(z->pbuf, (size_t)cap * sizeof *pbuf);
    if (pbuf) z->pbuf = pbuf;
    uint64_t *t = realloc(z->ticket, (size_t)cap * sizeof *t);
    if (t) z->ticket = t;
    uint64_t *ti = realloc(z->t_issue, (size_t)cap * sizeof *ti);
    if (ti) z->t_issue = ti;
    if (!rec || !pbuf || !t || !ti)
        return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_zero3_fetch: out of memory recording %d fetches", need);
    for (int i = z->cap; i < cap; i++) z->pbuf[i] = NULL;
    z->cap = cap;
    return ZCCL_SUCCESS;
}

static void pool_drop(struct zccl_zero3 *z, z3_buf_t *b) {
    if (zccl_comm_deregister(z->comm, b->reg) == ZCCL_SUCCESS) zccl_mem_free(b->p);
    /* else a peer may still map it: it stays until the process ends (docs/zero.md) */
    free(b);
}

/* Under z->mu: a buffer of at least `bytes` for a gathered layer: the smallest idle pool buffer that fits and is
 * at most twice the size (in whole pages), else a new registered one of whole pages, else malloc. */
static void *buf_get(struct zccl_zero3 *z, size_t bytes) {
    if (!z->pool_on) return malloc(bytes);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), cap = (bytes + page - 1) / page * page;
    z3_buf_t **best = NULL;
    for (z3_buf_t **pp = &z->idle; *pp; pp = &(*pp)->next)
        if ((*pp)->bytes >= cap && (*pp)->bytes / 2 <= cap && (!best || (*pp)->bytes < (*best)->bytes)) best = pp;
    if (best) {
        z3_buf_t *b = *best;
        *best = b->next;
        z->idle_bytes -= b->used;
        b->used = bytes;
        b->next = z->busy;
        z->busy = b;
        return b->p;
    }
    z3_buf_t *b = calloc(1, sizeof *b);
    void *m = NULL;
    if (b && zccl_mem_alloc(&m, cap) == ZCCL_SUCCESS) { /* whole pages: zccl_mem_alloc rounds up anyway */
        if (zccl_comm_register(z->comm, m, cap, &b->reg) == ZCCL_SUCCESS) {
            b->p = m;
            b->bytes = cap;
            b->used = bytes;
            b->next = z->busy;
            z->busy = b;
            z->st.registered_allocs++;
            return m;
        }
        zccl_mem_free(m);
    }
    free(b);
    if (!z->pool_fallback) {
        z->pool_fallback = true;
        ZCCL_INFO(ZCCL_LOG_INIT, "zccl_zero3: rank %d: gathered layers in ordinary memory from now on (%s)", z->rank,
                  zccl__last_error());
    }
    z->pool_on = false;
    return malloc(bytes);
}

/* Under z->mu: a gathered buffer is done with: back to the pool, or freed. */
static void buf_put(struct zccl_zero3 *z, void *p) {
    for (z3_buf_t **pp = &z->busy; *pp; pp = &(*pp)->next) {
        if ((*pp)->p != p) continue;
        z3_buf_t *b = *pp;
        *pp = b->next;
        b->next = z->idle;
        z->idle = b;
        z->idle_bytes += b->used;
        while (z->idle_bytes > z->limit) { /* idle buffers stay within the bound too: the largest goes first */
            z3_buf_t **big = &z->idle;
            for (z3_buf_t **q = &z->idle; *q; q = &(*q)->next)
                if ((*q)->bytes > (*big)->bytes) big = q;
            z3_buf_t *d = *big;
            *big = d->next;
            z->idle_bytes -= d->used;
            pool_drop(z, d);
        }
        return;
    }
    free(p);
}

/* Under z->mu: allocate position i's buffer, place the shard, queue the in-place all-gather. A secondary position
 * (hpZ) places this rank's secondary slice instead and gathers on the host's communicator, in full precision (one
 * rank per host: the slice is the whole layer, nothing to gather). */
static zccl_result_t issue(struct zccl_zero3 *z, int i) {
    const int l = z->rec[i];
    const bool sec = secondary(z, i);
    if (sec && z->sec_step[l] != z->step) /* the callers never get here: prefetch pauses, fetch follows the order */
        return zccl__error(ZCCL_INTERNAL_ERROR, "zccl_zero3: step %d, fetch #%d: layer %d's secondary partition is "
                           "not filled (its primary fetch #%d has not returned in this step)", z->step, i, l,
                           z->first[l]);
    char *buf = buf_get(z, layer_bytes(z, l));
    if (!buf)
        return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_zero3: out of memory gathering layer %d (%zu bytes)", l,
                           layer_bytes(z, l));
    zccl_result_t res = ZCCL_SUCCESS;
    if (sec) { /* hpZ */
        char *mine = buf + (size_t)z->local * sec_bytes(z, l);
        memcpy(mine, z->sec[l], sec_bytes(z, l));
        if (z->intra) res = zccl_allgather(mine, buf, z->padded[l] / (size_t)z->G, z->dt, z->intra, z->stream);
    } else {
        char *mine = buf + (size_t)z->rank * z->shard[l] * z->es;
        memcpy(mine, z->shard_buf[l], z->shard[l] * z->es);
        res = z->wire == ZCCL_WIRE_FULL
                  ? zccl_allgather(mine, buf, z->shard[l], z->dt, z->comm, z->stream)
                  : zccl__wire_enqueue(z->hier ? ZCCL__WIRE_ALLGATHER_HIER : ZCCL__WIRE_ALLGATHER, mine, buf,
                                       z->shard[l], z->dt, ZCCL_SUM, z->wire, z->comm, z->stream); /* qwZ */
    }
    if (res != ZCCL_SUCCESS) { buf_put(z, buf); return res; }
    z->pbuf[i] = buf;
    /* A local copy (G = 1) is complete now: ticket 0 never waits, and stays in issue order for stamp(). */
    z->ticket[i] = sec && !z->intra ? 0 : zccl__stream_issued(z->stream);
    z->t_issue[i] = zccl__now_ns();
    z->next_issue = i + 1;
    z->live += layer_bytes(z, l);
    if (z->live > z->st.peak_live_bytes) z->st.peak_live_bytes = z->live;
    z->st.gathers++;
    if (sec) z->st.hpz_gathers++;
    else if (z->hier) z->st.hier_gathers++;
    return ZCCL_SUCCESS;
}

/* Under z->mu: issue the next recorded positions while they fit in the bound; (hpZ) pause at a secondary position
 * whose layer's primary fetch has not returned in this step. */
static zccl_result_t prefetch(struct zccl_zero3 *z) {
    while (!z->recording && z->next_issue < z->nrec && z->live + layer_bytes(z, z->rec[z->next_issue]) <= z->limit &&
           !(secondary(z, z->next_issue) && z->sec_step[z->rec[z->next_issue]] != z->step))
        ZCCL_CHECK(issue(z, z->next_issue));
    return ZCCL_SUCCESS;
}

/* Under z->mu: wait until the stream completed ticket t. */
static zccl_result_t wait_ticket(struct zccl_zero3 *z, uint64_t t, const char *fn) {
    while (zccl__stream_completed(z->stream) < t) pthread_cond_wait(&z->cv, &z->mu);
    zccl_result_t ae = ZCCL_SUCCESS;
    zccl_comm_get_async_error(z->comm, &ae);
    if (ae != ZCCL_SUCCESS)
        return zccl__error(ae, "%s: a gather failed: %s", fn, zccl__comm_async_msg(z->comm));
    if (z->intra) zccl_comm_get_async_error(z->intra, &ae);
    if (ae != ZCCL_SUCCESS)
        return zccl__error(ae, "%s: a gather inside the host (hpZ) failed: %s", fn, zccl__comm_async_msg(z->intra));
    return ZCCL_SUCCESS;
}

/* Under z->mu, step 1: all ranks agree on what the caller does at this position (v = layer, or nlayers for the
 * end of the step). One all-reduce (MAX) of {v, ~v} on the store's stream gives the largest and smallest value. */
static zccl_result_t agree(struct zccl_zero3 *z, uint64_t v, const char *fn) {
    uint64_t in[2] = {v, ~v}, out[2] = {0, 0};
    ZCCL_CHECK(zccl_allreduce(in, out, 2, ZCCL_UINT64, ZCCL_MAX, z->comm, z->stream));
    ZCCL_CHECK(wait_ticket(z, zccl__stream_issued(z->stream), fn));
    const uint64_t hi = out[0], lo = ~out[1];
    if (hi == lo) return ZCCL_SUCCESS;
    char a[48], b[48];
    snprintf(a, sizeof a, lo == (uint64_t)z->nlayers ? "ended the step" : "fetched layer %llu", (unsigned long long)lo);
    snprintf(b, sizeof b, hi == (uint64_t)z->nlayers ? "ended the step" : "fetched layer %llu", (unsigned long long)hi);
    return zccl__error(ZCCL_INVALID_USAGE, "%s: step 1, fetch #%d: ranks diverge: some %s, others %s (this rank %s "
                       "%llu); every rank must fetch the same layers in the same order", fn, z->pos, a, b,
                       v == (uint64_t)z->nlayers ? "ended the step at" : "fetched layer", (unsigned long long)v);
}

/* Create with opts->hpz, on every rank (all ranks agreed on hpz in the cross-rank check): all-gathers the host keys
 * (the hierarchical calls' identity), so that every rank computes the same layout and reaches the same verdict; one
 * host turns hpZ off, hosts of unequal sizes are refused; then splits comm by host (G >= 2) and allocates the
 * secondary slices. */
static zccl_result_t hpz_setup(struct zccl_zero3 *z, const char *fn) {
    const int n = z->nranks;
    uint64_t *keys = malloc((size_t)n * sizeof *keys);
    int *host = malloc((size_t)n * sizeof *host), *local = malloc((size_t)n * sizeof *local);
    int *cnt = malloc((size_t)n * sizeof *cnt);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!keys || !host || !local || !cnt) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for the hpZ host layout of %d ranks", fn, n);
        zccl__coll_refuse(z->comm, NULL, res); /* the peers wait in the exchange below: they fail quoting this */
        goto out;
    }
    const uint64_t mine = zccl__host_key(z->comm);
    res = zccl_allgather(&mine, keys, 1, ZCCL_UINT64, z->comm, NULL);
    if (res != ZCCL_SUCCESS) goto out;
    const int nh = zccl__host_layout(keys, n, host, local, cnt), G = cnt[0];
    bool equal = true;
    for (int k = 1; k < nh; k++) equal = equal && cnt[k] == G;
    if (!equal) {
        char sizes[256];
        size_t len = 0;
        for (int k = 0; k < nh && len < sizeof sizes - 40; k++)
            len += (size_t)snprintf(sizes + len, sizeof sizes - len, "%shost %d: %d", k ? ", " : "", k, cnt[k]);
        if (len >= sizeof sizes - 40) snprintf(sizes + len, sizeof sizes - len, ", ...");
        res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->hpz needs hosts of equal size (its slices of a layer are "
                          "padded/G elements for G ranks per host), but the %d ranks are on %d hosts of unequal sizes "
                          "(%s ranks; hosts by ZCCL_HOST_ID or the real host, numbered by their lowest rank)", fn, n,
                          nh, sizes);
        goto out;
    }
    if (nh < 2) {
        ZCCL_INFO(ZCCL_LOG_INIT, "%s: opts->hpz: all %d ranks on one host: no gather leaves it, so the store runs "
                  "without hpZ", fn, n);
        goto out;
    }
    z->G = G;
    z->local = local[z->rank];
    int32_t ok = 1, all = 0;
    if (G > 1) { /* a collective of comm on every rank, then every rank learns whether it worked everywhere */
        zccl_result_t sr = zccl_comm_split(z->comm, host[z->rank], z->rank, &z->intra);
        int ri = -1;
        if (sr == ZCCL_SUCCESS) zccl_comm_rank(z->intra, &ri);
        if (sr == ZCCL_SUCCESS && ri != z->local)
            sr = zccl__error(ZCCL_INTERNAL_ERROR, "%s: the host communicator ranks this rank %d, the layout %d", fn,
                             ri, z->local);
        if (sr != ZCCL_SUCCESS) {
            res = sr;
            ok = 0;
        }
        const zccl_result_t ar = zccl_allreduce(&ok, &all, 1, ZCCL_INT32, ZCCL_MIN, z->comm, NULL);
        if (res == ZCCL_SUCCESS && ar != ZCCL_SUCCESS) res = ar;
        else if (res == ZCCL_SUCCESS && !all)
            res = zccl__error(ZCCL_REMOTE_ERROR, "%s: opts->hpz: another rank could not make its host communicator "
                              "(its own error says why)", fn);
        if (res != ZCCL_SUCCESS) goto out;
    }
    if (G > 1 && z->wire != ZCCL_WIRE_FULL && z->dt != ZCCL_FLOAT64) {
        /* The primary gathers cross hosts: zccl_allgather_hier (bitwise zccl_allgather_wire's output) sends each
         * wire string across once per host instead of once per rank. Its layout (two sub-communicators of comm) is
         * made here, on every rank alike, so that the stream thread finds it ready; the hierarchical calls take no
         * float64, whose gathers stay flat. */
        int hierarchical = 0;
        res = zccl_hier_layout(z->comm, NULL, NULL, &hierarchical);
        if (res != ZCCL_SUCCESS) goto out;
        z->hier = hierarchical != 0;
    }
    z->sec = calloc((size_t)z->nlayers, sizeof *z->sec);
    z->sec_step = calloc((size_t)z->nlayers, sizeof *z->sec_step);
    z->first = malloc((size_t)z->nlayers * sizeof *z->first);
    if (!z->sec || !z->sec_step || !z->first) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for hpZ's tables of %d layers", fn, z->nlayers);
        goto out;
    }
    for (int l = 0; l < z->nlayers; l++) {
        z->first[l] = -1;
        z->sec[l] = malloc(sec_bytes(z, l));
        if (!z->sec[l]) {
            res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for layer %d's hpZ slice (%zu bytes)", fn, l,
                              sec_bytes(z, l));
            goto out;
        }
    }
    z->hpz = true;
    ZCCL_INFO(ZCCL_LOG_INIT, "%s: hpZ: %d hosts of %d ranks, this rank is local rank %d of host %d", fn, nh, G,
              z->local, host[z->rank]);
out:
    free(keys);
    free(host);
    free(local);
    free(cnt);
    return res;
}

static zccl_result_t enter(struct zccl_zero3 *z, const char *fn, int layer, bool need_open) {
    if (!z) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'z' is NULL", fn);
    if (layer != -1 && (layer < 0 || layer >= z->nlayers))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'layer' = %d is outside [0, %d)", fn, layer,
                           z->nlayers);
    pthread_mutex_lock(&z->mu);
    zccl_result_t res = ZCCL_SUCCESS;
    if (z->err != ZCCL_SUCCESS)
        res = zccl__error(z->err, "%s: the store is broken by an earlier error: %s", fn, z->errmsg);
    else if (need_open && !z->open)
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: no step is open (call zccl_zero3_begin first)", fn);
    if (res != ZCCL_SUCCESS) pthread_mutex_unlock(&z->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_zero3_create(zccl_comm_t comm, int nlayers, const size_t *layer_numel,
                                         zccl_datatype_t datatype, const zccl_zero3_options_t *opts, zccl_zero3_t *out) {
    const char *fn = "zccl_zero3_create";
    if (!out) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'z' is NULL", fn);
    *out = NULL;
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (nlayers < 1) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'nlayers' = %d must be >= 1", fn, nlayers);
    if (!layer_numel) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'layer_numel' is NULL", fn);
    if ((unsigned)datatype >= ZCCL_NUM_TYPES)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'datatype' = %d is not a zccl_datatype_t", fn,
                           (int)datatype);
    const zccl_wire_t wire = opts ? opts->wire : ZCCL_WIRE_FULL;
    if ((unsigned)wire >= ZCCL_NUM_WIRES)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->wire = %d is not a zccl_wire_t", fn, (int)wire);
    if (wire != ZCCL_WIRE_FULL && datatype != ZCCL_FLOAT32 && datatype != ZCCL_FLOAT64 && datatype != ZCCL_FLOAT16 &&
        datatype != ZCCL_BFLOAT16)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->wire = %s needs a floating datatype (float32, float64, "
                           "float16 or bfloat16: the quantized formats' types), got datatype %d", fn,
                           zccl_wire_name(wire), (int)datatype);
    const int hpz = opts ? opts->hpz : 0;
    if (hpz != 0 && hpz != 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->hpz = %d must be 0 (off) or 1 (hpZ on)", fn, hpz);
    size_t limit = opts ? opts->max_live_bytes : 0;
    if (limit == 0) {
        int64_t v;
        ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_ZERO3_LIVE_BYTES, &v));
        limit = (size_t)v;
    }
    struct zccl_zero3 *z = calloc(1, sizeof *z);
    if (!z) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory", fn);
    z->comm = comm;
    zccl_comm_count(comm, &z->nranks);
    zccl_comm_rank(comm, &z->rank);
    z->nlayers = nlayers;
    z->dt = datatype;
    z->es = zccl_type_size(datatype);
    z->limit = limit;
    z->wire = wire;
    z->st.max_live_bytes = limit;
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    zccl_result_t res = ZCCL_SUCCESS;
    z->numel = calloc((size_t)nlayers, sizeof *z->numel);
    z->padded = calloc((size_t)nlayers, sizeof *z->padded);
    z->shard = calloc((size_t)nlayers, sizeof *z->shard);
    z->shard_buf = calloc((size_t)nlayers, sizeof *z->shard_buf);
    z->held = calloc((size_t)nlayers, sizeof *z->held);
    if (!z->numel || !z->padded || !z->shard || !z->shard_buf || !z->held) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %d layers", fn, nlayers);
        goto fail;
    }
    for (int l = 0; l < nlayers; l++) {
        const size_t n = layer_numel[l], r = (size_t)z->nranks;
        if (n == 0) {
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: layer_numel[%d] = 0: every layer needs an element", fn, l);
            goto fail;
        }
        size_t bytes;
        if (n > SIZE_MAX - r || !zccl__mul_ok((n + r - 1) / r * r, z->es, &bytes) || bytes > SIZE_MAX / 4) {
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: layer_numel[%d] = %zu overflows the address space", fn, l, n);
            goto fail;
        }
        z->numel[l] = n;
        z->padded[l] = (n + r - 1) / r * r;
        z->shard[l] = z->padded[l] / r;
        z->held[l] = -1;
        z->shard_buf[l] = zccl__calloc(z->shard[l], z->es);
        if (!z->shard_buf[l]) {
            res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for layer %d's shard (%zu bytes)", fn, l,
                              z->shard[l] * z->es);
            goto fail;
        }
    }
    /* A fetched layer is always gathered, so a bound below the largest gathered layer could never hold. The
     * verdict enters the cross-rank hash: a rank may not fail alone while the others wait in the check. */
    int largest = 0;
    for (int l = 1; l < nlayers; l++)
        if (z->padded[l] > z->padded[largest]) largest = l;
    const int limit_ok = limit >= layer_bytes(z, largest);
    uint64_t h = zccl__zero_hash(1469598103934665603ull, &nlayers, sizeof nlayers);
    h = zccl__zero_hash(h, layer_numel, (size_t)nlayers * sizeof *layer_numel);
    h = zccl__zero_hash(h, &datatype, sizeof datatype);
    h = zccl__zero_hash(h, &limit_ok, sizeof limit_ok);
    h = zccl__zero_hash(h, &wire, sizeof wire);
    h = zccl__zero_hash(h, &hpz, sizeof hpz);
    bool same = false;
    res = zccl__zero_same_on_all(comm, h, &same);
    if (res == ZCCL_SUCCESS && !limit_ok)
        res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: max_live_bytes = %zu (%s) is below the largest gathered layer "
                          "(layer %d: %zu bytes with padding): the bound could never hold", fn, limit,
                          opts && opts->max_live_bytes ? "opts->max_live_bytes" : "ZCCL_ZERO3_MAX_LIVE_BYTES", largest,
                          layer_bytes(z, largest));
    else if (res == ZCCL_SUCCESS && !same)
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: ranks passed different layer lists, datatypes, wires or hpz, or "
                          "another rank's max_live_bytes is below the largest layer (rank %d: %d layers)", fn, z->rank,
                          nlayers);
    if (res == ZCCL_SUCCESS) { /* the pool pays only where the registered path runs: every rank on this host */
        int64_t want = 1;
        bool one_host = false;
        res = zccl__cfg_int(ZCCL_CFG_BUCKET_REGISTER, &want);
        if (res == ZCCL_SUCCESS) res = zccl__zero_same_on_all(comm, zccl__host_hash(), &one_host);
        z->pool_on = want && one_host && z->nranks > 1;
    }
    if (res == ZCCL_SUCCESS && hpz) res = hpz_setup(z, fn);
    if (res == ZCCL_SUCCESS) res = zccl_stream_create(&z->stream);
    if (res != ZCCL_SUCCESS) goto fail;
    zccl__stream_set_notify(z->stream, on_complete, z);
    *out = z;
    return ZCCL_SUCCESS;
fail:
    zccl_zero3_destroy(z);
    return res;
}

ZCCL_API zccl_result_t zccl_zero3_destroy(zccl_zero3_t z) {
    if (!z) return ZCCL_SUCCESS;
    if (z->stream) {
        zccl__stream_set_notify(z->stream, NULL, NULL);
        zccl_stream_destroy(z->stream);
    }
    for (int i = 0; z->pbuf && i < z->cap; i++)
        if (z->pbuf[i]) buf_put(z, z->pbuf[i]);
    while (z->idle) {
        z3_buf_t *b = z->idle;
        z->idle = b->next;
        pool_drop(z, b);
    }
    if (z->intra) zccl_comm_destroy(z->intra); /* after the stream: nothing of it is queued any more */
    for (int l = 0; z->shard_buf && l < z->nlayers; l++) free(z->shard_buf[l]);
    for (int l = 0; z->sec && l < z->nlayers; l++) free(z->sec[l]);
    free(z->sec);
    free(z->sec_step);
    free(z->first);
    free(z->numel);
    free(z->padded);
    free(z->shard);
    free(z->shard_buf);
    free(z->held);
    free(z->rec);
    free(z->pbuf);
    free(z->ticket);
    free(z->t_issue);
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    free(z);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_zero3_shard(zccl_zero3_t z, int layer, void **shard, size_t *count, size_t *offset) {
    const char *fn = "zccl_zero3_shard";
    if (!z) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'z' is NULL", fn);
    if (layer < 0 || layer >= z->nlayers)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'layer' = %d is outside [0, %d)", fn, layer,
                           z->nlayers);
    if (shard) *shard = z->shard_buf[layer];
    if (count) *count = z->shard[layer];
    if (offset) *offset = (size_t)z->rank * z->shard[layer];
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_zero3_begin(zccl_zero3_t z) {
    const char *fn = "zccl_zero3_begin";
    ZCCL_CHECK(enter(z, fn, -1, false));
    zccl_result_t res = ZCCL_SUCCESS;
    if (z->open) {
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: step %d is open (call zccl_zero3_end first)", fn, z->step);
    } else {
        z->open = true;
        z->step++;
        z->recording = (z->step == 1);
        z->pos = z->next_issue = z->stamped = 0;
        res = prefetch(z); /* the first layers of the step can start at once */
        if (res != ZCCL_SUCCESS) set_broken(z, res);
    }
    pthread_mutex_unlock(&z->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_zero3_fetch(zccl_zero3_t z, int layer, void **full) {
    const char *fn = "zccl_zero3_fetch";
    if (!full) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'full' is NULL", fn);
    *full = NULL;
    ZCCL_CHECK(enter(z, fn, layer, true));
    zccl_result_t res = ZCCL_SUCCESS;
    const int i = z->pos;
    if (z->held[layer] >= 0) {
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: step %d: layer %d is already fetched and not released", fn,
                          z->step, layer);
        goto out;
    }
    bool hit = false;
    if (z->recording) {
        ZCCL_CHECK_GOTO(agree(z, (uint64_t)layer, fn), res, broken);
        ZCCL_CHECK_GOTO(grow(z, i + 1), res, broken);
        z->rec[i] = layer;
        z->nrec = i + 1;
        if (z->hpz && z->first[layer] < 0) z->first[layer] = i; /* the layer's primary position */
        ZCCL_CHECK_GOTO(issue(z, i), res, broken);
    } else {
        if (i >= z->nrec || z->rec[i] != layer) {
            char want[64];
            if (i >= z->nrec) snprintf(want, sizeof want, "step 1 recorded only %d fetches", z->nrec);
            else snprintf(want, sizeof want, "step 1 recorded layer %d there", z->rec[i]);
            res = zccl__error(ZCCL_INVALID_USAGE, "%s: step %d, fetch #%d is layer %d but %s: the fetch order must be "
                              "the same in every step (nothing was issued)", fn, z->step, i, layer, want);
            goto out;
        }
        hit = i < z->next_issue;
        while (z->next_issue <= i) ZCCL_CHECK_GOTO(issue(z, z->next_issue), res, broken);
        ZCCL_CHECK_GOTO(prefetch(z), res, broken); /* may go further while we wait */
    }
    const uint64_t t0 = zccl__now_ns();
    ZCCL_CHECK_GOTO(wait_ticket(z, z->ticket[i], fn), res, broken);
    z->st.fetch_wait_s += (double)(zccl__now_ns() - t0) * 1e-9;
    if (hit) z->st.prefetched++;
    z->held[layer] = i;
    z->pos = i + 1;
    if (z->hpz && z->first[layer] == i) { /* primary: keep this rank's slice for the layer's later positions */
        memcpy(z->sec[layer], (const char *)z->pbuf[i] + (size_t)z->local * sec_bytes(z, layer), sec_bytes(z, layer));
        z->sec_step[layer] = z->step;
        ZCCL_CHECK_GOTO(prefetch(z), res, broken); /* a secondary position may have been waiting for it */
    }
    *full = z->pbuf[i];
    goto out;
broken:
    set_broken(z, res);
out:
    pthread_mutex_unlock(&z->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_zero3_release(zccl_zero3_t z, int layer) {
    const char *fn = "zccl_zero3_release";
    ZCCL_CHECK(enter(z, fn, layer, true));
    zccl_result_t res = ZCCL_SUCCESS;
    const int i = z->held[layer];
    if (i < 0) {
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: step %d: layer %d is not fetched", fn, z->step, layer);
    } else {
        buf_put(z, z->pbuf[i]);
        z->pbuf[i] = NULL;
        z->live -= layer_bytes(z, layer);
        z->held[layer] = -1;
        res = prefetch(z);
        if (res != ZCCL_SUCCESS) set_broken(z, res);
    }
    pthread_mutex_unlock(&z->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_zero3_end(zccl_zero3_t z) {
    const char *fn = "zccl_zero3_end";
    ZCCL_CHECK(enter(z, fn, -1, true));
    zccl_result_t res = ZCCL_SUCCESS;
    if (z->recording) {
        res = agree(z, (uint64_t)z->nlayers, fn);
        if (res != ZCCL_SUCCESS) set_broken(z, res);
        z->recording = false;
    } else if (z->pos < z->nrec) {
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: step %d ended after %d fetches but step 1 recorded %d: fetch #%d "
                          "(layer %d) is missing", fn, z->step, z->pos, z->nrec, z->pos, z->rec[z->pos]);
    }
    /* Wait for gathers in flight, then drop every buffer of this step. */
    const uint64_t last = zccl__stream_issued(z->stream);
    while (zccl__stream_completed(z->stream) < last) pthread_cond_wait(&z->cv, &z->mu);
    stamp(z);
    for (int i = 0; i < z->next_issue && i < z->cap; i++) {
        if (!z->pbuf[i]) continue;
        buf_put(z, z->pbuf[i]);
        z->pbuf[i] = NULL;
        z->live -= layer_bytes(z, z->rec[i]);
    }
    for (int l = 0; l < z->nlayers; l++) z->held[l] = -1;
    z->open = false;
    z->st.steps++;
    pthread_mutex_unlock(&z->mu);
    zccl_result_t sr = zccl_stream_synchronize(z->stream);
    if (sr != ZCCL_SUCCESS && res == ZCCL_SUCCESS) {
        res = sr;
        pthread_mutex_lock(&z->mu);
        set_broken(z, sr);
        pthread_mutex_unlock(&z->mu);
    }
    return res;
}

ZCCL_API zccl_result_t zccl_zero3_stats(zccl_zero3_t z, zccl_zero3_stats_t *stats) {
    if (!z) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_zero3_stats: argument 'z' is NULL");
    if (!stats) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_zero3_stats: argument 'stats' is NULL");
    pthread_mutex_lock(&z->mu);
    *stats = z->st;
    stats->live_bytes = z->live;
    pthread_mutex_unlock(&z->mu);
    return ZCCL_SUCCESS;
}

/*
 * zero_offload.c — ZeRO-1/2 optimizer offload to the CPU (include/zccl_zero.h, "CPU offload"): this rank's
 * master shard and AdamW moments live in host memory (page-locked when a CUDA driver is present and the caller asks
 * for it); the reduced gradient shard is copied to host staging as soon as its bucket's collective completes (on
 * the bucket plan's stream thread, while the caller's backward continues; a device shard goes through the side
 * stream of zccl_ext.h), the AdamW step runs on the CPU, and the updated shard is copied back into the caller's
 * parameter buffer and all-gathered bucket by bucket (bucket b's all-gather runs while bucket b+1 is updated).
 *
 * The layer reaches host allocation and device copies only through zccl_ext.h (lib/api/offload_mem.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "zccl_ext.h"
#include "zero.h"

enum { OFF_MASTER, OFF_M, OFF_V, OFF_GSTAGE, OFF_PSTAGE, OFF_NBUF };

typedef struct {
    size_t lo, hi; /* elements [lo, hi) of a bucket's shard decay */
} decay_run_t;

struct zccl_zero_offload {
    struct zccl_bucket_plan *plan;
    pthread_mutex_t mu;
    int nb;
    zccl_datatype_t dt, mdt; /* parameters and gradients; master and moments */
    size_t es, ms;
    void **params;  /* per bucket: the caller's parameter buffer (elems elements, host or device) */
    int params_dev; /* 1: they are device memory (updated shards go through pstage) */
    size_t *sbase;  /* per bucket: element offset of its shard in master, m, v, gstage, pstage */
    size_t S;       /* elements of this rank's shard, all buckets */
    void *buf[OFF_NBUF];
    int pinned[OFF_NBUF];
    size_t bytes[OFF_NBUF];
    decay_run_t *runs; /* per bucket, runs[rstart[b] .. rstart[b+1]) */
    int *rstart;
    uint8_t *have;     /* per bucket: 1 the hook copied the plan's shard this window, 2 given by grad_shard */
    uint64_t stepped;  /* plan micro-step count at the last step (a finished window is stepped once) */
    zccl_zero_offload_stats_t st;
};

static size_t master_size(zccl_datatype_t dt) { return dt == ZCCL_FLOAT64 ? 8 : 4; }

static double load(const void *p, size_t i, zccl_datatype_t dt) {
    switch (dt) {
    case ZCCL_FLOAT64: return ((const double *)p)[i];
    case ZCCL_FLOAT32: return ((const float *)p)[i];
    case ZCCL_FLOAT16: return zccl_half_to_float(((const uint16_t *)p)[i]);
    case ZCCL_BFLOAT16: return zccl_bf16_to_float(((const uint16_t *)p)[i]);
    default: return 0;
    }
}

static void store(void *p, size_t i, zccl_datatype_t dt, double v) {
    switch (dt) {
    case ZCCL_FLOAT64: ((double *)p)[i] = v; break;
    case ZCCL_FLOAT32: ((float *)p)[i] = (float)v; break;
    case ZCCL_FLOAT16: ((uint16_t *)p)[i] = zccl_float_to_half((float)v); break;
    case ZCCL_BFLOAT16: ((uint16_t *)p)[i] = zccl_float_to_bf16((float)v); break;
    default: break;
    }
}

static size_t total_shard(const struct zccl_bucket_plan *p) {
    size_t s = 0;
    for (int b = 0; b < p->nbuckets; b++) s += p->b[b].shard;
    return s;
}

ZCCL_API zccl_result_t zccl_zero_offload_host_bytes(zccl_bucket_plan_t p, int params_on_device, size_t *state_bytes,
                                                    size_t *staging_bytes) {
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_zero_offload_host_bytes: argument 'plan' is NULL");
    const size_t S = total_shard(p), ms = master_size(p->dt);
    if (state_bytes) *state_bytes = 3 * S * ms;
    if (staging_bytes) *staging_bytes = S * p->es * (params_on_device ? 2 : 1);
    return ZCCL_SUCCESS;
}

/* Plan hook, under plan->mu, on the thread that retired bucket b (the plan's stream thread during backward). */
static void on_shard_final(void *arg, int b, const void *shard) {
    struct zccl_zero_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    int queued = 0;
    if (zccl__offload_copy((char *)o->buf[OFF_GSTAGE] + o->sbase[b] * o->es, shard, o->plan->b[b].shard * o->es,
                           &queued) == ZCCL_SUCCESS) {
        o->have[b] = 1;
        o->st.grad_copies_overlapped++;
        o->st.device_copies += (uint64_t)queued;
    } /* else: have[b] stays 0 and the step copies again, reporting the error there */
    pthread_mutex_unlock(&o->mu);
}

static void offload_free(struct zccl_zero_offload *o) {
    if (!o) return;
    for (int k = 0; k < OFF_NBUF; k++) zccl__offload_host_free(o->buf[k], o->pinned[k]);
    free(o->params);
    free(o->sbase);
    free(o->runs);
    free(o->rstart);
    free(o->have);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

ZCCL_API zccl_result_t zccl_zero_offload_create(zccl_bucket_plan_t plan, void *const *bucket_params,
                                                const size_t *decay_elems, const zccl_zero_offload_options_t *opts,
                                                zccl_zero_offload_t *out) {
    const char *fn = "zccl_zero_offload_create";
    if (!out) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'off' is NULL", fn);
    *out = NULL;
    if (!plan) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    if (!plan->comm)
        return zccl__error(ZCCL_INVALID_USAGE, "%s: the plan is a layout (zccl_bucket_layout_create) without a "
                           "communicator; use zccl_zero_offload_host_bytes for planning", fn);
    if (!bucket_params) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'bucket_params' is NULL", fn);
    struct zccl_bucket_plan *p = plan;
    for (int b = 0; b < p->nbuckets; b++)
        if (!bucket_params[b])
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: bucket_params[%d] is NULL", fn, b);
    if (decay_elems)
        for (int i = 0; i < p->nparams; i++)
            if (decay_elems[i] > p->numel[i])
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: decay_elems[%d] = %zu is more than the parameter's "
                                   "%zu elements", fn, i, decay_elems[i], p->numel[i]);
    const zccl_zero_offload_options_t oo = opts ? *opts : (zccl_zero_offload_options_t){0};
    /* The memory type of the parameters: all buckets alike. */
    int dev0 = 0;
    ZCCL_CHECK(zccl__offload_is_device(bucket_params[0], &dev0));
    for (int b = 1; b < p->nbuckets; b++) {
        int dev;
        ZCCL_CHECK(zccl__offload_is_device(bucket_params[b], &dev));
        if (dev != dev0)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: bucket_params[%d] is %s memory but bucket_params[0] is %s "
                               "memory; all buckets must be alike", fn, b, dev ? "device" : "host",
                               dev0 ? "device" : "host");
    }
    struct zccl_zero_offload *o = calloc(1, sizeof *o);
    if (!o) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory", fn);
    pthread_mutex_init(&o->mu, NULL);
    o->plan = p;
    o->nb = p->nbuckets;
    o->dt = p->dt;
    o->mdt = p->dt == ZCCL_FLOAT64 ? ZCCL_FLOAT64 : ZCCL_FLOAT32;
    o->es = p->es;
    o->ms = master_size(p->dt);
    o->params_dev = dev0;
    o->params = malloc((size_t)o->nb * sizeof *o->params);
    o->sbase = malloc((size_t)o->nb * sizeof *o->sbase);
    o->have = calloc((size_t)o->nb, 1);
    o->rstart = calloc((size_t)o->nb + 1, sizeof *o->rstart);
    o->runs = calloc((size_t)p->nparams + 1, sizeof *o->runs);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!o->params || !o->sbase || !o->have || !o->rstart || !o->runs) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %d buckets", fn, o->nb);
        goto fail;
    }
    for (int b = 0; b < o->nb; b++) {
        o->params[b] = bucket_params[b];
        o->sbase[b] = o->S;
        o->S += p->b[b].shard;
    }
    /* Decay runs, per bucket in shard coordinates: the parameters of bucket b lie at increasing offsets. */
    int nr = 0;
    for (int b = 0; b < o->nb; b++) {
        o->rstart[b] = nr;
        const size_t s0 = (size_t)p->rank * p->b[b].shard, s1 = s0 + p->b[b].shard;
        for (int k = 0; k < p->b[b].nparams; k++) {
            const int i = p->b[b].first_param - k;
            const size_t lo = p->p_off[i], hi = lo + (decay_elems ? decay_elems[i] : p->numel[i]);
            const size_t a = lo > s0 ? lo : s0, z = hi < s1 ? hi : s1;
            if (a < z) o->runs[nr++] = (decay_run_t){a - s0, z - s0};
        }
    }
    o->rstart[o->nb] = nr;
    const size_t sz[OFF_NBUF] = {o->S * o->ms, o->S * o->ms, o->S * o->ms, o->S * o->es, dev0 ? o->S * o->es : 0};
    for (int k = 0; k < OFF_NBUF; k++) {
        if (!sz[k]) continue;
        res = zccl__offload_host_alloc(&o->buf[k], sz[k], oo.pin_memory, &o->pinned[k]);
        if (res != ZCCL_SUCCESS) goto fail;
        o->bytes[k] = sz[k];
        if (o->pinned[k]) o->st.pinned_bytes += sz[k];
        if (k <= OFF_V) o->st.host_state_bytes += sz[k];
        else o->st.host_staging_bytes += sz[k];
    }
    /* The master shard starts as the parameters' shard (through the gradient staging buffer). */
    for (int b = 0; b < o->nb; b++) {
        void *g = (char *)o->buf[OFF_GSTAGE] + o->sbase[b] * o->es;
        res = zccl__offload_copy(g, (char *)o->params[b] + (size_t)p->rank * p->b[b].shard * o->es,
                                 p->b[b].shard * o->es, NULL);
        if (res != ZCCL_SUCCESS) goto fail;
    }
    if ((res = zccl__offload_copy_wait()) != ZCCL_SUCCESS) goto fail;
    for (size_t i = 0; i < o->S; i++) store(o->buf[OFF_MASTER], i, o->mdt, load(o->buf[OFF_GSTAGE], i, o->dt));
    pthread_mutex_lock(&p->mu);
    if (p->shard_final) {
        pthread_mutex_unlock(&p->mu);
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: the plan already has an offload; destroy it first", fn);
        goto fail;
    }
    if (p->open) {
        pthread_mutex_unlock(&p->mu);
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: a micro-step of the plan is open; create the offload between "
                          "micro-steps", fn);
        goto fail;
    }
    p->shard_final = on_shard_final;
    p->shard_final_arg = o;
    o->stepped = p->st.microsteps;
    pthread_mutex_unlock(&p->mu);
    *out = o;
    return ZCCL_SUCCESS;
fail:
    offload_free(o);
    return res;
}

ZCCL_API zccl_result_t zccl_zero_offload_destroy(zccl_zero_offload_t o) {
    if (!o) return ZCCL_SUCCESS;
    pthread_mutex_lock(&o->plan->mu);
    if (o->plan->shard_final_arg == o) {
        o->plan->shard_final = NULL;
        o->plan->shard_final_arg = NULL;
    }
    pthread_mutex_unlock(&o->plan->mu);
    (void)zccl__offload_copy_wait();
    offload_free(o);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_zero_offload_grad_shard(zccl_zero_offload_t o, int bucket, const void *shard) {
    const char *fn = "zccl_zero_offload_grad_shard";
    if (!o) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'off' is NULL", fn);
    if (bucket < 0 || bucket >= o->nb)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'bucket' = %d is outside [0, %d)", fn, bucket, o->nb);
    if (!shard) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'shard' is NULL", fn);
    pthread_mutex_lock(&o->mu);
    int queued = 0;
    zccl_result_t res = zccl__offload_copy((char *)o->buf[OFF_GSTAGE] + o->sbase[bucket] * o->es, shard,
                                           o->plan->b[bucket].shard * o->es, &queued);
    if (res == ZCCL_SUCCESS) {
        o->have[bucket] = 2;
        o->st.device_copies += (uint64_t)queued;
    }
    pthread_mutex_unlock(&o->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_zero_offload_step(zccl_zero_offload_t o, const zccl_zero_adamw_t *hp) {
    const char *fn = "zccl_zero_offload_step";
    if (!o) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'off' is NULL", fn);
    if (!hp) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'hp' is NULL", fn);
    if (!isfinite(hp->lr) || !isfinite(hp->weight_decay) || !isfinite(hp->grad_scale) || !(hp->eps > 0) ||
        !(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: hyperparameters out of range (lr %g, beta1 %g, beta2 %g, eps "
                           "%g, weight_decay %g, grad_scale %g): need finite values, betas in [0, 1), eps > 0", fn,
                           hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, hp->grad_scale);
    struct zccl_bucket_plan *p = o->plan;
    const uint64_t t0 = zccl__now_ns();
    /* Where each bucket's gradient comes from: the hook's copy of a finished sync window, grad_shard, or a copy of
     * the plan's shard now (an offload created after the window's buckets completed). */
    pthread_mutex_lock(&p->mu);
    zccl_result_t res = ZCCL_SUCCESS;
    const bool reduced = p->reduced && !p->open && p->err == ZCCL_SUCCESS;
    const uint64_t window = p->st.microsteps;
    if (p->err != ZCCL_SUCCESS)
        res = zccl__error(p->err, "%s: the plan is broken by an earlier error: %s", fn, p->errmsg);
    else if (p->open)
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: a micro-step of the plan is open; step after zccl_bucket_finish",
                          fn);
    pthread_mutex_unlock(&p->mu);
    if (res != ZCCL_SUCCESS) return res;
    pthread_mutex_lock(&o->mu);
    for (int b = 0; b < o->nb && res == ZCCL_SUCCESS; b++) {
        if (o->have[b] == 2) continue;
        if (!reduced)
            res = zccl__error(ZCCL_INVALID_USAGE, "%s: no gradient for bucket %d: no sync micro-step "
                              "(zccl_bucket_begin(plan, 1)) has finished since the last begin, and "
                              "zccl_zero_offload_grad_shard gave none", fn, b);
        else if (window == o->stepped)
            res = zccl__error(ZCCL_INVALID_USAGE, "%s: the gradient of the last finished window was already used "
                              "by a step (bucket %d); run another sync micro-step first", fn, b);
        else if (o->have[b] == 0) {
            res = zccl__offload_copy((char *)o->buf[OFF_GSTAGE] + o->sbase[b] * o->es,
                                     p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER
                                         ? p->acc[b] : (char *)p->buf[b] + (size_t)p->rank * p->b[b].shard * o->es,
                                     p->b[b].shard * o->es, NULL);
            o->st.grad_copies_at_step++;
        }
    }
    pthread_mutex_unlock(&o->mu);
    if (res == ZCCL_SUCCESS) res = zccl__offload_copy_wait();
    if (res != ZCCL_SUCCESS) return res;
    const uint64_t t1 = zccl__now_ns();
    pthread_mutex_lock(&o->mu); /* the counters, read by zccl_zero_offload_stats from any thread */
    o->st.copy_wait_s += (double)(t1 - t0) * 1e-9;
    const uint64_t t = ++o->st.steps;
    pthread_mutex_unlock(&o->mu);
    double cpu_s = 0;
    const double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, wd = hp->weight_decay, eps = hp->eps;
    const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    void *master = o->buf[OFF_MASTER], *m = o->buf[OFF_M], *v = o->buf[OFF_V], *g = o->buf[OFF_GSTAGE];
    for (int b = 0; b < o->nb && res == ZCCL_SUCCESS; b++) {
        const size_t n = p->b[b].shard, base = o->sbase[b], off = (size_t)p->rank * n;
        char *dst = o->params_dev ? (char *)o->buf[OFF_PSTAGE] + base * o->es : (char *)o->params[b] + off * o->es;
        const uint64_t tc = zccl__now_ns();
        int r = o->rstart[b];
        for (size_t i = 0; i < n; i++) {
            while (r < o->rstart[b + 1] && o->runs[r].hi <= i) r++;
            const bool decay = r < o->rstart[b + 1] && o->runs[r].lo <= i;
            const size_t k = base + i;
            const double gi = load(g, k, o->dt) * hp->grad_scale;
            const double mi = b1 * load(m, k, o->mdt) + (1.0 - b1) * gi;
            const double vi = b2 * load(v, k, o->mdt) + (1.0 - b2) * gi * gi;
            store(m, k, o->mdt, mi);
            store(v, k, o->mdt, vi);
            double pi = load(master, k, o->mdt);
            if (decay) pi -= lr * wd * pi;
            pi -= lr * (load(m, k, o->mdt) / bc1) / (sqrt(load(v, k, o->mdt) / bc2) + eps);
            store(master, k, o->mdt, pi);
            store(dst, i, o->dt, load(master, k, o->mdt));
        }
        cpu_s += (double)(zccl__now_ns() - tc) * 1e-9;
        char *full = o->params[b];
        if (o->params_dev) {
            res = zccl__offload_copy(full + off * o->es, dst, n * o->es, NULL);
            if (res == ZCCL_SUCCESS) res = zccl__offload_copy_wait();
        }
        /* The plan's stream is idle between finish and begin: the all-gathers queue on it and run while the next
         * bucket is updated. */
        if (res == ZCCL_SUCCESS) res = zccl_allgather(full + off * o->es, full, n, o->dt, p->comm, p->stream);
    }
    zccl_result_t sres = zccl_stream_synchronize(p->stream);
    if (res == ZCCL_SUCCESS) res = sres;
    pthread_mutex_lock(&o->mu);
    o->st.cpu_s += cpu_s;
    memset(o->have, 0, (size_t)o->nb);
    o->stepped = window;
    pthread_mutex_unlock(&o->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_zero_offload_master(zccl_zero_offload_t o, int bucket, void **master, void **exp_avg,
                                                void **exp_avg_sq, size_t *count) {
    const char *fn = "zccl_zero_offload_master";
    if (!o) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'off' is NULL", fn);
    if (bucket < 0 || bucket >= o->nb)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'bucket' = %d is outside [0, %d)", fn, bucket, o->nb);
    const size_t k = o->sbase[bucket] * o->ms;
    if (master) *master = (char *)o->buf[OFF_MASTER] + k;
    if (exp_avg) *exp_avg = (char *)o->buf[OFF_M] + k;
    if (exp_avg_sq) *exp_avg_sq = (char *)o->buf[OFF_V] + k;
    if (count) *count = o->plan->b[bucket].shard;
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_zero_offload_stats(zccl_zero_offload_t o, zccl_zero_offload_stats_t *stats) {
    if (!o) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_zero_offload_stats: argument 'off' is NULL");
    if (!stats) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_zero_offload_stats: argument 'stats' is NULL");
    pthread_mutex_lock(&o->mu);
    *stats = o->st;
    stats->params_on_device = o->params_dev;
    pthread_mutex_unlock(&o->mu);
    return ZCCL_SUCCESS;
}

/* shard.c — ZeRO stages 0-3 for zero_train over zccl collectives (see shard.h). */
#include "shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double *alloc0(size_t n)
{
    return calloc(n ? n : 1, sizeof(double));
}

static size_t round_up(size_t x, size_t m)
{
    return (x + m - 1) / m * m;
}

/* Bandwidth-optimal bytes one rank sends: all-reduce 2(N-1)/N S, reduce-scatter and all-gather (N-1)/N S. */
static double vol(const zt_zero_t *z, double factor, size_t elems)
{
    return factor * (double)(z->nranks - 1) / z->nranks * (double)elems * sizeof(double);
}

int zt_zero_init(zt_zero_t *z, zccl_comm_t comm, int stage, int ntensors, const char *const *names,
                 const size_t *numel, const int *decay, size_t first_bytes, size_t cap_bytes, size_t align_elems)
{
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->comm = comm;
    zccl_comm_rank(comm, &z->rank);
    zccl_comm_count(comm, &z->nranks);
    if (ntensors < 1 || ntensors > ZT_MAX_TENSORS) {
        fprintf(stderr, "zero_train: %d tensors (1..%d supported)\n", ntensors, ZT_MAX_TENSORS);
        return -1;
    }
    z->ntensors = ntensors;
    size_t pad = (size_t)z->nranks * (align_elems ? align_elems : 1);
    size_t off = 0, fill = 0;
    int b = 0;
    z->bucket_off[0] = 0;
    for (int t = ntensors - 1; t >= 0; t--) { /* reverse definition order: backward produces these first */
        z->name[t] = names[t];
        z->numel[t] = numel[t];
        z->decay[t] = decay[t];
        z->psi += numel[t];
        z->tensor_off[t] = off;
        z->tensor_bucket[t] = b;
        z->bucket_tensors[b]++;
        off += numel[t];
        fill += numel[t] * sizeof(double);
        size_t limit = b == 0 ? first_bytes : cap_bytes;
        if (fill >= limit || t == 0) {
            z->bucket_len[b] = round_up(off - z->bucket_off[b], pad);
            off = z->bucket_off[b] + z->bucket_len[b];
            z->shard_off[b] = z->shard;
            z->shard += z->bucket_len[b] / z->nranks;
            fill = 0;
            if (t > 0) {
                if (++b == ZT_MAX_BUCKETS) {
                    fprintf(stderr, "zero_train: more than %d buckets; raise --bucket-cap\n", ZT_MAX_BUCKETS);
                    return -1;
                }
                z->bucket_off[b] = off;
            }
        }
    }
    z->nbuckets = b + 1;
    z->flat = off;
    size_t nparams = stage == 3 ? z->shard : z->flat;
    size_t ngrads = stage >= 2 ? z->shard : z->flat;
    size_t nopt = stage >= 1 ? z->shard : z->flat;
    z->params = alloc0(nparams);
    z->grads = alloc0(ngrads);
    z->m = alloc0(nopt);
    z->v = alloc0(nopt);
    if (!z->params || !z->grads || !z->m || !z->v) {
        fprintf(stderr, "zero_train: out of memory for %zu parameters\n", z->flat);
        zt_zero_free(z);
        return -1;
    }
    return 0;
}

void zt_zero_free(zt_zero_t *z)
{
    free(z->params);
    free(z->grads);
    free(z->m);
    free(z->v);
    for (int b = 0; b < ZT_MAX_BUCKETS; b++) {
        free(z->gbuf[b]);
        free(z->pbuf[b]);
    }
    memset(z, 0, sizeof *z);
}

static void work_add(zt_zero_t *z, long delta)
{
    z->work_bytes += delta;
    if (z->work_bytes > z->work_peak) z->work_peak = z->work_bytes;
}

zccl_result_t zt_zero_set_params(zt_zero_t *z, const double *flat_on_root)
{
    double *full = z->stage == 3 ? alloc0(z->flat) : z->params;
    if (!full) return ZCCL_SYSTEM_ERROR;
    if (z->rank == 0) memcpy(full, flat_on_root, z->flat * sizeof(double));
    zccl_result_t r = zccl_broadcast(full, full, z->flat, ZCCL_FLOAT64, 0, z->comm, NULL);
    z->sent_other += z->rank == z->nranks - 1 ? 0.0 : (double)z->flat * sizeof(double); /* chain: all but last */
    if (z->stage == 3) {
        for (int b = 0; b < z->nbuckets; b++) {
            size_t sl = z->bucket_len[b] / z->nranks;
            memcpy(z->params + z->shard_off[b], full + z->bucket_off[b] + (size_t)z->rank * sl, sl * sizeof(double));
        }
        free(full);
    }
    return r;
}

void zt_zero_begin_step(zt_zero_t *z)
{
    memset(z->grads, 0, (z->stage >= 2 ? z->shard : z->flat) * sizeof(double));
}

void zt_zero_begin_micro(zt_zero_t *z, int last)
{
    z->boundary = last;
    memset(z->gready, 0, sizeof z->gready);
}

double *zt_zero_grad(zt_zero_t *z, int t)
{
    if (z->stage < 2) return z->grads + z->tensor_off[t]; /* accumulates locally across micro-steps */
    int b = z->tensor_bucket[t];
    if (!z->gbuf[b]) { /* a fresh bucket buffer per micro-step; freed once reduce-scattered */
        z->gbuf[b] = alloc0(z->bucket_len[b]);
        if (!z->gbuf[b]) {
            fprintf(stderr, "zero_train: out of memory for gradient bucket %d\n", b);
            exit(1);
        }
        work_add(z, (long)(z->bucket_len[b] * sizeof(double)));
    }
    return z->gbuf[b] + (z->tensor_off[t] - z->bucket_off[b]);
}

zccl_result_t zt_zero_grad_ready(zt_zero_t *z, int t)
{
    int b = z->tensor_bucket[t];
    if (++z->gready[b] < z->bucket_tensors[b]) return ZCCL_SUCCESS;
    size_t len = z->bucket_len[b], sl = len / z->nranks;
    if (z->stage < 2) { /* DP / ZeRO-1: one all-reduce per bucket at the accumulation boundary only */
        if (!z->boundary) return ZCCL_SUCCESS;
        double *g = z->grads + z->bucket_off[b];
        z->sent_grads += vol(z, 2.0, len);
        return zccl_allreduce(g, g, len, ZCCL_FLOAT64, ZCCL_SUM, z->comm, NULL);
    }
    /* ZeRO-2/3: reduce-scatter every micro-step, in place, then add this rank's slice into its accumulator. */
    double *g = z->gbuf[b];
    double *mine = g + (size_t)z->rank * sl;
    zccl_result_t r = zccl_reduce_scatter(g, mine, sl, ZCCL_FLOAT64, ZCCL_SUM, z->comm, NULL);
    z->sent_grads += vol(z, 1.0, len);
    if (r == ZCCL_SUCCESS) {
        double *acc = z->grads + z->shard_off[b];
        for (size_t i = 0; i < sl; i++) acc[i] += mine[i];
    }
    free(g);
    z->gbuf[b] = NULL;
    work_add(z, -(long)(len * sizeof(double)));
    return r;
}

zccl_result_t zt_zero_fetch(zt_zero_t *z, int t, const double **out)
{
    if (z->stage < 3) {
        *out = z->params + z->tensor_off[t];
        return ZCCL_SUCCESS;
    }
    int b = z->tensor_bucket[t];
    if (z->prefs[b]++ == 0) {
        size_t len = z->bucket_len[b], sl = len / z->nranks;
        z->pbuf[b] = malloc(len * sizeof(double));
        if (!z->pbuf[b]) {
            fprintf(stderr, "zero_train: out of memory gathering parameter bucket %d\n", b);
            exit(1);
        }
        work_add(z, (long)(len * sizeof(double)));
        z->sent_params += vol(z, 1.0, len);
        zccl_result_t r = zccl_allgather(z->params + z->shard_off[b], z->pbuf[b], sl, ZCCL_FLOAT64, z->comm, NULL);
        if (r != ZCCL_SUCCESS) return r;
    }
    *out = z->pbuf[b] + (z->tensor_off[t] - z->bucket_off[b]);
    return ZCCL_SUCCESS;
}

void zt_zero_release(zt_zero_t *z, int t)
{
    if (z->stage < 3) return;
    int b = z->tensor_bucket[t];
    if (--z->prefs[b] == 0) {
        free(z->pbuf[b]);
        z->pbuf[b] = NULL;
        work_add(z, -(long)(z->bucket_len[b] * sizeof(double)));
    }
}

zccl_result_t zt_zero_sum(zt_zero_t *z, double *vals, int n)
{
    z->sent_other += vol(z, 2.0, (size_t)n);
    return zccl_allreduce(vals, vals, (size_t)n, ZCCL_FLOAT64, ZCCL_SUM, z->comm, NULL);
}

/* Decay flag of flat element i (padding: none). */
static int decays(const zt_zero_t *z, size_t i)
{
    for (int t = 0; t < z->ntensors; t++)
        if (i >= z->tensor_off[t] && i < z->tensor_off[t] + z->numel[t]) return z->decay[t];
    return 0;
}

zccl_result_t zt_zero_step(zt_zero_t *z, double lr, double beta1, double beta2, double eps, double wd, double clip,
                           double global_batch, double *norm)
{
    int sharded = z->stage >= 1;
    /* Global gradient norm: stages 0/1 hold the whole reduced gradient; stages 2/3 sum squares over their shard
     * and add the ranks' partial sums with one scalar all-reduce. */
    double sq = 0.0;
    size_t ng = z->stage >= 2 ? z->shard : z->flat;
    for (size_t i = 0; i < ng; i++) sq += z->grads[i] * z->grads[i];
    if (z->stage >= 2) {
        zccl_result_t r = zt_zero_sum(z, &sq, 1);
        if (r != ZCCL_SUCCESS) return r;
    }
    *norm = sqrt(sq) / global_batch;
    double scale = 1.0 / global_batch;
    if (clip > 0.0 && *norm > clip) scale *= clip / (*norm + 1e-6);
    z->step++;
    double bc1 = 1.0 - pow(beta1, (double)z->step), bc2 = 1.0 - pow(beta2, (double)z->step);
    for (int b = 0; b < z->nbuckets; b++) {
        size_t sl = sharded ? z->bucket_len[b] / z->nranks : z->bucket_len[b];
        size_t flat0 = z->bucket_off[b] + (sharded ? (size_t)z->rank * sl : 0);
        size_t sh0 = sharded ? z->shard_off[b] : z->bucket_off[b];
        for (size_t j = 0; j < sl; j++) {
            size_t fi = flat0 + j, si = sh0 + j;
            double *p = z->stage == 3 ? &z->params[si] : &z->params[fi];
            double g = (z->stage >= 2 ? z->grads[si] : z->grads[fi]) * scale;
            double *m = &z->m[si], *v = &z->v[si];
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            if (decays(z, fi)) *p -= lr * wd * *p;
            *p -= lr * (*m / bc1) / (sqrt(*v / bc2) + eps);
        }
    }
    if (z->stage == 1 || z->stage == 2) { /* everyone needs the whole updated vector back */
        for (int b = 0; b < z->nbuckets; b++) {
            size_t sl = z->bucket_len[b] / z->nranks;
            double *pb = z->params + z->bucket_off[b];
            z->sent_params += vol(z, 1.0, z->bucket_len[b]);
            zccl_result_t r = zccl_allgather(pb + (size_t)z->rank * sl, pb, sl, ZCCL_FLOAT64, z->comm, NULL);
            if (r != ZCCL_SUCCESS) return r;
        }
    }
    return ZCCL_SUCCESS;
}

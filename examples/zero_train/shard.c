/* shard.c — zero_train's ZeRO stages over zccl_zero.h (see shard.h). */
#include "shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zccl_hier.h>

/* Bandwidth-optimal bytes one rank sends: all-reduce 2(N-1)/N S, reduce-scatter and all-gather (N-1)/N S. */
static double vol(const zt_zero_t *z, double factor, size_t elems)
{
    return factor * (double)(z->nranks - 1) / z->nranks * (double)elems * sizeof(double);
}

/* The same with a wire format: each rank sends its nranks - 1 encoded shards of elems / nranks elements per pass
 * (zccl_wire_bytes: header, scales, codes). */
static double wvol(const zt_zero_t *z, zccl_wire_t wire, double factor, size_t elems)
{
    if (wire == ZCCL_WIRE_FULL || z->nranks == 1) return vol(z, factor, elems);
    return factor * (double)(z->nranks - 1) * (double)zccl_wire_bytes(wire, elems / (size_t)z->nranks);
}

#define TRY(call)                                                                                                     \
    do {                                                                                                              \
        zccl_result_t r_ = (call);                                                                                    \
        if (r_ != ZCCL_SUCCESS) return r_;                                                                            \
    } while (0)

zccl_result_t zt_zero_init(zt_zero_t *z, zccl_comm_t comm, int stage, int nlayers, const size_t *numel,
                           const size_t *nweights, size_t first_bytes, size_t cap_bytes, int in_flight,
                           size_t max_live_bytes, zccl_wire_t grad_wire, zccl_wire_t weight_wire, int hpz,
                           int error_feedback)
{
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->grad_wire = grad_wire;
    z->weight_wire = weight_wire;
    z->comm = comm;
    z->nlayers = nlayers;
    TRY(zccl_comm_rank(comm, &z->rank));
    TRY(zccl_comm_count(comm, &z->nranks));
    for (int l = 0; l < nlayers; l++) {
        z->numel[l] = numel[l];
        z->nweights[l] = nweights[l];
        z->psi += numel[l];
    }
    zccl_bucket_options_t bo = {.first_bytes = first_bytes, .cap_bytes = cap_bytes, .max_in_flight = in_flight,
                                .mode = stage >= 2 ? ZCCL_BUCKET_REDUCE_SCATTER : ZCCL_BUCKET_ALLREDUCE,
                                .wire = grad_wire, .error_feedback = error_feedback};
    if (stage == 3) {
        /* One bucket per layer (every layer exceeds a 1-element target) without alignment padding beyond the
         * rank count: bucket shard r is then exactly the ZeRO-3 store's shard r of the layer. */
        bo.first_bytes = bo.cap_bytes = sizeof(double);
        bo.align_elems = 1;
    }
    TRY(zccl_bucket_plan_create(comm, nlayers, numel, ZCCL_FLOAT64, &bo, &z->plan));
    TRY(zccl_bucket_count(z->plan, &z->nbuckets));
    for (int b = 0; b < z->nbuckets; b++) {
        TRY(zccl_bucket_info(z->plan, b, &z->info[b]));
        z->bucket_base[b] = z->flat;
        z->shard_base[b] = z->shard;
        z->flat += z->info[b].elems;
        z->shard += z->info[b].shard_elems;
    }
    for (int l = 0; l < nlayers; l++) TRY(zccl_bucket_param_loc(z->plan, l, &z->bucket_of[l], &z->off_in_bucket[l]));
    if (stage == 3) {
        TRY(zccl_comm_split(comm, 0, 0, &z->comm3)); /* the store needs a communicator of its own (a duplicate) */
        zccl_zero3_options_t zo = {.max_live_bytes = max_live_bytes, .wire = weight_wire, .hpz = hpz};
        TRY(zccl_zero3_create(z->comm3, nlayers, numel, ZCCL_FLOAT64, &zo, &z->z3));
        if (hpz) { /* the store's host layout, for the byte counts: the same hosts as the hierarchical calls' */
            int nhosts = 1, per_host = 0;
            TRY(zccl_hier_layout(comm, &nhosts, &per_host, NULL));
            z->hpz_g = nhosts > 1 ? per_host : 0; /* one host: the store runs without hpZ */
            for (int l = 0; l < nlayers && z->hpz_g; l++)
                z->hpz_bytes += z->info[z->bucket_of[l]].elems / (size_t)z->hpz_g * sizeof(double);
        }
        for (int l = 0; l < nlayers; l++) {
            size_t count, off;
            const zccl_bucket_info_t *bi = &z->info[z->bucket_of[l]];
            TRY(zccl_zero3_shard(z->z3, l, NULL, &count, &off));
            if (bi->nparams != 1 || count != bi->shard_elems || off != bi->shard_offset) {
                fprintf(stderr, "zero_train: layer %d: ZeRO-3 shard [%zu, +%zu) differs from its gradient bucket's "
                        "[%zu, +%zu)\n", l, off, count, bi->shard_offset, bi->shard_elems);
                return ZCCL_INTERNAL_ERROR;
            }
        }
    } else {
        z->params = calloc(z->flat, sizeof(double));
        if (!z->params) return ZCCL_SYSTEM_ERROR;
    }
    size_t nopt = stage >= 1 ? z->shard : z->flat;
    z->m = calloc(nopt, sizeof(double));
    z->v = calloc(nopt, sizeof(double));
    return z->m && z->v ? ZCCL_SUCCESS : ZCCL_SYSTEM_ERROR;
}

zccl_result_t zt_zero_offload(zt_zero_t *z, int pin)
{
    if (z->stage != 1 && z->stage != 2) return ZCCL_INVALID_USAGE;
    void *bp[ZT_MAX_LAYERS];
    for (int b = 0; b < z->nbuckets; b++) bp[b] = z->params + z->bucket_base[b];
    zccl_zero_offload_options_t oo = {.pin_memory = pin};
    TRY(zccl_zero_offload_create(z->plan, bp, z->nweights, &oo, &z->off));
    free(z->m); /* the optimizer state now lives in the offload */
    free(z->v);
    z->m = z->v = NULL;
    return ZCCL_SUCCESS;
}

void zt_zero_free(zt_zero_t *z)
{
    zccl_zero_offload_destroy(z->off);
    zccl_zero3_destroy(z->z3);
    zccl_bucket_plan_destroy(z->plan);
    if (z->comm3) zccl_comm_destroy(z->comm3);
    for (int l = 0; l < ZT_MAX_LAYERS; l++) free(z->eval[l]);
    free(z->params);
    free(z->m);
    free(z->v);
    memset(z, 0, sizeof *z);
}

zccl_result_t zt_zero_set_params(zt_zero_t *z, double *const *full_on_root)
{
    for (int l = 0; l < z->nlayers; l++) {
        double *buf = malloc(z->numel[l] * sizeof(double));
        if (!buf) return ZCCL_SYSTEM_ERROR;
        if (z->rank == 0) memcpy(buf, full_on_root[l], z->numel[l] * sizeof(double));
        zccl_result_t r = zccl_broadcast(buf, buf, z->numel[l], ZCCL_FLOAT64, 0, z->comm, NULL);
        /* pipelined chain: every rank but the last of the chain forwards the vector once */
        z->sent_other += (double)z->numel[l] * sizeof(double) * (z->nranks - 1) / z->nranks;
        if (r == ZCCL_SUCCESS && z->stage == 3) {
            double *shard;
            size_t count, off;
            r = zccl_zero3_shard(z->z3, l, (void **)&shard, &count, &off);
            for (size_t i = 0; r == ZCCL_SUCCESS && i < count; i++)
                shard[i] = off + i < z->numel[l] ? buf[off + i] : 0.0;
        } else if (r == ZCCL_SUCCESS) {
            memcpy(z->params + z->bucket_base[z->bucket_of[l]] + z->off_in_bucket[l], buf,
                   z->numel[l] * sizeof(double));
        }
        free(buf);
        TRY(r);
    }
    return ZCCL_SUCCESS;
}

zccl_result_t zt_zero_begin_micro(zt_zero_t *z, int last)
{
    TRY(zccl_bucket_begin(z->plan, last));
    if (z->stage < 2) {
        if (last) /* all-reduce mode communicates only at the boundary: one all-reduce per bucket */
            for (int b = 0; b < z->nbuckets; b++) z->sent_grads += wvol(z, z->grad_wire, 2.0, z->info[b].elems);
    } else {
        for (int b = 0; b < z->nbuckets; b++) z->sent_grads += wvol(z, z->grad_wire, 1.0, z->info[b].elems);
    }
    if (z->stage == 3) {
        TRY(zccl_zero3_begin(z->z3));
        memset(z->fetched, 0, sizeof z->fetched);
    }
    return ZCCL_SUCCESS;
}

zccl_result_t zt_zero_end_micro(zt_zero_t *z)
{
    zccl_result_t r = zccl_bucket_finish(z->plan);
    if (z->stage == 3) {
        zccl_result_t r3 = zccl_zero3_end(z->z3);
        if (r == ZCCL_SUCCESS) r = r3;
    }
    return r;
}

zccl_result_t zt_zero_fetch(zt_zero_t *z, int l, const double **full)
{
    if (z->stage < 3) {
        *full = z->params + z->bucket_base[z->bucket_of[l]] + z->off_in_bucket[l];
        return ZCCL_SUCCESS;
    }
    void *p;
    TRY(zccl_zero3_fetch(z->z3, l, &p));
    const size_t elems = z->info[z->bucket_of[l]].elems;
    if (z->hpz_g && z->fetched[l]) { /* hpZ: gathered inside the host, full precision, among G ranks */
        const double v = (double)(z->hpz_g - 1) / z->hpz_g * (double)elems * sizeof(double);
        z->sent_params += v;
        z->sent_params_host += v;
    } else {
        z->sent_params += wvol(z, z->weight_wire, 1.0, elems);
    }
    z->fetched[l] = 1;
    *full = p;
    return ZCCL_SUCCESS;
}

zccl_result_t zt_zero_release(zt_zero_t *z, int l)
{
    return z->stage < 3 ? ZCCL_SUCCESS : zccl_zero3_release(z->z3, l);
}

zccl_result_t zt_zero_grad(zt_zero_t *z, int l, double **grad)
{
    return zccl_bucket_grad_ptr(z->plan, l, (void **)grad);
}

zccl_result_t zt_zero_grad_ready(zt_zero_t *z, int l)
{
    return zccl_bucket_mark_ready(z->plan, l);
}

zccl_result_t zt_zero_eval_fetch(zt_zero_t *z, int l, const double **full)
{
    if (z->stage < 3) return zt_zero_fetch(z, l, full);
    const zccl_bucket_info_t *bi = &z->info[z->bucket_of[l]];
    if (!z->eval[l] && !(z->eval[l] = malloc(bi->elems * sizeof(double)))) return ZCCL_SYSTEM_ERROR;
    void *shard;
    TRY(zccl_zero3_shard(z->z3, l, &shard, NULL, NULL));
    z->sent_other += vol(z, 1.0, bi->elems);
    TRY(zccl_allgather(shard, z->eval[l], bi->shard_elems, ZCCL_FLOAT64, z->comm3, NULL));
    *full = z->eval[l];
    return ZCCL_SUCCESS;
}

zccl_result_t zt_zero_sum(zt_zero_t *z, double *vals, int n)
{
    z->sent_other += vol(z, 2.0, (size_t)n);
    return zccl_allreduce(vals, vals, (size_t)n, ZCCL_FLOAT64, ZCCL_SUM, z->comm, NULL);
}

/* Weight decay of element j of bucket b: inside a layer's first nweights elements. */
static int decays(const zt_zero_t *z, int b, size_t j)
{
    for (int l = 0; l < z->nlayers; l++)
        if (z->bucket_of[l] == b && j >= z->off_in_bucket[l] && j < z->off_in_bucket[l] + z->nweights[l]) return 1;
    return 0;
}

zccl_result_t zt_zero_step(zt_zero_t *z, double lr, double beta1, double beta2, double eps, double wd, double clip,
                           double global_batch, double *norm)
{
    double sumnorm;
    TRY(zccl_bucket_grad_norm(z->plan, &sumnorm)); /* of the summed gradient: each rank's shards + 1 all-reduce */
    z->sent_other += vol(z, 2.0, 1);
    *norm = sumnorm / global_batch;
    double scale = 1.0 / global_batch;
    if (clip > 0.0 && *norm > clip) scale *= clip / (*norm + 1e-6);
    z->step++;
    if (z->off) { /* CPU offload: the library updates its host shard and all-gathers the parameters */
        zccl_zero_adamw_t hp = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd,
                                .grad_scale = scale};
        TRY(zccl_zero_offload_step(z->off, &hp));
        for (int b = 0; b < z->nbuckets; b++) z->sent_params += vol(z, 1.0, z->info[b].elems);
        return ZCCL_SUCCESS;
    }
    double bc1 = 1.0 - pow(beta1, (double)z->step), bc2 = 1.0 - pow(beta2, (double)z->step);
    for (int b = 0; b < z->nbuckets; b++) {
        const zccl_bucket_info_t *bi = &z->info[b];
        /* stage 0 updates the whole bucket from the all-reduced buffer; stages 1-3 their shard only */
        size_t j0 = z->stage == 0 ? 0 : bi->shard_offset, n = z->stage == 0 ? bi->elems : bi->shard_elems;
        const double *g = z->stage == 0 ? (const double *)bi->buffer : (const double *)bi->shard;
        double *p, *m = z->m + (z->stage == 0 ? z->bucket_base[b] : z->shard_base[b]);
        double *v = z->v + (z->stage == 0 ? z->bucket_base[b] : z->shard_base[b]);
        if (z->stage == 3) {
            int layer = bi->first_param; /* one layer per bucket */
            TRY(zccl_zero3_shard(z->z3, layer, (void **)&p, NULL, NULL));
        } else {
            p = z->params + z->bucket_base[b] + j0;
        }
        for (size_t i = 0; i < n; i++) {
            double gi = g[i] * scale;
            m[i] = beta1 * m[i] + (1.0 - beta1) * gi;
            v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi;
            if (decays(z, b, j0 + i)) p[i] -= lr * wd * p[i];
            p[i] -= lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + eps);
        }
    }
    if (z->stage == 1 || z->stage == 2) { /* every rank needs the whole updated vector back */
        for (int b = 0; b < z->nbuckets; b++) {
            const zccl_bucket_info_t *bi = &z->info[b];
            double *pb = z->params + z->bucket_base[b];
            z->sent_params += vol(z, 1.0, bi->elems);
            TRY(zccl_allgather(pb + bi->shard_offset, pb, bi->shard_elems, ZCCL_FLOAT64, z->comm, NULL));
        }
    }
    return ZCCL_SUCCESS;
}

void zt_zero_memory(const zt_zero_t *z, size_t *params, size_t *grads, size_t *opt, size_t *work)
{
    size_t full = 0, shard = 0;
    zccl_bucket_buffer_bytes(z->plan, &full, &shard);
    *params = (z->stage == 3 ? z->shard : z->flat) * sizeof(double);
    *grads = z->stage >= 2 ? shard : full;
    *opt = 2 * (z->stage >= 1 ? z->shard : z->flat) * sizeof(double);
    if (z->off) *opt = 0; /* on the host: zt_zero_report prints it */
    *work = z->stage >= 2 ? full : 0;
    if (z->stage == 3) {
        zccl_zero3_stats_t st;
        if (zccl_zero3_stats(z->z3, &st) == ZCCL_SUCCESS) *work += st.peak_live_bytes;
    }
}

void zt_zero_report(const zt_zero_t *z, FILE *f)
{
    zccl_bucket_stats_t bs;
    if (zccl_bucket_stats(z->plan, &bs) == ZCCL_SUCCESS)
        fprintf(f, "bucket scheduler: %llu bucket collectives in %llu micro-steps, at most %d in flight; "
                   "communication %.3f s, of which exposed at finish %.3f s, waiting for a bucket buffer %.3f s; "
                   "%d registered bucket buffers\n",
                (unsigned long long)bs.launches, (unsigned long long)bs.microsteps, bs.peak_in_flight, bs.comm_s,
                bs.finish_wait_s, bs.grad_wait_s, bs.registered_buffers);
    zccl_zero_offload_stats_t os;
    if (z->off && zccl_zero_offload_stats(z->off, &os) == ZCCL_SUCCESS)
        fprintf(f, "CPU offload: host optimizer state %zu bytes + staging %zu bytes (%zu pinned); %llu steps, "
                   "%llu gradient shards copied during backward, %llu at the step, %llu device copies; "
                   "waiting for copies %.3f s, CPU update %.3f s\n",
                os.host_state_bytes, os.host_staging_bytes, os.pinned_bytes, (unsigned long long)os.steps,
                (unsigned long long)os.grad_copies_overlapped, (unsigned long long)os.grad_copies_at_step,
                (unsigned long long)os.device_copies, os.copy_wait_s, os.cpu_s);
    zccl_zero3_stats_t st;
    if (z->z3 && zccl_zero3_stats(z->z3, &st) == ZCCL_SUCCESS)
        fprintf(f, "ZeRO-3 store: %llu layer all-gathers (%llu prefetched before their fetch; %llu inside the host "
                   "from the hpZ partition), gathering %.3f s, exposed %.3f s; peak gathered %zu bytes (limit %zu)\n",
                (unsigned long long)st.gathers, (unsigned long long)st.prefetched,
                (unsigned long long)st.hpz_gathers, st.gather_s, st.fetch_wait_s, st.peak_live_bytes,
                st.max_live_bytes);
}

/*
 * zero_grad.c — what a plan offers after a sync micro-step: the global gradient norm (each rank's shard summed in
 * float64, one scalar all-reduce) and scaling of the shards for clipping; element helpers for the four floating
 * types.
 */
#include <stdio.h>
#include <math.h>
#include <string.h>
#include "kernels.h"
#include "zero.h"

double zccl__zero_sumsq(const void *p, size_t n, zccl_datatype_t dt) {
    double s = 0;
    switch (dt) {
    case ZCCL_FLOAT32: {
        const float *x = p;
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        break;
    }
    case ZCCL_FLOAT64: {
        const double *x = p;
        for (size_t i = 0; i < n; i++) s += x[i] * x[i];
        break;
    }
    case ZCCL_FLOAT16: {
        const uint16_t *x = p;
        for (size_t i = 0; i < n; i++) { double v = zccl_half_to_float(x[i]); s += v * v; }
        break;
    }
    case ZCCL_BFLOAT16: {
        const uint16_t *x = p;
        for (size_t i = 0; i < n; i++) { double v = zccl_bf16_to_float(x[i]); s += v * v; }
        break;
    }
    default: break;
    }
    return s;
}

void zccl__zero_scale(void *p, size_t n, zccl_datatype_t dt, double f) {
    switch (dt) {
    case ZCCL_FLOAT32: {
        float *x = p;
        const float ff = (float)f;
        for (size_t i = 0; i < n; i++) x[i] *= ff;
        break;
    }
    case ZCCL_FLOAT64: {
        double *x = p;
        for (size_t i = 0; i < n; i++) x[i] *= f;
        break;
    }
    case ZCCL_FLOAT16: {
        uint16_t *x = p;
        for (size_t i = 0; i < n; i++) x[i] = zccl_float_to_half((float)(zccl_half_to_float(x[i]) * f));
        break;
    }
    case ZCCL_BFLOAT16: {
        uint16_t *x = p;
        for (size_t i = 0; i < n; i++) x[i] = zccl_float_to_bf16((float)(zccl_bf16_to_float(x[i]) * f));
        break;
    }
    default: break;
    }
}

void zccl__zero_ef_add(void *p, size_t n, zccl_datatype_t dt, const float *e) {
    switch (dt) {
    case ZCCL_FLOAT32: {
        float *x = p;
        for (size_t i = 0; i < n; i++) x[i] += e[i];
        break;
    }
    case ZCCL_FLOAT64: {
        double *x = p;
        for (size_t i = 0; i < n; i++) x[i] += e[i];
        break;
    }
    case ZCCL_FLOAT16: {
        uint16_t *x = p;
        for (size_t i = 0; i < n; i++) x[i] = zccl_float_to_half((float)((double)zccl_half_to_float(x[i]) + e[i]));
        break;
    }
    case ZCCL_BFLOAT16: {
        uint16_t *x = p;
        for (size_t i = 0; i < n; i++) x[i] = zccl_float_to_bf16((float)((double)zccl_bf16_to_float(x[i]) + e[i]));
        break;
    }
    default: break;
    }
}

static inline float ef_diff(double x, float q) {
    const double d = x - (double)q;
    return isfinite(d) ? (float)d : 0.0f;
}

void zccl__zero_ef_residual(const void *p, size_t n, zccl_datatype_t dt, const float *q, float *e) {
    switch (dt) {
    case ZCCL_FLOAT32: {
        const float *x = p;
        for (size_t i = 0; i < n; i++) e[i] = ef_diff(x[i], q[i]);
        break;
    }
    case ZCCL_FLOAT64: {
        const double *x = p;
        for (size_t i = 0; i < n; i++) e[i] = ef_diff(x[i], q[i]);
        break;
    }
    case ZCCL_FLOAT16: {
        const uint16_t *x = p;
        for (size_t i = 0; i < n; i++) e[i] = ef_diff(zccl_half_to_float(x[i]), q[i]);
        break;
    }
    case ZCCL_BFLOAT16: {
        const uint16_t *x = p;
        for (size_t i = 0; i < n; i++) e[i] = ef_diff(zccl_bf16_to_float(x[i]), q[i]);
        break;
    }
    default: break;
    }
}

static void *shard_ptr(struct zccl_bucket_plan *p, int b) {
    if (p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER) return p->acc[b];
    return (char *)p->buf[b] + (size_t)p->rank * p->b[b].shard * p->es;
}

/* Checks that a reduced gradient is available; returns with p->mu held on success. */
static zccl_result_t enter_reduced(struct zccl_bucket_plan *p, const char *fn) {
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    if (!p->comm)
        return zccl__error(ZCCL_INVALID_USAGE, "%s: the plan is a layout (zccl_bucket_layout_create) without buffers",
                           fn);
    pthread_mutex_lock(&p->mu);
    zccl_result_t res = ZCCL_SUCCESS;
    if (p->err != ZCCL_SUCCESS)
        res = zccl__error(p->err, "%s: the plan is broken by an earlier error: %s", fn, p->errmsg);
    else if (p->open)
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: a micro-step is open; call it after zccl_bucket_finish", fn);
    else if (!p->reduced)
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: no sync micro-step (zccl_bucket_begin(plan, 1)) has finished "
                          "since the last begin: there is no reduced gradient", fn);
    if (res != ZCCL_SUCCESS) pthread_mutex_unlock(&p->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_bucket_grad_norm(zccl_bucket_plan_t p, double *norm) {
    const char *fn = "zccl_bucket_grad_norm";
    if (!norm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'norm' is NULL", fn);
    ZCCL_CHECK(enter_reduced(p, fn));
    double local = 0, global = 0;
    for (int b = 0; b < p->nbuckets; b++) local += zccl__zero_sumsq(shard_ptr(p, b), p->b[b].shard, p->dt);
    pthread_mutex_unlock(&p->mu);
    /* The plan's stream is idle between finish and begin: the one scalar all-reduce goes on it, in order. */
    zccl_result_t res = zccl_allreduce(&local, &global, 1, ZCCL_FLOAT64, ZCCL_SUM, p->comm, p->stream);
    if (res == ZCCL_SUCCESS) res = zccl_stream_synchronize(p->stream);
    if (res != ZCCL_SUCCESS) {
        pthread_mutex_lock(&p->mu);
        if (p->err == ZCCL_SUCCESS) {
            p->err = res;
            snprintf(p->errmsg, sizeof p->errmsg, "%s", zccl__last_error());
        }
        pthread_mutex_unlock(&p->mu);
        return res;
    }
    *norm = sqrt(global);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_scale_shards(zccl_bucket_plan_t p, double factor) {
    const char *fn = "zccl_bucket_scale_shards";
    if (!isfinite(factor))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'factor' = %g is not finite", fn, factor);
    ZCCL_CHECK(enter_reduced(p, fn));
    for (int b = 0; b < p->nbuckets; b++) zccl__zero_scale(shard_ptr(p, b), p->b[b].shard, p->dt, factor);
    pthread_mutex_unlock(&p->mu);
    return ZCCL_SUCCESS;
}

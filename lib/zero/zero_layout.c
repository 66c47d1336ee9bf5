/*
 * zero_layout.c — gradient bucket plans: options, the bucket layout (reverse definition order, a small first
 * bucket then a cap, aligned and padded so every rank's shard has the same size) and the layout queries.
 * The layout rule follows PyTorch DDP's bucketing (Li et al., VLDB 2020); see include/zccl_zero.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "zccl_ext.h"
#include "zero.h"

uint64_t zccl__zero_hash(uint64_t h, const void *data, size_t len) {
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

zccl_result_t zccl__zero_same_on_all(zccl_comm_t comm, uint64_t h, bool *same) {
    uint64_t v[2] = {h, ~h}, r[2] = {0, 0};
    ZCCL_CHECK(zccl_allreduce(v, r, 2, ZCCL_UINT64, ZCCL_MAX, comm, NULL));
    *same = (r[0] == ~r[1]); /* max == min */
    return ZCCL_SUCCESS;
}

static bool is_float(zccl_datatype_t dt) {
    return dt == ZCCL_FLOAT32 || dt == ZCCL_FLOAT64 || dt == ZCCL_FLOAT16 || dt == ZCCL_BFLOAT16;
}

/* Resolves options (0 = the setting's value) and validates the common arguments. */
static zccl_result_t resolve(struct zccl_bucket_plan *p, const char *fn, int nparams, const size_t *numel,
                             zccl_datatype_t dt, const zccl_bucket_options_t *opts, zccl_bucket_plan_t *out) {
    if (!out) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    *out = NULL;
    if (nparams < 1) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'nparams' = %d must be >= 1", fn, nparams);
    if (!numel) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'numel' is NULL", fn);
    for (int i = 0; i < nparams; i++)
        if (numel[i] == 0)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: numel[%d] = 0: every parameter needs at least one element",
                               fn, i);
    if (!is_float(dt))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'datatype' = %d is not a floating type (float32, "
                           "float64, float16 or bfloat16)", fn, (int)dt);
    zccl_bucket_options_t o = opts ? *opts : (zccl_bucket_options_t){0};
    if (o.mode != ZCCL_BUCKET_ALLREDUCE && o.mode != ZCCL_BUCKET_REDUCE_SCATTER)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->mode = %d is not a zccl_bucket_mode_t", fn, (int)o.mode);
    if (o.max_in_flight < 0 || o.max_in_flight > ZCCL_BUCKET_MAX_IN_FLIGHT)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->max_in_flight = %d is outside [0, %d]", fn,
                           o.max_in_flight, ZCCL_BUCKET_MAX_IN_FLIGHT);
    if ((unsigned)o.wire >= ZCCL_NUM_WIRES)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->wire = %d is not a zccl_wire_t", fn, (int)o.wire);
    if (o.error_feedback != 0 && o.error_feedback != 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->error_feedback = %d must be 0 or 1", fn,
                           o.error_feedback);
    if (o.error_feedback && o.wire == ZCCL_WIRE_FULL)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: opts->error_feedback = 1 with opts->wire = ZCCL_WIRE_FULL: "
                           "error feedback carries the residual of a quantized wire (int8, int4, fp8e4m3, fp8e5m2) "
                           "to the next step; the full wire has none to carry", fn);
    int64_t v;
    if (o.first_bytes == 0) {
        ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_BUCKET_FIRST_BYTES, &v));
        o.first_bytes = (size_t)v;
    }
    if (o.cap_bytes == 0) {
        ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_BUCKET_CAP_BYTES, &v));
        o.cap_bytes = (size_t)v;
    }
    if (o.max_in_flight == 0) {
        ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_BUCKETS_IN_FLIGHT, &v));
        o.max_in_flight = (int)v;
    }
    p->es = zccl_type_size(dt);
    if (o.align_elems == 0) o.align_elems = ZCCL_CACHELINE / p->es;
    p->dt = dt;
    p->o = o;
    return ZCCL_SUCCESS;
}

static size_t round_up(size_t x, size_t m, bool *ok) {
    size_t r = x % m;
    if (r == 0) return x;
    if (x > SIZE_MAX - (m - r)) { *ok = false; return x; }
    return x + (m - r);
}

zccl_result_t zccl__bucket_layout(struct zccl_bucket_plan *p, int nparams, const size_t *numel) {
    p->nparams = nparams;
    p->numel = malloc((size_t)nparams * sizeof *p->numel);
    p->p_bucket = malloc((size_t)nparams * sizeof *p->p_bucket);
    p->p_off = malloc((size_t)nparams * sizeof *p->p_off);
    p->b = malloc((size_t)nparams * sizeof *p->b); /* at most one bucket per parameter */
    if (!p->numel || !p->p_bucket || !p->p_off || !p->b)
        return zccl__error(ZCCL_SYSTEM_ERROR, "bucket plan: out of memory for %d parameters", nparams);
    memcpy(p->numel, numel, (size_t)nparams * sizeof *numel);
    const size_t al = p->o.align_elems;
    size_t gran;
    bool ok = zccl__mul_ok(al, (size_t)p->nranks, &gran);
    int nb = 0;
    size_t used = 0; /* elements used by the open bucket nb (end of its last parameter) */
    p->b[0] = (zb_bucket_t){.first_param = nparams - 1, .nparams = 0};
    for (int i = nparams - 1; i >= 0 && ok; i--) {
        const size_t target = (nb == 0 ? p->o.first_bytes : p->o.cap_bytes) / p->es;
        size_t start = round_up(used, al, &ok), end;
        if (!ok || __builtin_add_overflow(start, numel[i], &end)) { ok = false; break; }
        if (p->b[nb].nparams > 0 && end > target) { /* close the open bucket; this parameter starts the next */
            p->b[nb].used = used;
            nb++;
            p->b[nb] = (zb_bucket_t){.first_param = i, .nparams = 0};
            start = 0;
            end = numel[i];
        }
        p->b[nb].nparams++;
        p->p_bucket[i] = nb;
        p->p_off[i] = start;
        used = end;
    }
    p->b[nb].used = used;
    nb++;
    p->nbuckets = nb;
    p->max_elems = 0;
    for (int b = 0; b < nb && ok; b++) {
        p->b[b].elems = round_up(p->b[b].used, gran, &ok);
        p->b[b].shard = p->b[b].elems / (size_t)p->nranks;
        size_t bytes;
        if (!zccl__mul_ok(p->b[b].elems, p->es, &bytes) || bytes > SIZE_MAX / 4) ok = false;
        if (p->b[b].elems > p->max_elems) p->max_elems = p->b[b].elems;
    }
    if (!ok)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "bucket plan: the parameters' total size overflows the address "
                           "space (alignment %zu elements, %d ranks)", al, p->nranks);
    return ZCCL_SUCCESS;
}

static void plan_free(struct zccl_bucket_plan *p) {
    if (!p) return;
    if (p->comm) zccl__bucket_sched_free(p);
    free(p->numel);
    free(p->p_bucket);
    free(p->p_off);
    free(p->b);
    free(p);
}

ZCCL_API zccl_result_t zccl_bucket_layout_create(int nranks, int nparams, const size_t *numel, zccl_datatype_t datatype,
                                                 const zccl_bucket_options_t *opts, zccl_bucket_plan_t *plan) {
    const char *fn = "zccl_bucket_layout_create";
    if (plan) *plan = NULL;
    if (nranks < 1 || nranks > 65536)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'nranks' = %d is outside [1, 65536]", fn, nranks);
    struct zccl_bucket_plan *p = calloc(1, sizeof *p);
    if (!p) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory", fn);
    p->nranks = nranks;
    zccl_result_t res = resolve(p, fn, nparams, numel, datatype, opts, plan);
    if (res == ZCCL_SUCCESS) res = zccl__bucket_layout(p, nparams, numel);
    if (res != ZCCL_SUCCESS) { plan_free(p); return res; }
    *plan = p;
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_plan_create(zccl_comm_t comm, int nparams, const size_t *numel,
                                               zccl_datatype_t datatype, const zccl_bucket_options_t *opts,
                                               zccl_bucket_plan_t *plan) {
    const char *fn = "zccl_bucket_plan_create";
    if (plan) *plan = NULL;
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    struct zccl_bucket_plan *p = calloc(1, sizeof *p);
    if (!p) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory", fn);
    zccl_comm_count(comm, &p->nranks);
    zccl_comm_rank(comm, &p->rank);
    zccl_result_t res = resolve(p, fn, nparams, numel, datatype, opts, plan);
    if (res == ZCCL_SUCCESS) res = zccl__bucket_layout(p, nparams, numel);
    if (res != ZCCL_SUCCESS) { plan_free(p); return res; }
    /* Every rank must have the same layout, or buckets would not match: hash what defines it. */
    uint64_t h = 1469598103934665603ull;
    h = zccl__zero_hash(h, &nparams, sizeof nparams);
    h = zccl__zero_hash(h, numel, (size_t)nparams * sizeof *numel);
    int32_t fields[5] = {(int32_t)datatype, (int32_t)p->o.mode, p->o.average != 0, (int32_t)p->o.wire,
                         p->o.error_feedback};
    h = zccl__zero_hash(h, fields, sizeof fields);
    size_t sizes[3] = {p->o.first_bytes, p->o.cap_bytes, p->o.align_elems};
    h = zccl__zero_hash(h, sizes, sizeof sizes);
    bool same = false;
    res = zccl__zero_same_on_all(comm, h, &same);
    if (res == ZCCL_SUCCESS && !same)
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: ranks passed different parameter lists, datatypes or options "
                          "(rank %d: %d parameters, %d buckets); buckets would not match", fn, p->rank, nparams,
                          p->nbuckets);
    if (res == ZCCL_SUCCESS) {
        p->comm = comm;
        res = zccl__bucket_sched_init(p);
    }
    if (res != ZCCL_SUCCESS) { plan_free(p); return res; }
    *plan = p;
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_plan_destroy(zccl_bucket_plan_t plan) {
    plan_free(plan);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_count(zccl_bucket_plan_t p, int *nbuckets) {
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_bucket_count: argument 'plan' is NULL");
    if (!nbuckets) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_bucket_count: argument 'nbuckets' is NULL");
    *nbuckets = p->nbuckets;
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_info(zccl_bucket_plan_t p, int bucket, zccl_bucket_info_t *info) {
    const char *fn = "zccl_bucket_info";
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    if (!info) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'info' is NULL", fn);
    if (bucket < 0 || bucket >= p->nbuckets)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'bucket' = %d is outside [0, %d)", fn, bucket,
                           p->nbuckets);
    const zb_bucket_t *b = &p->b[bucket];
    *info = (zccl_bucket_info_t){.first_param = b->first_param, .nparams = b->nparams, .used_elems = b->used,
                                 .elems = b->elems, .shard_elems = b->shard,
                                 .shard_offset = (size_t)p->rank * b->shard};
    if (p->comm) {
        if (p->o.mode == ZCCL_BUCKET_ALLREDUCE) {
            info->buffer = p->buf[bucket];
            info->shard = (char *)p->buf[bucket] + info->shard_offset * p->es;
        } else {
            info->shard = p->acc[bucket];
        }
    }
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_param_loc(zccl_bucket_plan_t p, int param, int *bucket, size_t *offset) {
    const char *fn = "zccl_bucket_param_loc";
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    if (param < 0 || param >= p->nparams)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'param' = %d is outside [0, %d)", fn, param,
                           p->nparams);
    if (bucket) *bucket = p->p_bucket[param];
    if (offset) *offset = p->p_off[param];
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_buffer_bytes(zccl_bucket_plan_t p, size_t *full_bytes, size_t *shard_bytes) {
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_bucket_buffer_bytes: argument 'plan' is NULL");
    size_t full = 0, shard = 0;
    if (p->o.mode == ZCCL_BUCKET_ALLREDUCE) {
        for (int b = 0; b < p->nbuckets; b++) full += p->b[b].elems * p->es;
    } else {
        full = (size_t)ZCCL_MIN(p->o.max_in_flight, p->nbuckets) * p->max_elems * p->es;
        for (int b = 0; b < p->nbuckets; b++) shard += p->b[b].shard * p->es;
    }
    if (full_bytes) *full_bytes = full;
    if (shard_bytes) *shard_bytes = shard;
    return ZCCL_SUCCESS;
}

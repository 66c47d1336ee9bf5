/*
 * zero_sched.c — the bucket scheduler: micro-steps, gradient pointers, ready marks, and the launch of bucket
 * collectives in bucket order with at most K in flight.
 *
 * Everything that decides a launch happens in pump(), under the plan's lock: it retires buckets whose collective
 * completed (in order; REDUCE_SCATTER adds the shard into the accumulator) and launches the next bucket while it is
 * complete and fewer than K are in flight. pump() runs in the caller's thread (mark, grad_ptr, finish) and on the
 * plan's stream thread after every completed collective (zccl__stream_set_notify), so a bucket held back by the K
 * bound launches as soon as a slot frees, even while the caller computes. Launch order is bucket order on every
 * rank because bucket b is only ever launched right after bucket b-1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "zccl_ext.h"
#include "zero.h"

static void *slot_of(struct zccl_bucket_plan *p, int b) {
    return p->o.mode == ZCCL_BUCKET_ALLREDUCE ? p->buf[b] : p->buf[b % p->nslots];
}

static void set_broken(struct zccl_bucket_plan *p, zccl_result_t res) {
    if (p->err != ZCCL_SUCCESS) return;
    p->err = res;
    snprintf(p->errmsg, sizeof p->errmsg, "%s", zccl__last_error());
}

/* Under p->mu: ZCCL_BUCKET_CHECK found a stale write. The plan breaks, nothing more launches, and the collective
 * the peers expect next is refused so that they fail quoting this rank's message instead of waiting for it. */
static zccl_result_t check_failed(struct zccl_bucket_plan *p, zccl_result_t res) {
    set_broken(p, res);
    p->abandon = true;
    return zccl__coll_refuse(p->comm, p->stream, res);
}

/* Error feedback (zccl_bucket_options_t.error_feedback), the pre step of bucket b's quantized call: on the plan's
 * stream thread, after the bucket's last mark and before the call reads the buffer. g' = g + e (the buffer, in
 * place), e = g' - Q(g') with Q exactly the call's quantization of this rank's contribution. The residuals and the
 * scratch are only touched here, and the stream runs one task at a time; the layout fields are immutable. */
static zccl_result_t ef_pre(void *arg, int b) {
    struct zccl_bucket_plan *p = arg;
    const zb_bucket_t *bk = &p->b[b];
    void *buf = slot_of(p, b);
    const bool rs = p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER;
    zccl__zero_ef_add(buf, bk->elems, p->dt, p->ef_res[b]);
    ZCCL_CHECK(zccl__wire_roundtrip(rs ? ZCCL__WIRE_REDUCE_SCATTER : ZCCL__WIRE_ALLREDUCE, buf,
                                    rs ? bk->shard : bk->elems, p->dt, p->o.wire, p->nranks, p->ef_q));
    zccl__zero_ef_residual(buf, bk->elems, p->dt, p->ef_q, p->ef_res[b]);
    return ZCCL_SUCCESS;
}

/* Called under p->mu. Issues bucket b's collective on the plan's stream. */
static void launch(struct zccl_bucket_plan *p, int b) {
    const zb_bucket_t *bk = &p->b[b];
    const zccl_redop_t op = p->o.average ? ZCCL_AVG : ZCCL_SUM;
    zccl_result_t res;
    if (p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER && p->slot_owner[b % p->nslots] != b &&
        (res = zccl__bucket_check_reuse(p, b % p->nslots)) != ZCCL_SUCCESS) {
        check_failed(p, res);
        return;
    }
    if ((res = zccl__bucket_check_launch(p, b)) != ZCCL_SUCCESS) {
        check_failed(p, res);
        return;
    }
    const zccl__wire_pre_t pre = p->o.error_feedback ? ef_pre : NULL;
    if (p->o.mode == ZCCL_BUCKET_ALLREDUCE) {
        res = p->o.wire == ZCCL_WIRE_FULL
                  ? zccl_allreduce(p->buf[b], p->buf[b], bk->elems, p->dt, op, p->comm, p->stream)
                  : zccl__wire_enqueue_pre(ZCCL__WIRE_ALLREDUCE, p->buf[b], p->buf[b], bk->elems, p->dt, op,
                                           p->o.wire, p->comm, p->stream, pre, p, b); /* qgZ, all-reduce form */
    } else {
        const int slot = b % p->nslots;
        if (p->slot_owner[slot] != b) { /* every parameter unused: nobody asked for the buffer */
            memset(p->buf[slot], 0, bk->elems * p->es);
            p->slot_owner[slot] = b;
        }
        /* First micro-step of the window: reduce-scatter straight into the accumulator; later ones in place, and
         * retire() adds the shard into the accumulator. */
        char *send = p->buf[slot];
        void *recv = p->window_start ? p->acc[b] : send + (size_t)p->rank * bk->shard * p->es;
        res = p->o.wire == ZCCL_WIRE_FULL
                  ? zccl_reduce_scatter(send, recv, bk->shard, p->dt, op, p->comm, p->stream)
                  : zccl__wire_enqueue_pre(ZCCL__WIRE_REDUCE_SCATTER, send, recv, bk->shard, p->dt, op, p->o.wire,
                                           p->comm, p->stream, pre, p, b); /* qgZ */
    }
    if (res != ZCCL_SUCCESS) {
        set_broken(p, res);
        p->abandon = true;
        return;
    }
    p->ticket[b] = zccl__stream_issued(p->stream);
    p->t_launch[b] = zccl__now_ns();
    p->launched++;
    p->log[p->nlog++] = b;
    p->st.launches++;
    int in_flight = p->launched - p->retired;
    if (in_flight > p->st.peak_in_flight) p->st.peak_in_flight = in_flight;
}

static void retire(struct zccl_bucket_plan *p, int b) {
    const zb_bucket_t *bk = &p->b[b];
    zccl__bucket_check_retire(p, b);
    if (p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER && !p->window_start) {
        const char *part = (const char *)p->buf[b % p->nslots] + (size_t)p->rank * bk->shard * p->es;
        zccl_kernel_reduce(p->acc[b], p->acc[b], part, bk->shard, p->dt, ZCCL_SUM, 0);
    }
    p->st.comm_s += (double)(zccl__now_ns() - p->t_launch[b]) * 1e-9;
    p->retired++;
    if (p->sync && p->shard_final) { /* the offload copies the final shard while backward continues */
        const void *sh = p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER
                             ? p->acc[b] : (const char *)p->buf[b] + (size_t)p->rank * bk->shard * p->es;
        p->shard_final(p->shard_final_arg, b, sh);
    }
}

/* Under p->mu: retire what completed, launch what may go. */
static void pump(struct zccl_bucket_plan *p) {
    if (!p->open || !p->comm_step) return;
    const uint64_t done = zccl__stream_completed(p->stream);
    while (p->retired < p->launched && p->ticket[p->retired] <= done) retire(p, p->retired);
    while (!p->abandon && p->launched < p->nbuckets && p->pending[p->launched] == 0 &&
           p->launched - p->retired < p->o.max_in_flight)
        launch(p, p->launched);
    pthread_cond_broadcast(&p->cv);
}

static void on_complete(void *arg) {
    struct zccl_bucket_plan *p = arg;
    pthread_mutex_lock(&p->mu);
    pump(p);
    pthread_mutex_unlock(&p->mu);
}

/* Bucket memory: with `reg` (ZCCL_BUCKET_REGISTER, every rank on one host) from zccl_mem_alloc and registered with
 * the plan's communicator, so the bucket's collectives run in one pass out of the peers' buffers (2-5x the staged
 * path between 32 KiB and a few MiB, docs/performance.md); otherwise, or when /dev/shm has no room, calloc'd.
 * Zero-filled either way. *handle: the registration, NULL for calloc'd memory. */
static void *bucket_alloc(struct zccl_bucket_plan *p, bool reg, size_t bytes, void **handle) {
    *handle = NULL;
    if (reg) {
        void *m = NULL;
        if (zccl_mem_alloc(&m, bytes) == ZCCL_SUCCESS) {
            if (zccl_comm_register(p->comm, m, bytes, handle) == ZCCL_SUCCESS) {
                p->st.registered_buffers++;
                return m;
            }
            *handle = NULL;
            zccl_mem_free(m);
        }
        if (!p->reg_fallback) {
            p->reg_fallback = true;
            ZCCL_INFO(ZCCL_LOG_INIT, "zccl_bucket_plan_create: rank %d: bucket buffers in ordinary memory (%s); "
                      "bucket collectives take the staged path", p->rank, zccl__last_error());
        }
    }
    return zccl__calloc(bytes ? bytes : 1, 1);
}

/* A registered block is freed only once every peer has closed its mapping (zccl_comm_deregister succeeded);
 * otherwise it stays mapped until the process ends: a peer may still read it. */
static void bucket_release(struct zccl_bucket_plan *p, void *m, void *handle) {
    if (!m) return;
    if (!handle) {
        free(m);
    } else if (zccl_comm_deregister(p->comm, handle) == ZCCL_SUCCESS) {
        zccl_mem_free(m);
    }
}

zccl_result_t zccl__bucket_sched_init(struct zccl_bucket_plan *p) {
    const int nb = p->nbuckets;
    p->nslots = (p->o.mode == ZCCL_BUCKET_ALLREDUCE) ? nb : ZCCL_MIN(p->o.max_in_flight, nb);
    p->buf = calloc((size_t)p->nslots, sizeof *p->buf);
    p->buf_reg = calloc((size_t)p->nslots, sizeof *p->buf_reg);
    p->marked = calloc((size_t)p->nparams, 1);
    p->pending = calloc((size_t)nb, sizeof *p->pending);
    p->ticket = calloc((size_t)nb, sizeof *p->ticket);
    p->t_launch = calloc((size_t)nb, sizeof *p->t_launch);
    p->log = calloc((size_t)nb, sizeof *p->log);
    p->slot_owner = calloc((size_t)p->nslots, sizeof *p->slot_owner);
    if (p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER) p->acc = calloc((size_t)nb, sizeof *p->acc);
    if (!p->buf || !p->buf_reg || !p->marked || !p->pending || !p->ticket || !p->t_launch || !p->log ||
        !p->slot_owner || (p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER && !p->acc))
        return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_bucket_plan_create: out of memory for %d buckets", nb);
    /* Registration pays only where the registered path runs: every rank on this host (a collective: every rank
     * reaches it, in the same order, since plan creation is collective). */
    int64_t want = 1;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_BUCKET_REGISTER, &want));
    bool one_host = false;
    ZCCL_CHECK(zccl__zero_same_on_all(p->comm, zccl__host_hash(), &one_host));
    const bool reg = want && one_host && p->nranks > 1;
    p->registered = reg;
    for (int s = 0; s < p->nslots; s++) {
        size_t elems = (p->o.mode == ZCCL_BUCKET_ALLREDUCE) ? p->b[s].elems : p->max_elems;
        p->buf[s] = bucket_alloc(p, reg, elems * p->es, &p->buf_reg[s]);
        if (!p->buf[s])
            return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_bucket_plan_create: out of memory for a bucket buffer of "
                               "%zu bytes", elems * p->es);
        p->slot_owner[s] = -1;
    }
    if (p->acc) { /* the shard accumulators (reduce-scatter outputs): one block, each shard 64-byte aligned */
        size_t total = 0;
        for (int b = 0; b < nb; b++) total += (p->b[b].shard * p->es + 63) / 64 * 64;
        char *blk = bucket_alloc(p, reg, total, &p->acc_reg);
        if (!blk)
            return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_bucket_plan_create: out of memory for the shards (%zu bytes)",
                               total);
        p->acc_block = blk;
        for (int b = 0; b < nb; b++) {
            p->acc[b] = blk;
            blk += (p->b[b].shard * p->es + 63) / 64 * 64;
        }
    }
    if (p->o.error_feedback) { /* one residual per bucket (elems float32 each) and one bucket's Q(g') */
        size_t total = 0;
        for (int b = 0; b < nb; b++) total += p->b[b].elems;
        p->ef_res = calloc((size_t)nb, sizeof *p->ef_res);
        p->ef_block = calloc(total ? total : 1, sizeof *p->ef_block);
        p->ef_q = calloc(p->max_elems ? p->max_elems : 1, sizeof *p->ef_q);
        if (!p->ef_res || !p->ef_block || !p->ef_q)
            return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_bucket_plan_create: out of memory for the error feedback "
                               "residuals (%zu bytes)", (total + p->max_elems) * sizeof(float));
        float *r = p->ef_block;
        for (int b = 0; b < nb; b++) {
            p->ef_res[b] = r;
            r += p->b[b].elems;
        }
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    ZCCL_CHECK(zccl__bucket_check_init(p));
    ZCCL_CHECK(zccl_stream_create(&p->stream));
    zccl__stream_set_notify(p->stream, on_complete, p);
    p->window_start = true;
    return ZCCL_SUCCESS;
}

void zccl__bucket_sched_free(struct zccl_bucket_plan *p) {
    if (p->stream) {
        /* Destroying the stream waits for its operations; the hook must not run on a plan being freed. */
        zccl__stream_set_notify(p->stream, NULL, NULL);
        zccl_stream_destroy(p->stream);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    for (int s = 0; p->buf && s < p->nslots; s++) bucket_release(p, p->buf[s], p->buf_reg ? p->buf_reg[s] : NULL);
    bucket_release(p, p->acc_block, p->acc_reg);
    free(p->buf);
    free(p->buf_reg);
    free(p->acc);
    free(p->marked);
    free(p->pending);
    free(p->ticket);
    free(p->t_launch);
    free(p->log);
    free(p->slot_owner);
    free(p->ef_res);
    free(p->ef_block);
    free(p->ef_q);
    zccl__bucket_check_free(p);
}

/* Common entry checks; on success returns with p->mu held. */
static zccl_result_t enter(struct zccl_bucket_plan *p, const char *fn, int param, bool need_open) {
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    if (!p->comm)
        return zccl__error(ZCCL_INVALID_USAGE, "%s: the plan is a layout (zccl_bucket_layout_create) without "
                           "buffers or communicator", fn);
    if (param != -1 && (param < 0 || param >= p->nparams))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'param' = %d is outside [0, %d)", fn, param,
                           p->nparams);
    pthread_mutex_lock(&p->mu);
    if (p->err != ZCCL_SUCCESS) {
        zccl_result_t e = p->err;
        pthread_mutex_unlock(&p->mu);
        return zccl__error(e, "%s: the plan is broken by an earlier error: %s", fn, p->errmsg);
    }
    if (need_open && !p->open) {
        pthread_mutex_unlock(&p->mu);
        return zccl__error(ZCCL_INVALID_USAGE, "%s: no micro-step is open (call zccl_bucket_begin first)", fn);
    }
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_begin(zccl_bucket_plan_t p, int sync) {
    const char *fn = "zccl_bucket_begin";
    ZCCL_CHECK(enter(p, fn, -1, false));
    if (p->open) {
        pthread_mutex_unlock(&p->mu);
        return zccl__error(ZCCL_INVALID_USAGE, "%s: a micro-step is already open (call zccl_bucket_finish first)", fn);
    }
    p->open = true;
    p->sync = sync != 0;
    p->comm_step = p->sync || p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER;
    p->reduced = false;
    p->abandon = false;
    p->launched = p->retired = 0;
    p->nlog = 0;
    memset(p->marked, 0, (size_t)p->nparams);
    zccl__bucket_check_begin(p);
    for (int b = 0; b < p->nbuckets; b++) p->pending[b] = p->b[b].nparams;
    if (p->o.mode == ZCCL_BUCKET_ALLREDUCE) {
        if (p->window_start)
            for (int b = 0; b < p->nbuckets; b++) memset(p->buf[b], 0, p->b[b].elems * p->es);
    } else {
        for (int s = 0; s < p->nslots; s++) p->slot_owner[s] = -1; /* zeroed when handed out */
    }
    pthread_mutex_unlock(&p->mu);
    return ZCCL_SUCCESS;
}

/* Under p->mu: the first parameter (in bucket order) of buckets [from, to] that is neither marked nor unused, or
 * -1. */
static int first_unmarked(struct zccl_bucket_plan *p, int from, int to) {
    for (int b = from; b <= to && b < p->nbuckets; b++) {
        if (p->pending[b] == 0) continue;
        for (int k = 0; k < p->b[b].nparams; k++) {
            int i = p->b[b].first_param - k;
            if (!p->marked[i]) return i;
        }
    }
    return -1;
}

ZCCL_API zccl_result_t zccl_bucket_grad_ptr(zccl_bucket_plan_t p, int param, void **grad) {
    const char *fn = "zccl_bucket_grad_ptr";
    if (!grad) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'grad' is NULL", fn);
    *grad = NULL;
    ZCCL_CHECK(enter(p, fn, param, false));
    zccl_result_t res = ZCCL_SUCCESS;
    const int b = p->p_bucket[param];
    if (!p->open) { /* between micro-steps: all-reduce mode gradients stay readable in place */
        if (p->o.mode != ZCCL_BUCKET_ALLREDUCE)
            res = zccl__error(ZCCL_INVALID_USAGE, "%s: no micro-step is open, and in reduce-scatter mode only the "
                              "shards (zccl_bucket_info) hold gradients between micro-steps", fn);
        goto out_ptr;
    }
    if (p->marked[param]) {
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: parameter %d is already marked ready in this micro-step; its "
                          "gradient region belongs to the collective until zccl_bucket_finish", fn, param);
        goto out;
    }
    if (p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER) {
        /* Bucket b uses buffer b mod K, which buckets b-K, b-2K, ... used before it in this micro-step: it is free
         * for b once bucket b-K has completed (then all earlier users have too). */
        const int slot = b % p->nslots, prev = b - p->nslots;
        const uint64_t t0 = zccl__now_ns();
        while (res == ZCCL_SUCCESS && p->slot_owner[slot] != b) {
            if (p->slot_owner[slot] > b) {
                res = zccl__error(ZCCL_INVALID_USAGE, "%s: parameter %d (bucket %d) shares a buffer with bucket %d, "
                                  "which is later in bucket order and not complete: with K = %d buffers backward "
                                  "must produce gradients in bucket order (reverse definition order)", fn, param, b,
                                  p->slot_owner[slot], p->nslots);
                break;
            }
            if (prev < 0 || p->retired > prev) { /* free: hand it to bucket b, zeroed */
                if ((res = zccl__bucket_check_reuse(p, slot)) != ZCCL_SUCCESS) {
                    check_failed(p, res);
                    break;
                }
                memset(p->buf[slot], 0, p->b[b].elems * p->es);
                p->slot_owner[slot] = b;
                break;
            }
            const int missing = first_unmarked(p, p->launched, prev);
            if (missing >= 0 || p->abandon) {
                res = zccl__error(ZCCL_INVALID_USAGE, "%s: parameter %d (bucket %d) needs the buffer of bucket %d, "
                                  "which cannot launch before parameter %d (bucket %d) is marked ready: waiting would "
                                  "never end (K = %d buffers)", fn, param, b, prev, missing,
                                  missing >= 0 ? p->p_bucket[missing] : -1, p->nslots);
                break;
            }
            pthread_cond_wait(&p->cv, &p->mu);
            if (p->err != ZCCL_SUCCESS) res = zccl__error(p->err, "%s: %s", fn, p->errmsg);
        }
        p->st.grad_wait_s += (double)(zccl__now_ns() - t0) * 1e-9;
    }
out_ptr:
    if (res == ZCCL_SUCCESS) *grad = (char *)slot_of(p, b) + p->p_off[param] * p->es;
out:
    pthread_mutex_unlock(&p->mu);
    return res;
}

static zccl_result_t mark(struct zccl_bucket_plan *p, const char *fn, int param) {
    ZCCL_CHECK(enter(p, fn, param, true));
    if (p->marked[param]) {
        pthread_mutex_unlock(&p->mu);
        return zccl__error(ZCCL_INVALID_USAGE, "%s: parameter %d is already marked (ready or unused) in this "
                           "micro-step", fn, param);
    }
    p->marked[param] = 1;
    zccl__bucket_check_mark(p, param);
    p->pending[p->p_bucket[param]]--;
    pump(p);
    pthread_mutex_unlock(&p->mu);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_mark_ready(zccl_bucket_plan_t p, int param) {
    return mark(p, "zccl_bucket_mark_ready", param);
}

ZCCL_API zccl_result_t zccl_bucket_mark_unused(zccl_bucket_plan_t p, int param) {
    return mark(p, "zccl_bucket_mark_unused", param);
}

ZCCL_API zccl_result_t zccl_bucket_finish(zccl_bucket_plan_t p) {
    const char *fn = "zccl_bucket_finish";
    ZCCL_CHECK(enter(p, fn, -1, true));
    const uint64_t t0 = zccl__now_ns();
    int missing = -1;
    if (p->comm_step) {
        for (;;) { /* let every launchable bucket go; stop at the first one that misses a mark */
            pump(p);
            if (p->err != ZCCL_SUCCESS || p->launched == p->nbuckets) break;
            if (p->pending[p->launched] > 0) {
                missing = first_unmarked(p, p->launched, p->launched);
                p->abandon = true;
                break;
            }
            pthread_cond_wait(&p->cv, &p->mu);
        }
        while (p->retired < p->launched) {
            pump(p);
            if (p->retired < p->launched) pthread_cond_wait(&p->cv, &p->mu);
        }
    } else {
        missing = first_unmarked(p, 0, p->nbuckets - 1);
    }
    p->st.finish_wait_s += (double)(zccl__now_ns() - t0) * 1e-9;
    if (p->err == ZCCL_SUCCESS && p->comm_step) {
        zccl_result_t ck = zccl__bucket_check_finish(p);
        if (ck != ZCCL_SUCCESS) check_failed(p, ck);
    }
    pthread_mutex_unlock(&p->mu);
    zccl_result_t res = zccl_stream_synchronize(p->stream); /* first error of the buckets' collectives */
    pthread_mutex_lock(&p->mu);
    if (res != ZCCL_SUCCESS) {
        set_broken(p, res);
    } else if (p->err != ZCCL_SUCCESS) {
        res = zccl__error(p->err, "%s: %s", fn, p->errmsg);
    } else if (missing >= 0) {
        res = zccl__error(ZCCL_INVALID_USAGE, "%s: parameter %d (bucket %d) was neither marked ready nor declared "
                          "unused in this micro-step; buckets %d.. were not communicated", fn, missing,
                          p->p_bucket[missing], p->p_bucket[missing]);
    }
    p->open = false;
    p->st.microsteps++;
    if (res == ZCCL_SUCCESS) {
        p->reduced = p->sync;
        p->window_start = p->sync; /* the next micro-step starts a new window after a boundary */
    } else {
        p->window_start = true; /* a failed window is dropped */
    }
    pthread_mutex_unlock(&p->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_bucket_stats(zccl_bucket_plan_t p, zccl_bucket_stats_t *stats) {
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_bucket_stats: argument 'plan' is NULL");
    if (!stats) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_bucket_stats: argument 'stats' is NULL");
    if (!p->comm) { *stats = (zccl_bucket_stats_t){0}; return ZCCL_SUCCESS; }
    pthread_mutex_lock(&p->mu);
    *stats = p->st;
    pthread_mutex_unlock(&p->mu);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_ef_residual(zccl_bucket_plan_t p, int bucket, float *residual) {
    const char *fn = "zccl_bucket_ef_residual";
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    if (!residual) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'residual' is NULL", fn);
    if (bucket < 0 || bucket >= p->nbuckets)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'bucket' = %d is outside [0, %d)", fn, bucket,
                           p->nbuckets);
    if (!p->comm || !p->o.error_feedback)
        return zccl__error(ZCCL_INVALID_USAGE, "%s: the plan %s", fn, !p->comm ? "is a layout without buffers"
                           : "keeps no residuals (zccl_bucket_options_t.error_feedback is 0)");
    pthread_mutex_lock(&p->mu);
    const bool open = p->open;
    if (!open) memcpy(residual, p->ef_res[bucket], p->b[bucket].elems * sizeof *residual);
    pthread_mutex_unlock(&p->mu);
    if (open)
        return zccl__error(ZCCL_INVALID_USAGE, "%s: a micro-step is open: the residuals change while its buckets "
                           "launch; read them between zccl_bucket_finish and zccl_bucket_begin", fn);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_bucket_launch_log(zccl_bucket_plan_t p, int *buckets, int cap, int *n) {
    const char *fn = "zccl_bucket_launch_log";
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'plan' is NULL", fn);
    if (!n) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'n' is NULL", fn);
    if (cap < 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'cap' = %d is negative", fn, cap);
    if (cap > 0 && !buckets) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'buckets' is NULL", fn);
    if (!p->comm) { *n = 0; return ZCCL_SUCCESS; }
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->nlog && i < cap; i++) buckets[i] = p->log[i];
    *n = p->nlog;
    pthread_mutex_unlock(&p->mu);
    return ZCCL_SUCCESS;
}

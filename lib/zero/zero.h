/*
 * zero.h — internals shared by the bucket plan files (lib/zero/zero_layout.c: layout and queries; lib/zero/zero_sched.c:
 * micro-steps, launch and completion; lib/zero/zero_grad.c: norm, scaling, element helpers) and lib/zero/zero3.c.
 */
#ifndef ZCCL_ZERO_INTERNAL_H
#define ZCCL_ZERO_INTERNAL_H

#include <pthread.h>
#include "core.h"
#include "zccl_zero.h"

#define ZCCL_BUCKET_MAX_IN_FLIGHT 64

typedef struct {
    int first_param, nparams;
    size_t used, elems, shard;
} zb_bucket_t;

struct zccl_bucket_plan {
    /* layout (immutable after create) */
    zccl_comm_t comm; /* NULL for a layout-only plan */
    int nranks, rank;
    zccl_datatype_t dt;
    size_t es;
    int nparams, nbuckets;
    size_t *numel;    /* per parameter */
    int *p_bucket;    /* per parameter: its bucket */
    size_t *p_off;    /* per parameter: element offset in the bucket */
    zb_bucket_t *b;   /* per bucket */
    size_t max_elems; /* largest bucket */
    zccl_bucket_options_t o; /* resolved: no zero fields */

    /* buffers: ALLREDUCE nbuckets buffers (buf[b]); REDUCE_SCATTER nslots shared buffers + shard accumulators */
    int nslots;
    void **buf;
    void **acc;
    void **buf_reg;   /* per buffer: its zccl_comm_register handle (memory from zccl_mem_alloc), NULL: calloc'd */
    void *acc_block;  /* REDUCE_SCATTER: the accumulators' one zccl_mem_alloc block, NULL: each calloc'd */
    void *acc_reg;    /* its registration */
    bool registered;  /* buffers were to be registered (ZCCL_BUCKET_REGISTER, one host, >1 rank) */
    bool reg_fallback; /* some could not be: INFO said so once */
    int *slot_owner; /* REDUCE_SCATTER: bucket using each slot in this micro-step, -1 if none */

    /* error feedback (o.error_feedback): per bucket, this rank's residual e = g' - Q(g') of its last launch, elems
     * float32 each, in one block; ef_q: one bucket's Q(g'), max_elems float32. Touched only by the pre step of
     * the bucket's queued call (on the plan's stream thread, one at a time) and between micro-steps. */
    float **ef_res;
    float *ef_block;
    float *ef_q;

    /* scheduling state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zccl_stream_t stream;
    bool open;          /* a micro-step is open */
    bool sync;          /* its sync flag */
    bool comm_step;     /* buckets are communicated in this micro-step */
    bool window_start;  /* the next/open micro-step is the first of its accumulation window */
    bool reduced;       /* a sync micro-step finished and no begin since: norm/scale allowed */
    bool abandon;       /* finish found a missing mark: launch nothing more */
    uint8_t *marked;    /* per parameter, this micro-step */
    int *pending;       /* per bucket: parameters not yet marked */
    int launched, retired;
    uint64_t *ticket;   /* per bucket: stream ticket of its collective */
    uint64_t *t_launch; /* per bucket: launch time, ns */
    int *log;
    int nlog;
    zccl_result_t err;  /* the plan is broken when not ZCCL_SUCCESS */
    char errmsg[512];
    zccl_bucket_stats_t st;

    /* ZCCL_BUCKET_CHECK (zero_check.c) */
    bool check;
    uint64_t *ck_mark;      /* per parameter: checksum at mark_ready */
    uint64_t *ck_post;      /* per parameter (ALLREDUCE): checksum after its bucket completed */
    uint8_t *ck_state;      /* per parameter: 0 nothing recorded, 1 ck_mark valid, 2 ck_post valid */
    uint64_t *ck_slot;      /* per buffer (REDUCE_SCATTER): checksum when its bucket completed */
    int *ck_slot_bucket;    /* per buffer: the bucket ck_slot belongs to, -1 if none */

    /* CPU offload (zero_offload.c): called under mu when bucket b's shard of a sync micro-step is final (its
     * collective completed and, in REDUCE_SCATTER mode, was added into the accumulator), with the shard's address;
     * it must not take mu. NULL: none. */
    void (*shard_final)(void *arg, int b, const void *shard);
    void *shard_final_arg;
};

/** Element helpers over the four floating types (lib/zero/zero_grad.c). */
double zccl__zero_sumsq(const void *p, size_t n, zccl_datatype_t dt);
void zccl__zero_scale(void *p, size_t n, zccl_datatype_t dt, double factor);
/** Error feedback (zero_grad.c, used by zero_sched.c): p[i] <- p[i] + e[i], rounded once to dt. */
void zccl__zero_ef_add(void *p, size_t n, zccl_datatype_t dt, const float *e);
/** e[i] <- p[i] - q[i] (computed in float64, rounded once to float32); 0 where that is not finite (a NaN or an
 *  infinity in the bucket is not carried to later steps). */
void zccl__zero_ef_residual(const void *p, size_t n, zccl_datatype_t dt, const float *q, float *e);

/** Computes the bucket layout into p (nranks, dt, options already set in p; numel copied). */
zccl_result_t zccl__bucket_layout(struct zccl_bucket_plan *p, int nparams, const size_t *numel);
/** Allocates the buffers and scheduler state of a plan with a communicator (lib/zero/zero_sched.c). */
zccl_result_t zccl__bucket_sched_init(struct zccl_bucket_plan *p);
/** Frees what zccl__bucket_sched_init allocated (waits for work in flight). */
void zccl__bucket_sched_free(struct zccl_bucket_plan *p);

/** Collective check that every rank passed the same description: all-reduce (MAX) of {h, ~h}. Sets *same. */
zccl_result_t zccl__zero_same_on_all(zccl_comm_t comm, uint64_t h, bool *same);
/** FNV-1a over bytes, continuing from h (start with 1469598103934665603). */
uint64_t zccl__zero_hash(uint64_t h, const void *data, size_t len);

/** ZCCL_BUCKET_CHECK (lib/zero/zero_check.c); every function but init/free is called under p->mu. */
zccl_result_t zccl__bucket_check_init(struct zccl_bucket_plan *p);
void zccl__bucket_check_free(struct zccl_bucket_plan *p);
void zccl__bucket_check_begin(struct zccl_bucket_plan *p);
void zccl__bucket_check_mark(struct zccl_bucket_plan *p, int param);
zccl_result_t zccl__bucket_check_launch(struct zccl_bucket_plan *p, int b);
void zccl__bucket_check_retire(struct zccl_bucket_plan *p, int b);
zccl_result_t zccl__bucket_check_reuse(struct zccl_bucket_plan *p, int slot);
zccl_result_t zccl__bucket_check_finish(struct zccl_bucket_plan *p);

/* This layer's rows of the settings table (lib/zero/settings.c). */
extern const zccl_cfg_desc_t zccl__set_bucket_register;
#define ZCCL_CFG_BUCKET_REGISTER (&zccl__set_bucket_register)
extern const zccl_cfg_desc_t zccl__set_bucket_check;
#define ZCCL_CFG_BUCKET_CHECK (&zccl__set_bucket_check)
extern const zccl_cfg_desc_t zccl__set_bucket_first_bytes;
#define ZCCL_CFG_BUCKET_FIRST_BYTES (&zccl__set_bucket_first_bytes)
extern const zccl_cfg_desc_t zccl__set_bucket_cap_bytes;
#define ZCCL_CFG_BUCKET_CAP_BYTES (&zccl__set_bucket_cap_bytes)
extern const zccl_cfg_desc_t zccl__set_buckets_in_flight;
#define ZCCL_CFG_BUCKETS_IN_FLIGHT (&zccl__set_buckets_in_flight)
extern const zccl_cfg_desc_t zccl__set_zero3_live_bytes;
#define ZCCL_CFG_ZERO3_LIVE_BYTES (&zccl__set_zero3_live_bytes)

#endif

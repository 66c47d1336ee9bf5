/*
 * zccl_zero.h — gradient buckets that overlap communication with the backward pass, and the ZeRO-1/2/3 building
 * blocks (sharded gradients, gradient accumulation, global gradient norm, ZeRO-3 parameter gathering with
 * prefetch). Include after (or instead of) zccl.h; link with -lzccl.
 *
 * Background. Data-parallel training all-reduces every gradient after backward. Backward produces gradients last
 * layer first, so waiting for the whole pass leaves the network idle while the processor computes, and then the
 * processor idle while the network works. Grouping gradients into buckets in reverse definition order and
 * launching each bucket's collective as soon as all its gradients are written overlaps the two (PyTorch DDP: Li et
 * al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020 — first bucket small,
 * 1 MiB, then 25 MiB). ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
 * Models", SC 2020) shards optimizer state (stage 1), gradients (stage 2) and parameters (stage 3) across ranks:
 * gradients are reduce-scattered so that rank r keeps only its shard, and stage 3 all-gathers each layer's
 * parameters just before the layer runs.
 *
 * Units. Counts and offsets are in ELEMENTS of the plan's datatype unless the name says bytes. Parameters,
 * buckets and layers are numbered from 0.
 *
 * Collective calls. Functions marked "collective" must be called by every rank of the communicator, in the same
 * order, with the same arguments where stated. The plan issues its collectives on a stream of its own; while a
 * plan has work in flight (between zccl_bucket_begin and zccl_bucket_finish, or between zccl_zero3_begin and
 * zccl_zero3_end) the caller must not issue other collectives on the same communicator (zccl.h: two streams must
 * not drive one communicator). ZeRO-3 fetches overlap gradient buckets, so a ZeRO-3 object needs a communicator of
 * its own: create a second one over the same ranks with zccl_comm_shrink(comm, NULL, 0, &comm2).
 *
 * Threads. Each plan object has its own lock: its functions may be called from any thread, one call at a time or
 * concurrently, but the order of marks and fetches is what defines a step, so typically one thread drives it.
 *
 * Errors. As in zccl.h: every function returns a zccl_result_t and, on failure, zccl_get_last_error() names the
 * cause (argument, parameter, bucket, layer, step). ZCCL_INVALID_ARGUMENT: an argument is out of range or NULL;
 * ZCCL_INVALID_USAGE: the call is not valid in the plan's state (e.g. mark before begin); ZCCL_SYSTEM_ERROR: out of
 * memory or a thread could not be started; ZCCL_REMOTE_ERROR / ZCCL_TIMEOUT: from the collectives (zccl.h).
 * After a failed collective the plan is broken: later calls fail with the same error; destroy it.
 *
 * Settings (environment, util/config.c; `zccl-bench --env` lists them): ZCCL_BUCKET_FIRST_BYTES (1M),
 * ZCCL_BUCKET_CAP_BYTES (25M), ZCCL_BUCKETS_IN_FLIGHT (2), ZCCL_ZERO3_MAX_LIVE_BYTES (1G). Option fields left 0
 * take these values.
 *
 * CPU offload of the optimizer state (zccl_zero_offload_*, ZeRO-Offload style) is at the end of this file.
 *
 * docs/zero.md walks through how a framework's backward hooks drive this API.
 */
#ifndef ZCCL_ZERO_H
#define ZCCL_ZERO_H

#include <stddef.h>
#include <stdint.h>
#include "zccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Gradient buckets                                                                                             */
/* ------------------------------------------------------------------------------------------------------------ */

/** Opaque bucket plan: the bucket layout, the gradient buffers and the scheduler that launches buckets. */
typedef struct zccl_bucket_plan *zccl_bucket_plan_t;

/** What a bucket's collective does. */
typedef enum {
    /** All-reduce every bucket: every rank ends with the full reduced gradient (plain data parallelism, DDP;
     *  ZeRO-1, which then updates only its shard of each bucket). */
    ZCCL_BUCKET_ALLREDUCE = 0,
    /** Reduce-scatter every bucket: rank r ends with shard r of every bucket (ZeRO-2 and ZeRO-3). */
    ZCCL_BUCKET_REDUCE_SCATTER = 1,
} zccl_bucket_mode_t;

/**
 * Options of a plan. Zero-initialise ({0}) and set what you need: a field left 0 takes its default.
 */
typedef struct {
    /** Target size in BYTES of bucket 0, the first to launch (so communication starts early). 0: the setting
     *  ZCCL_BUCKET_FIRST_BYTES (default 1 MiB). */
    size_t first_bytes;
    /** Target size in BYTES of every later bucket. 0: ZCCL_BUCKET_CAP_BYTES (default 25 MiB). */
    size_t cap_bytes;
    /** Alignment in ELEMENTS: every parameter's gradient starts at a multiple of align_elems inside its bucket,
     *  and every bucket's element count is padded to a multiple of nranks * align_elems, so every shard has the
     *  same size and starts aligned. 0: 64 bytes' worth of elements (one cache line; 16 float32). */
    size_t align_elems;
    /** ZCCL_BUCKET_ALLREDUCE (0, the default) or ZCCL_BUCKET_REDUCE_SCATTER. */
    zccl_bucket_mode_t mode;
    /** K: at most this many buckets launched and not yet complete at any time (bounds memory held by
     *  communication; in REDUCE_SCATTER mode also the number of full-size bucket buffers). 0: the setting
     *  ZCCL_BUCKETS_IN_FLIGHT (default 2). Must be <= 64. */
    int max_in_flight;
    /** Nonzero: the result is the average over ranks (sum / nranks), fused into the reduction (ZCCL_AVG, applied
     *  once to the complete sum). 0: the sum. Averaging over micro-steps is the caller's (scale the loss by
     *  1/k, as frameworks do). */
    int average;
    /** The gradients' wire format between ranks (qgZ of ZeRO++, Wang et al. 2023): ZCCL_WIRE_FULL (0, the
     *  default) sends the datatype itself; a quantized format reduces each bucket with zccl_allreduce_wire
     *  (ALLREDUCE mode) or zccl_reduce_scatter_wire (REDUCE_SCATTER mode) queued on the plan's stream, so it
     *  overlaps backward as the full-precision collectives do. Any datatype of the plan (float64 is rounded to
     *  float32 on the wire: zccl.h's E64). Error: each micro-step's bucket is quantized and reduced on its own
     *  with the bound those calls state per element (zccl.h, zccl_wire_t and the _wire calls; amax over the
     *  bucket's blocks of ZCCL_QUANT_BLOCK elements, which start at each shard's first element); over an
     *  accumulation window of K micro-steps the errors of the K reductions add (then the accumulator's own float
     *  rounding). Without error_feedback the quantization residual is not carried to the next step. The padding
     *  stays exactly zero (a zero encodes exactly) unless a NaN or an infinity shares its block, which then arrives
     *  as NaN. Every rank passes the same wire (part of the layout check). */
    zccl_wire_t wire;
    /** 1: error feedback for the quantized wire (error compensation: Seide et al., 2014, 1-bit SGD; Karimireddy et
     *  al., 2019, EF-SGD; the compensation of ZeRO++'s qgZ and 1-bit Adam). 0 (the default): none. Each rank keeps,
     *  per bucket, the residual e of its own quantization at the bucket's last launch: at each launch (every
     *  micro-step in REDUCE_SCATTER mode, each sync micro-step in ALLREDUCE mode) it sends g' = g + e instead of
     *  the bucket's data g (g' is written into the bucket buffer, rounded once to the datatype) and keeps
     *  e = g' - Q(g') in float32, where Q is exactly the quantize-dequantize the collective applies to this rank's
     *  contribution (the same blocks from each shard's first element, bitwise the value the owner adds). So what a
     *  rank has sent over K launches is its exact sum minus its last residual: the errors of the first hop no longer
     *  add over steps but stay within one quantization (|e| <= zccl.h's bound of one element, with the amax of its
     *  block of g'), and the sum of the reduced results over K launches differs from the exact sum by the ranks'
     *  last residuals plus each reduction's own rounding. Compensated: the first hop only, each rank's
     *  quantization of its own contribution. Not compensated: the all-reduce's second quantization (the owner
     *  requantizes the reduced shard for the all-gather, zccl_allreduce_wire), which stays one error per step and
     *  is not carried over; nor the float32 accumulation. The work runs on the plan's stream right before the
     *  bucket's collective (one encode and decode of the bucket, two passes over it), so it overlaps backward as
     *  the collective does. A residual element that is not finite is set to 0 (a NaN or an infinity in a step,
     *  e.g. a skipped step under loss scaling, is not carried on). The residual is the rank's own state: it is not
     *  reset by zccl_bucket_begin or at a window's start, and it travels with no checkpoint (zccl_bucket_ef_residual
     *  reads it). Memory: one float32 residual per bucket element per rank (4 bytes x the padded size of all
     *  gradients: the size of the gradients themselves for float32, twice it for float16 and bfloat16, half for
     *  float64) plus one bucket's float32 scratch. Requires a quantized wire: 1 with ZCCL_WIRE_FULL is refused
     *  (ZCCL_INVALID_ARGUMENT), as is any value but 0 and 1. Every rank passes the same value (part of the layout
     *  check). docs/zero.md, "Error feedback". */
    int error_feedback;
} zccl_bucket_options_t;

/**
 * Forms the buckets and allocates their buffers. Collective: every rank passes the same numel[], datatype and
 * options; the plan checks this with one small all-reduce of a hash of these inputs and fails with
 * ZCCL_INVALID_USAGE on every rank if they differ (the message says that they differ, not where).
 *
 * Layout (identical on every rank, computed from the arguments only): parameters are taken in REVERSE definition
 * order (param nparams-1 first, as backward produces them). A bucket is closed when adding the next parameter would
 * take it past its target (first_bytes for bucket 0, cap_bytes after); a parameter larger than the target gets a
 * bucket of its own; parameters are never split. Inside a bucket each parameter starts at a multiple of
 * align_elems; the bucket is padded to a multiple of nranks*align_elems elements (padding is zero and stays
 * zero). Rank r owns shard r: elements [r*S, (r+1)*S) of every bucket of S*nranks elements.
 *
 * Memory. ALLREDUCE mode: one buffer per bucket, together the (padded) size of all gradients; gradients stay
 * readable in place after zccl_bucket_finish. REDUCE_SCATTER mode: min(K, nbuckets) full-size bucket buffers,
 * reused in bucket order (bucket b uses buffer b mod K), plus this rank's shard of every bucket (the shard
 * accumulators): about K*cap_bytes + total/nranks.
 *
 * The plan creates a stream of its own and issues its collectives on comm from that stream (see the file comment
 * for what this forbids meanwhile). comm must outlive the plan.
 *
 * @param comm      communicator; must not be NULL.
 * @param nparams   number of parameters, >= 1.
 * @param numel     nparams element counts, numel[i] >= 1, in definition order (the order the model defines its
 *                  parameters; forward order). Copied: the array may be freed after the call.
 * @param datatype  gradient element type: ZCCL_FLOAT32, ZCCL_FLOAT64, ZCCL_FLOAT16 or ZCCL_BFLOAT16.
 * @param opts      options, or NULL for all defaults.
 * @param[out] plan the new plan; set to NULL on failure.
 * Errors: ZCCL_INVALID_ARGUMENT (comm, numel or plan NULL; nparams < 1; a numel[i] of 0, named by index; a
 * datatype that is not a floating type; max_in_flight outside [0, 64]; opts->wire out of range; opts->error_feedback
 * not 0 or 1, or 1 with ZCCL_WIRE_FULL; a total size
 * that overflows; an invalid setting, named); ZCCL_INVALID_USAGE (ranks passed different layouts); ZCCL_SYSTEM_ERROR (memory, thread);
 * ZCCL_REMOTE_ERROR / ZCCL_TIMEOUT from the check's all-reduce.
 */
zccl_result_t zccl_bucket_plan_create(zccl_comm_t comm, int nparams, const size_t *numel, zccl_datatype_t datatype,
                                      const zccl_bucket_options_t *opts, zccl_bucket_plan_t *plan);

/**
 * Computes the same layout as zccl_bucket_plan_create for nranks ranks, without a communicator and without
 * allocating gradient buffers: for planning tools (zccl-zero-plan) that print buckets and volumes. The layout
 * queries (zccl_bucket_count, zccl_bucket_info without pointers, zccl_bucket_param_loc, zccl_bucket_buffer_bytes)
 * work on it; step functions fail with ZCCL_INVALID_USAGE. Local, not collective.
 * @param nranks  1 <= nranks <= 65536.
 * Other parameters and errors as zccl_bucket_plan_create, without the communication errors.
 */
zccl_result_t zccl_bucket_layout_create(int nranks, int nparams, const size_t *numel, zccl_datatype_t datatype,
                                        const zccl_bucket_options_t *opts, zccl_bucket_plan_t *plan);

/**
 * Waits for the plan's work in flight (errors from it are dropped), frees its buffers, stream and thread.
 * NULL is accepted. Pointers obtained from the plan are invalid afterwards. Not collective. Always ZCCL_SUCCESS.
 */
zccl_result_t zccl_bucket_plan_destroy(zccl_bucket_plan_t plan);

/**
 * Starts a micro-step (one backward pass). Every rank calls it with the same `sync`.
 *  - sync != 0: this micro-step ends the accumulation window. ALLREDUCE mode: buckets are all-reduced during this
 *    micro-step's backward; after zccl_bucket_finish the buffers hold the reduced sum (or average) over ranks of
 *    the window's accumulated gradients. REDUCE_SCATTER mode: after finish the shards hold the window's reduced
 *    gradient, and the next begin starts a new window (zeroes the shards).
 *  - sync == 0: gradient accumulation without a boundary. ALLREDUCE mode: nothing is communicated; gradients add
 *    up locally in the bucket buffers (k micro-steps cost one all-reduce; ZeRO-1 / DDP no_sync). REDUCE_SCATTER
 *    mode: buckets are still reduce-scattered every micro-step and added into the shard accumulators (ZeRO-2/3:
 *    the full gradient does not fit, so it cannot wait).
 * Zeroing: ALLREDUCE mode zeroes the bucket buffers at the begin of the first micro-step of a window; REDUCE_SCATTER
 * mode zeroes each bucket buffer at every micro-step (when zccl_bucket_grad_ptr first hands it out). So backward
 * always ADDS its gradient into the pointer it gets (+=), which also covers parameters used twice.
 * Errors: ZCCL_INVALID_ARGUMENT (plan NULL); ZCCL_INVALID_USAGE (a micro-step is open: finish it first; a layout
 * plan); the plan's earlier error if it is broken.
 */
zccl_result_t zccl_bucket_begin(zccl_bucket_plan_t plan, int sync);

/**
 * Returns in *grad where backward writes (adds) parameter `param`'s gradient: numel[param] contiguous elements
 * inside its bucket's buffer (no copy happens later). Valid from zccl_bucket_begin until zccl_bucket_mark_ready
 * of the same parameter in this micro-step. The region must not be touched after mark_ready until finish: the
 * collective may be reading and writing it. ALLREDUCE mode: between micro-steps (after finish, before the next
 * begin) the call also works, for reading: the reduced gradient after a sync micro-step, the local accumulation
 * after a non-sync one.
 * REDUCE_SCATTER mode: bucket b uses the buffer of bucket b-K; if that bucket has not completed, this call waits
 * for it (bounded memory). If bucket b-K (or an earlier one) cannot launch because a parameter in it is not
 * marked ready yet, waiting would never end: the call fails with ZCCL_INVALID_USAGE naming that parameter instead.
 * Errors: ZCCL_INVALID_ARGUMENT (plan or grad NULL, param outside [0, nparams)); ZCCL_INVALID_USAGE (param already
 * marked in this micro-step; the wait above; no open micro-step in REDUCE_SCATTER mode); the plan's error if it is
 * broken.
 */
zccl_result_t zccl_bucket_grad_ptr(zccl_bucket_plan_t plan, int param, void **grad);

/**
 * Declares parameter `param`'s gradient of this micro-step complete. Any order is accepted: buckets still launch
 * in bucket order (0, 1, 2, ...), the same on every rank, never in the order marks arrive: bucket b launches when
 * all its parameters are marked, buckets 0..b-1 have launched, and fewer than K are in flight. The launch happens
 * on the plan's scheduler thread, so this call does not block on communication.
 * Errors: ZCCL_INVALID_ARGUMENT (plan NULL, param out of range); ZCCL_INVALID_USAGE (no open micro-step, param
 * marked twice in one micro-step, naming it); the plan's error if it is broken.
 */
zccl_result_t zccl_bucket_mark_ready(zccl_bucket_plan_t plan, int param);

/**
 * Declares that parameter `param` gets no gradient in this micro-step (not used by the forward pass: DDP's
 * find_unused_parameters). Its region counts as zero (ALLREDUCE: whatever was accumulated in earlier micro-steps of
 * the window stays) and as ready. Call it instead of mark_ready; errors as zccl_bucket_mark_ready.
 */
zccl_result_t zccl_bucket_mark_unused(zccl_bucket_plan_t plan, int param);

/**
 * Ends the micro-step: waits until every bucket launched in this micro-step has completed (ALLREDUCE with sync=0:
 * nothing was launched). On success the results described at zccl_bucket_begin are in place.
 * A parameter neither marked ready nor unused is an error: ZCCL_INVALID_USAGE naming the first such parameter (in
 * bucket order) and its bucket; its bucket and all later ones were not launched (buckets before it completed).
 * When every rank misses the same parameter all ranks fail alike; when only some ranks do, the others wait in the
 * collective of that bucket (set ZCCL_TIMEOUT_MS to turn that into ZCCL_TIMEOUT).
 * Errors: ZCCL_INVALID_ARGUMENT (plan NULL); ZCCL_INVALID_USAGE (no open micro-step; the missing mark above); the
 * first error of a bucket's collective (ZCCL_REMOTE_ERROR, ZCCL_TIMEOUT, ...), which breaks the plan.
 */
zccl_result_t zccl_bucket_finish(zccl_bucket_plan_t plan);

/** Number of buckets in *nbuckets. Errors: ZCCL_INVALID_ARGUMENT (plan or nbuckets NULL). */
zccl_result_t zccl_bucket_count(zccl_bucket_plan_t plan, int *nbuckets);

/** One bucket's layout and, for a plan with buffers, where its data lives. */
typedef struct {
    int first_param;   /**< parameters first_param, first_param-1, ..., first_param-nparams+1 (reverse order) */
    int nparams;       /**< parameters in the bucket, >= 1 */
    size_t used_elems; /**< elements up to the end of the last parameter (without the final padding) */
    size_t elems;      /**< padded element count: a multiple of nranks * align_elems */
    size_t shard_elems;  /**< elems / nranks: the size of every rank's shard */
    size_t shard_offset; /**< rank * shard_elems: where this rank's shard starts inside the bucket */
    /** ALLREDUCE mode: the bucket's buffer (elems elements; the reduced gradient after a sync finish).
     *  REDUCE_SCATTER mode and layout-only plans: NULL (the buffer is shared; use zccl_bucket_grad_ptr). */
    void *buffer;
    /** This rank's shard of the bucket, shard_elems elements: ALLREDUCE mode buffer + shard_offset (ZeRO-1 updates
     *  only this); REDUCE_SCATTER mode the shard accumulator. NULL for layout-only plans. The caller may read and
     *  write it (e.g. clipping scales it) between finish and the next begin. */
    void *shard;
} zccl_bucket_info_t;

/**
 * Describes bucket `bucket` (0 = launched first; holds the LAST parameters of the model).
 * Errors: ZCCL_INVALID_ARGUMENT (plan or info NULL, bucket outside [0, nbuckets)).
 */
zccl_result_t zccl_bucket_info(zccl_bucket_plan_t plan, int bucket, zccl_bucket_info_t *info);

/**
 * Where parameter `param`'s gradient lives: bucket number and element offset inside that bucket. The parameter
 * occupies elements [*offset, *offset + numel[param]) of the bucket; the part of it that falls in this rank's
 * shard is the intersection with [shard_offset, shard_offset + shard_elems). Either output may be NULL.
 * Errors: ZCCL_INVALID_ARGUMENT (plan NULL, param out of range).
 */
zccl_result_t zccl_bucket_param_loc(zccl_bucket_plan_t plan, int param, int *bucket, size_t *offset);

/**
 * Bytes of gradient memory the plan allocates on a rank: *full_bytes the full-size bucket buffers (all buckets in
 * ALLREDUCE mode, min(K, nbuckets) of the largest size in REDUCE_SCATTER mode), *shard_bytes the shard accumulators
 * (REDUCE_SCATTER mode; 0 otherwise). Layout-only plans report what a real plan would allocate. Either output may
 * be NULL. Errors: ZCCL_INVALID_ARGUMENT (plan NULL).
 */
zccl_result_t zccl_bucket_buffer_bytes(zccl_bucket_plan_t plan, size_t *full_bytes, size_t *shard_bytes);

/**
 * Global L2 norm of the reduced gradient, sqrt(sum of squares of every element), for clipping. Each rank sums the
 * squares of its own shard of every bucket (padding is zero), in float64, and one scalar all-reduce (ZCCL_SUM,
 * float64) adds the ranks' parts, so every element counts exactly once and every rank gets the same value.
 * Call it after a successful zccl_bucket_finish of a sync micro-step and before the next begin. Collective.
 * Errors: ZCCL_INVALID_ARGUMENT (plan or norm NULL); ZCCL_INVALID_USAGE (a micro-step is open; no sync step has
 * finished since the last begin; a layout plan); communication errors.
 */
zccl_result_t zccl_bucket_grad_norm(zccl_bucket_plan_t plan, double *norm);

/**
 * Multiplies this rank's shard of every bucket by factor (gradient clipping: factor = max_norm / (norm + eps)
 * when norm > max_norm). ALLREDUCE mode scales the shard part of the buffers only (ZeRO-1 reads only its shard;
 * DP callers that read the whole gradient scale it themselves). Same timing rule as zccl_bucket_grad_norm; local.
 * Errors: ZCCL_INVALID_ARGUMENT (plan NULL, factor not finite); ZCCL_INVALID_USAGE (as zccl_bucket_grad_norm).
 */
zccl_result_t zccl_bucket_scale_shards(zccl_bucket_plan_t plan, double factor);

/** Counters of a plan, for tests and benchmarks. Times are CLOCK_MONOTONIC seconds. */
typedef struct {
    int peak_in_flight;        /**< most buckets launched and not complete at one time, since creation */
    uint64_t launches;         /**< bucket collectives issued since creation */
    uint64_t microsteps;       /**< finished micro-steps */
    double finish_wait_s;      /**< total time zccl_bucket_finish waited for communication (exposed time) */
    double grad_wait_s;        /**< total time zccl_bucket_grad_ptr waited for a shared buffer (REDUCE_SCATTER) */
    double comm_s;             /**< total time from launch to completion of each bucket, summed */
    int registered_buffers;    /**< bucket buffers (and the shard block of a REDUCE_SCATTER plan) in zccl_mem_alloc
                                    memory registered with the plan's communicator (ZCCL_BUCKET_REGISTER: when every
                                    rank shares one host), so their collectives take the registered one-pass path;
                                    0: ordinary memory */
} zccl_bucket_stats_t;

/** Copies the plan's counters into *stats. Errors: ZCCL_INVALID_ARGUMENT (plan or stats NULL). */
zccl_result_t zccl_bucket_stats(zccl_bucket_plan_t plan, zccl_bucket_stats_t *stats);

/**
 * Copies this rank's error-feedback residual of bucket `bucket` (zccl_bucket_options_t.error_feedback) into
 * residual: elems float32 values (zccl_bucket_info's elems), e = g' - Q(g') of the bucket's last launch, zeros
 * before its first. For tests and diagnostics. Local; between micro-steps only. Errors: ZCCL_INVALID_ARGUMENT
 * (plan or residual NULL, bucket out of range); ZCCL_INVALID_USAGE (a layout-only plan, error_feedback 0, a
 * micro-step open).
 */
zccl_result_t zccl_bucket_ef_residual(zccl_bucket_plan_t plan, int bucket, float *residual);

/**
 * The buckets launched in the last (or current) micro-step, in launch order: writes min(n, cap) bucket numbers to
 * buckets and the full number to *n. With correct use this is 0, 1, ..., nbuckets-1 whatever the mark order.
 * Errors: ZCCL_INVALID_ARGUMENT (plan or n NULL; buckets NULL with cap > 0; cap < 0).
 */
zccl_result_t zccl_bucket_launch_log(zccl_bucket_plan_t plan, int *buckets, int cap, int *n);

/* ------------------------------------------------------------------------------------------------------------ */
/* ZeRO-3 parameters                                                                                            */
/* ------------------------------------------------------------------------------------------------------------ */

/** Opaque ZeRO-3 parameter store: layers' parameters kept as shards, gathered on demand with prefetch. */
typedef struct zccl_zero3 *zccl_zero3_t;

/** Options of a ZeRO-3 store; zero-initialise, a field left 0 takes its default. */
typedef struct {
    /** Upper bound in BYTES on gathered (full) layer parameters alive at once on a rank: gathered or being
     *  gathered and not released. Prefetching stops at this bound; a layer the caller fetches is always gathered,
     *  so the bound holds when it is at least the largest layer plus what the caller keeps unreleased. Below the
     *  largest layer's gathered bytes (padded to a multiple of nranks elements) it is rejected at creation.
     *  0: ZCCL_ZERO3_MAX_LIVE_BYTES (default 1 GiB). */
    size_t max_live_bytes;
    /** The parameters' wire format when a layer is gathered (qwZ of ZeRO++, Wang et al. 2023): ZCCL_WIRE_FULL (0,
     *  the default) gathers the datatype itself; a quantized format (ZCCL_WIRE_INT8 is qwZ's) gathers each rank's
     *  shard with zccl_allgather_wire queued on the store's stream (prefetch overlaps as before). The gathered
     *  layer then holds the decoded values on every rank, this rank's own shard included, bitwise equal across
     *  ranks, each within the bound of one quantization (zccl.h, zccl_wire_t; blocks of ZCCL_QUANT_BLOCK elements
     *  from each shard's first element); the shards the store keeps (zccl_zero3_shard, the optimizer's master
     *  copy) stay exact. Needs a floating datatype (float32, float64, float16, bfloat16). Every rank passes the same
     *  wire. */
    zccl_wire_t wire;
    /** 1: hierarchical partitioning of the gathered parameters (hpZ of ZeRO++, Wang et al. 2023); 0 (the
     *  default): every fetch gathers across all ranks. Every rank passes the same value (part of the cross-rank
     *  check at creation).
     *  What it does. A layer is fetched more than once a step (forward, then backward). The FIRST recorded fetch
     *  position of a layer in a step (its primary) gathers across all ranks as without hpZ (with `wire`; with a
     *  quantized wire, G >= 2 and a datatype other than float64 through zccl_allgather_hier, bitwise the same output
     *  with each wire string crossing between hosts once per host, stats.hier_gathers); when that
     *  fetch's gather has completed, each rank copies out the slice of the gathered layer that belongs to its local
     *  rank j within its host, elements [j*padded/G, (j+1)*padded/G) for G ranks per host (padded: the layer's
     *  element count rounded up to a multiple of nranks, so G divides it), into a buffer of its own
     *  (the secondary partition). Every LATER fetch position of that layer in the same step gathers only inside the
     *  host, from those slices, in full precision of the datatype (zccl_allgather on a communicator of the host's
     *  ranks, queued on the store's stream): so exactly one gather per layer per step crosses hosts, and with a
     *  quantized wire the later copies hold the values the primary gather decoded, bitwise equal to the first copy
     *  and across ranks (no second quantization; the in-host gather moves the datatype's bytes, not the wire's). With one rank per host (G = 1) the slice is the whole layer and a
     *  later fetch is a local copy, no communication. A later position is never issued (fetched or prefetched)
     *  before its layer's primary fetch of the step has returned: prefetching pauses there.
     *  Memory: padded/G elements per layer per rank, for the whole life of the store (not counted in
     *  max_live_bytes, which bounds the gathered layers as before); the gathered buffers are unchanged.
     *  Hosts: the identity of the hierarchical calls (include/zccl_hier.h): ZCCL_HOST_ID when set (simulated hosts),
     *  else the real host. Creation all-gathers every rank's host key, so every rank computes the same layout, and
     *  splits comm into one communicator per host, owned by the store (freed by zccl_zero3_destroy). One host (every
     *  rank shares it): nothing leaves a host anyway, so the store logs an INFO line and runs without hpZ
     *  (stats.hpz_gathers stays 0). Errors: ZCCL_INVALID_ARGUMENT on every rank when the hosts hold different
     *  numbers of ranks (the message names the host sizes: the slices must tile the layer), or when hpz is not 0 or
     *  1 (on the rank that passed it); the split's errors. */
    int hpz;
} zccl_zero3_options_t;

/**
 * Creates the store. A layer is a group of parameters that runs together; the caller lays its parameters out in
 * one vector of layer_numel[l] elements. Each layer's vector is padded to a multiple of nranks elements
 * (P = padded / nranks) and rank r keeps elements [r*P, (r+1)*P) — its shard — in memory owned by the store.
 * Collective: every rank passes the same layer sizes (checked with one small all-reduce of their hash).
 * comm must be a communicator used by nothing else while a step runs (see the file comment: one made with
 * zccl_comm_shrink(comm, NULL, 0, &comm3) when a bucket plan uses the first); it must outlive the store.
 * @param nlayers      >= 1.
 * @param layer_numel  nlayers element counts, each >= 1; copied.
 * @param datatype     any zccl_datatype_t (parameters are only moved, never combined).
 * @param opts         options or NULL.
 * @param[out] z       the new store; NULL on failure.
 * Errors: ZCCL_INVALID_ARGUMENT (NULL arguments, nlayers < 1, a layer_numel[l] of 0 named by index, datatype out
 * of range, overflow, max_live_bytes below the largest layer's gathered bytes, opts->wire out of range or
 * quantized with a datatype that is not floating, opts->hpz not 0 or 1 — on the rank that passed it; with hpz,
 * hosts of unequal sizes — on every rank, naming the sizes);
 * ZCCL_INVALID_USAGE (ranks disagree on the layers, wires or hpz, or another rank's max_live_bytes is too small:
 * every rank fails, none is left waiting); ZCCL_SYSTEM_ERROR; communication errors (and, with hpz, the per-host
 * split's).
 */
zccl_result_t zccl_zero3_create(zccl_comm_t comm, int nlayers, const size_t *layer_numel, zccl_datatype_t datatype,
                                const zccl_zero3_options_t *opts, zccl_zero3_t *z);

/** Waits for gathers in flight, frees every buffer. NULL accepted. Not collective. Always ZCCL_SUCCESS. */
zccl_result_t zccl_zero3_destroy(zccl_zero3_t z);

/**
 * This rank's shard of layer `layer`: *shard points to *count (= P) elements, which are elements [*offset,
 * *offset + P) of the layer's padded vector (elements past layer_numel are padding; keep them as you like, they
 * are gathered but not meaningful). The caller initialises and updates the shard (optimizer step) between steps;
 * it must not change it between zccl_zero3_begin and zccl_zero3_end (a prefetch may copy it any time). Any output
 * may be NULL. Errors: ZCCL_INVALID_ARGUMENT (z NULL, layer out of range).
 */
zccl_result_t zccl_zero3_shard(zccl_zero3_t z, int layer, void **shard, size_t *count, size_t *offset);

/**
 * Starts a training step (forward and backward). Step 1 (the first begin) records the sequence of fetches;
 * later steps prefetch along the recorded sequence. Errors: ZCCL_INVALID_ARGUMENT (z NULL); ZCCL_INVALID_USAGE
 * (a step is open); the store's earlier error.
 */
zccl_result_t zccl_zero3_begin(zccl_zero3_t z);

/**
 * Returns in *full the layer's gathered parameters (layer_numel[layer] meaningful elements, padded vector), valid
 * until zccl_zero3_release(z, layer). Collective in effect: every rank must fetch the same layers in the same order
 * (forward: first to last; backward: last to first, each layer fetched again after its release).
 *  - Step 1: the store checks, before each gather, that all ranks fetch the same layer (one all-reduce of two
 *    64-bit words per fetch, in step 1 only), then gathers and waits. A rank that fetches a different layer (or
 *    ends the step early, see zccl_zero3_end) makes every rank fail with ZCCL_INVALID_USAGE naming step 1, the
 *    fetch's position and the differing layers — an error, not a hang.
 *  - Later steps: fetch #i must be the layer recorded at position i in step 1, otherwise ZCCL_INVALID_USAGE names
 *    the step, the position and both layers (nothing is issued, so ranks following the recorded order are not left
 *    waiting on a mismatched collective; they will wait in their next gather, so set ZCCL_TIMEOUT_MS). The layer
 *    was usually prefetched; the call then waits only for the rest of its gather (exposed time), and issues gathers
 *    of the next recorded layers while the live bytes stay within max_live_bytes.
 * Errors: ZCCL_INVALID_ARGUMENT (z or full NULL, layer out of range); ZCCL_INVALID_USAGE (no open step; the layer
 * is fetched and not released; the order errors above); communication errors (break the store).
 */
zccl_result_t zccl_zero3_fetch(zccl_zero3_t z, int layer, void **full);

/**
 * Frees the layer's gathered parameters (the pointer from fetch becomes invalid) and lets prefetching continue.
 * Errors: ZCCL_INVALID_ARGUMENT (z NULL, layer out of range); ZCCL_INVALID_USAGE (the layer is not fetched).
 */
zccl_result_t zccl_zero3_release(zccl_zero3_t z, int layer);

/**
 * Ends the step: waits for gathers in flight and frees prefetched layers never fetched. Step 1: ends the recording
 * with the same cross-rank check as a fetch (so a rank that fetched fewer layers is caught). Later steps: a
 * sequence shorter than the recorded one is ZCCL_INVALID_USAGE naming the step and the first missing fetch.
 * Layers still fetched are released. Errors: ZCCL_INVALID_ARGUMENT (z NULL); ZCCL_INVALID_USAGE (no open step; the
 * cases above); communication errors.
 */
zccl_result_t zccl_zero3_end(zccl_zero3_t z);

/** Counters of a ZeRO-3 store since creation. */
typedef struct {
    size_t live_bytes;       /**< gathered or in-flight layer bytes now */
    size_t peak_live_bytes;  /**< most live bytes at one time */
    size_t max_live_bytes;   /**< the bound in force */
    uint64_t gathers;        /**< layer gathers issued: every fetch position's, across all ranks or (hpZ) inside
                                  the host; gathers - hpz_gathers crossed the whole communicator */
    uint64_t hpz_gathers;    /**< hpZ (zccl_zero3_options_t.hpz): gathers served inside the host from the secondary
                                  partition (a local copy with one rank per host); 0 without hpZ */
    uint64_t prefetched;     /**< fetches whose gather had been issued before the fetch (prefetch hits) */
    double fetch_wait_s;     /**< total time fetches waited for gathers (exposed gather time) */
    double gather_s;         /**< total time from issue to completion of gathers, summed */
    int steps;               /**< steps ended */
    uint64_t registered_allocs; /**< gathered-layer buffers allocated with zccl_mem_alloc and registered (the pool,
                                     where every rank shares one host and ZCCL_BUCKET_REGISTER=1); released buffers
                                     are reused, so after step 1 this grows only when a layer finds no idle buffer
                                     of its size (at most twice it). 0: ordinary memory */
    uint64_t hier_gathers;   /**< hpZ with a quantized wire: primary gathers issued as zccl_allgather_hier (each wire
                                  string crosses once per host; bitwise the flat call's output); 0 otherwise */
} zccl_zero3_stats_t;

/** Copies the counters. Errors: ZCCL_INVALID_ARGUMENT (z or stats NULL). */
zccl_result_t zccl_zero3_stats(zccl_zero3_t z, zccl_zero3_stats_t *stats);

/* ------------------------------------------------------------------------------------------------------------ */
/* CPU offload of the optimizer (ZeRO-1/2)                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

/*
 * The shape of DeepSpeed's offload_optimizer {device: cpu, pin_memory: true} (Ren et al., "ZeRO-Offload:
 * Democratizing Billion-Scale Model Training", USENIX ATC 2021) over a bucket plan: this rank's master copy of its
 * parameter shard and the AdamW moments live in host memory, never on the device. After a sync micro-step each
 * bucket's reduced gradient shard is copied to host staging as soon as the bucket's collective completes (on the
 * plan's stream thread, so while the caller's backward continues; a shard in device memory is copied on a side CUDA
 * stream), zccl_zero_offload_step runs AdamW on the CPU over the shard, writes the updated shard into the caller's
 * parameter buffer (host-to-device when that is device memory) and all-gathers every bucket in place, so every rank
 * ends with all updated parameters.
 *
 * Precision: the master copy and both moments are float32 for float32, float16 and bfloat16 parameters and
 * float64 for float64 ones; every element's update is computed in double and stored in that type, then converted
 * to the parameters' type. With float64 parameters the update is the same arithmetic, in the same order, as
 *   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;
 *   if decays: p -= lr wd p;  p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)      (t = step, from 1)
 * (AdamW, Loshchilov & Hutter, ICLR 2019), so it matches a host-side implementation of that formula bit for bit.
 *
 * Gradient clipping: zccl_bucket_grad_norm works as usual; pass the clipping factor in grad_scale.
 * zccl_bucket_scale_shards after the micro-step does NOT reach the offload's copy (already taken).
 */

/** Opaque CPU-offloaded optimizer bound to one bucket plan. */
typedef struct zccl_zero_offload *zccl_zero_offload_t;

/** Options; zero-initialise, a field left 0 takes its default. */
typedef struct {
    /** Nonzero: page-locked host memory (cuMemAllocHost) for the optimizer state and the staging buffers when a CUDA
     *  driver can be loaded (faster device-to-host copies; DeepSpeed's pin_memory); ordinary memory otherwise, and
     *  where the driver refuses (zccl_zero_offload_stats tells which). 0: ordinary host memory. */
    int pin_memory;
} zccl_zero_offload_options_t;

/** AdamW hyperparameters of one step. */
typedef struct {
    double lr;           /**< learning rate, finite */
    double beta1, beta2; /**< moment decay rates, in [0, 1) */
    double eps;          /**< > 0 */
    double weight_decay; /**< decoupled weight decay, finite; applied to the decay_elems of each parameter */
    double grad_scale;   /**< the reduced gradient is multiplied by this first (1 / global batch, clipping factor);
                              finite (0 is accepted and gives a pure decay step) */
} zccl_zero_adamw_t;

/** Counters and memory of an offload. */
typedef struct {
    size_t host_state_bytes;   /**< master shard + two moments: 3 x shard elements x 4 (8 for float64) bytes */
    size_t host_staging_bytes; /**< gradient shard staging (+ parameter shard staging when parameters are device
                                    memory), shard elements x element size each */
    size_t pinned_bytes;       /**< how many of the above bytes are page-locked */
    int params_on_device;      /**< the parameter buffers are device memory */
    uint64_t steps;            /**< steps taken */
    uint64_t grad_copies_overlapped; /**< bucket shards copied as their collective completed (during backward) */
    uint64_t grad_copies_at_step;    /**< bucket shards the step had to copy itself */
    uint64_t device_copies;    /**< copies that went through the side CUDA stream (device-to-host) */
    double copy_wait_s;        /**< time steps waited for gradient copies */
    double cpu_s;              /**< time in the CPU AdamW update */
} zccl_zero_offload_stats_t;

/**
 * Binds a CPU-offloaded AdamW optimizer to a plan (ALLREDUCE mode: ZeRO-1, the rank updates its shard of the
 * all-reduced buckets; REDUCE_SCATTER mode: ZeRO-2). Allocates 3 x shard elements of state and the staging buffers
 * in host memory and initialises the master shard from this rank's shard of bucket_params (so set the parameters
 * first: every rank must hold the same values). From now on the plan copies each bucket's final shard to the host
 * in every sync micro-step. Local (not collective). Create it between micro-steps; destroy it before the plan.
 * @param plan          a plan with a communicator (not a layout); at most one offload per plan.
 * @param bucket_params nbuckets pointers: bucket b's parameters laid out as its gradients are
 *                      (zccl_bucket_param_loc), elems elements of the plan's datatype each, all host memory or all
 *                      device memory. The pointers are kept; the step writes this rank's shard and all-gathers the
 *                      rest in place. Between steps the caller only reads them.
 * @param decay_elems   nparams counts, or NULL: the first decay_elems[i] elements of parameter i get weight decay
 *                      (e.g. the weights of a [weights | biases] vector); NULL: every element. Copied.
 * @param opts          options or NULL.
 * @param[out] off      the new offload; NULL on failure.
 * Errors: ZCCL_INVALID_ARGUMENT (NULL arguments or bucket_params[b], decay_elems[i] > numel[i], host and device
 * buffers mixed); ZCCL_INVALID_USAGE (a layout plan, a micro-step open, the plan already has an offload, device
 * buffers without a CUDA driver); ZCCL_SYSTEM_ERROR (memory, a driver call, named).
 */
zccl_result_t zccl_zero_offload_create(zccl_bucket_plan_t plan, void *const *bucket_params,
                                       const size_t *decay_elems, const zccl_zero_offload_options_t *opts,
                                       zccl_zero_offload_t *off);

/** Detaches from the plan, waits for copies in flight, frees the host memory. NULL accepted. Always ZCCL_SUCCESS. */
zccl_result_t zccl_zero_offload_destroy(zccl_zero_offload_t off);

/**
 * Gives bucket `bucket`'s reduced gradient shard for the next step from memory the caller reduced itself (e.g. its
 * own reduce-scatter on device buffers): shard_elems elements of the plan's datatype, host or device memory. A device
 * shard is copied on the side stream and the call returns at once; the step waits for it; the caller must not
 * change `shard` until the step returns. The copy is not ordered after the caller's own GPU work: whatever writes
 * `shard` must have completed (zccl's collectives on device memory return once their result is in place; a
 * kernel of the caller's needs a stream synchronize first). Overrides the plan's copy of that bucket for the next
 * step. Local.
 * Errors: ZCCL_INVALID_ARGUMENT (off or shard NULL, bucket out of range); ZCCL_INVALID_USAGE / ZCCL_SYSTEM_ERROR
 * (device memory without a usable driver; a failed copy).
 */
zccl_result_t zccl_zero_offload_grad_shard(zccl_zero_offload_t off, int bucket, const void *shard);

/**
 * One AdamW step: waits for the gradient shard copies, updates the host master shard and moments on the CPU, writes
 * the updated shard into bucket_params (converted to the plan's datatype) and all-gathers each bucket in place on
 * the plan's stream. Call after zccl_bucket_finish of a sync micro-step, once per window (or after
 * zccl_zero_offload_grad_shard for every bucket). Collective (the all-gathers): every rank steps together.
 * Errors: ZCCL_INVALID_ARGUMENT (off or hp NULL, hyperparameters out of range, named); ZCCL_INVALID_USAGE (a
 * micro-step open; no gradient: no finished sync micro-step and no grad_shard for a bucket, named; the window was
 * already stepped); the plan's earlier error; copy and communication errors. After a copy or communication error
 * the host state may be partly updated: restore it from a checkpoint (zccl_zero_offload_master) or start over.
 */
zccl_result_t zccl_zero_offload_step(zccl_zero_offload_t off, const zccl_zero_adamw_t *hp);

/**
 * This rank's host optimizer state of bucket `bucket`: master parameters, first and second moments, each *count
 * (= shard_elems) elements of float32 (float64 for float64 plans), for checkpoints and tests. Read or write them
 * between steps only. Any output may be NULL. Errors: ZCCL_INVALID_ARGUMENT (off NULL, bucket out of range).
 */
zccl_result_t zccl_zero_offload_master(zccl_zero_offload_t off, int bucket, void **master, void **exp_avg,
                                       void **exp_avg_sq, size_t *count);

/** Copies the counters. Errors: ZCCL_INVALID_ARGUMENT (off or stats NULL). */
zccl_result_t zccl_zero_offload_stats(zccl_zero_offload_t off, zccl_zero_offload_stats_t *stats);

/**
 * Host bytes an offload on this plan allocates per rank, for planning (works on layout plans): *state_bytes =
 * 3 x S x 4 (x 8 for float64) — master shard and two moments; *staging_bytes = S x element size, twice when
 * params_on_device (the updated shard is staged before its host-to-device copy); S = sum of shard_elems over the
 * buckets. Either output may be NULL. Errors: ZCCL_INVALID_ARGUMENT (plan NULL).
 */
zccl_result_t zccl_zero_offload_host_bytes(zccl_bucket_plan_t plan, int params_on_device, size_t *state_bytes,
                                           size_t *staging_bytes);

#ifdef __cplusplus
}
#endif
#endif /* ZCCL_ZERO_H */

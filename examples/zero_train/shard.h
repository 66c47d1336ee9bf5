/*
 * shard.h — zero_train's ZeRO stages, driven through zccl's bucket scheduler and ZeRO-3 parameter store
 * (include/zccl_zero.h). Each layer's weight matrix and bias form one flat parameter vector ([W | b], as FSDP's
 * flat parameters), so a layer is one parameter of the bucket plan and one layer of the ZeRO-3 store. Stage
 * semantics (Rajbhandari et al., "ZeRO: Memory optimizations toward training trillion parameter models", SC 2020):
 *   0  plain data parallel: every rank holds everything; buckets all-reduced at the accumulation boundary;
 *   1  optimizer state sharded: all-reduce at the boundary, each rank updates its shard of every bucket, then the
 *      parameters are all-gathered;
 *   2  + gradients sharded: every micro-step reduce-scatters each bucket into this rank's shard accumulator;
 *   3  + parameters sharded: the ZeRO-3 store all-gathers a layer before it runs (forward and backward),
 *      prefetching along the recorded order, and releases it after use.
 * Everything is float64, so runs on 1 and N ranks differ only in the order of the cross-rank sums.
 */
#ifndef ZT_SHARD_H
#define ZT_SHARD_H

#include <stddef.h>
#include <stdio.h>
#include <zccl_zero.h>

#define ZT_MAX_LAYERS 8

typedef struct {
    int stage, nranks, rank;
    zccl_comm_t comm, comm3;     /* comm3: the ZeRO-3 store's own communicator (stage 3) */
    int nlayers;
    size_t numel[ZT_MAX_LAYERS]; /* layer vector: weights then biases */
    size_t nweights[ZT_MAX_LAYERS]; /* the first nweights elements get weight decay */
    zccl_bucket_plan_t plan;
    zccl_zero3_t z3;
    zccl_zero_offload_t off;     /* --offload cpu (stages 1, 2): AdamW state in host memory, step on the CPU */
    int nbuckets;
    zccl_bucket_info_t info[ZT_MAX_LAYERS];
    size_t bucket_base[ZT_MAX_LAYERS]; /* element offset of bucket b in the flat parameter buffer (stages 0-2) */
    size_t shard_base[ZT_MAX_LAYERS];  /* element offset of bucket b's shard in m, v */
    int bucket_of[ZT_MAX_LAYERS];
    size_t off_in_bucket[ZT_MAX_LAYERS];
    size_t flat, shard;          /* padded elements: whole layout, one rank's shard */
    size_t psi;                  /* parameters without padding */
    double *params;              /* stages 0-2: the whole flat layout; stage 3: in the ZeRO-3 store */
    double *m, *v;               /* AdamW moments: flat (stage 0) or shard (stages 1-3) */
    double *eval[ZT_MAX_LAYERS]; /* stage 3 evaluation: gathered layers */
    long step;
    zccl_wire_t grad_wire, weight_wire; /* ZeRO++: qgZ (bucket plan), qwZ (stage-3 gathers) */
    int hpz_g;                   /* ZeRO++ hpZ (stage 3, --hpz) on several hosts: ranks per host; 0: off */
    size_t hpz_bytes;            /* hpZ: the store's secondary partition on this rank (padded/G per layer) */
    unsigned char fetched[ZT_MAX_LAYERS]; /* stage 3, this micro-step: layer fetched before (hpZ: inside the host) */
    /* bytes this rank sent, by the bandwidth-optimal volume of each collective it issued */
    double sent_grads, sent_params, sent_other;
    double sent_params_host;     /* hpZ: the part of sent_params gathered inside the host (full precision) */
} zt_zero_t;

/*
 * Creates the bucket plan (and, in stage 3, the ZeRO-3 store on a second communicator) for nlayers layer vectors of
 * numel[l] elements whose first nweights[l] elements decay. first_bytes / cap_bytes / in_flight: the plan's
 * bucket targets and K (stage 3 uses one bucket per layer so that gradient and parameter shards coincide);
 * max_live_bytes: the ZeRO-3 store's bound on gathered layer bytes (0: ZCCL_ZERO3_MAX_LIVE_BYTES); grad_wire: the
 * gradient buckets' wire format (ZeRO++ qgZ; zccl_bucket_options_t.wire), weight_wire: stage 3's layer gathers'
 * (qwZ; zccl_zero3_options_t.wire); ZCCL_WIRE_FULL for plain float64; hpz: stage 3's hierarchical partitioning
 * (ZeRO++ hpZ; zccl_zero3_options_t.hpz): a layer's second fetch of a micro-step gathers inside the host;
 * error_feedback: the gradient buckets' error feedback (zccl_bucket_options_t.error_feedback; quantized grad_wire).
 * Collective. Returns ZCCL_SUCCESS or the failing call's result (message in zccl_get_last_error).
 */
zccl_result_t zt_zero_init(zt_zero_t *z, zccl_comm_t comm, int stage, int nlayers, const size_t *numel,
                           const size_t *nweights, size_t first_bytes, size_t cap_bytes, int in_flight,
                           size_t max_live_bytes, zccl_wire_t grad_wire, zccl_wire_t weight_wire, int hpz,
                           int error_feedback);
void zt_zero_free(zt_zero_t *z);

/* Rank 0's layer vectors (full[l], numel[l] elements; ignored elsewhere) are broadcast; each rank keeps what its
 * stage holds. Collective. */
zccl_result_t zt_zero_set_params(zt_zero_t *z, double *const *full_on_root);

/* --offload cpu: moves the optimizer (AdamW moments and master shard) to host memory through zccl_zero_offload
 * (zccl_zero.h); call after zt_zero_set_params, stages 1 and 2 only. pin: page-locked host memory when CUDA is
 * present. zt_zero_step then runs the update on the CPU inside the library; the results are the same bit for bit
 * (everything is float64 and the update is the same formula). */
zccl_result_t zt_zero_offload(zt_zero_t *z, int pin);

/* Micro-step: begin (last = accumulation boundary), then per layer fetch/release and grad/ready, then end. */
zccl_result_t zt_zero_begin_micro(zt_zero_t *z, int last);
zccl_result_t zt_zero_end_micro(zt_zero_t *z);
/* Layer l's parameter vector (numel[l] elements), gathered first in stage 3; valid until zt_zero_release. */
zccl_result_t zt_zero_fetch(zt_zero_t *z, int l, const double **full);
zccl_result_t zt_zero_release(zt_zero_t *z, int l);
/* Where backward adds layer l's gradient (numel[l] elements) in this micro-step; then mark it ready. */
zccl_result_t zt_zero_grad(zt_zero_t *z, int l, double **grad);
zccl_result_t zt_zero_grad_ready(zt_zero_t *z, int l);

/* Outside a micro-step (evaluation): layer l's parameters, all-gathered by hand in stage 3. Collective. */
zccl_result_t zt_zero_eval_fetch(zt_zero_t *z, int l, const double **full);

/*
 * AdamW step (Loshchilov & Hutter, "Decoupled weight decay regularization", ICLR 2019) on the owned elements
 * with gradient = accumulated sum / global_batch, after global-norm clipping to clip (Pascanu et al. 2013; 0: no
 * clipping). The norm comes from zccl_bucket_grad_norm (shards and one scalar all-reduce); *norm receives it,
 * divided by global_batch. Stages 1 and 2 all-gather the updated parameters. Collective.
 */
zccl_result_t zt_zero_step(zt_zero_t *z, double lr, double beta1, double beta2, double eps, double wd, double clip,
                           double global_batch, double *norm);

/* Sum of n doubles over ranks (loss, counts), counted as "other" traffic. Collective. */
zccl_result_t zt_zero_sum(zt_zero_t *z, double *vals, int n);

/* Per-rank persistent bytes of parameters, gradients, optimizer state, and working bytes (bucket buffers in
 * reduce-scatter mode, ZeRO-3 peak gathered bytes). */
void zt_zero_memory(const zt_zero_t *z, size_t *params, size_t *grads, size_t *opt, size_t *work);

/* Prints the bucket scheduler's and the ZeRO-3 store's counters (zccl_bucket_stats, zccl_zero3_stats). */
void zt_zero_report(const zt_zero_t *z, FILE *f);

#endif

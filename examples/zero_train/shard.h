/*
 * shard.h — zero_train's ZeRO stages over zccl collectives: the flat parameter layout (buckets in reverse
 * definition order, each padded to a multiple of nranks x alignment; rank r owns slice r of every bucket), the
 * gradient path (where backward writes, what happens when a bucket is complete), the ZeRO-3 parameter fetch, and
 * the AdamW step on the owned slices. Stage semantics (Rajbhandari et al., "ZeRO: Memory optimizations toward
 * training trillion parameter models", SC 2020):
 *   0  plain data parallel: every rank holds everything; gradients all-reduced at the accumulation boundary;
 *   1  optimizer state sharded: all-reduce at the boundary, each rank updates its slices, all-gather parameters;
 *   2  + gradients sharded: every micro-step reduce-scatters each bucket into the rank's shard accumulator;
 *   3  + parameters sharded: all-gathered bucket by bucket before a layer runs (forward and backward), released
 *      after use.
 * All buffers are float64 so that runs on 1 and N ranks differ only by the order of the final cross-rank sums.
 */
#ifndef ZT_SHARD_H
#define ZT_SHARD_H

#include <stddef.h>
#include <zccl.h>

#define ZT_MAX_TENSORS 16
#define ZT_MAX_BUCKETS 16

typedef struct {
    int stage, nranks, rank;
    zccl_comm_t comm;
    int ntensors;
    const char *name[ZT_MAX_TENSORS];
    size_t numel[ZT_MAX_TENSORS];
    int decay[ZT_MAX_TENSORS];      /* AdamW weight decay applies (weights yes, biases no) */
    size_t tensor_off[ZT_MAX_TENSORS]; /* element offset in the flat layout */
    int tensor_bucket[ZT_MAX_TENSORS];
    int nbuckets;
    size_t bucket_off[ZT_MAX_BUCKETS], bucket_len[ZT_MAX_BUCKETS]; /* elements, len padded */
    size_t shard_off[ZT_MAX_BUCKETS];                              /* offset of the bucket's slice in a shard */
    int bucket_tensors[ZT_MAX_BUCKETS];
    size_t flat;     /* padded elements of the whole layout */
    size_t shard;    /* elements a rank owns: sum of bucket_len / nranks */
    size_t psi;      /* unpadded parameter count */
    /* persistent state */
    double *params;  /* flat (stages 0-2) or shard (stage 3) */
    double *grads;   /* flat (stages 0, 1) or shard accumulator (stages 2, 3) */
    double *m, *v;   /* flat (stage 0) or shard (stages 1-3) */
    long step;
    /* working buffers: one per bucket while live */
    double *gbuf[ZT_MAX_BUCKETS];
    int gready[ZT_MAX_BUCKETS];
    double *pbuf[ZT_MAX_BUCKETS];
    int prefs[ZT_MAX_BUCKETS];
    int boundary;    /* the current micro-step is the last before the optimizer step */
    size_t work_bytes, work_peak;
    /* bytes this rank sent, by the bandwidth-optimal volumes of each collective */
    double sent_grads, sent_params, sent_other;
} zt_zero_t;

/*
 * Lays out ntensors tensors (definition order) into buckets: reverse definition order, a bucket closes once it
 * holds >= first_bytes (the first) or >= cap_bytes (the others), each padded to a multiple of nranks*align_elems.
 * Allocates the stage's persistent state. Returns 0 or -1 with a message on stderr.
 */
int zt_zero_init(zt_zero_t *z, zccl_comm_t comm, int stage, int ntensors, const char *const *names,
                 const size_t *numel, const int *decay, size_t first_bytes, size_t cap_bytes, size_t align_elems);
void zt_zero_free(zt_zero_t *z);

/* Rank 0's full flat parameter vector (ignored elsewhere) is broadcast; each rank keeps what its stage holds. */
zccl_result_t zt_zero_set_params(zt_zero_t *z, const double *flat_on_root);

/* Starts an optimizer step's gradient accumulation (zeroes the gradient state). */
void zt_zero_begin_step(zt_zero_t *z);
/* Starts micro-step; last says it is the last before zt_zero_step (the accumulation boundary). */
void zt_zero_begin_micro(zt_zero_t *z, int last);
/* Where backward adds tensor t's gradient (numel[t] elements) for this micro-step. */
double *zt_zero_grad(zt_zero_t *z, int t);
/* Tensor t's gradient is complete for this micro-step; a complete bucket is communicated per the stage. */
zccl_result_t zt_zero_grad_ready(zt_zero_t *z, int t);

/* Tensor t's parameters, all-gathered first in stage 3 (the bucket stays live until every fetch is released). */
zccl_result_t zt_zero_fetch(zt_zero_t *z, int t, const double **out);
void zt_zero_release(zt_zero_t *z, int t);

/*
 * AdamW step (Loshchilov & Hutter, "Decoupled weight decay regularization", ICLR 2019) on the owned slices with
 * gradient = accumulated sum / global_batch, after global-norm clipping to clip (Pascanu et al. 2013; clip <= 0:
 * none). *norm receives the global gradient norm before clipping. Stages 1, 2 all-gather the updated parameters.
 */
zccl_result_t zt_zero_step(zt_zero_t *z, double lr, double beta1, double beta2, double eps, double wd, double clip,
                           double global_batch, double *norm);

/* Scalar sum over ranks (loss, counts), counted as "other" traffic. */
zccl_result_t zt_zero_sum(zt_zero_t *z, double *vals, int n);

#endif

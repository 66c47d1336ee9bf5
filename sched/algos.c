/*
 * algos.c — the registry of algorithms (algo.h) and the cost model's shared pieces. Each algorithm's builders,
 * predictor and formula live in its own file (sched_<name>.c); this table lists them.
 */
#include <math.h>
#include "algo.h"

extern const zccl_algo_t zccl__algo_ring, zccl__algo_rabenseifner, zccl__algo_recdbl, zccl__algo_bruck,
    zccl__algo_tree, zccl__algo_direct, zccl__algo_hier;

/* Row = the algorithm's id (zccl_sched_args_t.algo; the ZCCL_ALGO_* names in schedule.h follow this order). Order
 * = preference on equal predictions: fewer concurrent messages per step first. On 4 ranks the model gives direct
 * (one step, 3 messages) and the log-step algorithms (2 steps of one message) the same latency term, and on the
 * 2-core VM the log-step ones were measured as fast or faster (docs/tuning.md). */
const zccl_algo_t *const zccl__algo_table[] = {
    &zccl__algo_ring,   &zccl__algo_rabenseifner, &zccl__algo_recdbl, &zccl__algo_bruck,
    &zccl__algo_tree,   &zccl__algo_direct,       &zccl__algo_hier,
};
const int zccl__nalgos = (int)(sizeof zccl__algo_table / sizeof zccl__algo_table[0]);
_Static_assert(sizeof zccl__algo_table / sizeof zccl__algo_table[0] <= ZCCL_TUNE_MAX_ALGOS,
               "registry larger than the tuner's bitmask");
_Static_assert(sizeof zccl__algo_table / sizeof zccl__algo_table[0] >= ZCCL_ALGO_COUNT,
               "every ZCCL_ALGO_* name (schedule.h) needs its row; rows after them need no name");

/* ---- the cost model's shared pieces (formulas in docs/tuning.md) ---- */

size_t zccl__pipeline_chunk(size_t bytes, int nranks) {
    size_t c = bytes / (size_t)(4 * (nranks > 1 ? nranks - 1 : 1));
    if (c < (64u << 10)) c = 64u << 10;
    if (c > (4u << 20)) c = 4u << 20;
    return c;
}

double zccl__ceil_log2(int n) {
    int k = 0;
    while ((1 << k) < n) k++;
    return (double)k;
}
int zccl__pow2_floor(int n) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}
zccl_link_cost_t zccl__flat_link(const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    return L->nhosts > 1 ? p->inter : p->intra;
}
/* Bytes: the `share` ranks' messages go through one host link one after another (share x beta_inter), or stay on
 * the intra-host link. Latency: the flat link's alpha for every step, as the lock-step rounds of a flat algorithm
 * wait for each other (a step inside the hosts is not cheaper on the oversubscribed VM, where every step costs
 * process wake-ups; docs/tuning.md "Several hosts"). */
zccl_link_cost_t zccl__shared_link(const zccl_tune_layout_t *L, const zccl_tune_params_t *p, int share) {
    return (zccl_link_cost_t){.alpha = zccl__flat_link(L, p).alpha,
                              .beta = share > 0 ? p->inter.beta * share : p->intra.beta};
}
double zccl__step_cost(zccl_link_cost_t l, int k, double b) {
    if (k <= 0) return 0;
    return l.alpha * (1.0 + (k - 1) * ZCCL_TUNE_RHO) + (double)k * b * l.beta;
}

/* Ring (Patarasuk & Yuan 2009): reduce-scatter then all-gather over n-1 steps each, blocks of m/n bytes.
 * Broadcast/reduce: a pipelined chain of the same ring, ceil(m/chunk) chunks: (n-2+k) steps of one chunk. */
double zccl__ring_cost(zccl_coll_t c, size_t bytes, int n, zccl_link_cost_t l, const zccl_tune_params_t *p) {
    if (n <= 1) return 0;
    const double m = (double)bytes, blk = m / n, red = (n - 1) * blk * p->gamma;
    switch (c) {
    case ZCCL_COLL_ALLREDUCE: return 2.0 * (n - 1) * zccl__step_cost(l, 1, blk) + red;
    case ZCCL_COLL_REDUCE_SCATTER: return (n - 1) * zccl__step_cost(l, 1, blk) + red;
    case ZCCL_COLL_ALLGATHER: return (n - 1) * zccl__step_cost(l, 1, blk);
    case ZCCL_COLL_BROADCAST:
    case ZCCL_COLL_REDUCE: {
        const double k = ceil(m / (double)zccl__pipeline_chunk(bytes, n)), cb = m / (k > 0 ? k : 1);
        return (n - 2 + k) * (zccl__step_cost(l, 1, cb) + (c == ZCCL_COLL_REDUCE ? cb * p->gamma : 0.0));
    }
    default: return 0;
    }
}

void zccl__formula_terms(const zccl_sched_args_t *a, const zccl_cost_params_t *p, zccl_formula_terms_t *t) {
    const int n = a->nranks;
    const double es = (double)(a->elem_size ? a->elem_size : 1);
    int pw = 1;
    while (pw * 2 <= n) pw *= 2;
    *t = (zccl_formula_terms_t){.n = n, .pw = pw, .e = n - pw, .fn = n, .fp = pw, .A = p->alpha, .B = p->beta,
                                .G = p->gamma,
                                .m = a->coll == ZCCL_COLL_ALLREDUCE ? es * (double)a->count
                                                                     : es * (double)a->count * n};
}

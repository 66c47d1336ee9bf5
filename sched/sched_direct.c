/*
 * sched_direct.c — direct (one-shot) all-reduce for small messages; direct reduce-scatter and all-gather below.
 *
 * Every rank sends its whole vector to every other rank in one phase, then reduces the n vectors locally in rank
 * order 0, 1, ..., n-1. It takes one communication step instead of the ring's 2(n-1), at the price of sending
 * (n-1) full vectors instead of 2(n-1)/n of one, so it only pays for small messages, where latency dominates
 * (the "latency-optimal" end of the alpha-beta trade-off, Thakur, Rabenseifner & Gropp, IJHPCA 2005). Because
 * every rank combines the same values in the same order, all ranks get bitwise-identical results.
 */
#include <math.h>
#include "algo.h"

/* TMP slot q holds rank q's vector (all-reduce) or its contribution to this rank's block (reduce-scatter); this
 * rank's own one is at own_buf[own_off]. RECV = v0 op v1, then RECV = RECV op v2, ...: the same order on every rank,
 * so results are deterministic; the last step divides for ZCCL_AVG. */
static void reduce_in_rank_order(zccl_schedule_t *s, int n, int r, size_t c, uint8_t own_buf, size_t own_off) {
    for (int q = 1; q < n; q++) {
        /* operand a: v0 for the first step (own or received), then the running result in RECV */
        const uint8_t a_buf = q > 1 ? ZCCL_BUF_RECV : (r == 0 ? own_buf : ZCCL_BUF_TMP);
        const size_t a_off = q > 1 ? 0 : (r == 0 ? own_off : 0);
        const uint8_t b_buf = (q == r) ? own_buf : ZCCL_BUF_TMP;
        const size_t b_off = (q == r) ? own_off : (size_t)q * c;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_REDUCE, .buf = ZCCL_BUF_RECV, .src = a_buf,
                                          .src_off = a_off, .src2 = b_buf, .src2_off = b_off, .count = c,
                                          .final = (q == n - 1), .peer = -1});
    }
    zccl__sched_end_phase(s);
}

/* One phase: this rank sends c elements to every peer (from SEND, block `to` of it when per_peer_block) and
 * receives c elements from every peer into slot `from` of TMP. */
static void exchange(const zccl_sched_args_t *a, zccl_schedule_t *s, bool per_peer_block) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND,
                                          .off = per_peer_block ? (size_t)to * c : 0, .src = ZCCL_BUF_NONE,
                                          .peer = to, .count = c});
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_TMP, .src = ZCCL_BUF_NONE,
                                          .peer = from, .off = (size_t)from * c, .count = c});
    }
    zccl__sched_end_phase(s);
}

/* Direct all-reduce (whole vectors) and reduce-scatter (rank q's block to rank q): one exchange phase, then the
 * n contributions reduced locally in rank order. TMP slot q holds rank q's vector or contribution; this rank's own
 * stays in SEND (out of place) or is copied to its slot of TMP (in place: the reductions overwrite RECV, which is
 * SEND or its own block of SEND, before they read it). */
static void direct_reduce(const zccl_sched_args_t *a, zccl_schedule_t *s, bool scatter) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    s->tmp_elems = (size_t)n * c;
    const uint8_t own_buf = a->in_place ? ZCCL_BUF_TMP : ZCCL_BUF_SEND;
    const size_t own_off = (scatter || a->in_place) ? (size_t)r * c : 0;
    if (a->in_place)
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_TMP, .off = (size_t)r * c,
                                          .src = ZCCL_BUF_SEND, .src_off = scatter ? own_off : 0, .peer = -1,
                                          .count = c});
    exchange(a, s, scatter);
    reduce_in_rank_order(s, n, r, c, own_buf, own_off);
}

void zccl__sched_direct_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) { direct_reduce(a, s, false); }

/*
 * Direct reduce-scatter (for ranks on one host, over shared memory): every rank sends block q of its input to rank
 * q and receives block r from every peer in one phase, then reduces the n contributions to its block locally in
 * rank order 0, 1, ..., n-1. Each block is reduced at one rank only, so results are deterministic; one step of
 * latency, (n-1)/n of the data sent per rank, n blocks of scratch.
 */
void zccl__sched_direct_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s) { direct_reduce(a, s, true); }

/* Direct all-gather: every rank sends its block to every peer in one phase (one step of latency). */
void zccl__sched_direct_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (!a->in_place)
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .off = (size_t)r * c,
                                          .src = ZCCL_BUF_SEND, .peer = -1, .count = c});
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .src = ZCCL_BUF_NONE,
                                          .peer = to, .count = c});
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .off = (size_t)from * c,
                                          .src = ZCCL_BUF_NONE, .peer = from, .count = c});
    }
    zccl__sched_end_phase(s);
}

/* ---- cost model ---- */

/* Direct reduce-scatter / all-gather (sched_direct.c): one step, each rank exchanging one block with each of the
 * n-1 others (reduce-scatter then reduces the n-1 received blocks). Across hosts the step also waits for the
 * busiest host link, which carries ranks_h x (n - ranks_h) blocks. */
static double direct_step(const zccl_tune_layout_t *L, const zccl_tune_params_t *p, double b) {
    const int n = L->nranks;
    const double own = (n - 1) * b * p->intra.beta, across = L->direct_cross * b * p->inter.beta;
    return zccl__flat_link(L, p).alpha * (1.0 + (n - 2) * ZCCL_TUNE_RHO) + (across > own ? across : own);
}
static double predict_direct(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    const int n = L->nranks;
    if (n <= 1) return 0;
    const double m = (double)bytes;
    switch (c) {
    case ZCCL_COLL_ALLREDUCE: return direct_step(L, p, m) + (n - 1) * m * p->gamma;
    case ZCCL_COLL_REDUCE_SCATTER: return direct_step(L, p, m / n) + (n - 1) * (m / n) * p->gamma;
    case ZCCL_COLL_ALLGATHER: return direct_step(L, p, m / n);
    default: return HUGE_VAL;
    }
}

static double formula_direct(const zccl_sched_args_t *a, const zccl_cost_params_t *p) {
    zccl_formula_terms_t t;
    zccl__formula_terms(a, p, &t);
    const double fn = t.fn, A = t.A, B = t.B, G = t.G;
    switch (a->coll) {
    case ZCCL_COLL_ALLREDUCE: return A + (fn - 1) * t.m * B + (fn - 1) * t.m * G;
    case ZCCL_COLL_REDUCE_SCATTER: return A + (fn - 1) / fn * t.m * (B + G);
    case ZCCL_COLL_ALLGATHER: return A + (fn - 1) / fn * t.m * B;
    default: return -1;
    }
}

/* ---- the registry row ---- */

const zccl_algo_t zccl__algo_direct = {
    .name = "direct",
    .build = {
        [ZCCL_COLL_ALLREDUCE] = zccl__sched_direct_allreduce,
        [ZCCL_COLL_REDUCE_SCATTER] = zccl__sched_direct_reduce_scatter,
        [ZCCL_COLL_ALLGATHER] = zccl__sched_direct_allgather,
        /* sched_alltoall.c; these collectives have no other algorithm (schedule.c: algo_free) */
        [ZCCL_COLL_ALLTOALL] = zccl__sched_direct_alltoall,
        [ZCCL_COLL_ALLTOALLV] = zccl__sched_direct_alltoallv,
        [ZCCL_COLL_GATHER] = zccl__sched_direct_gather,
        [ZCCL_COLL_SCATTER] = zccl__sched_direct_scatter,
    },
    .predict = predict_direct,
    .formula = formula_direct,
};

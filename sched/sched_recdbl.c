/*
 * sched_recdbl.c — recursive doubling all-reduce of the whole vector, for tiny messages (Thakur, Rabenseifner &
 * Gropp, IJHPCA 2005, section 4.4: log2(p) steps of alpha + n*beta + n*gamma).
 *
 * With p = 2^k ranks, in the step with distance d = 1, 2, ..., p/2 every rank exchanges its whole partial vector
 * with rank v^d and combines the two. Any n: with p the largest power of two <= n and e = n - p, odd rank 2i+1
 * (i < e) first hands its input to even rank 2i, which takes part as virtual rank i (others: virtual r - e), and
 * gets the result from it at the end (it does not recompute it).
 *
 * Bitwise identity: every combination is written "lower OP upper": the folded pair computes x[2i] OP x[2i+1]; in
 * the step with distance d, the partial of the group whose virtual ranks have bit d clear is the left operand.
 * By induction every member of a group of 2d virtual ranks holds the same expression tree, hence the same bits,
 * whatever the operation's rounding (and even for operations that are not bitwise commutative, e.g. NaN
 * payloads). A rank in the upper half receives into scratch and combines in a local step, because a receive
 * always puts the incoming data second.
 */
#include <math.h>
#include "algo.h"

static void step(zccl_schedule_t *s, zccl_step_t st) { zccl__sched_step(s, st); }

void zccl__sched_recdbl_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int e = n - p;
    if (r < 2 * e && r % 2 == 1) { /* extra: hand over the input, get the result back */
        step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .src = ZCCL_BUF_NONE, .peer = r - 1,
                              .count = c});
        zccl__sched_end_phase(s);
        step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .src = ZCCL_BUF_NONE, .peer = r - 1,
                              .count = c});
        zccl__sched_end_phase(s);
        return;
    }
    const int v = r < 2 * e ? r / 2 : r - e;
    uint8_t cur = ZCCL_BUF_SEND; /* this rank's partial */
    if (r < 2 * e) {             /* RECV = x[r] OP x[r+1] */
        step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .src = ZCCL_BUF_SEND, .peer = r + 1,
                              .count = c});
        zccl__sched_end_phase(s);
        cur = ZCCL_BUF_RECV;
    }
    s->tmp_elems = c;
    for (int d = 1; d < p; d *= 2) {
        const int pv = v ^ d, peer = pv < e ? 2 * pv : pv + e;
        const bool lower = (v & d) == 0, last = (2 * d == p);
        step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = cur, .src = ZCCL_BUF_NONE, .peer = peer, .count = c});
        step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_TMP, .src = ZCCL_BUF_NONE, .peer = peer,
                              .count = c});
        zccl__sched_end_phase(s);
        /* local: RECV = lower OP upper (runs first in the next phase, before its send reads RECV) */
        step(s, (zccl_step_t){.kind = ZCCL_STEP_REDUCE, .buf = ZCCL_BUF_RECV, .src = lower ? cur : ZCCL_BUF_TMP,
                              .src2 = lower ? ZCCL_BUF_TMP : cur, .peer = -1, .count = c, .final = last});
        cur = ZCCL_BUF_RECV;
    }
    if (r < 2 * e)
        step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_RECV, .src = ZCCL_BUF_NONE, .peer = r + 1,
                              .count = c});
    zccl__sched_end_phase(s);
}

/* ---- cost model ---- */

/* Recursive doubling all-reduce of the whole vector: log2(p) steps of m bytes (+ the fold's two steps). */
static double predict_recdbl(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    (void)c;
    const int n = L->nranks;
    if (n <= 1) return 0;
    const int q = zccl__pow2_floor(n), lg = (int)zccl__ceil_log2(q);
    const double m = (double)bytes;
    double t = 0;
    for (int k = 0; k < lg; k++) t += zccl__step_cost(zccl__shared_link(L, p, L->xor_share[k]), 1, m) + m * p->gamma;
    if (q < n) t += 2 * zccl__step_cost(zccl__shared_link(L, p, L->add_share[0]), 1, m) + m * p->gamma;
    return t;
}

/* Thakur et al. 4.4, plus the fold: in (reduced) and out. */
static double formula_recdbl(const zccl_sched_args_t *a, const zccl_cost_params_t *p) {
    zccl_formula_terms_t t;
    zccl__formula_terms(a, p, &t);
    const double A = t.A, B = t.B, G = t.G, m = t.m;
    if (a->coll != ZCCL_COLL_ALLREDUCE) return -1;
    return log2(t.pw) * (A + m * B + m * G) + (t.e ? (A + m * B + m * G) + (A + m * B) : 0);
}

/* ---- the registry row ---- */

const zccl_algo_t zccl__algo_recdbl = {
    .name = "recdbl",
    .build = {
        [ZCCL_COLL_ALLREDUCE] = zccl__sched_recdbl_allreduce,
    },
    .predict = predict_recdbl,
    .formula = formula_recdbl,
};

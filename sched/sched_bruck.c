/*
 * sched_bruck.c — Bruck all-gather for any rank count (Bruck, Ho, Kipnis, Upfal & Weathersby, "Efficient
 * algorithms for all-to-all communications in multiport message-passing systems", IEEE TPDS 1997; Thakur,
 * Rabenseifner & Gropp 2005, section 4.1: ceil(log2 n) alpha + (n-1)/n of the data times beta).
 *
 * After step k (distance d = 2^k) rank r holds the blocks of ranks r, r+1, ..., r+2d-1 (mod n). In step k it sends
 * the m = min(d, n-d) blocks r .. r+m-1 it holds to rank r-d and receives blocks r+d .. r+d+m-1 from rank r+d.
 * The original algorithm keeps the blocks rotated in a scratch buffer and rotates them back at the end; here the
 * blocks go straight to their final place in the receive buffer, so a range that wraps past rank n-1 is sent as
 * two pieces (the receiver splits it the same way), and no scratch or final rotation is needed.
 * Only copies: every rank ends with the same bits. Communication follows rank numbers.
 */
#include <math.h>
#include "algo.h"

static void xfer(zccl_schedule_t *s, int kind, int buf, size_t off, size_t count, int peer) {
    zccl__sched_step(s, (zccl_step_t){.kind = (uint8_t)kind, .buf = (uint8_t)buf, .src = ZCCL_BUF_NONE,
                                      .peer = peer, .off = off, .count = count});
}

/* Blocks first, first+1, ..., first+m-1 (mod n) of RECV, as at most two contiguous pieces. */
static void blocks(zccl_schedule_t *s, int kind, int n, int first, int m, size_t c, int peer) {
    const int a = ((first % n) + n) % n;
    const int m1 = (a + m <= n) ? m : n - a;
    xfer(s, kind, ZCCL_BUF_RECV, (size_t)a * c, (size_t)m1 * c, peer);
    if (m1 < m) xfer(s, kind, ZCCL_BUF_RECV, 0, (size_t)(m - m1) * c, peer);
}

void zccl__sched_bruck_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (!a->in_place)
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .off = (size_t)r * c,
                                          .src = ZCCL_BUF_SEND, .peer = -1, .count = c});
    for (int d = 1; d < n; d *= 2) {
        const int m = d < n - d ? d : n - d;
        const int to = ((r - d) % n + n) % n, from = (r + d) % n;
        blocks(s, ZCCL_STEP_SEND, n, r, m, c, to);
        blocks(s, ZCCL_STEP_RECV, n, r + d, m, c, from);
        zccl__sched_end_phase(s);
    }
    zccl__sched_end_phase(s);
}

/* ---- cost model ---- */

/* Bruck all-gather (Bruck et al. 1997; Thakur et al. 2005): ceil(log2 n) steps, (n-1)/n of the data. A range that
 * wraps past rank n-1 travels as two messages. */
static double predict_bruck(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    (void)c;
    const int n = L->nranks;
    if (n <= 1) return 0;
    double t = 0;
    for (int k = 0, d = 1; d < n; k++, d *= 2) { /* step k: min(d, n-d) blocks of m/n to rank r - d */
        const zccl_link_cost_t l = zccl__shared_link(L, p, L->add_share[k]);
        t += l.alpha * (1.0 + ZCCL_TUNE_RHO) + (double)(d < n - d ? d : n - d) / n * (double)bytes * l.beta;
    }
    return t;
}

static double formula_bruck(const zccl_sched_args_t *a, const zccl_cost_params_t *p) {
    zccl_formula_terms_t t;
    zccl__formula_terms(a, p, &t);
    if (a->coll != ZCCL_COLL_ALLGATHER) return -1;
    return ceil(log2(t.n)) * t.A + (t.fn - 1) / t.fn * t.m * t.B;
}

/* ---- the registry row ---- */

const zccl_algo_t zccl__algo_bruck = {
    .name = "bruck",
    .build = {
        [ZCCL_COLL_ALLGATHER] = zccl__sched_bruck_allgather,
    },
    .predict = predict_bruck,
    .formula = formula_bruck,
};

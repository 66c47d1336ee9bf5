/*
 * sched_ring.c — ring reduce-scatter, ring all-gather, and ring all-reduce (= reduce-scatter + all-gather).
 *
 * The ring (Patarasuk & Yuan, JPDC 2009) is bandwidth-optimal: with n ranks each rank sends and receives
 * (n-1)/n of the data once for a reduce-scatter or an all-gather, 2(n-1)/n for an all-reduce, whatever n is.
 * The data is cut into n blocks. In step s of the reduce-scatter, rank r sends the block it finished reducing in
 * step s-1 (its own input block r-1 in step 0) to rank r+1, and receives block r-s-2 from rank r-1, reducing it
 * with its own input; after n-1 steps rank r holds the complete block r. The all-gather then passes the complete
 * blocks around the ring: in step s rank r forwards block r-s and receives block r-s-1.
 *
 * All-reduce accumulates in the receive buffer, so it needs no scratch. A stand-alone reduce-scatter has only
 * one block of output, so its partial sums travel through two scratch blocks; it works in rounds of at most
 * ZCCL_RS_ROUND_BYTES per block to bound that scratch whatever the message size.
 *
 * The ring runs in ring positions, not ranks: the rank at position p sends to the rank at position p+1, and the
 * topology-aware order (topology/topo_ring.c) decides which rank stands where. Blocks keep their rank identity
 * (block b is the output of rank b), so position q works on block ring[q].
 *
 * Reduce-scatter and all-gather also take uneven blocks (zccl_reduce_scatter_v / zccl_allgather_v: args counts and
 * displs); the data each rank moves is then (total - own block) instead of (n-1)/n of the total.
 */
#include <math.h>
#include "algo.h"

static void step(zccl_schedule_t *s, int kind, int buf, size_t off, int src, size_t src_off, size_t count, int peer,
                 bool final) {
    zccl__sched_step(s, (zccl_step_t){.kind = (uint8_t)kind, .buf = (uint8_t)buf, .src = (uint8_t)src,
                                      .final = (uint8_t)final, .peer = peer, .off = off, .src_off = src_off,
                                      .count = count});
}

void zccl__sched_ring_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    size_t my_off, my_len;
    zccl__vblock(a, r, &my_off, &my_len);
    if (n == 1) {
        zccl__sched_one_rank(a, s, my_off);
        return;
    }
    const int p = zccl__ring_pos(a, r), next = zccl__ring_at(a, p + 1), prev = zccl__ring_at(a, p - 1);
    /* Rounds walk the largest block; a smaller block (uneven counts) simply has nothing left in later rounds, and
     * both ends of every transfer compute the same length for it, so its steps vanish on both sides alike. */
    size_t maxb = 0;
    for (int b = 0; b < n; b++) {
        size_t o, l;
        zccl__vblock(a, b, &o, &l);
        if (l > maxb) maxb = l;
    }
    size_t S = maxb; /* elements of each block handled per round */
    if (n > 2) {
        S = a->rs_round_bytes / (a->elem_size ? a->elem_size : 1);
        if (S == 0) S = 1;
        if (S > maxb) S = maxb;
        s->tmp_elems = 2 * S;
    }
    for (size_t k0 = 0; k0 < maxb; k0 += S) {
        for (int st = 0; st <= n - 2; st++) {
            const int sb = zccl__ring_at(a, p - st - 1), rb = zccl__ring_at(a, p - st - 2);
            size_t so, sl, ro, rl;
            zccl__vblock(a, sb, &so, &sl);
            zccl__vblock(a, rb, &ro, &rl);
            sl = sl > k0 ? (sl - k0 < S ? sl - k0 : S) : 0;
            rl = rl > k0 ? (rl - k0 < S ? rl - k0 : S) : 0;
            const bool last = (st == n - 2);
            if (st == 0) step(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, so + k0, ZCCL_BUF_NONE, 0, sl, next, false);
            else step(s, ZCCL_STEP_SEND, ZCCL_BUF_TMP, (size_t)((st - 1) % 2) * S, ZCCL_BUF_NONE, 0, sl, next, false);
            if (last) step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, k0, ZCCL_BUF_SEND, ro + k0, rl, prev, true);
            else step(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (size_t)(st % 2) * S, ZCCL_BUF_SEND, ro + k0, rl, prev, false);
            zccl__sched_end_phase(s);
        }
    }
}

void zccl__sched_ring_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    size_t off, len;
    zccl__vblock(a, r, &off, &len);
    if (!a->in_place) step(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, off, ZCCL_BUF_SEND, 0, len, -1, false);
    const int p = zccl__ring_pos(a, r), next = zccl__ring_at(a, p + 1), prev = zccl__ring_at(a, p - 1);
    for (int st = 0; st <= n - 2; st++) {
        zccl__vblock(a, zccl__ring_at(a, p - st), &off, &len);
        if (st == 0) step(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, 0, ZCCL_BUF_NONE, 0, len, next, false);
        else step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, next, false);
        zccl__vblock(a, zccl__ring_at(a, p - st - 1), &off, &len);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, prev, false);
        zccl__sched_end_phase(s);
    }
    zccl__sched_end_phase(s);
}

void zccl__sched_ring_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t count = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    const int p = zccl__ring_pos(a, r), next = zccl__ring_at(a, p + 1), prev = zccl__ring_at(a, p - 1);
    size_t off, len;
    for (int st = 0; st <= n - 2; st++) { /* reduce-scatter, accumulating in the receive buffer */
        const int sb = zccl__ring_at(a, p - st - 1), rb = zccl__ring_at(a, p - st - 2);
        zccl__block(count, n, sb, &off, &len);
        step(s, ZCCL_STEP_SEND, st == 0 ? ZCCL_BUF_SEND : ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, next, false);
        zccl__block(count, n, rb, &off, &len);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, off, ZCCL_BUF_SEND, off, len, prev, st == n - 2);
        zccl__sched_end_phase(s);
    }
    for (int st = 0; st <= n - 2; st++) { /* all-gather of the reduced blocks */
        zccl__block(count, n, zccl__ring_at(a, p - st), &off, &len);
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, next, false);
        zccl__block(count, n, zccl__ring_at(a, p - st - 1), &off, &len);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, prev, false);
        zccl__sched_end_phase(s);
    }
}

/* ---- cost model ---- */

static double predict_ring(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    return zccl__ring_cost(c, bytes, L->nranks, zccl__shared_link(L, p, L->ring_share), p);
}

static double formula_ring(const zccl_sched_args_t *a, const zccl_cost_params_t *p) {
    zccl_formula_terms_t t;
    zccl__formula_terms(a, p, &t);
    const double fn = t.fn, A = t.A, B = t.B, G = t.G;
    switch (a->coll) {
    case ZCCL_COLL_ALLREDUCE: return 2 * (fn - 1) * A + 2 * (fn - 1) / fn * t.m * B + (fn - 1) / fn * t.m * G;
    case ZCCL_COLL_REDUCE_SCATTER: {
        double rounds = 1;
        if (t.n > 2) {
            size_t S = a->rs_round_bytes / (a->elem_size ? a->elem_size : 1);
            if (S == 0) S = 1;
            rounds = ceil((double)a->count / (double)S);
        }
        return (fn - 1) * rounds * A + (fn - 1) / fn * t.m * (B + G);
    }
    case ZCCL_COLL_ALLGATHER: return (fn - 1) * A + (fn - 1) / fn * t.m * B;
    default: return -1;
    }
}

/* ---- the registry row ---- */

const zccl_algo_t zccl__algo_ring = {
    .name = "ring",
    .build = {
        [ZCCL_COLL_ALLREDUCE] = zccl__sched_ring_allreduce,
        [ZCCL_COLL_REDUCE_SCATTER] = zccl__sched_ring_reduce_scatter,
        [ZCCL_COLL_ALLGATHER] = zccl__sched_ring_allgather,
        [ZCCL_COLL_BROADCAST] = zccl__sched_chain_broadcast,
        [ZCCL_COLL_REDUCE] = zccl__sched_chain_reduce,
    },
    .predict = predict_ring,
    .formula = formula_ring,
};

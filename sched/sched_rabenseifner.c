/*
 * sched_rabenseifner.c — recursive halving reduce-scatter, recursive doubling all-gather, and their composition as
 * all-reduce (Rabenseifner, "Optimization of collective reduction operations", ICCS 2004; Thakur, Rabenseifner &
 * Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 2005).
 *
 * With p = 2^k ranks, reduce-scatter takes k steps: in the step with distance d = p/2, p/4, ..., 1, rank v sends
 * the half of its current block range that its partner v^d keeps and reduces the half it keeps with what the
 * partner sends; after k steps it holds its own block, reduced over all ranks: k alpha + (p-1)/p (beta + gamma) of
 * the data. The all-gather runs the steps backwards (d = 1, 2, ..., p/2), doubling the held range each time.
 *
 * Any n: with p the largest power of two <= n and e = n - p, the first 2e ranks pair up before and after (the
 * standard fold of Thakur et al.): odd rank 2i+1 hands its whole input to even rank 2i, which takes part as
 * virtual rank i; ranks >= 2e take part as virtual rank r - e. At the end rank 2i hands 2i+1 its result.
 * For the all-reduce the blocks are p even parts of the vector. For the stand-alone reduce-scatter and all-gather
 * the unit is the "superblock" of virtual rank v, the output blocks of the ranks it stands for ({2v, 2v+1} for
 * v < e, {v+e} otherwise): superblocks are contiguous and in rank order, so every step moves contiguous ranges.
 *
 * Bitwise identity: every block is reduced along exactly one path, at the rank that ends up owning it, and then
 * only copied (all-gather, unfold), so every rank holds the same bits; the order of the operands at each step is
 * fixed by the schedule, so repeated runs give the same bits too.
 *
 * The stand-alone reduce-scatter keeps partial sums of n blocks in scratch; it works in rounds of S elements of
 * every block, with n*S*elem_size <= 2*rs_round_bytes (the ring's scratch budget), so scratch stays bounded.
 * Communication follows rank numbers (not the topology ring order).
 */
#include <math.h>
#include "algo.h"

static void step(zccl_schedule_t *s, int kind, int buf, size_t off, int src, size_t src_off, size_t count, int peer,
                 bool final) {
    zccl__sched_step(s, (zccl_step_t){.kind = (uint8_t)kind, .buf = (uint8_t)buf, .src = (uint8_t)src,
                                      .final = (uint8_t)final, .peer = peer, .off = off, .src_off = src_off,
                                      .count = count});
}

typedef struct {
    int n, p, e; /* ranks, participating ranks (power of two), extra ranks */
    int v;       /* this rank's virtual rank, or -1 for an extra (odd rank < 2e) */
} fold_t;

static fold_t fold_of(int n, int r) {
    fold_t f = {.n = n, .p = 1};
    while (f.p * 2 <= n) f.p *= 2;
    f.e = n - f.p;
    if (r < 2 * f.e) f.v = (r % 2 == 0) ? r / 2 : -1;
    else f.v = r - f.e;
    return f;
}
/* The real rank playing virtual rank v. */
static int real_of(const fold_t *f, int v) { return v < f->e ? 2 * v : v + f->e; }
/* First output block (rank) of superblock v; superblock v is ranks [sb_first(v), sb_first(v+1)). */
static int sb_first(const fold_t *f, int v) { return v < f->e ? 2 * v : v + f->e; }

void zccl__sched_rabenseifner_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t count = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    const fold_t f = fold_of(n, r);
    if (f.v < 0) { /* extra: hand over the input, get the result back */
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, 0, ZCCL_BUF_NONE, 0, count, r - 1, false);
        zccl__sched_end_phase(s);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, 0, ZCCL_BUF_NONE, 0, count, r - 1, false);
        zccl__sched_end_phase(s);
        return;
    }
    int cur = ZCCL_BUF_SEND; /* where this rank's partial of the blocks it holds lives */
    if (f.v < f.e) {         /* fold: RECV = own input OP the extra's input */
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, 0, ZCCL_BUF_SEND, 0, count, r + 1, false);
        zccl__sched_end_phase(s);
        cur = ZCCL_BUF_RECV;
    }
    /* Recursive halving over p blocks: the held range is [lo, lo + width) of virtual blocks. */
    int lo = 0, width = f.p;
    size_t o1, l1, o2, l2;
    for (int d = f.p / 2; d >= 1; d /= 2) {
        const int partner = real_of(&f, f.v ^ d);
        const int half = width / 2;
        const bool lower = (f.v & d) == 0;
        const int keep = lower ? lo : lo + half, give = lower ? lo + half : lo;
        size_t ko, kl, go, gl;
        zccl__block(count, f.p, keep, &ko, &o1);
        zccl__block(count, f.p, keep + half - 1, &o2, &l2);
        kl = o2 + l2 - ko;
        zccl__block(count, f.p, give, &go, &l1);
        zccl__block(count, f.p, give + half - 1, &o2, &l2);
        gl = o2 + l2 - go;
        step(s, ZCCL_STEP_SEND, cur, go, ZCCL_BUF_NONE, 0, gl, partner, false);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, ko, cur, ko, kl, partner, d == 1);
        zccl__sched_end_phase(s);
        cur = ZCCL_BUF_RECV;
        lo = keep;
        width = half;
    }
    (void)o1;
    (void)l1;
    /* Recursive doubling all-gather of the reduced blocks, all in RECV. */
    for (int d = 1; d < f.p; d *= 2) {
        const int partner = real_of(&f, f.v ^ d);
        const int mine = f.v & ~(d - 1), theirs = (f.v ^ d) & ~(d - 1);
        size_t mo, ml, to, tl;
        zccl__block(count, f.p, mine, &mo, &l1);
        zccl__block(count, f.p, mine + d - 1, &o2, &l2);
        ml = o2 + l2 - mo;
        zccl__block(count, f.p, theirs, &to, &l1);
        zccl__block(count, f.p, theirs + d - 1, &o2, &l2);
        tl = o2 + l2 - to;
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, mo, ZCCL_BUF_NONE, 0, ml, partner, false);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, to, ZCCL_BUF_NONE, 0, tl, partner, false);
        zccl__sched_end_phase(s);
    }
    if (f.v < f.e) { /* unfold */
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, 0, ZCCL_BUF_NONE, 0, count, r + 1, false);
        zccl__sched_end_phase(s);
    }
}

void zccl__sched_rabenseifner_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t rc = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    const fold_t f = fold_of(n, r);
    const size_t es = a->elem_size ? a->elem_size : 1;
    size_t S = (2 * a->rs_round_bytes) / (es * (size_t)n);
    if (S == 0) S = 1;
    if (S > rc) S = rc;
    const bool one_round = (S == rc); /* then TMP has SEND's layout (block stride rc) and step one reads SEND */
    if (f.v >= 0) s->tmp_elems = (size_t)n * S;
    else if (!one_round) s->tmp_elems = (size_t)n * S;
    for (size_t k0 = 0; k0 < rc; k0 += S) {
        const size_t len = (rc - k0 < S) ? rc - k0 : S;
        /* This round's input: SEND itself in one round (block b at b*rc), else a packed copy in TMP (block b at
         * b*S). In one round, blocks hold rc = len elements, so a range of blocks is one contiguous range; in
         * several rounds that holds only while len == S (the last round may be shorter): per-block steps then. */
        const size_t stride = one_round ? rc : S;
        const bool packed = (len == stride);
        int in_buf = ZCCL_BUF_SEND;
        if (!one_round) {
            for (int b = 0; b < n; b++)
                step(s, ZCCL_STEP_COPY, ZCCL_BUF_TMP, (size_t)b * S, ZCCL_BUF_SEND, (size_t)b * rc + k0, len, -1,
                     false);
            in_buf = ZCCL_BUF_TMP;
        }
        if (f.v < 0) { /* extra: hand over this round's input, get its block back */
            if (packed) step(s, ZCCL_STEP_SEND, in_buf, 0, ZCCL_BUF_NONE, 0, (size_t)n * stride, r - 1, false);
            else
                for (int b = 0; b < n; b++)
                    step(s, ZCCL_STEP_SEND, in_buf, (size_t)b * stride, ZCCL_BUF_NONE, 0, len, r - 1, false);
            zccl__sched_end_phase(s);
            step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, k0, ZCCL_BUF_NONE, 0, len, r - 1, false);
            zccl__sched_end_phase(s);
            continue;
        }
        int cur = in_buf;
        if (f.v < f.e) { /* fold into TMP */
            if (packed) step(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, 0, in_buf, 0, (size_t)n * stride, r + 1, false);
            else
                for (int b = 0; b < n; b++)
                    step(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (size_t)b * stride, in_buf, (size_t)b * stride, len, r + 1,
                         false);
            zccl__sched_end_phase(s);
            cur = ZCCL_BUF_TMP;
        }
        int lo = 0, width = f.p;
        for (int d = f.p / 2; d >= 1; d /= 2) {
            const int partner = real_of(&f, f.v ^ d);
            const int half = width / 2;
            const bool lower = (f.v & d) == 0;
            const int keep = lower ? lo : lo + half, give = lower ? lo + half : lo;
            const int kb0 = sb_first(&f, keep), kb1 = sb_first(&f, keep + half); /* rank blocks [kb0, kb1) */
            const int gb0 = sb_first(&f, give), gb1 = sb_first(&f, give + half);
            const bool last = (d == 1);
            if (packed && !last) {
                step(s, ZCCL_STEP_SEND, cur, (size_t)gb0 * stride, ZCCL_BUF_NONE, 0, (size_t)(gb1 - gb0) * len,
                     partner, false);
                step(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (size_t)kb0 * stride, cur, (size_t)kb0 * stride,
                     (size_t)(kb1 - kb0) * len, partner, false);
            } else {
                for (int b = gb0; b < gb1; b++)
                    step(s, ZCCL_STEP_SEND, cur, (size_t)b * stride, ZCCL_BUF_NONE, 0, len, partner, false);
                for (int b = kb0; b < kb1; b++) {
                    const size_t so = (size_t)b * stride;
                    if (last && b == r)
                        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, k0, cur, so, len, partner, true);
                    else
                        step(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (size_t)b * stride, cur, so, len, partner, last);
                }
            }
            zccl__sched_end_phase(s);
            cur = ZCCL_BUF_TMP;
            lo = keep;
            width = half;
        }
        if (f.v < f.e) { /* unfold: the extra's block */
            step(s, ZCCL_STEP_SEND, ZCCL_BUF_TMP, (size_t)(r + 1) * stride, ZCCL_BUF_NONE, 0, len, r + 1, false);
            zccl__sched_end_phase(s);
        }
    }
}

void zccl__sched_rabenseifner_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (!a->in_place) step(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, (size_t)r * c, ZCCL_BUF_SEND, 0, c, -1, false);
    if (n == 1) { zccl__sched_end_phase(s); return; }
    const fold_t f = fold_of(n, r);
    if (f.v < 0) { /* extra: hand over the block, get all others back */
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, 0, ZCCL_BUF_NONE, 0, c, r - 1, false);
        zccl__sched_end_phase(s);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, 0, ZCCL_BUF_NONE, 0, (size_t)r * c, r - 1, false);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, (size_t)(r + 1) * c, ZCCL_BUF_NONE, 0, (size_t)(n - r - 1) * c,
             r - 1, false);
        zccl__sched_end_phase(s);
        return;
    }
    if (f.v < f.e) {
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, (size_t)(r + 1) * c, ZCCL_BUF_NONE, 0, c, r + 1, false);
        zccl__sched_end_phase(s);
    }
    for (int d = 1; d < f.p; d *= 2) {
        const int partner = real_of(&f, f.v ^ d);
        const int mine = f.v & ~(d - 1), theirs = (f.v ^ d) & ~(d - 1);
        const size_t mo = (size_t)sb_first(&f, mine) * c, me = (size_t)sb_first(&f, mine + d) * c;
        const size_t to = (size_t)sb_first(&f, theirs) * c, te = (size_t)sb_first(&f, theirs + d) * c;
        /* the first step sends only this rank's superblock; out of place it reads the own block from SEND */
        if (d == 1 && !a->in_place && f.v >= f.e)
            step(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, 0, ZCCL_BUF_NONE, 0, c, partner, false);
        else step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, mo, ZCCL_BUF_NONE, 0, me - mo, partner, false);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, to, ZCCL_BUF_NONE, 0, te - to, partner, false);
        zccl__sched_end_phase(s);
    }
    if (f.v < f.e) { /* unfold: everything but the extra's own block */
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, 0, ZCCL_BUF_NONE, 0, (size_t)(r + 1) * c, r + 1, false);
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, (size_t)(r + 2) * c, ZCCL_BUF_NONE, 0, (size_t)(n - r - 2) * c, r + 1,
             false);
        zccl__sched_end_phase(s);
    }
    zccl__sched_end_phase(s);
}

/* ---- cost model ---- */

/* Recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner; Thakur et al. 2005, with their
 * fold for non-powers of two: the n - p extra ranks hand their vector to a partner first and get the result back
 * at the end, p the largest power of two <= n). */
static double predict_rab(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    const int n = L->nranks;
    if (n <= 1) return 0;
    const int q = zccl__pow2_floor(n), lg = (int)zccl__ceil_log2(q);
    const bool extra = q < n;
    const double m = (double)bytes, part = (double)(q - 1) / q * m;
    /* one pass of recursive halving (or doubling): the step with distance 2^k moves m / 2^(lg-k) bytes */
    double pass = 0;
    for (int k = 0; k < lg; k++) {
        const zccl_link_cost_t l = zccl__shared_link(L, p, L->xor_share[k]);
        pass += l.alpha + m / (double)(1u << (lg - k)) * l.beta;
    }
    const zccl_link_cost_t f = zccl__shared_link(L, p, L->add_share[0]); /* the fold pairs ranks 2i and 2i+1 */
    switch (c) {
    case ZCCL_COLL_ALLREDUCE:
        return 2 * pass + part * p->gamma + (extra ? 2 * f.alpha + 2 * m * f.beta + m * p->gamma : 0.0);
    case ZCCL_COLL_REDUCE_SCATTER:
        return pass + part * p->gamma + (extra ? 2 * f.alpha + (m + m / n) * f.beta + m * p->gamma : 0.0);
    case ZCCL_COLL_ALLGATHER:
        return pass + (extra ? 2 * f.alpha + (m + m / n) * f.beta : 0.0);
    default: return HUGE_VAL;
    }
}

/* Thakur et al. 4.4 (Rabenseifner), plus the fold. */
static double formula_rabenseifner(const zccl_sched_args_t *a, const zccl_cost_params_t *p) {
    zccl_formula_terms_t t;
    zccl__formula_terms(a, p, &t);
    const double fn = t.fn, fp = t.fp, A = t.A, B = t.B, G = t.G, m = t.m;
    switch (a->coll) {
    case ZCCL_COLL_ALLREDUCE:
        return 2 * log2(t.pw) * A + 2 * (fp - 1) / fp * m * B + (fp - 1) / fp * m * G +
               (t.e ? (A + m * B + m * G) + (A + m * B) : 0);
    case ZCCL_COLL_REDUCE_SCATTER:
        if (t.e == 0 && (size_t)t.n * a->count * (a->elem_size ? a->elem_size : 1) <= 2 * a->rs_round_bytes)
            return log2(t.pw) * A + (fn - 1) / fn * m * (B + G);
        return -1; /* superblocks of two sizes and rounds: no simple closed form */
    case ZCCL_COLL_ALLGATHER:
        if (t.e == 0) return log2(t.pw) * A + (fn - 1) / fn * m * B;
        return -1;
    default: return -1;
    }
}

/* ---- the registry row ---- */

const zccl_algo_t zccl__algo_rabenseifner = {
    .name = "rabenseifner",
    .build = {
        [ZCCL_COLL_ALLREDUCE] = zccl__sched_rabenseifner_allreduce,
        [ZCCL_COLL_REDUCE_SCATTER] = zccl__sched_rabenseifner_reduce_scatter,
        [ZCCL_COLL_ALLGATHER] = zccl__sched_rabenseifner_allgather,
    },
    .predict = predict_rab,
    .formula = formula_rabenseifner,
};

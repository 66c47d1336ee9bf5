/*
 * sched_hier.c — hierarchical all-reduce, reduce-scatter and all-gather for ranks spread over several hosts.
 *
 * H hosts with L ranks each (args->host_of; every host must hold the same number of ranks). Rank (h, j) is the
 * j-th rank of host h by rank number; hosts are numbered by increasing host_of value. The slow links between
 * hosts then carry each byte once per host instead of once per rank (cf. the two-level schemes of MPICH and NCCL):
 *
 *  all-reduce:     1. ring reduce-scatter inside each host: (h, j) gets block j of the vector (L blocks), reduced
 *                     over its host;
 *                  2. ring all-reduce of block j among the H ranks (., j), one per host, over the network;
 *                  3. ring all-gather inside each host.
 *  all-gather:     1. ring all-gather among (., j): (h, j) gets the blocks of every rank (h', j);
 *                  2. ring all-gather inside each host, a message carrying the H blocks of one local position.
 *  reduce-scatter: 1. ring reduce-scatter inside each host, block j being the H blocks of the ranks (h', j):
 *                     (h, j) gets them reduced over its host (in scratch: 3 H blocks, 3/L of the input);
 *                  2. ring reduce-scatter among (., j): (h, j) gets its own block reduced over all hosts.
 *
 * Inter-host traffic per rank is that of a ring over H ranks on 1/L of the data; intra-host steps use the ring
 * (shared memory). Bitwise identity: every element's final value is computed once, by the inter-host ring
 * reduce-scatter at one rank (or the intra-host one when H = 1), and only copied afterwards.
 */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "algo.h"

typedef struct {
    int H, L, h, j;
    int *grid; /* grid[h*L + j] = rank (h, j) */
} layout_t;

typedef struct { int host, rank; } hr_t;
static int cmp_hr(const void *a, const void *b) {
    const hr_t *x = a, *y = b;
    if (x->host != y->host) return (x->host > y->host) - (x->host < y->host);
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Returns false with the reason in why (and no grid) when the layout is unusable or memory runs out. */
static bool layout(const zccl_sched_args_t *a, layout_t *lo, char *why, size_t len) {
    const int n = a->nranks;
    *lo = (layout_t){0};
    hr_t *v = malloc((size_t)n * sizeof *v);
    lo->grid = malloc((size_t)n * sizeof *lo->grid);
    if (!v || !lo->grid) {
        free(v);
        free(lo->grid);
        lo->grid = NULL;
        snprintf(why, len, "out of memory for the host layout of %d ranks", n);
        return false;
    }
    for (int r = 0; r < n; r++) v[r] = (hr_t){a->host_of ? a->host_of[r] : 0, r};
    qsort(v, (size_t)n, sizeof *v, cmp_hr);
    int H = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 || v[i].host != v[i - 1].host) H++;
    const int L = n / H;
    bool even = (n % H == 0);
    for (int i = 0; i < n && even; i++)
        even = (v[i].host == v[i - i % L].host) && (i % L != 0 || i == 0 || v[i].host != v[i - 1].host);
    if (!even) {
        snprintf(why, len, "every host must hold the same number of ranks (host_of gives %d ranks over %d hosts, "
                 "not evenly)", n, H);
        free(v);
        free(lo->grid);
        lo->grid = NULL;
        return false;
    }
    lo->H = H;
    lo->L = L;
    for (int i = 0; i < n; i++) {
        lo->grid[i] = v[i].rank; /* sorted by (host, rank): index = h*L + j */
        if (v[i].rank == a->rank) lo->h = i / L, lo->j = i % L;
    }
    free(v);
    return true;
}

bool zccl__sched_hier_layout_ok(const zccl_sched_args_t *a, char *why, size_t len) {
    layout_t lo;
    if (!layout(a, &lo, why, len)) return false;
    free(lo.grid);
    return true;
}

static int mod(int x, int m) { return ((x % m) + m) % m; }

static void st(zccl_schedule_t *s, int kind, int buf, size_t off, int src, size_t src_off, size_t count, int peer,
               bool final) {
    zccl__sched_step(s, (zccl_step_t){.kind = (uint8_t)kind, .buf = (uint8_t)buf, .src = (uint8_t)src,
                                      .final = (uint8_t)final, .peer = peer, .off = off, .src_off = src_off,
                                      .count = count});
}

/* A group of g ranks: member(i) is the rank at ring position i. */
typedef struct { const layout_t *lo; bool local; } group_t;
static int member(const group_t *g, int i) {
    const layout_t *lo = g->lo;
    return g->local ? lo->grid[lo->h * lo->L + mod(i, lo->L)] : lo->grid[mod(i, lo->H) * lo->L + lo->j];
}
static int gsize(const group_t *g) { return g->local ? g->lo->L : g->lo->H; }
static int gpos(const group_t *g) { return g->local ? g->lo->j : g->lo->h; }

/* Ring reduce-scatter over [base, base+len) in g blocks, accumulating in RECV (as the ring all-reduce): position
 * p ends with block p. Input is `cur` (same offsets); the last step is final when `final`. */
static void ring_rs(zccl_schedule_t *s, const group_t *G, size_t base, size_t len, int cur, bool final) {
    const int g = gsize(G), p = gpos(G), next = member(G, p + 1), prev = member(G, p - 1);
    size_t o, l;
    for (int k = 0; k <= g - 2; k++) {
        zccl__block(len, g, mod(p - k - 1, g), &o, &l);
        st(s, ZCCL_STEP_SEND, k == 0 ? cur : ZCCL_BUF_RECV, base + o, ZCCL_BUF_NONE, 0, l, next, false);
        zccl__block(len, g, mod(p - k - 2, g), &o, &l);
        st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, base + o, cur, base + o, l, prev, final && k == g - 2);
        zccl__sched_end_phase(s);
    }
}

/* Ring all-gather over [base, base+len) in g blocks held in RECV; position p starts with block p. */
static void ring_ag(zccl_schedule_t *s, const group_t *G, size_t base, size_t len) {
    const int g = gsize(G), p = gpos(G), next = member(G, p + 1), prev = member(G, p - 1);
    size_t o, l;
    for (int k = 0; k <= g - 2; k++) {
        zccl__block(len, g, mod(p - k, g), &o, &l);
        st(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, base + o, ZCCL_BUF_NONE, 0, l, next, false);
        zccl__block(len, g, mod(p - k - 1, g), &o, &l);
        st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, base + o, ZCCL_BUF_NONE, 0, l, prev, false);
        zccl__sched_end_phase(s);
    }
}

static void copy_only(const zccl_sched_args_t *a, zccl_schedule_t *s, size_t count) {
    if (!a->in_place) st(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, 0, ZCCL_BUF_SEND, 0, count, -1, false);
    zccl__sched_end_phase(s);
}

void zccl__sched_hier_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const size_t count = a->count;
    if (a->nranks == 1) { copy_only(a, s, count); return; }
    layout_t lo;
    char why[160];
    if (!layout(a, &lo, why, sizeof why)) { s->oom = true; return; } /* zccl__sched_build checked the layout */
    const group_t local = {&lo, true}, cross = {&lo, false};
    int cur = ZCCL_BUF_SEND;
    if (lo.L > 1) {
        ring_rs(s, &local, 0, count, ZCCL_BUF_SEND, lo.H == 1);
        cur = ZCCL_BUF_RECV;
    }
    size_t bo, bl;
    zccl__block(count, lo.L, lo.j, &bo, &bl);
    if (lo.H > 1) {
        ring_rs(s, &cross, bo, bl, cur, true);
        ring_ag(s, &cross, bo, bl);
    }
    if (lo.L > 1) ring_ag(s, &local, 0, count);
    free(lo.grid);
}

void zccl__sched_hier_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const size_t c = a->count;
    const int r = a->rank;
    if (!a->in_place) st(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, (size_t)r * c, ZCCL_BUF_SEND, 0, c, -1, false);
    if (a->nranks == 1) { zccl__sched_end_phase(s); return; }
    layout_t lo;
    char why[160];
    if (!layout(a, &lo, why, sizeof why)) { s->oom = true; return; }
    const int H = lo.H, L = lo.L;
    /* 1. among (., j): block of rank (h', j) */
    const group_t cross = {&lo, false}, local = {&lo, true};
    if (H > 1) {
        const int next = member(&cross, lo.h + 1), prev = member(&cross, lo.h - 1);
        for (int k = 0; k <= H - 2; k++) {
            const int sb = member(&cross, lo.h - k), rb = member(&cross, lo.h - k - 1);
            st(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, (size_t)sb * c, ZCCL_BUF_NONE, 0, c, next, false);
            st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, (size_t)rb * c, ZCCL_BUF_NONE, 0, c, prev, false);
            zccl__sched_end_phase(s);
        }
    }
    /* 2. inside the host: local position j' carries the blocks of ranks (h', j') for every h' */
    if (L > 1) {
        const int next = member(&local, lo.j + 1), prev = member(&local, lo.j - 1);
        for (int k = 0; k <= L - 2; k++) {
            const int sj = mod(lo.j - k, L), rj = mod(lo.j - k - 1, L);
            for (int hh = 0; hh < H; hh++)
                st(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, (size_t)lo.grid[hh * L + sj] * c, ZCCL_BUF_NONE, 0, c, next,
                   false);
            for (int hh = 0; hh < H; hh++)
                st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, (size_t)lo.grid[hh * L + rj] * c, ZCCL_BUF_NONE, 0, c, prev,
                   false);
            zccl__sched_end_phase(s);
        }
    }
    zccl__sched_end_phase(s);
    free(lo.grid);
}

void zccl__sched_hier_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const size_t c = a->count;
    if (a->nranks == 1) { copy_only(a, s, c); return; }
    layout_t lo;
    char why[160];
    if (!layout(a, &lo, why, sizeof why)) { s->oom = true; return; }
    const int H = lo.H, L = lo.L, h = lo.h, j = lo.j;
    const size_t Hc = (size_t)H * c;
    /* TMP: A = [0, Hc) the host partials of this rank's local group (piece h' at h'*c), R0, R1 = rotating
     * partials of the intra-host ring. With L = 1 the host partials are the input itself. */
    s->tmp_elems = L > 1 ? 3 * Hc : Hc;
#define SENDOFF(hh, jj) ((size_t)lo.grid[(hh) * L + (jj)] * c)
    if (L > 1) {
        const group_t local = {&lo, true};
        const int next = member(&local, j + 1), prev = member(&local, j - 1);
        for (int k = 0; k <= L - 2; k++) {
            const int sj = mod(j - k - 1, L), rj = mod(j - k - 2, L);
            const bool last = (k == L - 2);
            for (int hh = 0; hh < H; hh++) {
                if (k == 0) st(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, SENDOFF(hh, sj), ZCCL_BUF_NONE, 0, c, next, false);
                else st(s, ZCCL_STEP_SEND, ZCCL_BUF_TMP, Hc * (size_t)(1 + (k - 1) % 2) + (size_t)hh * c,
                        ZCCL_BUF_NONE, 0, c, next, false);
            }
            for (int hh = 0; hh < H; hh++) {
                if (last && H == 1) /* the host is everything: this is the result */
                    st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, 0, ZCCL_BUF_SEND, SENDOFF(hh, rj), c, prev, true);
                else
                    st(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (last ? 0 : Hc * (size_t)(1 + k % 2)) + (size_t)hh * c,
                       ZCCL_BUF_SEND, SENDOFF(hh, rj), c, prev, false);
            }
            zccl__sched_end_phase(s);
        }
    }
    if (H > 1) { /* ring reduce-scatter among (., j) over pieces h', accumulating in A */
        const group_t cross = {&lo, false};
        const int next = member(&cross, h + 1), prev = member(&cross, h - 1);
        const int base_buf = L > 1 ? ZCCL_BUF_TMP : ZCCL_BUF_SEND;
#define BASEOFF(hh) (L > 1 ? (size_t)(hh) * c : SENDOFF(hh, j))
        for (int k = 0; k <= H - 2; k++) {
            const int sh = mod(h - k - 1, H), rh = mod(h - k - 2, H);
            const bool last = (k == H - 2);
            if (k == 0) st(s, ZCCL_STEP_SEND, base_buf, BASEOFF(sh), ZCCL_BUF_NONE, 0, c, next, false);
            else st(s, ZCCL_STEP_SEND, ZCCL_BUF_TMP, (size_t)sh * c, ZCCL_BUF_NONE, 0, c, next, false);
            if (last) st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, 0, base_buf, BASEOFF(rh), c, prev, true);
            else st(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (size_t)rh * c, base_buf, BASEOFF(rh), c, prev, false);
            zccl__sched_end_phase(s);
        }
#undef BASEOFF
    }
#undef SENDOFF
    free(lo.grid);
}

/* ---- cost model ---- */

/* Hierarchical (sched_hier.c): ring reduce-scatter inside each host (intra-host link), ring among the hosts on
 * 1/R of the data (inter-host link), ring all-gather inside each host; R ranks per host. The R inter-host rings
 * (one per position on the host) run at once and share each host's link. */
static double predict_hier(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    const int H = L->nhosts, R = L->per_host;
    const double m = (double)bytes;
    const zccl_link_cost_t inter = zccl__shared_link(L, p, R);
    switch (c) {
    case ZCCL_COLL_ALLREDUCE:
        return zccl__ring_cost(ZCCL_COLL_REDUCE_SCATTER, bytes, R, p->intra, p) +
               zccl__ring_cost(ZCCL_COLL_ALLREDUCE, (size_t)(m / R), H, inter, p) +
               zccl__ring_cost(ZCCL_COLL_ALLGATHER, bytes, R, p->intra, p);
    case ZCCL_COLL_ALLGATHER:
        return zccl__ring_cost(ZCCL_COLL_ALLGATHER, (size_t)(m / R), H, inter, p) +
               zccl__ring_cost(ZCCL_COLL_ALLGATHER, bytes, R, p->intra, p);
    case ZCCL_COLL_REDUCE_SCATTER:
        return zccl__ring_cost(ZCCL_COLL_REDUCE_SCATTER, bytes, R, p->intra, p) +
               zccl__ring_cost(ZCCL_COLL_REDUCE_SCATTER, (size_t)(m / R), H, inter, p);
    default: return HUGE_VAL;
    }
}
static const char *hier_unavailable(zccl_coll_t c, const zccl_tune_layout_t *L) {
    (void)c;
    if (L->nhosts < 2) return "needs ranks on more than one host";
    if (!L->uniform) return "needs the same number of ranks on every host";
    return NULL;
}

/* ---- the registry row ---- */

const zccl_algo_t zccl__algo_hier = {
    .name = "hier",
    .build = {
        [ZCCL_COLL_ALLREDUCE] = zccl__sched_hier_allreduce,
        [ZCCL_COLL_REDUCE_SCATTER] = zccl__sched_hier_reduce_scatter,
        [ZCCL_COLL_ALLGATHER] = zccl__sched_hier_allgather,
    },
    .layout_ok = zccl__sched_hier_layout_ok,
    .unavailable = hier_unavailable,
    .predict = predict_hier,
};

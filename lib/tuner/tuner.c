/*
 * tuner.c — the algorithm registry, the ZCCL_ALGO filter, the cost model and the choice (see tuner.h and
 * docs/tuning.md). Calibration and the cache file are in tuner_calib.c.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "comm.h"
#include "tuner.h"

/* ---- collectives ------------------------------------------------------------------------------------------- */

static const char *const coll_tune_names[ZCCL_COLL_COUNT] = {"allreduce", "reducescatter", "allgather", "broadcast",
                                                             "reduce", "send", "recv"};
static const char *const coll_alt_names[ZCCL_COLL_COUNT] = {"all_reduce", "reduce_scatter", "all_gather", "bcast",
                                                            NULL, NULL, NULL};
#define NTUNED 5 /* collectives with a choice to make: allreduce .. reduce (send/recv have one schedule) */

const char *zccl__coll_tune_name(zccl_coll_t c) { return (unsigned)c < ZCCL_COLL_COUNT ? coll_tune_names[c] : "?"; }

int zccl__coll_from_name(const char *name, size_t len) {
    for (int c = 0; c < NTUNED; c++) {
        if (strlen(coll_tune_names[c]) == len && !strncasecmp(name, coll_tune_names[c], len)) return c;
        if (coll_alt_names[c] && strlen(coll_alt_names[c]) == len && !strncasecmp(name, coll_alt_names[c], len))
            return c;
    }
    return -1;
}

/* ---- the cost model ---------------------------------------------------------------------------------------- */

size_t zccl__pipeline_chunk(size_t bytes, int nranks) {
    size_t c = bytes / (size_t)(4 * (nranks > 1 ? nranks - 1 : 1));
    if (c < (64u << 10)) c = 64u << 10;
    if (c > (4u << 20)) c = 4u << 20;
    return c;
}

/* Alpha-beta-gamma predictors, one per algorithm (formulas in docs/tuning.md). */

#define BIT(c) (1u << (c))

static double ceil_log2(int n) {
    int k = 0;
    while ((1 << k) < n) k++;
    return (double)k;
}
static int pow2_floor(int n) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}
/* The link every lockstep round of a flat algorithm waits for: across hosts as soon as there are several. */
static zccl_link_cost_t flat_link(const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    return L->nhosts > 1 ? p->inter : p->intra;
}
/* The link of one step of a flat algorithm whose exchange pattern puts `share` ranks of one host on the host's
 * link at once (0: the pattern stays inside the hosts). Bytes: those ranks' messages go through one link one after
 * another (share x beta_inter), or stay on the intra-host link. Latency: the flat link's alpha for every step, as
 * the lock-step rounds of a flat algorithm wait for each other (a step inside the hosts is not cheaper on the
 * oversubscribed VM, where every step costs process wake-ups; docs/tuning.md "Several hosts"). */
static zccl_link_cost_t shared_link(const zccl_tune_layout_t *L, const zccl_tune_params_t *p, int share) {
    return (zccl_link_cost_t){.alpha = flat_link(L, p).alpha,
                              .beta = share > 0 ? p->inter.beta * share : p->intra.beta};
}
/* One step with k concurrent messages of b bytes each (see tuner.h). */
static double step(zccl_link_cost_t l, int k, double b) {
    if (k <= 0) return 0;
    return l.alpha * (1.0 + (k - 1) * ZCCL_TUNE_RHO) + (double)k * b * l.beta;
}

/* Ring (Patarasuk & Yuan 2009): reduce-scatter then all-gather over n-1 steps each, blocks of m/n bytes.
 * Broadcast/reduce: a pipelined chain of the same ring, ceil(m/chunk) chunks: (n-2+k) steps of one chunk. */
static double ring_cost(zccl_coll_t c, size_t bytes, int n, zccl_link_cost_t l, const zccl_tune_params_t *p) {
    if (n <= 1) return 0;
    const double m = (double)bytes, blk = m / n, red = (n - 1) * blk * p->gamma;
    switch (c) {
    case ZCCL_COLL_ALLREDUCE: return 2.0 * (n - 1) * step(l, 1, blk) + red;
    case ZCCL_COLL_REDUCE_SCATTER: return (n - 1) * step(l, 1, blk) + red;
    case ZCCL_COLL_ALLGATHER: return (n - 1) * step(l, 1, blk);
    case ZCCL_COLL_BROADCAST:
    case ZCCL_COLL_REDUCE: {
        const double k = ceil(m / (double)zccl__pipeline_chunk(bytes, n)), cb = m / (k > 0 ? k : 1);
        return (n - 2 + k) * (step(l, 1, cb) + (c == ZCCL_COLL_REDUCE ? cb * p->gamma : 0.0));
    }
    default: return 0;
    }
}

static double predict_ring(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    return ring_cost(c, bytes, L->nranks, shared_link(L, p, L->ring_share), p);
}

/* Direct reduce-scatter / all-gather (sched_direct.c): one step, each rank exchanging one block with each of the
 * n-1 others (reduce-scatter then reduces the n-1 received blocks). Across hosts the step also waits for the
 * busiest host link, which carries ranks_h x (n - ranks_h) blocks. */
static double direct_step(const zccl_tune_layout_t *L, const zccl_tune_params_t *p, double b) {
    const int n = L->nranks;
    const double own = (n - 1) * b * p->intra.beta, across = L->direct_cross * b * p->inter.beta;
    return flat_link(L, p).alpha * (1.0 + (n - 2) * ZCCL_TUNE_RHO) + (across > own ? across : own);
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

/* Recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner; Thakur et al. 2005, with their
 * fold for non-powers of two: the n - p extra ranks hand their vector to a partner first and get the result back
 * at the end, p the largest power of two <= n). */
static double predict_rab(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    const int n = L->nranks;
    if (n <= 1) return 0;
    const int q = pow2_floor(n), lg = (int)ceil_log2(q);
    const bool extra = q < n;
    const double m = (double)bytes, part = (double)(q - 1) / q * m;
    /* one pass of recursive halving (or doubling): the step with distance 2^k moves m / 2^(lg-k) bytes */
    double pass = 0;
    for (int k = 0; k < lg; k++) {
        const zccl_link_cost_t l = shared_link(L, p, L->xor_share[k]);
        pass += l.alpha + m / (double)(1u << (lg - k)) * l.beta;
    }
    const zccl_link_cost_t f = shared_link(L, p, L->add_share[0]); /* the fold pairs ranks 2i and 2i+1 */
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

/* Recursive doubling all-reduce of the whole vector: log2(p) steps of m bytes (+ the fold's two steps). */
static double predict_recdbl(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    (void)c;
    const int n = L->nranks;
    if (n <= 1) return 0;
    const int q = pow2_floor(n), lg = (int)ceil_log2(q);
    const double m = (double)bytes;
    double t = 0;
    for (int k = 0; k < lg; k++) t += step(shared_link(L, p, L->xor_share[k]), 1, m) + m * p->gamma;
    if (q < n) t += 2 * step(shared_link(L, p, L->add_share[0]), 1, m) + m * p->gamma;
    return t;
}

/* Bruck all-gather (Bruck et al. 1997; Thakur et al. 2005): ceil(log2 n) steps, (n-1)/n of the data. A range that
 * wraps past rank n-1 travels as two messages. */
static double predict_bruck(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    (void)c;
    const int n = L->nranks;
    if (n <= 1) return 0;
    double t = 0;
    for (int k = 0, d = 1; d < n; k++, d *= 2) { /* step k: min(d, n-d) blocks of m/n to rank r - d */
        const zccl_link_cost_t l = shared_link(L, p, L->add_share[k]);
        t += l.alpha * (1.0 + ZCCL_TUNE_RHO) + (double)(d < n - d ? d : n - d) / n * (double)bytes * l.beta;
    }
    return t;
}

/* Double binary tree all-reduce (Sanders, Speck & Traeff 2009; sched_tree.c): each tree carries half the vector
 * in K chunks through (K + 2D) lock-step slots, D the depth (about log2 n); in a slot the busiest rank (inner node
 * of one tree, leaf of the other) sends and receives up to three chunks. Chunks follow collectives.c's rule. */
static double predict_tree(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    (void)c;
    const int n = L->nranks;
    if (n <= 1) return 0;
    const double m = (double)bytes, half = m / 2;
    const double cb = ZCCL_MIN(half, (double)zccl__pipeline_chunk(bytes, n));
    const double K = cb > 0 ? ceil(half / cb) : 1, D = ceil_log2(n);
    return (K + 2 * D) * step(flat_link(L, p), 3, cb) + m * p->gamma;
}

/* Hierarchical (sched_hier.c): ring reduce-scatter inside each host (intra-host link), ring among the hosts on
 * 1/R of the data (inter-host link), ring all-gather inside each host; R ranks per host. The R inter-host rings
 * (one per position on the host) run at once and share each host's link. */
static double predict_hier(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    const int H = L->nhosts, R = L->per_host;
    const double m = (double)bytes;
    const zccl_link_cost_t inter = shared_link(L, p, R);
    switch (c) {
    case ZCCL_COLL_ALLREDUCE:
        return ring_cost(ZCCL_COLL_REDUCE_SCATTER, bytes, R, p->intra, p) +
               ring_cost(ZCCL_COLL_ALLREDUCE, (size_t)(m / R), H, inter, p) +
               ring_cost(ZCCL_COLL_ALLGATHER, bytes, R, p->intra, p);
    case ZCCL_COLL_ALLGATHER:
        return ring_cost(ZCCL_COLL_ALLGATHER, (size_t)(m / R), H, inter, p) +
               ring_cost(ZCCL_COLL_ALLGATHER, bytes, R, p->intra, p);
    case ZCCL_COLL_REDUCE_SCATTER:
        return ring_cost(ZCCL_COLL_REDUCE_SCATTER, bytes, R, p->intra, p) +
               ring_cost(ZCCL_COLL_REDUCE_SCATTER, (size_t)(m / R), H, inter, p);
    default: return HUGE_VAL;
    }
}
static const char *hier_unavailable(zccl_coll_t c, const zccl_tune_layout_t *L) {
    (void)c;
    if (L->nhosts < 2) return "needs ranks on more than one host";
    if (!L->uniform) return "needs the same number of ranks on every host";
    return NULL;
}

/* ---- the registry ------------------------------------------------------------------------------------------ */

#define RS_AG (BIT(ZCCL_COLL_REDUCE_SCATTER) | BIT(ZCCL_COLL_ALLGATHER))
/* Order = preference on equal predictions: fewer concurrent messages per step first. On 4 ranks the model gives
 * direct (one step, 3 messages) and the log-step algorithms (2 steps of one message) the same latency term, and
 * on the 2-core VM the log-step ones were measured as fast or faster (docs/tuning.md). */
const zccl_algo_desc_t zccl__algos[] = {
    {"ring", ZCCL_ALGO_RING,
     BIT(ZCCL_COLL_ALLREDUCE) | RS_AG | BIT(ZCCL_COLL_BROADCAST) | BIT(ZCCL_COLL_REDUCE), NULL, predict_ring},
    {"rabenseifner", ZCCL_ALGO_RABENSEIFNER, BIT(ZCCL_COLL_ALLREDUCE) | RS_AG, NULL, predict_rab},
    {"recdbl", ZCCL_ALGO_RECDBL, BIT(ZCCL_COLL_ALLREDUCE), NULL, predict_recdbl},
    {"bruck", ZCCL_ALGO_BRUCK, BIT(ZCCL_COLL_ALLGATHER), NULL, predict_bruck},
    {"tree", ZCCL_ALGO_TREE, BIT(ZCCL_COLL_ALLREDUCE), NULL, predict_tree},
    {"direct", ZCCL_ALGO_DIRECT, BIT(ZCCL_COLL_ALLREDUCE) | RS_AG, NULL, predict_direct},
    {"hier", ZCCL_ALGO_HIER, BIT(ZCCL_COLL_ALLREDUCE) | RS_AG, hier_unavailable, predict_hier},
};
const int zccl__nalgos = (int)(sizeof zccl__algos / sizeof zccl__algos[0]);
_Static_assert(sizeof zccl__algos / sizeof zccl__algos[0] <= ZCCL_TUNE_MAX_ALGOS, "registry larger than a bitmask");

int zccl__algo_index(const char *name, size_t len) {
    for (int i = 0; i < zccl__nalgos; i++)
        if (strlen(zccl__algos[i].name) == len && !strncasecmp(name, zccl__algos[i].name, len)) return i;
    return -1;
}

static void list_algos(unsigned coll_mask, char *buf, size_t len) {
    size_t w = 0;
    buf[0] = '\0';
    for (int i = 0; i < zccl__nalgos && w < len; i++)
        if (zccl__algos[i].colls & coll_mask)
            w += (size_t)snprintf(buf + w, len - w, "%s%s", w ? ", " : "", zccl__algos[i].name);
}

static uint32_t algos_of(int coll) {
    uint32_t m = 0;
    for (int i = 0; i < zccl__nalgos; i++)
        if (zccl__algos[i].colls & BIT(coll)) m |= 1u << i;
    return m;
}

/* ---- ZCCL_ALGO --------------------------------------------------------------------------------------------- */

static void trim(const char **b, const char **e) {
    while (*b < *e && isspace((unsigned char)**b)) (*b)++;
    while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

zccl_result_t zccl__algo_filter_parse(const char *spec, const char *what, zccl_algo_filter_t *f) {
    memset(f, 0, sizeof *f);
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) f->allow[c] = algos_of(c);
    if (!spec) return ZCCL_SUCCESS;
    const char *p = spec, *end = spec + strlen(spec);
    trim(&p, &end);
    if (p == end) return ZCCL_SUCCESS;
    bool have_default = false, have_coll[ZCCL_COLL_COUNT] = {false};
    uint32_t sec_allow[ZCCL_COLL_COUNT];
    memcpy(sec_allow, f->allow, sizeof sec_allow);
    uint32_t dflt = (1u << zccl__nalgos) - 1; /* the default section's set, before intersecting per collective */
    char known[256], colls[128] = "";
    list_algos(~0u, known, sizeof known);
    for (int c = 0; c < NTUNED; c++)
        snprintf(colls + strlen(colls), sizeof colls - strlen(colls), "%s%s", c ? ", " : "", coll_tune_names[c]);
    while (p <= end) {
        const char *se = memchr(p, ';', (size_t)(end - p));
        if (!se) se = end;
        const char *b = p, *e = se;
        trim(&b, &e);
        int coll = -1;
        const char *colon = memchr(b, ':', (size_t)(e - b));
        if (colon) {
            const char *cb = b, *ce = colon;
            trim(&cb, &ce);
            coll = zccl__coll_from_name(cb, (size_t)(ce - cb));
            if (coll < 0)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": unknown collective '%.*s' (known: %s)", what,
                                   spec, (int)(ce - cb), cb, colls);
            if (have_coll[coll])
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": collective '%s' has two sections", what, spec,
                                   coll_tune_names[coll]);
            have_coll[coll] = true;
            b = colon + 1;
            trim(&b, &e);
        } else if (have_default) {
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": two sections without a collective ('%.*s'); prefix "
                               "the others with a collective, e.g. allreduce:%.*s", what, spec, (int)(e - b), b,
                               (int)(e - b), b);
        } else {
            have_default = true;
        }
        bool exclude = false;
        if (b < e && *b == '^') {
            exclude = true;
            b++;
            trim(&b, &e);
        }
        uint32_t named = 0;
        const char *q = b;
        for (;;) {
            const char *ne = memchr(q, ',', (size_t)(e - q));
            if (!ne) ne = e;
            const char *nb = q, *nn = ne;
            trim(&nb, &nn);
            if (nb == nn)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": empty algorithm name in section '%.*s' (known: "
                                   "%s)", what, spec, (int)(se - p), p, known);
            int a = zccl__algo_index(nb, (size_t)(nn - nb));
            if (a < 0 && *nb == '^')
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": '%.*s': '^' goes only at the start of a section "
                                   "and excludes every algorithm listed after it (e.g. ^ring,direct)", what, spec,
                                   (int)(nn - nb), nb);
            if (a < 0)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": unknown algorithm '%.*s' (known: %s)", what, spec,
                                   (int)(nn - nb), nb, known);
            if (coll >= 0 && !(zccl__algos[a].colls & BIT(coll))) {
                char valid[256];
                list_algos(BIT(coll), valid, sizeof valid);
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": algorithm '%s' does not run %s (algorithms for "
                                   "%s: %s)", what, spec, zccl__algos[a].name, coll_tune_names[coll],
                                   coll_tune_names[coll], valid);
            }
            named |= 1u << a;
            if (ne == e) break;
            q = ne + 1;
        }
        if (coll >= 0) {
            const uint32_t set = exclude ? algos_of(coll) & ~named : named;
            if (!set) {
                char valid[256];
                list_algos(BIT(coll), valid, sizeof valid);
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": section '%.*s' leaves %s no algorithm (algorithms "
                                   "for %s: %s)", what, spec, (int)(se - p), p, coll_tune_names[coll],
                                   coll_tune_names[coll], valid);
            }
            sec_allow[coll] = set;
            f->explicit_[coll] = true;
        } else {
            dflt = exclude ? ((1u << zccl__nalgos) - 1) & ~named : named;
            if (!dflt)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": section '%.*s' excludes every algorithm (known: "
                                   "%s)", what, spec, (int)(se - p), p, known);
        }
        if (se == end) break;
        p = se + 1;
    }
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) {
        if (f->explicit_[c]) f->allow[c] = sec_allow[c];
        else if (algos_of(c) & dflt) f->allow[c] = algos_of(c) & dflt;
        /* else: the default section names nothing this collective can run: it stays unrestricted */
    }
    return ZCCL_SUCCESS;
}

uint64_t zccl__algo_filter_hash(const zccl_algo_filter_t *f) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the allowed sets */
    for (int c = 0; c < ZCCL_COLL_COUNT; c++)
        for (int k = 0; k < 4; k++) h = (h ^ ((f->allow[c] >> (8 * k)) & 0xffu)) * 1099511628211ull;
    return h;
}

/* ---- layout, defaults, usable sets ------------------------------------------------------------------------- */

void zccl__tune_defaults(zccl_tune_params_t *p) {
    /* Round numbers of the order measured on small x86 VMs (docs/tuning.md); calibration replaces them. */
    p->intra = (zccl_link_cost_t){.alpha = 5e-6, .beta = 1.0 / 4e9};
    p->inter = (zccl_link_cost_t){.alpha = 30e-6, .beta = 1.0 / 1e9};
    p->gamma = 1.0 / 8e9;
    p->copy = 1.0 / 8e9;
}

/* Virtual rank v of the power-of-two fold (Thakur et al.: ranks 2v for v < e, v + e above) -> real rank. */
static int fold_real(int v, int e) { return v < e ? 2 * v : v + e; }

/* Most ranks of one host (host[r] in [0, nh)) with a partner on another host, for the pairs (a[i], b[i]), i < k;
 * per[] is scratch of nh ints. */
static int max_share(const int *host, const int *a, const int *b, int k, int nh, int *per) {
    memset(per, 0, (size_t)nh * sizeof *per);
    int most = 0;
    for (int i = 0; i < k; i++)
        if (host[a[i]] != host[b[i]] && ++per[host[a[i]]] > most) most = per[host[a[i]]];
    return most;
}

zccl_result_t zccl__tune_layout(const uint64_t *host_hash, const int *ring, int n, zccl_tune_layout_t *L,
                                int *host_of) {
    memset(L, 0, sizeof *L);
    L->nranks = n;
    L->uniform = true;
    int *host = malloc((size_t)n * sizeof *host), *cnt = calloc((size_t)n, sizeof *cnt);
    int *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    if (!host || !cnt || !a || !b) {
        free(host), free(cnt), free(a), free(b);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the tuner's layout of %d ranks", n);
    }
    for (int r = 0; r < n; r++) { /* host index: order of first appearance */
        host[r] = L->nhosts;
        for (int q = 0; q < r; q++)
            if (host_hash[q] == host_hash[r]) {
                host[r] = host[q];
                break;
            }
        if (host[r] == L->nhosts) L->nhosts++;
        cnt[host[r]]++;
    }
    for (int h = 0; h < L->nhosts; h++) {
        if (cnt[h] > L->per_host) L->per_host = cnt[h];
        if (cnt[h] != cnt[0]) L->uniform = false;
        const double cross = (double)cnt[h] * (n - cnt[h]);
        if (cross > L->direct_cross) L->direct_cross = cross;
    }
    if (L->nhosts > 1) {
        for (int i = 0; i < n; i++) a[i] = ring ? ring[i] : i, b[i] = ring ? ring[(i + 1) % n] : (i + 1) % n;
        L->ring_share = max_share(host, a, b, n, L->nhosts, cnt);
        int q = 1;
        while (q * 2 <= n) q *= 2;
        for (int k = 0; (1 << k) < n && k < ZCCL_TUNE_MAX_LG; k++) {
            const int d = 1 << k;
            int m = 0;
            for (int v = 0; v < q && d < q; v++) a[m] = fold_real(v, n - q), b[m] = fold_real(v ^ d, n - q), m++;
            L->xor_share[k] = max_share(host, a, b, m, L->nhosts, cnt);
            for (int r = 0; r < n; r++) a[r] = r, b[r] = (r + d) % n;
            L->add_share[k] = max_share(host, a, b, n, L->nhosts, cnt);
        }
    }
    if (host_of) memcpy(host_of, host, (size_t)n * sizeof *host);
    free(host), free(cnt), free(a), free(b);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__tune_usable(zccl_tuner_t *t, const char *what) {
    t->fallback[0] = '\0';
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) {
        uint32_t avail = 0, allowed = t->filter.allow[c];
        const char *why = NULL, *why_name = NULL;
        for (int i = 0; i < zccl__nalgos; i++) {
            if (!(zccl__algos[i].colls & BIT(c))) continue;
            const char *u = zccl__algos[i].unavailable ? zccl__algos[i].unavailable((zccl_coll_t)c, &t->L) : NULL;
            if (!u) avail |= 1u << i;
            else if (allowed & (1u << i)) why = u, why_name = zccl__algos[i].name;
        }
        t->usable[c] = allowed & avail;
        if (!t->usable[c] && c < NTUNED) {
            if (t->filter.explicit_[c])
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: %s cannot run with %s on this communicator (%d ranks on "
                                   "%d hosts): %s", what, coll_tune_names[c], why_name ? why_name : "?", t->L.nranks,
                                   t->L.nhosts, why ? why : "not available");
            /* Not an error: one setting serves every communicator of the job (a sub-communicator inside one host
             * cannot run hier), but say so instead of ignoring it silently. */
            const size_t used = strlen(t->fallback);
            snprintf(t->fallback + used, sizeof t->fallback - used, "%s%s", used ? ", " : "", coll_tune_names[c]);
            if (why && !strstr(t->fallback, why)) {
                const size_t u2 = strlen(t->fallback);
                snprintf(t->fallback + u2, sizeof t->fallback - u2, " (%s %s)", why_name, why);
            }
            t->usable[c] = avail;
        }
    }
    return ZCCL_SUCCESS;
}

/* ---- the choice -------------------------------------------------------------------------------------------- */

size_t zccl__tune_bytes(zccl_coll_t coll, size_t count, size_t elem_size, int nranks) {
    size_t b = count * elem_size;
    if (coll == ZCCL_COLL_REDUCE_SCATTER || coll == ZCCL_COLL_ALLGATHER) b *= (size_t)nranks;
    return b;
}

int zccl__tune_pick(const zccl_tuner_t *t, zccl_coll_t coll, size_t bytes, double *pred) {
    int best = -1;
    double best_t = 0;
    for (int i = 0; i < zccl__nalgos; i++) {
        double x = -1.0;
        if ((unsigned)coll < ZCCL_COLL_COUNT && (t->usable[coll] & (1u << i))) {
            x = zccl__algos[i].predict(coll, bytes, &t->L, &t->p);
            if (!(x >= 0) || !isfinite(x)) x = HUGE_VAL; /* a broken prediction never wins, but stays usable */
            if (best < 0 || x < best_t) best = i, best_t = x;
        }
        if (pred) pred[i] = x;
    }
    return best;
}

static int bucket_of(size_t bytes) {
    int b = 0;
    while (b < 63 && (bytes >> (b + 1))) b++;
    return b;
}

void zccl__tune(struct zccl_comm *comm, zccl_sched_args_t *a) {
    zccl_tuner_t *t = comm->tuner;
    const zccl_coll_t coll = a->coll;
    a->algo = ZCCL_ALGO_RING;
    if ((unsigned)coll >= NTUNED || !t || !t->agreed) return; /* send/recv: one schedule; before agreement: ring */
    a->host_of = t->host_of;
    const size_t bytes = zccl__tune_bytes(coll, a->count, a->elem_size, comm->nranks);
    double pred[ZCCL_TUNE_MAX_ALGOS];
    const int best = zccl__tune_pick(t, coll, bytes, pred);
    if (best < 0) return; /* cannot happen: every collective keeps an available algorithm */
    if (zccl__log_level >= ZCCL_LOG_INFO) {
        const int b = bucket_of(bytes);
        const uint64_t bit = 1ull << b;
        if (!(__atomic_fetch_or(&t->logged[coll], bit, __ATOMIC_RELAXED) & bit)) {
            char line[512];
            size_t w = 0;
            for (int i = 0; i < zccl__nalgos && w < sizeof line; i++)
                if (pred[i] >= 0)
                    w += (size_t)snprintf(line + w, sizeof line - w, " %s%s=%.1fus", zccl__algos[i].name,
                                          i == best ? "*" : "", pred[i] * 1e6);
            ZCCL_INFO(ZCCL_LOG_TUNE, "tuner: %s %zu B (bucket [%llu, %llu) B) on %d ranks / %d hosts -> %s; "
                      "predicted:%s", coll_tune_names[coll], bytes, (unsigned long long)(1ull << b),
                      (unsigned long long)(b < 63 ? 1ull << (b + 1) : 0), comm->nranks, t->L.nhosts,
                      zccl__algos[best].name, line);
        }
    }
    a->algo = zccl__algos[best].algo;
}

/* ---- public queries and the runtime override ---------------------------------------------------------------- */

static zccl_result_t coll_arg(const char *fn, const char *collective, int *coll) {
    if (!collective) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'collective' is NULL", fn);
    *coll = zccl__coll_from_name(collective, strlen(collective));
    if (*coll < 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'collective' = \"%s\" is not one of allreduce, "
                           "reducescatter, allgather, broadcast, reduce", fn, collective);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_algorithms(zccl_comm_t comm, const char *collective, char *names, size_t len) {
    const char *fn = "zccl_comm_algorithms";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (!names || len == 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'names' is NULL or 'len' is 0", fn);
    int c;
    ZCCL_CHECK(coll_arg(fn, collective, &c));
    size_t w = 0;
    names[0] = '\0';
    for (int i = 0; i < zccl__nalgos; i++) {
        if (!(zccl__algos[i].colls & BIT(c))) continue;
        if (zccl__algos[i].unavailable && zccl__algos[i].unavailable((zccl_coll_t)c, &comm->tuner->L)) continue;
        int k = snprintf(names + w, len - w, "%s%s", w ? "," : "", zccl__algos[i].name);
        if (k < 0 || (size_t)k >= len - w)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'len' = %zu is too small for the list", fn, len);
        w += (size_t)k;
    }
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_algo_choice(zccl_comm_t comm, const char *collective, size_t bytes, char *name,
                                             size_t len, double *predicted_us) {
    const char *fn = "zccl_comm_algo_choice";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (!name || len == 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'name' is NULL or 'len' is 0", fn);
    int c;
    ZCCL_CHECK(coll_arg(fn, collective, &c));
    double pred[ZCCL_TUNE_MAX_ALGOS];
    pthread_mutex_lock(&comm->exec_mutex);
    const int best = zccl__tune_pick(comm->tuner, (zccl_coll_t)c, bytes, pred);
    pthread_mutex_unlock(&comm->exec_mutex);
    if (best < 0) return zccl__error(ZCCL_INTERNAL_ERROR, "%s: no algorithm can run %s", fn, collective);
    if ((size_t)snprintf(name, len, "%s", zccl__algos[best].name) >= len)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'len' = %zu is too small for \"%s\"", fn, len,
                           zccl__algos[best].name);
    if (predicted_us) *predicted_us = pred[best] * 1e6;
    return ZCCL_SUCCESS;
}

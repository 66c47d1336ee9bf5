/*
 * algo.h — the registry of algorithms: one row per algorithm with its name, a schedule builder per collective it
 * runs, its availability rule and its cost predictor (and, where the literature gives one, its closed-form time).
 * The tuner (lib/tuner) chooses among the rows; the schedule builder (schedule.c) runs the chosen row's builder.
 *
 * Adding an algorithm: one file sched/sched_<name>.c that defines `const zccl_algo_t zccl__algo_<name>` (its
 * builders, predictor, formula), and one row in zccl__algo_table (sched/algos.c). Row order is the tuner's
 * preference on equal predictions. docs/architecture.md, "Add an algorithm".
 *
 * Cost model (Hockney's alpha-beta model with a reduction term gamma, as in Thakur, Rabenseifner & Gropp, "Optimization
 * of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005; Patarasuk & Yuan, "Bandwidth optimal
 * all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009): a step that moves b bytes over a link
 * costs alpha + b*beta, reducing b bytes costs b*gamma. A step in which a rank has k messages in flight at once
 * costs alpha*(1 + (k-1)*ZCCL_TUNE_RHO) + (sum of bytes)*beta: on CPU-driven transports each extra message adds
 * work for the same core, but less than a full dependent step.
 */
#ifndef ZCCL_ALGO_H
#define ZCCL_ALGO_H

#include <stdbool.h>
#include <stddef.h>
#include "schedule.h"

/** One class of link: alpha in seconds per message step, beta in seconds per byte. */
typedef struct {
    double alpha, beta;
} zccl_link_cost_t;

/** Model parameters. intra: between ranks of one host (shared memory, or TCP when forced); inter: between hosts. */
typedef struct {
    zccl_link_cost_t intra, inter;
    double gamma; /* seconds per byte reduced (float32 sum with the reduction kernel) */
    double copy;  /* seconds per byte of a local copy */
} zccl_tune_params_t;

#define ZCCL_TUNE_MAX_LG 32

/**
 * How the ranks sit on hosts (identical on every rank: derived from the bootstrap's host table and the ring).
 * The *_share fields describe how the flat algorithms load the host links: for one exchange pattern, the most
 * ranks of one host whose partner is on another host (they all send through that host's link at once, so a step
 * costs share x beta_inter per byte); 0 means the pattern stays inside the hosts (intra-host link). All zero on one
 * host (also when left zero by an aggregate initialiser).
 */
typedef struct {
    int nranks;
    int nhosts;
    int per_host;  /* most ranks on one host */
    bool uniform;  /* every host has per_host ranks */
    int ring_share;                     /* ring neighbours (the communicator's ring order) */
    int xor_share[ZCCL_TUNE_MAX_LG];    /* virtual ranks v and v ^ 2^k of the power-of-two fold (Thakur et al.) */
    int add_share[ZCCL_TUNE_MAX_LG];    /* ranks r and r + 2^k mod n (Bruck) */
    double direct_cross;                /* most blocks one host sends to other hosts in a direct step:
                                           max over hosts of ranks_h x (n - ranks_h) */
} zccl_tune_layout_t;

/** Extra cost of each further concurrent message of a step, as a fraction of alpha. */
#define ZCCL_TUNE_RHO 0.5


/** One algorithm. Slots a row leaves NULL: it does not run that collective / it runs on any layout / no closed form. */
typedef struct zccl_algo {
    const char *name; /* ZCCL_ALGO name, lower case */
    /** Builds args->rank's schedule of collective c (indexed by zccl_coll_t). */
    void (*build[ZCCL_COLL_COUNT])(const zccl_sched_args_t *a, zccl_schedule_t *s);
    /** Schedule-time check of the rank layout (args->host_of): false with a reason when it cannot run. */
    bool (*layout_ok)(const zccl_sched_args_t *a, char *why, size_t len);
    /** Tuner-time availability on a layout: NULL if it can run coll there, else why not (static text). */
    const char *(*unavailable)(zccl_coll_t coll, const zccl_tune_layout_t *L);
    /** Predicted seconds for coll over `bytes` (zccl__tune_bytes' convention), by the alpha-beta-gamma model. */
    double (*predict)(zccl_coll_t coll, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p);
    /** Closed-form alpha-beta-gamma time on one host from the literature (zccl__sched_cost_formula), or < 0. */
    double (*formula)(const zccl_sched_args_t *a, const zccl_cost_params_t *p);
} zccl_algo_t;

#define ZCCL_TUNE_MAX_ALGOS 32
/** The registry (sched/algos.c), zccl__nalgos rows; an algorithm's id (zccl_sched_args_t.algo) is its row. */
extern const zccl_algo_t *const zccl__algo_table[];
extern const int zccl__nalgos;
/** Row `algo`, or NULL when out of range. */
static inline const zccl_algo_t *zccl__algo(int algo) {
    return algo >= 0 && algo < zccl__nalgos ? zccl__algo_table[algo] : (const zccl_algo_t *)0;
}

/* ---- helpers of the predictors (sched/algos.c) ---- */

/** Pipeline chunk in bytes of broadcast/reduce and the tree for a call of `bytes` on n ranks: bytes/(4(n-1)),
 *  clamped to [64 KiB, 4 MiB] (enough chunks to fill the pipeline, each large enough to amortise alpha). */
size_t zccl__pipeline_chunk(size_t bytes, int nranks);
/** ceil(log2 n) as a double, and the largest power of two <= n. */
double zccl__ceil_log2(int n);
int zccl__pow2_floor(int n);
/** The link every lockstep round of a flat algorithm waits for: across hosts as soon as there are several. */
zccl_link_cost_t zccl__flat_link(const zccl_tune_layout_t *L, const zccl_tune_params_t *p);
/** The link of one step whose exchange pattern puts `share` ranks of one host on the host's link at once. */
zccl_link_cost_t zccl__shared_link(const zccl_tune_layout_t *L, const zccl_tune_params_t *p, int share);
/** One step with k concurrent messages of b bytes each. */
double zccl__step_cost(zccl_link_cost_t l, int k, double b);
/** The ring's time for c over `bytes` on n ranks over link l (also hier's pieces). */
double zccl__ring_cost(zccl_coll_t c, size_t bytes, int n, zccl_link_cost_t l, const zccl_tune_params_t *p);

/** The terms of the closed forms: n ranks, pw the largest power of two <= n, e = n - pw, alpha/beta/gamma, and m
 *  the bytes of the full vector (all-reduce: count*elem; reduce-scatter, all-gather: n*count*elem). */
typedef struct {
    int n, pw, e;
    double fn, fp, A, B, G, m;
} zccl_formula_terms_t;
void zccl__formula_terms(const zccl_sched_args_t *a, const zccl_cost_params_t *p, zccl_formula_terms_t *t);

#endif

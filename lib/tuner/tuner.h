/*
 * tuner.h — which algorithm runs a collective: over the registry of algorithms (sched/algo.h: name, builders,
 * availability, cost predictor), the ZCCL_ALGO filter (NCCL_ALGO's grammar), the alpha-beta-gamma parameters measured at init (or read
 * from a cache file) and agreed by all ranks, and the choice itself. See docs/tuning.md.
 *
 * The choice is a pure function of (collective, bytes, rank layout, agreed parameters, agreed filter): every
 * rank computes the same inputs, so every rank runs the same schedule. Nothing measured locally enters a choice
 * before it has been agreed (all-reduce MAX over ranks).
 *
 * Cost model (Hockney's alpha-beta model with a reduction term gamma, as in Thakur, Rabenseifner & Gropp, "Optimization
 * of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005; Patarasuk & Yuan, "Bandwidth optimal
 * all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009): a step that moves b bytes over a link
 * costs alpha + b*beta, reducing b bytes costs b*gamma. A step in which a rank has k messages in flight at once
 * costs alpha*(1 + (k-1)*ZCCL_TUNE_RHO) + (sum of bytes)*beta: on CPU-driven transports each extra message adds
 * work for the same core, but less than a full dependent step.
 */
#ifndef ZCCL_TUNER_H
#define ZCCL_TUNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "algo.h"

struct zccl_comm;

/* The cost model's types (zccl_link_cost_t, zccl_tune_params_t, zccl_tune_layout_t) and the registry of algorithms
 * with their predictors live in the schedule layer (sched/algo.h): an algorithm is one file there. */

/** Collectives with a choice to make: all-reduce .. reduce (send/recv have one schedule). */
#define ZCCL_NTUNED 5
/** The collectives a registry row runs, as a bitmask (bit c: zccl_coll_t c). */
unsigned zccl__algo_colls(const zccl_algo_t *row);

/** Name of a collective as ZCCL_ALGO spells it ("allreduce", "reducescatter", ...); "?" if out of range. */
const char *zccl__coll_tune_name(zccl_coll_t c);
/** Collective from a ZCCL_ALGO name (NCCL's spelling; "_" variants accepted, case-insensitive); -1 if unknown. */
int zccl__coll_from_name(const char *name, size_t len);
/** Registry index of an algorithm name (case-insensitive), -1 if unknown. */
int zccl__algo_index(const char *name, size_t len);

/** Which algorithms ZCCL_ALGO allows: bit i of allow[c] is registry entry i. */
typedef struct {
    uint32_t allow[ZCCL_COLL_COUNT];
    bool explicit_[ZCCL_COLL_COUNT]; /* a section named this collective: an empty choice is an error */
} zccl_algo_filter_t;

/**
 * Parses a ZCCL_ALGO value (NCCL_ALGO's grammar):
 *   spec     := section (';' section)*
 *   section  := [collective ':'] ['^'] name (',' name)*
 * A section without a collective applies to every collective that has no section of its own; '^' excludes the
 * names instead of selecting them. Names and collectives are case-insensitive; spaces around them are ignored.
 * Empty or NULL spec: everything allowed. `what` names the source in errors (e.g. "ZCCL_ALGO").
 * Errors (ZCCL_INVALID_ARGUMENT, message names the offending token and lists the valid ones): unknown algorithm,
 * unknown collective, empty name, a collective given two sections, two sections without a collective, a
 * collective section naming an algorithm that does not run that collective or leaving it none.
 * A section without a collective that leaves some collective no algorithm leaves that collective unrestricted.
 */
zccl_result_t zccl__algo_filter_parse(const char *spec, const char *what, zccl_algo_filter_t *f);
/** A hash of the filter (equal filters, equal hashes), for checking that ranks agree. */
uint64_t zccl__algo_filter_hash(const zccl_algo_filter_t *f);

/** Tuner state of a communicator. */
typedef struct zccl_tuner {
    zccl_tune_params_t p;
    zccl_tune_layout_t L;
    zccl_algo_filter_t filter;
    uint32_t usable[ZCCL_COLL_COUNT]; /* filter & available on this layout */
    uint64_t logged[ZCCL_COLL_COUNT]; /* size buckets (log2 of bytes) already shown at INFO */
    int *host_of;                     /* host index of every rank (for hierarchical schedules) */
    char source[64];                  /* where p came from: "defaults", "calibrated", "cache FILE" */
    double calib_ms;                  /* time init spent on calibration */
    char fallback[320];               /* set by zccl__tune_usable when ZCCL_ALGO's default section named nothing
                                         a collective can run here, so the tuner chooses freely (printed at init) */
    bool cma_on[ZCCL_COLL_COUNT];     /* the single copy (true) or the slots for this collective on shared
                                         memory, measured at calibration (tuner_calib.c cma_choose) */
    bool cma_per_call;                /* cma_on differs between collectives: zccl__tune sets it before each call
                                         (false: set once for all at calibration, or the transport's own setting) */
    bool agreed;                      /* parameters and filter agreed by all ranks; until then every collective
                                         runs the ring, which needs no agreement (init's own all-reduces) */
    struct {                          /* the last choice per collective (zccl__tune; cleared by zccl__tune_forget
                                         whenever p, filter, usable or agreed change) */
        size_t bytes;
        int algo;
        bool valid;
    } memo[ZCCL_COLL_COUNT];
} zccl_tuner_t;

/** Forgets the remembered choices: call after changing t->p, t->filter, t->usable or t->agreed. */
void zccl__tune_forget(zccl_tuner_t *t);

/** Default parameters (used when calibration is disabled, and before it has run). */
void zccl__tune_defaults(zccl_tune_params_t *p);
/**
 * Layout of n ranks from their host hashes (n entries) and the ring order (n ranks, position -> rank; NULL: rank
 * order). If host_of is not NULL it receives each rank's host index (0, 1, ... in order of first appearance; n
 * ints), the labels the hierarchical schedules take. Returns ZCCL_SYSTEM_ERROR when out of memory (scratch of n ints).
 */
zccl_result_t zccl__tune_layout(const uint64_t *host_hash, const int *ring, int n, zccl_tune_layout_t *L,
                                int *host_of);
/**
 * Fills usable[] from the filter and the layout. An explicit section whose algorithms are all unavailable is an
 * error naming the reason; elsewhere an empty set falls back to every available algorithm.
 */
zccl_result_t zccl__tune_usable(zccl_tuner_t *t, const char *what);

/** Bytes the model uses for a call: the vector every rank holds in full (allreduce/broadcast/reduce: count*size;
 *  reduce-scatter and all-gather: count*size*nranks). */
size_t zccl__tune_bytes(zccl_coll_t coll, size_t count, size_t elem_size, int nranks);

/**
 * The choice for coll over `bytes`: the usable algorithm of least predicted time (ties: lower registry index).
 * Fills pred[i] for every registry entry (negative: not usable) when pred is non-NULL. Returns the registry
 * index, or -1 when no algorithm can run coll.
 */
int zccl__tune_pick(const zccl_tuner_t *t, zccl_coll_t coll, size_t bytes, double *pred);

/**
 * Sets a->algo (and a->host_of) for the schedule of a->coll over a->count elements of a->elem_size bytes on comm
 * (collectives.c calls this for every operation). Logs the choice with every candidate's predicted time at INFO
 * once per (collective, power-of-two size bucket).
 */
void zccl__tune(struct zccl_comm *comm, zccl_sched_args_t *a);


/** Before the first collective of a new communicator: defaults, layout, ZCCL_ALGO. */
zccl_result_t zccl__tuner_setup(struct zccl_comm *comm);
/**
 * After the transports are up (collective over comm): loads ZCCL_TUNER_CACHE or measures alpha and beta per link
 * class with ring shifts between neighbours and gamma with the reduction kernel (ZCCL_TUNER_CALIBRATE), then
 * makes every rank adopt the same parameters (all-reduce MAX) and checks that every rank has the same ZCCL_ALGO.
 * With ZCCL_DETERMINISTIC=1 nothing is measured (the cache when every rank has its entries, else the defaults) and
 * the cache is never written, so the choices, hence the summation orders, are the same in every run.
 */
zccl_result_t zccl__tuner_calibrate(struct zccl_comm *comm);
void zccl__tuner_free(struct zccl_comm *comm);

/**
 * The agreement step alone, for tests: all-reduces (MAX) the parameters and the filter hash over comm; on return
 * *p holds the agreed values. A filter that differs between ranks is ZCCL_INVALID_USAGE on every rank.
 */
zccl_result_t zccl__tuner_agree(struct zccl_comm *comm, zccl_tune_params_t *p, uint64_t filter_hash, const char *what);

/* This layer's rows of the settings table (lib/tuner/settings.c). */
extern const zccl_cfg_desc_t zccl__set_algo;
#define ZCCL_CFG_ALGO (&zccl__set_algo)
extern const zccl_cfg_desc_t zccl__set_tuner_calibrate;
#define ZCCL_CFG_TUNER_CALIBRATE (&zccl__set_tuner_calibrate)
extern const zccl_cfg_desc_t zccl__set_deterministic;
#define ZCCL_CFG_DETERMINISTIC (&zccl__set_deterministic)
extern const zccl_cfg_desc_t zccl__set_tuner_cache;
#define ZCCL_CFG_TUNER_CACHE (&zccl__set_tuner_cache)

#endif

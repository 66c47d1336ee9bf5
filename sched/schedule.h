/*
 * schedule.h — algorithms as data. A collective compiles, per rank, into a list of phases; each phase is a set of
 * steps (send / receive / receive-and-reduce / local copy over a range of elements) that run concurrently, and a
 * phase starts when the previous one has completed on this rank. The progress engine (engine.c) runs a schedule
 * over any transport; the checker (sched_check.c) runs every rank's schedule symbolically, without processes.
 *
 * Buffers are named, not pointed to, so a schedule depends only on (collective, count, nranks, rank, root) and
 * can be printed, checked and cached: SEND and RECV are the user's buffers, TMP is the communicator's scratch.
 */
#ifndef ZCCL_SCHEDULE_H
#define ZCCL_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core.h"

typedef enum { ZCCL_BUF_SEND = 0, ZCCL_BUF_RECV = 1, ZCCL_BUF_TMP = 2, ZCCL_BUF_NONE = 3 } zccl_buf_id_t;

typedef enum {
    ZCCL_STEP_SEND = 0, /* send buf[off, off+count) to peer */
    ZCCL_STEP_RECV = 1, /* receive count elements from peer into buf[off..]; if src != NONE, reduce them with
                           src[src_off..] (dst = received OP src), dividing by nranks when `final` and op is AVG */
    ZCCL_STEP_COPY = 2, /* buf[off..] = src[src_off..] (skipped when both are the same memory) */
    ZCCL_STEP_REDUCE = 3 /* local: buf[off..] = src[src_off..] OP src2[src2_off..] (divided when `final`, AVG) */
} zccl_step_kind_t;

typedef struct {
    uint8_t kind;
    uint8_t buf;
    uint8_t src;
    uint8_t final;
    int32_t peer;
    size_t off, src_off, count; /* elements */
    uint8_t src2;               /* ZCCL_STEP_REDUCE only */
    size_t src2_off;
} zccl_step_t;

/**
 * Names for the rows of the registry of algorithms (sched/algo.h, sched/algos.c), which holds each one's
 * builders and cost model; the library itself finds algorithms through the table and their names, these constants
 * are for tests and callers that force one (in table order, checked by a static assertion in algos.c). Which
 * collectives each implements: zccl__algo_supports(). Broadcast and reduce run the pipelined chain (the ring row's
 * builders) whatever the algorithm, send/recv are single steps; `algo` is ignored for them.
 *  RING          ring reduce-scatter / all-gather / all-reduce (sched_ring.c; Patarasuk & Yuan 2009)
 *  DIRECT        one-shot exchange: all-reduce, reduce-scatter, all-gather (sched_direct.c)
 *  TREE          double binary tree all-reduce, pipelined (sched_tree.c; Sanders, Speck & Traeff 2009)
 *  RABENSEIFNER  recursive halving reduce-scatter + recursive doubling all-gather, and their composition as
 *                all-reduce; any rank count (sched_rabenseifner.c; Rabenseifner 2004, Thakur et al. 2005)
 *  RECDBL        recursive doubling all-reduce of the whole vector, for tiny messages (sched_recdbl.c)
 *  BRUCK         Bruck all-gather, ceil(log2 n) steps for any n (sched_bruck.c; Bruck et al. 1997)
 *  HIER          hierarchical: intra-host reduce-scatter, inter-host collective among the ranks with the same
 *                position on their host, intra-host all-gather (sched_hier.c); needs zccl_sched_args_t.host_of
 */
enum {
    ZCCL_ALGO_RING = 0,
    ZCCL_ALGO_RABENSEIFNER = 1,
    ZCCL_ALGO_RECDBL = 2,
    ZCCL_ALGO_BRUCK = 3,
    ZCCL_ALGO_TREE = 4,
    ZCCL_ALGO_DIRECT = 5,
    ZCCL_ALGO_HIER = 6,
    ZCCL_ALGO_COUNT
};

typedef enum {
    ZCCL_COLL_ALLREDUCE = 0,
    ZCCL_COLL_REDUCE_SCATTER,
    ZCCL_COLL_ALLGATHER,
    ZCCL_COLL_BROADCAST,
    ZCCL_COLL_REDUCE,
    ZCCL_COLL_SEND,
    ZCCL_COLL_RECV,
    ZCCL_COLL_ALLTOALL,  /* count: elements to/from each peer; direct (sched_alltoall.c) */
    ZCCL_COLL_ALLTOALLV, /* per-peer counts and displacements in a2av; direct */
    ZCCL_COLL_GATHER,    /* count per rank; root: the root */
    ZCCL_COLL_SCATTER,   /* count per rank; root: the root */
    ZCCL_COLL_COUNT
} zccl_coll_t;

/** The arguments that shape a schedule. count is the collective's count argument (recvcount for reduce-scatter,
 *  sendcount for all-gather). in_place follows NCCL's rules for the collective. */
typedef struct {
    zccl_coll_t coll;
    int nranks, rank, root; /* root: broadcast/reduce root; peer for send/recv */
    size_t count;
    bool in_place;
    size_t elem_size;  /* bytes per element: chunking is decided in bytes */
    size_t chunk_bytes;      /* pipeline chunk for broadcast/reduce */
    size_t rs_round_bytes;   /* reduce-scatter block slice per round (bounds TMP) */
    int algo;                /* ZCCL_ALGO_* for collectives with several algorithms */
    const int *ring;         /* ring order: ring[i] is the rank at position i (topology-aware); NULL = 0..n-1 */
    /* Uneven reduce-scatter / all-gather (zccl_reduce_scatter_v, zccl_allgather_v): block b (rank b's output of a
     * reduce-scatter, its input of an all-gather) has counts[b] elements starting at displs[b] of the full buffer
     * (displs = prefix sums of counts); count is then counts[rank]. NULL: every block has `count` elements. Only the
     * ring schedules read them. */
    const size_t *counts, *displs;
    /* All-to-allv: this rank's sendcounts, sdispls, recvcounts, rdispls (nranks entries each, elements, back to
     * back). The checker instead takes the whole matrix a2av_matrix[q * nranks + r] = elements rank q sends to rank
     * r (each rank's blocks then packed in rank order) and derives every rank's a2av itself. */
    const size_t *a2av;
    const size_t *a2av_matrix;
    const int *host_of;      /* HIER only: host_of[r] is the host index (any int) of rank r, nranks entries; NULL
                                = all ranks on one host. Every host must hold the same number of ranks; a rank's
                                position on its host is its order among the host's ranks by rank number. */
} zccl_sched_args_t;

typedef struct {
    zccl_step_t *steps;
    size_t nsteps, steps_cap;
    uint32_t *phase_end; /* phase i is steps [i ? phase_end[i-1] : 0, phase_end[i]) */
    size_t nphases, phases_cap;
    size_t tmp_elems;    /* scratch the schedule needs, in elements */
    bool oom;            /* an append failed: the schedule is unusable */
} zccl_schedule_t;

/** Name of an algorithm ("ring", "direct", "tree", "rabenseifner", "recdbl", "bruck", "hier"); "?" if unknown. */
const char *zccl__algo_name(int algo);
/** The ZCCL_ALGO_* named `name` (exact, lower case), or -1. */
int zccl__algo_from_name(const char *name);
/** Whether `algo` implements collective `coll` (broadcast, reduce, send, recv: every algo, they ignore it). */
bool zccl__algo_supports(int algo, zccl_coll_t coll);

/** Test hook: from now on, all-reduce / reduce-scatter / all-gather schedules built in this process run `algo`
 *  where it implements the collective (-1: the caller's choice again) and, if host_of is not NULL, use that host
 *  layout (nranks entries, owned by the caller, which must outlive its use). Set it before any collective runs
 *  (e.g. in a forked test rank before its first call); not thread-safe; meant for tests only. */
void zccl__sched_force_algo(int algo, const int *host_of);

/** Builds the schedule of args->rank. Returns ZCCL_SYSTEM_ERROR on allocation failure, ZCCL_INVALID_ARGUMENT when
 *  args->algo does not implement args->coll or HIER's host layout is unusable (message names which). */
zccl_result_t zccl__sched_build(const zccl_sched_args_t *args, zccl_schedule_t *s);
void zccl__sched_free(zccl_schedule_t *s);

/**
 * A communicator's cache of recently built schedules: training repeats the same calls (the same bucket sizes every
 * step), and building a schedule costs about as much as a small all-reduce's whole data movement. Entries are keyed
 * by every field of zccl_sched_args_t a builder reads (the ring and host layout by address: the communicator owns
 * them for its lifetime) and by the test hook zccl__sched_force_algo; calls with uneven counts or all-to-allv
 * arguments are not cached. Not thread-safe: the owner serialises its calls (a communicator's exec_mutex).
 */
#define ZCCL_SCHED_CACHE_SIZE 8
typedef struct {
    struct {
        zccl_sched_args_t key;
        int forced_algo;
        const int *forced_hosts;
        zccl_schedule_t s;
        uint64_t used; /* last use, for replacing the least recently used entry */
        bool valid;
    } e[ZCCL_SCHED_CACHE_SIZE];
    uint64_t clock;
    uint64_t hits, misses; /* for tests and the debug log */
} zccl_sched_cache_t;

/**
 * The schedule for `args` from `cache`, built with zccl__sched_build on a miss. *out points into the cache and stays
 * valid until the next call on the same cache or zccl__sched_cache_free. Errors as zccl__sched_build (nothing is
 * cached then).
 */
zccl_result_t zccl__sched_get(zccl_sched_cache_t *cache, const zccl_sched_args_t *args, const zccl_schedule_t **out);
/** Frees every cached schedule; the cache is empty (and reusable) afterwards. */
void zccl__sched_cache_free(zccl_sched_cache_t *cache);

/* Builders for one algorithm each (sched_<name>.c; the registry rows point at them). */
void zccl__sched_ring_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_ring_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_ring_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_chain_broadcast(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_chain_reduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_direct_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_direct_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_direct_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_tree_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_rabenseifner_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_rabenseifner_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_rabenseifner_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_recdbl_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_bruck_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s);
/* Direct all-to-all, all-to-allv, gather and scatter (sched_alltoall.c); they ignore `algo`. */
void zccl__sched_direct_alltoall(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_direct_alltoallv(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_direct_gather(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_direct_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s);
/** Hierarchical builders; they return false (building nothing) when the host layout is unusable. */
bool zccl__sched_hier_layout_ok(const zccl_sched_args_t *a, char *why, size_t len);
void zccl__sched_hier_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_hier_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_hier_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s);

/* Building blocks. */
void zccl__sched_step(zccl_schedule_t *s, zccl_step_t st); /* count 0 steps are dropped */
void zccl__sched_end_phase(zccl_schedule_t *s);          /* empty phases are dropped */
/** The whole schedule of a 1-rank communicator: copy a->count elements from SEND[src_off] to RECV[0] unless in
 *  place, in one phase. Every builder starts with it for n == 1. */
void zccl__sched_one_rank(const zccl_sched_args_t *a, zccl_schedule_t *s, size_t src_off);
/** Offset and length of block b when n blocks share count elements as evenly as possible (first ones larger). */
static inline void zccl__block(size_t count, int n, int b, size_t *off, size_t *len) {
    size_t q = count / (size_t)n, rem = count % (size_t)n, ub = (size_t)b;
    *off = ub * q + (ub < rem ? ub : rem);
    *len = q + (ub < rem ? 1 : 0);
}

/** Offset and length, in elements, of block b of a reduce-scatter's input / all-gather's output (rank b's block). */
static inline void zccl__vblock(const zccl_sched_args_t *a, int b, size_t *off, size_t *len) {
    if (a->counts) {
        *off = a->displs[b];
        *len = a->counts[b];
    } else {
        *off = (size_t)b * a->count;
        *len = a->count;
    }
}
/** Elements of a reduce-scatter's input / all-gather's output: the sum of all blocks. */
static inline size_t zccl__vtotal(const zccl_sched_args_t *a) {
    const int n = a->nranks;
    return a->counts ? a->displs[n - 1] + a->counts[n - 1] : (size_t)n * a->count;
}

/** Rank at ring position i (any integer: taken modulo n). */
static inline int zccl__ring_at(const zccl_sched_args_t *a, int i) {
    const int n = a->nranks, p = ((i % n) + n) % n;
    return a->ring ? a->ring[p] : p;
}
/** Ring position of rank r. */
static inline int zccl__ring_pos(const zccl_sched_args_t *a, int r) {
    if (!a->ring) return r;
    for (int i = 0; i < a->nranks; i++)
        if (a->ring[i] == r) return i;
    return -1; /* not a permutation: callers validated it */
}

/** Human-readable dump (for ZCCL_DEBUG=TRACE and tests). */
void zccl__sched_print(const zccl_schedule_t *s, int rank, char *buf, size_t len);

/**
 * Symbolic checker: builds every rank's schedule for `args` (args->rank ignored) and executes them together with
 * each element represented by the multiset of rank contributions it holds. Verifies that every output element
 * receives each rank's contribution exactly once (reductions) or the right rank's element (copies), that sends
 * and receives pair up with equal sizes in order, that no rank waits forever (rendezvous semantics: a phase ends
 * only when its sends were consumed), and that no step reads or writes outside its buffer.
 * Returns true when all holds; otherwise false with a description in err.
 */
bool zccl__sched_check(const zccl_sched_args_t *args, char *err, size_t errlen);
/** The same, letting a test alter each rank's schedule after it is built (to prove the checker catches faults). */
typedef void (*zccl_sched_mutator_t)(int rank, zccl_schedule_t *s);
bool zccl__sched_check_with(const zccl_sched_args_t *args, zccl_sched_mutator_t mutate, char *err, size_t errlen);

/**
 * alpha-beta-gamma cost model (Hockney; Thakur, Rabenseifner & Gropp, IJHPCA 2005): a message of b bytes takes
 * alpha + beta*b seconds, reducing b bytes takes gamma*b seconds. Links between ranks on different hosts
 * (host_of differs) use alpha_inter / beta_inter.
 */
typedef struct {
    double alpha, beta, gamma;        /* seconds, seconds per byte, seconds per byte reduced */
    double alpha_inter, beta_inter;   /* for links between hosts; used only when args->host_of is set */
} zccl_cost_params_t;

/**
 * Predicted time in seconds of the collective described by `args` (every rank's schedule, args->rank ignored),
 * by simulating all schedules together with rendezvous semantics: a phase starts when the previous one ended on
 * that rank plus the gamma cost of its local reductions; a message starts when both its sender's and its
 * receiver's phases have started and takes alpha + beta*bytes (+ gamma*bytes if it is reduced on arrival); a rank
 * moves at most one message-time's worth of bytes at a time in each direction, so a phase lasts at least
 * alpha + beta*max(bytes sent, bytes received) (+ gamma*bytes reduced on arrival). The result is the latest
 * finish over all ranks (the critical path). Returns a negative value (and a reason in err) if a schedule cannot
 * be built or does not complete (unmatched or deadlocked steps).
 */
double zccl__sched_cost(const zccl_sched_args_t *args, const zccl_cost_params_t *p, char *err, size_t errlen);

/**
 * Closed-form alpha-beta-gamma time of `algo` for `coll` on n ranks with `bytes` the size of the full vector
 * (all-reduce count*elem, reduce-scatter and all-gather nranks*count*elem), one host (alpha, beta, gamma only),
 * from Thakur, Rabenseifner & Gropp 2005 (recursive doubling / halving, Bruck, non-power-of-two fold) and
 * Patarasuk & Yuan 2009 (ring); the tree uses the pipelined-tree bound with the schedule's chunk size. A cross
 * check of zccl__sched_cost, not a replacement: returns a negative value where no formula is given (HIER).
 */
double zccl__sched_cost_formula(const zccl_sched_args_t *args, const zccl_cost_params_t *p);

#endif

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

/** Algorithms a collective may run with (the choice is the caller's: collectives.c picks by size). */
enum { ZCCL_ALGO_RING = 0, ZCCL_ALGO_DIRECT = 1 };

typedef enum {
    ZCCL_COLL_ALLREDUCE = 0,
    ZCCL_COLL_REDUCE_SCATTER,
    ZCCL_COLL_ALLGATHER,
    ZCCL_COLL_BROADCAST,
    ZCCL_COLL_REDUCE,
    ZCCL_COLL_SEND,
    ZCCL_COLL_RECV,
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
} zccl_sched_args_t;

typedef struct {
    zccl_step_t *steps;
    size_t nsteps, steps_cap;
    uint32_t *phase_end; /* phase i is steps [i ? phase_end[i-1] : 0, phase_end[i]) */
    size_t nphases, phases_cap;
    size_t tmp_elems;    /* scratch the schedule needs, in elements */
    bool oom;            /* an append failed: the schedule is unusable */
} zccl_schedule_t;

/** Builds the schedule of args->rank. Returns ZCCL_SYSTEM_ERROR on allocation failure. */
zccl_result_t zccl__sched_build(const zccl_sched_args_t *args, zccl_schedule_t *s);
void zccl__sched_free(zccl_schedule_t *s);

/* Builders for one algorithm each (sched_ring.c, sched_chain.c, sched_p2p.c). */
void zccl__sched_ring_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_ring_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_ring_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_chain_broadcast(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_chain_reduce(const zccl_sched_args_t *a, zccl_schedule_t *s);
void zccl__sched_direct_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s);

/* Building blocks. */
void zccl__sched_step(zccl_schedule_t *s, zccl_step_t st); /* count 0 steps are dropped */
void zccl__sched_end_phase(zccl_schedule_t *s);          /* empty phases are dropped */
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

#endif

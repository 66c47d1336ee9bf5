/*
 * stream.h — operations as values, and streams that run them in the background, in order.
 */
#ifndef ZCCL_STREAM_H
#define ZCCL_STREAM_H

#include "comm.h"
#include "schedule.h"

/** One validated operation, as issued by the caller. */
typedef struct {
    zccl_coll_t coll;
    bool barrier; /* a barrier: runs as a one-byte all-reduce on its own buffer */
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    zccl_datatype_t dt;
    zccl_redop_t op;
    int root; /* broadcast/reduce root, or send/recv peer */
    bool in_place;
    zccl_mem_type_t mem; /* what memory the buffers are (mem), learned once when the call is issued */
    struct zccl_comm *comm;
    size_t *vcounts; /* _v collectives: nranks counts then nranks displacements, owned by the op (freed by
                        zccl__op_release); NULL otherwise */
    bool noop;       /* count 0: takes its sequence number (and joins ZCCL_CHECK's check), moves nothing */
    bool refused;    /* the caller was refused (an invalid argument): takes the call's sequence number and tells
                        the peers (notice.h), or joins ZCCL_CHECK's check marked invalid; moves nothing */
    char *reason;    /* refused: the error message, owned by the op */
    size_t *a2av;    /* all-to-allv: sendcounts, sdispls, recvcounts, rdispls (4 x nranks), owned; else NULL */
    bool premul;     /* PreMulSum: each rank's input is multiplied by `scalar` (one element of dt), then summed */
    uint8_t scalar[8];
    /* A group's part on one communicator (lib/api/group.c), run by run_group instead of a schedule; owned, freed
     * by release_group. NULL for ordinary operations. */
    void *group;
    zccl_result_t (*run_group)(const void *group);
    void (*release_group)(void *group);
    /* A device-memory call on a stream bound to a CUDA stream (zccl_stream_create_cuda): its ticket in that CUDA
     * stream's order (mem/cuda_order.c); value 0 otherwise. Set when the op is queued. */
    zccl_cuda_ticket_t cuda;
} zccl_op_t;

/** Frees what the op owns (its copy of the counts of a _v collective). */
void zccl__op_release(zccl_op_t *op);

/** Runs op to completion on the calling thread. */
zccl_result_t zccl__op_run(const zccl_op_t *op);
/** Queues op on stream (or runs it now when stream is NULL). */
zccl_result_t zccl__op_issue(const zccl_op_t *op, zccl_stream_t stream);
/** True if some stream still holds queued or running operations of comm. */
bool zccl__stream_busy_with(struct zccl_comm *comm);
/** Waits until no stream holds a queued or running operation of comm (zccl_comm_finalize). */
void zccl__stream_wait_comm(struct zccl_comm *comm);
/** Drops queued operations of an aborted comm from every stream (they fail with ZCCL_REMOTE_ERROR) and waits until
 *  no stream runs one of its operations. */
void zccl__stream_forget(struct zccl_comm *comm);

/* Tickets: the n-th operation queued on a stream (counting from 1 since its creation) has ticket n; it has
 * completed (successfully or not) once zccl__stream_completed(s) >= n. Used by the bucket scheduler and the ZeRO-3
 * store (lib/zero_*.c) to wait for one operation and to bound how many are in flight. */
/** Operations ever queued on s: the ticket of the last one. */
uint64_t zccl__stream_issued(zccl_stream_t s);
/** Operations of s that have finished. */
uint64_t zccl__stream_completed(zccl_stream_t s);
/** Sets fn(arg) to be called on the stream's thread after each operation finishes (after the counters are
 *  updated), without the stream's lock held, so fn may queue more operations on s. fn NULL removes it. */
void zccl__stream_set_notify(zccl_stream_t s, void (*fn)(void *), void *arg);

#endif

/*
 * zccl_ext.h — the few internal entry points the ZeRO layer (lib/zero) uses besides the public API: an operation
 * counter per stream (tickets), a completion callback, and the message a broken communicator failed with. The ZeRO
 * layer sees only include/, util, kernels/ and this header; it must not reach the communicator's internals.
 * Defined in the core layer (lib/core/stream.c, lib/core/comm.c), declared there too (stream.h, comm.h).
 */
#ifndef ZCCL_EXT_H
#define ZCCL_EXT_H

#include <stdint.h>
#include "zccl.h"

/** Operations ever queued on s: the ticket of the last one. Operation n (1-based) has finished, successfully or
 *  not, once zccl__stream_completed(s) >= n. */
uint64_t zccl__stream_issued(zccl_stream_t s);
/** Operations of s that have finished. */
uint64_t zccl__stream_completed(zccl_stream_t s);
/** Sets fn(arg) to be called on the stream's thread after each operation finishes (after the counters are
 *  updated), without the stream's lock held, so fn may queue more operations on s. fn NULL removes it. */
void zccl__stream_set_notify(zccl_stream_t s, void (*fn)(void *), void *arg);
/** The ZeRO layer gives up a collective it owes its peers (ZCCL_BUCKET_CHECK found a stale write): the call is
 *  refused as an invalid call would be (zccl.h "Invalid calls"), so the peers fail quoting this rank's last error
 *  message instead of waiting. Returns res. Defined in lib/api/collectives.c. */
zccl_result_t zccl__coll_refuse(zccl_comm_t comm, zccl_stream_t stream, zccl_result_t res);
/** The quantized collectives (include/zccl.h, zccl_wire_t) queued on a stream, for the ZeRO layer's qgZ and qwZ:
 *  zccl_allgather_wire, zccl_reduce_scatter_wire, zccl_allreduce_wire or zccl_allgather_hier with these arguments
 *  (count: sendcount, recvcount or count as that call takes it; op ignored by the all-gathers) runs on the stream's
 *  thread in the stream's order, as if called there with no stream, so the caller does not wait for it (the public
 *  _wire calls wait for their stream and run on the caller's thread). Its errors, including its argument checks, are the
 *  stream's (zccl_stream_synchronize); a call refused on one rank fails on every rank as the _wire calls do.
 *  stream NULL: the call runs now. Errors here: ZCCL_INVALID_ARGUMENT (comm NULL, call out of range),
 *  ZCCL_SYSTEM_ERROR (out of memory queuing it). Defined in lib/api/coll_quant.c. */
typedef enum {
    ZCCL__WIRE_ALLGATHER,
    ZCCL__WIRE_REDUCE_SCATTER,
    ZCCL__WIRE_ALLREDUCE,
    ZCCL__WIRE_ALLGATHER_HIER /* zccl_allgather_hier (include/zccl_hier.h): zccl_allgather_wire's output, bitwise */
} zccl__wire_call_t;
zccl_result_t zccl__wire_enqueue(zccl__wire_call_t call, const void *sendbuf, void *recvbuf, size_t count,
                                 zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm,
                                 zccl_stream_t stream);
/** A step of the caller's run on the stream's thread right before a queued quantized call (zccl__wire_enqueue_pre),
 *  in the stream's order, with the arg and tag given there: the bucket plan's error feedback (lib/zero/zero_sched.c)
 *  adds its residual into the bucket there, once the bucket is final and before the call reads it. A failure
 *  refuses the call (its peers fail on it, quoting this rank's message) and is the stream's error. */
typedef zccl_result_t (*zccl__wire_pre_t)(void *arg, int tag);
/** zccl__wire_enqueue with a pre step (NULL: none, the same as zccl__wire_enqueue). */
zccl_result_t zccl__wire_enqueue_pre(zccl__wire_call_t call, const void *sendbuf, void *recvbuf, size_t count,
                                     zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm,
                                     zccl_stream_t stream, zccl__wire_pre_t pre, void *pre_arg, int pre_tag);
/** Q(src): the quantize-dequantize that the quantized call `call` (with this count argument, as zccl__wire_enqueue
 *  takes it, and nranks ranks) applies to this rank's contribution src, written to out as float32, the value the
 *  owner's reduction adds (zccl_allreduce_wire: count elements in nranks shards of ceil(count / nranks), the last
 *  ones shorter or empty; zccl_reduce_scatter_wire: nranks shards of count elements, out has count * nranks;
 *  zccl_allgather_wire: one shard of count). Blocks of ZCCL_QUANT_BLOCK counted from each shard's first element,
 *  the same encoder and decoder as the call, so out is bitwise what the call's peers decode (float64 is rounded to
 *  float32 first, as the call does). Local; src and out must not overlap. For the error feedback of the bucket plan
 *  (zccl_bucket_options_t.error_feedback). Errors: ZCCL_INVALID_ARGUMENT (wire not quantized, datatype not a
 *  floating type, call out of range, nranks < 1), ZCCL_SYSTEM_ERROR (out of memory for one wire string). Defined in
 *  lib/api/coll_quant.c. */
zccl_result_t zccl__wire_roundtrip(zccl__wire_call_t call, const void *src, size_t count, zccl_datatype_t datatype,
                                   zccl_wire_t wire, int nranks, float *out);
/** The message of the first error that broke comm ("" while it works). */
const char *zccl__comm_async_msg(zccl_comm_t comm);
/** This host's identity (hash of the hostname and /proc boot_id): equal on two ranks means they share a host and
 *  shared memory (lib/core/comm.c). The mesh layer (lib/mesh) places its innermost dimensions by it. */
uint64_t zccl__host_hash(void);
/** The host identity of the hierarchical calls (include/zccl_hier.h) for this rank of comm: FNV-1a of ZCCL_HOST_ID
 *  when that is set (simulated hosts), else the real host the transports found. Equal keys: one host. Local.
 *  Defined in lib/api/coll_hier.c, as the next one; the ZeRO-3 store's hpZ (lib/zero/zero3.c) uses both. */
uint64_t zccl__host_key(zccl_comm_t comm);
/** Numbers hosts from every rank's key (keys[r] for the n ranks, all-gathered): hosts in order of their lowest
 *  rank, host[r] and local[r] (the rank's place among its host's ranks, in rank order), cnt[h] the ranks of host h
 *  (cnt needs room for n). Returns the number of hosts. The same answer on every rank that has the same keys. */
int zccl__host_layout(const uint64_t *keys, int n, int *host, int *local, int *cnt);

/*
 * Host memory and copies for the ZeRO layer's CPU offload (lib/zero/zero_offload.c), over the memory layer
 * (mem): the ZeRO layer may not include mem. Defined in lib/api/offload_mem.c.
 */
/** bytes (>= 1) of zero-filled host memory, 4096-byte aligned. pin != 0 asks for page-locked memory
 *  (cuMemAllocHost) when a CUDA driver can be loaded; *pinned (may be NULL) is set to 1 when the memory is
 *  page-locked, 0 when it is ordinary (no driver, or the driver refused: then pageable memory is returned instead).
 *  Errors: ZCCL_SYSTEM_ERROR (out of memory). */
zccl_result_t zccl__offload_host_alloc(void **p, size_t bytes, int pin, int *pinned);
/** Frees memory of zccl__offload_host_alloc; pinned as it reported. NULL: nothing. */
void zccl__offload_host_free(void *p, int pinned);
/** *is_device = 1 when p is CUDA device memory, 0 for host memory (always 0 without a CUDA driver). Errors: the
 *  driver's query failed (ZCCL_SYSTEM_ERROR). */
zccl_result_t zccl__offload_is_device(const void *p, int *is_device);
/** dst <- src, bytes, non-overlapping; either side host or device memory. Both host: memcpy, done on return
 *  (*queued = 0). Otherwise queued on the offload side stream, one non-blocking CUDA stream per process that is
 *  not the collectives' stream (cuMemcpyAsync), and returns at once (*queued = 1); the bytes are in place after
 *  zccl__offload_copy_wait. queued may be NULL. Errors: ZCCL_INVALID_USAGE (device memory without a usable CUDA
 *  driver), ZCCL_SYSTEM_ERROR (the driver failed, named). */
zccl_result_t zccl__offload_copy(void *dst, const void *src, size_t bytes, int *queued);
/** Waits until every copy queued on the side stream has completed. Nothing queued ever: returns at once.
 *  Errors: ZCCL_SYSTEM_ERROR (cuStreamSynchronize failed, named). */
zccl_result_t zccl__offload_copy_wait(void);

#endif

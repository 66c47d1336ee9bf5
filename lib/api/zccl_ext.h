/*
 * zccl_ext.h — the few internal entry points the ZeRO layer (lib/zero) uses besides the public API: an operation
 * counter per stream (tickets), a completion callback, and the message a broken communicator failed with. The ZeRO
 * layer sees only include/, lib/util, kernels/ and this header; it must not reach the communicator's internals.
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
/** The message of the first error that broke comm ("" while it works). */
const char *zccl__comm_async_msg(zccl_comm_t comm);

#endif

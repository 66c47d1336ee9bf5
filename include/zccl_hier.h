/*
 * zccl_hier.h — hierarchical quantized collectives: full precision among the ranks of a host, the quantized wire
 * formats of zccl.h (zccl_wire_t) only between hosts (docs/zero.md, "Hierarchical quantized collectives").
 *
 * The flat _wire calls quantize every byte they move, also between ranks of one host whose links (shared memory)
 * are fast and where quantization buys nothing. The reductions here sum the host's share in float32 over the
 * communicator's intra-host links and send between hosts only the wire strings of the flat calls, each rank
 * carrying one slice (ZeRO++'s hpZ/qgZ two-hop shape: Wang et al., 2023); the all-gather quantizes each rank's data
 * once, as the flat call, and sends each string across the host boundary once per host instead of once per rank.
 */
#ifndef ZCCL_HIER_H
#define ZCCL_HIER_H

#include "zccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Common rules of the three _hier calls (everything the _wire calls' "Common rules" in zccl.h say holds as well:
 * datatypes float32, float16, bfloat16; op SUM or AVG; host memory only; stream semantics; every rank passes the
 * same wire, count and ZCCL_QUANT_BLOCK; not inside a group).
 *
 * Hosts. A host is the set of ranks whose host identity is equal: by default the real host (the one the transports
 * use to choose shared memory: hostname and boot id); ZCCL_HOST_ID=<string> replaces it for these calls (and the
 * ZeRO-3 store's hpZ, zccl_zero.h) only (ranks with equal strings count as one host, so that one machine can stand
 * for several, docs/configuration.md). The ranks of a host need not be contiguous. Hosts are numbered by their lowest rank, and a host's ranks get local
 * ranks 0..G-1 in rank order.
 *
 * The first _hier call on a communicator (every rank makes it, as any collective) exchanges the host identities
 * (one all-gather) and, when the layout is hierarchical, makes two sub-communicators with zccl_comm_split: the
 * host's ranks ("intra", ranked by local rank) and the ranks of equal local rank on every host ("inter", ranked by
 * host). They are kept in comm for every later _hier call and freed by zccl_comm_destroy / zccl_comm_abort. Since
 * that first call splits comm, no other stream may hold queued operations of comm then (as for zccl_comm_split; the
 * call's own stream is waited for).
 *
 * Memory: the calls keep their temporaries in comm between calls (freed by zccl_comm_destroy / zccl_comm_abort): a
 * reduce-scatter (N + H + 1) * recvcount float32, an all-gather N + H + 1 wire strings of sendcount elements, an
 * all-reduce about (G + 1) * ceil(count / G) float32 (plus G * ceil(count / G) elements when G does not divide
 * count); the inner _wire calls keep theirs in the sub-communicators (zccl.h, "Common rules"). Two threads must not
 * call _hier on one comm at once (as for any collectives of one communicator, their order would differ between ranks
 * anyway).
 *
 * Fallback. With one host, with one rank per host, or with hosts of unequal rank counts there is no two-hop shape
 * that keeps the flat result layout: every _hier call on that communicator then is exactly the flat _wire call
 * (same bytes, same bound; logged once at INFO, subsystem COLL). ZCCL_WIRE_FULL: the call is zccl_allgather /
 * zccl_reduce_scatter / zccl_allreduce.
 *
 * Result layout: identical to the flat collective (rank r's block of a reduce-scatter is block r of the reduced
 * vector; the all-gather's block r is rank r's data), whatever the rank-to-host mapping.
 *
 * Error bounds. E(x; amax) is one quantization's error of zccl.h (zccl_wire_t) for the wire in use, u = 2^-24, and
 * for element i: S_i the exact sum over all N ranks, and for a host h, P_h,i the exact sum over its G ranks and
 * a_h,i = sum of |x_q,i| over them. The intra-host hop is exact up to float32 rounding: the host's partial sum
 * reaches the wire as p~ with |p~ - P_h,i| <= (G-1) u a_h,i. Write p_h,i = |P_h,i| + (G-1) u a_h,i (a bound on
 * |p~|) and E_h,i = E(p_h,i; amax = max of p_h,j over the wire block of element i). Then the cross-host reduction
 * (quantized once, summed over H hosts in float32) is within
 *   R_i = (G-1) u sum_h a_h,i + sum_h E_h,i + (H-1) u sum_h (p_h,i + E_h,i)
 * of S_i. The intra-host all-gather copies values exactly. Every bound below gets the output conversion of zccl.h
 * added (one narrowing to the datatype at the end). ZCCL_AVG: the float32 sum is divided by N once, at the end:
 * the bound and the sum are divided by N, plus u (|S_i| + bound) / N.
 *
 * Errors: as the _wire calls (ZCCL_INVALID_ARGUMENT naming 'wire', 'datatype', 'op', 'count', 'sendbuf'/'recvbuf'
 * (NULL, device memory, overlap); ZCCL_INVALID_USAGE inside a group or for ranks whose calls differ;
 * ZCCL_SYSTEM_ERROR out of memory), plus the errors of zccl_comm_split at the first call (the sub-communicators),
 * which every rank returns alike. A call refused on one rank fails on every rank: the refusing rank refuses each
 * step the others run (on the communicator it runs on), and a rank whose step fails refuses the rest of its steps,
 * so no rank waits for a step that another rank skipped. A failed step breaks the sub-communicators, and then comm
 * (its error is comm's asynchronous error; later calls on comm fail).
 */

/**
 * Hierarchical quantized reduce-scatter. Step 1 (intra, float32): each rank widens its nranks blocks to float32
 * and the host reduce-scatters them so that local rank l holds the host's partial sums of the H blocks owned by
 * local rank l of every host. Step 2 (inter, quantized once): zccl_reduce_scatter_wire over the H ranks of local
 * rank l delivers to each its own block, summed over the hosts in float32 in host order. Cross-host bytes: H-1
 * wire strings of recvcount elements per rank.
 * Bound: |recvbuf[i] - S_i| <= R_i (above; blocks of B from recvbuf[0], as the flat call), plus the output
 * conversion; AVG as above. Quantized hops: 1 (as zccl_reduce_scatter_wire).
 * @param sendbuf    nranks*recvcount elements of datatype, host memory; block r goes to rank r.
 * @param recvbuf    recvcount elements, host memory. In place when recvbuf == sendbuf + rank*recvcount (in
 *                   elements); any other overlap is refused.
 * @param recvcount  elements each rank receives (the same on every rank); 0 moves nothing but is a call.
 * @param datatype   ZCCL_FLOAT32, ZCCL_FLOAT16 or ZCCL_BFLOAT16 (any type with ZCCL_WIRE_FULL).
 * @param op         ZCCL_SUM or ZCCL_AVG (any op with ZCCL_WIRE_FULL).
 * @param wire       the cross-host format (zccl_wire_t); ZCCL_WIRE_FULL calls zccl_reduce_scatter.
 * @param comm       the communicator; its hosts decide the shape (see above).
 * @param stream     NULL: runs now; a stream: waits for its queued work first, then runs, done on return.
 */
zccl_result_t zccl_reduce_scatter_hier(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire,
                                       zccl_comm_t comm, zccl_stream_t stream);

/**
 * Hierarchical quantized all-gather. Each rank encodes its sendcount elements once (blocks of B from its
 * sendbuf[0]) into a wire string as zccl_allgather_wire does. Step 1 (inter): the wire strings are all-gathered
 * among this rank's local rank on every host. Step 2 (intra, exact copies): the host's ranks all-gather the H
 * strings each received, and every rank decodes all N strings into their ranks' places. So every rank decodes the
 * same bytes: the output is bitwise identical on every rank and to zccl_allgather_wire's. Cross-host bytes: one wire
 * string of sendcount elements per rank and other host; inside the host the quantized strings too (not decoded
 * data). Ranks whose counts differ by less than the padding all fail with ZCCL_INVALID_USAGE naming both calls
 * (every rank checks every string's header), and the communicator stays usable.
 * Bound: as zccl_allgather_wire: |recvbuf[r*sendcount + i] - sendbuf_r[i]| <= E(sendbuf_r[i]; amax over
 * sendbuf_r's block of i) plus the output conversion. Quantized hops: 1.
 * @param sendbuf    sendcount elements of datatype, host memory. In place when sendbuf == recvbuf +
 *                   rank*sendcount (in elements); any other overlap is refused.
 * @param recvbuf    nranks*sendcount elements, host memory; block r is rank r's.
 * @param sendcount  elements each rank contributes (the same on every rank); 0 moves nothing but is a call.
 * @param datatype   ZCCL_FLOAT32, ZCCL_FLOAT16 or ZCCL_BFLOAT16 (any type with ZCCL_WIRE_FULL).
 * @param wire       the cross-host format; ZCCL_WIRE_FULL calls zccl_allgather.
 * @param comm       the communicator.
 * @param stream     as for zccl_reduce_scatter_hier.
 */
zccl_result_t zccl_allgather_hier(const void *sendbuf, void *recvbuf, size_t sendcount, zccl_datatype_t datatype,
                                  zccl_wire_t wire, zccl_comm_t comm, zccl_stream_t stream);

/**
 * Hierarchical quantized all-reduce. The vector is cut into G chunks of C = ceil(count / G) elements (chunk l =
 * elements [l*C, min((l+1)*C, count)), the last zero-padded). Step 1 (intra, float32): the host reduce-scatters
 * the widened vector, local rank l holding the host's partial sums of chunk l. Step 2 (inter, quantized twice):
 * zccl_allreduce_wire of chunk l (C float32 elements) among local rank l of every host: its shards are
 * L = ceil(C / H) elements, wire blocks of B start at each shard's first element within the chunk. The result is
 * divided by N for AVG and narrowed to the datatype. Step 3 (intra, the datatype, exact): the host all-gathers the
 * G chunks. Every rank ends with the same bytes (bitwise identical on every rank). Cross-host bytes per rank: two
 * wire strings per other host of about C / H elements each.
 * Bound: |recvbuf[i] - S_i| <= R_i + E(z_i; amax = max over z_i's block of |S_j| + R_j), with z_i's magnitude
 * taken as |S_i| + R_i (the second quantization, of the reduced chunk), plus the output conversion; AVG as above.
 * Quantized hops: 2 (as zccl_allreduce_wire).
 * @param sendbuf   count elements of datatype, host memory. In place when sendbuf == recvbuf; any other overlap is
 *                  refused.
 * @param recvbuf   count elements, host memory.
 * @param count     elements (the same on every rank); 0 moves nothing but is a call.
 * @param datatype  ZCCL_FLOAT32, ZCCL_FLOAT16 or ZCCL_BFLOAT16 (any type with ZCCL_WIRE_FULL).
 * @param op        ZCCL_SUM or ZCCL_AVG (any op with ZCCL_WIRE_FULL).
 * @param wire      the cross-host format; ZCCL_WIRE_FULL calls zccl_allreduce.
 * @param comm      the communicator.
 * @param stream    as for zccl_reduce_scatter_hier.
 */
zccl_result_t zccl_allreduce_hier(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                  zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm, zccl_stream_t stream);

/**
 * The host layout the _hier calls use on comm (making it, collectively, if no _hier call made it yet: every rank
 * must call it then): *nhosts hosts of *per_host ranks each, and *hierarchical = 1 when the calls run in two hops,
 * 0 when they fall back to the flat _wire calls. Any output pointer may be NULL.
 */
zccl_result_t zccl_hier_layout(zccl_comm_t comm, int *nhosts, int *per_host, int *hierarchical);

#ifdef __cplusplus
}
#endif

#endif

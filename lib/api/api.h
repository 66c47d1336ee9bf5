/*
 * api.h — what the API layer's files share: creating a communicator (init, split and shrink all end in
 * zccl__comm_init) and releasing one with everything the layers below attached to it.
 */
#ifndef ZCCL_API_H
#define ZCCL_API_H

#include "bootstrap.h"
#include "comm.h"
#include "stream.h"

/** Creates this rank's communicator of nranks ranks from a decoded unique id (lib/api/comm_init.c). */
zccl_result_t zccl__comm_init(zccl_comm_t *out, int nranks, const zccl_id_info_t *id, int rank);
/** The same into a zeroed struct the caller allocated (non-blocking creation, comm_config.c). On failure the
 *  struct is freed too unless comm->keep_shell is set. */
zccl_result_t zccl__comm_init_into(struct zccl_comm *comm, zccl_comm_t *out, int nranks, const zccl_id_info_t *id,
                                   int rank);
/** Before destroy/abort: waits for a non-blocking creation still running; returns true (having freed the handle)
 *  when that creation failed, so nothing else is left to free. */
bool zccl__comm_settle(struct zccl_comm *comm);
/** Frees a communicator and its tuner (zccl__comm_free frees the core's part). */
void zccl__comm_release(struct zccl_comm *comm);

/* ---- argument checks shared by the entry points (collectives.c); each names the function and the argument ---- */
zccl_result_t zccl__check_common(const char *fn, zccl_comm_t comm, size_t count, size_t mult, zccl_datatype_t dt,
                                 int has_op, zccl_redop_t op, size_t *bytes);
zccl_result_t zccl__check_root(const char *fn, const char *what, zccl_comm_t comm, int root);
zccl_result_t zccl__check_buf(const char *fn, const char *name, const void *p);
zccl_result_t zccl__check_overlap(const char *fn, const void *s, size_t sbytes, const void *r, size_t rbytes,
                                  bool in_place);
/** The checks every quantized call shares after zccl__check_common (coll_quant.c; also the hierarchical calls of
 *  coll_hier.c): the wire (a quantized format), the datatype, the op (has_op: SUM or AVG only), no open group; then
 *  the wire size of `shard` elements times `mult` shards (*wbytes: one shard's wire string, header included). */
zccl_result_t zccl__check_wire(const char *fn, zccl_comm_t comm, zccl_wire_t wire, zccl_datatype_t dt, bool has_op,
                               zccl_redop_t op, size_t shard, size_t mult, size_t *wbytes);
/** One wire string of the quantized calls (coll_quant.c: a header naming count, wire and B, then the encoded
 *  elements; zccl__check_wire's *wbytes bytes): the 1-byte datatype the inner collectives carry it as; encoding
 *  count elements of dt into dst; checking n strings (stride w; string k from rank who[k], or rank k when who is
 *  NULL) against this rank's call (ZCCL_INVALID_USAGE naming both calls when they differ); decoding one string into
 *  count elements of dt. */
zccl_datatype_t zccl__wire_inner_type(zccl_wire_t wire);
void zccl__wire_encode(zccl_wire_t wire, const void *src, zccl_datatype_t dt, size_t count, uint8_t *dst);
zccl_result_t zccl__wire_check(const char *fn, const uint8_t *all, size_t w, size_t n, const int *who, size_t me,
                               size_t count, zccl_wire_t wire);
void zccl__wire_decode(zccl_wire_t wire, const uint8_t *str, size_t count, void *dst, zccl_datatype_t dt);
/** Refuses CUDA device memory in sendbuf or recvbuf: the quantized calls take host memory only (coll_quant.c). */
zccl_result_t zccl__check_host_mem(const char *fn, const void *sendbuf, const void *recvbuf);
/** Frees what the hierarchical collectives attached to comm (coll_hier.c): its sub-communicators, destroyed, or
 *  aborted when abort is set. */
void zccl__hier_free(struct zccl_comm *comm, bool abort);
/** Frees the _wire calls' scratch area of comm (lib/api/coll_quant.c). */
void zccl__wire_scratch_free(struct zccl_comm *comm);
/** "zccl_allreduce", ... for a collective. */
const char *zccl__coll_api_name(zccl_coll_t c);

/* ---- issuing (group.c) --------------------------------------------------------------------------------------- */
/** Every entry point's last step: resolves a PreMulSum handle, then records the operation in the calling thread's
 *  open group, or queues it on the stream / runs it now (zccl__op_issue). Takes ownership of what op owns. */
zccl_result_t zccl__api_issue(const zccl_op_t *op, zccl_stream_t stream);
/** Sets op->mem from its buffers (mem: host or CUDA device memory), once per call; errors name the buffer.
 *  in_group: device memory is refused inside zccl_group_start/end (not supported yet, docs/gpu.md). */
zccl_result_t zccl__api_mem_type(zccl_op_t *op, bool in_group);
/** Creating a communicator inside a group runs its internal collectives at once: the group is set aside meanwhile
 *  (returns the depth to give back to zccl__group_resume). */
int zccl__group_suspend(void);
void zccl__group_resume(int saved);
/** Whether the calling thread has a group open (zccl_group_start without its zccl_group_end yet). */
bool zccl__group_open(void);

/* ---- PreMulSum handles (redop.c) ------------------------------------------------------------------------------ */
/** ZCCL_SUCCESS if op is a live PreMulSum handle of comm made for dt; else ZCCL_INVALID_ARGUMENT naming why. */
zccl_result_t zccl__redop_check(zccl_comm_t comm, zccl_redop_t op, zccl_datatype_t dt, const char *fn);
/** Copies the handle's scalar (one element of its datatype) into out[8]; false if op is not a handle of comm. */
bool zccl__redop_scalar(zccl_comm_t comm, zccl_redop_t op, uint8_t out[8]);
/** Forgets every handle of comm (its destruction). */
void zccl__redop_forget(zccl_comm_t comm);

/* ---- non-blocking communicators (comm_config.c) -------------------------------------------------------------- */
/** ZCCL_SUCCESS if comm is ready; ZCCL_IN_PROGRESS (without logging) while a non-blocking creation runs; its error
 *  if that creation failed. */
zccl_result_t zccl__comm_ready(zccl_comm_t comm, const char *fn);

/** The first host of a Slurm node list ("node[01-04],x" -> "node01"); 0, or -1 if malformed or longer than len. */
int zccl__slurm_first_host(const char *list, char *out, size_t len);

/** Prints, once per job, the unknown ZCCL_* names (stderr) and the NCCL_* ones read or ignored (INFO)
 *  (config_check.c). */
void zccl__config_warn_unknown(void);

/** Refuses the call o (include/zccl.h "Invalid calls"): returns res to the caller, and on a communicator of several
 *  ranks still issues o marked refused so that the peers fail it too (collectives.c). */
zccl_result_t zccl__coll_refuse_op(zccl_op_t o, zccl_stream_t stream, zccl_result_t res);
/** One validation step of a public entry point, in a function with the partly filled op `o` and its `stream` in
 *  scope: a failure refuses the call (zccl__coll_refuse_op), so the peers fail it too instead of pairing their call
 *  with this rank's next one, and returns its result. */
#define ZCCL__TRY_OR_REFUSE(call)                                                                              \
    do {                                                                                                       \
        zccl_result_t try_res__ = (call);                                                                      \
        if (try_res__ != ZCCL_SUCCESS) return zccl__coll_refuse_op(o, stream, try_res__);                      \
    } while (0)
/** A count-0 call: nothing moves but it takes its sequence number and joins ZCCL_CHECK (collectives.c). */
zccl_result_t zccl__coll_noop(zccl_op_t o, zccl_stream_t stream);

#endif

/*
 * mem_pipe.h — the device side of pipelined staging (issue 24, docs/gpu.md "Pipelined staging"): a device call's
 * transfers move in chunks through the pinned staging block, and the copies of one chunk overlap the wire of the
 * others. Two lanes, each a CUDA stream of its own: OUT carries device-to-host copies of the chunks a rank sends, IN
 * carries host-to-device copies of the chunks it received and the reduction kernels that combine them with their
 * second operand. Every queued operation returns a ticket (a CUDA event recorded after it on its lane) that the
 * engine polls without blocking; the engine sends a chunk only once its OUT ticket is done, and a phase ends only
 * after the IN lane drained. Nothing here waits except zccl__mem_pipe_drain.
 *
 * State lives in the communicator's zccl_mem_stage_t (one pipe per communicator: its own streams, so two
 * communicators driven by two threads never wait for each other's copies).
 */
#ifndef ZCCL_MEM_PIPE_H
#define ZCCL_MEM_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include "mem.h"

enum { ZCCL_PIPE_OUT = 0, ZCCL_PIPE_IN = 1 };

/** Whether memory type t can be staged in pipelined chunks (CUDA with events and its kernels); *why gets the
 *  reason if not (the caller then stages synchronously). */
bool zccl__mem_pipe_usable(zccl_mem_type_t t, const char **why);

/**
 * Begins a phase on st's pipe for memory type t: creates the two streams on first use, makes room for `tickets`
 * tickets and a device bounce ring of `depth` slots of `chunk` bytes for the IN lane's reductions. Tickets of the
 * previous phase are void. Errors: stream, event or device allocation failures, named (ZCCL_SYSTEM_ERROR).
 */
zccl_result_t zccl__mem_pipe_phase(zccl_mem_stage_t *st, zccl_mem_type_t t, size_t tickets, size_t chunk,
                                   size_t depth);
/** Queues dst <- src (bytes; one side host staging, the other device memory) on lane; *ticket is its ticket. */
zccl_result_t zccl__mem_pipe_copy(zccl_mem_stage_t *st, int lane, void *dst, const void *src, size_t bytes,
                                  size_t *ticket);
/**
 * Queues on the IN lane: the received host chunk (bytes, pinned staging) copied into a bounce slot on the device,
 * then dst[i] = op2[i] OP slot[i] (kernels.h semantics; divisor > 1 divides). dst may equal op2. bytes <= the
 * phase's chunk. The slot is reused depth chunks later on the same stream, so stream order keeps it safe.
 */
zccl_result_t zccl__mem_pipe_reduce_in(zccl_mem_stage_t *st, void *dst, const void *op2, const void *host,
                                       size_t bytes, zccl_datatype_t dt, zccl_redop_t op, uint32_t divisor,
                                       size_t *ticket);
/** Whether ticket's work has run (*done); a failed copy or kernel is an error naming the CUDA error. */
zccl_result_t zccl__mem_pipe_done(zccl_mem_stage_t *st, size_t ticket, bool *done);
/** Waits until both lanes are empty (phase end, and before an error returns: no copy may land after the call). */
zccl_result_t zccl__mem_pipe_drain(zccl_mem_stage_t *st);
/** Releases the pipe (zccl__mem_stage_free calls it). */
void zccl__mem_pipe_free(zccl_mem_stage_t *st);

#endif

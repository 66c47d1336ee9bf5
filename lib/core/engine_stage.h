/*
 * engine_stage.h — pipelined staging of device calls (engine_stage.c, docs/gpu.md "Pipelined staging"), and the
 * hooks through which it drives the engine's phase loop (engine.c).
 */
#ifndef ZCCL_ENGINE_STAGE_H
#define ZCCL_ENGINE_STAGE_H

#include "comm.h"

/** What a phase's loop asks of a staging pipeline (engine.c's run_phase). NULL hooks: a plain phase. */
typedef struct zccl_phase_hooks {
    void *ctx;
    /** Whether transfer i may move now (a send chunk whose device-to-host copy has not run may not). */
    bool (*ready)(void *ctx, size_t i);
    /** Queues and polls copies: *moved when a chunk became ready or a received chunk was handed to the device;
     *  *busy while a copy the wire waits for is running (the loop then spins instead of sleeping on the sockets). */
    zccl_result_t (*tick)(void *ctx, bool *moved, bool *busy);
} zccl_phase_hooks_t;

/** engine.c: one phase of transfers, with optional hooks. Errors as zccl__engine_run. */
zccl_result_t zccl__engine_phase(struct zccl_comm *comm, zccl_xfer_t *x, size_t nx, size_t phase,
                                 const zccl_phase_hooks_t *h);

/**
 * Whether this call on memory type mt is staged in pipelined chunks (ZCCL_STAGE_DEPTH > 0 and the memory type can:
 * CUDA with events and kernels); reads the settings (an invalid value is an error naming it).
 */
zccl_result_t zccl__stage_pipelined(struct zccl_comm *comm, zccl_mem_type_t mt, bool *on);

/**
 * Runs one phase of a device call with pipelined staging: each transfer split into ZCCL_STAGE_CHUNK_BYTES chunks
 * (the same split on every rank: the setting must match), a send chunk goes on the wire once its device-to-host copy
 * ran, a received chunk enters the device (copied, or reduced with its operand) as soon as it landed, while later
 * chunks are still on the wire. Call descriptors are not staged. Returns once every received byte is in device
 * memory. Errors as zccl__engine_run; after an error no copy of the phase is still running.
 */
zccl_result_t zccl__stage_run_phase(struct zccl_comm *comm, zccl_mem_type_t mt, zccl_xfer_t *x, size_t nx,
                                    size_t phase);

#endif

/*
 * engine.h — the progress engine: runs one rank's schedule over the transports.
 */
#ifndef ZCCL_ENGINE_H
#define ZCCL_ENGINE_H

#include "comm.h"
#include "schedule.h"

/**
 * Executes schedule s of this rank with the user's buffers. Steps of a phase run concurrently; a phase ends when
 * its receives are delivered and its sends handed over. Waits poll for ZCCL_SPIN_US, then sleep on the
 * rank's doorbell (futex) or poll the TCP sockets, so oversubscribed ranks do not steal each other's cores; with
 * ZCCL_WAIT_YIELD they yield the core between looks for up to ZCCL_YIELD_MAX_US first (transport/doorbell.c).
 * Errors: ZCCL_REMOTE_ERROR / ZCCL_TIMEOUT naming the peer waited on; ZCCL_SYSTEM_ERROR.
 */
zccl_result_t zccl__engine_run(struct zccl_comm *comm, const zccl_schedule_t *s, const void *sendbuf, void *recvbuf,
                               zccl_datatype_t dt, zccl_redop_t op);

/**
 * Runs a set of transfers as one phase: all progress concurrently (transfers on one channel in array order), as a
 * group's send/recv do (lib/api/group.c). Sets x[i].complete for those that finished, so that after an error the
 * caller can name the first transfer that did not. Errors as zccl__engine_run.
 */
zccl_result_t zccl__engine_run_xfers(struct zccl_comm *comm, zccl_xfer_t *x, size_t nx);

#endif

/*
 * regmem.h — zccl-allocated, shareable host memory and per-communicator registration (zccl_mem_alloc,
 * zccl_comm_register), and the direct path that reduces straight out of the peers' registered buffers.
 */
#ifndef ZCCL_REGMEM_H
#define ZCCL_REGMEM_H

#include <stdbool.h>
#include "comm.h"
#include "stream.h"

zccl_result_t zccl__mem_alloc(void **ptr, size_t bytes);
zccl_result_t zccl__mem_free(void *ptr);
zccl_result_t zccl__comm_register(struct zccl_comm *comm, void *buf, size_t bytes, void **handle);
zccl_result_t zccl__comm_deregister(struct zccl_comm *comm, void *handle);
/** Forgets comm's registrations and unmaps the peers' regions it mapped (zccl__comm_free). */
void zccl__reg_comm_gone(struct zccl_comm *comm);
/** Service thread: peer deregistered its region or allocation `id` (ZCCL_NOTICE_DEREG): closes this rank's mapping
 *  of it on comm, if any, before the notice is acknowledged. */
void zccl__reg_peer_dropped(struct zccl_comm *comm, int peer, uint64_t id);

/** Whether a live zccl_comm_register registration of comm holds p as device memory; what says which (the
 *  use-after-free check, lib/core/engine_gdr.c). */
bool zccl__reg_held_device(struct zccl_comm *comm, const void *p, char *what, size_t len);

/**
 * Runs all-reduce, reduce-scatter, all-gather or broadcast o (sequence number comm->seq) straight out of the peers'
 * buffers when every rank's buffers are registered (host: inside zccl_mem_alloc memory; device: a cuMemAlloc
 * allocation, shared by CUDA IPC), of one memory type on every rank, all ranks share this host through shm, and the
 * call is at least ZCCL_SHM_REG_MIN_BYTES: *done is then true. The loops run the call's memory table (mem). Every rank reaches the same decision from the same descriptors.
 * *started is true once the ranks may depend on this rank (a failure then breaks the communicator).
 */
zccl_result_t zccl__reg_try_run(struct zccl_comm *comm, const zccl_op_t *o, bool *done, bool *started);

/**
 * The staged one-pass path (regmem.c, "the staged one-pass path"): zccl__stg_setup, at init on every rank (it calls
 * collectives), gives each rank a staging region the peers map when every rank is on this host and
 * ZCCL_SHM_STAGED_MAX_BYTES > 0; a failure anywhere leaves the path off on every rank (not an error).
 * zccl__stg_try_run runs o on that path when it qualifies (host memory, all-reduce / reduce-scatter / all-gather,
 * even counts, whole vector within the staged bounds: the same answer on every rank); *done says it did, after which
 * its result is the call's. zccl__stg_calls counts the process's staged calls.
 */
zccl_result_t zccl__stg_setup(struct zccl_comm *comm);
zccl_result_t zccl__stg_try_run(struct zccl_comm *comm, const zccl_op_t *o, bool *done);
uint64_t zccl__stg_calls(void);

/** How many calls on memory type mem_type (zccl_mem_type_t) this process ran on the direct path (tests, tools). */
uint64_t zccl__reg_direct_calls(int mem_type);

extern const zccl_cfg_desc_t zccl__set_shm_reg_min_bytes;
#define ZCCL_CFG_SHM_REG_MIN_BYTES (&zccl__set_shm_reg_min_bytes)

#endif

/*
 * engine_gdr.h — the GPUDirect RDMA path of a device call over verbs (engine_gdr.c, docs/gpu.md "GPUDirect RDMA";
 * issue 24): the per-call decision every rank agrees on before any byte moves, and a phase whose transfers the NIC
 * moves straight from and into device memory.
 */
#ifndef ZCCL_ENGINE_GDR_H
#define ZCCL_ENGINE_GDR_H

#include "comm.h"

typedef struct {
    bool on;         /* every rank takes the GDR path for this call */
    bool flush;      /* this rank flushes each landed receive (GPU before Hopper, ZCCL_GDR_FLUSH_DISABLE unset) */
    bool voted;      /* the agreement ran (the call is on device memory and every peer is reached over verbs) */
    char why[360];   /* this rank's decision, or which rank could not */
} zccl_gdr_call_t;

/**
 * For a call on device memory: whether this rank could take the GDR path (ZCCL_GDR, every peer over verbs, the
 * NIC's and GPU's support, the flush QP where needed, and the NIC registration of the send, receive and scratch
 * allocations and the bounce buffer of reductions), then one byte to and from every peer over verbs, so every rank
 * knows whether all can; all take the GDR path or all take staging. Runs before the call's first phase. An error is
 * a failed exchange (a lost peer, mismatched calls); a rank that cannot is not an error.
 */
zccl_result_t zccl__gdr_agree(struct zccl_comm *comm, const zccl_schedule_t *s, const void *sendbuf, void *recvbuf,
                              void *scratch, size_t es, zccl_gdr_call_t *out);

/**
 * The use-after-free check of a call on host memory (lib/api/collectives.c): p (the call's buffer `name` of fn) is
 * not device memory to the CUDA driver, yet this rank registered it as device memory (for GPUDirect RDMA in a rail's
 * registration cache, or with zccl_comm_register): the allocation was freed while registered. ZCCL_INVALID_ARGUMENT
 * naming the buffer, the registration and the cause (the GDR registration is dropped: it pinned the freed pages);
 * the caller refuses the call, so every rank fails it. ZCCL_SUCCESS otherwise.
 */
zccl_result_t zccl__gdr_freed_check(struct zccl_comm *comm, const char *fn, const char *name, const void *p);

/**
 * One phase of a GDR call: sends read device memory, receives land in it (a reduction's receives in the bounce
 * buffer, then combined with their operand by the memory layer's device kernel as soon as each completed); each
 * landed receive is flushed first where `flush`. Call descriptors stay host bytes. Errors as zccl__engine_run.
 */
zccl_result_t zccl__gdr_run_phase(struct zccl_comm *comm, zccl_mem_type_t mt, zccl_xfer_t *x, size_t nx, size_t phase,
                                  bool flush);

#endif

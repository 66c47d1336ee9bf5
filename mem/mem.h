/*
 * mem.h — the memory-type layer: what kind of memory a buffer is (host, CUDA device), and copy, reduce and
 * allocation for each kind behind one const ops table per type. Between kernels/ and transport/ in the layer stack
 * (docs/architecture.md, docs/gpu.md).
 *
 * A collective learns its memory type once per call (zccl__mem_call_type, lib/api/collectives.c); the engine's
 * COPY/REDUCE steps then call that type's table, and for a device call it stages what transports move through host
 * memory (zccl_mem_stage_t below), so schedules, algorithms and transports never fork per memory type.
 *
 * CUDA is reached only through the driver API of libcuda, opened with dlopen on first need (ZCCL_CUDA_LIBRARY names
 * another file, e.g. the fake libcuda of the unit tests): libzccl.so loads and runs on machines without CUDA.
 */
#ifndef ZCCL_MEM_H
#define ZCCL_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core.h"
#include "zccl.h"

typedef enum {
    ZCCL_MEM_HOST = 0, /* ordinary (pageable or pinned) host memory: the CPU kernels */
    ZCCL_MEM_CUDA = 1, /* CUDA device memory (cuMemAlloc/cudaMalloc): the CUDA kernels, staged through the host */
    ZCCL_MEM_TYPES = 2
} zccl_mem_type_t;

/** An opaque handle through which another process of the host maps an allocation (CUDA: CUipcMemHandle). */
#define ZCCL_MEM_IPC_HANDLE_BYTES 64
typedef struct { uint8_t bytes[ZCCL_MEM_IPC_HANDLE_BYTES]; } zccl_mem_ipc_handle_t;

/** One memory type's operations. Every pointer argument is memory of that type unless said otherwise. */
typedef struct zccl_mem_ops {
    const char *name; /* "host", "cuda" */
    /** dst <- src, bytes; non-overlapping. For CUDA either side may also be host memory (unified addressing). */
    zccl_result_t (*copy)(void *dst, const void *src, size_t bytes);
    /** dst[i] = a[i] OP b[i] with kernels.h's semantics (op SUM..MIN; AVG is SUM; divisor > 1 divides). */
    zccl_result_t (*reduce)(void *dst, const void *a, const void *b, size_t count, zccl_datatype_t dt,
                            zccl_redop_t op, uint32_t divisor);
    /** PreMulSum's product dst[i] = *scalar * src[i]; scalar is one host element of dt. */
    zccl_result_t (*premul)(void *dst, const void *src, size_t count, zccl_datatype_t dt, const void *scalar);
    /** Memory of this type (4096-byte aligned for host), and its release. */
    zccl_result_t (*alloc)(void **p, size_t bytes);
    void (*free)(void *p);
    /** Optional (NULL: nothing to do): called once before a call's first step on this memory. CUDA: waits until the
     *  work already queued in the context (the caller's kernels that produce the input) is done. */
    zccl_result_t (*call_begin)(void);
    /** Optional (NULL: none): page-locked host memory the device can reach, for staging; and its release. */
    zccl_result_t (*alloc_host)(void **p, size_t bytes);
    void (*free_host)(void *p);
    /** Bytes the one-pass path of registered buffers (lib/core/regmem.c) reduces per step through its bounce
     *  buffer: host 32 KiB (stays in the cache), CUDA 8 MiB (few kernel launches). */
    size_t direct_step_bytes;
    /*
     * Optional (NULL: this table does not share memory between processes; host memory is shared through
     * zccl_mem_alloc's named regions in regmem.c instead). Sharing an allocation with the other processes of the
     * host, CUDA IPC (mem_cuda.c, docs/gpu.md "CUDA IPC"):
     *  ipc_range   the allocation holding p: its first byte *base and its size *bytes;
     *  ipc_export  a handle for the allocation starting at base; fails (ZCCL_INVALID_USAGE, naming why) when the
     *              allocation cannot be shared (e.g. not from cuMemAlloc/cudaMalloc);
     *  ipc_open    maps a handle exported by another process: *base and *bytes of the mapping in this process;
     *  ipc_close   unmaps what ipc_open returned.
     */
    zccl_result_t (*ipc_range)(const void *p, void **base, size_t *bytes);
    zccl_result_t (*ipc_export)(void *base, zccl_mem_ipc_handle_t *out);
    zccl_result_t (*ipc_open)(const zccl_mem_ipc_handle_t *h, void **base, size_t *bytes);
    void (*ipc_close)(void *base);
} zccl_mem_ops_t;

extern const zccl_mem_ops_t zccl__mem_host; /* mem_host.c: wraps kernels/ */
extern const zccl_mem_ops_t zccl__mem_cuda; /* mem_cuda.c: driver API + the embedded kernels (kernels/cuda/) */

/** The table of type t (t < ZCCL_MEM_TYPES). */
const zccl_mem_ops_t *zccl__mem_ops(zccl_mem_type_t t);

/**
 * What memory p is: *type (host when CUDA is absent, for NULL, and for host memory CUDA does not know) and, for
 * device memory, *device (the CUDA ordinal; -1 for host). Fails only when the CUDA query itself fails.
 */
zccl_result_t zccl__mem_query(const void *p, zccl_mem_type_t *type, int *device);

/**
 * The id of the CUDA allocation holding p (cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID): unique per
 * allocation for the life of the process, so an address freed and allocated again has a new one). What registration
 * caches keep with a device registration to find out that the memory behind it changed (docs/gpu.md "The
 * registration cache"). Fails with ZCCL_INVALID_ARGUMENT naming p and `what` when the driver does not know p (freed,
 * or never allocated: "<what> <p> is not device memory that is allocated (freed while registered?)"), and with
 * ZCCL_SYSTEM_ERROR for any other failure of the query or without a CUDA driver.
 */
zccl_result_t zccl__mem_buffer_id(const void *p, const char *what, uint64_t *id);

/**
 * The memory type of one call from its two buffers (either may be NULL: not used on this rank). Errors name the
 * function and the buffer: device memory in a build without the CUDA kernels or where libcuda cannot be loaded
 * (ZCCL_INVALID_USAGE), a host buffer mixed with a device buffer or buffers on two devices (ZCCL_INVALID_ARGUMENT).
 * Costs nothing when no CUDA library is present (host).
 */
zccl_result_t zccl__mem_call_type(const char *fn, const void *sendbuf, const void *recvbuf, zccl_mem_type_t *type);

/**
 * The CUDA device (ordinal) of the calling thread's current context: the GPU this rank works on, as NCCL takes the
 * device current at communicator creation. -1 when no context is current, or when the process has not loaded the
 * CUDA driver (libcuda.so.1, or ZCCL_CUDA_LIBRARY's file): this never loads it, so a CPU job stays without CUDA.
 */
int zccl__mem_caller_gpu(void);
/** Whether this build holds the CUDA kernels (ZCCL_WITH_CUDA found nvcc). */
bool zccl__mem_cuda_built(void);
/** Whether libcuda was loaded (tries once; ZCCL_CUDA_LIBRARY overrides the file); *why gets the reason if not. */
bool zccl__mem_cuda_available(const char **why);

/*
 * Staging for calls on non-host memory, one per communicator: the scratch buffer of the schedule in the call's
 * memory, host bytes for the transports (a send's source is copied out before its phase; a receive lands in host
 * memory and enters the device buffer when it completes: copied, or reduced with its second operand), and a device
 * bounce buffer for those reductions. Grows as needed, never shrinks until zccl__mem_stage_free.
 */
typedef struct zccl_mem_stage {
    zccl_mem_type_t scratch_type;
    void *scratch;            /* the schedule's tmp buffer in device memory */
    size_t scratch_bytes;
    void *bounce;             /* device: a received block before it is reduced */
    size_t bounce_bytes;
    uint8_t *host;            /* the current phase's host bytes, handed out front to back */
    size_t host_bytes, host_used;
    size_t host_want;         /* the most any phase asked for: the next phase allocates that in one block */
    uint8_t **spill;          /* blocks allocated when host ran out mid-phase, freed at the next phase */
    size_t nspill;
    zccl_result_t error;      /* sticky first failure of this call */
    void *direct;             /* the one-pass path's bounce buffer (regmem.c), memory type direct_type */
    size_t direct_bytes;
    zccl_mem_type_t direct_type;
    struct zccl_mem_pipe *pipe; /* pipelined staging's streams, tickets and bounce ring (mem_pipe.c), or NULL */
    uint64_t stage_copies;      /* copies between device memory and host staging so far (both paths, every chunk) */
} zccl_mem_stage_t;

/** The schedule's scratch buffer of bytes in memory type t. */
zccl_result_t zccl__mem_stage_scratch(zccl_mem_stage_t *st, zccl_mem_type_t t, size_t bytes, void **out);
/** The one-pass path's bounce buffer of bytes in memory type t (regmem.c reduces through it). */
zccl_result_t zccl__mem_stage_direct(zccl_mem_stage_t *st, zccl_mem_type_t t, size_t bytes, void **out);
/** Begins a phase: host bytes handed out in the last one are free again. */
void zccl__mem_stage_phase(zccl_mem_stage_t *st);
/** Host bytes for one transfer of this phase (valid until the next zccl__mem_stage_phase). */
zccl_result_t zccl__mem_stage_host(zccl_mem_stage_t *st, size_t bytes, uint8_t **out);
/** A send's source src (type t) copied into host bytes for the transport. */
zccl_result_t zccl__mem_stage_send(zccl_mem_stage_t *st, zccl_mem_type_t t, const void *src, size_t bytes,
                                   const uint8_t **host);
/** A completed receive of bytes, staged at host, enters dst (type t): copied, or reduced with op2 (type t). */
zccl_result_t zccl__mem_stage_recv_done(zccl_mem_stage_t *st, zccl_mem_type_t t, void *dst, const void *op2,
                                        const void *host, size_t bytes, zccl_datatype_t dt, zccl_redop_t op,
                                        uint32_t divisor);
/** Releases everything st holds. */
void zccl__mem_stage_free(zccl_mem_stage_t *st);

/*
 * Stream order on a caller's CUDA stream (cuda_order.c; docs/gpu.md), behind zccl_stream_create_cuda: issue records
 * an event on the stream and queues a wait there until the pinned completion word reaches the call's ticket, and
 * returns at once; begin (the zccl stream's thread) waits for the event; end stores the ticket once the call's device
 * work is done (or failed), which lets the caller's stream continue.
 */
typedef struct zccl_cuda_order zccl_cuda_order_t;
typedef struct {
    uint32_t value; /* 0: no ticket */
    void *event;    /* the CUevent recorded on the caller's stream for this call */
} zccl_cuda_ticket_t;
/** The order state of cuda_stream. Errors name the cause: no driver or no CUDA kernels (ZCCL_INVALID_USAGE), a
 *  handle that is no stream, a stream of a context other than its device's primary one, or of another device than
 *  the one zccl's CUDA table already uses (ZCCL_INVALID_ARGUMENT). */
zccl_result_t zccl__cuda_order_create(void *cuda_stream, zccl_cuda_order_t **out);
/** The CUDA device of the order's stream. */
int zccl__cuda_order_device(const zccl_cuda_order_t *o);
zccl_result_t zccl__cuda_order_issue(zccl_cuda_order_t *o, zccl_cuda_ticket_t *t);
/** Waits until the work the caller queued before t has run; gives up when *abort becomes non-zero (may be NULL). */
zccl_result_t zccl__cuda_order_begin(zccl_cuda_order_t *o, const zccl_cuda_ticket_t *t, const volatile int *abort);
/** Lets the caller's stream pass t's wait (call it whether the call succeeded or not, once per issued ticket). */
void zccl__cuda_order_end(zccl_cuda_order_t *o, zccl_cuda_ticket_t *t);
/** The last ticket completed. */
uint32_t zccl__cuda_order_done(const zccl_cuda_order_t *o);
void zccl__cuda_order_destroy(zccl_cuda_order_t *o);

/* This layer's rows of the settings table (mem/settings.c). */
extern const zccl_cfg_desc_t zccl__set_cuda_library;
#define ZCCL_CFG_CUDA_LIBRARY (&zccl__set_cuda_library)

#endif

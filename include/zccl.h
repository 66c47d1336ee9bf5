/*
 * zccl.h — public API of zccl, a collective-communication library for data-parallel training with ZeRO.
 *
 * The API keeps NCCL's shapes and numbering (ncclResult_t, ncclDataType_t, ncclRedOp_t, the argument order of
 * every collective and NCCL's in-place rules) so that a framework written against NCCL maps onto zccl name for
 * name. Differences from NCCL are stated where they occur.
 *
 * Units. Every `count` argument is a number of ELEMENTS of the given datatype, never bytes. Buffers are host
 * memory or, where libzccl was built with its CUDA kernels and a CUDA driver is present, CUDA device memory (both
 * buffers of a call of one kind; docs/gpu.md): a call on device memory with a NULL stream has completed on the GPU
 * when it returns; on a stream of zccl_stream_create_cuda it is ordered with that CUDA stream.
 *
 * Errors. Every function returns a zccl_result_t. On failure a message naming the cause (which argument, which
 * peer rank, which limit) is kept per thread and returned by zccl_get_last_error(); with ZCCL_DEBUG=WARN or higher
 * it is also printed on stderr. Output buffers are written only by operations that succeed, except that a
 * collective failing with ZCCL_REMOTE_ERROR or ZCCL_TIMEOUT part-way may have written part of its output.
 *
 * Threads. A communicator may be used by one thread at a time; operations queued on streams of the same
 * communicator run in the order they were queued on each stream, and two streams must not drive the same
 * communicator concurrently (as in NCCL, where a communicator is bound to one ordered sequence of collectives).
 */
#ifndef ZCCL_H
#define ZCCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZCCL_MAJOR 0
#define ZCCL_MINOR 1
#define ZCCL_PATCH 0
/** Version as one integer: major*10000 + minor*100 + patch (NCCL's NCCL_VERSION_CODE form). */
#define ZCCL_VERSION_CODE (ZCCL_MAJOR * 10000 + ZCCL_MINOR * 100 + ZCCL_PATCH)

/** Result codes; numbering identical to ncclResult_t. */
typedef enum {
    ZCCL_SUCCESS = 0,              /**< The operation completed. */
    ZCCL_UNHANDLED_CUDA_ERROR = 1, /**< A CUDA call failed (not produced by this CPU-only build). */
    ZCCL_SYSTEM_ERROR = 2,         /**< A system call failed: out of memory, /dev/shm, sockets, limits. */
    ZCCL_INTERNAL_ERROR = 3,       /**< A bug in zccl or a corrupted message: please report it. */
    ZCCL_INVALID_ARGUMENT = 4,     /**< An argument is invalid; the message names it. */
    ZCCL_INVALID_USAGE = 5,        /**< The call is valid alone but not in this state (e.g. destroyed stream). */
    ZCCL_REMOTE_ERROR = 6,         /**< A peer rank failed, disconnected or sent something invalid. */
    ZCCL_IN_PROGRESS = 7,          /**< Work has not completed yet: zccl_stream_query, a non-blocking communicator
                                        (zccl_config_t.blocking = 0) still initialising or running. */
    /* 8 is ncclNumResults in NCCL and is no result code here either (zccl_get_error_string says "unknown"). */
    ZCCL_TIMEOUT = 9,              /**< A deadline (ZCCL_TIMEOUT_MS) passed; the message names the peer. zccl only
                                        (NCCL has no such code). */
    ZCCL_NUM_RESULTS = 10
} zccl_result_t;

/** Element types; numbering identical to ncclDataType_t. */
typedef enum {
    ZCCL_INT8 = 0,
    ZCCL_UINT8 = 1,
    ZCCL_INT32 = 2,
    ZCCL_UINT32 = 3,
    ZCCL_INT64 = 4,
    ZCCL_UINT64 = 5,
    ZCCL_FLOAT16 = 6,  /**< IEEE 754 binary16. */
    ZCCL_FLOAT32 = 7,
    ZCCL_FLOAT64 = 8,
    ZCCL_BFLOAT16 = 9, /**< bfloat16: the upper 16 bits of a binary32. */
    ZCCL_FLOAT8E4M3 = 10, /**< OCP 8-bit float E4M3 (OFP8): bias 7, no infinities, S.1111.111 is NaN, max 448. */
    ZCCL_FLOAT8E5M2 = 11, /**< OCP 8-bit float E5M2 (OFP8): bias 15, IEEE-like with infinities and NaNs, max 57344. */
    ZCCL_NUM_TYPES = 12
} zccl_datatype_t;

/**
 * Reduction operations; numbering identical to ncclRedOp_t.
 * Integer sum and product wrap modulo 2^bits (two's complement), as NCCL does. ZCCL_AVG is the sum divided by
 * the number of ranks, applied once to the complete sum (integer types: truncating division). For float16,
 * bfloat16 and the two fp8 types each reduction step converts its operands to float32, combines them, and rounds
 * the result to the nearest even representable value once. fp8 results that overflow the format saturate to the
 * largest finite value of its sign (CUDA's __NV_SATFINITE, which NCCL uses); NaN operands give NaN; E5M2 infinities
 * stay infinite (docs/groups.md, "fp8").
 * Values from ZCCL_NUM_OPS up are handles made by zccl_redop_create_premulsum(), valid on their communicator only.
 */
typedef enum {
    ZCCL_SUM = 0,
    ZCCL_PROD = 1,
    ZCCL_MAX = 2,
    ZCCL_MIN = 3,
    ZCCL_AVG = 4,
    ZCCL_NUM_OPS = 5
} zccl_redop_t;

/** Size in bytes of the opaque unique id (as NCCL_UNIQUE_ID_BYTES). */
#define ZCCL_UNIQUE_ID_BYTES 128

/**
 * Opaque job identifier created by zccl_get_unique_id() on one process and handed to every rank out of band
 * (MPI_Bcast, a file, ...). It carries the bootstrap root's address and the job's 128-bit secret: treat it as a
 * credential, since anyone holding it may join the job.
 */
typedef struct {
    char internal[ZCCL_UNIQUE_ID_BYTES];
} zccl_unique_id_t;

/** Opaque communicator: a group of ranks that run collectives together. */
typedef struct zccl_comm *zccl_comm_t;

/** Opaque stream: an ordered queue of operations completed by a background thread. NULL means "blocking". */
typedef struct zccl_stream *zccl_stream_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* Errors and version                                                                                           */
/* ------------------------------------------------------------------------------------------------------------ */

/** Returns a static, human-readable name for a result code (never NULL; unknown codes give "unknown result"). */
const char *zccl_get_error_string(zccl_result_t result);

/**
 * Returns the message describing the last failure on the calling thread (which argument, which peer, which
 * limit), or "" if no zccl call on this thread has failed. The string stays valid until the next failing zccl
 * call on the same thread. comm may be NULL; it is accepted for NCCL's ncclGetLastError(comm) shape.
 */
const char *zccl_get_last_error(zccl_comm_t comm);

/** Stores ZCCL_VERSION_CODE into *version. Errors: ZCCL_INVALID_ARGUMENT if version is NULL. */
zccl_result_t zccl_get_version(int *version);

/* ------------------------------------------------------------------------------------------------------------ */
/* Communicators                                                                                                */
/* ------------------------------------------------------------------------------------------------------------ */

/**
 * Creates a new job id: picks this host's address (ZCCL_SOCKET_IFNAME selects the interface, NCCL grammar),
 * opens the bootstrap root's listening socket on it, starts the root in a background thread of this process and
 * draws a random 128-bit secret from the kernel (getrandom). Call it on exactly one process per communicator,
 * then pass the id to all ranks, including the calling one if it is a rank. The calling process must stay alive
 * until every rank has returned from zccl_comm_init_rank().
 * @param[out] id  the new id; must not be NULL.
 * Errors: ZCCL_INVALID_ARGUMENT (id NULL); ZCCL_SYSTEM_ERROR (no usable interface, socket or thread failure).
 */
zccl_result_t zccl_get_unique_id(zccl_unique_id_t *id);

/**
 * Creates the communicator of rank `rank` in a group of `nranks` ranks that share `id`. Collective: every rank
 * must call it; it returns once all ranks have joined and connections to the neighbours are set up. Every
 * connection, bootstrap and data, proves knowledge of the id's secret before anything else it sends is parsed.
 * @param[out] comm    the new communicator; must not be NULL. Set to NULL on failure.
 * @param      nranks  number of ranks, 1 <= nranks <= 65536.
 * @param      id      the id from zccl_get_unique_id(), the same on all ranks.
 * @param      rank    this rank, 0 <= rank < nranks, distinct on every rank.
 * Errors: ZCCL_INVALID_ARGUMENT (comm NULL, nranks or rank out of range, malformed id); ZCCL_SYSTEM_ERROR
 * (sockets, shared memory, limits); ZCCL_REMOTE_ERROR (a peer disagrees on nranks, or rank used twice; a rank that
 * joined died before every rank did, named within about 0.1 s; under zcclrun, a rank that exited before joining,
 * named by the launcher within about 0.3 s); ZCCL_TIMEOUT (not every rank joined within ZCCL_INIT_TIMEOUT_MS).
 * While it waits, a WARN line every 10 s names the bootstrap root's address and the ranks not heard from.
 */
zccl_result_t zccl_comm_init_rank(zccl_comm_t *comm, int nranks, zccl_unique_id_t id, int rank);

/**
 * Creates a communicator from the environment that launchers set:
 *   - torchrun / zcclrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
 *   - Open MPI's mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, with MASTER_ADDR and MASTER_PORT;
 *   - MPICH/Hydra: PMI_RANK, PMI_SIZE, with MASTER_ADDR and MASTER_PORT.
 * Rank 0 runs the bootstrap root, listening on MASTER_PORT. The job secret is read from ZCCL_SECRET (32 hex
 * digits; zcclrun sets it). Without ZCCL_SECRET the secret is derived from MASTER_ADDR, MASTER_PORT and
 * TORCHELASTIC_RUN_ID, which keeps unrelated jobs apart but is no protection against a hostile user on the
 * network: set ZCCL_SECRET in that case.
 * @param[out] comm  the new communicator; must not be NULL.
 * Errors: as zccl_comm_init_rank(), plus ZCCL_INVALID_ARGUMENT naming the missing or malformed variable.
 */
zccl_result_t zccl_comm_init_env(zccl_comm_t *comm);

/**
 * Frees a communicator after completing every operation queued on it. Not collective in effect, but peers still
 * running collectives with this rank will see ZCCL_REMOTE_ERROR. NULL is accepted and ignored.
 * Errors: ZCCL_INVALID_USAGE if a stream still holds unfinished operations of this communicator.
 */
zccl_result_t zccl_comm_destroy(zccl_comm_t comm);

/**
 * Frees a communicator without waiting for its peers. May be called from another thread while a collective of
 * this communicator is blocked (in a call or on a stream): that collective returns ZCCL_REMOTE_ERROR within about
 * 50 ms, operations still queued on streams fail with ZCCL_REMOTE_ERROR, and connections are closed so that peers
 * see ZCCL_REMOTE_ERROR instead of waiting. The communicator must not be used afterwards (not even destroyed).
 * NULL is accepted and ignored. Always returns ZCCL_SUCCESS.
 */
zccl_result_t zccl_comm_abort(zccl_comm_t comm);

/**
 * Stores in *async_error the error that broke the communicator, or ZCCL_SUCCESS: once a peer is lost, a deadline
 * passes (ZCCL_TIMEOUT_MS), any other failure happens after a collective started moving data (a port that went
 * down, a transport's system error), or the communicator is aborted, every later operation fails at once with that
 * error (as ncclCommGetAsyncError reports), and operations queued on a stream fail without running. Safe to call from any thread while another thread is inside a collective.
 * Errors: ZCCL_INVALID_ARGUMENT if comm or async_error is NULL.
 */
zccl_result_t zccl_comm_get_async_error(zccl_comm_t comm, zccl_result_t *async_error);

/**
 * Describes how this rank reaches the ranks of other hosts over TCP: its rails (interfaces, each with its subnet)
 * and the most sockets it stripes one direction of a pair over ("eth0 10.200.0.0/24, eth1 10.200.1.0/24; up to 2
 * sockets per direction of a pair", "one TCP connection per direction (no rails)", or, when no peer is reached over
 * TCP, "no peer over TCP (every peer over shared memory)" or the transport that carries them; over verbs its rails,
 * and for each peer that lost one the live ones: "no peer over TCP (ib: IB rails rxe0:1,rxe2:1; to rank 1 live
 * rxe0:1 (lost rxe2:1))"). Local; the values are those fixed at init (docs/configuration.md: ZCCL_TCP_RAILS,
 * ZCCL_NSOCKS_PERTHREAD, ZCCL_IB_HCA) except the live IB rails, read when called.
 * @param text       receives the NUL-terminated line (truncated to len bytes); may be NULL when len is 0.
 * @param nrails     if non-NULL: this rank's TCP rails (0 when it has fewer than two and one socket per rail); when
 *                   no peer is over TCP and verbs carries them, its IB rails (HCA ports).
 * @param max_socks  if non-NULL: the most sockets per direction it uses with any peer (1 = no striping).
 * Errors: ZCCL_INVALID_ARGUMENT if comm is NULL.
 */
zccl_result_t zccl_comm_net_info(zccl_comm_t comm, char *text, size_t len, int *nrails, int *max_socks);

/**
 * Creates a communicator of the ranks of comm that are not in `exclude` (elastic training after a failure, as
 * ncclCommShrink). Collective over the survivors, who must pass the same set; excluded ranks do not call it. comm may
 * be broken (ZCCL_REMOTE_ERROR from a lost peer): only its connection service and rank table are used. New ranks are
 * the survivors in their old order. Destroy or abort comm afterwards as usual.
 * @param exclude   nexclude distinct ranks of comm to leave out (the lost ones); may be NULL when nexclude is 0.
 * @param nexclude  0 <= nexclude < nranks; the caller must not be excluded.
 * @param[out] newcomm  the new communicator; NULL on failure.
 * Errors: ZCCL_INVALID_ARGUMENT (a rank out of range, listed twice, or the caller excluded); ZCCL_TIMEOUT (a survivor
 * did not join within ZCCL_INIT_TIMEOUT_MS); ZCCL_REMOTE_ERROR / ZCCL_SYSTEM_ERROR as zccl_comm_init_rank.
 */
zccl_result_t zccl_comm_shrink(zccl_comm_t comm, const int *exclude, int nexclude, zccl_comm_t *newcomm);

/** color value for ranks that take part in zccl_comm_split but join no new communicator (NCCL_SPLIT_NOCOLOR). */
#define ZCCL_SPLIT_NOCOLOR (-1)

/**
 * Splits comm into disjoint communicators, one per distinct color (as ncclCommSplit / MPI_Comm_split): data-parallel
 * groups inside 3D parallelism, per-host communicators for hierarchical schedules. Collective over every rank of
 * comm, called in the same order as comm's collectives. New ranks follow (key, old rank) ascending.
 * @param color  >= 0, or ZCCL_SPLIT_NOCOLOR: the caller joins no communicator and *newcomm is NULL.
 * @param key    any int; orders ranks inside the new communicator (ties broken by old rank).
 * @param[out] newcomm  the new communicator (destroy it as usual); NULL for ZCCL_SPLIT_NOCOLOR or on failure.
 * Errors: ZCCL_INVALID_ARGUMENT (comm/newcomm NULL, color < -1); ZCCL_INVALID_USAGE (operations of comm still queued
 * on a stream: synchronize first); ZCCL_REMOTE_ERROR when comm is broken or a rank is
 * lost during the split; ZCCL_TIMEOUT / ZCCL_SYSTEM_ERROR as zccl_comm_init_rank. Every rank of comm gets the same
 * outcome for the exchange of colors; the new communicators are then set up group by group.
 */
zccl_result_t zccl_comm_split(zccl_comm_t comm, int color, int key, zccl_comm_t *newcomm);

/* ---- configured and non-blocking communicators (NCCL's ncclConfig_t) ---------------------------------------- */

/**
 * Options for zccl_comm_init_rank_config() and zccl_comm_split_config(). Always start from ZCCL_CONFIG_INITIALIZER
 * and then set fields: size, magic and version identify the layout the caller was compiled with, so that fields
 * added at the end later keep old callers working (a shorter `size` means the missing fields take their defaults).
 *  - size:        sizeof(zccl_config_t) of the caller; at least offsetof(zccl_config_t, split_share) + sizeof(int).
 *  - magic:       0x7a63636c ("zccl"); any other value is ZCCL_INVALID_ARGUMENT naming 'magic'.
 *  - version:     ZCCL_VERSION_CODE of the caller's header; must not be newer than the library's.
 *  - blocking:    1 (default): creation and operations return when done, as without a config. 0: NCCL's
 *                 non-blocking mode: creation returns ZCCL_IN_PROGRESS at once while it continues on a background
 *                 thread, and zccl_comm_get_async_error() reports ZCCL_IN_PROGRESS until it has finished, then
 *                 ZCCL_SUCCESS or its error. Any other value is ZCCL_INVALID_ARGUMENT naming 'blocking'.
 *  - comm_name:   a name shown in this communicator's log lines and error messages ("[name]"); copied (at most 63
 *                 characters kept); NULL: none.
 *  - split_share: reserved (NCCL's splitShare); must be 0 or 1, has no effect.
 */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    const char *comm_name;
    int split_share; /* reserved */
} zccl_config_t;

/** zccl_config_t.magic */
#define ZCCL_CONFIG_MAGIC 0x7a63636c
/** Default configuration: blocking, no name. */
#define ZCCL_CONFIG_INITIALIZER {sizeof(zccl_config_t), 0x7a63636c, ZCCL_VERSION_CODE, 1, NULL, 0}

/**
 * zccl_comm_init_rank() with options (NCCL's ncclCommInitRankConfig).
 * @param config  NULL: the defaults (the same as zccl_comm_init_rank). Read during the call only.
 * Blocking (config->blocking = 1): as zccl_comm_init_rank(). Non-blocking (0): validates the arguments, stores a
 * usable handle in *comm and returns ZCCL_IN_PROGRESS; the bootstrap and connection set-up continue in the
 * background. Poll zccl_comm_get_async_error(*comm, &r) until r is not ZCCL_IN_PROGRESS; r is then ZCCL_SUCCESS or
 * the error creation failed with (the message: zccl_get_last_error on the polling thread). While r is
 * ZCCL_IN_PROGRESS, collectives, send/recv and group calls on the communicator return ZCCL_IN_PROGRESS without
 * doing anything (call them again later); zccl_comm_destroy/zccl_comm_abort wait for the background work to end.
 * After a failed non-blocking creation the handle must still be freed with zccl_comm_destroy() or zccl_comm_abort().
 * Errors: as zccl_comm_init_rank(), plus ZCCL_INVALID_ARGUMENT naming a config field ('size', 'magic', 'version',
 * 'blocking', 'split_share') that is wrong.
 */
zccl_result_t zccl_comm_init_rank_config(zccl_comm_t *comm, int nranks, zccl_unique_id_t id, int rank,
                                         const zccl_config_t *config);

/**
 * zccl_comm_split() with options for the new communicator (NCCL's ncclCommSplit with its config argument).
 * config NULL: the new communicator inherits comm's blocking mode and has no name. The split itself runs on the
 * calling thread in both modes (it is collective over comm); with blocking = 0 the new communicator is complete
 * when this returns and the call returns ZCCL_SUCCESS. Errors: as zccl_comm_split(), plus a config field as in
 * zccl_comm_init_rank_config().
 */
zccl_result_t zccl_comm_split_config(zccl_comm_t comm, int color, int key, zccl_comm_t *newcomm,
                                     const zccl_config_t *config);

/**
 * Completes every operation of comm still outstanding on streams or in a background initialisation and flushes
 * the communicator's work, so that zccl_comm_destroy() afterwards only frees memory (NCCL's ncclCommFinalize).
 * Collective in the sense that peers waiting for this rank's part of an outstanding operation get it. A
 * non-blocking communicator returns ZCCL_SUCCESS once done (zccl finishes the work before returning in both modes).
 * Calling zccl_comm_destroy() without it is allowed. Errors: ZCCL_INVALID_ARGUMENT (comm NULL); the first error of
 * an outstanding operation (as zccl_stream_synchronize), or the communicator's async error.
 */
zccl_result_t zccl_comm_finalize(zccl_comm_t comm);

/** Stores the communicator's size in *count. Errors: ZCCL_INVALID_ARGUMENT if comm or count is NULL. */
zccl_result_t zccl_comm_count(const zccl_comm_t comm, int *count);

/** Stores the caller's rank in *rank. Errors: ZCCL_INVALID_ARGUMENT if comm or rank is NULL. */
zccl_result_t zccl_comm_rank(const zccl_comm_t comm, int *rank);

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

/**
 * Creates a stream: operations issued on it are queued, in order, and run by a background thread of the stream,
 * so that the caller can compute while they progress (the bucket scheduler relies on this). An operation issued
 * on a stream returns ZCCL_SUCCESS once its arguments are validated and it is queued; the buffers must stay valid
 * and untouched (send buffer: not written; receive buffer: not read or written) until the stream is synchronized.
 * Errors: ZCCL_INVALID_ARGUMENT (stream NULL); ZCCL_SYSTEM_ERROR (thread creation failed).
 */
zccl_result_t zccl_stream_create(zccl_stream_t *stream);

/**
 * Waits until every operation queued on the stream has completed. Returns the first error that any of them
 * returned since the last synchronize (its message is then available via zccl_get_last_error()), else success.
 * Operations queued behind an error that broke their communicator (zccl_comm_get_async_error) complete at once,
 * failed, without running.
 * Errors: ZCCL_INVALID_ARGUMENT (stream NULL), or the error of a queued operation.
 */
zccl_result_t zccl_stream_synchronize(zccl_stream_t stream);

/**
 * Returns ZCCL_SUCCESS if every queued operation has completed successfully, ZCCL_IN_PROGRESS if some have not
 * completed yet, or the first error of a completed one (then cleared, as by zccl_stream_synchronize). Never blocks.
 * Errors: ZCCL_INVALID_ARGUMENT if stream is NULL; otherwise the first failed operation's error.
 */
zccl_result_t zccl_stream_query(zccl_stream_t stream);

/** Waits for the stream's queued operations, then frees it. NULL is accepted. Returns as zccl_stream_synchronize. */
zccl_result_t zccl_stream_destroy(zccl_stream_t stream);

/**
 * Creates a stream bound to a caller's CUDA stream (NCCL's cudaStream_t argument; docs/gpu.md, "Stream order").
 * cuda_stream: a CUstream / cudaStream_t of the primary context of its device (what the CUDA runtime creates), or
 * NULL for the legacy default stream of the calling thread's current context. Not owned: it must outlive the zccl
 * stream. A call on CUDA device memory of that device issued on the returned stream returns at once, without waiting
 * for the GPU: it runs on the stream's thread once the work queued on cuda_stream before the call has run (an event
 * recorded at issue), and the work queued on cuda_stream after the call waits for it (cuda_stream waits on a
 * completion word that zccl writes when the call is done, failed or not), as an NCCL call on that stream. The
 * buffers follow the CUDA stream's order: the caller may free or overwrite them once its later work on cuda_stream
 * has run (cudaStreamSynchronize), or zccl_stream_synchronize has returned. Calls on host memory on this stream are
 * queued as on zccl_stream_create's streams and not ordered with cuda_stream. Errors of a call that ran in the
 * background come from zccl_stream_synchronize/query and, where the ranks lost step, zccl_comm_get_async_error;
 * a failure of the work queued before the call (cuEventQuery reports it) fails the call with
 * ZCCL_UNHANDLED_CUDA_ERROR without moving data (its peers fail it too, naming why).
 * Calls on device memory of another device than cuda_stream's fail with ZCCL_INVALID_ARGUMENT when issued (the call
 * still takes its place in the sequence, so the peers fail it too, naming why).
 * Errors: ZCCL_INVALID_ARGUMENT (stream NULL; cuda_stream no live stream; a stream of a context that is not its
 * device's primary context; a stream of a device other than the one zccl's CUDA layer already uses in this
 * process); ZCCL_INVALID_USAGE (no CUDA driver could be loaded, a driver without events, cuStreamGetCtx or
 * cuStreamWaitValue32_v2 (older than CUDA 12), or a libzccl built without its CUDA kernels); ZCCL_SYSTEM_ERROR
 * (pinned memory, events or the thread could not be created).
 */
zccl_result_t zccl_stream_create_cuda(void *cuda_stream, zccl_stream_t *stream);

/**
 * What memory ptr points into: *device receives the CUDA device ordinal for CUDA device memory, -1 for host memory
 * (any pointer when no CUDA driver is loaded or libzccl has no CUDA kernels, NULL, pinned or registered host memory).
 * Errors: ZCCL_INVALID_ARGUMENT (device NULL); ZCCL_SYSTEM_ERROR (the driver's pointer query failed).
 */
zccl_result_t zccl_pointer_device(const void *ptr, int *device);

/**
 * Allocates `bytes` bytes (0 gives 1) of CUDA device memory through zccl's memory layer (cuMemAlloc in the calling
 * thread's current context, else the primary context of device 0 or of the device of the last device call), for
 * buffers of calls on device memory (ncclMemAlloc, zccl-bench -G 1). Free it with zccl_mem_free_cuda.
 * Errors: ZCCL_INVALID_ARGUMENT (ptr NULL); ZCCL_INVALID_USAGE (no CUDA driver, or no CUDA kernels in this build);
 * ZCCL_SYSTEM_ERROR (the allocation failed; the message gives the driver's reason).
 */
zccl_result_t zccl_mem_alloc_cuda(void **ptr, size_t bytes);
/** Frees memory from zccl_mem_alloc_cuda. ptr NULL: nothing. Errors: ZCCL_INVALID_ARGUMENT (ptr is not CUDA
 *  device memory). */
zccl_result_t zccl_mem_free_cuda(void *ptr);
/**
 * Copies `bytes` bytes from src to dst (not overlapping), each host or CUDA device memory; the copy has completed
 * when the call returns. Errors: ZCCL_INVALID_ARGUMENT (dst or src NULL with bytes > 0); ZCCL_SYSTEM_ERROR (the
 * driver's copy failed).
 */
zccl_result_t zccl_mem_copy(void *dst, const void *src, size_t bytes);

/* ------------------------------------------------------------------------------------------------------------ */
/* Collectives                                                                                                  */
/*                                                                                                              */
/* Common rules, as in NCCL:                                                                                    */
/*  - count/sendcount/recvcount are element counts; count 0 is a no-op that accepts NULL buffers (still         */
/*    collective: every rank must make the call);                                                               */
/*  - stream NULL: the call returns when the operation has completed; else it is queued (zccl_stream_create);   */
/*  - every rank must call the same collectives in the same order with matching count, datatype, op and root;   */
/*  - buffers may not overlap except in the in-place forms named for each collective.                           */
/*  Common errors: ZCCL_INVALID_ARGUMENT naming the argument (NULL buffer with count > 0, datatype or op out of  */
/*  range, root out of range, count whose byte size overflows size_t or whose total exceeds SIZE_MAX/2, comm     */
/*  NULL); ZCCL_REMOTE_ERROR (a peer failed or closed its connection; the message names the peer);              */
/*  ZCCL_TIMEOUT (no progress from a peer within ZCCL_TIMEOUT_MS); ZCCL_SYSTEM_ERROR (a system call failed).     */
/* ------------------------------------------------------------------------------------------------------------ */

/*
 * Invalid calls: what every rank sees when any rank's call is invalid (docs/faults.md, "Ranks whose calls differ").
 * The rule: no rank ever returns ZCCL_SUCCESS with output that is not this call's, and no rank waits forever for it.
 *  - Without a communicator (comm NULL) a call just returns its error; nothing else happens.
 *  - A call refused by its own argument check on a valid communicator of several ranks returns its error at once
 *    (ZCCL_INVALID_ARGUMENT naming the argument), but still counts as the communicator's next collective, on the
 *    stream it was meant for, and tells every peer why. A peer that made the valid call fails it with
 *    ZCCL_REMOTE_ERROR "rank R refused its call #k ...: <R's message>", also where its part needs no data from R
 *    (a reduce or gather non-root, a scatter's root, a broadcast rank upstream of R: rooted collectives wait for
 *    every peer's call descriptor, so the call cannot complete before R made or refused it). From
 *    then on the communicator is broken on every rank, R included (zccl_comm_get_async_error). If every rank refuses
 *    the same call, nothing moved and the communicator stays usable. A refused zccl_send/zccl_recv breaks it likewise.
 *  - With ZCCL_CHECK=1 a refused collective joins the check, marked invalid: every rank fails that call before any
 *    data moves (the others with ZCCL_INVALID_USAGE naming R and its reason) and the communicator stays usable.
 *  - count 0 is a call like any other: it moves nothing but takes its place in the sequence and in the check.
 *  - Calls that differ (collective, datatype, op, count, root, or a rank one call ahead): every collective opens
 *    each channel with a 32-byte descriptor of the call, checked on receipt. The rank that receives a differing one
 *    fails with ZCCL_INVALID_USAGE naming both calls ("rank 0 called #5 zccl_allreduce(count 64, float32, op sum),
 *    rank 2 called #5 zccl_allreduce(count 64, int32, op sum)"); the others fail with ZCCL_REMOTE_ERROR quoting it;
 *    the communicator is broken. Broadcast, reduce, gather and scatter send the descriptor to every peer, so ranks
 *    that exchange no data in the call (two ranks that both believe they are a broadcast's root) fail that call on
 *    every rank, naming both roots (ZCCL_CHECK=-1 leaves that exchange out, for latency: such ranks then fail only
 *    at their next call). ZCCL_CHECK=1 catches all of these before any data moves.
 */

/**
 * All-reduce: recvbuf[i] = op over ranks r of sendbuf_r[i], for 0 <= i < count, on every rank.
 * Algorithm: chosen per call by the tuner (docs/tuning.md; ZCCL_ALGO restricts it): ring reduce-scatter + ring
 * all-gather (Patarasuk & Yuan, JPDC 2009), Rabenseifner halving/doubling, recursive doubling, double binary tree,
 * direct or hierarchical. All ranks receive bitwise-identical results whichever runs.
 * @param sendbuf  count elements. In place when sendbuf == recvbuf.
 * @param recvbuf  count elements.
 */
zccl_result_t zccl_allreduce(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                             zccl_redop_t op, zccl_comm_t comm, zccl_stream_t stream);

/**
 * Reduce-scatter: recvbuf[i] = op over ranks r of sendbuf_r[rank*recvcount + i], for 0 <= i < recvcount.
 * Rank r ends with block r of the reduced vector (ZeRO-2/3 gradient sharding).
 * @param sendbuf    nranks*recvcount elements.
 * @param recvbuf    recvcount elements. In place when recvbuf == sendbuf + rank*recvcount (in elements).
 * @param recvcount  elements each rank receives.
 */
zccl_result_t zccl_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, zccl_datatype_t datatype,
                                  zccl_redop_t op, zccl_comm_t comm, zccl_stream_t stream);

/**
 * All-gather: recvbuf[r*sendcount + i] = sendbuf_r[i] on every rank (ZeRO-3 parameter gathering).
 * @param sendbuf    sendcount elements. In place when sendbuf == recvbuf + rank*sendcount (in elements).
 * @param recvbuf    nranks*sendcount elements.
 * @param sendcount  elements each rank contributes.
 */
zccl_result_t zccl_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, zccl_datatype_t datatype,
                             zccl_comm_t comm, zccl_stream_t stream);

/**
 * Uneven reduce-scatter (NCCL has none; MPI_Reduce_scatter): rank r ends with recvcounts[r] reduced elements,
 * recvbuf[i] = op over ranks q of sendbuf_q[displ_r + i] where displ_r = recvcounts[0] + ... + recvcounts[r-1].
 * For ZeRO buckets whose size does not divide by nranks. Ring algorithm; each rank sends and receives
 * (total - its own block) elements.
 * @param sendbuf     total = sum(recvcounts) elements (the blocks back to back, rank order).
 * @param recvbuf     recvcounts[rank] elements (may be NULL when that is 0). In place when
 *                    recvbuf == sendbuf + displ_rank (in elements).
 * @param recvcounts  nranks element counts (any may be 0), identical on every rank; copied before the call returns,
 *                    so it need not outlive a queued operation (the buffers must).
 * Errors: ZCCL_INVALID_ARGUMENT as zccl_reduce_scatter, plus 'recvcounts' NULL or its sum overflowing;
 * ZCCL_INVALID_USAGE when ranks pass different counts (found by the call descriptor, or by ZCCL_CHECK=1).
 */
zccl_result_t zccl_reduce_scatter_v(const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                                    zccl_datatype_t datatype, zccl_redop_t op, zccl_comm_t comm, zccl_stream_t stream);

/**
 * Uneven all-gather (MPI_Allgatherv with contiguous blocks): recvbuf[displ_r + i] = sendbuf_r[i] for
 * 0 <= i < recvcounts[r], displ_r = recvcounts[0] + ... + recvcounts[r-1]. Ring algorithm.
 * @param sendbuf     recvcounts[rank] elements (may be NULL when that is 0). In place when
 *                    sendbuf == recvbuf + displ_rank (in elements).
 * @param recvbuf     sum(recvcounts) elements.
 * @param recvcounts  nranks element counts, identical on every rank; copied before the call returns.
 * Errors: as zccl_reduce_scatter_v.
 */
zccl_result_t zccl_allgather_v(const void *sendbuf, void *recvbuf, const size_t *recvcounts, zccl_datatype_t datatype,
                               zccl_comm_t comm, zccl_stream_t stream);

/**
 * Broadcast: recvbuf = root's sendbuf on every rank. Pipelined chain along the ring.
 * @param sendbuf  count elements, read on the root only (may be NULL elsewhere). In place when sendbuf == recvbuf.
 * @param recvbuf  count elements on every rank.
 * @param root     0 <= root < nranks.
 */
zccl_result_t zccl_broadcast(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype, int root,
                             zccl_comm_t comm, zccl_stream_t stream);

/**
 * Reduce: root's recvbuf[i] = op over ranks r of sendbuf_r[i]. Pipelined chain along the ring ending at root.
 * @param sendbuf  count elements on every rank. In place when sendbuf == recvbuf (on the root).
 * @param recvbuf  count elements, written on the root only (may be NULL elsewhere).
 * @param root     0 <= root < nranks.
 */
zccl_result_t zccl_reduce(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                          zccl_redop_t op, int root, zccl_comm_t comm, zccl_stream_t stream);

/**
 * Point-to-point send of count elements to rank peer; matched, in order, by zccl_recv on peer with the same
 * count and datatype. Messages between two ranks arrive in the order they were sent. Outside a group a blocking
 * send of a large message may wait until the peer has posted the matching receive, so two ranks that exchange
 * data must order their calls (one sends first while the other receives first) or, simpler, put the sends and
 * receives in one group (zccl_group_start): grouped transfers progress together in any posting order.
 * @param peer  0 <= peer < nranks. peer == the caller's rank (a local copy) is allowed only inside a group, where
 *              the send is matched by a zccl_recv from the caller's rank with the same count and datatype in the
 *              same group; outside a group it is ZCCL_INVALID_ARGUMENT naming 'peer' ("a send to oneself completes
 *              only against a zccl_recv from oneself in the same group").
 */
zccl_result_t zccl_send(const void *sendbuf, size_t count, zccl_datatype_t datatype, int peer, zccl_comm_t comm,
                        zccl_stream_t stream);

/** Point-to-point receive of count elements from rank peer into recvbuf (count elements). See zccl_send; peer ==
 *  the caller's rank only inside a group, matched by a zccl_send to oneself there. */
zccl_result_t zccl_recv(void *recvbuf, size_t count, zccl_datatype_t datatype, int peer, zccl_comm_t comm,
                        zccl_stream_t stream);

/** Returns once every rank of comm has entered the barrier (a one-element all-reduce). */
zccl_result_t zccl_barrier(zccl_comm_t comm, zccl_stream_t stream);

/* ---- group calls (NCCL's ncclGroupStart / ncclGroupEnd) ----------------------------------------------------- */

/**
 * Opens a group: collectives and send/recv issued until the matching zccl_group_end() are validated and recorded,
 * not run; they return ZCCL_SUCCESS at once and must not be waited for individually. Groups nest: a depth counter
 * counts zccl_group_start calls and only the outermost zccl_group_end runs the group. A group belongs to the
 * calling thread. See docs/groups.md.
 * Errors: ZCCL_INVALID_USAGE if the nesting depth would exceed 1024.
 */
zccl_result_t zccl_group_start(void);

/**
 * Closes a group; the outermost call posts every recorded operation together. All send/recv of the group on one
 * communicator form one combined schedule whose transfers the engine progresses concurrently, so sends and receives
 * between two ranks may be recorded in any order on either side (an all-to-all written as n receives then n sends
 * cannot deadlock); a send to oneself is copied into the matching receive from oneself. Collectives of the group run
 * after that, in the order they were recorded. Operations on several communicators may share a group: each
 * communicator's part runs in turn (all its send/recv together, then its collectives), in the order in which
 * each communicator first appeared in the group, so every rank must use the communicators of a group in the same
 * order of first use (as with separate calls).
 * Streams: the group runs where its operations were issued. If every operation of a communicator named the same
 * stream, that communicator's part is queued on it as one operation and this call returns once it is queued
 * (synchronize the stream to wait); operations with a NULL stream run before zccl_group_end returns. The
 * operations of one communicator in a group must all name the same stream (NULL included), else
 * ZCCL_INVALID_USAGE. Creating a communicator inside a group runs at once (not deferred to the group's end).
 * Errors: ZCCL_INVALID_USAGE without a matching zccl_group_start, or for a self send/recv without its counterpart
 * in the group; any error of a recorded operation, with the message naming it: "zccl_group_end: call 3 (zccl_send
 * to peer 2, count 1024): ..." (calls numbered from 1 in recording order). A group whose transfers fail part-way
 * breaks the communicator as a failed collective would (zccl_comm_get_async_error). Argument errors of a call made
 * inside the group are returned by that call itself, as outside a group, and the call is not recorded.
 */
zccl_result_t zccl_group_end(void);

/* ---- all-to-all, gather, scatter ----------------------------------------------------------------------------- */

/**
 * All-to-all: rank r sends block q of its sendbuf to rank q, and recvbuf[q*count + i] = sendbuf_q[r*count + i]
 * (as ncclAllToAll / MPI_Alltoall). Direct (pairwise) algorithm: in one phase every rank sends to and receives from
 * every peer, the own block is a local copy.
 * @param sendbuf  nranks*count elements: block q (count elements at sendbuf + q*count) goes to rank q.
 * @param recvbuf  nranks*count elements: block q comes from rank q. In place when sendbuf == recvbuf (the blocks
 *                 are staged through the communicator's scratch memory); other overlaps are ZCCL_INVALID_ARGUMENT.
 * @param count    elements sent to, and received from, EACH rank (not the total).
 */
zccl_result_t zccl_alltoall(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                            zccl_comm_t comm, zccl_stream_t stream);

/**
 * All-to-all with per-peer counts and displacements (MPI_Alltoallv; NCCL users write it as grouped send/recv).
 * Rank r sends sendcounts[q] elements starting at sendbuf + sdispls[q] to rank q, and receives recvcounts[q]
 * elements from rank q into recvbuf + rdispls[q]. sendcounts[q] on rank r must equal recvcounts[r] on rank q
 * (a mismatch is not detected: the data is then wrong or the call fails with ZCCL_TIMEOUT / ZCCL_REMOTE_ERROR
 * naming the peer, as in MPI).
 * @param sendcounts, sdispls, recvcounts, rdispls  nranks entries each, in ELEMENTS; copied before the call
 *                 returns, so they need not outlive a queued operation (the buffers must). Any count may be 0.
 * @param sendbuf  must hold every [sdispls[q], sdispls[q] + sendcounts[q]) range; may be NULL if all are empty.
 * @param recvbuf  must hold every [rdispls[q], rdispls[q] + recvcounts[q]) range; the received ranges must not
 *                 overlap each other. May be NULL if all are empty. Not in place: sendbuf's and recvbuf's used
 *                 ranges must not overlap (ZCCL_INVALID_ARGUMENT).
 * Errors: the common ones, plus ZCCL_INVALID_ARGUMENT naming a NULL array, the entry whose displacement + count
 * overflows, two received ranges that overlap (or a received and a sent one), or sendcounts[rank] !=
 * recvcounts[rank] (the block a rank sends itself).
 */
zccl_result_t zccl_alltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                             const size_t *recvcounts, const size_t *rdispls, zccl_datatype_t datatype,
                             zccl_comm_t comm, zccl_stream_t stream);

/**
 * Gather: root's recvbuf[q*count + i] = sendbuf_q[i] (as ncclGather / MPI_Gather). Direct algorithm: every rank
 * sends its block to the root, which receives all blocks in one phase.
 * @param sendbuf  count elements on every rank. On the root, in place when sendbuf == recvbuf + root*count.
 * @param recvbuf  nranks*count elements, significant on the root only (may be NULL elsewhere).
 * @param count    elements each rank contributes.
 * @param root     0 <= root < nranks.
 */
zccl_result_t zccl_gather(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype, int root,
                          zccl_comm_t comm, zccl_stream_t stream);

/**
 * Scatter: recvbuf_q[i] = root's sendbuf[q*count + i] (as ncclScatter / MPI_Scatter). Direct algorithm: the root
 * sends block q to rank q, all in one phase.
 * @param sendbuf  nranks*count elements, significant on the root only (may be NULL elsewhere).
 * @param recvbuf  count elements on every rank. On the root, in place when recvbuf == sendbuf + root*count.
 * @param count    elements each rank receives.
 * @param root     0 <= root < nranks.
 */
zccl_result_t zccl_scatter(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype, int root,
                           zccl_comm_t comm, zccl_stream_t stream);

/* ---- user-defined reductions: PreMulSum (NCCL's ncclRedOpCreatePreMulSum) ------------------------------------- */

/** Where the scalar of zccl_redop_create_premulsum lives (values of NCCL's ncclScalarResidence_t). */
typedef enum {
    ZCCL_SCALAR_DEVICE = 0,         /**< pointer kept and read when each operation is issued (NCCL: GPU memory;
                                         this build: host memory only). */
    ZCCL_SCALAR_HOST_IMMEDIATE = 1  /**< pointer to host memory read once, by zccl_redop_create_premulsum. */
} zccl_scalar_residence_t;

/**
 * Creates a reduction "sum of (scalar * x)": result = sum over ranks r of (scalar * x_r), where each product is
 * computed in the datatype's precision (integers: wrapping multiplication; float16/bfloat16/fp8: the product is
 * rounded to the type, then the sum proceeds as ZCCL_SUM), as NCCL does. Use it for averaging with a weight
 * (scalar = 1/nranks) in one pass. The handle is valid for `datatype` on `comm` only, until zccl_redop_destroy.
 * @param[out] op   the new handle: ZCCL_NUM_OPS (5), 6, ... (freed numbers are reused).
 * @param scalar    points to one element of `datatype`.
 * @param residence ZCCL_SCALAR_HOST_IMMEDIATE: *scalar is read now. ZCCL_SCALAR_DEVICE: the pointer is kept and
 *                  *scalar is read each time an operation with the handle is issued (called, or recorded in a
 *                  group); it must be host memory in this build (a pointer this process cannot read:
 *                  ZCCL_INVALID_ARGUMENT "device-resident scalars need GPU memory support").
 * Use: pass the handle as the `op` of zccl_allreduce, zccl_reduce, zccl_reduce_scatter or zccl_reduce_scatter_v
 * with the same datatype and communicator; a handle used with another datatype, on another communicator or after
 * zccl_redop_destroy is ZCCL_INVALID_ARGUMENT naming 'op' and saying which.
 * Errors: ZCCL_INVALID_ARGUMENT naming op/scalar/datatype/residence/comm; ZCCL_SYSTEM_ERROR (out of memory).
 */
zccl_result_t zccl_redop_create_premulsum(zccl_redop_t *op, void *scalar, zccl_datatype_t datatype,
                                          zccl_scalar_residence_t residence, zccl_comm_t comm);

/**
 * Frees a handle made by zccl_redop_create_premulsum on comm. Operations already issued with it (queued on a
 * stream or in an open group) keep their copy of the scalar. Errors: ZCCL_INVALID_ARGUMENT for comm NULL, a
 * built-in op (ZCCL_SUM..ZCCL_AVG), a handle of another communicator or one already destroyed (the message says which).
 */
zccl_result_t zccl_redop_destroy(zccl_redop_t op, zccl_comm_t comm);

/* ---- algorithm choice (docs/tuning.md) ---------------------------------------------------------------------- */

/**
 * Lists the algorithms that can run a collective on comm (available for its rank layout, whatever ZCCL_ALGO
 * allows), as a comma-separated list of ZCCL_ALGO names ("ring,direct").
 * @param collective  "allreduce", "reducescatter", "allgather", "broadcast" or "reduce" (NCCL_ALGO's spelling;
 *                    "all_reduce", "reduce_scatter", "all_gather", "bcast" also accepted; case-insensitive).
 * @param names       receives the NUL-terminated list; len: its size in bytes.
 * Errors: ZCCL_INVALID_ARGUMENT for a NULL comm/collective/names, len 0 or too small, an unknown collective.
 */
zccl_result_t zccl_comm_algorithms(zccl_comm_t comm, const char *collective, char *names, size_t len);

/**
 * Restricts the algorithms comm's tuner may choose, with ZCCL_ALGO's grammar (NCCL_ALGO's): "ring,direct",
 * "^direct", "allreduce:ring;reducescatter:^ring". NULL or "" goes back to ZCCL_ALGO. Collective: every rank of
 * comm must call it with the same spec, with no operation of comm queued on a stream; it then applies to every
 * operation issued afterwards. Errors (on every rank): ZCCL_INVALID_ARGUMENT for a NULL comm or a spec that does
 * not parse (the message names the token and lists valid names) or names an algorithm that cannot run on comm
 * (e.g. a hierarchical one on a single host); ZCCL_INVALID_USAGE if the ranks passed different specs or a stream
 * still holds operations of comm; errors of the all-reduce that checks agreement.
 */
zccl_result_t zccl_comm_set_algo(zccl_comm_t comm, const char *spec);

/**
 * The algorithm comm's tuner would choose for a collective over `bytes` bytes (the whole vector: count x type size
 * for allreduce/broadcast/reduce, count x type size x nranks for reducescatter/allgather), and its predicted time.
 * @param name          receives the algorithm's name (NUL-terminated, at most len bytes).
 * @param predicted_us  if non-NULL, receives the model's predicted time in microseconds.
 * Errors: ZCCL_INVALID_ARGUMENT for NULL comm/collective/name, len 0 or too small, an unknown collective.
 */
zccl_result_t zccl_comm_algo_choice(zccl_comm_t comm, const char *collective, size_t bytes, char *name, size_t len,
                                    double *predicted_us);

/**
 * Describes every ZCCL_* environment setting, one per line: "NAME=value-in-force (default D): description".
 * Writes at most len bytes including the terminating NUL into buf (buf may be NULL when len is 0).
 * Returns the number of characters the full text needs, excluding the NUL (as snprintf does).
 */
size_t zccl_config_describe(char *buf, size_t len);

/**
 * Checks the ZCCL_* settings in the environment the way communicator creation reads them, without creating one:
 * numbers against their ranges, names against their lists, ZCCL_ALGO with the tuner's parser. (Interface and
 * device lists and file names are checked against the machine only at creation.) Writes one line per finding into
 * buf: "invalid: " and a reason naming the variable and its value, for a value creation would refuse (or, for
 * ZCCL_DEBUG and ZCCL_DEBUG_SUBSYS, ignore with a warning); "unknown: NAME=value: ..." for a ZCCL_*
 * variable the library does not read (a misspelling such as ZCCL_ALOG; not counted as invalid). At most len bytes
 * including the NUL are written (buf may be NULL when len is 0).
 * @param ninvalid  if non-NULL, receives the number of invalid settings (0: creation will accept them all).
 * @return the number of characters the full text needs, excluding the NUL (as snprintf does); 0: nothing to report.
 */
size_t zccl_config_check(char *buf, size_t len, int *ninvalid);

/** Size in bytes of one element of datatype, or 0 if datatype is out of range. */
size_t zccl_type_size(zccl_datatype_t datatype);

/* ---- zccl-allocated buffers (the shapes of ncclMemAlloc / ncclMemFree / ncclCommRegister / ncclCommDeregister) ----
 *
 * A collective whose buffers were registered with zccl_comm_register on EVERY rank of a communicator whose ranks all
 * share one host (shared-memory transport) runs in one pass straight out of the peers' buffers, with no staging
 * copy: all-reduce, reduce-scatter, all-gather and broadcast of at least ZCCL_SHM_REG_MIN_BYTES bytes (the whole
 * vector; default 32 KiB), in place or not. Host buffers qualify when allocated by zccl_mem_alloc; CUDA device
 * buffers when allocated by cudaMalloc/cuMemAlloc (shared with the peers through CUDA IPC, their kernels reading the
 * buffers in place; several ranks may use one GPU; docs/gpu.md "CUDA IPC"). Every rank's buffers must be of the same
 * kind. If any rank's buffer does not qualify the call takes the normal path, with the same results; so registering
 * is only ever an optimisation.
 * Every rank's registered buffers may be read and written by its peers while a collective that uses them runs, and
 * only then: the call returns when no peer touches them any more.
 */

/**
 * Allocates `bytes` bytes (rounded up to whole pages; 0 gives one page) of host memory that the other processes
 * of this host can map: a POSIX shared-memory object named /zccl-mem-<id>-p<pid>, mapped shared and read and write,
 * page-aligned, zero-filled and already faulted in. The name exists until zccl_mem_free (a process that dies
 * leaves it; the next communicator created on the host removes it an hour later).
 * Errors: ZCCL_INVALID_ARGUMENT (ptr NULL); ZCCL_SYSTEM_ERROR (shm_open, ftruncate or mmap failed, or /dev/shm has no
 * room for the pages: they are reserved here, so a full /dev/shm fails this call instead of raising SIGBUS at a
 * later write; the message names which and why).
 */
zccl_result_t zccl_mem_alloc(void **ptr, size_t bytes);
/** Frees memory from zccl_mem_alloc. ptr NULL: nothing. Errors: ZCCL_INVALID_ARGUMENT (ptr is not the start of a
 *  zccl_mem_alloc block, or was freed already). Deregister it from every communicator first: deregistering closes
 *  the peers' mappings of it, so its pages return to the system when it is freed. */
zccl_result_t zccl_mem_free(void *ptr);
/**
 * Registers [buf, buf + bytes) with comm, locally (no communication; ranks may register in any order). buf is host
 * or CUDA device memory. A collective on comm uses the direct path for a buffer lying entirely inside a registered
 * range that is also inside one zccl_mem_alloc block (host) or one cudaMalloc/cuMemAlloc allocation (device: its
 * CUDA IPC handle is taken here, once per allocation, shared by the registrations inside it); a range elsewhere
 * (malloc'd memory, device memory that cannot be exported such as cuMemCreate's) is accepted and recorded but never
 * enables it. Overlapping registrations are allowed. *handle identifies the registration for zccl_comm_deregister.
 * Peers map a registered buffer (its whole zccl_mem_alloc block, or its whole CUDA allocation through CUDA IPC) the
 * first time a collective uses it and keep it mapped until it is deregistered or comm is destroyed; free the memory
 * only after one of those (CUDA leaves freeing an allocation another process still has open undefined).
 * Errors: ZCCL_INVALID_ARGUMENT (comm, buf or handle NULL, bytes 0); ZCCL_SYSTEM_ERROR (out of memory, or the CUDA
 * pointer query failed).
 */
zccl_result_t zccl_comm_register(zccl_comm_t comm, void *buf, size_t bytes, void **handle);
/**
 * Ends a registration. If a collective published it (ran, or offered to run, on the direct path), every peer is
 * told over the communicator's connection service to close its mapping of the zccl_mem_alloc block or CUDA allocation
 * the range lies in, and has closed it when this returns (about a millisecond per peer), so the memory may be freed
 * then (a peer that still needs another registration in the same block maps it again at its next call). Local to this
 * rank: the peers need not call anything. Destroying the communicator ends all of its registrations.
 * Errors: ZCCL_INVALID_ARGUMENT (comm NULL, or handle not a live registration of comm); ZCCL_INVALID_USAGE (a
 * collective running now on comm, on a stream or another thread, uses the registration: nothing changed, call again
 * once it completed); ZCCL_REMOTE_ERROR (some live peer could not be told within about 2 s: the registration is gone,
 * but free the memory only after destroying comm).
 */
zccl_result_t zccl_comm_deregister(zccl_comm_t comm, void *handle);


/* ------------------------------------------------------------------------------------------------------------ */
/* Quantized collectives (ZeRO++'s qwZ and qgZ in the library; docs/zero.md, "Quantized collectives")           */
/* ------------------------------------------------------------------------------------------------------------ */

/**
 * Wire formats of the quantized collectives: what the bytes between ranks are, chosen per call. Source: ZeRO++
 * (Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant Model Training", 2023): qwZ
 * all-gathers weights as block-quantized int8, qgZ reduce-scatters gradients as block-quantized int4 through an
 * all-to-all followed by a local reduction. Every quantized format cuts a vector into blocks of B consecutive
 * elements (B = ZCCL_QUANT_BLOCK, default 128, even, the same on every rank; the last block of a shard may be
 * shorter) and sends one float32 scale s_b = amax_b / Q per block, amax_b = max |x_i| over the block, with one code
 * per element: x_i is sent as code_i = round(x_i / s_b) and received as x^_i = s_b * code_i (float32).
 *
 * Error of one quantization of element x_i (in float32 arithmetic; u = 2^-24; amax = amax_b of x_i's block):
 *   int8  (Q = 127, codes -127..127, 1 byte):            E(x_i) = amax / 254          + 2^-21 amax + 2^-140
 *   int4  (Q = 7, codes -7..7, half a byte):              E(x_i) = amax / 14           + 2^-21 amax + 2^-140
 *   fp8e4m3 (Q = 448, OCP E4M3 codes, 1 byte):            E(x_i) = 2^-4 |x_i| + 2^-10 amax / 448   + 2^-21 amax + 2^-140
 *   fp8e5m2 (Q = 57344, OCP E5M2 codes, 1 byte):          E(x_i) = 2^-3 |x_i| + 2^-17 amax / 57344 + 2^-21 amax + 2^-140
 * (the first term is half a step of the code grid: 1/(2Q) of amax for the integer codes, half an ulp of the fp8 code
 * relative to |x_i| plus half the spacing of its subnormals; 2^-21 amax covers float32 rounding of the scale, the
 * quotient and the product; 2^-140 covers blocks whose scale is subnormal or rounds to zero.)
 * Wire bytes of a shard of n elements: a 16-byte header (the call's count, the wire, B), then 4 * ceil(n / B) + n
 * (int8, fp8) or ceil(n / 2) (int4), rounded up to a multiple of 8 (zccl_wire_bytes). For B = 128: int8 sends 25.8% of float32's bytes and 51.6% of float16's, int4 13.3% and
 * 26.6%.
 *
 * NaN and infinity propagate, at block granularity: a block holding a NaN or an infinity is sent with the scale NaN,
 * and every element of that block arrives as NaN (an infinity arrives as NaN, not as an infinity). A reduction over
 * such a block gives NaN in that block of the result. So an overflow check on the output (loss scaling) still sees it.
 *
 * Output conversion: the result is computed in float32 and narrowed once to the call's datatype, which adds
 * u_out * |y| + a_out to the bound of an element of magnitude |y| (float32 and float64: 0; float16: u_out = 2^-11,
 * a_out = 2^-25; bfloat16: u_out = 2^-8, a_out = 2^-134). Float16 results beyond 65504 overflow to infinity.
 *
 * Float64 data is rounded to float32 on the way in (x'_i, to nearest), then encoded as float32 data is, and the
 * float32 result widens exactly. Each quantization of a float64 input therefore has the bound
 *   E64(x_i) = (1 + 2^-24) E(x_i) + 2^-24 |x_i|
 * with E and amax as above over the exact values (E is monotone in |x| and amax, and rounding grows each by at
 * most a factor 1 + 2^-24); use E64 for E_q,i in the reductions below. A float64 value beyond float32's range
 * (3.4e38) rounds to infinity, so its block arrives as NaN. The hierarchical calls (zccl_hier.h) do not take
 * float64.
 */
typedef enum {
    ZCCL_WIRE_FULL = 0,    /**< full precision: the call is exactly zccl_allgather / _reduce_scatter / _allreduce */
    ZCCL_WIRE_INT8 = 1,    /**< block-quantized int8 (qwZ's weight format) */
    ZCCL_WIRE_INT4 = 2,    /**< block-quantized int4 (qgZ's gradient format) */
    ZCCL_WIRE_FP8E4M3 = 3, /**< OCP fp8 E4M3 codes with a per-block scale (relative error, 3 mantissa bits) */
    ZCCL_WIRE_FP8E5M2 = 4, /**< OCP fp8 E5M2 codes with a per-block scale (2 mantissa bits) */
    ZCCL_NUM_WIRES = 5
} zccl_wire_t;

/**
 * Common rules of the three _wire calls.
 *  - datatype: ZCCL_FLOAT32, ZCCL_FLOAT64, ZCCL_FLOAT16 or ZCCL_BFLOAT16 with a quantized wire (any datatype with
 *    ZCCL_WIRE_FULL);
 *    op (reductions): ZCCL_SUM or ZCCL_AVG (AVG divides the float32 sum by nranks once, before any requantization).
 *  - Buffers: host memory (CUDA device memory is refused with ZCCL_INVALID_ARGUMENT naming the buffer). Counts are
 *    elements. Out of place, or in place at the position named for each call; other overlaps are refused.
 *  - stream: NULL runs the call now. A stream: the call first waits for the work already queued on that stream
 *    (zccl_stream_synchronize), then runs at once, and has completed when it returns.
 *  - Every rank gets bitwise-identical output (all-gather, all-reduce): each rank decodes the same wire bytes,
 *    its own contribution included (the owner of a shard uses the decoded value of what it sent, not its input).
 *  - Every rank passes the same wire (a different wire is a different datatype of the inner call, so the ranks fail
 *    naming both calls, as for any calls that differ), and ZCCL_QUANT_BLOCK must be the same on every rank. Every
 *    wire string carries the call's count, wire and B, which every receiving rank checks: ranks whose counts or B differ
 *    all fail with ZCCL_INVALID_USAGE naming both calls, before any output is written (the communicator stays usable).
 *  - Not from inside a stream's own thread (a ZeRO plan's completion hook): the call waits for that stream.
 *  - Internally a call is two or three collectives of the communicator (each takes a sequence number).
 *  - Memory: the wire strings (sent and received: 2 x nranks strings of a shard, zccl_wire_bytes) and a
 *    reduction's float32 sums (one shard) live in a scratch area of the communicator, kept between calls and grown
 *    to the largest call's need, freed by zccl_comm_destroy / zccl_comm_abort (reusing faulted-in pages made a
 *    2-rank int8 reduce-scatter 2.7-9x faster from 4 to 64 MiB than allocating per call; docs/performance.md,
 *    "Quantized collectives between hosts on a quiet machine").
 *  Errors: the common ones (see "Collectives"), plus ZCCL_INVALID_ARGUMENT naming 'wire' (out of range), 'datatype'
 *  (not a float type the formats take), 'op' (not SUM or AVG with a quantized wire), 'count' (its wire size
 *  overflows), a device buffer or overlapping buffers; ZCCL_SYSTEM_ERROR (out of memory for the wire buffers). A
 *  call refused on one rank fails on every rank (the peers with ZCCL_REMOTE_ERROR quoting the reason), as "Invalid
 *  calls" above says.
 */

/**
 * Quantized all-gather (qwZ): recvbuf[r*sendcount + i] = x^ of sendbuf_r[i] on every rank: each rank encodes its
 * sendcount elements once (blocks of B from its sendbuf[0]), the wire strings are all-gathered, every rank decodes
 * all of them. One quantization: |recvbuf[r*sendcount + i] - sendbuf_r[i]| <= E(sendbuf_r[i]) + the output
 * conversion, with amax over sendbuf_r's block of i.
 * @param sendbuf    sendcount elements. In place when sendbuf == recvbuf + rank*sendcount (in elements).
 * @param recvbuf    nranks*sendcount elements.
 * @param sendcount  elements each rank contributes.
 * @param wire       the format; ZCCL_WIRE_FULL calls zccl_allgather.
 */
zccl_result_t zccl_allgather_wire(const void *sendbuf, void *recvbuf, size_t sendcount, zccl_datatype_t datatype,
                                  zccl_wire_t wire, zccl_comm_t comm, zccl_stream_t stream);

/**
 * Quantized reduce-scatter (qgZ's shape, one hop): every rank encodes each of its nranks blocks of recvcount
 * elements separately (blocks of B from each block's first element), one all-to-all delivers block r of every rank
 * to rank r, which decodes them and adds them in float32 in rank order 0, 1, ..., nranks-1, then narrows once.
 * With S_i = sum over ranks q of x_q,i (x_q,i = sendbuf_q[rank*recvcount + i]) and E_q,i = E(x_q,i) over x_q,i's
 * block, for ZCCL_SUM:
 *   |recvbuf[i] - S_i| <= R_i = sum_q E_q,i + (nranks-1) * 2^-24 * sum_q (|x_q,i| + E_q,i), plus the output conversion;
 * for ZCCL_AVG the bound and the sum are divided by nranks, plus 2^-24 |S_i| / nranks.
 * @param sendbuf    nranks*recvcount elements.
 * @param recvbuf    recvcount elements. In place when recvbuf == sendbuf + rank*recvcount (in elements).
 * @param recvcount  elements each rank receives.
 */
zccl_result_t zccl_reduce_scatter_wire(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire,
                                       zccl_comm_t comm, zccl_stream_t stream);

/**
 * Quantized all-reduce = the quantized reduce-scatter above, then the quantized all-gather of its float32 results
 * (two quantizations: "hops" = 2). The vector is cut into nranks shards of L = ceil(count / nranks) elements
 * (shard q = elements [q*L, min((q+1)*L, count)), the last ones shorter or empty), blocks of B start at each
 * shard's first element. Rank q reduces shard q as zccl_reduce_scatter_wire does, giving z_i (float32; AVG divided),
 * encodes it and all ranks decode the same bytes:
 *   |recvbuf[i] - S_i| <= R_i + E(z_i), with E's amax = max |z_j| over z_i's block <= max_j (|S_j| + R_j),
 * plus the output conversion (S_i, R_i as for reduce-scatter, AVG scaled). Bitwise identical on every rank.
 * @param sendbuf  count elements. In place when sendbuf == recvbuf.
 * @param recvbuf  count elements.
 */
zccl_result_t zccl_allreduce_wire(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                  zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm, zccl_stream_t stream);

/**
 * Bytes that one shard of count elements takes on the wire in format wire with the block size in force
 * (ZCCL_QUANT_BLOCK): 16 (header) + 4 * ceil(count / B) + payload, rounded up to 8 (see zccl_wire_t). ZCCL_WIRE_FULL: 0 (the
 * datatype decides). 0 for a wire out of range; SIZE_MAX when the size overflows.
 */
size_t zccl_wire_bytes(zccl_wire_t wire, size_t count);

/** "full", "int8", "int4", "fp8e4m3", "fp8e5m2"; NULL for a value out of range. */
const char *zccl_wire_name(zccl_wire_t wire);

#ifdef __cplusplus
}
#endif
#endif /* ZCCL_H */

/*
 * comm.h — the communicator: who the ranks are, where they live, and how this rank reaches each of them.
 */
#ifndef ZCCL_COMM_H
#define ZCCL_COMM_H

#include <pthread.h>
#include "core.h"
#include "mem.h"
#include "socket.h"
#include "topo.h"
#include "transport.h"
#include "calldesc.h"
#include "schedule.h"


typedef struct {
    uint64_t shrink_seq;  /* which shrink of this communicator (every survivor counts its calls) */
    zccl_sockaddr_t root; /* the new bootstrap root, run by the lowest surviving rank */
} zccl_shrink_msg_t;

struct zccl_comm {
    /* What the transports see of this communicator (transport/transport.h): peers, per-peer transport, accepted
     * connections, transport state, the wake-up word, the bounce buffer, the abort and broken flags. */
    zccl_tp_comm_t tc;
    int rank, nranks;        /* the same as tc.rank, tc.nranks */
    int *ring;                       /* ring order: ring[i] = rank at position i (same on every rank) */
    zccl_sched_cache_t sched_cache;  /* schedules of recent calls (op_run, under exec_mutex) */
    int64_t reg_min_bytes;           /* ZCCL_SHM_REG_MIN_BYTES, read at init (lib/core/regmem.c) */
    struct {                         /* the staged one-pass path (lib/core/regmem.c) */
        bool ok;                     /* set up on every rank */
        uint64_t seq;                /* staged calls so far */
        size_t cap, min;             /* bytes: ZCCL_SHM_STAGED_MAX_BYTES, ZCCL_SHM_STAGED_MIN_BYTES */
        void *mine;                  /* this rank's staging region (zccl_mem_alloc) */
        uint8_t **base;              /* every rank's region as mapped here (nranks entries) */
    } stg;

    /* Listening socket and the service thread that admits authenticated incoming connections. */
    int listen_fd;
    int stop_pipe[2];
    pthread_t service_thread;
    bool service_running;

    /* Progress engine. */
    pthread_mutex_t exec_mutex; /* one operation executes at a time */
    uint64_t seq;               /* the running call's number in messages: its collective number (cseq); a send or
                                   receive counts with the next collective */
    void *scratch;
    size_t scratch_bytes;
    zccl_mem_type_t call_mem;   /* the running call's memory type (mem), set by the API layer */
    zccl_mem_stage_t mem_stage; /* staging of calls on device memory (mem/mem_stage.c) */
    void *gdr_bounce;           /* GDR calls: device memory the receives of a reduction land in (engine_gdr.c) */
    size_t gdr_bounce_bytes;
    void *gdr_scratch;          /* the device scratch last registered for a GDR call (dropped when it moved) */
    uint64_t spin_ns;           /* how long a waiting rank polls before sleeping (ZCCL_SPIN_US) */
    uint64_t stream_spin_ns;    /* how long an idle stream or a synchronize polls (ZCCL_STREAM_SPIN_US) */
    size_t rs_round_bytes;      /* ZCCL_RS_ROUND_BYTES, read once at init */
    struct zccl_tuner *tuner;   /* algorithm choice: parameters, layout, ZCCL_ALGO (lib/tuner/tuner.h) */
    bool check;                 /* ZCCL_CHECK=1: verify that ranks call matching collectives */
    bool rooted_desc;           /* ZCCL_CHECK >= 0: rooted collectives exchange every pair's descriptor (engine.c) */
    const char *op_name;        /* the collective running now, for error messages */
    int64_t timeout_ms;
    /* zccl_comm_shrink: the service thread records where the lowest survivor's new root listens. */
    pthread_cond_t shrink_cv;
    bool shrink_known;
    zccl_shrink_msg_t shrink_msg;
    uint64_t shrinks;          /* zccl_comm_shrink calls made on this communicator */
    uint64_t splits;           /* zccl_comm_split calls made on this communicator */
    char async_msg[512];       /* the text of tc.async_error (first remote error or timeout) */
    /* Invalid calls (notice.c, include/zccl.h "Invalid calls"). */
    uint64_t cseq;             /* collectives run or refused (send/recv not counted: only some ranks take part) */
    uint64_t cseq_init;        /* cseq when init returned (its own barrier, calibration and warm-up): messages number
                                  collectives from the user's first (zccl__seq_shown); the wire keeps cseq */
    uint32_t notice_gen;       /* bumped by the service thread for every notice received */
    uint32_t notice_seen;      /* notice_gen when the notices were last found not to apply */
    struct zccl_notice_node *notices; /* peers' notices (tc.in_mutex) */
    uint64_t *refused_here;    /* sequence numbers of the calls this rank refused (tc.in_mutex) */
    size_t nrefused, refused_cap;
    bool notice_learned;       /* this rank's failure came from a peer's notice: the peers know already */
    /* Call descriptors sent first on every channel of a collective (engine.c). */
    bool desc_on;
    zccl_call_desc_t desc_mine;
    zccl_call_desc_t *desc_in; /* per peer: the descriptor received from it */
    uint64_t *desc_mark;       /* per peer: [2r] run that sent to r, [2r+1] run that received from r */
    uint64_t desc_run;
    /* zccl_config_t (lib/api/comm_config.c) */
    char name[64];             /* comm_name: shown in log lines and messages; "" = none */
    bool nonblocking;          /* created with blocking = 0 */
    int nb_state;              /* non-blocking creation: ZCCL_IN_PROGRESS while it runs, then its result */
    bool nb_thread_running;
    pthread_t nb_thread;
    bool keep_shell;           /* zccl__comm_free frees everything but the struct (a failed non-blocking creation) */
    char nb_msg[1024];         /* the failed creation's message */
    /* The hierarchical collectives' host layout and sub-communicators, made at the first such call; owned and freed
     * by the API layer (lib/api/coll_hier.c, zccl__hier_free). */
    struct zccl_hier *hier;
    /* The quantized (_wire) calls' wire strings and float32 sums, kept between calls and grown on demand (a fresh
     * allocation per call faulted in tens of MiB of new pages each time); owned and freed by the API layer
     * (lib/api/coll_quant.c, zccl__wire_scratch_free). Calls of one communicator never run at once. */
    void *wire_scratch;
    size_t wire_scratch_bytes;
};

/* ---- the communicator's own parts (comm.c) and the setup steps of its creation (comm_setup.c) ---- */

/** The service thread's body: admits authenticated data and shrink connections on comm->listen_fd. */
void *zccl__comm_service_main(void *arg);
/** The word peers read with process_vm_readv to learn whether single-copy works between them. */
extern volatile uint64_t zccl__cma_probe_word;
/** Hashes of the settings marked must_match, as this rank sees them (published in zccl_peer_info_t). */
void zccl__comm_cfg_hashes(uint32_t out[ZCCL_CFG_MATCH_MAX]);
/** Fails naming the first must_match setting whose hash differs between two ranks. */
zccl_result_t zccl__comm_check_settings(struct zccl_comm *comm);
/** Stops the service thread, tears every transport down, closes and frees what the core attached. */
void zccl__comm_free(struct zccl_comm *comm);
/** Picks a transport per peer (comm->tc.tp). */
zccl_result_t zccl__comm_choose_transports(struct zccl_comm *comm);
/** Where this process runs (package, NUMA node, core, NIC distance); unknown when topology cannot be read. */
zccl_result_t zccl__comm_locality_self(zccl_locality_t *loc, uint64_t host);
/**
 * The GPU of this rank (the CUDA device current on the calling thread, zccl__mem_caller_gpu) and the names of the
 * NIC(s) the topology pairs it with (zccl_topo_gpu_nic_names), into tc->gpu_nic, before the transports
 * publish their endpoints: the rails with those names are where this rank starts its traffic. Advisory: without a
 * GPU, a topology or a pairing, tc->ngpu_nics is 0 and rank i of a host starts on rail i mod R. Said at INFO.
 */
void zccl__comm_gpu_rails(zccl_tp_comm_t *tc);

/** The machine model this process loaded (ZCCL_TOPO_FILE or live discovery), or NULL when it could not. */
const zccl_topo_t *zccl__comm_process_topo(void);
/** The ring order (ZCCL_RING_ORDER). */
zccl_result_t zccl__comm_choose_ring(struct zccl_comm *comm);
/** How long a waiting rank spins before it sleeps (ZCCL_SPIN_US). */
zccl_result_t zccl__comm_choose_spin(struct zccl_comm *comm);
/* Ranks competing for this rank's cores, in *sharing: `local` (the communicator's ranks on this host), or
 * ZCCL_MACHINE_RANKS when that is larger (network-namespace hosts that zcclrun runs on one machine). Fails on a bad
 * ZCCL_MACHINE_RANKS value. */
zccl_result_t zccl__cpu_ranks(int local, int *sharing);
/** Fails early when the process cannot open a socket per TCP peer. */
zccl_result_t zccl__comm_check_fd_limit(struct zccl_comm *comm);

/** The number messages give collective #seq: counted from the user's first collective (#1), however many init ran
 *  before it (which ranks agree on, so every rank shows the same number); init's own keep their wire number. */
static inline unsigned long long zccl__seq_shown(const struct zccl_comm *comm, uint64_t seq) {
    return zccl__seq_after(seq, comm->cseq_init);
}

/** After this rank gave up collective #seq (lost peer, timeout, mismatch): tells every peer why (a notice quoting
 *  comm->async_msg, notice.h) and makes the peers that may still wait on it fail too (every transport's poison op),
 *  so an error reaches every survivor instead of leaving some hanging. */
void zccl__comm_poison(struct zccl_comm *comm, uint64_t seq);

/** The message of the first error that broke comm (also declared for the ZeRO layer in lib/api/zccl_ext.h). */
const char *zccl__comm_async_msg(zccl_comm_t comm);

/** Host identity: hash of hostname and /proc boot_id. */
uint64_t zccl__host_hash(void);

/* This layer's rows of the settings table (lib/core/settings.c). */
extern const zccl_cfg_desc_t zccl__set_secret;
#define ZCCL_CFG_SECRET (&zccl__set_secret)
extern const zccl_cfg_desc_t zccl__set_init_timeout_ms;
#define ZCCL_CFG_INIT_TIMEOUT_MS (&zccl__set_init_timeout_ms)
extern const zccl_cfg_desc_t zccl__set_timeout_ms;
#define ZCCL_CFG_TIMEOUT_MS (&zccl__set_timeout_ms)
extern const zccl_cfg_desc_t zccl__set_spin_us;
#define ZCCL_CFG_SPIN_US (&zccl__set_spin_us)
extern const zccl_cfg_desc_t zccl__set_wait_yield;
#define ZCCL_CFG_WAIT_YIELD (&zccl__set_wait_yield)
extern const zccl_cfg_desc_t zccl__set_machine_ranks;
extern const zccl_cfg_desc_t zccl__set_stream_spin_us;
#define ZCCL_CFG_STREAM_SPIN_US (&zccl__set_stream_spin_us)
extern const zccl_cfg_desc_t zccl__set_stage_chunk_bytes;
#define ZCCL_CFG_STAGE_CHUNK_BYTES (&zccl__set_stage_chunk_bytes)
extern const zccl_cfg_desc_t zccl__set_stage_depth;
#define ZCCL_CFG_STAGE_DEPTH (&zccl__set_stage_depth)
extern const zccl_cfg_desc_t zccl__set_chunk_bytes;
#define ZCCL_CFG_CHUNK_BYTES (&zccl__set_chunk_bytes)
extern const zccl_cfg_desc_t zccl__set_rs_round_bytes;
#define ZCCL_CFG_RS_ROUND_BYTES (&zccl__set_rs_round_bytes)
extern const zccl_cfg_desc_t zccl__set_check;
#define ZCCL_CFG_CHECK (&zccl__set_check)
extern const zccl_cfg_desc_t zccl__set_ring_order;
#define ZCCL_CFG_RING_ORDER (&zccl__set_ring_order)
extern const zccl_cfg_desc_t zccl__set_host_id;
#define ZCCL_CFG_HOST_ID (&zccl__set_host_id)

#endif

/*
 * transport.h — the interface every transport implements: a const ops table plus the transfer descriptor the
 * progress engine hands it, and the transport's view of a communicator (zccl_tp_comm_t).
 *
 * A transport moves the bytes of one directed channel (this rank -> peer, or peer -> this rank). Channels are
 * FIFO: transfers between the same pair in the same direction complete in the order they were started, and the
 * engine starts them in schedule order on both sides, so no message carries a tag. Transports never block: each
 * progress() call does a bounded amount of work (about one chunk) and returns.
 *
 * Layer rule (docs/architecture.md): transports see util, kernels and topology below them and nothing above. They
 * never see struct zccl_comm: the communicator embeds a zccl_tp_comm_t and hands transports a pointer to it.
 * Received bytes reach the collective through zccl__xfer_deliver (transport/deliver.c), owned by this layer.
 * Adding a transport: one file with its ops table and one row in zccl__transports (transport/registry.c).
 */
#ifndef ZCCL_TRANSPORT_H
#define ZCCL_TRANSPORT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "core.h"
#include "socket.h"
#include "topo.h"

/* Settings every rank must share (lib/core/comm.c: must_match): at most this many rows. */
#define ZCCL_CFG_MATCH_MAX 32

/** Most HCA ports (rails) one rank stripes its IB connections over (transport/ib*.c). */
#define ZCCL_IB_RAILS_MAX 4

/** One IB rail of a rank: an HCA port with its rdma_cm listener and its probe buffer. */
typedef struct {
    zccl_sockaddr_t addr;  /* rdma_cm listening address: the IP of the port's interface (IPoIB or RoCE) */
    uint64_t probe_addr;   /* registered buffer (on this rail's PD) peers write the connect-time probe into */
    uint32_t probe_rkey;
    int32_t port;          /* port number on the device */
    int32_t gid_index;
    char dev[32];          /* device name, for messages */
} zccl_ib_rail_info_t;

/** How a rank can be reached over the IB verbs transport (transport/ib*.c); nrails 0 = no usable device. */
typedef struct {
    int32_t nrails;        /* rails in rail[], in device enumeration order; a pair uses the first min(both) */
    int32_t link;          /* 1 = InfiniBand, 2 = Ethernet (RoCE); every rail of a rank has the same */
    uint64_t subnet;       /* InfiniBand: the GID's subnet prefix (ranks on different subnets do not use IB) */
    int32_t start_rail;    /* the rail paired with this rank's GPU, where its sends start; -1: none (rank i of a
                            * host starts on rail i mod R) */
    int32_t pad;
    zccl_ib_rail_info_t rail[ZCCL_IB_RAILS_MAX];
} zccl_ib_peer_info_t;

/** Most NIC names of a rank's GPU that the transports match their rails against (zccl_tp_comm_t.gpu_nic). */
#define ZCCL_GPU_NICS_MAX 8

/** Most TCP rails (interfaces) a rank publishes, and most TCP sockets per direction of a pair (rails x sockets). */
#define ZCCL_RAIL_MAX 8
#define ZCCL_TCP_SOCKS_MAX 16

/** One TCP rail of a rank: an interface it listens on for striped data connections (transport/rail.c). */
typedef struct {
    zccl_sockaddr_t addr; /* the interface's address, with the port of this rank's listener on it */
    uint8_t prefix;       /* netmask length: addr/prefix is the rail's subnet */
    uint8_t pad[7];
    char ifname[16];      /* interface name, for messages */
} zccl_rail_addr_t;

/** A rank's TCP rails (n = 0: it has fewer than two rails and ZCCL_NSOCKS_PERTHREAD=1, so it uses only `listen`). */
typedef struct {
    int32_t n;
    int32_t nsocks;       /* its ZCCL_NSOCKS_PERTHREAD: sockets per rail; a pair uses the smaller */
    zccl_rail_addr_t rail[ZCCL_RAIL_MAX];
} zccl_tcp_peer_info_t;

/** What every rank tells every other at init (fixed size, exchanged through the bootstrap root). */
typedef struct {
    int32_t rank;
    int32_t pid;
    uint64_t host_hash;     /* hostname + boot id: equal means "same host, shared memory possible" */
    zccl_sockaddr_t listen; /* this rank's data/bootstrap listening socket */
    char shm_name[64];      /* this rank's shared-memory inbox ("" if none) */
    uint64_t cma_probe;     /* address of a word holding cma_probe_value, for the single-copy probe */
    uint64_t cma_probe_value;
    uint64_t shm_free;      /* bytes free in /dev/shm when this rank started (the host's ranks must fit in it) */
    zccl_locality_t loc;    /* package / NUMA node / core this rank is bound to, and its NIC distance */
    zccl_ib_peer_info_t ib; /* IB verbs transport endpoint */
    zccl_tcp_peer_info_t tcp; /* TCP rails: every usable interface's listening address (transport/rail.c) */
    uint32_t cfg_hash[ZCCL_CFG_MATCH_MAX];  /* hash of each setting every rank must share (api/comm_init.c), compared at init */
} zccl_peer_info_t;

/** Header a rank sends (TCP data connections, the communicator's shrink notice) after the handshake on a rank-to-rank connection. */
typedef struct {
    uint64_t comm_id;
    int32_t from_rank;
    int32_t kind; /* ZCCL_CONN_DATA */
} zccl_conn_hdr_t;
#define ZCCL_CONN_DATA 1
#define ZCCL_CONN_SHRINK 2 /* followed by the shrink message of lib/core/comm.h (not a transport's) */
#define ZCCL_CONN_NOTICE 3 /* followed by a notice of lib/core/notice.h: a rank refused or gave up a collective */

struct zccl_transport_ops;

/** Most transports one build can hold (zccl__transports has at most this many rows). */
#define ZCCL_TRANSPORT_MAX 8

/**
 * The transport layer's view of a communicator. struct zccl_comm embeds one (member `tc`); transports receive a
 * pointer to it and never the communicator. rank/nranks/comm_id/secret are copies fixed at creation.
 */
/* How long one wait in ZCCL_WAIT_YIELD mode yields before it sleeps (doorbell.c for shared memory, the engine's
 * poll for sockets). Measured with 4 and 8 ranks on 2 cores (bench/wait_ab, docs/performance.md): 250 us keeps the
 * small calls' gain (a descheduled peer gets the core at once) and, unlike 1-5 ms, does not slow 4-16 MiB calls,
 * whose waits are for peers busy copying on the core the waiter keeps taking turns on. */
#define ZCCL_YIELD_MAX_US 250

typedef struct zccl_tp_comm {
    int rank, nranks;
    uint64_t comm_id;
    uint8_t secret[ZCCL_SECRET_BYTES];
    zccl_peer_info_t *peers;                 /* nranks entries: what every rank published at init */
    const struct zccl_transport_ops **tp;    /* per peer: the transport that carries its traffic */
    /* Accepted incoming connections: the communicator's service thread fills in_fd[peer] under in_mutex. */
    pthread_mutex_t in_mutex;
    int *in_fd;
    /* Each transport's own state, in the slot of its row of zccl__transports (zccl__tp_state). Written by the thread
     * creating the communicator while its service thread may read another slot: accessed atomically. */
    void *priv[ZCCL_TRANSPORT_MAX];
    /* Wake-up word: a futex this rank sleeps on while it waits; peers and the service thread bump it. It lives in
     * the rank's shared-memory segment when it has one, else in local_doorbell. */
    uint32_t *doorbell;
    uint32_t *sleeping;
    uint32_t local_doorbell[2];
    /* ZCCL_WAIT_YIELD: a waiting rank does not sleep on the futex but hands its core over with sched_yield and
     * looks again (sleeping = 2 then, so a peer bumps the word without the FUTEX_WAKE system call), for up to
     * ZCCL_YIELD_MAX_US per wait; then it sleeps. */
    int wait_yield;
    /* Cache-sized bounce buffer for transports that need one (chunk_bytes, ZCCL_CHUNK_BYTES). */
    uint8_t *chunk_tmp;
    size_t chunk_bytes;
    int64_t init_timeout_ms;                 /* ZCCL_INIT_TIMEOUT_MS: how long comm_setup may wait for peers */
    volatile int aborted;                    /* zccl_comm_abort was called */
    zccl_result_t async_error;               /* the communicator broke (first remote error or timeout) */
    /* The OS names of the NIC(s) the topology pairs with this rank's GPU (the CUDA device current at init;
     * zccl_topo_gpu_nic_names): the TCP and IB rails whose interface or device has one of those names are where
     * this rank starts its traffic, as NCCL pairs a GPU with its NIC. Set before the transports publish their
     * endpoints (zccl__comm_gpu_rails); none without a GPU. */
    int ngpu_nics;
    char gpu_nic[ZCCL_GPU_NICS_MAX][ZCCL_TOPO_NAME_LEN];
} zccl_tp_comm_t;

/** Whether `name` (an interface or RDMA device) is one of the NICs paired with this rank's GPU (tc->gpu_nic). */
static inline bool zccl__gpu_nic_is(const zccl_tp_comm_t *tc, const char *name) {
    for (int i = 0; i < tc->ngpu_nics; i++)
        if (!strcmp(tc->gpu_nic[i], name)) return true;
    return false;
}

/** The slot of a transport: its row in zccl__transports (a const table), or -1. */
int zccl__tp_slot(const struct zccl_transport_ops *ops);
/** The state a transport stored for tc (NULL before it set any). */
static inline void *zccl__tp_state(const zccl_tp_comm_t *tc, const struct zccl_transport_ops *ops) {
    const int i = zccl__tp_slot(ops);
    return i >= 0 ? __atomic_load_n(&tc->priv[i], __ATOMIC_ACQUIRE) : NULL;
}
/** Stores (state non-NULL) or forgets (NULL) a transport's state in tc. */
void zccl__tp_set_state(zccl_tp_comm_t *tc, const struct zccl_transport_ops *ops, void *state);

/** What kind of link a transport is, for the tuner's cost model (which parameters apply). */
typedef enum {
    ZCCL_LINK_MEMORY = 0, /* within a host through shared memory */
    ZCCL_LINK_NETWORK = 1 /* through a network stack or NIC, on one host or across hosts */
} zccl_link_class_t;

/** One send or receive in flight. The engine fills the first block; the transport owns `t`. */
typedef struct zccl_xfer {
    int peer;
    bool is_send;
    const uint8_t *src;   /* send: bytes to send */
    uint8_t *dst;         /* recv: where the result goes */
    const uint8_t *op2;   /* recv: second reduction operand (bytes aligned with dst), NULL = plain copy */
    size_t bytes;
    zccl_datatype_t dt;   /* recv with op2: how to reduce */
    zccl_redop_t op;
    uint32_t divisor;     /* >1: divide the reduced value (ZCCL_AVG's final step) */
    size_t done;          /* bytes sent (handed over) or delivered */
    bool complete;        /* send: the source buffer may be reused; recv: every byte delivered */
    bool started;         /* the transport has begun this transfer */
    uint64_t t[4];        /* transport-private state */
    /* A call on device memory (mem): src/dst above are host staging, and a completed receive enters dev_dst
     * (reduced with dev_op2 when set) through the memory layer. NULL for host calls; transports ignore them. */
    uint8_t *dev_dst;
    const uint8_t *dev_op2;
    /* GPUDirect RDMA (issue 24; ib only): src/dst are device memory the NIC reads and writes itself, registered
     * beforehand (zccl__ib_gdr_register); the transport never touches them with the CPU. gdr_flush: once a receive
     * has landed, read one byte of it back over the loopback QP (GPUs before Hopper) before it completes. */
    bool gdr, gdr_flush;
} zccl_xfer_t;

typedef struct zccl_transport_ops {
    const char *name;          /* as ZCCL_TRANSPORT names it */
    zccl_link_class_t link;    /* its link class (the tuner's cost model) */
    unsigned fds_per_peer;     /* file descriptors it opens per remote peer (checked against RLIMIT_NOFILE) */
    /** Optional: why this transport cannot reach peer, for the error when ZCCL_TRANSPORT forces it and for the INFO
     *  log (writes a sentence into buf). Returns the error class: ZCCL_SYSTEM_ERROR for a resource limit of this
     *  host, ZCCL_INVALID_ARGUMENT otherwise. NULL: "another host". */
    zccl_result_t (*why_unreachable)(const zccl_tp_comm_t *comm, int peer, char *buf, size_t len);
    /** Comm-wide setup once every rank's info is known (map segments, probe capabilities). */
    zccl_result_t (*comm_setup)(zccl_tp_comm_t *comm);
    /** Whether this transport can carry traffic between this rank and peer. */
    bool (*can_reach)(const zccl_tp_comm_t *comm, int peer);
    /**
     * Advances x by about one chunk. Sets *progressed when anything moved, x->complete when finished.
     * Must only touch x if every earlier transfer on the same channel has completed (the engine ensures it).
     */
    zccl_result_t (*progress)(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed);
    /** A file descriptor to poll while waiting for x (POLLIN/POLLOUT in *events), or -1 if the transport wakes the
     *  rank's doorbell instead. */
    int (*wait_fd)(zccl_tp_comm_t *comm, const zccl_xfer_t *x, short *events);
    /** Checks that peer is still alive. Called for every peer each time a sleeping rank wakes without progress
     *  (about every 50 ms), so it must be cheap; transports that cannot tell (TCP: loss shows as EOF) return success. */
    zccl_result_t (*check_peer)(zccl_tp_comm_t *comm, int peer);
    /** Releases everything comm_setup created. */
    void (*comm_teardown)(zccl_tp_comm_t *comm);
    /** Optional (NULL = never): whether peer left cleanly (destroyed its communicator after its last operation, so
     *  all it sent was delivered). The engine then does not count that peer's exit as a loss unless it still waits
     *  on a transfer with it. */
    bool (*departed)(const zccl_tp_comm_t *comm, int peer);
    /** Optional (NULL = nothing to do): this rank gave up a collective after a lost peer or a timeout; make every
     *  peer that may still wait on it fail too instead of hanging (TCP: shut the connections down; shm: mark the
     *  inbox failed and wake the host's ranks). The listening socket stays, so zccl_comm_shrink still works. */
    void (*poison)(zccl_tp_comm_t *comm);
    /** Optional (NULL = nothing to say): writes this rank's rails of this transport and, for each peer that lost one,
     *  which are live ("IB rails rxe0:1,rxe1:1; to rank 1 live rxe0:1 (lost rxe1:1)") into buf; returns how many rails
     *  it has (0: none set up). Local; may race with progress on another thread (it reads flags only). */
    int (*describe_rails)(const zccl_tp_comm_t *comm, char *buf, size_t len);
} zccl_transport_ops_t;

/** The registration table (transport/registry.c): every transport of this build in order of preference (a peer
 *  gets the first that can reach it), NULL-terminated. The one place a new transport is added. */
extern const zccl_transport_ops_t *const zccl__transports[];
/** The transport named `name` (case-insensitive), or NULL. */
const zccl_transport_ops_t *zccl__transport_by_name(const char *name);

/**
 * Hands `len` received bytes (a whole number of elements) to x at offset x->done: copies them to dst, or reduces
 * them with op2 into dst; then advances x->done. Shared by every transport so the reduction happens straight from
 * the transport's buffer, with no extra pass over memory (transport/deliver.c).
 */
void zccl__xfer_deliver(zccl_xfer_t *x, const void *data, size_t len);

/**
 * Whether /dev/shm holds the inboxes of all ranks of this host: *need bytes (their total) against *avail (the least
 * free space any of them saw at start). Without room, ranks of one host talk over TCP instead.
 */
bool zccl__shm_room(const zccl_tp_comm_t *comm, size_t *need, size_t *avail);
/** Removes this rank's shared-memory inbox name once every peer has mapped it (the mapping stays). */
void zccl__shm_unlink_own(zccl_tp_comm_t *comm);

/** Whether process pid of this host has exited (gone, or a zombie not yet reaped). Defined in shm.c. */
bool zccl__local_pid_exited(int pid);

/** Wakes the given local rank's engine if it sleeps (shm doorbell; no-op for ranks without shm). */
void zccl__doorbell_ring(zccl_tp_comm_t *comm, int peer);
/** Bytes of the area in every shm rank's segment header that only its owner writes and every local peer reads
 *  (registered-buffer descriptors, lib/core/regmem.c). */
#define ZCCL_SHM_REG_AREA_BYTES 256
/** That area of `rank` (this rank included), or NULL if rank is not reached through shared memory. Defined in shm.c. */
void *zccl__shm_reg_area(zccl_tp_comm_t *comm, int rank);
/**
 * The sleep protocol of every waiting loop: zccl__doorbell_announce says this rank is about to sleep and returns the
 * word's value `seen` (a peer that changes anything afterwards rings it, since it now sees the rank asleep); the loop
 * then looks once more for what it waits for, sleeps with zccl__doorbell_wait(seen) only if nothing came, and calls
 * zccl__doorbell_awake when it wakes (transport/doorbell.c).
 */
uint32_t zccl__doorbell_announce(zccl_tp_comm_t *comm);
void zccl__doorbell_awake(zccl_tp_comm_t *comm);
/** ZCCL_SHM_CMA=-1 (auto): turns shared memory's single copy (process_vm_readv for messages from
 *  ZCCL_CMA_THRESHOLD bytes) on (on = 1) or off (0) for this communicator's sends from now on; on = -1 only asks.
 *  Only the sender chooses a message's path, so ranks never need to agree for correctness; the tuner's calibration
 *  measures both (lib/tuner/tuner_calib.c) and the tuner sets it before each call, per collective, the same on every
 *  rank (lib/tuner/tuner.c, zccl__tune), on the thread that runs the calls. Returns whether it was on, or -1
 *  when the communicator has no shared-memory transport, ZCCL_SHM_CMA is 0 or 1 (nothing overrides the user), or
 *  the single copy is off anyway (transport/shm.c). */
int zccl__shm_single_copy(zccl_tp_comm_t *comm, int on);
/** Bytes of one shared-memory channel's slots (ZCCL_SHM_SLOTS x ZCCL_SHM_SLOT_BYTES): a transfer through the slots of
 *  that many bytes has used every slot of its channel once. 0 when comm has no shared-memory transport. */
size_t zccl__shm_ring_bytes(const zccl_tp_comm_t *comm);
/** Sleeps on this rank's wake-up word until it differs from `seen` or timeout_ms passes (transport/doorbell.c); with
 *  comm->wait_yield it yields the core (sched_yield) between looks at the word instead of sleeping. */
void zccl__doorbell_wait(zccl_tp_comm_t *comm, uint32_t seen, int timeout_ms);

/**
 * IB transport, before the bootstrap: reads the ZCCL_IB_* knobs, opens the chosen device and starts this rank's
 * rdma_cm listener, and fills *me (family 0 when IB is disabled, absent from the build, or no device is usable:
 * peers then use another transport; the reason is logged at INFO). Errors only for invalid knobs, or when
 * ZCCL_TRANSPORT=ib demands a device and none can be used.
 */
zccl_result_t zccl__ib_local_info(zccl_tp_comm_t *comm, zccl_ib_peer_info_t *me);
/**
 * TCP rails, before the bootstrap (transport/rail.c): enumerates this host's rails (every up, non-loopback,
 * non-container interface with an address, or those ZCCL_SOCKET_IFNAME selects; at most ZCCL_TCP_RAILS), and when
 * there are two or more (or ZCCL_NSOCKS_PERTHREAD > 1) opens a listener on each and fills *me; otherwise me->n = 0
 * and TCP uses one socket per direction as before. Errors: ZCCL_INVALID_ARGUMENT naming the setting when
 * ZCCL_SOCKET_IFNAME is set and matches no interface with an address; ZCCL_SYSTEM_ERROR (listen, thread).
 */
zccl_result_t zccl__tcp_rails_local_info(zccl_tp_comm_t *comm, zccl_tcp_peer_info_t *me);
/** This host's TCP rails as zccl__tcp_rails_local_info enumerates them (before ZCCL_TCP_RAILS caps them), at most
 *  max, into out; *tried lists every up IPv4 interface seen. Errors: ZCCL_SOCKET_IFNAME matching none. */
zccl_result_t zccl__tcp_rails_list(zccl_rail_addr_t *out, int max, int *n, char *tried, size_t tlen);
/** One line describing this rank's rails and how many sockets it stripes over with each other-host peer
 *  ("eth0 10.200.0.1/24, eth1 10.200.1.1/24; rank 1: 2 rails x 1 socket"), for zccl_comm_net_info. */
void zccl__tcp_rails_describe(const zccl_tp_comm_t *comm, char *buf, size_t len, int *nrails, int *max_socks);
/** Whether this build has the IB verbs transport. */
bool zccl__ib_built(void);

/* This layer's rows of the settings table (transport/settings.c). */
extern const zccl_cfg_desc_t zccl__set_shm_slot_bytes;
#define ZCCL_CFG_SHM_SLOT_BYTES (&zccl__set_shm_slot_bytes)
extern const zccl_cfg_desc_t zccl__set_shm_slots;
#define ZCCL_CFG_SHM_SLOTS (&zccl__set_shm_slots)
extern const zccl_cfg_desc_t zccl__set_shm_cma;
#define ZCCL_CFG_SHM_CMA (&zccl__set_shm_cma)
extern const zccl_cfg_desc_t zccl__set_cma_threshold;
#define ZCCL_CFG_CMA_THRESHOLD (&zccl__set_cma_threshold)
extern const zccl_cfg_desc_t zccl__set_ib_disable;
#define ZCCL_CFG_IB_DISABLE (&zccl__set_ib_disable)
extern const zccl_cfg_desc_t zccl__set_ib_hca;
#define ZCCL_CFG_IB_HCA (&zccl__set_ib_hca)
extern const zccl_cfg_desc_t zccl__set_ib_gid_index;
#define ZCCL_CFG_IB_GID_INDEX (&zccl__set_ib_gid_index)
extern const zccl_cfg_desc_t zccl__set_ib_timeout;
#define ZCCL_CFG_IB_TIMEOUT (&zccl__set_ib_timeout)
extern const zccl_cfg_desc_t zccl__set_ib_retry_cnt;
#define ZCCL_CFG_IB_RETRY_CNT (&zccl__set_ib_retry_cnt)
extern const zccl_cfg_desc_t zccl__set_ib_qps_per_conn;
#define ZCCL_CFG_IB_QPS_PER_CONN (&zccl__set_ib_qps_per_conn)
extern const zccl_cfg_desc_t zccl__set_ib_zcopy_bytes;
#define ZCCL_CFG_IB_ZCOPY_BYTES (&zccl__set_ib_zcopy_bytes)
extern const zccl_cfg_desc_t zccl__set_socket_user_timeout_ms;
#define ZCCL_CFG_SOCKET_USER_TIMEOUT_MS (&zccl__set_socket_user_timeout_ms)
extern const zccl_cfg_desc_t zccl__set_tcp_rails;
#define ZCCL_CFG_TCP_RAILS (&zccl__set_tcp_rails)
extern const zccl_cfg_desc_t zccl__set_nsocks_perthread;
#define ZCCL_CFG_NSOCKS_PERTHREAD (&zccl__set_nsocks_perthread)
extern const zccl_cfg_desc_t zccl__set_rail_timeout_ms;
#define ZCCL_CFG_RAIL_TIMEOUT_MS (&zccl__set_rail_timeout_ms)
extern const zccl_cfg_desc_t zccl__set_min_nchannels;
#define ZCCL_CFG_MIN_NCHANNELS (&zccl__set_min_nchannels)
extern const zccl_cfg_desc_t zccl__set_max_nchannels;
#define ZCCL_CFG_MAX_NCHANNELS (&zccl__set_max_nchannels)
extern const zccl_cfg_desc_t zccl__set_tcp_stripe_min_bytes;
#define ZCCL_CFG_TCP_STRIPE_MIN_BYTES (&zccl__set_tcp_stripe_min_bytes)
extern const zccl_cfg_desc_t zccl__set_transport;
#define ZCCL_CFG_TRANSPORT (&zccl__set_transport)

#endif

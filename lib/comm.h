/*
 * comm.h — the communicator: who the ranks are, where they live, and how this rank reaches each of them.
 */
#ifndef ZCCL_COMM_H
#define ZCCL_COMM_H

#include <pthread.h>
#include "core.h"
#include "socket.h"
#include "topo.h"
#include "transport.h"
#include "calldesc.h"

/** How a rank can be reached over the IB verbs transport (transport/ib*.c); addr family 0 = no usable device. */
typedef struct {
    zccl_sockaddr_t addr;  /* rdma_cm listening address: the IP of the chosen port's interface (IPoIB or RoCE) */
    uint64_t probe_addr;   /* registered buffer peers write the connect-time probe into */
    uint32_t probe_rkey;
    int32_t port;          /* port number on the device */
    int32_t link;          /* 1 = InfiniBand, 2 = Ethernet (RoCE) */
    int32_t gid_index;
    uint64_t subnet;       /* InfiniBand: the GID's subnet prefix (ranks on different subnets do not use IB) */
    char dev[32];          /* device name, for messages */
} zccl_ib_peer_info_t;

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
    uint32_t cfg_hash[16];  /* hash of each setting every rank must share (comm.c: must_match), compared at init */
} zccl_peer_info_t;

/** Header a rank sends after the handshake on a rank-to-rank connection. */
typedef struct {
    uint64_t comm_id;
    int32_t from_rank;
    int32_t kind; /* ZCCL_CONN_DATA */
} zccl_conn_hdr_t;
#define ZCCL_CONN_DATA 1
#define ZCCL_CONN_SHRINK 2 /* followed by a zccl_shrink_msg_t: where the shrunk communicator's root listens */
#define ZCCL_CONN_NOTICE 3 /* followed by a zccl_notice_msg_t: the sender refused or gave up a collective (notice.h) */

typedef struct {
    uint64_t shrink_seq;  /* which shrink of this communicator (every survivor counts its calls) */
    zccl_sockaddr_t root; /* the new bootstrap root, run by the lowest surviving rank */
} zccl_shrink_msg_t;

struct zccl_shm_comm;
struct zccl_tcp_comm;
struct zccl_ib_comm;

struct zccl_comm {
    int rank, nranks;
    uint64_t comm_id;
    uint8_t secret[ZCCL_SECRET_BYTES];
    zccl_peer_info_t *peers; /* nranks entries */
    const zccl_transport_ops_t **tp; /* per peer: the transport that carries its traffic */
    int *ring;                       /* ring order: ring[i] = rank at position i (same on every rank) */

    /* Listening socket and the service thread that admits authenticated incoming connections. */
    int listen_fd;
    int stop_pipe[2];
    pthread_t service_thread;
    bool service_running;
    pthread_mutex_t in_mutex;
    int *in_fd; /* per peer: accepted data connection from that peer, -1 until it arrives */

    struct zccl_shm_comm *shm;
    struct zccl_tcp_comm *tcp;
    struct zccl_ib_comm *ib;

    /* Doorbell: a futex word this rank sleeps on; peers and the service thread bump it (see engine.c). */
    uint32_t *doorbell;
    uint32_t *sleeping;
    uint32_t local_doorbell[2]; /* used when the rank has no shared-memory segment */

    /* Progress engine. */
    pthread_mutex_t exec_mutex; /* one operation executes at a time */
    uint64_t seq;               /* collectives issued */
    void *scratch;
    size_t scratch_bytes;
    uint8_t *chunk_tmp;         /* cache-sized bounce buffer for transports that need one */
    size_t chunk_bytes;
    uint64_t spin_ns;           /* how long a waiting rank polls before sleeping (ZCCL_SPIN_US) */
    size_t rs_round_bytes;      /* ZCCL_RS_ROUND_BYTES, read once at init */
    struct zccl_tuner *tuner;   /* algorithm choice: parameters, layout, ZCCL_ALGO (lib/tuner.h) */
    bool check;                 /* ZCCL_CHECK: verify that ranks call matching collectives */
    const char *op_name;        /* the collective running now, for error messages */
    int64_t timeout_ms;
    volatile int aborted;
    /* zccl_comm_shrink: the service thread records where the lowest survivor's new root listens. */
    pthread_cond_t shrink_cv;
    bool shrink_known;
    zccl_shrink_msg_t shrink_msg;
    uint64_t shrinks;          /* zccl_comm_shrink calls made on this communicator */
    uint64_t splits;           /* zccl_comm_split calls made on this communicator */
    zccl_result_t async_error; /* first remote error or timeout; every later operation fails with it */
    /* Invalid calls (notice.c, include/zccl.h "Invalid calls"). */
    uint64_t cseq;             /* collectives run or refused (send/recv not counted: only some ranks take part) */
    uint32_t notice_gen;       /* bumped by the service thread for every notice received */
    uint32_t notice_seen;      /* notice_gen when the notices were last found not to apply */
    struct zccl_notice_node *notices; /* peers' notices (in_mutex) */
    uint64_t *refused_here;    /* sequence numbers of the calls this rank refused (in_mutex) */
    size_t nrefused, refused_cap;
    bool notice_learned;       /* this rank's failure came from a peer's notice: the peers know already */
    /* Call descriptors sent first on every channel of a collective (engine.c). */
    bool desc_on;
    zccl_call_desc_t desc_mine;
    zccl_call_desc_t *desc_in; /* per peer: the descriptor received from it */
    uint64_t *desc_mark;       /* per peer: [2r] run that sent to r, [2r+1] run that received from r */
    uint64_t desc_run;
    char async_msg[512];
};

/**
 * IB transport, before the bootstrap: reads the ZCCL_IB_* knobs, opens the chosen device and starts this rank's
 * rdma_cm listener, and fills *me (family 0 when IB is disabled, absent from the build, or no device is usable:
 * peers then use another transport; the reason is logged at INFO). Errors only for invalid knobs, or when
 * ZCCL_TRANSPORT=ib demands a device and none can be used.
 */
zccl_result_t zccl__ib_local_info(struct zccl_comm *comm, zccl_ib_peer_info_t *me);

/** After this rank gave up collective #seq (lost peer, timeout, mismatch): tells every peer why (a notice quoting
 *  comm->async_msg, notice.h) and makes the peers that may still wait on it fail too (every transport's poison op),
 *  so an error reaches every survivor instead of leaving some hanging. */
void zccl__comm_poison(struct zccl_comm *comm, uint64_t seq);

/** Host identity: hash of hostname and /proc boot_id. */
uint64_t zccl__host_hash(void);

#endif

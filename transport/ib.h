/*
 * ib.h — internals shared by the InfiniBand verbs transport's files (transport/ib*.c).
 *
 * The first half is plain C with no verbs types: the ZCCL_IB_HCA grammar, GID choice, the knobs, the rdma_cm
 * private-data proof and the registration cache's bookkeeping. It is compiled in every build, so the unit tests
 * (tests/test_ib.cpp) exercise it on machines without an RDMA device or without libibverbs. The second half
 * (ZCCL_HAVE_IB) is the verbs state of one communicator.
 */
#ifndef ZCCL_IB_H
#define ZCCL_IB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core.h"
#include "socket.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ZCCL_IB_HCA: NCCL's grammar ---------------------------------------------------------------------------- */

#define ZCCL_IB_MAX_HCA 32
#define ZCCL_IB_NAME_LEN 64

/**
 * A parsed ZCCL_IB_HCA value: "[^][=]hca[:port],hca[:port],...". Without '=' each name is a prefix ("mlx5" matches
 * mlx5_0, mlx5_1); with '=' names match exactly. A leading '^' excludes the listed devices instead of selecting
 * them. A port (1-255) restricts the entry to that port; without one every port matches.
 */
typedef struct {
    bool exclude;
    bool exact;
    int n;                                 /* entries; 0 = no filter (empty value) */
    char name[ZCCL_IB_MAX_HCA][ZCCL_IB_NAME_LEN];
    int port[ZCCL_IB_MAX_HCA];             /* -1 = any port */
} zccl_ib_hca_filter_t;

/**
 * Parses spec (NULL or "" = no filter). Errors (ZCCL_INVALID_ARGUMENT, naming ZCCL_IB_HCA, the value and the
 * offending entry): empty entry, name longer than 63 bytes, port not an integer in [1, 255], more than 32 entries.
 */
zccl_result_t zccl__ib_hca_parse(const char *spec, zccl_ib_hca_filter_t *f);
/** Whether device `dev` port `port` (1-based) may be used under f. */
bool zccl__ib_hca_match(const zccl_ib_hca_filter_t *f, const char *dev, int port);

/* ---- GID choice --------------------------------------------------------------------------------------------- */

enum { ZCCL_IB_GID_IB = 0, ZCCL_IB_GID_ROCE_V1 = 1, ZCCL_IB_GID_ROCE_V2 = 2 };
typedef struct {
    uint8_t raw[16];
    int index; /* index in the port's GID table */
    int type;  /* ZCCL_IB_GID_* */
} zccl_ib_gid_t;

/** Whether a GID is an IPv4-mapped address (::ffff:a.b.c.d), as RoCE uses for an interface's IPv4 address. */
bool zccl__ib_gid_is_ipv4(const uint8_t raw[16]);
/**
 * Chooses the GID of a port: `forced` >= 0 (ZCCL_IB_GID_INDEX) must be an index present in g[0..n); otherwise
 * on Ethernet (roce = true) the first RoCE v2 IPv4-mapped GID, else the first RoCE v2 GID, else the first GID;
 * on InfiniBand the first GID (index 0 normally). Sets *out to the chosen entry's position in g. Errors
 * (ZCCL_INVALID_ARGUMENT): forced index absent (*why lists what the port has), or n == 0.
 */
zccl_result_t zccl__ib_gid_pick(const zccl_ib_gid_t *g, size_t n, bool roce, int forced, size_t *out,
                                char *why, size_t why_len);

/* ---- knobs -------------------------------------------------------------------------------------------------- */

typedef struct {
    bool disable;        /* ZCCL_IB_DISABLE */
    int gid_index;       /* ZCCL_IB_GID_INDEX, -1 = automatic */
    int timeout;         /* ZCCL_IB_TIMEOUT: local ACK timeout exponent, 4.096 us * 2^timeout */
    int retry_cnt;       /* ZCCL_IB_RETRY_CNT */
    int qps_per_conn;    /* ZCCL_IB_QPS_PER_CONN */
    size_t zcopy_bytes;  /* ZCCL_IB_ZCOPY_BYTES: zero-copy threshold, 0 = always stage */
    zccl_ib_hca_filter_t hca;
} zccl_ib_knobs_t;

/** Reads and validates every ZCCL_IB_* setting; errors name the variable, its value and the accepted range. */
zccl_result_t zccl__ib_knobs(zccl_ib_knobs_t *k);

/* ---- rails ------------------------------------------------------------------------------------------------- */

/** The plan of one pair's connection over IB rails (HCA ports), as each side computes it from both records. */
typedef struct {
    int nrails;  /* rails the pair uses: min(both counts); rail k connects to the peer's rail k */
    int nqp;     /* QPs of the connection: nrails x ZCCL_IB_QPS_PER_CONN; QP q is on rail q / qps */
    int off_tx;  /* grant g of this rank's sends travels on QP (g + off_tx) % nqp */
    int off_rx;  /* grant g of the peer's sends travels on QP (g + off_rx) % nqp */
} zccl_ib_rail_plan_t;

/**
 * Plans the connection of a rank with my_rails rails and start index my_li, with a peer of their_rails rails and
 * start index their_li: each side starts its sends on rail (start index mod R). The start index is the rail paired
 * with the rank's GPU when it has one (zccl_ib_peer_info_t.start_rail), else its index among its host's ranks, so
 * rank i of a host starts on rail i mod R (as the TCP rails do) and two ranks of one host do not both put their
 * first QP on the same NIC. Both sides compute the
 * same mapping for each direction (this rank's off_tx is the peer's off_rx). Rail counts must be >= 1.
 */
zccl_ib_rail_plan_t zccl__ib_rail_plan(int my_rails, int their_rails, int qps, int my_li, int their_li);
/**
 * The QP of grant seq in a direction of QP offset off, over nqp QPs of qps per rail, when dead[k] says which rails
 * the pair lost (NULL: none): (seq + off) % nqp, moved a rail on (same QP index within the rail) while that rail is
 * dead; -1 when every rail is dead. Both sides of a pair compute the same QP once they agree on the dead rails.
 */
int zccl__ib_grant_qp(uint32_t seq, int off, int nqp, int qps, const bool *dead);

/* ---- rdma_cm private data: proof of the job secret ----------------------------------------------------------
 * Connect (active side, 48 bytes, within rdma_cm's 56-byte limit for a connect request):
 *   comm_id u64 | from_rank i32 | qp u16 | nqp u16 | nonce_c[16] | MAC[16]
 *   MAC = first 16 bytes of HMAC-SHA256(secret, "C" | hdr16' | nonce_c), hdr16' = comm_id | from | to | qp | nqp
 *   (socket.c's proof with the header in place of the server nonce), so a request is bound to its communicator,
 *   both ranks and the QP index; each (from, qp) is admitted once.
 * Accept (passive side, 48 bytes): socket.c's CHAL over the client's nonce, nonce_s | HMAC(secret, "S"|nonce_c|nonce_s),
 *   which the active side checks before it uses the connection. */
#define ZCCL_IB_REQ_BYTES 48
#define ZCCL_IB_REP_BYTES ZCCL_CHAL_BYTES

void zccl__ib_req_encode(const uint8_t secret[ZCCL_SECRET_BYTES], uint64_t comm_id, int from, int to, int qp,
                         int nqp, const uint8_t nonce_c[ZCCL_NONCE_BYTES], uint8_t out[ZCCL_IB_REQ_BYTES]);
/**
 * Validates a connect request received by rank `me` of an nranks communicator: length at least
 * ZCCL_IB_REQ_BYTES (rdma_cm pads), communicator id, sender in [0, nranks) and below `me` (the lower rank
 * connects), qp < nqp == expect_nqp, MAC (constant time). Sets *from, *qp and nonce_c. ZCCL_INVALID_ARGUMENT with
 * *why on failure.
 */
zccl_result_t zccl__ib_req_decode(const uint8_t secret[ZCCL_SECRET_BYTES], uint64_t comm_id, int me, int nranks,
                                  int expect_nqp, const void *buf, size_t len, int *from, int *qp,
                                  uint8_t nonce_c[ZCCL_NONCE_BYTES], const char **why);

/* ---- registration cache (bookkeeping only; the verbs calls are callbacks) ----------------------------------
 * Entries cover page-aligned ranges. A lookup that a live entry covers is a hit (and refreshes its LRU age);
 * otherwise the range (rounded out to pages) is registered through reg_fn, and entries it overlaps are
 * invalidated first (re-registration). Capacity is bounded by max_entries and max_bytes: least recently used
 * entries that are not pinned (in use by a transfer in flight) are deregistered to make room. */
typedef struct {
    uintptr_t start, end; /* [start, end), page-aligned */
    void *handle;         /* what reg_fn returned (an ibv_mr *) */
    uint32_t lkey, rkey;
    uint64_t last_use;
    int pins;
    bool live;            /* slot in use */
    uint64_t buf_id;      /* device memory: the CUDA allocation's buffer id when registered (0: host memory) */
} zccl_ib_mr_entry_t;

typedef int (*zccl_ib_reg_fn)(void *ctx, void *addr, size_t len, void **handle, uint32_t *lkey, uint32_t *rkey);
typedef void (*zccl_ib_dereg_fn)(void *ctx, void *handle);

typedef struct {
    zccl_ib_mr_entry_t *e;
    size_t n, max_entries, bytes, max_bytes; /* n: live entries */
    uint64_t clock;
    zccl_ib_reg_fn reg;
    zccl_ib_dereg_fn dereg;
    void *ctx;
    uint64_t hits, misses, evictions, invalidations; /* statistics, for logs and tests */
    uint64_t stale;       /* device entries dropped because their allocation was freed and the address reused */
} zccl_ib_mr_cache_t;

/** Sets up an empty cache; ZCCL_SYSTEM_ERROR when the entry array cannot be allocated. */
zccl_result_t zccl__ib_mr_cache_init(zccl_ib_mr_cache_t *c, size_t max_entries, size_t max_bytes,
                                     zccl_ib_reg_fn reg, zccl_ib_dereg_fn dereg, void *ctx);
/**
 * Finds or creates the entry covering [addr, addr+len) and pins it (unpin with zccl__ib_mr_unpin when the
 * transfer that uses it has finished). Returns NULL when the range is larger than max_bytes, when every entry is
 * pinned and no room can be made, or when reg_fn fails (the caller then stages the data instead).
 */
zccl_ib_mr_entry_t *zccl__ib_mr_get(zccl_ib_mr_cache_t *c, const void *addr, size_t len);
/**
 * For device memory (the GDR path's registration, once per call): as zccl__ib_mr_get, but every entry is of the
 * allocation whose CUDA buffer id (zccl__mem_buffer_id) it was made for. An entry covering or overlapping the range
 * made for another allocation maps pages that were freed since (the address came back from the allocator with other
 * memory behind it): it is deregistered and the range registered anew with buf_id; *stale says so (the caller names
 * it). NULL as zccl__ib_mr_get, and when such a stale entry is pinned by a transfer in flight.
 */
zccl_ib_mr_entry_t *zccl__ib_mr_get_dev(zccl_ib_mr_cache_t *c, const void *addr, size_t len, uint64_t buf_id,
                                        bool *stale);
/** The live device entry (buf_id != 0) holding address p, or NULL (the use-after-free check of host calls). */
const zccl_ib_mr_entry_t *zccl__ib_mr_find_dev(const zccl_ib_mr_cache_t *c, const void *p);
void zccl__ib_mr_unpin(zccl_ib_mr_cache_t *c, zccl_ib_mr_entry_t *e);
/** Drops every unpinned entry that overlaps [addr, addr+len) (memory freed or about to be re-registered). */
void zccl__ib_mr_invalidate(zccl_ib_mr_cache_t *c, const void *addr, size_t len);
/** Deregisters everything. */
void zccl__ib_mr_cache_fini(zccl_ib_mr_cache_t *c);

/* ---- GPUDirect RDMA (transport/ib_gdr.c) -------------------------------------------------------------------- */

/** What this build and this machine offer for registering GPU memory; logged once at init. */
typedef enum { ZCCL_GDR_NONE = 0, ZCCL_GDR_DMABUF = 1, ZCCL_GDR_PEERMEM = 2 } zccl_gdr_mode_t;
const char *zccl__ib_gdr_mode_name(zccl_gdr_mode_t m);

/* ---- the GDR data path (issue 24; ib_gdr.c; lib/core/engine_gdr.c drives it) ---- */
struct zccl_tp_comm;
struct zccl_nic_gdr;
struct zccl_transport_ops;
extern const struct zccl_transport_ops zccl_transport_ib; /* ib.c: a peer reached over verbs has this row */
/** Whether this rank's IB device could carry device memory: false with the reason in why (no IB state, no
 *  registration mode, or need_flush and no flush QP). nic: what the NIC offers, for zccl__gdr_decide. */
bool zccl__ib_gdr_usable(struct zccl_tp_comm *comm, bool need_flush, struct zccl_nic_gdr *nic, char *why, size_t len);
/** Registers the device allocation holding [p, p + bytes) with the NIC, cached per allocation in the communicator's
 *  registration cache (the NIC's); false with the cause in why when it cannot (refused export, no peer memory). */
bool zccl__ib_gdr_register(struct zccl_tp_comm *comm, const void *p, size_t bytes, char *why, size_t len);
/** Whether a rail's registration cache holds a registration of device memory covering p; what says which (the
 *  use-after-free check of calls whose buffer the CUDA driver no longer knows, lib/core/engine_gdr.c). */
bool zccl__ib_gdr_held(struct zccl_tp_comm *comm, const void *p, char *what, size_t len);
/** Device registrations found stale (their allocation freed and the address reused) and registered again. */
uint64_t zccl__ib_gdr_stale(struct zccl_tp_comm *comm);
/** Drops cached registrations overlapping [p, p + bytes) (the memory is about to be freed). */
void zccl__ib_gdr_forget(struct zccl_tp_comm *comm, const void *p, size_t bytes);
/** Flushes done so far on this communicator's device. */
uint64_t zccl__ib_gdr_flushes(struct zccl_tp_comm *comm);

/** Whether the IB transport was compiled in (libibverbs and librdmacm found at build time). */
bool zccl__ib_built(void);

#ifdef __cplusplus
}
#endif
#endif

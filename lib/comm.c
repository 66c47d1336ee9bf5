/*
 * comm.c — creating and destroying communicators.
 *
 * zccl_comm_init_rank: open this rank's listening socket and start the service thread that admits peers' data
 * connections; join the bootstrap root to learn every rank's address and host; choose a transport per peer
 * (shared memory on the same host, TCP otherwise, or ZCCL_TRANSPORT); let each transport set itself up; finish
 * with a barrier so every peer has mapped what it needs before shared-memory names are removed.
 */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <openssl/sha.h>
#include <unistd.h>
#include "bootstrap.h"
#include "comm.h"
#include "engine.h"
#include "notice.h"
#include "stream.h"
#include "tuner.h"

void zccl__shm_unlink_own(struct zccl_comm *comm);

/* In order of preference: shared memory on one host, IB verbs where a device reaches the peer, TCP. */
static const zccl_transport_ops_t *const transports[] = {&zccl_transport_shm, &zccl_transport_ib, &zccl_transport_tcp};
#define NTRANSPORTS (sizeof transports / sizeof transports[0])

uint64_t zccl__host_hash(void) {
    char buf[512] = {0};
    gethostname(buf, 255);
    size_t n = strlen(buf);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        n += fread(buf + n, 1, sizeof buf - n - 1, f);
        fclose(f);
    }
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)buf[i]) * 1099511628211ull;
    return h;
}

static volatile uint64_t cma_probe_word = 0;

/* ---- the service thread: admits authenticated data connections from peers ------------------------------------ */

static int service_on_conn(void *ctx, int fd, const void *hdr, size_t hdr_bytes) {
    struct zccl_comm *comm = ctx;
    int from = -1;
    const char *why = NULL;
    if (zccl__conn_hdr_decode(hdr, hdr_bytes, comm->comm_id, comm->rank, comm->nranks, &from, &why) != ZCCL_SUCCESS) {
        zccl_conn_hdr_t h = {0}; /* for the log only */
        if (hdr_bytes >= sizeof h) memcpy(&h, hdr, sizeof h);
        ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: refused a connection with a valid secret but a wrong header (communicator "
                  "%016llx, from rank %d): %s", comm->rank, (unsigned long long)h.comm_id, h.from_rank, why);
        close(fd);
        return 0;
    }
    zccl_conn_hdr_t h;
    memcpy(&h, hdr, sizeof h);
    if (h.kind == ZCCL_CONN_SHRINK) { /* a survivor announces the root of a shrunk communicator */
        zccl_shrink_msg_t m;
        const char *bad = NULL;
        if (zccl__recv_all(fd, &m, sizeof m, zccl__now_ns() + 2000000000ull, "shrink announcement") != ZCCL_SUCCESS)
            bad = "incomplete";
        else if (zccl__sockaddr_check(&m.root, &bad) != ZCCL_SUCCESS)
            bad = bad ? bad : "bad address";
        close(fd);
        if (bad) {
            ZCCL_WARN(ZCCL_LOG_INIT, "rank %d: refused a shrink announcement from rank %d: %s", comm->rank, from, bad);
            return 0;
        }
        pthread_mutex_lock(&comm->in_mutex);
        comm->shrink_msg = m;
        comm->shrink_known = true;
        pthread_cond_broadcast(&comm->shrink_cv);
        pthread_mutex_unlock(&comm->in_mutex);
        return 0;
    }
    if (h.kind == ZCCL_CONN_NOTICE) { /* a peer refused or gave up a collective */
        zccl__notice_receive(comm, fd, from);
        return 0;
    }
    pthread_mutex_lock(&comm->in_mutex);
    bool dup = comm->in_fd[from] >= 0;
    if (!dup) comm->in_fd[from] = fd;
    pthread_mutex_unlock(&comm->in_mutex);
    if (dup) {
        ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: rank %d connected twice; second connection refused", comm->rank, from);
        close(fd);
        return 0;
    }
    zccl__doorbell_ring(comm, comm->rank);
    return 0;
}

static void *service_main(void *arg) {
    struct zccl_comm *comm = arg;
    zccl__log_set_rank(comm->rank);
    zccl__accept_loop(comm->listen_fd, comm->stop_pipe[0], comm->secret, sizeof(zccl_conn_hdr_t), service_on_conn,
                      comm, 0, NULL);
    return NULL;
}

/* ---- teardown ----------------------------------------------------------------------------------------------- */

void zccl__comm_poison(struct zccl_comm *comm, uint64_t seq) {
    /* The notice first: a peer that reads it fails quoting this rank's reason; one that sees the transports'
     * poison first only learns that this rank left. A rank that failed because of a peer's notice does not pass it
     * on: that peer told every rank already. */
    if (!comm->notice_learned) zccl__notice_send(comm, ZCCL_NOTICE_GAVE_UP, seq, comm->async_msg);
    for (size_t t = 0; t < NTRANSPORTS; t++)
        if (transports[t]->poison) transports[t]->poison(comm);
}

/* Settings that shape the protocol or the schedules: ranks that disagree on one would stall at init or fail in the
 * middle of a collective with a confusing message, so every rank publishes a hash of each and init compares them. */
static const zccl_cfg_id_t must_match[] = {
    ZCCL_CFG_TRANSPORT,      ZCCL_CFG_SHM_SLOT_BYTES, ZCCL_CFG_SHM_SLOTS,       ZCCL_CFG_SHM_CMA,
    ZCCL_CFG_RS_ROUND_BYTES, ZCCL_CFG_CHECK,          ZCCL_CFG_RING_ORDER,      ZCCL_CFG_ALGO,
    ZCCL_CFG_TUNER_CALIBRATE, ZCCL_CFG_IB_DISABLE,    ZCCL_CFG_IB_QPS_PER_CONN, ZCCL_CFG_CMA_THRESHOLD,
};
_Static_assert(sizeof must_match / sizeof must_match[0] <= 16, "zccl_peer_info_t.cfg_hash holds 16 settings");

static void cfg_hashes(uint32_t out[16]) {
    memset(out, 0, 16 * sizeof *out);
    for (size_t i = 0; i < sizeof must_match / sizeof must_match[0]; i++) {
        uint32_t h = 2166136261u; /* FNV-1a of the value as the rank sees it (its default when unset) */
        for (const char *p = zccl__cfg_str(must_match[i]); *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
        out[i] = h | 1u;
    }
}

/* Every rank holds the same table, so every rank fails alike, before any transport is set up. */
static zccl_result_t check_settings_match(struct zccl_comm *comm) {
    for (int r = 1; r < comm->nranks; r++)
        for (size_t i = 0; i < sizeof must_match / sizeof must_match[0]; i++)
            if (comm->peers[r].cfg_hash[i] != comm->peers[0].cfg_hash[i]) {
                const char *name = zccl__cfg_table[must_match[i]].name;
                return zccl__error(ZCCL_INVALID_USAGE, "%s differs between rank 0 and rank %d (this is rank %d, where "
                                   "it is \"%s\"): it must be the same on every rank", name, r, comm->rank,
                                   zccl__cfg_str(must_match[i]));
            }
    return ZCCL_SUCCESS;
}

static void comm_free(struct zccl_comm *comm) {
    if (!comm) return;
    if (comm->service_running) {
        if (write(comm->stop_pipe[1], "x", 1) < 0) { /* the thread also exits when the pipe closes */ }
        pthread_join(comm->service_thread, NULL);
    }
    for (size_t t = 0; t < NTRANSPORTS; t++) transports[t]->comm_teardown(comm);
    if (comm->stop_pipe[0] >= 0) close(comm->stop_pipe[0]);
    if (comm->stop_pipe[1] >= 0) close(comm->stop_pipe[1]);
    if (comm->listen_fd >= 0) close(comm->listen_fd);
    if (comm->in_fd)
        for (int i = 0; i < comm->nranks; i++)
            if (comm->in_fd[i] >= 0) close(comm->in_fd[i]);
    free(comm->in_fd);
    free(comm->peers);
    free(comm->tp);
    free(comm->ring);
    free(comm->scratch);
    free(comm->chunk_tmp);
    free(comm->desc_in);
    free(comm->desc_mark);
    zccl__notice_free(comm);
    zccl__tuner_free(comm);
    pthread_mutex_destroy(&comm->in_mutex);
    pthread_mutex_destroy(&comm->exec_mutex);
    pthread_cond_destroy(&comm->shrink_cv);
    free(comm);
}

/* ---- init --------------------------------------------------------------------------------------------------- */

static zccl_result_t choose_transports(struct zccl_comm *comm) {
    const char *forced = zccl__cfg_str(ZCCL_CFG_TRANSPORT);
    const zccl_transport_ops_t *force = NULL;
    if (*forced) {
        for (size_t t = 0; t < NTRANSPORTS; t++)
            if (!strcasecmp(forced, transports[t]->name)) force = transports[t];
        if (!force) return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TRANSPORT=%s is not one of: shm, ib, tcp", forced);
    }
    int nshm = 0, ntcp = 0, nib = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank) { comm->tp[r] = force ? force : &zccl_transport_shm; continue; }
        const zccl_transport_ops_t *pick = NULL;
        if (force) {
            if (!force->can_reach(comm, r)) {
                size_t need, avail;
                if (force == &zccl_transport_shm && comm->peers[r].host_hash == comm->peers[comm->rank].host_hash &&
                    !zccl__shm_room(comm, &need, &avail))
                    return zccl__error(ZCCL_SYSTEM_ERROR, "ZCCL_TRANSPORT=shm: /dev/shm has %zu bytes free but the "
                                       "ranks of this host need %zu; enlarge it (docker: --shm-size), lower "
                                       "ZCCL_SHM_SLOTS / ZCCL_SHM_SLOT_BYTES, or allow TCP", avail, need);
                if (force == &zccl_transport_ib)
                    return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TRANSPORT=ib cannot reach rank %d: %s", r,
                                       !comm->peers[r].ib.addr.sa.ss_family ? "it has no usable RDMA device (see its "
                                       "INFO log)" : "its device is on another link layer, IB subnet or address "
                                       "family than this rank's");
                return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TRANSPORT=%s cannot reach rank %d (another host)",
                                   force->name, r);
            }
            pick = force;
        } else {
            for (size_t t = 0; t < NTRANSPORTS && !pick; t++) /* ordered by preference: shm, ib, tcp */
                if (transports[t]->can_reach(comm, r)) pick = transports[t];
        }
        comm->tp[r] = pick;
        if (pick == &zccl_transport_shm) nshm++;
        else if (pick == &zccl_transport_ib) nib++;
        else ntcp++;
        if (pick == &zccl_transport_ib || (pick == &zccl_transport_tcp && !force))
            ZCCL_INFO(ZCCL_LOG_INIT, "rank %d -> rank %d: %s%s", comm->rank, r, pick->name,
                      pick == &zccl_transport_ib ? "" : comm->peers[comm->rank].ib.addr.sa.ss_family
                      ? " (its host has no RDMA device this rank's reaches)" : " (no usable RDMA device on this rank)");
    }
    size_t need, avail;
    int first_local = comm->rank; /* the lowest rank of this host speaks for it */
    for (int r = comm->rank - 1; r >= 0; r--)
        if (comm->peers[r].host_hash == comm->peers[comm->rank].host_hash) first_local = r;
    if (!force && !zccl__shm_room(comm, &need, &avail) && comm->rank == first_local && nshm + ntcp > 0)
        ZCCL_WARN(ZCCL_LOG_SHM, "/dev/shm has %zu bytes free but the ranks of this host need %zu for shared memory: "
                  "using TCP between them (slower; enlarge /dev/shm, e.g. docker --shm-size, or lower "
                  "ZCCL_SHM_SLOTS / ZCCL_SHM_SLOT_BYTES)", avail, need);
    ZCCL_INFO(ZCCL_LOG_INIT, "rank %d of %d: %d peers over shm, %d over ib, %d over tcp", comm->rank, comm->nranks,
              nshm, nib, ntcp);
    return ZCCL_SUCCESS;
}

/* Where this rank runs (package, NUMA node, core, NIC distance). Advisory: it only orders the ring, so a
 * topology that cannot be read leaves the locality unknown instead of failing the communicator. */
static zccl_topo_t *process_topo;           /* loaded once per process: discovery takes milliseconds */
static zccl_result_t process_topo_res;
static char process_topo_err[512];
static pthread_once_t process_topo_once = PTHREAD_ONCE_INIT;
static void load_process_topo(void) {
    const char *f = zccl__cfg_str(ZCCL_CFG_TOPO_FILE);
    process_topo_res = *f ? zccl_topo_create_file(f, ZCCL_TOPO_THIS_SYSTEM, &process_topo)
                          : zccl_topo_create_live(&process_topo);
    if (process_topo_res != ZCCL_SUCCESS) snprintf(process_topo_err, sizeof process_topo_err, "%s", zccl__last_error());
}

static zccl_result_t locality_self(zccl_locality_t *loc, uint64_t host) {
    pthread_once(&process_topo_once, load_process_topo);
    zccl_result_t r = process_topo_res;
    const char *f = zccl__cfg_str(ZCCL_CFG_TOPO_FILE);
    if (r != ZCCL_SUCCESS && *f) /* the user named a file: not being able to use it is their error to see */
        return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TOPO_FILE=%s cannot be used: %s", f, process_topo_err);
    if (r == ZCCL_SUCCESS) r = zccl_topo_locality_self(process_topo, host, loc);
    if (r != ZCCL_SUCCESS) {
        ZCCL_INFO(ZCCL_LOG_TOPO, "topology unavailable (%s); ring in rank order within this host", process_topo_err);
        memset(loc, 0, sizeof *loc);
        loc->host = host;
        loc->package = loc->numa = loc->core = -1;
        loc->nic_path = ZCCL_TOPO_NO_NIC;
    }
    return ZCCL_SUCCESS;
}

/* An explicit ring, "3,1,0,2": must name every rank exactly once. */
static zccl_result_t parse_ring(const char *spec, int n, int *ring) {
    char *seen = calloc((size_t)n, 1);
    if (!seen) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    const char *p = spec;
    int i = 0;
    zccl_result_t res = ZCCL_SUCCESS;
    while (*p && res == ZCCL_SUCCESS) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= n || seen[v] || i >= n)
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_RING_ORDER=%s is not topo, rank, or a permutation of the "
                              "%d ranks (e.g. \"3,1,0,2\")", spec, n);
        else {
            seen[v] = 1;
            ring[i++] = (int)v;
            p = (*end == ',') ? end + 1 : end;
            if (*end && *end != ',') p = end, res = zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_RING_ORDER=%s: unexpected "
                                                              "character '%c'", spec, *end);
        }
    }
    if (res == ZCCL_SUCCESS && i != n)
        res = zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_RING_ORDER=%s names %d ranks; the communicator has %d", spec,
                          i, n);
    free(seen);
    return res;
}

/* The ring every rank uses, computed from everyone's locality by the same deterministic function. */
static zccl_result_t choose_ring(struct zccl_comm *comm) {
    const int n = comm->nranks;
    comm->ring = malloc((size_t)n * sizeof(int));
    zccl_locality_t *locs = malloc((size_t)n * sizeof *locs);
    if (!comm->ring || !locs) {
        free(locs);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the ring of %d ranks", n);
    }
    for (int r = 0; r < n; r++) locs[r] = comm->peers[r].loc;
    const char *how = zccl__cfg_str(ZCCL_CFG_RING_ORDER);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!strcasecmp(how, "rank")) {
        for (int r = 0; r < n; r++) comm->ring[r] = r;
    } else if (!strcasecmp(how, "topo")) {
        res = zccl_topo_ring_order(locs, n, comm->ring);
    } else {
        res = parse_ring(how, n, comm->ring);
    }
    if (res == ZCCL_SUCCESS && zccl__log_level >= ZCCL_LOG_INFO && comm->rank == 0) {
        zccl_ring_crossings_t c;
        zccl_topo_ring_crossings(locs, n, comm->ring, &c);
        size_t len = zccl_topo_ring_format(comm->ring, n, NULL, 0) + 1;
        char *buf = malloc(len);
        if (buf) {
            zccl_topo_ring_format(comm->ring, n, buf, len);
            ZCCL_INFO(ZCCL_LOG_TOPO, "ring %s (boundary crossings: host %d, package %d, numa %d)", buf, c.host,
                      c.package, c.numa);
            free(buf);
        }
    }
    free(locs);
    return res;
}

/* TCP needs two descriptors per remote peer (one per direction). Check the limit before connecting, raising the
 * soft limit up to the hard one if needed, so a low `ulimit -n` fails here with the number needed instead of as a
 * stray EMFILE in the middle of a collective. */
static zccl_result_t check_fd_limit(struct zccl_comm *comm) {
    int ntcp = 0;
    for (int r = 0; r < comm->nranks; r++) ntcp += (r != comm->rank && comm->tp[r] == &zccl_transport_tcp);
    size_t open_now = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        while (readdir(d)) open_now++;
        closedir(d);
    }
    const rlim_t need = (rlim_t)open_now + 2u * (rlim_t)ntcp + 16u; /* + a margin for the application */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need) return ZCCL_SUCCESS;
    if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need) {
        struct rlimit up = {need, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
            ZCCL_INFO(ZCCL_LOG_INIT, "raised the open-file limit from %llu to %llu for %d TCP peers",
                      (unsigned long long)rl.rlim_cur, (unsigned long long)need, ntcp);
            return ZCCL_SUCCESS;
        }
    }
    return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d needs about %llu open files (%zu open now + 2 per TCP peer x %d "
                       "peers) but RLIMIT_NOFILE is %llu (hard limit %llu); raise it (ulimit -n) or use fewer ranks per "
                       "process", comm->rank, (unsigned long long)need, open_now, ntcp,
                       (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
}

/* Polling keeps latency low only while every rank of the host has a core; with more ranks than cores a poller
 * steals the core its peer needs to make progress, so such ranks sleep at once and are woken by their peers. */
static zccl_result_t choose_spin(struct zccl_comm *comm) {
    int64_t us;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_SPIN_US, &us));
    int local = 0;
    for (int r = 0; r < comm->nranks; r++) local += comm->peers[r].host_hash == comm->peers[comm->rank].host_hash;
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (us < 0) us = (local <= cpus) ? 50 : 0;
    comm->spin_ns = (uint64_t)us * 1000u;
    ZCCL_INFO(ZCCL_LOG_INIT, "rank %d: %d ranks on this host, %d cores available: poll %lld us before sleeping",
              comm->rank, local, cpus, (long long)us);
    return ZCCL_SUCCESS;
}

static zccl_result_t comm_init(zccl_comm_t *out, int nranks, const zccl_id_info_t *id, int rank) {
    zccl_result_t res;
    struct zccl_comm *comm = calloc(1, sizeof *comm);
    if (!comm) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a communicator");
    comm->rank = rank;
    comm->nranks = nranks;
    comm->comm_id = id->comm_id;
    memcpy(comm->secret, id->secret, ZCCL_SECRET_BYTES);
    comm->listen_fd = -1;
    comm->stop_pipe[0] = comm->stop_pipe[1] = -1;
    comm->doorbell = &comm->local_doorbell[0];
    comm->sleeping = &comm->local_doorbell[1];
    pthread_mutex_init(&comm->in_mutex, NULL);
    pthread_mutex_init(&comm->exec_mutex, NULL);
    pthread_cond_init(&comm->shrink_cv, NULL);
    zccl__log_set_rank(rank);

    int64_t v, init_ms;
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, &init_ms), res, fail);
    const uint64_t deadline = zccl__now_ns() + (uint64_t)init_ms * 1000000ull;
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_TIMEOUT_MS, &comm->timeout_ms), res, fail);
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_RS_ROUND_BYTES, &v), res, fail);
    comm->rs_round_bytes = (size_t)v;
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_CHECK, &v), res, fail);
    comm->check = v != 0;
    comm->op_name = "init";
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_CHUNK_BYTES, &v), res, fail);
    comm->chunk_bytes = (size_t)v & ~(size_t)63;
    if (posix_memalign((void **)&comm->chunk_tmp, 4096, comm->chunk_bytes) != 0) {
        comm->chunk_tmp = NULL;
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a %zu-byte bounce buffer", comm->chunk_bytes);
        goto fail;
    }
    comm->peers = calloc((size_t)nranks, sizeof *comm->peers);
    comm->tp = calloc((size_t)nranks, sizeof *comm->tp);
    comm->in_fd = malloc((size_t)nranks * sizeof(int));
    if (!comm->peers || !comm->tp || !comm->in_fd) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %d peers", nranks);
        goto fail;
    }
    for (int i = 0; i < nranks; i++) comm->in_fd[i] = -1;

    /* Listen on the interface that reaches the root; peers connect here for data. */
    zccl_sockaddr_t local;
    ZCCL_CHECK_GOTO(zccl__pick_local_addr(&id->root, &local), res, fail);
    if (local.sa.ss_family == AF_INET) ((struct sockaddr_in *)&local.sa)->sin_port = 0;
    else ((struct sockaddr_in6 *)&local.sa)->sin6_port = 0;
    ZCCL_CHECK_GOTO(zccl__listen(&local, &comm->listen_fd), res, fail);
    if (pipe2(comm->stop_pipe, O_CLOEXEC) != 0) {
        res = zccl__syserror(errno, "pipe for the service thread");
        goto fail;
    }
    int rc = pthread_create(&comm->service_thread, NULL, service_main, comm);
    if (rc != 0) {
        res = zccl__syserror(rc, "cannot start the connection service thread");
        goto fail;
    }
    comm->service_running = true;

    zccl_peer_info_t me = {0};
    me.rank = rank;
    me.pid = (int32_t)getpid();
    me.host_hash = zccl__host_hash();
    me.listen = local;
    if (cma_probe_word == 0) {
        uint64_t r = 0;
        while (r == 0) getrandom(&r, sizeof r, 0);
        cma_probe_word = r;
    }
    me.cma_probe = (uint64_t)(uintptr_t)&cma_probe_word;
    struct statvfs vfs;
    me.shm_free = statvfs("/dev/shm", &vfs) == 0 ? (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize : 0;
    me.cma_probe_value = cma_probe_word;
    ZCCL_CHECK_GOTO(locality_self(&me.loc, me.host_hash), res, fail);
    ZCCL_CHECK_GOTO(zccl__ib_local_info(comm, &me.ib), res, fail);
    cfg_hashes(me.cfg_hash);
    ZCCL_CHECK_GOTO(zccl__bootstrap_join(comm, id, &me, deadline), res, fail);
    ZCCL_CHECK_GOTO(check_settings_match(comm), res, fail);
    ZCCL_CHECK_GOTO(choose_ring(comm), res, fail);
    ZCCL_CHECK_GOTO(choose_transports(comm), res, fail);
    ZCCL_CHECK_GOTO(choose_spin(comm), res, fail);
    ZCCL_CHECK_GOTO(check_fd_limit(comm), res, fail);
    ZCCL_CHECK_GOTO(zccl__tuner_setup(comm), res, fail);
    for (size_t t = 0; t < NTRANSPORTS; t++) {
        bool used = false;
        for (int r = 0; r < nranks; r++) used |= (comm->tp[r] == transports[t] && r != rank);
        if (used) /* a transport no peer uses sets nothing up (a lone rank creates no shared memory) */
            ZCCL_CHECK_GOTO(transports[t]->comm_setup(comm), res, fail);
    }
    /* Every peer has mapped our inbox once it passes this barrier; the name can go. */
    if (nranks > 1) {
        int64_t saved = comm->timeout_ms;
        comm->timeout_ms = init_ms;
        res = zccl_barrier(comm, NULL);
        comm->timeout_ms = saved;
        if (res != ZCCL_SUCCESS) goto fail;
    }
    zccl__shm_unlink_own(comm);
    {   /* alpha, beta, gamma measured (or read) and agreed by every rank; bounded by the init deadline */
        int64_t saved = comm->timeout_ms;
        comm->timeout_ms = init_ms;
        res = zccl__tuner_calibrate(comm);
        comm->timeout_ms = saved;
        if (res != ZCCL_SUCCESS) goto fail;
    }
    ZCCL_INFO(ZCCL_LOG_INIT, "rank %d of %d ready (communicator %016llx)", rank, nranks,
              (unsigned long long)comm->comm_id);
    *out = comm;
    return ZCCL_SUCCESS;
fail:
    comm_free(comm);
    return res;
}

ZCCL_API zccl_result_t zccl_get_unique_id(zccl_unique_id_t *id) {
    zccl__log_init();
    if (!id) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_get_unique_id: argument 'id' is NULL");
    zccl_sockaddr_t addr;
    ZCCL_CHECK(zccl__pick_local_addr(NULL, &addr));
    if (addr.sa.ss_family == AF_INET) ((struct sockaddr_in *)&addr.sa)->sin_port = 0;
    else ((struct sockaddr_in6 *)&addr.sa)->sin6_port = 0;
    int fd;
    ZCCL_CHECK(zccl__listen(&addr, &fd));
    uint8_t secret[ZCCL_SECRET_BYTES];
    if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
        close(fd);
        return zccl__syserror(errno, "getrandom for the job secret");
    }
    zccl_result_t res = zccl__root_start(fd, secret);
    if (res != ZCCL_SUCCESS) { close(fd); return res; }
    zccl__id_encode(&addr, secret, id);
    char as[80];
    ZCCL_INFO(ZCCL_LOG_BOOT, "unique id created; bootstrap root listening on %s", zccl__sockaddr_str(&addr, as, sizeof as));
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_init_rank(zccl_comm_t *comm, int nranks, zccl_unique_id_t id, int rank) {
    zccl__log_init();
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_rank: argument 'comm' is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > 65536)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_rank: argument 'nranks' = %d is outside [1, 65536]", nranks);
    if (rank < 0 || rank >= nranks)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_rank: argument 'rank' = %d is outside [0, nranks-1 = %d]",
                           rank, nranks - 1);
    zccl_id_info_t info;
    ZCCL_CHECK(zccl__id_decode(&id, &info));
    return comm_init(comm, nranks, &info, rank);
}

static zccl_result_t env_int(const char *name, int lo, int hi, int *out, bool *found) {
    const char *v = getenv(name);
    *found = (v && *v);
    if (!*found) return ZCCL_SUCCESS;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=\"%s\" is not an integer in [%d, %d]", name, v, lo, hi);
    *out = (int)x;
    return ZCCL_SUCCESS;
}

static zccl_result_t parse_secret(const char *hex, uint8_t out[ZCCL_SECRET_BYTES]) {
    if (strlen(hex) != 2 * ZCCL_SECRET_BYTES) goto bad;
    for (int i = 0; i < 2 * ZCCL_SECRET_BYTES; i++) {
        const char ch = hex[i];
        int v = (ch >= '0' && ch <= '9') ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
              : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : -1;
        if (v < 0) goto bad;
        out[i / 2] = (uint8_t)((i % 2) ? (out[i / 2] | v) : (v << 4));
    }
    return ZCCL_SUCCESS;
bad:
    return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_SECRET must be exactly 32 hexadecimal digits");
}

ZCCL_API zccl_result_t zccl_comm_init_env(zccl_comm_t *comm) {
    zccl__log_init();
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: argument 'comm' is NULL");
    *comm = NULL;
    int rank = -1, size = -1, port = -1;
    bool fr = false, fs = false, fp;
    static const char *pairs[][2] = {{"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                     {"PMI_RANK", "PMI_SIZE"}};
    const char *used = NULL;
    for (size_t i = 0; i < 3 && !fr; i++) {
        ZCCL_CHECK(env_int(pairs[i][0], 0, 65535, &rank, &fr));
        ZCCL_CHECK(env_int(pairs[i][1], 1, 65536, &size, &fs));
        if (fr != fs)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "environment sets %s but not %s", fr ? pairs[i][0] : pairs[i][1],
                               fr ? pairs[i][1] : pairs[i][0]);
        if (fr) used = pairs[i][0];
    }
    if (!fr)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: none of RANK/WORLD_SIZE (torchrun, zcclrun), "
                           "OMPI_COMM_WORLD_RANK/SIZE (Open MPI) or PMI_RANK/PMI_SIZE (MPICH) is set");
    if (rank >= size)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=%d is not below the world size %d", used, rank, size);
    const char *addr = getenv("MASTER_ADDR");
    if (!addr || !*addr)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: MASTER_ADDR is not set (the bootstrap root's host)");
    ZCCL_CHECK(env_int("MASTER_PORT", 1, 65535, &port, &fp));
    if (!fp) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: MASTER_PORT is not set");

    uint8_t secret[ZCCL_SECRET_BYTES];
    const char *hex = zccl__cfg_str(ZCCL_CFG_SECRET);
    if (*hex) {
        ZCCL_CHECK(parse_secret(hex, secret));
    } else {
        /* No secret handed out: derive one every rank can compute. It separates jobs, it does not protect. */
        char buf[512];
        const char *run = getenv("TORCHELASTIC_RUN_ID");
        snprintf(buf, sizeof buf, "zccl|%s|%d|%s", addr, port, run ? run : "");
        uint8_t d[32];
        SHA256((const unsigned char *)buf, strlen(buf), d);
        memcpy(secret, d, sizeof secret);
        if (rank == 0)
            ZCCL_INFO(ZCCL_LOG_INIT, "ZCCL_SECRET not set: using a secret derived from MASTER_ADDR/MASTER_PORT; set "
                      "ZCCL_SECRET (zcclrun does) to keep other users out");
    }
    zccl_sockaddr_t root;
    ZCCL_CHECK(zccl__resolve(addr, port, &root));
    if (rank == 0) { /* rank 0 hosts the bootstrap root on MASTER_PORT, on every interface */
        zccl_sockaddr_t any = {0};
        any.sa.ss_family = root.sa.ss_family;
        if (root.sa.ss_family == AF_INET) {
            ((struct sockaddr_in *)&any.sa)->sin_port = htons((uint16_t)port);
            any.len = sizeof(struct sockaddr_in);
        } else {
            ((struct sockaddr_in6 *)&any.sa)->sin6_port = htons((uint16_t)port);
            any.len = sizeof(struct sockaddr_in6);
        }
        int fd;
        zccl_result_t res = zccl__listen(&any, &fd);
        if (res != ZCCL_SUCCESS)
            return zccl__error(res, "rank 0 cannot host the bootstrap root on MASTER_PORT=%d: %s", port,
                               zccl__last_error());
        res = zccl__root_start(fd, secret);
        if (res != ZCCL_SUCCESS) { close(fd); return res; }
    }
    zccl_unique_id_t id;
    zccl__id_encode(&root, secret, &id);
    zccl_id_info_t info;
    ZCCL_CHECK(zccl__id_decode(&id, &info));
    return comm_init(comm, size, &info, rank);
}

ZCCL_API zccl_result_t zccl_comm_destroy(zccl_comm_t comm) {
    if (!comm) return ZCCL_SUCCESS;
    if (zccl__stream_busy_with(comm))
        return zccl__error(ZCCL_INVALID_USAGE, "zccl_comm_destroy: a stream still holds unfinished operations of this "
                           "communicator; synchronize it first");
    pthread_mutex_lock(&comm->exec_mutex); /* wait for an operation in flight */
    pthread_mutex_unlock(&comm->exec_mutex);
    comm_free(comm);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_abort(zccl_comm_t comm) {
    if (!comm) return ZCCL_SUCCESS;
    __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
    zccl__doorbell_ring(comm, comm->rank); /* a collective sleeping on its doorbell wakes, sees `aborted`, returns */
    zccl__stream_forget(comm);             /* queued operations fail; waits for a stream running one of ours */
    pthread_mutex_lock(&comm->exec_mutex); /* waits for a blocking call in another thread to return */
    pthread_mutex_unlock(&comm->exec_mutex);
    comm_free(comm); /* closing the sockets makes peers see the loss at once instead of waiting for a deadline */
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_shrink(zccl_comm_t comm, const int *exclude, int nexclude, zccl_comm_t *newcomm) {
    const char *fn = "zccl_comm_shrink";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (!newcomm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'newcomm' is NULL", fn);
    *newcomm = NULL;
    if (nexclude < 0 || nexclude >= comm->nranks || (nexclude > 0 && !exclude))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'nexclude' = %d must be in [0, nranks-1 = %d] with "
                           "'exclude' non-NULL when > 0", fn, nexclude, comm->nranks - 1);
    const int n = comm->nranks;
    char *out = calloc((size_t)n, 1);
    if (!out) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    zccl_result_t res = ZCCL_SUCCESS;
    for (int i = 0; i < nexclude && res == ZCCL_SUCCESS; i++) {
        const int r = exclude[i];
        if (r < 0 || r >= n || out[r])
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'exclude[%d]' = %d is out of range or listed twice", fn, i, r);
        else if (r == comm->rank)
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'exclude' lists the calling rank %d", fn, r);
        else out[r] = 1;
    }
    /* New ranks: the survivors in their old order. The lowest survivor hosts the new bootstrap root. */
    int newrank = 0, lowest = -1, nsurv = 0;
    for (int r = 0; r < n; r++) {
        if (out[r]) continue;
        if (lowest < 0) lowest = r;
        if (r == comm->rank) newrank = nsurv;
        nsurv++;
    }
    int64_t init_ms = 120000;
    if (res == ZCCL_SUCCESS) res = zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, &init_ms);
    if (res != ZCCL_SUCCESS) { /* rejected calls do not count as a shrink: survivors must agree on the number */
        free(out);
        return res;
    }
    const uint64_t deadline = zccl__now_ns() + (uint64_t)init_ms * 1000000ull;
    const uint64_t seq = ++comm->shrinks;
    zccl_id_info_t info;
    memset(&info, 0, sizeof info);
    memcpy(info.secret, comm->secret, ZCCL_SECRET_BYTES);
    /* Every survivor derives the same new communicator id from the old one, this shrink's number and the set. */
    uint8_t *idbuf = malloc(16 + (size_t)n);
    if (!idbuf && res == ZCCL_SUCCESS) res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    if (idbuf) {
        uint8_t d[SHA256_DIGEST_LENGTH];
        memcpy(idbuf, &comm->comm_id, 8);
        memcpy(idbuf + 8, &seq, 8);
        memcpy(idbuf + 16, out, (size_t)n);
        SHA256(idbuf, 16 + (size_t)n, d);
        memcpy(&info.comm_id, d, sizeof info.comm_id);
        free(idbuf);
    }
    if (res == ZCCL_SUCCESS && comm->rank == lowest) {
        /* Start the new root next to our listener, then tell every other survivor where it is. */
        zccl_sockaddr_t addr = comm->peers[comm->rank].listen;
        if (addr.sa.ss_family == AF_INET) ((struct sockaddr_in *)&addr.sa)->sin_port = 0;
        else ((struct sockaddr_in6 *)&addr.sa)->sin6_port = 0;
        int fd = -1;
        res = zccl__listen(&addr, &fd);
        if (res == ZCCL_SUCCESS) {
            res = zccl__root_start(fd, comm->secret);
            if (res != ZCCL_SUCCESS) close(fd);
        }
        info.root = addr;
        zccl_shrink_msg_t m;
        memset(&m, 0, sizeof m);
        m.shrink_seq = seq;
        m.root = addr;
        for (int r = 0; r < n && res == ZCCL_SUCCESS; r++) {
            if (out[r] || r == comm->rank) continue;
            zccl_conn_hdr_t h = {comm->comm_id, comm->rank, ZCCL_CONN_SHRINK};
            int cfd;
            res = zccl__connect_auth(&comm->peers[r].listen, comm->secret, &h, sizeof h, deadline, &cfd);
            if (res == ZCCL_SUCCESS) {
                res = zccl__send_all(cfd, &m, sizeof m, deadline, "shrink announcement");
                close(cfd);
            }
            if (res != ZCCL_SUCCESS)
                res = zccl__error(res, "%s: cannot tell surviving rank %d where the new communicator starts (exclude "
                                  "it too if it is lost): %s", fn, r, zccl__last_error());
        }
    } else if (res == ZCCL_SUCCESS) {
        /* Wait for the lowest survivor's announcement of this shrink. */
        pthread_mutex_lock(&comm->in_mutex);
        while (!(comm->shrink_known && comm->shrink_msg.shrink_seq == seq)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&comm->shrink_cv, &comm->in_mutex, &ts);
            if (zccl__now_ns() > deadline) break;
        }
        bool ok = comm->shrink_known && comm->shrink_msg.shrink_seq == seq;
        info.root = comm->shrink_msg.root;
        pthread_mutex_unlock(&comm->in_mutex);
        if (!ok)
            res = zccl__error(ZCCL_TIMEOUT, "%s: rank %d (the lowest survivor) did not announce the new communicator "
                              "within ZCCL_INIT_TIMEOUT_MS; do all survivors call zccl_comm_shrink with the same "
                              "'exclude' set?", fn, lowest);
    }
    free(out);
    if (res != ZCCL_SUCCESS) return res;
    ZCCL_INFO(ZCCL_LOG_INIT, "shrink #%llu: rank %d becomes rank %d of %d", (unsigned long long)seq, comm->rank,
              newrank, nsurv);
    return comm_init(newcomm, nsurv, &info, newrank);
}

/* ---- zccl_comm_split ----------------------------------------------------------------------------------------- */

typedef struct {
    int32_t color, key;
} split_entry_t;

typedef struct {
    uint32_t ok; /* 1: addr is where this group leader's bootstrap root listens; 0: the leader has none */
    uint32_t pad;
    zccl_sockaddr_t addr;
} split_root_t;

/* All-gather of `bytes` bytes per rank over comm, as one ordinary collective (same order rules, same errors). */
static zccl_result_t allgather_bytes(zccl_comm_t comm, const void *mine, void *all, size_t bytes) {
    zccl_op_t o = {.coll = ZCCL_COLL_ALLGATHER, .sendbuf = mine, .recvbuf = all, .count = bytes, .dt = ZCCL_UINT8, .op = ZCCL_SUM, .root = 0, .comm = comm};
    return zccl__op_run(&o);
}

ZCCL_API zccl_result_t zccl_comm_split(zccl_comm_t comm, int color, int key, zccl_comm_t *newcomm) {
    const char *fn = "zccl_comm_split";
    if (newcomm) *newcomm = NULL;
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (!newcomm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'newcomm' is NULL", fn);
    if (color < ZCCL_SPLIT_NOCOLOR)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'color' = %d must be >= 0 or ZCCL_SPLIT_NOCOLOR (-1)",
                           fn, color);
    if (zccl__stream_busy_with(comm))
        return zccl__error(ZCCL_INVALID_USAGE, "%s: comm has operations queued on a stream; synchronize it first, "
                           "since the split is ordered with comm's collectives", fn);
    const int n = comm->nranks;
    split_entry_t me = {color, key}, *all = calloc((size_t)n, sizeof *all);
    split_root_t *roots = calloc((size_t)n, sizeof *roots);
    int *members = malloc((size_t)n * sizeof *members);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!all || !roots || !members) res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %d ranks", fn, n);
    /* Every rank takes part in both exchanges, whatever happens locally, so no rank is left waiting. */
    int64_t init_ms = 120000;
    if (res == ZCCL_SUCCESS) res = zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, &init_ms);
    if (res != ZCCL_SUCCESS) goto out;
    res = allgather_bytes(comm, &me, all, sizeof me);
    if (res != ZCCL_SUCCESS) {
        res = zccl__error(res, "%s: exchanging colors failed: %s", fn, zccl__last_error());
        goto out;
    }
    const uint64_t seq = ++comm->splits;
    /* My group: ranks of my color, ordered by (key, old rank) — insertion sort keeps it stable and simple. */
    int nm = 0, newrank = -1;
    if (color != ZCCL_SPLIT_NOCOLOR) {
        for (int r = 0; r < n; r++) {
            if (all[r].color != color) continue;
            int i = nm++;
            while (i > 0 && all[members[i - 1]].key > all[r].key) { members[i] = members[i - 1]; i--; }
            members[i] = r;
        }
        for (int i = 0; i < nm; i++)
            if (members[i] == comm->rank) newrank = i;
    }
    /* Each group's new rank 0 starts a bootstrap root next to its listener; a second exchange tells the group where. */
    split_root_t mine = {0};
    zccl_result_t lead_res = ZCCL_SUCCESS;
    char lead_err[256] = "";
    if (newrank == 0) {
        zccl_sockaddr_t addr = comm->peers[comm->rank].listen;
        if (addr.sa.ss_family == AF_INET) ((struct sockaddr_in *)&addr.sa)->sin_port = 0;
        else ((struct sockaddr_in6 *)&addr.sa)->sin6_port = 0;
        int fd = -1;
        lead_res = zccl__listen(&addr, &fd);
        if (lead_res == ZCCL_SUCCESS) {
            lead_res = zccl__root_start(fd, comm->secret);
            if (lead_res != ZCCL_SUCCESS) close(fd);
        }
        if (lead_res == ZCCL_SUCCESS) {
            mine.ok = 1;
            mine.addr = addr;
        } else {
            snprintf(lead_err, sizeof lead_err, "%s", zccl__last_error());
        }
    }
    res = allgather_bytes(comm, &mine, roots, sizeof mine);
    if (res != ZCCL_SUCCESS) {
        res = zccl__error(res, "%s: exchanging bootstrap addresses failed: %s", fn, zccl__last_error());
        goto out;
    }
    if (color == ZCCL_SPLIT_NOCOLOR) goto out;
    const int leader = members[0];
    if (!roots[leader].ok) {
        res = newrank == 0 ? zccl__error(lead_res, "%s: cannot start the bootstrap root of color %d: %s", fn, color,
                                         lead_err)
                           : zccl__error(ZCCL_REMOTE_ERROR, "%s: rank %d (new rank 0 of color %d) could not start the "
                                         "group's bootstrap root", fn, leader, color);
        goto out;
    }
    const char *why = NULL;
    if (zccl__sockaddr_check(&roots[leader].addr, &why) != ZCCL_SUCCESS) {
        res = zccl__error(ZCCL_REMOTE_ERROR, "%s: rank %d sent an unusable root address: %s", fn, leader,
                          why ? why : "bad address");
        goto out;
    }
    zccl_id_info_t info;
    memset(&info, 0, sizeof info);
    memcpy(info.secret, comm->secret, ZCCL_SECRET_BYTES);
    info.root = roots[leader].addr;
    { /* The new id: derived from the old one, this split's number and the color, the same on every member. */
        uint8_t idbuf[8 + 8 + 4 + 5], d[SHA256_DIGEST_LENGTH];
        memcpy(idbuf, &comm->comm_id, 8);
        memcpy(idbuf + 8, &seq, 8);
        memcpy(idbuf + 16, &color, 4);
        memcpy(idbuf + 20, "split", 5);
        SHA256(idbuf, sizeof idbuf, d);
        memcpy(&info.comm_id, d, sizeof info.comm_id);
    }
    ZCCL_INFO(ZCCL_LOG_INIT, "split #%llu: rank %d joins color %d as rank %d of %d", (unsigned long long)seq,
              comm->rank, color, newrank, nm);
    res = comm_init(newcomm, nm, &info, newrank);
out:
    free(all);
    free(roots);
    free(members);
    return res;
}

ZCCL_API zccl_result_t zccl_comm_get_async_error(zccl_comm_t comm, zccl_result_t *async_error) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_get_async_error: argument 'comm' is NULL");
    if (!async_error)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_get_async_error: argument 'async_error' is NULL");
    zccl_result_t e = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    *async_error = e != ZCCL_SUCCESS ? e : (__atomic_load_n(&comm->aborted, __ATOMIC_ACQUIRE) ? ZCCL_REMOTE_ERROR
                                                                                              : ZCCL_SUCCESS);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_count(const zccl_comm_t comm, int *count) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_count: argument 'comm' is NULL");
    if (!count) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_count: argument 'count' is NULL");
    *count = comm->nranks;
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_rank(const zccl_comm_t comm, int *rank) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_rank: argument 'comm' is NULL");
    if (!rank) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_rank: argument 'rank' is NULL");
    *rank = comm->rank;
    return ZCCL_SUCCESS;
}

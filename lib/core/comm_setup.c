/*
 * comm_setup.c — the choices a communicator makes while it is created, once every rank's peer info is known: a
 * transport per peer (the first row of zccl__transports that reaches it, or ZCCL_TRANSPORT), where this rank runs,
 * the ring order, how long a waiting rank spins, and whether the process may open enough sockets.
 */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>
#include "comm.h"
#include "mem.h"
#include "mem_gdr.h"

/* ---- transports --------------------------------------------------------------------------------------------------- */

zccl_result_t zccl__comm_choose_transports(struct zccl_comm *comm) {
    zccl_tp_comm_t *tc = &comm->tc;
    const char *forced = zccl__cfg_str(ZCCL_CFG_TRANSPORT);
    const zccl_transport_ops_t *force = NULL;
    if (*forced && !(force = zccl__transport_by_name(forced))) {
        char names[128];
        int w = 0;
        for (size_t t = 0; zccl__transports[t] && w >= 0 && (size_t)w < sizeof names; t++)
            w += snprintf(names + w, sizeof names - (size_t)w, "%s%s", t ? ", " : "", zccl__transports[t]->name);
        return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TRANSPORT=%s is not one of: %s", forced, names);
    }
    int count[ZCCL_TRANSPORT_MAX] = {0};
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank) { tc->tp[r] = force ? force : zccl__transports[0]; continue; }
        const zccl_transport_ops_t *pick = NULL;
        if (force) {
            if (!force->can_reach(tc, r)) {
                char why[400] = "another host";
                const zccl_result_t cls = force->why_unreachable ? force->why_unreachable(tc, r, why, sizeof why)
                                                                 : ZCCL_INVALID_ARGUMENT;
                return zccl__error(cls, "ZCCL_TRANSPORT=%s cannot reach rank %d: %s", force->name, r, why);
            }
            pick = force;
        } else {
            for (size_t t = 0; zccl__transports[t] && !pick; t++) /* ordered by preference */
                if (zccl__transports[t]->can_reach(tc, r)) pick = zccl__transports[t];
        }
        tc->tp[r] = pick;
        for (size_t t = 0; zccl__transports[t]; t++) count[t] += zccl__transports[t] == pick;
        if (pick->link == ZCCL_LINK_NETWORK && !force && zccl__log_level >= ZCCL_LOG_INFO) {
            /* Say why each network transport preferred to it could not reach the peer. */
            char why[512] = "";
            int w = 0;
            for (size_t t = 0; zccl__transports[t] != pick && w >= 0 && (size_t)w < sizeof why; t++) {
                char one[400] = "";
                if (zccl__transports[t]->link != ZCCL_LINK_NETWORK || !zccl__transports[t]->why_unreachable) continue;
                zccl__transports[t]->why_unreachable(tc, r, one, sizeof one);
                w += snprintf(why + w, sizeof why - (size_t)w, " (%s: %s)", zccl__transports[t]->name, one);
            }
            ZCCL_INFO(ZCCL_LOG_INIT, "rank %d -> rank %d: %s%s", comm->rank, r, pick->name, why);
        }
    }
    size_t need, avail;
    int first_local = comm->rank; /* the lowest rank of this host speaks for it */
    for (int r = comm->rank - 1; r >= 0; r--)
        if (tc->peers[r].host_hash == tc->peers[comm->rank].host_hash) first_local = r;
    int nlocal = 0;
    for (int r = 0; r < comm->nranks; r++)
        nlocal += r != comm->rank && tc->peers[r].host_hash == tc->peers[comm->rank].host_hash;
    if (!force && !zccl__shm_room(tc, &need, &avail) && comm->rank == first_local && nlocal > 0)
        ZCCL_WARN(ZCCL_LOG_SHM, "/dev/shm has %zu bytes free but the ranks of this host need %zu for shared memory: "
                  "using TCP between them (slower; enlarge /dev/shm, e.g. docker --shm-size, or lower "
                  "ZCCL_SHM_SLOTS / ZCCL_SHM_SLOT_BYTES)", avail, need);
    char line[256];
    int w = snprintf(line, sizeof line, "rank %d of %d:", comm->rank, comm->nranks);
    for (size_t t = 0; zccl__transports[t] && w > 0 && (size_t)w < sizeof line; t++)
        w += snprintf(line + w, sizeof line - (size_t)w, "%s %d peers over %s", t ? "," : "", count[t],
                      zccl__transports[t]->name);
    ZCCL_INFO(ZCCL_LOG_INIT, "%s", line);
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

const zccl_topo_t *zccl__comm_process_topo(void) {
    pthread_once(&process_topo_once, load_process_topo);
    return process_topo_res == ZCCL_SUCCESS ? process_topo : NULL;
}

zccl_result_t zccl__comm_locality_self(zccl_locality_t *loc, uint64_t host) {
    pthread_once(&process_topo_once, load_process_topo);
    zccl_result_t r = process_topo_res;
    const char *f = zccl__cfg_str(ZCCL_CFG_TOPO_FILE);
    if (r != ZCCL_SUCCESS && *f) /* the user named a file: not being able to use it is their error to see */
        return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_TOPO_FILE=%s cannot be used: %s", f, process_topo_err);
    const char *why = process_topo_err;
    if (r == ZCCL_SUCCESS && (r = zccl_topo_locality_self(process_topo, host, loc)) != ZCCL_SUCCESS)
        why = zccl__last_error(); /* the model loaded but cannot place this process (a file without CPUs) */
    if (r != ZCCL_SUCCESS) {
        ZCCL_INFO(ZCCL_LOG_TOPO, "topology unavailable (%s); ring in rank order within this host", why);
        memset(loc, 0, sizeof *loc);
        loc->host = host;
        loc->package = loc->numa = loc->core = -1;
        loc->nic_path = ZCCL_TOPO_NO_NIC;
    }
    return ZCCL_SUCCESS;
}

void zccl__comm_gpu_rails(zccl_tp_comm_t *tc) {
    tc->ngpu_nics = 0;
    const int gpu = zccl__mem_caller_gpu();
    if (gpu < 0) return;
    zccl_gpu_gdr_t g;
    zccl__mem_gpu_gdr(gpu, &g);
    const zccl_topo_t *t = zccl__comm_process_topo();
    tc->ngpu_nics = zccl_topo_gpu_nic_names(t, g.busid, tc->gpu_nic, ZCCL_GPU_NICS_MAX);
    char names[ZCCL_GPU_NICS_MAX * (ZCCL_TOPO_NAME_LEN + 1)] = "";
    size_t o = 0;
    for (int i = 0; i < tc->ngpu_nics && o < sizeof names; i++)
        o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? "," : "", tc->gpu_nic[i]);
    if (tc->ngpu_nics)
        ZCCL_INFO(ZCCL_LOG_TOPO, "rank %d: CUDA device %d (PCI %s) pairs with NIC %s: its rails start there", tc->rank,
                  gpu, g.busid, names);
    else
        ZCCL_INFO(ZCCL_LOG_TOPO, "rank %d: CUDA device %d (PCI %s): no NIC paired with it (%s); rails start at rank "
                  "order", tc->rank, gpu, g.busid[0] ? g.busid : "no bus id",
                  !t ? "no topology" : !g.busid[0] ? "the driver gives no PCI bus id"
                                                   : "not in the topology, or no NIC nearer than the others");
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
zccl_result_t zccl__comm_choose_ring(struct zccl_comm *comm) {
    const int n = comm->nranks;
    comm->ring = malloc((size_t)n * sizeof(int));
    zccl_locality_t *locs = malloc((size_t)n * sizeof *locs);
    if (!comm->ring || !locs) {
        free(locs);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the ring of %d ranks", n);
    }
    for (int r = 0; r < n; r++) locs[r] = comm->tc.peers[r].loc;
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

/* A transport may need descriptors per remote peer (TCP: two, one per direction). Check the limit before connecting, raising the
 * soft limit up to the hard one if needed, so a low `ulimit -n` fails here with the number needed instead of as a
 * stray EMFILE in the middle of a collective. */
zccl_result_t zccl__comm_check_fd_limit(struct zccl_comm *comm) {
    rlim_t nfds = 0;
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank) nfds += comm->tc.tp[r]->fds_per_peer;
    size_t open_now = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        while (readdir(d)) open_now++;
        closedir(d);
    }
    const rlim_t need = (rlim_t)open_now + nfds + 16u; /* + a margin for the application */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need) return ZCCL_SUCCESS;
    if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need) {
        struct rlimit up = {need, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
            ZCCL_INFO(ZCCL_LOG_INIT, "raised the open-file limit from %llu to %llu for %llu transport sockets",
                      (unsigned long long)rl.rlim_cur, (unsigned long long)need, (unsigned long long)nfds);
            return ZCCL_SUCCESS;
        }
    }
    return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d needs about %llu open files (%zu open now + %llu for its peers' "
                       "connections, 2 per TCP peer) but RLIMIT_NOFILE is %llu (hard limit %llu); raise it (ulimit -n) or use fewer ranks per "
                       "process", comm->rank, (unsigned long long)need, open_now, (unsigned long long)nfds,
                       (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
}

zccl_result_t zccl__cpu_ranks(int local, int *sharing) {
    int64_t m = 0;
    ZCCL_CHECK(zccl__cfg_int(&zccl__set_machine_ranks, &m)); /* a bad value fails creation, as every setting's */
    *sharing = m > local ? (int)m : local;
    return ZCCL_SUCCESS;
}

/* Polling keeps latency low only while every rank of the host has a core; with more ranks than cores a poller
 * steals the core its peer needs to make progress, so such ranks sleep at once and are woken by their peers. */
zccl_result_t zccl__comm_choose_spin(struct zccl_comm *comm) {
    int64_t us;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_SPIN_US, &us));
    int local = 0;
    for (int r = 0; r < comm->nranks; r++) local += comm->tc.peers[r].host_hash == comm->tc.peers[comm->rank].host_hash;
    ZCCL_CHECK(zccl__cpu_ranks(local, &local)); /* ZCCL_MACHINE_RANKS: simulated hosts sharing one machine's cores */
    const int cpus = zccl__cpus_for_ranks(local);
    if (us < 0) us = (local <= cpus) ? 50 : 0;
    comm->spin_ns = (uint64_t)us * 1000u;
    int64_t yield;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_WAIT_YIELD, &yield));
    if (yield < 0) yield = local > cpus;
    comm->tc.wait_yield = (int)yield;
    /* A stream adds a thread per rank: its polling pays only where the caller's thread keeps a core of its own. */
    int64_t sus;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_STREAM_SPIN_US, &sus));
    if (sus < 0) sus = (2 * local <= cpus) ? us : 0;
    comm->stream_spin_ns = (uint64_t)sus * 1000u;
    ZCCL_INFO(ZCCL_LOG_INIT, "rank %d: %d ranks share this machine's cores, %d cores available: poll %lld us, then %s",
              comm->rank, local, cpus, (long long)us, yield ? "yield the core between looks" : "sleep");
    return ZCCL_SUCCESS;
}

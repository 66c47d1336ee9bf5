/*
 * comm_init.c — creating and destroying communicators.
 *
 * zccl_comm_init_rank: open this rank's listening socket and start the service thread that admits peers' data
 * connections; join the bootstrap root to learn every rank's address and host; choose a transport per peer
 * (shared memory on the same host, IB or TCP otherwise, or ZCCL_TRANSPORT); let each transport set itself up;
 * finish with a barrier so every peer has mapped what it needs before shared-memory names are removed; calibrate
 * the tuner. Split and shrink (comm_split.c) create communicators through zccl__comm_init too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <openssl/sha.h>
#include "zccl_version.h"
#include "api.h"
#include "bootstrap.h"
#include "comm.h"
#include "regmem.h"
#include "engine.h"
#include "stream.h"
#include "tuner.h"

void zccl__comm_release(struct zccl_comm *comm) {
    if (!comm) return;
    zccl__hier_free(comm, false);
    zccl__wire_scratch_free(comm);
    zccl__redop_forget(comm);
    zccl__tuner_free(comm);
    zccl__comm_free(comm);
}

zccl_result_t zccl__comm_init(zccl_comm_t *out, int nranks, const zccl_id_info_t *id, int rank) {
    struct zccl_comm *comm = calloc(1, sizeof *comm);
    if (!comm) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a communicator");
    return zccl__comm_init_into(comm, out, nranks, id, rank);
}

static zccl_result_t comm_init_body(struct zccl_comm *comm, zccl_comm_t *out, int nranks, const zccl_id_info_t *id,
                                    int rank);

zccl_result_t zccl__comm_init_into(struct zccl_comm *comm, zccl_comm_t *out, int nranks, const zccl_id_info_t *id,
                                   int rank) {
    const int group = zccl__group_suspend(); /* the creation's own collectives are not part of a caller's group */
    const zccl_result_t res = comm_init_body(comm, out, nranks, id, rank);
    zccl__group_resume(group);
    return res;
}

static zccl_result_t comm_init_body(struct zccl_comm *comm, zccl_comm_t *out, int nranks, const zccl_id_info_t *id,
                                    int rank) {
    zccl_result_t res;
    comm->rank = comm->tc.rank = rank;
    comm->nranks = comm->tc.nranks = nranks;
    comm->tc.comm_id = id->comm_id;
    memcpy(comm->tc.secret, id->secret, ZCCL_SECRET_BYTES);
    comm->listen_fd = -1;
    comm->stop_pipe[0] = comm->stop_pipe[1] = -1;
    comm->tc.doorbell = &comm->tc.local_doorbell[0];
    comm->tc.sleeping = &comm->tc.local_doorbell[1];
    pthread_mutex_init(&comm->tc.in_mutex, NULL);
    pthread_mutex_init(&comm->exec_mutex, NULL);
    pthread_cond_init(&comm->shrink_cv, NULL);
    zccl__log_set_rank(rank);
    /* Once per job: rank 0 of the first communicator a process creates (not again for splits or shrinks). */
    static int first_comm = 1;
    if (__atomic_exchange_n(&first_comm, 0, __ATOMIC_RELAXED) && rank == 0) {
#ifdef ZCCL_HAVE_IB
        const char *ib = "yes";
#else
        const char *ib = "no";
#endif
#ifdef ZCCL_HAVE_CUDA
        const char *cuda = "yes (GPUDirect RDMA registration)";
#else
        const char *cuda = "no";
#endif
        ZCCL_INFO(ZCCL_LOG_INIT, "zccl version %s (IB: %s, CUDA: %s)", ZCCL_VERSION_STRING, ib, cuda);
        zccl__config_warn_unknown();
    }

    int64_t v, init_ms;
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, &init_ms), res, fail);
    const uint64_t deadline = zccl__now_ns() + (uint64_t)init_ms * 1000000ull;
    comm->tc.init_timeout_ms = init_ms;
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_TIMEOUT_MS, &comm->timeout_ms), res, fail);
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_RS_ROUND_BYTES, &v), res, fail);
    comm->rs_round_bytes = (size_t)v;
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_CHECK, &v), res, fail);
    comm->check = v > 0;
    comm->rooted_desc = v >= 0;
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_SHM_REG_MIN_BYTES, &comm->reg_min_bytes), res, fail);
    comm->op_name = "init";
    ZCCL_CHECK_GOTO(zccl__cfg_int(ZCCL_CFG_CHUNK_BYTES, &v), res, fail);
    comm->tc.chunk_bytes = (size_t)v & ~(size_t)63;
    if (posix_memalign((void **)&comm->tc.chunk_tmp, 4096, comm->tc.chunk_bytes) != 0) {
        comm->tc.chunk_tmp = NULL;
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a %zu-byte bounce buffer", comm->tc.chunk_bytes);
        goto fail;
    }
    comm->tc.peers = calloc((size_t)nranks, sizeof *comm->tc.peers);
    comm->tc.tp = calloc((size_t)nranks, sizeof *comm->tc.tp);
    comm->tc.in_fd = malloc((size_t)nranks * sizeof(int));
    if (!comm->tc.peers || !comm->tc.tp || !comm->tc.in_fd) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %d peers", nranks);
        goto fail;
    }
    for (int i = 0; i < nranks; i++) comm->tc.in_fd[i] = -1;

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
    int rc = pthread_create(&comm->service_thread, NULL, zccl__comm_service_main, comm);
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
    if (__atomic_load_n(&zccl__cma_probe_word, __ATOMIC_ACQUIRE) == 0) {
        /* Several communicators may be created at once in one process (ncclCommInitAll's threads): the first
         * non-zero value wins and every one publishes that. */
        uint64_t r = 0, zero = 0;
        while (r == 0) getrandom(&r, sizeof r, 0);
        __atomic_compare_exchange_n(&zccl__cma_probe_word, &zero, r, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    me.cma_probe = (uint64_t)(uintptr_t)&zccl__cma_probe_word;
    struct statvfs vfs;
    me.shm_free = statvfs("/dev/shm", &vfs) == 0 ? (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize : 0;
    me.cma_probe_value = __atomic_load_n(&zccl__cma_probe_word, __ATOMIC_ACQUIRE);
    ZCCL_CHECK_GOTO(zccl__comm_locality_self(&me.loc, me.host_hash), res, fail);
    zccl__comm_gpu_rails(&comm->tc);
    ZCCL_CHECK_GOTO(zccl__ib_local_info(&comm->tc, &me.ib), res, fail);
    ZCCL_CHECK_GOTO(zccl__tcp_rails_local_info(&comm->tc, &me.tcp), res, fail);
    zccl__comm_cfg_hashes(me.cfg_hash);
    ZCCL_CHECK_GOTO(zccl__bootstrap_join(comm, id, &me, deadline), res, fail);
    ZCCL_CHECK_GOTO(zccl__comm_check_settings(comm), res, fail);
    ZCCL_CHECK_GOTO(zccl__comm_choose_ring(comm), res, fail);
    ZCCL_CHECK_GOTO(zccl__comm_choose_transports(comm), res, fail);
    ZCCL_CHECK_GOTO(zccl__comm_choose_spin(comm), res, fail);
    ZCCL_CHECK_GOTO(zccl__comm_check_fd_limit(comm), res, fail);
    ZCCL_CHECK_GOTO(zccl__tuner_setup(comm), res, fail);
    for (size_t t = 0; zccl__transports[t]; t++) {
        bool used = false;
        for (int r = 0; r < nranks; r++) used |= (comm->tc.tp[r] == zccl__transports[t] && r != rank);
        if (used) /* a transport no peer uses sets nothing up (a lone rank creates no shared memory) */
            ZCCL_CHECK_GOTO(zccl__transports[t]->comm_setup(&comm->tc), res, fail);
    }
    /* Every peer has mapped our inbox once it passes this barrier; the name can go. */
    if (nranks > 1) {
        int64_t saved = comm->timeout_ms;
        comm->timeout_ms = init_ms;
        res = zccl_barrier(comm, NULL);
        comm->timeout_ms = saved;
        if (res != ZCCL_SUCCESS) goto fail;
    }
    zccl__shm_unlink_own(&comm->tc);
    {   /* alpha, beta, gamma measured (or read) and agreed by every rank; bounded by the init deadline */
        int64_t saved = comm->timeout_ms;
        comm->timeout_ms = init_ms;
        res = zccl__tuner_calibrate(comm);
        comm->timeout_ms = saved;
        if (res != ZCCL_SUCCESS) goto fail;
    }
    {   /* the staged one-pass path's regions (lib/core/regmem.c): collective, bounded by the init deadline */
        int64_t saved = comm->timeout_ms;
        comm->timeout_ms = init_ms;
        res = zccl__stg_setup(comm);
        comm->timeout_ms = saved;
        if (res != ZCCL_SUCCESS) goto fail;
    }
    if (nranks > 1) { /* One small all-reduce on the path the tuner now chooses: the user's first collective then finds
                       * its code, its schedule's allocations and its peers' cache lines warm (a first 8-byte
                       * all-reduce took 4-17 us against 0.1-0.3 us for the next ones), and the ranks leave init
                       * closer together. Bounded by the init deadline like the barrier above. */
        float w[2] = {0, 0}, wo[2];
        int64_t saved = comm->timeout_ms;
        comm->timeout_ms = init_ms;
        res = zccl_allreduce(w, wo, 2, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL);
        comm->timeout_ms = saved;
        if (res != ZCCL_SUCCESS) goto fail;
    }
    comm->cseq_init = comm->cseq; /* messages count the user's collectives from #1 (zccl__seq_shown) */
    ZCCL_INFO(ZCCL_LOG_INIT, "rank %d of %d ready (communicator %016llx%s%s%s)", rank, nranks,
              (unsigned long long)comm->tc.comm_id, comm->name[0] ? " \"" : "", comm->name,
              comm->name[0] ? "\"" : "");
    *out = comm;
    return ZCCL_SUCCESS;
fail:
    zccl__comm_release(comm);
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
    return zccl__comm_init(comm, nranks, &info, rank);
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

/* The first host name of a Slurm node list: "node[01-04,07],gpu5" -> "node01", "r[1-2]-n[3,5]" -> "r1-n3", "a,b" ->
 * "a". Each bracket contributes its first number (zero padding kept); nothing after the first top-level comma is
 * read. Returns 0, or -1 when the list is empty, malformed or the name does not fit in len bytes. */
int zccl__slurm_first_host(const char *list, char *out, size_t len) {
    size_t n = 0;
    const char *p = list;
    if (!p || !len) return -1;
    while (*p && *p != ',') {
        if (*p == '[') {
            p++;
            const char *start = p;
            while (*p >= '0' && *p <= '9') p++;
            if (p == start || (*p != '-' && *p != ',' && *p != ']')) return -1;
            if (n + (size_t)(p - start) >= len) return -1;
            memcpy(out + n, start, (size_t)(p - start));
            n += (size_t)(p - start);
            while (*p && *p != ']') p++;
            if (*p != ']') return -1;
            p++;
            continue;
        }
        if (*p == ']' || n + 1 >= len) return -1;
        out[n++] = *p++;
    }
    out[n] = '\0';
    return n ? 0 : -1;
}

ZCCL_API zccl_result_t zccl_comm_init_env(zccl_comm_t *comm) {
    zccl__log_init();
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: argument 'comm' is NULL");
    *comm = NULL;
    int rank = -1, size = -1, port = -1;
    bool fr = false, fs = false, fp;
    /* Slurm's task variables count only inside a job step (srun): a batch script's own shell has SLURM_PROCID=0 and
     * SLURM_NTASKS of the whole allocation too, and would wait for ranks that never come. */
    const char *step = getenv("SLURM_STEP_ID");
    if (!step || !*step) step = getenv("SLURM_STEPID");
    const bool slurm_step = step && *step;
    static const char *pairs[][2] = {{"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                     {"PMI_RANK", "PMI_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}};
    const char *used = NULL;
    for (size_t i = 0; i < (slurm_step ? 4u : 3u) && !fr; i++) {
        ZCCL_CHECK(env_int(pairs[i][0], 0, 65535, &rank, &fr));
        ZCCL_CHECK(env_int(pairs[i][1], 1, 65536, &size, &fs));
        if (fr != fs)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "environment sets %s but not %s", fr ? pairs[i][0] : pairs[i][1],
                               fr ? pairs[i][1] : pairs[i][0]);
        if (fr) used = pairs[i][0];
    }
    if (!fr)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: none of RANK/WORLD_SIZE (torchrun, zcclrun), "
                           "OMPI_COMM_WORLD_RANK/SIZE (Open MPI), PMI_RANK/PMI_SIZE (MPICH) or SLURM_PROCID/"
                           "SLURM_NTASKS (srun) is set");
    if (rank >= size)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=%d is not below the world size %d", used, rank, size);
    const bool slurm = !strcmp(used, "SLURM_PROCID");
    char slurm_host[256];
    const char *addr = getenv("MASTER_ADDR");
    if ((!addr || !*addr) && slurm) {
        /* task 0 runs on the step's first node */
        const char *lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"};
        for (size_t i = 0; i < 2 && (!addr || !*addr); i++) {
            const char *l = getenv(lists[i]);
            if (!l || !*l) continue;
            if (zccl__slurm_first_host(l, slurm_host, sizeof slurm_host) != 0)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: cannot read the first host of "
                                   "%s=\"%s\"; set MASTER_ADDR", lists[i], l);
            addr = slurm_host;
            if (rank == 0)
                ZCCL_INFO(ZCCL_LOG_INIT, "MASTER_ADDR not set: bootstrap root on %s, the first node of %s", addr,
                          lists[i]);
        }
    }
    if (!addr || !*addr)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "MASTER_ADDR is not set (the bootstrap root's host)%s: export "
                           "MASTER_ADDR and MASTER_PORT to every rank (mpirun: -x MASTER_ADDR=host0 -x "
                           "MASTER_PORT=29500; zcclrun and torchrun set them)",
                           slurm ? ", nor SLURM_STEP_NODELIST or SLURM_JOB_NODELIST" : "");
    ZCCL_CHECK(env_int("MASTER_PORT", 1, 65535, &port, &fp));
    int job = 0, stepid = 0;
    bool fj = false, fst = false;
    if (!fp && slurm) {
        /* Every task of the step computes the same port from the job and step ids: 12000..31999, below Linux's
         * ephemeral range; two steps of one job running at once get different ports unless 20000 apart. */
        ZCCL_CHECK(env_int("SLURM_JOB_ID", 0, INT32_MAX, &job, &fj));
        ZCCL_CHECK(env_int(getenv("SLURM_STEP_ID") && *getenv("SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID", 0,
                           INT32_MAX, &stepid, &fst));
        if (fj) {
            port = 12000 + (int)(((unsigned)job + 7919u * (unsigned)stepid) % 20000u);
            fp = true;
            if (rank == 0)
                ZCCL_INFO(ZCCL_LOG_INIT, "MASTER_PORT not set: port %d from SLURM_JOB_ID=%d, step %d", port, job,
                          stepid);
        }
    }
    if (!fp)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_init_env: MASTER_PORT is not set%s",
                           slurm ? " (nor SLURM_JOB_ID to derive one from)" : "");
    /* torchrun's default (static) rendezvous keeps its own store listening on MASTER_PORT in the agent process and
     * tells the workers so with TORCHELASTIC_USE_AGENT_STORE: the bootstrap root then takes the next port. */
    const char *agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (agent_store && (!strcasecmp(agent_store, "true") || !strcmp(agent_store, "1"))) {
        port = port < 65535 ? port + 1 : port - 1;
        if (rank == 0)
            ZCCL_INFO(ZCCL_LOG_INIT, "torchrun's agent store holds MASTER_PORT: bootstrap root on port %d", port);
    }

    uint8_t secret[ZCCL_SECRET_BYTES];
    const char *hex = zccl__cfg_str(ZCCL_CFG_SECRET);
    if (*hex) {
        ZCCL_CHECK(parse_secret(hex, secret));
    } else {
        /* No secret handed out: derive one every rank can compute. It separates jobs, it does not protect. */
        char buf[512];
        const char *run = getenv("TORCHELASTIC_RUN_ID");
        if (slurm) snprintf(buf, sizeof buf, "zccl|%s|%d|slurm %d.%d", addr, port, job, stepid);
        else snprintf(buf, sizeof buf, "zccl|%s|%d|%s", addr, port, run ? run : "");
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
        /* up to a second for a port held by a connection about to go, before naming it as busy */
        zccl_result_t res = zccl__listen_busy(&any, &fd, 1000);
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
    return zccl__comm_init(comm, size, &info, rank);
}

ZCCL_API zccl_result_t zccl_comm_destroy(zccl_comm_t comm) {
    if (!comm) return ZCCL_SUCCESS;
    if (zccl__comm_settle(comm)) return ZCCL_SUCCESS; /* a failed non-blocking creation: only the handle was left */
    if (zccl__stream_busy_with(comm))
        return zccl__error(ZCCL_INVALID_USAGE, "zccl_comm_destroy: a stream still holds unfinished operations of this "
                           "communicator; synchronize it first");
    pthread_mutex_lock(&comm->exec_mutex); /* wait for an operation in flight */
    pthread_mutex_unlock(&comm->exec_mutex);
    zccl__comm_release(comm);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_abort(zccl_comm_t comm) {
    if (!comm) return ZCCL_SUCCESS;
    if (zccl__comm_settle(comm)) return ZCCL_SUCCESS;
    __atomic_store_n(&comm->tc.aborted, 1, __ATOMIC_RELEASE);
    zccl__doorbell_ring(&comm->tc, comm->rank); /* a collective sleeping on its doorbell wakes, sees `aborted`, returns */
    zccl__stream_forget(comm);             /* queued operations fail; waits for a stream running one of ours */
    pthread_mutex_lock(&comm->exec_mutex); /* waits for a blocking call in another thread to return */
    pthread_mutex_unlock(&comm->exec_mutex);
    zccl__hier_free(comm, true);
    zccl__comm_release(comm); /* closing the sockets makes peers see the loss at once instead of waiting for a deadline */
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_get_async_error(zccl_comm_t comm, zccl_result_t *async_error) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_get_async_error: argument 'comm' is NULL");
    if (!async_error)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_get_async_error: argument 'async_error' is NULL");
    const int nb = __atomic_load_n(&comm->nb_state, __ATOMIC_ACQUIRE);
    if (nb != ZCCL_SUCCESS) { /* non-blocking creation still running, or failed */
        if (nb != ZCCL_IN_PROGRESS) zccl__set_last_error(comm->nb_msg);
        *async_error = (zccl_result_t)nb;
        return ZCCL_SUCCESS;
    }
    zccl_result_t e = __atomic_load_n(&comm->tc.async_error, __ATOMIC_ACQUIRE);
    *async_error = e != ZCCL_SUCCESS ? e : (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE) ? ZCCL_REMOTE_ERROR
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

ZCCL_API zccl_result_t zccl_comm_net_info(zccl_comm_t comm, char *text, size_t len, int *nrails, int *max_socks) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_net_info: comm is NULL");
    char buf[512];
    zccl__tcp_rails_describe(&comm->tc, buf, sizeof buf, nrails, max_socks);
    /* No peer over TCP (all on this host's shared memory, or over verbs): say what carries the data instead. */
    int tcp_peers = 0;
    const char *other = NULL;
    for (int p = 0; p < comm->nranks; p++) {
        if (p == comm->rank || !comm->tc.tp || !comm->tc.tp[p]) continue;
        if (!strcmp(comm->tc.tp[p]->name, "tcp")) tcp_peers++;
        else if (!other) other = comm->tc.tp[p]->name;
    }
    if (tcp_peers == 0) {
        /* a transport with rails of its own (verbs) describes them, with the live ones per peer after a loss */
        const zccl_transport_ops_t *ops = NULL;
        for (int p = 0; p < comm->nranks && !ops; p++)
            if (p != comm->rank && comm->tc.tp && comm->tc.tp[p] && comm->tc.tp[p]->describe_rails)
                ops = comm->tc.tp[p];
        char rails[384] = "";
        const int n = ops ? ops->describe_rails(&comm->tc, rails, sizeof rails) : 0;
        if (n > 0) {
            snprintf(buf, sizeof buf, "no peer over TCP (%s: %s)", ops->name, rails);
            if (nrails) *nrails = n;
        } else if (!(nrails && *nrails > 0)) {
            snprintf(buf, sizeof buf, "no peer over TCP (%s)",
                     !other ? "no peers" : !strcmp(other, "shm") ? "every peer over shared memory" : other);
        }
    }
    if (text && len) snprintf(text, len, "%s", buf);
    return ZCCL_SUCCESS;
}

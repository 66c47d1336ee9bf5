/*
 * bootstrap.c — unique ids and the bootstrap root.
 *
 * The root is a thread of the process that created the id (zccl_get_unique_id) or of rank 0 (zccl_comm_init_env).
 * It only introduces the ranks to each other: once every rank has sent its address and host identity, each gets
 * the whole table and the root exits. Ranks then connect to each other directly, as they need to.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bootstrap.h"

#define ID_MAGIC 0x5a434944u /* "ZCID" */
#define ID_VERSION 1

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t addr_len;
    uint8_t addr[sizeof(struct sockaddr_in6)];
    uint8_t secret[ZCCL_SECRET_BYTES];
} id_layout_t;
_Static_assert(sizeof(id_layout_t) <= ZCCL_UNIQUE_ID_BYTES, "unique id layout too large");

/* What a rank sends the root after the handshake. */
typedef struct {
    int32_t rank;
    int32_t nranks;
    zccl_peer_info_t info;
} root_hello_t;

/* The root's answer: status, then on success nranks entries. */
typedef struct {
    int32_t status; /* ROOT_OK, or why the root refused the rank (ROOT_TAKEN ...) */
    int32_t nranks;
    char missing[192]; /* ROOT_INCOMPLETE: the ranks that never joined, " 3 5" (NUL-terminated, may be cut) */
} root_reply_t;
enum { ROOT_OK = 0, ROOT_TAKEN = 1, ROOT_NRANKS = 2, ROOT_RANGE = 3, ROOT_MALFORMED = 4, ROOT_INCOMPLETE = 5,
       ROOT_ABORTED = 6 /* init cannot complete: `missing` says why (a rank that joined died) */ };
#define ROOT_MAX_NRANKS 65536

/* ---- decoders of the headers that follow a proof (see socket.h) ------------------------------------------ */

static bool nul_terminated(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

/*
 * Validates one rank's zccl_peer_info_t as it came over the wire (in a root hello, or in the table the root
 * hands out): its rank, pid, listening address, shared-memory name (NUL-terminated within its array, "" or one
 * "/name" component) and locality fields (-1 = unknown, else >= 0). Pure: *why names the first problem.
 */
static zccl_result_t peer_info_check(const zccl_peer_info_t *p, int32_t rank, const char **why) {
    const char *w = NULL;
    if (p->rank != rank) w = "peer info of another rank than the one claimed";
    else if (p->pid <= 0) w = "peer info with an invalid pid";
    else if (zccl__sockaddr_check(&p->listen, &w) != ZCCL_SUCCESS) { /* w set */ }
    else if (!nul_terminated(p->shm_name, sizeof p->shm_name)) w = "shared-memory name not NUL-terminated";
    else if (p->shm_name[0] && (p->shm_name[0] != '/' || strchr(p->shm_name + 1, '/')))
        w = "shared-memory name is not of the form /name";
    else if (p->loc.package < -1 || p->loc.numa < -1 || p->loc.core < -1 || p->loc.first_pu < -1 ||
             p->loc.last_pu < -1 || p->loc.npus < 0)
        w = "locality field out of range";
    else if (p->ib.nrails < 0 || p->ib.nrails > ZCCL_IB_RAILS_MAX) w = "IB rail count out of range";
    for (int k = 0; !w && k < p->ib.nrails; k++) {
        if (zccl__sockaddr_check(&p->ib.rail[k].addr, &w) != ZCCL_SUCCESS) { /* w set */ }
        else if (!nul_terminated(p->ib.rail[k].dev, sizeof p->ib.rail[k].dev)) w = "IB device name not NUL-terminated";
    }
    if (!w) return ZCCL_SUCCESS;
    if (why) *why = w;
    return ZCCL_INVALID_ARGUMENT;
}

/*
 * Validates a root hello of len bytes (exactly sizeof(root_hello_t)). known_nranks: the job's size once a first
 * rank has been admitted, else -1. On success fills *out and returns ROOT_OK; otherwise returns the status the
 * root refuses the rank with and sets *why. Pure (no I/O, no logging).
 */
static int root_hello_decode(const void *buf, size_t len, int known_nranks, root_hello_t *out, const char **why) {
    const char *w = NULL;
    int st = ROOT_OK;
    root_hello_t h;
    if (!buf || len != sizeof h) {
        if (why) *why = "root hello of the wrong length";
        return ROOT_MALFORMED;
    }
    memcpy(&h, buf, sizeof h);
    if (h.nranks < 1 || h.nranks > ROOT_MAX_NRANKS) st = ROOT_NRANKS, w = "nranks out of range [1, 65536]";
    else if (known_nranks >= 0 && h.nranks != known_nranks) st = ROOT_NRANKS, w = "nranks differs from the first rank's";
    else if (h.rank < 0 || h.rank >= h.nranks) st = ROOT_RANGE, w = "rank out of range [0, nranks)";
    else if (peer_info_check(&h.info, h.rank, &w) != ZCCL_SUCCESS) st = ROOT_MALFORMED;
    if (st != ROOT_OK) {
        if (why) *why = w;
        return st;
    }
    *out = h;
    return ROOT_OK;
}

_Static_assert(sizeof(zccl_conn_hdr_t) == 16 && offsetof(zccl_conn_hdr_t, from_rank) == 8 &&
               offsetof(zccl_conn_hdr_t, kind) == 12, "zccl_conn_hdr_t is a wire format");

zccl_result_t zccl__conn_hdr_decode(const void *buf, size_t len, uint64_t comm_id, int my_rank, int nranks,
                                    int *from_rank, const char **why) {
    const char *w = NULL;
    zccl_conn_hdr_t h;
    if (!buf || len != sizeof h) {
        w = "connection header of the wrong length";
    } else {
        memcpy(&h, buf, sizeof h);
        if (h.comm_id != comm_id) w = "header of another communicator";
        else if (h.kind != ZCCL_CONN_DATA && h.kind != ZCCL_CONN_SHRINK && h.kind != ZCCL_CONN_NOTICE) w = "unknown connection kind";
        else if (h.from_rank < 0 || h.from_rank >= nranks) w = "sender rank out of range [0, nranks)";
        else if (h.from_rank == my_rank) w = "sender claims to be this rank";
    }
    if (w) {
        if (why) *why = w;
        return ZCCL_INVALID_ARGUMENT;
    }
    *from_rank = h.from_rank;
    return ZCCL_SUCCESS;
}

void zccl__id_encode(const zccl_sockaddr_t *root, const uint8_t secret[ZCCL_SECRET_BYTES], zccl_unique_id_t *id) {
    id_layout_t l = {0};
    l.magic = ID_MAGIC;
    l.version = ID_VERSION;
    l.addr_len = (uint16_t)root->len;
    memcpy(l.addr, &root->sa, root->len);
    memcpy(l.secret, secret, ZCCL_SECRET_BYTES);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &l, sizeof l);
}

zccl_result_t zccl__id_decode(const zccl_unique_id_t *id, zccl_id_info_t *out) {
    id_layout_t l;
    memcpy(&l, id->internal, sizeof l);
    if (l.magic != ID_MAGIC || l.version != ID_VERSION)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "argument 'id' is not a zccl unique id (bad magic or version; was "
                           "it created by zccl_get_unique_id and copied whole?)");
    sa_family_t fam;
    memcpy(&fam, l.addr, sizeof fam);
    if (!((fam == AF_INET && l.addr_len == sizeof(struct sockaddr_in)) ||
          (fam == AF_INET6 && l.addr_len == sizeof(struct sockaddr_in6))))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "argument 'id' holds a malformed root address (family %d, %u bytes)",
                           (int)fam, (unsigned)l.addr_len);
    memset(out, 0, sizeof *out);
    memcpy(&out->root.sa, l.addr, l.addr_len);
    out->root.len = l.addr_len;
    memcpy(out->secret, l.secret, ZCCL_SECRET_BYTES);
    uint8_t digest[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)id->internal, sizeof id->internal, digest);
    memcpy(&out->comm_id, digest, sizeof out->comm_id);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__unique_id_set_secret(zccl_unique_id_t *id, const uint8_t secret[16]) {
    zccl_id_info_t info;
    ZCCL_CHECK(zccl__id_decode(id, &info));
    zccl__id_encode(&info.root, secret, id);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__unique_id_address(const zccl_unique_id_t *id, char *host, size_t hostlen, int *port) {
    zccl_id_info_t info;
    ZCCL_CHECK(zccl__id_decode(id, &info));
    if (info.root.sa.ss_family == AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)&info.root.sa;
        inet_ntop(AF_INET, &s->sin_addr, host, (socklen_t)hostlen);
        *port = ntohs(s->sin_port);
    } else {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&info.root.sa;
        inet_ntop(AF_INET6, &s->sin6_addr, host, (socklen_t)hostlen);
        *port = ntohs(s->sin6_port);
    }
    return ZCCL_SUCCESS;
}

/* ---- the root ---------------------------------------------------------------------------------------------- */

typedef struct {
    int listen_fd;
    uint8_t secret[ZCCL_SECRET_BYTES];
    int nranks;      /* from the first hello; -1 before */
    int *fd;         /* per rank */
    zccl_peer_info_t *info;
    int joined;
    int *ready; /* set by the accept loop once it has allocated what it needs (points into zccl__root_start) */
    /* The watcher thread (root_watch): ranks that die after joining, and a WARN line every 10 s while waiting. */
    pthread_mutex_t mu;  /* nranks, fd, joined, abort_why, done */
    pthread_cond_t done_cv; /* signalled with done set: the watcher's 100 ms wait ends at once */
    int stop_pipe[2];    /* the watcher stops the accept loop through it */
    bool done;           /* the accept loop has ended: the watcher exits */
    char abort_why[192]; /* non-empty: init cannot complete; every joined rank is told this */
} root_t;

static void root_refuse(int fd, int32_t status) {
    root_reply_t r = {status, 0, ""};
    zccl__send_all(fd, &r, sizeof r, zccl__now_ns() + 1000000000ull, "bootstrap root refusal");
    close(fd);
}

static int root_admit(root_t *R, int fd, const root_hello_t *hp);

static int root_on_conn(void *ctx, int fd, const void *hdr, size_t hdr_bytes) {
    root_t *R = ctx;
    root_hello_t h;
    const char *why = NULL;
    int st = root_hello_decode(hdr, hdr_bytes, R->nranks, &h, &why);
    if (st != ROOT_OK) {
        int32_t claim[2] = {-1, -1}; /* for the log only: rank and nranks as claimed, if the header is that long */
        if (hdr_bytes >= sizeof claim) memcpy(claim, hdr, sizeof claim);
        ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: refused a rank that proved the secret (claims rank %d of %d; the "
                  "first rank said nranks=%d): %s", claim[0], claim[1], R->nranks, why);
        root_refuse(fd, st);
        return 0;
    }
    pthread_mutex_lock(&R->mu);
    int stop = root_admit(R, fd, &h);
    pthread_mutex_unlock(&R->mu);
    return stop;
}

/* root_on_conn, under R->mu: records a rank that passed every check. */
static int root_admit(root_t *R, int fd, const root_hello_t *hp) {
    const root_hello_t h = *hp;
    if (R->nranks < 0) {
        R->fd = malloc((size_t)h.nranks * sizeof(int));
        R->info = calloc((size_t)h.nranks, sizeof(zccl_peer_info_t));
        if (!R->fd || !R->info) {
            free(R->fd);
            free(R->info);
            R->fd = NULL;
            R->info = NULL;
            root_refuse(fd, ROOT_NRANKS);
            return 0;
        }
        R->nranks = h.nranks;
        for (int i = 0; i < h.nranks; i++) R->fd[i] = -1;
    }
    if (R->fd[h.rank] >= 0) {
        ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: rank %d joined twice; the second is refused", h.rank);
        root_refuse(fd, ROOT_TAKEN);
        return 0;
    }
    R->fd[h.rank] = fd;
    R->info[h.rank] = h.info;
    R->info[h.rank].rank = h.rank;
    return ++R->joined == R->nranks;
}

/* Lists the ranks that have not joined yet (" 2 5 ..."), cut to fit. Under R->mu. */
static void root_missing(const root_t *R, char *buf, size_t len) {
    size_t w = 0;
    buf[0] = '\0';
    for (int r = 0; R->fd && r < R->nranks && w + 16 < len; r++)
        if (R->fd[r] < 0) w += (size_t)snprintf(buf + w, len - w, " %d", r);
}

/*
 * The watcher: a rank sends nothing after its hello, so its connection becoming readable means it closed (it
 * exited or was killed): init cannot complete, and the ranks that joined are told at once which rank died instead
 * of waiting for ZCCL_INIT_TIMEOUT_MS. Every 10 s it also logs which ranks the root still waits for.
 */
static void *root_watch(void *arg) {
    root_t *R = arg;
    char as[80] = "?";
    zccl_sockaddr_t a;
    a.len = sizeof a.sa;
    if (getsockname(R->listen_fd, (struct sockaddr *)&a.sa, &a.len) == 0) zccl__sockaddr_str(&a, as, sizeof as);
    const uint64_t start = zccl__now_ns();
    uint64_t next_warn = start + 10000000000ull;
    pthread_mutex_lock(&R->mu);
    for (;;) {
        /* every 100 ms, or at once when the accept loop ends: a root that slept its 100 ms out before it let the
         * ranks have the table held every communicator's init that long (100 of the 115 ms a 2-rank
         * zccl_comm_split took) */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 100000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        while (!R->done && pthread_cond_timedwait(&R->done_cv, &R->mu, &until) == 0) {
        }
        if (R->done) break;
        for (int r = 0; R->fd && r < R->nranks && !R->abort_why[0]; r++) {
            if (R->fd[r] < 0) continue;
            struct pollfd p = {R->fd[r], POLLIN | POLLRDHUP, 0};
            if (poll(&p, 1, 0) > 0)
                snprintf(R->abort_why, sizeof R->abort_why, "rank %d (pid %d) closed its connection to the bootstrap "
                         "root before every rank joined: it exited or was killed", r, (int)R->info[r].pid);
        }
        if (R->abort_why[0]) {
            if (write(R->stop_pipe[1], "x", 1) < 0) { /* the accept loop also ends at its deadline */ }
            break;
        }
        if (zccl__now_ns() >= next_warn) {
            next_warn += 10000000000ull;
            char missing[192];
            root_missing(R, missing, sizeof missing);
            if (R->nranks < 0)
                ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root at %s: no rank has joined after %llu s (is MASTER_ADDR/"
                          "MASTER_PORT or the unique id the same on every rank?)", as,
                          (unsigned long long)((zccl__now_ns() - start) / 1000000000ull));
            else
                ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root at %s: %d of %d ranks joined after %llu s; waiting for "
                          "rank(s)%s", as, R->joined, R->nranks,
                          (unsigned long long)((zccl__now_ns() - start) / 1000000000ull), missing);
        }
    }
    pthread_mutex_unlock(&R->mu);
    return NULL;
}

static void *root_main(void *arg) {
    root_t *R = arg;
    int64_t init_ms = 120000;
    if (zccl__cfg_int(ZCCL_CFG_INIT_TIMEOUT_MS, &init_ms) != ZCCL_SUCCESS) init_ms = 120000;
    /* Give up a little before the ranks do, so that the ranks that joined hear which ones are missing. */
    const uint64_t margin_ms = ZCCL_MIN((uint64_t)init_ms / 10, 1000u);
    uint64_t deadline = zccl__now_ns() + ((uint64_t)init_ms - margin_ms) * 1000000ull;
    pthread_t watcher;
    bool watching = pthread_create(&watcher, NULL, root_watch, R) == 0;
    zccl_result_t res = zccl__accept_loop(R->listen_fd, R->stop_pipe[0], R->secret, sizeof(root_hello_t),
                                          root_on_conn, R, deadline, R->ready);
    pthread_mutex_lock(&R->mu);
    R->done = true;
    pthread_cond_signal(&R->done_cv);
    pthread_mutex_unlock(&R->mu);
    if (watching) pthread_join(watcher, NULL);
    close(R->listen_fd);
    if (R->abort_why[0]) {
        ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: init cannot complete: %s", R->abort_why);
        root_reply_t rep = {ROOT_ABORTED, R->nranks, ""};
        snprintf(rep.missing, sizeof rep.missing, "%s", R->abort_why);
        for (int r = 0; R->fd && r < R->nranks; r++)
            if (R->fd[r] >= 0)
                zccl__send_all(R->fd[r], &rep, sizeof rep, zccl__now_ns() + 200000000ull, "bootstrap root abort");
    } else if (res == ZCCL_SUCCESS) {
        root_reply_t rep = {ROOT_OK, R->nranks, ""};
        for (int r = 0; r < R->nranks; r++) {
            if (zccl__send_all(R->fd[r], &rep, sizeof rep, deadline, "bootstrap root reply") != ZCCL_SUCCESS ||
                zccl__send_all(R->fd[r], R->info, (size_t)R->nranks * sizeof *R->info, deadline,
                               "bootstrap root table") != ZCCL_SUCCESS)
                ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: could not send the rank table to rank %d", r);
        }
        ZCCL_INFO(ZCCL_LOG_BOOT, "bootstrap root: %d ranks joined", R->nranks);
    } else if (R->nranks > 0) {
        char missing[sizeof(((root_reply_t *)0)->missing)];
        size_t w = 0;
        for (int r = 0; r < R->nranks && w < sizeof missing - 16; r++)
            if (R->fd[r] < 0) w += (size_t)snprintf(missing + w, sizeof missing - w, " %d", r);
        ZCCL_WARN(ZCCL_LOG_BOOT, "bootstrap root: %d of %d ranks joined before the deadline; missing:%s", R->joined,
                  R->nranks, missing);
        root_reply_t rep = {ROOT_INCOMPLETE, R->nranks, ""};
        snprintf(rep.missing, sizeof rep.missing, "%s", missing);
        for (int r = 0; r < R->nranks; r++) /* tell the ranks that did join who is missing (best effort) */
            if (R->fd[r] >= 0)
                zccl__send_all(R->fd[r], &rep, sizeof rep, zccl__now_ns() + 200000000ull, "bootstrap root timeout");
    }
    for (int r = 0; R->fd && r < R->nranks; r++)
        if (R->fd[r] >= 0) close(R->fd[r]);
    free(R->fd);
    free(R->info);
    close(R->stop_pipe[0]);
    close(R->stop_pipe[1]);
    pthread_mutex_destroy(&R->mu);
    pthread_cond_destroy(&R->done_cv);
    free(R);
    return NULL;
}

zccl_result_t zccl__root_start(int listen_fd, const uint8_t secret[ZCCL_SECRET_BYTES]) {
    root_t *R = calloc(1, sizeof *R);
    if (!R) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the bootstrap root");
    R->listen_fd = listen_fd;
    R->nranks = -1;
    if (pipe2(R->stop_pipe, O_CLOEXEC) != 0) {
        free(R);
        return zccl__syserror(errno, "pipe for the bootstrap root");
    }
    pthread_mutex_init(&R->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the watcher's waits do not move with the wall clock */
    pthread_cond_init(&R->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    int ready = 0;
    R->ready = &ready;
    memcpy(R->secret, secret, ZCCL_SECRET_BYTES);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, root_main, R);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(R->stop_pipe[0]);
        close(R->stop_pipe[1]);
        free(R);
        return zccl__syserror(rc, "cannot start the bootstrap root thread");
    }
    /* Return only once the root thread is past its own allocations: callers often fork the ranks next. The thread
     * writes `ready` (on this stack) exactly once, right after those allocations, and never blocks before. */
    while (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) usleep(50);
    return ZCCL_SUCCESS;
}

/* ---- joining ----------------------------------------------------------------------------------------------- */

/*
 * What the launcher knows: zcclrun (tools/launch.c) passes ZCCL_LAUNCH_STATUS_FD, a memory file it writes a line
 * into ("rank 2 (pid 123) was killed by signal 9 (KILL)") as soon as a rank exits abnormally. A rank still in init
 * reads it five times a second, so a rank that died before reaching the bootstrap root is reported at once.
 * Returns true and fills msg when the launcher reported a rank's death.
 */
static bool launcher_reports(char *msg, size_t len) {
    /* Read every time, not cached: a process that forks its ranks may have initialised a communicator itself. */
    const char *v = getenv("ZCCL_LAUNCH_STATUS_FD");
    char *end = NULL;
    long x = v && *v ? strtol(v, &end, 10) : -1;
    const int fd = (end && *end == '\0' && x >= 0 && x < 65536) ? (int)x : -1;
    if (fd < 0 || len < 2) return false;
    ssize_t n = pread(fd, msg, len - 1, 0);
    if (n <= 0) return false;
    msg[n] = '\0';
    char *nl = strchr(msg, '\n');
    if (nl) *nl = '\0';
    return msg[0] != '\0';
}

/* Waits until fd is readable or deadline passes, in slices: between them, the launcher's news and (every 10 s) a
 * WARN line naming what this rank waits for. ZCCL_SUCCESS when readable. */
static zccl_result_t join_wait(struct zccl_comm *comm, int fd, const char *as, uint64_t start, uint64_t deadline_ns,
                               uint64_t *next_warn) {
    for (;;) {
        char news[256];
        if (launcher_reports(news, sizeof news))
            return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: init cannot complete: the launcher reports that %s",
                               comm->rank, news);
        const uint64_t now = zccl__now_ns();
        if (now >= deadline_ns) return ZCCL_TIMEOUT;
        if (now >= *next_warn) {
            *next_warn += 10000000000ull;
            ZCCL_WARN(ZCCL_LOG_BOOT, "rank %d: %s the bootstrap root at %s for %llu s (ZCCL_INIT_TIMEOUT_MS: %llu s "
                      "left)", comm->rank, fd >= 0 ? "joined; waiting for the other ranks at" : "cannot reach", as,
                      (unsigned long long)((now - start) / 1000000000ull),
                      (unsigned long long)((deadline_ns - now) / 1000000000ull));
        }
        if (fd < 0) return ZCCL_SUCCESS; /* connecting: the caller retries */
        struct pollfd p = {fd, POLLIN, 0};
        const uint64_t left_ms = (deadline_ns - now) / 1000000ull;
        if (poll(&p, 1, (int)ZCCL_MIN(left_ms, 200ull)) > 0) return ZCCL_SUCCESS;
    }
}

zccl_result_t zccl__bootstrap_join(struct zccl_comm *comm, const zccl_id_info_t *info, const zccl_peer_info_t *me,
                                   uint64_t deadline_ns) {
    root_hello_t h;
    memset(&h, 0, sizeof h);
    h.rank = comm->rank;
    h.nranks = comm->nranks;
    h.info = *me;
    int fd = -1;
    char as[80];
    zccl__sockaddr_str(&info->root, as, sizeof as);
    const uint64_t start = zccl__now_ns();
    uint64_t next_warn = start + 10000000000ull;
    zccl_result_t res;
    /* Connect in short attempts, so that the launcher's news and the progress line come in between. */
    for (;;) {
        res = join_wait(comm, -1, as, start, deadline_ns, &next_warn);
        if (res == ZCCL_REMOTE_ERROR) return res;
        zccl__connect_until(zccl__now_ns() + 300000000ull);
        res = zccl__connect_auth(&info->root, info->secret, &h, sizeof h, deadline_ns, &fd);
        zccl__connect_until(0);
        if (res != ZCCL_TIMEOUT || zccl__now_ns() >= deadline_ns) break;
    }
    if (res != ZCCL_SUCCESS)
        return zccl__error(res, "rank %d could not join the bootstrap root at %s: %s", comm->rank, as,
                           zccl__last_error());
    root_reply_t rep;
    res = join_wait(comm, fd, as, start, deadline_ns, &next_warn);
    if (res == ZCCL_REMOTE_ERROR) {
        close(fd);
        return res;
    }
    res = zccl__recv_all(fd, &rep, sizeof rep, deadline_ns, "waiting for all ranks at the bootstrap root");
    if (res == ZCCL_SUCCESS && rep.status == ROOT_ABORTED) {
        rep.missing[sizeof rep.missing - 1] = 0;
        close(fd);
        /* The rank the root saw leave may have left because the launcher reported another one dead first: the
         * launcher's report names the cause. */
        char news[256];
        if (launcher_reports(news, sizeof news))
            return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: init cannot complete: the launcher reports that %s",
                               comm->rank, news);
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: init cannot complete: %s", comm->rank, rep.missing);
    }
    if (res == ZCCL_SUCCESS && rep.status == ROOT_INCOMPLETE) {
        rep.missing[sizeof rep.missing - 1] = 0;
        close(fd);
        return zccl__error(ZCCL_TIMEOUT, "rank %d: not every rank joined within ZCCL_INIT_TIMEOUT_MS; the bootstrap "
                           "root never heard from rank(s)%s (started with the same id and nranks %d? alive?)",
                           comm->rank, rep.missing, comm->nranks);
    }
    if (res == ZCCL_SUCCESS && rep.status != ROOT_OK) {
        static const char *why[] = {"", "another process already joined as this rank",
                                    "this nranks differs from the other ranks'", "rank out of range",
                                    "the root found this rank's hello malformed"};
        res = zccl__error(ZCCL_REMOTE_ERROR, "bootstrap root refused rank %d (nranks %d): %s", comm->rank,
                          comm->nranks, rep.status >= 1 && rep.status <= ROOT_MALFORMED ? why[rep.status]
                                                                                         : "unknown reason");
    } else if (res == ZCCL_SUCCESS && rep.nranks != comm->nranks) {
        res = zccl__error(ZCCL_INTERNAL_ERROR, "bootstrap root answered for %d ranks, expected %d", rep.nranks,
                          comm->nranks);
    }
    if (res == ZCCL_SUCCESS)
        res = zccl__recv_all(fd, comm->tc.peers, (size_t)comm->nranks * sizeof *comm->tc.peers, deadline_ns,
                             "receiving the rank table from the bootstrap root");
    for (int r = 0; res == ZCCL_SUCCESS && r < comm->nranks; r++) {
        const char *why = NULL;
        if (peer_info_check(&comm->tc.peers[r], r, &why) != ZCCL_SUCCESS)
            res = zccl__error(ZCCL_REMOTE_ERROR, "the bootstrap root sent a malformed entry for rank %d: %s", r, why);
    }
    close(fd);
    if (res == ZCCL_TIMEOUT)
        return zccl__error(ZCCL_TIMEOUT, "rank %d: not every rank joined within ZCCL_INIT_TIMEOUT_MS (are all %d "
                           "ranks started with the same id?)", comm->rank, comm->nranks);
    return res;
}

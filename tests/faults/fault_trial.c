/*
 * fault_trial.c — one trial of the zccl fault suite (tests/faults/run_faults.sh runs many and prints the table).
 *
 * A trial:
 *   1. The parent draws everything from one 64-bit trial seed (--seed, --trial, --transport): the victim rank, the
 *      fault (SIGKILL, or for tcp sometimes a cut of every TCP link of the victim), and when it lands:
 *        init     (15%) the fault is injected 0-300 ms after the ranks are forked (a third of the time at once,
 *                       often before the victim has even called zccl_comm_init_rank), mostly while the ranks create
 *                       the communicator (on a loaded 2-core machine that takes ~300 ms for 8 ranks);
 *        between  (15%) the victim finishes collective number K (1..20), then parks between two collectives; the
 *                       fault lands while it is parked and the survivors are already inside the next collective;
 *        random   (70%) 0-300 ms after every rank has created its communicator: wherever the ranks are then.
 *      The victim's state at the moment of the fault (phase:collective) is reported as victim_at.
 *      --mode, --delay-ms and --victim override the draw to replay one scenario.
 *   2. It creates the unique id (zccl_get_unique_id) and forks --nranks (8) ranks. Each rank calls
 *      zccl_comm_init_rank (ZCCL_TRANSPORT=shm|tcp from the environment) and then loops over a sequence of
 *      collectives drawn from the trial seed (the same on every rank): all-reduce, reduce-scatter, all-gather and
 *      broadcast of int32 or float32 data, 4 B .. 1 MiB, checking every element of every successful result. A rank
 *      records its state in shared memory (phase, current collective, iteration) and, when a call fails, the
 *      CLOCK_MONOTONIC time at which it returned, the result code and zccl_get_last_error(); then it calls
 *      zccl_comm_abort and exits 0. The loop never ends on its own (it stops only after --loop-s seconds, far
 *      past the deadline), so a survivor cannot "finish" before the fault.
 *   3. The parent injects the fault, recording CLOCK_MONOTONIC just before it, and reaps every child until all
 *      survivors have exited or --deadline seconds (10) have passed since the fault; the ones still running then
 *      are hangs (SIGKILLed). A survivor killed by a signal the parent did not send is a crash.
 *
 * Kinds of fault:
 *   kill  SIGKILL of the victim: every other rank is a survivor and must fail its collective (or its init).
 *   cut   (tcp only) SIGUSR1 to the victim, whose handler shutdown()s every TCP socket of the process: the data
 *         links in both directions and the bootstrap connection. The victim stays alive; every rank, the victim
 *         included, must see an error.
 *
 * A survivor "erred in time" when its failing call returned with a non-success code within --detect-s (2 s) of
 * the fault. Other outcomes: erred late, erred early (before the fault: a spurious error), no error (exited
 * normally without seeing one), wrong data (a collective returned success with a wrong result), bad exit (any
 * other exit code), hang, crash. The trial passes when every survivor erred in time.
 *
 * ZCCL_INIT_TIMEOUT_MS defaults to 1500 here (unless set): a victim killed before it connected to the bootstrap
 * root cannot be noticed by anyone, so its peers can only time out. (On shm the same holds today for a victim
 * killed after it joined the bootstrap but before it created its shared-memory inbox: its peers wait for the init
 * deadline although they know its pid. Replay: ZCCL_INIT_TIMEOUT_MS=5000 fault_trial --transport shm --mode init
 * --delay-ms 300 --victim 4 --verbose, with the delay tuned to this machine's init time.) ZCCL_TIMEOUT_MS is
 * removed: collectives must detect the loss themselves.
 *
 * Output on stdout: one "TRIAL key=value ..." line (parsed by run_faults.sh), preceded by one "RANK ..." line per
 * rank when the trial fails or --verbose is given. The ranks' stderr is inherited.
 * Exit status: 0 trial passed, 1 trial failed, 2 usage or setup error.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zccl.h"

#define MAX_RANKS 64
#define MAX_BYTES (1u << 20) /* largest buffer a collective touches */
#define MSG_LEN 320

enum phase { PH_FORKED = 0, PH_INIT, PH_CALL, PH_LOCAL, PH_PARKED, PH_FAILED, PH_DONE };
static const char *phase_name[] = {"forked", "init", "call", "local", "parked", "failed", "done"};
enum op { OP_NONE = 0, OP_INIT, OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST };
static const char *op_name[] = {"-", "init", "allreduce", "reduce_scatter", "allgather", "broadcast"};
enum fault { F_KILL = 0, F_CUT };
static const char *fault_name[] = {"kill", "cut"};
enum mode { M_INIT = 0, M_BETWEEN, M_RANDOM };
static const char *mode_name[] = {"init", "between", "random"};

/* Exit codes of a rank. */
enum { RC_ERRED = 0, RC_WRONG = 2, RC_NO_ERROR = 3, RC_SETUP = 4 };

typedef struct {
    _Atomic int phase;
    _Atomic int op;
    _Atomic long iter;        /* collectives completed successfully */
    _Atomic size_t bytes;     /* bytes of the current collective's largest buffer */
    _Atomic int64_t t_fail;   /* ns, CLOCK_MONOTONIC; 0 = no failure recorded */
    _Atomic int64_t t_ready;  /* ns; when zccl_comm_init_rank returned successfully */
    int result;
    int fail_op;
    long fail_iter;
    size_t fail_bytes;
    int wrong;                /* 1: a successful collective returned a wrong value */
    char msg[MSG_LEN];
} rank_rec_t;

typedef struct {
    _Atomic int64_t t_fault;  /* ns; set just before the fault is injected */
    _Atomic int release;      /* parked victim may go on (set after the fault, or when the parent gives up) */
    int victim;
    int mode;
    int hold_iter;            /* M_BETWEEN: the victim parks after this many successful collectives */
    rank_rec_t r[MAX_RANKS];
} shared_t;

static shared_t *g_sh;

/* ---- helpers ------------------------------------------------------------------------------------------------ */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ns(int64_t ns) {
    if (ns <= 0) return;
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rnd_below(uint64_t *s, uint64_t n) { return n ? splitmix64(s) % n : 0; }

static uint64_t hash_str(const char *p) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* ---- the victim's "cut" handler: shut down every TCP socket of the process ----------------------------------- */

static void cut_links(int sig) {
    (void)sig;
    int saved = errno;
    for (int fd = 0; fd < 4096; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) continue;
        if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) continue;
        shutdown(fd, SHUT_RDWR);
    }
    errno = saved;
}

/* ---- a rank -------------------------------------------------------------------------------------------------- */

/* Value rank r contributes at element i of collective number it: small integers, so float32 sums are exact. */
static inline uint32_t val(int r, size_t i, long it) { return (uint32_t)((r + 1) * 3 + (int)(i % 61) + (int)(it % 17)); }

static void record_failure(rank_rec_t *me, zccl_comm_t comm, zccl_result_t res, int op, long it, size_t bytes) {
    me->result = (int)res;
    me->fail_op = op;
    me->fail_iter = it;
    me->fail_bytes = bytes;
    snprintf(me->msg, sizeof me->msg, "%s", zccl_get_last_error(comm));
    for (char *p = me->msg; *p; p++)
        if (*p == '\n' || *p == '\t') *p = ' ';
    atomic_store(&me->phase, PH_FAILED);
}

static void fill(void *buf, size_t n, int fp, int r, size_t base, long it) {
    if (fp) {
        float *f = buf;
        for (size_t i = 0; i < n; i++) f[i] = (float)val(r, base + i, it);
    } else {
        uint32_t *u = buf;
        for (size_t i = 0; i < n; i++) u[i] = val(r, base + i, it);
    }
}

/* Checks n elements of buf against expected(i) = sum over ranks (sum) or val(root) at global index base + i. */
static bool check(const void *buf, size_t n, int fp, int nranks, int root, size_t base, long it) {
    for (size_t i = 0; i < n; i++) {
        uint32_t want = 0;
        if (root >= 0)
            want = val(root, base + i, it);
        else
            for (int r = 0; r < nranks; r++) want += val(r, base + i, it);
        if (fp ? (((const float *)buf)[i] != (float)want) : (((const uint32_t *)buf)[i] != want)) return false;
    }
    return true;
}

static int rank_main(int rank, int nranks, zccl_unique_id_t id, uint64_t trial_seed, double loop_s) {
    rank_rec_t *me = &g_sh->r[rank];
    if (rank == g_sh->victim) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = cut_links;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR1, &sa, NULL);
    }
    void *a = malloc(MAX_BYTES), *b = malloc(MAX_BYTES);
    if (!a || !b) return RC_SETUP;
    memset(a, 0, MAX_BYTES);
    memset(b, 0, MAX_BYTES);

    atomic_store(&me->op, OP_INIT);
    atomic_store(&me->phase, PH_INIT);
    zccl_comm_t comm = NULL;
    zccl_result_t res = zccl_comm_init_rank(&comm, nranks, id, rank);
    if (res != ZCCL_SUCCESS) {
        atomic_store(&me->t_fail, now_ns());
        record_failure(me, NULL, res, OP_INIT, 0, 0);
        return RC_ERRED;
    }

    atomic_store(&me->t_ready, now_ns());
    uint64_t seq = trial_seed ^ 0xC0FFEE1234567ull; /* same sequence on every rank */
    const int64_t stop = now_ns() + (int64_t)(loop_s * 1e9);
    for (long it = 0; now_ns() < stop; it++) {
        atomic_store(&me->phase, PH_LOCAL);
        if (rank == g_sh->victim && g_sh->mode == M_BETWEEN && it == g_sh->hold_iter) {
            atomic_store(&me->phase, PH_PARKED); /* the fault lands here */
            const int64_t until = now_ns() + 5000000000ll;
            while (!atomic_load(&g_sh->release) && now_ns() < until) sleep_ns(200000);
            atomic_store(&me->phase, PH_LOCAL);
        }
        int op = OP_ALLREDUCE + (int)rnd_below(&seq, 4);
        int fp = (int)rnd_below(&seq, 2);
        zccl_datatype_t dt = fp ? ZCCL_FLOAT32 : ZCCL_INT32;
        /* Largest buffer: 4 B .. 1 MiB, log-uniform, so small (inline / direct) and pipelined sizes both occur. */
        size_t maxel = (size_t)1 << rnd_below(&seq, 19); /* 1 .. 256K elements of 4 bytes */
        maxel += rnd_below(&seq, maxel);
        if (maxel > MAX_BYTES / 4) maxel = MAX_BYTES / 4;
        int root = (int)rnd_below(&seq, (uint64_t)nranks);
        size_t per = maxel / (size_t)nranks; /* reduce-scatter / all-gather block */
        if (per == 0) per = 1;
        bool ok = true;
        switch (op) {
            case OP_ALLREDUCE:
                fill(a, maxel, fp, rank, 0, it);
                break;
            case OP_REDUCE_SCATTER:
                fill(a, per * (size_t)nranks, fp, rank, 0, it);
                break;
            case OP_ALLGATHER:
                fill(a, per, fp, rank, (size_t)rank * per, it);
                break;
            case OP_BROADCAST:
                if (rank == root) fill(a, maxel, fp, rank, 0, it);
                break;
        }
        atomic_store(&me->op, op);
        atomic_store(&me->bytes, (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER ? per * nranks : maxel) * 4);
        atomic_store(&me->phase, PH_CALL);
        switch (op) {
            case OP_ALLREDUCE:
                res = zccl_allreduce(a, b, maxel, dt, ZCCL_SUM, comm, NULL);
                break;
            case OP_REDUCE_SCATTER:
                res = zccl_reduce_scatter(a, b, per, dt, ZCCL_SUM, comm, NULL);
                break;
            case OP_ALLGATHER:
                res = zccl_allgather(a, b, per, dt, comm, NULL);
                break;
            default:
                res = zccl_broadcast(a, b, maxel, dt, root, comm, NULL);
                break;
        }
        if (res != ZCCL_SUCCESS) {
            atomic_store(&me->t_fail, now_ns());
            record_failure(me, comm, res, op, it, atomic_load(&me->bytes));
            zccl_comm_abort(comm);
            return RC_ERRED;
        }
        atomic_store(&me->phase, PH_LOCAL);
        switch (op) {
            case OP_ALLREDUCE:
                ok = check(b, maxel, fp, nranks, -1, 0, it);
                break;
            case OP_REDUCE_SCATTER:
                ok = check(b, per, fp, nranks, -1, (size_t)rank * per, it);
                break;
            case OP_ALLGATHER:
                for (int r = 0; r < nranks && ok; r++)
                    ok = check((char *)b + (size_t)r * per * 4, per, fp, nranks, r, (size_t)r * per, it);
                break;
            default:
                ok = check(b, maxel, fp, nranks, root, 0, it);
                break;
        }
        if (!ok) {
            me->wrong = 1;
            me->fail_op = op;
            me->fail_iter = it;
            snprintf(me->msg, sizeof me->msg, "%s #%ld (%zu bytes) returned success with a wrong result",
                     op_name[op], it, atomic_load(&me->bytes));
            fprintf(stderr, "[fault_trial rank %d] %s\n", rank, me->msg);
            zccl_comm_abort(comm);
            return RC_WRONG;
        }
        atomic_fetch_add(&me->iter, 1);
    }
    atomic_store(&me->phase, PH_DONE);
    zccl_comm_destroy(comm);
    return RC_NO_ERROR;
}

/* ---- the parent ---------------------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: fault_trial [--transport shm|tcp] [--seed S] [--trial T] [--nranks N] [--deadline SEC]\n"
            "                   [--detect-s SEC] [--faults kill|cut|kill,cut] [--loop-s SEC] [--verbose]\n"
            "                   [--mode init|between|random] [--delay-ms MS] [--victim R]   (reproduce one scenario;\n"
            "                    --delay-ms: from the fork (init), after every rank joined (random), or the\n"
            "                    collective count K (between))\n"
            "  ZCCL_TRANSPORT is taken from --transport, else from the environment (default shm).\n");
}

int main(int argc, char **argv) {
    const char *transport = getenv("ZCCL_TRANSPORT");
    uint64_t seed = 1;
    long trial = 0;
    int nranks = 8;
    double deadline_s = 10.0, detect_s = 2.0, loop_s = 120.0;
    bool allow_cut = true, allow_kill = true, verbose = false;
    int force_mode = -1, force_victim = -1;
    double force_delay_ms = -1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--verbose")) {
            verbose = true;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        if (!strcmp(k, "--transport")) transport = v;
        else if (!strcmp(k, "--seed")) seed = strtoull(v, NULL, 0);
        else if (!strcmp(k, "--trial")) trial = strtol(v, NULL, 0);
        else if (!strcmp(k, "--nranks")) nranks = atoi(v);
        else if (!strcmp(k, "--deadline")) deadline_s = atof(v);
        else if (!strcmp(k, "--detect-s")) detect_s = atof(v);
        else if (!strcmp(k, "--loop-s")) loop_s = atof(v);
        else if (!strcmp(k, "--victim")) force_victim = atoi(v);
        else if (!strcmp(k, "--delay-ms")) force_delay_ms = atof(v);
        else if (!strcmp(k, "--mode")) {
            force_mode = !strcmp(v, "init") ? M_INIT : !strcmp(v, "between") ? M_BETWEEN : !strcmp(v, "random") ? M_RANDOM : -2;
            if (force_mode == -2) {
                usage();
                return 2;
            }
        }
        else if (!strcmp(k, "--faults")) {
            allow_kill = strstr(v, "kill") != NULL;
            allow_cut = strstr(v, "cut") != NULL;
        } else {
            usage();
            return 2;
        }
    }
    if (!transport || !*transport) transport = "shm";
    if (strcmp(transport, "shm") && strcmp(transport, "tcp")) {
        fprintf(stderr, "fault_trial: transport must be shm or tcp, not '%s'\n", transport);
        return 2;
    }
    if (nranks < 2 || nranks > MAX_RANKS || (!allow_kill && !allow_cut)) {
        usage();
        return 2;
    }
    setenv("ZCCL_TRANSPORT", transport, 1);
    setenv("ZCCL_INIT_TIMEOUT_MS", "1500", 0);
    unsetenv("ZCCL_TIMEOUT_MS");

    /* Every decision of the trial comes from this seed. */
    uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ hash_str(transport) ^ ((uint64_t)trial << 20);
    splitmix64(&s);
    const uint64_t trial_seed = splitmix64(&s);
    uint64_t ps = trial_seed;
    int victim = (int)rnd_below(&ps, (uint64_t)nranks);
    int fault = F_KILL;
    if (!strcmp(transport, "tcp") && allow_cut && (!allow_kill || rnd_below(&ps, 4) == 0)) fault = F_CUT;
    uint64_t m = rnd_below(&ps, 100);
    int mode = m < 15 ? M_INIT : m < 30 ? M_BETWEEN : M_RANDOM;
    int64_t delay_ns = 0;
    if (mode == M_INIT) delay_ns = rnd_below(&ps, 3) == 0 ? 0 : (int64_t)rnd_below(&ps, 300001) * 1000;
    if (mode == M_RANDOM) delay_ns = (int64_t)rnd_below(&ps, 300001) * 1000;
    int hold_iter = 1 + (int)rnd_below(&ps, 20);
    /* Overrides for reproducing one scenario; the draws above still happen, so the rest of the trial is unchanged. */
    if (force_victim >= 0 && force_victim < nranks) victim = force_victim;
    if (force_mode >= 0) mode = force_mode;
    if (force_delay_ms >= 0) delay_ns = (int64_t)(force_delay_ms * 1e6);
    if (force_delay_ms >= 0 && mode == M_BETWEEN) hold_iter = (int)force_delay_ms;

    g_sh = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_sh == MAP_FAILED) {
        perror("fault_trial: mmap");
        return 2;
    }
    memset(g_sh, 0, sizeof *g_sh);
    g_sh->victim = victim;
    g_sh->mode = mode;
    g_sh->hold_iter = hold_iter;

    zccl_unique_id_t id;
    zccl_result_t idres = zccl_get_unique_id(&id);
    if (idres != ZCCL_SUCCESS) {
        fprintf(stderr, "fault_trial: zccl_get_unique_id: %s: %s\n", zccl_get_error_string(idres),
                zccl_get_last_error(NULL));
        return 2;
    }

    fflush(stdout);
    fflush(stderr);
    pid_t pids[MAX_RANKS];
    const int64_t t_start = now_ns();
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fault_trial: fork");
            for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
            while (wait(NULL) > 0) {
            }
            return 2;
        }
        if (pids[r] == 0) _exit(rank_main(r, nranks, id, trial_seed, loop_s));
    }

    /* Wait for the moment of the fault. */
    bool reaped[MAX_RANKS] = {false};
    int status[MAX_RANKS] = {0};
    int n_reaped = 0;
    bool victim_gone_early = false, until_fault_anyway = false;
    if (mode == M_BETWEEN) {
        const int64_t until = now_ns() + 20000000000ll; /* the victim parks after at most 20 collectives */
        while (atomic_load(&g_sh->r[victim].phase) != PH_PARKED && now_ns() < until) {
            int st;
            if (waitpid(pids[victim], &st, WNOHANG) == pids[victim]) {
                reaped[victim] = true, status[victim] = st, n_reaped++;
                victim_gone_early = true;
                break;
            }
            sleep_ns(100000);
        }
    } else if (mode == M_INIT) {
        sleep_ns(t_start + delay_ns - now_ns());
    } else { /* M_RANDOM: the delay counts from the moment every rank has created its communicator */
        const int64_t until = now_ns() + 20000000000ll;
        for (bool all = false; !all && now_ns() < until;) {
            all = true;
            for (int r = 0; r < nranks; r++) {
                int ph = atomic_load(&g_sh->r[r].phase);
                if (ph == PH_FAILED || ph == PH_DONE) until_fault_anyway = true;
                all = all && atomic_load(&g_sh->r[r].t_ready) != 0;
            }
            if (until_fault_anyway) break;
            if (!all) sleep_ns(100000);
        }
        sleep_ns(delay_ns);
    }
    int v_phase = atomic_load(&g_sh->r[victim].phase), v_op = atomic_load(&g_sh->r[victim].op);
    long v_iter = atomic_load(&g_sh->r[victim].iter);
    size_t v_bytes = atomic_load(&g_sh->r[victim].bytes);
    int64_t t_fault = now_ns();
    atomic_store(&g_sh->t_fault, t_fault);
    bool injected = false;
    if (!victim_gone_early && waitpid(pids[victim], &status[victim], WNOHANG) == 0) {
        injected = kill(pids[victim], fault == F_KILL ? SIGKILL : SIGUSR1) == 0;
    } else if (!victim_gone_early) {
        reaped[victim] = true, n_reaped++;
    }
    atomic_store(&g_sh->release, 1);
    const double fault_ms = (double)(t_fault - t_start) / 1e6;

    /* Reap everybody until the survivors are gone or the deadline passes. */
    const int64_t deadline = t_fault + (int64_t)(deadline_s * 1e9);
    bool hung[MAX_RANKS] = {false};
    for (;;) {
        bool survivors_left = false;
        for (int r = 0; r < nranks; r++) {
            if (reaped[r]) continue;
            int st;
            pid_t w = waitpid(pids[r], &st, WNOHANG);
            if (w == pids[r]) {
                reaped[r] = true, status[r] = st, n_reaped++;
                continue;
            }
            if (r != victim || fault == F_CUT) survivors_left = true;
        }
        if (!survivors_left) break;
        if (now_ns() >= deadline) {
            for (int r = 0; r < nranks; r++) {
                if (reaped[r]) continue;
                if (r != victim || fault == F_CUT) hung[r] = true;
                kill(pids[r], SIGKILL);
            }
            for (int r = 0; r < nranks; r++) {
                if (reaped[r]) continue;
                waitpid(pids[r], &status[r], 0);
                reaped[r] = true, n_reaped++;
            }
            break;
        }
        sleep_ns(200000);
    }
    /* A killed victim whose survivors are done: reap it (it died of our SIGKILL). */
    if (!reaped[victim]) {
        if (fault == F_KILL && injected) waitpid(pids[victim], &status[victim], 0);
        else {
            kill(pids[victim], SIGKILL);
            waitpid(pids[victim], &status[victim], 0);
        }
        reaped[victim] = true;
    }

    /* Judge. */
    int survivors = 0, intime = 0, late = 0, early = 0, noerr = 0, wrong = 0, hangs = 0, crashes = 0, badexit = 0;
    int init_fail = 0, timeouts = 0;
    double det_ms[MAX_RANKS];
    int ndet = 0;
    char why[MAX_RANKS][64];
    for (int r = 0; r < nranks; r++) {
        why[r][0] = 0;
        const rank_rec_t *rec = &g_sh->r[r];
        const int st = status[r];
        if (r == victim && fault == F_KILL) {
            if (!injected || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
                /* The victim died before the fault, or exited: report it as what it is. */
                if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL) crashes++, snprintf(why[r], 64, "victim crashed");
                else if (!injected) badexit++, snprintf(why[r], 64, "victim gone before the fault");
            }
            continue;
        }
        survivors++;
        int64_t tf = atomic_load(&rec->t_fail);
        if (hung[r]) {
            hangs++;
            snprintf(why[r], 64, "hang");
        } else if (WIFSIGNALED(st)) {
            crashes++;
            snprintf(why[r], 64, "crash: signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
        } else if (WEXITSTATUS(st) == RC_WRONG || rec->wrong) {
            wrong++;
            snprintf(why[r], 64, "wrong data");
        } else if (WEXITSTATUS(st) == RC_NO_ERROR) {
            noerr++;
            snprintf(why[r], 64, "no error");
        } else if (WEXITSTATUS(st) != RC_ERRED || tf == 0) {
            badexit++;
            snprintf(why[r], 64, "exit code %d", WEXITSTATUS(st));
        } else {
            double d = (double)(tf - t_fault) / 1e6;
            if (rec->fail_op == OP_INIT) init_fail++;
            if (rec->result == ZCCL_TIMEOUT) timeouts++;
            if (tf < t_fault) {
                early++;
                snprintf(why[r], 64, "erred %.1f ms before the fault", -d);
            } else if (d > detect_s * 1e3) {
                late++;
                det_ms[ndet++] = d;
                snprintf(why[r], 64, "erred late: %.1f ms", d);
            } else {
                intime++;
                det_ms[ndet++] = d;
            }
        }
    }
    const bool pass = injected && survivors == intime;

    if (!pass || verbose) {
        for (int r = 0; r < nranks; r++) {
            const rank_rec_t *rec = &g_sh->r[r];
            const int st = status[r];
            int64_t tf = atomic_load(&rec->t_fail);
            char exitdesc[48];
            if (WIFSIGNALED(st)) snprintf(exitdesc, sizeof exitdesc, "signal:%d", WTERMSIG(st));
            else snprintf(exitdesc, sizeof exitdesc, "exit:%d", WEXITSTATUS(st));
            printf("RANK transport=%s trial=%ld rank=%d%s %s phase=%s op=%s iter=%ld bytes=%zu result=%s "
                   "t_fail_ms=%.1f verdict=\"%s\" msg=\"%s\"\n",
                   transport, trial, r, r == victim ? " (victim)" : "", exitdesc,
                   phase_name[atomic_load(&rec->phase)], op_name[rec->fail_op ? rec->fail_op : atomic_load(&rec->op)],
                   rec->fail_op ? rec->fail_iter : atomic_load(&rec->iter), rec->fail_op ? rec->fail_bytes : atomic_load(&rec->bytes),
                   tf ? zccl_get_error_string((zccl_result_t)rec->result) : "-",
                   tf ? (double)(tf - t_fault) / 1e6 : 0.0, why[r][0] ? why[r] : "ok", rec->msg);
        }
    }
    double init_ms = 0;
    for (int r = 0; r < nranks; r++) {
        int64_t tr = atomic_load(&g_sh->r[r].t_ready);
        if (tr && (double)(tr - t_start) / 1e6 > init_ms) init_ms = (double)(tr - t_start) / 1e6;
    }
    double maxd = 0;
    char dets[MAX_RANKS * 12] = "";
    size_t off = 0;
    for (int i = 0; i < ndet; i++) {
        if (det_ms[i] > maxd) maxd = det_ms[i];
        off += (size_t)snprintf(dets + off, sizeof dets - off, "%s%.2f", i ? "," : "", det_ms[i]);
    }
    printf("TRIAL transport=%s seed=%" PRIu64 " trial=%ld pass=%d fault=%s victim=%d mode=%s init_ms=%.1f fault_ms=%.1f "
           "victim_at=%s:%s victim_iter=%ld victim_bytes=%zu injected=%d survivors=%d intime=%d late=%d early=%d "
           "noerr=%d wrong=%d badexit=%d hangs=%d crashes=%d init_fail=%d timeouts=%d max_ms=%.2f det_ms=%s\n",
           transport, seed, trial, pass ? 1 : 0, fault_name[fault], victim, mode_name[mode], init_ms, fault_ms,
           phase_name[v_phase], op_name[v_op], v_iter, v_bytes, injected ? 1 : 0, survivors, intime, late, early,
           noerr, wrong, badexit, hangs, crashes, init_fail, timeouts, maxd, ndet ? dets : "-");
    fflush(stdout);
    return pass ? 0 : 1;
}

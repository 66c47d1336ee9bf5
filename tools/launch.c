/*
 * launch.c — local multi-process launcher shared by zcclrun and `zccl-bench -np N`. See launch.h.
 *
 * Design notes
 *  - All signals the launcher acts on (SIGCHLD and the forwarded SIGINT/SIGTERM/SIGHUP/SIGQUIT) are blocked and
 *    read from a signalfd inside one poll() loop, together with the --tag-output pipes: no async handlers, no
 *    races between waitpid and a signal arriving. SIGPIPE is blocked too, so a closed stdout of the launcher gives
 *    EPIPE instead of killing it. Ranks get the original signal mask back before they run.
 *  - Ranks stay in the launcher's process group (the default after fork). A terminal sends Ctrl-C (SIGINT),
 *    Ctrl-\ (SIGQUIT), hang-up (SIGHUP) and Ctrl-Z to the whole foreground process group, so every rank already
 *    has the signal: the launcher recognises those (si_code SI_KERNEL) and does not send them a second time.
 *    Signals sent to the launcher alone (kill PID, a batch system, `timeout`) have si_code SI_USER and are
 *    forwarded to every rank. A second terminating signal sends SIGKILL to every rank, as mpirun does.
 *  - A signal that was ignored when the launcher started (nohup, `cmd &` in a script) stays ignored and is not
 *    watched: the ranks inherit the ignored disposition, as they would from a shell.
 *  - Every rank has PR_SET_PDEATHSIG = SIGKILL, so `kill -9` of the launcher does not leave ranks behind.
 *  - Only rank 0 keeps the launcher's stdin; the other ranks read /dev/null (as mpirun does).
 *  - The launcher is a child subreaper (PR_SET_CHILD_SUBREAPER) while ranks run: a process a rank started (a rank
 *    that is a shell script running the real program, say) becomes the launcher's child when that rank dies. When
 *    the job is stopped (a rank failed, the timeout, a signal), those orphans are stopped too — SIGTERM, then
 *    SIGKILL after the grace period — before the launcher removes the ranks' shared-memory names and returns, so
 *    nothing of a stopped job keeps running or writing. After a job that succeeded, orphans are left alone.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* signalfd, pipe2, getrandom, prctl */
#endif
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A rank stopped while it creates its communicator (after another rank failed, or at the timeout) cannot unlink its
 * shared-memory inbox; the library names it /dev/shm/zccl-<comm id>-r<rank>-p<pid> (transport/shm.c) and sweeps old
 * ones itself, but the launcher knows the pids and that they have all exited, so it removes them at once. */
static void remove_shm_leftovers(const pid_t *pids, int n) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *p = strrchr(e->d_name, '-');
        if (strncmp(e->d_name, "zccl-", 5) != 0 || !p || p[1] != 'p') continue;
        char *end;
        const long pid = strtol(p + 2, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        for (int r = 0; r < n; r++)
            if (pids[r] == (pid_t)pid) {
                char name[300];
                snprintf(name, sizeof name, "/dev/shm/%s", e->d_name);
                unlink(name);
                break;
            }
    }
    closedir(d);
}

#define ZL_GRACE_S 3.0          /* SIGTERM -> SIGKILL grace period */
#define ZL_DRAIN_S 1.0          /* how long to keep reading tagged output after the last rank exited */
#define ZL_LINE_MAX 16384       /* longest line kept whole by --tag-output */

static const int zl_fwd_sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define ZL_NFWD ((int)(sizeof zl_fwd_sigs / sizeof zl_fwd_sigs[0]))

const char *zl_signame(int sig)
{
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
        {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
        {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
    };
    static char buf[32];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) return names[i].name;
    snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}

int zl_random_secret(char out[33])
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)r;
    }
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[32] = '\0';
    return 0;
}

int zl_parse_long(const char *s, int base, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, base);
    if (errno || end == s || *end != '\0' || v < min || v > max) return -1;
    *out = v;
    return 0;
}

/* Linux hands out local ports for outgoing connections from net.ipv4.ip_local_port_range. A bootstrap port picked
 * there can be taken between the probe and rank 0's bind by any connect() on the machine, or by a rank's own connect
 * to that very port (TCP's self-connect on loopback: source port == destination port), so the port is drawn from
 * below that range (torchrun's 29500 lies there too), or above it, and only falls back to the kernel's choice. */
static void local_port_range(int *lo, int *hi)
{
    *lo = 32768;
    *hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (!f) return;
    int a, b;
    if (fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && b >= a && b <= 65535) {
        *lo = a;
        *hi = b;
    }
    fclose(f);
}

/* Binds port (0: the kernel's choice) on the wildcard address of ai's family; returns the bound port or -1 (errno). */
static int probe_port(const struct addrinfo *ai, int port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (ai->ai_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons((uint16_t)port);
        len = sizeof *a;
    } else if (ai->ai_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)port);
        len = sizeof *a;
    } else {
        errno = EAFNOSUPPORT;
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int got = -1;
    if (bind(fd, (struct sockaddr *)&ss, len) == 0 && getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        got = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                      : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    int e = errno;
    close(fd);
    errno = e;
    return got;
}

int zl_free_port(const char *addr, const char *name)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(addr, "0", &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot resolve address '%s': %s\n", name, addr, gai_strerror(rc));
        return -1;
    }
    int lo, hi;
    local_port_range(&lo, &hi);
    /* candidates: 20000 .. lo-1, else hi+1 .. 65535, else none (the kernel's choice only) */
    int base = 0, span = 0;
    if (lo - 20000 >= 1000) { base = 20000; span = lo - 20000; }
    else if (lo - 10000 >= 1000) { base = 10000; span = lo - 10000; }
    else if (65535 - hi >= 1000) { base = hi + 1; span = 65535 - hi; }
    unsigned r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (unsigned)getpid() * 2654435761u;
    int port = -1, err = 0;
    for (struct addrinfo *ai = res; ai && port < 0; ai = ai->ai_next) {
        for (int t = 0; span > 0 && t < 64 && port < 0; t++) {
            r = r * 1103515245u + 12345u;
            port = probe_port(ai, base + (int)((r >> 8) % (unsigned)span));
            if (port < 0) err = errno;
        }
        if (port < 0 && (port = probe_port(ai, 0)) < 0) err = errno;
    }
    freeaddrinfo(res);
    if (port <= 0) {
        fprintf(stderr, "%s: cannot bind a TCP port on '%s': %s\n", name, addr,
                err ? strerror(err) : "no usable address");
        return -1;
    }
    return port;
}

static double zl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void zl_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                poll(&pf, 1, 100);
                continue;
            }
            return; /* EPIPE etc.: drop the output, keep supervising */
        }
        p += w;
        n -= (size_t)w;
    }
}

/* One tagged output stream (stdout or stderr of one rank). */
struct zl_stream {
    int fd;       /* read end, -1 once closed */
    int wfd;      /* write end, -1 once closed (the launcher closes it after the forks) */
    int dest;     /* 1 or 2 */
    int rank;
    int midline;  /* the last chunk written did not end a line: no prefix before the next bytes */
    size_t len;
    char *buf;
};

static void zl_emit(struct zl_stream *s, const char *line, size_t n)
{
    char prefix[24];
    int plen = 0;
    if (!s->midline) plen = snprintf(prefix, sizeof prefix, "[%d] ", s->rank);
    char out[ZL_LINE_MAX + 32];
    memcpy(out, prefix, (size_t)plen);
    memcpy(out + plen, line, n);
    zl_write_all(s->dest, out, (size_t)plen + n);
    s->midline = (n == 0 || line[n - 1] != '\n');
}

/* Reads what is available; returns 0 at EOF / error (stream closed), 1 otherwise. */
static int zl_pump(struct zl_stream *s)
{
    ssize_t r = read(s->fd, s->buf + s->len, ZL_LINE_MAX - s->len);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
    if (r <= 0) {
        if (s->len > 0) {
            s->buf[s->len++] = '\n'; /* buffer has room: len < ZL_LINE_MAX is kept below */
            zl_emit(s, s->buf, s->len);
            s->len = 0;
        } else if (s->midline) {
            zl_emit(s, "\n", 1);
        }
        close(s->fd);
        s->fd = -1;
        return 0;
    }
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            zl_emit(s, s->buf + start, i + 1 - start);
            start = i + 1;
        }
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (s->len >= ZL_LINE_MAX - 1) { /* over-long line: pass it on in pieces */
        zl_emit(s, s->buf, s->len);
        s->len = 0;
    }
    return 1;
}

struct zl_state {
    const char *name;
    int n;
    pid_t *pids;       /* 0 once reaped / never started */
    int alive;
    int first_fail;    /* rank, or -1 */
    int exit_code;
    int timed_out;
    int launch_failed;
    int got_sig;
    int nsig;
    int stopped;       /* a signal was sent to the ranks: orphans they leave are stopped at the end */
    double kill_at;    /* when to send SIGKILL to survivors; INFINITY if not armed */
};

static void zl_signal_all(struct zl_state *st, int sig)
{
    st->stopped = 1;
    for (int r = 0; r < st->n; r++)
        if (st->pids[r] > 0) kill(st->pids[r], sig);
}

static void zl_stop_all(struct zl_state *st)
{
    zl_signal_all(st, SIGTERM);
    if (isinf(st->kill_at)) st->kill_at = zl_now() + ZL_GRACE_S;
}

/* A memory file the ranks read during init (ZCCL_LAUNCH_STATUS_FD, lib/bootstrap.c): the first abnormal exit of a
 * rank is written into it at once, so ranks waiting for a peer that died before joining fail within half a second. */
static int zl_status_fd = -1;

static void zl_reap(struct zl_state *st)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            if (pid < 0 && errno == EINTR) continue;
            return;
        }
        int r = -1;
        for (int i = 0; i < st->n; i++)
            if (st->pids[i] == pid) { r = i; break; }
        if (r < 0) continue; /* not one of ours */
        st->pids[r] = 0;
        st->alive--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
        if (code == 0 || st->first_fail >= 0 || st->timed_out || st->launch_failed) continue;
        st->first_fail = r;
        st->exit_code = code;
        char how[96];
        if (WIFEXITED(status))
            snprintf(how, sizeof how, "exited with status %d", code);
        else
            snprintf(how, sizeof how, "was killed by signal %d (%s)%s", WTERMSIG(status),
                     zl_signame(WTERMSIG(status)), WCOREDUMP(status) ? ", core dumped" : "");
        if (zl_status_fd >= 0) {
            char line[160];
            int len = snprintf(line, sizeof line, "rank %d (pid %d) %s\n", r, (int)pid, how);
            if (pwrite(zl_status_fd, line, (size_t)len, 0) < 0) { /* the ranks then wait for their own deadline */ }
        }
        /* After a signal (Ctrl-C) a rank has likely been stopped in the middle of a line (a table row of
         * zccl-bench, say): the report starts on a line of its own. */
        const char *nl = st->got_sig ? "\n" : "";
        if (st->alive > 0) {
            fprintf(stderr, "%s%s: rank %d (pid %d) %s; stopping %d other rank%s\n", nl, st->name, r, (int)pid, how,
                    st->alive, st->alive == 1 ? "" : "s");
            zl_stop_all(st);
        } else {
            fprintf(stderr, "%s%s: rank %d (pid %d) %s\n", nl, st->name, r, (int)pid, how);
        }
    }
}

/* Sends sig to every direct child of this process that is not a rank still tracked in st (when this runs, every
 * rank has been reaped, so every child is an orphan a rank left behind); returns how many were signalled. */
static int zl_signal_orphans(int sig)
{
    const pid_t self = getpid();
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        const long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        const size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the last ')' */
        const char *close_paren = strrchr(buf, ')');
        char state;
        long ppid;
        if (!close_paren || sscanf(close_paren + 1, " %c %ld", &state, &ppid) != 2 || ppid != (long)self) continue;
        if (kill((pid_t)pid, sig) == 0) count++;
    }
    closedir(d);
    return count;
}

/* After a stopped job: stop and reap what its ranks left running (SIGTERM, SIGKILL after the grace period). */
static void zl_stop_orphans(void)
{
    const double kill_at = zl_now() + ZL_GRACE_S, give_up = kill_at + 2.0;
    int sig = SIGTERM;
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (zl_signal_orphans(sig) == 0) {
            while (waitpid(-1, NULL, WNOHANG) > 0) {
            }
            return;
        }
        const double now = zl_now();
        if (now >= give_up) return;
        if (now >= kill_at) sig = SIGKILL;
        else sig = 0; /* SIGTERM sent once; afterwards only check whether they are gone */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void zl_on_signal(struct zl_state *st, int sig, int code)
{
    st->nsig++;
    if (st->alive == 0) return;
    if (st->nsig >= 2) {
        fprintf(stderr, "\n%s: got %s again; killing %d rank%s\n", st->name, zl_signame(sig), st->alive,
                st->alive == 1 ? "" : "s");
        zl_signal_all(st, SIGKILL);
        return;
    }
    st->got_sig = sig;
    /* From the terminal (SI_KERNEL) the whole foreground process group, ranks included, already has it. */
    if (code != SI_KERNEL) zl_signal_all(st, sig);
}

/* Child side, between fork and fn(). Never returns on failure. */
static void zl_child_setup(int rank, const struct zl_opts *o, const char *addr, int port, const char *secret,
                           int sfd, struct zl_stream *streams, const sigset_t *oldmask, pid_t parent)
{
    char buf[32];
    if (sfd >= 0) close(sfd);
    if (streams) {
        if (dup2(streams[2 * rank].wfd, 1) < 0 || dup2(streams[2 * rank + 1].wfd, 2) < 0) _exit(127);
        for (int i = 0; i < 2 * o->nranks; i++) {
            if (streams[i].fd > 2) close(streams[i].fd);
            if (streams[i].wfd > 2) close(streams[i].wfd);
        }
    }
    if (rank > 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            if (nul != 0) close(nul);
        }
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL); /* launcher already gone */

    snprintf(buf, sizeof buf, "%d", rank);
    setenv("RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", o->local_rank ? o->local_rank[rank] : rank);
    setenv("LOCAL_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", o->nranks);
    setenv("WORLD_SIZE", buf, 1);
    snprintf(buf, sizeof buf, "%d", o->local_size ? o->local_size[rank] : o->nranks);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    setenv("MASTER_ADDR", addr, 1);
    snprintf(buf, sizeof buf, "%d", port);
    setenv("MASTER_PORT", buf, 1);
    setenv("ZCCL_SECRET", secret, 1);
    if (zl_status_fd >= 0) {
        snprintf(buf, sizeof buf, "%d", zl_status_fd);
        setenv("ZCCL_LAUNCH_STATUS_FD", buf, 1);
    }
    /* Another launcher's rank variables would be ambiguous next to ours. */
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");

    sigprocmask(SIG_SETMASK, oldmask, NULL);
}

/* One launch: what its phases (signals, output pipes, start, supervision, clean-up) share. */
struct zl_run {
    const struct zl_opts *o;
    const char *name, *addr, *secret;
    int n, port, sfd;
    sigset_t oldmask;
    struct zl_state st;
    pid_t *started;             /* pids as launched (st.pids clears them when reaped) */
    struct zl_stream *streams;  /* 2 per rank with --tag-output, else NULL */
    struct pollfd *pfds;
};

/* Blocks the signals the launcher forwards (and SIGCHLD) and reads them from a signalfd instead. */
static int zl_watch_signals(struct zl_run *R)
{
    sigset_t watch, block;
    sigemptyset(&watch);
    sigaddset(&watch, SIGCHLD);
    for (int i = 0; i < ZL_NFWD; i++) {
        struct sigaction sa;
        if (sigaction(zl_fwd_sigs[i], NULL, &sa) == 0 && sa.sa_handler == SIG_IGN) continue;
        sigaddset(&watch, zl_fwd_sigs[i]);
    }
    block = watch;
    sigaddset(&block, SIGPIPE);
    signal(SIGCHLD, SIG_DFL); /* SIG_IGN inherited from our parent would auto-reap the ranks */
    sigprocmask(SIG_BLOCK, &block, &R->oldmask);
    R->sfd = signalfd(-1, &watch, SFD_CLOEXEC | SFD_NONBLOCK);
    if (R->sfd < 0) {
        fprintf(stderr, "%s: signalfd: %s\n", R->name, strerror(errno));
        sigprocmask(SIG_SETMASK, &R->oldmask, NULL);
        return 1;
    }
    return 0;
}

/* --tag-output: one pipe per rank and stream, read by the supervisor and written line by line with a tag. */
static int zl_open_streams(struct zl_run *R)
{
    const int n = R->n;
    struct rlimit rl;
    rlim_t need = (rlim_t)(4 * n + 32);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct zl_stream *streams = R->streams = calloc((size_t)(2 * n), sizeof *streams);
    if (!streams) {
        fprintf(stderr, "%s: out of memory\n", R->name);
        return 1;
    }
    for (int i = 0; i < 2 * n; i++) streams[i].fd = streams[i].wfd = -1;
    for (int i = 0; i < 2 * n; i++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) {
            fprintf(stderr, "%s: cannot create output pipes for %d ranks: %s%s\n", R->name, n, strerror(errno),
                    errno == EMFILE ? " (raise the open-file limit or drop --tag-output)" : "");
            return 1;
        }
        fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
        streams[i].fd = p[0];
        streams[i].wfd = p[1];
        streams[i].rank = i / 2;
        streams[i].dest = (i % 2) ? 2 : 1;
        streams[i].buf = malloc(ZL_LINE_MAX + 1);
        if (!streams[i].buf) {
            fprintf(stderr, "%s: out of memory\n", R->name);
            return 1;
        }
    }
    return 0;
}

/* Forks the ranks; a fork that fails stops those already started. */
static void zl_start_ranks(struct zl_run *R, zl_child_fn fn, void *arg)
{
    struct zl_state *st = &R->st;
    fflush(stdout);
    fflush(stderr);
    pid_t self = getpid();
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* see the design notes */
    for (int r = 0; r < R->n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "%s: cannot start rank %d: fork: %s\n", R->name, r, strerror(errno));
            st->launch_failed = 1;
            st->exit_code = 1;
            if (st->alive > 0) zl_stop_all(st);
            break;
        }
        if (pid == 0) {
            zl_child_setup(r, R->o, R->addr, R->port, R->secret, R->sfd, R->streams, &R->oldmask, self);
            free(R->pfds);
            int rc = fn(r, arg);
            exit(rc);
        }
        st->pids[r] = pid;
        R->started[r] = pid;
        st->alive++;
    }
    if (R->streams) {
        for (int i = 0; i < 2 * R->n; i++) {
            close(R->streams[i].wfd);
            R->streams[i].wfd = -1;
        }
    }
}

/* Until every rank has exited (and their output is drained): signals, output, the job's deadline, the grace period
 * after a stop. */
static void zl_supervise(struct zl_run *R)
{
    struct zl_state *st = &R->st;
    struct zl_stream *streams = R->streams;
    struct pollfd *pfds = R->pfds;
    const int n = R->n;
    double deadline = R->o->timeout_s > 0 ? zl_now() + R->o->timeout_s : INFINITY;
    double drain_until = INFINITY;
    int open_streams = streams ? 2 * n : 0;
    while (st->alive > 0 || (open_streams > 0 && zl_now() < drain_until)) {
        double now = zl_now();
        double next = deadline < st->kill_at ? deadline : st->kill_at;
        if (drain_until < next) next = drain_until;
        int ms = -1;
        if (!isinf(next)) {
            double d = (next - now) * 1000.0 + 1.0;
            ms = d < 0 ? 0 : d > 1e9 ? 1000000000 : (int)d;
        }
        int np = 0;
        pfds[np++] = (struct pollfd){.fd = R->sfd, .events = POLLIN};
        for (int i = 0; streams && i < 2 * n; i++)
            if (streams[i].fd >= 0) pfds[np++] = (struct pollfd){.fd = streams[i].fd, .events = POLLIN};
        int pr = poll(pfds, (nfds_t)np, ms);
        if (pr < 0 && errno != EINTR) {
            fprintf(stderr, "%s: poll: %s\n", R->name, strerror(errno));
            break;
        }
        if (pr > 0 && (pfds[0].revents & POLLIN)) {
            struct signalfd_siginfo si;
            while (read(R->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if ((int)si.ssi_signo == SIGCHLD) zl_reap(st);
                else zl_on_signal(st, (int)si.ssi_signo, si.ssi_code);
            }
        }
        if (pr > 0 && streams) {
            for (int k = 1, i = 0; k < np; k++) {
                if (!(pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                while (i < 2 * n && streams[i].fd != pfds[k].fd) i++;
                if (i < 2 * n && !zl_pump(&streams[i])) open_streams--;
            }
        }
        zl_reap(st); /* cheap; covers a SIGCHLD coalesced with an earlier read */
        now = zl_now();
        if (now >= deadline && st->alive > 0) {
            deadline = INFINITY;
            if (st->first_fail < 0 && !st->launch_failed) {
                st->timed_out = 1;
                /* like a signal, a timeout likely catches a rank in the middle of a line: a line of its own */
                fprintf(stderr, "\n%s: timeout after %g s; stopping %d rank%s\n", R->name, R->o->timeout_s, st->alive,
                        st->alive == 1 ? "" : "s");
                zl_stop_all(st);
            }
        }
        if (now >= st->kill_at) {
            if (st->alive > 0) {
                fprintf(stderr, "%s: %d rank%s still running after %.0f s; sending SIGKILL\n", R->name, st->alive,
                        st->alive == 1 ? "" : "s", ZL_GRACE_S);
                zl_signal_all(st, SIGKILL);
            }
            st->kill_at = INFINITY;
        }
        if (st->alive == 0 && isinf(drain_until)) drain_until = now + ZL_DRAIN_S;
    }
}

/* Flushes partial output lines, stops what the ranks left running, removes their /dev/shm leftovers, frees. */
static void zl_finish(struct zl_run *R)
{
    struct zl_stream *streams = R->streams;
    for (int i = 0; streams && i < 2 * R->n; i++) {
        if (streams[i].fd >= 0) {
            if (streams[i].len > 0) {
                streams[i].buf[streams[i].len++] = '\n';
                zl_emit(&streams[i], streams[i].buf, streams[i].len);
            }
            close(streams[i].fd);
        }
        free(streams[i].buf);
    }
    free(streams);
    free(R->pfds);
    if (R->st.stopped) zl_stop_orphans();
    prctl(PR_SET_CHILD_SUBREAPER, 0);
    remove_shm_leftovers(R->started, R->n);
    free(R->started);
    free(R->st.pids);
    close(R->sfd);
    /* The signal mask stays as it is: unblocking now would deliver a pending SIGPIPE and kill the caller before
     * it can exit with the status computed here. */
}

int zl_launch(const struct zl_opts *o, zl_child_fn fn, void *arg)
{
    struct zl_run R = {.o = o, .name = o->name ? o->name : "zcclrun", .addr = o->addr ? o->addr : "127.0.0.1",
                       .n = o->nranks, .port = o->port, .sfd = -1};
    if (R.n < 1 || R.n > ZL_MAX_RANKS) {
        fprintf(stderr, "%s: number of ranks must be between 1 and %d\n", R.name, ZL_MAX_RANKS);
        return 2;
    }
    if (R.port == 0 && (R.port = zl_free_port(R.addr, R.name)) < 0) return 1;
    char secret_buf[33];
    R.secret = getenv("ZCCL_SECRET");
    if (!R.secret || !*R.secret) {
        if (zl_random_secret(secret_buf) != 0) {
            fprintf(stderr, "%s: getrandom: %s\n", R.name, strerror(errno));
            return 1;
        }
        R.secret = secret_buf;
    }
    zl_status_fd = memfd_create("zccl-launch-status", 0); /* inherited across exec on purpose; -1: ranks do without */
    if (zl_watch_signals(&R) != 0) return 1;
    R.st = (struct zl_state){.name = R.name, .n = R.n, .first_fail = -1, .kill_at = INFINITY};
    R.st.pids = calloc((size_t)R.n, sizeof(pid_t));
    R.started = calloc((size_t)R.n, sizeof(pid_t));
    R.pfds = calloc((size_t)(1 + (o->tag_output ? 2 * R.n : 0)), sizeof(struct pollfd));
    if (!R.st.pids || !R.pfds || !R.started) {
        fprintf(stderr, "%s: out of memory\n", R.name);
        return 1;
    }
    if (o->tag_output && zl_open_streams(&R) != 0) return 1;
    zl_start_ranks(&R, fn, arg);
    zl_supervise(&R);
    zl_finish(&R);
    if (R.st.timed_out) return 124;
    if (R.st.first_fail >= 0 || R.st.launch_failed) return R.st.exit_code;
    if (R.st.got_sig) return 128 + R.st.got_sig;
    return 0;
}

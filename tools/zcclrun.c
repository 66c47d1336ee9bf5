/*
 * zcclrun — start N local ranks of a program with the environment zccl_comm_init_env() reads.
 *
 *   zcclrun [-n N | -np N] [--port P] [--addr A] [--timeout SEC] [--tag-output] [--] prog [args...]
 *
 * Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and ZCCL_SECRET.
 * Supervision (failure propagation, signal forwarding, timeout) is in launch.c; see docs/tools.md.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* signalfd, pipe2, getrandom, prctl */
#endif
#include "launch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME "zcclrun"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: " NAME " [options] [--] PROGRAM [ARGS...]\n"
            "Start N local ranks of PROGRAM for zccl (zccl_comm_init_env reads the environment set here).\n"
            "\n"
            "Options:\n"
            "  -n, -np, --np N      number of ranks to start (default 1)\n"
            "  --addr A             MASTER_ADDR given to the ranks (default 127.0.0.1)\n"
            "  --port P             MASTER_PORT (default: a free port, found by binding port 0 on the address)\n"
            "  --timeout SEC        stop every rank and exit with status 124 after SEC seconds\n"
            "  --tag-output         prefix each line a rank writes on stdout/stderr with \"[rank] \"\n"
            "  -h, --help           show this help\n"
            "\n"
            "Environment of each rank: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
            "ZCCL_SECRET (32 random hex digits, unless ZCCL_SECRET is already set). Rank 0 keeps stdin; the\n"
            "others read /dev/null.\n"
            "\n"
            "Exit status: 0 if every rank exited with 0; else the first failing rank's status (128+N if it was\n"
            "killed by signal N), after the other ranks are stopped (SIGTERM, then SIGKILL 3 s later); 124 on\n"
            "--timeout; 127 if PROGRAM is not found, 126 if it cannot be executed; 2 for bad options.\n"
            "SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to " NAME " are forwarded to every rank (a terminal's Ctrl-C\n"
            "reaches the ranks directly, as they are in " NAME "'s process group); a second one kills all ranks.\n");
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, NAME ": ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry '" NAME " --help' for more information.\n");
    return 2;
}

static int parse_int(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max) return -1;
    *out = v;
    return 0;
}

/* Resolves prog as execvp would. Returns 0 if found and executable, 127 if not found, 126 if not executable. */
static int check_program(const char *prog)
{
    struct stat sb;
    if (strchr(prog, '/')) {
        if (stat(prog, &sb) != 0) {
            fprintf(stderr, NAME ": %s: %s\n", prog, strerror(errno));
            return errno == ENOENT || errno == ENOTDIR ? 127 : 126;
        }
        if (S_ISDIR(sb.st_mode) || access(prog, X_OK) != 0) {
            fprintf(stderr, NAME ": %s: %s\n", prog, S_ISDIR(sb.st_mode) ? "is a directory" : strerror(errno));
            return 126;
        }
        return 0;
    }
    if (!*prog) {
        fprintf(stderr, NAME ": empty program name\n");
        return 127;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/bin:/usr/bin";
    int found_noexec = 0;
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char full[PATH_MAX];
        int w = dlen ? snprintf(full, sizeof full, "%.*s/%s", (int)dlen, p, prog)
                     : snprintf(full, sizeof full, "./%s", prog);
        if (w > 0 && (size_t)w < sizeof full && stat(full, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
            if (access(full, X_OK) == 0) return 0;
            found_noexec = 1;
        }
        if (!colon) break;
        p = colon + 1;
    }
    if (found_noexec) {
        fprintf(stderr, NAME ": %s: permission denied\n", prog);
        return 126;
    }
    fprintf(stderr, NAME ": %s: command not found\n", prog);
    return 127;
}

static int exec_rank(int rank, void *arg)
{
    char **argv = arg;
    (void)rank;
    execvp(argv[0], argv);
    int e = errno;
    fprintf(stderr, NAME ": cannot execute %s: %s\n", argv[0], strerror(e));
    return e == ENOENT ? 127 : 126;
}

int main(int argc, char **argv)
{
    struct zl_opts o = {.nranks = 1, .name = NAME};
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == '\0') break; /* the program */
        if (!strcmp(a, "--")) { i++; break; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--tag-output")) { o.tag_output = 1; continue; }

        /* options with a value: "-n N", "-nN", "--np=N", "--port=P", ... */
        const char *val = NULL, *opt = a;
        char optbuf[32];
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq) {
            snprintf(optbuf, sizeof optbuf, "%.*s", (int)(eq - a), a);
            opt = optbuf;
            val = eq + 1;
        }
        enum { O_N, O_PORT, O_ADDR, O_TIMEOUT, O_BAD } which = O_BAD;
        if (!strcmp(opt, "-n") || !strcmp(opt, "-np") || !strcmp(opt, "--np") || !strcmp(opt, "--nproc") ||
            !strcmp(opt, "--nproc-per-node") || !strcmp(opt, "--nproc_per_node"))
            which = O_N;
        else if (!strcmp(opt, "--port") || !strcmp(opt, "--master-port") || !strcmp(opt, "--master_port"))
            which = O_PORT;
        else if (!strcmp(opt, "--addr") || !strcmp(opt, "--master-addr") || !strcmp(opt, "--master_addr"))
            which = O_ADDR;
        else if (!strcmp(opt, "--timeout"))
            which = O_TIMEOUT;
        else if (!eq && strncmp(a, "-n", 2) == 0 && a[2] >= '0' && a[2] <= '9') { /* -n4 */
            which = O_N;
            opt = "-n";
            val = a + 2;
        }
        if (which == O_BAD) return bad("unknown option '%s'%s", a, "");
        if (!val) {
            if (i + 1 >= argc) return bad("option '%s' needs a value%s", opt, "");
            val = argv[++i];
        }
        long v;
        switch (which) {
        case O_N:
            if (parse_int(val, LONG_MIN, LONG_MAX, &v) != 0)
                return bad("%s: '%s' is not a number", opt, val);
            if (v < 1 || v > ZL_MAX_RANKS) {
                char lim[16];
                snprintf(lim, sizeof lim, "%d", ZL_MAX_RANKS);
                return bad("number of ranks must be between 1 and %s (got %s)", lim, val);
            }
            o.nranks = (int)v;
            break;
        case O_PORT:
            if (parse_int(val, 1, 65535, &v) != 0) return bad("--port: '%s' is not a port number (1-65535)%s", val, "");
            o.port = (int)v;
            break;
        case O_ADDR:
            if (!*val) return bad("--addr: empty address%s%s", "", "");
            o.addr = val;
            break;
        case O_TIMEOUT: {
            char *end;
            errno = 0;
            double t = strtod(val, &end);
            if (errno || end == val || *end != '\0' || !(t > 0) || t > 1e9)
                return bad("--timeout: '%s' is not a positive number of seconds%s", val, "");
            o.timeout_s = t;
            break;
        }
        default:
            break;
        }
    }
    if (i >= argc) return bad("no program given%s%s", "", "");
    char **prog_argv = argv + i;
    int rc = check_program(prog_argv[0]);
    if (rc != 0) return rc;
    return zl_launch(&o, exec_rank, prog_argv);
}

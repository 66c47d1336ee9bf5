/*
 * launch.h — the local multi-process launcher shared by zcclrun and `zccl-bench -np N`.
 *
 * zl_launch() forks N rank processes, gives each the environment that zccl_comm_init_env() reads
 * (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ZCCL_SECRET), supervises them and
 * returns the exit status the launcher should exit with:
 *   - 0 when every rank exited with status 0;
 *   - the first failing rank's status (128+signo if it was killed by a signal); the other ranks then get SIGTERM
 *     and, 3 s later, SIGKILL;
 *   - 124 when the optional timeout expires (all ranks are stopped the same way);
 *   - 128+signo when the launcher itself got SIGINT/SIGTERM/SIGHUP/SIGQUIT and every rank then exited 0.
 * Ranks stay in the launcher's process group, so a terminal's Ctrl-C / Ctrl-Z / Ctrl-\ reach every rank directly
 * (as for any foreground job) and job control works; signals sent to the launcher alone (kill PID) are forwarded.
 * A second terminating signal kills every rank with SIGKILL.
 *
 * Not part of the library: tools only. Linux-specific (signalfd, prctl, getrandom).
 */
#ifndef ZCCL_TOOLS_LAUNCH_H
#define ZCCL_TOOLS_LAUNCH_H

#ifdef __cplusplus
extern "C" {
#endif

#define ZL_MAX_RANKS 65536

struct zl_opts {
    int nranks;          /* >= 1 */
    const char *addr;    /* MASTER_ADDR; NULL: "127.0.0.1" */
    int port;            /* MASTER_PORT; 0: a free port found by binding port 0 on addr */
    double timeout_s;    /* > 0: stop everything and return 124 after this many seconds */
    int tag_output;      /* prefix every line of each rank's stdout/stderr with "[rank] " */
    const char *name;    /* program name used in messages, e.g. "zcclrun" */
    const int *local_rank; /* per rank: LOCAL_RANK (rank within its host); NULL: the rank itself (one host) */
    const int *local_size; /* per rank: LOCAL_WORLD_SIZE (ranks on its host); NULL: nranks (one host) */
};

/*
 * Called in each forked rank process, after the environment and signal state are set up. Returns the exit status
 * of the rank (the child then calls exit() with it), or does not return (execvp).
 */
typedef int (*zl_child_fn)(int rank, void *arg);

/* Runs the job; returns the launcher's exit status (see above). Prints its own errors on stderr. */
int zl_launch(const struct zl_opts *opts, zl_child_fn fn, void *arg);

/*
 * Fills out[33] with 32 lowercase hex digits from getrandom() (16 random bytes). Returns 0, or -1 with errno set.
 */
int zl_random_secret(char out[33]);

/*
 * Finds a free TCP port on addr by binding port 0 and reading the port back (the socket is closed again).
 * Returns the port, or -1 after printing an error prefixed with name.
 */
int zl_free_port(const char *addr, const char *name);

/*
 * Parses all of s as a number in base (10; 0: C's prefixes, 0x.. and 0..) into *out. Returns 0, or -1 when s is not
 * such a number or lies outside [min, max].
 */
int zl_parse_long(const char *s, int base, long min, long max, long *out);

/* Short name of a signal ("SIGTERM"), or "signal N" in a static buffer for unknown ones. */
const char *zl_signame(int sig);

#ifdef __cplusplus
}
#endif
#endif

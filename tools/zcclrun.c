/*
 * zcclrun — start N local ranks of a program with the environment zccl_comm_init_env() reads.
 *
 *   zcclrun [-n N | -np N] [--hostfile FILE] [--port P] [--addr A] [--timeout SEC] [--tag-output]
 *           [--bind core|numa|package|none] [--report-bindings] [--] prog [args...]
 *
 * Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ZCCL_SECRET and
 * ZCCL_LOCAL_BIND (and ZCCL_MACHINE_RANKS where hosts of a --hostfile share this machine). Supervision (failure
 * propagation, signal forwarding, timeout) is in launch.c; CPU binding (--bind, as mpirun --bind-to) is here, with hwloc; so are the simulated hosts of --hostfile (network
 * namespaces on this machine): see docs/tools.md.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* signalfd, pipe2, getrandom, prctl */
#endif
#include "launch.h"
#include "zccl_version.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hwloc.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NAME "zcclrun"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: " NAME " [options] [--] PROGRAM [ARGS...]\n"
            "Start N local ranks of PROGRAM for zccl (zccl_comm_init_env reads the environment set here).\n"
            "\n"
            "Options:\n"
            "  -n, -np, --np N      number of ranks to start (default 1; with --hostfile: the hostfile's slots);\n"
            "                       also --nproc, --nproc-per-node / --nproc_per_node (torchrun's name)\n"
            "  --hostfile FILE      (or --machinefile) start the ranks on the hosts FILE lists, one per line:\n"
            "                       \"HOST slots=M\" or \"ssh:HOST slots=M\" (a remote host, reached with ssh),\n"
            "                       \"netns:NAME slots=M\" (a network namespace of this machine, as 'ip netns add\n"
            "                       NAME' makes it) or \"localhost slots=M\"; ranks fill the hosts in order\n"
            "  --ssh CMD            remote shell for ssh hosts (default \"ssh -x -o BatchMode=yes\"); it is run as\n"
            "                       CMD HOST COMMAND, with the rank's environment on its stdin\n"
            "  --addr A             MASTER_ADDR given to the ranks (also --master-addr, --master_addr; default\n"
            "                       127.0.0.1; with --hostfile and a first host netns:NAME: that namespace's first\n"
            "                       address; ssh:HOST: HOST)\n"
            "  --port P             MASTER_PORT (also --master-port, --master_port; default: a free port below the\n"
            "                       kernel's ephemeral range, which no connection's source port can take; a random\n"
            "                       one in 20000-32767 when the first host is remote)\n"
            "  --timeout SEC        stop every rank and exit with status 124 after SEC seconds\n"
            "  --tag-output         prefix each line a rank writes on stdout/stderr with \"[rank] \"\n"
            "  --bind WHAT          bind local rank i (with --hostfile: this machine's rank i over its hosts),\n"
            "                       before it starts, to core / NUMA node / package i mod count\n"
            "                       of the CPUs " NAME " may use (WHAT: core, numa, package or none), like mpirun\n"
            "                       --bind-to; --bind numa binds memory to that node too (machines with several\n"
            "                       nodes). Default: core where the ranks on this machine fit its cores, else\n"
            "                       none (said at ZCCL_DEBUG=INFO; --hostfile's netns and localhost hosts count\n"
            "                       together: they share this machine); --bind none turns binding off, --bind core\n"
            "                       forces it\n"
            "  --report-bindings    print each rank's binding on stderr\n"
            "  -x VAR[=VALUE]       as mpirun's -x: with =VALUE, set VAR for every local and netns rank (they inherit\n"
            "                       " NAME "'s environment, so plain -x VAR changes nothing; remote ranks get only the\n"
            "                       ZCCL_*/NCCL_* variables)\n"
            "  --oversubscribe      accepted for mpirun's habit: more ranks than cores is always allowed (binding\n"
            "                       is then off unless --bind core)\n"
            "  --version            print the version and exit\n"
            "  -h, --help           show this help\n"
            "\n"
            "Environment of each rank: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
            "ZCCL_SECRET (32 random hex digits, unless ZCCL_SECRET is already set), ZCCL_LOCAL_BIND (what the rank\n"
            "is bound to: core, numa, package or none), and ZCCL_MACHINE_RANKS (ranks on this machine over its\n"
            "hosts) where --hostfile puts several hosts on it (not on ssh: hosts). Rank 0 keeps stdin; the others\n"
            "read /dev/null. A rank on a host netns:NAME runs in that\n"
            "network namespace (as 'ip netns exec NAME' would start it) with hostname NAME in a UTS namespace of\n"
            "its own, so zccl treats each namespace as a separate host (TCP between them). Needs root. A rank on a\n"
            "remote host gets the same variables and every ZCCL_*/NCCL_* one of " NAME "'s environment on the\n"
            "remote shell's stdin (never on a command line), runs in the same directory when it exists there,\n"
            "and reads an empty stdin; PROGRAM must have the same path on every host.\n"
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

/* ---- --bind: one hwloc topology loaded in the launcher, each rank binds itself between fork and exec ---- */

enum bind_kind { BIND_NONE, BIND_CORE, BIND_NUMA, BIND_PACKAGE };
static const char *const bind_words[] = {"none", "core", "numa", "package"};

struct bind_plan {
    enum bind_kind kind;    /* BIND_NONE: nothing is bound (only --report-bindings needs the plan) */
    int by_default;         /* no --bind: kind is BIND_CORE, but ranks are bound only where this machine's fit */
    int nranks;
    const int *cpu_rank;    /* per rank: its index among the ranks started on this machine; NULL: the rank itself */
    int cpu_size;           /* ranks started on this machine (over all its hosts of a --hostfile) */
    hwloc_topology_t topo;
    hwloc_bitmap_t avail;   /* PUs the launcher may run on (its own binding): what ranks can be bound within */
    int nobjs;              /* objects ranks are spread over, in logical order */
    hwloc_obj_t *objs;
    hwloc_bitmap_t *sets;   /* objs[k]->cpuset & avail: what rank r is bound to, k = r mod nobjs */
    int membind;            /* --bind numa with more than one NUMA node: bind memory to the node as well */
};

/* Rank r's object. The ranks are counted over this machine, not per host: the network-namespace hosts of a
 * --hostfile (and a localhost line) all run on this machine's cores, so numbering each host's ranks from 0 would put
 * every host's first rank on core 0 while other cores idle (2 hosts x 1 rank on 2 cores: both ranks on core 0). */
static int bind_index(const struct bind_plan *p, int r)
{
    return (p->cpu_rank ? p->cpu_rank[r] : r) % p->nobjs;
}

/* Whether zcclrun binds rank r: always under --bind core|numa|package; by default where the ranks it starts on this
 * machine fit its cores (more ranks than cores would share them, and a rank bound to a busy core cannot move to an
 * idle one). */
static int rank_bound(const struct bind_plan *p, int r)
{
    return p->kind != BIND_NONE && (!p->by_default || p->cpu_size <= p->nobjs) && (!p->cpu_rank || p->cpu_rank[r] >= 0);
}

struct hostplan;
struct job {
    char **argv;
    struct bind_plan *bind;   /* NULL: --bind none */
    struct hostplan *hosts;   /* NULL: no --hostfile (every rank on this host) */
    char **ssh;               /* the remote-shell command of ssh hosts, as argv (--ssh; default ssh) */
};

/* "core 1", "numa 0" (NUMA nodes by OS index, as numactl and /sys number them), "package 0" (logical index). */
static void obj_label(hwloc_obj_t o, char *buf, size_t len)
{
    switch (o->type) {
    case HWLOC_OBJ_CORE: snprintf(buf, len, "core %u", o->logical_index); break;
    case HWLOC_OBJ_NUMANODE: snprintf(buf, len, "numa %u", o->os_index); break;
    case HWLOC_OBJ_PACKAGE: snprintf(buf, len, "package %u", o->logical_index); break;
    case HWLOC_OBJ_PU: snprintf(buf, len, "pu %u", o->os_index); break;
    default: snprintf(buf, len, "machine"); break;
    }
}

/* Objects of `type` with at least one PU in avail, in logical order. Returns their count (0 if none). */
static int collect_objs(struct bind_plan *p, hwloc_obj_type_t type)
{
    int total = hwloc_get_nbobjs_by_type(p->topo, type);
    if (total <= 0) return 0;
    p->objs = calloc((size_t)total, sizeof *p->objs);
    p->sets = calloc((size_t)total, sizeof *p->sets);
    if (!p->objs || !p->sets) return -1;
    int n = 0;
    for (int k = 0; k < total; k++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(p->topo, type, (unsigned)k);
        if (!o || !o->cpuset || !hwloc_bitmap_intersects(o->cpuset, p->avail)) continue; /* e.g. CPU-less NUMA */
        hwloc_bitmap_t set = hwloc_bitmap_alloc();
        if (!set) return -1;
        hwloc_bitmap_and(set, o->cpuset, p->avail);
        p->objs[n] = o;
        p->sets[n] = set;
        p->nobjs = ++n;
    }
    return n;
}

/*
 * Loads the topology and works out what each rank is bound to (bind_index, rank_bound). Prints the
 * oversubscription warning (not for the default, which binds only where the ranks fit). Returns 0, or 1 after
 * printing an error.
 */
static int bind_prepare(struct bind_plan *p, enum bind_kind kind, int by_default, int nranks, const int *cpu_rank,
                        int cpu_size)
{
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->by_default = by_default;
    p->nranks = nranks;
    p->cpu_rank = cpu_rank;
    p->cpu_size = cpu_rank ? cpu_size : nranks;
    const int most = p->cpu_size; /* ranks sharing this machine's cores */
    if (hwloc_topology_init(&p->topo) != 0) {
        fprintf(stderr, NAME ": hwloc_topology_init: %s\n", strerror(errno));
        return 1;
    }
    /* Only what binding needs: no caches, groups or I/O (PUs, NUMA nodes and the machine are always kept). */
    hwloc_topology_set_all_types_filter(p->topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_type_filter(p->topo, HWLOC_OBJ_PACKAGE, HWLOC_TYPE_FILTER_KEEP_ALL);
    hwloc_topology_set_type_filter(p->topo, HWLOC_OBJ_CORE, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (hwloc_topology_load(p->topo) != 0) {
        fprintf(stderr, NAME ": cannot read the machine topology (hwloc): %s\n", strerror(errno));
        return 1;
    }
    p->avail = hwloc_bitmap_alloc();
    if (!p->avail) goto oom;
    /* Within the launcher's own binding (taskset, a batch system's allocation), as mpirun does. */
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(p->topo);
    if (hwloc_get_cpubind(p->topo, p->avail, HWLOC_CPUBIND_PROCESS) != 0 || !hwloc_bitmap_intersects(p->avail, all))
        hwloc_bitmap_copy(p->avail, all);
    else
        hwloc_bitmap_and(p->avail, p->avail, all);
    if (kind == BIND_NONE) return 0; /* only --report-bindings */

    static const hwloc_obj_type_t types[] = {HWLOC_OBJ_MACHINE, HWLOC_OBJ_CORE, HWLOC_OBJ_NUMANODE,
                                             HWLOC_OBJ_PACKAGE};
    int got = collect_objs(p, types[kind]);
    if (got == 0) { /* no cores (PUs instead) or no packages (the whole machine) reported by this system */
        free(p->objs);
        free(p->sets);
        p->objs = NULL;
        p->sets = NULL;
        got = collect_objs(p, kind == BIND_CORE ? HWLOC_OBJ_PU : HWLOC_OBJ_MACHINE);
    }
    if (got < 0) goto oom;
    if (got == 0) {
        fprintf(stderr, NAME ": --bind %s: no %s found in the machine topology\n", bind_words[kind],
                bind_words[kind]);
        return 1;
    }
    p->membind = kind == BIND_NUMA && p->objs[0]->type == HWLOC_OBJ_NUMANODE &&
                 hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_NUMANODE) > 1;

    /* Oversubscription: more ranks on this machine than cores (--bind core), or than PUs on one NUMA node / package. */
    char lab[48];
    if (kind == BIND_CORE && !by_default && most > p->nobjs) {
        fprintf(stderr,
                NAME ": warning: %d ranks on %s but only %d core%s: cores are oversubscribed (%s rank i is "
                "bound to core i mod %d)\n", most, cpu_rank ? "this machine" : "a host", p->nobjs,
                p->nobjs == 1 ? "" : "s", cpu_rank ? "this machine's" : "local", p->nobjs);
    } else if (kind != BIND_CORE) {
        for (int k = 0; k < p->nobjs && k < most; k++) {
            int on = most / p->nobjs + (k < most % p->nobjs);
            int pus = hwloc_bitmap_weight(p->sets[k]);
            if (on > pus) {
                obj_label(p->objs[k], lab, sizeof lab);
                fprintf(stderr, NAME ": warning: %d ranks bound to %s, which has %d PU%s: oversubscribed\n", on,
                        lab, pus, pus == 1 ? "" : "s");
                break;
            }
        }
    }
    return 0;
oom:
    fprintf(stderr, NAME ": out of memory\n");
    return 1;
}

/* Appends " numa 0-1" (NUMA OS indexes) or " package 0" (logical indexes) for the objects set intersects. */
static void list_touching(const struct bind_plan *p, hwloc_const_cpuset_t set, hwloc_obj_type_t type,
                          const char *word, char *buf, size_t len)
{
    hwloc_bitmap_t ids = hwloc_bitmap_alloc();
    if (!ids) return;
    hwloc_obj_t o = NULL;
    while ((o = hwloc_get_next_obj_by_type(p->topo, type, o)) != NULL)
        if (o->cpuset && hwloc_bitmap_intersects(o->cpuset, set))
            hwloc_bitmap_set(ids, type == HWLOC_OBJ_NUMANODE ? o->os_index : o->logical_index);
    if (!hwloc_bitmap_iszero(ids)) {
        size_t used = strlen(buf);
        if (used + 1 < len) {
            used += (size_t)snprintf(buf + used, len - used, " %s ", word);
            if (used < len) hwloc_bitmap_list_snprintf(buf + used, len - used, ids);
        }
    }
    hwloc_bitmap_free(ids);
}

static void bind_free(struct bind_plan *p)
{
    for (int k = 0; k < p->nobjs; k++) hwloc_bitmap_free(p->sets[k]);
    free(p->sets);
    free(p->objs);
    hwloc_bitmap_free(p->avail);
    if (p->topo) hwloc_topology_destroy(p->topo);
}

/* --report-bindings: "zcclrun: rank 3 bound to core 1 (PUs 1) numa 0 package 0", one line per rank. */
static void bind_report(const struct bind_plan *p, int nranks)
{
    char pus[256], line[768], lab[48];
    for (int r = 0; r < nranks; r++) {
        if (p->cpu_rank && p->cpu_rank[r] < 0) {
            fprintf(stderr, NAME ": rank %d runs on an ssh: host: binding is that host's affair\n", r);
            continue;
        }
        if (!rank_bound(p, r)) {
            hwloc_bitmap_list_snprintf(pus, sizeof pus, p->avail);
            fprintf(stderr, NAME ": rank %d not bound (PUs %s)\n", r, pus);
            continue;
        }
        int k = bind_index(p, r);
        hwloc_obj_t o = p->objs[k];
        obj_label(o, lab, sizeof lab);
        hwloc_bitmap_list_snprintf(pus, sizeof pus, p->sets[k]);
        snprintf(line, sizeof line, "%s (PUs %s)", lab, pus);
        if (o->type != HWLOC_OBJ_NUMANODE) list_touching(p, p->sets[k], HWLOC_OBJ_NUMANODE, "numa", line, sizeof line);
        if (o->type != HWLOC_OBJ_PACKAGE) list_touching(p, p->sets[k], HWLOC_OBJ_PACKAGE, "package", line, sizeof line);
        fprintf(stderr, NAME ": rank %d bound to %s\n", r, line);
    }
}

/* In the rank, after fork: the CPU binding (and memory policy) is kept across execvp. Returns 0, or 1 on error. */
static int bind_self(const struct bind_plan *p, int rank)
{
    int k = bind_index(p, rank);
    char lab[48];
    if (hwloc_set_cpubind(p->topo, p->sets[k], HWLOC_CPUBIND_PROCESS) != 0) {
        int e = errno;
        char pus[256];
        obj_label(p->objs[k], lab, sizeof lab);
        hwloc_bitmap_list_snprintf(pus, sizeof pus, p->sets[k]);
        fprintf(stderr, NAME ": rank %d: cannot bind to %s (PUs %s): %s\n", rank, lab, pus, strerror(e));
        return 1;
    }
    /* The rank is single-threaded here: its thread policy is what later threads inherit and exec keeps. */
    if (p->membind && hwloc_set_membind(p->topo, p->objs[k]->nodeset, HWLOC_MEMBIND_BIND,
                                        HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0) {
        int e = errno;
        obj_label(p->objs[k], lab, sizeof lab);
        fprintf(stderr, NAME ": rank %d: warning: cannot bind memory to %s: %s (CPU binding only)\n", rank, lab,
                strerror(e));
    }
    return 0;
}


/* ---- --hostfile: simulated hosts, one network namespace each ---- */

struct host {
    char *ns;  /* network namespace name; NULL: localhost (this process's namespaces) or a remote host */
    char *ssh; /* remote host ([user@]name) reached with --ssh's command; NULL: on this machine */
    int slots; /* ranks on this host */
};

struct hostplan {
    int nhosts;
    struct host *hosts;
    int *host_of;    /* per rank: index into hosts */
    int *local_rank; /* per rank: rank within its host */
    int *local_size; /* per rank: ranks on its host */
    int *cpu_rank;   /* per rank: index among the ranks on this machine (network-namespace and localhost hosts); -1 on
                      * an ssh host */
    int cpu_size;    /* ranks on this machine */
};

/* Whether rank r runs on this machine beside another host's ranks (netns / localhost hosts of a --hostfile): they
 * share its cores, which the binding messages and ZCCL_MACHINE_RANKS say. */
static int shares_machine(const struct hostplan *hp, int r)
{
    return hp && hp->cpu_rank[r] >= 0 && hp->cpu_size > hp->local_size[r];
}

/* ip(8) keeps named network namespaces as bind mounts in /run/netns (/var/run/netns on older systems). */
static int open_netns(const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        snprintf(path, sizeof path, "/var/run/netns/%s", name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    return fd;
}

/* Whether s can be given to ssh as a destination: [user@]host with letters, digits and . _ - : (IPv6) only, not
 * starting with '-' (it would be read as an option). */
static int ssh_dest_ok(const char *s)
{
    if (!*s || *s == '-' || strlen(s) > 255) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("._-:@", *p)))
            return 0;
    return strchr(s, '@') == strrchr(s, '@'); /* at most one '@' */
}

/* Lines "netns:NAME slots=M", "localhost slots=M", "ssh:HOST slots=M" or "HOST slots=M" (slots defaults to 1);
 * '#' starts a comment. Returns 0, or 2 after printing an error naming the file and line. */
static int hostfile_read(const char *path, struct hostplan *hp)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, NAME ": --hostfile %s: %s\n", path, strerror(errno));
        return 2;
    }
    char line[1024];
    int lineno = 0, cap = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok) continue;
        struct host h = {NULL, NULL, 1};
        if (!strncmp(tok, "netns:", 6)) {
            const char *name = tok + 6;
            if (!*name || strlen(name) > 64 || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
                fprintf(stderr, NAME ": %s:%d: '%s': a namespace name must be 1 to 64 characters without '/' "
                        "(it becomes the host's hostname)\n", path, lineno, tok);
                rc = 2;
                break;
            }
            h.ns = strdup(name);
        } else if (strcmp(tok, "localhost") != 0) {
            const char *dest = strncmp(tok, "ssh:", 4) ? tok : tok + 4;
            if (!ssh_dest_ok(dest)) {
                fprintf(stderr, NAME ": %s:%d: unknown host '%s': a host is 'netns:NAME' (a network namespace), "
                        "'localhost', or a remote host '[ssh:][user@]NAME' (letters, digits, '.', '_', '-', ':'; "
                        "not starting with '-')\n", path, lineno, tok);
                rc = 2;
                break;
            }
            h.ssh = strdup(dest);
        }
        while ((tok = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
            long v;
            if (strncmp(tok, "slots=", 6) != 0 || zl_parse_long(tok + 6, 10, 1, ZL_MAX_RANKS, &v) != 0) {
                fprintf(stderr, NAME ": %s:%d: '%s': expected slots=M with M from 1 to %d\n", path, lineno, tok,
                        ZL_MAX_RANKS);
                rc = 2;
                break;
            }
            h.slots = (int)v;
        }
        if (rc) { free(h.ns); free(h.ssh); break; }
        for (int k = 0; k < hp->nhosts; k++) {
            const struct host *o = &hp->hosts[k];
            if ((h.ns == NULL) == (o->ns == NULL) && (h.ssh == NULL) == (o->ssh == NULL) &&
                (!h.ns || !strcmp(h.ns, o->ns)) && (!h.ssh || !strcmp(h.ssh, o->ssh))) {
                fprintf(stderr, NAME ": %s:%d: host '%s%s' is listed twice\n", path, lineno,
                        h.ns ? "netns:" : h.ssh ? "ssh:" : "", h.ns ? h.ns : h.ssh ? h.ssh : "localhost");
                rc = 2;
                break;
            }
        }
        if (rc) { free(h.ns); free(h.ssh); break; }
        if (hp->nhosts == cap) {
            cap = cap ? 2 * cap : 8;
            struct host *nh = realloc(hp->hosts, (size_t)cap * sizeof *nh);
            if (!nh) { fprintf(stderr, NAME ": out of memory\n"); free(h.ns); free(h.ssh); rc = 1; break; }
            hp->hosts = nh;
        }
        hp->hosts[hp->nhosts++] = h;
    }
    if (!rc && ferror(f)) {
        fprintf(stderr, NAME ": --hostfile %s: read error\n", path);
        rc = 2;
    }
    fclose(f);
    if (!rc && hp->nhosts == 0) {
        fprintf(stderr, NAME ": --hostfile %s: no hosts in it\n", path);
        rc = 2;
    }
    for (int k = 0; !rc && k < hp->nhosts; k++) {
        if (!hp->hosts[k].ns) continue;
        int fd = open_netns(hp->hosts[k].ns);
        if (fd < 0) {
            fprintf(stderr, NAME ": --hostfile %s: network namespace '%s': %s (create it with 'ip netns add %s')\n",
                    path, hp->hosts[k].ns, strerror(errno), hp->hosts[k].ns);
            rc = 2;
        } else {
            close(fd);
        }
    }
    return rc;
}

/* Ranks fill the hosts in hostfile order. *nranks = 0: all slots. Returns 0, or 2 after printing an error. */
static int hostplan_assign(struct hostplan *hp, int *nranks, const char *path)
{
    long total = 0;
    for (int k = 0; k < hp->nhosts; k++) total += hp->hosts[k].slots;
    if (total > ZL_MAX_RANKS) total = ZL_MAX_RANKS;
    if (*nranks == 0) *nranks = (int)total;
    if (*nranks > total) {
        fprintf(stderr, NAME ": %d ranks asked for, but the hosts of %s have %ld slot%s\n", *nranks, path, total,
                total == 1 ? "" : "s");
        return 2;
    }
    int n = *nranks;
    hp->host_of = malloc((size_t)n * sizeof(int));
    hp->local_rank = malloc((size_t)n * sizeof(int));
    hp->local_size = malloc((size_t)n * sizeof(int));
    hp->cpu_rank = malloc((size_t)n * sizeof(int));
    if (!hp->host_of || !hp->local_rank || !hp->local_size || !hp->cpu_rank) {
        fprintf(stderr, NAME ": out of memory\n");
        return 1;
    }
    for (int r = 0, k = 0, used = 0; r < n; r++) {
        while (used == hp->hosts[k].slots) { k++; used = 0; }
        hp->host_of[r] = k;
        hp->local_rank[r] = used++;
    }
    for (int r = 0; r < n; r++) {
        int k = hp->host_of[r];
        hp->local_size[r] = hp->hosts[k].slots;
        if (r + (hp->hosts[k].slots - hp->local_rank[r]) > n) hp->local_size[r] = n - (r - hp->local_rank[r]);
        hp->cpu_rank[r] = hp->hosts[k].ssh ? -1 : hp->cpu_size++;
    }
    return 0;
}

static void hostplan_free(struct hostplan *hp)
{
    for (int k = 0; k < hp->nhosts; k++) {
        free(hp->hosts[k].ns);
        free(hp->hosts[k].ssh);
    }
    free(hp->hosts);
    free(hp->host_of);
    free(hp->local_rank);
    free(hp->local_size);
    free(hp->cpu_rank);
}

/*
 * Moves the calling (single-threaded) process onto host ns, as `ip netns exec NS` does: its network namespace;
 * a mount namespace of its own in which /sys is sysfs of that network namespace (so /sys/class/net lists the
 * host's interfaces); and a UTS namespace of its own with hostname NS, so that ranks on different simulated hosts
 * have different host identities (zccl keys shared memory on hostname + boot id). Returns 0, or 1 after printing
 * an error naming the rank and the step.
 */
static int enter_host(const char *ns, int rank)
{
    const char *step = "open the namespace";
    int fd = open_netns(ns);
    if (fd < 0) goto fail;
    step = "setns(CLONE_NEWNET)";
    if (setns(fd, CLONE_NEWNET) != 0) { int e = errno; close(fd); errno = e; goto fail; }
    close(fd);
    step = "unshare(CLONE_NEWUTS | CLONE_NEWNS)";
    if (unshare(CLONE_NEWUTS | CLONE_NEWNS) != 0) goto fail;
    step = "sethostname";
    if (sethostname(ns, strlen(ns)) != 0) goto fail;
    step = "make / a slave mount";
    if (mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0) goto fail;
    step = "remount /sys";
    umount2("/sys", MNT_DETACH); /* may not be mounted at all; the mount below is what matters */
    if (mount(ns, "/sys", "sysfs", 0, NULL) != 0) goto fail;
    return 0;
fail:
    fprintf(stderr, NAME ": rank %d: cannot enter network namespace '%s': %s: %s%s\n", rank, ns, step,
            strerror(errno), errno == EPERM ? " (needs root)" : "");
    return 1;
}

/* The first address of an up, non-loopback interface (IPv4 before IPv6 global) in network namespace ns, and a free
 * TCP port on it when *port is 0; looked up by a child process that enters the namespace. Returns 0, or 1 after
 * printing an error. */
static int netns_addr_port(const char *ns, char *addr, size_t addrlen, int *port)
{
    int p[2];
    if (pipe(p) != 0) {
        fprintf(stderr, NAME ": pipe: %s\n", strerror(errno));
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, NAME ": fork: %s\n", strerror(errno));
        close(p[0]);
        close(p[1]);
        return 1;
    }
    if (pid == 0) {
        close(p[0]);
        int fd = open_netns(ns);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
            fprintf(stderr, NAME ": cannot enter network namespace '%s': %s%s\n", ns, strerror(errno),
                    errno == EPERM ? " (needs root)" : "");
            _exit(1);
        }
        struct ifaddrs *ifa = NULL;
        if (getifaddrs(&ifa) != 0) {
            fprintf(stderr, NAME ": getifaddrs in network namespace '%s': %s\n", ns, strerror(errno));
            _exit(1);
        }
        char best[INET6_ADDRSTRLEN] = "";
        for (int fam = 0; fam < 2 && !best[0]; fam++) {
            for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
                if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
                if (fam == 0 && i->ifa_addr->sa_family == AF_INET) {
                    inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, best, sizeof best);
                    break;
                }
                if (fam == 1 && i->ifa_addr->sa_family == AF_INET6) {
                    const struct in6_addr *a = &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
                    if (IN6_IS_ADDR_LINKLOCAL(a)) continue; /* would need a scope id */
                    inet_ntop(AF_INET6, a, best, sizeof best);
                    break;
                }
            }
        }
        freeifaddrs(ifa);
        if (!best[0]) {
            fprintf(stderr, NAME ": network namespace '%s' has no address on an interface that is up (besides "
                    "loopback): give it one, or pass --addr\n", ns);
            _exit(1);
        }
        int port_found = *port;
        if (port_found == 0 && (port_found = zl_free_port(best, NAME)) < 0) _exit(1);
        dprintf(p[1], "%s %d\n", best, port_found);
        _exit(0);
    }
    close(p[1]);
    char buf[INET6_ADDRSTRLEN + 16] = "";
    size_t got = 0;
    for (;;) {
        ssize_t r = read(p[0], buf + got, sizeof buf - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(p[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    char a[INET6_ADDRSTRLEN];
    int pt;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || sscanf(buf, "%45s %d", a, &pt) != 2) return 1;
    snprintf(addr, addrlen, "%s", a);
    *port = pt;
    return 0;
}

/* Appends s to out in single quotes for a POSIX shell ('\'' for a quote). Returns 0, or -1 when out is full. */
static int shell_quote(char *out, size_t len, size_t *used, const char *s)
{
    size_t n = *used;
    if (n + 2 >= len) return -1;
    out[n++] = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            if (n + 5 >= len) return -1;
            memcpy(out + n, "'\\''", 4);
            n += 4;
        } else {
            if (n + 2 >= len) return -1;
            out[n++] = *p;
        }
    }
    out[n++] = '\'';
    out[n++] = ' ';
    out[n] = '\0';
    *used = n;
    return 0;
}

/*
 * Starts rank `rank` on remote host dest through the remote-shell command (ssh): the rank's environment (what
 * zl_launch set, plus every ZCCL_* and NCCL_* variable of this process, as mpirun -x would pass them) goes on ssh's
 * standard input as NAME=VALUE lines ended by an empty line, read by a small sh script on the remote side, so the
 * job secret never appears on a command line (ps, /proc/PID/cmdline on either machine). The script then changes
 * to this directory when the remote host has it and executes the program; the rank's stdin is empty. Does not
 * return on success.
 */
static int exec_remote(int rank, const char *dest, char **agent, char **argv)
{
    static const char *const job_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                           "MASTER_PORT"};
    static char env[60000]; /* below a pipe's capacity: written whole before ssh starts */
    size_t n = 0;
    int overflow = 0;
    for (size_t k = 0; k < sizeof job_vars / sizeof job_vars[0]; k++) {
        const char *v = getenv(job_vars[k]);
        int w = snprintf(env + n, sizeof env - n, "%s=%s\n", job_vars[k], v ? v : "");
        if (w < 0 || (size_t)w >= sizeof env - n) overflow = 1;
        else n += (size_t)w;
    }
    extern char **environ;
    for (char **e = environ; *e && !overflow; e++) {
        if (strncmp(*e, "ZCCL_", 5) && strncmp(*e, "NCCL_", 5)) continue;
        if (strchr(*e, '\n')) {
            fprintf(stderr, NAME ": rank %d: cannot pass %.*s to host '%s': its value has a newline\n", rank,
                    (int)strcspn(*e, "="), *e, dest);
            return 1;
        }
        int w = snprintf(env + n, sizeof env - n, "%s\n", *e);
        if (w < 0 || (size_t)w >= sizeof env - n) overflow = 1;
        else n += (size_t)w;
    }
    if (overflow || n + 1 >= sizeof env) {
        fprintf(stderr, NAME ": rank %d: the ZCCL_*/NCCL_* environment is too large to pass to host '%s'\n", rank,
                dest);
        return 1;
    }
    env[n++] = '\n';
    int p[2];
    if (pipe(p) != 0) {
        fprintf(stderr, NAME ": rank %d: pipe: %s\n", rank, strerror(errno));
        return 1;
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(p[1], env + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, NAME ": rank %d: write to pipe: %s\n", rank, strerror(errno));
            return 1;
        }
        off += (size_t)w;
    }
    close(p[1]);
    if (dup2(p[0], 0) < 0) {
        fprintf(stderr, NAME ": rank %d: dup2: %s\n", rank, strerror(errno));
        return 1;
    }
    if (p[0] != 0) close(p[0]);

    /* The remote command line: sh -c SCRIPT zcclrun CWD PROGRAM ARGS..., every word quoted for the remote shell. */
    static char cmd[65536];
    size_t used = 0;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
    int bad_len = shell_quote(cmd, sizeof cmd, &used, "sh") || shell_quote(cmd, sizeof cmd, &used, "-c") ||
                  shell_quote(cmd, sizeof cmd, &used,
                              "while IFS= read -r zccl_kv && [ -n \"$zccl_kv\" ]; do export \"$zccl_kv\"; done; "
                              "unset zccl_kv; cd \"$1\" 2>/dev/null; shift; exec \"$@\" </dev/null") ||
                  shell_quote(cmd, sizeof cmd, &used, NAME) || shell_quote(cmd, sizeof cmd, &used, cwd);
    for (char **a = argv; *a && !bad_len; a++) bad_len = shell_quote(cmd, sizeof cmd, &used, *a);
    if (bad_len) {
        fprintf(stderr, NAME ": rank %d: the command line for host '%s' is too long\n", rank, dest);
        return 1;
    }
    int nagent = 0;
    while (agent[nagent]) nagent++;
    char **av = calloc((size_t)nagent + 3, sizeof *av);
    if (!av) return 1;
    for (int k = 0; k < nagent; k++) av[k] = agent[k];
    av[nagent] = (char *)dest;
    av[nagent + 1] = cmd;
    execvp(av[0], av);
    int e = errno;
    fprintf(stderr, NAME ": rank %d: cannot execute the remote shell %s: %s\n", rank, av[0], strerror(e));
    return e == ENOENT ? 127 : 126;
}

static int exec_rank(int rank, void *arg)
{
    struct job *job = arg;
    char **argv = job->argv;
    const struct host *h = job->hosts ? &job->hosts->hosts[job->hosts->host_of[rank]] : NULL;
    /* Binding is the remote host's affair: zcclrun binds only the ranks it starts on this machine. */
    const int bound = job->bind && !(h && h->ssh) && rank_bound(job->bind, rank);
    if (setenv("ZCCL_LOCAL_BIND", bound ? bind_words[job->bind->kind] : "none", 1) != 0) {
        fprintf(stderr, NAME ": rank %d: setenv: %s\n", rank, strerror(errno));
        return 1;
    }
    /* Hosts that share this machine's cores (netns, localhost): tell the library how many ranks compete for them,
     * so that its choices for ranks with cores of their own or not (ZCCL_SPIN_US=-1, ...) count them all (unless
     * set). Only where another host runs here too: one host's ranks are what the library counts anyway. */
    if (shares_machine(job->hosts, rank)) {
        char mr[16];
        snprintf(mr, sizeof mr, "%d", job->hosts->cpu_size);
        if (setenv("ZCCL_MACHINE_RANKS", mr, 0) != 0) {
            fprintf(stderr, NAME ": rank %d: setenv: %s\n", rank, strerror(errno));
            return 1;
        }
    }
    if (h && h->ssh) return exec_remote(rank, h->ssh, job->ssh, argv);
    if (h && h->ns && enter_host(h->ns, rank) != 0) return 1;
    if (bound && bind_self(job->bind, rank) != 0) return 1;
    execvp(argv[0], argv);
    int e = errno;
    fprintf(stderr, NAME ": cannot execute %s: %s\n", argv[0], strerror(e));
    return e == ENOENT ? 127 : 126;
}

/* zcclrun's INFO lines follow the ranks' log level (ZCCL_DEBUG, else NCCL_DEBUG, as the library reads them). */
static int info_enabled(void)
{
    const char *v = getenv("ZCCL_DEBUG");
    if (!v) v = getenv("NCCL_DEBUG");
    return v && (!strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"));
}

/* Without --bind, says per host whether its ranks were bound (they fit its cores) or not. */
static void bind_default_info(const struct bind_plan *p, const struct hostplan *hp)
{
    for (int k = 0; k < (hp ? hp->nhosts : 1); k++) {
        int r = 0;
        while (hp && r < p->nranks && hp->host_of[r] != k) r++;
        if (r == p->nranks) continue; /* a host of the hostfile that got no rank */
        const struct host *h = hp ? &hp->hosts[k] : NULL;
        char where[96];
        snprintf(where, sizeof where, "%s%s", !h ? "this host" : h->ns ? "host netns:" : h->ssh ? "host ssh:" : "host ",
                 !h ? "" : h->ns ? h->ns : h->ssh ? h->ssh : "localhost");
        const int n = hp ? hp->local_size[r] : p->nranks;
        /* With a --hostfile, the hosts on this machine share its cores: say how many ranks they hold together. */
        char shared[96] = "";
        if (shares_machine(hp, r))
            snprintf(shared, sizeof shared, " (%d on this machine, whose hosts share its cores)", p->cpu_size);
        if (h && h->ssh)
            fprintf(stderr, NAME ": INFO: %d rank%s on %s: binding is that host's affair\n", n, n == 1 ? "" : "s",
                    where);
        else if (rank_bound(p, r))
            fprintf(stderr, NAME ": INFO: %d rank%s on %s%s, %d core%s: %s rank i bound to core i (the default "
                    "where the ranks fit the cores; --bind none turns it off)\n", n, n == 1 ? "" : "s", where,
                    shared, p->nobjs, p->nobjs == 1 ? "" : "s", shared[0] ? "this machine's" : "local");
        else if (shared[0])
            fprintf(stderr, NAME ": INFO: %d rank%s on %s; %d ranks on this machine, whose hosts share its cores, but "
                    "%d core%s: the ranks are not bound (--bind core binds them anyway, this machine's rank i to core "
                    "i mod %d)\n", n, n == 1 ? "" : "s", where, p->cpu_size, p->nobjs, p->nobjs == 1 ? "" : "s",
                    p->nobjs);
        else
            fprintf(stderr, NAME ": INFO: %d ranks on %s but %d core%s: the ranks are not bound (--bind core binds "
                    "them anyway, i mod %d)\n", n, where, p->nobjs, p->nobjs == 1 ? "" : "s", p->nobjs);
    }
}

int main(int argc, char **argv)
{
    struct zl_opts o = {.nranks = 1, .name = NAME};
    enum bind_kind bind = BIND_CORE; /* without --bind: where a host's ranks fit its cores (bind_given 0) */
    int bind_given = 0;
    const char *hostfile = NULL;
    const char *ssh_cmd = "ssh -x -o BatchMode=yes"; /* --ssh: the remote shell for ssh hosts */
    int nranks_given = 0;
    int report_bindings = 0;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == '\0') break; /* the program */
        if (!strcmp(a, "--")) { i++; break; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--version")) { printf("zcclrun (zccl) %s\n", ZCCL_VERSION_STRING); return 0; }
        if (!strcmp(a, "--tag-output")) { o.tag_output = 1; continue; }
        if (!strcmp(a, "--report-bindings")) { report_bindings = 1; continue; }
        if (!strcmp(a, "--oversubscribe")) continue; /* mpirun's: more ranks than cores is always allowed here */
        if (!strcmp(a, "-x")) { /* mpirun's -x VAR[=VALUE]: the ranks get VAR (they inherit this environment) */
            if (i + 1 >= argc) return bad("option '-x' needs VAR or VAR=VALUE%s%s", "", "");
            const char *x = argv[++i], *xeq = strchr(x, '=');
            const size_t nl = xeq ? (size_t)(xeq - x) : strlen(x);
            if (nl == 0 || nl >= 256 || strspn(x, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") != nl ||
                (x[0] >= '0' && x[0] <= '9'))
                return bad("-x: '%s' is not VAR or VAR=VALUE with VAR a variable name%s", x, "");
            if (xeq) {
                char name[256];
                memcpy(name, x, nl);
                name[nl] = '\0';
                if (setenv(name, xeq + 1, 1) != 0) return bad("-x: cannot set '%s'%s", x, "");
            }
            continue;
        }

        /* options with a value: "-n N", "-nN", "--np=N", "--port=P", ... */
        const char *val = NULL, *opt = a;
        char optbuf[32];
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq) {
            snprintf(optbuf, sizeof optbuf, "%.*s", (int)(eq - a), a);
            opt = optbuf;
            val = eq + 1;
        }
        enum { O_N, O_PORT, O_ADDR, O_TIMEOUT, O_BIND, O_HOSTFILE, O_SSH, O_BAD } which = O_BAD;
        if (!strcmp(opt, "-n") || !strcmp(opt, "-np") || !strcmp(opt, "--np") || !strcmp(opt, "--nproc") ||
            !strcmp(opt, "--nproc-per-node") || !strcmp(opt, "--nproc_per_node"))
            which = O_N;
        else if (!strcmp(opt, "--port") || !strcmp(opt, "--master-port") || !strcmp(opt, "--master_port"))
            which = O_PORT;
        else if (!strcmp(opt, "--addr") || !strcmp(opt, "--master-addr") || !strcmp(opt, "--master_addr"))
            which = O_ADDR;
        else if (!strcmp(opt, "--timeout"))
            which = O_TIMEOUT;
        else if (!strcmp(opt, "--bind") || !strcmp(opt, "--bind-to"))
            which = O_BIND;
        else if (!strcmp(opt, "--hostfile") || !strcmp(opt, "--machinefile"))
            which = O_HOSTFILE;
        else if (!strcmp(opt, "--ssh"))
            which = O_SSH;
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
            if (zl_parse_long(val, 10, LONG_MIN, LONG_MAX, &v) != 0)
                return bad("%s: '%s' is not a number", opt, val);
            if (v < 1 || v > ZL_MAX_RANKS) {
                char lim[16];
                snprintf(lim, sizeof lim, "%d", ZL_MAX_RANKS);
                return bad("number of ranks must be between 1 and %s (got %s)", lim, val);
            }
            o.nranks = (int)v;
            nranks_given = 1;
            break;
        case O_HOSTFILE:
            if (!*val) return bad("%s: empty file name%s", opt, "");
            hostfile = val;
            break;
        case O_SSH:
            if (!val[strspn(val, " \t")]) return bad("--ssh: empty command%s%s", "", "");
            ssh_cmd = val;
            break;
        case O_PORT:
            if (zl_parse_long(val, 10, 1, 65535, &v) != 0)
                return bad("--port: '%s' is not a port number (1-65535)%s", val, "");
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
        case O_BIND: {
            int k = 0;
            while (k < 4 && strcmp(val, bind_words[k]) != 0) k++;
            if (k == 4) return bad("%s: '%s' is not one of core, numa, package, none", opt, val);
            bind = (enum bind_kind)k;
            bind_given = 1;
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

    struct hostplan hp = {0};
    char master_addr[256];
    if (hostfile) {
        if ((rc = hostfile_read(hostfile, &hp)) != 0 ||
            (rc = hostplan_assign(&hp, nranks_given ? &o.nranks : (o.nranks = 0, &o.nranks), hostfile)) != 0) {
            hostplan_free(&hp);
            return rc;
        }
        o.local_rank = hp.local_rank;
        o.local_size = hp.local_size;
        /* Rank 0 runs the bootstrap root: by default it listens on the first host's own address. */
        const char *ns0 = hp.hosts[0].ns, *ssh0 = hp.hosts[0].ssh;
        if (ssh0) {
            /* A remote first host: its name is the address (as the other hosts resolve it), and the port one that
             * cannot be checked from here: random in 20000..32767 (below Linux's default ephemeral range, where no
             * connect() takes it) unless --port says. */
            if (!o.addr) {
                const char *at = strchr(ssh0, '@');
                snprintf(master_addr, sizeof master_addr, "%s", at ? at + 1 : ssh0);
                o.addr = master_addr;
            }
            if (o.port == 0) {
                unsigned r = 0;
                if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (unsigned)getpid() * 2654435761u;
                o.port = 20000 + (int)(r % 12768u);
            }
        } else if (!o.addr && ns0) {
            if (netns_addr_port(ns0, master_addr, sizeof master_addr, &o.port) != 0) {
                hostplan_free(&hp);
                return 1;
            }
            o.addr = master_addr;
        } else if (o.port == 0 && ns0) {
            /* --addr given: it must be reachable from every host; a free port is still looked up in host 0. */
            char scratch[INET6_ADDRSTRLEN];
            if (netns_addr_port(ns0, scratch, sizeof scratch, &o.port) != 0) {
                hostplan_free(&hp);
                return 1;
            }
        }
    }
    struct bind_plan plan;
    /* --ssh's command as argv: split at blanks (no quoting; a wrapper script takes anything more elaborate) */
    char *ssh_copy = strdup(ssh_cmd), *ssh_argv[32];
    int nssh = 0;
    for (char *save = NULL, *t = ssh_copy ? strtok_r(ssh_copy, " \t", &save) : NULL; t && nssh < 31;
         t = strtok_r(NULL, " \t", &save))
        ssh_argv[nssh++] = t;
    ssh_argv[nssh] = NULL;
    struct job job = {.argv = prog_argv, .bind = NULL, .hosts = hostfile ? &hp : NULL, .ssh = ssh_argv};
    int use_hwloc = bind != BIND_NONE || report_bindings;
    if (use_hwloc) {
        if (bind_prepare(&plan, bind, !bind_given, o.nranks, hostfile ? hp.cpu_rank : NULL, hp.cpu_size) != 0) {
            bind_free(&plan);
            if (bind_given || report_bindings) {
                hostplan_free(&hp);
                free(ssh_copy);
                return 1;
            }
            fprintf(stderr, NAME ": the ranks run unbound (--bind none does not read the topology)\n");
            use_hwloc = 0;
        } else {
            if (bind != BIND_NONE) job.bind = &plan;
            if (!bind_given && info_enabled()) bind_default_info(&plan, job.hosts);
            if (report_bindings) bind_report(&plan, o.nranks);
        }
    }
    rc = zl_launch(&o, exec_rank, &job);
    if (use_hwloc) bind_free(&plan);
    hostplan_free(&hp);
    free(ssh_copy);
    return rc;
}

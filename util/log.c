/*
 * log.c — leveled, per-subsystem logging on stderr: "host:pid:tid [rank] zccl LEVEL file:line message".
 * ZCCL_DEBUG=WARN|INFO|TRACE sets the level (default: WARN is printed only for errors the library reports;
 * ZCCL_DEBUG unset prints nothing but still keeps last-error messages). ZCCL_DEBUG_SUBSYS filters subsystems.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "core.h"

int zccl__log_level = -1; /* -1: not yet read from the environment */
static unsigned log_subsys = ZCCL_LOG_ALL;
static int log_rank = -1;
static char log_host[64];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

const zccl_log_subsys_t zccl__log_subsys[ZCCL_LOG_NSUBSYS] = {
    {"INIT", ZCCL_LOG_INIT}, {"BOOT", ZCCL_LOG_BOOT}, {"SHM", ZCCL_LOG_SHM},   {"TCP", ZCCL_LOG_TCP},
    {"COLL", ZCCL_LOG_COLL}, {"ENV", ZCCL_LOG_ENV},   {"TOPO", ZCCL_LOG_TOPO}, {"TUNE", ZCCL_LOG_TUNE},
    {"IB", ZCCL_LOG_IB},     {"ALL", ZCCL_LOG_ALL}};

int zccl__log_level_of(const char *v) {
    if (!strcasecmp(v, "WARN")) return ZCCL_LOG_WARN;
    if (!strcasecmp(v, "INFO")) return ZCCL_LOG_INFO;
    if (!strcasecmp(v, "TRACE")) return ZCCL_LOG_TRACE;
    if (!*v || !strcasecmp(v, "NONE") || !strcasecmp(v, "VERSION")) return ZCCL_LOG_NONE;
    return -1;
}

static void log_init_once(void) {
    const char *v = zccl__cfg_str(ZCCL_CFG_DEBUG);
    int level = zccl__log_level_of(v);
    if (level < 0) {
        fprintf(stderr, "zccl: %s=%s is not one of NONE, WARN, INFO, TRACE; using NONE\n",
                zccl__cfg_source(ZCCL_CFG_DEBUG), v);
        level = ZCCL_LOG_NONE;
    }
    const char *s = zccl__cfg_str(ZCCL_CFG_DEBUG_SUBSYS);
    if (*s) {
        /* NCCL_DEBUG_SUBSYS may name NCCL's own subsystems (NET, GRAPH, ALLOC, ...): those are skipped quietly. */
        const char *src = zccl__cfg_source(ZCCL_CFG_DEBUG_SUBSYS);
        const bool from_nccl = src && strcmp(src, "ZCCL_DEBUG_SUBSYS") != 0;
        const zccl_log_subsys_t *names = zccl__log_subsys;
        int exclude = (*s == '^');
        unsigned mask = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", s + exclude);
        int known = 0;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            size_t i = 0;
            while (i < ZCCL_LOG_NSUBSYS && strcasecmp(tok, names[i].name)) i++;
            if (i < ZCCL_LOG_NSUBSYS) {
                mask |= names[i].bit;
                known++;
            } else if (!from_nccl) {
                fprintf(stderr, "zccl: ZCCL_DEBUG_SUBSYS=%s: '%s' is not a subsystem (INIT, BOOT, SHM, TCP, COLL, "
                                "ENV, TOPO, TUNE, IB, ALL); ignored\n", s, tok);
            }
        }
        /* nothing recognised: keep every subsystem rather than silence the log the user asked for */
        if (known) log_subsys = exclude ? (ZCCL_LOG_ALL & ~mask) : mask;
    }
    gethostname(log_host, sizeof log_host - 1);
    char *dot = strchr(log_host, '.');
    if (dot) *dot = 0;
    __atomic_store_n(&zccl__log_level, level, __ATOMIC_RELEASE);
}

void zccl__log_init(void) { pthread_once(&log_once, log_init_once); }

void zccl__log_set_rank(int rank) { __atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED); }

/* The communicator name (zccl_config_t.comm_name) of the operation this thread runs, shown as "[name] ". */
static _Thread_local const char *log_tag;
const char *zccl__log_set_tag(const char *tag) {
    const char *old = log_tag;
    log_tag = tag && *tag ? tag : NULL;
    return old;
}

void zccl__log(zccl_log_level_t level, unsigned subsys, const char *file, int line, const char *fmt, ...) {
    zccl__log_init();
    if ((int)level > zccl__log_level || !(subsys & log_subsys)) return;
    static const char *names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    /* One fprintf per line so lines from threads of one process do not interleave. */
    if (level == ZCCL_LOG_WARN || level == ZCCL_LOG_TRACE)
        fprintf(stderr, "%s:%d:%ld [%d] zccl %s %s:%d %s%s%s%s\n", log_host, (int)getpid(), (long)syscall(SYS_gettid),
                __atomic_load_n(&log_rank, __ATOMIC_RELAXED), names[level], base, line, log_tag ? "[" : "",
                log_tag ? log_tag : "", log_tag ? "] " : "", msg);
    else
        fprintf(stderr, "%s:%d:%ld [%d] zccl %s %s%s%s%s\n", log_host, (int)getpid(), (long)syscall(SYS_gettid),
                __atomic_load_n(&log_rank, __ATOMIC_RELAXED), names[level], log_tag ? "[" : "", log_tag ? log_tag : "",
                log_tag ? "] " : "", msg);
}

/* True when every CPU of `set` is a hardware thread of one core: the kernel's list of the first CPU's SMT siblings
 * (sysfs topology/thread_siblings_list, "0,56" or "0-1") covers the set. A rank bound to a core of a hyperthreaded
 * host has a two-CPU mask, and that is still one core per rank. */
static bool one_core_mask(const cpu_set_t *set) {
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, set)) first = c;
    if (first < 0) return false;
    char path[96], list[256];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", first);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    const bool got = fgets(list, sizeof list, f) != NULL;
    fclose(f);
    if (!got) return false;
    cpu_set_t sib;
    CPU_ZERO(&sib);
    for (char *p = list; *p && *p != '\n';) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return false;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p) return false;
        }
        for (long c = a; c <= b && c < CPU_SETSIZE; c++) CPU_SET((int)c, &sib);
        p = *end == ',' ? end + 1 : end;
    }
    cpu_set_t both;
    CPU_AND(&both, set, &sib);
    return CPU_EQUAL(&both, set);
}

int zccl__cpus_for_ranks(int local) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int n = CPU_COUNT(&set);
    /* A mask of one core's hardware threads that is not the whole machine: the launcher bound this rank. */
    const int online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const bool bound = n == 1 || (n < online && one_core_mask(&set));
    /* One core per rank, but never more cores than the machine has (ranks forced onto shared cores, or
     * ZCCL_MACHINE_RANKS counting other hosts' ranks on this machine). */
    return bound && local > 1 ? (online > 0 && local > online ? online : local) : n;
}

uint64_t zccl__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *zccl__calloc(size_t n, size_t size) { return calloc(n, size); }

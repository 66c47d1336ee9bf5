/*
 * zccl-bench — bandwidth benchmark for zccl collectives with nccl-tests' options and output layout.
 *
 *   zccl-bench OP [-b MIN] [-e MAX] [-f FACTOR | -i INCR] [-n ITERS] [-w WARMUP] [-c CHECK] [-d TYPE] [-o REDOP]
 *              [-r ROOT] [-z 0|1] [-y 0|1] [-a 0..3] [-m AGG] [-J FILE] [-np N] [--algo NAME|all]
 *   OP: allreduce, reduce_scatter, allgather, broadcast, reduce, sendrecv, alltoall, gather, scatter (nccl-tests
 *       names such as all_reduce_perf work)
 *
 * Runs as one rank of a job started by zcclrun/torchrun/mpirun (zccl_comm_init_env), as a single rank when no
 * launcher variables are set, or starts N local ranks itself with -np N (launch.c). Only rank 0 prints.
 *
 * Per size and placement (out-of-place, then in-place): one untimed run, a barrier, ITERS timed runs back to back
 * (CLOCK_MONOTONIC; the time per iteration is combined over ranks as -a says, max by default), then -c checked
 * runs on freshly generated data (bench_data.c), not timed. See docs/tools.md.
 *
 * --algo NAME forces one algorithm of the tuner's registry for the whole run (zccl_comm_set_algo with
 * "OP:NAME"); --algo all runs the sizes once per algorithm that can run OP and ends with a table of every
 * algorithm's out-of-place time per size, the fastest one, and the tuner's own choice (docs/tuning.md).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* signalfd, pipe2, getrandom, prctl */
#endif
#include "bench_data.h"
#include "zccl_version.h"
#include "bytes.h"
#include "launch.h"
#include "zccl.h"
#include "zccl_hier.h"

#include <errno.h>
#include <sched.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NAME "zccl-bench"

/* ------------------------------------------------------------------------------------------------------------ */
/* Tables                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */

enum coll { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE, C_SENDRECV, C_ALLTOALL, C_GATHER,
            C_SCATTER, C_NCOLL };

static const struct {
    const char *name;
    const char *alias[4];
    int has_op;   /* takes a reduction operation */
    int has_root; /* takes a root */
} colls[C_NCOLL] = {
    [C_ALLREDUCE] = {"allreduce", {"all_reduce", "all_reduce_perf", "allreduce_perf", NULL}, 1, 0},
    [C_REDUCE_SCATTER] = {"reduce_scatter", {"reducescatter", "reduce_scatter_perf", "reducescatter_perf", NULL}, 1, 0},
    [C_ALLGATHER] = {"allgather", {"all_gather", "all_gather_perf", "allgather_perf", NULL}, 0, 0},
    [C_BROADCAST] = {"broadcast", {"bcast", "broadcast_perf", NULL, NULL}, 0, 1},
    [C_REDUCE] = {"reduce", {"reduce_perf", NULL, NULL, NULL}, 1, 1},
    [C_SENDRECV] = {"sendrecv", {"sendrecv_perf", "send_recv", NULL, NULL}, 0, 0},
    [C_ALLTOALL] = {"alltoall", {"alltoall_perf", "all_to_all", "all_to_all_perf", NULL}, 0, 0},
    [C_GATHER] = {"gather", {"gather_perf", NULL, NULL, NULL}, 0, 1},
    [C_SCATTER] = {"scatter", {"scatter_perf", NULL, NULL, NULL}, 0, 1},
};

/* nccl-tests' type names first (they are what is printed), then accepted aliases. */
static const struct {
    const char *name;
    zccl_datatype_t dt;
} types[] = {
    {"int8", ZCCL_INT8},       {"uint8", ZCCL_UINT8},     {"int32", ZCCL_INT32},   {"uint32", ZCCL_UINT32},
    {"int64", ZCCL_INT64},     {"uint64", ZCCL_UINT64},   {"half", ZCCL_FLOAT16},  {"float", ZCCL_FLOAT32},
    {"double", ZCCL_FLOAT64},  {"bfloat16", ZCCL_BFLOAT16},
};
#define NTYPES ((int)(sizeof types / sizeof types[0]))
static const struct {
    const char *alias;
    int index;
} type_aliases[] = {
    {"char", 0}, {"int", 2}, {"float16", 6}, {"fp16", 6}, {"f16", 6}, {"float32", 7}, {"fp32", 7}, {"f32", 7},
    {"float64", 8}, {"fp64", 8}, {"f64", 8}, {"bf16", 9},
};

static const char *const opnames[] = {"sum", "prod", "max", "min", "avg"};
#define NOPS 5

/* ------------------------------------------------------------------------------------------------------------ */
/* Options                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

struct cfg {
    int coll;
    size_t minbytes, maxbytes, stepbytes, stepfactor;
    int iters, warmup, agg, check;
    int type;      /* index into types, -1: all */
    int op;        /* zccl_redop_t, -1: all */
    int root;      /* -1: all roots (broadcast, reduce) */
    int blocking;  /* -z */
    int stream_null; /* -y */
    int average;   /* -a: 0 rank 0, 1 avg, 2 min, 3 max */
    int cputime;   /* -C */
    int registered; /* -R: buffers from zccl_mem_alloc, registered with the communicator */
    int device;    /* -D: send and receive buffers in CUDA device memory (zccl_mem_alloc_cuda) */
    int bind;      /* --bind: -np ranks bound to one CPU each (-1 auto: when they fit the CPUs; 0 no; 1 yes) */
    int buf_offset, rbuf_offset; /* --buf-offset S[,R]: bytes past page alignment of the host send and receive
                                  * buffers */
    const char *json;
    int np;        /* -np N: start N local ranks; 0: run as one rank */
    const char *algo; /* --algo: NULL = the tuner's choice, "all", or one algorithm name */
    int wire;      /* --wire: a zccl_wire_t; ZCCL_WIRE_FULL (0) = the ordinary collectives */
    int hier;      /* --wire hier:FMT: the hierarchical calls (zccl_*_hier) instead of the flat zccl_*_wire */
};

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: " NAME " OP [options]\n"
        "Bandwidth benchmark for zccl collectives; options and output as nccl-tests (all_reduce_perf, ...).\n"
        "\n"
        "OP: allreduce | reduce_scatter | allgather | broadcast | reduce | sendrecv | alltoall | gather | scatter\n"
        "    (sendrecv: rank r sends to r+1 and receives from r-1, modulo the ranks; out of place only)\n"
        "\n"
        "Options (sizes take K, M, G, T suffixes, powers of 1024: 8, 1K, 1.5M, 128MiB):\n"
        "  -b, --minbytes SIZE      smallest size (default 32M)\n"
        "  -e, --maxbytes SIZE      largest size (default 32M)\n"
        "  -f, --stepfactor F       multiply the size by F at each step (integer F >= 2)\n"
        "      --env                print every ZCCL_* setting with its value in force, check them (invalid values and\n"
        "                           unknown ZCCL_* names on stderr; exit status 2 if any value is invalid), then exit\n"
        "  -i, --stepbytes SIZE     else add SIZE at each step (default 1M)\n"
        "  -n, --iters N            timed iterations per size (default 20)\n"
        "  -w, --warmup_iters N     warm-up iterations (default 5)\n"
        "  -m, --agg_iters N        operations per timed iteration (default 1)\n"
        "  -c, --check N            check results N times per size, 0 = no check (default 1)\n"
        "  -d, --datatype TYPE      int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, or all\n"
        "                           (also float16 float32 float64 bf16; default float)\n"
        "  -o, --op OP              sum prod max min avg, or all (default sum)\n"
        "  -r, --root R             root of broadcast/reduce/gather/scatter, -1 = every rank in turn (default 0)\n"
        "  -z, --blocking 0|1       1: blocking calls and a barrier after each operation (default 0)\n"
        "  -y, --stream_null 0|1    1: blocking calls instead of a zccl stream (default 0)\n"
        "  -a, --average 0..3       time reported: 0 rank 0's, 1 average, 2 min, 3 max over ranks (default 3)\n"
        "  -C, --report_cputime 0|1 report the time to issue the operations instead of completing them\n"
        "  -J, --json FILE          also write the results as JSON to FILE (rank 0)\n"
        "  -D, --device-buffers 0|1 1: send and receive buffers in CUDA device memory (zccl_mem_alloc_cuda), filled and\n"
        "                           checked through host copies (zccl_mem_copy); calls on a zccl stream bound to the\n"
        "                           default CUDA stream (zccl_stream_create_cuda) unless -z 1 / -y 1 (default 0)\n"
        "  -R, --registered 0|1     1: send and receive buffers from zccl_mem_alloc, registered with zccl_comm_register\n"
        "                           (one-pass collectives straight out of the peers' buffers on one host; default 0)\n"
        "  -np, --np N              start N local ranks (fork) instead of running as one rank (not under a launcher)\n"
        "      --bind core|none     with -np: bind rank i to the i-th CPU this process may run on (default: core when\n"
        "                           the ranks fit those CPUs, as mpirun's default --bind-to core; else none)\n"
        "      --buf-offset S[,R]   host send buffers start S bytes (0..4095) past a page boundary, receive buffers R\n"
        "                           (default S), as malloc'd or sliced buffers do (default 0: page-aligned; not\n"
        "                           with -R or -D)\n"
        "      --wire FMT           quantized collectives (zccl_*_wire; allreduce, reduce_scatter, allgather; float,\n"
        "                           half, bfloat16; sum, avg): full, int8, int4, fp8e4m3 or fp8e5m2. Sizes and busbw\n"
        "                           stay full-precision bytes (the effective bandwidth); results are approximate, so\n"
        "                           -c is off and #wrong is N/A (tests/test_quant_coll.cpp checks the error bounds)\n"
        "      --wire hier:FMT      the hierarchical calls (zccl_*_hier: full precision inside a host, FMT between\n"
        "                           hosts; hosts as ZCCL_HOST_ID says, else the real ones; flat when one host)\n"
        "      --algo NAME|all      force one algorithm (ring, direct, ...; see docs/tuning.md), or run every\n"
        "                           algorithm that can run OP and print a per-algorithm table with the tuner's choice\n"
        "  -h, --help               show this help\n"
        "      --version            print the version and exit\n"
        "  (-t/--nthreads and -g/--ngpus accept 1 only; -p, -T, -G 0 are accepted for compatibility)\n"
        "\n"
        "Without -np, " NAME " is one rank of a job: run it under zcclrun, torchrun or mpirun (RANK/WORLD_SIZE,\n"
        "OMPI_COMM_WORLD_*, PMI_* with MASTER_ADDR/MASTER_PORT); with no such variables it runs as a single rank.\n"
        "Exit status: 0; 1 if a result was wrong or a zccl call failed; 2 for bad options.\n");
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, NAME ": ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry '" NAME " --help' for more information.\n");
    return 2;
}

/* "8", "1K", "128M", "1.5G", "64KB", "4KiB". Returns 0 or -1. */
/* A byte size in util/bytes.c's grammar (4M, 4MiB, 1.5G): the same as zccl-zero-plan and the ZCCL_* settings. */
static int parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (zccl__parse_bytes(s, &v) != 0 || v > SIZE_MAX) return -1;
    *out = (size_t)v;
    return 0;
}

static int find_type(const char *s)
{
    for (int i = 0; i < NTYPES; i++)
        if (!strcmp(s, types[i].name)) return i;
    for (size_t i = 0; i < sizeof type_aliases / sizeof type_aliases[0]; i++)
        if (!strcmp(s, type_aliases[i].alias)) return type_aliases[i].index;
    return -2;
}

static int find_coll(const char *s)
{
    for (int c = 0; c < C_NCOLL; c++) {
        if (!strcmp(s, colls[c].name)) return c;
        for (int k = 0; k < 4 && colls[c].alias[k]; k++)
            if (!strcmp(s, colls[c].alias[k])) return c;
    }
    return -1;
}

/* Returns 0, or the exit status for a parse error / --help (-1 for help). */
/* --env: every ZCCL_* setting with the value in force (the settings table), then checked; exit 2 if invalid. */
static void print_env(void)
{
    size_t need = zccl_config_describe(NULL, 0);
    char *text = malloc(need + 1);
    if (text) { zccl_config_describe(text, need + 1); fputs(text, stdout); free(text); }
    int ninvalid = 0;
    need = zccl_config_check(NULL, 0, &ninvalid);
    text = malloc(need + 1);
    if (text) { zccl_config_check(text, need + 1, NULL); fputs(text, stderr); free(text); }
    if (ninvalid) {
        fprintf(stderr, "zccl-bench: %d invalid setting%s (above)\n", ninvalid, ninvalid == 1 ? "" : "s");
        exit(2);
    }
}

/* One option's value into c: opt is its short letter (nccl-tests' names), optname as the user spelt it. */
static int set_option(struct cfg *c, char opt, const char *val, const char *optname)
{
    long v = 0;
    size_t sz = 0;
#define NUM(min, max, what)                                                                                       \
do {                                                                                                          \
    if (zl_parse_long(val, 0, (min), (max), &v) != 0) return bad("%s: '%s' is not " what, optname, val);            \
} while (0)
    switch (opt) {
    case 'b':
    case 'e':
    case 'i':
        if (parse_size(val, &sz) != 0)
            return bad("%s: invalid size '%s' (a number of bytes below 2^62, optionally with K, M, G or T)",
                       optname, val);
        if (opt == 'b') c->minbytes = sz;
        else if (opt == 'e') c->maxbytes = sz;
        else c->stepbytes = sz;
        break;
    case 'f': NUM(2, 1 << 20, "an integer step factor >= 2 (use -i for additive steps)"); c->stepfactor = (size_t)v; break;
    case 'n': NUM(1, INT_MAX, "an iteration count >= 1"); c->iters = (int)v; break;
    case 'w': NUM(0, INT_MAX, "an iteration count >= 0"); c->warmup = (int)v; break;
    case 'm': NUM(1, 1 << 20, "a count >= 1"); c->agg = (int)v; break;
    case 'c': NUM(0, 1000, "a check count >= 0"); c->check = (int)v; break;
    case 'z': NUM(0, 1, "0 or 1"); c->blocking = (int)v; break;
    case 'y': NUM(0, 1, "0 or 1"); c->stream_null = (int)v; break;
    case 'C': NUM(0, 1, "0 or 1"); c->cputime = (int)v; break;
    case 'R': NUM(0, 1, "0 or 1"); c->registered = (int)v; break;
    case 'D': NUM(0, 1, "0 or 1"); c->device = (int)v; break;
    case 'B':
        if (!strcmp(val, "core")) c->bind = 1;
        else if (!strcmp(val, "none")) c->bind = 0;
        else return bad("--bind %s: expected core or none%s", val, "");
        break;
    case 'a': NUM(0, 3, "0, 1, 2 or 3"); c->average = (int)v; break;
    case 'O': {
        char *end = NULL;
        const long so = strtol(val, &end, 10), ro = *end == ',' ? strtol(end + 1, &end, 10) : so;
        if (end == val || *end || so < 0 || so > 4095 || ro < 0 || ro > 4095)
            return bad("%s %s: expected a byte offset 0..4095, or two (send,receive)", optname, val);
        c->buf_offset = (int)so, c->rbuf_offset = (int)ro;
        break;
    }
    case 'r': NUM(-1, ZL_MAX_RANKS - 1, "a rank (or -1 for all)"); c->root = (int)v; break;
    case 'N': NUM(1, ZL_MAX_RANKS, "a number of ranks (1-65536)"); c->np = (int)v; break;
    case 't':
    case 'g':
        NUM(1, 1, "supported (zccl-bench runs one rank per process: use -np or a launcher)");
        break;
    case 'G': NUM(0, 0, "supported (no CUDA graphs in zccl)"); break;
    case 'p':
    case 'T': NUM(LONG_MIN, LONG_MAX, "a number"); break; /* accepted, no effect */
    case 'd':
        if (!strcmp(val, "all")) c->type = -1;
        else if ((c->type = find_type(val)) < 0)
            return bad("-d: unknown datatype '%s' (int8 uint8 int32 uint32 int64 uint64 half float double "
                       "bfloat16 all)%s", val, "");
        break;
    case 'o':
        if (!strcmp(val, "all")) {
            c->op = -1;
        } else {
            c->op = -2;
            for (int k = 0; k < NOPS; k++)
                if (!strcmp(val, opnames[k])) c->op = k;
            if (c->op == -2) return bad("-o: unknown reduction '%s' (sum prod max min avg all)%s", val, "");
        }
        break;
    case 'A':
        if (!*val || strpbrk(val, ";:,^ "))
            return bad("--algo: '%s' is not one algorithm name or 'all'%s", val, "");
        c->algo = val;
        break;
    case 'W':
        c->wire = -1;
        c->hier = !strncmp(val, "hier:", 5);
        if (c->hier) val += 5;
        for (int k = 0; k < ZCCL_NUM_WIRES; k++)
            if (!strcmp(val, zccl_wire_name((zccl_wire_t)k))) c->wire = k;
        if (c->wire < 0)
            return bad("--wire: '%s' is not full, int8, int4, fp8e4m3 or fp8e5m2%s", val,
                       c->hier ? " (after hier:)" : "");
        break;
    case 'J':
        if (!*val) return bad("-J: empty file name%s%s", "", "");
        c->json = val;
        break;
    default: break;
    }
#undef NUM
    return 0;
}

/* The whole configuration's consistency, once every option is read. */
static int check_cfg(const struct cfg *c)
{
    if (c->coll < 0)
        return bad("no operation given (allreduce, reduce_scatter, allgather, broadcast, reduce, sendrecv, alltoall, "
                   "gather, scatter)%s%s", "", "");
    if (c->minbytes > c->maxbytes) {
        char a[32], b[32];
        snprintf(a, sizeof a, "%zu", c->minbytes);
        snprintf(b, sizeof b, "%zu", c->maxbytes);
        return bad("minimum size (-b %s) is larger than maximum size (-e %s)", a, b);
    }
    if (c->stepfactor <= 1 && c->stepbytes == 0 && c->minbytes < c->maxbytes)
        return bad("-i 0 without -f > 1 never reaches the maximum size%s%s", "", "");
    if (c->stepfactor > 1 && c->minbytes == 0)
        return bad("-b 0 with -f %s never grows; use -b 1 or more%s", "F > 1", "");
    if (c->device && c->registered)
        return bad("-D 1 and -R 1 exclude each other (zccl_mem_alloc buffers are host memory)%s%s", "", "");
    if ((c->wire || c->hier) && c->coll != C_ALLREDUCE && c->coll != C_REDUCE_SCATTER && c->coll != C_ALLGATHER)
        return bad("--wire applies to allreduce, reduce_scatter and allgather only%s%s", "", "");
    if ((c->wire || c->hier) && c->device)
        return bad("--wire takes host buffers only (-D 1 excludes it)%s%s", "", "");
    if ((c->buf_offset || c->rbuf_offset) && (c->registered || c->device))
        return bad("--buf-offset applies to ordinary host buffers, not with %s%s", c->registered ? "-R 1" : "-D 1", "");
    if (c->coll == C_SENDRECV && c->algo)
        return bad("--algo does not apply to sendrecv (point to point: no algorithm to choose)%s%s", "", "");
    return 0;
}

/* Which option argv[*i] is (short, long or -np), and its value (attached or the next argument). */
static int split_option(int argc, char **argv, int *i, char *opt, const char **val, char *optname, size_t len)
{
    static const struct { char s; const char *l; } longs[] = {
        {'t', "nthreads"}, {'g', "ngpus"}, {'b', "minbytes"}, {'e', "maxbytes"}, {'i', "stepbytes"},
        {'f', "stepfactor"}, {'n', "iters"}, {'m', "agg_iters"}, {'w', "warmup_iters"}, {'p', "parallel_init"},
        {'c', "check"}, {'o', "op"}, {'d', "datatype"}, {'r', "root"}, {'z', "blocking"}, {'y', "stream_null"},
        {'T', "timeout"}, {'G', "cudagraph"}, {'C', "report_cputime"}, {'a', "average"}, {'J', "json"},
        {'N', "np"}, {'A', "algo"}, {'W', "wire"}, {'R', "registered"}, {'D', "device-buffers"}, {'B', "bind"},
        {'O', "buf-offset"},
    };
    const char *a = argv[*i];
    *opt = 0;
    *val = NULL;
    if (!strcmp(a, "-np") || !strncmp(a, "-np=", 4) || (!strncmp(a, "-np", 3) && a[3] >= '0' && a[3] <= '9')) {
        *opt = 'N';
        if (a[3]) *val = a + 3 + (a[3] == '=');
        snprintf(optname, len, "-np");
    } else if (a[1] == '-') {
        const char *eq = strchr(a, '=');
        size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        for (size_t k = 0; k < sizeof longs / sizeof longs[0]; k++)
            if (strlen(longs[k].l) == n && !strncmp(a + 2, longs[k].l, n)) *opt = longs[k].s;
        if (!*opt) return bad("unknown option '%s'%s", a, "");
        if (eq) *val = eq + 1;
        snprintf(optname, len, "%.*s", (int)(n + 2), a);
    } else {
        *opt = a[1];
        if (!strchr("tgbeifnmwpcodrzyTGCaJRD", *opt)) return bad("unknown option '%s'%s", a, "");
        if (a[2]) *val = a + 2;
        snprintf(optname, len, "-%c", *opt);
    }
    if (!*val) {
        if (*i + 1 >= argc) return bad("option '%s' needs a value%s", optname, "");
        *val = argv[++*i];
    }
    return 0;
}

static int parse_args(int argc, char **argv, struct cfg *c)
{
    *c = (struct cfg){.coll = -1, .bind = -1, .minbytes = 32u << 20, .maxbytes = 32u << 20, .stepbytes = 1u << 20,
                      .stepfactor = 1, .iters = 20, .warmup = 5, .agg = 1, .check = 1, .type = 7,
                      .op = ZCCL_SUM, .root = 0, .average = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return -1; }
        if (!strcmp(a, "--version")) { printf("zccl-bench (zccl) %s\n", ZCCL_VERSION_STRING); return -1; }
        if (!strcmp(a, "--env")) { print_env(); return -1; }
        if (a[0] != '-' || a[1] == '\0') {
            if (c->coll >= 0) return bad("unexpected argument '%s' (the operation is already '%s')", a,
                                         colls[c->coll].name);
            c->coll = find_coll(a);
            if (c->coll < 0)
                return bad("unknown operation '%s' (allreduce, reduce_scatter, allgather, broadcast, reduce, "
                           "sendrecv, alltoall, gather, scatter)%s", a, "");
            continue;
        }
        char opt, optname[48];
        const char *val;
        if (split_option(argc, argv, &i, &opt, &val, optname, sizeof optname) != 0) return 2;
        if (set_option(c, opt, val, optname) != 0) return 2;
    }
    if (c->wire) c->check = 0; /* approximate results: the exact check does not apply */
    return check_cfg(c);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* One rank                                                                                                     */
/* ------------------------------------------------------------------------------------------------------------ */

struct bench {
    const struct cfg *c;
    zccl_comm_t comm;
    zccl_stream_t stream; /* NULL with -z 1 / -y 1 */
    int rank, nranks;
    char *sendbuf, *recvbuf;
    char *hsend, *hrecv;  /* -D 1: host copies of the device buffers, where checks fill and verify */
    void *reg_handle[2];  /* -R 1: registrations of sendbuf and recvbuf */
    size_t bufbytes;
    uint64_t rep;         /* check seed counter, identical on every rank */
    int errors;           /* results with #wrong > 0 */
    double bw_sum;
    int bw_count;
    FILE *json;
    int json_rows;
    double *rec;          /* --algo all: out-of-place time (us) per size, for the summary; NULL otherwise */
    int rec_i;            /* size index being timed */
    const char *algo_name; /* algorithm forced for this table (--algo), for the JSON rows; NULL: tuner's choice */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank 0 has printed the start of a result row and not its end: an error message must start on a new line. */
static bool row_open;

static void die_zccl(struct bench *b, const char *what, zccl_result_t r)
{
    if (row_open) fputc('\n', stdout);
    fflush(stdout);
    int len = (int)strcspn(what, "("); /* "zccl_allreduce(&t, ...)" -> "zccl_allreduce" */
    fprintf(stderr, NAME ": rank %d: %.*s failed: %s (%d): %s\n", b->rank, len, what, zccl_get_error_string(r),
            (int)r, zccl_get_last_error(b->comm));
    if (b->json) fclose(b->json);
    if (b->comm) zccl_comm_abort(b->comm);
    exit(1);
}

#define ZC(b, call)                                                                                               \
    do {                                                                                                          \
        zccl_result_t r_ = (call);                                                                                \
        if (r_ != ZCCL_SUCCESS) die_zccl((b), #call, r_);                                                         \
    } while (0)

/* Element counts of one size, as nccl-tests computes them. */
struct sizes {
    size_t param;     /* count argument of the call */
    size_t sendcount; /* elements in each rank's send vector */
    size_t recvcount; /* elements in each rank's receive vector */
    size_t bytes;     /* printed size: max(send, recv) * element size */
};

static struct sizes get_sizes(int coll, size_t size, size_t esize, int nranks)
{
    struct sizes s;
    size_t count = size / esize;
    size_t align = esize < 16 ? 16 / esize : 1;
    size_t base = (count / (size_t)nranks) / align * align;
    switch (coll) {
    case C_ALLGATHER:
    case C_GATHER: s.param = base; s.sendcount = base; s.recvcount = base * (size_t)nranks; break;
    case C_REDUCE_SCATTER:
    case C_SCATTER: s.param = base; s.sendcount = base * (size_t)nranks; s.recvcount = base; break;
    case C_ALLTOALL: s.param = base; s.sendcount = s.recvcount = base * (size_t)nranks; break;
    default: s.param = s.sendcount = s.recvcount = count; break;
    }
    s.bytes = (s.sendcount > s.recvcount ? s.sendcount : s.recvcount) * esize;
    return s;
}

static double busbw_factor(int coll, int n)
{
    switch (coll) {
    case C_ALLREDUCE: return 2.0 * (n - 1) / n;
    case C_REDUCE_SCATTER:
    case C_ALLGATHER:
    case C_ALLTOALL: /* nccl-tests: each rank keeps 1/n of what it sends and receives */
    case C_GATHER:
    case C_SCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* nccl-tests' sendrecv: every rank sends to the next rank and receives from the previous one. zccl has no group
 * calls, and a blocking send of a large message waits for its receive: even ranks send first, odd ranks receive
 * first, which breaks every wait cycle (with an odd count, rank n-1's send waits for rank 0, whose own send to the
 * odd rank 1 completes first). On a stream the two are queued in the same order. */
static zccl_result_t run_sendrecv(struct bench *b, const void *s, void *r, size_t count, zccl_datatype_t dt,
                                  zccl_stream_t st)
{
    const int n = b->nranks, next = (b->rank + 1) % n, prev = (b->rank + n - 1) % n;
    zccl_result_t res;
    if (b->rank % 2 == 0) {
        res = zccl_send(s, count, dt, next, b->comm, st);
        return res != ZCCL_SUCCESS ? res : zccl_recv(r, count, dt, prev, b->comm, st);
    }
    res = zccl_recv(r, count, dt, prev, b->comm, st);
    return res != ZCCL_SUCCESS ? res : zccl_send(s, count, dt, next, b->comm, st);
}

static zccl_result_t run_coll(struct bench *b, const void *s, void *r, size_t count, zccl_datatype_t dt, int op,
                              int root, zccl_stream_t st)
{
    const zccl_wire_t w = (zccl_wire_t)b->c->wire;
    if (b->c->hier && b->c->coll == C_ALLREDUCE)
        return zccl_allreduce_hier(s, r, count, dt, (zccl_redop_t)op, w, b->comm, st);
    if (b->c->hier && b->c->coll == C_REDUCE_SCATTER)
        return zccl_reduce_scatter_hier(s, r, count, dt, (zccl_redop_t)op, w, b->comm, st);
    if (b->c->hier && b->c->coll == C_ALLGATHER) return zccl_allgather_hier(s, r, count, dt, w, b->comm, st);
    switch (b->c->coll) {
    case C_SENDRECV: return run_sendrecv(b, s, r, count, dt, st);
    case C_ALLREDUCE: return zccl_allreduce_wire(s, r, count, dt, (zccl_redop_t)op, (zccl_wire_t)b->c->wire, b->comm, st);
    case C_REDUCE_SCATTER:
        return zccl_reduce_scatter_wire(s, r, count, dt, (zccl_redop_t)op, (zccl_wire_t)b->c->wire, b->comm, st);
    case C_ALLGATHER: return zccl_allgather_wire(s, r, count, dt, (zccl_wire_t)b->c->wire, b->comm, st);
    case C_BROADCAST: return zccl_broadcast(s, r, count, dt, root, b->comm, st);
    case C_ALLTOALL: return zccl_alltoall(s, r, count, dt, b->comm, st);
    case C_GATHER: return zccl_gather(s, r, count, dt, root, b->comm, st);
    case C_SCATTER: return zccl_scatter(s, r, count, dt, root, b->comm, st);
    default: return zccl_reduce(s, r, count, dt, (zccl_redop_t)op, root, b->comm, st);
    }
}

static void complete(struct bench *b)
{
    if (b->stream) ZC(b, zccl_stream_synchronize(b->stream));
}

/* Buffers of one placement: in-place positions as NCCL defines them. */
static void placement(struct bench *b, const struct sizes *sz, size_t esize, int in_place, char **s, char **r)
{
    if (!in_place) {
        *s = b->sendbuf;
        *r = b->recvbuf;
        return;
    }
    *s = *r = b->recvbuf;
    if (b->c->coll == C_ALLGATHER || b->c->coll == C_GATHER) *s = b->recvbuf + (size_t)b->rank * sz->param * esize;
    if (b->c->coll == C_REDUCE_SCATTER || b->c->coll == C_SCATTER)
        *r = b->recvbuf + (size_t)b->rank * sz->param * esize;
}

/* The host copy of a position in the send or receive buffer (-D 1), else p itself. */
static char *host_of(struct bench *b, char *p)
{
    if (!b->hsend) return p;
    if (p >= b->sendbuf && p < b->sendbuf + b->bufbytes) return b->hsend + (p - b->sendbuf);
    return b->hrecv + (p - b->recvbuf);
}

/* One checked run: fill, run, verify. Returns this rank's number of wrong elements. */
static int64_t check_once(struct bench *b, const struct sizes *sz, zccl_datatype_t dt, size_t esize, int op,
                          int root, int in_place)
{
    const int coll = b->c->coll, rank = b->rank, n = b->nranks;
    const int movement = coll == C_ALLGATHER || coll == C_BROADCAST || coll == C_SENDRECV || coll == C_ALLTOALL ||
                         coll == C_GATHER || coll == C_SCATTER;
    bench_check_t ck;
    b->rep++;
    if (bench_check_init(&ck, dt, movement ? BP_BITS : op, n, b->rep) != 0) {
        fprintf(stderr, NAME ": rank %d: out of memory\n", rank);
        zccl_comm_abort(b->comm);
        exit(1);
    }
    char *ds, *dr; /* what the collective gets */
    placement(b, sz, esize, in_place, &ds, &dr);
    /* -D 1: fill and verify host copies of the device buffers at the same offsets */
    char *s = host_of(b, ds), *r = host_of(b, dr), *recvbuf = host_of(b, b->recvbuf);
    const unsigned char sentinel = (unsigned char)(0xa5 ^ (b->rep & 0x3c));
    const size_t P = sz->param;
    int64_t wrong = 0;
    int src_used = 1; /* whether this rank's send buffer is read (and so must stay unchanged out of place) */

    switch (coll) {
    case C_ALLREDUCE:
    case C_REDUCE:
        bench_fill(&ck, s, rank, 0, P);
        if (!in_place) memset(r, sentinel, P * esize);
        break;
    case C_BROADCAST:
        if (rank == root) bench_fill(&ck, s, rank, 0, P);
        else src_used = 0;
        if (!in_place || rank != root) memset(r, sentinel, P * esize);
        break;
    case C_ALLGATHER:
        memset(recvbuf, sentinel, P * (size_t)n * esize);
        bench_fill(&ck, s, rank, 0, P);
        break;
    case C_REDUCE_SCATTER:
        bench_fill(&ck, s, rank, 0, P * (size_t)n);
        if (!in_place) memset(r, sentinel, P * esize);
        break;
    case C_SENDRECV:
        bench_fill(&ck, s, rank, 0, P);
        memset(r, sentinel, P * esize);
        break;
    case C_ALLTOALL: /* block q of rank r's vector goes to rank q: elements q*P.. of r's pattern */
        if (!in_place) memset(r, sentinel, P * (size_t)n * esize);
        bench_fill(&ck, s, rank, 0, P * (size_t)n);
        break;
    case C_GATHER: /* the root's receive buffer is significant only there */
        if (rank == root) memset(recvbuf, sentinel, P * (size_t)n * esize);
        bench_fill(&ck, s, rank, 0, P);
        break;
    case C_SCATTER: /* only the root's send vector is read: the root's pattern, P elements per rank */
        if (rank == root) bench_fill(&ck, s, rank, 0, P * (size_t)n);
        else src_used = 0;
        if (!in_place || rank != root) memset(r, sentinel, P * esize);
        break;
    }

    if (b->hsend) {
        ZC(b, zccl_mem_copy(b->sendbuf, b->hsend, b->bufbytes));
        ZC(b, zccl_mem_copy(b->recvbuf, b->hrecv, b->bufbytes));
    }
    ZC(b, run_coll(b, ds, dr, P, dt, op, root, b->stream));
    complete(b);
    if (b->hsend) {
        ZC(b, zccl_mem_copy(b->hsend, b->sendbuf, b->bufbytes));
        ZC(b, zccl_mem_copy(b->hrecv, b->recvbuf, b->bufbytes));
    }

    switch (coll) {
    case C_ALLREDUCE: wrong += bench_verify_reduce(&ck, r, 0, P); break;
    case C_REDUCE:
        if (rank == root) wrong += bench_verify_reduce(&ck, r, 0, P);
        break;
    case C_REDUCE_SCATTER: wrong += bench_verify_reduce(&ck, r, (size_t)rank * P, P); break;
    case C_BROADCAST: wrong += bench_verify_copy(&ck, r, root, 0, P); break;
    case C_ALLGATHER:
        for (int q = 0; q < n; q++) wrong += bench_verify_copy(&ck, r + (size_t)q * P * esize, q, 0, P);
        break;
    case C_SENDRECV: wrong += bench_verify_copy(&ck, r, (rank + n - 1) % n, 0, P); break; /* the previous rank's */
    case C_ALLTOALL: /* block q came from rank q: its elements rank*P.. */
        for (int q = 0; q < n; q++) wrong += bench_verify_copy(&ck, r + (size_t)q * P * esize, q, (size_t)rank * P, P);
        break;
    case C_GATHER:
        if (rank == root)
            for (int q = 0; q < n; q++) wrong += bench_verify_copy(&ck, r + (size_t)q * P * esize, q, 0, P);
        break;
    case C_SCATTER: wrong += bench_verify_copy(&ck, r, root, (size_t)rank * P, P); break;
    }
    if (!in_place && src_used) {
        const bool whole = coll == C_REDUCE_SCATTER || coll == C_ALLTOALL || coll == C_SCATTER;
        wrong += bench_verify_copy(&ck, s, rank, 0, whole ? P * (size_t)n : P);
    }
    bench_check_free(&ck);
    return wrong;
}

static double combine_time(struct bench *b, double t)
{
    double out = t;
    switch (b->c->average) {
    case 0: ZC(b, zccl_broadcast(&t, &out, 1, ZCCL_FLOAT64, 0, b->comm, NULL)); break;
    case 1:
        ZC(b, zccl_allreduce(&t, &out, 1, ZCCL_FLOAT64, ZCCL_SUM, b->comm, NULL));
        out /= b->nranks;
        break;
    case 2: ZC(b, zccl_allreduce(&t, &out, 1, ZCCL_FLOAT64, ZCCL_MIN, b->comm, NULL)); break;
    default: ZC(b, zccl_allreduce(&t, &out, 1, ZCCL_FLOAT64, ZCCL_MAX, b->comm, NULL)); break;
    }
    return out;
}

static void json_result(struct bench *b, const char *key, double us, double algbw, double busbw, long long wrong)
{
    if (!b->json) return;
    fprintf(b->json, "\"%s\": {\"time_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, \"wrong\": %lld}", key,
            isfinite(us) ? us : 0.0, isfinite(algbw) ? algbw : 0.0, isfinite(busbw) ? busbw : 0.0, wrong);
}

/* One placement of one size: timing, then checking. Prints its columns and returns nothing. */
static void bench_time(struct bench *b, const struct sizes *sz, zccl_datatype_t dt, size_t esize, int op, int root,
                       int in_place)
{
    const struct cfg *c = b->c;
    char *s, *r;
    if (c->coll == C_SENDRECV && in_place) {
        /* Without group calls one of two neighbours receives before it sends, which would overwrite what it has
         * to send: sendrecv runs out of place only, and the in-place columns say so. */
        if (b->rank == 0) {
            printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
            fflush(stdout);
        }
        return;
    }
    placement(b, sz, esize, in_place, &s, &r);
    zccl_stream_t st = b->stream;

    /* untimed run, then line every rank up */
    ZC(b, run_coll(b, s, r, sz->param, dt, op, root, st));
    complete(b);
    ZC(b, zccl_barrier(b->comm, NULL));

    double t0 = now_s();
    for (int it = 0; it < c->iters; it++) {
        for (int k = 0; k < c->agg; k++) ZC(b, run_coll(b, s, r, sz->param, dt, op, root, st));
        if (c->blocking) ZC(b, zccl_barrier(b->comm, NULL));
    }
    double t_issue = now_s() - t0;
    complete(b);
    double t_done = now_s() - t0;
    double sec = (c->cputime ? t_issue : t_done) / ((double)c->iters * c->agg);
    sec = combine_time(b, sec);

    double algbw = sec > 0 ? (double)sz->bytes / 1.0e9 / sec : 0.0;
    double busbw = algbw * busbw_factor(c->coll, b->nranks);

    long long wrong = -1;
    for (int k = 0; k < c->check; k++) {
        int64_t w = check_once(b, sz, dt, esize, op, root, in_place), total = 0;
        ZC(b, zccl_allreduce(&w, &total, 1, ZCCL_INT64, ZCCL_SUM, b->comm, NULL));
        wrong = (long long)total;
        if (wrong) break;
    }
    if (wrong > 0) b->errors++;
    b->bw_sum += busbw;
    b->bw_count++;

    if (b->rec && !in_place) b->rec[b->rec_i] = sec * 1e6;
    if (b->rank == 0) {
        double us = sec * 1e6;
        char tbuf[32];
        snprintf(tbuf, sizeof tbuf, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
        if (wrong >= 0) printf("  %7s  %6.2f  %6.2f  %5lld", tbuf, algbw, busbw, wrong);
        else printf("  %7s  %6.2f  %6.2f  %5s", tbuf, algbw, busbw, "N/A");
        fflush(stdout);
        if (b->json) {
            fprintf(b->json, ", ");
            json_result(b, in_place ? "ip" : "oop", us, algbw, busbw, wrong);
        }
    }
}

static void warmup(struct bench *b, size_t size, zccl_datatype_t dt, size_t esize, int op, int root)
{
    struct sizes sz = get_sizes(b->c->coll, size, esize, b->nranks);
    for (int it = 0; it < b->c->warmup; it++)
        ZC(b, run_coll(b, b->sendbuf, b->recvbuf, sz.param, dt, op, root, b->stream));
    complete(b);
}

static size_t next_size(const struct cfg *c, size_t size)
{
    if (c->stepfactor > 1) return size > SIZE_MAX / c->stepfactor ? SIZE_MAX : size * c->stepfactor;
    return size > SIZE_MAX - c->stepbytes ? SIZE_MAX : size + c->stepbytes;
}

static void time_test(struct bench *b, int ti, int op, int root)
{
    const struct cfg *c = b->c;
    zccl_datatype_t dt = types[ti].dt;
    size_t esize = zccl_type_size(dt);
    const char *opname = colls[c->coll].has_op ? opnames[op] : "none";
    int shown_root = colls[c->coll].has_root ? root : -1;

    ZC(b, zccl_barrier(b->comm, NULL));
    warmup(b, c->maxbytes, dt, esize, op, root);
    warmup(b, c->minbytes, dt, esize, op, root);

    b->rec_i = 0;
    for (size_t size = c->minbytes; size <= c->maxbytes; size = next_size(c, size), b->rec_i++) {
        struct sizes sz = get_sizes(c->coll, size, esize, b->nranks);
        if (b->rank == 0) {
            printf("%12zu  %12zu  %8s  %6s  %6i", sz.bytes, sz.param, types[ti].name, opname, shown_root);
            row_open = true;
            fflush(stdout);
            if (b->json) {
                fprintf(b->json, "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
                                 "\"root\": %d",
                        b->json_rows++ ? "," : "", sz.bytes, sz.param, types[ti].name, opname, shown_root);
                if (b->algo_name) fprintf(b->json, ", \"algo\": \"%s\"", b->algo_name);
            }
        }
        bench_time(b, &sz, dt, esize, op, root, 0);
        bench_time(b, &sz, dt, esize, op, root, 1);
        if (b->rank == 0) {
            printf("\n");
            row_open = false;
            if (b->json) fprintf(b->json, "}");
        }
        if (size == SIZE_MAX) break;
    }
}

/* ZCCL_ALGO's names of the collectives, in enum coll order. */
static const char *const tune_names[C_NCOLL] = {"allreduce", "reducescatter", "allgather", "broadcast", "reduce",
                                                "sendrecv", "alltoall", "gather", "scatter"};

/* --algo NAME: every rank restricts the tuner to NAME for OP. Returns 0, or 2 after rank 0 explains. */
static int force_algo(struct bench *b, const char *name)
{
    char spec[160];
    snprintf(spec, sizeof spec, "%s:%s", tune_names[b->c->coll], name);
    zccl_result_t r = zccl_comm_set_algo(b->comm, spec);
    if (r == ZCCL_SUCCESS) {
        b->algo_name = name;
        return 0;
    }
    if (r != ZCCL_INVALID_ARGUMENT) die_zccl(b, "zccl_comm_set_algo", r);
    if (b->rank == 0) {
        char valid[512] = "";
        zccl_comm_algorithms(b->comm, tune_names[b->c->coll], valid, sizeof valid);
        fprintf(stderr, NAME ": --algo %s: %s\n" NAME ": algorithms for %s on this communicator: %s (or 'all')\n",
                name, zccl_get_last_error(b->comm), colls[b->c->coll].name, valid);
    }
    return 2;
}

static int count_sizes(const struct cfg *c)
{
    int k = 0;
    for (size_t size = c->minbytes; size <= c->maxbytes; size = next_size(c, size)) {
        k++;
        if (size == SIZE_MAX) break;
    }
    return k;
}

/* --algo all: one table per algorithm, then the summary (rank 0 prints it). */
static void run_all_algos(struct bench *b, int ti, int op, int root)
{
    const struct cfg *c = b->c;
    char list[512], *names[64];
    int na = 0;
    ZC(b, zccl_comm_algorithms(b->comm, tune_names[c->coll], list, sizeof list));
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t && na < 64; t = strtok_r(NULL, ",", &save))
        names[na++] = t;
    const int ns = count_sizes(c);
    double *times = calloc((size_t)na * (size_t)ns, sizeof *times);
    if (!times) {
        fprintf(stderr, NAME ": rank %d: out of memory\n", b->rank);
        zccl_comm_abort(b->comm);
        exit(1);
    }
    /* Sizes outer, algorithms inner, starting with a different algorithm at each size: slow drifts of a shared
     * machine and first-run effects spread over all algorithms instead of favouring or penalising one. */
    const zccl_datatype_t dt0 = types[ti].dt;
    const size_t esize = zccl_type_size(dt0);
    const char *opname = colls[c->coll].has_op ? opnames[op] : "none";
    const int shown_root = colls[c->coll].has_root ? root : -1;
    ZC(b, zccl_barrier(b->comm, NULL));
    if (b->rank == 0) printf("# --algo all: every size runs every algorithm (named at the end of the row)\n");
    int i = 0;
    for (size_t size = c->minbytes; size <= c->maxbytes; size = next_size(c, size), i++) {
        struct sizes sz = get_sizes(c->coll, size, esize, b->nranks);
        for (int k = 0; k < na; k++) {
            const int a = (k + i) % na;
            if (force_algo(b, names[a]) != 0) die_zccl(b, "zccl_comm_set_algo", ZCCL_INTERNAL_ERROR);
            warmup(b, size, dt0, esize, op, root);
            if (b->rank == 0) {
                printf("%12zu  %12zu  %8s  %6s  %6i", sz.bytes, sz.param, types[ti].name, opname, shown_root);
                row_open = true;
                fflush(stdout);
                if (b->json)
                    fprintf(b->json, "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
                                     "\"root\": %d, \"algo\": \"%s\"",
                            b->json_rows++ ? "," : "", sz.bytes, sz.param, types[ti].name, opname, shown_root,
                            names[a]);
            }
            b->rec = times + (size_t)a * (size_t)ns;
            b->rec_i = i;
            bench_time(b, &sz, dt0, esize, op, root, 0);
            bench_time(b, &sz, dt0, esize, op, root, 1);
            if (b->rank == 0) {
                printf("  %s\n", names[a]);
                row_open = false;
                if (b->json) fprintf(b->json, "}");
            }
        }
        if (size == SIZE_MAX) break;
    }
    b->rec = NULL;
    b->algo_name = NULL;
    ZC(b, zccl_comm_set_algo(b->comm, NULL)); /* back to the tuner's own choice */
    if (b->rank == 0) {
        const zccl_datatype_t dt = types[ti].dt;
        printf("#\n# Per-algorithm summary: %s %s %s, %d ranks; out-of-place time (us), %s over ranks\n",
               colls[c->coll].name, types[ti].name, colls[c->coll].has_op ? opnames[op] : "", b->nranks,
               (const char *[]){"rank 0", "average", "min", "max"}[c->average]);
        printf("# %10s", "size");
        for (int a = 0; a < na; a++) printf("  %12s", names[a]);
        printf("  %12s  %12s  %10s  %9s\n", "best", "tuner", "tuner/best", "pred(us)");
        int within = 0;
        i = 0;
        for (size_t size = c->minbytes; size <= c->maxbytes; size = next_size(c, size), i++) {
            struct sizes sz = get_sizes(c->coll, size, zccl_type_size(dt), b->nranks);
            int best = 0, chosen = -1;
            for (int a = 1; a < na; a++)
                if (times[(size_t)a * ns + i] < times[(size_t)best * ns + i]) best = a;
            char choice[64] = "?";
            double pred = 0;
            ZC(b, zccl_comm_algo_choice(b->comm, tune_names[c->coll], sz.bytes, choice, sizeof choice, &pred));
            for (int a = 0; a < na; a++)
                if (!strcmp(names[a], choice)) chosen = a;
            printf("  %10zu", sz.bytes);
            for (int a = 0; a < na; a++) printf("  %12.2f", times[(size_t)a * ns + i]);
            double ratio = chosen >= 0 ? times[(size_t)chosen * ns + i] / times[(size_t)best * ns + i] : NAN;
            within += ratio <= 1.10;
            printf("  %12s  %12s  %10.3f  %9.2f\n", names[best], choice, ratio, pred);
            if (size == SIZE_MAX) break;
        }
        printf("# tuner within 10%% of the best measured algorithm at %d of %d sizes\n#\n", within, i);
        fflush(stdout);
    }
    free(times);
}

static int env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

/* Bytes the kernel says can be allocated without swapping (MemAvailable in /proc/meminfo); 0 when unknown. */
static unsigned long long mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024ull;
}

/* Ranks of this job on this host, from the launcher's environment (zcclrun/torchrun, Open MPI, MPICH); 1 when
 * none says. */
static int local_ranks(void)
{
    for (const char *const *v = (const char *const[]){"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                      "MPI_LOCALNRANKS", NULL}; *v; v++)
        if (env_set(*v) && atoi(getenv(*v)) > 0) return atoi(getenv(*v));
    return 1;
}

static void print_header(struct bench *b)
{
    const struct cfg *c = b->c;
    /* every rank describes itself; rank 0 prints the lines in rank order */
    enum { LINE = 640 };
    char mine[LINE];
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    const char *lr = getenv("LOCAL_RANK");
    if (!lr) lr = getenv("SLURM_LOCALID"); /* srun */
    int local = lr ? atoi(lr) : 0;
    memset(mine, 0, sizeof mine);
    int cudev = -1;
    if (b->c->device) zccl_pointer_device(b->sendbuf, &cudev);
    char what[64];
    if (cudev >= 0) snprintf(what, sizeof what, "CUDA device %d memory, staged by zccl", cudev);
    else snprintf(what, sizeof what, "CPU (host memory)");
    int len = snprintf(mine, sizeof mine, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s\n", b->rank, 0,
                       (int)getpid(), host, cudev >= 0 ? cudev : local, 0, what);
    /* The rails this rank stripes over to other hosts (zccl_comm_net_info), on a line of its own. */
    char net[400] = "";
    int nrails = 0, socks = 1;
    ZC(b, zccl_comm_net_info(b->comm, net, sizeof net, &nrails, &socks));
    if (len > 0 && len < LINE)
        snprintf(mine + len, sizeof mine - (size_t)len, "#  Rank %2d channels 1 rails %d sockets/pair %d: %s\n", b->rank,
                 nrails, socks, net);
    char *gather = malloc((size_t)b->nranks * LINE);
    if (!gather) {
        fprintf(stderr, NAME ": rank %d: out of memory\n", b->rank);
        zccl_comm_abort(b->comm);
        exit(1);
    }
    ZC(b, zccl_allgather(mine, gather, LINE, ZCCL_INT8, b->comm, NULL));
    if (b->rank == 0) {
        int version = 0;
        zccl_get_version(&version);
        printf("# zccl-bench version %d.%d.%d zccl-headers=%d zccl-library=%d\n", ZCCL_MAJOR, ZCCL_MINOR,
               ZCCL_PATCH, ZCCL_VERSION_CODE, version);
        printf("# Collective test starting: %s\n", colls[c->coll].name);
        printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
               "validation: %d graph: 0\n",
               c->minbytes, c->maxbytes, c->stepfactor > 1 ? c->stepfactor : c->stepbytes,
               c->stepfactor > 1 ? "factor" : "bytes", c->warmup, c->iters, c->agg, c->check);
        if (c->blocking) printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
        printf("#\n# Using devices\n");
        for (int q = 0; q < b->nranks; q++) {
            gather[(size_t)q * LINE + LINE - 1] = '\0';
            fputs(gather + (size_t)q * LINE, stdout);
        }
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n", "", "", "", "",
               "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
               "redop", "root", c->cputime ? "cputime" : "time", "algbw", "busbw", "#wrong",
               c->cputime ? "cputime" : "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
               "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
        fflush(stdout);
    }
    free(gather);
}

/* --bind core for -np rank r: the r-th CPU of the mask the launcher inherited (a rank that cannot bind says so and
 * runs unbound). */
static void bind_rank(const struct cfg *c, int r)
{
    cpu_set_t set, one;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    const int ncpu = CPU_COUNT(&set);
    if (c->bind == 0 || (c->bind < 0 && c->np > ncpu)) return;
    int k = r % ncpu;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set) || k-- > 0) continue;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0)
            fprintf(stderr, NAME ": rank %d: cannot bind to CPU %d: %s (running unbound)\n", r, cpu, strerror(errno));
        return;
    }
}

static int run_rank(int launched_rank, void *arg)
{
    const struct cfg *c = arg;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (c->np > 0) bind_rank(c, launched_rank);
    struct bench b = {.c = c, .rank = -1};
    /* Until the communicator exists, errors carry the rank the launcher gave (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK,
     * or the -np child index). */
    for (const char *const *v = (const char *const[]){"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", NULL}; *v; v++)
        if (env_set(*v)) { b.rank = atoi(getenv(*v)); break; }
    if (b.rank < 0 && launched_rank >= 0) b.rank = launched_rank;

    if (c->device) { /* as a CUDA program does (cudaSetDevice) before creating its communicator: a context is
                      * current, so the communicator knows its GPU and starts on the rail paired with it */
        void *p = NULL;
        if (zccl_mem_alloc_cuda(&p, 256) == ZCCL_SUCCESS) zccl_mem_free_cuda(p);
    }
    if (env_set("RANK") || env_set("OMPI_COMM_WORLD_RANK") || env_set("PMI_RANK")) {
        ZC(&b, zccl_comm_init_env(&b.comm));
    } else {
        zccl_unique_id_t id;
        ZC(&b, zccl_get_unique_id(&id));
        ZC(&b, zccl_comm_init_rank(&b.comm, 1, id, 0));
    }
    ZC(&b, zccl_comm_rank(b.comm, &b.rank));
    ZC(&b, zccl_comm_count(b.comm, &b.nranks));

    /* Setup that can fail on one rank only (memory, the JSON file): agree on it before going on. */
    int64_t bad_local = 0, bad_any = 0;
    if (c->coll == C_SENDRECV && b.nranks < 2) {
        if (b.rank == 0)
            fprintf(stderr, NAME ": sendrecv needs at least 2 ranks (zccl_send to oneself is not allowed)\n");
        bad_local = 2;
    }
    if (colls[c->coll].has_root && c->root >= b.nranks) {
        if (b.rank == 0)
            fprintf(stderr, NAME ": -r %d: root must be below the number of ranks (%d)\n", c->root, b.nranks);
        bad_local = 2;
    }
    b.bufbytes = (c->maxbytes + 4095) / 4096 * 4096;
    if (b.bufbytes == 0) b.bufbytes = 4096;
    /* Linux overcommits: the allocation below succeeds for any size, and touching the pages would bring the OOM
     * killer instead of an error. Send and receive buffers, plus the library's scratch space of up to one buffer
     * for reductions, for every rank of this host, must fit in what the kernel has available. */
    const unsigned long long avail = mem_available(), per_rank = 3ull * b.bufbytes;
    const int local = local_ranks();
    if (!bad_local && avail && per_rank > avail / (unsigned long long)local) {
        if (b.rank == 0)
            fprintf(stderr, NAME ": -e %zu needs about %llu MiB per rank (send, receive and scratch buffers) x %d "
                    "rank%s on this host, but only %llu MiB are available (MemAvailable): lower -e\n", c->maxbytes,
                    per_rank >> 20, local, local == 1 ? "" : "s", avail >> 20);
        bad_local = 2;
    }
    if (!bad_local) {
        if (c->registered) {
            if (zccl_mem_alloc((void **)&b.sendbuf, b.bufbytes) != ZCCL_SUCCESS ||
                zccl_mem_alloc((void **)&b.recvbuf, b.bufbytes) != ZCCL_SUCCESS ||
                zccl_comm_register(b.comm, b.sendbuf, b.bufbytes, &b.reg_handle[0]) != ZCCL_SUCCESS ||
                zccl_comm_register(b.comm, b.recvbuf, b.bufbytes, &b.reg_handle[1]) != ZCCL_SUCCESS) {
                fprintf(stderr, NAME ": rank %d: -R 1: %s\n", b.rank, zccl_get_last_error(b.comm));
                bad_local = 1;
            }
        } else if (c->device) {
            if (zccl_mem_alloc_cuda((void **)&b.sendbuf, b.bufbytes) != ZCCL_SUCCESS ||
                zccl_mem_alloc_cuda((void **)&b.recvbuf, b.bufbytes) != ZCCL_SUCCESS) {
                fprintf(stderr, NAME ": rank %d: -D 1: %s\n", b.rank, zccl_get_last_error(b.comm));
                bad_local = 1;
            } else if (posix_memalign((void **)&b.hsend, 4096, b.bufbytes) != 0 ||
                       posix_memalign((void **)&b.hrecv, 4096, b.bufbytes) != 0) {
                fprintf(stderr, NAME ": rank %d: cannot allocate 2 x %zu bytes of host copies for -e %zu\n", b.rank,
                        b.bufbytes, c->maxbytes);
                bad_local = 1;
            }
        } else if (posix_memalign((void **)&b.sendbuf, 4096, b.bufbytes + (size_t)c->buf_offset) != 0 ||
            posix_memalign((void **)&b.recvbuf, 4096, b.bufbytes + (size_t)c->rbuf_offset) != 0) {
            fprintf(stderr, NAME ": rank %d: cannot allocate 2 x %zu bytes for -e %zu\n", b.rank, b.bufbytes,
                    c->maxbytes);
            free(b.sendbuf);
            b.sendbuf = NULL; /* recvbuf is NULL: its allocation failed */
            bad_local = 1;
        } else {
            b.sendbuf += c->buf_offset, b.recvbuf += c->rbuf_offset; /* freed at the offsets' start below */
        }
        if (!bad_local && c->device) {
            memset(b.hsend, 0, b.bufbytes);
            memset(b.hrecv, 0, b.bufbytes);
            if (zccl_mem_copy(b.sendbuf, b.hsend, b.bufbytes) != ZCCL_SUCCESS ||
                zccl_mem_copy(b.recvbuf, b.hrecv, b.bufbytes) != ZCCL_SUCCESS) {
                fprintf(stderr, NAME ": rank %d: -D 1: %s\n", b.rank, zccl_get_last_error(b.comm));
                bad_local = 1;
            }
        } else if (!bad_local) {
            memset(b.sendbuf, 0, b.bufbytes);
            memset(b.recvbuf, 0, b.bufbytes);
            if (c->wire) { /* finite, varied data in every float type (zeros would take the encoder's fast path) */
                uint16_t *h = (uint16_t *)(void *)b.sendbuf;
                uint32_t x = 2463534242u ^ (uint32_t)b.rank;
                for (size_t k = 0; k < b.bufbytes / 2; k++) {
                    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                    h[k] = (uint16_t)((x & 0x8000u) | 0x3800u | (x & 0x7ffu)); /* half 0.5..2, bf16 and float finite */
                }
            }
        }
    }
    if (!bad_local && b.rank == 0 && c->json && !(b.json = fopen(c->json, "w"))) {
        fprintf(stderr, NAME ": cannot open JSON output '%s': %s\n", c->json, strerror(errno));
        bad_local = 2;
    }
    ZC(&b, zccl_allreduce(&bad_local, &bad_any, 1, ZCCL_INT64, ZCCL_MAX, b.comm, NULL));
    if (bad_any) {
        if (b.json) fclose(b.json);
        zccl_comm_destroy(b.comm);
        return (int)bad_any;
    }
    if (!c->blocking && !c->stream_null) {
        /* -D 1: ordered with the default CUDA stream of this thread's context, as an NCCL call on stream 0 */
        if (c->device) ZC(&b, zccl_stream_create_cuda(NULL, &b.stream));
        else ZC(&b, zccl_stream_create(&b.stream));
    }

    if (c->algo && strcmp(c->algo, "all")) {
        int frc = force_algo(&b, c->algo);
        if (frc) {
            if (b.json) fclose(b.json);
            if (b.stream) zccl_stream_destroy(b.stream);
            zccl_comm_destroy(b.comm);
            return frc;
        }
    }
    print_header(&b);
    if (b.json) {
        fprintf(b.json, "{\n  \"op\": \"%s\", \"nranks\": %d, \"datatype\": \"%s\", \"redop\": \"%s\", \"root\": %d,\n"
                        "  \"minbytes\": %zu, \"maxbytes\": %zu, \"iters\": %d, \"warmup_iters\": %d, \"check\": %d,\n"
                        "  \"results\": [",
                colls[c->coll].name, b.nranks, c->type < 0 ? "all" : types[c->type].name,
                !colls[c->coll].has_op ? "none" : c->op < 0 ? "all" : opnames[c->op],
                colls[c->coll].has_root ? c->root : -1, c->minbytes, c->maxbytes, c->iters, c->warmup, c->check);
    }

    int t_first = c->type < 0 ? 0 : c->type, t_last = c->type < 0 ? NTYPES - 1 : c->type;
    int o_first = 0, o_last = 0;
    if (colls[c->coll].has_op) {
        o_first = c->op < 0 ? 0 : c->op;
        o_last = c->op < 0 ? NOPS - 1 : c->op;
    }
    int r_first = 0, r_last = 0;
    if (colls[c->coll].has_root) {
        r_first = c->root < 0 ? 0 : c->root;
        r_last = c->root < 0 ? b.nranks - 1 : c->root;
    }
    for (int ti = t_first; ti <= t_last; ti++)
        for (int op = o_first; op <= o_last; op++)
            for (int root = r_first; root <= r_last; root++) {
                if (c->algo && !strcmp(c->algo, "all")) run_all_algos(&b, ti, op, root);
                else time_test(&b, ti, op, root);
            }

    double avg_bw = b.bw_count ? b.bw_sum / b.bw_count : 0.0;
    if (b.rank == 0) {
        /* The rails in use now: a rail lost during the run shows as "(ethN lost)" (zccl_comm_net_info). */
        char net[400] = "";
        int nrails = 0, socks = 1;
        ZC(&b, zccl_comm_net_info(b.comm, net, sizeof net, &nrails, &socks));
        zccl_result_t async = ZCCL_SUCCESS;
        ZC(&b, zccl_comm_get_async_error(b.comm, &async));
        if (nrails)
            printf("# Rails at the end (rank 0): %s; async error: %s\n", net,
                   async == ZCCL_SUCCESS ? "SUCCESS" : zccl_get_error_string(async));
        printf("# Out of bounds values : %d %s\n", b.errors, b.errors ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", avg_bw);
        printf("#\n");
        fflush(stdout);
    }
    /* Wrong results make rank 0 (which printed them) exit with 1; the other ranks exit with 0 so that a launcher
     * does not stop rank 0 before it has finished its report. zccl failures exit with 1 on the rank that saw them. */
    int rc = b.errors && b.rank == 0 ? 1 : 0;
    if (b.json) {
        fprintf(b.json, "\n  ],\n  \"avg_busbw\": %.6f,\n  \"wrong_results\": %d\n}\n", isfinite(avg_bw) ? avg_bw : 0.0,
                b.errors);
        if (fclose(b.json) != 0) {
            fprintf(stderr, NAME ": writing '%s': %s\n", c->json, strerror(errno));
            rc = 1;
        }
        b.json = NULL;
    }
    if (b.stream) ZC(&b, zccl_stream_destroy(b.stream));
    if (c->registered) {
        for (int k = 0; k < 2; k++)
            if (b.reg_handle[k]) ZC(&b, zccl_comm_deregister(b.comm, b.reg_handle[k]));
        ZC(&b, zccl_comm_destroy(b.comm));
        ZC(&b, zccl_mem_free(b.sendbuf));
        ZC(&b, zccl_mem_free(b.recvbuf));
        return rc;
    }
    ZC(&b, zccl_comm_destroy(b.comm));
    if (c->device) {
        ZC(&b, zccl_mem_free_cuda(b.sendbuf));
        ZC(&b, zccl_mem_free_cuda(b.recvbuf));
        free(b.hsend);
        free(b.hrecv);
        return rc;
    }
    if (b.sendbuf) free(b.sendbuf - c->buf_offset); /* -R and -D returned above */
    if (b.recvbuf) free(b.recvbuf - c->rbuf_offset);
    return rc;
}

int main(int argc, char **argv)
{
    struct cfg c;
    int rc = parse_args(argc, argv, &c);
    if (rc == -1) return 0;
    if (rc != 0) return rc;
    if (c.np > 0) {
        for (const char *const *v = (const char *const[]){"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", NULL}; *v; v++)
            if (env_set(*v)) {
                /* under zcclrun/torchrun/mpirun every rank would start a job of its own */
                fprintf(stderr,
                        NAME ": -np %d: this process is already rank %s of a job a launcher started (%s is set); "
                             "drop -np to run as that rank, or run " NAME " -np %d without a launcher\n",
                        c.np, getenv(*v), *v, c.np);
                return 2;
            }
        if (colls[c.coll].has_root && c.root >= c.np) {
            fprintf(stderr, NAME ": -r %d: root must be below the number of ranks (-np %d)\n", c.root, c.np);
            return 2;
        }
        struct zl_opts o = {.nranks = c.np, .name = NAME};
        return zl_launch(&o, run_rank, &c);
    }
    return run_rank(0, &c);
}

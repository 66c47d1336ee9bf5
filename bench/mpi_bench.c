/*
 * mpi_bench.c — MPI baseline for zccl-bench: times MPI collectives on float32 / sum and prints the same table as
 * nccl-tests (and zccl-bench), so bench/compare can read all of them with one parser.
 *
 *   mpirun -np 2 ./mpi_bench allreduce -b 8 -e 256M -f 2 [-n iters] [-w warmup] [-c 0|1]
 *
 * Collectives: allreduce (MPI_Allreduce), reduce_scatter (MPI_Reduce_scatter_block), allgather (MPI_Allgather),
 * broadcast (MPI_Bcast), reduce (MPI_Reduce).
 *
 * Conventions follow nccl-tests:
 *   - a sweep size is the largest buffer involved, in bytes: for allgather and reduce_scatter it is the total
 *     (count per rank * nranks * 4), and the count column is the count argument of the call (per rank there);
 *     the count per rank is size / 4 / nranks rounded down to a multiple of 4 elements (16 bytes), so sizes below
 *     nranks * 16 bytes print as 0;
 *   - time is the mean time of one call in microseconds over the timed iterations (here: the maximum of that mean
 *     over the ranks), measured after the warm-up calls and a barrier;
 *   - algbw = size / time; busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter), 1 (broadcast,
 *     reduce);
 *   - out-of-place columns use separate send and receive buffers, in-place columns use MPI_IN_PLACE laid out as
 *     NCCL does (allgather: own block at rank*count in the receive buffer; reduce_scatter: whole input in the
 *     receive buffer, result in its first count elements). MPI_Bcast has a single buffer, so both of its columns
 *     time the same call;
 *   - #wrong is the number of wrong elements summed over ranks, from one extra checked call per size and placement
 *     (outside the timing) on data whose exact result is known; N/A with -c 0.
 */
#include <mpi.h>

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum coll { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE };

static const struct {
    const char *name;
    const char *alias;
    const char *opname; /* the redop column */
} COLLS[] = {
    [C_ALLREDUCE] = {"allreduce", "all_reduce", "sum"},
    [C_REDUCE_SCATTER] = {"reduce_scatter", "reducescatter", "sum"},
    [C_ALLGATHER] = {"allgather", "all_gather", "none"},
    [C_BROADCAST] = {"broadcast", "bcast", "none"},
    [C_REDUCE] = {"reduce", "reduce", "sum"},
};

static int g_rank, g_nranks;

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s COLLECTIVE [options]\n"
            "  COLLECTIVE: allreduce | reduce_scatter | allgather | broadcast | reduce\n"
            "  -b SIZE   smallest size in bytes (K/M/G suffixes = 2^10/2^20/2^30; default 32M)\n"
            "  -e SIZE   largest size in bytes (default 32M)\n"
            "  -f N      multiply the size by N each step (default 1 = use -i)\n"
            "  -i SIZE   add SIZE bytes each step when -f is 1 (default 1M)\n"
            "  -n N      timed iterations per size (default 20)\n"
            "  -w N      warm-up iterations per size (default 5)\n"
            "  -c 0|1    check results once per size (default 1)\n"
            "  -r ROOT   root rank for broadcast and reduce (default 0)\n"
            "  -d float  data type (only float)\n"
            "  -o sum    reduction (only sum)\n"
            "  -h        this help\n"
            "Sizes, time, algbw, busbw and #wrong are defined as in nccl-tests; see the head of mpi_bench.c.\n",
            prog);
}

static void die0(const char *fmt, const char *arg) {
    if (g_rank == 0) {
        fprintf(stderr, "mpi_bench: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\n");
    }
    MPI_Finalize();
    exit(2);
}

/* "8", "64K", "256M", "1G" (optionally followed by B) -> bytes; -1 when malformed. */
static long long parse_size(const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0) return -1;
    long long mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1LL << 10; end++; break;
    case 'M': mul = 1LL << 20; end++; break;
    case 'G': mul = 1LL << 30; end++; break;
    default: break;
    }
    if (toupper((unsigned char)*end) == 'B') end++;
    if (*end) return -1;
    if (v > (1LL << 62) / mul) return -1;
    return v * mul;
}

static long parse_int(const char *s, const char *flag) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0) die0("bad value for %s", flag);
    return v;
}

/* Test data: small integers, so every sum is exact whatever order MPI adds in. */
static inline float val(int rank, size_t i) { return (float)((int)(((size_t)rank * 13u + 5u + i * 7u) % 31u) - 15); }

static float sum_val(size_t i) {
    float s = 0;
    for (int q = 0; q < g_nranks; q++) s += val(q, i);
    return s;
}

static void fill(float *buf, size_t n, int rank, size_t first) {
    for (size_t i = 0; i < n; i++) buf[i] = val(rank, first + i);
}

static void poison(float *buf, size_t n) {
    for (size_t i = 0; i < n; i++) buf[i] = -1.0e30f;
}

/* One call. count = elements per rank block for allgather / reduce_scatter, total elements otherwise. */
static void run_once(enum coll c, int inplace, float *send, float *recv, size_t count, int root) {
    int n = (int)count;
    switch (c) {
    case C_ALLREDUCE:
        MPI_Allreduce(inplace ? MPI_IN_PLACE : send, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case C_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : send, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case C_ALLGATHER:
        if (inplace)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, MPI_FLOAT, MPI_COMM_WORLD);
        else
            MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case C_BROADCAST:
        MPI_Bcast(recv, n, MPI_FLOAT, root, MPI_COMM_WORLD);
        break;
    case C_REDUCE:
        if (!inplace)
            MPI_Reduce(send, recv, n, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
        else if (g_rank == root)
            MPI_Reduce(MPI_IN_PLACE, recv, n, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
        else /* NCCL's in-place: sendbuff == recvbuff; MPI ignores recvbuf off the root */
            MPI_Reduce(recv, send, n, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
        break;
    }
}

/* Put the input of one call in place (what the timed loop and the check both start from). */
static void prepare(enum coll c, int inplace, float *send, float *recv, size_t count, int root) {
    size_t total = (c == C_ALLGATHER || c == C_REDUCE_SCATTER) ? count * (size_t)g_nranks : count;
    switch (c) {
    case C_ALLREDUCE:
    case C_REDUCE:
        poison(recv, count);
        fill(inplace ? recv : send, count, g_rank, 0);
        break;
    case C_REDUCE_SCATTER:
        poison(recv, total);
        fill(inplace ? recv : send, total, g_rank, 0);
        break;
    case C_ALLGATHER:
        poison(recv, total);
        if (inplace)
            fill(recv + (size_t)g_rank * count, count, g_rank, 0);
        else
            fill(send, count, g_rank, 0);
        break;
    case C_BROADCAST:
        if (g_rank == root)
            fill(recv, count, root, 0);
        else
            poison(recv, count);
        break;
    }
}

/* Wrong elements on this rank after one call on prepare()d data. */
static long long count_wrong(enum coll c, const float *recv, size_t count, int root) {
    long long wrong = 0;
    switch (c) {
    case C_ALLREDUCE:
        for (size_t i = 0; i < count; i++) wrong += recv[i] != sum_val(i);
        break;
    case C_REDUCE:
        if (g_rank == root)
            for (size_t i = 0; i < count; i++) wrong += recv[i] != sum_val(i);
        break;
    case C_REDUCE_SCATTER:
        for (size_t j = 0; j < count; j++) wrong += recv[j] != sum_val((size_t)g_rank * count + j);
        break;
    case C_ALLGATHER:
        for (int q = 0; q < g_nranks; q++)
            for (size_t j = 0; j < count; j++) wrong += recv[(size_t)q * count + j] != val(q, j);
        break;
    case C_BROADCAST:
        for (size_t i = 0; i < count; i++) wrong += recv[i] != val(root, i);
        break;
    }
    return wrong;
}

/* nccl-tests prints times with 2, 1 or 0 decimals so the column stays 7 characters wide. */
static void fmt_time(char *out, size_t len, double us) {
    if (us >= 10000.0)
        snprintf(out, len, "%7.0f", us);
    else if (us >= 100.0)
        snprintf(out, len, "%7.1f", us);
    else
        snprintf(out, len, "%7.2f", us);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_nranks);

    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        if (g_rank == 0) usage(argc < 2 ? stderr : stdout, argv[0]);
        MPI_Finalize();
        return argc < 2 ? 2 : 0;
    }
    int coll = -1;
    for (int k = 0; k < (int)(sizeof COLLS / sizeof COLLS[0]); k++)
        if (!strcmp(argv[1], COLLS[k].name) || !strcmp(argv[1], COLLS[k].alias)) coll = k;
    if (coll < 0) die0("unknown collective '%s' (allreduce, reduce_scatter, allgather, broadcast, reduce)", argv[1]);

    long long minb = 32LL << 20, maxb = 32LL << 20, stepb = 1LL << 20;
    long factor = 1, iters = 20, warmup = 5, check = 1, root = 0;
    for (int a = 2; a < argc; a++) {
        const char *f = argv[a];
        if (!strcmp(f, "-h")) {
            if (g_rank == 0) usage(stdout, argv[0]);
            MPI_Finalize();
            return 0;
        }
        if (f[0] != '-' || !f[1] || f[2] || a + 1 >= argc) die0("bad argument '%s' (try -h)", f);
        const char *v = argv[++a];
        switch (f[1]) {
        case 'b': if ((minb = parse_size(v)) < 0) die0("bad size '%s' for -b", v); break;
        case 'e': if ((maxb = parse_size(v)) < 0) die0("bad size '%s' for -e", v); break;
        case 'i': if ((stepb = parse_size(v)) <= 0) die0("bad size '%s' for -i", v); break;
        case 'f': factor = parse_int(v, "-f"); break;
        case 'n': iters = parse_int(v, "-n"); break;
        case 'w': warmup = parse_int(v, "-w"); break;
        case 'c': check = parse_int(v, "-c"); break;
        case 'r': root = parse_int(v, "-r"); break;
        case 'd': if (strcmp(v, "float") && strcmp(v, "float32")) die0("only -d float is supported, not '%s'", v); break;
        case 'o': if (strcmp(v, "sum")) die0("only -o sum is supported, not '%s'", v); break;
        default: die0("unknown option '%s' (try -h)", f);
        }
    }
    if (iters < 1) die0("%s", "-n must be at least 1");
    if (factor < 1) die0("%s", "-f must be at least 1");
    if (minb > maxb) die0("%s", "-b is larger than -e");
    if (root >= g_nranks) die0("%s", "-r is not a rank");
    if (maxb / 4 > INT32_MAX) die0("%s", "-e too large: MPI counts are int");

    const enum coll c = (enum coll)coll;
    const int blocked = (c == C_ALLGATHER || c == C_REDUCE_SCATTER);
    const int rootcol = (c == C_BROADCAST || c == C_REDUCE) ? (int)root : -1;

    /* Every collective here fits in two buffers of maxb bytes each. */
    size_t maxelems = (size_t)(maxb / 4) + 16;
    float *send = NULL, *recv = NULL;
    if (posix_memalign((void **)&send, 4096, maxelems * 4) || posix_memalign((void **)&recv, 4096, maxelems * 4)) {
        fprintf(stderr, "mpi_bench: rank %d: cannot allocate 2 x %zu bytes\n", g_rank, maxelems * 4);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send, 0, maxelems * 4); /* touch every page before timing */
    memset(recv, 0, maxelems * 4);

    if (g_rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        for (char *p = lib; *p; p++)
            if (*p == '\t') *p = ' ';
        char *comma = strchr(lib, ',');
        if (comma && comma - lib < 60) *comma = 0;
        printf("# mpi_bench %s (%s)  nranks %d\n", COLLS[c].name, lib, g_nranks);
        printf("# minBytes %lld maxBytes %lld step: %lld(%s) warmup iters: %ld iters: %ld validation: %ld\n", minb,
               maxb, factor > 1 ? (long long)factor : stepb, factor > 1 ? "factor" : "bytes", warmup, iters, check);
        printf("#\n# Using ranks\n");
        fflush(stdout);
    }
    {
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        char line[160];
        snprintf(line, sizeof line, "#  Rank %2d Pid %6d on %10s\n", g_rank, (int)getpid(), host);
        char *all = g_rank == 0 ? malloc(sizeof line * (size_t)g_nranks) : NULL;
        MPI_Gather(line, sizeof line, MPI_CHAR, all, sizeof line, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (g_rank == 0) {
            for (int q = 0; q < g_nranks; q++) fputs(all + (size_t)q * sizeof line, stdout);
            free(all);
        }
    }
    if (g_rank == 0) {
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
               "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop",
               "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "", "",
               "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
        fflush(stdout);
    }

    double busfactor = 1.0;
    if (c == C_ALLREDUCE) busfactor = 2.0 * (g_nranks - 1) / g_nranks;
    if (blocked) busfactor = (double)(g_nranks - 1) / g_nranks;

    /* Like nccl-tests, warm up once at the smallest size before the sweep, so the first row does not carry the
     * library's first-call costs (connection set-up, algorithm selection); every size then warms up again. */
    {
        size_t e0 = (size_t)minb / 4, c0 = blocked ? e0 / (size_t)g_nranks / 4 * 4 : e0;
        for (int inplace = 0; inplace < 2; inplace++) {
            prepare(c, inplace, send, recv, c0, (int)root);
            for (long k = 0; k < warmup + 5; k++) run_once(c, inplace, send, recv, c0, (int)root);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }

    double bw_sum = 0;
    int bw_count = 0;
    long long wrong_total = 0;
    for (long long size = minb; size <= maxb;) {
        size_t elems = (size_t)size / 4;
        /* argument passed to MPI; per-rank blocks are whole multiples of 16 bytes, as in nccl-tests */
        size_t count = blocked ? elems / (size_t)g_nranks / 4 * 4 : elems;
        size_t total = blocked ? count * (size_t)g_nranks : count;
        long long bytes = (long long)total * 4;
        double t_us[2];
        long long wrong[2] = {-1, -1};
        for (int inplace = 0; inplace < 2; inplace++) {
            prepare(c, inplace, send, recv, count, (int)root);
            for (long k = 0; k < warmup; k++) run_once(c, inplace, send, recv, count, (int)root);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (long k = 0; k < iters; k++) run_once(c, inplace, send, recv, count, (int)root);
            double dt = (MPI_Wtime() - t0) / (double)iters, dtmax = 0;
            MPI_Allreduce(&dt, &dtmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            t_us[inplace] = dtmax * 1e6;
            if (check) {
                prepare(c, inplace, send, recv, count, (int)root);
                MPI_Barrier(MPI_COMM_WORLD);
                run_once(c, inplace, send, recv, count, (int)root);
                long long w = count_wrong(c, recv, count, (int)root);
                MPI_Allreduce(&w, &wrong[inplace], 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
                wrong_total += wrong[inplace];
            }
        }
        if (g_rank == 0) {
            printf("%12lld  %12zu  %8s  %6s  %6d", bytes, count, "float", COLLS[c].opname, rootcol);
            for (int k = 0; k < 2; k++) {
                char ts[32], ws[32];
                fmt_time(ts, sizeof ts, t_us[k]);
                double algbw = t_us[k] > 0 ? (double)bytes / 1e3 / t_us[k] : 0; /* bytes/us/1e3 = GB/s */
                double busbw = algbw * busfactor;
                if (check)
                    snprintf(ws, sizeof ws, "%5lld", wrong[k]);
                else
                    snprintf(ws, sizeof ws, "%5s", "N/A");
                printf("  %s  %6.2f  %6.2f  %s", ts, algbw, busbw, ws);
                bw_sum += busbw;
                bw_count++;
            }
            printf("\n");
            fflush(stdout);
        }
        if (factor > 1) {
            if (size == 0) break;
            size *= factor;
        } else {
            size += stepb;
        }
    }
    if (g_rank == 0) {
        printf("# Out of bounds values : %lld %s\n", check ? wrong_total : 0LL, wrong_total ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n#\n", bw_count ? bw_sum / bw_count : 0.0);
        fflush(stdout);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return wrong_total ? 1 : 0;
}

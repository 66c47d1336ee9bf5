/*
 * shm_limit.c — what shared memory on this host can do for a collective: the denominator of bench/compare's
 * "% of limit" column.
 *
 *   shm_limit [--op allreduce|reduce_scatter|allgather|all] [-np N] [-b 1K] [-e 256M] [-f 2] [-t 0.05] [-r 3]
 *
 * N processes (fork) share one mapping that holds every rank's input and every rank's output.
 * No messages, no slots, no handshakes beyond one barrier per phase: each rank reads its peers' inputs in place,
 * which is the fewest passes over the data a host can make, so no library that keeps the user's buffers private can
 * beat these numbers on this machine (it would need at least one more copy).
 *
 *   all-reduce     rank i sums block i of all N inputs, in 32 KiB pieces, into its own output and copies each
 *                  piece, still in cache, into every other rank's output: every input is read once and every
 *                  output written once, with one barrier. (A first version reduced into a shared result and had
 *                  every rank copy it out after a barrier: one pass more, and zccl's registered path beat it.)
 *   reduce_scatter rank i sums slice i of all N inputs into its own output.
 *   allgather      rank i copies all N input blocks into its own output.
 *
 * The loops are the fastest this file can write portably: 32-byte (AVX2) or 64-byte (AVX-512F) vector loads
 * chosen at run time, four independent accumulators, and non-temporal stores once the bytes a rank writes exceed
 * half of its last-level cache share (they skip the read-for-ownership of lines nobody reads again soon).
 *
 * Sizes are nccl-tests sizes (all-reduce: the vector; reduce_scatter and allgather: the total over ranks) and
 * busbw uses nccl-tests' factors: 2(N-1)/N for all-reduce, (N-1)/N for the others. Every buffer is written before
 * timing (no page fault is timed); iterations per measurement double until one takes -t seconds; the best of -r
 * measurements is printed (least disturbed by other processes), and beside it rank 0's fastest single iteration:
 * NOT a limit (when the other ranks are ahead, rank 0 passes the barrier at once and the iteration shows only its
 * own share of the work), only a hint of what a loaded machine's quiet moments allow. The result of the last iteration is checked
 * against a scalar reference on every rank: a wrong loop fails loudly instead of printing a fast number.
 * Output: '#' comment lines, then rows "op  size  time(us)  busbw(GB/s)  min_time(us)  min_busbw(GB/s)".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <errno.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { OP_AR, OP_RS, OP_AG, OP_N };
static const char *op_names[OP_N] = {"allreduce", "reduce_scatter", "allgather"};

typedef struct {
    _Alignas(64) volatile uint32_t count;
    _Alignas(64) volatile uint32_t sense;
    _Alignas(64) volatile uint32_t failed;
    _Alignas(64) volatile long reps; /* rank 0 decides how many iterations the next measurement runs */
    _Alignas(64) volatile uint32_t stop; /* rank 0: this size has its measurements */
} ctl_t;

static ctl_t *ctl;
static int nranks;
static long barriers_passed; /* this process's barriers in the current op, for the deadline's message */
static int my_rank;
static int oversubscribed; /* more ranks than CPUs: yield while waiting, or the waiter steals the worker's core */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { BARRIER_DEADLINE_S = 20 };

/* Sense-reversing barrier on one shared counter. */
static void barrier(uint32_t *local_sense) {
    uint32_t s = *local_sense ^= 1u;
    barriers_passed++;
    if (__atomic_add_fetch(&ctl->count, 1, __ATOMIC_ACQ_REL) == (uint32_t)nranks) {
        __atomic_store_n(&ctl->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctl->sense, s, __ATOMIC_RELEASE);
        return;
    }
    double t0 = 0;
    for (unsigned spin = 0; __atomic_load_n(&ctl->sense, __ATOMIC_ACQUIRE) != s; spin++) {
        if (ctl->failed) _exit(3);
        if ((spin & 1023) == 1023) { /* a deadline: a rank out of step names itself instead of hanging */
            if (t0 == 0) t0 = now();
            else if (now() - t0 > BARRIER_DEADLINE_S) {
                fprintf(stderr, "shm_limit: rank %d waited %d s at its barrier %ld of this op (%u of %d ranks arrived): "
                        "a rank died or the ranks are out of step\n", my_rank, BARRIER_DEADLINE_S, barriers_passed,
                        __atomic_load_n(&ctl->count, __ATOMIC_RELAXED), nranks);
                ctl->failed = 1;
                _exit(4);
            }
        }
        if (oversubscribed || (spin & 1023) == 1023) sched_yield();
        else _mm_pause();
    }
}

/* ---- kernels: dst[k] = sum over i of src[i][k], k < n floats (n a multiple of 16 where called) ---- */

__attribute__((target("avx512f"))) static void sum_avx512(float *dst, float *const *src, int ns, size_t n, int nt) {
    size_t k = 0;
    for (; k + 64 <= n; k += 64) {
        __m512 a0 = _mm512_loadu_ps(src[0] + k), a1 = _mm512_loadu_ps(src[0] + k + 16);
        __m512 a2 = _mm512_loadu_ps(src[0] + k + 32), a3 = _mm512_loadu_ps(src[0] + k + 48);
        for (int i = 1; i < ns; i++) {
            a0 = _mm512_add_ps(a0, _mm512_loadu_ps(src[i] + k));
            a1 = _mm512_add_ps(a1, _mm512_loadu_ps(src[i] + k + 16));
            a2 = _mm512_add_ps(a2, _mm512_loadu_ps(src[i] + k + 32));
            a3 = _mm512_add_ps(a3, _mm512_loadu_ps(src[i] + k + 48));
        }
        if (nt) {
            _mm512_stream_ps(dst + k, a0); _mm512_stream_ps(dst + k + 16, a1);
            _mm512_stream_ps(dst + k + 32, a2); _mm512_stream_ps(dst + k + 48, a3);
        } else {
            _mm512_storeu_ps(dst + k, a0); _mm512_storeu_ps(dst + k + 16, a1);
            _mm512_storeu_ps(dst + k + 32, a2); _mm512_storeu_ps(dst + k + 48, a3);
        }
    }
    for (; k < n; k++) {
        float a = src[0][k];
        for (int i = 1; i < ns; i++) a += src[i][k];
        dst[k] = a;
    }
}

__attribute__((target("avx2"))) static void sum_avx2(float *dst, float *const *src, int ns, size_t n, int nt) {
    size_t k = 0;
    for (; k + 32 <= n; k += 32) {
        __m256 a0 = _mm256_loadu_ps(src[0] + k), a1 = _mm256_loadu_ps(src[0] + k + 8);
        __m256 a2 = _mm256_loadu_ps(src[0] + k + 16), a3 = _mm256_loadu_ps(src[0] + k + 24);
        for (int i = 1; i < ns; i++) {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(src[i] + k));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(src[i] + k + 8));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(src[i] + k + 16));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(src[i] + k + 24));
        }
        if (nt) {
            _mm256_stream_ps(dst + k, a0); _mm256_stream_ps(dst + k + 8, a1);
            _mm256_stream_ps(dst + k + 16, a2); _mm256_stream_ps(dst + k + 24, a3);
        } else {
            _mm256_storeu_ps(dst + k, a0); _mm256_storeu_ps(dst + k + 8, a1);
            _mm256_storeu_ps(dst + k + 16, a2); _mm256_storeu_ps(dst + k + 24, a3);
        }
    }
    for (; k < n; k++) {
        float a = src[0][k];
        for (int i = 1; i < ns; i++) a += src[i][k];
        dst[k] = a;
    }
}

static void sum_scalar(float *dst, float *const *src, int ns, size_t n, int nt) {
    (void)nt;
    for (size_t k = 0; k < n; k++) {
        float a = src[0][k];
        for (int i = 1; i < ns; i++) a += src[i][k];
        dst[k] = a;
    }
}

/* Copy with non-temporal stores (dst 64-byte aligned): the stream of a large all-gather. */
__attribute__((target("avx2"))) static void copy_nt_avx2(void *dst, const void *src, size_t bytes) {
    size_t k = 0;
    char *d = dst;
    const char *s = src;
    for (; k + 128 <= bytes; k += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + k)), b = _mm256_loadu_si256((const __m256i *)(s + k + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + k + 64)), e = _mm256_loadu_si256((const __m256i *)(s + k + 96));
        _mm256_stream_si256((__m256i *)(d + k), a); _mm256_stream_si256((__m256i *)(d + k + 32), b);
        _mm256_stream_si256((__m256i *)(d + k + 64), c); _mm256_stream_si256((__m256i *)(d + k + 96), e);
    }
    memcpy(d + k, s + k, bytes - k);
}

typedef void (*sum_fn)(float *, float *const *, int, size_t, int);
static sum_fn sum = sum_scalar;
static int have_avx2;
static size_t nt_from = 1u << 20; /* bytes written per rank per pass from which stores are non-temporal */

static void copy(void *dst, const void *src, size_t bytes) {
    if (have_avx2 && bytes >= nt_from && ((uintptr_t)dst & 63) == 0) {
        copy_nt_avx2(dst, src, bytes);
        _mm_sfence();
    } else {
        memcpy(dst, src, bytes);
    }
}

/* ---- the shapes ---- */

typedef struct {
    size_t cap;  /* bytes per buffer (largest size, rounded) */
    char *in;    /* nranks inputs */
    char *out;   /* nranks outputs */
} bufs_t;

static float *in_of(const bufs_t *b, int r) { return (float *)(b->in + (size_t)r * b->cap); }
static float *out_of(const bufs_t *b, int r) { return (float *)(b->out + (size_t)r * b->cap); }

#define ZMIN(a, b) ((a) < (b) ? (a) : (b))

/* Elements of rank r's block when n elements are split in nranks blocks of a multiple of 16 elements. */
static void block(size_t n, int r, size_t *off, size_t *len) {
    size_t per = (n / (size_t)nranks + 15) / 16 * 16;
    *off = ZMIN((size_t)r * per, n);
    *len = ZMIN(per, n - *off);
}

static void one_iteration(int op, const bufs_t *b, int me, size_t n, uint32_t *sense) {
    float *srcs[64];
    size_t off, len;
    if (op == OP_AG) { /* n = elements per rank's block */
        for (int r = 0; r < nranks; r++) copy(out_of(b, me) + (size_t)r * n, in_of(b, r), n * sizeof(float));
        barrier(sense);
        return;
    }
    block(n, me, &off, &len);
    for (int r = 0; r < nranks; r++) srcs[r] = in_of(b, r) + off;
    if (op == OP_RS) {
        sum(out_of(b, me), srcs, nranks, len, len * sizeof(float) >= nt_from);
        barrier(sense);
        return;
    }
    /* All-reduce, pushed: block `me` is summed in cache-sized pieces into this rank's own output and each piece is
     * copied at once, still in cache, into every other rank's output — one read of the inputs, one write of each
     * output, and one barrier. */
    const size_t piece = 8192; /* floats: 32 KiB */
    for (size_t k = 0; k < len; k += piece) {
        const size_t c = ZMIN(piece, len - k);
        float *mine = out_of(b, me) + off + k;
        for (int r = 0; r < nranks; r++) srcs[r] = in_of(b, r) + off + k;
        sum(mine, srcs, nranks, c, 0);
        for (int r = 0; r < nranks; r++)
            if (r != me) memcpy(out_of(b, r) + off + k, mine, c * sizeof(float));
    }
    barrier(sense);
}

/* Checks rank me's output of the last iteration against a scalar sum; returns the number of wrong elements. */
static size_t check(int op, const bufs_t *b, int me, size_t n) {
    size_t wrong = 0;
    const float *o = out_of(b, me);
    if (op == OP_AG) {
        for (int r = 0; r < nranks; r++)
            for (size_t k = 0; k < n; k++) wrong += o[(size_t)r * n + k] != in_of(b, r)[k];
        return wrong;
    }
    size_t off = 0, len = n;
    if (op == OP_RS) block(n, me, &off, &len);
    for (size_t k = 0; k < len; k++) {
        float a = 0;
        for (int r = 0; r < nranks; r++) a += in_of(b, r)[off + k];
        wrong += o[k] != a;
    }
    return wrong;
}

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
    if (*end || v > (1LL << 40) / mul) return -1;
    return v * mul;
}

static void usage(FILE *f) {
    fprintf(f, "usage: shm_limit [--op allreduce|reduce_scatter|allgather|all] [-np N] [-b SIZE] [-e SIZE] [-f FACTOR]\n"
               "                 [-t SECONDS] [-r REPEATS]\n"
               "  sizes take K/M/G suffixes (2^10, 2^20, 2^30); defaults --op all -np 2 -b 1K -e 256M -f 2 -t 0.05 -r 3\n");
}

/* One rank's sweep. Rank 0 times; the others follow its iteration counts through the control block. */
static int run_rank(int me, const bufs_t *b, int op, long long minb, long long maxb, long factor, double mintime,
                    long repeats) {
    uint32_t sense = 0;
    barriers_passed = 0;
    my_rank = me;
    for (long long size = minb; size <= maxb; size *= factor) {
        /* nccl-tests sizes: the all-reduce vector; reduce_scatter and allgather: the total over ranks */
        size_t n = (size_t)size / sizeof(float);
        if (op != OP_AR) n = n / (size_t)nranks; /* elements per rank's block */
        if (op == OP_RS) n *= (size_t)nranks;     /* the vector each rank reduces a block of */
        if (n == 0 || (op == OP_RS && n < (size_t)nranks)) continue;
        double best = 1e30, fastest = 1e30;
        long reps = 1, taken = 0;
        one_iteration(op, b, me, n, &sense); /* warm */
        for (;;) {
            if (me == 0) ctl->reps = reps;
            barrier(&sense);
            const long k = ctl->reps;
            double t0 = now();
            double prev = t0;
            for (long i = 0; i < k; i++) {
                one_iteration(op, b, me, n, &sense);
                double t1 = now();
                if (t1 - prev < fastest) fastest = t1 - prev;
                prev = t1;
            }
            double t = prev - t0;
            if (me == 0) {
                /* Double the count until a measurement lasts mintime; then keep the best of `repeats`. */
                if (taken == 0 && t < mintime && reps < (1L << 30)) {
                    reps *= 2;
                } else {
                    taken++;
                    if (t / (double)k < best) best = t / (double)k;
                }
                ctl->stop = taken >= repeats;
            }
            barrier(&sense);
            if (ctl->stop) break;
        }
        size_t wrong = check(op, b, me, n);
        if (wrong) {
            fprintf(stderr, "shm_limit: rank %d: %s of %lld bytes: %zu wrong elements\n", me, op_names[op], size, wrong);
            ctl->failed = 1;
            return 1;
        }
        barrier(&sense);
        if (me == 0) {
            double bus = (op == OP_AR ? 2.0 : 1.0) * (double)(nranks - 1) / (double)nranks;
            printf("%-15s %12lld  %10.3f  %8.2f  %10.3f  %8.2f\n", op_names[op], size, best * 1e6,
                   (double)size / best / 1e9 * bus, fastest * 1e6, (double)size / fastest / 1e9 * bus);
            fflush(stdout);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    long long minb = 1024, maxb = 256LL << 20;
    long factor = 2, repeats = 3;
    double mintime = 0.05;
    int ops[OP_N] = {1, 1, 1};
    nranks = 2;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help")) {
            usage(stdout);
            return 0;
        }
        if (a + 1 >= argc) {
            fprintf(stderr, "shm_limit: '%s' needs a value\n", argv[a]);
            usage(stderr);
            return 2;
        }
        const char *k = argv[a], *v = argv[++a];
        char *end = NULL;
        int bad = 0;
        if (!strcmp(k, "--op")) {
            int all = !strcmp(v, "all"), hit = all;
            for (int o = 0; o < OP_N; o++) {
                ops[o] = all || !strcmp(v, op_names[o]);
                hit |= ops[o];
            }
            bad = !hit;
        } else if (!strcmp(k, "-np") || !strcmp(k, "--np")) {
            nranks = (int)strtol(v, &end, 10);
            bad = *end || nranks < 1 || nranks > 64;
        } else if (!strcmp(k, "-b")) bad = (minb = parse_size(v)) < 4;
        else if (!strcmp(k, "-e")) bad = (maxb = parse_size(v)) < 4;
        else if (!strcmp(k, "-f")) { factor = strtol(v, &end, 10); bad = *end || factor < 2; }
        else if (!strcmp(k, "-r")) { repeats = strtol(v, &end, 10); bad = *end || repeats < 1; }
        else if (!strcmp(k, "-t")) { mintime = strtod(v, &end); bad = *end || !(mintime > 0); }
        else {
            fprintf(stderr, "shm_limit: unknown argument '%s'\n", k);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "shm_limit: bad value '%s' for %s (-np: 1..64; sizes: at least 4 bytes; -f: >= 2)\n", v, k);
            return 2;
        }
    }
    if (minb > maxb) {
        fprintf(stderr, "shm_limit: -b is larger than -e\n");
        return 2;
    }
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
    sum = __builtin_cpu_supports("avx512f") ? sum_avx512 : have_avx2 ? sum_avx2 : sum_scalar;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    oversubscribed = nranks > ncpu;
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc > 0) nt_from = (size_t)llc / (size_t)(2 * (ncpu > 0 ? ncpu : 1)); /* half a core's share of the LLC */
    if (nt_from < (256u << 10)) nt_from = 256u << 10;
    if (nt_from > (8u << 20)) nt_from = 8u << 20; /* VMs report odd LLC sizes (504 MiB); past 8 MiB streams win anyway */

    bufs_t b;
    b.cap = ((size_t)maxb + 4095) / 4096 * 4096 + 4096;
    size_t total = sizeof(ctl_t) + 4096 + 2 * (size_t)nranks * b.cap;
    char *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "shm_limit: cannot map %zu shared bytes for %d ranks up to %lld bytes: %s\n", total, nranks,
                maxb, strerror(errno));
        return 1;
    }
    ctl = (ctl_t *)m;
    b.in = m + 4096 + (sizeof(ctl_t) + 4095) / 4096 * 4096;
    b.out = b.in + (size_t)nranks * b.cap;
    /* Small integers: every partial sum is exact in float, so the check may compare exactly. */
    for (int r = 0; r < nranks; r++) {
        float *p = in_of(&b, r);
        for (size_t k = 0; k < b.cap / sizeof(float); k++) p[k] = (float)((k * 7 + (size_t)r * 13) % 97);
    }
    memset(b.out, 0, (size_t)nranks * b.cap);

    printf("# shm_limit: %d processes reducing straight out of one shared mapping; kernel %s, non-temporal stores from "
           "%zu bytes per rank; best of %ld measurements of >= %.3g s; %ld CPUs online%s\n", nranks,
           sum == sum_avx512 ? "avx512f" : sum == sum_avx2 ? "avx2" : "scalar", nt_from, repeats, mintime, ncpu,
           oversubscribed ? " (oversubscribed: waits yield)" : "");
    printf("# %-13s %12s  %10s  %8s  %10s  %8s\n", "op", "size(B)", "time(us)", "busbw", "r0_min(us)", "r0_min_busbw");
    fflush(stdout);
    pid_t pids[64];
    int rc = 0;
    for (int o = 0; o < OP_N && rc == 0; o++) {
        if (!ops[o]) continue;
        /* The previous op's ranks have exited; its barriers left the sense at 0 or 1 by their count's parity. New
         * ranks start with a local sense of 0, so the shared one starts there too, or the first barrier lets ranks
         * through before the last one arrives and the ranks fall a barrier out of step (a hang seen in CI). */
        ctl->count = 0;
        ctl->sense = 0;
        ctl->stop = 0;
        for (int r = 1; r < nranks; r++) {
            pids[r] = fork();
            if (pids[r] < 0) {
                fprintf(stderr, "shm_limit: fork of rank %d: %s\n", r, strerror(errno));
                ctl->failed = 1;
                for (int q = 1; q < r; q++) kill(pids[q], SIGKILL);
                return 1;
            }
            if (pids[r] == 0) _exit(run_rank(r, &b, o, minb, maxb, factor, mintime, repeats));
        }
        rc |= run_rank(0, &b, o, minb, maxb, factor, mintime, repeats);
        for (int r = 1; r < nranks; r++) {
            int st = 0;
            if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "shm_limit: rank %d failed (%s)\n", r, WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "exit status");
                rc = 1;
            }
        }
    }
    return rc;
}

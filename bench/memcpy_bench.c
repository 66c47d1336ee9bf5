/*
 * memcpy_bench.c — single-core memcpy bandwidth, the reference line for bench/compare.
 *
 *   memcpy_bench [-b 8] [-e 256M] [-f 2] [-i 1M] [-t 0.2] [-r 3]
 *
 * For each size of the sweep (same -b/-e/-f/-i meaning as nccl-tests), copies SIZE bytes from one buffer to another
 * repeatedly. Both buffers are allocated once for the largest size and written before any timing, so no page fault
 * is timed. The number of copies per measurement is doubled until one measurement takes at least -t seconds; the
 * best of -r such measurements is reported (least disturbed by other processes on the machine).
 *
 * GB/s = SIZE / (time of one copy) in 10^9 bytes per second: the bytes moved once, not read+written (a copy reads
 * SIZE and writes SIZE bytes, so the memory traffic is twice this). Small sizes stay in cache and show cache
 * bandwidth. Output: '#' comment lines, then rows "size  time(us)  GB/s".
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    if (*end || v > (1LL << 62) / mul) return -1;
    return v * mul;
}

static void usage(FILE *f) {
    fprintf(f, "usage: memcpy_bench [-b SIZE] [-e SIZE] [-f FACTOR] [-i STEP] [-t SECONDS] [-r REPEATS]\n"
               "  sizes take K/M/G suffixes (2^10, 2^20, 2^30); defaults -b 8 -e 256M -f 2 -t 0.2 -r 3\n");
}

/* Copies n bytes `reps` times; the empty asm tells the compiler the copy is observed, so it is never elided. */
static double time_copies(char *dst, const char *src, size_t n, long reps) {
    double t0 = now();
    for (long k = 0; k < reps; k++) {
        memcpy(dst, src, n);
        __asm__ __volatile__("" : : "r"(dst), "r"(src) : "memory");
    }
    return now() - t0;
}

int main(int argc, char **argv) {
    long long minb = 8, maxb = 256LL << 20, stepb = 1LL << 20;
    long factor = 2, repeats = 3;
    double mintime = 0.2;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help")) {
            usage(stdout);
            return 0;
        }
        if (argv[a][0] != '-' || !argv[a][1] || argv[a][2] || a + 1 >= argc) {
            fprintf(stderr, "memcpy_bench: bad argument '%s'\n", argv[a]);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++a];
        char *end = NULL;
        int bad = 0;
        switch (argv[a - 1][1]) {
        case 'b': bad = (minb = parse_size(v)) < 0; break;
        case 'e': bad = (maxb = parse_size(v)) < 0; break;
        case 'i': bad = (stepb = parse_size(v)) <= 0; break;
        case 'f': factor = strtol(v, &end, 10); bad = *end || factor < 1; break;
        case 'r': repeats = strtol(v, &end, 10); bad = *end || repeats < 1; break;
        case 't': mintime = strtod(v, &end); bad = *end || !(mintime > 0); break;
        default: bad = 1;
        }
        if (bad) {
            fprintf(stderr, "memcpy_bench: bad value '%s' for %s\n", v, argv[a - 1]);
            return 2;
        }
    }
    if (minb > maxb) {
        fprintf(stderr, "memcpy_bench: -b is larger than -e\n");
        return 2;
    }
    size_t cap = (size_t)maxb + 64;
    char *src = NULL, *dst = NULL;
    if (posix_memalign((void **)&src, 4096, cap) || posix_memalign((void **)&dst, 4096, cap)) {
        fprintf(stderr, "memcpy_bench: cannot allocate 2 x %zu bytes\n", cap);
        return 1;
    }
    for (size_t i = 0; i < cap; i++) src[i] = (char)(i * 31u + 7u);
    memset(dst, 0, cap);

    printf("# memcpy_bench: single core, best of %ld measurements of >= %.3g s each\n", repeats, mintime);
    printf("# minBytes %lld maxBytes %lld step: %lld(%s)\n", minb, maxb, factor > 1 ? (long long)factor : stepb,
           factor > 1 ? "factor" : "bytes");
    printf("# %10s  %10s  %8s\n", "size", "time", "bw");
    printf("# %10s  %10s  %8s\n", "(B)", "(us)", "(GB/s)");
    fflush(stdout);
    for (long long size = minb; size <= maxb;) {
        size_t n = (size_t)size;
        long reps = 1;
        time_copies(dst, src, n, 1); /* warm */
        double t;
        while ((t = time_copies(dst, src, n, reps)) < mintime && reps < (1L << 40)) reps *= 2;
        double best = t / (double)reps;
        for (long r = 1; r < repeats; r++) {
            double x = time_copies(dst, src, n, reps) / (double)reps;
            if (x < best) best = x;
        }
        if (memcmp(dst, src, n) != 0) {
            fprintf(stderr, "memcpy_bench: copy of %zu bytes is wrong\n", n);
            return 1;
        }
        printf("%12lld  %10.3f  %8.2f\n", size, best * 1e6, best > 0 ? (double)n / best / 1e9 : 0.0);
        fflush(stdout);
        if (factor > 1) {
            if (size == 0) break;
            size *= factor;
        } else {
            size += stepb;
        }
    }
    free(src);
    free(dst);
    return 0;
}

/*
 * copy_distance.c — how fast this CPU copies when the destination's page offset is a few bytes past the source's.
 *
 *   copy_distance [-r 3] [SIZE ...]        (default sizes: 32K 128K 512K 2M)
 *
 * For each size and each distance d (the destination's address minus the source's, modulo 4096: 0, 16, 63, 64, 80,
 * 2048, 4080), copies SIZE bytes from a page-aligned source to a destination d bytes further into its page with
 * glibc's memcpy, with `rep movsb` itself, with zccl_kernel_copy forced to treat this CPU as slow there (its AVX2
 * loop of unaligned loads and aligned stores at distances 1..63, memcpy elsewhere), and with process_vm_readv(2)
 * from a forked child (the kernel's copy, which the shared-memory transport's single copy uses). Best of -r rounds,
 * each long enough to take about 20 ms. Output: a markdown table of GB/s (bytes copied / time).
 *
 * docs/performance.md, "A slow copy distance", quotes its output.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void rep_movsb(void *d, const void *s, size_t n) {
    __asm__ __volatile__("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

/* zccl's copy with the CPU check forced on: its vector loop at distances 1..63, memcpy elsewhere. */
static void zccl_copy(void *d, const void *s, size_t n) { zccl_kernel_copy(d, s, n); }

static pid_t child;
static uint8_t *src;

static void cma_copy(void *dst, const void *from, size_t n) {
    struct iovec l = {dst, n}, r = {(void *)from, n};
    if (process_vm_readv(child, &l, 1, &r, 1, 0) != (ssize_t)n) {
        perror("copy_distance: process_vm_readv");
        exit(1);
    }
}

typedef void (*copy_fn)(void *, const void *, size_t);

static void memcpy_wrap(void *d, const void *s, size_t n) { memcpy(d, s, n); }

static double rate(copy_fn f, uint8_t *d, const uint8_t *s, size_t n, int rounds) {
    double best = 0;
    for (int r = 0; r < rounds; r++) {
        long iters = 1;
        for (;;) {
            const double t0 = now();
            for (long i = 0; i < iters; i++) {
                f(d, s, n);
                __asm__ __volatile__("" : : "r"(d) : "memory");
            }
            const double t = now() - t0;
            if (t >= 0.02) {
                const double v = (double)n * (double)iters / t / 1e9;
                if (v > best) best = v;
                break;
            }
            iters *= 2;
        }
    }
    return best;
}

static size_t parse_size(const char *a) {
    char *end;
    double v = strtod(a, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    else if (*end != 0) {
        fprintf(stderr, "copy_distance: bad size '%s' (a number, optionally with K or M)\n", a);
        exit(2);
    }
    return (size_t)v;
}

int main(int argc, char **argv) {
    int rounds = 3, nsizes = 0;
    size_t sizes[16];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: copy_distance [-r ROUNDS] [SIZE ...]\n");
            return 0;
        } else if (nsizes < 16) sizes[nsizes++] = parse_size(argv[i]);
    }
    if (!nsizes) sizes[0] = 32 << 10, sizes[1] = 128 << 10, sizes[2] = 512 << 10, sizes[3] = 2 << 20, nsizes = 4;
    if (!__builtin_cpu_supports("avx2")) {
        printf("copy_distance: this CPU has no AVX2: zccl_kernel_copy is memcpy here, nothing to compare\n");
        return 0;
    }
    zccl_kernel_rep_movsb_force(1);
    size_t maxn = 0;
    for (int k = 0; k < nsizes; k++) maxn = sizes[k] > maxn ? sizes[k] : maxn;
    src = aligned_alloc(4096, maxn + 8192);
    uint8_t *dst = aligned_alloc(4096, maxn + 8192);
    if (!src || !dst) return 1;
    memset(src, 1, maxn + 8192);
    memset(dst, 2, maxn + 8192);
    int p[2];
    if (pipe(p) != 0) return 1;
    child = fork();
    if (child == 0) { /* holds the source for process_vm_readv until the parent is done */
        char c;
        close(p[1]);
        (void)!read(p[0], &c, 1);
        _exit(0);
    }
    close(p[0]);
    const size_t dists[] = {0, 16, 63, 64, 80, 2048, 4080};
    printf("| size | distance (B) | memcpy (GB/s) | rep movsb (GB/s) | zccl_kernel_copy (GB/s) | process_vm_readv (GB/s) |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < nsizes; k++)
        for (size_t j = 0; j < sizeof dists / sizeof dists[0]; j++) {
            const size_t n = sizes[k];
            uint8_t *d = dst + dists[j];
            printf("| %zu KiB | %zu | %.1f | %.1f | %.1f | %.1f |\n", n >> 10, dists[j], rate(memcpy_wrap, d, src, n, rounds),
                   rate(rep_movsb, d, src, n, rounds), rate(zccl_copy, d, src, n, rounds),
                   rate(cma_copy, d, src, n, rounds));
            fflush(stdout);
        }
    close(p[1]);
    waitpid(child, NULL, 0);
    return 0;
}

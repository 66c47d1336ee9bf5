/*
 * quant_block.c — the measurement behind ZCCL_QUANT_BLOCK's default (docs/zero.md, "Choosing B"): for each block
 * size B and wire format, the wire bytes per element, the error of one quantization on two kinds of data (Gaussian,
 * and Gaussian with 0.1% outliers 50x larger, as gradients have) as RMS error / RMS value, and the encode + decode
 * speed of one core in GB/s of float32 input. Single process, no communicator.
 *
 *   build/bench/quant_block [--elems N] [--reps R]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "quant.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static double uni(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static double gauss(void) { return sqrt(-2.0 * log(uni())) * cos(6.283185307179586 * uni()); }

static double rel_rms_error(zccl_wire_t w, const float *x, size_t n, size_t B, uint8_t *wire, float *y) {
    zccl__quant_encode(w, x, ZCCL_FLOAT32, n, B, wire);
    zccl__quant_decode(w, wire, n, B, y, ZCCL_FLOAT32);
    double e = 0, v = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        v += (double)x[i] * x[i];
    }
    return sqrt(e / v);
}

int main(int argc, char **argv) {
    size_t n = 1 << 22;
    int reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--elems")) n = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    float *g = malloc(n * sizeof *g), *o = malloc(n * sizeof *o), *y = malloc(n * sizeof *y);
    uint8_t *wire = malloc(zccl__quant_bytes(ZCCL_WIRE_INT8, n, 8));
    if (!g || !o || !y || !wire) return 1;
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)gauss();
        o[i] = uni() < 0.001 ? (float)(50.0 * gauss()) : g[i];
    }
    const zccl_wire_t wires[] = {ZCCL_WIRE_INT8, ZCCL_WIRE_INT4, ZCCL_WIRE_FP8E4M3, ZCCL_WIRE_FP8E5M2};
    const size_t blocks[] = {32, 64, 128, 256, 512, 1024, 4096};
    printf("# %zu float32 elements, %d reps; error = RMS(decoded - x) / RMS(x)\n", n, reps);
    printf("%-8s %6s %12s %14s %14s %12s\n", "wire", "B", "bytes/elem", "err_gauss", "err_outliers", "enc+dec_GB/s");
    for (size_t wi = 0; wi < 4; wi++)
        for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
            const zccl_wire_t w = wires[wi];
            const size_t B = blocks[bi];
            const double eg = rel_rms_error(w, g, n, B, wire, y), eo = rel_rms_error(w, o, n, B, wire, y);
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = now_s();
                zccl__quant_encode(w, g, ZCCL_FLOAT32, n, B, wire);
                zccl__quant_decode(w, wire, n, B, y, ZCCL_FLOAT32);
                const double t = now_s() - t0;
                best = t < best ? t : best;
            }
            printf("%-8s %6zu %12.4f %14.3e %14.3e %12.2f\n", zccl__quant_name(w), B,
                   (double)zccl__quant_bytes(w, n, B) / (double)n, eg, eo, (double)n * 4 / best / 1e9);
        }
    free(g);
    free(o);
    free(y);
    free(wire);
    return 0;
}

/*
 * bench_data.c — patterns and checks for zccl-bench. See bench_data.h for the value ranges and tolerances.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* signalfd, pipe2, getrandom, prctl */
#endif
#include "bench_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- half / bfloat16 ---- */

uint16_t bench_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u)); /* NaN / Inf */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                              /* >= 65520: Inf */
    if (ax < 0x38800000u) {                                                                /* < 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 0x1p24f)); /* units of 2^-24, nearest even */
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffffu) >> 13));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float bench_half_to_float(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1fu, m = (uint32_t)h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31) x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
    else x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t bench_float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float bench_bf16_to_float(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- pattern ---- */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static inline uint64_t hash_at(uint64_t rseed, size_t idx)
{
    return mix64(rseed + (uint64_t)idx * 0x9e3779b97f4a7c15ULL);
}

/* The small integer rank `rank` contributes for a reduction pattern. */
static inline int64_t red_value(uint64_t h, int op, int uns, int rank)
{
    uint32_t u = (uint32_t)(h >> 32);
    switch (op) {
    case ZCCL_PROD: {
        uint32_t k = u & 3u;
        if (k == 3u) return rank < 8 ? 2 : 1;
        if (k == 2u) return uns ? 1 : -1;
        return 1;
    }
    case ZCCL_MAX:
    case ZCCL_MIN:
        return uns ? (int64_t)(u % 121u) : (int64_t)(u % 121u) - 60;
    default: /* sum, avg */
        return uns ? (int64_t)(u % 9u) : (int64_t)(u % 9u) - 4;
    }
}

static inline uint64_t esize_mask(size_t esize)
{
    return esize >= 8 ? ~0ULL : ((1ULL << (8 * esize)) - 1);
}

/* Bit pattern of the value v in the element type. */
static inline uint64_t encode(const bench_check_t *c, int64_t v)
{
    switch (c->kind) {
    case BK_F16: return bench_float_to_half((float)v);
    case BK_BF16: return bench_float_to_bf16((float)v);
    case BK_F32: {
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, 4);
        return x;
    }
    case BK_F64: {
        double d = (double)v;
        uint64_t x;
        memcpy(&x, &d, 8);
        return x;
    }
    default: return (uint64_t)v & esize_mask(c->esize);
    }
}

static inline uint64_t load_bits(const void *buf, size_t i, size_t esize)
{
    switch (esize) {
    case 1: return ((const uint8_t *)buf)[i];
    case 2: return ((const uint16_t *)buf)[i];
    case 4: return ((const uint32_t *)buf)[i];
    default: return ((const uint64_t *)buf)[i];
    }
}

static inline void store_bits(void *buf, size_t i, size_t esize, uint64_t v)
{
    switch (esize) {
    case 1: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case 2: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case 4: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    default: ((uint64_t *)buf)[i] = v; break;
    }
}

static inline double load_double(const bench_check_t *c, const void *buf, size_t i)
{
    switch (c->kind) {
    case BK_F16: return bench_half_to_float(((const uint16_t *)buf)[i]);
    case BK_BF16: return bench_bf16_to_float(((const uint16_t *)buf)[i]);
    case BK_F32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

/* Rounds x to the element type and back. */
static inline double round_to_type(const bench_check_t *c, double x)
{
    switch (c->kind) {
    case BK_F16: return bench_half_to_float(bench_float_to_half((float)x));
    case BK_BF16: return bench_bf16_to_float(bench_float_to_bf16((float)x));
    case BK_F32: return (double)(float)x;
    default: return x;
    }
}

static inline uint64_t expected_bits(const bench_check_t *c, int rank, size_t idx)
{
    uint64_t h = hash_at(c->rseed[rank], idx);
    if (c->pattern == BP_BITS) return h & esize_mask(c->esize);
    return encode(c, red_value(h, c->pattern, c->kind == BK_UINT, rank));
}

int bench_check_init(bench_check_t *c, zccl_datatype_t dt, int pattern, int nranks, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->dt = dt;
    c->pattern = pattern;
    c->nranks = nranks;
    int p = 0;
    switch (dt) {
    case ZCCL_INT8: c->kind = BK_INT; c->esize = 1; break;
    case ZCCL_UINT8: c->kind = BK_UINT; c->esize = 1; break;
    case ZCCL_INT32: c->kind = BK_INT; c->esize = 4; break;
    case ZCCL_UINT32: c->kind = BK_UINT; c->esize = 4; break;
    case ZCCL_INT64: c->kind = BK_INT; c->esize = 8; break;
    case ZCCL_UINT64: c->kind = BK_UINT; c->esize = 8; break;
    case ZCCL_FLOAT16: c->kind = BK_F16; c->esize = 2; p = 11; break;
    case ZCCL_BFLOAT16: c->kind = BK_BF16; c->esize = 2; p = 8; break;
    case ZCCL_FLOAT32: c->kind = BK_F32; c->esize = 4; p = 24; break;
    default: c->kind = BK_F64; c->esize = 8; p = 53; break;
    }
    c->rseed = malloc((size_t)nranks * sizeof(uint64_t));
    if (!c->rseed) return -1;
    for (int r = 0; r < nranks; r++)
        c->rseed[r] = mix64(seed * 0xd1b54a32d192ed03ULL + (uint64_t)(r + 1) * 0x8cb92ba72f3d8dd7ULL);
    if (p > 0 && pattern != BP_BITS) {
        double maxabs = pattern == ZCCL_PROD ? 256.0 : (pattern == ZCCL_MAX || pattern == ZCCL_MIN) ? 60.0
                                                                                                 : 4.0 * nranks;
        if (maxabs > ldexp(1.0, p)) c->tol_abs = (double)nranks * maxabs * ldexp(1.0, -p);
        if (pattern == ZCCL_AVG) c->tol_rel = ldexp(1.0, 1 - p);
    }
    return 0;
}

void bench_check_free(bench_check_t *c)
{
    free(c->rseed);
    c->rseed = NULL;
}

void bench_fill(const bench_check_t *c, void *buf, int rank, size_t first, size_t count)
{
    for (size_t i = 0; i < count; i++) store_bits(buf, i, c->esize, expected_bits(c, rank, first + i));
}

int64_t bench_verify_copy(const bench_check_t *c, const void *buf, int rank, size_t first, size_t count)
{
    int64_t wrong = 0;
    for (size_t i = 0; i < count; i++)
        wrong += load_bits(buf, i, c->esize) != expected_bits(c, rank, first + i);
    return wrong;
}

int64_t bench_verify_reduce(const bench_check_t *c, const void *buf, size_t first, size_t count)
{
    const int op = c->pattern, n = c->nranks, uns = c->kind == BK_UINT;
    const uint64_t mask = esize_mask(c->esize);
    int64_t wrong = 0;
    if (c->kind == BK_INT || c->kind == BK_UINT) {
        for (size_t i = 0; i < count; i++) {
            size_t j = first + i;
            uint64_t acc = op == ZCCL_PROD ? 1 : 0;
            int64_t m = op == ZCCL_MAX ? INT64_MIN : INT64_MAX;
            for (int r = 0; r < n; r++) {
                int64_t v = red_value(hash_at(c->rseed[r], j), op, uns, r);
                switch (op) {
                case ZCCL_PROD: acc *= (uint64_t)v; break;
                case ZCCL_MAX: if (v > m) m = v; break;
                case ZCCL_MIN: if (v < m) m = v; break;
                default: acc += (uint64_t)v; break;
                }
            }
            if (op == ZCCL_MAX || op == ZCCL_MIN) acc = (uint64_t)m;
            acc &= mask;
            if (op == ZCCL_AVG) {
                if (uns) {
                    acc = acc / (uint64_t)n;
                } else {
                    int64_t s;
                    if (c->esize < 8 && (acc >> (8 * c->esize - 1)) & 1) s = (int64_t)(acc | ~mask); /* sign-extend */
                    else s = (int64_t)acc;
                    acc = (uint64_t)(s / n) & mask;
                }
            }
            wrong += load_bits(buf, i, c->esize) != acc;
        }
        return wrong;
    }
    for (size_t i = 0; i < count; i++) {
        size_t j = first + i;
        double acc = op == ZCCL_PROD ? 1.0 : op == ZCCL_MAX ? -INFINITY : op == ZCCL_MIN ? INFINITY : 0.0;
        for (int r = 0; r < n; r++) {
            double v = (double)red_value(hash_at(c->rseed[r], j), op, 0, r);
            switch (op) {
            case ZCCL_PROD: acc *= v; break;
            case ZCCL_MAX: if (v > acc) acc = v; break;
            case ZCCL_MIN: if (v < acc) acc = v; break;
            default: acc += v; break;
            }
        }
        if (op == ZCCL_AVG) acc /= n;
        double want = round_to_type(c, acc);
        double got = load_double(c, buf, i);
        double tol = c->tol_abs + c->tol_rel * fabs(want);
        wrong += !(fabs(got - want) <= tol); /* NaN counts as wrong */
    }
    return wrong;
}

/*
 * quant.c — encoding and decoding of the block-quantized wire formats (layout and policy: quant.h).
 *
 * Each block is handled in two passes over float32 values: the largest magnitude (an integer maximum over the
 * magnitude bits, which orders non-negative floats and sees NaN and infinity as the largest values), then the codes.
 * Narrow inputs are widened in chunks of CHUNK elements on the stack, so that the format kernels below exist once,
 * for float32, and each is a plain loop without branches that the compiler vectorises (-O3, as kernels/).
 */
#include <math.h>
#include <string.h>
#include "elem_math.h"
#include "quant.h"

#define CHUNK 1024 /* even: an int4 chunk starts on a byte */

/* The format kernels are compiled for AVX2 and for the baseline, picked at load time, as kernels/ does
 * (kernels/kernels_impl.h); -DZQ_CLONES= builds the baseline only. */
#if !defined(ZQ_CLONES) && defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define ZQ_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef ZQ_CLONES
#define ZQ_CLONES
#endif

bool zccl__quant_is_quantized(zccl_wire_t w) {
    return w == ZCCL_WIRE_INT8 || w == ZCCL_WIRE_INT4 || w == ZCCL_WIRE_FP8E4M3 || w == ZCCL_WIRE_FP8E5M2;
}

bool zccl__quant_dtype_ok(zccl_datatype_t dt) {
    return dt == ZCCL_FLOAT32 || dt == ZCCL_FLOAT64 || dt == ZCCL_FLOAT16 || dt == ZCCL_BFLOAT16;
}

const char *zccl__quant_name(zccl_wire_t w) {
    switch (w) {
    case ZCCL_WIRE_FULL: return "full";
    case ZCCL_WIRE_INT8: return "int8";
    case ZCCL_WIRE_INT4: return "int4";
    case ZCCL_WIRE_FP8E4M3: return "fp8e4m3";
    case ZCCL_WIRE_FP8E5M2: return "fp8e5m2";
    default: return "?";
    }
}

float zccl__quant_qmax(zccl_wire_t w) {
    switch (w) {
    case ZCCL_WIRE_INT8: return 127.0f;
    case ZCCL_WIRE_INT4: return 7.0f;
    case ZCCL_WIRE_FP8E4M3: return 448.0f;
    case ZCCL_WIRE_FP8E5M2: return 57344.0f;
    default: return 0.0f;
    }
}

static size_t payload_bytes(zccl_wire_t w, size_t n) { return w == ZCCL_WIRE_INT4 ? n / 2 + (n & 1) : n; }

size_t zccl__quant_bytes(zccl_wire_t w, size_t n, size_t B) {
    if (n == 0) return 0;
    if (B == 0) return SIZE_MAX;
    const size_t nb = n / B + (n % B != 0);
    size_t sc;
    if (!zccl__mul_ok(nb, 4, &sc)) return SIZE_MAX;
    const size_t p = payload_bytes(w, n);
    if (p > SIZE_MAX - 8 || sc > SIZE_MAX - 8 - p) return SIZE_MAX;
    return (sc + p + 7) & ~(size_t)7;
}

/* Bytes of one element of the types the formats take. */
static size_t elem_size(zccl_datatype_t dt) { return dt == ZCCL_FLOAT64 ? 8 : dt == ZCCL_FLOAT32 ? 4 : 2; }

/* ---- widening and narrowing ------------------------------------------------------------------------------- */

void zccl__quant_widen(const void *src, zccl_datatype_t dt, size_t n, float *restrict dst) {
    if (dt == ZCCL_FLOAT32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == ZCCL_FLOAT64) { /* rounded to nearest; beyond float32's range: infinity */
        const double *restrict s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    } else if (dt == ZCCL_FLOAT16) {
        const uint16_t *restrict s = src;
        for (size_t i = 0; i < n; i++) dst[i] = zccl_em_half_to_float(s[i]);
    } else {
        const uint16_t *restrict s = src;
        for (size_t i = 0; i < n; i++) dst[i] = zccl_em_bf16_to_float(s[i]);
    }
}

void zccl__quant_narrow(const float *restrict src, size_t n, zccl_datatype_t dt, void *dst) {
    if (dt == ZCCL_FLOAT32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == ZCCL_FLOAT64) { /* exact */
        double *restrict d = dst;
        for (size_t i = 0; i < n; i++) d[i] = (double)src[i];
    } else if (dt == ZCCL_FLOAT16) {
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++) d[i] = zccl_em_float_to_half(src[i]);
    } else {
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++) d[i] = zccl_em_float_to_bf16(src[i]);
    }
}

/* ---- the format kernels (float32) --------------------------------------------------------------------------- */

/* The largest magnitude's bits: non-negative floats order as integers; NaN and infinity are >= 0x7f800000. */
ZQ_CLONES static uint32_t amax_bits(const float *restrict x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t b = zccl_em_bits32(x[i]) & 0x7fffffffu;
        m = b > m ? b : m;
    }
    return m;
}

/* Clamp to [-q, q], then round to nearest, ties to even: adding and subtracting 1.5 * 2^23 leaves an integer in
 * float32 (|v| <= 127 < 2^22), in the default rounding mode, which zccl never changes. */
static inline float round_clamped(float v, float q) {
    v = v > q ? q : v;
    v = v < -q ? -q : v;
    return (v + 12582912.0f) - 12582912.0f;
}

ZQ_CLONES static void enc_int8(const float *restrict x, size_t n, float s, uint8_t *restrict d) {
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(int8_t)(int32_t)round_clamped(x[i] / s, 127.0f);
}

/* n elements from an even element index: byte k holds elements 2k (low nibble) and 2k+1 (high). */
ZQ_CLONES static void enc_int4(const float *restrict x, size_t n, float s, uint8_t *restrict d) {
    const size_t pairs = n / 2;
    for (size_t k = 0; k < pairs; k++) {
        const int32_t lo = (int32_t)round_clamped(x[2 * k] / s, 7.0f);
        const int32_t hi = (int32_t)round_clamped(x[2 * k + 1] / s, 7.0f);
        d[k] = (uint8_t)((uint32_t)(lo & 15) | ((uint32_t)(hi & 15) << 4));
    }
    if (n & 1) d[pairs] = (uint8_t)((int32_t)round_clamped(x[n - 1] / s, 7.0f) & 15);
}

ZQ_CLONES static void enc_e4m3(const float *restrict x, size_t n, float s, uint8_t *restrict d) {
    for (size_t i = 0; i < n; i++) d[i] = zccl_em_float_to_e4m3(x[i] / s);
}

ZQ_CLONES static void enc_e5m2(const float *restrict x, size_t n, float s, uint8_t *restrict d) {
    for (size_t i = 0; i < n; i++) d[i] = zccl_em_float_to_e5m2(x[i] / s);
}

ZQ_CLONES static void dec_int8(const uint8_t *restrict c, size_t n, float s, float *restrict y) {
    for (size_t i = 0; i < n; i++) y[i] = s * (float)(int8_t)c[i];
}

ZQ_CLONES static void dec_int4(const uint8_t *restrict c, size_t n, float s, float *restrict y) {
    const size_t pairs = n / 2;
    for (size_t k = 0; k < pairs; k++) {
        const int8_t b = (int8_t)c[k];
        y[2 * k] = s * (float)((int8_t)(uint8_t)((uint32_t)c[k] << 4) >> 4);
        y[2 * k + 1] = s * (float)(b >> 4);
    }
    if (n & 1) y[n - 1] = s * (float)((int8_t)(uint8_t)((uint32_t)c[pairs] << 4) >> 4);
}

ZQ_CLONES static void dec_e4m3(const uint8_t *restrict c, size_t n, float s, float *restrict y) {
    for (size_t i = 0; i < n; i++) y[i] = s * zccl_em_e4m3_to_float(c[i]);
}

ZQ_CLONES static void dec_e5m2(const uint8_t *restrict c, size_t n, float s, float *restrict y) {
    for (size_t i = 0; i < n; i++) y[i] = s * zccl_em_e5m2_to_float(c[i]);
}

typedef void (*enc_fn)(const float *, size_t, float, uint8_t *);
typedef void (*dec_fn)(const uint8_t *, size_t, float, float *);

static enc_fn enc_of(zccl_wire_t w) {
    return w == ZCCL_WIRE_INT8 ? enc_int8 : w == ZCCL_WIRE_INT4 ? enc_int4 : w == ZCCL_WIRE_FP8E4M3 ? enc_e4m3 : enc_e5m2;
}

static dec_fn dec_of(zccl_wire_t w) {
    return w == ZCCL_WIRE_INT8 ? dec_int8 : w == ZCCL_WIRE_INT4 ? dec_int4 : w == ZCCL_WIRE_FP8E4M3 ? dec_e4m3 : dec_e5m2;
}

/* Payload byte of element index i (even for int4 chunks). */
static size_t code_off(zccl_wire_t w, size_t i) { return w == ZCCL_WIRE_INT4 ? i / 2 : i; }

/* ---- shards ------------------------------------------------------------------------------------------------- */

void zccl__quant_encode(zccl_wire_t w, const void *src, zccl_datatype_t dt, size_t n, size_t B, uint8_t *dst) {
    if (n == 0) return;
    const size_t es = elem_size(dt), nb = n / B + (n % B != 0);
    uint8_t *pay = dst + 4 * nb;
    const enc_fn enc = enc_of(w);
    const float q = zccl__quant_qmax(w);
    float buf[CHUNK];
    for (size_t b = 0; b < nb; b++) {
        const size_t off = b * B, len = n - off < B ? n - off : B;
        uint32_t m = 0;
        for (size_t c = 0; c < len; c += CHUNK) {
            const size_t k = len - c < CHUNK ? len - c : CHUNK;
            const float *x = (const float *)src + off + c;
            if (dt != ZCCL_FLOAT32) {
                zccl__quant_widen((const char *)src + (off + c) * es, dt, k, buf);
                x = buf;
            }
            const uint32_t mc = amax_bits(x, k);
            m = mc > m ? mc : m;
        }
        const bool bad = m >= 0x7f800000u; /* a NaN or an infinity in the block */
        const float s = bad ? NAN : zccl_em_from_bits32(m) / q;
        memcpy(dst + 4 * b, &s, sizeof s);
        uint8_t *p = pay + code_off(w, off);
        if (bad || s == 0.0f) {
            memset(p, 0, payload_bytes(w, len));
            continue;
        }
        for (size_t c = 0; c < len; c += CHUNK) {
            const size_t k = len - c < CHUNK ? len - c : CHUNK;
            const float *x = (const float *)src + off + c;
            if (dt != ZCCL_FLOAT32) {
                zccl__quant_widen((const char *)src + (off + c) * es, dt, k, buf);
                x = buf;
            }
            enc(x, k, s, p + code_off(w, c));
        }
    }
    const size_t used = 4 * nb + payload_bytes(w, n), total = zccl__quant_bytes(w, n, B);
    memset(dst + used, 0, total - used);
}

/* Decodes block by block, chunk by chunk; `sink` takes each chunk of float32 values. */
static void decode_with(zccl_wire_t w, const uint8_t *src, size_t n, size_t B, void *dst, zccl_datatype_t dt,
                        float *acc) {
    if (n == 0) return;
    const size_t nb = n / B + (n % B != 0), es = elem_size(dt);
    const uint8_t *pay = src + 4 * nb;
    const dec_fn dec = dec_of(w);
    float buf[CHUNK];
    for (size_t b = 0; b < nb; b++) {
        const size_t off = b * B, len = n - off < B ? n - off : B;
        float s;
        memcpy(&s, src + 4 * b, sizeof s);
        const uint8_t *p = pay + code_off(w, off);
        for (size_t c = 0; c < len; c += CHUNK) {
            const size_t k = len - c < CHUNK ? len - c : CHUNK;
            if (!acc && dt == ZCCL_FLOAT32) {
                dec(p + code_off(w, c), k, s, (float *)dst + off + c);
                continue;
            }
            dec(p + code_off(w, c), k, s, buf);
            if (acc) {
                float *restrict a = acc + off + c;
                for (size_t i = 0; i < k; i++) a[i] += buf[i];
            } else {
                zccl__quant_narrow(buf, k, dt, (char *)dst + (off + c) * es);
            }
        }
    }
}

void zccl__quant_decode(zccl_wire_t w, const uint8_t *src, size_t n, size_t B, void *dst, zccl_datatype_t dt) {
    decode_with(w, src, n, B, dst, dt, NULL);
}

void zccl__quant_decode_add(zccl_wire_t w, const uint8_t *src, size_t n, size_t B, float *acc) {
    decode_with(w, src, n, B, NULL, ZCCL_FLOAT32, acc);
}

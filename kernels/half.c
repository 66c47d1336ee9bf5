/*
 * half.c — IEEE binary16 and bfloat16: conversions to and from binary32, and the reduction and scaling kernels
 * that use them.
 *
 * The kernels live here, beside the conversions, because the conversions must be inlined into the loops for GCC
 * to vectorise them, and a static inline function can only be shared with another file through a header.
 *
 * The conversions here are integer and bit manipulation; the only floating-point operations in them are exact
 * (an int-to-float conversion and a multiplication by a power of two, on normal numbers) or a NaN test. So:
 *  - they work on any x86-64, which need not have F16C, and give identical bits in every clone;
 *  - they do not depend on the MXCSR: a process that enables flush-to-zero or denormals-are-zero (as -ffast-math
 *    programs and some training frameworks do) still converts binary16 subnormals exactly, and a changed
 *    rounding mode does not change the narrowing, which is always to nearest-even.
 * With AVX2 every step is one vector instruction, including the per-element variable shift (vpsrlvd) that
 * rounds results into the subnormal range. That is still about 30 instructions per 8 binary16 values, so on CPUs
 * with F16C the binary16 kernels use the hardware conversions of half_f16c.c instead (same results); bfloat16
 * needs little more than a shift and an add, and stays here.
 */
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

/* Alignment-1 element type: the kernels accept any address (see int.c). */
typedef uint16_t zk_u16 __attribute__((aligned(1)));

/* ---------------------------------------------------------------------------------------------------------- */
/* Conversions                                                                                                 */
/*                                                                                                            */
/* Each computes every candidate result without branches and then selects one, so that a vectorised loop can */
/* evaluate all lanes at once; values computed for the cases not selected are discarded, and every shift      */
/* count stays within 0..31 so that those discarded values are still defined C.                               */
/* ---------------------------------------------------------------------------------------------------------- */

/*
 * binary16 -> binary32, exact for every input. NaNs keep their payload and their quiet bit (binary16 bit 9
 * becomes binary32 bit 22), so a signalling NaN widens to a signalling NaN; any arithmetic on it yields a quiet
 * NaN, and narrowing sets the quiet bit.
 */
static inline float zk_half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t mag = h & 0x7fffu;
    /* Normal: moving the fields into place and adding (127 - 15) << 23 rebiases the exponent. */
    const uint32_t normal = (mag << 13) + (112u << 23);
    /* Infinity and NaN: the exponent becomes all ones and the payload moves up unchanged. */
    const uint32_t inf_nan = (mag << 13) | 0x7f800000u;
    /*
     * Subnormal (and zero): the value is mag * 2^-24. The integer converts to float exactly (mag < 2^10) and the
     * product is a normal binary32 (>= 2^-24), so this is exact even with flush-to-zero or denormals-are-zero.
     */
    const uint32_t subnormal = zk_bits32((float)(int32_t)mag * 0x1p-24f);
    const uint32_t r = mag < 0x0400u ? subnormal : mag >= 0x7c00u ? inf_nan : normal;
    return zk_from_bits32(sign | r);
}

/*
 * binary32 -> binary16, round to nearest, ties to even. Magnitudes are compared as signed integers, which is
 * monotonic in the value for non-negative floats and maps straight onto vpcmpgtd.
 */
static inline uint16_t zk_float_to_half(float f)
{
    const uint32_t x = zk_bits32(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const int32_t ax = (int32_t)(x & 0x7fffffffu);
    const uint32_t ux = (uint32_t)ax;

    /*
     * Normal result (2^-14 <= |f| < 65520): rebias the exponent, then drop 13 mantissa bits adding 0xfff plus the
     * lowest kept bit, so that a tie rounds up exactly when the kept part is odd. A carry out of the mantissa
     * correctly bumps the exponent.
     */
    const uint32_t normal = (ux - (112u << 23) + 0x0fffu + ((ux >> 13) & 1u)) >> 13;

    /*
     * Subnormal result (|f| < 2^-14): the result is |f| / 2^-24 rounded to an integer, i.e. the 24-bit
     * significand shifted right by 126 - exponent, at least 14. Shifts of 25 or more give 0 (the significand is
     * below 2^24, so the value is below one half); the count is clamped into 14..31 so that it stays a defined
     * shift for the lanes whose result is discarded. A rounded-up result of 0x400 is the smallest normal, which
     * is the right encoding.
     */
    int32_t shift = 126 - (ax >> 23);
    shift = shift < 14 ? 14 : shift;
    shift = shift > 31 ? 31 : shift;
    const uint32_t sig = (ux & 0x7fffffu) | 0x800000u;
    const uint32_t subnormal =
        (sig + (1u << (shift - 1)) - 1u + ((sig >> shift) & 1u)) >> shift;

    /* NaN: keep the top 10 payload bits and set the quiet bit, so that the result is never mistaken for Inf. */
    const uint32_t nan = 0x7e00u | ((ux >> 13) & 0x03ffu);

    /*
     * 65520 = 0x477ff000 is halfway between 65504 (the largest finite half, odd significand) and 2^16; ties go to
     * the even side, which is beyond the range, so everything from there up is infinity.
     */
    const uint32_t r = ax > 0x7f800000 ? nan : ax >= 0x477ff000 ? 0x7c00u : ax >= 0x38800000 ? normal : subnormal;
    return (uint16_t)(sign | r);
}

/* bfloat16 -> binary32: bfloat16 is the upper half of a binary32, so widening is exact and needs no cases. */
static inline float zk_bf16_to_float(uint16_t h)
{
    return zk_from_bits32((uint32_t)h << 16);
}

/*
 * binary32 -> bfloat16, round to nearest, ties to even: add 0x7fff plus the lowest kept bit and truncate. This is
 * also right for subnormals, and a carry out of the largest finite values gives infinity, as it should. A NaN
 * would round into infinity or the other sign, so it is truncated instead, with the quiet bit set so that its
 * payload cannot truncate to zero. Selecting before the common shift, and testing for NaN with a float compare
 * (one vcmpunordps), keeps the vector loop short: measured 40% faster than selecting between two finished
 * results with an integer range test.
 */
static inline uint16_t zk_float_to_bf16(float f)
{
    const uint32_t x = zk_bits32(f);
    const uint32_t r = f != f ? (x | 0x00400000u) : x + 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(r >> 16);
}

float zccl_half_to_float(uint16_t h)
{
    return zk_half_to_float(h);
}

uint16_t zccl_float_to_half(float f)
{
    return zk_float_to_half(f);
}

float zccl_bf16_to_float(uint16_t h)
{
    return zk_bf16_to_float(h);
}

uint16_t zccl_float_to_bf16(float f)
{
    return zk_float_to_bf16(f);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Kernels                                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */

/*
 * Binary kernel: widen both operands, combine them in float32 (EXPR of x, y and the divisor dv), narrow once.
 * Operands are read before the store, so dst may equal a or b.
 */
#define ZK_BINARY(name, WIDEN, NARROW, EXPR)                                                                    \
    ZK_CLONES static void name(void *dst_, const void *a_, const void *b_, size_t n, float dv)                 \
    {                                                                                                          \
        zk_u16 *d = dst_;                                                                                      \
        const zk_u16 *a = a_;                                                                                  \
        const zk_u16 *b = b_;                                                                                  \
        for (size_t i = 0; i < n; i++) {                                                                       \
            const float x = WIDEN(a[i]);                                                                       \
            const float y = WIDEN(b[i]);                                                                       \
            d[i] = NARROW(EXPR);                                                                               \
        }                                                                                                      \
    }

#define ZK_SCALE(name, WIDEN, NARROW)                                                                           \
    ZK_CLONES static void name(void *dst_, const void *s_, size_t n, float dv)                                 \
    {                                                                                                          \
        zk_u16 *d = dst_;                                                                                      \
        const zk_u16 *s = s_;                                                                                  \
        for (size_t i = 0; i < n; i++)                                                                         \
            d[i] = NARROW(WIDEN(s[i]) / dv);                                                                   \
    }

/*
 * float32's 24-bit significand has at least 2p + 2 bits for both binary16 (p = 11) and bfloat16 (p = 8), which
 * makes the intermediate float32 rounding of a sum or product harmless (Figueroa, "When is double rounding
 * innocuous?", 1995): SUM and PROD are correctly rounded in both formats, exactly as if the exact result were
 * rounded once. The average rounds (a + b) and the quotient in float32 and then narrows, as kernels.h says.
 */
ZK_BINARY(zk_sum_f16, zk_half_to_float, zk_float_to_half, x + y)
ZK_BINARY(zk_prod_f16, zk_half_to_float, zk_float_to_half, x * y)
ZK_BINARY(zk_max_f16, zk_half_to_float, zk_float_to_half, zk_maxf(x, y))
ZK_BINARY(zk_min_f16, zk_half_to_float, zk_float_to_half, zk_minf(x, y))
ZK_BINARY(zk_avg_f16, zk_half_to_float, zk_float_to_half, (x + y) / dv)
ZK_SCALE(zk_scale_f16, zk_half_to_float, zk_float_to_half)

ZK_BINARY(zk_sum_bf16, zk_bf16_to_float, zk_float_to_bf16, x + y)
ZK_BINARY(zk_prod_bf16, zk_bf16_to_float, zk_float_to_bf16, x * y)
ZK_BINARY(zk_max_bf16, zk_bf16_to_float, zk_float_to_bf16, zk_maxf(x, y))
ZK_BINARY(zk_min_bf16, zk_bf16_to_float, zk_float_to_bf16, zk_minf(x, y))
ZK_BINARY(zk_avg_bf16, zk_bf16_to_float, zk_float_to_bf16, (x + y) / dv)
ZK_SCALE(zk_scale_bf16, zk_bf16_to_float, zk_float_to_bf16)

/* The F16C binary16 kernels (half_f16c.c): each returns 0, doing nothing, where F16C is unavailable. */

/* 16-bit floating part of zccl_kernel_reduce(); dt is ZCCL_FLOAT16 or ZCCL_BFLOAT16 and count > 0. */
ZK_HIDDEN void zccl_kernels_reduce_half(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                        zccl_redop_t op, uint32_t divisor)
{
    const int avg = (op == ZCCL_SUM || op == ZCCL_AVG) && divisor > 1;
    /* Exact up to 2^24, far above the 65536-rank limit. */
    const float dv = (float)divisor;

    if (dt == ZCCL_FLOAT16) {
        if (zccl_kernels_reduce_f16c(dst, a, b, n, op, divisor))
            return;
        if (avg)
            zk_avg_f16(dst, a, b, n, dv);
        else if (op == ZCCL_SUM || op == ZCCL_AVG)
            zk_sum_f16(dst, a, b, n, dv);
        else if (op == ZCCL_PROD)
            zk_prod_f16(dst, a, b, n, dv);
        else if (op == ZCCL_MAX)
            zk_max_f16(dst, a, b, n, dv);
        else if (op == ZCCL_MIN)
            zk_min_f16(dst, a, b, n, dv);
    } else if (dt == ZCCL_BFLOAT16) {
        if (avg)
            zk_avg_bf16(dst, a, b, n, dv);
        else if (op == ZCCL_SUM || op == ZCCL_AVG)
            zk_sum_bf16(dst, a, b, n, dv);
        else if (op == ZCCL_PROD)
            zk_prod_bf16(dst, a, b, n, dv);
        else if (op == ZCCL_MAX)
            zk_max_bf16(dst, a, b, n, dv);
        else if (op == ZCCL_MIN)
            zk_min_bf16(dst, a, b, n, dv);
    }
}

/* 16-bit floating part of zccl_kernel_scale(); count > 0 and divisor >= 2. */
ZK_HIDDEN void zccl_kernels_scale_half(void *dst, const void *src, size_t n, zccl_datatype_t dt, uint32_t divisor)
{
    if (dt == ZCCL_FLOAT16) {
        if (!zccl_kernels_scale_f16c(dst, src, n, divisor))
            zk_scale_f16(dst, src, n, (float)divisor);
    }
    else if (dt == ZCCL_BFLOAT16)
        zk_scale_bf16(dst, src, n, (float)divisor);
}

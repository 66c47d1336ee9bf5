/*
 * elem_math.h — the element arithmetic of zccl in one place: conversions between float32 and the narrow floating
 * types (binary16, bfloat16, OCP 8-bit E4M3 and E5M2) and the meaning of each reduction operation on one pair of
 * elements. Every CPU kernel (every kernels/ file) is built from these functions, and a GPU kernel compiled by nvcc can
 * include the same header (each function is then __host__ __device__), so both compute bit-identical results.
 *
 * Rules every function keeps (see docs/kernels.md and docs/groups.md, "fp8"):
 *  - Narrow types are widened to float32 exactly, combined in float32, and narrowed once, rounding to nearest,
 *    ties to even. The conversions are integer bit manipulation, so they do not depend on the MXCSR (flush-to-zero,
 *    rounding mode) and vectorise (every case is computed, then one is selected).
 *  - fp8 narrowing saturates: a finite result beyond the format's range, and an infinity, become the largest finite
 *    value of the same sign (448 for E4M3, 57344 for E5M2), as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ..)
 *    which NCCL's fp8 types use. A NaN stays NaN (E4M3: S.1111.111, E5M2: S.11111.11), keeping its sign.
 *  - MAX and MIN follow fmax/fmin: a NaN operand yields the other operand, and -0 orders below +0.
 * Needs only <stdint.h> and <string.h> (memcpy for the bit casts, which nvcc also accepts in device code). Valid C11
 * and C++11 (no hexadecimal float literals); checked to compile with nvcc for host and device (tests/cuda/elem_math_nvcc.cu).
 */
#ifndef ZCCL_ELEM_MATH_H
#define ZCCL_ELEM_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define ZCCL_EM_FN static inline __host__ __device__
#else
#define ZCCL_EM_FN static inline
#endif

ZCCL_EM_FN uint32_t zccl_em_bits32(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
ZCCL_EM_FN float zccl_em_from_bits32(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }
ZCCL_EM_FN uint64_t zccl_em_bits64(double f) { uint64_t u; memcpy(&u, &f, sizeof u); return u; }
ZCCL_EM_FN double zccl_em_from_bits64(uint64_t u) { double f; memcpy(&f, &u, sizeof f); return f; }

/* ---- binary16 ------------------------------------------------------------------------------------------------ */

/*
 * binary16 -> binary32, exact for every input. NaNs keep their payload and their quiet bit (binary16 bit 9
 * becomes binary32 bit 22), so a signalling NaN widens to a signalling NaN; any arithmetic on it yields a quiet
 * NaN, and narrowing sets the quiet bit.
 */
ZCCL_EM_FN float zccl_em_half_to_float(uint16_t h)
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
    const uint32_t subnormal = zccl_em_bits32((float)(int32_t)mag * 5.9604644775390625e-08f); /* 2^-24 */
    const uint32_t r = mag < 0x0400u ? subnormal : mag >= 0x7c00u ? inf_nan : normal;
    return zccl_em_from_bits32(sign | r);
}

/*
 * Rounds the 24-bit significand `sig` right by `shift` bits (1..31) to nearest, ties to even: adds one less than
 * half a unit of the result plus the lowest kept bit, so that a tie rounds up exactly when the kept part is odd.
 */
ZCCL_EM_FN uint32_t zccl_em_round_shift(uint32_t sig, int32_t shift)
{
    return (sig + (1u << (shift - 1)) - 1u + ((sig >> shift) & 1u)) >> shift;
}

/*
 * binary32 -> binary16, round to nearest, ties to even. Magnitudes are compared as signed integers, which is
 * monotonic in the value for non-negative floats and maps straight onto vpcmpgtd.
 */
ZCCL_EM_FN uint16_t zccl_em_float_to_half(float f)
{
    const uint32_t x = zccl_em_bits32(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const int32_t ax = (int32_t)(x & 0x7fffffffu);
    const uint32_t ux = (uint32_t)ax;

    /* Normal result (2^-14 <= |f| < 65520): rebias the exponent, then drop 13 mantissa bits, rounding. A carry out
     * of the mantissa correctly bumps the exponent. */
    const uint32_t normal = (ux - (112u << 23) + 0x0fffu + ((ux >> 13) & 1u)) >> 13;

    /* Subnormal result (|f| < 2^-14): |f| / 2^-24 rounded to an integer, i.e. the 24-bit significand shifted right
     * by 126 - exponent, at least 14; clamped into 14..31 so that it stays a defined shift for the lanes whose
     * result is discarded. A rounded-up result of 0x400 is the smallest normal, which is the right encoding. */
    int32_t shift = 126 - (ax >> 23);
    shift = shift < 14 ? 14 : shift;
    shift = shift > 31 ? 31 : shift;
    const uint32_t sig = (ux & 0x7fffffu) | 0x800000u;
    const uint32_t subnormal = zccl_em_round_shift(sig, shift);

    /* NaN: keep the top 10 payload bits and set the quiet bit, so that the result is never mistaken for Inf. */
    const uint32_t nan = 0x7e00u | ((ux >> 13) & 0x03ffu);

    /* 65520 = 0x477ff000 is halfway between 65504 (the largest finite half, odd significand) and 2^16; ties go to
     * the even side, which is beyond the range, so everything from there up is infinity. */
    const uint32_t r = ax > 0x7f800000 ? nan : ax >= 0x477ff000 ? 0x7c00u : ax >= 0x38800000 ? normal : subnormal;
    return (uint16_t)(sign | r);
}

/* ---- bfloat16 ------------------------------------------------------------------------------------------------ */

/* bfloat16 -> binary32: bfloat16 is the upper half of a binary32, so widening is exact and needs no cases. */
ZCCL_EM_FN float zccl_em_bf16_to_float(uint16_t h)
{
    return zccl_em_from_bits32((uint32_t)h << 16);
}

/*
 * binary32 -> bfloat16, round to nearest, ties to even: add 0x7fff plus the lowest kept bit and truncate. This is
 * also right for subnormals, and a carry out of the largest finite values gives infinity, as it should. A NaN
 * would round into infinity or the other sign, so it is truncated instead, with the quiet bit set so that its
 * payload cannot truncate to zero.
 */
ZCCL_EM_FN uint16_t zccl_em_float_to_bf16(float f)
{
    const uint32_t x = zccl_em_bits32(f);
    const uint32_t r = f != f ? (x | 0x00400000u) : x + 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(r >> 16);
}

/* ---- OCP 8-bit floating point (OFP8) ------------------------------------------------------------------------- */

/*
 * E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities: S.1111.111 is NaN, so the largest finite
 * value is S.1111.110 = 1.75 * 2^8 = 448. Subnormals (exponent 0) are m * 2^-9. Widening is exact.
 */
ZCCL_EM_FN float zccl_em_e4m3_to_float(uint8_t v)
{
    const uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    const uint32_t mag = v & 0x7fu;
    const uint32_t normal = (mag << 20) + (120u << 23); /* rebias 7 -> 127 */
    const uint32_t subnormal = zccl_em_bits32((float)(int32_t)mag * 0.001953125f); /* 2^-9; mag < 8: exact */
    const uint32_t r = mag == 0x7fu ? 0x7fc00000u : mag < 0x08u ? subnormal : normal;
    return zccl_em_from_bits32(sign | r);
}

/*
 * E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is infinity, S.11111.{01,10,11}
 * are NaNs; the largest finite value is S.11110.11 = 1.75 * 2^15 = 57344. Subnormals are m * 2^-16.
 */
ZCCL_EM_FN float zccl_em_e5m2_to_float(uint8_t v)
{
    const uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    const uint32_t mag = v & 0x7fu;
    const uint32_t normal = (mag << 21) + (112u << 23); /* rebias 15 -> 127 */
    const uint32_t subnormal = zccl_em_bits32((float)(int32_t)mag * 1.52587890625e-05f); /* 2^-16; mag < 4: exact */
    const uint32_t r = mag > 0x7cu ? 0x7fc00000u : mag == 0x7cu ? 0x7f800000u : mag < 0x04u ? subnormal : normal;
    return zccl_em_from_bits32(sign | r);
}

/*
 * binary32 -> E4M3, round to nearest, ties to even, saturating (__NV_SATFINITE). Normal results (|f| >= 2^-6)
 * drop 20 mantissa bits; a rounded result above 0x7e (448), including every infinity, saturates to 0x7e.
 * Subnormal results are the significand shifted right by 141 - exponent (>= 21), clamped to 31 as in
 * zccl_em_float_to_half; rounding up to 0x08 gives the smallest normal, which is the right encoding.
 */
ZCCL_EM_FN uint8_t zccl_em_float_to_e4m3(float f)
{
    const uint32_t x = zccl_em_bits32(f);
    const uint32_t sign = (x >> 24) & 0x80u;
    const int32_t ax = (int32_t)(x & 0x7fffffffu);
    const uint32_t ux = (uint32_t)ax;
    uint32_t normal = (ux - (120u << 23) + 0x7ffffu + ((ux >> 20) & 1u)) >> 20;
    normal = normal > 0x7eu ? 0x7eu : normal;
    int32_t shift = 141 - (ax >> 23);
    shift = shift < 21 ? 21 : shift;
    shift = shift > 31 ? 31 : shift;
    const uint32_t subnormal = zccl_em_round_shift((ux & 0x7fffffu) | 0x800000u, shift);
    const uint32_t r = ax > 0x7f800000 ? 0x7fu : ax >= (121 << 23) ? normal : subnormal;
    return (uint8_t)(sign | r);
}

/*
 * binary32 -> E5M2, round to nearest, ties to even, saturating (__NV_SATFINITE): a rounded result above 0x7b
 * (57344), including every infinity, becomes 0x7b; NaN becomes S.11111.11. Normal results (|f| >= 2^-14) drop 21
 * mantissa bits; subnormal ones shift the significand right by 134 - exponent (>= 22).
 */
ZCCL_EM_FN uint8_t zccl_em_float_to_e5m2(float f)
{
    const uint32_t x = zccl_em_bits32(f);
    const uint32_t sign = (x >> 24) & 0x80u;
    const int32_t ax = (int32_t)(x & 0x7fffffffu);
    const uint32_t ux = (uint32_t)ax;
    uint32_t normal = (ux - (112u << 23) + 0xfffffu + ((ux >> 21) & 1u)) >> 21;
    normal = normal > 0x7bu ? 0x7bu : normal;
    int32_t shift = 134 - (ax >> 23);
    shift = shift < 22 ? 22 : shift;
    shift = shift > 31 ? 31 : shift;
    const uint32_t subnormal = zccl_em_round_shift((ux & 0x7fffffu) | 0x800000u, shift);
    const uint32_t r = ax > 0x7f800000 ? 0x7fu : ax >= (113 << 23) ? normal : subnormal;
    return (uint8_t)(sign | r);
}

/* ---- the operations on one pair of elements (float32 working precision) -------------------------------------- */

/*
 * Maximum and minimum with fmax/fmin semantics: a NaN operand yields the other operand (NaN only if both are),
 * and -0 orders below +0, as C23 Annex F recommends for fmax. Equal operands are combined bitwise: they are either
 * identical, or +0 and -0, where AND clears the sign (+0, for max) and OR sets it (-0, for min). Each step is a
 * compare and a blend, so loops vectorise without -ffinite-math-only.
 */
ZCCL_EM_FN float zccl_em_maxf(float x, float y)
{
    const float larger = x > y ? x : y;
    const float r = x == y ? zccl_em_from_bits32(zccl_em_bits32(x) & zccl_em_bits32(y)) : larger;
    return y != y ? x : r;
}

ZCCL_EM_FN float zccl_em_minf(float x, float y)
{
    const float smaller = x < y ? x : y;
    const float r = x == y ? zccl_em_from_bits32(zccl_em_bits32(x) | zccl_em_bits32(y)) : smaller;
    return y != y ? x : r;
}

/* SUM, PROD, AVG's last step ((x + y) / nranks, divisor as float: exact up to 2^24) and PreMulSum's product. */
ZCCL_EM_FN float zccl_em_sumf(float x, float y) { return x + y; }
ZCCL_EM_FN float zccl_em_prodf(float x, float y) { return x * y; }
ZCCL_EM_FN float zccl_em_avgf(float x, float y, float divisor) { return (x + y) / divisor; }
/* PreMulSum: each rank's input is first multiplied by the scalar in the datatype's precision (the product is
 * narrowed to the type before the sum uses it), then the products are summed as ZCCL_SUM. */
ZCCL_EM_FN float zccl_em_premulf(float scalar, float x) { return scalar * x; }

#endif

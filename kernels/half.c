/*
 * half.c — IEEE binary16 and bfloat16: conversions to and from binary32, and the reduction and scaling kernels
 * that use them.
 *
 * The conversions themselves are static inline functions of elem_math.h, so that they are inlined into these loops
 * (GCC vectorises them) and shared with any other kernel, including CUDA code compiled by nvcc.
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

/* The conversions are the shared element math of elem_math.h (also usable from CUDA code). */
#define zk_half_to_float zccl_em_half_to_float
#define zk_float_to_half zccl_em_float_to_half
#define zk_bf16_to_float zccl_em_bf16_to_float
#define zk_float_to_bf16 zccl_em_float_to_bf16

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
 * float32's 24-bit significand has at least 2p + 2 bits for both binary16 (p = 11) and bfloat16 (p = 8), which
 * makes the intermediate float32 rounding of a sum or product harmless (Figueroa, "When is double rounding
 * innocuous?", 1995): SUM and PROD are correctly rounded in both formats, exactly as if the exact result were
 * rounded once. The average rounds (a + b) and the quotient in float32 and then narrows, as kernels.h says.
 * zk_{sum,prod,max,min,avg,scale}_f16 and _bf16 (kernels_impl.h) widen, combine in float32 and narrow once.
 */
ZK_FLOAT_KERNELS(f16, zk_u16, float, zk_half_to_float, zk_float_to_half, zk_maxf, zk_minf)
ZK_FLOAT_KERNELS(bf16, zk_u16, float, zk_bf16_to_float, zk_float_to_bf16, zk_maxf, zk_minf)

/* The F16C binary16 kernels (half_f16c.c): each returns 0, doing nothing, where F16C is unavailable. */

/* 16-bit floating part of zccl_kernel_reduce(); dt is ZCCL_FLOAT16 or ZCCL_BFLOAT16 and count > 0. */
ZK_HIDDEN void zccl_kernels_reduce_half(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                        zccl_redop_t op, uint32_t divisor)
{
    /* Exact up to 2^24, far above the 65536-rank limit. */
    const float dv = (float)divisor;

    if (dt == ZCCL_FLOAT16) {
        if (zccl_kernels_reduce_f16c(dst, a, b, n, op, divisor))
            return;
        ZK_FLOAT_DISPATCH(f16, op, divisor, dst, a, b, n, dv);
    } else if (dt == ZCCL_BFLOAT16) {
        ZK_FLOAT_DISPATCH(bf16, op, divisor, dst, a, b, n, dv);
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

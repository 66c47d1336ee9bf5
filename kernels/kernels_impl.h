/*
 * kernels_impl.h — what the kernel files share and the rest of the library does not see: the multi-versioning
 * and visibility attributes, bit casts, and the per-family entry points that reduce.c dispatches to.
 */
#ifndef ZCCL_KERNELS_IMPL_H
#define ZCCL_KERNELS_IMPL_H

#include <stdint.h>
#include <string.h>

#include "elem_math.h"
#include "kernels.h"

/*
 * Function multi-versioning: each hot loop is compiled twice, once for AVX2 and once for the baseline x86-64
 * (SSE2), and the dynamic loader picks the clone through an ifunc when the library is loaded. This needs an ELF
 * target with ifunc support in the C library, so anywhere else the attribute disappears and the loops are
 * compiled once for whatever the compiler targets. Defining ZK_CLONES as empty (-DZK_CLONES=) does the same on
 * purpose, which is how the baseline code path is tested on a machine that has AVX2.
 */
#if !defined(ZK_CLONES) && defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define ZK_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef ZK_CLONES
#define ZK_CLONES
#endif

#if defined(__GNUC__)
#define ZK_HIDDEN __attribute__((visibility("hidden")))
#else
#define ZK_HIDDEN
#endif

/*
 * The two loops every reduction kernel is, written once for all the families (int.c, float.c, half.c, fp8.c):
 *   binary: d[i] = STORE(EXPR), EXPR of x = LOAD(a[i]) and y = LOAD(b[i]);
 *   unary:  d[i] = STORE(EXPR), EXPR of x = LOAD(s[i]) (zccl_kernel_scale).
 * UT is the element type in memory (alignment 1 where the family reads wider elements), T the working type, LOAD
 * and STORE the widening and narrowing (ZK_SAME where there is none); the arguments after EXPR are the kernel's
 * last parameters (the divisor, or its magic numbers), which EXPR may use. The loops carry no `restrict`: both
 * operands are read before the store, so dst may equal a, b or s exactly, and GCC still vectorises each loop (its
 * runtime overlap check accepts distance 0).
 */
#define ZK_SAME(v) (v)
#define ZK_BINARY_LOOP(name, UT, T, LOAD, STORE, EXPR, ...)                                                     \
    ZK_CLONES static void name(void *dst_, const void *a_, const void *b_, size_t n, __VA_ARGS__)              \
    {                                                                                                          \
        UT *d = dst_;                                                                                          \
        const UT *a = a_;                                                                                      \
        const UT *b = b_;                                                                                      \
        for (size_t i = 0; i < n; i++) {                                                                       \
            const T x = LOAD(a[i]);                                                                            \
            const T y = LOAD(b[i]);                                                                            \
            d[i] = STORE(EXPR);                                                                                \
        }                                                                                                      \
    }
#define ZK_UNARY_LOOP(name, UT, T, LOAD, STORE, EXPR, ...)                                                      \
    ZK_CLONES static void name(void *dst_, const void *s_, size_t n, __VA_ARGS__)                              \
    {                                                                                                          \
        UT *d = dst_;                                                                                          \
        const UT *s = s_;                                                                                      \
        for (size_t i = 0; i < n; i++) {                                                                       \
            const T x = LOAD(s[i]);                                                                            \
            d[i] = STORE(EXPR);                                                                                \
        }                                                                                                      \
    }

/*
 * The six kernels of a floating type SFX (float.c, half.c, fp8.c), computed in working type T with the divisor dv
 * in T: zk_{sum,prod,max,min,avg}_SFX and zk_scale_SFX. MAX and MIN are the fmax/fmin-style functions of T. The
 * average divides rather than multiplying by 1/divisor: the reciprocal is rounded, and the product would then
 * differ from the quotient in the last bit for some inputs; division keeps the documented (a + b) / divisor with
 * two roundings, and the loop is memory-bound either way.
 */
#define ZK_FLOAT_KERNELS(SFX, UT, T, LOAD, STORE, MAX, MIN)                                                     \
    ZK_BINARY_LOOP(zk_sum_##SFX, UT, T, LOAD, STORE, x + y, T dv)                                              \
    ZK_BINARY_LOOP(zk_prod_##SFX, UT, T, LOAD, STORE, x * y, T dv)                                             \
    ZK_BINARY_LOOP(zk_max_##SFX, UT, T, LOAD, STORE, MAX(x, y), T dv)                                          \
    ZK_BINARY_LOOP(zk_min_##SFX, UT, T, LOAD, STORE, MIN(x, y), T dv)                                          \
    ZK_BINARY_LOOP(zk_avg_##SFX, UT, T, LOAD, STORE, (x + y) / dv, T dv)                                       \
    ZK_UNARY_LOOP(zk_scale_##SFX, UT, T, LOAD, STORE, x / dv, T dv)

/*
 * Runs the kernel of a floating type SFX (ZK_FLOAT_KERNELS) for op on (dst, a, b, n, dv): a sum or average with a
 * divisor > 1 is the average step; any op but SUM, AVG, PROD, MAX and MIN leaves dst untouched.
 */
#define ZK_FLOAT_DISPATCH(SFX, op, divisor, dst, a, b, n, dv)                                                   \
    do {                                                                                                       \
        if (((op) == ZCCL_SUM || (op) == ZCCL_AVG) && (divisor) > 1)                                           \
            zk_avg_##SFX(dst, a, b, n, dv);                                                                    \
        else if ((op) == ZCCL_SUM || (op) == ZCCL_AVG)                                                         \
            zk_sum_##SFX(dst, a, b, n, dv);                                                                    \
        else if ((op) == ZCCL_PROD)                                                                            \
            zk_prod_##SFX(dst, a, b, n, dv);                                                                   \
        else if ((op) == ZCCL_MAX)                                                                             \
            zk_max_##SFX(dst, a, b, n, dv);                                                                    \
        else if ((op) == ZCCL_MIN)                                                                             \
            zk_min_##SFX(dst, a, b, n, dv);                                                                    \
    } while (0)

/* Bit casts and fmax/fmin-style maximum and minimum: the shared element math (elem_math.h). */
#define zk_bits32 zccl_em_bits32
#define zk_from_bits32 zccl_em_from_bits32
#define zk_bits64 zccl_em_bits64
#define zk_from_bits64 zccl_em_from_bits64
#define zk_maxf zccl_em_maxf
#define zk_minf zccl_em_minf

/* Family entry points (int.c, float.c, half.c), called by reduce.c once the datatype is known. */
ZK_HIDDEN void zccl_kernels_reduce_int(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                       zccl_redop_t op, uint32_t divisor);
ZK_HIDDEN void zccl_kernels_reduce_float(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                         zccl_redop_t op, uint32_t divisor);
ZK_HIDDEN void zccl_kernels_reduce_half(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                        zccl_redop_t op, uint32_t divisor);
ZK_HIDDEN void zccl_kernels_scale_int(void *dst, const void *src, size_t n, zccl_datatype_t dt, uint32_t divisor);
ZK_HIDDEN void zccl_kernels_scale_float(void *dst, const void *src, size_t n, zccl_datatype_t dt,
                                        uint32_t divisor);
ZK_HIDDEN void zccl_kernels_scale_half(void *dst, const void *src, size_t n, zccl_datatype_t dt, uint32_t divisor);
/* fp8 E4M3 / E5M2 (fp8.c). */
ZK_HIDDEN void zccl_kernels_reduce_fp8(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                       zccl_redop_t op, uint32_t divisor);
ZK_HIDDEN void zccl_kernels_scale_fp8(void *dst, const void *src, size_t n, zccl_datatype_t dt, uint32_t divisor);
/* float16 through F16C (half_f16c.c); return 0 when the CPU lacks F16C and the portable path must run. */
ZK_HIDDEN int zccl_kernels_reduce_f16c(void *dst, const void *a, const void *b, size_t n, zccl_redop_t op,
                                       uint32_t divisor);
ZK_HIDDEN int zccl_kernels_scale_f16c(void *dst, const void *src, size_t n, uint32_t divisor);

#endif

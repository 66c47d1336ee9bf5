/*
 * kernels_impl.h — what the kernel files share and the rest of the library does not see: the multi-versioning
 * and visibility attributes, bit casts, and the per-family entry points that reduce.c dispatches to.
 */
#ifndef ZCCL_KERNELS_IMPL_H
#define ZCCL_KERNELS_IMPL_H

#include <stdint.h>
#include <string.h>

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

static inline uint32_t zk_bits32(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
static inline float zk_from_bits32(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }
static inline uint64_t zk_bits64(double f) { uint64_t u; memcpy(&u, &f, sizeof u); return u; }
static inline double zk_from_bits64(uint64_t u) { double f; memcpy(&f, &u, sizeof f); return f; }

/*
 * Maximum and minimum with fmax/fmin semantics: a NaN operand yields the other operand (NaN only if both are),
 * and -0 orders below +0, as C23 Annex F recommends for fmax. The library fmaxf cannot be used because GCC only
 * vectorises it under -ffinite-math-only, and the SSE maxps instruction alone returns its second operand for
 * NaN and for equal zeros. Equal operands are combined bitwise: they are either identical, or +0 and -0, where
 * AND clears the sign (+0, for max) and OR sets it (-0, for min). Each step is a compare and a blend.
 */
static inline float zk_maxf(float x, float y)
{
    const float larger = x > y ? x : y;
    const float r = x == y ? zk_from_bits32(zk_bits32(x) & zk_bits32(y)) : larger;
    return y != y ? x : r;
}

static inline float zk_minf(float x, float y)
{
    const float smaller = x < y ? x : y;
    const float r = x == y ? zk_from_bits32(zk_bits32(x) | zk_bits32(y)) : smaller;
    return y != y ? x : r;
}

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
/* float16 through F16C (half_f16c.c); return 0 when the CPU lacks F16C and the portable path must run. */
ZK_HIDDEN int zccl_kernels_reduce_f16c(void *dst, const void *a, const void *b, size_t n, zccl_redop_t op,
                                       uint32_t divisor);
ZK_HIDDEN int zccl_kernels_scale_f16c(void *dst, const void *src, size_t n, uint32_t divisor);

#endif

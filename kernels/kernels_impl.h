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

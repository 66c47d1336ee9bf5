/*
 * kernels.h — CPU reduction kernels, one per datatype x operation, used by every reduction step.
 *
 * Layer rule: kernels/ depends only on include/zccl.h (for the enums). Nothing here allocates, locks or makes a
 * system call: these functions sit on the hot path of every reduce-scatter and all-reduce chunk.
 */
#ifndef ZCCL_KERNELS_H
#define ZCCL_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "zccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * dst[i] = a[i] OP b[i] for 0 <= i < count (count in ELEMENTS of dt).
 *  - op is ZCCL_SUM, ZCCL_PROD, ZCCL_MAX, ZCCL_MIN or ZCCL_AVG; ZCCL_AVG is treated as ZCCL_SUM (the engine
 *    passes divisor = nranks on the one step that produces the complete sum, and 1 elsewhere).
 *  - divisor > 1 with SUM/AVG: dst[i] = (a[i] + b[i]) / divisor, integer types truncating toward zero, floating
 *    types computed as (a+b)/divisor in the working precision (float16/bfloat16/float32 convert the divisor to
 *    float, exact up to 2^24). divisor <= 1: no division. The divisor is ignored for PROD, MAX and MIN.
 *  - Integer SUM/PROD wrap modulo 2^bits (computed in unsigned arithmetic; no signed-overflow UB).
 *  - float16/bfloat16/fp8 (E4M3, E5M2): both operands are widened to float32, combined (and divided), and the
 *    result is rounded to nearest-even once (fp8: saturating to the largest finite value; elem_math.h). NaN stays NaN; MAX/MIN follow fmaxf/fminf semantics for floating types
 *    (a NaN operand yields the other operand; -0 orders below +0) — see docs/kernels.md.
 *  - Aliasing: dst may equal a or b exactly (in-place); partial overlap is not allowed.
 *  - No alignment requirement: any byte address works. count 0 accepts NULL pointers.
 * Returns nothing; dt/op out of range are caller bugs and must have been rejected by argument checks.
 */
void zccl_kernel_reduce(void *dst, const void *a, const void *b, size_t count, zccl_datatype_t dt,
                        zccl_redop_t op, uint32_t divisor);

/** dst[i] = src[i] / divisor (integer: truncating). dst may equal src; divisor <= 1 copies bit for bit. */
void zccl_kernel_scale(void *dst, const void *src, size_t count, zccl_datatype_t dt, uint32_t divisor);

/**
 * memcpy with non-temporal stores (no read-for-ownership of the destination), for large destinations the caller
 * will not read back soon. dst and src must not overlap; any alignment. Stores are fenced before returning.
 */
void zccl_kernel_copy_stream(void *dst, const void *src, size_t bytes);

/**
 * Whether this CPU's `rep movsb` is slow when the destination's page offset is 1..63 bytes past the source's: on the
 * AMD EPYC CPUs of these machines a 32-128 KiB copy at such a distance ran at 2.8-3.0 GB/s against 35-52 GB/s at
 * other distances, in glibc's memcpy (which uses `rep movsb` from a few KiB to a few hundred KiB) and in the
 * kernel's copies (process_vm_readv: 2.0-2.4 against 6.2-11 GB/s); docs/performance.md, "A slow copy distance".
 * Measured once per process (64 KiB copies at distances 16 and 80, about 0.1-0.4 ms); true when 16 took over twice
 * as long. Always false off x86-64.
 */
bool zccl_kernel_rep_movsb_slow(void);
/** Tests: makes zccl_kernel_rep_movsb_slow() answer v (0 or 1) from now on in this process, or measure again (-1),
 *  so that the vector copy and the shared-memory transport's detour run on every CPU. No effect off x86-64. */
void zccl_kernel_rep_movsb_force(int v);
/** Whether a copy from src to dst would hit that slowness: dst's page offset 1..63 bytes past src's and
 *  zccl_kernel_rep_movsb_slow(). Only the addresses are compared (src may be another process's). */
bool zccl_kernel_copy_slow_at(const void *dst, const void *src);

/**
 * memcpy for the library's bulk copies (slots, staging areas, the engine's copies, the host memory table): the same
 * bytes as memcpy; where zccl_kernel_rep_movsb_slow() and the destination's page offset is 1..63 bytes past the
 * source's, it copies with vector loads and aligned vector stores (AVX2) instead of glibc's memcpy. dst and src
 * must not overlap; any alignment; bytes 0 accepts NULL.
 */
void zccl_kernel_copy(void *dst, const void *src, size_t bytes);

/** IEEE binary16 <-> binary32 conversions, round-to-nearest-even, NaN/Inf/subnormals preserved. */
float zccl_half_to_float(uint16_t h);
uint16_t zccl_float_to_half(float f);
/** bfloat16 <-> binary32, round-to-nearest-even; NaN stays a (quiet) NaN. */
float zccl_bf16_to_float(uint16_t h);
uint16_t zccl_float_to_bf16(float f);
/** OCP fp8 E4M3 / E5M2 <-> binary32 (elem_math.h): widening exact; narrowing round-to-nearest-even, saturating to
 *  the largest finite value of the sign for overflow and infinities (CUDA's __NV_SATFINITE); NaN stays NaN. */
float zccl_e4m3_to_float(uint8_t v);
uint8_t zccl_float_to_e4m3(float f);
float zccl_e5m2_to_float(uint8_t v);
uint8_t zccl_float_to_e5m2(float f);

/**
 * PreMulSum's multiplication: dst[i] = (*scalar) * src[i] for 0 <= i < count, in the datatype's precision
 * (integers wrap; float16/bfloat16/fp8 products are rounded to the type once). scalar points to one element of dt.
 * dst may equal src. count 0 accepts NULL pointers.
 */
void zccl_kernel_premul(void *dst, const void *src, size_t count, zccl_datatype_t dt, const void *scalar);

#ifdef __cplusplus
}
#endif
#endif

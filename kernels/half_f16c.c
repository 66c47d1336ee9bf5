/*
 * half_f16c.c — binary16 kernels using the F16C conversion instructions, for the CPUs that have them.
 *
 * The portable binary16 kernels in half.c convert with integer operations, which GCC vectorises but which cost
 * about 30 vector instructions per 8 elements; measured on an AVX2 machine they reach only ~0.5 G elements/s,
 * far below memory bandwidth. Every x86-64 CPU with AVX2 (and a few before it) has F16C, whose vcvtph2ps and
 * vcvtps2ph convert 8 values in one instruction each. GCC 12 does not vectorise _Float16 conversions without
 * AVX-512 FP16, so this file uses the intrinsics directly; the arithmetic around them is the same as in half.c.
 *
 * The results are those of half.c (both paths pass the same unit tests against one reference, including the
 * ones run under FTZ/DAZ and under another rounding mode):
 *  - vcvtph2ps is exact, including subnormals, and is not affected by MXCSR.DAZ;
 *  - vcvtps2ph is given rounding mode 0, round to nearest even, in the instruction rather than from MXCSR, and
 *    it produces binary16 subnormals whatever MXCSR.FTZ says; NaNs come out quiet with their top payload;
 *  - the float32 arithmetic in between never sees a binary32 subnormal, because binary16 values, their sums,
 *    products and quotients by a divisor < 2^32 all stay far above 2^-126.
 */
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

/* Defining ZK_NO_F16C leaves only the portable path, so that it can be tested on a machine that has F16C. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(ZK_NO_F16C)
#define ZK_HAVE_F16C_PATH 1
#endif

#if ZK_HAVE_F16C_PATH
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

/* AVX for the 256-bit float operations, F16C for the conversions; nothing else is required of the CPU. */
#define ZK_F16C __attribute__((target("avx,f16c")))

/* Eight binary16 values at any byte address, widened exactly. */
ZK_F16C static inline __m256 zk_load8(const unsigned char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* Eight results narrowed to binary16 with round-to-nearest-even, stored at any byte address. */
ZK_F16C static inline void zk_store8(unsigned char *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/*
 * fmax/fmin with -0 < +0, as zk_maxf/zk_minf in kernels_impl.h: the larger (smaller) operand; for equal operands their
 * bitwise AND (OR), which differs from either only for +0 and -0; and x when y is NaN. (vmaxps alone would return
 * y for a NaN x, but also y for a NaN y and for equal zeros.)
 */
ZK_F16C static inline __m256 zk_max8(__m256 x, __m256 y)
{
    const __m256 larger = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, y, _CMP_GT_OQ));
    const __m256 r = _mm256_blendv_ps(larger, _mm256_and_ps(x, y), _mm256_cmp_ps(x, y, _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, x, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
}

ZK_F16C static inline __m256 zk_min8(__m256 x, __m256 y)
{
    const __m256 smaller = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, y, _CMP_LT_OQ));
    const __m256 r = _mm256_blendv_ps(smaller, _mm256_or_ps(x, y), _mm256_cmp_ps(x, y, _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, x, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
}

#define ZK_OP_SUM(x, y, dv) _mm256_add_ps(x, y)
#define ZK_OP_PROD(x, y, dv) _mm256_mul_ps(x, y)
#define ZK_OP_MAX(x, y, dv) zk_max8(x, y)
#define ZK_OP_MIN(x, y, dv) zk_min8(x, y)
#define ZK_OP_AVG(x, y, dv) _mm256_div_ps(_mm256_add_ps(x, y), dv)

/*
 * Eight elements per step. Both operands are loaded before the result is stored, so dst may equal a or b. The
 * last n % 8 elements go through the same vector code via small zero-padded copies, so that every element is
 * computed the same way whatever the length and offset.
 */
#define ZK_F16C_BINARY(name, OP)                                                                                \
    ZK_F16C static void name(unsigned char *d, const unsigned char *a, const unsigned char *b, size_t n,       \
                             float divisor)                                                                    \
    {                                                                                                          \
        const __m256 dv = _mm256_set1_ps(divisor); /* used by the average only */                            \
        size_t i = 0;                                                                                          \
        (void)dv;                                                                                              \
        for (; i + 8 <= n; i += 8)                                                                             \
            zk_store8(d + 2 * i, OP(zk_load8(a + 2 * i), zk_load8(b + 2 * i), dv));                            \
        if (i < n) {                                                                                           \
            unsigned char ta[16] = {0}, tb[16] = {0}, td[16];                                                  \
            const size_t rest = 2 * (n - i);                                                                   \
            memcpy(ta, a + 2 * i, rest);                                                                       \
            memcpy(tb, b + 2 * i, rest);                                                                       \
            zk_store8(td, OP(zk_load8(ta), zk_load8(tb), dv));                                                 \
            memcpy(d + 2 * i, td, rest);                                                                       \
        }                                                                                                      \
    }

ZK_F16C_BINARY(zk_f16c_sum, ZK_OP_SUM)
ZK_F16C_BINARY(zk_f16c_prod, ZK_OP_PROD)
ZK_F16C_BINARY(zk_f16c_max, ZK_OP_MAX)
ZK_F16C_BINARY(zk_f16c_min, ZK_OP_MIN)
ZK_F16C_BINARY(zk_f16c_avg, ZK_OP_AVG)

ZK_F16C static void zk_f16c_scale(unsigned char *d, const unsigned char *s, size_t n, float divisor)
{
    const __m256 dv = _mm256_set1_ps(divisor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        zk_store8(d + 2 * i, _mm256_div_ps(zk_load8(s + 2 * i), dv));
    if (i < n) {
        unsigned char ts[16] = {0}, td[16];
        const size_t rest = 2 * (n - i);
        memcpy(ts, s + 2 * i, rest);
        zk_store8(td, _mm256_div_ps(zk_load8(ts), dv));
        memcpy(d + 2 * i, td, rest);
    }
}

/*
 * CPUID leaf 1 reports AVX and F16C; the OS must also save the YMM registers (OSXSAVE set, and XCR0 bits 1 and 2,
 * SSE and AVX state). This is what __builtin_cpu_supports("f16c") checks in GCC, but clang 14 does not know that
 * name, so the check is written out.
 */
static int zk_detect_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    const unsigned need = bit_OSXSAVE | bit_AVX | bit_F16C;
    if ((ecx & need) != need)
        return 0;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    return (xcr0_lo & 6u) == 6u;
}

/*
 * CPUID is slow (in a virtual machine it traps to the hypervisor), so the answer is computed on first use and
 * kept. Threads racing on the first call compute the same value; relaxed atomics make that race well-defined
 * without a lock.
 */
static int zk_f16c_usable(void)
{
    static atomic_int state; /* 0: not known yet, 1: unavailable, 2: available */
    int s = atomic_load_explicit(&state, memory_order_relaxed);
    if (s == 0) {
        s = zk_detect_f16c() ? 2 : 1;
        atomic_store_explicit(&state, s, memory_order_relaxed);
    }
    return s == 2;
}
#endif /* ZK_HAVE_F16C_PATH */

/*
 * Runs the binary16 reduction with F16C if this CPU has it and returns 1, else returns 0 and does nothing. n > 0;
 * op and divisor as for zccl_kernel_reduce().
 */
ZK_HIDDEN int zccl_kernels_reduce_f16c(void *dst, const void *a, const void *b, size_t n, zccl_redop_t op,
                                       uint32_t divisor)
{
#if ZK_HAVE_F16C_PATH
    if (!zk_f16c_usable())
        return 0;
    const float dv = (float)divisor;
    if ((op == ZCCL_SUM || op == ZCCL_AVG) && divisor > 1)
        zk_f16c_avg(dst, a, b, n, dv);
    else if (op == ZCCL_SUM || op == ZCCL_AVG)
        zk_f16c_sum(dst, a, b, n, dv);
    else if (op == ZCCL_PROD)
        zk_f16c_prod(dst, a, b, n, dv);
    else if (op == ZCCL_MAX)
        zk_f16c_max(dst, a, b, n, dv);
    else if (op == ZCCL_MIN)
        zk_f16c_min(dst, a, b, n, dv);
    return 1;
#else
    (void)dst, (void)a, (void)b, (void)n, (void)op, (void)divisor;
    return 0;
#endif
}

/* As zccl_kernels_reduce_f16c(), for zccl_kernel_scale() with divisor >= 2. */
ZK_HIDDEN int zccl_kernels_scale_f16c(void *dst, const void *src, size_t n, uint32_t divisor)
{
#if ZK_HAVE_F16C_PATH
    if (!zk_f16c_usable())
        return 0;
    zk_f16c_scale(dst, src, n, (float)divisor);
    return 1;
#else
    (void)dst, (void)src, (void)n, (void)divisor;
    return 0;
#endif
}

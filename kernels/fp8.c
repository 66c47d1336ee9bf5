/*
 * fp8.c — reduction and scaling kernels for the OCP 8-bit floating types E4M3 and E5M2 (ZCCL_FLOAT8E4M3,
 * ZCCL_FLOAT8E5M2). Each element is widened to float32 exactly, combined in float32, and narrowed once with
 * round-to-nearest-even and saturation to the largest finite value (elem_math.h), as NCCL does with CUDA's
 * __NV_SATFINITE conversions. float32's 24-bit significand has more than 2p + 2 bits for both formats (p = 4 and 3),
 * so SUM and PROD are correctly rounded, as if the exact result were rounded once.
 */
#include <stdint.h>

#include "kernels_impl.h"

#define ZK_FP8_BINARY(name, WIDEN, NARROW, EXPR)                                                                \
    ZK_CLONES static void name(void *dst_, const void *a_, const void *b_, size_t n, float dv)                 \
    {                                                                                                          \
        uint8_t *d = dst_;                                                                                     \
        const uint8_t *a = a_;                                                                                 \
        const uint8_t *b = b_;                                                                                 \
        for (size_t i = 0; i < n; i++) {                                                                       \
            const float x = WIDEN(a[i]);                                                                       \
            const float y = WIDEN(b[i]);                                                                       \
            d[i] = NARROW(EXPR);                                                                               \
        }                                                                                                      \
    }

#define ZK_FP8_SCALE(name, WIDEN, NARROW)                                                                       \
    ZK_CLONES static void name(void *dst_, const void *s_, size_t n, float dv)                                 \
    {                                                                                                          \
        uint8_t *d = dst_;                                                                                     \
        const uint8_t *s = s_;                                                                                 \
        for (size_t i = 0; i < n; i++)                                                                         \
            d[i] = NARROW(WIDEN(s[i]) / dv);                                                                   \
    }

ZK_FP8_BINARY(zk_sum_e4m3, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3, zccl_em_sumf(x, y))
ZK_FP8_BINARY(zk_prod_e4m3, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3, zccl_em_prodf(x, y))
ZK_FP8_BINARY(zk_max_e4m3, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3, zccl_em_maxf(x, y))
ZK_FP8_BINARY(zk_min_e4m3, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3, zccl_em_minf(x, y))
ZK_FP8_BINARY(zk_avg_e4m3, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3, zccl_em_avgf(x, y, dv))
ZK_FP8_SCALE(zk_scale_e4m3, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3)

ZK_FP8_BINARY(zk_sum_e5m2, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2, zccl_em_sumf(x, y))
ZK_FP8_BINARY(zk_prod_e5m2, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2, zccl_em_prodf(x, y))
ZK_FP8_BINARY(zk_max_e5m2, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2, zccl_em_maxf(x, y))
ZK_FP8_BINARY(zk_min_e5m2, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2, zccl_em_minf(x, y))
ZK_FP8_BINARY(zk_avg_e5m2, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2, zccl_em_avgf(x, y, dv))
ZK_FP8_SCALE(zk_scale_e5m2, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2)

ZK_HIDDEN void zccl_kernels_reduce_fp8(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                       zccl_redop_t op, uint32_t divisor)
{
    const int avg = (op == ZCCL_SUM || op == ZCCL_AVG) && divisor > 1;
    const float dv = (float)divisor;
    const int e4 = dt == ZCCL_FLOAT8E4M3;
    if (avg)
        (e4 ? zk_avg_e4m3 : zk_avg_e5m2)(dst, a, b, n, dv);
    else if (op == ZCCL_SUM || op == ZCCL_AVG)
        (e4 ? zk_sum_e4m3 : zk_sum_e5m2)(dst, a, b, n, dv);
    else if (op == ZCCL_PROD)
        (e4 ? zk_prod_e4m3 : zk_prod_e5m2)(dst, a, b, n, dv);
    else if (op == ZCCL_MAX)
        (e4 ? zk_max_e4m3 : zk_max_e5m2)(dst, a, b, n, dv);
    else if (op == ZCCL_MIN)
        (e4 ? zk_min_e4m3 : zk_min_e5m2)(dst, a, b, n, dv);
}

ZK_HIDDEN void zccl_kernels_scale_fp8(void *dst, const void *src, size_t n, zccl_datatype_t dt, uint32_t divisor)
{
    (dt == ZCCL_FLOAT8E4M3 ? zk_scale_e4m3 : zk_scale_e5m2)(dst, src, n, (float)divisor);
}

float zccl_e4m3_to_float(uint8_t v) { return zccl_em_e4m3_to_float(v); }
uint8_t zccl_float_to_e4m3(float f) { return zccl_em_float_to_e4m3(f); }
float zccl_e5m2_to_float(uint8_t v) { return zccl_em_e5m2_to_float(v); }
uint8_t zccl_float_to_e5m2(float f) { return zccl_em_float_to_e5m2(f); }

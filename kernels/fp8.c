/*
 * fp8.c — reduction and scaling kernels for the OCP 8-bit floating types E4M3 and E5M2 (ZCCL_FLOAT8E4M3,
 * ZCCL_FLOAT8E5M2). Each element is widened to float32 exactly, combined in float32, and narrowed once with
 * round-to-nearest-even and saturation to the largest finite value (elem_math.h), as NCCL does with CUDA's
 * __NV_SATFINITE conversions. float32's 24-bit significand has more than 2p + 2 bits for both formats (p = 4 and 3),
 * so SUM and PROD are correctly rounded, as if the exact result were rounded once.
 */
#include <stdint.h>

#include "kernels_impl.h"

/* zk_{sum,prod,max,min,avg,scale}_e4m3 and _e5m2 (kernels_impl.h): widen, combine in float32, narrow once. */
ZK_FLOAT_KERNELS(e4m3, uint8_t, float, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3, zccl_em_maxf, zccl_em_minf)
ZK_FLOAT_KERNELS(e5m2, uint8_t, float, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2, zccl_em_maxf, zccl_em_minf)

ZK_HIDDEN void zccl_kernels_reduce_fp8(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                       zccl_redop_t op, uint32_t divisor)
{
    const float dv = (float)divisor;
    if (dt == ZCCL_FLOAT8E4M3)
        ZK_FLOAT_DISPATCH(e4m3, op, divisor, dst, a, b, n, dv);
    else
        ZK_FLOAT_DISPATCH(e5m2, op, divisor, dst, a, b, n, dv);
}

ZK_HIDDEN void zccl_kernels_scale_fp8(void *dst, const void *src, size_t n, zccl_datatype_t dt, uint32_t divisor)
{
    (dt == ZCCL_FLOAT8E4M3 ? zk_scale_e4m3 : zk_scale_e5m2)(dst, src, n, (float)divisor);
}

float zccl_e4m3_to_float(uint8_t v) { return zccl_em_e4m3_to_float(v); }
uint8_t zccl_float_to_e4m3(float f) { return zccl_em_float_to_e4m3(f); }
float zccl_e5m2_to_float(uint8_t v) { return zccl_em_e5m2_to_float(v); }
uint8_t zccl_float_to_e5m2(float f) { return zccl_em_float_to_e5m2(f); }

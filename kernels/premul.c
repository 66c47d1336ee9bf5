/*
 * premul.c — the first half of a PreMulSum reduction (zccl_redop_create_premulsum): dst[i] = scalar * src[i] in
 * the datatype's precision, as NCCL multiplies each rank's input before summing. Integers wrap modulo 2^bits
 * (unsigned arithmetic); float32 and float64 multiply in their own type; float16, bfloat16 and fp8 widen both the
 * scalar and the element to float32, multiply, and narrow the product once (round to nearest even; fp8 saturates).
 */
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

#define ZK_PREMUL_INT(name, T)                                                                                  \
    ZK_CLONES static void name(void *dst_, const void *src_, size_t n, const void *sc)                         \
    {                                                                                                          \
        T s, v;                                                                                                \
        memcpy(&s, sc, sizeof s);                                                                              \
        unsigned char *d = dst_;                                                                               \
        const unsigned char *x = src_;                                                                         \
        for (size_t i = 0; i < n; i++) {                                                                       \
            memcpy(&v, x + i * sizeof(T), sizeof v);                                                           \
            v = (T)(s * v);                                                                                    \
            memcpy(d + i * sizeof(T), &v, sizeof v);                                                           \
        }                                                                                                      \
    }

#define ZK_PREMUL_NARROW(name, T, WIDEN, NARROW)                                                                \
    ZK_CLONES static void name(void *dst_, const void *src_, size_t n, const void *sc)                         \
    {                                                                                                          \
        T s, v;                                                                                                \
        memcpy(&s, sc, sizeof s);                                                                              \
        const float fs = WIDEN(s);                                                                             \
        unsigned char *d = dst_;                                                                               \
        const unsigned char *x = src_;                                                                         \
        for (size_t i = 0; i < n; i++) {                                                                       \
            memcpy(&v, x + i * sizeof(T), sizeof v);                                                           \
            v = NARROW(zccl_em_premulf(fs, WIDEN(v)));                                                         \
            memcpy(d + i * sizeof(T), &v, sizeof v);                                                           \
        }                                                                                                      \
    }

ZK_PREMUL_INT(zk_premul_u8, uint8_t)
ZK_PREMUL_INT(zk_premul_u32, uint32_t)
ZK_PREMUL_INT(zk_premul_u64, uint64_t)
ZK_PREMUL_INT(zk_premul_f32, float)
ZK_PREMUL_INT(zk_premul_f64, double)
ZK_PREMUL_NARROW(zk_premul_f16, uint16_t, zccl_em_half_to_float, zccl_em_float_to_half)
ZK_PREMUL_NARROW(zk_premul_bf16, uint16_t, zccl_em_bf16_to_float, zccl_em_float_to_bf16)
ZK_PREMUL_NARROW(zk_premul_e4m3, uint8_t, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3)
ZK_PREMUL_NARROW(zk_premul_e5m2, uint8_t, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2)

void zccl_kernel_premul(void *dst, const void *src, size_t count, zccl_datatype_t dt, const void *scalar)
{
    if (count == 0)
        return;
    switch (dt) {
    case ZCCL_INT8: /* two's complement: the low 8 bits of the product do not depend on signedness */
    case ZCCL_UINT8: zk_premul_u8(dst, src, count, scalar); break;
    case ZCCL_INT32:
    case ZCCL_UINT32: zk_premul_u32(dst, src, count, scalar); break;
    case ZCCL_INT64:
    case ZCCL_UINT64: zk_premul_u64(dst, src, count, scalar); break;
    case ZCCL_FLOAT32: zk_premul_f32(dst, src, count, scalar); break;
    case ZCCL_FLOAT64: zk_premul_f64(dst, src, count, scalar); break;
    case ZCCL_FLOAT16: zk_premul_f16(dst, src, count, scalar); break;
    case ZCCL_BFLOAT16: zk_premul_bf16(dst, src, count, scalar); break;
    case ZCCL_FLOAT8E4M3: zk_premul_e4m3(dst, src, count, scalar); break;
    case ZCCL_FLOAT8E5M2: zk_premul_e5m2(dst, src, count, scalar); break;
    default: break;
    }
}

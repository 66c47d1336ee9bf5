/*
 * reduce.c — the public entry points of the reduction kernels: route each call by datatype to the kernel file
 * of its family (int.c, float.c, half.c, fp8.c), which picks the loop for the operation and runs it.
 */
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

/* Each datatype's kernel family (the file whose entry points run it) and element size, in include/zccl.h's order. */
enum zk_family { ZK_NONE, ZK_INT, ZK_FLOAT, ZK_HALF, ZK_FP8 };
static const struct {
    unsigned char family, size;
} zk_types[ZCCL_NUM_TYPES] = {
    [ZCCL_INT8] = {ZK_INT, 1},       [ZCCL_UINT8] = {ZK_INT, 1},        [ZCCL_INT32] = {ZK_INT, 4},
    [ZCCL_UINT32] = {ZK_INT, 4},     [ZCCL_INT64] = {ZK_INT, 8},        [ZCCL_UINT64] = {ZK_INT, 8},
    [ZCCL_FLOAT16] = {ZK_HALF, 2},   [ZCCL_FLOAT32] = {ZK_FLOAT, 4},    [ZCCL_FLOAT64] = {ZK_FLOAT, 8},
    [ZCCL_BFLOAT16] = {ZK_HALF, 2},  [ZCCL_FLOAT8E4M3] = {ZK_FP8, 1},   [ZCCL_FLOAT8E5M2] = {ZK_FP8, 1},
};

static enum zk_family zk_family_of(zccl_datatype_t dt)
{
    return (unsigned)dt < ZCCL_NUM_TYPES ? (enum zk_family)zk_types[dt].family : ZK_NONE;
}

void zccl_kernel_reduce(void *dst, const void *a, const void *b, size_t count, zccl_datatype_t dt,
                        zccl_redop_t op, uint32_t divisor)
{
    /* count 0 comes with possibly-NULL buffers (a zero-length collective); touch nothing. */
    if (count == 0)
        return;
    switch (zk_family_of(dt)) {
    case ZK_INT: zccl_kernels_reduce_int(dst, a, b, count, dt, op, divisor); break;
    case ZK_FLOAT: zccl_kernels_reduce_float(dst, a, b, count, dt, op, divisor); break;
    case ZK_HALF: zccl_kernels_reduce_half(dst, a, b, count, dt, op, divisor); break;
    case ZK_FP8: zccl_kernels_reduce_fp8(dst, a, b, count, dt, op, divisor); break;
    default: break;
    }
}

void zccl_kernel_scale(void *dst, const void *src, size_t count, zccl_datatype_t dt, uint32_t divisor)
{
    if (count == 0)
        return;
    if (divisor <= 1) {
        /* No division: the result is the input, bit for bit (a NaN keeps even its signalling bit). */
        if (dst != src && zk_family_of(dt) != ZK_NONE)
            memmove(dst, src, count * zk_types[dt].size);
        return;
    }
    switch (zk_family_of(dt)) {
    case ZK_INT: zccl_kernels_scale_int(dst, src, count, dt, divisor); break;
    case ZK_FLOAT: zccl_kernels_scale_float(dst, src, count, dt, divisor); break;
    case ZK_HALF: zccl_kernels_scale_half(dst, src, count, dt, divisor); break;
    case ZK_FP8: zccl_kernels_scale_fp8(dst, src, count, dt, divisor); break;
    default: break;
    }
}

/*
 * reduce.c — the public entry points of the reduction kernels: route each call by datatype to the kernel file
 * of its family (int.c, float.c, half.c, fp8.c), which picks the loop for the operation and runs it.
 */
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

void zccl_kernel_reduce(void *dst, const void *a, const void *b, size_t count, zccl_datatype_t dt,
                        zccl_redop_t op, uint32_t divisor)
{
    /* count 0 comes with possibly-NULL buffers (a zero-length collective); touch nothing. */
    if (count == 0)
        return;
    switch (dt) {
    case ZCCL_INT8:
    case ZCCL_UINT8:
    case ZCCL_INT32:
    case ZCCL_UINT32:
    case ZCCL_INT64:
    case ZCCL_UINT64:
        zccl_kernels_reduce_int(dst, a, b, count, dt, op, divisor);
        break;
    case ZCCL_FLOAT32:
    case ZCCL_FLOAT64:
        zccl_kernels_reduce_float(dst, a, b, count, dt, op, divisor);
        break;
    case ZCCL_FLOAT16:
    case ZCCL_BFLOAT16:
        zccl_kernels_reduce_half(dst, a, b, count, dt, op, divisor);
        break;
    case ZCCL_FLOAT8E4M3:
    case ZCCL_FLOAT8E5M2:
        zccl_kernels_reduce_fp8(dst, a, b, count, dt, op, divisor);
        break;
    default:
        break;
    }
}

/* Size of one element, for the copy that scaling by 1 reduces to. */
static size_t zk_elem_size(zccl_datatype_t dt)
{
    switch (dt) {
    case ZCCL_INT8:
    case ZCCL_UINT8:
    case ZCCL_FLOAT8E4M3:
    case ZCCL_FLOAT8E5M2:
        return 1;
    case ZCCL_FLOAT16:
    case ZCCL_BFLOAT16:
        return 2;
    case ZCCL_INT32:
    case ZCCL_UINT32:
    case ZCCL_FLOAT32:
        return 4;
    case ZCCL_INT64:
    case ZCCL_UINT64:
    case ZCCL_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

void zccl_kernel_scale(void *dst, const void *src, size_t count, zccl_datatype_t dt, uint32_t divisor)
{
    if (count == 0)
        return;
    if (divisor <= 1) {
        /* No division: the result is the input, bit for bit (a NaN keeps even its signalling bit). */
        if (dst != src)
            memmove(dst, src, count * zk_elem_size(dt));
        return;
    }
    switch (dt) {
    case ZCCL_INT8:
    case ZCCL_UINT8:
    case ZCCL_INT32:
    case ZCCL_UINT32:
    case ZCCL_INT64:
    case ZCCL_UINT64:
        zccl_kernels_scale_int(dst, src, count, dt, divisor);
        break;
    case ZCCL_FLOAT32:
    case ZCCL_FLOAT64:
        zccl_kernels_scale_float(dst, src, count, dt, divisor);
        break;
    case ZCCL_FLOAT16:
    case ZCCL_BFLOAT16:
        zccl_kernels_scale_half(dst, src, count, dt, divisor);
        break;
    case ZCCL_FLOAT8E4M3:
    case ZCCL_FLOAT8E5M2:
        zccl_kernels_scale_fp8(dst, src, count, dt, divisor);
        break;
    default:
        break;
    }
}

/*
 * float.c — reduction and scaling kernels for float32 and float64.
 *
 * As in int.c, one macro-generated loop per (type, operation) keeps the per-call decision to a single switch and
 * leaves GCC a trivially vectorisable loop body. The build uses -fno-trapping-math (so the compiler may evaluate
 * both arms of a select) and -fno-math-errno; it does not use -ffast-math, so every operation is IEEE: the
 * compiler may not reassociate, contract or drop NaN and signed-zero handling.
 */
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

/* Alignment-1 element types: the kernels accept any address (see int.c). */
typedef float zk_f32 __attribute__((aligned(1)));
typedef double zk_f64 __attribute__((aligned(1)));

static inline double zk_max(double x, double y)
{
    const double larger = x > y ? x : y;
    const double r = x == y ? zk_from_bits64(zk_bits64(x) & zk_bits64(y)) : larger;
    return y != y ? x : r;
}

static inline double zk_min(double x, double y)
{
    const double smaller = x < y ? x : y;
    const double r = x == y ? zk_from_bits64(zk_bits64(x) | zk_bits64(y)) : smaller;
    return y != y ? x : r;
}

/* The loops (kernels_impl.h): zk_{sum,prod,max,min,avg,scale}_f32 and _f64. */
ZK_FLOAT_KERNELS(f32, zk_f32, float, ZK_SAME, ZK_SAME, zk_maxf, zk_minf)
ZK_FLOAT_KERNELS(f64, zk_f64, double, ZK_SAME, ZK_SAME, zk_max, zk_min)

/* Floating part of zccl_kernel_reduce(); dt is ZCCL_FLOAT32 or ZCCL_FLOAT64 and count > 0. */
ZK_HIDDEN void zccl_kernels_reduce_float(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                         zccl_redop_t op, uint32_t divisor)
{
    if (dt == ZCCL_FLOAT32) {
        /* (float)divisor is exact up to 2^24, far above the 65536-rank limit of zccl_comm_init_rank. */
        ZK_FLOAT_DISPATCH(f32, op, divisor, dst, a, b, n, (float)divisor);
    } else if (dt == ZCCL_FLOAT64) {
        ZK_FLOAT_DISPATCH(f64, op, divisor, dst, a, b, n, (double)divisor);
    }
}

/* Floating part of zccl_kernel_scale(); count > 0 and divisor >= 2. */
ZK_HIDDEN void zccl_kernels_scale_float(void *dst, const void *src, size_t n, zccl_datatype_t dt, uint32_t divisor)
{
    if (dt == ZCCL_FLOAT32)
        zk_scale_f32(dst, src, n, (float)divisor);
    else if (dt == ZCCL_FLOAT64)
        zk_scale_f64(dst, src, n, (double)divisor);
}

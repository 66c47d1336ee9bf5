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

/*
 * Binary kernel d[i] = EXPR(x = a[i], y = b[i]), dv being the divisor in the working type (unused except for
 * the average). Operands are read before the store, so dst may equal a or b.
 */
#define ZK_BINARY(name, UT, T, EXPR)                                                                            \
    ZK_CLONES static void name(void *dst_, const void *a_, const void *b_, size_t n, T dv)                     \
    {                                                                                                          \
        UT *d = dst_;                                                                                          \
        const UT *a = a_;                                                                                      \
        const UT *b = b_;                                                                                      \
        for (size_t i = 0; i < n; i++) {                                                                       \
            const T x = a[i];                                                                                  \
            const T y = b[i];                                                                                  \
            d[i] = (EXPR);                                                                                     \
        }                                                                                                      \
    }

/* Unary kernel d[i] = s[i] / dv for zccl_kernel_scale; dst may equal src. */
#define ZK_SCALE(name, UT, T)                                                                                   \
    ZK_CLONES static void name(void *dst_, const void *s_, size_t n, T dv)                                     \
    {                                                                                                          \
        UT *d = dst_;                                                                                          \
        const UT *s = s_;                                                                                      \
        for (size_t i = 0; i < n; i++)                                                                         \
            d[i] = s[i] / dv;                                                                                  \
    }

/*
 * The average divides rather than multiplying by 1/divisor: the reciprocal is rounded, and the product would
 * then differ from the quotient in the last bit for some inputs. Division keeps the documented result,
 * (a + b) / divisor with two roundings, and the loop is memory-bound either way.
 */
ZK_BINARY(zk_sum_f32, zk_f32, float, x + y)
ZK_BINARY(zk_prod_f32, zk_f32, float, x * y)
ZK_BINARY(zk_max_f32, zk_f32, float, zk_maxf(x, y))
ZK_BINARY(zk_min_f32, zk_f32, float, zk_minf(x, y))
ZK_BINARY(zk_avg_f32, zk_f32, float, (x + y) / dv)
ZK_SCALE(zk_scale_f32, zk_f32, float)

ZK_BINARY(zk_sum_f64, zk_f64, double, x + y)
ZK_BINARY(zk_prod_f64, zk_f64, double, x * y)
ZK_BINARY(zk_max_f64, zk_f64, double, zk_max(x, y))
ZK_BINARY(zk_min_f64, zk_f64, double, zk_min(x, y))
ZK_BINARY(zk_avg_f64, zk_f64, double, (x + y) / dv)
ZK_SCALE(zk_scale_f64, zk_f64, double)

/* Floating part of zccl_kernel_reduce(); dt is ZCCL_FLOAT32 or ZCCL_FLOAT64 and count > 0. */
ZK_HIDDEN void zccl_kernels_reduce_float(void *dst, const void *a, const void *b, size_t n, zccl_datatype_t dt,
                                         zccl_redop_t op, uint32_t divisor)
{
    const int avg = (op == ZCCL_SUM || op == ZCCL_AVG) && divisor > 1;

    if (dt == ZCCL_FLOAT32) {
        /* (float)divisor is exact up to 2^24, far above the 65536-rank limit of zccl_comm_init_rank. */
        const float dv = (float)divisor;
        if (avg)
            zk_avg_f32(dst, a, b, n, dv);
        else if (op == ZCCL_SUM || op == ZCCL_AVG)
            zk_sum_f32(dst, a, b, n, dv);
        else if (op == ZCCL_PROD)
            zk_prod_f32(dst, a, b, n, dv);
        else if (op == ZCCL_MAX)
            zk_max_f32(dst, a, b, n, dv);
        else if (op == ZCCL_MIN)
            zk_min_f32(dst, a, b, n, dv);
    } else if (dt == ZCCL_FLOAT64) {
        const double dv = (double)divisor;
        if (avg)
            zk_avg_f64(dst, a, b, n, dv);
        else if (op == ZCCL_SUM || op == ZCCL_AVG)
            zk_sum_f64(dst, a, b, n, dv);
        else if (op == ZCCL_PROD)
            zk_prod_f64(dst, a, b, n, dv);
        else if (op == ZCCL_MAX)
            zk_max_f64(dst, a, b, n, dv);
        else if (op == ZCCL_MIN)
            zk_min_f64(dst, a, b, n, dv);
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

/*
 * reduce_ops.cuh — one element of every reduction, for the CUDA kernels (zccl_kernels.cu) and, compiled by the host
 * C++ compiler, for the CPU test that checks them against the CPU kernels (tests/test_cuda_elem.cpp): the GPU and
 * that test run this same code. Built on kernels/elem_math.h (conversions and each op's float semantics).
 *
 * zccl_cu_elem<DT>: storage type `T` and `apply<OP>(a, b, divisor)` / `premul(scalar, x)` with kernels.h's
 * semantics: integers wrap (unsigned arithmetic) and divide truncating; narrow floats widen to float32, combine,
 * divide, round once (fp8 saturating); float32 divides in float, float64 in double; MAX/MIN as fmax/fmin (a NaN
 * operand yields the other one, -0 below +0).
 */
#ifndef ZCCL_CUDA_REDUCE_OPS_CUH
#define ZCCL_CUDA_REDUCE_OPS_CUH

#include <stdint.h>
#include "elem_math.h"
#include "zccl.h"

#if defined(__CUDACC__)
#define ZCCL_HD __host__ __device__ __forceinline__
#else
#define ZCCL_HD inline
#endif

namespace zccl_cu {

ZCCL_HD double maxd(double x, double y) {
    const double larger = x > y ? x : y;
    const double r = x == y ? zccl_em_from_bits64(zccl_em_bits64(x) & zccl_em_bits64(y)) : larger;
    return y != y ? x : r;
}
ZCCL_HD double mind(double x, double y) {
    const double smaller = x < y ? x : y;
    const double r = x == y ? zccl_em_from_bits64(zccl_em_bits64(x) | zccl_em_bits64(y)) : smaller;
    return y != y ? x : r;
}

/* Integers: T the storage, U the unsigned type of the same width for wrapping sum and product. */
template <typename T, typename U> struct int_elem {
    typedef T type;
    template <int OP> static ZCCL_HD T apply(T a, T b, uint32_t div) {
        if (OP == ZCCL_SUM) {
            const T s = (T)(U)((U)a + (U)b);
            if (div <= 1) return s;
            return (T)(-1) < (T)0 ? (T)((int64_t)s / (int64_t)div) : (T)((uint64_t)s / (uint64_t)div);
        }
        if (OP == ZCCL_PROD) return (T)(U)((U)a * (U)b);
        if (OP == ZCCL_MAX) return a > b ? a : b;
        return a < b ? a : b; /* MIN */
    }
    static ZCCL_HD T premul(T s, T x) { return (T)(U)((U)s * (U)x); }
};

/* Narrow floats stored as bits: widen, combine in float32, narrow once. */
template <typename C> struct narrow_elem {
    typedef typename C::type T;
    typedef T type;
    static ZCCL_HD float WIDEN(T v) { return C::widen(v); }
    static ZCCL_HD T NARROW(float f) { return C::narrow(f); }
    template <int OP> static ZCCL_HD T apply(T a, T b, uint32_t div) {
        const float x = WIDEN(a), y = WIDEN(b);
        float r;
        if (OP == ZCCL_SUM) r = div > 1 ? zccl_em_avgf(x, y, (float)div) : zccl_em_sumf(x, y);
        else if (OP == ZCCL_PROD) r = zccl_em_prodf(x, y);
        else if (OP == ZCCL_MAX) r = zccl_em_maxf(x, y);
        else r = zccl_em_minf(x, y);
        return NARROW(r);
    }
    static ZCCL_HD T premul(T s, T x) { return NARROW(zccl_em_premulf(WIDEN(s), WIDEN(x))); }
};

struct f32_elem {
    typedef float type;
    template <int OP> static ZCCL_HD float apply(float x, float y, uint32_t div) {
        if (OP == ZCCL_SUM) return div > 1 ? zccl_em_avgf(x, y, (float)div) : zccl_em_sumf(x, y);
        if (OP == ZCCL_PROD) return zccl_em_prodf(x, y);
        if (OP == ZCCL_MAX) return zccl_em_maxf(x, y);
        return zccl_em_minf(x, y);
    }
    static ZCCL_HD float premul(float s, float x) { return zccl_em_premulf(s, x); }
};

struct f64_elem {
    typedef double type;
    template <int OP> static ZCCL_HD double apply(double x, double y, uint32_t div) {
        if (OP == ZCCL_SUM) return div > 1 ? (x + y) / (double)div : x + y;
        if (OP == ZCCL_PROD) return x * y;
        if (OP == ZCCL_MAX) return maxd(x, y);
        return mind(x, y);
    }
    static ZCCL_HD double premul(double s, double x) { return s * x; }
};

#define ZCCL_CU_CONV(name, T, w, n)                                                                             \
    struct name {                                                                                              \
        typedef T type;                                                                                        \
        static ZCCL_HD float widen(T v) { return w(v); }                                                       \
        static ZCCL_HD T narrow(float f) { return n(f); }                                                      \
    };
ZCCL_CU_CONV(conv_half, uint16_t, zccl_em_half_to_float, zccl_em_float_to_half)
ZCCL_CU_CONV(conv_bf16, uint16_t, zccl_em_bf16_to_float, zccl_em_float_to_bf16)
ZCCL_CU_CONV(conv_e4m3, uint8_t, zccl_em_e4m3_to_float, zccl_em_float_to_e4m3)
ZCCL_CU_CONV(conv_e5m2, uint8_t, zccl_em_e5m2_to_float, zccl_em_float_to_e5m2)

template <int DT> struct elem;
template <> struct elem<ZCCL_INT8> : int_elem<int8_t, uint8_t> {};
template <> struct elem<ZCCL_UINT8> : int_elem<uint8_t, uint8_t> {};
template <> struct elem<ZCCL_INT32> : int_elem<int32_t, uint32_t> {};
template <> struct elem<ZCCL_UINT32> : int_elem<uint32_t, uint32_t> {};
template <> struct elem<ZCCL_INT64> : int_elem<int64_t, uint64_t> {};
template <> struct elem<ZCCL_UINT64> : int_elem<uint64_t, uint64_t> {};
template <> struct elem<ZCCL_FLOAT16> : narrow_elem<conv_half> {};
template <> struct elem<ZCCL_FLOAT32> : f32_elem {};
template <> struct elem<ZCCL_FLOAT64> : f64_elem {};
template <> struct elem<ZCCL_BFLOAT16> : narrow_elem<conv_bf16> {};
template <> struct elem<ZCCL_FLOAT8E4M3> : narrow_elem<conv_e4m3> {};
template <> struct elem<ZCCL_FLOAT8E5M2> : narrow_elem<conv_e5m2> {};

/* The scalar loop every kernel thread runs over its elements (and the CPU test runs over a whole vector). */
template <int DT, int OP>
ZCCL_HD void reduce_range(typename elem<DT>::type *dst, const typename elem<DT>::type *a,
                          const typename elem<DT>::type *b, size_t begin, size_t end, size_t stride, uint32_t div) {
    for (size_t i = begin; i < end; i += stride) dst[i] = elem<DT>::template apply<OP>(a[i], b[i], div);
}

} // namespace zccl_cu

#endif

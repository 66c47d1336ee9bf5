/*
 * zccl_kernels.cu — the CUDA kernels of the memory layer (mem/mem_cuda.c loads them from the fatbin CMake
 * embeds in libzccl and launches them with cuLaunchKernel): a reduction for every datatype x op, PreMulSum's
 * product for every datatype, and a copy. Grid-stride loops; when every pointer is 16-byte aligned each thread
 * moves 16 bytes per load and store (uint4), the tail and unaligned buffers go element by element. The element
 * arithmetic is reduce_ops.cuh over kernels/elem_math.h, the same code the CPU kernels and tests use.
 *
 * Names and parameters (the contract with mem_cuda.c):
 *   zccl_reduce_<dt>_<op>(void *dst, const void *a, const void *b, size_t count, uint32_t divisor)
 *   zccl_premul_<dt>(void *dst, const void *src, size_t count, uint64_t scalar_bits)
 *   zccl_copy(void *dst, const void *src, size_t bytes)
 */
#include <stdint.h>
#include "reduce_ops.cuh"

namespace {

__device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <int DT, int OP>
__device__ void reduce_body(void *dst_, const void *a_, const void *b_, size_t n, uint32_t div) {
    typedef typename zccl_cu::elem<DT>::type T;
    constexpr int V = 16 / sizeof(T);
    T *dst = (T *)dst_;
    const T *a = (const T *)a_, *b = (const T *)b_;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nthr = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (aligned16(dst) && aligned16(a) && aligned16(b)) {
        const size_t nv = n / V;
        for (size_t v = tid; v < nv; v += nthr) {
            union { uint4 u; T e[V]; } x, y, r;
            x.u = ((const uint4 *)a)[v];
            y.u = ((const uint4 *)b)[v];
#pragma unroll
            for (int k = 0; k < V; k++) r.e[k] = zccl_cu::elem<DT>::template apply<OP>(x.e[k], y.e[k], div);
            ((uint4 *)dst)[v] = r.u;
        }
        done = nv * V;
    }
    zccl_cu::reduce_range<DT, OP>(dst, a, b, done + tid, n, nthr, div);
}

template <int DT>
__device__ void premul_body(void *dst_, const void *src_, size_t n, uint64_t bits) {
    typedef typename zccl_cu::elem<DT>::type T;
    T s;
    memcpy(&s, &bits, sizeof s);
    T *dst = (T *)dst_;
    const T *src = (const T *)src_;
    const size_t nthr = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += nthr)
        dst[i] = zccl_cu::elem<DT>::premul(s, src[i]);
}

} // namespace

#define ZCCL_RED(dt, op)                                                                                        \
    extern "C" __global__ void zccl_reduce_##dt##_##op(void *dst, const void *a, const void *b, size_t n,          \
                                                      uint32_t div) {                                          \
        reduce_body<dt, op>(dst, a, b, n, div);                                                                 \
    }
/* op 4 (AVG) is launched as SUM with a divisor; its kernel exists so that every (dt, op) name resolves. */
#define ZCCL_RED_ALL(dt)                                                                                        \
    ZCCL_RED(dt, 0) ZCCL_RED(dt, 1) ZCCL_RED(dt, 2) ZCCL_RED(dt, 3)                                             \
    extern "C" __global__ void zccl_reduce_##dt##_4(void *dst, const void *a, const void *b, size_t n,             \
                                                   uint32_t div) {                                              \
        reduce_body<dt, 0>(dst, a, b, n, div);                                                                  \
    }                                                                                                          \
    extern "C" __global__ void zccl_premul_##dt(void *dst, const void *src, size_t n, uint64_t bits) {             \
        premul_body<dt>(dst, src, n, bits);                                                                     \
    }

/* Datatype numbers of zccl.h (checked below). */
ZCCL_RED_ALL(0)
ZCCL_RED_ALL(1)
ZCCL_RED_ALL(2)
ZCCL_RED_ALL(3)
ZCCL_RED_ALL(4)
ZCCL_RED_ALL(5)
ZCCL_RED_ALL(6)
ZCCL_RED_ALL(7)
ZCCL_RED_ALL(8)
ZCCL_RED_ALL(9)
ZCCL_RED_ALL(10)
ZCCL_RED_ALL(11)
static_assert(ZCCL_NUM_TYPES == 12 && ZCCL_NUM_OPS == 5, "one kernel per datatype x op: update the list above");

extern "C" __global__ void zccl_copy(void *dst, const void *src, size_t bytes) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nthr = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (aligned16(dst) && aligned16(src)) {
        const size_t nv = bytes / 16;
        for (size_t v = tid; v < nv; v += nthr) ((uint4 *)dst)[v] = ((const uint4 *)src)[v];
        done = nv * 16;
    }
    for (size_t i = done + tid; i < bytes; i += nthr) ((uint8_t *)dst)[i] = ((const uint8_t *)src)[i];
}

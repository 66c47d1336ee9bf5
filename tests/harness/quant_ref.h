/*
 * quant_ref.h — what the tests of the quantized collectives share (test_quant_coll.cpp, test_quant_hier.cpp): the
 * error bound of one quantization (include/zccl.h, zccl_wire_t) and of the output conversion, the inputs every rank
 * can recompute for any rank (a hash of rank, case and index), element access in float32/float64/float16/bfloat16,
 * a hash of an output for the bitwise comparison across ranks.
 */
#ifndef ZCCL_TEST_QUANT_REF_H
#define ZCCL_TEST_QUANT_REF_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "elem_math.h"
#include "zccl.h"

namespace zq {

inline const zccl_wire_t kWires[] = {ZCCL_WIRE_INT8, ZCCL_WIRE_INT4, ZCCL_WIRE_FP8E4M3, ZCCL_WIRE_FP8E5M2};
inline const zccl_datatype_t kTypes[] = {ZCCL_FLOAT32, ZCCL_FLOAT64, ZCCL_FLOAT16, ZCCL_BFLOAT16};
/* The hierarchical calls (zccl_hier.h) do not take float64. */
inline const zccl_datatype_t kHierTypes[] = {ZCCL_FLOAT32, ZCCL_FLOAT16, ZCCL_BFLOAT16};
constexpr double kU = 5.9604644775390625e-08; /* 2^-24 */

inline double qbound(zccl_wire_t w, double x, double amax) {
    double m;
    switch (w) {
    case ZCCL_WIRE_INT8: m = amax / 254.0; break;
    case ZCCL_WIRE_INT4: m = amax / 14.0; break;
    case ZCCL_WIRE_FP8E4M3: m = std::ldexp(std::fabs(x), -4) + std::ldexp(amax / 448.0, -10); break;
    default: m = std::ldexp(std::fabs(x), -3) + std::ldexp(amax / 57344.0, -17); break;
    }
    return m + std::ldexp(amax, -21) + std::ldexp(1.0, -140);
}
/* One quantization of an input element of type dt: float64 is rounded to float32 first (zccl.h, E64). */
inline double qbound_in(zccl_datatype_t dt, zccl_wire_t w, double x, double amax) {
    const double e = qbound(w, x, amax);
    return dt == ZCCL_FLOAT64 ? e * (1 + kU) + kU * std::fabs(x) : e;
}
inline double out_bound(zccl_datatype_t dt, double y) {
    if (dt == ZCCL_FLOAT16) return std::ldexp(std::fabs(y), -11) + std::ldexp(1.0, -25);
    if (dt == ZCCL_BFLOAT16) return std::ldexp(std::fabs(y), -8) + std::ldexp(1.0, -134);
    return 0;
}
inline size_t esize(zccl_datatype_t dt) { return dt == ZCCL_FLOAT64 ? 8 : dt == ZCCL_FLOAT32 ? 4 : 2; }

/* Input element i of rank r in case c, as float32 before narrowing: a hash in [-1, 1) times a magnitude that
 * changes every 37 elements (so that blocks have different maxima). */
inline float gen(int r, int c, size_t i) {
    uint64_t h = (uint64_t)r * 0x9E3779B97F4A7C15ull ^ (uint64_t)c * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)i * 0x165667B19E3779F9ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const double u = (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    const double mag = std::ldexp(1.0, (int)((i / 37 + (size_t)r) % 9) - 4);
    return (float)(u * mag);
}
/* Float64 stores f slightly moved off the float32 grid (by 3 * 2^-28 of itself), so the wire's rounding to float32
 * is exercised. */
inline void store(zccl_datatype_t dt, void *buf, size_t i, float f) {
    if (dt == ZCCL_FLOAT64) {
        const double d = (double)f * (1.0 + 3.0 * std::ldexp(1.0, -28));
        memcpy((char *)buf + 8 * i, &d, 8);
        return;
    }
    if (dt == ZCCL_FLOAT32) {
        memcpy((char *)buf + 4 * i, &f, 4);
        return;
    }
    const uint16_t h = dt == ZCCL_FLOAT16 ? zccl_em_float_to_half(f) : zccl_em_float_to_bf16(f);
    memcpy((char *)buf + 2 * i, &h, 2);
}
inline double load(zccl_datatype_t dt, const void *buf, size_t i) {
    if (dt == ZCCL_FLOAT64) {
        double d;
        memcpy(&d, (const char *)buf + 8 * i, 8);
        return d;
    }
    if (dt == ZCCL_FLOAT32) {
        float f;
        memcpy(&f, (const char *)buf + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)buf + 2 * i, 2);
    return dt == ZCCL_FLOAT16 ? zccl_em_half_to_float(h) : zccl_em_bf16_to_float(h);
}
/* The exact value of the input element once narrowed to dt. */
inline double input(zccl_datatype_t dt, int r, int c, size_t i) {
    uint8_t b[8];
    store(dt, b, 0, gen(r, c, i));
    return load(dt, b, 0);
}
inline std::vector<uint8_t> make(zccl_datatype_t dt, int r, int c, size_t n) {
    std::vector<uint8_t> v(n * esize(dt) + 1);
    for (size_t i = 0; i < n; i++) store(dt, v.data(), i, gen(r, c, i));
    return v;
}
inline uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}
/* Largest |x| over block [b0, b1) of element index f(i). */
template <class F> inline double amax_of(size_t b0, size_t b1, F f) {
    double m = 0;
    for (size_t i = b0; i < b1; i++) m = std::max(m, std::fabs(f(i)));
    return m;
}

inline const char *dtn(zccl_datatype_t dt) {
    return dt == ZCCL_FLOAT32 ? "f32" : dt == ZCCL_FLOAT64 ? "f64" : dt == ZCCL_FLOAT16 ? "f16" : "bf16";
}

}  // namespace zq

#endif

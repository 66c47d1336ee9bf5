// test_kernels.cpp — unit tests of the CPU reduction kernels (kernels/kernels.h).
//
// Every result is checked against a reference computed here independently of the kernels' code paths: integers
// in 128-bit arithmetic reduced modulo 2^bits, floating types in binary128 (__float128) rounded with the
// compiler's conversions, and binary16/bfloat16 through a table of all 65536 encodings decoded with ldexp and a
// nearest-value search with explicit tie-breaking. binary128 is wide enough that rounding its exact or
// correctly rounded result once more to float or double gives the correctly rounded float or double result
// (p' >= 2p + 2), so the references are exact where the kernels must be.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif

namespace {

#if defined(__SIZEOF_FLOAT128__)
using wide_t = __float128;
#else
using wide_t = long double;  // binary128 on the 64-bit targets without __float128 (e.g. AArch64 Linux)
#endif
static_assert(std::numeric_limits<double>::digits == 53, "IEEE double expected");

using Rng = std::mt19937_64;

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
uint64_t bits_of(double f) {
    uint64_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
float float_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

const char *op_name(zccl_redop_t op) {
    switch (op) {
    case ZCCL_SUM: return "SUM";
    case ZCCL_PROD: return "PROD";
    case ZCCL_MAX: return "MAX";
    case ZCCL_MIN: return "MIN";
    case ZCCL_AVG: return "AVG";
    default: return "?";
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 16-bit float references
// ---------------------------------------------------------------------------------------------------------------

// Describes a 16-bit binary floating format by its exponent and fraction widths.
struct Format16 {
    int exp_bits;
    int frac_bits;
    int bias() const { return (1 << (exp_bits - 1)) - 1; }
    uint16_t exp_mask() const { return (uint16_t)(((1u << exp_bits) - 1) << frac_bits); }
    uint16_t frac_mask() const { return (uint16_t)((1u << frac_bits) - 1); }
    uint16_t inf() const { return exp_mask(); }
    uint16_t quiet_bit() const { return (uint16_t)(1u << (frac_bits - 1)); }
    bool is_nan(uint16_t h) const { return (h & exp_mask()) == exp_mask() && (h & frac_mask()) != 0; }
};
constexpr Format16 kHalf{5, 10};
constexpr Format16 kBf16{8, 7};

// The value of an encoding, written from the definition of the format: (2^p + m) * 2^(e - bias - p) for normal
// numbers, m * 2^(1 - bias - p) for subnormals. Exact in double for both formats.
double decode16(const Format16 &f, uint16_t h) {
    const int e = (h & f.exp_mask()) >> f.frac_bits;
    const int m = h & f.frac_mask();
    const bool neg = (h & 0x8000u) != 0;
    double v;
    if (e == (1 << f.exp_bits) - 1)
        v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (e == 0)
        v = std::ldexp((double)m, 1 - f.bias() - f.frac_bits);
    else
        v = std::ldexp((double)((1 << f.frac_bits) + m), e - f.bias() - f.frac_bits);
    return neg ? -v : v;
}

// Rounds a double to the nearest encoding of the format, ties to the even encoding, by searching the sorted
// table of all non-negative finite values; the infinity encoding stands in the table for the first value beyond
// the range (2^(emax+1)), which is how IEEE rounding decides overflow. NaN maps to the canonical quiet NaN.
class Rounder16 {
public:
    explicit Rounder16(const Format16 &f) : fmt_(f) {
        for (uint32_t k = 0; k < f.inf(); k++)
            values_.push_back(decode16(f, (uint16_t)k));
        values_.push_back(std::ldexp(1.0, f.bias() + 1));  // stands for the encoding f.inf()
    }

    uint16_t round(double x) const {
        if (std::isnan(x))
            return (uint16_t)(fmt_.inf() | fmt_.quiet_bit());
        const uint16_t sign = std::signbit(x) ? 0x8000u : 0;
        const double ax = std::fabs(x);
        if (ax >= values_.back())
            return sign | fmt_.inf();
        // values_[k] <= ax < values_[k + 1]
        const size_t k = (size_t)(std::upper_bound(values_.begin(), values_.end(), ax) - values_.begin()) - 1;
        if (values_[k] == ax)
            return sign | (uint16_t)k;
        // Neighbouring values are within a factor of two, so both differences are exact (Sterbenz) whenever
        // the comparison can be close; the comparison is therefore exact.
        const double below = ax - values_[k];
        const double above = values_[k + 1] - ax;
        size_t pick;
        if (below < above)
            pick = k;
        else if (above < below)
            pick = k + 1;
        else
            pick = (k % 2 == 0) ? k : k + 1;  // tie: the even encoding
        return sign | (uint16_t)pick;
    }

    const std::vector<double> &values() const { return values_; }

private:
    Format16 fmt_;
    std::vector<double> values_;
};

const Rounder16 &half_rounder() {
    static const Rounder16 r(kHalf);
    return r;
}
const Rounder16 &bf16_rounder() {
    static const Rounder16 r(kBf16);
    return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Floating-point max/min as documented: a NaN operand yields the other one; -0 < +0.
// ---------------------------------------------------------------------------------------------------------------

template <class F>
F ref_max(F x, F y) {
    if (std::isnan(x))
        return y;
    if (std::isnan(y))
        return x;
    if (x == 0 && y == 0)
        return (std::signbit(x) && std::signbit(y)) ? -F(0) : F(0);
    return x > y ? x : y;
}

template <class F>
F ref_min(F x, F y) {
    if (std::isnan(x))
        return y;
    if (std::isnan(y))
        return x;
    if (x == 0 && y == 0)
        return (std::signbit(x) || std::signbit(y)) ? -F(0) : F(0);
    return x < y ? x : y;
}

bool applies_divisor(zccl_redop_t op, uint32_t d) { return (op == ZCCL_SUM || op == ZCCL_AVG) && d > 1; }

// ---------------------------------------------------------------------------------------------------------------
// Per-datatype traits: element storage type, generator, reference and comparison.
// ---------------------------------------------------------------------------------------------------------------

template <class T, zccl_datatype_t DT>
struct IntTraits {
    using Elem = T;
    using U = std::make_unsigned_t<T>;
    static constexpr zccl_datatype_t dt = DT;

    static T gen(Rng &rng) {
        const T specials[] = {T(0), T(1), T(2), T(-1), std::numeric_limits<T>::min(), std::numeric_limits<T>::max(),
                              T(std::numeric_limits<T>::min() + 1), T(std::numeric_limits<T>::max() - 1), T(7)};
        const uint64_t r = rng();
        if (r % 4 == 0)
            return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
        if (r % 4 == 1)
            return (T)(int64_t)((int)((r >> 8) % 201) - 100);  // small values: products and sums stay readable
        return (T)(U)(rng());
    }

    // The reduced value modulo 2^bits, read back in T (two's complement).
    static T wrap(__int128 v) { return (T)(U)(unsigned __int128)v; }

    static T ref(T x, T y, zccl_redop_t op, uint32_t d) {
        if (applies_divisor(op, d)) {
            const __int128 s = (__int128)wrap((__int128)x + (__int128)y);
            return (T)(s / (__int128)d);  // C++ division truncates toward zero
        }
        switch (op) {
        case ZCCL_SUM:
        case ZCCL_AVG: return wrap((__int128)x + (__int128)y);
        case ZCCL_PROD: return wrap((__int128)((unsigned __int128)(U)x * (unsigned __int128)(U)y));
        case ZCCL_MAX: return std::max(x, y);
        case ZCCL_MIN: return std::min(x, y);
        default: return T(0);
        }
    }

    static T ref_scale(T x, uint32_t d) { return d <= 1 ? x : (T)((__int128)x / (__int128)d); }
    static bool same(T want, T got) { return want == got; }
    static bool bits_equal(T want, T got) { return want == got; }
    static std::string show(T v) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%lld (0x%llx)", (long long)v, (unsigned long long)(U)v);
        return buf;
    }
};

template <class F, zccl_datatype_t DT>
struct FloatTraits {
    using Elem = F;
    using Bits = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
    static constexpr zccl_datatype_t dt = DT;

    static F gen(Rng &rng) {
        const F inf = std::numeric_limits<F>::infinity();
        const F specials[] = {F(0), -F(0), inf, -inf, std::numeric_limits<F>::quiet_NaN(),
                              std::numeric_limits<F>::signaling_NaN(), -std::numeric_limits<F>::quiet_NaN(),
                              std::numeric_limits<F>::denorm_min(), -std::numeric_limits<F>::denorm_min(),
                              std::numeric_limits<F>::min(), std::numeric_limits<F>::max(),
                              -std::numeric_limits<F>::max(), F(1), F(-1), F(0.5), F(3)};
        const uint64_t r = rng();
        switch (r % 8) {
        case 0:
        case 1: return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
        case 2: {  // arbitrary bit patterns: every exponent, subnormals, NaN payloads
            Bits b = (Bits)rng();
            F f;
            std::memcpy(&f, &b, sizeof f);
            return f;
        }
        default: {  // moderate values, so that sums cancel and round in interesting ways
            std::uniform_real_distribution<F> u(F(-1000), F(1000));
            const F v = u(rng);
            return (r >> 8) % 3 == 0 ? std::ldexp(v, (int)((r >> 16) % 40) - 20) : v;
        }
        }
    }

    static F ref(F x, F y, zccl_redop_t op, uint32_t d) {
        if (applies_divisor(op, d)) {
            const F s = (F)((wide_t)x + (wide_t)y);
            return (F)((wide_t)s / (wide_t)(F)d);
        }
        switch (op) {
        case ZCCL_SUM:
        case ZCCL_AVG: return (F)((wide_t)x + (wide_t)y);
        case ZCCL_PROD: return (F)((wide_t)x * (wide_t)y);
        case ZCCL_MAX: return ref_max(x, y);
        case ZCCL_MIN: return ref_min(x, y);
        default: return F(0);
        }
    }

    static F ref_scale(F x, uint32_t d) { return d <= 1 ? x : (F)((wide_t)x / (wide_t)(F)d); }

    // NaN matches any NaN (payloads are not specified); everything else must match bit for bit, so that the sign
    // of zero is checked too. Scaling by 1 is a copy and is compared by bits_equal() instead.
    static bool same(F want, F got) { return std::isnan(want) ? std::isnan(got) : bits_of(want) == bits_of(got); }
    static bool bits_equal(F want, F got) { return bits_of(want) == bits_of(got); }
    static std::string show(F v) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%.17g (0x%llx)", (double)v, (unsigned long long)bits_of(v));
        return buf;
    }
};

// binary16 and bfloat16: elements are their 16-bit encodings.
template <zccl_datatype_t DT>
struct Half16Traits {
    using Elem = uint16_t;
    static constexpr zccl_datatype_t dt = DT;
    static const Format16 &fmt() { return DT == ZCCL_FLOAT16 ? kHalf : kBf16; }
    static const Rounder16 &rounder() { return DT == ZCCL_FLOAT16 ? half_rounder() : bf16_rounder(); }

    static uint16_t gen(Rng &rng) {
        const Format16 &f = fmt();
        const uint16_t one = (uint16_t)(f.bias() << f.frac_bits);
        const uint16_t specials[] = {0x0000, 0x8000, f.inf(), (uint16_t)(0x8000 | f.inf()),
                                     (uint16_t)(f.inf() | f.quiet_bit()), (uint16_t)(f.inf() | 1),
                                     0x0001, 0x8001, f.frac_mask(), (uint16_t)(f.frac_mask() + 1),
                                     (uint16_t)(f.inf() - 1), (uint16_t)(0x8000 | (f.inf() - 1)), one,
                                     (uint16_t)(0x8000 | one), (uint16_t)(one + 1), (uint16_t)(one - 1)};
        const uint64_t r = rng();
        switch (r % 8) {
        case 0: return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
        case 1:
        case 2: return (uint16_t)rng();
        default: {  // exponents within +-6 of 1: sums round, cancel and tie often
            const uint16_t e = (uint16_t)(f.bias() - 6 + (int)((r >> 8) % 13));
            const uint16_t m = (uint16_t)((r >> 16) & f.frac_mask());
            return (uint16_t)(((r >> 32) & 1 ? 0x8000 : 0) | (e << f.frac_bits) | m);
        }
        }
    }

    // As specified: widen exactly, combine with float32 rounding (and divide, rounding again), narrow once.
    static uint16_t ref(uint16_t a, uint16_t b, zccl_redop_t op, uint32_t d) {
        const double x = decode16(fmt(), a), y = decode16(fmt(), b);
        float r;
        if (applies_divisor(op, d)) {
            const float s = (float)((wide_t)x + (wide_t)y);
            r = (float)((wide_t)s / (wide_t)(float)d);
        } else {
            switch (op) {
            case ZCCL_SUM:
            case ZCCL_AVG: r = (float)((wide_t)x + (wide_t)y); break;
            case ZCCL_PROD: r = (float)((wide_t)x * (wide_t)y); break;
            case ZCCL_MAX: r = (float)ref_max(x, y); break;
            case ZCCL_MIN: r = (float)ref_min(x, y); break;
            default: r = 0; break;
            }
        }
        return rounder().round((double)r);
    }

    static uint16_t ref_scale(uint16_t a, uint32_t d) {
        if (d <= 1)
            return a;
        return rounder().round((double)(float)((wide_t)decode16(fmt(), a) / (wide_t)(float)d));
    }

    static bool same(uint16_t want, uint16_t got) {
        return fmt().is_nan(want) ? fmt().is_nan(got) : want == got;
    }
    static bool bits_equal(uint16_t want, uint16_t got) { return want == got; }
    static std::string show(uint16_t v) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%.10g (0x%04x)", decode16(fmt(), v), (unsigned)v);
        return buf;
    }
};

using I8 = IntTraits<int8_t, ZCCL_INT8>;
using U8 = IntTraits<uint8_t, ZCCL_UINT8>;
using I32 = IntTraits<int32_t, ZCCL_INT32>;
using U32 = IntTraits<uint32_t, ZCCL_UINT32>;
using I64 = IntTraits<int64_t, ZCCL_INT64>;
using U64 = IntTraits<uint64_t, ZCCL_UINT64>;
using F32 = FloatTraits<float, ZCCL_FLOAT32>;
using F64 = FloatTraits<double, ZCCL_FLOAT64>;
using F16 = Half16Traits<ZCCL_FLOAT16>;
using BF16 = Half16Traits<ZCCL_BFLOAT16>;

// ---------------------------------------------------------------------------------------------------------------
// Buffers with guard zones, placed at a chosen byte offset from a 64-byte boundary.
// ---------------------------------------------------------------------------------------------------------------

constexpr unsigned char kCanary = 0xA5;

class GuardedBuffer {
public:
    GuardedBuffer(size_t bytes, size_t offset) : mem_(bytes + offset + 192, kCanary), bytes_(bytes) {
        uintptr_t base = (reinterpret_cast<uintptr_t>(mem_.data()) + 64 + 63) & ~(uintptr_t)63;
        p_ = reinterpret_cast<unsigned char *>(base) + offset;
    }
    unsigned char *data() { return p_; }
    bool guards_intact() const {
        const unsigned char *begin = mem_.data(), *end = mem_.data() + mem_.size();
        for (const unsigned char *q = begin; q < p_; q++)
            if (*q != kCanary)
                return false;
        for (const unsigned char *q = p_ + bytes_; q < end; q++)
            if (*q != kCanary)
                return false;
        return true;
    }

private:
    std::vector<unsigned char> mem_;
    unsigned char *p_;
    size_t bytes_;
};

template <class E>
void store(unsigned char *p, const std::vector<E> &v) {
    if (!v.empty())
        std::memcpy(p, v.data(), v.size() * sizeof(E));
}
template <class E>
std::vector<E> load(const unsigned char *p, size_t n) {
    std::vector<E> v(n);
    if (n)
        std::memcpy(v.data(), p, n * sizeof(E));
    return v;
}

// Where the output goes relative to the inputs.
enum class Layout { kOutOfPlace, kDstIsA, kDstIsB, kSameInputs, kAllSame };
const char *layout_name(Layout l) {
    switch (l) {
    case Layout::kOutOfPlace: return "out-of-place";
    case Layout::kDstIsA: return "dst==a";
    case Layout::kDstIsB: return "dst==b";
    case Layout::kSameInputs: return "a==b";
    case Layout::kAllSame: return "dst==a==b";
    }
    return "?";
}
constexpr Layout kLayouts[] = {Layout::kOutOfPlace, Layout::kDstIsA, Layout::kDstIsB, Layout::kSameInputs,
                               Layout::kAllSame};

constexpr size_t kLengths[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 1000, 4099};

// Byte offsets of the buffers from a 64-byte boundary: aligned, one and three elements off, and (for elements
// wider than a byte) not even element-aligned, which kernels.h says works too.
template <class E>
std::vector<size_t> offsets_for() {
    std::vector<size_t> o = {0, sizeof(E), 3 * sizeof(E)};
    if (sizeof(E) > 1)
        o.push_back(1);
    return o;
}

// Runs one reduction in the given layout and compares every element with the reference; returns false (after
// recording a failure that names the case) on the first mismatch.
template <class Tr>
bool run_reduce_case(const std::vector<typename Tr::Elem> &va, const std::vector<typename Tr::Elem> &vb_in,
                     zccl_redop_t op, uint32_t d, Layout layout, size_t offset) {
    using E = typename Tr::Elem;
    const size_t n = va.size(), bytes = n * sizeof(E);
    const bool shared_inputs = layout == Layout::kSameInputs || layout == Layout::kAllSame;
    const std::vector<E> &vb = shared_inputs ? va : vb_in;

    GuardedBuffer ba(bytes, offset), bb(bytes, offset), bd(bytes, offset);
    store(ba.data(), va);
    store(bb.data(), vb);
    unsigned char *a = ba.data(), *b = bb.data(), *dst = bd.data();
    switch (layout) {
    case Layout::kOutOfPlace: break;
    case Layout::kDstIsA: dst = a; break;
    case Layout::kDstIsB: dst = b; break;
    case Layout::kSameInputs: b = a; break;
    case Layout::kAllSame: b = a; dst = a; break;
    }
    zccl_kernel_reduce(dst, a, b, n, Tr::dt, op, d);

    const std::string where = std::string(op_name(op)) + " divisor=" + std::to_string(d) + " n=" +
                              std::to_string(n) + " " + layout_name(layout) + " offset=" + std::to_string(offset);
    const std::vector<E> got = load<E>(dst, n);
    for (size_t i = 0; i < n; i++) {
        const E want = Tr::ref(va[i], vb[i], op, d);
        if (!Tr::same(want, got[i])) {
            ADD_FAILURE() << where << " i=" << i << ": a=" << Tr::show(va[i]) << " b=" << Tr::show(vb[i])
                          << " want " << Tr::show(want) << " got " << Tr::show(got[i]);
            return false;
        }
    }
    if (!ba.guards_intact() || !bb.guards_intact() || !bd.guards_intact()) {
        ADD_FAILURE() << where << ": wrote outside the output";
        return false;
    }
    // Inputs that are not the output must be untouched.
    if (dst != a && n && std::memcmp(a, va.data(), bytes) != 0) {
        ADD_FAILURE() << where << ": modified input a";
        return false;
    }
    if (dst != b && n && std::memcmp(b, vb.data(), bytes) != 0) {
        ADD_FAILURE() << where << ": modified input b";
        return false;
    }
    return true;
}

struct ReduceConfig {
    zccl_redop_t op;
    uint32_t divisor;
};

// SUM, PROD, MAX and MIN with no division (divisor 0 and 1 both mean none), the average with small, power-of-two
// and extreme divisors, ZCCL_AVG passed directly (treated as SUM), and a divisor given with an operation it does
// not apply to (ignored).
const std::vector<ReduceConfig> &reduce_configs() {
    static const std::vector<ReduceConfig> c = {
        {ZCCL_SUM, 0},  {ZCCL_SUM, 1},    {ZCCL_PROD, 0},     {ZCCL_MAX, 0},      {ZCCL_MIN, 0},
        {ZCCL_PROD, 1}, {ZCCL_MAX, 1},    {ZCCL_MIN, 1},      {ZCCL_SUM, 2},      {ZCCL_SUM, 3},
        {ZCCL_SUM, 7},  {ZCCL_SUM, 8},    {ZCCL_SUM, 255},    {ZCCL_SUM, 65536},  {ZCCL_SUM, 0xffffffffu},
        {ZCCL_AVG, 3},  {ZCCL_AVG, 1},    {ZCCL_MAX, 5},      {ZCCL_MIN, 5},      {ZCCL_PROD, 5}};
    return c;
}

template <class Tr>
void check_reduce_suite(uint64_t seed) {
    using E = typename Tr::Elem;
    Rng rng(seed);
    int failures = 0;
    for (size_t n : kLengths) {
        std::vector<E> va(n), vb(n);
        for (size_t i = 0; i < n; i++) {
            va[i] = Tr::gen(rng);
            vb[i] = Tr::gen(rng);
        }
        for (const ReduceConfig &c : reduce_configs())
            for (Layout layout : kLayouts)
                for (size_t offset : offsets_for<E>())
                    if (!run_reduce_case<Tr>(va, vb, c.op, c.divisor, layout, offset) && ++failures >= 10)
                        return;
    }
}

template <class Tr>
void check_scale_suite(uint64_t seed) {
    using E = typename Tr::Elem;
    Rng rng(seed);
    const uint32_t divisors[] = {0, 1, 2, 3, 7, 8, 255, 256, 65536, 0xffffffffu};
    int failures = 0;
    for (size_t n : kLengths) {
        std::vector<E> vs(n);
        for (auto &v : vs)
            v = Tr::gen(rng);
        for (uint32_t d : divisors)
            for (bool in_place : {false, true})
                for (size_t offset : offsets_for<E>()) {
                    GuardedBuffer bs(n * sizeof(E), offset), bd(n * sizeof(E), offset);
                    store(bs.data(), vs);
                    unsigned char *dst = in_place ? bs.data() : bd.data();
                    zccl_kernel_scale(dst, bs.data(), n, Tr::dt, d);
                    const std::vector<E> got = load<E>(dst, n);
                    for (size_t i = 0; i < n; i++) {
                        const E want = Tr::ref_scale(vs[i], d);
                        // Without division the result is a copy: bit for bit, NaN payloads included.
                        const bool ok = d <= 1 ? Tr::bits_equal(want, got[i]) : Tr::same(want, got[i]);
                        if (!ok) {
                            ADD_FAILURE() << "scale divisor=" << d << " n=" << n << (in_place ? " in-place" : "")
                                          << " offset=" << offset << " i=" << i << ": x=" << Tr::show(vs[i])
                                          << " want " << Tr::show(want) << " got " << Tr::show(got[i]);
                            if (++failures >= 10)
                                return;
                            break;
                        }
                    }
                    EXPECT_TRUE(bs.guards_intact() && bd.guards_intact()) << "scale wrote outside its output";
                    if (!in_place && n) {
                        EXPECT_EQ(0, std::memcmp(bs.data(), vs.data(), n * sizeof(E))) << "scale modified src";
                    }
                }
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Every datatype x operation x divisor x length x layout x offset against the reference.
// ---------------------------------------------------------------------------------------------------------------

TEST(Kernels, ReduceInt8) { check_reduce_suite<I8>(1); }
TEST(Kernels, ReduceUint8) { check_reduce_suite<U8>(2); }
TEST(Kernels, ReduceInt32) { check_reduce_suite<I32>(3); }
TEST(Kernels, ReduceUint32) { check_reduce_suite<U32>(4); }
TEST(Kernels, ReduceInt64) { check_reduce_suite<I64>(5); }
TEST(Kernels, ReduceUint64) { check_reduce_suite<U64>(6); }
TEST(Kernels, ReduceFloat16) { check_reduce_suite<F16>(7); }
TEST(Kernels, ReduceFloat32) { check_reduce_suite<F32>(8); }
TEST(Kernels, ReduceFloat64) { check_reduce_suite<F64>(9); }
TEST(Kernels, ReduceBfloat16) { check_reduce_suite<BF16>(10); }

TEST(Kernels, ScaleAllTypes) {
    check_scale_suite<I8>(11);
    check_scale_suite<U8>(12);
    check_scale_suite<I32>(13);
    check_scale_suite<U32>(14);
    check_scale_suite<I64>(15);
    check_scale_suite<U64>(16);
    check_scale_suite<F16>(17);
    check_scale_suite<F32>(18);
    check_scale_suite<F64>(19);
    check_scale_suite<BF16>(20);
}

// A zero-length call is a no-op that accepts NULL buffers, for every datatype and operation.
TEST(Kernels, ZeroCountTouchesNothing) {
    for (int dt = 0; dt < ZCCL_NUM_TYPES; dt++) {
        for (int op = 0; op < ZCCL_NUM_OPS; op++)
            zccl_kernel_reduce(nullptr, nullptr, nullptr, 0, (zccl_datatype_t)dt, (zccl_redop_t)op, 4);
        zccl_kernel_scale(nullptr, nullptr, 0, (zccl_datatype_t)dt, 4);
        zccl_kernel_scale(nullptr, nullptr, 0, (zccl_datatype_t)dt, 1);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------------------------------------------

// All 65536 binary16 values widen to the exact binary32 value (NaNs: same sign and payload, signalling ones
// staying signalling) and narrow back to themselves (NaNs: with the quiet bit set).
TEST(Kernels, HalfRoundTripExhaustive) {
    int failures = 0;
    for (uint32_t k = 0; k < 65536 && failures < 10; k++) {
        const uint16_t h = (uint16_t)k;
        const float f = zccl_half_to_float(h);
        const double want = decode16(kHalf, h);
        uint16_t back_want = h;
        if (kHalf.is_nan(h)) {
            const uint32_t want_bits = ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(h & 0x3ffu) << 13);
            if (bits_of(f) != want_bits) {
                ADD_FAILURE() << "half_to_float(0x" << std::hex << k << ") = 0x" << bits_of(f);
                failures++;
            }
            back_want = (uint16_t)(h | 0x0200u);
        } else if (bits_of(f) != bits_of((float)want)) {
            ADD_FAILURE() << "half_to_float(0x" << std::hex << k << ") = " << f << ", want " << want;
            failures++;
        }
        const uint16_t back = zccl_float_to_half(f);
        if (back != back_want) {
            ADD_FAILURE() << "float_to_half(half_to_float(0x" << std::hex << k << ")) = 0x" << back;
            failures++;
        }
    }
}

TEST(Kernels, Bf16RoundTripExhaustive) {
    int failures = 0;
    for (uint32_t k = 0; k < 65536 && failures < 10; k++) {
        const uint16_t h = (uint16_t)k;
        const float f = zccl_bf16_to_float(h);
        const double want = decode16(kBf16, h);
        if (bits_of(f) != ((uint32_t)h << 16) || (!kBf16.is_nan(h) && (double)f != want)) {
            ADD_FAILURE() << "bf16_to_float(0x" << std::hex << k << ") = 0x" << bits_of(f);
            failures++;
        }
        const uint16_t back = zccl_float_to_bf16(f);
        const uint16_t back_want = kBf16.is_nan(h) ? (uint16_t)(h | 0x0040u) : h;
        if (back != back_want) {
            ADD_FAILURE() << "float_to_bf16(bf16_to_float(0x" << std::hex << k << ")) = 0x" << back;
            failures++;
        }
    }
}

namespace {

// Checks one narrowing against the table reference; NaN must become a quiet NaN with the sign and the top payload
// bits of the input.
bool check_narrow(const Format16 &fmt, const Rounder16 &rounder, uint16_t (*narrow)(float), float f,
                  int *failures) {
    const uint16_t got = narrow(f);
    uint16_t want;
    const uint32_t x = bits_of(f);
    if (std::isnan(f))
        want = (uint16_t)(((x >> 16) & 0x8000u) | fmt.inf() | fmt.quiet_bit() |
                          ((x >> (23 - fmt.frac_bits)) & fmt.frac_mask()));
    else
        want = rounder.round((double)f);
    if (got != want) {
        if (++*failures <= 10)
            ADD_FAILURE() << "narrow(" << f << " = 0x" << std::hex << x << ") = 0x" << got << ", want 0x" << want;
        return false;
    }
    return true;
}

// The floats around every rounding boundary of a 16-bit format: for each pair of neighbouring values, their
// midpoint (exact in float) and the floats just below and above it, with both signs; and the neighbours of
// every representable value.
std::vector<float> boundary_floats(const Rounder16 &r) {
    std::vector<float> out;
    const std::vector<double> &v = r.values();
    const float inf = std::numeric_limits<float>::infinity();
    for (size_t k = 0; k + 1 < v.size(); k++) {
        const float mid = (float)((v[k] + v[k + 1]) / 2);
        const float val = (float)v[k];
        for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, inf), val, std::nextafter(val, inf),
                        std::nextafter(val, 0.0f)}) {
            out.push_back(f);
            out.push_back(-f);
        }
    }
    return out;
}

}  // namespace

// float -> binary16: every float whose top 10 fraction bits follow one of a few patterns, for every exponent,
// sign and every value of the 13 fraction bits that are rounded away (so every kind of tie, carry and
// underflow), plus the floats at and around every midpoint, plus random floats. Compared with the table
// reference and, where the compiler has _Float16, with the compiler's own conversion as a second opinion.
TEST(Kernels, FloatToHalfMatchesReference) {
    const Rounder16 &r = half_rounder();
    int failures = 0;
    const uint32_t top_patterns[] = {0x000, 0x001, 0x155, 0x200, 0x2aa, 0x3fe, 0x3ff};
    size_t checked = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 0; e < 256; e++)
            for (uint32_t top : top_patterns)
                for (uint32_t low = 0; low < 8192; low++) {
                    const float f = float_from_bits((sign << 31) | (e << 23) | (top << 13) | low);
                    check_narrow(kHalf, r, zccl_float_to_half, f, &failures);
                    checked++;
                }
    for (float f : boundary_floats(r)) {
        check_narrow(kHalf, r, zccl_float_to_half, f, &failures);
        checked++;
    }
    Rng rng(21);
    for (int i = 0; i < 2000000; i++) {
        check_narrow(kHalf, r, zccl_float_to_half, float_from_bits((uint32_t)rng()), &failures);
        checked++;
    }
    EXPECT_EQ(0, failures) << "of " << checked << " floats";
#if defined(__FLT16_MANT_DIG__)
    // Second opinion: the compiler's float -> _Float16 conversion (libgcc or F16C), on the random sample.
    Rng rng2(22);
    int disagreements = 0;
    for (int i = 0; i < 2000000; i++) {
        const float f = float_from_bits((uint32_t)rng2());
        if (std::isnan(f))
            continue;
        const _Float16 h = (_Float16)f;
        uint16_t hb;
        std::memcpy(&hb, &h, sizeof hb);
        if (hb != zccl_float_to_half(f) && ++disagreements <= 10)
            ADD_FAILURE() << "_Float16 disagrees on 0x" << std::hex << bits_of(f);
    }
#endif
}

// float -> bfloat16, as above: every exponent and sign with the rounded-away 16 bits around zero, around the
// halfway point and at the top, then every boundary, then random floats.
TEST(Kernels, FloatToBf16MatchesReference) {
    const Rounder16 &r = bf16_rounder();
    int failures = 0;
    const uint32_t top_patterns[] = {0x00, 0x01, 0x3f, 0x40, 0x7f};
    std::vector<uint32_t> lows;
    for (uint32_t low = 0; low < 0x100; low++)
        lows.push_back(low);
    for (uint32_t low = 0x7e00; low < 0x8200; low++)
        lows.push_back(low);
    for (uint32_t low = 0xff00; low < 0x10000; low++)
        lows.push_back(low);
    size_t checked = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 0; e < 256; e++)
            for (uint32_t top : top_patterns)
                for (uint32_t low : lows) {
                    const float f = float_from_bits((sign << 31) | (e << 23) | (top << 16) | low);
                    check_narrow(kBf16, r, zccl_float_to_bf16, f, &failures);
                    checked++;
                }
    for (float f : boundary_floats(r)) {
        check_narrow(kBf16, r, zccl_float_to_bf16, f, &failures);
        checked++;
    }
    Rng rng(23);
    for (int i = 0; i < 2000000; i++) {
        check_narrow(kBf16, r, zccl_float_to_bf16, float_from_bits((uint32_t)rng()), &failures);
        checked++;
    }
    EXPECT_EQ(0, failures) << "of " << checked << " floats";
}

// ---------------------------------------------------------------------------------------------------------------
// The vectorised 16-bit kernels on every encoding
// ---------------------------------------------------------------------------------------------------------------

namespace {

template <class Tr>
void check_16bit_exhaustive(const Rounder16 &rounder) {
    const Format16 &fmt = Tr::fmt();
    const size_t n = 65536;
    std::vector<uint16_t> all(n), shuffled(n);
    for (size_t k = 0; k < n; k++)
        all[k] = (uint16_t)k;
    shuffled = all;
    Rng rng(24);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);

    // Partners for every encoding: each special value in turn, then a random permutation of all encodings.
    const uint16_t one = (uint16_t)(fmt.bias() << fmt.frac_bits);
    std::vector<std::vector<uint16_t>> partners;
    for (uint16_t s : {(uint16_t)0x0000, (uint16_t)0x8000, fmt.inf(), (uint16_t)(0x8000 | fmt.inf()),
                       (uint16_t)(fmt.inf() | fmt.quiet_bit()), (uint16_t)0x0001, (uint16_t)0x8001, one,
                       (uint16_t)(0x8000 | one), (uint16_t)(fmt.inf() - 1), (uint16_t)(one + 1)})
        partners.emplace_back(n, s);
    partners.push_back(shuffled);

    const ReduceConfig configs[] = {{ZCCL_SUM, 0}, {ZCCL_PROD, 0}, {ZCCL_MAX, 0}, {ZCCL_MIN, 0}, {ZCCL_SUM, 3}};
    std::vector<uint16_t> out(n);
    int failures = 0;
    for (const std::vector<uint16_t> &b : partners)
        for (const ReduceConfig &c : configs) {
            zccl_kernel_reduce(out.data(), all.data(), b.data(), n, Tr::dt, c.op, c.divisor);
            for (size_t i = 0; i < n; i++) {
                const uint16_t want = Tr::ref(all[i], b[i], c.op, c.divisor);
                bool ok = Tr::same(want, out[i]);
                // SUM and PROD are also correctly rounded from the exact result (the double-rounding claim):
                // the exact binary16 sum and every product are exact in double, and for bfloat16 the double
                // result is itself correctly rounded with 53 >= 2 * 8 + 2 bits.
                if (ok && c.divisor == 0 && (c.op == ZCCL_SUM || c.op == ZCCL_PROD) && !fmt.is_nan(want)) {
                    const double x = decode16(fmt, all[i]), y = decode16(fmt, b[i]);
                    ok = rounder.round(c.op == ZCCL_SUM ? x + y : x * y) == out[i];
                }
                if (!ok && ++failures <= 10)
                    ADD_FAILURE() << op_name(c.op) << " divisor=" << c.divisor << ": a=" << Tr::show(all[i])
                                  << " b=" << Tr::show(b[i]) << " want " << Tr::show(want) << " got "
                                  << Tr::show(out[i]);
            }
        }
    // Scaling every encoding.
    for (uint32_t d : {2u, 3u, 10u}) {
        zccl_kernel_scale(out.data(), all.data(), n, Tr::dt, d);
        for (size_t i = 0; i < n; i++)
            if (!Tr::same(Tr::ref_scale(all[i], d), out[i]) && ++failures <= 10)
                ADD_FAILURE() << "scale " << d << ": " << Tr::show(all[i]) << " got " << Tr::show(out[i]);
    }
    EXPECT_EQ(0, failures);
}

}  // namespace

TEST(Kernels, Float16KernelsEveryEncoding) { check_16bit_exhaustive<F16>(half_rounder()); }
TEST(Kernels, Bfloat16KernelsEveryEncoding) { check_16bit_exhaustive<BF16>(bf16_rounder()); }

// binary16 results do not depend on flush-to-zero / denormals-are-zero, which -ffast-math programs and some
// frameworks switch on: binary16 subnormals are converted without binary32 subnormal arithmetic. (bfloat16 and
// float32 subnormals are binary32 subnormals and do follow those modes.)
TEST(Kernels, Float16IgnoresFlushToZero) {
#if defined(HAVE_MXCSR)
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
    check_16bit_exhaustive<F16>(half_rounder());
    int failures = 0;
    for (uint32_t k = 0; k < 65536; k++) {
        const uint16_t h = (uint16_t)k;
        if (kHalf.is_nan(h))
            continue;
        const float f = zccl_half_to_float(h);
        if (bits_of(f) != bits_of((float)decode16(kHalf, h)) || zccl_float_to_half(f) != h)
            failures++;
    }
    _mm_setcsr(saved);
    EXPECT_EQ(0, failures) << "binary16 conversions changed under FTZ/DAZ";
#else
    GTEST_SKIP() << "no MXCSR on this architecture";
#endif
}

// Narrowing rounds to nearest even even when the thread's rounding mode is another one (the float32 arithmetic
// itself does follow the mode, so only sums that are exact in float32 are checked here).
TEST(Kernels, NarrowingIgnoresRoundingMode) {
#if defined(HAVE_MXCSR)
    const size_t n = 65536;
    std::vector<uint16_t> a(n), b(n), out(n), out_bf(n);
    Rng rng(27);
    for (size_t k = 0; k < n; k++) {
        a[k] = (uint16_t)k;
        b[k] = (uint16_t)(rng() & 0x7fffu);  // non-negative partners, so that sums of like signs round
    }
    const unsigned saved = _mm_getcsr();
    _mm_setcsr((saved & ~0x6000u) | 0x6000u);  // round toward zero
    zccl_kernel_reduce(out.data(), a.data(), b.data(), n, ZCCL_FLOAT16, ZCCL_SUM, 0);
    zccl_kernel_reduce(out_bf.data(), a.data(), b.data(), n, ZCCL_BFLOAT16, ZCCL_SUM, 0);
    std::vector<float> floats(n);
    std::vector<uint16_t> conv(n), conv_bf(n);
    for (size_t k = 0; k < n; k++) {
        floats[k] = float_from_bits((uint32_t)rng());
        conv[k] = zccl_float_to_half(floats[k]);
        conv_bf[k] = zccl_float_to_bf16(floats[k]);
    }
    _mm_setcsr(saved);
    int failures = 0;
    for (size_t k = 0; k < n; k++) {
        if (std::isnan(floats[k]))
            continue;
        if ((conv[k] != half_rounder().round(floats[k]) || conv_bf[k] != bf16_rounder().round(floats[k])) &&
            ++failures <= 10)
            ADD_FAILURE() << "toward-zero mode: conversion of 0x" << std::hex << bits_of(floats[k]);
    }
    for (size_t k = 0; k < n; k++) {
        for (const auto &[fmt, rounder, got] :
             {std::tuple<Format16, const Rounder16 *, uint16_t>{kHalf, &half_rounder(), out[k]},
              std::tuple<Format16, const Rounder16 *, uint16_t>{kBf16, &bf16_rounder(), out_bf[k]}}) {
            const double x = decode16(fmt, a[k]), y = decode16(fmt, b[k]);
            const wide_t exact = (wide_t)x + (wide_t)y;
            if (std::isnan(x) || std::isnan(y) || (wide_t)(float)exact != exact)
                continue;  // float32 rounding involved: mode-dependent by design
            if (got != rounder->round((double)exact) && ++failures <= 10)
                ADD_FAILURE() << "toward-zero mode: " << x << " + " << y << " narrowed to 0x" << std::hex << got;
        }
    }
    EXPECT_EQ(0, failures);
#else
    GTEST_SKIP() << "no MXCSR on this architecture";
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Integer division by multiplication
// ---------------------------------------------------------------------------------------------------------------

// 8-bit: every pair of operands (so every wrapped sum) with every divisor up to 300 and the extremes.
TEST(Kernels, AverageInt8Exhaustive) {
    std::vector<uint8_t> a(65536), b(65536), out(65536);
    for (size_t k = 0; k < 65536; k++) {
        a[k] = (uint8_t)(k & 0xff);
        b[k] = (uint8_t)(k >> 8);
    }
    std::vector<uint32_t> divisors;
    for (uint32_t d = 2; d <= 300; d++)
        divisors.push_back(d);
    for (uint32_t d : {511u, 512u, 513u, 65535u, 65536u, 65537u, 0x80000000u, 0xfffffffeu, 0xffffffffu})
        divisors.push_back(d);
    int failures = 0;
    for (uint32_t d : divisors) {
        zccl_kernel_reduce(out.data(), a.data(), b.data(), a.size(), ZCCL_UINT8, ZCCL_SUM, d);
        for (size_t k = 0; k < a.size(); k++)
            if (out[k] != U8::ref(a[k], b[k], ZCCL_SUM, d) && ++failures <= 10)
                ADD_FAILURE() << "uint8 (" << +a[k] << "+" << +b[k] << ")/" << d << " got " << +out[k];
        zccl_kernel_reduce(out.data(), a.data(), b.data(), a.size(), ZCCL_INT8, ZCCL_SUM, d);
        for (size_t k = 0; k < a.size(); k++) {
            const int8_t want = I8::ref((int8_t)a[k], (int8_t)b[k], ZCCL_SUM, d);
            if ((int8_t)out[k] != want && ++failures <= 10)
                ADD_FAILURE() << "int8 (" << +(int8_t)a[k] << "+" << +(int8_t)b[k] << ")/" << d << " got "
                              << +(int8_t)out[k];
        }
    }
    EXPECT_EQ(0, failures);
}

namespace {

// Divisors that exercise every multiplier shape: all small ones, powers of two and their neighbours, the
// largest, and random ones.
std::vector<uint32_t> wide_divisors() {
    std::vector<uint32_t> d;
    for (uint32_t k = 2; k <= 1100; k++)
        d.push_back(k);
    for (int s = 1; s < 32; s++)
        for (int64_t delta : {-1, 0, 1}) {
            const int64_t v = ((int64_t)1 << s) + delta;
            if (v >= 2 && v <= 0xffffffffLL)
                d.push_back((uint32_t)v);
        }
    d.push_back(0xffffffffu);
    d.push_back(0xfffffffeu);
    Rng rng(25);
    for (int k = 0; k < 300; k++)
        d.push_back((uint32_t)std::max<uint64_t>(2, rng() >> 32));
    for (int k = 0; k < 100; k++)
        d.push_back((uint32_t)std::max<uint64_t>(2, rng() >> 48));
    return d;
}

// Dividends near multiples of d (where truncation turns), near the ends of the range, and random.
template <class T>
std::vector<T> dividends_for(uint32_t d, Rng &rng) {
    using U = std::make_unsigned_t<T>;
    std::vector<T> v = {T(0), T(1), T(-1), std::numeric_limits<T>::min(), std::numeric_limits<T>::max(),
                        T(std::numeric_limits<T>::min() + 1), T(std::numeric_limits<T>::max() - 1)};
    for (int k = 0; k < 8; k++) {
        const U q = (U)rng() % ((U)std::numeric_limits<U>::max() / d + 1);
        const U m = (U)(q * (U)d);
        for (U delta : {U(0), U(1), U(-1)}) {
            v.push_back((T)(U)(m + delta));
            v.push_back((T)(U)(0 - (U)(m + delta)));
        }
    }
    const U top = (U)((U)std::numeric_limits<U>::max() / d * d);
    v.push_back((T)top);
    v.push_back((T)(U)(top - 1));
    for (int k = 0; k < 64; k++)
        v.push_back((T)(U)rng());
    return v;
}

template <class Tr>
void check_division_wide() {
    using T = typename Tr::Elem;
    Rng rng(26);
    int failures = 0;
    for (uint32_t d : wide_divisors()) {
        const std::vector<T> x = dividends_for<T>(d, rng);
        // SUM with divisor: pair every dividend with 0, and with a random partner.
        std::vector<T> zero(x.size(), T(0)), partner(x.size()), out(x.size());
        for (auto &p : partner)
            p = (T)rng();
        for (const std::vector<T> *b : {&zero, &partner}) {
            zccl_kernel_reduce(out.data(), x.data(), b->data(), x.size(), Tr::dt, ZCCL_SUM, d);
            for (size_t i = 0; i < x.size(); i++)
                if (out[i] != Tr::ref(x[i], (*b)[i], ZCCL_SUM, d) && ++failures <= 10)
                    ADD_FAILURE() << "(" << Tr::show(x[i]) << " + " << Tr::show((*b)[i]) << ") / " << d << " got "
                                  << Tr::show(out[i]);
        }
        zccl_kernel_scale(out.data(), x.data(), x.size(), Tr::dt, d);
        for (size_t i = 0; i < x.size(); i++)
            if (out[i] != Tr::ref_scale(x[i], d) && ++failures <= 10)
                ADD_FAILURE() << Tr::show(x[i]) << " / " << d << " got " << Tr::show(out[i]);
    }
    EXPECT_EQ(0, failures);
}

}  // namespace

TEST(Kernels, AverageInt32ManyDivisors) {
    check_division_wide<I32>();
    check_division_wide<U32>();
}
TEST(Kernels, AverageInt64ManyDivisors) {
    check_division_wide<I64>();
    check_division_wide<U64>();
}

// ---------------------------------------------------------------------------------------------------------------
// The documented special cases, spelled out
// ---------------------------------------------------------------------------------------------------------------

namespace {

template <class F>
F reduce1(F x, F y, zccl_redop_t op, zccl_datatype_t dt, uint32_t d = 0) {
    F out;
    zccl_kernel_reduce(&out, &x, &y, 1, dt, op, d);
    return out;
}

uint16_t reduce1_16(uint16_t x, uint16_t y, zccl_redop_t op, zccl_datatype_t dt, uint32_t d = 0) {
    uint16_t out;
    zccl_kernel_reduce(&out, &x, &y, 1, dt, op, d);
    return out;
}

template <class F, zccl_datatype_t DT>
void check_float_special_cases() {
    const F nan = std::numeric_limits<F>::quiet_NaN(), inf = std::numeric_limits<F>::infinity();
    // MAX/MIN: a NaN operand yields the other operand, in either position; two NaNs give NaN.
    EXPECT_EQ(F(1), reduce1(nan, F(1), ZCCL_MAX, DT));
    EXPECT_EQ(F(1), reduce1(F(1), nan, ZCCL_MAX, DT));
    EXPECT_EQ(F(1), reduce1(nan, F(1), ZCCL_MIN, DT));
    EXPECT_EQ(F(1), reduce1(F(1), nan, ZCCL_MIN, DT));
    EXPECT_EQ(-inf, reduce1(nan, -inf, ZCCL_MAX, DT));
    EXPECT_TRUE(std::isnan(reduce1(nan, nan, ZCCL_MAX, DT)));
    EXPECT_TRUE(std::isnan(reduce1(nan, nan, ZCCL_MIN, DT)));
    // -0 < +0, whatever the order.
    EXPECT_FALSE(std::signbit(reduce1(F(0), -F(0), ZCCL_MAX, DT)));
    EXPECT_FALSE(std::signbit(reduce1(-F(0), F(0), ZCCL_MAX, DT)));
    EXPECT_TRUE(std::signbit(reduce1(F(0), -F(0), ZCCL_MIN, DT)));
    EXPECT_TRUE(std::signbit(reduce1(-F(0), F(0), ZCCL_MIN, DT)));
    // SUM/PROD: NaN propagates; invalid operations give NaN; -0 + -0 = -0.
    EXPECT_TRUE(std::isnan(reduce1(nan, F(1), ZCCL_SUM, DT)));
    EXPECT_TRUE(std::isnan(reduce1(inf, -inf, ZCCL_SUM, DT)));
    EXPECT_TRUE(std::isnan(reduce1(inf, F(0), ZCCL_PROD, DT)));
    EXPECT_TRUE(std::signbit(reduce1(-F(0), -F(0), ZCCL_SUM, DT)));
    EXPECT_EQ(F(2.5), reduce1(F(2), F(3), ZCCL_SUM, DT, 2));
}

}  // namespace

TEST(Kernels, FloatSpecialCases) {
    check_float_special_cases<float, ZCCL_FLOAT32>();
    check_float_special_cases<double, ZCCL_FLOAT64>();
}

TEST(Kernels, Half16SpecialCases) {
    for (const auto &[dt, fmt] : {std::pair<zccl_datatype_t, Format16>{ZCCL_FLOAT16, kHalf},
                                  std::pair<zccl_datatype_t, Format16>{ZCCL_BFLOAT16, kBf16}}) {
        const uint16_t one = (uint16_t)(fmt.bias() << fmt.frac_bits), neg_zero = 0x8000;
        const uint16_t snan = (uint16_t)(fmt.inf() | 1), qnan = (uint16_t)(fmt.inf() | fmt.quiet_bit());
        EXPECT_EQ(one, reduce1_16(snan, one, ZCCL_MAX, dt));
        EXPECT_EQ(one, reduce1_16(one, qnan, ZCCL_MIN, dt));
        EXPECT_TRUE(fmt.is_nan(reduce1_16(snan, snan, ZCCL_MAX, dt)));
        EXPECT_TRUE(fmt.is_nan(reduce1_16(snan, one, ZCCL_SUM, dt)));
        EXPECT_TRUE(fmt.is_nan(reduce1_16(fmt.inf(), (uint16_t)(0x8000 | fmt.inf()), ZCCL_SUM, dt)));
        EXPECT_EQ(0x0000, reduce1_16(0x0000, neg_zero, ZCCL_MAX, dt));
        EXPECT_EQ(neg_zero, reduce1_16(0x0000, neg_zero, ZCCL_MIN, dt));
        EXPECT_EQ(neg_zero, reduce1_16(neg_zero, neg_zero, ZCCL_SUM, dt));
        // The largest finite value doubled overflows to infinity.
        EXPECT_EQ(fmt.inf(), reduce1_16((uint16_t)(fmt.inf() - 1), (uint16_t)(fmt.inf() - 1), ZCCL_SUM, dt));
    }
    // binary16 ties: 2048 + 1 is halfway between 2048 and 2050 and goes to the even 2048; 2050 + 1 goes to 2052.
    const uint16_t h2048 = zccl_float_to_half(2048.0f), h1 = zccl_float_to_half(1.0f);
    EXPECT_EQ(2048.0f, zccl_half_to_float(reduce1_16(h2048, h1, ZCCL_SUM, ZCCL_FLOAT16)));
    const uint16_t h2050 = zccl_float_to_half(2050.0f);
    EXPECT_EQ(2052.0f, zccl_half_to_float(reduce1_16(h2050, h1, ZCCL_SUM, ZCCL_FLOAT16)));
    // Subnormal results: the smallest subnormal halved is a tie between 0 and 2^-24 and goes to 0;
    // three smallest subnormals halved (1.5 * 2^-24) go to 2 * 2^-24.
    EXPECT_EQ(0x0000, reduce1_16(0x0001, 0x0000, ZCCL_SUM, ZCCL_FLOAT16, 2));
    EXPECT_EQ(0x0002, reduce1_16(0x0002, 0x0001, ZCCL_SUM, ZCCL_FLOAT16, 2));
}

TEST(Kernels, IntegerSpecialCases) {
    // Sums and products wrap; the average truncates toward zero in the element's own type.
    EXPECT_EQ(INT32_MIN, reduce1<int32_t>(INT32_MAX, 1, ZCCL_SUM, ZCCL_INT32));
    EXPECT_EQ(-3, reduce1<int32_t>(-7, 0, ZCCL_SUM, ZCCL_INT32, 2));
    EXPECT_EQ(3, reduce1<int32_t>(7, 0, ZCCL_SUM, ZCCL_INT32, 2));
    EXPECT_EQ(INT32_MIN / 2, reduce1<int32_t>(INT32_MAX, 1, ZCCL_SUM, ZCCL_INT32, 2));  // wrapped sum, then divided
    EXPECT_EQ((int8_t)-64, reduce1<int8_t>(127, 1, ZCCL_SUM, ZCCL_INT8, 2));
    EXPECT_EQ((uint8_t)0, reduce1<uint8_t>(255, 1, ZCCL_SUM, ZCCL_UINT8));
    EXPECT_EQ((uint8_t)(200 * 3 % 256), reduce1<uint8_t>(200, 3, ZCCL_PROD, ZCCL_UINT8));
    EXPECT_EQ(INT64_MIN, reduce1<int64_t>(INT64_MIN, -1, ZCCL_PROD, ZCCL_INT64));
    EXPECT_EQ(UINT64_MAX / 3, reduce1<uint64_t>(UINT64_MAX, 0, ZCCL_SUM, ZCCL_UINT64, 3));
    EXPECT_EQ(INT64_MIN / 7, reduce1<int64_t>(INT64_MIN, 0, ZCCL_SUM, ZCCL_INT64, 7));
}

// The streaming copy must equal memcpy for every length and alignment, and write nothing outside its range.
TEST(Kernels, StreamCopyMatchesMemcpy) {
    std::vector<uint8_t> src(70000 + 64), dst(70000 + 128);
    for (size_t i = 0; i < src.size(); i++) src[i] = (uint8_t)(i * 131 + 7);
    for (size_t len : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(63), size_t(64), size_t(65),
                       size_t(1000), size_t(4096), size_t(70000)})
        for (size_t so : {size_t(0), size_t(1), size_t(13)})
            for (size_t doff : {size_t(0), size_t(3), size_t(16)}) {
                std::fill(dst.begin(), dst.end(), 0xEE);
                zccl_kernel_copy_stream(dst.data() + 32 + doff, src.data() + so, len);
                for (size_t i = 0; i < dst.size(); i++) {
                    const bool inside = i >= 32 + doff && i < 32 + doff + len;
                    const uint8_t want = inside ? src[so + i - 32 - doff] : 0xEE;
                    ASSERT_EQ(dst[i], want) << "len " << len << " src+" << so << " dst+" << doff << " byte " << i;
                }
            }
}

// zccl_kernel_copy must equal memcpy at every distance between the two page offsets — above all 1..63, where it takes
// its vector loop on CPUs whose rep movsb is slow there (forced on here, so it runs on every CPU) — for lengths
// around its 1 KiB threshold and its 128-byte steps, and write nothing outside its range.
TEST(Kernels, CopyMatchesMemcpyAtEveryDistance) {
    const size_t page = 4096, maxlen = 9000;
    std::vector<uint8_t> src(maxlen + 2 * page), dst(maxlen + 3 * page);
    for (size_t i = 0; i < src.size(); i++) src[i] = (uint8_t)(i * 167 + 11);
    uint8_t *const s0 = (uint8_t *)(((uintptr_t)src.data() + page - 1) & ~(uintptr_t)(page - 1));
    uint8_t *const d0 = (uint8_t *)(((uintptr_t)dst.data() + page - 1) & ~(uintptr_t)(page - 1));
    for (int forced : {1, 0}) {
        zccl_kernel_rep_movsb_force(forced);
        for (size_t ahead : {size_t(0), size_t(1), size_t(63), size_t(64), size_t(4095), size_t(4096 + 16)})
            EXPECT_EQ(zccl_kernel_copy_slow_at(d0 + ahead, s0), forced && ahead % 4096 >= 1 && ahead % 4096 < 64)
                << "ahead " << ahead << " forced " << forced;
        for (size_t len : {size_t(0), size_t(1023), size_t(1024), size_t(1025), size_t(4096 + 31), size_t(maxlen)})
            for (size_t so : {size_t(0), size_t(5), size_t(32)})
                for (size_t ahead : {size_t(0), size_t(1), size_t(16), size_t(31), size_t(32), size_t(63),
                                     size_t(64), size_t(4095)}) {
                    const uint8_t *from = s0 + so;
                    uint8_t *to = d0 + page + so + ahead; // to's page offset is `ahead` past from's
                    std::fill(dst.begin(), dst.end(), 0xEE);
                    zccl_kernel_copy(to, from, len);
                    size_t wrong = 0, outside = 0;
                    for (size_t i = 0; i < dst.size(); i++) {
                        const uint8_t *p = dst.data() + i;
                        if (p >= to && p < to + len) wrong += *p != from[p - to];
                        else outside += *p != 0xEE;
                    }
                    ASSERT_EQ(wrong, 0u) << "len " << len << " src+" << so << " ahead " << ahead << " forced " << forced;
                    ASSERT_EQ(outside, 0u) << "len " << len << " src+" << so << " ahead " << ahead;
                }
    }
    zccl_kernel_rep_movsb_force(-1);
}

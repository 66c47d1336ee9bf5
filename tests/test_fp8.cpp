/*
 * test_fp8.cpp — the OCP 8-bit floating types E4M3 and E5M2 (ZCCL_FLOAT8E4M3, ZCCL_FLOAT8E5M2), exhaustively.
 *
 * The reference here is written from the format definitions alone (OFP8 spec: sign, exponent with bias, mantissa,
 * E4M3 without infinities and with S.1111.111 as NaN, E5M2 IEEE-like), in double precision with ldexp, and shares
 * no code with kernels/elem_math.h:
 *  - decode: every one of the 256 codes of each format;
 *  - encode: every code's value, the midpoints between neighbouring codes (ties to even), values just around each
 *    midpoint, values beyond the range (saturation to the largest finite value, as __NV_SATFINITE), infinities,
 *    NaN, and 200000 pseudo-random floats over the whole float range;
 *  - every operation (sum, prod, max, min, avg's final step with divisors 2 and 3, and PreMulSum's product) on all
 *    65536 operand pairs, through zccl_kernel_reduce / zccl_kernel_premul, against the reference rounding of the
 *    exact double result (float32 intermediate rounding is innocuous: 24 >= 2*4 + 2 bits).
 */
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels.h"
#include "zccl.h"

namespace {

struct Fmt {
    const char *name;
    zccl_datatype_t dt;
    int ebits, mbits, bias;
    bool has_inf; /* E5M2: exponent all ones is inf/NaN; E4M3: only S.1111.111 is NaN */
};
const Fmt kE4M3 = {"E4M3", ZCCL_FLOAT8E4M3, 4, 3, 7, false};
const Fmt kE5M2 = {"E5M2", ZCCL_FLOAT8E5M2, 5, 2, 15, true};

bool ref_is_nan(const Fmt &f, unsigned c) {
    const unsigned e = (c >> f.mbits) & ((1u << f.ebits) - 1), m = c & ((1u << f.mbits) - 1);
    if (f.has_inf) return e == (1u << f.ebits) - 1 && m != 0;
    return e == (1u << f.ebits) - 1 && m == (1u << f.mbits) - 1;
}

/* The value of code c, from the definition. */
double ref_decode(const Fmt &f, unsigned c) {
    const double sign = (c & 0x80) ? -1.0 : 1.0;
    const unsigned e = (c >> f.mbits) & ((1u << f.ebits) - 1), m = c & ((1u << f.mbits) - 1);
    if (ref_is_nan(f, c)) return std::numeric_limits<double>::quiet_NaN();
    if (f.has_inf && e == (1u << f.ebits) - 1) return sign * INFINITY;
    if (e == 0) return sign * std::ldexp((double)m, 1 - f.bias - f.mbits);
    return sign * std::ldexp(1.0 + std::ldexp((double)m, -f.mbits), (int)e - f.bias);
}

double max_finite(const Fmt &f) { return f.has_inf ? 57344.0 : 448.0; }

/* Round x to the format: nearest finite code, ties to the code with an even mantissa; beyond the largest finite
 * value (and infinities) saturate; NaN gives NaN. Returns the code. Searches all codes (slow, simple). */
unsigned ref_encode(const Fmt &f, double x) {
    if (std::isnan(x)) return 0x7f | (std::signbit(x) ? 0x80 : 0);
    const unsigned sign = std::signbit(x) ? 0x80 : 0;
    const double a = std::fabs(x);
    if (a >= max_finite(f)) return sign | (f.has_inf ? 0x7b : 0x7e);
    unsigned best = 0;
    double bestd = INFINITY;
    for (unsigned c = 0; c < 0x80; c++) {
        const double v = ref_decode(f, c);
        if (!std::isfinite(v)) continue;
        const double d = std::fabs(v - a);
        if (d < bestd || (d == bestd && (c & 1) == 0)) {
            best = c;
            bestd = d;
        }
    }
    return sign | best;
}

float dec(const Fmt &f, uint8_t c) { return f.has_inf ? zccl_e5m2_to_float(c) : zccl_e4m3_to_float(c); }
uint8_t enc(const Fmt &f, float x) { return f.has_inf ? zccl_float_to_e5m2(x) : zccl_float_to_e4m3(x); }

/* Same code, or both NaN (the sign of a NaN produced by arithmetic is not specified). */
bool same(const Fmt &f, unsigned got, unsigned want) {
    if (ref_is_nan(f, want)) return ref_is_nan(f, got);
    return got == want;
}

class Fp8 : public ::testing::TestWithParam<Fmt> {};

TEST_P(Fp8, DecodeAll256) {
    const Fmt f = GetParam();
    int nan = 0, inf = 0;
    for (unsigned c = 0; c < 256; c++) {
        const double want = ref_decode(f, c);
        const float got = dec(f, (uint8_t)c);
        if (std::isnan(want)) {
            nan++;
            EXPECT_TRUE(std::isnan(got)) << f.name << " code 0x" << std::hex << c;
        } else {
            inf += std::isinf(want);
            EXPECT_EQ((double)got, want) << f.name << " code 0x" << std::hex << c;
            EXPECT_EQ(std::signbit(got), std::signbit(want)) << f.name << " code 0x" << std::hex << c;
        }
    }
    EXPECT_EQ(nan, f.has_inf ? 6 : 2) << f.name;
    EXPECT_EQ(inf, f.has_inf ? 2 : 0) << f.name;
    EXPECT_EQ(ref_decode(f, f.has_inf ? 0x7b : 0x7e), max_finite(f));
}

TEST_P(Fp8, EncodeRoundTripMidpointsAndSaturation) {
    const Fmt f = GetParam();
    int checked = 0;
    auto check = [&](double x) {
        const float xf = (float)x;
        if ((double)xf != x) return; /* only values representable in float32 are inputs */
        const unsigned want = ref_encode(f, x), got = enc(f, xf);
        EXPECT_TRUE(same(f, got, want)) << f.name << " encode(" << x << ") = 0x" << std::hex << got << ", want 0x"
                                        << want;
        checked++;
    };
    for (unsigned c = 0; c < 256; c++) {
        const double v = ref_decode(f, c);
        if (std::isnan(v)) continue;
        check(v); /* round trip (infinities saturate) */
        if (!std::isfinite(v)) continue;
        const double v2 = ref_decode(f, (c & 0x80) | ((c & 0x7f) + 1));
        if (std::isfinite(v2) && (c & 0x7f) < 0x7f) {
            const double mid = (v + v2) / 2; /* a tie: goes to the even code */
            check(mid);
            check(std::nextafter((float)mid, 0.f));
            check(std::nextafter((float)mid, (float)(2 * mid)));
        }
    }
    for (double big : {448.0, 464.0, 480.0, 500.0, 57344.0, 61440.0, 65536.0, 1e10, 3.0e38})
        for (double s : {1.0, -1.0}) check(s * big);
    check(INFINITY);
    check(-INFINITY);
    EXPECT_EQ(enc(f, INFINITY), f.has_inf ? 0x7b : 0x7e) << "infinity saturates (__NV_SATFINITE)";
    EXPECT_EQ(enc(f, -INFINITY), f.has_inf ? 0xfb : 0xfe);
    EXPECT_TRUE(ref_is_nan(f, enc(f, NAN)));
    EXPECT_EQ(enc(f, -0.0f), 0x80);
    EXPECT_EQ(enc(f, 1e-30f), 0x00); /* far below half the smallest subnormal */
    std::mt19937 rng(13);
    for (int i = 0; i < 200000; i++) {
        uint32_t u = rng();
        float x;
        memcpy(&x, &u, 4);
        if (std::isnan(x)) continue;
        /* half the samples near the format's range, where rounding decisions happen */
        if (i & 1) x = std::ldexp(std::fabs(x) / std::ldexp(1.0f, std::ilogb(x == 0 ? 1.0f : x)), (int)(rng() % 40) - 20) * (u & 1 ? -1 : 1);
        check(x);
    }
    EXPECT_GT(checked, 100000);
}

double ref_op(int op, double x, double y, double dv) {
    switch (op) {
    case ZCCL_SUM: return x + y;
    case ZCCL_PROD: return x * y;
    case ZCCL_MAX: if (std::isnan(x)) return y; if (std::isnan(y)) return x; if (x == y) return std::signbit(x) ? y : x; return x > y ? x : y;
    case ZCCL_MIN: if (std::isnan(x)) return y; if (std::isnan(y)) return x; if (x == y) return std::signbit(x) ? x : y; return x < y ? x : y;
    default: return (x + y) / dv; /* AVG's final step */
    }
}

TEST_P(Fp8, EveryOpOnAllPairs) {
    const Fmt f = GetParam();
    std::vector<uint8_t> a(65536), b(65536), d(65536);
    for (unsigned i = 0; i < 65536; i++) { a[i] = (uint8_t)(i >> 8); b[i] = (uint8_t)i; }
    struct { zccl_redop_t op; uint32_t divisor; } cases[] = {{ZCCL_SUM, 1}, {ZCCL_PROD, 1}, {ZCCL_MAX, 1},
                                                            {ZCCL_MIN, 1}, {ZCCL_AVG, 2}, {ZCCL_AVG, 3}};
    for (auto cs : cases) {
        zccl_kernel_reduce(d.data(), a.data(), b.data(), 65536, f.dt, cs.op, cs.divisor);
        int bad = 0;
        for (unsigned i = 0; i < 65536 && bad < 5; i++) {
            const double x = ref_decode(f, a[i]), y = ref_decode(f, b[i]);
            const double r = ref_op(cs.op == ZCCL_AVG ? 99 : cs.op, x, y, cs.divisor);
            const unsigned want = ref_encode(f, r);
            if (!same(f, d[i], want)) {
                bad++;
                ADD_FAILURE() << f.name << " op " << cs.op << "/" << cs.divisor << " (0x" << std::hex << (unsigned)a[i]
                              << ", 0x" << (unsigned)b[i] << ") = 0x" << (unsigned)d[i] << ", want 0x" << want;
            }
        }
    }
    /* PreMulSum's product: every scalar code times every element code */
    for (unsigned s = 0; s < 256; s++) {
        uint8_t sc = (uint8_t)s;
        zccl_kernel_premul(d.data(), b.data(), 256, f.dt, &sc);
        for (unsigned i = 0; i < 256; i++) {
            const unsigned want = ref_encode(f, ref_decode(f, s) * ref_decode(f, i));
            ASSERT_TRUE(same(f, d[i], want)) << f.name << " premul 0x" << std::hex << s << " * 0x" << i << " = 0x"
                                             << (unsigned)d[i] << ", want 0x" << want;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::Values(kE4M3, kE5M2),
                         [](const ::testing::TestParamInfo<Fmt> &i) { return std::string(i.param.name); });

/* The overflow behaviour documented in zccl.h: sums beyond the range saturate, E5M2 infinities become the largest
 * finite value (NCCL's __NV_SATFINITE), NaN propagates through SUM and is skipped by MAX. */
TEST(Fp8Semantics, SaturationAndNaN) {
    uint8_t a[4] = {0x7e, 0xfe, 0x7f, 0x38}, b[4] = {0x7e, 0xfe, 0x38, 0x7f}, d[4];
    zccl_kernel_reduce(d, a, b, 4, ZCCL_FLOAT8E4M3, ZCCL_SUM, 1);
    EXPECT_EQ(d[0], 0x7e); /* 448 + 448 -> 448 */
    EXPECT_EQ(d[1], 0xfe);
    EXPECT_EQ(d[2] & 0x7f, 0x7f);
    zccl_kernel_reduce(d, a, b, 4, ZCCL_FLOAT8E4M3, ZCCL_MAX, 1);
    EXPECT_EQ(d[2], 0x38); /* max(NaN, 1) = 1 */
    EXPECT_EQ(d[3], 0x38);
    uint8_t e[2] = {0x7c, 0x3c}, g[2] = {0x3c, 0x7b};
    zccl_kernel_reduce(d, e, g, 2, ZCCL_FLOAT8E5M2, ZCCL_SUM, 1);
    EXPECT_EQ(d[0], 0x7b); /* inf + 1 -> 57344 */
    EXPECT_EQ(d[1], 0x7b); /* 1 + 57344 -> 57344 */
}

}  // namespace

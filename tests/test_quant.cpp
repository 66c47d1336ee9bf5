/*
 * test_quant.cpp — the block-quantized wire formats of quant/ (include/zccl.h zccl_wire_t states the formats, the
 * per-element error bound and the NaN/Inf policy; quant/quant.h the byte layout).
 *
 * Every element decoded from a wire string is compared, in double, with its input against the bound of zccl.h,
 * which the test computes itself from the block's largest magnitude (also computed here): int8 amax/254, int4
 * amax/14, fp8 E4M3 2^-4|x| + 2^-10 amax/448, E5M2 2^-3|x| + 2^-17 amax/57344, each + 2^-21 amax + 2^-140, plus the
 * output conversion (float16 2^-11|y| + 2^-25, bfloat16 2^-8|y| + 2^-134). Each format x datatype x block size x
 * length, random data of several magnitudes, and adversarial blocks: one huge element, all zeros, subnormals,
 * NaN and infinity (which must turn their whole block, and only it, into NaN). A bound that holds trivially would not
 * catch a broken format, so the largest error seen on random data must reach a quarter of the bound's main term.
 */
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "elem_math.h"
#include "quant.h"

namespace {

const zccl_wire_t kWires[] = {ZCCL_WIRE_INT8, ZCCL_WIRE_INT4, ZCCL_WIRE_FP8E4M3, ZCCL_WIRE_FP8E5M2};
const zccl_datatype_t kTypes[] = {ZCCL_FLOAT32, ZCCL_FLOAT64, ZCCL_FLOAT16, ZCCL_BFLOAT16};

/* The main term and the whole bound of one quantization (zccl.h, zccl_wire_t). */
double main_term(zccl_wire_t w, double x, double amax) {
    switch (w) {
    case ZCCL_WIRE_INT8: return amax / 254.0;
    case ZCCL_WIRE_INT4: return amax / 14.0;
    case ZCCL_WIRE_FP8E4M3: return std::ldexp(std::fabs(x), -4) + std::ldexp(amax / 448.0, -10);
    default: return std::ldexp(std::fabs(x), -3) + std::ldexp(amax / 57344.0, -17);
    }
}
double qbound(zccl_wire_t w, double x, double amax) {
    return main_term(w, x, amax) + std::ldexp(amax, -21) + std::ldexp(1.0, -140);
}
/* One quantization of an input of type dt: float64 is rounded to float32 first (zccl.h, E64). */
double qbound_dt(zccl_datatype_t dt, zccl_wire_t w, double x, double amax) {
    const double e = qbound(w, x, amax);
    return dt == ZCCL_FLOAT64 ? e * (1 + std::ldexp(1.0, -24)) + std::ldexp(std::fabs(x), -24) : e;
}
/* What narrowing a float32 result y to dt adds. */
double out_bound(zccl_datatype_t dt, double y) {
    if (dt == ZCCL_FLOAT16) return std::ldexp(std::fabs(y), -11) + std::ldexp(1.0, -25);
    if (dt == ZCCL_BFLOAT16) return std::ldexp(std::fabs(y), -8) + std::ldexp(1.0, -134);
    return 0;
}

size_t esize(zccl_datatype_t dt) { return dt == ZCCL_FLOAT64 ? 8 : dt == ZCCL_FLOAT32 ? 4 : 2; }

/* Values stored as dt (rounded once from the float32 value; float64 moved off the float32 grid by 3 * 2^-28 of
 * itself, so the wire's rounding to float32 is exercised) and what they are exactly. */
struct Input {
    std::vector<uint8_t> raw;
    std::vector<double> exact;
};
Input make_input(zccl_datatype_t dt, const std::vector<float> &v) {
    Input in;
    in.raw.resize(v.size() * esize(dt));
    in.exact.resize(v.size());
    for (size_t i = 0; i < v.size(); i++) {
        float f = v[i];
        if (dt == ZCCL_FLOAT64) {
            const double d = (double)f * (1.0 + 3.0 * std::ldexp(1.0, -28));
            memcpy(&in.raw[8 * i], &d, 8);
            in.exact[i] = d;
            continue;
        }
        if (dt == ZCCL_FLOAT16) {
            uint16_t h = zccl_em_float_to_half(f);
            memcpy(&in.raw[2 * i], &h, 2);
            f = zccl_em_half_to_float(h);
        } else if (dt == ZCCL_BFLOAT16) {
            uint16_t h = zccl_em_float_to_bf16(f);
            memcpy(&in.raw[2 * i], &h, 2);
            f = zccl_em_bf16_to_float(h);
        } else {
            memcpy(&in.raw[4 * i], &f, 4);
        }
        in.exact[i] = f;
    }
    return in;
}
double read_out(zccl_datatype_t dt, const std::vector<uint8_t> &raw, size_t i) {
    if (dt == ZCCL_FLOAT64) {
        double d;
        memcpy(&d, &raw[8 * i], 8);
        return d;
    }
    if (dt == ZCCL_FLOAT32) {
        float f;
        memcpy(&f, &raw[4 * i], 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, &raw[2 * i], 2);
    return dt == ZCCL_FLOAT16 ? zccl_em_half_to_float(h) : zccl_em_bf16_to_float(h);
}

/* The wire size the header states: 4 per block + payload, rounded up to 8. */
size_t expected_bytes(zccl_wire_t w, size_t n, size_t B) {
    if (n == 0) return 0;
    size_t b = 4 * ((n + B - 1) / B) + (w == ZCCL_WIRE_INT4 ? (n + 1) / 2 : n);
    return (b + 7) / 8 * 8;
}

struct RoundTrip {
    std::vector<double> exact, out;
    size_t bytes = 0;
};
RoundTrip round_trip(zccl_wire_t w, zccl_datatype_t dt, const std::vector<float> &v, size_t B) {
    Input in = make_input(dt, v);
    RoundTrip rt;
    rt.exact = in.exact;
    rt.bytes = zccl__quant_bytes(w, v.size(), B);
    std::vector<uint8_t> wire(rt.bytes + 16, 0xCD), out(v.size() * esize(dt) + 8, 0xEE);
    zccl__quant_encode(w, in.raw.data(), dt, v.size(), B, wire.data());
    EXPECT_EQ(wire[rt.bytes], 0xCD) << "encode wrote past its wire string";
    zccl__quant_decode(w, wire.data(), v.size(), B, out.data(), dt);
    EXPECT_EQ(out[v.size() * esize(dt)], 0xEE) << "decode wrote past its output";
    for (size_t i = 0; i < v.size(); i++) rt.out.push_back(read_out(dt, out, i));
    return rt;
}

/* Checks every element against the bound; returns the largest error / main term ratio seen. */
double check_bound(zccl_wire_t w, zccl_datatype_t dt, const RoundTrip &rt, size_t B, const std::string &what) {
    double worst = 0;
    const size_t n = rt.exact.size();
    for (size_t b0 = 0; b0 < n; b0 += B) {
        const size_t b1 = std::min(n, b0 + B);
        double amax = 0;
        for (size_t i = b0; i < b1; i++) amax = std::max(amax, std::fabs(rt.exact[i]));
        for (size_t i = b0; i < b1; i++) {
            const double x = rt.exact[i], y = rt.out[i], err = std::fabs(y - x);
            const double bound = qbound_dt(dt, w, x, amax) + out_bound(dt, std::fabs(x) + qbound_dt(dt, w, x, amax));
            if (!(err <= bound)) {
                ADD_FAILURE() << what << ": element " << i << " (block " << b0 / B << ", amax " << amax << "): x = "
                              << x << ", decoded " << y << ", error " << err << " > bound " << bound;
                return worst;
            }
            const double mt = main_term(w, x, amax);
            if (mt > 0) worst = std::max(worst, err / mt);
        }
    }
    return worst;
}

std::string name_of(zccl_wire_t w, zccl_datatype_t dt, size_t B, size_t n) {
    return std::string(zccl__quant_name(w)) + "/" + (dt == ZCCL_FLOAT32 ? "f32" : dt == ZCCL_FLOAT64 ? "f64" : dt == ZCCL_FLOAT16 ? "f16" : "bf16") +
           " B=" + std::to_string(B) + " n=" + std::to_string(n);
}

}  // namespace

TEST(QuantFormats, WireSizeIsTheHeadersFormula) {
    for (zccl_wire_t w : kWires)
        for (size_t B : {8, 256, 1000})
            for (size_t n : {0, 1, 2, 7, 8, 9, 255, 256, 257, 1001, 4096})
                EXPECT_EQ(zccl__quant_bytes(w, n, B), expected_bytes(w, n, B)) << name_of(w, ZCCL_FLOAT32, B, n);
    EXPECT_EQ(zccl__quant_bytes(ZCCL_WIRE_INT8, SIZE_MAX - 3, 8), SIZE_MAX); /* 4 * 2^61 + 2^64 - 3 overflows */
}

TEST(QuantFormats, RandomDataWithinTheBoundEveryFormatTypeBlockAndLength) {
    std::mt19937 rng(12345);
    for (zccl_wire_t w : kWires)
        for (zccl_datatype_t dt : kTypes)
            for (size_t B : {8, 256, 1000}) {
                double worst = 0;
                for (size_t n : {1, 2, 7, 255, 256, 257, 3001}) {
                    for (double scale : {1e-3, 1.0, 3e3}) {
                        std::normal_distribution<float> g(0.0f, (float)scale);
                        std::vector<float> v(n);
                        for (auto &x : v) x = g(rng);
                        const RoundTrip rt = round_trip(w, dt, v, B);
                        EXPECT_EQ(rt.bytes, expected_bytes(w, n, B));
                        worst = std::max(worst, check_bound(w, dt, rt, B, name_of(w, dt, B, n)));
                    }
                }
                /* The bound is not vacuous: random data reaches a quarter of its main term somewhere. */
                EXPECT_GT(worst, 0.25) << name_of(w, dt, B, 0) << ": largest error / main term = " << worst;
            }
}

TEST(QuantFormats, OneHugeElementAllZerosAndSubnormals) {
    const size_t B = 64;
    for (zccl_wire_t w : kWires)
        for (zccl_datatype_t dt : kTypes) {
            const float big = dt == ZCCL_FLOAT16 ? 60000.0f : 1e30f;
            std::vector<float> v(3 * B, 0.0f);
            for (size_t i = 0; i < B; i++) v[i] = 0.001f * (float)(i + 1);
            v[17] = big;                                           /* block 0: one huge element among small ones */
            /* block 1: all zeros (and one -0) */
            v[B + 5] = -0.0f;
            for (size_t i = 2 * B; i < 3 * B; i++)                 /* block 2: subnormal (of dt) magnitudes */
                v[i] = (dt == ZCCL_FLOAT16 ? 3e-6f : 1e-40f) * (float)((int)i % 7 - 3);
            const RoundTrip rt = round_trip(w, dt, v, B);
            check_bound(w, dt, rt, B, name_of(w, dt, B, v.size()) + " adversarial");
            /* the huge element itself comes back to within its format's step */
            EXPECT_NEAR(rt.out[17], rt.exact[17], qbound_dt(dt, w, rt.exact[17], rt.exact[17]) + out_bound(dt, big))
                << name_of(w, dt, B, 0);
            for (size_t i = B; i < 2 * B; i++) EXPECT_EQ(rt.out[i], 0.0) << "an all-zero block decodes to zeros";
            for (size_t i = 0; i < v.size(); i++) EXPECT_FALSE(std::isnan(rt.out[i])) << "element " << i;
        }
}

TEST(QuantFormats, NanAndInfinityTurnTheirWholeBlockIntoNanAndOnlyIt) {
    const size_t B = 16;
    for (zccl_wire_t w : kWires)
        for (zccl_datatype_t dt : kTypes)
            for (float special : {NAN, INFINITY, -INFINITY}) {
                std::vector<float> v(4 * B + 3);
                for (size_t i = 0; i < v.size(); i++) v[i] = std::sin((float)i) * 10.0f;
                v[B + 3] = special;             /* block 1 */
                v[4 * B + 1] = special;         /* the short last block */
                const RoundTrip rt = round_trip(w, dt, v, B);
                for (size_t i = 0; i < v.size(); i++) {
                    const size_t b = i / B;
                    if (b == 1 || b == 4)
                        EXPECT_TRUE(std::isnan(rt.out[i])) << name_of(w, dt, B, v.size()) << " element " << i;
                    else
                        EXPECT_FALSE(std::isnan(rt.out[i]) || std::isinf(rt.out[i]))
                            << name_of(w, dt, B, v.size()) << " element " << i << " outside the NaN blocks";
                }
                RoundTrip clean = rt;
                clean.exact.resize(B);
                clean.out.resize(B);
                check_bound(w, dt, clean, B, name_of(w, dt, B, v.size()) + " block 0 next to a NaN block");
            }
}

TEST(QuantFormats, DecodeAddAccumulatesTheDecodedValues) {
    const size_t B = 32, n = 101;
    for (zccl_wire_t w : kWires) {
        std::vector<float> v(n), acc(n), dec(n);
        for (size_t i = 0; i < n; i++) v[i] = (float)i - 50.0f;
        std::vector<uint8_t> wire(zccl__quant_bytes(w, n, B));
        zccl__quant_encode(w, v.data(), ZCCL_FLOAT32, n, B, wire.data());
        zccl__quant_decode(w, wire.data(), n, B, dec.data(), ZCCL_FLOAT32);
        for (size_t i = 0; i < n; i++) acc[i] = 0.5f * (float)i;
        zccl__quant_decode_add(w, wire.data(), n, B, acc.data());
        for (size_t i = 0; i < n; i++) EXPECT_EQ(acc[i], 0.5f * (float)i + dec[i]) << zccl__quant_name(w) << " " << i;
    }
}

TEST(QuantFormats, Int4PacksTwoCodesPerByteLowNibbleFirst) {
    /* Block amax 7 gives scale 1: the codes are the values themselves. */
    const float v[5] = {7.0f, -7.0f, 1.0f, -2.0f, 3.0f};
    std::vector<uint8_t> wire(zccl__quant_bytes(ZCCL_WIRE_INT4, 5, 8));
    zccl__quant_encode(ZCCL_WIRE_INT4, v, ZCCL_FLOAT32, 5, 8, wire.data());
    float s;
    memcpy(&s, wire.data(), 4);
    EXPECT_EQ(s, 1.0f);
    EXPECT_EQ(wire[4], 0x97);     /* 7 | (-7 & 15) << 4 */
    EXPECT_EQ(wire[5], 0xE1);     /* 1 | (-2 & 15) << 4 */
    EXPECT_EQ(wire[6], 0x03);     /* the odd last element, high nibble 0 */
    EXPECT_EQ(wire[7], 0x00);     /* padding */
}

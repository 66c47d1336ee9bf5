/* data.cpp — see data.h. */
#include "harness/data.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zt {

const char *dtype_name(zccl_datatype_t dt) {
    switch (dt) {
    case ZCCL_INT8: return "int8";
    case ZCCL_UINT8: return "uint8";
    case ZCCL_INT32: return "int32";
    case ZCCL_UINT32: return "uint32";
    case ZCCL_INT64: return "int64";
    case ZCCL_UINT64: return "uint64";
    case ZCCL_FLOAT16: return "float16";
    case ZCCL_FLOAT32: return "float32";
    case ZCCL_FLOAT64: return "float64";
    case ZCCL_BFLOAT16: return "bfloat16";
    default: return "?dtype";
    }
}

const char *op_name(zccl_redop_t op) {
    switch (op) {
    case ZCCL_SUM: return "sum";
    case ZCCL_PROD: return "prod";
    case ZCCL_MAX: return "max";
    case ZCCL_MIN: return "min";
    case ZCCL_AVG: return "avg";
    default: return "?op";
    }
}

size_t dtype_bytes(zccl_datatype_t dt) {
    switch (dt) {
    case ZCCL_INT8:
    case ZCCL_UINT8: return 1;
    case ZCCL_FLOAT16:
    case ZCCL_BFLOAT16: return 2;
    case ZCCL_INT32:
    case ZCCL_UINT32:
    case ZCCL_FLOAT32: return 4;
    case ZCCL_INT64:
    case ZCCL_UINT64:
    case ZCCL_FLOAT64: return 8;
    default: return 0;
    }
}

bool dtype_is_float(zccl_datatype_t dt) {
    return dt == ZCCL_FLOAT16 || dt == ZCCL_FLOAT32 || dt == ZCCL_FLOAT64 || dt == ZCCL_BFLOAT16;
}

static bool dtype_is_signed(zccl_datatype_t dt) { return dt == ZCCL_INT8 || dt == ZCCL_INT32 || dt == ZCCL_INT64; }

Pattern pattern_for(zccl_redop_t op) {
    switch (op) {
    case ZCCL_SUM:
    case ZCCL_AVG: return Pattern::Additive;
    case ZCCL_PROD: return Pattern::Product;
    default: return Pattern::Extremes;
    }
}

/* ---- half precision ------------------------------------------------------------------------------------------ */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t x = f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mant = x & 0x7fffffu;
    int exp = (int)((x >> 23) & 0xff);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));
    int e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t hm = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (hm & 1))) hm++;
        return (uint16_t)(sign | hm);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry into the exponent is correct (up to inf) */
    return (uint16_t)h;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        float v = std::ldexp((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e - 15 + 127) << 23) | (m << 13));
}

uint16_t f32_to_bf16(float f) {
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* ---- generation ---------------------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

static uint64_t rank_base(zccl_datatype_t dt, Pattern p, uint64_t salt, int rank) {
    return mix64(salt * 0xd1b54a32d192ed03ull ^ ((uint64_t)(rank + 1) << 20) ^ ((uint64_t)dt << 8) ^
                 (uint64_t)p ^ 0x5bd1e995ull);
}
static inline uint64_t hash_at(uint64_t base, size_t i) { return mix64(base + (uint64_t)(i + 1) * kGolden); }

static inline double float_value(zccl_datatype_t dt, Pattern p, uint64_t h) {
    switch (p) {
    case Pattern::Additive:
        if (dt == ZCCL_FLOAT16 || dt == ZCCL_BFLOAT16) return (double)((int64_t)(h % 17) - 8);
        if (dt == ZCCL_FLOAT32) return (double)((int64_t)(h % (1u << 18)) - (1 << 17)) / 4.0;
        return (double)((int64_t)(h % (1ull << 40)) - (1ll << 39)) / 16.0;
    case Pattern::Product: {
        static const double v[4] = {-1.0, 0.5, 1.0, 2.0};
        return v[h & 3];
    }
    default:
        if (dt == ZCCL_FLOAT16) return (double)((int64_t)(h % 2001) - 1000) / 8.0;
        if (dt == ZCCL_BFLOAT16) return (double)((int64_t)(h % 511) - 255) / 4.0;
        if (dt == ZCCL_FLOAT32) return (double)((int64_t)(h % (1u << 24)) - (1 << 23)) / 1024.0;
        return (double)((int64_t)(h >> 11) - (1ll << 52)) / 65536.0;
    }
}

static inline uint64_t int_value(Pattern p, uint64_t h) { return p == Pattern::Product ? (h | 1u) : h; }

template <class T>
static void fill_int(T *out, uint64_t base, Pattern p, size_t start, size_t n) {
    for (size_t k = 0; k < n; k++) out[k] = (T)int_value(p, hash_at(base, start + k));
}

void gen_fill(void *buf, zccl_datatype_t dt, Pattern p, uint64_t salt, int rank, size_t start, size_t n) {
    uint64_t base = rank_base(dt, p, salt, rank);
    switch (dt) {
    case ZCCL_INT8:
    case ZCCL_UINT8: fill_int((uint8_t *)buf, base, p, start, n); break;
    case ZCCL_INT32:
    case ZCCL_UINT32: fill_int((uint32_t *)buf, base, p, start, n); break;
    case ZCCL_INT64:
    case ZCCL_UINT64: fill_int((uint64_t *)buf, base, p, start, n); break;
    case ZCCL_FLOAT16: {
        uint16_t *o = (uint16_t *)buf;
        for (size_t k = 0; k < n; k++) o[k] = f32_to_f16((float)float_value(dt, p, hash_at(base, start + k)));
        break;
    }
    case ZCCL_BFLOAT16: {
        uint16_t *o = (uint16_t *)buf;
        for (size_t k = 0; k < n; k++) o[k] = f32_to_bf16((float)float_value(dt, p, hash_at(base, start + k)));
        break;
    }
    case ZCCL_FLOAT32: {
        float *o = (float *)buf;
        for (size_t k = 0; k < n; k++) o[k] = (float)float_value(dt, p, hash_at(base, start + k));
        break;
    }
    case ZCCL_FLOAT64: {
        double *o = (double *)buf;
        for (size_t k = 0; k < n; k++) o[k] = float_value(dt, p, hash_at(base, start + k));
        break;
    }
    default: break;
    }
}

double elem_as_double(const void *buf, zccl_datatype_t dt, size_t i) {
    const uint8_t *b = (const uint8_t *)buf;
    switch (dt) {
    case ZCCL_INT8: return (double)((const int8_t *)b)[i];
    case ZCCL_UINT8: return (double)b[i];
    case ZCCL_INT32: { int32_t v; memcpy(&v, b + 4 * i, 4); return (double)v; }
    case ZCCL_UINT32: { uint32_t v; memcpy(&v, b + 4 * i, 4); return (double)v; }
    case ZCCL_INT64: { int64_t v; memcpy(&v, b + 8 * i, 8); return (double)v; }
    case ZCCL_UINT64: { uint64_t v; memcpy(&v, b + 8 * i, 8); return (double)v; }
    case ZCCL_FLOAT16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return (double)f16_to_f32(v); }
    case ZCCL_BFLOAT16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return (double)bf16_to_f32(v); }
    case ZCCL_FLOAT32: { float v; memcpy(&v, b + 4 * i, 4); return (double)v; }
    case ZCCL_FLOAT64: { double v; memcpy(&v, b + 8 * i, 8); return v; }
    default: return NAN;
    }
}

uint64_t elem_bits(const void *buf, zccl_datatype_t dt, size_t i) {
    const uint8_t *b = (const uint8_t *)buf;
    size_t sz = dtype_bytes(dt);
    uint64_t v = 0;
    memcpy(&v, b + sz * i, sz); /* little endian */
    return v;
}

double tolerance(zccl_datatype_t dt, zccl_redop_t op) {
    if (!dtype_is_float(dt) || op != ZCCL_AVG) return 0.0;
    switch (dt) {
    case ZCCL_FLOAT16: return std::ldexp(1.0, -10);
    case ZCCL_BFLOAT16: return std::ldexp(1.0, -7);
    case ZCCL_FLOAT32: return std::ldexp(1.0, -22);
    default: return std::ldexp(1.0, -50);
    }
}

/* ---- reference ----------------------------------------------------------------------------------------------- */

static inline uint64_t dbits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}
static inline double bitsd(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

void Reference::compute(zccl_datatype_t dt_, zccl_redop_t op_, uint64_t salt, int nranks_, size_t start_,
                        size_t n_) {
    store_.resize(n_);
    compute_range(store_.data(), dt_, op_, salt, nranks_, start_, n_);
    attach(store_.data(), dt_, op_, nranks_, start_, n_);
}

void Reference::attach(const uint64_t *ext, zccl_datatype_t dt_, zccl_redop_t op_, int nranks_, size_t start_,
                       size_t n_) {
    vals = ext;
    dt = dt_;
    op = op_;
    nranks = nranks_;
    start = start_;
    n = n_;
}

void Reference::compute_range(uint64_t *out, zccl_datatype_t dt, zccl_redop_t op, uint64_t salt, int nranks,
                              size_t start, size_t n) {
    const Pattern p = pattern_for(op);
    std::vector<uint64_t> base((size_t)nranks);
    for (int r = 0; r < nranks; r++) base[(size_t)r] = rank_base(dt, p, salt, r);

    if (dtype_is_float(dt)) {
        for (size_t k = 0; k < n; k++) {
            size_t i = start + k;
            double acc = float_value(dt, p, hash_at(base[0], i));
            for (int r = 1; r < nranks; r++) {
                double v = float_value(dt, p, hash_at(base[(size_t)r], i));
                switch (op) {
                case ZCCL_SUM:
                case ZCCL_AVG: acc += v; break;
                case ZCCL_PROD: acc *= v; break;
                case ZCCL_MAX: acc = v > acc ? v : acc; break;
                default: acc = v < acc ? v : acc; break;
                }
            }
            if (op == ZCCL_AVG) acc /= (double)nranks;
            out[k] = dbits(acc);
        }
        return;
    }

    const unsigned bits = (unsigned)(8 * dtype_bytes(dt));
    const uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    const bool sgn = dtype_is_signed(dt);
    auto widen = [&](uint64_t v) -> uint64_t {
        v &= mask;
        if (sgn && bits < 64 && (v >> (bits - 1)) & 1) v |= ~mask;
        return v;
    };
    for (size_t k = 0; k < n; k++) {
        size_t i = start + k;
        uint64_t acc = widen(int_value(p, hash_at(base[0], i)));
        for (int r = 1; r < nranks; r++) {
            uint64_t v = widen(int_value(p, hash_at(base[(size_t)r], i)));
            switch (op) {
            case ZCCL_SUM:
            case ZCCL_AVG: acc += v; break;
            case ZCCL_PROD: acc *= v; break;
            case ZCCL_MAX:
                if (sgn ? (int64_t)v > (int64_t)acc : v > acc) acc = v;
                break;
            default:
                if (sgn ? (int64_t)v < (int64_t)acc : v < acc) acc = v;
                break;
            }
        }
        if (op == ZCCL_AVG) {
            uint64_t s = widen(acc);
            if (sgn) acc = (uint64_t)((int64_t)s / (int64_t)nranks);
            else acc = (s & mask) / (uint64_t)nranks;
        }
        out[k] = acc & mask;
    }
}

size_t Reference::check(const void *buf, size_t off, size_t cnt, std::string *first) const {
    size_t bad = 0;
    if (dtype_is_float(dt)) {
        const double tol = tolerance(dt, op);
        for (size_t k = 0; k < cnt; k++) {
            double got = elem_as_double(buf, dt, k);
            double want = bitsd(vals[off + k]);
            bool ok = got == want || (tol > 0 && std::fabs(got - want) <= tol * std::fabs(want));
            if (!ok) {
                if (bad == 0 && first) {
                    char b[200];
                    snprintf(b, sizeof b, "element %zu: got %.17g (bits 0x%llx), expected %.17g (tolerance %g rel)", k,
                             got, (unsigned long long)elem_bits(buf, dt, k), want, tol);
                    *first = b;
                }
                bad++;
            }
        }
    } else {
        for (size_t k = 0; k < cnt; k++) {
            uint64_t got = elem_bits(buf, dt, k);
            uint64_t want = vals[off + k];
            if (got != want) {
                if (bad == 0 && first) {
                    char b[200];
                    snprintf(b, sizeof b, "element %zu: got 0x%llx, expected 0x%llx", k, (unsigned long long)got,
                             (unsigned long long)want);
                    *first = b;
                }
                bad++;
            }
        }
    }
    return bad;
}

size_t compare_elems(const void *got, const void *want, zccl_datatype_t dt, size_t n, std::string *first) {
    size_t sz = dtype_bytes(dt);
    if (n == 0 || memcmp(got, want, n * sz) == 0) return 0;
    size_t bad = 0;
    const uint8_t *g = (const uint8_t *)got, *w = (const uint8_t *)want;
    for (size_t k = 0; k < n; k++) {
        if (memcmp(g + k * sz, w + k * sz, sz) != 0) {
            if (bad == 0 && first) {
                char b[200];
                snprintf(b, sizeof b, "element %zu: got 0x%llx, expected 0x%llx", k,
                         (unsigned long long)elem_bits(got, dt, k), (unsigned long long)elem_bits(want, dt, k));
                *first = b;
            }
            bad++;
        }
    }
    return bad;
}

/* ---- guarded buffers ----------------------------------------------------------------------------------------- */

void GuardedBuf::reset(size_t bytes, uint8_t fill) {
    if (ext_ && ext_cap_ < bytes + 2 * kGuard) {
        fprintf(stderr, "GuardedBuf: %zu bytes and guards do not fit the %zu bytes given by use_memory\n", bytes,
                ext_cap_);
        abort();
    }
    if (!ext_ && mem_.size() < bytes + 2 * kGuard) mem_.resize(bytes + 2 * kGuard);
    bytes_ = bytes;
    uint8_t *m = base();
    memset(m, kGuardByte, kGuard);
    memset(m + kGuard, fill, bytes);
    memset(m + kGuard + bytes, kGuardByte, kGuard);
}

bool GuardedBuf::guards_ok(std::string *why) const {
    const uint8_t *m = base();
    for (size_t k = 0; k < kGuard; k++) {
        if (m[k] != kGuardByte) {
            if (why) *why = "guard byte at offset -" + std::to_string(kGuard - k) + " overwritten";
            return false;
        }
        if (m[kGuard + bytes_ + k] != kGuardByte) {
            if (why) *why = "guard byte at offset +" + std::to_string(k) + " past the end overwritten";
            return false;
        }
    }
    return true;
}

bool GuardedBuf::all_bytes(size_t from, size_t to, uint8_t v) const {
    const uint8_t *b = p();
    for (size_t k = from; k < to; k++)
        if (b[k] != v) return false;
    return true;
}

}  // namespace zt

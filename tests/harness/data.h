/*
 * data.h — deterministic per-rank input patterns and reference results for collective tests.
 *
 * Every rank's input is a pure function of (datatype, pattern, salt, rank, element index), so that any process can
 * regenerate any rank's input and compute the expected result of a collective by itself, without communication.
 *
 * Patterns are chosen so that reductions of floating types are EXACT whatever the reduction order (see the
 * tolerance table in data.cpp / tolerance()):
 *   Additive (SUM, AVG): float16/bfloat16 small integers in [-8, 8] (8 ranks sum to at most 64: exact in both);
 *                        float32 multiples of 1/4 in [-2^15, 2^15) (sums need < 24 significant bits);
 *                        float64 multiples of 1/16 in [-2^35, 2^35) (sums need < 53 bits).
 *   Product (PROD):      floats from {-1, 0.5, 1, 2} (8 ranks: |product| in [2^-8, 2^8], exact in every type);
 *                        integers: random odd values over the full width (products wrap modulo 2^bits).
 *   Extremes (MAX, MIN) and Copy (allgather, broadcast, send/recv): float16 k/8, k in [-1000, 1000]; bfloat16 k/4,
 *                        k in [-255, 255]; float32 k/1024, |k| < 2^23; float64 k/65536, |k| < 2^52.
 *   Integers (SUM, AVG, MAX, MIN, Copy): uniformly random over the full width, so sums wrap.
 * The reference is computed in 64-bit unsigned arithmetic for integers (wrapping, then truncated to the type's
 * width; AVG = wrapped sum at the type's width, interpreted signed/unsigned, truncating division by nranks) and
 * in float64 for floating types (AVG = exact sum / nranks).
 */
#ifndef ZCCL_TEST_DATA_H
#define ZCCL_TEST_DATA_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zccl.h"

namespace zt {

enum class Pattern { Additive, Product, Extremes, Copy };

const char *dtype_name(zccl_datatype_t dt);
const char *op_name(zccl_redop_t op);
size_t dtype_bytes(zccl_datatype_t dt);
bool dtype_is_float(zccl_datatype_t dt);
Pattern pattern_for(zccl_redop_t op);

/** IEEE binary16 and bfloat16 conversions written for the tests (round to nearest even). */
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);

/** Writes elements [start, start+n) of rank's input into buf (n elements of dt). */
void gen_fill(void *buf, zccl_datatype_t dt, Pattern p, uint64_t salt, int rank, size_t start, size_t n);

/** Element i of buf (of type dt) as a double (floats) — for messages and tolerance checks. */
double elem_as_double(const void *buf, zccl_datatype_t dt, size_t i);
/** Element i of buf as its raw bits, zero-extended. */
uint64_t elem_bits(const void *buf, zccl_datatype_t dt, size_t i);

/**
 * Relative tolerance used when comparing a reduction result with the float64 reference:
 *   integers: 0 (exact, every op);
 *   float16/bfloat16/float32/float64 with SUM, PROD, MAX, MIN: 0 (inputs make every partial result exact);
 *   AVG: float16 2^-10, bfloat16 2^-7, float32 2^-22, float64 2^-50 (one final division and rounding,
 *        i.e. about one unit in the last place; float16/bfloat16 may round twice: float32 then 16 bits).
 */
double tolerance(zccl_datatype_t dt, zccl_redop_t op);

/**
 * Expected reduction of elements [start, start+n) over nranks ranks' inputs. Values are kept as 64-bit words:
 * integer types hold the value truncated to the type's width (zero-extended); floating types hold the bits of the
 * float64 result. The words live in the object (compute) or in memory the caller provides (attach; e.g. shared
 * memory filled cooperatively by several ranks with compute_range).
 */
struct Reference {
    zccl_datatype_t dt = ZCCL_FLOAT32;
    zccl_redop_t op = ZCCL_SUM;
    int nranks = 1;
    size_t start = 0;
    size_t n = 0;
    const uint64_t *vals = nullptr;

    void compute(zccl_datatype_t dt, zccl_redop_t op, uint64_t salt, int nranks, size_t start, size_t n);
    void attach(const uint64_t *ext, zccl_datatype_t dt, zccl_redop_t op, int nranks, size_t start, size_t n);
    /** Writes the words for elements [start, start+n) to out[0..n). */
    static void compute_range(uint64_t *out, zccl_datatype_t dt, zccl_redop_t op, uint64_t salt, int nranks,
                              size_t start, size_t n);
    size_t size() const { return n; }
    /**
     * Compares cnt elements of buf with reference elements [off, off+cnt). Returns the number of mismatches; the
     * first one is described in *first (if not NULL): index, got, expected.
     */
    size_t check(const void *buf, size_t off, size_t cnt, std::string *first) const;

  private:
    std::vector<uint64_t> store_;
};

/** Bytewise comparison of n elements; returns the number of differing elements, describing the first. */
size_t compare_elems(const void *got, const void *want, zccl_datatype_t dt, size_t n, std::string *first);

/** Buffer with guard bytes before and after the n-byte payload; reused across calls (grows as needed). */
class GuardedBuf {
  public:
    static constexpr size_t kGuard = 64;
    static constexpr uint8_t kGuardByte = 0xA5;
    static constexpr uint8_t kPoison = 0xEE; /* initial content of output regions */

    /** Sets the payload size; guards are (re)written and the payload filled with `fill`. */
    void reset(size_t bytes, uint8_t fill = kPoison);
    /** From now on the buffer lives in [mem, mem + cap) (e.g. zccl_mem_alloc memory, registered with a
     *  communicator) instead of its own vector; reset() aborts if a payload and its guards do not fit. */
    void use_memory(uint8_t *mem, size_t cap) { ext_ = mem; ext_cap_ = cap; }
    uint8_t *p() { return base() + kGuard; }
    const uint8_t *p() const { return base() + kGuard; }
    size_t bytes() const { return bytes_; }
    /** True if both guards are intact; else describes the first damaged byte's offset relative to p(). */
    bool guards_ok(std::string *why = nullptr) const;
    /** True if payload bytes [from, to) all equal v. */
    bool all_bytes(size_t from, size_t to, uint8_t v) const;

  private:
    std::vector<uint8_t> mem_;
    uint8_t *ext_ = nullptr;
    size_t ext_cap_ = 0;
    size_t bytes_ = 0;
    uint8_t *base() { return ext_ ? ext_ : mem_.data(); }
    const uint8_t *base() const { return ext_ ? ext_ : mem_.data(); }
};

}  // namespace zt

#endif

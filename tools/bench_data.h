/*
 * bench_data.h — deterministic test patterns, element conversions and result checking for zccl-bench.
 *
 * Every element a rank sends is a function of (seed, rank, element index): any rank can regenerate any other
 * rank's data, so each rank computes the expected value of each of its output elements on its own, without an
 * extra collective and without a reference buffer.
 *
 * Values, chosen so that reductions are exact in every type (float16 and bfloat16 included) for the rank counts
 * a single host runs:
 *   sum, avg  : integers in [-4, 4] (unsigned types: [0, 8]);
 *   prod      : 1, -1 or 2 (unsigned types: 1 or 2); 2 only on ranks 0..7, so |product| <= 2^8;
 *   max, min  : integers in [-60, 60] (unsigned types: [0, 120]);
 *   allgather, broadcast (no arithmetic): raw random bits, compared bit for bit (NaN patterns included).
 * Integer types are compared exactly, with sum and prod wrapping modulo 2^bits as the API specifies.
 * Floating types are compared exactly as long as every partial result is an integer the type represents exactly
 * (|partial| <= 2^p, p = 11 for half, 8 for bfloat16, 24 for float, 53 for double); beyond that (more than 64
 * ranks for bfloat16 sum) the tolerance is nranks * maxabs * 2^-p. avg is compared within one unit in the last
 * place of the expected value (the library divides in float32 for half/bfloat16, which may round differently
 * from the double-precision reference).
 */
#ifndef ZCCL_TOOLS_BENCH_DATA_H
#define ZCCL_TOOLS_BENCH_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "zccl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { BK_INT, BK_UINT, BK_F16, BK_BF16, BK_F32, BK_F64 } bench_kind_t;

/* Pattern kind: what values the send buffers hold. */
typedef enum { BP_BITS = -1 } bench_pattern_special_t; /* otherwise a zccl_redop_t */

typedef struct {
    zccl_datatype_t dt;
    bench_kind_t kind;
    size_t esize;    /* bytes per element */
    int pattern;     /* a zccl_redop_t, or BP_BITS for data movement */
    int nranks;
    uint64_t *rseed; /* per-rank stream seeds for the current seed */
    double tol_abs;  /* float comparison: |got - want| <= tol_abs + tol_rel * |want| */
    double tol_rel;
} bench_check_t;

/* Sets up (allocating rseed) for one checked run. Returns 0, or -1 if out of memory. */
int bench_check_init(bench_check_t *c, zccl_datatype_t dt, int pattern, int nranks, uint64_t seed);
void bench_check_free(bench_check_t *c);

/* Writes count elements of rank's pattern, elements first..first+count-1 of its send vector, to buf. */
void bench_fill(const bench_check_t *c, void *buf, int rank, size_t first, size_t count);

/* Number of elements of buf (count elements) that differ from rank's pattern starting at element first. */
int64_t bench_verify_copy(const bench_check_t *c, const void *buf, int rank, size_t first, size_t count);

/* Number of elements of buf (count elements) that differ from the reduction over all ranks of the patterns at
 * elements first..first+count-1 (op is c->pattern, avg dividing by nranks). */
int64_t bench_verify_reduce(const bench_check_t *c, const void *buf, size_t first, size_t count);

/* IEEE binary16 / bfloat16 conversions, round to nearest even. */
uint16_t bench_float_to_half(float f);
float bench_half_to_float(uint16_t h);
uint16_t bench_float_to_bf16(float f);
float bench_bf16_to_float(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif

/*
 * quant.h — block-quantized wire formats (docs/zero.md, "Quantized collectives"; the public names and error bounds
 * are in include/zccl.h, zccl_wire_t).
 *
 * A shard of n elements travels as one self-contained byte string of zccl__quant_bytes(wire, n, B) bytes:
 *     [ceil(n/B) fp32 scales, host byte order][payload][zero padding up to a multiple of 8 bytes]
 * Block b holds elements [b*B, min((b+1)*B, n)) and has scale s_b = amax_b / Q, amax_b = max |x| over the block
 * (Q = 127 for int8, 7 for int4, 448 for fp8 E4M3, 57344 for fp8 E5M2). Payload: int8 and fp8, one byte per element;
 * int4, two's complement nibbles, element 2k in the low nibble of byte k and element 2k+1 in its high nibble.
 * A block holding a NaN or an infinity gets the scale NaN and a zero payload, so every element of it dequantizes
 * to NaN (the NaN/Inf policy: propagate, at block granularity). A block whose scale rounds to 0 (all zeros, or
 * amax below 127 * 2^-150) has a zero payload and dequantizes to zeros.
 * Encoding divides each element by s_b in float32, clamps to [-Q, Q] and rounds to nearest, ties to even (int
 * formats) or narrows to fp8 with elem_math.h's saturating conversion; decoding multiplies the code by s_b in
 * float32. Both are branch-free inner loops over a block that vectorise.
 */
#ifndef ZCCL_QUANT_H
#define ZCCL_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core.h"
#include "zccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This layer's setting (quant/settings.c). */
extern const zccl_cfg_desc_t zccl__set_quant_block;
#define ZCCL_CFG_QUANT_BLOCK (&zccl__set_quant_block)

/** The block size B in force (ZCCL_QUANT_BLOCK; its default when the value is invalid, which config_check reports). */
size_t zccl__quant_block(void);

/** True for a quantized format (int8, int4, fp8 E4M3, fp8 E5M2); false for ZCCL_WIRE_FULL and out-of-range values. */
bool zccl__quant_is_quantized(zccl_wire_t wire);
/** True for the element types the formats take: float32, float64 (rounded to float32 on the way in), float16,
 *  bfloat16. */
bool zccl__quant_dtype_ok(zccl_datatype_t dt);
/** "int8", "int4", "fp8e4m3", "fp8e5m2", "full"; "?" otherwise. */
const char *zccl__quant_name(zccl_wire_t wire);
/** Q of the format (127, 7, 448, 57344); 0 for ZCCL_WIRE_FULL. */
float zccl__quant_qmax(zccl_wire_t wire);

/** Bytes of the wire string of a shard of n elements with blocks of B (a multiple of 8; 0 for n = 0); SIZE_MAX
 *  when the size overflows. */
size_t zccl__quant_bytes(zccl_wire_t wire, size_t n, size_t B);

/** Encodes n elements of dt (float32, float16, bfloat16) at src into dst (zccl__quant_bytes(wire, n, B) bytes,
 *  padding included; any alignment). src and dst must not overlap. */
void zccl__quant_encode(zccl_wire_t wire, const void *src, zccl_datatype_t dt, size_t n, size_t B, uint8_t *dst);

/** Decodes a wire string of n elements into dst as dt (the float32 value s_b * code, narrowed once to dt). */
void zccl__quant_decode(zccl_wire_t wire, const uint8_t *src, size_t n, size_t B, void *dst, zccl_datatype_t dt);

/** acc[i] += s_b * code_i in float32, for the n elements of a wire string (the accumulating decode of a
 *  reduction hop). */
void zccl__quant_decode_add(zccl_wire_t wire, const uint8_t *src, size_t n, size_t B, float *acc);

/** Widens n elements of dt to float32 (dst[i] = src[i], exact). */
void zccl__quant_widen(const void *src, zccl_datatype_t dt, size_t n, float *dst);
/** Narrows n float32 values to dt, rounding to nearest, ties to even (float16 overflows to infinity, as
 *  elem_math.h's conversion does). */
void zccl__quant_narrow(const float *src, size_t n, zccl_datatype_t dt, void *dst);

#ifdef __cplusplus
}
#endif

#endif

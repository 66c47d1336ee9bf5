/*
 * settings.c — the quantization layer's row of the ZCCL_* settings table (util/config.c gathers the rows;
 * docs/configuration.md explains it).
 */
#include <stdint.h>
#include "quant.h"

ZCCL_SETTING(zccl__set_quant_block) = {.name = "ZCCL_QUANT_BLOCK", .deflt = "128",
        .help = "elements per block of the quantized wire formats (one fp32 scale per block; even); smaller blocks "
        "bound the error tighter and cost 4 bytes per block more on the wire",
        .kind = ZCCL_CFG_INT, .lo = 8, .hi = 1 << 20};
/* Not must_match: init compares at most 16 such rows (lib/core/comm.c), and every wire string's header carries B,
 * which each receiving rank checks, so ranks with different blocks fail the call on every rank. */

size_t zccl__quant_block(void) {
    int64_t v = 128;
    if (zccl__cfg_int(ZCCL_CFG_QUANT_BLOCK, &v) != ZCCL_SUCCESS) v = 128;
    return (size_t)(v & ~(int64_t)1); /* even: int4 pairs never straddle two blocks */
}

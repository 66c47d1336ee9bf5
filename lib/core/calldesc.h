/*
 * calldesc.h — a collective call described in 32 bytes: what every rank must agree on (sequence number, collective,
 * datatype, op, count, root). The engine sends it as the first message of a collective on every channel, and
 * ZCCL_CHECK all-gathers it, so that ranks whose calls differ fail naming both calls instead of mixing data.
 */
#ifndef ZCCL_CALLDESC_H
#define ZCCL_CALLDESC_H

#include <stddef.h>
#include <stdint.h>
#include "core.h"

#define ZCCL_DESC_BARRIER 1u /* flags: the all-reduce is zccl_barrier */
#define ZCCL_DESC_REFUSED 2u /* flags: the rank refused this call locally (ZCCL_CHECK marker) */
#define ZCCL_DESC_DEVICE 4u  /* flags: the call is on device memory (its transfers move in staging chunks) */

/** Wire format (no padding): compared bytewise. op 0xff: none; root -1: none. */
typedef struct {
    uint64_t seq;   /* collectives counted on this communicator, this one included */
    uint64_t count; /* elements (_v collectives: the total) */
    uint64_t vhash; /* _v collectives: hash of the per-rank counts; else 0 */
    uint8_t coll, dt, op, flags;
    int32_t root;
} zccl_call_desc_t;
#ifndef __cplusplus
_Static_assert(sizeof(zccl_call_desc_t) == 32, "zccl_call_desc_t is a wire format");
#endif

/** Writes "#5 zccl_allreduce(count 64, float32, op sum)" (root only where the collective has one). The number shown
 *  is d->seq - seq_base when d->seq > seq_base: the communicator's cseq_init, so that a user's first collective is
 *  #1 whatever init ran before it (comm.h, zccl__seq_shown). */
void zccl__desc_describe(const zccl_call_desc_t *d, uint64_t seq_base, char *buf, size_t len);

/** Collective #seq as messages number it: seq - base once past base (a communicator's cseq_init), else seq. */
static inline unsigned long long zccl__seq_after(uint64_t seq, uint64_t base) {
    return (unsigned long long)(seq > base ? seq - base : seq);
}

#endif

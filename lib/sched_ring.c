/*
 * sched_ring.c — ring reduce-scatter, ring all-gather, and ring all-reduce (= reduce-scatter + all-gather).
 *
 * The ring (Patarasuk & Yuan, JPDC 2009) is bandwidth-optimal: with n ranks each rank sends and receives
 * (n-1)/n of the data once for a reduce-scatter or an all-gather, 2(n-1)/n for an all-reduce, whatever n is.
 * The data is cut into n blocks. In step s of the reduce-scatter, rank r sends the block it finished reducing in
 * step s-1 (its own input block r-1 in step 0) to rank r+1, and receives block r-s-2 from rank r-1, reducing it
 * with its own input; after n-1 steps rank r holds the complete block r. The all-gather then passes the complete
 * blocks around the ring: in step s rank r forwards block r-s and receives block r-s-1.
 *
 * All-reduce accumulates in the receive buffer, so it needs no scratch. A stand-alone reduce-scatter has only
 * one block of output, so its partial sums travel through two scratch blocks; it works in rounds of at most
 * ZCCL_RS_ROUND_BYTES per block to bound that scratch whatever the message size.
 *
 * The ring runs in ring positions, not ranks: the rank at position p sends to the rank at position p+1, and the
 * topology-aware order (topology/topo_ring.c) decides which rank stands where. Blocks keep their rank identity
 * (block b is the output of rank b), so position q works on block ring[q].
 */
#include "schedule.h"

static void step(zccl_schedule_t *s, int kind, int buf, size_t off, int src, size_t src_off, size_t count, int peer,
                 bool final) {
    zccl__sched_step(s, (zccl_step_t){.kind = (uint8_t)kind, .buf = (uint8_t)buf, .src = (uint8_t)src,
                                      .final = (uint8_t)final, .peer = peer, .off = off, .src_off = src_off,
                                      .count = count});
}

void zccl__sched_ring_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t rc = a->count;
    if (n == 1) {
        if (!a->in_place) step(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, 0, ZCCL_BUF_SEND, 0, rc, -1, false);
        zccl__sched_end_phase(s);
        return;
    }
    const int p = zccl__ring_pos(a, r), next = zccl__ring_at(a, p + 1), prev = zccl__ring_at(a, p - 1);
    size_t S = rc; /* elements of each block handled per round */
    if (n > 2) {
        S = a->rs_round_bytes / (a->elem_size ? a->elem_size : 1);
        if (S == 0) S = 1;
        if (S > rc) S = rc;
        s->tmp_elems = 2 * S;
    }
    for (size_t k0 = 0; k0 < rc; k0 += S) {
        const size_t len = (rc - k0 < S) ? rc - k0 : S;
        for (int st = 0; st <= n - 2; st++) {
            const int sb = zccl__ring_at(a, p - st - 1), rb = zccl__ring_at(a, p - st - 2);
            const bool last = (st == n - 2);
            if (st == 0) step(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, (size_t)sb * rc + k0, ZCCL_BUF_NONE, 0, len, next, false);
            else step(s, ZCCL_STEP_SEND, ZCCL_BUF_TMP, (size_t)((st - 1) % 2) * S, ZCCL_BUF_NONE, 0, len, next, false);
            if (last) step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, k0, ZCCL_BUF_SEND, (size_t)rb * rc + k0, len, prev, true);
            else step(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (size_t)(st % 2) * S, ZCCL_BUF_SEND, (size_t)rb * rc + k0, len,
                      prev, false);
            zccl__sched_end_phase(s);
        }
    }
}

void zccl__sched_ring_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (!a->in_place) step(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, (size_t)r * c, ZCCL_BUF_SEND, 0, c, -1, false);
    const int p = zccl__ring_pos(a, r), next = zccl__ring_at(a, p + 1), prev = zccl__ring_at(a, p - 1);
    for (int st = 0; st <= n - 2; st++) {
        const int sb = zccl__ring_at(a, p - st), rb = zccl__ring_at(a, p - st - 1);
        if (st == 0) step(s, ZCCL_STEP_SEND, ZCCL_BUF_SEND, 0, ZCCL_BUF_NONE, 0, c, next, false);
        else step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, (size_t)sb * c, ZCCL_BUF_NONE, 0, c, next, false);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, (size_t)rb * c, ZCCL_BUF_NONE, 0, c, prev, false);
        zccl__sched_end_phase(s);
    }
    zccl__sched_end_phase(s);
}

void zccl__sched_ring_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t count = a->count;
    if (n == 1) {
        if (!a->in_place) step(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, 0, ZCCL_BUF_SEND, 0, count, -1, false);
        zccl__sched_end_phase(s);
        return;
    }
    const int p = zccl__ring_pos(a, r), next = zccl__ring_at(a, p + 1), prev = zccl__ring_at(a, p - 1);
    size_t off, len;
    for (int st = 0; st <= n - 2; st++) { /* reduce-scatter, accumulating in the receive buffer */
        const int sb = zccl__ring_at(a, p - st - 1), rb = zccl__ring_at(a, p - st - 2);
        zccl__block(count, n, sb, &off, &len);
        step(s, ZCCL_STEP_SEND, st == 0 ? ZCCL_BUF_SEND : ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, next, false);
        zccl__block(count, n, rb, &off, &len);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, off, ZCCL_BUF_SEND, off, len, prev, st == n - 2);
        zccl__sched_end_phase(s);
    }
    for (int st = 0; st <= n - 2; st++) { /* all-gather of the reduced blocks */
        zccl__block(count, n, zccl__ring_at(a, p - st), &off, &len);
        step(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, next, false);
        zccl__block(count, n, zccl__ring_at(a, p - st - 1), &off, &len);
        step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, off, ZCCL_BUF_NONE, 0, len, prev, false);
        zccl__sched_end_phase(s);
    }
}

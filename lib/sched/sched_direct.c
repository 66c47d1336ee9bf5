/*
 * sched_direct.c — direct (one-shot) all-reduce for small messages; direct reduce-scatter and all-gather below.
 *
 * Every rank sends its whole vector to every other rank in one phase, then reduces the n vectors locally in rank
 * order 0, 1, ..., n-1. It takes one communication step instead of the ring's 2(n-1), at the price of sending
 * (n-1) full vectors instead of 2(n-1)/n of one, so it only pays for small messages, where latency dominates
 * (the "latency-optimal" end of the alpha-beta trade-off, Thakur, Rabenseifner & Gropp, IJHPCA 2005). Because
 * every rank combines the same values in the same order, all ranks get bitwise-identical results.
 */
#include "schedule.h"

void zccl__sched_direct_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    /* TMP holds one vector per rank at slot q. This rank's own vector is read from SEND, or, in place, from a copy
     * in its own slot, since the reductions below overwrite RECV == SEND before they reach it. */
    s->tmp_elems = (size_t)n * c;
    const uint8_t own_buf = a->in_place ? ZCCL_BUF_TMP : ZCCL_BUF_SEND;
    const size_t own_off = a->in_place ? (size_t)r * c : 0;
    if (a->in_place)
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_TMP, .off = own_off,
                                          .src = ZCCL_BUF_SEND, .peer = -1, .count = c});
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .src = ZCCL_BUF_NONE,
                                          .peer = to, .count = c});
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_TMP, .src = ZCCL_BUF_NONE,
                                          .peer = from, .off = (size_t)from * c, .count = c});
    }
    zccl__sched_end_phase(s);
    /* RECV = v0 op v1, then RECV = RECV op v2, ...: the same order on every rank. */
    for (int q = 1; q < n; q++) {
        /* operand a: v0 for the first step (own or received), then the running result in RECV */
        const uint8_t a_buf = q > 1 ? ZCCL_BUF_RECV : (r == 0 ? own_buf : ZCCL_BUF_TMP);
        const size_t a_off = q > 1 ? 0 : (r == 0 ? own_off : 0);
        const uint8_t b_buf = (q == r) ? own_buf : ZCCL_BUF_TMP;
        const size_t b_off = (q == r) ? own_off : (size_t)q * c;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_REDUCE, .buf = ZCCL_BUF_RECV, .src = a_buf,
                                          .src_off = a_off, .src2 = b_buf, .src2_off = b_off, .count = c,
                                          .final = (q == n - 1), .peer = -1});
    }
    zccl__sched_end_phase(s);
}

/*
 * Direct reduce-scatter (for ranks on one host, over shared memory): every rank sends block q of its input to rank
 * q and receives block r from every peer in one phase, then reduces the n contributions to its block locally in
 * rank order 0, 1, ..., n-1. Each block is reduced at one rank only, so results are deterministic; one step of
 * latency, (n-1)/n of the data sent per rank, n blocks of scratch.
 */
void zccl__sched_direct_reduce_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    /* TMP slot q holds rank q's contribution; the own one stays in SEND (out of place) or is copied to slot r (in
     * place, where RECV is the own block of SEND and is overwritten by the first reduction). */
    s->tmp_elems = (size_t)n * c;
    const uint8_t own_buf = a->in_place ? ZCCL_BUF_TMP : ZCCL_BUF_SEND;
    const size_t own_off = (size_t)r * c;
    if (a->in_place)
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_TMP, .off = own_off,
                                          .src = ZCCL_BUF_SEND, .src_off = own_off, .peer = -1, .count = c});
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .off = (size_t)to * c,
                                          .src = ZCCL_BUF_NONE, .peer = to, .count = c});
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_TMP, .src = ZCCL_BUF_NONE,
                                          .peer = from, .off = (size_t)from * c, .count = c});
    }
    zccl__sched_end_phase(s);
    for (int q = 1; q < n; q++) {
        const uint8_t a_buf = q > 1 ? ZCCL_BUF_RECV : (r == 0 ? own_buf : ZCCL_BUF_TMP);
        const size_t a_off = q > 1 ? 0 : (r == 0 ? own_off : 0);
        const uint8_t b_buf = (q == r) ? own_buf : ZCCL_BUF_TMP;
        const size_t b_off = (size_t)q * c;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_REDUCE, .buf = ZCCL_BUF_RECV, .src = a_buf,
                                          .src_off = a_off, .src2 = b_buf, .src2_off = b_off, .count = c,
                                          .final = (q == n - 1), .peer = -1});
    }
    zccl__sched_end_phase(s);
}

/* Direct all-gather: every rank sends its block to every peer in one phase (one step of latency). */
void zccl__sched_direct_allgather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    if (!a->in_place)
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .off = (size_t)r * c,
                                          .src = ZCCL_BUF_SEND, .peer = -1, .count = c});
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .src = ZCCL_BUF_NONE,
                                          .peer = to, .count = c});
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .off = (size_t)from * c,
                                          .src = ZCCL_BUF_NONE, .peer = from, .count = c});
    }
    zccl__sched_end_phase(s);
}

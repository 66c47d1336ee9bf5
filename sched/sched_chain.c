/*
 * sched_chain.c — pipelined chain broadcast and reduce along the ring.
 *
 * Broadcast: the root sends the message in chunks to rank root+1, which forwards each chunk to root+2 as soon as
 * it has it, and so on. With k chunks and n ranks the message crosses in k+n-2 chunk-times, so for large
 * messages the time approaches one message-time regardless of n (the pipelined-chain bound, cf. Thakur,
 * Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 2005).
 * Reduce is the same chain run backwards: rank root+1 sends its chunks, every next rank adds its own input and
 * forwards the partial sum, and the root adds the last contribution into its receive buffer. Intermediate ranks
 * keep two chunks of scratch (one arriving, one leaving). "Next" and "previous" are ring positions, so the chain
 * follows the topology-aware ring order.
 */
#include "schedule.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

static void step(zccl_schedule_t *s, int kind, int buf, int src, bool final, int peer, size_t off, size_t src_off,
                 size_t count) {
    zccl__sched_step(s, (zccl_step_t){.kind = (uint8_t)kind, .buf = (uint8_t)buf, .src = (uint8_t)src,
                                      .final = (uint8_t)final, .peer = peer, .off = off, .src_off = src_off,
                                      .count = count});
}

static size_t chunk_elems(const zccl_sched_args_t *a) {
    size_t c = a->chunk_bytes / (a->elem_size ? a->elem_size : 1);
    return c ? c : 1;
}

void zccl__sched_chain_broadcast(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank, root = a->root;
    const size_t count = a->count;
    const int rp = zccl__ring_pos(a, r), p = mod(rp - zccl__ring_pos(a, root), n); /* chain position; root is 0 */
    if (p == 0 && !a->in_place)
        step(s, ZCCL_STEP_COPY, ZCCL_BUF_RECV, ZCCL_BUF_SEND, 0, -1, 0, 0, count);
    if (n == 1) { zccl__sched_end_phase(s); return; }
    const size_t C = chunk_elems(a), K = (count + C - 1) / C;
    const int next = zccl__ring_at(a, rp + 1), prev = zccl__ring_at(a, rp - 1);
    for (size_t t = 0; t + 2 < K + (size_t)n; t++) {
        if (p >= 1 && t + 1 >= (size_t)p && t + 1 - (size_t)p < K) {
            const size_t c = t + 1 - (size_t)p, off = c * C, len = ZCCL_MIN(C, count - off);
            step(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, ZCCL_BUF_NONE, 0, prev, off, 0, len);
        }
        if (p <= n - 2 && t >= (size_t)p && t - (size_t)p < K) {
            const size_t c = t - (size_t)p, off = c * C, len = ZCCL_MIN(C, count - off);
            step(s, ZCCL_STEP_SEND, p == 0 ? ZCCL_BUF_SEND : ZCCL_BUF_RECV, ZCCL_BUF_NONE, 0, next, off, 0, len);
        }
        zccl__sched_end_phase(s);
    }
    zccl__sched_end_phase(s);
}

void zccl__sched_chain_reduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank, root = a->root;
    const size_t count = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    /* chain: the ranks after the root in ring order, then the root last (position n-1) */
    const int rp = zccl__ring_pos(a, r), p = mod(rp - zccl__ring_pos(a, root) - 1, n);
    const size_t C = chunk_elems(a), K = (count + C - 1) / C;
    const int next = zccl__ring_at(a, rp + 1), prev = zccl__ring_at(a, rp - 1);
    const bool middle = (p >= 1 && p <= n - 2);
    if (middle) s->tmp_elems = 2 * C;
    for (size_t t = 0; t + 2 < K + (size_t)n; t++) {
        if (p >= 1 && t + 1 >= (size_t)p && t + 1 - (size_t)p < K) {
            const size_t c = t + 1 - (size_t)p, off = c * C, len = ZCCL_MIN(C, count - off);
            const bool at_root = (p == n - 1);
            step(s, ZCCL_STEP_RECV, at_root ? ZCCL_BUF_RECV : ZCCL_BUF_TMP, ZCCL_BUF_SEND, at_root, prev,
                 at_root ? off : (c % 2) * C, off, len);
        }
        if (p <= n - 2 && t >= (size_t)p && t - (size_t)p < K) {
            const size_t c = t - (size_t)p, off = c * C, len = ZCCL_MIN(C, count - off);
            step(s, ZCCL_STEP_SEND, p == 0 ? ZCCL_BUF_SEND : ZCCL_BUF_TMP, ZCCL_BUF_NONE, 0, next,
                 p == 0 ? off : (c % 2) * C, 0, len);
        }
        zccl__sched_end_phase(s);
    }
}

/*
 * sched_alltoall.c — direct (pairwise, one-shot) all-to-all, all-to-allv, gather and scatter.
 *
 * Each is a single phase: every transfer a rank takes part in is posted at once and the engine progresses them
 * together, so no ordering between peers is needed for deadlock freedom (the checker proves it under rendezvous
 * semantics, where a send completes only when its receiver consumes it). Peers are visited in the order
 * r+1, r+2, ... (sends) and r-1, r-2, ... (receives), so that at any moment the ranks' first transfers form a
 * permutation and no single rank is the first target of everyone (the usual pairwise all-to-all order). The own
 * block is a local copy. Per rank: (n-1) messages each way, one step of latency; the data volume is the minimum.
 * For gather and scatter the root is the bottleneck ((n-1) blocks through one link), which a tree would not
 * change for bandwidth; a tree only saves latency for tiny messages at large n, which is left for later.
 */
#include "schedule.h"

static void add(zccl_schedule_t *s, zccl_step_t st) { zccl__sched_step(s, st); }

void zccl__sched_direct_alltoall(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t c = a->count;
    /* In place the receives overwrite blocks still to be sent: every block is first staged in TMP (a local step,
     * which runs before the phase's transfers), and the sends read from there. The own block stays in place. */
    uint8_t src = ZCCL_BUF_SEND;
    if (a->in_place && n > 1) {
        s->tmp_elems = (size_t)n * c;
        add(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_TMP, .src = ZCCL_BUF_SEND, .peer = -1,
                             .count = (size_t)n * c});
        src = ZCCL_BUF_TMP;
    }
    if (!a->in_place)
        add(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .off = (size_t)r * c, .src = ZCCL_BUF_SEND,
                             .src_off = (size_t)r * c, .peer = -1, .count = c});
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        add(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = src, .off = (size_t)to * c, .src = ZCCL_BUF_NONE,
                             .peer = to, .count = c});
        add(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .off = (size_t)from * c,
                             .src = ZCCL_BUF_NONE, .peer = from, .count = c});
    }
    zccl__sched_end_phase(s);
}

void zccl__sched_direct_alltoallv(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t *sc = a->a2av, *sd = a->a2av + n, *rc = a->a2av + 2 * (size_t)n, *rd = a->a2av + 3 * (size_t)n;
    /* Not in place (zccl_alltoallv refuses overlapping buffers). The own block is a copy of min(sc, rc) elements:
     * the two must agree, and a disagreement is the caller's error (as MPI's). */
    add(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .off = rd[r], .src = ZCCL_BUF_SEND,
                         .src_off = sd[r], .peer = -1, .count = sc[r] < rc[r] ? sc[r] : rc[r]});
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        add(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .off = sd[to], .src = ZCCL_BUF_NONE,
                             .peer = to, .count = sc[to]});
        add(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .off = rd[from], .src = ZCCL_BUF_NONE,
                             .peer = from, .count = rc[from]});
    }
    zccl__sched_end_phase(s);
}

void zccl__sched_direct_gather(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank, root = a->root;
    const size_t c = a->count;
    if (r != root) {
        add(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .src = ZCCL_BUF_NONE, .peer = root,
                             .count = c});
    } else {
        if (!a->in_place)
            add(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .off = (size_t)root * c,
                                 .src = ZCCL_BUF_SEND, .peer = -1, .count = c});
        for (int k = 1; k < n; k++) {
            const int from = (root + k) % n;
            add(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .off = (size_t)from * c,
                                 .src = ZCCL_BUF_NONE, .peer = from, .count = c});
        }
    }
    zccl__sched_end_phase(s);
}

void zccl__sched_direct_scatter(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank, root = a->root;
    const size_t c = a->count;
    if (r != root) {
        add(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .src = ZCCL_BUF_NONE, .peer = root,
                             .count = c});
    } else {
        if (!a->in_place)
            add(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .src = ZCCL_BUF_SEND,
                                 .src_off = (size_t)root * c, .peer = -1, .count = c});
        for (int k = 1; k < n; k++) {
            const int to = (root + k) % n;
            add(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .off = (size_t)to * c,
                                 .src = ZCCL_BUF_NONE, .peer = to, .count = c});
        }
    }
    zccl__sched_end_phase(s);
}

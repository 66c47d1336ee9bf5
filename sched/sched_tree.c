/*
 * sched_tree.c — double binary tree all-reduce (Sanders, Speck & Traeff, "Two-tree algorithms for full bandwidth
 * broadcast, reduction and scan", Parallel Computing 2009; the scheme NCCL uses for its "tree" algorithm).
 *
 * Tree shape: ranks are labelled 1..n in in-order; label x with lowest set bit b has left child x - b/2 (if b > 1)
 * and right child x + d for the largest d in {b/2, b/4, ...} with x + d <= n; the root is the largest power of
 * two <= n. Leaves are exactly the odd labels, so about half the ranks are leaves, and depth is < 2 log2 n.
 * Tree 0 gives rank r label r+1; tree 1 gives it label ((r+1) mod n)+1 (shifted by one), so a rank is an inner
 * node in at most one of the two trees: the two trees together use each rank's links about once in each
 * direction, which is what lets them reach full bandwidth (Sanders et al.). Tree 0 carries the first half of the
 * vector, tree 1 the second.
 *
 * Each half is cut into chunks of chunk_bytes and pipelined through its tree in lock-step slots: a node at depth h
 * of a tree of depth D receives chunk c from its children in slot c + D-h-1 and sends its partial to its parent
 * in slot c + D-h; the root finishes chunk c in slot c + D and sends it down, a node at depth h receives it in slot
 * c + D+h-1 and forwards it in slot c + D+h. Time about (K + 2D) slots for K chunks: for large messages each half
 * crosses at the speed of one link, for small ones it takes 2D steps (log-depth latency).
 *
 * An inner node computes (own OP left-child) as the left child's data arrives and then OP right-child, which
 * arrives into scratch and is combined by a local step at the start of the next slot. Bitwise identity: each
 * element's final value is computed once, at its tree's root (which also divides for ZCCL_AVG), and broadcast;
 * the order of operations is fixed by the tree, so repeated runs give the same bits.
 * Scratch: one chunk per tree. Communication follows rank numbers.
 */
#include <stdlib.h>
#include <math.h>
#include "algo.h"

typedef struct {
    int left, right, parent, depth; /* labels (0 = none) */
} node_t;

/* Fills nodes[1..n]; returns the depth of the deepest node, or -1 on allocation failure. */
static int build_tree(int n, node_t *nodes) {
    int root = 1;
    while (root * 2 <= n) root *= 2;
    for (int x = 1; x <= n; x++) {
        const int b = x & -x;
        nodes[x].left = b > 1 ? x - b / 2 : 0;
        int d = b / 2;
        while (d >= 1 && x + d > n) d /= 2;
        nodes[x].right = d >= 1 ? x + d : 0;
        nodes[x].parent = 0;
    }
    for (int x = 1; x <= n; x++) {
        if (nodes[x].left) nodes[nodes[x].left].parent = x;
        if (nodes[x].right) nodes[nodes[x].right].parent = x;
    }
    /* depths: walk up (depth < 2 log2 n, so this is O(n log n)) */
    int D = 0;
    for (int x = 1; x <= n; x++) {
        int h = 0;
        for (int y = x; y != root; y = nodes[y].parent) h++;
        nodes[x].depth = h;
        if (h > D) D = h;
    }
    return D;
}

static void st(zccl_schedule_t *s, int kind, int buf, size_t off, int src, size_t src_off, size_t count, int peer,
               bool final) {
    zccl__sched_step(s, (zccl_step_t){.kind = (uint8_t)kind, .buf = (uint8_t)buf, .src = (uint8_t)src,
                                      .final = (uint8_t)final, .peer = peer, .off = off, .src_off = src_off,
                                      .count = count});
}

void zccl__sched_tree_allreduce(const zccl_sched_args_t *a, zccl_schedule_t *s) {
    const int n = a->nranks, r = a->rank;
    const size_t count = a->count;
    if (n == 1) {
        zccl__sched_one_rank(a, s, 0);
        return;
    }
    node_t *nodes = malloc(((size_t)n + 1) * sizeof *nodes);
    if (!nodes) { s->oom = true; return; }
    const int D = build_tree(n, nodes);
    size_t C = a->chunk_bytes / (a->elem_size ? a->elem_size : 1);
    if (C == 0) C = 1;
    struct {
        size_t off, len, K;
        int x; /* this rank's label */
    } t[2];
    size_t slots = 0;
    for (int k = 0; k < 2; k++) {
        zccl__block(count, 2, k, &t[k].off, &t[k].len);
        t[k].K = (t[k].len + C - 1) / C;
        t[k].x = (r + k) % n + 1;
        if (t[k].K && t[k].K + 2 * (size_t)D > slots) slots = t[k].K + 2 * (size_t)D;
    }
    if (C > t[0].len) C = t[0].len ? t[0].len : 1; /* the first half is the larger: no chunk is longer */
    for (int k = 0; k < 2; k++) t[k].K = (t[k].len + C - 1) / C;
    s->tmp_elems = 2 * C;
#define RANK(k, label) ((((label) - 1) - (k) + n) % n)
    for (size_t T = 0; T < slots; T++) {
        for (int k = 0; k < 2; k++) {
            if (!t[k].K) continue;
            const node_t *me = &nodes[t[k].x];
            const size_t h = (size_t)me->depth, K = t[k].K;
            const bool root = (me->parent == 0), leaf = (me->left == 0);
#define CHUNK(c, o, l) size_t o = t[k].off + (c) * C, l = ZCCL_MIN(C, t[k].len - (c) * C)
            /* up: the partial of chunk cs is complete (combine the right child's part first), send it */
            if (T + h >= (size_t)D && T + h - (size_t)D < K) {
                const size_t cs = T + h - (size_t)D;
                CHUNK(cs, o, l);
                if (me->right) /* RECV = (own OP left) OP right; the root's result is final */
                    zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_REDUCE, .buf = ZCCL_BUF_RECV, .off = o,
                                                      .src = ZCCL_BUF_RECV, .src_off = o, .src2 = ZCCL_BUF_TMP,
                                                      .src2_off = (size_t)k * C, .count = l, .final = root,
                                                      .peer = -1});
                if (!root)
                    st(s, ZCCL_STEP_SEND, leaf ? ZCCL_BUF_SEND : ZCCL_BUF_RECV, o, ZCCL_BUF_NONE, 0, l,
                       RANK(k, me->parent), false);
            }
            /* up: receive chunk cr from the children */
            if (!leaf && T + h + 1 >= (size_t)D && T + h + 1 - (size_t)D < K) {
                const size_t cr = T + h + 1 - (size_t)D;
                CHUNK(cr, o, l);
                st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, o, ZCCL_BUF_SEND, o, l, RANK(k, me->left),
                   root && !me->right);
                if (me->right)
                    st(s, ZCCL_STEP_RECV, ZCCL_BUF_TMP, (size_t)k * C, ZCCL_BUF_NONE, 0, l, RANK(k, me->right),
                       false);
            }
            /* down: receive chunk cb from the parent */
            if (!root && T + 1 >= (size_t)D + h && T + 1 - (size_t)D - h < K) {
                const size_t cb = T + 1 - (size_t)D - h;
                CHUNK(cb, o, l);
                st(s, ZCCL_STEP_RECV, ZCCL_BUF_RECV, o, ZCCL_BUF_NONE, 0, l, RANK(k, me->parent), false);
            }
            /* down: forward chunk cf to the children */
            if (!leaf && T >= (size_t)D + h && T - (size_t)D - h < K) {
                const size_t cf = T - (size_t)D - h;
                CHUNK(cf, o, l);
                st(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, o, ZCCL_BUF_NONE, 0, l, RANK(k, me->left), false);
                if (me->right) st(s, ZCCL_STEP_SEND, ZCCL_BUF_RECV, o, ZCCL_BUF_NONE, 0, l, RANK(k, me->right), false);
            }
#undef CHUNK
        }
        zccl__sched_end_phase(s);
    }
#undef RANK
    free(nodes);
}

/* ---- cost model ---- */

/* Double binary tree all-reduce (Sanders, Speck & Traeff 2009; sched_tree.c): each tree carries half the vector
 * in K chunks through (K + 2D) lock-step slots, D the depth (about log2 n); in a slot the busiest rank (inner node
 * of one tree, leaf of the other) sends and receives up to three chunks. Chunks follow collectives.c's rule. */
static double predict_tree(zccl_coll_t c, size_t bytes, const zccl_tune_layout_t *L, const zccl_tune_params_t *p) {
    (void)c;
    const int n = L->nranks;
    if (n <= 1) return 0;
    const double m = (double)bytes, half = m / 2;
    const double cb = ZCCL_MIN(half, (double)zccl__pipeline_chunk(bytes, n));
    const double K = cb > 0 ? ceil(half / cb) : 1, D = zccl__ceil_log2(n);
    return (K + 2 * D) * zccl__step_cost(zccl__flat_link(L, p), 3, cb) + m * p->gamma;
}

/* ---- the registry row ---- */

const zccl_algo_t zccl__algo_tree = {
    .name = "tree",
    .build = {
        [ZCCL_COLL_ALLREDUCE] = zccl__sched_tree_allreduce,
    },
    .predict = predict_tree,
};

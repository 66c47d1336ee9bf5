/*
 * sched_check.c — runs every rank's schedule together, symbolically, to prove an algorithm correct for a given
 * rank count without starting processes.
 *
 * Each element is modelled as (index tag, number of contributions, fingerprint of the contributions, "finalised"
 * flag). Rank q's contribution carries a random 64-bit key k_q; the fingerprint of a multiset of contributions is
 * the sum of their keys mod 2^64. An output element is accepted as "each rank exactly once" when it holds n
 * contributions and its fingerprint equals sum(k_q); a different multiset of n contributions has the same sum only
 * if sum((c_q - 1) * k_q) = 0 mod 2^64 for its counts c_q, which random keys make a 2^-60-or-less event for the
 * small counts that occur (multiset hashing; the counts check rules out cancellations by size). This keeps 16
 * bytes per element whatever n is, so n = 4096 ranks are checked in seconds (per-rank counters took n bytes).
 * A rank's send buffer starts with tag i and its own contribution for element i; receive and scratch buffers
 * start uninitialised. Each element also carries a hash of its expression tree (combining is hashed in operand
 * order, not commutatively), and for all-reduce the checker requires every rank's output element to have the same
 * expression: the same operations in the same order, so bitwise-identical results on every rank whatever the
 * rounding of the operation.
 * Sends are posted when a phase starts and stay in the channel's FIFO until the receiver consumes them; a phase
 * ends only when its receives are matched and its sends consumed, which models the rendezvous (single-copy)
 * transport, the strictest one. A round in which no rank can move is a deadlock. Local steps (COPY, REDUCE) of a
 * phase run before its transfers start, as in the engine, so a send may read what a local step of its own phase
 * wrote, but not what a receive of its phase writes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "schedule.h"

typedef struct {
    int32_t tag;    /* -1: uninitialised */
    uint32_t cnt;   /* contributions; bit 31: finalised */
    uint64_t hash;  /* sum of the contributing ranks' keys */
    uint64_t expr;  /* hash of the expression tree (operand order and nesting): equal on two ranks means the same
                       operations in the same order, hence bitwise-equal results */
} sym_t;
#define FINAL_BIT 0x80000000u
#define CNT(e) ((e)->cnt & ~FINAL_BIT)
#define IS_FINAL(e) (((e)->cnt & FINAL_BIT) != 0)

typedef struct msg {
    struct msg *next;
    int src_rank;
    size_t count;
    sym_t *data;
    bool consumed;
} msg_t;

typedef struct {
    int n;
    sym_t *arena[ZCCL_BUF_NONE]; /* per buffer id: base pointer (aliases inside one allocation for in-place) */
    size_t size[ZCCL_BUF_NONE];
    sym_t *alloc[2];
    size_t phase;
    bool posted;
    bool *recv_done;
    msg_t **my_sends; /* messages posted in the current phase */
    size_t nsends;
    uint64_t *stamp;  /* per peer: last pass of try_recvs in which a receive from it was left waiting */
    uint64_t pass;
    size_t *a2av;     /* all-to-allv: this rank's counts and displacements (4n) */
    zccl_schedule_t sched;
} rank_t;

typedef struct {
    int n;
    rank_t *ranks;
    uint64_t *key;        /* per rank: random contribution key */
    size_t *chan_base;    /* per rank r: channels r->peers[chan_base[r] .. chan_base[r+1]) in chan_peer, sorted */
    int *chan_peer;
    size_t nchan;
    msg_t **head, **tail; /* per channel: messages not yet consumed */
    uint64_t key_sum;
    int *queue;           /* ranks that may be able to move (ring buffer of n entries) */
    bool *queued;
    size_t qhead, qlen;
    struct iv { const sym_t *lo, *hi; } *wr; /* scratch for post_phase: receive ranges of one phase */
    char *err;
    size_t errlen;
    bool failed;
} sim_t;

/* Marks rank r as possibly able to move (a message arrived for it, or one it sent was consumed). */
static void wake(sim_t *sim, int r) {
    if (sim->queued[r]) return;
    sim->queued[r] = true;
    sim->queue[(sim->qhead + sim->qlen++) % (size_t)sim->n] = r;
}

static int cmp_iv(const void *a, const void *b) {
    const struct iv *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static bool fail(sim_t *sim, const char *fmt, ...) {
    if (sim->failed) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sim->err, sim->errlen, fmt, ap);
    va_end(ap);
    sim->failed = true;
    return false;
}

static sym_t *new_syms(int n, size_t count) {
    (void)n;
    sym_t *s = malloc((count ? count : 1) * sizeof *s);
    if (!s) return NULL;
    for (size_t i = 0; i < (count ? count : 1); i++) s[i] = (sym_t){.tag = -1};
    return s;
}
static void free_syms(sym_t *s) { free(s); }

static void sym_copy(int n, sym_t *d, const sym_t *s) {
    (void)n;
    *d = *s;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Channel src->dst, or SIZE_MAX when src never sends to dst. */
static size_t chan_of(const sim_t *sim, int src, int dst) {
    size_t lo = sim->chan_base[src], hi = sim->chan_base[src + 1];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim->chan_peer[mid] < dst) lo = mid + 1;
        else hi = mid;
    }
    return (lo < sim->chan_base[src + 1] && sim->chan_peer[lo] == dst) ? lo : SIZE_MAX;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Builds the channel table from the SEND steps of every rank's schedule. */
static bool build_channels(sim_t *sim) {
    const int n = sim->n;
    size_t total = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < sim->ranks[r].sched.nsteps; i++)
            if (sim->ranks[r].sched.steps[i].kind == ZCCL_STEP_SEND) total++;
    sim->chan_base = calloc((size_t)n + 1, sizeof *sim->chan_base);
    sim->chan_peer = malloc((total ? total : 1) * sizeof *sim->chan_peer);
    if (!sim->chan_base || !sim->chan_peer) return fail(sim, "out of memory");
    size_t w = 0;
    for (int r = 0; r < n; r++) {
        sim->chan_base[r] = w;
        const zccl_schedule_t *s = &sim->ranks[r].sched;
        size_t first = w;
        for (size_t i = 0; i < s->nsteps; i++) {
            const zccl_step_t *x = &s->steps[i];
            if (x->kind != ZCCL_STEP_SEND) continue;
            if (x->peer < 0 || x->peer >= n || x->peer == r)
                return fail(sim, "rank %d sends to invalid peer %d", r, x->peer);
            sim->chan_peer[w++] = x->peer;
        }
        qsort(sim->chan_peer + first, w - first, sizeof(int), cmp_int);
        size_t u = first;
        for (size_t i = first; i < w; i++)
            if (u == first || sim->chan_peer[u - 1] != sim->chan_peer[i]) sim->chan_peer[u++] = sim->chan_peer[i];
        w = u;
    }
    sim->chan_base[n] = w;
    sim->nchan = w;
    sim->head = calloc(w ? w : 1, sizeof *sim->head);
    sim->tail = calloc(w ? w : 1, sizeof *sim->tail);
    if (!sim->head || !sim->tail) return fail(sim, "out of memory");
    return true;
}

/* All-to-allv in the checker: rank r's counts and packed displacements, derived from the matrix (r's row: what it
 * sends; r's column: what it receives). a2v must hold 4n entries. */
static void a2av_of(const zccl_sched_args_t *a, int r, size_t *a2v) {
    const int n = a->nranks;
    size_t so = 0, ro = 0;
    for (int q = 0; q < n; q++) {
        a2v[q] = a->a2av_matrix[(size_t)r * n + q];
        a2v[n + q] = so;
        so += a2v[q];
        a2v[2 * n + q] = a->a2av_matrix[(size_t)q * n + r];
        a2v[3 * n + q] = ro;
        ro += a2v[2 * n + q];
    }
}

static size_t send_size(const zccl_sched_args_t *a, int r) {
    const int n = a->nranks;
    switch (a->coll) {
    case ZCCL_COLL_REDUCE_SCATTER: return zccl__vtotal(a);
    case ZCCL_COLL_BROADCAST: return r == a->root ? a->count : 0;
    case ZCCL_COLL_ALLTOALL: return (size_t)n * a->count;
    case ZCCL_COLL_ALLTOALLV: return a->a2av[2 * n - 1] + a->a2av[n - 1]; /* last displacement + count */
    case ZCCL_COLL_SCATTER: return r == a->root ? (size_t)n * a->count : 0;
    default: return a->count;
    }
}
static size_t recv_size(const zccl_sched_args_t *a, int r) {
    const int n = a->nranks;
    switch (a->coll) {
    case ZCCL_COLL_ALLGATHER: return zccl__vtotal(a);
    case ZCCL_COLL_REDUCE: return r == a->root ? a->count : 0;
    case ZCCL_COLL_ALLTOALL: return (size_t)n * a->count;
    case ZCCL_COLL_ALLTOALLV: return a->a2av[4 * n - 1] + a->a2av[3 * n - 1];
    case ZCCL_COLL_GATHER: return r == a->root ? (size_t)n * a->count : 0;
    default: return a->count;
    }
}

static bool setup_rank(sim_t *sim, const zccl_sched_args_t *args, int r, zccl_sched_mutator_t mutate) {
    rank_t *R = &sim->ranks[r];
    const int n = sim->n;
    zccl_sched_args_t a = *args;
    a.rank = r;
    if (a.counts) a.count = a.counts[r]; /* uneven blocks: each rank's own count */
    if (a.coll == ZCCL_COLL_ALLTOALLV) {
        if (!a.a2av_matrix) return fail(sim, "all-to-allv needs a2av_matrix in the checker");
        R->a2av = malloc(4 * (size_t)n * sizeof *R->a2av);
        if (!R->a2av) return fail(sim, "out of memory");
        a2av_of(&a, r, R->a2av);
        a.a2av = R->a2av;
    }
    if (zccl__sched_build(&a, &R->sched) != ZCCL_SUCCESS) return fail(sim, "rank %d: schedule build failed", r);
    if (mutate) mutate(r, &R->sched);
    size_t ss = send_size(&a, r), rs = recv_size(&a, r);
    const bool rooted = args->coll == ZCCL_COLL_BROADCAST || args->coll == ZCCL_COLL_REDUCE ||
                        args->coll == ZCCL_COLL_GATHER || args->coll == ZCCL_COLL_SCATTER;
    bool inp = args->in_place && args->coll != ZCCL_COLL_ALLTOALLV && !(rooted && r != args->root);
    if (inp) {
        /* One allocation; the smaller buffer lives inside the larger one where NCCL's in-place rule puts it. */
        size_t big = ss > rs ? ss : rs;
        R->alloc[0] = new_syms(n, big);
        if (!R->alloc[0]) return fail(sim, "out of memory");
        if (args->coll == ZCCL_COLL_SCATTER) { /* recvbuf = sendbuf + root*count */
            R->arena[ZCCL_BUF_SEND] = R->alloc[0];
            R->arena[ZCCL_BUF_RECV] = R->alloc[0] + (size_t)r * a.count;
        } else if (args->coll == ZCCL_COLL_GATHER) { /* sendbuf = recvbuf + root*count */
            R->arena[ZCCL_BUF_RECV] = R->alloc[0];
            R->arena[ZCCL_BUF_SEND] = R->alloc[0] + (size_t)r * a.count;
        } else if (args->coll == ZCCL_COLL_REDUCE_SCATTER) {
            R->arena[ZCCL_BUF_SEND] = R->alloc[0];
            size_t off, len;
            zccl__vblock(&a, r, &off, &len);
            R->arena[ZCCL_BUF_RECV] = R->alloc[0] + off;
        } else if (args->coll == ZCCL_COLL_ALLGATHER) {
            R->arena[ZCCL_BUF_RECV] = R->alloc[0];
            size_t off, len;
            zccl__vblock(&a, r, &off, &len);
            R->arena[ZCCL_BUF_SEND] = R->alloc[0] + off;
        } else {
            R->arena[ZCCL_BUF_SEND] = R->arena[ZCCL_BUF_RECV] = R->alloc[0];
        }
    } else {
        R->alloc[0] = new_syms(n, ss);
        R->alloc[1] = new_syms(n, rs);
        if (!R->alloc[0] || !R->alloc[1]) return fail(sim, "out of memory");
        R->arena[ZCCL_BUF_SEND] = R->alloc[0];
        R->arena[ZCCL_BUF_RECV] = R->alloc[1];
    }
    R->size[ZCCL_BUF_SEND] = ss;
    R->size[ZCCL_BUF_RECV] = rs;
    R->size[ZCCL_BUF_TMP] = R->sched.tmp_elems;
    R->arena[ZCCL_BUF_TMP] = new_syms(n, R->sched.tmp_elems);
    if (!R->arena[ZCCL_BUF_TMP]) return fail(sim, "out of memory");
    for (size_t i = 0; i < ss; i++)
        R->arena[ZCCL_BUF_SEND][i] = (sym_t){.tag = (int32_t)i, .cnt = 1, .hash = sim->key[r],
                                             .expr = sim->key[r] ^ 0x7f4a7c15u};
    R->recv_done = calloc(R->sched.nsteps + 1, sizeof(bool));
    R->stamp = calloc((size_t)n, sizeof *R->stamp);
    if (!R->stamp) return fail(sim, "out of memory");
    R->my_sends = calloc(R->sched.nsteps + 1, sizeof(msg_t *));
    if (!R->recv_done || !R->my_sends) return fail(sim, "out of memory");
    return true;
}

static sym_t *range(sim_t *sim, rank_t *R, int r, int buf, size_t off, size_t count, const char *what) {
    if (buf < 0 || buf >= ZCCL_BUF_NONE) { fail(sim, "rank %d: %s names no buffer", r, what); return NULL; }
    if (off > R->size[buf] || count > R->size[buf] - off) {
        fail(sim, "rank %d: %s [%zu, %zu) outside buffer %d of %zu elements", r, what, off, off + count, buf,
             R->size[buf]);
        return NULL;
    }
    return R->arena[buf] + off;
}

static bool overlap(const sym_t *a, size_t na, const sym_t *b, size_t nb) { return a < b + nb && b < a + na; }

/* dst = p OP q, symbolically: same element, contributions added, neither operand already divided. */
static bool combine(sim_t *sim, int r, sym_t *dst, const sym_t *p, const sym_t *q, bool final) {
    if (p->tag < 0 || q->tag < 0) return fail(sim, "rank %d reduces with an uninitialised element", r);
    if (p->tag != q->tag)
        return fail(sim, "rank %d reduces element %lld with element %lld", r, (long long)p->tag, (long long)q->tag);
    if (IS_FINAL(p) || IS_FINAL(q))
        return fail(sim, "rank %d reduces a value that was already finalised (divided twice)", r);
    const uint32_t c = CNT(p) + CNT(q);
    if (c >= FINAL_BIT) return fail(sim, "rank %d: contribution count overflows", r);
    const uint64_t h = p->hash + q->hash; /* dst may be p or q */
    uint64_t x = p->expr * 0x9E3779B97F4A7C15ull + ((q->expr << 23) | (q->expr >> 41)) + (final ? 0x5bd1e995u : 1);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    dst->expr = x;
    dst->tag = p->tag;
    dst->cnt = c | (final ? FINAL_BIT : 0);
    dst->hash = h;
    return true;
}

/* Starts the current phase of rank r: local copies, then posting its sends. */
static bool post_phase(sim_t *sim, int r) {
    rank_t *R = &sim->ranks[r];
    const zccl_schedule_t *s = &R->sched;
    size_t b = R->phase ? s->phase_end[R->phase - 1] : 0, e = s->phase_end[R->phase];
    /* A send's source may not be written by a receive of the same phase (the transport reads it while the phase
     * runs). Local steps finish before the transfers start, so they may write it. Receive ranges are sorted by
     * address and merged, then each send is looked up: O((sends + receives) log receives) per phase. */
    size_t nw = 0;
    for (size_t i = b; i < e; i++) {
        const zccl_step_t *y = &s->steps[i];
        if (y->kind != ZCCL_STEP_RECV) continue;
        sym_t *dst = range(sim, R, r, y->buf, y->off, y->count, "receive");
        if (!dst) return false;
        sim->wr[nw].lo = dst;
        sim->wr[nw].hi = dst + y->count;
        nw++;
    }
    if (nw > 0) {
        qsort(sim->wr, nw, sizeof *sim->wr, cmp_iv);
        size_t u = 0;
        for (size_t i = 0; i < nw; i++) {
            if (u && sim->wr[i].lo <= sim->wr[u - 1].hi) {
                if (sim->wr[i].hi > sim->wr[u - 1].hi) sim->wr[u - 1].hi = sim->wr[i].hi;
            } else sim->wr[u++] = sim->wr[i];
        }
        nw = u;
        for (size_t i = b; i < e; i++) {
            const zccl_step_t *x = &s->steps[i];
            if (x->kind != ZCCL_STEP_SEND) continue;
            sym_t *src = range(sim, R, r, x->buf, x->off, x->count, "send");
            if (!src) return false;
            /* first merged range ending after src */
            size_t lo = 0, hi = nw;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (sim->wr[mid].hi <= src) lo = mid + 1;
                else hi = mid;
            }
            if (lo < nw && sim->wr[lo].lo < src + x->count)
                return fail(sim, "rank %d phase %zu: a send reads memory that a receive of the same phase writes", r,
                            R->phase);
        }
    }
    for (size_t i = b; i < e; i++) { /* local steps run first, in order */
        const zccl_step_t *x = &s->steps[i];
        if (x->kind == ZCCL_STEP_REDUCE) {
            sym_t *dst = range(sim, R, r, x->buf, x->off, x->count, "reduce destination");
            sym_t *p = range(sim, R, r, x->src, x->src_off, x->count, "reduce operand");
            sym_t *q = range(sim, R, r, x->src2, x->src2_off, x->count, "reduce operand 2");
            if (!dst || !p || !q) return false;
            if ((dst != p && overlap(dst, x->count, p, x->count)) || (dst != q && overlap(dst, x->count, q, x->count)))
                return fail(sim, "rank %d: reduce destination partly overlaps an operand", r);
            for (size_t k = 0; k < x->count; k++)
                if (!combine(sim, r, &dst[k], &p[k], &q[k], x->final)) return false;
            continue;
        }
        if (x->kind != ZCCL_STEP_COPY) continue;
        sym_t *dst = range(sim, R, r, x->buf, x->off, x->count, "copy destination");
        sym_t *src = range(sim, R, r, x->src, x->src_off, x->count, "copy source");
        if (!dst || !src) return false;
        if (dst == src) continue;
        if (overlap(dst, x->count, src, x->count)) return fail(sim, "rank %d: overlapping copy", r);
        for (size_t k = 0; k < x->count; k++) {
            if (src[k].tag < 0) return fail(sim, "rank %d: copy reads uninitialised element", r);
            sym_copy(sim->n, &dst[k], &src[k]);
        }
    }
    R->nsends = 0;
    for (size_t i = b; i < e; i++) {
        const zccl_step_t *x = &s->steps[i];
        R->recv_done[i] = (x->kind != ZCCL_STEP_RECV);
        if (x->kind != ZCCL_STEP_SEND) continue;
        if (x->peer < 0 || x->peer >= sim->n || x->peer == r)
            return fail(sim, "rank %d sends to invalid peer %d", r, x->peer);
        sym_t *src = range(sim, R, r, x->buf, x->off, x->count, "send");
        if (!src) return false;
        msg_t *m = calloc(1, sizeof *m);
        if (!m || !(m->data = new_syms(sim->n, x->count))) { free(m); return fail(sim, "out of memory"); }
        for (size_t k = 0; k < x->count; k++) {
            if (src[k].tag < 0) {
                free_syms(m->data);
                free(m);
                return fail(sim, "rank %d phase %zu sends an uninitialised element", r, R->phase);
            }
            sym_copy(sim->n, &m->data[k], &src[k]);
        }
        m->count = x->count;
        m->src_rank = r;
        size_t ch = chan_of(sim, r, x->peer);
        if (ch == SIZE_MAX) return fail(sim, "rank %d: internal checker error (no channel to %d)", r, x->peer);
        if (sim->tail[ch]) sim->tail[ch]->next = m; else sim->head[ch] = m;
        sim->tail[ch] = m;
        wake(sim, x->peer);
        R->my_sends[R->nsends++] = m;
    }
    R->posted = true;
    return true;
}

/* Tries to match the receives of rank r's current phase; returns whether anything happened. */
static bool try_recvs(sim_t *sim, int r, const zccl_sched_args_t *args) {
    rank_t *R = &sim->ranks[r];
    const zccl_schedule_t *s = &R->sched;
    size_t b = R->phase ? s->phase_end[R->phase - 1] : 0, e = s->phase_end[R->phase];
    bool moved = false;
    /* In order per channel: an earlier receive from the same peer in this phase must be done first. A peer whose
     * receive was left waiting in this pass is stamped, which blocks its later receives. */
    const uint64_t pass = ++R->pass;
    for (size_t i = b; i < e; i++) {
        const zccl_step_t *x = &s->steps[i];
        if (R->recv_done[i]) continue;
        if (x->peer < 0 || x->peer >= sim->n || x->peer == r)
            return fail(sim, "rank %d receives from invalid peer %d", r, x->peer);
        if (R->stamp[x->peer] == pass) continue;
        size_t ch = chan_of(sim, x->peer, r);
        msg_t *m = ch == SIZE_MAX ? NULL : sim->head[ch];
        if (!m) { R->stamp[x->peer] = pass; continue; }
        if (m->count != x->count)
            return fail(sim, "rank %d expects %zu elements from rank %d, which sent %zu", r, x->count, x->peer,
                        m->count);
        sym_t *dst = range(sim, R, r, x->buf, x->off, x->count, "receive");
        if (!dst) return false;
        if (x->src != ZCCL_BUF_NONE) {
            sym_t *op2 = range(sim, R, r, x->src, x->src_off, x->count, "reduce operand");
            if (!op2) return false;
            for (size_t k = 0; k < x->count; k++)
                if (!combine(sim, r, &dst[k], &op2[k], &m->data[k], x->final)) return false;
        } else {
            if (x->final) return fail(sim, "rank %d: a plain receive is marked final", r);
            for (size_t k = 0; k < x->count; k++) sym_copy(sim->n, &dst[k], &m->data[k]);
        }
        (void)args;
        m->consumed = true;
        wake(sim, m->src_rank);
        sim->head[ch] = m->next; /* FIFO: the consumed message is always the channel's head */
        if (!sim->head[ch]) sim->tail[ch] = NULL;
        m->next = NULL; /* freed by the sender when its phase ends */
        R->recv_done[i] = true;
        moved = true;
    }
    return moved;
}

static bool phase_complete(sim_t *sim, int r) {
    rank_t *R = &sim->ranks[r];
    size_t b = R->phase ? R->sched.phase_end[R->phase - 1] : 0, e = R->sched.phase_end[R->phase];
    for (size_t i = b; i < e; i++)
        if (!R->recv_done[i]) return false;
    for (size_t i = 0; i < R->nsends; i++)
        if (!R->my_sends[i]->consumed) return false;
    return true;
}

static bool expect(sim_t *sim, int r, const sym_t *e, int64_t tag, int only, bool reduced, size_t idx) {
    if (e->tag != tag) return fail(sim, "rank %d output[%zu]: holds element %lld, expected %lld", r, idx, (long long)e->tag, (long long)tag);
    const uint32_t want_cnt = only < 0 ? (uint32_t)sim->n : 1;
    const uint64_t want_hash = only < 0 ? sim->key_sum : sim->key[only];
    if (CNT(e) != want_cnt)
        return fail(sim, "rank %d output[%zu]: holds %u contributions, expected %u", r, idx, CNT(e), want_cnt);
    if (e->hash != want_hash) {
        if (only >= 0) {
            for (int q = 0; q < sim->n; q++)
                if (e->hash == sim->key[q])
                    return fail(sim, "rank %d output[%zu]: holds rank %d's element, expected rank %d's", r, idx, q, only);
        }
        return fail(sim, "rank %d output[%zu]: the %u contributions are not each rank's exactly once", r, idx,
                    CNT(e));
    }
    if (reduced && sim->n > 1 && !IS_FINAL(e))
        return fail(sim, "rank %d output[%zu]: the step producing it is not marked final (ZCCL_AVG would not divide)", r, idx);
    return true;
}

static bool verify(sim_t *sim, const zccl_sched_args_t *a) {
    const int n = sim->n;
    const size_t c = a->count;
    for (int r = 0; r < n; r++) {
        rank_t *R = &sim->ranks[r];
        const sym_t *out = R->arena[ZCCL_BUF_RECV];
        switch (a->coll) {
        case ZCCL_COLL_ALLREDUCE:
            for (size_t i = 0; i < c; i++) {
                if (!expect(sim, r, &out[i], (int64_t)i, -1, true, i)) return false;
                if (r > 0 && out[i].expr != sim->ranks[0].arena[ZCCL_BUF_RECV][i].expr)
                    return fail(sim, "rank %d output[%zu]: computed by a different expression than on rank 0 (results "
                                "would not be bitwise identical)", r, i);
            }
            break;
        case ZCCL_COLL_REDUCE_SCATTER: {
            size_t off, len;
            zccl__vblock(a, r, &off, &len);
            for (size_t i = 0; i < len; i++)
                if (!expect(sim, r, &out[i], (int64_t)(off + i), -1, true, i)) return false;
            break;
        }
        case ZCCL_COLL_ALLGATHER:
            for (int q = 0; q < n; q++) {
                size_t off, len;
                zccl__vblock(a, q, &off, &len);
                for (size_t i = 0; i < len; i++)
                    if (!expect(sim, r, &out[off + i], (int64_t)i, q, false, off + i)) return false;
            }
            break;
        case ZCCL_COLL_BROADCAST:
            for (size_t i = 0; i < c; i++) if (!expect(sim, r, &out[i], (int64_t)i, a->root, false, i)) return false;
            break;
        case ZCCL_COLL_REDUCE:
            if (r == a->root)
                for (size_t i = 0; i < c; i++) if (!expect(sim, r, &out[i], (int64_t)i, -1, true, i)) return false;
            break;
        case ZCCL_COLL_ALLTOALL: /* block q of rank r's output: block r of rank q's input */
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < c; i++)
                    if (!expect(sim, r, &out[(size_t)q * c + i], (int64_t)((size_t)r * c + i), q, false,
                                (size_t)q * c + i))
                        return false;
            break;
        case ZCCL_COLL_ALLTOALLV: {
            const size_t *me = R->a2av;
            for (int q = 0; q < n; q++) {
                const size_t *them = sim->ranks[q].a2av;
                if (them[r] != me[2 * n + q])
                    return fail(sim, "rank %d: all-to-allv counts disagree with rank %d", r, q);
                for (size_t i = 0; i < me[2 * n + q]; i++)
                    if (!expect(sim, r, &out[me[3 * n + q] + i], (int64_t)(them[n + r] + i), q, false, me[3 * n + q] + i))
                        return false;
            }
            break;
        }
        case ZCCL_COLL_GATHER:
            if (r == a->root)
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < c; i++)
                        if (!expect(sim, r, &out[(size_t)q * c + i], (int64_t)i, q, false, (size_t)q * c + i))
                            return false;
            break;
        case ZCCL_COLL_SCATTER:
            for (size_t i = 0; i < c; i++)
                if (!expect(sim, r, &out[i], (int64_t)((size_t)r * c + i), a->root, false, i)) return false;
            break;
        default: return fail(sim, "checker does not know collective %d", (int)a->coll);
        }
        if (!a->in_place) { /* out of place: the send buffer must be untouched */
            const sym_t *in = R->arena[ZCCL_BUF_SEND];
            for (size_t i = 0; i < R->size[ZCCL_BUF_SEND]; i++)
                if (!expect(sim, r, &in[i], (int64_t)i, r, false, i)) return fail(sim, "rank %d: send buffer modified", r) && false;
        }
    }
    return true;
}

bool zccl__sched_check(const zccl_sched_args_t *args, char *err, size_t errlen) {
    return zccl__sched_check_with(args, NULL, err, errlen);
}

bool zccl__sched_check_with(const zccl_sched_args_t *args, zccl_sched_mutator_t mutate, char *err, size_t errlen) {
    sim_t sim = {0};
    sim.n = args->nranks;
    sim.err = err;
    sim.errlen = errlen;
    if (errlen) err[0] = 0;
    const int n = sim.n;
    sim.ranks = calloc((size_t)n, sizeof *sim.ranks);
    sim.key = malloc((size_t)n * sizeof *sim.key);
    if (!sim.ranks || !sim.key) { fail(&sim, "out of memory"); goto out; }
    uint64_t seed = 0x5eed0000u + (uint64_t)n;
    for (int r = 0; r < n; r++) sim.key_sum += (sim.key[r] = splitmix64(&seed));
    size_t maxsteps = 1;
    for (int r = 0; r < n; r++) {
        if (!setup_rank(&sim, args, r, mutate)) goto out;
        if (sim.ranks[r].sched.nsteps > maxsteps) maxsteps = sim.ranks[r].sched.nsteps;
    }
    sim.wr = malloc(maxsteps * sizeof *sim.wr);
    if (!sim.wr) { fail(&sim, "out of memory"); goto out; }
    if (!build_channels(&sim)) goto out;
    /* Event-driven: a rank is looked at again only when a message arrives for it or one it sent is consumed, so
     * the work is proportional to the steps, not to (rounds x ranks). */
    sim.queue = malloc((size_t)n * sizeof *sim.queue);
    sim.queued = calloc((size_t)n, sizeof *sim.queued);
    if (!sim.queue || !sim.queued) { fail(&sim, "out of memory"); goto out; }
    for (int r = 0; r < n; r++) wake(&sim, r);
    while (sim.qlen > 0 && !sim.failed) {
        const int r = sim.queue[sim.qhead];
        sim.qhead = (sim.qhead + 1) % (size_t)n;
        sim.qlen--;
        sim.queued[r] = false;
        rank_t *R = &sim.ranks[r];
        while (R->phase < R->sched.nphases && !sim.failed) {
            if (!R->posted && !post_phase(&sim, r)) break;
            try_recvs(&sim, r, args);
            if (!phase_complete(&sim, r)) break;
            /* the phase's messages were all consumed: free them */
            for (size_t i = 0; i < R->nsends; i++) { free_syms(R->my_sends[i]->data); free(R->my_sends[i]); }
            R->nsends = 0;
            R->phase++;
            R->posted = false;
        }
    }
    if (!sim.failed) {
        char buf[256];
        size_t w = 0;
        bool stuck = false;
        for (int r = 0; r < n && w < sizeof buf - 32; r++)
            if (sim.ranks[r].phase < sim.ranks[r].sched.nphases) {
                stuck = true;
                w += (size_t)snprintf(buf + w, sizeof buf - w, " rank %d@phase %zu", r, sim.ranks[r].phase);
            }
        if (stuck) fail(&sim, "deadlock: no rank can progress;%s", buf);
    }
    if (!sim.failed) {
        for (size_t ch = 0; ch < sim.nchan; ch++)
            if (sim.head[ch]) { fail(&sim, "rank %d sent a message nobody received", sim.head[ch]->src_rank); break; }
    }
    if (!sim.failed) verify(&sim, args);
out:
    /* Consumed messages of unfinished phases first (they are in no channel any more), then the unconsumed ones,
     * which are still queued in their channels: the other order reads freed messages' `consumed` flags. */
    for (int r = 0; sim.ranks && r < n; r++)
        for (size_t i = 0; i < sim.ranks[r].nsends; i++)
            if (sim.ranks[r].my_sends[i]->consumed) { free_syms(sim.ranks[r].my_sends[i]->data); free(sim.ranks[r].my_sends[i]); }
    for (size_t ch = 0; sim.head && ch < sim.nchan; ch++)
        for (msg_t *m = sim.head[ch], *nx; m; m = nx) { nx = m->next; free_syms(m->data); free(m); }
    for (int r = 0; sim.ranks && r < n; r++) {
        rank_t *R = &sim.ranks[r];
        free_syms(R->alloc[0]);
        free_syms(R->alloc[1]);
        free_syms(R->arena[ZCCL_BUF_TMP]);
        free(R->recv_done);
        free(R->my_sends);
        free(R->stamp);
        free(R->a2av);
        zccl__sched_free(&R->sched);
    }
    free(sim.ranks);
    free(sim.head);
    free(sim.tail);
    free(sim.key);
    free(sim.queue);
    free(sim.queued);
    free(sim.chan_base);
    free(sim.chan_peer);
    free(sim.wr);
    return !sim.failed;
}

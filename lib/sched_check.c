/*
 * sched_check.c — runs every rank's schedule together, symbolically, to prove an algorithm correct for a given
 * rank count without starting processes.
 *
 * Each element is modelled as (index tag, contribution count per rank, "finalised" flag). A rank's send buffer
 * starts with tag i and its own contribution for element i; receive and scratch buffers start uninitialised.
 * Sends are posted when a phase starts and stay in the channel's FIFO until the receiver consumes them; a phase
 * ends only when its receives are matched and its sends consumed, which models the rendezvous (single-copy)
 * transport, the strictest one. A round in which no rank can move is a deadlock.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "schedule.h"

typedef struct {
    int64_t tag; /* -1: uninitialised */
    bool final;
    uint8_t *cnt; /* n counters */
} sym_t;

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
    zccl_schedule_t sched;
} rank_t;

typedef struct {
    int n;
    rank_t *ranks;
    msg_t **head, **tail; /* per channel src*n+dst: messages not yet consumed */
    msg_t *done;          /* consumed messages, freed at the end (senders still look at their flag) */
    char *err;
    size_t errlen;
    bool failed;
} sim_t;

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
    sym_t *s = calloc(count ? count : 1, sizeof *s);
    uint8_t *c = calloc((count ? count : 1) * (size_t)n, 1);
    if (!s || !c) { free(s); free(c); return NULL; }
    s[0].cnt = c; /* keeps the counters' allocation reachable even for count 0 */
    s[0].tag = -1;
    for (size_t i = 0; i < count; i++) s[i].tag = -1, s[i].cnt = c + i * (size_t)n;
    return s;
}
static void free_syms(sym_t *s) { if (s) { free(s[0].cnt); free(s); } }

static void sym_copy(int n, sym_t *d, const sym_t *s) {
    d->tag = s->tag;
    d->final = s->final;
    memcpy(d->cnt, s->cnt, (size_t)n);
}

static size_t send_size(const zccl_sched_args_t *a, int r) {
    switch (a->coll) {
    case ZCCL_COLL_REDUCE_SCATTER: return zccl__vtotal(a);
    case ZCCL_COLL_BROADCAST: return r == a->root ? a->count : 0;
    default: return a->count;
    }
}
static size_t recv_size(const zccl_sched_args_t *a, int r) {
    switch (a->coll) {
    case ZCCL_COLL_ALLGATHER: return zccl__vtotal(a);
    case ZCCL_COLL_REDUCE: return r == a->root ? a->count : 0;
    default: return a->count;
    }
}

static bool setup_rank(sim_t *sim, const zccl_sched_args_t *args, int r, zccl_sched_mutator_t mutate) {
    rank_t *R = &sim->ranks[r];
    const int n = sim->n;
    zccl_sched_args_t a = *args;
    a.rank = r;
    if (a.counts) a.count = a.counts[r]; /* uneven blocks: each rank's own count */
    if (zccl__sched_build(&a, &R->sched) != ZCCL_SUCCESS) return fail(sim, "rank %d: schedule build failed", r);
    if (mutate) mutate(r, &R->sched);
    size_t ss = send_size(&a, r), rs = recv_size(&a, r);
    bool inp = args->in_place && !(args->coll == ZCCL_COLL_BROADCAST && r != args->root) &&
               !(args->coll == ZCCL_COLL_REDUCE && r != args->root);
    if (inp) {
        /* One allocation; the smaller buffer lives inside the larger one where NCCL's in-place rule puts it. */
        size_t big = ss > rs ? ss : rs;
        R->alloc[0] = new_syms(n, big);
        if (!R->alloc[0]) return fail(sim, "out of memory");
        if (args->coll == ZCCL_COLL_REDUCE_SCATTER) {
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
    for (size_t i = 0; i < ss; i++) {
        sym_t *e = &R->arena[ZCCL_BUF_SEND][i];
        e->tag = (int64_t)i;
        memset(e->cnt, 0, (size_t)n);
        e->cnt[r] = 1;
    }
    R->recv_done = calloc(R->sched.nsteps + 1, sizeof(bool));
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
    if (p->final || q->final) return fail(sim, "rank %d reduces a value that was already finalised (divided twice)", r);
    for (int k = 0; k < sim->n; k++) dst->cnt[k] = (uint8_t)(p->cnt[k] + q->cnt[k]); /* dst may be p or q */
    dst->tag = p->tag;
    dst->final = final;
    return true;
}

/* Starts the current phase of rank r: local copies, then posting its sends. */
static bool post_phase(sim_t *sim, int r) {
    rank_t *R = &sim->ranks[r];
    const zccl_schedule_t *s = &R->sched;
    size_t b = R->phase ? s->phase_end[R->phase - 1] : 0, e = s->phase_end[R->phase];
    /* A send's source may not be written by a receive or copy of the same phase (the transport reads it while the
     * phase runs). */
    for (size_t i = b; i < e; i++) {
        const zccl_step_t *x = &s->steps[i];
        if (x->kind != ZCCL_STEP_SEND) continue;
        sym_t *src = range(sim, R, r, x->buf, x->off, x->count, "send");
        if (!src) return false;
        for (size_t j = b; j < e; j++) {
            const zccl_step_t *y = &s->steps[j];
            if (y->kind == ZCCL_STEP_SEND) continue;
            sym_t *dst = range(sim, R, r, y->buf, y->off, y->count, "write");
            if (!dst) return false;
            if (overlap(src, x->count, dst, y->count))
                return fail(sim, "rank %d phase %zu: a send reads memory that a step of the same phase writes", r,
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
        msg_t *m = calloc(1, sizeof *m);
        if (!m || !(m->data = new_syms(sim->n, x->count))) { free(m); return fail(sim, "out of memory"); }
        for (size_t k = 0; k < x->count; k++) {
            if (src[k].tag < 0) return fail(sim, "rank %d phase %zu sends an uninitialised element", r, R->phase);
            sym_copy(sim->n, &m->data[k], &src[k]);
        }
        m->count = x->count;
        m->src_rank = r;
        size_t ch = (size_t)r * (size_t)sim->n + (size_t)x->peer;
        if (sim->tail[ch]) sim->tail[ch]->next = m; else sim->head[ch] = m;
        sim->tail[ch] = m;
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
    for (size_t i = b; i < e; i++) {
        const zccl_step_t *x = &s->steps[i];
        if (R->recv_done[i]) continue;
        /* In order per channel: an earlier receive from the same peer in this phase must be done first. */
        bool blocked = false;
        for (size_t j = b; j < i; j++)
            if (!R->recv_done[j] && s->steps[j].peer == x->peer) blocked = true;
        if (blocked) continue;
        if (x->peer < 0 || x->peer >= sim->n || x->peer == r)
            return fail(sim, "rank %d receives from invalid peer %d", r, x->peer);
        size_t ch = (size_t)x->peer * (size_t)sim->n + (size_t)r;
        msg_t *m = sim->head[ch];
        if (!m) continue;
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
        sim->head[ch] = m->next; /* FIFO: the consumed message is always the channel's head */
        if (!sim->head[ch]) sim->tail[ch] = NULL;
        m->next = sim->done;
        sim->done = m;
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
    for (int q = 0; q < sim->n; q++) {
        int want = (only < 0 || only == q) ? 1 : 0;
        if (e->cnt[q] != want)
            return fail(sim, "rank %d output[%zu]: rank %d's contribution counted %d times, expected %d", r, idx, q,
                        e->cnt[q], want);
    }
    if (reduced && sim->n > 1 && !e->final)
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
            for (size_t i = 0; i < c; i++) if (!expect(sim, r, &out[i], (int64_t)i, -1, true, i)) return false;
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
    sim.head = calloc((size_t)n * (size_t)n, sizeof *sim.head);
    sim.tail = calloc((size_t)n * (size_t)n, sizeof *sim.tail);
    if (!sim.ranks || !sim.head || !sim.tail) { fail(&sim, "out of memory"); goto out; }
    for (int r = 0; r < n; r++)
        if (!setup_rank(&sim, args, r, mutate)) goto out;
    for (;;) {
        bool moved = false, all_done = true;
        for (int r = 0; r < n && !sim.failed; r++) {
            rank_t *R = &sim.ranks[r];
            while (R->phase < R->sched.nphases && !sim.failed) {
                if (!R->posted) { if (!post_phase(&sim, r)) break; moved = true; }
                if (try_recvs(&sim, r, args)) moved = true;
                if (!phase_complete(&sim, r)) break;
                R->phase++;
                R->posted = false;
                moved = true;
            }
            if (R->phase < R->sched.nphases) all_done = false;
        }
        if (sim.failed || all_done) break;
        if (!moved) {
            char buf[256];
            size_t w = 0;
            for (int r = 0; r < n && w < sizeof buf - 32; r++)
                if (sim.ranks[r].phase < sim.ranks[r].sched.nphases)
                    w += (size_t)snprintf(buf + w, sizeof buf - w, " rank %d@phase %zu", r, sim.ranks[r].phase);
            fail(&sim, "deadlock: no rank can progress;%s", buf);
            break;
        }
    }
    if (!sim.failed) {
        for (size_t ch = 0; ch < (size_t)n * (size_t)n; ch++)
            if (sim.head[ch]) { fail(&sim, "rank %d sent a message nobody received", sim.head[ch]->src_rank); break; }
    }
    if (!sim.failed) verify(&sim, args);
out:
    for (size_t ch = 0; sim.head && ch < (size_t)n * (size_t)n; ch++)
        for (msg_t *m = sim.head[ch], *nx; m; m = nx) { nx = m->next; free_syms(m->data); free(m); }
    for (msg_t *m = sim.done, *nx; m; m = nx) { nx = m->next; free_syms(m->data); free(m); }
    for (int r = 0; sim.ranks && r < n; r++) {
        rank_t *R = &sim.ranks[r];
        free_syms(R->alloc[0]);
        free_syms(R->alloc[1]);
        free_syms(R->arena[ZCCL_BUF_TMP]);
        free(R->recv_done);
        free(R->my_sends);
        zccl__sched_free(&R->sched);
    }
    free(sim.ranks);
    free(sim.head);
    free(sim.tail);
    return !sim.failed;
}

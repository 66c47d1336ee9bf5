/*
 * sched_cost.c — alpha-beta-gamma time of a schedule, by simulating every rank's schedule together, and the
 * closed-form times of the algorithms (Hockney's model as used by Thakur, Rabenseifner & Gropp, "Optimization of
 * collective communication operations in MPICH", IJHPCA 2005, and Patarasuk & Yuan, JPDC 2009).
 *
 * Simulation (see zccl__sched_cost in schedule.h): the k-th send from rank a to rank b is matched with the k-th
 * receive of b from a, as the engine's channels do. A rank's phase starts when its previous phase ended plus
 * gamma times the bytes its local REDUCE steps combine; a message starts when both its sender's and its
 * receiver's phases have started and lasts alpha + beta*bytes (+ gamma*bytes when the receive reduces); a phase
 * ends when all its messages have, and no sooner than alpha + beta*max(bytes sent, bytes received) after it
 * started (one port each way per link class). The processing order is the checker's: a rank advances while the
 * phases of all its partners have started; if no rank can advance the schedule deadlocks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "algo.h"

typedef struct {
    int src, dst;
    uint32_t seq;
    int rank;     /* the rank owning the step */
    size_t step;  /* its index */
} xref_t;

static int cmp_xref(const void *a, const void *b) {
    const xref_t *x = a, *y = b;
    if (x->src != y->src) return (x->src > y->src) - (x->src < y->src);
    if (x->dst != y->dst) return (x->dst > y->dst) - (x->dst < y->dst);
    return (x->seq > y->seq) - (x->seq < y->seq);
}

typedef struct {
    zccl_schedule_t s;
    uint32_t *step_phase;   /* phase of each step */
    int *peer_rank;         /* per step: for transfers, the partner rank */
    uint32_t *peer_phase;   /* per step: the partner step's phase */
    uint8_t *reduces;       /* per step: the receive of this transfer reduces on arrival */
    double *start;          /* per phase: start time, valid for phases <= cur */
    size_t cur;             /* current phase */
    double end;             /* end of the last finished phase */
} crank_t;

double zccl__sched_cost(const zccl_sched_args_t *args, const zccl_cost_params_t *p, char *err, size_t errlen) {
    const int n = args->nranks;
    const double es = (double)(args->elem_size ? args->elem_size : 1);
    double result = -1;
    if (errlen) err[0] = 0;
    crank_t *R = calloc((size_t)n, sizeof *R);
    xref_t *sends = NULL, *recvs = NULL;
    uint32_t *cnt = calloc((size_t)n, sizeof *cnt);
    int *touched = calloc((size_t)n, sizeof *touched);
    if (!R || !cnt || !touched) { snprintf(err, errlen, "out of memory"); goto out; }
    size_t ns = 0, nr = 0;
    for (int r = 0; r < n; r++) {
        zccl_sched_args_t a = *args;
        a.rank = r;
        if (zccl__sched_build(&a, &R[r].s) != ZCCL_SUCCESS) {
            snprintf(err, errlen, "rank %d: schedule build failed", r);
            goto out;
        }
        const zccl_schedule_t *s = &R[r].s;
        R[r].step_phase = malloc((s->nsteps + 1) * sizeof(uint32_t));
        R[r].peer_rank = malloc((s->nsteps + 1) * sizeof(int));
        R[r].peer_phase = malloc((s->nsteps + 1) * sizeof(uint32_t));
        R[r].start = calloc(s->nphases + 1, sizeof(double));
        R[r].reduces = calloc(s->nsteps + 1, 1);
        if (!R[r].step_phase || !R[r].peer_rank || !R[r].peer_phase || !R[r].start || !R[r].reduces) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
        size_t i = 0;
        for (size_t ph = 0; ph < s->nphases; ph++)
            for (; i < s->phase_end[ph]; i++) R[r].step_phase[i] = (uint32_t)ph;
        for (i = 0; i < s->nsteps; i++) {
            if (s->steps[i].kind == ZCCL_STEP_SEND) ns++;
            else if (s->steps[i].kind == ZCCL_STEP_RECV) nr++;
        }
    }
    if (ns != nr) { snprintf(err, errlen, "%zu sends but %zu receives", ns, nr); goto out; }
    sends = malloc((ns + 1) * sizeof *sends);
    recvs = malloc((nr + 1) * sizeof *recvs);
    if (!sends || !recvs) { snprintf(err, errlen, "out of memory"); goto out; }
    ns = nr = 0;
    for (int kind = ZCCL_STEP_SEND; kind <= ZCCL_STEP_RECV; kind++)
        for (int r = 0; r < n; r++) {
            const zccl_schedule_t *s = &R[r].s;
            int nt = 0;
            for (size_t i = 0; i < s->nsteps; i++) {
                const zccl_step_t *x = &s->steps[i];
                if (x->kind != kind) continue;
                if (x->peer < 0 || x->peer >= n || x->peer == r) {
                    snprintf(err, errlen, "rank %d: step %zu names invalid peer %d", r, i, x->peer);
                    goto out;
                }
                if (cnt[x->peer] == 0) touched[nt++] = x->peer;
                const uint32_t seq = cnt[x->peer]++;
                if (kind == ZCCL_STEP_SEND) sends[ns++] = (xref_t){r, x->peer, seq, r, i};
                else recvs[nr++] = (xref_t){x->peer, r, seq, r, i};
            }
            for (int t = 0; t < nt; t++) cnt[touched[t]] = 0;
        }
    qsort(sends, ns, sizeof *sends, cmp_xref);
    qsort(recvs, nr, sizeof *recvs, cmp_xref);
    for (size_t i = 0; i < ns; i++) {
        const xref_t *x = &sends[i], *y = &recvs[i];
        if (x->src != y->src || x->dst != y->dst || x->seq != y->seq) {
            snprintf(err, errlen, "unmatched transfer between ranks %d and %d", x->src, x->dst);
            goto out;
        }
        if (R[x->rank].s.steps[x->step].count != R[y->rank].s.steps[y->step].count) {
            snprintf(err, errlen, "rank %d sends %zu elements, rank %d receives %zu", x->src,
                     R[x->rank].s.steps[x->step].count, y->dst, R[y->rank].s.steps[y->step].count);
            goto out;
        }
        R[x->rank].peer_rank[x->step] = y->rank;
        R[x->rank].peer_phase[x->step] = R[y->rank].step_phase[y->step];
        R[y->rank].peer_rank[y->step] = x->rank;
        R[y->rank].peer_phase[y->step] = R[x->rank].step_phase[x->step];
        R[x->rank].reduces[x->step] = R[y->rank].reduces[y->step] = R[y->rank].s.steps[y->step].src != ZCCL_BUF_NONE;
    }
    /* local cost of phase ph of rank r: gamma times the bytes its REDUCE steps combine */
#define LOCAL(r, ph, out)                                                                                     \
    do {                                                                                                      \
        const zccl_schedule_t *s_ = &R[r].s;                                                                  \
        size_t b_ = (ph) ? s_->phase_end[(ph) - 1] : 0, e_ = s_->phase_end[ph];                              \
        double t_ = 0;                                                                                        \
        for (size_t i_ = b_; i_ < e_; i_++)                                                                   \
            if (s_->steps[i_].kind == ZCCL_STEP_REDUCE) t_ += p->gamma * es * (double)s_->steps[i_].count;    \
        (out) = t_;                                                                                           \
    } while (0)
    for (int r = 0; r < n; r++)
        if (R[r].s.nphases) LOCAL(r, 0, R[r].start[0]);
    const bool hosts = args->host_of != NULL;
    for (;;) {
        bool moved = false, all_done = true;
        for (int r = 0; r < n; r++) {
            crank_t *me = &R[r];
            while (me->cur < me->s.nphases) {
                const size_t ph = me->cur;
                const size_t b = ph ? me->s.phase_end[ph - 1] : 0, e = me->s.phase_end[ph];
                bool ready = true;
                for (size_t i = b; i < e && ready; i++) {
                    const zccl_step_t *x = &me->s.steps[i];
                    if (x->kind != ZCCL_STEP_SEND && x->kind != ZCCL_STEP_RECV) continue;
                    ready = R[me->peer_rank[i]].cur >= me->peer_phase[i];
                }
                if (!ready) break;
                const double t0 = me->start[ph];
                double end = t0, sent[2] = {0, 0}, rcvd[2] = {0, 0}, red = 0;
                bool any[2] = {false, false};
                for (size_t i = b; i < e; i++) {
                    const zccl_step_t *x = &me->s.steps[i];
                    if (x->kind != ZCCL_STEP_SEND && x->kind != ZCCL_STEP_RECV) continue;
                    const int q = me->peer_rank[i];
                    const int cls = (hosts && args->host_of[q] != args->host_of[r]) ? 1 : 0;
                    const double al = cls ? p->alpha_inter : p->alpha, be = cls ? p->beta_inter : p->beta;
                    const double bytes = es * (double)x->count;
                    const double g = me->reduces[i] ? p->gamma * bytes : 0;
                    const double ps = R[q].start[me->peer_phase[i]];
                    const double te = (t0 > ps ? t0 : ps) + al + be * bytes + g;
                    if (te > end) end = te;
                    any[cls] = true;
                    if (x->kind == ZCCL_STEP_SEND) sent[cls] += bytes;
                    else {
                        rcvd[cls] += bytes;
                        if (x->src != ZCCL_BUF_NONE) red += bytes;
                    }
                }
                for (int cls = 0; cls < 2; cls++) {
                    if (!any[cls]) continue;
                    const double al = cls ? p->alpha_inter : p->alpha, be = cls ? p->beta_inter : p->beta;
                    const double vol = sent[cls] > rcvd[cls] ? sent[cls] : rcvd[cls];
                    const double te = t0 + al + be * vol + p->gamma * red;
                    if (te > end) end = te;
                }
                me->end = end;
                me->cur++;
                if (me->cur < me->s.nphases) {
                    double loc;
                    LOCAL(r, me->cur, loc);
                    me->start[me->cur] = end + loc;
                }
                moved = true;
            }
            if (me->cur < me->s.nphases) all_done = false;
        }
        if (all_done) break;
        if (!moved) { snprintf(err, errlen, "deadlock: no rank can advance"); goto out; }
    }
#undef LOCAL
    result = 0;
    for (int r = 0; r < n; r++)
        if (R[r].end > result) result = R[r].end;
out:
    for (int r = 0; R && r < n; r++) {
        zccl__sched_free(&R[r].s);
        free(R[r].step_phase);
        free(R[r].peer_rank);
        free(R[r].peer_phase);
        free(R[r].start);
        free(R[r].reduces);
    }
    free(R);
    free(sends);
    free(recvs);
    free(cnt);
    free(touched);
    return result;
}

double zccl__sched_cost_formula(const zccl_sched_args_t *a, const zccl_cost_params_t *p) {
    if (a->nranks == 1) return 0; /* a local copy, not modelled */
    const zccl_algo_t *row = zccl__algo(a->algo);
    return row && row->formula ? row->formula(a, p) : -1;
}

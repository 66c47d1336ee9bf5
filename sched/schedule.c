/* schedule.c — schedule containers, dispatch to the algorithm builders, and printing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "algo.h"

static const char *coll_names[ZCCL_COLL_COUNT] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                                  "reduce", "send", "recv", "all-to-all", "all-to-allv",
                                                  "gather", "scatter"};

const char *zccl__algo_name(int algo) {
    const zccl_algo_t *row = zccl__algo(algo);
    return row ? row->name : "?";
}

int zccl__algo_from_name(const char *name) {
    for (int i = 0; name && i < zccl__nalgos; i++)
        if (strcmp(name, zccl__algo_table[i]->name) == 0) return i;
    return -1;
}

/* Collectives whose schedule does not depend on the algorithm: broadcast and reduce use the first row's chain,
 * send and recv are single steps, all-to-all(v), gather and scatter use the direct row's builders
 * (sched_alltoall.c) whatever algorithm is asked for. */
static bool algo_free(zccl_coll_t coll) {
    return coll == ZCCL_COLL_BROADCAST || coll == ZCCL_COLL_REDUCE || coll == ZCCL_COLL_SEND ||
           coll == ZCCL_COLL_RECV || coll == ZCCL_COLL_ALLTOALL || coll == ZCCL_COLL_ALLTOALLV ||
           coll == ZCCL_COLL_GATHER || coll == ZCCL_COLL_SCATTER;
}

/* The first row that builds coll (an algorithm-free collective asked of a row without a builder for it). */
static const zccl_algo_t *row_with(zccl_coll_t coll) {
    for (int i = 0; i < zccl__nalgos; i++)
        if (zccl__algo_table[i]->build[coll]) return zccl__algo_table[i];
    return NULL;
}

bool zccl__algo_supports(int algo, zccl_coll_t coll) {
    const zccl_algo_t *row = zccl__algo(algo);
    if (!row || (unsigned)coll >= ZCCL_COLL_COUNT) return false;
    return row->build[coll] != NULL || algo_free(coll);
}

void zccl__sched_step(zccl_schedule_t *s, zccl_step_t st) {
    if (st.count == 0 || s->oom) return;
    if (s->nsteps == s->steps_cap) {
        size_t cap = s->steps_cap ? 2 * s->steps_cap : 16;
        zccl_step_t *p = realloc(s->steps, cap * sizeof *p);
        if (!p) { s->oom = true; return; }
        s->steps = p;
        s->steps_cap = cap;
    }
    s->steps[s->nsteps++] = st;
}

void zccl__sched_end_phase(zccl_schedule_t *s) {
    size_t start = s->nphases ? s->phase_end[s->nphases - 1] : 0;
    if (s->nsteps == start || s->oom) return;
    if (s->nphases == s->phases_cap) {
        size_t cap = s->phases_cap ? 2 * s->phases_cap : 8;
        uint32_t *p = realloc(s->phase_end, cap * sizeof *p);
        if (!p) { s->oom = true; return; }
        s->phase_end = p;
        s->phases_cap = cap;
    }
    s->phase_end[s->nphases++] = (uint32_t)s->nsteps;
}

void zccl__sched_one_rank(const zccl_sched_args_t *a, zccl_schedule_t *s, size_t src_off) {
    if (!a->in_place)
        zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_COPY, .buf = ZCCL_BUF_RECV, .src = ZCCL_BUF_SEND,
                                          .src_off = src_off, .peer = -1, .count = a->count});
    zccl__sched_end_phase(s);
}

void zccl__sched_free(zccl_schedule_t *s) {
    free(s->steps);
    free(s->phase_end);
    *s = (zccl_schedule_t){0};
}

static int forced_algo = -1;
static const int *forced_hosts;

void zccl__sched_force_algo(int algo, const int *host_of) {
    forced_algo = algo;
    forced_hosts = host_of;
}

zccl_result_t zccl__sched_build(const zccl_sched_args_t *args, zccl_schedule_t *s) {
    *s = (zccl_schedule_t){0};
    zccl_sched_args_t forced;
    const zccl_sched_args_t *a = args;
    if (forced_algo >= 0 && zccl__algo_supports(forced_algo, args->coll) &&
        (args->coll == ZCCL_COLL_ALLREDUCE || args->coll == ZCCL_COLL_REDUCE_SCATTER ||
         args->coll == ZCCL_COLL_ALLGATHER)) {
        forced = *args;
        forced.algo = forced_algo;
        if (forced_hosts) forced.host_of = forced_hosts;
        a = &forced;
    }
    const int algo = a->algo;
    if ((unsigned)a->coll >= ZCCL_COLL_COUNT)
        return zccl__error(ZCCL_INTERNAL_ERROR, "schedule requested for unknown collective %d", (int)a->coll);
    if (!zccl__algo_supports(algo, a->coll))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "algorithm %d (%s) does not implement %s", algo,
                           zccl__algo_name(algo), coll_names[a->coll]);
    const zccl_algo_t *row = zccl__algo(algo);
    if (a->coll == ZCCL_COLL_SEND || a->coll == ZCCL_COLL_RECV) {
        const bool send = a->coll == ZCCL_COLL_SEND;
        zccl__sched_step(s, (zccl_step_t){.kind = send ? ZCCL_STEP_SEND : ZCCL_STEP_RECV,
                                          .buf = send ? ZCCL_BUF_SEND : ZCCL_BUF_RECV, .src = ZCCL_BUF_NONE,
                                          .peer = a->root, .count = a->count});
        zccl__sched_end_phase(s);
    } else {
        if (!row->build[a->coll]) row = row_with(a->coll); /* broadcast, reduce: the chain; all-to-all...: direct */
        if (!row) return zccl__error(ZCCL_INTERNAL_ERROR, "no algorithm builds %s", coll_names[a->coll]);
        char why[160];
        if (row->layout_ok && !row->layout_ok(a, why, sizeof why))
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s %s: %s", row->name, coll_names[a->coll], why);
        row->build[a->coll](a, s);
    }
    if (s->oom) {
        zccl__sched_free(s);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory building a schedule");
    }
    return ZCCL_SUCCESS;
}

/* Whether a and b build the same schedule: every field a builder reads (schedule.h, zccl_sched_args_t). */
static bool same_args(const zccl_sched_args_t *a, const zccl_sched_args_t *b) {
    return a->coll == b->coll && a->nranks == b->nranks && a->rank == b->rank && a->root == b->root &&
           a->count == b->count && a->in_place == b->in_place && a->elem_size == b->elem_size &&
           a->chunk_bytes == b->chunk_bytes && a->rs_round_bytes == b->rs_round_bytes && a->algo == b->algo &&
           a->ring == b->ring && a->host_of == b->host_of;
}

zccl_result_t zccl__sched_get(zccl_sched_cache_t *c, const zccl_sched_args_t *args, const zccl_schedule_t **out) {
    const bool cacheable = !args->counts && !args->displs && !args->a2av && !args->a2av_matrix;
    int victim = 0;
    if (cacheable) {
        for (int i = 0; i < ZCCL_SCHED_CACHE_SIZE; i++) {
            if (c->e[i].valid && c->e[i].forced_algo == forced_algo && c->e[i].forced_hosts == forced_hosts &&
                same_args(&c->e[i].key, args)) {
                c->e[i].used = ++c->clock;
                c->hits++;
                *out = &c->e[i].s;
                return ZCCL_SUCCESS;
            }
            if (!c->e[i].valid || (c->e[victim].valid && c->e[i].used < c->e[victim].used)) victim = i;
        }
    } else {
        victim = ZCCL_SCHED_CACHE_SIZE - 1; /* uncacheable calls rebuild in the last entry, marked invalid */
    }
    c->misses++;
    if (c->e[victim].valid || c->e[victim].s.steps || c->e[victim].s.phase_end) zccl__sched_free(&c->e[victim].s);
    c->e[victim].valid = false;
    ZCCL_CHECK(zccl__sched_build(args, &c->e[victim].s));
    if (cacheable) {
        c->e[victim].key = *args;
        c->e[victim].forced_algo = forced_algo;
        c->e[victim].forced_hosts = forced_hosts;
        c->e[victim].used = ++c->clock;
        c->e[victim].valid = true;
    }
    *out = &c->e[victim].s;
    return ZCCL_SUCCESS;
}

void zccl__sched_cache_free(zccl_sched_cache_t *c) {
    for (int i = 0; i < ZCCL_SCHED_CACHE_SIZE; i++) zccl__sched_free(&c->e[i].s);
    *c = (zccl_sched_cache_t){0};
}

void zccl__sched_print(const zccl_schedule_t *s, int rank, char *buf, size_t len) {
    static const char *bufs[] = {"send", "recv", "tmp", "-"};
    size_t w = 0;
    size_t st = 0;
    for (size_t p = 0; p < s->nphases && w < len; p++) {
        w += (size_t)snprintf(buf + w, len - w, "rank %d phase %zu:", rank, p);
        for (; st < s->phase_end[p] && w < len; st++) {
            const zccl_step_t *x = &s->steps[st];
            if (x->kind == ZCCL_STEP_SEND)
                w += (size_t)snprintf(buf + w, len - w, " send(%d %s[%zu+%zu])", x->peer, bufs[x->buf], x->off, x->count);
            else if (x->kind == ZCCL_STEP_RECV)
                w += (size_t)snprintf(buf + w, len - w, " recv(%d %s[%zu+%zu]%s%s%s)", x->peer, bufs[x->buf], x->off,
                                      x->count, x->src != ZCCL_BUF_NONE ? " op " : "",
                                      x->src != ZCCL_BUF_NONE ? bufs[x->src] : "", x->final ? " final" : "");
            else if (x->kind == ZCCL_STEP_REDUCE)
                w += (size_t)snprintf(buf + w, len - w, " reduce(%s[%zu] <- %s[%zu] op %s[%zu] +%zu%s)", bufs[x->buf],
                                      x->off, bufs[x->src], x->src_off, bufs[x->src2], x->src2_off, x->count,
                                      x->final ? " final" : "");
            else
                w += (size_t)snprintf(buf + w, len - w, " copy(%s[%zu] <- %s[%zu] +%zu)", bufs[x->buf], x->off,
                                      bufs[x->src], x->src_off, x->count);
        }
        if (w < len) w += (size_t)snprintf(buf + w, len - w, "\n");
    }
}

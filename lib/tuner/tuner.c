/*
 * tuner.c — the choice over the registry of algorithms (sched/algo.h holds the rows and their cost models):
 * the rank layout, the usable set per collective, the pick and its log, the public queries (see tuner.h and
 * docs/tuning.md). The ZCCL_ALGO grammar is in algo_spec.c; calibration and the cache file in tuner_calib.c.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "comm.h"
#include "tuner.h"

#define BIT(c) (1u << (c))

/* ---- layout, defaults, usable sets ------------------------------------------------------------------------- */

void zccl__tune_defaults(zccl_tune_params_t *p) {
    /* Round numbers of the order measured on small x86 VMs (docs/tuning.md); calibration replaces them. */
    p->intra = (zccl_link_cost_t){.alpha = 5e-6, .beta = 1.0 / 4e9};
    p->inter = (zccl_link_cost_t){.alpha = 30e-6, .beta = 1.0 / 1e9};
    p->gamma = 1.0 / 8e9;
    p->copy = 1.0 / 8e9;
}

/* Virtual rank v of the power-of-two fold (Thakur et al.: ranks 2v for v < e, v + e above) -> real rank. */
static int fold_real(int v, int e) { return v < e ? 2 * v : v + e; }

/* Most ranks of one host (host[r] in [0, nh)) with a partner on another host, for the pairs (a[i], b[i]), i < k;
 * per[] is scratch of nh ints. */
static int max_share(const int *host, const int *a, const int *b, int k, int nh, int *per) {
    memset(per, 0, (size_t)nh * sizeof *per);
    int most = 0;
    for (int i = 0; i < k; i++)
        if (host[a[i]] != host[b[i]] && ++per[host[a[i]]] > most) most = per[host[a[i]]];
    return most;
}

zccl_result_t zccl__tune_layout(const uint64_t *host_hash, const int *ring, int n, zccl_tune_layout_t *L,
                                int *host_of) {
    memset(L, 0, sizeof *L);
    L->nranks = n;
    L->uniform = true;
    int *host = malloc((size_t)n * sizeof *host), *cnt = calloc((size_t)n, sizeof *cnt);
    int *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    if (!host || !cnt || !a || !b) {
        free(host), free(cnt), free(a), free(b);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the tuner's layout of %d ranks", n);
    }
    for (int r = 0; r < n; r++) { /* host index: order of first appearance */
        host[r] = L->nhosts;
        for (int q = 0; q < r; q++)
            if (host_hash[q] == host_hash[r]) {
                host[r] = host[q];
                break;
            }
        if (host[r] == L->nhosts) L->nhosts++;
        cnt[host[r]]++;
    }
    for (int h = 0; h < L->nhosts; h++) {
        if (cnt[h] > L->per_host) L->per_host = cnt[h];
        if (cnt[h] != cnt[0]) L->uniform = false;
        const double cross = (double)cnt[h] * (n - cnt[h]);
        if (cross > L->direct_cross) L->direct_cross = cross;
    }
    if (L->nhosts > 1) {
        for (int i = 0; i < n; i++) a[i] = ring ? ring[i] : i, b[i] = ring ? ring[(i + 1) % n] : (i + 1) % n;
        L->ring_share = max_share(host, a, b, n, L->nhosts, cnt);
        int q = 1;
        while (q * 2 <= n) q *= 2;
        for (int k = 0; (1 << k) < n && k < ZCCL_TUNE_MAX_LG; k++) {
            const int d = 1 << k;
            int m = 0;
            for (int v = 0; v < q && d < q; v++) a[m] = fold_real(v, n - q), b[m] = fold_real(v ^ d, n - q), m++;
            L->xor_share[k] = max_share(host, a, b, m, L->nhosts, cnt);
            for (int r = 0; r < n; r++) a[r] = r, b[r] = (r + d) % n;
            L->add_share[k] = max_share(host, a, b, n, L->nhosts, cnt);
        }
    }
    if (host_of) memcpy(host_of, host, (size_t)n * sizeof *host);
    free(host), free(cnt), free(a), free(b);
    return ZCCL_SUCCESS;
}

void zccl__tune_forget(zccl_tuner_t *t) {
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) t->memo[c].valid = false;
}

zccl_result_t zccl__tune_usable(zccl_tuner_t *t, const char *what) {
    zccl__tune_forget(t);
    t->fallback[0] = '\0';
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) {
        uint32_t avail = 0, allowed = t->filter.allow[c];
        const char *why = NULL, *why_name = NULL;
        for (int i = 0; i < zccl__nalgos; i++) {
            if (!(zccl__algo_colls(zccl__algo_table[i]) & BIT(c))) continue;
            const char *u = zccl__algo_table[i]->unavailable ? zccl__algo_table[i]->unavailable((zccl_coll_t)c, &t->L) : NULL;
            if (!u) avail |= 1u << i;
            else if (allowed & (1u << i)) why = u, why_name = zccl__algo_table[i]->name;
        }
        t->usable[c] = allowed & avail;
        if (!t->usable[c] && c < ZCCL_NTUNED) {
            if (t->filter.explicit_[c])
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: %s cannot run with %s on this communicator (%d ranks on "
                                   "%d hosts): %s", what, zccl__coll_tune_name((zccl_coll_t)c), why_name ? why_name : "?", t->L.nranks,
                                   t->L.nhosts, why ? why : "not available");
            /* Not an error: one setting serves every communicator of the job (a sub-communicator inside one host
             * cannot run hier), but say so instead of ignoring it silently. */
            const size_t used = strlen(t->fallback);
            snprintf(t->fallback + used, sizeof t->fallback - used, "%s%s", used ? ", " : "", zccl__coll_tune_name((zccl_coll_t)c));
            if (why && !strstr(t->fallback, why)) {
                const size_t u2 = strlen(t->fallback);
                snprintf(t->fallback + u2, sizeof t->fallback - u2, " (%s %s)", why_name, why);
            }
            t->usable[c] = avail;
        }
    }
    return ZCCL_SUCCESS;
}

/* ---- the choice -------------------------------------------------------------------------------------------- */

size_t zccl__tune_bytes(zccl_coll_t coll, size_t count, size_t elem_size, int nranks) {
    size_t b = count * elem_size;
    if (coll == ZCCL_COLL_REDUCE_SCATTER || coll == ZCCL_COLL_ALLGATHER) b *= (size_t)nranks;
    return b;
}

int zccl__tune_pick(const zccl_tuner_t *t, zccl_coll_t coll, size_t bytes, double *pred) {
    int best = -1;
    double best_t = 0;
    for (int i = 0; i < zccl__nalgos; i++) {
        double x = -1.0;
        if ((unsigned)coll < ZCCL_COLL_COUNT && (t->usable[coll] & (1u << i))) {
            x = zccl__algo_table[i]->predict(coll, bytes, &t->L, &t->p);
            if (!(x >= 0) || !isfinite(x)) x = HUGE_VAL; /* a broken prediction never wins, but stays usable */
            if (best < 0 || x < best_t) best = i, best_t = x;
        }
        if (pred) pred[i] = x;
    }
    return best;
}

static int bucket_of(size_t bytes) {
    int b = 0;
    while (b < 63 && (bytes >> (b + 1))) b++;
    return b;
}

void zccl__tune(struct zccl_comm *comm, zccl_sched_args_t *a) {
    zccl_tuner_t *t = comm->tuner;
    const zccl_coll_t coll = a->coll;
    a->algo = ZCCL_ALGO_RING;
    /* The shared-memory path chosen for this collective at calibration, where collectives differ; on the thread that
     * runs the calls, between transfers (the sender of each message decides its protocol when the transfer starts). */
    if (t && t->cma_per_call && (unsigned)coll < ZCCL_COLL_COUNT) zccl__shm_single_copy(&comm->tc, t->cma_on[coll]);
    if ((unsigned)coll >= ZCCL_NTUNED || !t || !t->agreed) return; /* send/recv: one schedule; before agreement: ring */
    a->host_of = t->host_of;
    const size_t bytes = zccl__tune_bytes(coll, a->count, a->elem_size, comm->nranks);
    if (t->memo[coll].valid && t->memo[coll].bytes == bytes) { /* a training loop repeats its sizes */
        a->algo = t->memo[coll].algo;
        return;
    }
    double pred[ZCCL_TUNE_MAX_ALGOS];
    const int best = zccl__tune_pick(t, coll, bytes, pred);
    if (best < 0) return; /* cannot happen: every collective keeps an available algorithm */
    t->memo[coll].bytes = bytes;
    t->memo[coll].algo = best;
    t->memo[coll].valid = true;
    if (zccl__log_level >= ZCCL_LOG_INFO) {
        const int b = bucket_of(bytes);
        const uint64_t bit = 1ull << b;
        if (!(__atomic_fetch_or(&t->logged[coll], bit, __ATOMIC_RELAXED) & bit)) {
            char line[512];
            size_t w = 0;
            for (int i = 0; i < zccl__nalgos && w < sizeof line; i++)
                if (pred[i] >= 0)
                    w += (size_t)snprintf(line + w, sizeof line - w, " %s%s=%.1fus", zccl__algo_table[i]->name,
                                          i == best ? "*" : "", pred[i] * 1e6);
            ZCCL_INFO(ZCCL_LOG_TUNE, "tuner: %s %zu B (bucket [%llu, %llu) B) on %d ranks / %d hosts -> %s; "
                      "predicted:%s", zccl__coll_tune_name(coll), bytes, (unsigned long long)(1ull << b),
                      (unsigned long long)(b < 63 ? 1ull << (b + 1) : 0), comm->nranks, t->L.nhosts,
                      zccl__algo_table[best]->name, line);
        }
    }
    a->algo = best;
}

/* ---- public queries and the runtime override ---------------------------------------------------------------- */

static zccl_result_t coll_arg(const char *fn, const char *collective, int *coll) {
    if (!collective) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'collective' is NULL", fn);
    *coll = zccl__coll_from_name(collective, strlen(collective));
    if (*coll < 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'collective' = \"%s\" is not one of allreduce, "
                           "reducescatter, allgather, broadcast, reduce", fn, collective);
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_algorithms(zccl_comm_t comm, const char *collective, char *names, size_t len) {
    const char *fn = "zccl_comm_algorithms";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (!names || len == 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'names' is NULL or 'len' is 0", fn);
    int c;
    ZCCL_CHECK(coll_arg(fn, collective, &c));
    size_t w = 0;
    names[0] = '\0';
    for (int i = 0; i < zccl__nalgos; i++) {
        if (!(zccl__algo_colls(zccl__algo_table[i]) & BIT(c))) continue;
        if (zccl__algo_table[i]->unavailable && zccl__algo_table[i]->unavailable((zccl_coll_t)c, &comm->tuner->L)) continue;
        int k = snprintf(names + w, len - w, "%s%s", w ? "," : "", zccl__algo_table[i]->name);
        if (k < 0 || (size_t)k >= len - w)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'len' = %zu is too small for the list", fn, len);
        w += (size_t)k;
    }
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_algo_choice(zccl_comm_t comm, const char *collective, size_t bytes, char *name,
                                             size_t len, double *predicted_us) {
    const char *fn = "zccl_comm_algo_choice";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (!name || len == 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'name' is NULL or 'len' is 0", fn);
    int c;
    ZCCL_CHECK(coll_arg(fn, collective, &c));
    double pred[ZCCL_TUNE_MAX_ALGOS];
    pthread_mutex_lock(&comm->exec_mutex);
    const int best = zccl__tune_pick(comm->tuner, (zccl_coll_t)c, bytes, pred);
    pthread_mutex_unlock(&comm->exec_mutex);
    if (best < 0) return zccl__error(ZCCL_INTERNAL_ERROR, "%s: no algorithm can run %s", fn, collective);
    if ((size_t)snprintf(name, len, "%s", zccl__algo_table[best]->name) >= len)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'len' = %zu is too small for \"%s\"", fn, len,
                           zccl__algo_table[best]->name);
    if (predicted_us) *predicted_us = pred[best] * 1e6;
    return ZCCL_SUCCESS;
}

/*
 * algo_spec.c — the ZCCL_ALGO grammar (NCCL_ALGO's: a comma list of algorithm names, ^ to exclude, sections per
 * collective such as "allreduce:ring,tree;reducescatter:^direct"; docs/tuning.md) turned into a filter over the
 * registry's rows, the collectives' names it accepts, and the filter's hash that every rank must share.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "tuner.h"

#define BIT(c) (1u << (c))

/* ---- collectives ------------------------------------------------------------------------------------------- */

static const char *const coll_tune_names[ZCCL_COLL_COUNT] = {"allreduce", "reducescatter", "allgather", "broadcast",
                                                             "reduce", "send", "recv", "alltoall",
                                                             "alltoallv", "gather", "scatter"};
static const char *const coll_alt_names[ZCCL_COLL_COUNT] = {"all_reduce", "reduce_scatter", "all_gather", "bcast",
                                                            NULL, NULL, NULL, NULL, NULL, NULL, NULL};

const char *zccl__coll_tune_name(zccl_coll_t c) { return (unsigned)c < ZCCL_COLL_COUNT ? coll_tune_names[c] : "?"; }

int zccl__coll_from_name(const char *name, size_t len) {
    for (int c = 0; c < ZCCL_NTUNED; c++) {
        if (strlen(coll_tune_names[c]) == len && !strncasecmp(name, coll_tune_names[c], len)) return c;
        if (coll_alt_names[c] && strlen(coll_alt_names[c]) == len && !strncasecmp(name, coll_alt_names[c], len))
            return c;
    }
    return -1;
}

/* The collectives a registry row runs, as a bitmask (bit c: zccl_coll_t c). */
unsigned zccl__algo_colls(const zccl_algo_t *row) {
    unsigned m = 0;
    for (int c = 0; c < ZCCL_COLL_COUNT; c++)
        if (row->build[c]) m |= BIT(c);
    return m;
}

int zccl__algo_index(const char *name, size_t len) {
    for (int i = 0; i < zccl__nalgos; i++)
        if (strlen(zccl__algo_table[i]->name) == len && !strncasecmp(name, zccl__algo_table[i]->name, len)) return i;
    return -1;
}

static void list_algos(unsigned coll_mask, char *buf, size_t len) {
    size_t w = 0;
    buf[0] = '\0';
    for (int i = 0; i < zccl__nalgos && w < len; i++)
        if (zccl__algo_colls(zccl__algo_table[i]) & coll_mask)
            w += (size_t)snprintf(buf + w, len - w, "%s%s", w ? ", " : "", zccl__algo_table[i]->name);
}

static uint32_t algos_of(int coll) {
    uint32_t m = 0;
    for (int i = 0; i < zccl__nalgos; i++)
        if (zccl__algo_colls(zccl__algo_table[i]) & BIT(coll)) m |= 1u << i;
    return m;
}

/* ---- ZCCL_ALGO --------------------------------------------------------------------------------------------- */

static void trim(const char **b, const char **e) {
    while (*b < *e && isspace((unsigned char)**b)) (*b)++;
    while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

zccl_result_t zccl__algo_filter_parse(const char *spec, const char *what, zccl_algo_filter_t *f) {
    memset(f, 0, sizeof *f);
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) f->allow[c] = algos_of(c);
    if (!spec) return ZCCL_SUCCESS;
    const char *p = spec, *end = spec + strlen(spec);
    trim(&p, &end);
    if (p == end) return ZCCL_SUCCESS;
    bool have_default = false, have_coll[ZCCL_COLL_COUNT] = {false};
    uint32_t sec_allow[ZCCL_COLL_COUNT];
    memcpy(sec_allow, f->allow, sizeof sec_allow);
    uint32_t dflt = (1u << zccl__nalgos) - 1; /* the default section's set, before intersecting per collective */
    char known[256], colls[128] = "";
    list_algos(~0u, known, sizeof known);
    for (int c = 0; c < ZCCL_NTUNED; c++)
        snprintf(colls + strlen(colls), sizeof colls - strlen(colls), "%s%s", c ? ", " : "", coll_tune_names[c]);
    while (p <= end) {
        const char *se = memchr(p, ';', (size_t)(end - p));
        if (!se) se = end;
        const char *b = p, *e = se;
        trim(&b, &e);
        int coll = -1;
        const char *colon = memchr(b, ':', (size_t)(e - b));
        if (colon) {
            const char *cb = b, *ce = colon;
            trim(&cb, &ce);
            coll = zccl__coll_from_name(cb, (size_t)(ce - cb));
            if (coll < 0)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": unknown collective '%.*s' (known: %s)", what,
                                   spec, (int)(ce - cb), cb, colls);
            if (have_coll[coll])
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": collective '%s' has two sections", what, spec,
                                   coll_tune_names[coll]);
            have_coll[coll] = true;
            b = colon + 1;
            trim(&b, &e);
        } else if (have_default) {
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": two sections without a collective ('%.*s'); prefix "
                               "the others with a collective, e.g. allreduce:%.*s", what, spec, (int)(e - b), b,
                               (int)(e - b), b);
        } else {
            have_default = true;
        }
        bool exclude = false;
        if (b < e && *b == '^') {
            exclude = true;
            b++;
            trim(&b, &e);
        }
        uint32_t named = 0;
        const char *q = b;
        for (;;) {
            const char *ne = memchr(q, ',', (size_t)(e - q));
            if (!ne) ne = e;
            const char *nb = q, *nn = ne;
            trim(&nb, &nn);
            if (nb == nn)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": empty algorithm name in section '%.*s' (known: "
                                   "%s)", what, spec, (int)(se - p), p, known);
            int a = zccl__algo_index(nb, (size_t)(nn - nb));
            if (a < 0 && *nb == '^')
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": '%.*s': '^' goes only at the start of a section "
                                   "and excludes every algorithm listed after it (e.g. ^ring,direct)", what, spec,
                                   (int)(nn - nb), nb);
            if (a < 0)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": unknown algorithm '%.*s' (known: %s)", what, spec,
                                   (int)(nn - nb), nb, known);
            if (coll >= 0 && !(zccl__algo_colls(zccl__algo_table[a]) & BIT(coll))) {
                char valid[256];
                list_algos(BIT(coll), valid, sizeof valid);
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": algorithm '%s' does not run %s (algorithms for "
                                   "%s: %s)", what, spec, zccl__algo_table[a]->name, coll_tune_names[coll],
                                   coll_tune_names[coll], valid);
            }
            named |= 1u << a;
            if (ne == e) break;
            q = ne + 1;
        }
        if (coll >= 0) {
            const uint32_t set = exclude ? algos_of(coll) & ~named : named;
            if (!set) {
                char valid[256];
                list_algos(BIT(coll), valid, sizeof valid);
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": section '%.*s' leaves %s no algorithm (algorithms "
                                   "for %s: %s)", what, spec, (int)(se - p), p, coll_tune_names[coll],
                                   coll_tune_names[coll], valid);
            }
            sec_allow[coll] = set;
            f->explicit_[coll] = true;
        } else {
            dflt = exclude ? ((1u << zccl__nalgos) - 1) & ~named : named;
            if (!dflt)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=\"%s\": section '%.*s' excludes every algorithm (known: "
                                   "%s)", what, spec, (int)(se - p), p, known);
        }
        if (se == end) break;
        p = se + 1;
    }
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) {
        if (f->explicit_[c]) f->allow[c] = sec_allow[c];
        else if (algos_of(c) & dflt) f->allow[c] = algos_of(c) & dflt;
        /* else: the default section names nothing this collective can run: it stays unrestricted */
    }
    return ZCCL_SUCCESS;
}

uint64_t zccl__algo_filter_hash(const zccl_algo_filter_t *f) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the allowed sets */
    for (int c = 0; c < ZCCL_COLL_COUNT; c++)
        for (int k = 0; k < 4; k++) h = (h ^ ((f->allow[c] >> (8 * k)) & 0xffu)) * 1099511628211ull;
    return h;
}

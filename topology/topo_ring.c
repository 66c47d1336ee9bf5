/*
 * topo_ring.c — the ring order that follows from the ranks' localities, and the count of boundaries a ring crosses.
 *
 * Every rank computes the order from the same exchanged records, so the function is pure and deterministic: ranks
 * are sorted by a total order (package, NUMA node, core, rank) and every choice is made over that order.
 *
 * One host: the ring is the canonical order itself. Ranks of a package are contiguous, and within a package those of
 * a NUMA node, then of a core; a cycle through P package groups crosses P package boundaries, the fewest possible.
 *
 * Several hosts: hosts are contiguous (ordered by their lowest rank), so the ring crosses H host boundaries. Each
 * host is a segment that must start (entry e) and end (exit x) at the ranks closest to the NIC: e is the first rank
 * with the smallest nic_path, x the best other one, preferring an exit in another package, else another NUMA node,
 * else another core, and among equals the last in canonical order. The segment is laid out level by level with
 * fixed ends: at each level the group of e comes first, the group of x last, the others between. When e and x fall
 * in the same group and other groups exist, that group is split in two (the part holding e, and the rest ending at
 * x) and the other groups go between them: the one extra crossing a host pays when all its NIC-near ranks share a
 * package.
 */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include "topo_model.h"

enum { LVL_PACKAGE, LVL_NUMA, LVL_CORE, LVL_LEAF };

typedef struct {
    const zccl_locality_t *loc;
    int *out;
    int pos;
} ring_t;

static int32_t key(const zccl_locality_t *l, int level) {
    return level == LVL_PACKAGE ? l->package : level == LVL_NUMA ? l->numa : l->core;
}

/* The canonical total order: package, NUMA node, core, then rank. */
static int canon_cmp(const zccl_locality_t *loc, int a, int b) {
    for (int lvl = LVL_PACKAGE; lvl < LVL_LEAF; lvl++) {
        int32_t ka = key(&loc[a], lvl), kb = key(&loc[b], lvl);
        if (ka != kb) return ka < kb ? -1 : 1;
    }
    return (a > b) - (a < b);
}

static int host_cmp(const zccl_locality_t *loc, int a, int b) {
    if (loc[a].host != loc[b].host) return loc[a].host < loc[b].host ? -1 : 1;
    return canon_cmp(loc, a, b);
}

/* Stable merge sort of rank indices; tmp has room for n. */
static void sort_ranks(const zccl_locality_t *loc, int *v, int *tmp, int n,
                       int (*cmp)(const zccl_locality_t *, int, int)) {
    if (n < 2) return;
    int h = n / 2;
    sort_ranks(loc, v, tmp, h, cmp);
    sort_ranks(loc, v + h, tmp, n - h, cmp);
    int i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp(loc, v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

/* End (exclusive) of the run of equal keys at `level` starting at idx[from]. */
static int run_end(const ring_t *r, const int *idx, int m, int from, int level) {
    int32_t k = key(&r->loc[idx[from]], level);
    int e = from + 1;
    while (e < m && key(&r->loc[idx[e]], level) == k) e++;
    return e;
}

static int run_of(const ring_t *r, const int *idx, int m, int level, int rank) {
    int32_t k = key(&r->loc[rank], level);
    for (int i = 0; i < m; i++)
        if (key(&r->loc[idx[i]], level) == k) return i;
    return -1;
}

/*
 * Splits G (canonical order, one group of the level above) into A holding s and B holding t, both canonical:
 * at the first level where s and t differ, A is s's subgroup and B everything else.
 */
static void split(const ring_t *r, const int *g, int m, int level, int s, int t, int *a, int *na, int *b, int *nb,
                  int *tmp) {
    *na = *nb = 0;
    if (level == LVL_LEAF) {
        a[(*na)++] = s;
        for (int i = 0; i < m; i++)
            if (g[i] != s) b[(*nb)++] = g[i];
        return;
    }
    int32_t ks = key(&r->loc[s], level), kt = key(&r->loc[t], level);
    if (ks != kt) {
        for (int i = 0; i < m; i++) {
            if (key(&r->loc[g[i]], level) == ks) a[(*na)++] = g[i];
            else b[(*nb)++] = g[i];
        }
        return;
    }
    int h0 = run_of(r, g, m, level, s), h1 = run_end(r, g, m, h0, level);
    split(r, g + h0, h1 - h0, level + 1, s, t, a, na, b, nb, tmp);
    for (int i = 0; i < m; i++)
        if (i < h0 || i >= h1) b[(*nb)++] = g[i];
    sort_ranks(r->loc, b, tmp, *nb, canon_cmp);
}

static zccl_result_t arrange(ring_t *r, const int *idx, int m, int level, int s, int t);

static zccl_result_t arrange_split(ring_t *r, const int *idx, int m, int level, int g0, int g1, int s, int t) {
    int gm = g1 - g0;
    int *a = malloc(sizeof(int) * (size_t)gm * 3);
    if (!a) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory ordering the ring");
    int *b = a + gm, *tmp = b + gm, na, nb;
    split(r, idx + g0, gm, level + 1, s, t, a, &na, b, &nb, tmp);
    zccl_result_t res = arrange(r, a, na, level + 1, s, -1);
    for (int i = 0; i < m && res == ZCCL_SUCCESS;) {
        int e = run_end(r, idx, m, i, level);
        if (i != g0) res = arrange(r, idx + i, e - i, level + 1, -1, -1);
        i = e;
    }
    if (res == ZCCL_SUCCESS) res = arrange(r, b, nb, level + 1, -1, t);
    free(a);
    return res;
}

/* Emits idx[m] (canonical, one group of the level above) as a path from s (if >= 0) to t (if >= 0). */
static zccl_result_t arrange(ring_t *r, const int *idx, int m, int level, int s, int t) {
    if (m == 0) return ZCCL_SUCCESS;
    if (level == LVL_LEAF) {
        if (s >= 0) r->out[r->pos++] = s;
        for (int i = 0; i < m; i++)
            if (idx[i] != s && idx[i] != t) r->out[r->pos++] = idx[i];
        if (t >= 0) r->out[r->pos++] = t;
        return ZCCL_SUCCESS;
    }
    if (run_end(r, idx, m, 0, level) == m) return arrange(r, idx, m, level + 1, s, t);
    int gs = s >= 0 ? run_of(r, idx, m, level, s) : -1;
    int gt = t >= 0 ? run_of(r, idx, m, level, t) : -1;
    if (gs >= 0 && gs == gt) return arrange_split(r, idx, m, level, gs, run_end(r, idx, m, gs, level), s, t);
    if (gs >= 0) ZCCL_CHECK(arrange(r, idx + gs, run_end(r, idx, m, gs, level) - gs, level + 1, s, -1));
    for (int i = 0; i < m;) {
        int e = run_end(r, idx, m, i, level);
        if (i != gs && i != gt) ZCCL_CHECK(arrange(r, idx + i, e - i, level + 1, -1, -1));
        i = e;
    }
    if (gt >= 0) ZCCL_CHECK(arrange(r, idx + gt, run_end(r, idx, m, gt, level) - gt, level + 1, -1, t));
    return ZCCL_SUCCESS;
}

/* 0: another package, 1: another NUMA node, 2: another core, 3: the same core — smaller is a better exit. */
static int closeness(const zccl_locality_t *a, const zccl_locality_t *b) {
    if (a->package != b->package) return 0;
    if (a->numa != b->numa) return 1;
    return a->core != b->core ? 2 : 3;
}

static zccl_result_t host_segment(ring_t *r, const int *idx, int m) {
    const zccl_locality_t *loc = r->loc;
    if (m == 1) return arrange(r, idx, m, LVL_PACKAGE, idx[0], -1);
    int e = idx[0];
    for (int i = 1; i < m; i++)
        if (loc[idx[i]].nic_path < loc[e].nic_path) e = idx[i];
    int x = -1;
    for (int i = 0; i < m; i++) {
        int c = idx[i];
        if (c == e) continue;
        /* Later ranks win ties, so a host whose ranks are all alike keeps its canonical order. */
        if (x < 0 || loc[c].nic_path < loc[x].nic_path ||
            (loc[c].nic_path == loc[x].nic_path && closeness(&loc[e], &loc[c]) <= closeness(&loc[e], &loc[x])))
            x = c;
    }
    return arrange(r, idx, m, LVL_PACKAGE, e, x);
}

typedef struct {
    int start, len, min_rank;
} host_run_t;

zccl_result_t zccl_topo_ring_order(const zccl_locality_t *ranks, int n, int *order) {
    if (!ranks || !order || n < 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_ring_order: %d ranks, ranks %p, order %p", n,
                           (const void *)ranks, (void *)order);
    int *idx = malloc(sizeof(int) * (size_t)n * 2);
    host_run_t *hosts = malloc(sizeof *hosts * (size_t)n);
    if (!idx || !hosts) {
        free(idx);
        free(hosts);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory ordering a ring of %d ranks", n);
    }
    int *tmp = idx + n;
    for (int i = 0; i < n; i++) idx[i] = i;
    sort_ranks(ranks, idx, tmp, n, host_cmp);
    int nhosts = 0;
    for (int i = 0; i < n;) {
        int e = i + 1, lo = idx[i];
        for (; e < n && ranks[idx[e]].host == ranks[idx[i]].host; e++) lo = ZCCL_MIN(lo, idx[e]);
        hosts[nhosts++] = (host_run_t){i, e - i, lo};
        i = e;
    }
    /* Hosts in the order of their lowest rank (insertion sort: few hosts, and already nearly sorted). */
    for (int i = 1; i < nhosts; i++)
        for (int j = i; j > 0 && hosts[j].min_rank < hosts[j - 1].min_rank; j--) {
            host_run_t h = hosts[j];
            hosts[j] = hosts[j - 1];
            hosts[j - 1] = h;
        }
    ring_t r = {.loc = ranks, .out = order, .pos = 0};
    zccl_result_t res = ZCCL_SUCCESS;
    if (nhosts == 1) res = arrange(&r, idx, n, LVL_PACKAGE, -1, -1);
    for (int h = 0; nhosts > 1 && h < nhosts && res == ZCCL_SUCCESS; h++)
        res = host_segment(&r, idx + hosts[h].start, hosts[h].len);
    if (res == ZCCL_SUCCESS && r.pos != n)
        res = zccl__error(ZCCL_INTERNAL_ERROR, "ring order placed %d of %d ranks", r.pos, n);
    free(idx);
    free(hosts);
    return res;
}

void zccl_topo_ring_crossings(const zccl_locality_t *ranks, int n, const int *order, zccl_ring_crossings_t *out) {
    memset(out, 0, sizeof *out);
    if (n < 2) return;
    for (int i = 0; i < n; i++) {
        const zccl_locality_t *a = &ranks[order[i]], *b = &ranks[order[(i + 1) % n]];
        if (a->host != b->host) out->host++;
        else if (a->package != b->package) out->package++;
        else if (a->numa != b->numa) out->numa++;
        else if (a->core != b->core) out->core++;
        else out->local++;
    }
}

size_t zccl_topo_ring_format(const int *order, int n, char *buf, size_t len) {
    size_t need = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(buf && need < len ? buf + need : NULL, buf && need < len ? len - need : 0, "%s%d",
                         i ? " " : "", order[i]);
        if (w > 0) need += (size_t)w;
    }
    if (buf && len && n <= 0) buf[0] = '\0';
    return need;
}

int zccl_topo_ring_is_permutation(const int *order, int n) {
    if (!order || n < 1) return 0;
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) return 0;
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        if (order[i] < 0 || order[i] >= n || seen[order[i]]) ok = 0;
        else seen[order[i]] = 1;
    }
    free(seen);
    return ok;
}

/*
 * overlap — how much gradient communication the bucket scheduler hides behind backward, and how much ZeRO-3
 * gather time prefetch hides behind forward, on a real model's layer shapes (include/zccl_zero.h, docs/zero.md).
 *
 *   zcclrun -n 4 overlap [--model FILE] [--scale S] [--caps 256K,1M,4M] [--first BYTES] [--ratios 1,2]
 *                        [--iters N] [--k K] [--mode allreduce|reduce_scatter] [--zero3-limits 1,2,4] [--no-zero3]
 *
 * The model file is a shape table (name<TAB>shape<TAB>numel, '#' comment lines, a header line), e.g.
 * ../shared/models/gpt2-124m.tsv; every numel is multiplied by --scale (default 0.02) so a step fits a small
 * machine. Backward is synthetic: parameter i (last first) "computes" until a deadline that advances by a time
 * proportional to numel[i] — sleeping, like a host thread waiting for an accelerator, so the processor stays free
 * for communication — then adds its gradient and marks it ready.
 *
 * Calibration: the communication time C of one step is measured first (every bucket marked after a backward with
 * no compute: the time from the first mark to the end of finish); total compute is then set to R * C for every R
 * in --ratios. Per (bucket cap, R) the two schedules alternate for --iters steps each (so both see the same
 * machine); columns are medians of the slowest rank:
 *   comm_ms     time after backward in "after" (backward, then all buckets: no overlap) = C in this run
 *   after_ms    step time without overlap, about compute + C
 *   zccl_ms     step time with the bucket scheduler (buckets launch while backward continues)
 *   ideal_ms    max(compute, C) + the last bucket's share of C (it cannot start before backward ends)
 *   exposed_ms  time after backward with the scheduler: the communication not hidden
 *   hidden      1 - exposed / C;  of_hideable: (C - exposed) / (C - the last bucket's share)
 *   buffers_B   gradient buffer bytes per rank (zccl_bucket_buffer_bytes: full buckets + shards)
 *   peak_k      most buckets in flight at once (<= K)
 * ZeRO-3 forward: layers are the tensors that share a name prefix up to the first numeric component ("h.3",
 * "model.layers.3"); each is fetched, "computes" for a time proportional to its size (total = R * gather_ms, the
 * forward step time measured without compute), then released. Reported per live-bytes limit (multiples of the
 * largest layer): step time, exposed gather time (time fetches waited), hidden = 1 - exposed / gather,
 * of_hideable (against gather minus layer 0's share, which nothing precedes), peak live bytes (<= the limit).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zccl.h"
#include "zccl_zero.h"

#ifndef ZCCL_SHARED_DIR
#define ZCCL_SHARED_DIR "../shared"
#endif

#define CHECK(call)                                                                                              \
    do {                                                                                                         \
        zccl_result_t r_ = (call);                                                                               \
        if (r_ != ZCCL_SUCCESS) {                                                                                \
            fprintf(stderr, "overlap: rank %d: %s failed: %s\n", g_rank, #call, zccl_get_last_error(NULL));      \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static int g_rank, g_nranks;
static zccl_comm_t g_comm;

typedef struct {
    char **name;
    size_t *numel;
    int n;
} model_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

/* Reads name<TAB>shape<TAB>numel rows; '#' lines and the "name" header are skipped. Returns 0, or -1 if the file
 * cannot be opened (the caller skips), exits on a malformed row. */
static int load_model(const char *path, double scale, model_t *m) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int cap = 0, lineno = 0;
    memset(m, 0, sizeof *m);
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n' || strncmp(line, "name\t", 5) == 0) continue;
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!t2) { fprintf(stderr, "overlap: %s:%d: expected name<TAB>shape<TAB>numel\n", path, lineno); exit(2); }
        *t1 = 0;
        char *end;
        errno = 0;
        unsigned long long numel = strtoull(t2 + 1, &end, 10);
        if (errno || end == t2 + 1 || numel == 0) {
            fprintf(stderr, "overlap: %s:%d: numel '%s' is not a positive integer\n", path, lineno, t2 + 1);
            exit(2);
        }
        if (m->n == cap) {
            cap = cap ? 2 * cap : 256;
            m->name = realloc(m->name, (size_t)cap * sizeof *m->name);
            m->numel = realloc(m->numel, (size_t)cap * sizeof *m->numel);
            if (!m->name || !m->numel) { fprintf(stderr, "overlap: out of memory\n"); exit(1); }
        }
        double s = (double)numel * scale;
        m->name[m->n] = strdup(line);
        m->numel[m->n] = s < 1 ? 1 : (size_t)s;
        m->n++;
    }
    fclose(f);
    return 0;
}

static double max_over_ranks(double x) {
    double r = 0;
    CHECK(zccl_allreduce(&x, &r, 1, ZCCL_FLOAT64, ZCCL_MAX, g_comm, NULL));
    return r;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void write_grad(zccl_bucket_plan_t plan, const model_t *m, int i) {
    void *g;
    CHECK(zccl_bucket_grad_ptr(plan, i, &g));
    float *x = g;
    for (size_t j = 0; j < m->numel[i]; j += 16) x[j] += 1.0f; /* touch the gradient (one store per line) */
}

/* One backward step. per_elem_s: compute seconds per element; overlap: mark as soon as computed, else after the
 * whole backward. Returns the step time (slowest rank); *compute_s the backward time on this rank. */
static double backward_step(zccl_bucket_plan_t plan, const model_t *m, double per_elem_s, int overlap,
                            double *compute_s, double *tail_s) {
    CHECK(zccl_barrier(g_comm, NULL));
    const double t0 = now_s();
    double deadline = t0;
    CHECK(zccl_bucket_begin(plan, 1));
    for (int i = m->n - 1; i >= 0; i--) {
        if (overlap) write_grad(plan, m, i);
        deadline += per_elem_s * (double)m->numel[i];
        sleep_until(deadline);
        if (overlap) CHECK(zccl_bucket_mark_ready(plan, i));
    }
    const double t1 = now_s();
    /* No overlap: gradients are handed over only after the whole backward (a reduce-scatter plan could not hold
     * them all: it has K bucket buffers). */
    if (!overlap)
        for (int i = m->n - 1; i >= 0; i--) {
            write_grad(plan, m, i);
            CHECK(zccl_bucket_mark_ready(plan, i));
        }
    CHECK(zccl_bucket_finish(plan));
    const double t2 = now_s();
    *compute_s = t1 - t0;
    *tail_s = max_over_ranks(t2 - t1); /* after backward: marks (non-overlap: all of them) and finish */
    return max_over_ranks(t2 - t0);
}

static size_t parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

static int parse_list(const char *s, double *out, int max, int bytes) {
    int n = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save))
        out[n++] = bytes ? (double)parse_bytes(t) : atof(t);
    free(copy);
    return n;
}

static void run_buckets(const model_t *m, double *caps, int ncaps, size_t first, double *ratios, int nratios,
                        int iters, int K, zccl_bucket_mode_t mode) {
    size_t total = 0;
    for (int i = 0; i < m->n; i++) total += m->numel[i];
    if (g_rank == 0) {
        printf("# backward: %d tensors, %zu elements (%.1f MiB float32), %d ranks, K %d, mode %s, median of %d\n",
               m->n, total, total * 4.0 / (1 << 20), g_nranks, K, mode == ZCCL_BUCKET_ALLREDUCE ? "allreduce" :
               "reduce_scatter", iters);
        printf("# %9s %7s %5s %9s %10s %9s %9s %9s %10s %7s %11s %11s %6s\n", "cap", "buckets", "R", "comm_ms",
               "compute_ms", "after_ms", "zccl_ms", "ideal_ms", "exposed_ms", "hidden", "of_hideable", "buffers_B",
               "peak_k");
    }
    for (int c = 0; c < ncaps; c++) {
        zccl_bucket_options_t o = {0};
        o.cap_bytes = (size_t)caps[c];
        o.first_bytes = first < o.cap_bytes ? first : o.cap_bytes;
        o.max_in_flight = K;
        o.mode = mode;
        o.average = 1;
        zccl_bucket_plan_t plan;
        CHECK(zccl_bucket_plan_create(g_comm, m->n, m->numel, ZCCL_FLOAT32, &o, &plan));
        int nb;
        CHECK(zccl_bucket_count(plan, &nb));
        zccl_bucket_info_t last;
        CHECK(zccl_bucket_info(plan, nb - 1, &last));
        size_t fullb, shardb;
        CHECK(zccl_bucket_buffer_bytes(plan, &fullb, &shardb));
        /* Communication alone: every bucket marked after a backward without compute; the time from the first mark
         * to the end of finish. Warm up once. */
        double cs, tail, v[64];
        backward_step(plan, m, 0, 0, &cs, &tail);
        for (int it = 0; it < iters; it++) backward_step(plan, m, 0, 0, &cs, &v[it]);
        const double comm = median(v, iters);
        size_t padded = 0;
        for (int b = 0; b < nb; b++) {
            zccl_bucket_info_t bi;
            CHECK(zccl_bucket_info(plan, b, &bi));
            padded += bi.elems;
        }
        const double last_frac = (double)last.elems / (double)padded;
        for (int r = 0; r < nratios; r++) {
            const double per_elem = ratios[r] * comm / (double)total;
            /* The two schedules alternate, so both see the same machine; each step gives its time after backward:
             * all of the communication for "after", the exposed part for "zccl". */
            double ta[64], tz[64], ca[64], cz[64], xa[64], xz[64];
            for (int it = 0; it < iters; it++) {
                ta[it] = backward_step(plan, m, per_elem, 0, &ca[it], &xa[it]);
                tz[it] = backward_step(plan, m, per_elem, 1, &cz[it], &xz[it]);
            }
            const double after = median(ta, iters), zc = median(tz, iters);
            const double c_after = median(xa, iters), exposed = median(xz, iters);
            const double compute = max_over_ranks(median(cz, iters));
            const double last_share = c_after * last_frac;
            const double ideal = (compute > c_after ? compute : c_after) + last_share;
            double hidden = 1.0 - exposed / c_after;
            if (hidden < 0) hidden = 0;
            /* The last bucket cannot start before backward ends: at most C - its share can be hidden. */
            double of_hideable = (c_after - exposed) / (c_after - last_share);
            if (of_hideable < 0) of_hideable = 0;
            if (of_hideable > 1) of_hideable = 1;
            zccl_bucket_stats_t st;
            CHECK(zccl_bucket_stats(plan, &st));
            if (g_rank == 0)
                printf("  %9zu %7d %5.2f %9.2f %10.2f %9.2f %9.2f %9.2f %10.2f %6.1f%% %10.1f%% %11zu %6d\n",
                       o.cap_bytes, nb, ratios[r], c_after * 1e3, compute * 1e3, after * 1e3, zc * 1e3, ideal * 1e3,
                       exposed * 1e3, hidden * 100, of_hideable * 100, fullb + shardb, st.peak_in_flight);
        }
        fflush(stdout);
        CHECK(zccl_bucket_plan_destroy(plan));
    }
}

/* Layers: consecutive tensors sharing the name prefix up to the first all-digit component. */
static int group_layers(const model_t *m, size_t *layer_numel) {
    int nl = 0;
    char prev[512] = "";
    for (int i = 0; i < m->n; i++) {
        char key[512];
        snprintf(key, sizeof key, "%s", m->name[i]);
        char *p = key, *cut = NULL;
        while (p && *p) {
            char *dot = strchr(p, '.');
            size_t len = dot ? (size_t)(dot - p) : strlen(p);
            bool digits = len > 0;
            for (size_t k = 0; k < len; k++) digits = digits && p[k] >= '0' && p[k] <= '9';
            if (digits) { cut = p + len; break; }
            p = dot ? dot + 1 : NULL;
        }
        if (cut) *cut = 0;
        if (nl == 0 || !cut || strcmp(key, prev) != 0) layer_numel[nl++] = 0;
        snprintf(prev, sizeof prev, "%s", cut ? key : "");
        layer_numel[nl - 1] += m->numel[i];
    }
    return nl;
}

static double forward_step(zccl_zero3_t z, const size_t *ln, int nl, double per_elem_s, double *wait_s,
                           double *compute_s) {
    zccl_zero3_stats_t s0, s1;
    CHECK(zccl_zero3_stats(z, &s0));
    CHECK(zccl_barrier(g_comm, NULL));
    const double t0 = now_s();
    double deadline = t0, computed = 0;
    CHECK(zccl_zero3_begin(z));
    for (int l = 0; l < nl; l++) {
        void *full;
        CHECK(zccl_zero3_fetch(z, l, &full));
        const double start = now_s();
        if (deadline < start) deadline = start; /* compute starts when the parameters are there */
        deadline += per_elem_s * (double)ln[l];
        sleep_until(deadline);
        computed += now_s() - start; /* measured: a late wake-up counts as compute, not as exposed gather */
        CHECK(zccl_zero3_release(z, l));
    }
    CHECK(zccl_zero3_end(z));
    const double t = now_s() - t0;
    CHECK(zccl_zero3_stats(z, &s1));
    *wait_s = max_over_ranks(s1.fetch_wait_s - s0.fetch_wait_s);
    *compute_s = computed;
    return max_over_ranks(t);
}

static void run_zero3(const model_t *m, double *limits, int nlimits, double *ratios, int nratios, int iters) {
    size_t *ln = calloc((size_t)m->n, sizeof *ln);
    const int nl = group_layers(m, ln);
    size_t largest = 0, total = 0;
    for (int l = 0; l < nl; l++) {
        size_t b = (ln[l] + (size_t)g_nranks - 1) / (size_t)g_nranks * (size_t)g_nranks * 4;
        if (b > largest) largest = b;
        total += ln[l];
    }
    zccl_comm_t comm3;
    CHECK(zccl_comm_split(g_comm, 0, 0, &comm3)); /* a duplicate for the store */
    if (g_rank == 0) {
        printf("# ZeRO-3 forward: %d layers, %zu elements, largest layer %zu bytes, %d ranks, median of %d\n", nl,
               total, largest, g_nranks, iters);
        printf("# %11s %5s %10s %10s %10s %10s %7s %11s %13s\n", "limit_B", "R", "gather_ms", "compute_ms",
               "step_ms", "exposed_ms", "hidden", "of_hideable", "peak_live_B");
    }
    for (int li = 0; li < nlimits; li++) {
        zccl_zero3_options_t o = {0};
        o.max_live_bytes = (size_t)(limits[li] * (double)largest);
        zccl_zero3_t z;
        CHECK(zccl_zero3_create(comm3, nl, ln, ZCCL_FLOAT32, &o, &z));
        double w, c, v[64], wv[64];
        forward_step(z, ln, nl, 0, &w, &c); /* step 1: records the order */
        /* Gather time alone: forward without compute. */
        for (int it = 0; it < iters; it++) v[it] = forward_step(z, ln, nl, 0, &w, &c);
        const double gather = median(v, iters);
        for (int r = 0; r < nratios; r++) {
            const double per_elem = ratios[r] * gather / (double)total;
            double cv[64];
            for (int it = 0; it < iters; it++) v[it] = forward_step(z, ln, nl, per_elem, &wv[it], &cv[it]);
            const double comp = max_over_ranks(median(cv, iters));
            const double step = median(v, iters), exposed = median(wv, iters);
            double hidden = 1.0 - exposed / gather;
            if (hidden < 0) hidden = 0;
            /* Layer 0's gather starts at begin, with no compute before it: at most gather - its share is hidden. */
            const double first = gather * (double)ln[0] / (double)total;
            double of_hideable = (gather - exposed) / (gather - first);
            if (of_hideable < 0) of_hideable = 0;
            if (of_hideable > 1) of_hideable = 1;
            zccl_zero3_stats_t st;
            CHECK(zccl_zero3_stats(z, &st));
            if (g_rank == 0)
                printf("  %11zu %5.2f %10.2f %10.2f %10.2f %10.2f %6.1f%% %10.1f%% %13zu%s\n", o.max_live_bytes,
                       ratios[r], gather * 1e3, comp * 1e3, step * 1e3, exposed * 1e3, hidden * 100,
                       of_hideable * 100, st.peak_live_bytes,
                       st.peak_live_bytes <= o.max_live_bytes ? "" : "  (over the limit: one layer > limit)");
        }
        fflush(stdout);
        CHECK(zccl_zero3_destroy(z));
    }
    CHECK(zccl_comm_destroy(comm3));
    free(ln);
}

int main(int argc, char **argv) {
    const char *model = ZCCL_SHARED_DIR "/models/gpt2-124m.tsv";
    double scale = 0.02, caps[16] = {256 << 10, 1 << 20, 4 << 20}, ratios[16] = {1.0, 2.0}, limits[16] = {1, 2, 4};
    int ncaps = 3, nratios = 2, nlimits = 3, iters = 5, K = 2, zero3 = 1;
    size_t first = 64 << 10;
    zccl_bucket_mode_t mode = ZCCL_BUCKET_ALLREDUCE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-zero3")) { zero3 = 0; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help") || !v) {
            fprintf(stderr, "usage: zcclrun -n N overlap [--model FILE] [--scale S] [--caps LIST] [--first BYTES] "
                            "[--ratios LIST] [--iters N] [--k K] [--mode allreduce|reduce_scatter] "
                            "[--zero3-limits LIST] [--no-zero3]\n(see the comment at the top of bench/overlap.c)\n");
            return strcmp(a, "-h") && strcmp(a, "--help") ? 2 : 0;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--scale")) scale = atof(v);
        else if (!strcmp(a, "--caps")) ncaps = parse_list(v, caps, 16, 1);
        else if (!strcmp(a, "--first")) first = parse_bytes(v);
        else if (!strcmp(a, "--ratios")) nratios = parse_list(v, ratios, 16, 0);
        else if (!strcmp(a, "--zero3-limits")) nlimits = parse_list(v, limits, 16, 0);
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--k")) K = atoi(v);
        else if (!strcmp(a, "--mode")) mode = !strcmp(v, "reduce_scatter") ? ZCCL_BUCKET_REDUCE_SCATTER : ZCCL_BUCKET_ALLREDUCE;
        else { fprintf(stderr, "overlap: unknown option %s\n", a); return 2; }
    }
    if (iters < 1 || iters > 64 || scale <= 0 || ncaps < 1 || nratios < 1 || K < 1) {
        fprintf(stderr, "overlap: need 1 <= iters <= 64, scale > 0, K >= 1, non-empty lists\n");
        return 2;
    }
    model_t m;
    if (load_model(model, scale, &m) != 0) {
        printf("overlap: SKIP: model file %s not found (the shapes live in ../shared/models)\n", model);
        return 0;
    }
    CHECK(zccl_comm_init_env(&g_comm));
    CHECK(zccl_comm_rank(g_comm, &g_rank));
    CHECK(zccl_comm_count(g_comm, &g_nranks));
    if (g_rank == 0) printf("# overlap: model %s, scale %g\n", model, scale);
    run_buckets(&m, caps, ncaps, first, ratios, nratios, iters, K, mode);
    if (zero3) run_zero3(&m, limits, nlimits, ratios, nratios, iters);
    CHECK(zccl_comm_destroy(g_comm));
    return 0;
}

/*
 * tuner_calib.c — the tuner's parameters for a communicator: defaults, measurement at init, the cache file, the
 * agreement between ranks, and zccl_comm_set_algo.
 *
 * Measurement (ZCCL_TUNER_CALIBRATE=1, the default), run by every rank together right after the init barrier:
 *   intra-host link: ranks of each host form a ring in rank order. alpha is the median time of ALPHA_ITERS small
 *     ring all-reduces (8 bytes per block) divided by their 2(k-1) dependent steps; beta = (median time of
 *     BETA_ITERS shifts of BETA_BYTES (send to the next, receive from the previous, one phase) - alpha) / BETA_BYTES.
 *   inter-host link (several hosts): alpha the same between the first ranks of each host; beta from shifts of
 *     INTER_BETA_BYTES, long enough to outlast the buffering on a network path (switch and NIC queues, a shaper's
 *     token bucket, TCP's window after idle), which a 64 KiB probe fits inside and so measures too fast.
 *   gamma: the float32 sum kernel over GAMMA_BYTES in cache; copy: memcpy of BUF_BYTES.
 *   single copy (ZCCL_SHM_CMA=-1, a host with two ranks or more): ring reduce-scatters and all-gathers of
 *     CMA_PROBE_BYTES among the host's ranks with the single copy (process_vm_readv) and through the slots, in pairs
 *     side by side (cma_against_slots); per collective (cma_choose: the all-reduce by both halves, reduce-scatter and
 *     reduce by the reduce-scatter, the rest by the all-gather) the single copy is used unless the median of the
 *     pairs' ratios exceeds CMA_SLOWER on some host (MAX over ranks), for the communicator's life.
 * "Median" above is the fastest run instead when the host's ranks fit its cores (fastest_is_cost, below).
 * Every rank then takes the maximum over ranks of every value (one all-reduce), so the choice is the same
 * everywhere even though each rank measured something slightly different. The ZCCL_ALGO filter is agreed the
 * same way (all-reduce MAX of its hash h and of ~h: equal on every rank only if every rank has the same filter).
 *
 * Cache (ZCCL_TUNER_CACHE=FILE): lines "HOST LINK ALPHA_US BETA_NS_PER_BYTE"; LINK is intra-shm, intra-tcp,
 * inter-tcp, gamma or copy ('#' starts a comment). When every rank finds the entries it needs for its host, nobody
 * measures; otherwise all measure and the first rank of each host rewrites its host's lines (write to a temporary
 * file, then rename).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "comm.h"
#include "engine.h"
#include "kernels.h"
#include "stream.h"
#include "tuner.h"

#define ALPHA_ITERS 9
#define BETA_ITERS 5
/* 64 KiB: the sizes where latency- and bandwidth-optimised algorithms trade places (and messages stay in cache, as
 * the pipelined chunks of large collectives do); a 256 KiB probe measured 2-4x more per byte under
 * oversubscription and made the model pick bandwidth algorithms too early (docs/tuning.md). */
#define BETA_BYTES (64u << 10)
/* Inter-host beta: 1 MiB x BETA_ITERS back to back. Under a 1 Gbit/s tbf cap with a 512 KB burst (tests/netns), 64 KiB
 * probes passed at the veth's speed (0.73 GB/s measured against 0.125 GB/s) and the model saw no reason for the
 * hierarchical schedules; 1 MiB measures the sustained rate (docs/tuning.md, "Several hosts"). */
#define INTER_BETA_BYTES (1u << 20)
#define BUF_BYTES (256u << 10)
#define GAMMA_BYTES (64u << 10)
/* The single copy against the slots: 1 MiB is inside the band where they trade places by machine (an Intel VM: the
 * single copy 1.2-1.9x faster from 256 KiB; an AMD EPYC VM: the slots 1.4-3x faster up to 16 MiB; docs/performance.md,
 * "Design choices"). Above 1.0 the slots: the probe shows less of the gap than the collectives then see (1.06-1.80
 * where 2-rank all-reduces ran 2x faster through the slots, docs/tuning.md "Calibration"), so level leans to them. */
#define CMA_PROBE_BYTES (1u << 20)
#define CMA_SLOWER 1.0

enum { P_INTRA_A, P_INTRA_B, P_INTER_A, P_INTER_B, P_GAMMA, P_COPY, P_N };

static void params_to(const zccl_tune_params_t *p, double v[P_N]) {
    v[P_INTRA_A] = p->intra.alpha, v[P_INTRA_B] = p->intra.beta;
    v[P_INTER_A] = p->inter.alpha, v[P_INTER_B] = p->inter.beta;
    v[P_GAMMA] = p->gamma, v[P_COPY] = p->copy;
}
static void params_from(const double v[P_N], zccl_tune_params_t *p) {
    p->intra.alpha = v[P_INTRA_A], p->intra.beta = v[P_INTRA_B];
    p->inter.alpha = v[P_INTER_A], p->inter.beta = v[P_INTER_B];
    p->gamma = v[P_GAMMA], p->copy = v[P_COPY];
}

zccl_result_t zccl__tuner_setup(struct zccl_comm *comm) {
    zccl_tuner_t *t = zccl__calloc(1, sizeof *t);
    if (!t) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the tuner");
    comm->tuner = t;
    zccl__tune_defaults(&t->p);
    snprintf(t->source, sizeof t->source, "defaults");
    uint64_t *hosts = malloc((size_t)comm->nranks * sizeof *hosts);
    t->host_of = malloc((size_t)comm->nranks * sizeof *t->host_of);
    if (!hosts || !t->host_of) {
        free(hosts);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the tuner's host table of %d ranks", comm->nranks);
    }
    for (int r = 0; r < comm->nranks; r++) hosts[r] = comm->tc.peers[r].host_hash;
    zccl_result_t res = zccl__tune_layout(hosts, comm->ring, comm->nranks, &t->L, t->host_of);
    free(hosts);
    if (res != ZCCL_SUCCESS) return res;
    ZCCL_CHECK(zccl__algo_filter_parse(zccl__cfg_str(ZCCL_CFG_ALGO), "ZCCL_ALGO", &t->filter));
    return zccl__tune_usable(t, "ZCCL_ALGO");
}

void zccl__tuner_free(struct zccl_comm *comm) {
    if (comm->tuner) free(comm->tuner->host_of);
    free(comm->tuner);
    comm->tuner = NULL;
}

zccl_result_t zccl__tuner_agree(struct zccl_comm *comm, zccl_tune_params_t *p, uint64_t filter_hash,
                                const char *what) {
    double v[P_N], out[P_N];
    params_to(p, v);
    ZCCL_CHECK(zccl_allreduce(v, out, P_N, ZCCL_FLOAT64, ZCCL_MAX, comm, NULL));
    params_from(out, p);
    uint64_t h[2] = {filter_hash, ~filter_hash}, hmax[2];
    ZCCL_CHECK(zccl_allreduce(h, hmax, 2, ZCCL_UINT64, ZCCL_MAX, comm, NULL));
    if (hmax[0] != filter_hash || hmax[1] != ~filter_hash)
        return zccl__error(ZCCL_INVALID_USAGE, "%s differs between ranks (rank %d: \"%s\"); every rank must allow the "
                           "same algorithms so that all choose alike", what, comm->rank,
                           !strcmp(what, "ZCCL_ALGO") ? zccl__cfg_str(ZCCL_CFG_ALGO) : "see zccl_comm_set_algo");
    return ZCCL_SUCCESS;
}

/* ---- measurement -------------------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Whether the fastest run, not the median, stands for a link's cost: when this host's ranks fit its cores, every
 * run slower than the fastest was slowed by something else on the machine (other jobs, a build), and a median
 * taken on a loaded machine varied 10-80x between inits (alpha 1 us to 79 us on the 2-core VM), flipping the
 * algorithm chosen for 64 KiB - 4 MiB from one run to the next. When the host has more ranks than cores, waiting
 * for a descheduled peer is part of every step, so the median keeps it. Decided by measure(), passed down (two
 * communicators may calibrate at once in different threads). */
/* Median (or fastest, see fastest_is_cost) seconds of `iters` runs of schedule s (one untimed run first lines the
 * ranks up). */
static zccl_result_t time_sched(struct zccl_comm *comm, zccl_schedule_t *s, int iters, void *sbuf, void *rbuf,
                                bool fastest_is_cost, double *out) {
    double t[ALPHA_ITERS > BETA_ITERS ? ALPHA_ITERS : BETA_ITERS];
    if (s->oom) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a calibration schedule");
    zccl_result_t res = zccl__engine_run(comm, s, sbuf, rbuf, ZCCL_UINT8, ZCCL_SUM);
    for (int i = 0; i < iters && res == ZCCL_SUCCESS; i++) {
        const uint64_t t0 = zccl__now_ns();
        res = zccl__engine_run(comm, s, sbuf, rbuf, ZCCL_UINT8, ZCCL_SUM);
        t[i] = (double)(zccl__now_ns() - t0) * 1e-9;
    }
    if (res == ZCCL_SUCCESS) {
        const double m = median(t, iters); /* sorts t */
        *out = fastest_is_cost ? t[0] : m;
    }
    return res;
}

/* A shift of `bytes` into s: send to `to` and receive from `from`, one phase (count in bytes: run as ZCCL_UINT8). */
static void shift_sched(int to, int from, size_t bytes, zccl_schedule_t *s) {
    zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_SEND, .buf = ZCCL_BUF_SEND, .src = ZCCL_BUF_NONE, .peer = to,
                                      .count = bytes});
    zccl__sched_step(s, (zccl_step_t){.kind = ZCCL_STEP_RECV, .buf = ZCCL_BUF_RECV, .src = ZCCL_BUF_NONE,
                                      .peer = from, .count = bytes});
    zccl__sched_end_phase(s);
}

/* Median seconds of `iters` shifts of `bytes` (send to `to`, receive from `from`); 0 when this rank has no part. */
static zccl_result_t shift_time(struct zccl_comm *comm, int to, int from, size_t bytes, int iters, void *sbuf,
                                void *rbuf, bool fastest_is_cost, double *out) {
    *out = 0;
    if (to < 0) return ZCCL_SUCCESS;
    zccl_schedule_t s = {0};
    shift_sched(to, from, bytes, &s);
    zccl_result_t res = time_sched(comm, &s, iters, sbuf, rbuf, fastest_is_cost, out);
    zccl__sched_free(&s);
    return res;
}

/* A ring all-reduce, reduce-scatter or all-gather (coll) of `count` elements of `elem_size` bytes (the collective's
 * count argument: per rank for the last two) among `members` (k ranks, rank order) into s, its steps naming ranks of
 * the communicator; false (s untouched) when this rank is not a member or is alone. */
static bool members_ring(const struct zccl_comm *comm, zccl_coll_t coll, const int *members, int k, size_t count,
                         size_t elem_size, size_t chunk_bytes, zccl_schedule_t *s) {
    int idx = -1;
    for (int i = 0; i < k; i++)
        if (members[i] == comm->rank) idx = i;
    if (idx < 0 || k < 2) return false;
    zccl_sched_args_t a = {.coll = coll, .nranks = k, .rank = idx, .count = count,
                           .elem_size = elem_size, .chunk_bytes = chunk_bytes, .rs_round_bytes = 4u << 20,
                           .algo = ZCCL_ALGO_RING};
    if (coll == ZCCL_COLL_REDUCE_SCATTER) zccl__sched_ring_reduce_scatter(&a, s);
    else if (coll == ZCCL_COLL_ALLGATHER) zccl__sched_ring_allgather(&a, s);
    else zccl__sched_ring_allreduce(&a, s);
    for (size_t i = 0; i < s->nsteps; i++) /* positions in the sub-ring -> ranks of the communicator */
        if (s->steps[i].peer >= 0) s->steps[i].peer = members[s->steps[i].peer];
    return true;
}

/* alpha as collectives see it: the median time of a small ring all-reduce among `members` (k ranks, rank order)
 * divided by its 2(k-1) dependent steps — each step waits for the previous one's data, as in every algorithm, which
 * back-to-back independent shifts do not show (they overlap their wake-ups). 0 when this rank has no part. */
static zccl_result_t chain_alpha(struct zccl_comm *comm, const int *members, int k, void *sbuf, void *rbuf,
                                 bool fastest_is_cost, double *out) {
    *out = 0;
    zccl_schedule_t s = {0};
    if (!members_ring(comm, ZCCL_COLL_ALLREDUCE, members, k, 8 * (size_t)k, 1, 64u << 10, &s)) return ZCCL_SUCCESS;
    double t = 0;
    zccl_result_t res = time_sched(comm, &s, ALPHA_ITERS, sbuf, rbuf, fastest_is_cost, &t);
    zccl__sched_free(&s);
    *out = t / (2.0 * (k - 1));
    return res;
}

/* Next/previous rank of `members` (rank order) around this rank; -1 when it is not a member or alone. */
static void ring_peers(const int *members, int k, int me, int *to, int *from) {
    *to = *from = -1;
    for (int i = 0; i < k; i++)
        if (members[i] == me && k > 1) {
            *to = members[(i + 1) % k];
            *from = members[(i + k - 1) % k];
        }
}

/* The single copy's time over the slots' (ratio[CMA_AR], [CMA_RS], [CMA_AG]) for a ring all-reduce, reduce-scatter
 * and all-gather of CMA_PROBE_BYTES of float32 among this host's ranks (`members`, k of them, rank order), as the
 * collectives run them (pulls or slot copies of pipeline chunks, reductions, the gather). The reduce-scatter and the
 * all-gather are timed, CMA_PAIRS pairs of runs each, one with each path back to back and each pair in the other
 * order; [CMA_RS] and [CMA_AG] are the medians of their pairs' ratios, and [CMA_AR] the median of (reduce-scatter +
 * all-gather with the single copy) over (the same with the slots), pair by pair: the ring all-reduce is those two
 * halves. One probe for every collective decided wrongly on the AMD EPYC VM (docs/tuning.md "Calibration"): in its
 * slow phases the single copy was faster for reduce-scatter and slower for the all-reduce. Two earlier probes (5
 * one-megabyte shifts with each path in turn; the same in pairs) showed less than the collectives' gap. All 0 when
 * this rank has no part. Switches this rank's single copy on and off between runs, and leaves it on; the sender of
 * each message decides its protocol, so the ranks need not switch in step. */
#define CMA_PAIRS 9
enum { CMA_AR, CMA_RS, CMA_AG, CMA_N };
static zccl_result_t cma_against_slots(struct zccl_comm *comm, const int *members, int k, bool part, void *sbuf,
                                       void *rbuf, double ratio[CMA_N]) {
    for (int c = 0; c < CMA_N; c++) ratio[c] = 0;
    const size_t count = k > 0 ? CMA_PROBE_BYTES / 4 / (size_t)k : 0; /* per rank */
    zccl_schedule_t s[2] = {{0}, {0}};                                  /* [0] reduce-scatter, [1] all-gather */
    const zccl_coll_t coll[2] = {ZCCL_COLL_REDUCE_SCATTER, ZCCL_COLL_ALLGATHER};
    if (!part) return ZCCL_SUCCESS;
    for (int h = 0; h < 2; h++)
        if (!members_ring(comm, coll[h], members, k, count, 4, zccl__pipeline_chunk(count * 4 * (size_t)k, k), &s[h])) {
            zccl__sched_free(&s[0]);
            return ZCCL_SUCCESS;
        }
    zccl_result_t res = ZCCL_SUCCESS;
    if (s[0].oom || s[1].oom) res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a calibration schedule");
    double r[CMA_N][CMA_PAIRS];
    for (int on = 1; on >= 0 && res == ZCCL_SUCCESS; on--) /* one untimed run each: pages, pins, slots */
        for (int h = 0; h < 2 && res == ZCCL_SUCCESS; h++) {
            zccl__shm_single_copy(&comm->tc, on);
            res = zccl__engine_run(comm, &s[h], sbuf, rbuf, ZCCL_FLOAT32, ZCCL_SUM);
        }
    for (int i = 0; i < CMA_PAIRS && res == ZCCL_SUCCESS; i++) {
        double t[2][2] = {{0, 0}, {0, 0}}; /* [half][0] slots, [half][1] single copy */
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 2 && res == ZCCL_SUCCESS; j++) {
                const int on = (i + j + h) % 2;
                zccl__shm_single_copy(&comm->tc, on);
                const uint64_t t0 = zccl__now_ns();
                res = zccl__engine_run(comm, &s[h], sbuf, rbuf, ZCCL_FLOAT32, ZCCL_SUM);
                t[h][on] = (double)(zccl__now_ns() - t0) * 1e-9;
            }
        r[CMA_RS][i] = t[0][0] > 0 ? t[0][1] / t[0][0] : 1;
        r[CMA_AG][i] = t[1][0] > 0 ? t[1][1] / t[1][0] : 1;
        r[CMA_AR][i] = t[0][0] + t[1][0] > 0 ? (t[0][1] + t[1][1]) / (t[0][0] + t[1][0]) : 1;
    }
    zccl__shm_single_copy(&comm->tc, 1);
    zccl__sched_free(&s[0]);
    zccl__sched_free(&s[1]);
    if (res == ZCCL_SUCCESS)
        for (int c = 0; c < CMA_N; c++) ratio[c] = median(r[c], CMA_PAIRS);
    return res;
}

/* Every slot of the shared-memory channels to `to` and from `from` used once, untimed, through the slots (the single
 * copy off meanwhile where the tuner may switch it): a slot's first use faults its pages in on both sides, about
 * 200 us per 64 KiB slot on the 2-core VM, and the shifts and probes below, each reaching slots not used before,
 * measured that as bandwidth: the intra-host beta came out at 0.2-0.4 GB/s where the same 64 KiB shifts ran in 5 us
 * (13 GB/s) once every slot had been used (docs/tuning.md "Calibration"). The faults are not saved, only moved:
 * the first collectives would take them. Nothing when this rank has no local peer or no shared memory. */
static zccl_result_t warm_slots(struct zccl_comm *comm, int to, int from, void *sbuf, void *rbuf, size_t buf_bytes) {
    if (to < 0) return ZCCL_SUCCESS;
    const size_t ring = zccl__shm_ring_bytes(&comm->tc);
    if (ring == 0) return ZCCL_SUCCESS;
    const int was = zccl__shm_single_copy(&comm->tc, 0);
    zccl_result_t res = ZCCL_SUCCESS;
    for (size_t done = 0; done < ring && res == ZCCL_SUCCESS; done += buf_bytes) {
        const size_t bytes = ring - done < buf_bytes ? ring - done : buf_bytes;
        zccl_schedule_t s = {0};
        shift_sched(to, from, bytes, &s);
        res = s.oom ? zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a calibration schedule")
                    : zccl__engine_run(comm, &s, sbuf, rbuf, ZCCL_UINT8, ZCCL_SUM);
        zccl__sched_free(&s);
    }
    if (was >= 0) zccl__shm_single_copy(&comm->tc, was);
    return res;
}

/* A calibration buffer of `bytes` (a multiple of the page size), page-aligned and with its pages in place before any
 * timing (MAP_POPULATE: one system call instead of a fault per page on first use, about 30 us each on the 2-core VM).
 * NULL when out of memory. */
static uint8_t *calib_buf(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static zccl_result_t measure(struct zccl_comm *comm, zccl_tune_params_t *p, double cma_ratio[CMA_N]) {
    const int n = comm->nranks, me = comm->rank;
    int *local = malloc((size_t)n * sizeof(int)), *heads = malloc((size_t)n * sizeof(int));
    const size_t bufbytes = INTER_BETA_BYTES > BUF_BYTES ? INTER_BETA_BYTES : BUF_BYTES;
    /* Page-aligned, as the buffers of most callers: malloc's (16 bytes past a page) put the slots' copies at a
     * distance some CPUs copy 10x slower (kernels.h, zccl_kernel_rep_movsb_slow), which once made the single copy
     * look 2.5-3x faster than the slots here while the slots were faster for aligned buffers. */
    const size_t bufalloc = (bufbytes + 4095) / 4096 * 4096;
    uint8_t *sbuf = calib_buf(bufalloc), *rbuf = calib_buf(bufalloc);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!local || !heads || !sbuf || !rbuf) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for calibration buffers");
        goto out;
    }
    memset(sbuf, 0x5a, bufbytes);
    int nl = 0, nh = 0;
    const uint64_t myhost = comm->tc.peers[me].host_hash;
    for (int r = 0; r < n; r++) {
        if (comm->tc.peers[r].host_hash == myhost) local[nl++] = r;
        bool first = true;
        for (int q = 0; q < r && first; q++) first = comm->tc.peers[q].host_hash != comm->tc.peers[r].host_hash;
        if (first) heads[nh++] = r;
    }
    double v[P_N] = {0};
    int to, from;
    double a = 0, b = 0;
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const bool fastest_is_cost = ncpu > 0 && nl <= ncpu;
    /* Every rank runs every measurement in the same order; a rank without a part returns at once. */
    ring_peers(local, nl, me, &to, &from);
    ZCCL_CHECK_GOTO(chain_alpha(comm, local, nl, sbuf, rbuf, fastest_is_cost, &a), res, out);
    ZCCL_CHECK_GOTO(warm_slots(comm, to, from, sbuf, rbuf, bufalloc), res, out);
    ZCCL_CHECK_GOTO(shift_time(comm, to, from, BETA_BYTES, BETA_ITERS, sbuf, rbuf, fastest_is_cost, &b), res, out);
    if (to >= 0) v[P_INTRA_A] = a, v[P_INTRA_B] = fmax(b - a, b * 0.1) / BETA_BYTES;
    /* Single copy against slots, only where every rank with a local peer has the choice (one MIN over ranks decides,
     * so either all of them run both shifts or none does: a rank that skipped a shift its peer runs would hang it). */
    for (int c = 0; c < CMA_N; c++) cma_ratio[c] = 0;
    {
        const int was = zccl__shm_single_copy(&comm->tc, -1);
        int64_t mine = to >= 0 ? was : 1, all = 0;
        ZCCL_CHECK_GOTO(zccl_allreduce(&mine, &all, 1, ZCCL_INT64, ZCCL_MIN, comm, NULL), res, out);
        ZCCL_CHECK_GOTO(cma_against_slots(comm, local, nl, all == 1 && to >= 0, sbuf, rbuf, cma_ratio), res, out);
    }
    ring_peers(heads, nh, me, &to, &from);
    ZCCL_CHECK_GOTO(chain_alpha(comm, heads, nh, sbuf, rbuf, fastest_is_cost, &a), res, out);
    ZCCL_CHECK_GOTO(shift_time(comm, to, from, INTER_BETA_BYTES, BETA_ITERS, sbuf, rbuf, fastest_is_cost, &b), res, out);
    if (to >= 0) v[P_INTER_A] = a, v[P_INTER_B] = fmax(b - a, b * 0.1) / INTER_BETA_BYTES;
    /* gamma and copy, in cache */
    double tg[5], tc[5];
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = zccl__now_ns();
        zccl_kernel_reduce(rbuf, sbuf, sbuf + GAMMA_BYTES, GAMMA_BYTES / 4, ZCCL_FLOAT32, ZCCL_SUM, 1);
        uint64_t t1 = zccl__now_ns();
        memcpy(rbuf, sbuf, BUF_BYTES);
        __asm__ __volatile__("" ::"r"(rbuf) : "memory");
        uint64_t t2 = zccl__now_ns();
        tg[i] = (double)(t1 - t0) * 1e-9 / GAMMA_BYTES;
        tc[i] = (double)(t2 - t1) * 1e-9 / BUF_BYTES;
    }
    v[P_GAMMA] = median(tg, 5);
    v[P_COPY] = median(tc, 5);
    if (fastest_is_cost) v[P_GAMMA] = tg[0], v[P_COPY] = tc[0]; /* median() sorted them */
    if (nl <= 1) v[P_INTRA_A] = v[P_INTRA_B] = 0; /* alone on its host: other hosts measure, MAX takes theirs */
    if (nh <= 1) v[P_INTER_A] = v[P_INTER_B] = 0;
    params_from(v, p);
out:
    free(local);
    free(heads);
    if (sbuf) munmap(sbuf, bufalloc);
    if (rbuf) munmap(rbuf, bufalloc);
    return res;
}

/* ---- cache file -------------------------------------------------------------------------------------------- */

static const char *intra_link_name(struct zccl_comm *comm) {
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank && comm->tc.peers[r].host_hash == comm->tc.peers[comm->rank].host_hash)
            return comm->tc.tp[r]->link == ZCCL_LINK_MEMORY ? "intra-shm" : "intra-tcp";
    return NULL;
}

/* Reads this host's entries; *have is true when every link this rank needs is there. */
static void cache_read(struct zccl_comm *comm, const char *path, const char *host, zccl_tune_params_t *p, bool *have) {
    *have = false;
    FILE *f = fopen(path, "r");
    if (!f) return;
    const char *intra = intra_link_name(comm);
    const bool need_inter = comm->tuner->L.nhosts > 1;
    bool got_intra = !intra, got_inter = !need_inter, got_g = false, got_c = false;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char h[256], link[32];
        double a, b;
        if (line[0] == '#' || sscanf(line, "%255s %31s %lf %lf", h, link, &a, &b) != 4) continue;
        if (strcmp(h, host) || !(a >= 0) || !(b > 0) || !isfinite(a) || !isfinite(b)) continue;
        const zccl_link_cost_t l = {a * 1e-6, b * 1e-9};
        if (intra && !strcmp(link, intra)) p->intra = l, got_intra = true;
        else if (!strcmp(link, "inter-tcp") && need_inter) p->inter = l, got_inter = true;
        else if (!strcmp(link, "gamma")) p->gamma = l.beta, got_g = true;
        else if (!strcmp(link, "copy")) p->copy = l.beta, got_c = true;
    }
    fclose(f);
    *have = got_intra && got_inter && got_g && got_c;
}

static void cache_write(struct zccl_comm *comm, const char *path, const char *host, const zccl_tune_params_t *p) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *out = fopen(tmp, "w");
    if (!out) {
        ZCCL_WARN(ZCCL_LOG_TUNE, "ZCCL_TUNER_CACHE=%s: cannot write %s: %s (calibration not cached)", path, tmp,
                  strerror(errno));
        return;
    }
    const char *intra = intra_link_name(comm);
    fprintf(out, "# zccl tuner cache: HOST LINK ALPHA_US BETA_NS_PER_BYTE (see docs/tuning.md)\n");
    FILE *in = fopen(path, "r");
    if (in) { /* keep other hosts' lines, and ours for links this communicator did not measure */
        char line[512];
        while (fgets(line, sizeof line, in)) {
            char h[256], link[32];
            if (line[0] == '#' || sscanf(line, "%255s %31s", h, link) != 2) continue;
            if (!strcmp(h, host) && ((intra && !strcmp(link, intra)) || !strcmp(link, "gamma") ||
                                     !strcmp(link, "copy") || (comm->tuner->L.nhosts > 1 && !strcmp(link, "inter-tcp"))))
                continue;
            fputs(line, out);
        }
        fclose(in);
    }
    if (intra) fprintf(out, "%s %s %.4f %.6f\n", host, intra, p->intra.alpha * 1e6, p->intra.beta * 1e9);
    if (comm->tuner->L.nhosts > 1)
        fprintf(out, "%s inter-tcp %.4f %.6f\n", host, p->inter.alpha * 1e6, p->inter.beta * 1e9);
    fprintf(out, "%s gamma 0 %.6f\n", host, p->gamma * 1e9);
    fprintf(out, "%s copy 0 %.6f\n", host, p->copy * 1e9);
    if (fclose(out) != 0 || rename(tmp, path) != 0) {
        ZCCL_WARN(ZCCL_LOG_TUNE, "ZCCL_TUNER_CACHE=%s: cannot replace it: %s (calibration not cached)", path,
                  strerror(errno));
        unlink(tmp);
    }
}

/* The single copy or the slots, per collective, from the agreed ratios (cma_against_slots): the all-reduce by its own,
 * reduce-scatter and reduce by the reduce-scatter's, every other collective (all-gather, broadcast, all-to-all,
 * gather, scatter, send/recv: copies, no reduction) by the all-gather's; the single copy where its ratio is at most
 * CMA_SLOWER. Set here for all; zccl__tune switches it before each call where the collectives differ. */
static void cma_choose(struct zccl_comm *comm, zccl_tuner_t *t, const double worst[CMA_N]) {
    for (int c = 0; c < ZCCL_COLL_COUNT; c++) {
        const int k = c == ZCCL_COLL_ALLREDUCE ? CMA_AR
                      : (c == ZCCL_COLL_REDUCE_SCATTER || c == ZCCL_COLL_REDUCE) ? CMA_RS : CMA_AG;
        t->cma_on[c] = worst[k] <= CMA_SLOWER;
        t->cma_per_call |= t->cma_on[c] != t->cma_on[0];
    }
    zccl__shm_single_copy(&comm->tc, t->cma_on[ZCCL_COLL_ALLREDUCE]); /* every call's, when they agree */
    if (comm->rank == 0) {
        const char *path[2] = {"the slots", "the single copy"};
        ZCCL_INFO(ZCCL_LOG_TUNE, "tuner: the single copy (process_vm_readv) took %.2fx, %.2fx and %.2fx the slots' "
                  "time for a %u KiB ring all-reduce, reduce-scatter and all-gather on this machine: shared memory "
                  "uses %s for all-reduce, %s for reduce-scatter and reduce, %s for the other collectives "
                  "(ZCCL_SHM_CMA=0 or 1 sets one path for all)", worst[CMA_AR], worst[CMA_RS], worst[CMA_AG],
                  CMA_PROBE_BYTES >> 10, path[t->cma_on[ZCCL_COLL_ALLREDUCE]],
                  path[t->cma_on[ZCCL_COLL_REDUCE_SCATTER]], path[t->cma_on[ZCCL_COLL_ALLGATHER]]);
    }
}

zccl_result_t zccl__tuner_calibrate(struct zccl_comm *comm) {
    zccl_tuner_t *t = comm->tuner;
    if (comm->nranks <= 1) {
        zccl__tune_forget(t);
        t->agreed = true;
        return ZCCL_SUCCESS;
    }
    const uint64_t t0 = zccl__now_ns();
    int64_t calibrate = 1;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_TUNER_CALIBRATE, &calibrate));
    /* A measurement differs from run to run, and so would a choice between two algorithms of close cost (zero_train's
     * 20 KiB all-reduce: recdbl 67 us against direct 83 us), hence the order of the sum and the last bit of a float
     * result. ZCCL_DETERMINISTIC takes the measurement out of the choice. */
    int64_t deterministic = 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_DETERMINISTIC, &deterministic));
    if (deterministic) calibrate = 0;
    const char *cache = zccl__cfg_str(ZCCL_CFG_TUNER_CACHE);
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    for (char *c = host; *c; c++)
        if (*c == ' ' || *c == '\t' || *c == '\n') *c = '_';
    zccl_tune_params_t p = t->p;
    double cma_ratio[CMA_N] = {0}; /* single copy's time over the slots' at CMA_PROBE_BYTES; 0: not measured */
    int64_t have = 0, all_have = 0;
    if (*cache) {
        bool h;
        cache_read(comm, cache, host, &p, &h);
        have = h;
    }
    /* Agree on whether anyone must measure: measuring is collective. */
    ZCCL_CHECK(zccl_allreduce(&have, &all_have, 1, ZCCL_INT64, ZCCL_MIN, comm, NULL));
    if (*cache && all_have) {
        snprintf(t->source, sizeof t->source, "cache");
    } else if (calibrate) {
        ZCCL_CHECK(measure(comm, &p, cma_ratio));
        snprintf(t->source, sizeof t->source, "calibrated");
    } else {
        zccl__tune_defaults(&p);
    }
    ZCCL_CHECK(zccl__tuner_agree(comm, &p, zccl__algo_filter_hash(&t->filter), "ZCCL_ALGO"));
    if (calibrate && !(*cache && all_have)) { /* every rank measured: agree on the slowest host's ratios */
        double worst[CMA_N];
        ZCCL_CHECK(zccl_allreduce(cma_ratio, worst, CMA_N, ZCCL_FLOAT64, ZCCL_MAX, comm, NULL));
        if (worst[CMA_AR] > 0 && zccl__shm_single_copy(&comm->tc, -1) >= 0)
            cma_choose(comm, t, worst);
    }
    /* A link class nobody measured (no host with two ranks; a single host) keeps its default: same on every rank. */
    zccl_tune_params_t d;
    zccl__tune_defaults(&d);
    if (!(p.intra.alpha > 0) || !(p.intra.beta > 0)) p.intra = d.intra;
    if (!(p.inter.alpha > 0) || !(p.inter.beta > 0)) p.inter = d.inter;
    if (!(p.gamma > 0)) p.gamma = d.gamma;
    if (!(p.copy > 0)) p.copy = d.copy;
    pthread_mutex_lock(&comm->exec_mutex);
    t->p = p;
    t->agreed = true;
    zccl__tune_forget(t);
    pthread_mutex_unlock(&comm->exec_mutex);
    if (*cache && !all_have && calibrate) {
        bool first_local = true;
        for (int r = 0; r < comm->rank && first_local; r++)
            first_local = comm->tc.peers[r].host_hash != comm->tc.peers[comm->rank].host_hash;
        if (first_local) cache_write(comm, cache, host, &p);
    }
    t->calib_ms = (double)(zccl__now_ns() - t0) * 1e-6;
    if (comm->rank == 0 && t->fallback[0]) /* printed whatever ZCCL_DEBUG says: the user's setting is not obeyed */
        fprintf(stderr, "zccl: ZCCL_ALGO=%s names no algorithm that can run on this communicator (%d ranks on %d "
                "host%s) for %s; the tuner chooses among all algorithms for %s\n", zccl__cfg_str(ZCCL_CFG_ALGO),
                t->L.nranks, t->L.nhosts, t->L.nhosts == 1 ? "" : "s", t->fallback,
                strchr(t->fallback, ',') ? "them" : "it");
    if (comm->rank == 0)
        ZCCL_INFO(ZCCL_LOG_TUNE, "tuner: %s parameters%s (%.1f ms): intra-host alpha %.2f us beta %.4f ns/B (%.2f GB/s); "
                  "inter-host alpha %.2f us beta %.4f ns/B (%.2f GB/s); gamma %.4f ns/B; copy %.4f ns/B; %d ranks on %d "
                  "hosts", t->source, deterministic ? " (ZCCL_DETERMINISTIC=1: nothing measured)" : "", t->calib_ms,
                  p.intra.alpha * 1e6, p.intra.beta * 1e9, 1e-9 / p.intra.beta,
                  p.inter.alpha * 1e6, p.inter.beta * 1e9, 1e-9 / p.inter.beta, p.gamma * 1e9, p.copy * 1e9,
                  t->L.nranks, t->L.nhosts);
    return ZCCL_SUCCESS;
}

/* ---- zccl_comm_set_algo ------------------------------------------------------------------------------------- */

ZCCL_API zccl_result_t zccl_comm_set_algo(zccl_comm_t comm, const char *spec) {
    const char *fn = "zccl_comm_set_algo";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (zccl__stream_busy_with(comm))
        return zccl__error(ZCCL_INVALID_USAGE, "%s: a stream still holds unfinished operations of this communicator; "
                           "synchronize it first (the operations already queued must keep their algorithms)", fn);
    const bool from_env = !spec || !*spec;
    const char *what = from_env ? "ZCCL_ALGO" : "zccl_comm_set_algo";
    zccl_tuner_t t = *comm->tuner;
    zccl_result_t perr = zccl__algo_filter_parse(from_env ? zccl__cfg_str(ZCCL_CFG_ALGO) : spec, what, &t.filter);
    if (perr == ZCCL_SUCCESS) perr = zccl__tune_usable(&t, what);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", zccl__last_error());
    /* Collective: every rank learns whether all ranks hold the same filter before anyone switches. A rank whose
     * spec did not parse contributes a hash of its (failed) spec text, so it mismatches any rank that parsed. */
    uint64_t h = zccl__algo_filter_hash(&t.filter);
    if (perr != ZCCL_SUCCESS) {
        h = 0x9e3779b97f4a7c15ull;
        for (const char *c = spec ? spec : ""; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    }
    zccl_tune_params_t p = comm->tuner->p;
    zccl_result_t res = zccl__tuner_agree(comm, &p, h, what);
    if (perr != ZCCL_SUCCESS) return zccl__error(perr, "%s", msg);
    if (res != ZCCL_SUCCESS) return res;
    pthread_mutex_lock(&comm->exec_mutex);
    comm->tuner->filter = t.filter;
    memcpy(comm->tuner->usable, t.usable, sizeof t.usable);
    memset(comm->tuner->logged, 0, sizeof comm->tuner->logged);
    zccl__tune_forget(comm->tuner);
    pthread_mutex_unlock(&comm->exec_mutex);
    ZCCL_INFO(ZCCL_LOG_TUNE, "tuner: algorithms now restricted by %s=\"%s\"", what,
              from_env ? zccl__cfg_str(ZCCL_CFG_ALGO) : spec);
    return ZCCL_SUCCESS;
}

/*
 * bucket_check_cost — what ZCCL_BUCKET_CHECK=1 costs a gradient bucket plan (docs/zero.md, "Debugging buffer
 * lifetime"). One micro-step = begin, grad_ptr and one pass writing every gradient, mark_ready of every parameter
 * (last first), finish; no compute, so the step time is the plan's own work plus the collectives. Run it with and
 * without the setting and compare the medians:
 *
 *   ZCCL_BUCKET_CHECK=0 zcclrun -n 2 bucket_check_cost [MiB of gradients, default 64] [steps, default 20]
 *   ZCCL_BUCKET_CHECK=1 zcclrun -n 2 bucket_check_cost ...
 *
 * 64 parameters of equal size, float32, all-reduce mode, then reduce-scatter mode; prints the median step time in
 * ms of rank 0 for each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "zccl.h"
#include "zccl_zero.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const double mib = argc > 1 ? atof(argv[1]) : 64;
    const int steps = argc > 2 ? atoi(argv[2]) : 20;
    enum { NP = 64 };
    size_t numel[NP];
    for (int i = 0; i < NP; i++) numel[i] = (size_t)(mib * 1048576 / 4 / NP);
    zccl_comm_t comm;
    if (zccl_comm_init_env(&comm) != ZCCL_SUCCESS) {
        fprintf(stderr, "init: %s\n", zccl_get_last_error(NULL));
        return 1;
    }
    int rank;
    zccl_comm_rank(comm, &rank);
    const char *check = getenv("ZCCL_BUCKET_CHECK");
    for (int mode = 0; mode < 2; mode++) {
        zccl_bucket_options_t o = {0};
        o.mode = mode ? ZCCL_BUCKET_REDUCE_SCATTER : ZCCL_BUCKET_ALLREDUCE;
        zccl_bucket_plan_t plan;
        if (zccl_bucket_plan_create(comm, NP, numel, ZCCL_FLOAT32, &o, &plan) != ZCCL_SUCCESS) {
            fprintf(stderr, "plan: %s\n", zccl_get_last_error(comm));
            return 1;
        }
        double *t = calloc((size_t)steps, sizeof *t);
        for (int s = 0; s < steps + 2; s++) {
            double t0 = now_ms();
            zccl_bucket_begin(plan, 1);
            for (int i = NP - 1; i >= 0; i--) {
                float *g;
                if (zccl_bucket_grad_ptr(plan, i, (void **)&g) != ZCCL_SUCCESS) return 2;
                for (size_t e = 0; e < numel[i]; e++) g[e] += 1.0f;
                zccl_bucket_mark_ready(plan, i);
            }
            if (zccl_bucket_finish(plan) != ZCCL_SUCCESS) {
                fprintf(stderr, "finish: %s\n", zccl_get_last_error(comm));
                return 3;
            }
            if (s >= 2) t[s - 2] = now_ms() - t0;
        }
        qsort(t, (size_t)steps, sizeof *t, cmp);
        if (rank == 0)
            printf("%s mode, %.0f MiB of gradients, ZCCL_BUCKET_CHECK=%s: median step %.2f ms (min %.2f)\n",
                   mode ? "reduce-scatter" : "all-reduce", mib, check ? check : "0", t[steps / 2], t[0]);
        free(t);
        zccl_bucket_plan_destroy(plan);
    }
    zccl_comm_destroy(comm);
    return 0;
}

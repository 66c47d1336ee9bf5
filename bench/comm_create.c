/*
 * comm_create — how long creating a communicator takes (docs/performance.md, "Creating a communicator"): the
 * first one from the launcher's environment, then N splits of it over the same ranks (each a full creation:
 * bootstrap root, transports, the init barrier, the tuner's calibration, the warm-up all-reduce), each destroyed
 * before the next. Rank 0 prints every split's time and their median, in ms.
 *
 *   zcclrun -n 2 build/bench/comm_create [N, default 5]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "zccl.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 5;
    if (n < 1 || n > 1000) {
        fprintf(stderr, "usage: comm_create [N: splits to time, 1..1000]\n");
        return 2;
    }
    zccl_comm_t comm;
    const double t0 = now_ms();
    if (zccl_comm_init_env(&comm) != ZCCL_SUCCESS) {
        fprintf(stderr, "comm_create: zccl_comm_init_env: %s\n", zccl_get_last_error(NULL));
        return 1;
    }
    const double t_init = now_ms() - t0;
    int rank, size;
    zccl_comm_rank(comm, &rank);
    zccl_comm_count(comm, &size);
    double *ms = malloc((size_t)n * sizeof *ms);
    if (!ms) return 1;
    for (int i = 0; i < n; i++) {
        zccl_comm_t c;
        const double a = now_ms();
        if (zccl_comm_split(comm, 0, rank, &c) != ZCCL_SUCCESS) {
            fprintf(stderr, "comm_create: rank %d: zccl_comm_split: %s\n", rank, zccl_get_last_error(comm));
            zccl_comm_abort(comm);
            return 1;
        }
        ms[i] = now_ms() - a;
        zccl_comm_destroy(c);
    }
    if (rank == 0) {
        printf("# %d ranks: first communicator %.1f ms; splits (ms):", size, t_init);
        for (int i = 0; i < n; i++) printf(" %.1f", ms[i]);
        qsort(ms, (size_t)n, sizeof *ms, cmp);
        printf("; median %.1f ms\n", ms[n / 2]);
    }
    free(ms);
    zccl_comm_destroy(comm);
    return 0;
}

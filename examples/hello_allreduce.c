/*
 * hello_allreduce.c — the smallest zccl program: every rank averages a vector in place.
 *
 *   build/tools/zcclrun -n 4 build/examples/hello_allreduce
 *
 * Rank r starts with grad[i] = i + 1 + r, so after ZCCL_AVG every rank holds i + 1 + (n-1)/2.
 */
#include <math.h>
#include <stdio.h>
#include <zccl.h>

int main(void) {
    zccl_comm_t comm;
    zccl_result_t res = zccl_comm_init_env(&comm); /* RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher */
    if (res != ZCCL_SUCCESS) {
        fprintf(stderr, "zccl_comm_init_env: %s: %s\n", zccl_get_error_string(res), zccl_get_last_error(NULL));
        return 1;
    }
    int rank, n;
    zccl_comm_rank(comm, &rank);
    zccl_comm_count(comm, &n);
    float grad[4];
    for (int i = 0; i < 4; i++) grad[i] = (float)(i + 1 + rank);
    res = zccl_allreduce(grad, grad, 4, ZCCL_FLOAT32, ZCCL_AVG, comm, NULL); /* in place, blocking */
    if (res != ZCCL_SUCCESS) {
        fprintf(stderr, "rank %d: zccl_allreduce: %s\n", rank, zccl_get_last_error(comm));
        zccl_comm_abort(comm);
        return 1;
    }
    int wrong = 0;
    for (int i = 0; i < 4; i++) wrong += fabsf(grad[i] - (float)(i + 1 + (n - 1) / 2.0)) > 1e-6f;
    printf("rank %d of %d: %g %g %g %g%s\n", rank, n, grad[0], grad[1], grad[2], grad[3], wrong ? "  WRONG" : "");
    zccl_comm_destroy(comm);
    return wrong ? 2 : 0;
}

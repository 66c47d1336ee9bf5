/*
 * mesh_check.c — builds a dp x tp mesh (include/zccl_mesh.h) over every rank and checks it: each tp group's ranks
 * share a hostname, each dp group's ranks have distinct hostnames when the job spans as many hosts as dp's size, each
 * group is the ranks the layout rule names (ranks placed in blocks per host, as zcclrun --hosts/--hostfile does),
 * and an all-reduce of the world ranks in each group gives their sum. With a shape that must be refused, it checks
 * that every rank refuses it with ZCCL_INVALID_ARGUMENT naming the shape. Used by tests/netns/mesh_hosts.sh.
 *
 *   zcclrun -n 8 build/examples/mesh_check 2 4          # dp=2 x tp=4: prints "mesh_check: OK" per rank
 *   zcclrun -n 8 build/examples/mesh_check 3 3 refuse   # every rank: "mesh_check: refused as expected: ..."
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zccl.h>
#include <zccl_mesh.h>

#define HOSTLEN 64

static int fail(int rank, const char *what, zccl_comm_t c) {
    fprintf(stderr, "rank %d: mesh_check: FAIL: %s: %s\n", rank, what, zccl_get_last_error(c));
    return 1;
}

/* The world ranks and hostnames of this rank's group along `name`; checks the group against `want[]`. */
static int check_dim(zccl_mesh_t mesh, const char *name, int rank, const int *want, int size, int same_host,
                     int distinct_hosts) {
    zccl_comm_t c;
    int n = 0;
    if (zccl_mesh_comm(mesh, name, &c) != ZCCL_SUCCESS || zccl_comm_count(c, &n) != ZCCL_SUCCESS || n != size)
        return fail(rank, name, NULL);
    struct { int64_t rank; char host[HOSTLEN]; } me = {rank, {0}}, *all = calloc((size_t)n, sizeof me);
    gethostname(me.host, HOSTLEN - 1);
    if (!all || zccl_allgather(&me, all, sizeof me, ZCCL_UINT8, c, NULL) != ZCCL_SUCCESS) return fail(rank, name, c);
    int64_t sum = rank, want_sum = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        want_sum += want[i];
        if (all[i].rank != want[i]) bad = 1;
        if (same_host && strcmp(all[i].host, all[0].host)) bad = 2;
        for (int j = 0; j < i && distinct_hosts; j++)
            if (!strcmp(all[i].host, all[j].host)) bad = 3;
    }
    if (zccl_allreduce(&sum, &sum, 1, ZCCL_INT64, ZCCL_SUM, c, NULL) != ZCCL_SUCCESS) return fail(rank, name, c);
    if (bad || sum != want_sum) {
        fprintf(stderr, "rank %d: mesh_check: FAIL: %s group: %s (all-reduce %lld, want %lld)\n", rank, name,
                bad == 1 ? "members differ from the layout rule" : bad == 2 ? "spans hosts" :
                bad == 3 ? "two members on one host" : "wrong sum", (long long)sum, (long long)want_sum);
        return 1;
    }
    printf("rank %d host %s: %s group of %d:", rank, me.host, name, n);
    for (int i = 0; i < n; i++) printf(" %lld@%s", (long long)all[i].rank, all[i].host);
    printf("\n");
    free(all);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: mesh_check DP TP [refuse]\n");
        return 2;
    }
    const int sizes[2] = {atoi(argv[1]), atoi(argv[2])}, refuse = argc > 3 && !strcmp(argv[3], "refuse");
    const char *names[2] = {"dp", "tp"};
    zccl_comm_t comm;
    if (zccl_comm_init_env(&comm) != ZCCL_SUCCESS) return fail(-1, "zccl_comm_init_env", NULL);
    int rank, n;
    zccl_comm_rank(comm, &rank);
    zccl_comm_count(comm, &n);
    zccl_mesh_t mesh;
    zccl_result_t res = zccl_mesh_create(comm, 2, names, sizes, 0, &mesh);
    int rc = 0;
    if (refuse) {
        char shape[64];
        snprintf(shape, sizeof shape, "dp=%d x tp=%d", sizes[0], sizes[1]);
        if (res != ZCCL_INVALID_ARGUMENT || !strstr(zccl_get_last_error(comm), shape)) {
            rc = fail(rank, "the shape was not refused naming it", comm);
        } else {
            printf("rank %d: mesh_check: refused as expected: %s\n", rank, zccl_get_last_error(comm));
        }
    } else if (res != ZCCL_SUCCESS) {
        rc = fail(rank, "zccl_mesh_create", comm);
    } else {
        /* Ranks in blocks per host: mesh position = rank, dp = rank / tp, tp = rank % tp. */
        const int dp = rank / sizes[1], tp = rank % sizes[1];
        int want_tp[256], want_dp[256];
        for (int k = 0; k < sizes[1] && k < 256; k++) want_tp[k] = dp * sizes[1] + k;
        for (int k = 0; k < sizes[0] && k < 256; k++) want_dp[k] = k * sizes[1] + tp;
        rc = check_dim(mesh, "tp", rank, want_tp, sizes[1], 1, 0) ||
             check_dim(mesh, "dp", rank, want_dp, sizes[0], 0, getenv("MESH_DP_ACROSS") != NULL);
        zccl_mesh_destroy(mesh);
        if (!rc) printf("rank %d: mesh_check: OK\n", rank);
    }
    zccl_comm_destroy(comm);
    (void)n;
    return rc;
}

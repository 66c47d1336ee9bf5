/*
 * coll_a2a.c — public entry points of all-to-all, all-to-allv, gather and scatter: argument validation (every
 * failure names the argument), then an operation that runs the direct schedules of sched/sched_alltoall.c.
 */
#include <stdlib.h>
#include <string.h>
#include "api.h"

#define TRY ZCCL__TRY_OR_REFUSE

ZCCL_API zccl_result_t zccl_alltoall(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                     zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_alltoall";
    size_t total;
    zccl_op_t o = {.coll = ZCCL_COLL_ALLTOALL, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                   .dt = datatype, .op = ZCCL_SUM, .comm = comm};
    TRY(zccl__check_common(fn, comm, count, (size_t)(comm ? comm->nranks : 1), datatype, 0, ZCCL_SUM, &total));
    if (count == 0) return zccl__coll_noop(o, stream);
    TRY(zccl__check_buf(fn, "sendbuf", sendbuf));
    TRY(zccl__check_buf(fn, "recvbuf", recvbuf));
    o.in_place = sendbuf == recvbuf;
    TRY(zccl__check_overlap(fn, sendbuf, total, recvbuf, total, o.in_place));
    return zccl__api_issue(&o, stream);
}

typedef struct {
    uintptr_t lo, hi;
    bool recv;
} range_t;

static int cmp_range(const void *a, const void *b) {
    const range_t *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Received ranges must not overlap each other nor any sent range (sent ranges may overlap each other: they are
 * only read). Sorted sweep, O(n log n). */
static zccl_result_t check_ranges(const char *fn, const void *sendbuf, const size_t *sc, const size_t *sd,
                                  void *recvbuf, const size_t *rc, const size_t *rd, int n, size_t es) {
    range_t *v = malloc(2 * (size_t)n * sizeof *v);
    if (!v) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory checking %d ranges", fn, 2 * n);
    size_t k = 0;
    for (int q = 0; q < n; q++) {
        if (sc[q]) v[k++] = (range_t){(uintptr_t)sendbuf + sd[q] * es, (uintptr_t)sendbuf + (sd[q] + sc[q]) * es, false};
        if (rc[q]) v[k++] = (range_t){(uintptr_t)recvbuf + rd[q] * es, (uintptr_t)recvbuf + (rd[q] + rc[q]) * es, true};
    }
    qsort(v, k, sizeof *v, cmp_range);
    uintptr_t send_end = 0, recv_end = 0;
    zccl_result_t res = ZCCL_SUCCESS;
    for (size_t i = 0; i < k && res == ZCCL_SUCCESS; i++) {
        if (v[i].lo < recv_end || (v[i].recv && v[i].lo < send_end))
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: the received ranges (recvbuf + rdispls[q], recvcounts[q] "
                              "elements) overlap each other or a sent range; all-to-allv is not in place", fn);
        if (v[i].recv) recv_end = v[i].hi > recv_end ? v[i].hi : recv_end;
        else send_end = v[i].hi > send_end ? v[i].hi : send_end;
    }
    free(v);
    return res;
}

ZCCL_API zccl_result_t zccl_alltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                                      void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                                      zccl_datatype_t datatype, zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_alltoallv";
    size_t bytes;
    ZCCL_CHECK(zccl__check_common(fn, comm, 0, 1, datatype, 0, ZCCL_SUM, &bytes));
    const char *names[4] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
    const size_t *arr[4] = {sendcounts, sdispls, recvcounts, rdispls};
    for (int i = 0; i < 4; i++)
        if (!arr[i]) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument '%s' is NULL", fn, names[i]);
    const int n = comm->nranks;
    const size_t es = zccl_type_size(datatype);
    size_t stotal = 0, rtotal = 0;
    for (int q = 0; q < n; q++) {
        for (int side = 0; side < 2; side++) {
            const size_t c = arr[2 * side][q], d = arr[2 * side + 1][q];
            size_t end, b;
            if (__builtin_add_overflow(c, d, &end) || !zccl__mul_ok(end, es, &b) || b > SIZE_MAX / 2)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: %s[%d] = %zu + %s[%d] = %zu elements overflows the "
                                   "address space", fn, names[2 * side + 1], q, d, names[2 * side], q, c);
        }
        stotal += sendcounts[q];
        rtotal += recvcounts[q];
    }
    if (stotal && !sendbuf)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'sendbuf' is NULL while sendcounts are not all 0", fn);
    if (rtotal && !recvbuf)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'recvbuf' is NULL while recvcounts are not all 0", fn);
    if (recvcounts[comm->rank] != sendcounts[comm->rank])
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: sendcounts[%d] = %zu differs from recvcounts[%d] = %zu (the "
                           "block this rank sends itself)", fn, comm->rank, sendcounts[comm->rank], comm->rank,
                           recvcounts[comm->rank]);
    ZCCL_CHECK(check_ranges(fn, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, n, es));
    size_t *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory copying %d counts", fn, 4 * n);
    for (int i = 0; i < 4; i++) memcpy(v + (size_t)i * n, arr[i], (size_t)n * sizeof *v);
    zccl_op_t o = {.coll = ZCCL_COLL_ALLTOALLV, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = 0, .dt = datatype,
                   .op = ZCCL_SUM, .comm = comm, .a2av = v};
    return zccl__api_issue(&o, stream); /* the op owns v now */
}

/*
 * Gather and scatter: the root's `whole` buffer (recvbuf of a gather, sendbuf of a scatter) holds nranks blocks of
 * count elements, every rank's `block` buffer one; on the root the block may sit in place at block `root` of the
 * whole buffer. Off the root the whole buffer is not used, and the op forgets it.
 */
static zccl_result_t rooted(zccl_coll_t coll, const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                            zccl_datatype_t datatype, int root, zccl_comm_t comm, zccl_stream_t stream) {
    const bool gather = coll == ZCCL_COLL_GATHER;
    size_t total;
    zccl_op_t o = {.coll = coll, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dt = datatype,
                   .op = ZCCL_SUM, .root = root, .comm = comm};
    TRY(zccl__check_common(fn, comm, count, (size_t)(comm ? comm->nranks : 1), datatype, 0, ZCCL_SUM, &total));
    TRY(zccl__check_root(fn, "root", comm, root));
    if (count == 0) return zccl__coll_noop(o, stream);
    const size_t bbytes = total / (size_t)comm->nranks;
    const char *block = gather ? sendbuf : recvbuf, *whole = gather ? recvbuf : sendbuf;
    TRY(zccl__check_buf(fn, gather ? "sendbuf" : "recvbuf", block));
    if (comm->rank == root) {
        TRY(zccl__check_buf(fn, gather ? "recvbuf" : "sendbuf", whole));
        o.in_place = block == whole + (size_t)root * bbytes;
        TRY(zccl__check_overlap(fn, sendbuf, gather ? bbytes : total, recvbuf, gather ? total : bbytes, o.in_place));
    } else if (gather) {
        o.recvbuf = NULL;
    } else {
        o.sendbuf = NULL;
    }
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_gather(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                   int root, zccl_comm_t comm, zccl_stream_t stream) {
    return rooted(ZCCL_COLL_GATHER, "zccl_gather", sendbuf, recvbuf, count, datatype, root, comm, stream);
}

ZCCL_API zccl_result_t zccl_scatter(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                    int root, zccl_comm_t comm, zccl_stream_t stream) {
    return rooted(ZCCL_COLL_SCATTER, "zccl_scatter", sendbuf, recvbuf, count, datatype, root, comm, stream);
}

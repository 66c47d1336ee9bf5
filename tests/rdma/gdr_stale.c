/*
 * gdr_stale.c — a device buffer freed while registered for GPUDirect RDMA (issue 24; docs/gpu.md "The registration
 * cache"). Run under zcclrun in the soft-RoCE VM by vm_gdr.sh, with the fake CUDA driver (ZCCL_CUDA_LIBRARY) and
 * FAKE_CUDA_REUSE_FREED=1, so that a freed allocation's address comes back from the next cuMemAlloc of its size
 * with other pages behind it (the NIC's registration of the old allocation still holds the old pages).
 *
 * Every rank allocates one device buffer (send half, receive half) and all-reduces it (the GDR path registers the
 * allocation with the NIC); then rank 0 frees it and allocates again — the same address — and every rank
 * all-reduces again with new inputs: the results must be exact (a stale registration would let the NIC read rank
 * 0's old inputs and write its result into the freed pages). Last, rank 0 frees the buffer and calls with the freed
 * pointer: every rank must fail that call (rank 0 with ZCCL_INVALID_ARGUMENT naming the buffer), none succeed.
 * Prints "gdr_stale: rank R ok" or "gdr_stale: rank R FAIL ..." and exits 0 or 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zccl.h"

#define COUNT 65536 /* floats per half: 256 KiB, several pages */

static int rank_ = -1;

static int fail(const char *what, const char *detail) {
    printf("gdr_stale: rank %d FAIL %s: %s\n", rank_, what, detail ? detail : "");
    fflush(stdout);
    return 1;
}

static float in(int rank, size_t j, int round) { return (float)((int)(j % 89) - 30 + 7 * rank + 100 * round); }

/* One all-reduce of round `round` on buf (send half, receive half): exact sums of every rank's inputs. */
static int round_ok(zccl_comm_t comm, float *buf, int nranks, int round) {
    for (size_t j = 0; j < COUNT; j++) {
        buf[j] = in(rank_, j, round);
        buf[COUNT + j] = -1.f;
    }
    zccl_result_t r = zccl_allreduce(buf, buf + COUNT, COUNT, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL);
    if (r != ZCCL_SUCCESS) return fail("allreduce", zccl_get_last_error(NULL));
    for (size_t j = 0; j < COUNT; j++) {
        float want = 0;
        for (int q = 0; q < nranks; q++) want += in(q, j, round);
        if (buf[COUNT + j] != want) {
            char d[128];
            snprintf(d, sizeof d, "round %d: [%zu] = %g, want %g", round, j, buf[COUNT + j], want);
            return fail("wrong result", d);
        }
    }
    return 0;
}

int main(void) {
    zccl_comm_t comm = NULL;
    if (zccl_comm_init_env(&comm) != ZCCL_SUCCESS) return fail("zccl_comm_init_env", zccl_get_last_error(NULL));
    int nranks = 0;
    zccl_comm_rank(comm, &rank_);
    zccl_comm_count(comm, &nranks);
    float *buf = NULL;
    if (zccl_mem_alloc_cuda((void **)&buf, 2 * COUNT * sizeof(float)) != ZCCL_SUCCESS)
        return fail("zccl_mem_alloc_cuda", zccl_get_last_error(NULL));
    if (round_ok(comm, buf, nranks, 1)) return 1;
    if (rank_ == 0) {
        float *old = buf;
        if (zccl_mem_free_cuda(buf) != ZCCL_SUCCESS) return fail("zccl_mem_free_cuda", zccl_get_last_error(NULL));
        if (zccl_mem_alloc_cuda((void **)&buf, 2 * COUNT * sizeof(float)) != ZCCL_SUCCESS)
            return fail("zccl_mem_alloc_cuda again", zccl_get_last_error(NULL));
        if (buf != old) return fail("the fake driver did not hand the freed address back", "FAKE_CUDA_REUSE_FREED=1?");
    }
    if (round_ok(comm, buf, nranks, 2)) return 1;
    if (round_ok(comm, buf, nranks, 3)) return 1;
    if (rank_ == 0 && zccl_mem_free_cuda(buf) != ZCCL_SUCCESS)
        return fail("zccl_mem_free_cuda", zccl_get_last_error(NULL));
    const zccl_result_t r = zccl_allreduce(buf, buf + COUNT, COUNT, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL);
    const char *msg = zccl_get_last_error(NULL);
    if (r == ZCCL_SUCCESS) return fail("a call on rank 0's freed buffer succeeded here", "");
    if (!strstr(msg, "is not device memory that is allocated (freed while registered?)"))
        return fail("the error does not name the cause", msg);
    char addr[32];
    snprintf(addr, sizeof addr, "%p", (void *)buf);
    if (rank_ == 0 && (r != ZCCL_INVALID_ARGUMENT || !strstr(msg, addr)))
        return fail("rank 0's error is not ZCCL_INVALID_ARGUMENT naming the buffer", msg);
    printf("gdr_stale: rank %d ok (%s)\n", rank_, msg);
    fflush(stdout);
    zccl_comm_abort(comm);
    return 0;
}

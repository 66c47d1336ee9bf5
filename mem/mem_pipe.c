/*
 * mem_pipe.c — pipelined staging's device side (mem_pipe.h): two CUDA streams per communicator (OUT: device to host,
 * IN: host to device and the reductions of received chunks), events as tickets, and a device bounce ring for the
 * reductions. The engine (lib/core/engine_stage.c) decides what to queue and when; this file only queues, polls and
 * drains. A copy engine per direction is what a GPU has (PCIe is full duplex), so the OUT and IN lanes overlap each
 * other and the wire.
 */
#include <stdlib.h>
#include <string.h>
#include "mem_pipe.h"
#include "cuda_drv.h"

typedef struct zccl_mem_pipe {
    CUstream lane[2];
    CUevent *ev;              /* one event per ticket, reused phase after phase */
    size_t nev, used;
    void *ring;               /* IN lane's bounce slots (device memory) */
    size_t slot_bytes, slots, next_slot;
} zccl_mem_pipe_t;

static zccl_result_t drv_err(const char *what, CUresult r) {
    return zccl__error(ZCCL_SYSTEM_ERROR, "pipelined staging: %s failed: %s", what, zccl__cuda_errstr(r));
}

bool zccl__mem_pipe_usable(zccl_mem_type_t t, const char **why) {
    if (t != ZCCL_MEM_CUDA) { *why = "not CUDA memory"; return false; }
    const zccl_cuda_drv_t *d = zccl__cuda_drv(why);
    if (!d) return false;
    if (!d->cuEventCreate || !d->cuEventRecord || !d->cuEventQuery || !d->cuEventDestroy) {
        *why = "the CUDA driver library lacks events (cuEventCreate/Record/Query/Destroy_v2)";
        return false;
    }
    if (!zccl__mem_cuda_built()) { *why = "this libzccl has no CUDA kernels"; return false; }
    return true;
}

zccl_result_t zccl__mem_pipe_phase(zccl_mem_stage_t *st, zccl_mem_type_t t, size_t tickets, size_t chunk,
                                   size_t depth) {
    const char *why = NULL;
    if (!zccl__mem_pipe_usable(t, &why))
        return zccl__error(ZCCL_INTERNAL_ERROR, "pipelined staging unusable: %s", why);
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    ZCCL_CHECK(zccl__cuda_ctx(d));
    if (!st->pipe) {
        st->pipe = calloc(1, sizeof *st->pipe);
        if (!st->pipe) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the staging pipe");
    }
    zccl_mem_pipe_t *p = st->pipe;
    for (int l = 0; l < 2; l++)
        if (!p->lane[l]) {
            CUresult r = d->cuStreamCreate(&p->lane[l], ZCU_STREAM_NON_BLOCKING);
            if (r != ZCU_SUCCESS) { p->lane[l] = NULL; return drv_err("cuStreamCreate", r); }
        }
    if (tickets > p->nev) {
        CUevent *ne = realloc(p->ev, tickets * sizeof *ne);
        if (!ne) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %zu staging events", tickets);
        p->ev = ne;
        for (; p->nev < tickets; p->nev++) {
            CUresult r = d->cuEventCreate(&p->ev[p->nev], ZCU_EVENT_DISABLE_TIMING);
            if (r != ZCU_SUCCESS) return drv_err("cuEventCreate", r);
        }
    }
    p->used = 0;
    if (depth && chunk && (p->slot_bytes < chunk || p->slots < depth)) {
        if (p->ring) zccl__mem_cuda.free(p->ring);
        p->ring = NULL;
        p->slot_bytes = p->slots = 0;
        const size_t sb = (chunk + 255) & ~(size_t)255; /* slots 256-byte aligned: the kernels' vector loads */
        ZCCL_CHECK(zccl__mem_cuda.alloc(&p->ring, sb * depth));
        p->slot_bytes = sb;
        p->slots = depth;
    }
    p->next_slot = 0;
    return ZCCL_SUCCESS;
}

static zccl_result_t record(zccl_mem_pipe_t *p, const zccl_cuda_drv_t *d, int lane, size_t *ticket) {
    if (p->used >= p->nev)
        return zccl__error(ZCCL_INTERNAL_ERROR, "pipelined staging: more than the %zu tickets asked for", p->nev);
    CUresult r = d->cuEventRecord(p->ev[p->used], p->lane[lane]);
    if (r != ZCU_SUCCESS) return drv_err("cuEventRecord", r);
    *ticket = p->used++;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__mem_pipe_copy(zccl_mem_stage_t *st, int lane, void *dst, const void *src, size_t bytes,
                                  size_t *ticket) {
    zccl_mem_pipe_t *p = st->pipe;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (bytes) {
        CUresult r = d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, p->lane[lane]);
        if (r != ZCU_SUCCESS) return drv_err("cuMemcpyAsync", r);
        st->stage_copies++;
    }
    return record(p, d, lane, ticket);
}

zccl_result_t zccl__mem_pipe_reduce_in(zccl_mem_stage_t *st, void *dst, const void *op2, const void *host,
                                       size_t bytes, zccl_datatype_t dt, zccl_redop_t op, uint32_t divisor,
                                       size_t *ticket) {
    zccl_mem_pipe_t *p = st->pipe;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (bytes > p->slot_bytes || !p->slots)
        return zccl__error(ZCCL_INTERNAL_ERROR, "pipelined staging: a chunk of %zu bytes exceeds its %zu-byte slot",
                           bytes, p->slot_bytes);
    if (bytes) {
        uint8_t *slot = (uint8_t *)p->ring + p->slot_bytes * (p->next_slot++ % p->slots);
        CUresult r = d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)slot, (CUdeviceptr)(uintptr_t)host, bytes,
                                      p->lane[ZCCL_PIPE_IN]);
        if (r != ZCU_SUCCESS) return drv_err("cuMemcpyAsync", r);
        st->stage_copies++;
        ZCCL_CHECK(zccl__mem_cuda_reduce_on(p->lane[ZCCL_PIPE_IN], dst, op2, slot, bytes / zccl_type_size(dt), dt, op,
                                            divisor));
    }
    return record(p, d, ZCCL_PIPE_IN, ticket);
}

zccl_result_t zccl__mem_pipe_done(zccl_mem_stage_t *st, size_t ticket, bool *done) {
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    CUresult r = d->cuEventQuery(st->pipe->ev[ticket]);
    *done = r == ZCU_SUCCESS;
    if (r == ZCU_SUCCESS || r == 600 /* CUDA_ERROR_NOT_READY */) return ZCCL_SUCCESS;
    return drv_err("a staging copy or reduction on the GPU (cuEventQuery)", r);
}

zccl_result_t zccl__mem_pipe_drain(zccl_mem_stage_t *st) {
    zccl_mem_pipe_t *p = st->pipe;
    if (!p) return ZCCL_SUCCESS;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    zccl_result_t res = ZCCL_SUCCESS;
    for (int l = 0; l < 2; l++) {
        if (!p->lane[l]) continue;
        CUresult r = d->cuStreamSynchronize(p->lane[l]);
        if (r != ZCU_SUCCESS && res == ZCCL_SUCCESS) res = drv_err("waiting for the staging copies (cuStreamSynchronize)", r);
    }
    return res;
}

void zccl__mem_pipe_free(zccl_mem_stage_t *st) {
    zccl_mem_pipe_t *p = st->pipe;
    if (!p) return;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    (void)zccl__mem_pipe_drain(st);
    if (d) {
        for (size_t i = 0; i < p->nev; i++) d->cuEventDestroy(p->ev[i]);
        for (int l = 0; l < 2; l++)
            if (p->lane[l] && d->cuStreamDestroy) d->cuStreamDestroy(p->lane[l]);
    }
    if (p->ring) zccl__mem_cuda.free(p->ring);
    free(p->ev);
    free(p);
    st->pipe = NULL;
}

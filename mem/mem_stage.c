/*
 * mem_stage.c — staging for calls on device memory (mem.h: zccl_mem_stage_t). The transports move host bytes only
 * (GPUDirect is not used yet; CUDA IPC only for registered buffers, regmem.c), so a device call's sends are copied out to
 * host memory (page-locked when the driver allows: cuMemAllocHost) before their
 * phase and its receives land in host memory and enter the device buffer when they complete.
 */
#include <stdlib.h>
#include "mem.h"
#include "mem_pipe.h"

zccl_result_t zccl__mem_stage_scratch(zccl_mem_stage_t *st, zccl_mem_type_t t, size_t bytes, void **out) {
    if (st->scratch && st->scratch_type == t && st->scratch_bytes >= bytes) {
        *out = st->scratch;
        return ZCCL_SUCCESS;
    }
    if (st->scratch) zccl__mem_ops(st->scratch_type)->free(st->scratch);
    st->scratch = NULL;
    st->scratch_bytes = 0;
    const size_t sz = (bytes + 4095) & ~(size_t)4095;
    ZCCL_CHECK(zccl__mem_ops(t)->alloc(&st->scratch, sz));
    st->scratch_type = t;
    st->scratch_bytes = sz;
    *out = st->scratch;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__mem_stage_direct(zccl_mem_stage_t *st, zccl_mem_type_t t, size_t bytes, void **out) {
    if (!st->direct || st->direct_type != t || st->direct_bytes < bytes) {
        if (st->direct) zccl__mem_ops(st->direct_type)->free(st->direct);
        st->direct = NULL;
        st->direct_bytes = 0;
        const size_t sz = (bytes + 4095) & ~(size_t)4095;
        ZCCL_CHECK(zccl__mem_ops(t)->alloc(&st->direct, sz));
        st->direct_type = t;
        st->direct_bytes = sz;
    }
    *out = st->direct;
    return ZCCL_SUCCESS;
}

void zccl__mem_stage_phase(zccl_mem_stage_t *st) {
    for (size_t i = 0; i < st->nspill; i++) free(st->spill[i]);
    free(st->spill);
    st->spill = NULL;
    st->nspill = 0;
    st->host_used = 0;
}

/* The staging block's allocator: only device calls stage, so the CUDA table's pinned host memory when it has one. */
static zccl_result_t stage_host_alloc(void **p, size_t bytes) {
    return zccl__mem_cuda.alloc_host ? zccl__mem_cuda.alloc_host(p, bytes) : zccl__mem_host.alloc(p, bytes);
}
static void stage_host_free(void *p) {
    if (zccl__mem_cuda.free_host) zccl__mem_cuda.free_host(p);
    else zccl__mem_host.free(p);
}

zccl_result_t zccl__mem_stage_host(zccl_mem_stage_t *st, size_t bytes, uint8_t **out) {
    bytes = (bytes + 63) & ~(size_t)63; /* each transfer's bytes on their own cache lines */
    if (st->host_used == 0 && st->host_bytes < st->host_want) { /* a phase start: one block as large as ever asked */
        /* Page-locked when the driver gives it (cuMemAllocHost; pageable otherwise): the device copies into and
         * out of it run at the bus's speed instead of through the driver's own bounce buffers. */
        stage_host_free(st->host);
        st->host = NULL;
        st->host_bytes = 0;
        ZCCL_CHECK(stage_host_alloc((void **)&st->host, st->host_want));
        st->host_bytes = st->host_want;
    }
    if (st->host_used + bytes <= st->host_bytes) {
        *out = st->host + st->host_used;
        st->host_used += bytes;
        if (st->host_used > st->host_want) st->host_want = st->host_used;
        return ZCCL_SUCCESS;
    }
    /* Out of room in the middle of a phase: a block of its own for this transfer (earlier ones keep theirs). */
    st->host_used += bytes;
    if (st->host_used > st->host_want) st->host_want = st->host_used;
    uint8_t **ns = realloc(st->spill, (st->nspill + 1) * sizeof *ns);
    if (!ns) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for staging a transfer of %zu bytes", bytes);
    st->spill = ns;
    ZCCL_CHECK(zccl__mem_host.alloc((void **)&st->spill[st->nspill], bytes));
    *out = st->spill[st->nspill++];
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__mem_stage_send(zccl_mem_stage_t *st, zccl_mem_type_t t, const void *src, size_t bytes,
                                   const uint8_t **host) {
    uint8_t *h = NULL;
    ZCCL_CHECK(zccl__mem_stage_host(st, bytes, &h));
    ZCCL_CHECK(zccl__mem_ops(t)->copy(h, src, bytes));
    st->stage_copies++;
    *host = h;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__mem_stage_recv_done(zccl_mem_stage_t *st, zccl_mem_type_t t, void *dst, const void *op2,
                                        const void *host, size_t bytes, zccl_datatype_t dt, zccl_redop_t op,
                                        uint32_t divisor) {
    const zccl_mem_ops_t *m = zccl__mem_ops(t);
    if (t != ZCCL_MEM_HOST) st->stage_copies++;
    if (!op2) return m->copy(dst, host, bytes);
    if (t == ZCCL_MEM_HOST) return m->reduce(dst, op2, host, bytes / zccl_type_size(dt), dt, op, divisor);
    if (st->bounce_bytes < bytes) { /* the received operand goes to the device first, then the kernel combines */
        m->free(st->bounce);
        st->bounce = NULL;
        st->bounce_bytes = 0;
        const size_t sz = (bytes + 4095) & ~(size_t)4095;
        ZCCL_CHECK(m->alloc(&st->bounce, sz));
        st->bounce_bytes = sz;
    }
    ZCCL_CHECK(m->copy(st->bounce, host, bytes));
    return m->reduce(dst, op2, st->bounce, bytes / zccl_type_size(dt), dt, op, divisor);
}

void zccl__mem_stage_free(zccl_mem_stage_t *st) {
    zccl__mem_pipe_free(st);
    zccl__mem_stage_phase(st);
    if (st->scratch) zccl__mem_ops(st->scratch_type)->free(st->scratch);
    if (st->bounce) zccl__mem_cuda.free(st->bounce);
    if (st->direct) zccl__mem_ops(st->direct_type)->free(st->direct);
    stage_host_free(st->host);
    *st = (zccl_mem_stage_t){0};
}

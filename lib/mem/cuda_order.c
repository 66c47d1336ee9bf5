/*
 * cuda_order.c — stream order for calls on device memory that return at once (docs/gpu.md, "Stream order").
 * Host-side sequencing only, with the driver API; compiled and exercised with the fake driver, never run on a GPU.
 *
 * For a caller's CUDA stream S (one zccl_cuda_order_t per S):
 *   issue (API thread, returns at once): record event `ready` on S (the inputs are written once S reaches it), then
 *     queue on S a wait until the pinned host word `flag` reaches this call's ticket (cuStreamWaitValue32, GEQ), so
 *     S's later work waits for the collective without a host thread blocking.
 *   begin (zccl's progress thread): wait until `ready` has fired, then run the collective (copies and kernels on the
 *     memory layer's internal stream, synchronised before the engine hands bytes on).
 *   end (progress thread, after the collective's last device operation completed): store the ticket in `flag`
 *     (release), which lets S continue.
 * Tickets grow by one per call on S; the flag only grows, so a wait for ticket t is satisfied by any later end.
 * Calls on one S complete in order (zccl streams run their operations in order), so one `ready` event per S is
 * enough: re-recording it for a later call makes an earlier begin wait at most until the later point of S, which is
 * still correct (stricter), and never shorter.
 */
#include <stdlib.h>
#include <time.h>
#include "mem.h"
#include "cuda_drv.h"

struct zccl_cuda_order {
    CUstream user;           /* the caller's stream */
    CUevent ready;           /* recorded on `user` at each issue */
    volatile uint32_t *flag; /* pinned host word: the last ticket completed */
    CUdeviceptr flag_dev;    /* its device address, for cuStreamWaitValue32 */
    uint32_t issued;         /* tickets handed out */
};

static zccl_result_t drv_err(const char *what, CUresult r) {
    return zccl__error(ZCCL_SYSTEM_ERROR, "stream order on the caller's CUDA stream: %s failed: %s", what,
                       zccl__cuda_errstr(r));
}

zccl_result_t zccl__cuda_order_create(void *user_stream, zccl_cuda_order_t **out) {
    const char *why = NULL;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(&why);
    *out = NULL;
    if (!d) return zccl__error(ZCCL_INVALID_USAGE, "a CUDA stream was given but no CUDA driver is loaded: %s", why);
    if (!d->cuEventCreate || !d->cuEventRecord || !d->cuEventQuery || !d->cuEventDestroy || !d->cuStreamWaitValue32 ||
        !d->cuMemAllocHost || !d->cuMemFreeHost || !d->cuMemHostGetDevicePointer)
        return zccl__error(ZCCL_INVALID_USAGE, "this CUDA driver lacks events or stream memory operations "
                           "(cuStreamWaitValue32_v2): stream-ordered calls need a CUDA 12 driver or newer");
    ZCCL_CHECK(zccl__cuda_ctx(d));
    zccl_cuda_order_t *o = calloc(1, sizeof *o);
    if (!o) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a CUDA stream's order state");
    o->user = (CUstream)user_stream;
    void *h = NULL;
    CUresult r = d->cuEventCreate(&o->ready, ZCU_EVENT_DISABLE_TIMING);
    if (r != ZCU_SUCCESS) { free(o); return drv_err("cuEventCreate", r); }
    if ((r = d->cuMemAllocHost(&h, 64)) != ZCU_SUCCESS) {
        d->cuEventDestroy(o->ready);
        free(o);
        return drv_err("cuMemAllocHost of the completion word", r);
    }
    o->flag = h;
    *o->flag = 0;
    if ((r = d->cuMemHostGetDevicePointer(&o->flag_dev, h, 0)) != ZCU_SUCCESS) {
        d->cuMemFreeHost(h);
        d->cuEventDestroy(o->ready);
        free(o);
        return drv_err("cuMemHostGetDevicePointer of the completion word", r);
    }
    *out = o;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__cuda_order_issue(zccl_cuda_order_t *o, uint32_t *ticket) {
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!d || !o) return zccl__error(ZCCL_INTERNAL_ERROR, "stream order state missing");
    CUresult r = d->cuEventRecord(o->ready, o->user);
    if (r != ZCU_SUCCESS) return drv_err("cuEventRecord on the caller's stream", r);
    const uint32_t t = o->issued + 1;
    r = d->cuStreamWaitValue32(o->user, o->flag_dev, t, ZCU_STREAM_WAIT_VALUE_GEQ);
    if (r != ZCU_SUCCESS) return drv_err("cuStreamWaitValue32 on the caller's stream", r);
    o->issued = t;
    *ticket = t;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__cuda_order_begin(zccl_cuda_order_t *o, uint32_t ticket) {
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!d || !o) return zccl__error(ZCCL_INTERNAL_ERROR, "stream order state missing");
    ZCCL_CHECK(zccl__cuda_ctx(d));
    for (unsigned spins = 0;; spins++) {
        CUresult r = d->cuEventQuery(o->ready);
        if (r == ZCU_SUCCESS) return ZCCL_SUCCESS;
        if (r != 600 /* CUDA_ERROR_NOT_READY */)
            return zccl__error(ZCCL_SYSTEM_ERROR, "call %u on the caller's CUDA stream: the work queued before it "
                               "failed (cuEventQuery: %s)", ticket, zccl__cuda_errstr(r));
        if (spins > 1000) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

void zccl__cuda_order_end(zccl_cuda_order_t *o, uint32_t ticket) {
    __atomic_store_n(o->flag, ticket, __ATOMIC_RELEASE);
}

uint32_t zccl__cuda_order_done(const zccl_cuda_order_t *o) { return __atomic_load_n(o->flag, __ATOMIC_ACQUIRE); }

void zccl__cuda_order_destroy(zccl_cuda_order_t *o) {
    if (!o) return;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (d) {
        d->cuEventDestroy(o->ready);
        d->cuMemFreeHost((void *)o->flag);
    }
    free(o);
}

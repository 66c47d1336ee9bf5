/*
 * cuda_order.c — stream order for calls on device memory that return at once (docs/gpu.md, "Stream order"): the
 * host side of zccl_stream_create_cuda. Driver API only; exercised with the fake driver, never run on a GPU.
 *
 * For a caller's CUDA stream S (one zccl_cuda_order_t per S, one per zccl stream bound to S):
 *   issue (caller's thread, returns at once): record an event on S (the inputs are written once S reaches it), then
 *     queue on S a wait until the pinned host word `flag` reaches this call's ticket (cuStreamWaitValue32, GEQ), so
 *     S's later work waits for the collective without a host thread blocking.
 *   begin (the zccl stream's thread): wait until that call's event has fired, then run the collective (copies and
 *     kernels on the memory layer's internal stream, synchronised before the engine hands bytes on).
 *   end (same thread, after the collective, failed or not): store the ticket in `flag` (release): S continues.
 * Tickets grow by one per call on S; the flag only grows, so a wait for ticket t is satisfied by any later end.
 *
 * Each call has an event of its own (a small pool per S). One event re-recorded for every call would be wrong:
 * cuEventQuery answers for the most recent record, and when the caller issues call t+1 before call t began, t's
 * begin would wait for a point of S that lies behind t's own wait on the flag — S never gets there.
 *
 * While such waits are queued, nothing on zccl's side may wait for the whole context or device (cuCtxSynchronize,
 * cuMemFree on some drivers): S is blocked until zccl writes the flag. The CUDA table asks
 * zccl__cuda_in_ordered_call / zccl__cuda_ordered_pending for that (mem_cuda.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include "mem.h"
#include "cuda_drv.h"

#define ZCU_ERROR_NOT_READY 600

static void reap(const zccl_cuda_drv_t *d);

struct zccl_cuda_order {
    CUstream user;           /* the caller's stream */
    CUcontext ctx;           /* its context: the primary context of `device` */
    int device;
    volatile uint32_t *flag; /* pinned host word: the last ticket completed */
    CUdeviceptr flag_dev;    /* its device address, for cuStreamWaitValue32 */
    uint32_t issued;         /* tickets handed out */
    pthread_mutex_t mu;      /* the event pool */
    CUevent *pool;
    size_t npool, cappool;
};

static __thread bool in_ordered;
static long pending; /* issued and not ended, over every order of the process */

bool zccl__cuda_in_ordered_call(void) { return in_ordered; }
long zccl__cuda_ordered_pending(void) { return __atomic_load_n(&pending, __ATOMIC_ACQUIRE); }

static zccl_result_t drv_err(const char *what, CUresult r) {
    return zccl__error(ZCCL_SYSTEM_ERROR, "stream order on the caller's CUDA stream: %s failed: %s", what,
                       zccl__cuda_errstr(r));
}

/* The context and device of the caller's stream; it must be the primary context of its device, the one zccl's
 * copies and kernels run in (as the CUDA runtime's). */
static zccl_result_t stream_device(const zccl_cuda_drv_t *d, CUstream s, CUcontext *ctx, int *device) {
    CUcontext sc = NULL, saved = NULL, primary = NULL;
    CUresult r = d->cuStreamGetCtx(s, &sc);
    if (r != ZCU_SUCCESS || !sc)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_stream_create_cuda: 'cuda_stream' (%p) is not a CUDA stream "
                           "of a live context (cuStreamGetCtx: %s)%s", (void *)s,
                           r != ZCU_SUCCESS ? zccl__cuda_errstr(r) : "no context",
                           s ? "" : "; the default stream needs a current context on the calling thread "
                           "(cudaSetDevice)");
    d->cuCtxGetCurrent(&saved);
    CUdevice dev = -1;
    if ((r = d->cuCtxSetCurrent(sc)) == ZCU_SUCCESS) r = d->cuCtxGetDevice(&dev);
    if (r == ZCU_SUCCESS) r = d->cuDevicePrimaryCtxRetain(&primary, dev);
    d->cuCtxSetCurrent(saved);
    if (r != ZCU_SUCCESS) return drv_err("finding the device of the caller's stream (cuCtxGetDevice)", r);
    if (primary != sc)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_stream_create_cuda: 'cuda_stream' (%p) belongs to CUDA context "
                           "%p, which is not the primary context of device %d (%p); zccl runs its copies and kernels "
                           "in the primary context, as the CUDA runtime does: create the stream with the runtime API "
                           "or in the primary context (cuDevicePrimaryCtxRetain)", (void *)s, (void *)sc, (int)dev,
                           (void *)primary);
    *ctx = sc;
    *device = (int)dev;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__cuda_order_create(void *user_stream, zccl_cuda_order_t **out) {
    const char *why = NULL;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(&why);
    *out = NULL;
    if (!d) return zccl__error(ZCCL_INVALID_USAGE, "zccl_stream_create_cuda: a CUDA stream was given but no CUDA "
                               "driver is loaded: %s", why);
    if (!zccl__mem_cuda_built())
        return zccl__error(ZCCL_INVALID_USAGE, "zccl_stream_create_cuda: this libzccl was built without the CUDA "
                           "kernels (ZCCL_WITH_CUDA found no nvcc): no calls on device memory");
    if (!d->cuEventCreate || !d->cuEventRecord || !d->cuEventQuery || !d->cuEventDestroy || !d->cuStreamWaitValue32 ||
        !d->cuMemAllocHost || !d->cuMemFreeHost || !d->cuMemHostGetDevicePointer || !d->cuStreamGetCtx ||
        !d->cuCtxGetDevice)
        return zccl__error(ZCCL_INVALID_USAGE, "zccl_stream_create_cuda: this CUDA driver lacks events, "
                           "cuStreamGetCtx or stream memory operations (cuStreamWaitValue32_v2): stream-ordered calls "
                           "need a CUDA 12 driver or newer");
    CUcontext ctx = NULL;
    int dev = -1;
    reap(d);
    ZCCL_CHECK(stream_device(d, (CUstream)user_stream, &ctx, &dev));
    /* zccl's internal stream and kernels now, in the stream's context, before any wait is queued on the stream */
    CUcontext saved = NULL;
    d->cuCtxGetCurrent(&saved);
    d->cuCtxSetCurrent(ctx);
    const zccl_result_t pr = zccl__mem_cuda_prepare(dev);
    if (saved) d->cuCtxSetCurrent(saved);
    if (pr != ZCCL_SUCCESS) return pr;
    zccl_cuda_order_t *o = calloc(1, sizeof *o);
    if (!o) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a CUDA stream's order state");
    o->user = (CUstream)user_stream;
    o->ctx = ctx;
    o->device = dev;
    pthread_mutex_init(&o->mu, NULL);
    void *h = NULL;
    CUresult r = d->cuMemAllocHost(&h, 64);
    if (r != ZCU_SUCCESS) {
        pthread_mutex_destroy(&o->mu);
        free(o);
        return drv_err("cuMemAllocHost of the completion word", r);
    }
    o->flag = h;
    *o->flag = 0;
    if ((r = d->cuMemHostGetDevicePointer(&o->flag_dev, h, 0)) != ZCU_SUCCESS) {
        d->cuMemFreeHost(h);
        pthread_mutex_destroy(&o->mu);
        free(o);
        return drv_err("cuMemHostGetDevicePointer of the completion word", r);
    }
    *out = o;
    return ZCCL_SUCCESS;
}

int zccl__cuda_order_device(const zccl_cuda_order_t *o) { return o->device; }

static zccl_result_t take_event(const zccl_cuda_drv_t *d, zccl_cuda_order_t *o, CUevent *e) {
    pthread_mutex_lock(&o->mu);
    *e = o->npool ? o->pool[--o->npool] : NULL;
    pthread_mutex_unlock(&o->mu);
    if (*e) return ZCCL_SUCCESS;
    CUresult r = d->cuEventCreate(e, ZCU_EVENT_DISABLE_TIMING);
    if (r != ZCU_SUCCESS) return drv_err("cuEventCreate", r);
    return ZCCL_SUCCESS;
}

static void give_event(const zccl_cuda_drv_t *d, zccl_cuda_order_t *o, CUevent e) {
    if (!e) return;
    pthread_mutex_lock(&o->mu);
    if (o->npool == o->cappool) {
        size_t cap = o->cappool ? 2 * o->cappool : 8;
        CUevent *p = realloc(o->pool, cap * sizeof *p);
        if (p) { o->pool = p; o->cappool = cap; }
    }
    const bool kept = o->npool < o->cappool;
    if (kept) o->pool[o->npool++] = e;
    pthread_mutex_unlock(&o->mu);
    if (!kept) d->cuEventDestroy(e);
}

/* Event and wait in the stream's context, whatever the calling thread has current (it is restored). */
static zccl_result_t issue_in_ctx(const zccl_cuda_drv_t *d, zccl_cuda_order_t *o, uint32_t v, CUevent *e) {
    ZCCL_CHECK(take_event(d, o, e));
    CUresult r = d->cuEventRecord(*e, o->user);
    if (r != ZCU_SUCCESS) {
        give_event(d, o, *e);
        return drv_err("cuEventRecord on the caller's stream", r);
    }
    r = d->cuStreamWaitValue32(o->user, o->flag_dev, v, ZCU_STREAM_WAIT_VALUE_GEQ);
    if (r != ZCU_SUCCESS) {
        give_event(d, o, *e);
        return drv_err("cuStreamWaitValue32 on the caller's stream", r);
    }
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__cuda_order_issue(zccl_cuda_order_t *o, zccl_cuda_ticket_t *t) {
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!d || !o) return zccl__error(ZCCL_INTERNAL_ERROR, "stream order state missing");
    CUcontext cur = NULL;
    d->cuCtxGetCurrent(&cur);
    if (cur != o->ctx) d->cuCtxSetCurrent(o->ctx);
    CUevent e = NULL;
    const uint32_t v = o->issued + 1;
    const zccl_result_t res = issue_in_ctx(d, o, v, &e);
    if (cur != o->ctx) d->cuCtxSetCurrent(cur);
    if (res != ZCCL_SUCCESS) return res;
    o->issued = v;
    __atomic_add_fetch(&pending, 1, __ATOMIC_ACQ_REL);
    t->value = v;
    t->event = e;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__cuda_order_begin(zccl_cuda_order_t *o, const zccl_cuda_ticket_t *t, const volatile int *abort) {
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (!d || !o) return zccl__error(ZCCL_INTERNAL_ERROR, "stream order state missing");
    in_ordered = true;
    CUcontext c = NULL;
    if ((d->cuCtxGetCurrent(&c) != ZCU_SUCCESS || c != o->ctx) && d->cuCtxSetCurrent(o->ctx) != ZCU_SUCCESS)
        return zccl__error(ZCCL_SYSTEM_ERROR, "call %u on the caller's CUDA stream: cannot make the stream's context "
                           "current on zccl's thread", t->value);
    for (unsigned spins = 0;; spins++) {
        CUresult r = d->cuEventQuery((CUevent)t->event);
        if (r == ZCU_SUCCESS) return ZCCL_SUCCESS;
        if (r != ZCU_ERROR_NOT_READY)
            return zccl__error(ZCCL_UNHANDLED_CUDA_ERROR, "call %u on the caller's CUDA stream: the work queued on "
                               "that stream before it failed (cuEventQuery: %s)", t->value, zccl__cuda_errstr(r));
        if (abort && *abort)
            return zccl__error(ZCCL_REMOTE_ERROR, "call %u on the caller's CUDA stream: the communicator was aborted "
                               "while the call waited for the work queued before it", t->value);
        if (spins > 1000) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

void zccl__cuda_order_end(zccl_cuda_order_t *o, zccl_cuda_ticket_t *t) {
    in_ordered = false;
    if (!t->value) return;
    __atomic_store_n(o->flag, t->value, __ATOMIC_RELEASE);
    give_event(zccl__cuda_drv(NULL), o, (CUevent)t->event);
    t->event = NULL;
    t->value = 0;
    __atomic_sub_fetch(&pending, 1, __ATOMIC_ACQ_REL);
}

uint32_t zccl__cuda_order_done(const zccl_cuda_order_t *o) { return __atomic_load_n(o->flag, __ATOMIC_ACQUIRE); }

/* Completion words of destroyed orders whose stream may not have passed its last wait yet: each is freed once an
 * event recorded on the stream at destroy time has fired (the stream read the word for the last time before). */
typedef struct grave { void *flag; CUevent passed; struct grave *next; } grave_t;
static grave_t *graves;
static pthread_mutex_t graves_mu = PTHREAD_MUTEX_INITIALIZER;

static void reap(const zccl_cuda_drv_t *d) {
    pthread_mutex_lock(&graves_mu);
    for (grave_t **g = &graves; *g;) {
        if (d->cuEventQuery((*g)->passed) == ZCU_ERROR_NOT_READY) { g = &(*g)->next; continue; }
        grave_t *f = *g;
        *g = f->next;
        d->cuEventDestroy(f->passed);
        d->cuMemFreeHost(f->flag);
        free(f);
    }
    pthread_mutex_unlock(&graves_mu);
}

void zccl__cuda_order_destroy(zccl_cuda_order_t *o) {
    if (!o) return;
    const zccl_cuda_drv_t *d = zccl__cuda_drv(NULL);
    if (d) {
        for (size_t i = 0; i < o->npool; i++) d->cuEventDestroy(o->pool[i]);
        /* The caller's stream may still have to pass waits on the word (its GPU-side queue runs behind zccl): keep
         * the word until an event recorded there now has fired. */
        CUevent passed = NULL;
        grave_t *g = malloc(sizeof *g);
        CUcontext cur = NULL;
        d->cuCtxGetCurrent(&cur);
        if (cur != o->ctx) d->cuCtxSetCurrent(o->ctx);
        const bool later = g && o->issued && d->cuEventCreate(&passed, ZCU_EVENT_DISABLE_TIMING) == ZCU_SUCCESS &&
                           d->cuEventRecord(passed, o->user) == ZCU_SUCCESS;
        if (cur != o->ctx) d->cuCtxSetCurrent(cur);
        if (later) {
            *g = (grave_t){(void *)o->flag, passed, NULL};
            pthread_mutex_lock(&graves_mu);
            g->next = graves;
            graves = g;
            pthread_mutex_unlock(&graves_mu);
        } else {
            if (passed) d->cuEventDestroy(passed);
            free(g);
            /* No call was ever queued on the stream: free the word. Else, with no event to tell when the stream
             * has passed its waits, 64 bytes of pinned memory are left rather than freed under the GPU's reads. */
            if (!o->issued) d->cuMemFreeHost((void *)o->flag);
        }
        reap(d);
    }
    free(o->pool);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

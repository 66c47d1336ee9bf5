/*
 * stream.c — streams: an ordered queue of operations and one background thread that runs them, so the caller
 * computes while communication progresses (as a CUDA stream lets NCCL kernels run behind the host). The first
 * error is kept, with its message, until the next synchronize.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "stream.h"

struct zccl_stream {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_idle, cv_done;
    struct zccl_comm *running_comm; /* communicator of the operation running now (NULL if none) */
    zccl_op_t *q;
    size_t cap, head, tail; /* queue [head, tail) modulo cap; the running op stays at head until it finishes */
    bool running, stop;
    uint64_t issued, completed; /* operations ever queued / ever finished: tickets (zccl__stream_issued); written
                                   under mu with atomic stores, so that the spinning waits below read them without it */
    uint64_t spin_ns;           /* how long an idle stream thread or a synchronize polls before sleeping: the last
                                   operation's communicator's ZCCL_STREAM_SPIN_US (0 until one ran); atomic */
    void (*notify)(void *);     /* called after each operation finishes, without s->mu held (may be NULL) */
    void *notify_arg;
    zccl_result_t err;
    char errmsg[1024];
    struct zccl_stream *next_live;
    zccl_cuda_order_t *order; /* bound to a caller's CUDA stream (zccl_stream_create_cuda), else NULL */
};

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct zccl_stream *live; /* every stream, for zccl_comm_destroy's check */

/* Polls until `*word` reaches `want` (or, with stop, *stop is set), for at most ns nanoseconds.
 * Waking a sleeping thread costs microseconds to milliseconds (a futex wake, then the scheduler), so a stream whose
 * next operation or completion comes soon is polled for, as the engine polls before it sleeps (ZCCL_STREAM_SPIN_US: by
 * default only where every rank's two threads have cores, since a poller takes the core its peers need). */
static void spin_until_reached(const uint64_t *word, uint64_t want, const bool *stop, uint64_t ns) {
    if (ns == 0) return;
    const uint64_t end = zccl__now_ns() + ns;
    for (unsigned i = 1;; i++) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return;
        if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) return;
        if ((i & 63) == 0 && zccl__now_ns() >= end) return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* A device-memory call on a stream bound to a CUDA stream: waits until the work the caller queued on that stream
 * before the call has run, then runs it. If that work failed or the communicator was aborted meanwhile, the call is
 * not run: it takes its sequence number and tells the peers why, as a call refused at issue does, and fails here. */
static zccl_result_t run_ordered(zccl_cuda_order_t *order, zccl_op_t *op) {
    zccl_result_t res = zccl__cuda_order_begin(order, &op->cuda, &op->comm->tc.aborted);
    if (res == ZCCL_SUCCESS) return zccl__op_run(op);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zccl__last_error());
    free(op->reason);
    op->reason = strdup(msg);
    op->refused = true;
    if (!__atomic_load_n(&op->comm->tc.aborted, __ATOMIC_ACQUIRE)) zccl__op_run(op);
    zccl__set_last_error(msg);
    return res;
}

static void *stream_main(void *arg) {
    struct zccl_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->head == s->tail && !s->stop) { /* idle: poll a while for the next operation, then sleep */
            const uint64_t seen = s->issued;
            const uint64_t ns = __atomic_load_n(&s->spin_ns, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&s->mu);
            spin_until_reached(&s->issued, seen + 1, &s->stop, ns);
            pthread_mutex_lock(&s->mu);
        }
        while (s->head == s->tail && !s->stop) pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->head == s->tail && s->stop) break;
        zccl_op_t op = s->q[s->head % s->cap];
        s->running = true;
        s->running_comm = op.comm;
        const bool had_err = s->err != ZCCL_SUCCESS; /* read under the lock: synchronize clears it */
        pthread_mutex_unlock(&s->mu);
        /* Behind an error that broke its communicator, an operation fails without being run: the stream keeps
         * the first error, and a long queue drains in microseconds per operation. */
        const zccl_result_t broken = op.comm ? __atomic_load_n(&op.comm->tc.async_error, __ATOMIC_ACQUIRE)
                                             : ZCCL_SUCCESS;
        zccl_result_t res;
        if (!op.comm) res = zccl__error(ZCCL_REMOTE_ERROR, "operation dropped: its communicator was aborted");
        else if (broken != ZCCL_SUCCESS && had_err) res = broken;
        else if (op.cuda.value) res = run_ordered(s->order, &op);
        else res = zccl__op_run(&op);
        if (op.comm) __atomic_store_n(&s->spin_ns, op.comm->stream_spin_ns, __ATOMIC_RELAXED);
        /* The caller's CUDA stream waits for this ticket: let it go, whatever happened (the error is the stream's
         * and the communicator's to report). */
        if (op.cuda.value) zccl__cuda_order_end(s->order, &op.cuda);
        zccl__op_release(&op);
        pthread_mutex_lock(&s->mu);
        if (res != ZCCL_SUCCESS && s->err == ZCCL_SUCCESS) {
            s->err = res;
            strncpy(s->errmsg, zccl__last_error(), sizeof s->errmsg - 1);
        }
        s->head++;
        __atomic_store_n(&s->completed, s->completed + 1, __ATOMIC_RELEASE);
        s->running = false;
        s->running_comm = NULL;
        pthread_cond_broadcast(&s->cv_done);
        if (s->head == s->tail) pthread_cond_broadcast(&s->cv_idle);
        if (s->notify) {
            void (*fn)(void *) = s->notify;
            void *arg = s->notify_arg;
            pthread_mutex_unlock(&s->mu);
            fn(arg);
            pthread_mutex_lock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static zccl_result_t stream_new(zccl_stream_t *stream, zccl_cuda_order_t *order);

ZCCL_API zccl_result_t zccl_stream_create(zccl_stream_t *stream) {
    if (!stream) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_stream_create: argument 'stream' is NULL");
    return stream_new(stream, NULL);
}

ZCCL_API zccl_result_t zccl_stream_create_cuda(void *cuda_stream, zccl_stream_t *stream) {
    if (!stream) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_stream_create_cuda: argument 'stream' is NULL");
    *stream = NULL;
    zccl_cuda_order_t *order = NULL;
    ZCCL_CHECK(zccl__cuda_order_create(cuda_stream, &order));
    zccl_result_t res = stream_new(stream, order);
    if (res != ZCCL_SUCCESS) zccl__cuda_order_destroy(order);
    return res;
}

static zccl_result_t stream_new(zccl_stream_t *stream, zccl_cuda_order_t *order) {
    struct zccl_stream *s = calloc(1, sizeof *s);
    if (!s) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a stream");
    s->cap = 64;
    s->q = malloc(s->cap * sizeof *s->q);
    if (!s->q) { free(s); return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a stream queue"); }
    s->order = order;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_idle, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    int rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc != 0) {
        free(s->q);
        free(s);
        return zccl__syserror(rc, "cannot start a stream thread");
    }
    pthread_mutex_lock(&live_mu);
    s->next_live = live;
    live = s;
    pthread_mutex_unlock(&live_mu);
    *stream = s;
    return ZCCL_SUCCESS;
}

void zccl__op_release(zccl_op_t *op) {
    free(op->vcounts);
    free(op->reason);
    op->reason = NULL;
    op->vcounts = NULL;
    free(op->a2av);
    op->a2av = NULL;
    if (op->group && op->release_group) op->release_group(op->group);
    op->group = NULL;
}

/* A device call refused when queued on a CUDA-bound stream (res, with the thread's last error): as a call refused at
 * its entry point, it still takes its sequence number on the stream and tells the peers why (collectives.c,
 * run_refused), so that they fail it instead of pairing it with this rank's next call. Releases op. */
static zccl_result_t refuse_here(const zccl_op_t *op, zccl_stream_t s, zccl_result_t res) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zccl__last_error());
    zccl_op_t o = *op;
    zccl__op_release(&o);
    if (o.comm && o.comm->nranks > 1) {
        zccl_op_t r = {.coll = o.coll, .barrier = o.barrier, .count = o.count, .dt = o.dt, .op = o.op, .root = o.root,
                       .comm = o.comm, .refused = true, .reason = strdup(msg), .mem = ZCCL_MEM_HOST};
        zccl__op_issue(&r, s);
        zccl__set_last_error(msg);
    }
    return res;
}

zccl_result_t zccl__op_issue(const zccl_op_t *op, zccl_stream_t s) {
    if (!s) {
        zccl_result_t res = zccl__op_run(op);
        zccl_op_t o = *op;
        zccl__op_release(&o);
        return res;
    }
    /* Stream order with the caller's CUDA stream (a device call on a stream of zccl_stream_create_cuda): the inputs
     * are ready when the call's event fires, the caller's later work waits on the completion word. The buffers must
     * be on the stream's device. */
    const bool order = s->order && op->mem == ZCCL_MEM_CUDA && !op->group;
    zccl_result_t res = ZCCL_SUCCESS;
    if (order) {
        const void *p = op->sendbuf ? op->sendbuf : op->recvbuf;
        zccl_mem_type_t t;
        int dev = -1;
        res = zccl__mem_query(p, &t, &dev);
        if (res == ZCCL_SUCCESS && dev != zccl__cuda_order_device(s->order))
            res = zccl__error(ZCCL_INVALID_ARGUMENT, "a call on a stream bound to a CUDA stream: its buffers are on "
                              "CUDA device %d but the CUDA stream is on device %d", dev,
                              zccl__cuda_order_device(s->order));
        if (res != ZCCL_SUCCESS) return refuse_here(op, s, res);
    }
    pthread_mutex_lock(&s->mu);
    if (s->tail - s->head == s->cap) { /* grow, keeping order */
        zccl_op_t *nq = malloc(2 * s->cap * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&s->mu);
            zccl_op_t o = *op;
            zccl__op_release(&o);
            return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory growing a stream queue past %zu operations", s->cap);
        }
        for (size_t i = s->head; i < s->tail; i++) nq[i - s->head] = s->q[i % s->cap];
        free(s->q);
        s->q = nq;
        s->tail -= s->head;
        s->head = 0;
        s->cap *= 2;
    }
    zccl_op_t ordered;
    if (order) { /* under the lock: tickets in queue order */
        ordered = *op;
        if ((res = zccl__cuda_order_issue(s->order, &ordered.cuda)) != ZCCL_SUCCESS) {
            pthread_mutex_unlock(&s->mu);
            return refuse_here(op, s, res);
        }
        op = &ordered;
    }
    s->q[s->tail % s->cap] = *op;
    s->tail++;
    __atomic_store_n(&s->issued, s->issued + 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return ZCCL_SUCCESS;
}

static zccl_result_t take_error(struct zccl_stream *s) {
    zccl_result_t res = s->err;
    if (res != ZCCL_SUCCESS) {
        zccl__set_last_error(s->errmsg);
        s->err = ZCCL_SUCCESS;
    }
    return res;
}

ZCCL_API zccl_result_t zccl_stream_synchronize(zccl_stream_t s) {
    if (!s) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_stream_synchronize: argument 'stream' is NULL");
    pthread_mutex_lock(&s->mu);
    if (s->head != s->tail) { /* poll a while for the last queued operation, then sleep */
        const uint64_t want = s->issued;
        const uint64_t ns = __atomic_load_n(&s->spin_ns, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&s->mu);
        spin_until_reached(&s->completed, want, NULL, ns);
        pthread_mutex_lock(&s->mu);
    }
    while (s->head != s->tail) pthread_cond_wait(&s->cv_idle, &s->mu);
    zccl_result_t res = take_error(s);
    pthread_mutex_unlock(&s->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_stream_query(zccl_stream_t s) {
    if (!s) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_stream_query: argument 'stream' is NULL");
    pthread_mutex_lock(&s->mu);
    zccl_result_t res = (s->head != s->tail) ? ZCCL_IN_PROGRESS : take_error(s);
    pthread_mutex_unlock(&s->mu);
    return res;
}

ZCCL_API zccl_result_t zccl_stream_destroy(zccl_stream_t s) {
    if (!s) return ZCCL_SUCCESS;
    zccl_result_t res = zccl_stream_synchronize(s);
    pthread_mutex_lock(&s->mu);
    __atomic_store_n(&s->stop, true, __ATOMIC_RELEASE);
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&live_mu);
    for (struct zccl_stream **p = &live; *p; p = &(*p)->next_live)
        if (*p == s) { *p = s->next_live; break; }
    pthread_mutex_unlock(&live_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_idle);
    pthread_cond_destroy(&s->cv_done);
    zccl__cuda_order_destroy(s->order);
    free(s->q);
    free(s);
    return res;
}

bool zccl__stream_busy_with(struct zccl_comm *comm) {
    bool busy = false;
    pthread_mutex_lock(&live_mu);
    for (struct zccl_stream *s = live; s && !busy; s = s->next_live) {
        pthread_mutex_lock(&s->mu);
        for (size_t i = s->head; i < s->tail && !busy; i++) busy = (s->q[i % s->cap].comm == comm);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&live_mu);
    return busy;
}

void zccl__stream_forget(struct zccl_comm *comm) {
    pthread_mutex_lock(&live_mu);
    for (struct zccl_stream *s = live; s; s = s->next_live) {
        pthread_mutex_lock(&s->mu);
        /* Queued operations of comm fail instead of running; one that is running sees comm->tc.aborted and returns
         * soon: wait for it, since it still uses comm. */
        for (size_t i = s->head + (s->running ? 1 : 0); i < s->tail; i++)
            if (s->q[i % s->cap].comm == comm) s->q[i % s->cap].comm = NULL;
        while (s->running_comm == comm) pthread_cond_wait(&s->cv_done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&live_mu);
}

uint64_t zccl__stream_issued(zccl_stream_t s) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->issued;
    pthread_mutex_unlock(&s->mu);
    return n;
}

uint64_t zccl__stream_completed(zccl_stream_t s) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->completed;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void zccl__stream_set_notify(zccl_stream_t s, void (*fn)(void *), void *arg) {
    pthread_mutex_lock(&s->mu);
    s->notify = fn;
    s->notify_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

void zccl__stream_wait_comm(struct zccl_comm *comm) {
    pthread_mutex_lock(&live_mu);
    for (struct zccl_stream *s = live; s; s = s->next_live) {
        pthread_mutex_lock(&s->mu);
        for (;;) {
            bool busy = false;
            for (size_t i = s->head; i < s->tail && !busy; i++) busy = (s->q[i % s->cap].comm == comm);
            if (!busy) break;
            pthread_cond_wait(&s->cv_done, &s->mu);
        }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&live_mu);
}

/*
 * collectives.c — the public collective entry points: argument validation (every failure names the argument),
 * then an operation value that runs now (NULL stream) or on a stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "api.h"
#include "comm.h"
#include "kernels.h"
#include "engine.h"
#include "engine_gdr.h"
#include "regmem.h"
#include "notice.h"
#include "zccl_ext.h"
#include "stream.h"
#include "tuner.h"

/* How long a rank whose peer closed its connection mid-call waits for the notice that says why (docs/faults.md). */
#define NOTICE_GRACE_MS 1000

static const size_t type_sizes[ZCCL_NUM_TYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

ZCCL_API size_t zccl_type_size(zccl_datatype_t dt) {
    return ((unsigned)dt < ZCCL_NUM_TYPES) ? type_sizes[dt] : 0;
}

static const char *coll_names[ZCCL_COLL_COUNT] = {"zccl_allreduce", "zccl_reduce_scatter", "zccl_allgather",
                                                  "zccl_broadcast", "zccl_reduce", "zccl_send", "zccl_recv",
                                                  "zccl_alltoall", "zccl_alltoallv", "zccl_gather", "zccl_scatter"};

/* Checks the arguments every collective shares; on success *bytes is count*elemsize*mult. */
static zccl_result_t check_common(const char *fn, zccl_comm_t comm, size_t count, size_t mult, zccl_datatype_t dt,
                                  int has_op, zccl_redop_t op, size_t *bytes) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    ZCCL_CHECK(zccl__comm_ready(comm, fn)); /* a non-blocking communicator still being created: ZCCL_IN_PROGRESS */
    if ((unsigned)dt >= ZCCL_NUM_TYPES)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'datatype' = %d is not a zccl_datatype_t (0..%d)", fn,
                           (int)dt, ZCCL_NUM_TYPES - 1);
    if (has_op && (int)op < 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d is not a zccl_redop_t (0..%d) nor a "
                           "PreMulSum handle", fn, (int)op, ZCCL_NUM_OPS - 1);
    if (has_op && (unsigned)op >= ZCCL_NUM_OPS) ZCCL_CHECK(zccl__redop_check(comm, op, dt, fn));
    size_t total;
    if (!zccl__mul_ok(count, mult, &total) || !zccl__mul_ok(total, zccl_type_size(dt), bytes) || *bytes > SIZE_MAX / 2)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'count' = %zu elements (x%zu ranks) of %zu bytes "
                           "overflows the address space", fn, count, mult, zccl_type_size(dt));
    return ZCCL_SUCCESS;
}

static zccl_result_t check_root(const char *fn, const char *what, zccl_comm_t comm, int root) {
    if (root < 0 || root >= comm->nranks)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument '%s' = %d is outside [0, nranks-1 = %d]", fn, what,
                           root, comm->nranks - 1);
    return ZCCL_SUCCESS;
}

static zccl_result_t check_buf(const char *fn, const char *name, const void *p) {
    if (!p) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument '%s' is NULL while count > 0", fn, name);
    return ZCCL_SUCCESS;
}

/* Out-of-place buffers must not overlap; in-place must be exactly NCCL's position. */
static zccl_result_t check_overlap(const char *fn, const void *s, size_t sbytes, const void *r, size_t rbytes,
                                   bool in_place) {
    if (in_place) return ZCCL_SUCCESS;
    const char *a = s, *b = r;
    if (a < b + rbytes && b < a + sbytes)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'sendbuf' and 'recvbuf' overlap but are not at the in-place "
                           "position (see zccl.h)", fn);
    return ZCCL_SUCCESS;
}

/* ---- the call's descriptor (calldesc.h): what every rank must agree on ----------------------------------- */

static void make_desc(const struct zccl_comm *comm, const zccl_op_t *o, uint64_t seq, zccl_call_desc_t *d) {
    memset(d, 0, sizeof *d);
    const bool has_op = o->coll == ZCCL_COLL_ALLREDUCE || o->coll == ZCCL_COLL_REDUCE_SCATTER || o->coll == ZCCL_COLL_REDUCE;
    const bool has_root = o->coll == ZCCL_COLL_BROADCAST || o->coll == ZCCL_COLL_REDUCE ||
                          o->coll == ZCCL_COLL_GATHER || o->coll == ZCCL_COLL_SCATTER;
    d->seq = seq;
    d->count = o->count;
    d->coll = (uint8_t)o->coll;
    d->dt = (uint8_t)o->dt;
    d->op = has_op ? (uint8_t)o->op : 0xff;
    d->root = has_root ? o->root : -1;
    if (o->barrier) d->flags |= ZCCL_DESC_BARRIER;
    if (o->refused) d->flags |= ZCCL_DESC_REFUSED;
    if (o->mem != ZCCL_MEM_HOST) d->flags |= ZCCL_DESC_DEVICE; /* device calls split their transfers (engine_stage.c) */
    if (o->vcounts) { /* FNV-1a over the counts; the total goes in count */
        uint64_t h = 1469598103934665603ull, total = 0;
        for (int r = 0; r < comm->nranks; r++) {
            h = (h ^ (uint64_t)o->vcounts[r]) * 1099511628211ull;
            total += o->vcounts[r];
        }
        d->vhash = h | 1;
        d->count = total;
    }
}

/* ---- ZCCL_CHECK: do all ranks call the same collective? ---------------------------------------------------- */

typedef struct {
    zccl_call_desc_t d;
    char why[224]; /* a refused call: the reason (the rank's error message) */
} check_entry_t;

/* Every rank contributes a fixed-size description of its call to one all-gather (so the check itself cannot
 * mismatch), then compares all of them with rank 0's. Every rank sees the same table, so all fail alike, before
 * any data moves. A rank that refused its call locally still joins, marked, so that its peers fail with it. */
static zccl_result_t check_matching(struct zccl_comm *comm, const zccl_op_t *o, uint64_t seq) {
    const int n = comm->nranks;
    check_entry_t *all = calloc((size_t)n, sizeof *all);
    if (!all) return zccl__error(ZCCL_SYSTEM_ERROR, "ZCCL_CHECK: out of memory for %d descriptions", n);
    check_entry_t *me = &all[comm->rank];
    make_desc(comm, o, seq, &me->d);
    if (o->refused) snprintf(me->why, sizeof me->why, "%s", o->reason ? o->reason : "");
    zccl_sched_args_t a = {.coll = ZCCL_COLL_ALLGATHER, .nranks = n, .rank = comm->rank, .count = sizeof(check_entry_t),
                           .in_place = true, .elem_size = 1, .ring = comm->ring};
    zccl_schedule_t s;
    zccl_result_t res = zccl__sched_build(&a, &s);
    if (res == ZCCL_SUCCESS) {
        res = zccl__engine_run(comm, &s, me, all, ZCCL_UINT8, ZCCL_SUM);
        zccl__sched_free(&s);
    }
    for (int r = 0; r < n && res == ZCCL_SUCCESS; r++) {
        if (!(all[r].d.flags & ZCCL_DESC_REFUSED)) continue;
        all[r].why[sizeof all[r].why - 1] = '\0';
        char dr[160];
        zccl__desc_describe(&all[r].d, comm->cseq_init, dr, sizeof dr);
        res = zccl__error(ZCCL_INVALID_USAGE, "ZCCL_CHECK: rank %d refused its call %s, so every rank fails it before "
                          "any data moves: %s", r, dr, all[r].why);
    }
    for (int r = 1; r < n && res == ZCCL_SUCCESS; r++) {
        if (memcmp(&all[r].d, &all[0].d, sizeof all[0].d) == 0) continue;
        char d0[160], dr[160];
        zccl__desc_describe(&all[0].d, comm->cseq_init, d0, sizeof d0);
        zccl__desc_describe(&all[r].d, comm->cseq_init, dr, sizeof dr);
        res = zccl__error(ZCCL_INVALID_USAGE, "ZCCL_CHECK: ranks called different collectives: rank %d called %s, "
                          "rank 0 called %s%s", r, dr, d0, r == comm->rank ? " (this rank differs)" : "");
    }
    free(all);
    return res;
}

/* A refused call takes its sequence number like any other, so that the ranks stay in step, and tells the peers:
 * under ZCCL_CHECK by joining the check marked invalid (every rank fails the call, nothing moves, the communicator
 * stays usable), else by a notice (the peers fail their call with ZCCL_REMOTE_ERROR quoting this rank's reason,
 * unless they refused it too). Its own error was returned to the caller when it was refused. */
static zccl_result_t run_refused(struct zccl_comm *comm, const zccl_op_t *o, uint64_t seq, bool is_coll) {
    if (comm->check && is_coll) {
        zccl_result_t res = check_matching(comm, o, seq);
        return res == ZCCL_INVALID_USAGE ? ZCCL_SUCCESS : res;
    }
    /* A point-to-point call only leaves its peer out of step (refuse() queued it only with a valid peer). */
    zccl__notice_refused_here(comm, seq);
    zccl__notice_send(comm, ZCCL_NOTICE_REFUSED, seq, o->reason, is_coll ? -1 : o->root);
    return ZCCL_SUCCESS;
}

static zccl_result_t op_run(const zccl_op_t *o);

zccl_result_t zccl__api_mem_type(zccl_op_t *o, bool in_group) {
    o->mem = ZCCL_MEM_HOST;
    if (o->barrier || o->group) return ZCCL_SUCCESS;
    const char *fn = coll_names[o->coll];
    ZCCL_CHECK(zccl__mem_call_type(fn, o->sendbuf, o->recvbuf, &o->mem));
    zccl_mem_type_t ts = ZCCL_MEM_HOST;
    if (o->mem != ZCCL_MEM_HOST && in_group && zccl__mem_query(o->sendbuf, &ts, NULL) == ZCCL_SUCCESS)
        return zccl__error(ZCCL_INVALID_USAGE, "%s inside zccl_group_start/zccl_group_end: '%s' is CUDA device memory, "
                           "which groups do not take yet (docs/gpu.md); call it outside the group", fn,
                           ts == ZCCL_MEM_CUDA ? "sendbuf" : "recvbuf");
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__op_run(const zccl_op_t *o) {
    const char *old = zccl__log_set_tag(o->comm ? o->comm->name : NULL); /* comm_name in this op's log lines */
    zccl_result_t res = o->group ? o->run_group(o->group) /* a group's part on one communicator (group.c) */
                                 : op_run(o);
    zccl__log_set_tag(old);
    return res;
}

static zccl_result_t op_run(const zccl_op_t *o) {
    struct zccl_comm *comm = o->comm;
    if (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
        return zccl__error(ZCCL_REMOTE_ERROR, "%s on rank %d: the communicator was aborted",
                                          coll_names[o->coll], comm->rank);
    /* A peer was lost or timed out: fail at once, do not wait again. Not logged again: the first error was, and a
     * stream may hold a million operations queued behind it. */
    const zccl_result_t broken = __atomic_load_n(&comm->tc.async_error, __ATOMIC_ACQUIRE);
    if (broken != ZCCL_SUCCESS) {
        char msg[sizeof comm->async_msg + 128];
        snprintf(msg, sizeof msg, "%s on rank %d: the communicator is broken by an earlier error: %s",
                 coll_names[o->coll], comm->rank, comm->async_msg);
        zccl__set_last_error(msg);
        return broken;
    }
    uint8_t one = 0, out = 0;
    zccl_op_t b = *o;
    if (o->barrier) {
        b.sendbuf = &one;
        b.recvbuf = &out;
        b.count = 1;
        b.dt = ZCCL_UINT8;
        b.op = ZCCL_SUM;
    }
    const char *name = o->barrier ? "zccl_barrier" : coll_names[(unsigned)b.coll < ZCCL_COLL_COUNT ? b.coll : 0];
    /* Collectives are numbered; point-to-point calls are not (only two ranks take part) and count as part of the
     * next collective for notices. */
    const bool is_coll = b.coll != ZCCL_COLL_SEND && b.coll != ZCCL_COLL_RECV;
    pthread_mutex_lock(&comm->exec_mutex);
    const uint64_t seq = comm->cseq + 1;
    if (is_coll) comm->cseq = seq;
    comm->seq = seq; /* the number error messages give this call: the same as its descriptor's and notices' */
    comm->op_name = name;
    zccl_result_t res = ZCCL_SUCCESS;
    bool in_engine = false; /* the ranks may have begun moving data */
    bool direct = false;    /* ran straight out of the peers' registered buffers (lib/core/regmem.c) */
    /* A buffer this rank registered as device memory that the CUDA driver no longer knows (freed while registered):
     * the call would read or write freed memory on the host path. Refused like an invalid argument, so that every
     * rank fails it (engine_gdr.c). Costs a look at the registrations only where a CUDA driver is loaded. */
    if (!b.refused && !b.noop && !b.barrier && !b.group && b.mem == ZCCL_MEM_HOST && zccl__mem_cuda_available(NULL)) {
        zccl_result_t fr = b.sendbuf ? zccl__gdr_freed_check(comm, name, "sendbuf", b.sendbuf) : ZCCL_SUCCESS;
        if (fr == ZCCL_SUCCESS && b.recvbuf && b.recvbuf != b.sendbuf)
            fr = zccl__gdr_freed_check(comm, name, "recvbuf", b.recvbuf);
        if (fr != ZCCL_SUCCESS) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", zccl__last_error());
            b.refused = true;
            b.reason = msg;
            run_refused(comm, &b, seq, is_coll);
            pthread_mutex_unlock(&comm->exec_mutex);
            zccl__set_last_error(msg);
            return fr;
        }
    }
    if (b.refused) {
        res = run_refused(comm, &b, seq, is_coll);
        pthread_mutex_unlock(&comm->exec_mutex);
        return res;
    }
    res = zccl__notice_check(comm, seq, name); /* a peer refused or gave up this call or an earlier one */
    if (res == ZCCL_SUCCESS && comm->check && is_coll && comm->nranks > 1) res = check_matching(comm, &b, seq);
    if (res == ZCCL_SUCCESS && b.noop) {
        pthread_mutex_unlock(&comm->exec_mutex);
        return ZCCL_SUCCESS;
    }
    const zccl_schedule_t *s = NULL;
    void *premul_buf = NULL;
    if (res == ZCCL_SUCCESS) {
        const size_t es = zccl_type_size(b.dt);
        zccl_sched_args_t a = {
            .coll = b.coll, .nranks = comm->nranks, .rank = comm->rank, .root = b.root, .count = b.count,
            .in_place = b.in_place, .elem_size = es, .chunk_bytes = zccl__pipeline_chunk(b.count * es, comm->nranks),
            .rs_round_bytes = comm->rs_round_bytes,
            .algo = ZCCL_ALGO_RING,
            .ring = comm->ring,
        };
        if (b.vcounts) { /* uneven reduce-scatter / all-gather: ring only */
            a.counts = b.vcounts;
            a.displs = b.vcounts + comm->nranks;
            a.count = b.vcounts[comm->rank];
        }
        a.a2av = b.a2av;
        /* PreMulSum: this rank's input times the scalar, in the datatype's precision, into a buffer of its own;
         * then an out-of-place sum from there (recvbuf may be the original input: it is no longer read). */
        if (b.premul) {
            size_t in_elems = b.count;
            if (b.coll == ZCCL_COLL_REDUCE_SCATTER)
                in_elems = b.vcounts ? b.vcounts[2 * comm->nranks - 1] + b.vcounts[comm->nranks - 1]
                                     : b.count * (size_t)comm->nranks;
            const zccl_mem_ops_t *m = zccl__mem_ops(b.mem); /* the products in the call's memory */
            if (m->alloc(&premul_buf, in_elems * es) != ZCCL_SUCCESS) {
                premul_buf = NULL;
                res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of %s memory for the PreMulSum products (%zu bytes)",
                                  name, m->name, in_elems * es);
            } else if ((res = m->premul(premul_buf, b.sendbuf, in_elems, b.dt, b.scalar)) == ZCCL_SUCCESS) {
                b.sendbuf = premul_buf;
                b.op = ZCCL_SUM;
                b.in_place = false;
                a.in_place = false;
            }
        }
        zccl__tune(comm, &a); /* cheapest predicted algorithm (tuner.c), the same on every rank */
        if (a.counts) a.algo = ZCCL_ALGO_RING; /* uneven blocks: only the ring schedules take them */
        if (res == ZCCL_SUCCESS) {
            /* Collectives open every channel with the call's descriptor, so that ranks whose calls differ fail
             * naming both instead of mixing data (engine.c); the registered path's descriptors carry it too. */
            make_desc(comm, &b, seq, &comm->desc_mine);
            res = zccl__reg_try_run(comm, &b, &direct, &in_engine);
            if (res == ZCCL_SUCCESS && !direct) { /* unregistered buffers, all ranks on this host: one copy, one pass */
                res = zccl__stg_try_run(comm, &b, &direct);
                if (direct) in_engine = true;
            }
        }
        if (res == ZCCL_SUCCESS && !direct) res = zccl__sched_get(&comm->sched_cache, &a, &s);
    }
    if (res == ZCCL_SUCCESS && !direct) {
        ZCCL_TRACE(ZCCL_LOG_COLL, "%s #%llu: count %zu type %d op %d root %d in_place %d: %zu phases",
                   name, zccl__seq_shown(comm, seq), b.count, (int)b.dt, (int)b.op, b.root, (int)b.in_place, s->nphases);
        comm->desc_on = is_coll;
        comm->call_mem = b.mem;
        res = zccl__engine_run(comm, s, b.sendbuf, b.recvbuf, b.dt, b.op);
        comm->call_mem = ZCCL_MEM_HOST;
        comm->desc_on = false;
        in_engine = true;
    }
    if (premul_buf) zccl__mem_ops(b.mem)->free(premul_buf);
    /* A collective that failed in the engine (a lost peer, a timeout, a port that went down, a transport's system
     * error, calls that differ between ranks, even scratch memory this rank could not get while its peers went
     * ahead) leaves the ranks out of step: later operations on this communicator cannot succeed, so they fail at
     * once instead of running (and failing) one by one — a stream with a million queued operations would otherwise
     * take minutes to report the error. A mismatch found by ZCCL_CHECK is seen by every rank before anyone moves
     * data, so the communicator stays usable after it. */
    /* A transport's "closed its connection" is often a peer that gave up and said why: quote it. */
    if (res == ZCCL_REMOTE_ERROR && !comm->notice_learned) {
        zccl_result_t why = zccl__notice_check(comm, seq, name);
        /* The peer that closed may have left because of a third rank's notice, which that rank is still delivering
         * here (it tells its peers one at a time, each acknowledged, and the peer that learned it first does not pass
         * it on): give it a moment, so that the message names the cause. A crashed peer costs this wait once. */
        const uint64_t until = zccl__now_ns() + NOTICE_GRACE_MS * 1000000ull;
        while (why == ZCCL_SUCCESS && !__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE) && zccl__now_ns() < until) {
            usleep(1000);
            why = zccl__notice_check(comm, seq, name);
        }
        if (why != ZCCL_SUCCESS) res = why;
    }
    if (res != ZCCL_SUCCESS && (in_engine || res == ZCCL_REMOTE_ERROR || res == ZCCL_TIMEOUT ||
                                res == ZCCL_INTERNAL_ERROR)) {
        snprintf(comm->async_msg, sizeof comm->async_msg, "%s", zccl__last_error());
        __atomic_store_n(&comm->tc.async_error, res, __ATOMIC_RELEASE);
        zccl__comm_poison(comm, seq); /* peers still waiting on this rank fail too instead of hanging */
    }
    pthread_mutex_unlock(&comm->exec_mutex);
    return res;
}

/* ---- invalid calls (include/zccl.h, "Invalid calls") -------------------------------------------------------- */

/* The caller's call o was refused with res (its message is the thread's last error). On a communicator of several
 * ranks the call still takes its place in the sequence (run_refused), on the stream it was meant for, so that the
 * peers fail it too instead of pairing their call with this rank's next one. */
static zccl_result_t refuse(zccl_op_t o, zccl_stream_t stream, zccl_result_t res) {
    if (!o.comm || o.comm->nranks < 2 || res == ZCCL_IN_PROGRESS) return res;
    /* A send or receive without a valid peer (out of range, or this rank) pairs with nobody: nothing to tell. */
    if ((o.coll == ZCCL_COLL_SEND || o.coll == ZCCL_COLL_RECV) &&
        (o.root < 0 || o.root >= o.comm->nranks || o.root == o.comm->rank))
        return res;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zccl__last_error());
    o.refused = true;
    o.noop = false;
    o.sendbuf = NULL;
    o.recvbuf = NULL;
    o.vcounts = NULL;
    o.reason = strdup(msg);
    o.op = ZCCL_SUM; /* a refused call carries no PreMulSum handle to resolve */
    /* Straight to the stream (or run now), also inside a group: a refused call is not part of the group's fused
     * work, and telling the peers must not wait for zccl_group_end. */
    zccl__op_issue(&o, stream); /* consumes o.reason; its result is this refusal's, returned below */
    zccl__set_last_error(msg);
    return res;
}

zccl_result_t zccl__coll_refuse_op(zccl_op_t o, zccl_stream_t stream, zccl_result_t res) {
    return refuse(o, stream, res);
}

zccl_result_t zccl__coll_refuse(zccl_comm_t comm, zccl_stream_t stream, zccl_result_t res) {
    zccl_op_t o = {.coll = ZCCL_COLL_ALLREDUCE, .comm = comm};
    return refuse(o, stream, res);
}

/* Count 0: nothing moves, but the call takes its sequence number (and joins ZCCL_CHECK's check), so that a rank that
 * passes 0 where the others do not is caught at this call. Owns o.vcounts. */
static zccl_result_t noop(zccl_op_t o, zccl_stream_t stream) {
    if (o.comm->nranks < 2) {
        zccl__op_release(&o);
        return ZCCL_SUCCESS;
    }
    o.noop = true;
    return zccl__api_issue(&o, stream);
}

zccl_result_t zccl__coll_noop(zccl_op_t o, zccl_stream_t stream) { return noop(o, stream); }

#define TRY ZCCL__TRY_OR_REFUSE

ZCCL_API zccl_result_t zccl_allreduce(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                      zccl_redop_t op, zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_allreduce";
    size_t bytes;
    zccl_op_t o = {.coll = ZCCL_COLL_ALLREDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dt = datatype, .op = op, .root = 0, .comm = comm};
    TRY(check_common(fn, comm, count, 1, datatype, 1, op, &bytes));
    if (count == 0) return noop(o, stream);
    TRY(check_buf(fn, "sendbuf", sendbuf));
    TRY(check_buf(fn, "recvbuf", recvbuf));
    o.in_place = (sendbuf == recvbuf);
    TRY(check_overlap(fn, sendbuf, bytes, recvbuf, bytes, o.in_place));
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                           zccl_datatype_t datatype, zccl_redop_t op, zccl_comm_t comm,
                                           zccl_stream_t stream) {
    const char *fn = "zccl_reduce_scatter";
    size_t total;
    zccl_op_t o = {.coll = ZCCL_COLL_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = recvcount, .dt = datatype, .op = op, .root = 0, .comm = comm};
    TRY(check_common(fn, comm, recvcount, (size_t)(comm ? comm->nranks : 1), datatype, 1, op, &total));
    if (recvcount == 0) return noop(o, stream);
    TRY(check_buf(fn, "sendbuf", sendbuf));
    TRY(check_buf(fn, "recvbuf", recvbuf));
    const size_t rbytes = total / (size_t)comm->nranks;
    o.in_place = ((const char *)recvbuf == (const char *)sendbuf + (size_t)comm->rank * rbytes);
    TRY(check_overlap(fn, sendbuf, total, recvbuf, rbytes, o.in_place));
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, zccl_datatype_t datatype,
                                      zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_allgather";
    size_t total;
    zccl_op_t o = {.coll = ZCCL_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = sendcount, .dt = datatype, .op = ZCCL_SUM, .root = 0, .comm = comm};
    TRY(check_common(fn, comm, sendcount, (size_t)(comm ? comm->nranks : 1), datatype, 0, ZCCL_SUM, &total));
    if (sendcount == 0) return noop(o, stream);
    TRY(check_buf(fn, "sendbuf", sendbuf));
    TRY(check_buf(fn, "recvbuf", recvbuf));
    const size_t sbytes = total / (size_t)comm->nranks;
    o.in_place = ((const char *)sendbuf == (const char *)recvbuf + (size_t)comm->rank * sbytes);
    TRY(check_overlap(fn, sendbuf, sbytes, recvbuf, total, o.in_place));
    return zccl__api_issue(&o, stream);
}

/* Validates and copies the per-rank counts of a _v collective: *out holds nranks counts then nranks displacements
 * (prefix sums), *total their sum and *tbytes its size in bytes. */
static zccl_result_t copy_counts(const char *fn, zccl_comm_t comm, const size_t *counts, zccl_datatype_t dt,
                                 size_t **out, size_t *total, size_t *tbytes) {
    *out = NULL;
    if (!counts) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'counts' is NULL", fn);
    const int n = comm->nranks;
    size_t *v = malloc(2 * (size_t)n * sizeof *v);
    if (!v) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory copying %d counts", fn, n);
    size_t t = 0;
    for (int r = 0; r < n; r++) {
        v[n + r] = t;
        v[r] = counts[r];
        if (counts[r] > SIZE_MAX - t) {
            free(v);
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: the sum of 'counts' overflows at counts[%d] = %zu", fn, r,
                               counts[r]);
        }
        t += counts[r];
    }
    size_t bytes;
    zccl_result_t res = check_common(fn, comm, t, 1, dt, 0, ZCCL_SUM, &bytes);
    if (res != ZCCL_SUCCESS) {
        free(v);
        return res;
    }
    *out = v;
    *total = t;
    *tbytes = bytes;
    return ZCCL_SUCCESS;
}

/* A _v collective's buffer checks failed: free the counts, refuse the call. */
static zccl_result_t refuse_v(zccl_op_t o, zccl_stream_t stream, zccl_result_t res) {
    free(o.vcounts);
    o.vcounts = NULL;
    return refuse(o, stream, res);
}

ZCCL_API zccl_result_t zccl_reduce_scatter_v(const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                                             zccl_datatype_t datatype, zccl_redop_t op, zccl_comm_t comm,
                                             zccl_stream_t stream) {
    const char *fn = "zccl_reduce_scatter_v";
    size_t bytes, total, tbytes, *v;
    zccl_op_t o = {.coll = ZCCL_COLL_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = 0, .dt = datatype, .op = op, .root = 0, .comm = comm};
    TRY(check_common(fn, comm, 0, 1, datatype, 1, op, &bytes));
    TRY(copy_counts(fn, comm, recvcounts, datatype, &v, &total, &tbytes));
    const size_t es = zccl_type_size(datatype), mine = v[comm->rank], moff = v[comm->nranks + comm->rank];
    o.vcounts = v; /* the op owns v now */
    o.count = mine;
    zccl_result_t res;
    if (total == 0) return noop(o, stream);
    if ((res = check_buf(fn, "sendbuf", sendbuf)) != ZCCL_SUCCESS) return refuse_v(o, stream, res);
    if (mine && (res = check_buf(fn, "recvbuf", recvbuf)) != ZCCL_SUCCESS) return refuse_v(o, stream, res);
    o.in_place = mine && ((const char *)recvbuf == (const char *)sendbuf + moff * es);
    if (mine && (res = check_overlap(fn, sendbuf, tbytes, recvbuf, mine * es, o.in_place)) != ZCCL_SUCCESS)
        return refuse_v(o, stream, res);
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_allgather_v(const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                                        zccl_datatype_t datatype, zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_allgather_v";
    size_t bytes, total, tbytes, *v;
    zccl_op_t o = {.coll = ZCCL_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = 0, .dt = datatype, .op = ZCCL_SUM, .root = 0, .comm = comm};
    TRY(check_common(fn, comm, 0, 1, datatype, 0, ZCCL_SUM, &bytes));
    TRY(copy_counts(fn, comm, recvcounts, datatype, &v, &total, &tbytes));
    const size_t es = zccl_type_size(datatype), mine = v[comm->rank], moff = v[comm->nranks + comm->rank];
    o.vcounts = v;
    o.count = mine;
    zccl_result_t res;
    if (total == 0) return noop(o, stream);
    if (mine && (res = check_buf(fn, "sendbuf", sendbuf)) != ZCCL_SUCCESS) return refuse_v(o, stream, res);
    if ((res = check_buf(fn, "recvbuf", recvbuf)) != ZCCL_SUCCESS) return refuse_v(o, stream, res);
    o.in_place = mine == 0 || ((const char *)sendbuf == (const char *)recvbuf + moff * es);
    if (mine && (res = check_overlap(fn, sendbuf, mine * es, recvbuf, tbytes, o.in_place)) != ZCCL_SUCCESS)
        return refuse_v(o, stream, res);
    o.sendbuf = mine ? sendbuf : (const char *)recvbuf + moff * es;
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_broadcast(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                      int root, zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_broadcast";
    size_t bytes;
    zccl_op_t o = {.coll = ZCCL_COLL_BROADCAST, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dt = datatype, .op = ZCCL_SUM, .root = root, .comm = comm};
    TRY(check_common(fn, comm, count, 1, datatype, 0, ZCCL_SUM, &bytes));
    TRY(check_root(fn, "root", comm, root));
    if (count == 0) return noop(o, stream);
    const bool is_root = (comm->rank == root);
    if (is_root) TRY(check_buf(fn, "sendbuf", sendbuf));
    TRY(check_buf(fn, "recvbuf", recvbuf));
    o.in_place = (sendbuf == recvbuf);
    if (is_root) TRY(check_overlap(fn, sendbuf, bytes, recvbuf, bytes, o.in_place));
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_reduce(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                   zccl_redop_t op, int root, zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_reduce";
    size_t bytes;
    zccl_op_t o = {.coll = ZCCL_COLL_REDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dt = datatype, .op = op, .root = root, .comm = comm};
    TRY(check_common(fn, comm, count, 1, datatype, 1, op, &bytes));
    TRY(check_root(fn, "root", comm, root));
    if (count == 0) return noop(o, stream);
    const bool is_root = (comm->rank == root);
    TRY(check_buf(fn, "sendbuf", sendbuf));
    if (is_root) TRY(check_buf(fn, "recvbuf", recvbuf));
    o.in_place = is_root && (sendbuf == recvbuf);
    if (is_root) TRY(check_overlap(fn, sendbuf, bytes, recvbuf, bytes, o.in_place));
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_send(const void *sendbuf, size_t count, zccl_datatype_t datatype, int peer,
                                 zccl_comm_t comm, zccl_stream_t stream) {
    const char *fn = "zccl_send";
    size_t bytes;
    zccl_op_t o = {.coll = ZCCL_COLL_SEND, .sendbuf = sendbuf, .recvbuf = NULL, .count = count, .dt = datatype, .op = ZCCL_SUM, .root = peer, .comm = comm};
    TRY(check_common(fn, comm, count, 1, datatype, 0, ZCCL_SUM, &bytes));
    TRY(check_root(fn, "peer", comm, peer));
    if (peer == comm->rank && !zccl__group_open())
        TRY(zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'peer' = %d is the calling rank: a send to oneself "
                        "completes only against a zccl_recv from oneself in the same group (zccl_group_start)", fn,
                        peer));
    if (count == 0) return ZCCL_SUCCESS; /* only the two ranks take part: nothing to keep in step */
    TRY(check_buf(fn, "sendbuf", sendbuf));
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_recv(void *recvbuf, size_t count, zccl_datatype_t datatype, int peer, zccl_comm_t comm,
                                 zccl_stream_t stream) {
    const char *fn = "zccl_recv";
    size_t bytes;
    zccl_op_t o = {.coll = ZCCL_COLL_RECV, .sendbuf = NULL, .recvbuf = recvbuf, .count = count, .dt = datatype, .op = ZCCL_SUM, .root = peer, .comm = comm};
    TRY(check_common(fn, comm, count, 1, datatype, 0, ZCCL_SUM, &bytes));
    TRY(check_root(fn, "peer", comm, peer));
    if (peer == comm->rank && !zccl__group_open())
        TRY(zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'peer' = %d is the calling rank: a receive from "
                        "oneself completes only against a zccl_send to oneself in the same group "
                        "(zccl_group_start)", fn, peer));
    if (count == 0) return ZCCL_SUCCESS;
    TRY(check_buf(fn, "recvbuf", recvbuf));
    return zccl__api_issue(&o, stream);
}

ZCCL_API zccl_result_t zccl_barrier(zccl_comm_t comm, zccl_stream_t stream) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_barrier: argument 'comm' is NULL");
    zccl_op_t o = {.coll = ZCCL_COLL_ALLREDUCE, .barrier = true, .sendbuf = NULL, .recvbuf = NULL, .count = 1, .dt = ZCCL_UINT8, .op = ZCCL_SUM, .root = 0, .comm = comm};
    return zccl__api_issue(&o, stream);
}

/* ---- shared with the other entry points of this layer (api.h) ------------------------------------------------ */

zccl_result_t zccl__check_common(const char *fn, zccl_comm_t comm, size_t count, size_t mult, zccl_datatype_t dt,
                                 int has_op, zccl_redop_t op, size_t *bytes) {
    return check_common(fn, comm, count, mult, dt, has_op, op, bytes);
}
zccl_result_t zccl__check_root(const char *fn, const char *what, zccl_comm_t comm, int root) {
    return check_root(fn, what, comm, root);
}
zccl_result_t zccl__check_buf(const char *fn, const char *name, const void *p) { return check_buf(fn, name, p); }
zccl_result_t zccl__check_overlap(const char *fn, const void *s, size_t sbytes, const void *r, size_t rbytes,
                                  bool in_place) {
    return check_overlap(fn, s, sbytes, r, rbytes, in_place);
}
const char *zccl__coll_api_name(zccl_coll_t c) { return (unsigned)c < ZCCL_COLL_COUNT ? coll_names[c] : "?"; }

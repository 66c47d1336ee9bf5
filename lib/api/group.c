/*
 * group.c — zccl_group_start / zccl_group_end (NCCL's ncclGroupStart / ncclGroupEnd), and the last step of every
 * entry point (zccl__api_issue): PreMulSum handles are resolved, then the operation is recorded in the calling
 * thread's open group or issued at once. See docs/groups.md.
 *
 * A group is recorded per thread. At the outermost zccl_group_end it is split per communicator (in order of first
 * use). Each communicator's part runs as one operation: first all its send/recv as ONE set of transfers that the
 * engine progresses together (zccl__engine_run_xfers), so the order in which a rank posted them does not matter and
 * an all-to-all written as n receives then n sends cannot deadlock; sends to oneself are copied into the matching
 * receives from oneself (k-th with k-th). Then its collectives, in recording order. The part runs on the stream its
 * operations named (one stream per communicator per group), or before zccl_group_end returns for NULL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api.h"
#include "engine.h"

#define MAX_DEPTH 1024

typedef struct {
    zccl_op_t op;
    zccl_stream_t stream;
    int index; /* 1-based position in the group, for messages */
} rec_t;

/* One communicator's part of a group. */
typedef struct {
    struct zccl_comm *comm;
    rec_t *recs;
    size_t n;
} part_t;

static _Thread_local int depth;
static _Thread_local rec_t *recs;
static _Thread_local size_t nrecs, caprecs;
static _Thread_local int next_index;

bool zccl__group_open(void) { return depth > 0; }

int zccl__group_suspend(void) {
    const int d = depth;
    depth = 0;
    return d;
}

void zccl__group_resume(int saved) { depth = saved; }

static bool has_op(zccl_coll_t c) {
    return c == ZCCL_COLL_ALLREDUCE || c == ZCCL_COLL_REDUCE_SCATTER || c == ZCCL_COLL_REDUCE;
}

zccl_result_t zccl__api_issue(const zccl_op_t *o, zccl_stream_t stream) {
    zccl_op_t b = *o;
    zccl_result_t mres = zccl__api_mem_type(&b, depth > 0); /* collectives.c: the call's memory type */
    if (mres != ZCCL_SUCCESS) {
        /* Refused like any invalid argument (a host buffer with a device one, buffers on two devices): the call
         * still takes its place on every rank, so the peers fail it too instead of waiting for it. */
        zccl_op_t r = b;
        r.vcounts = NULL;
        r.a2av = NULL;
        r.reason = NULL;
        r.group = NULL;
        zccl__op_release(&b);
        return zccl__coll_refuse_op(r, stream, mres);
    }
    if (has_op(b.coll) && !b.barrier && (unsigned)b.op >= ZCCL_NUM_OPS) {
        /* checked by the entry point (zccl__redop_check); copy the scalar now, so that destroying the handle later
         * does not affect an operation already issued */
        if (!zccl__redop_scalar(b.comm, b.op, b.scalar)) {
            zccl__op_release(&b);
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d is not a PreMulSum handle of this "
                               "communicator", zccl__coll_api_name(b.coll), (int)b.op);
        }
        b.premul = true;
        b.op = ZCCL_SUM;
    }
    if (depth == 0) return zccl__op_issue(&b, stream);
    if (nrecs == caprecs) {
        size_t cap = caprecs ? 2 * caprecs : 16;
        rec_t *p = realloc(recs, cap * sizeof *p);
        if (!p) {
            zccl__op_release(&b);
            return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory recording call %d of a group",
                               zccl__coll_api_name(b.coll), next_index + 1);
        }
        recs = p;
        caprecs = cap;
    }
    recs[nrecs++] = (rec_t){b, stream, ++next_index};
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_group_start(void) {
    if (depth >= MAX_DEPTH)
        return zccl__error(ZCCL_INVALID_USAGE, "zccl_group_start: groups nested deeper than %d (missing "
                           "zccl_group_end calls?)", MAX_DEPTH);
    if (depth++ == 0) next_index = 0;
    return ZCCL_SUCCESS;
}

/* "zccl_send to peer 2, count 1024" */
static void describe(const rec_t *r, char *buf, size_t len) {
    const zccl_op_t *o = &r->op;
    if (o->coll == ZCCL_COLL_SEND || o->coll == ZCCL_COLL_RECV)
        snprintf(buf, len, "%s %s peer %d%s, count %zu", zccl__coll_api_name(o->coll),
                 o->coll == ZCCL_COLL_SEND ? "to" : "from", o->root, o->root == o->comm->rank ? " (itself)" : "",
                 o->count);
    else
        snprintf(buf, len, "%s, count %zu", o->barrier ? "zccl_barrier" : zccl__coll_api_name(o->coll), o->count);
}

/* Prefixes the thread's last error with the call it belongs to. */
static zccl_result_t name_call(zccl_result_t res, const rec_t *r) {
    char d[160], msg[1024];
    describe(r, d, sizeof d);
    snprintf(msg, sizeof msg, "zccl_group_end: call %d (%s): %s", r->index, d, zccl__last_error());
    zccl__set_last_error(msg);
    return res;
}

static bool is_p2p(const rec_t *r) { return r->op.coll == ZCCL_COLL_SEND || r->op.coll == ZCCL_COLL_RECV; }
static bool is_self(const rec_t *r) { return is_p2p(r) && r->op.root == r->op.comm->rank; }

/* Sends to oneself pair with receives from oneself in order, with equal byte counts. */
static zccl_result_t check_self(const part_t *p) {
    size_t si = 0, ri = 0;
    for (;;) {
        while (si < p->n && !(is_self(&p->recs[si]) && p->recs[si].op.coll == ZCCL_COLL_SEND)) si++;
        while (ri < p->n && !(is_self(&p->recs[ri]) && p->recs[ri].op.coll == ZCCL_COLL_RECV)) ri++;
        if (si == p->n && ri == p->n) return ZCCL_SUCCESS;
        if (si == p->n || ri == p->n) {
            const rec_t *r = &p->recs[si == p->n ? ri : si];
            char d[160];
            describe(r, d, sizeof d);
            return zccl__error(ZCCL_INVALID_USAGE, "zccl_group_end: call %d (%s) has no matching %s in the group: a "
                               "send to oneself completes only against a receive from oneself", r->index, d,
                               r->op.coll == ZCCL_COLL_SEND ? "zccl_recv from itself" : "zccl_send to itself");
        }
        const zccl_op_t *s = &p->recs[si].op, *r = &p->recs[ri].op;
        const size_t sb = s->count * zccl_type_size(s->dt), rb = r->count * zccl_type_size(r->dt);
        if (sb != rb)
            return zccl__error(ZCCL_INVALID_USAGE, "zccl_group_end: call %d (zccl_send to itself, %zu bytes) and call "
                               "%d (zccl_recv from itself, %zu bytes) pair up but differ in size",
                               p->recs[si].index, sb, p->recs[ri].index, rb);
        si++;
        ri++;
    }
}

static void release_part(void *arg) {
    part_t *p = arg;
    for (size_t i = 0; i < p->n; i++) zccl__op_release(&p->recs[i].op);
    free(p->recs);
    free(p);
}

/* The send/recv of one part: self copies, then every other transfer in one engine phase. */
static zccl_result_t run_p2p(part_t *p) {
    struct zccl_comm *comm = p->comm;
    size_t nx = 0;
    for (size_t i = 0; i < p->n; i++) nx += is_p2p(&p->recs[i]) && !is_self(&p->recs[i]);
    zccl_xfer_t *xs = calloc(nx ? nx : 1, sizeof *xs);
    size_t *which = malloc((nx ? nx : 1) * sizeof *which);
    if (!xs || !which) {
        free(xs);
        free(which);
        return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_group_end: out of memory for %zu transfers", nx);
    }
    size_t si = 0, k = 0;
    for (size_t i = 0; i < p->n; i++) {
        const rec_t *r = &p->recs[i];
        if (!is_p2p(r)) continue;
        if (is_self(r)) {
            if (r->op.coll != ZCCL_COLL_RECV) continue;
            /* the matching send to itself: the next one after the previous pair (check_self proved it exists) */
            while (!(is_self(&p->recs[si]) && p->recs[si].op.coll == ZCCL_COLL_SEND)) si++;
            const zccl_op_t *s = &p->recs[si++].op;
            if (s->sendbuf != r->op.recvbuf) memmove(r->op.recvbuf, s->sendbuf, r->op.count * zccl_type_size(r->op.dt));
            continue;
        }
        zccl_xfer_t *x = &xs[k];
        which[k++] = i;
        x->peer = r->op.root;
        x->bytes = r->op.count * zccl_type_size(r->op.dt);
        x->dt = r->op.dt;
        x->op = ZCCL_SUM;
        if (r->op.coll == ZCCL_COLL_SEND) {
            x->is_send = true;
            x->src = r->op.sendbuf;
        } else {
            x->dst = r->op.recvbuf;
        }
    }
    zccl_result_t res = zccl__engine_run_xfers(comm, xs, nx);
    if (res != ZCCL_SUCCESS) {
        size_t bad = 0;
        while (bad < nx && xs[bad].complete) bad++;
        if (bad < nx) name_call(res, &p->recs[which[bad]]);
    }
    free(xs);
    free(which);
    return res;
}

static zccl_result_t run_part(const void *arg) {
    part_t *p = (part_t *)arg;
    struct zccl_comm *comm = p->comm;
    if (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
        return zccl__error(ZCCL_REMOTE_ERROR, "zccl_group_end on rank %d: the communicator was aborted", comm->rank);
    const zccl_result_t broken = __atomic_load_n(&comm->tc.async_error, __ATOMIC_ACQUIRE);
    if (broken != ZCCL_SUCCESS) {
        char msg[sizeof comm->async_msg + 128];
        snprintf(msg, sizeof msg, "zccl_group_end on rank %d: the communicator is broken by an earlier error: %s",
                 comm->rank, comm->async_msg);
        zccl__set_last_error(msg);
        return broken;
    }
    bool any_p2p = false;
    for (size_t i = 0; i < p->n; i++) any_p2p |= is_p2p(&p->recs[i]);
    zccl_result_t res = ZCCL_SUCCESS;
    if (any_p2p) {
        pthread_mutex_lock(&comm->exec_mutex);
        comm->seq = comm->cseq + 1; /* messages number it with the next collective, as send/recv */
        comm->op_name = "zccl_group_end (send/recv)";
        res = run_p2p(p);
        if (res != ZCCL_SUCCESS) { /* the ranks are out of step now: as a collective failing in the engine */
            snprintf(comm->async_msg, sizeof comm->async_msg, "%s", zccl__last_error());
            __atomic_store_n(&comm->tc.async_error, res, __ATOMIC_RELEASE);
            zccl__comm_poison(comm, comm->cseq + 1); /* counted with the next collective, as send/recv are */
        }
        pthread_mutex_unlock(&comm->exec_mutex);
    }
    for (size_t i = 0; i < p->n && res == ZCCL_SUCCESS; i++) {
        if (is_p2p(&p->recs[i])) continue;
        res = zccl__op_run(&p->recs[i].op);
        if (res != ZCCL_SUCCESS) name_call(res, &p->recs[i]);
    }
    return res;
}

ZCCL_API zccl_result_t zccl_group_end(void) {
    if (depth == 0)
        return zccl__error(ZCCL_INVALID_USAGE, "zccl_group_end: no group is open (no matching zccl_group_start on "
                           "this thread)");
    if (--depth > 0) return ZCCL_SUCCESS; /* nested: only the outermost end runs the group */
    rec_t *all = recs;
    const size_t n = nrecs;
    recs = NULL;
    nrecs = caprecs = 0;
    if (n == 0) {
        free(all);
        return ZCCL_SUCCESS;
    }
    /* Split per communicator, in order of first use; check each part before anything runs. */
    part_t **parts = calloc(n, sizeof *parts);
    zccl_stream_t *streams = calloc(n, sizeof *streams);
    bool *taken = calloc(n, sizeof *taken);
    size_t nparts = 0;
    zccl_result_t res = ZCCL_SUCCESS;
    if (!parts || !streams || !taken) res = zccl__error(ZCCL_SYSTEM_ERROR, "zccl_group_end: out of memory");
    for (size_t i = 0; i < n && res == ZCCL_SUCCESS; i++) {
        if (taken[i]) continue;
        part_t *p = calloc(1, sizeof *p);
        size_t cnt = 0;
        for (size_t j = i; j < n; j++) cnt += all[j].op.comm == all[i].op.comm;
        if (p) p->recs = malloc(cnt * sizeof *p->recs);
        if (!p || !p->recs) {
            free(p);
            res = zccl__error(ZCCL_SYSTEM_ERROR, "zccl_group_end: out of memory");
            break;
        }
        p->comm = all[i].op.comm;
        for (size_t j = i; j < n; j++) {
            if (all[j].op.comm != p->comm) continue;
            if (all[j].stream != all[i].stream && res == ZCCL_SUCCESS)
                res = zccl__error(ZCCL_INVALID_USAGE, "zccl_group_end: calls %d and %d use the same communicator on "
                                  "different streams; a group's operations on one communicator must share one stream",
                                  all[i].index, all[j].index);
            p->recs[p->n++] = all[j];
            taken[j] = true;
        }
        streams[nparts] = all[i].stream;
        parts[nparts++] = p;
        if (res == ZCCL_SUCCESS) res = check_self(p);
    }
    if (res != ZCCL_SUCCESS) { /* nothing ran: release every recorded operation */
        for (size_t i = 0; i < n; i++)
            if (!taken[i]) zccl__op_release(&all[i].op);
        for (size_t k = 0; k < nparts; k++) release_part(parts[k]);
    } else {
        size_t k = 0;
        for (; k < nparts; k++) {
            zccl_op_t o = {.coll = ZCCL_COLL_SEND, .comm = parts[k]->comm, .group = parts[k], .run_group = run_part,
                           .release_group = release_part};
            res = zccl__op_issue(&o, streams[k]); /* owns and releases the part */
            if (res != ZCCL_SUCCESS) break;
        }
        for (k++; k < nparts; k++) release_part(parts[k]); /* after a failure the later parts do not run */
    }
    free(parts);
    free(streams);
    free(taken);
    free(all);
    return res;
}

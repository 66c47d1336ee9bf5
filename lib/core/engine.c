/*
 * engine.c — the one progress engine. It walks a rank's schedule phase by phase; inside a phase it polls every
 * unfinished transfer in turn (each poll moves at most about one chunk, so a send and a receive of the same phase
 * advance together and neither starves), keeps transfers of one channel in order, and sleeps when nothing
 * moves. Nothing here allocates per chunk or takes a lock on the hot path.
 */
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "engine.h"
#include "engine_gdr.h"
#include "engine_stage.h"
#include "ib.h"
#include "kernels.h"
#include "notice.h"

static zccl_result_t ensure_scratch(struct zccl_comm *comm, size_t bytes) {
    if (bytes <= comm->scratch_bytes) return ZCCL_SUCCESS;
    void *p = NULL;
    size_t sz = (bytes + 4095) & ~(size_t)4095;
    if (posix_memalign(&p, 4096, sz) != 0)
        return zccl__error(ZCCL_SYSTEM_ERROR, "cannot allocate %zu bytes of scratch memory for the collective", sz);
    free(comm->scratch);
    comm->scratch = p;
    comm->scratch_bytes = sz;
    return ZCCL_SUCCESS;
}

/* Waits for any transfer to be able to move: sockets by poll, shared memory by the doorbell futex. */
static void wait_for_event(struct zccl_comm *comm, zccl_xfer_t *x, size_t nx, uint32_t seen, uint64_t idle_ns) {
    struct pollfd pfd[64];
    nfds_t np = 0;
    bool other = false;
    for (size_t i = 0; i < nx; i++) {
        if (x[i].complete) continue;
        short ev = 0;
        int fd = comm->tc.tp[x[i].peer]->wait_fd(&comm->tc, &x[i], &ev);
        if (fd >= 0 && np < 64) pfd[np++] = (struct pollfd){fd, ev, 0};
        else other = true;
    }
    if (np && comm->tc.wait_yield && idle_ns < ZCCL_YIELD_MAX_US * 1000u) { /* ZCCL_WAIT_YIELD, as doorbell.c */
        if (poll(pfd, np, 0) == 0) sched_yield();
    } else if (np)
        poll(pfd, np, other ? 1 : 50);
    else
        zccl__doorbell_wait(&comm->tc, seen, 50);
}

/* ---- call descriptors ---------------------------------------------------------------------------------------
 * When comm->desc_on, the first transfer of a collective on every channel (this rank -> peer, peer -> this rank) is
 * the call's 32-byte descriptor (calldesc.h), received into desc_in[peer] and compared before anything that follows
 * it on that channel is delivered (channels are FIFO and the engine keeps a channel's transfers in order). Calls
 * that differ (datatype, op, count, root, collective, or a rank one call ahead) therefore fail on the rank that
 * receives the first differing descriptor, with ZCCL_INVALID_USAGE naming both calls, before any of the peer's data
 * reaches the user's buffers; that rank then gives up and tells the others (notice.h). Cost: one small message per
 * channel per collective.
 *
 * Rooted collectives (broadcast, reduce, gather, scatter) send it to every peer. In them a rank can finish without
 * hearing from some peer at all (a gather non-root, a scatter root, the ranks of a chain before the one that refused;
 * two ranks that both think they are the root exchange nothing), so such a rank could return success from a call a
 * peer refused, or with another root, and learn it only at its next call. No message that already flows can tell it:
 * its part of the call completes before the peer even makes its call, so it must wait for something from every peer.
 * The cheapest such thing is the descriptor itself: every rank sends it to every peer in the call's first phase (on
 * the channels the schedule uses, ahead of their first data; on the others as the channel's only message) and
 * receives one from every peer in that phase too (a descriptor may travel by rendezvous: shm's single-copy path with
 * ZCCL_CMA_THRESHOLD=0 acknowledges a send only once the receiver took it, so a receive kept for a later phase would
 * hold every rank in the first one).
 * A peer that refused never sends it: the wait ends with its refusal notice (it is told before anything it sends
 * afterwards arrives); a peer with another root sends a differing one. Every rank therefore fails that call itself.
 * All descriptor sends leave in phase 0, before anything can block, so a rank whose schedule differs from a peer's
 * (another root) still delivers its descriptor and the mismatch is found instead of a deadlock. Cost: n-1 more
 * 32-byte messages per rank per rooted collective, and the call cannot finish before every peer has entered it
 * (docs/faults.md gives the measured latency). Not under ZCCL_CHECK=1, whose all-gather of descriptors did it, nor
 * under ZCCL_CHECK=-1, which gives this guarantee up for that latency. */

/* Whether the collective coll needs every pair's descriptor (above). */
static bool rooted(uint8_t coll) {
    return coll == ZCCL_COLL_BROADCAST || coll == ZCCL_COLL_REDUCE || coll == ZCCL_COLL_GATHER ||
           coll == ZCCL_COLL_SCATTER;
}

/* Appends a descriptor transfer with peer on the channel (send or receive) to xs. */
static void add_desc_xfer(struct zccl_comm *comm, zccl_xfer_t *d, int peer, bool snd) {
    memset(d, 0, sizeof *d);
    d->peer = peer;
    d->bytes = sizeof(zccl_call_desc_t);
    d->dt = ZCCL_UINT8;
    d->op = ZCCL_SUM;
    d->is_send = snd;
    if (snd) d->src = (const uint8_t *)&comm->desc_mine;
    else d->dst = (uint8_t *)&comm->desc_in[peer];
}

/* Rooted collectives: every peer's descriptor channel not opened yet by this run, one direction (snd) at a time.
 * Returns how many transfers it appended. */
static size_t add_all_pairs(struct zccl_comm *comm, zccl_xfer_t *xs, bool snd) {
    size_t nx = 0;
    for (int q = 0; q < comm->nranks; q++) {
        uint64_t *mark = &comm->desc_mark[2 * (size_t)q + (snd ? 0 : 1)];
        if (q == comm->rank || *mark == comm->desc_run) continue;
        *mark = comm->desc_run;
        add_desc_xfer(comm, &xs[nx++], q, snd);
    }
    return nx;
}

static zccl_result_t ensure_desc(struct zccl_comm *comm) {
    if (comm->desc_in) return ZCCL_SUCCESS;
    comm->desc_in = calloc((size_t)comm->nranks, sizeof *comm->desc_in);
    comm->desc_mark = calloc(2 * (size_t)comm->nranks, sizeof *comm->desc_mark);
    if (!comm->desc_in || !comm->desc_mark) {
        free(comm->desc_in);
        free(comm->desc_mark);
        comm->desc_in = NULL;
        comm->desc_mark = NULL;
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %d call descriptors", comm->nranks);
    }
    return ZCCL_SUCCESS;
}

static bool is_desc_recv(const struct zccl_comm *comm, const zccl_xfer_t *x) {
    return !x->is_send && comm->desc_in && x->dst == (uint8_t *)&comm->desc_in[x->peer];
}

/* Whether x carries a descriptor, either way. */
static bool is_desc(const struct zccl_comm *comm, const zccl_xfer_t *x) {
    return is_desc_recv(comm, x) || (x->is_send && x->src == (const uint8_t *)&comm->desc_mine);
}

/* x just completed: if it is a descriptor, does the peer's call match ours? */
static zccl_result_t verify_desc(struct zccl_comm *comm, const zccl_xfer_t *x) {
    if (!x->complete || !is_desc_recv(comm, x)) return ZCCL_SUCCESS;
    /* A peer that refused or gave up a call told us before it sent anything more (notice.c waits for our
     * acknowledgement): its reason is the better message, and it covers a peer that is one call ahead. */
    ZCCL_CHECK(zccl__notice_check(comm, comm->cseq, comm->op_name));
    const zccl_call_desc_t *theirs = &comm->desc_in[x->peer], *mine = &comm->desc_mine;
    if (memcmp(theirs, mine, sizeof *mine) == 0) return ZCCL_SUCCESS;
    char dm[160], dt[160];
    zccl__desc_describe(mine, comm->cseq_init, dm, sizeof dm);
    zccl__desc_describe(theirs, comm->cseq_init, dt, sizeof dt);
    const char *hint = theirs->seq != mine->seq ? " (one rank made a call the other did not: a call refused or "
                                                  "skipped on one rank?)"
                                                : "";
    return zccl__error(ZCCL_INVALID_USAGE, "ranks called different collectives: rank %d called %s, rank %d called %s"
                       "%s; every rank must make the same calls in the same order with the same count, datatype, op "
                       "and root", comm->rank, dm, x->peer, dt, hint);
}

static zccl_result_t check_stalled(struct zccl_comm *comm, zccl_xfer_t *x, size_t nx, uint64_t last_progress,
                                   size_t phase) {
    if (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
        return zccl__error(ZCCL_REMOTE_ERROR, "communicator aborted while rank %d waited", comm->rank);
    /* A peer refused or gave up this collective (or an earlier one) and said why: its reason beats the transports'
     * "closed its connection", and covers a peer this rank never connected to. */
    ZCCL_CHECK(zccl__notice_check(comm, comm->cseq, comm->op_name));
    for (size_t i = 0; i < nx; i++) {
        if (x[i].complete) continue;
        const zccl_transport_ops_t *tp = comm->tc.tp[x[i].peer];
        if (tp->departed && tp->departed(&comm->tc, x[i].peer)) {
            /* It left cleanly: whatever it sent is delivered, so look once more before calling it a mismatch. */
            bool pr = false, blocked = false;
            for (size_t j = 0; j < i && !blocked; j++) /* channel order, as in poll_once */
                blocked = !x[j].complete && x[j].peer == x[i].peer && x[j].is_send == x[i].is_send;
            if (!blocked) ZCCL_CHECK(tp->progress(&comm->tc, &x[i], &pr));
            ZCCL_CHECK(verify_desc(comm, &x[i]));
            if (pr || x[i].complete) return ZCCL_SUCCESS;
            return zccl__error(ZCCL_REMOTE_ERROR, "rank %d destroyed its communicator while rank %d still %s it (%s, "
                               "collective #%llu): did the ranks call the same collectives?", x[i].peer, comm->rank,
                               x[i].is_send ? "sends to" : "receives from", comm->op_name,
                               zccl__seq_shown(comm, comm->seq));
        }
        ZCCL_CHECK(tp->check_peer(&comm->tc, x[i].peer));
    }
    /* A rank we do not wait on directly can be lost too (the ring's far side): the collective cannot complete
     * then either, and its neighbours may stay alive, so look at every peer a transport can check cheaply. */
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank) continue;
        /* A rank that finished this collective and destroyed its communicator cleanly is not lost: it may exit while
         * slower ranks still pass its data on (transfers we wait on were checked above). */
        if (comm->tc.tp[r]->departed && comm->tc.tp[r]->departed(&comm->tc, r)) continue;
        ZCCL_CHECK(comm->tc.tp[r]->check_peer(&comm->tc, r));
    }
    if (comm->timeout_ms > 0 && zccl__now_ns() - last_progress > (uint64_t)comm->timeout_ms * 1000000ull) {
        for (size_t i = 0; i < nx; i++)
            if (!x[i].complete)
                return zccl__error(ZCCL_TIMEOUT, "rank %d: no progress for %lld ms %s rank %d (%s, collective #%llu, "
                                   "phase %zu, %zu of %zu bytes done)", comm->rank, (long long)comm->timeout_ms,
                                   x[i].is_send ? "sending to" : "receiving from", x[i].peer, comm->op_name,
                                   zccl__seq_shown(comm, comm->seq), phase, x[i].done, x[i].bytes);
    }
    return ZCCL_SUCCESS;
}

/* Advances every transfer that may move (transfers of one channel go in schedule order; a staged chunk whose copy
 * has not run waits, h). */
static zccl_result_t poll_once(struct zccl_comm *comm, zccl_xfer_t *x, size_t nx, const zccl_phase_hooks_t *h,
                               bool *all_done, bool *moved) {
    *all_done = true;
    *moved = false;
    for (size_t i = 0; i < nx; i++) {
        if (x[i].complete) continue;
        *all_done = false;
        if (h && !h->ready(h->ctx, i)) continue;
        bool blocked = false;
        for (size_t j = 0; j < i && !blocked; j++)
            blocked = !x[j].complete && x[j].peer == x[i].peer && x[j].is_send == x[i].is_send;
        if (blocked) continue;
        bool pr = false;
        ZCCL_CHECK(comm->tc.tp[x[i].peer]->progress(&comm->tc, &x[i], &pr));
        ZCCL_CHECK(verify_desc(comm, &x[i]));
        *moved |= pr;
    }
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__engine_phase(struct zccl_comm *comm, zccl_xfer_t *x, size_t nx, size_t phase,
                                 const zccl_phase_hooks_t *h) {
    uint64_t idle = 0, idle_since = 0, last_progress = zccl__now_ns();
    for (;;) {
        bool all_done, moved, ticked = false, busy = false;
        if (h) ZCCL_CHECK(h->tick(h->ctx, &ticked, &busy));
        ZCCL_CHECK(poll_once(comm, x, nx, h, &all_done, &moved));
        if (all_done) return ZCCL_SUCCESS;
        if (moved || ticked) { idle = 0; continue; }
        if (busy) { /* a copy the wire waits for runs on the GPU: no socket or doorbell will say when it is done */
            if ((++idle & 63) == 0) {
                if (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
                    return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: communicator aborted during collective #%llu",
                                       comm->rank, zccl__seq_shown(comm, comm->seq));
                sched_yield();
            }
            __builtin_ia32_pause();
            continue;
        }
        /* Poll for up to spin_ns (a peer one step behind answers within microseconds), reading the clock only every
         * 64 polls; then sleep. */
        if (idle++ == 0) idle_since = zccl__now_ns();
        if ((idle & 63) != 0 || zccl__now_ns() - idle_since < comm->spin_ns) {
            if ((idle & 63) == 0 && __atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
                return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: communicator aborted during collective #%llu",
                                   comm->rank, zccl__seq_shown(comm, comm->seq));
            __builtin_ia32_pause();
            continue;
        }
        /* Announce that we sleep, look once more, then sleep. */
        const uint32_t seen = zccl__doorbell_announce(&comm->tc);
        zccl_result_t res = poll_once(comm, x, nx, h, &all_done, &moved);
        if (res == ZCCL_SUCCESS && !moved && !all_done) wait_for_event(comm, x, nx, seen, zccl__now_ns() - idle_since);
        zccl__doorbell_awake(&comm->tc);
        ZCCL_CHECK(res);
        if (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
            return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: communicator aborted during collective #%llu", comm->rank,
                               zccl__seq_shown(comm, comm->seq));
        if (moved || all_done || __atomic_load_n(comm->tc.doorbell, __ATOMIC_SEQ_CST) != seen) {
            idle = 0;
            last_progress = zccl__now_ns();
            continue;
        }
        ZCCL_CHECK(check_stalled(comm, x, nx, last_progress, phase));
    }
}

/* A phase of a call on device memory: each send's source is copied out to host bytes now (after the phase's local
 * steps), each receive lands in host bytes; the device destination and operand move to dev_dst/dev_op2. */
static zccl_result_t stage_xfers(struct zccl_comm *comm, zccl_mem_type_t mt, zccl_xfer_t *x, size_t nx) {
    zccl__mem_stage_phase(&comm->mem_stage);
    for (size_t i = 0; i < nx; i++) {
        if (is_desc(comm, &x[i])) continue; /* host bytes already, and verify_desc finds them by address */
        if (x[i].is_send) {
            ZCCL_CHECK(zccl__mem_stage_send(&comm->mem_stage, mt, x[i].src, x[i].bytes, &x[i].src));
        } else {
            x[i].dev_dst = x[i].dst;
            x[i].dev_op2 = x[i].op2;
            x[i].op2 = NULL; /* the transport copies into the host bytes; the reduction happens on the device */
            ZCCL_CHECK(zccl__mem_stage_host(&comm->mem_stage, x[i].bytes, &x[i].dst));
        }
    }
    return ZCCL_SUCCESS;
}

/* The phase's receives (all complete) enter their device buffers: copied, or reduced with their operand. */
static zccl_result_t finish_recvs(struct zccl_comm *comm, zccl_mem_type_t mt, zccl_xfer_t *x, size_t nx) {
    for (size_t i = 0; i < nx; i++)
        if (!x[i].is_send && !is_desc(comm, &x[i]))
            ZCCL_CHECK(zccl__mem_stage_recv_done(&comm->mem_stage, mt, x[i].dev_dst, x[i].dev_op2, x[i].dst,
                                                 x[i].bytes, x[i].dt, x[i].op, x[i].divisor));
    return ZCCL_SUCCESS;
}

/* ---- local copies beside the wire --------------------------------------------------------------------------
 * A phase's COPY steps used to run before its transfers started, so the wire (and the peer waiting for this rank's
 * data) was idle while they ran: an out-of-place ring all-gather copies its own block in its first phase, 8 MiB of a
 * 16 MiB all-gather between 2 ranks. On host memory, in a phase without REDUCE steps, a copy whose destination no
 * transfer of the phase reads or writes and whose source no receive of the phase writes runs instead in slices of
 * COPY_SLICE bytes between the engine's polls (a phase hook); the phase ends once its transfers and its copies are
 * done. Copies that may not move beside the transfers run first, as before. */
#define COPY_SLICE ((size_t)256 << 10)
#define COPIES_BESIDE 8
typedef struct {
    struct { uint8_t *dst; const uint8_t *src; size_t len, done; } c[COPIES_BESIDE];
    size_t n, next; /* copies held; the first one not finished */
} beside_t;

static bool overlap(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
    return alen && blen && a < b + blen && b < a + alen;
}

/* Whether the copy dst <- src (len bytes) may run beside the phase's transfers xs. */
static bool copy_beside_ok(const zccl_xfer_t *xs, size_t nx, const uint8_t *dst, const uint8_t *src, size_t len) {
    for (size_t i = 0; i < nx; i++) {
        const zccl_xfer_t *x = &xs[i];
        if (x->is_send ? overlap(dst, len, x->src, x->bytes)
                       : overlap(dst, len, x->dst, x->bytes) || overlap(dst, len, x->op2, x->op2 ? x->bytes : 0) ||
                             overlap(src, len, x->dst, x->bytes))
            return false;
    }
    return true;
}

static bool beside_ready(void *ctx, size_t i) { (void)ctx, (void)i; return true; }

/* One slice of the first unfinished copy per turn of the engine's loop. */
static zccl_result_t beside_tick(void *ctx, bool *moved, bool *busy) {
    beside_t *b = ctx;
    *busy = false;
    while (b->next < b->n && b->c[b->next].done == b->c[b->next].len) b->next++;
    if (b->next == b->n) return ZCCL_SUCCESS;
    const size_t n = ZCCL_MIN(COPY_SLICE, b->c[b->next].len - b->c[b->next].done);
    zccl_kernel_copy(b->c[b->next].dst + b->c[b->next].done, b->c[b->next].src + b->c[b->next].done, n);
    b->c[b->next].done += n;
    *moved = true;
    return ZCCL_SUCCESS;
}

/* Runs what is left of the held copies (all of them: their phase has no transfers, or it ended). */
static void beside_finish(beside_t *b) {
    for (size_t i = 0; i < b->n; i++)
        if (b->c[i].done < b->c[i].len) zccl_kernel_copy(b->c[i].dst + b->c[i].done, b->c[i].src + b->c[i].done, b->c[i].len - b->c[i].done);
    b->n = b->next = 0;
}

zccl_result_t zccl__engine_run(struct zccl_comm *comm, const zccl_schedule_t *s, const void *sendbuf, void *recvbuf,
                               zccl_datatype_t dt, zccl_redop_t op) {
    const size_t es = zccl_type_size(dt);
    /* The call's memory type (mem): its table runs the COPY/REDUCE steps; device memory is staged through host
     * bytes for the transports (stage_xfers, finish_recvs). */
    const zccl_mem_type_t mt = comm->call_mem;
    const zccl_mem_ops_t *mops = zccl__mem_ops(mt);
    void *scratch = NULL;
    if (mops->call_begin) ZCCL_CHECK(mops->call_begin());
    bool pipelined = false;
    if (mt != ZCCL_MEM_HOST) ZCCL_CHECK(zccl__stage_pipelined(comm, mt, &pipelined));
    const uint64_t copies0 = comm->mem_stage.stage_copies,
                   flushes0 = mt != ZCCL_MEM_HOST ? zccl__ib_gdr_flushes(&comm->tc) : 0; /* device calls report it */
    if (mt == ZCCL_MEM_HOST) {
        ZCCL_CHECK(ensure_scratch(comm, s->tmp_elems * es));
        scratch = comm->scratch;
    } else {
        ZCCL_CHECK(zccl__mem_stage_scratch(&comm->mem_stage, mt, s->tmp_elems * es, &scratch));
    }
    /* Over verbs, every rank says whether it can run the call on the device buffers themselves; all do, or none. */
    zccl_gdr_call_t gdr = {.on = false};
    if (mt != ZCCL_MEM_HOST && comm->nranks > 1) {
        ZCCL_CHECK(zccl__gdr_agree(comm, s, sendbuf, recvbuf, scratch, es, &gdr));
        if (gdr.voted && !gdr.on)
            ZCCL_INFO(ZCCL_LOG_COLL, "rank %d: %s #%llu on device memory: no GPUDirect RDMA for this call: %s",
                      comm->rank, comm->op_name ? comm->op_name : "call", zccl__seq_shown(comm, comm->seq), gdr.why);
    }
    uint8_t *base[ZCCL_BUF_NONE] = {(uint8_t *)sendbuf, (uint8_t *)recvbuf, (uint8_t *)scratch};
    const zccl_redop_t kop = (op == ZCCL_AVG) ? ZCCL_SUM : op;
    const bool desc = comm->desc_on && comm->nranks > 1;
    const bool all_pairs = desc && rooted(comm->desc_mine.coll) && comm->rooted_desc && !comm->check;
    if (desc) {
        ZCCL_CHECK(ensure_desc(comm));
        comm->desc_run++;
    }
    const size_t extra = all_pairs ? 2 * ((size_t)comm->nranks - 1) : 0; /* the first phase's sends and receives */
    zccl_xfer_t xs_local[16], *xs = xs_local;
    size_t xcap = 16;
    zccl_result_t res = ZCCL_SUCCESS;
    size_t first = 0;
    for (size_t p = 0; p < s->nphases; p++) {
        const size_t end = s->phase_end[p];
        const size_t need = (end - first) * (desc ? 2 : 1) + extra; /* room for a descriptor before every transfer */
        if (need > xcap) {
            zccl_xfer_t *nxs = malloc(need * sizeof *nxs);
            if (!nxs) { res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %zu transfers", need); break; }
            if (xs != xs_local) free(xs);
            xs = nxs;
            xcap = need;
        }
        size_t nx = 0;
        beside_t held = {.n = 0};
        const bool may_hold = mt == ZCCL_MEM_HOST; /* device calls (staged, pipelined, GDR) copy through mops */
        /* Rooted calls: every pair's descriptors, both ways, in the first phase. Receives there too, not later: a
         * descriptor may travel by rendezvous (shm's single-copy path acknowledges only once the receiver took it), so a
         * send whose receive waited for a later phase would hold every rank in this one. */
        if (all_pairs && p == 0) {
            nx += add_all_pairs(comm, xs + nx, true);
            nx += add_all_pairs(comm, xs + nx, false);
        }
        for (size_t i = first; i < end; i++) {
            const zccl_step_t *st = &s->steps[i];
            uint8_t *b = base[st->buf] + st->off * es;
            if (st->kind == ZCCL_STEP_COPY) {
                const uint8_t *src = base[st->src] + st->src_off * es;
                if (src == b) continue;
                if (may_hold && held.n < COPIES_BESIDE) { /* decided once the phase's transfers are known */
                    held.c[held.n].dst = b, held.c[held.n].src = src, held.c[held.n].len = st->count * es;
                    held.c[held.n++].done = 0;
                    continue;
                }
                if ((res = mops->copy(b, src, st->count * es)) != ZCCL_SUCCESS) goto out;
                continue;
            }
            if (st->kind == ZCCL_STEP_REDUCE) {
                beside_finish(&held); /* the copies before it, in order (a reduction may read what they write) */
                res = mops->reduce(b, base[st->src] + st->src_off * es, base[st->src2] + st->src2_off * es, st->count,
                                   dt, kop, (st->final && op == ZCCL_AVG) ? (uint32_t)comm->nranks : 1);
                if (res != ZCCL_SUCCESS) goto out;
                continue;
            }
            const bool snd = st->kind == ZCCL_STEP_SEND;
            uint64_t *mark = desc ? &comm->desc_mark[2 * (size_t)st->peer + (snd ? 0 : 1)] : NULL;
            if (mark && *mark != comm->desc_run) { /* first transfer on this channel: the descriptor goes first */
                *mark = comm->desc_run;
                add_desc_xfer(comm, &xs[nx++], st->peer, snd);
            }
            zccl_xfer_t *x = &xs[nx++];
            memset(x, 0, sizeof *x);
            x->peer = st->peer;
            x->bytes = st->count * es;
            x->dt = dt;
            x->op = kop;
            if (st->kind == ZCCL_STEP_SEND) {
                x->is_send = true;
                x->src = b;
            } else {
                x->dst = b;
                if (st->src != ZCCL_BUF_NONE) {
                    x->op2 = base[st->src] + st->src_off * es;
                    x->divisor = (st->final && op == ZCCL_AVG) ? (uint32_t)comm->nranks : 1;
                }
            }
        }
        first = end;
        if (nx && gdr.on) { /* engine_gdr.c: the NIC reads and writes the device buffers */
            if ((res = zccl__gdr_run_phase(comm, mt, xs, nx, p, gdr.flush)) != ZCCL_SUCCESS) break;
            continue;
        }
        if (nx && pipelined) { /* engine_stage.c: chunks whose copies overlap the wire */
            if ((res = zccl__stage_run_phase(comm, mt, xs, nx, p)) != ZCCL_SUCCESS) break;
            continue;
        }
        if (nx && mt != ZCCL_MEM_HOST && (res = stage_xfers(comm, mt, xs, nx)) != ZCCL_SUCCESS) break;
        if (nx && held.n) { /* the held copies that may not run beside the transfers run first, the others beside */
            size_t k = 0;
            for (size_t i = 0; i < held.n; i++) {
                if (copy_beside_ok(xs, nx, held.c[i].dst, held.c[i].src, held.c[i].len)) held.c[k++] = held.c[i];
                else zccl_kernel_copy(held.c[i].dst, held.c[i].src, held.c[i].len);
            }
            held.n = k;
        }
        if (nx) {
            const zccl_phase_hooks_t hooks = {.ctx = &held, .ready = beside_ready, .tick = beside_tick};
            res = zccl__engine_phase(comm, xs, nx, p, held.n ? &hooks : NULL);
            if (res != ZCCL_SUCCESS) break;
        }
        beside_finish(&held);
        if (nx && mt != ZCCL_MEM_HOST && (res = finish_recvs(comm, mt, xs, nx)) != ZCCL_SUCCESS) break;
    }
out:
    if (xs != xs_local) free(xs);
    if (mt != ZCCL_MEM_HOST) /* which path a device call took, and what it cost in host staging copies */
        ZCCL_INFO(ZCCL_LOG_COLL, "rank %d: %s #%llu on device memory: path %s, %llu host staging copies (%llu in all), "
                  "%llu GDR flushes", comm->rank, comm->op_name ? comm->op_name : "call", zccl__seq_shown(comm, comm->seq),
                  gdr.on ? "gdr" : pipelined ? "staged-pipelined" : "staged",
                  (unsigned long long)(comm->mem_stage.stage_copies - copies0),
                  (unsigned long long)comm->mem_stage.stage_copies,
                  (unsigned long long)(zccl__ib_gdr_flushes(&comm->tc) - flushes0));
    return res;
}

zccl_result_t zccl__engine_run_xfers(struct zccl_comm *comm, zccl_xfer_t *x, size_t nx) {
    return nx ? zccl__engine_phase(comm, x, nx, 0, NULL) : ZCCL_SUCCESS;
}

/*
 * engine_stage.c — pipelined staging of a device call's phase (issue 24; docs/gpu.md "Pipelined staging").
 *
 * The transports move host bytes, so a device call's transfers go through the pinned staging block. Copying a whole
 * send out before the wire starts and a whole receive in after it ended costs copy + wire + copy; NCCL instead
 * moves a large message in chunks through a few buffers so that the copies of some chunks and the wire of others
 * run at once. Here each transfer of the phase becomes consecutive chunk transfers of ZCCL_STAGE_CHUNK_BYTES on the
 * same channel (every rank splits alike: the setting must match, and the call descriptor says the call is on device
 * memory, so a rank on host memory and one on device memory fail with a mismatch instead of disagreeing on sizes).
 * Then, while the engine's loop runs:
 *   - OUT lane (a CUDA stream): device-to-host copies of the send chunks, queued channel by channel in wire order,
 *     at most ZCCL_STAGE_DEPTH chunks per sending channel ahead of the wire; a send chunk may move once the event
 *     recorded after its copy has fired (the hooks' ready);
 *   - the wire: every transport as before, on host bytes;
 *   - IN lane (a second stream): a received chunk, as soon as it is complete, is copied into the device buffer or,
 *     for a reduction, into a bounce slot and combined with its operand by the CUDA kernel.
 * So the copy of chunk k+1, the wire of chunk k and the copy back of chunk k-1 overlap. The phase ends when every
 * transfer completed and the IN lane drained (the next phase's sends may read what this phase reduced). Host
 * staging stays one block per phase (mem_stage.c), so no host chunk is reused while a copy may still read it.
 */
#include <stdlib.h>
#include <string.h>
#include "engine_stage.h"
#include "mem_pipe.h"

enum { K_PLAIN = 0, K_SEND = 1, K_RECV = 2 };
enum { S_WAIT = 0, S_ISSUED = 1, S_READY = 2, S_LANDED = 3 };

typedef struct {
    uint8_t kind, state;
    const uint8_t *dev;  /* send: the device bytes of this chunk */
    size_t ticket;
} chunk_t;

typedef struct {
    struct zccl_comm *comm;
    zccl_mem_stage_t *st;
    zccl_xfer_t *y;       /* the phase's transfers, chunked */
    chunk_t *c;
    size_t ny;
    size_t *out;          /* send chunks in issue order (channel by channel, round robin) */
    size_t nout, issued, readied, lo, limit;
    size_t *in;           /* receive chunks */
    size_t nin, landed;
} pipe_t;

zccl_result_t zccl__stage_pipelined(struct zccl_comm *comm, zccl_mem_type_t mt, bool *on) {
    (void)comm;
    int64_t depth = 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_STAGE_DEPTH, &depth));
    const char *why = NULL;
    *on = depth > 0 && zccl__mem_pipe_usable(mt, &why);
    return ZCCL_SUCCESS;
}

static bool is_desc(const struct zccl_comm *comm, const zccl_xfer_t *x) {
    if (!comm->desc_in) return false;
    return x->is_send ? x->src == (const uint8_t *)&comm->desc_mine : x->dst == (uint8_t *)&comm->desc_in[x->peer];
}

static bool hook_ready(void *ctx, size_t i) {
    const pipe_t *p = ctx;
    return p->c[i].kind != K_SEND || p->c[i].state == S_READY;
}

static zccl_result_t hook_tick(void *ctx, bool *moved, bool *busy) {
    pipe_t *p = ctx;
    /* Send chunks that left: the lowest unsent one bounds how far ahead copies may run. */
    size_t inflight = 0;
    while (p->lo < p->issued && p->y[p->out[p->lo]].complete) p->lo++;
    for (size_t k = p->lo; k < p->issued; k++) inflight += !p->y[p->out[k]].complete;
    while (p->issued < p->nout && inflight < p->limit) {
        const size_t i = p->out[p->issued];
        ZCCL_CHECK(zccl__mem_pipe_copy(p->st, ZCCL_PIPE_OUT, (void *)p->y[i].src, p->c[i].dev, p->y[i].bytes,
                                       &p->c[i].ticket));
        p->c[i].state = S_ISSUED;
        p->issued++;
        inflight++;
    }
    /* The OUT lane runs in queue order: its events fire in that order. */
    while (p->readied < p->issued) {
        const size_t i = p->out[p->readied];
        bool done = false;
        ZCCL_CHECK(zccl__mem_pipe_done(p->st, p->c[i].ticket, &done));
        if (!done) break;
        p->c[i].state = S_READY;
        p->readied++;
        *moved = true;
    }
    *busy = p->readied < p->issued;
    /* Received chunks enter the device as they complete. */
    for (size_t k = 0; k < p->nin && p->landed < p->nin; k++) {
        const size_t i = p->in[k];
        zccl_xfer_t *x = &p->y[i];
        if (p->c[i].state == S_LANDED || !x->complete) continue;
        size_t t;
        if (x->dev_op2)
            ZCCL_CHECK(zccl__mem_pipe_reduce_in(p->st, x->dev_dst, x->dev_op2, x->dst, x->bytes, x->dt, x->op,
                                                x->divisor, &t));
        else
            ZCCL_CHECK(zccl__mem_pipe_copy(p->st, ZCCL_PIPE_IN, x->dev_dst, x->dst, x->bytes, &t));
        p->c[i].state = S_LANDED;
        p->landed++;
        *moved = true;
    }
    return ZCCL_SUCCESS;
}

/* Issue order of the send chunks: the k-th chunk of every sending channel before the (k+1)-th of any, so each
 * channel's head is always queued and a channel never waits on copies taken by another. */
typedef struct { size_t pos, chan, idx; } order_t;
static int order_cmp(const void *a, const void *b) {
    const order_t *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    if (x->chan != y->chan) return x->chan < y->chan ? -1 : 1;
    return 0;
}

static zccl_result_t build(pipe_t *p, zccl_mem_type_t mt, zccl_xfer_t *x, size_t nx, size_t chunk, size_t depth) {
    (void)mt;
    struct zccl_comm *comm = p->comm;
    size_t ny = 0;
    for (size_t i = 0; i < nx; i++)
        ny += is_desc(comm, &x[i]) || x[i].bytes == 0 ? 1 : (x[i].bytes + chunk - 1) / chunk;
    p->y = calloc(ny, sizeof *p->y);
    p->c = calloc(ny, sizeof *p->c);
    p->out = calloc(ny, sizeof *p->out);
    p->in = calloc(ny, sizeof *p->in);
    order_t *ord = calloc(ny, sizeof *ord);
    int *chan_pos = calloc((size_t)comm->nranks, sizeof *chan_pos);
    int *chan_id = malloc((size_t)comm->nranks * sizeof *chan_id);
    if (!p->y || !p->c || !p->out || !p->in || !ord || !chan_pos || !chan_id) {
        free(ord);
        free(chan_pos);
        free(chan_id);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for %zu staged chunks", ny);
    }
    for (int r = 0; r < comm->nranks; r++) chan_id[r] = -1;
    int nchan = 0;
    zccl__mem_stage_phase(p->st);
    zccl_result_t res = ZCCL_SUCCESS;
    size_t n = 0;
    for (size_t i = 0; i < nx && res == ZCCL_SUCCESS; i++) {
        if (is_desc(comm, &x[i])) {
            p->y[n] = x[i];
            p->c[n++].kind = K_PLAIN;
            continue;
        }
        uint8_t *host = NULL;
        if ((res = zccl__mem_stage_host(p->st, x[i].bytes, &host)) != ZCCL_SUCCESS) break;
        size_t off = 0;
        do {
            const size_t len = x[i].bytes - off < chunk ? x[i].bytes - off : chunk;
            zccl_xfer_t *y = &p->y[n];
            *y = x[i];
            y->bytes = len;
            y->done = 0;
            y->complete = false;
            y->started = false;
            memset(y->t, 0, sizeof y->t);
            if (x[i].is_send) {
                y->src = host + off;
                p->c[n] = (chunk_t){.kind = K_SEND, .state = S_WAIT, .dev = x[i].src + off};
                if (chan_id[x[i].peer] < 0) chan_id[x[i].peer] = nchan++;
                ord[p->nout++] = (order_t){(size_t)chan_pos[x[i].peer]++, (size_t)chan_id[x[i].peer], n};
            } else {
                y->dst = host + off;
                y->dev_dst = x[i].dst + off;
                y->dev_op2 = x[i].op2 ? x[i].op2 + off : NULL;
                y->op2 = NULL; /* the transport copies into host bytes; the reduction runs on the device */
                p->c[n] = (chunk_t){.kind = K_RECV, .state = S_WAIT};
                p->in[p->nin++] = n;
            }
            n++;
            off += len;
        } while (off < x[i].bytes);
    }
    qsort(ord, p->nout, sizeof *ord, order_cmp);
    for (size_t k = 0; k < p->nout; k++) p->out[k] = ord[k].idx;
    p->ny = n;
    p->limit = depth * (size_t)(nchan ? nchan : 1);
    free(ord);
    free(chan_pos);
    free(chan_id);
    if (res == ZCCL_SUCCESS) res = zccl__mem_pipe_phase(p->st, ZCCL_MEM_CUDA, p->nout + p->nin, chunk, depth);
    return res;
}

zccl_result_t zccl__stage_run_phase(struct zccl_comm *comm, zccl_mem_type_t mt, zccl_xfer_t *x, size_t nx,
                                    size_t phase) {
    int64_t chunk = 0, depth = 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_STAGE_CHUNK_BYTES, &chunk));
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_STAGE_DEPTH, &depth));
    pipe_t p = {.comm = comm, .st = &comm->mem_stage};
    zccl_result_t res = build(&p, mt, x, nx, (size_t)chunk, (size_t)depth);
    if (res == ZCCL_SUCCESS) {
        const zccl_phase_hooks_t h = {.ctx = &p, .ready = hook_ready, .tick = hook_tick};
        res = zccl__engine_phase(comm, p.y, p.ny, phase, &h);
    }
    if (res == ZCCL_SUCCESS) { /* the last receives completed in the loop's final pass */
        bool moved = false, busy = false;
        res = hook_tick(&p, &moved, &busy);
        if (res == ZCCL_SUCCESS && p.landed != p.nin)
            res = zccl__error(ZCCL_INTERNAL_ERROR, "pipelined staging: %zu of %zu received chunks not delivered",
                              p.nin - p.landed, p.nin);
    }
    /* Nothing of this phase may still be copying when the call moves on or returns. */
    const zccl_result_t dr = zccl__mem_pipe_drain(&comm->mem_stage);
    if (res == ZCCL_SUCCESS) res = dr;
    /* The caller names the first transfer that did not finish (group send/recv): mirror completion back. */
    for (size_t i = 0, n = 0; i < nx && n < p.ny; i++) {
        bool all = true;
        const size_t k = is_desc(comm, &x[i]) || x[i].bytes == 0 ? 1 : (x[i].bytes + (size_t)chunk - 1) / (size_t)chunk;
        for (size_t j = 0; j < k && n < p.ny; j++, n++) all &= p.y[n].complete;
        x[i].complete = all;
    }
    free(p.y);
    free(p.c);
    free(p.out);
    free(p.in);
    return res;
}

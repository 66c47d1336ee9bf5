/*
 * coll_quant.c — the quantized collectives (include/zccl.h, zccl_wire_t; docs/zero.md "Quantized collectives"):
 * ZeRO++'s qwZ (all-gather of block-quantized shards) and qgZ (reduce-scatter as one all-to-all of block-quantized
 * shards followed by a float32 reduction at the owner; Wang et al., 2023), composed from the communicator's own
 * all-to-all and all-gather on the wire bytes, with the formats of quant/.
 *
 * Why a composition and not a schedule of the engine: a ring reduce-scatter would requantize at each of its n-1 hops
 * (the error bound would grow with the rank count), while the all-to-all hop quantizes every contribution exactly
 * once; that is also the shape ZeRO++ chose. The all-reduce is that reduce-scatter followed by an all-gather of the
 * owners' requantized results, in which every rank, the owner included, decodes the same bytes: the outputs are
 * bitwise identical on every rank.
 *
 * The inner calls carry the wire's own 1-byte datatype (int8, uint8 for int4, the fp8 types), so ranks that pass
 * different wires fail on the call descriptor naming both calls instead of mixing formats.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api.h"
#include "mem.h"
#include "quant.h"
#include "zccl_ext.h"
#include "zccl_hier.h"

static zccl_datatype_t inner_type(zccl_wire_t w) {
    switch (w) {
    case ZCCL_WIRE_INT8: return ZCCL_INT8;
    case ZCCL_WIRE_INT4: return ZCCL_UINT8;
    case ZCCL_WIRE_FP8E4M3: return ZCCL_FLOAT8E4M3;
    default: return ZCCL_FLOAT8E5M2;
    }
}

/* Every wire string starts with a header naming what it encodes, so that ranks whose counts differ by less than the
 * padding (same wire size, so the call descriptors agree) fail on every rank instead of decoding garbage: each rank
 * checks the headers of every string it receives, and every rank receives one from every rank. */
typedef struct {
    uint64_t count; /* the call's count argument (the vector, not the shard) */
    uint32_t wire, block;
} wire_hdr_t;
#define HDR ((size_t)sizeof(wire_hdr_t))

static void put_hdr(uint8_t *p, size_t count, zccl_wire_t wire, size_t B) {
    const wire_hdr_t h = {.count = count, .wire = (uint32_t)wire, .block = (uint32_t)B};
    memcpy(p, &h, sizeof h);
}

/* Checks the n headers (stride w) against this rank's call; string k came from rank who[k] (who NULL: rank k). */
static zccl_result_t check_hdrs_from(const char *fn, const uint8_t *all, size_t w, size_t n, const int *who, size_t me,
                                     size_t count, zccl_wire_t wire, size_t B) {
    for (size_t k = 0; k < n; k++) {
        wire_hdr_t h;
        memcpy(&h, all + k * w, sizeof h);
        const size_t r = who ? (size_t)who[k] : k;
        if (h.count != count || h.wire != (uint32_t)wire || h.block != (uint32_t)B)
            return zccl__error(ZCCL_INVALID_USAGE, "%s: rank %zu called with count %llu, wire %s, block %u; rank %zu "
                               "(this rank) with count %zu, wire %s, block %zu: every rank must pass the same", fn, r,
                               (unsigned long long)h.count, h.wire < ZCCL_NUM_WIRES ? zccl__quant_name(h.wire) : "?",
                               h.block, me, count, zccl__quant_name(wire), B);
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t check_hdrs(const char *fn, const uint8_t *all, size_t w, size_t n, size_t me, size_t count,
                                zccl_wire_t wire, size_t B) {
    return check_hdrs_from(fn, all, w, n, NULL, me, count, wire, B);
}

/* ---- one wire string at a time, for the hierarchical calls (api.h) ---- */

zccl_datatype_t zccl__wire_inner_type(zccl_wire_t wire) { return inner_type(wire); }

void zccl__wire_encode(zccl_wire_t wire, const void *src, zccl_datatype_t dt, size_t count, uint8_t *dst) {
    const size_t B = zccl__quant_block();
    put_hdr(dst, count, wire, B);
    zccl__quant_encode(wire, src, dt, count, B, dst + HDR);
}

zccl_result_t zccl__wire_check(const char *fn, const uint8_t *all, size_t w, size_t n, const int *who, size_t me,
                               size_t count, zccl_wire_t wire) {
    return check_hdrs_from(fn, all, w, n, who, me, count, wire, zccl__quant_block());
}

void zccl__wire_decode(zccl_wire_t wire, const uint8_t *str, size_t count, void *dst, zccl_datatype_t dt) {
    zccl__quant_decode(wire, str + HDR, count, zccl__quant_block(), dst, dt);
}

ZCCL_API size_t zccl_wire_bytes(zccl_wire_t wire, size_t count) {
    if (!zccl__quant_is_quantized(wire)) return 0;
    const size_t q = zccl__quant_bytes(wire, count, zccl__quant_block());
    return q == SIZE_MAX || q == 0 ? q : q + HDR;
}

ZCCL_API const char *zccl_wire_name(zccl_wire_t wire) {
    return (unsigned)wire < ZCCL_NUM_WIRES ? zccl__quant_name(wire) : NULL;
}

/* The checks every quantized call shares after the common ones (api.h). */
zccl_result_t zccl__check_wire(const char *fn, zccl_comm_t comm, zccl_wire_t wire, zccl_datatype_t dt, bool has_op,
                               zccl_redop_t op, size_t shard, size_t mult, size_t *wbytes) {
    if (!zccl__quant_is_quantized(wire))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'wire' = %d is not a zccl_wire_t (0..%d)", fn,
                           (int)wire, ZCCL_NUM_WIRES - 1);
    if (!zccl__quant_dtype_ok(dt))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'datatype' = %d: the %s wire format takes float32, "
                           "float64, float16 or bfloat16 data only (ZCCL_WIRE_FULL takes any datatype)", fn, (int)dt,
                           zccl__quant_name(wire));
    if (has_op && op != ZCCL_SUM && op != ZCCL_AVG)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d: a quantized reduction (wire %s) takes "
                           "ZCCL_SUM or ZCCL_AVG only (its error bound is a sum's)", fn, (int)op,
                           zccl__quant_name(wire));
    if (zccl__group_open())
        return zccl__error(ZCCL_INVALID_USAGE, "%s: quantized collectives run their inner collectives at once and "
                           "cannot be part of a zccl_group_start/zccl_group_end group", fn);
    const size_t q = zccl__quant_bytes(wire, shard, zccl__quant_block()), w = q == SIZE_MAX ? q : q + HDR;
    size_t total;
    if (q == SIZE_MAX || !zccl__mul_ok(w, mult, &total) || total > SIZE_MAX / 4)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'count' = %zu elements x %zu shards: the %s wire "
                           "strings overflow the address space", fn, shard, mult, zccl__quant_name(wire));
    (void)comm;
    *wbytes = w;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__check_host_mem(const char *fn, const void *sendbuf, const void *recvbuf) {
    zccl_mem_type_t t = ZCCL_MEM_HOST;
    ZCCL_CHECK(zccl__mem_call_type(fn, sendbuf, recvbuf, &t));
    if (t != ZCCL_MEM_HOST)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: 'sendbuf'/'recvbuf' are CUDA device memory: quantized "
                           "collectives take host memory only (docs/zero.md)", fn);
    return ZCCL_SUCCESS;
}

/* A refused call still takes its place in the sequence, so that every peer fails it (include/zccl.h "Invalid
 * calls"). */
#define REFUSE_IF(call)                                                                                    \
    do {                                                                                                   \
        zccl_result_t r__ = (call);                                                                        \
        if (r__ != ZCCL_SUCCESS) {                                                                         \
            return zccl__coll_refuse_op(o, stream, r__);                                                   \
        }                                                                                                  \
    } while (0)

/* Waits for the stream's queued work: the quantized call then runs on the calling thread. */
static zccl_result_t settle_stream(zccl_stream_t stream) {
    return stream ? zccl_stream_synchronize(stream) : ZCCL_SUCCESS;
}

void zccl__wire_scratch_free(struct zccl_comm *comm) {
    if (!comm) return;
    free(comm->wire_scratch);
    comm->wire_scratch = NULL;
    comm->wire_scratch_bytes = 0;
}

/* The call's wire strings to send (sbytes), received (rbytes) and float32 sums (abytes), carved from comm's scratch
 * area (64-byte aligned parts), which grows when a call needs more and is otherwise reused: the pages stay faulted
 * in between calls (at 64 MiB a fresh allocation per call made a reduce-scatter 3-4x slower than at 16 MiB per
 * byte). Not freed by the call. */
static size_t up64(size_t b) { return (b + 63) / 64 * 64; }
static zccl_result_t alloc_all(const char *fn, zccl_comm_t comm, size_t sbytes, size_t rbytes, size_t abytes,
                               uint8_t **ws, uint8_t **wr, float **acc) {
    const size_t need = up64(sbytes) + up64(rbytes) + up64(abytes);
    if (need > comm->wire_scratch_bytes) {
        void *p = NULL;
        if (posix_memalign(&p, 64, need) != 0)
            return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for the wire buffers (%zu + %zu + %zu bytes)",
                               fn, sbytes, rbytes, abytes);
        free(comm->wire_scratch);
        comm->wire_scratch = p;
        comm->wire_scratch_bytes = need;
    }
    uint8_t *base = comm->wire_scratch;
    *ws = base;
    *wr = base + up64(sbytes);
    *acc = (float *)(void *)(base + up64(sbytes) + up64(rbytes));
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_allgather_wire(const void *sendbuf, void *recvbuf, size_t sendcount,
                                           zccl_datatype_t datatype, zccl_wire_t wire, zccl_comm_t comm,
                                           zccl_stream_t stream) {
    if (wire == ZCCL_WIRE_FULL) return zccl_allgather(sendbuf, recvbuf, sendcount, datatype, comm, stream);
    const char *fn = "zccl_allgather_wire";
    zccl_op_t o = {.coll = ZCCL_COLL_ALLGATHER, .count = sendcount, .dt = datatype, .op = ZCCL_SUM, .comm = comm};
    uint8_t *wsend = NULL, *wrecv = NULL;
    float *acc = NULL;
    size_t total, w;
    REFUSE_IF(zccl__check_common(fn, comm, sendcount, (size_t)(comm ? comm->nranks : 1), datatype, 0, ZCCL_SUM,
                                 &total));
    const size_t n = (size_t)comm->nranks, me = (size_t)comm->rank;
    REFUSE_IF(zccl__check_wire(fn, comm, wire, datatype, false, ZCCL_SUM, sendcount, n, &w));
    const zccl_datatype_t idt = inner_type(wire);
    if (sendcount == 0) {
        ZCCL_CHECK(settle_stream(stream));
        return zccl_allgather(NULL, NULL, 0, idt, comm, NULL);
    }
    REFUSE_IF(zccl__check_buf(fn, "sendbuf", sendbuf));
    REFUSE_IF(zccl__check_buf(fn, "recvbuf", recvbuf));
    const size_t sbytes = total / n;
    const bool in_place = (const char *)sendbuf == (const char *)recvbuf + me * sbytes;
    REFUSE_IF(zccl__check_overlap(fn, sendbuf, sbytes, recvbuf, total, in_place));
    REFUSE_IF(zccl__check_host_mem(fn, sendbuf, recvbuf));
    REFUSE_IF(alloc_all(fn, comm, w, w * n, 0, &wsend, &wrecv, &acc));
    const size_t B = zccl__quant_block();
    put_hdr(wsend, sendcount, wire, B);
    zccl__quant_encode(wire, sendbuf, datatype, sendcount, B, wsend + HDR);
    zccl_result_t res = settle_stream(stream);
    if (res == ZCCL_SUCCESS) res = zccl_allgather(wsend, wrecv, w, idt, comm, NULL);
    if (res == ZCCL_SUCCESS) res = check_hdrs(fn, wrecv, w, n, me, sendcount, wire, B);
    if (res == ZCCL_SUCCESS)
        for (size_t r = 0; r < n; r++)
            zccl__quant_decode(wire, wrecv + r * w + HDR, sendcount, B, (char *)recvbuf + r * sbytes, datatype);
    return res;
}

/* Decodes and adds the n wire strings of `cnt` elements (stride w) in rank order, AVG divided. */
static void reduce_strings(zccl_wire_t wire, const uint8_t *wrecv, size_t w, size_t n, size_t cnt, size_t B,
                           zccl_redop_t op, float *acc) {
    memset(acc, 0, cnt * sizeof *acc);
    for (size_t q = 0; q < n; q++) zccl__quant_decode_add(wire, wrecv + q * w + HDR, cnt, B, acc);
    if (op == ZCCL_AVG) {
        const float d = (float)n;
        for (size_t i = 0; i < cnt; i++) acc[i] = acc[i] / d;
    }
}

ZCCL_API zccl_result_t zccl_reduce_scatter_wire(const void *sendbuf, void *recvbuf, size_t recvcount,
                                                zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire,
                                                zccl_comm_t comm, zccl_stream_t stream) {
    if (wire == ZCCL_WIRE_FULL) return zccl_reduce_scatter(sendbuf, recvbuf, recvcount, datatype, op, comm, stream);
    const char *fn = "zccl_reduce_scatter_wire";
    zccl_op_t o = {.coll = ZCCL_COLL_ALLTOALL, .count = recvcount, .dt = datatype, .op = ZCCL_SUM, .comm = comm};
    uint8_t *wsend = NULL, *wrecv = NULL;
    float *acc = NULL;
    size_t total, w;
    REFUSE_IF(zccl__check_common(fn, comm, recvcount, (size_t)(comm ? comm->nranks : 1), datatype, 1, op, &total));
    const size_t n = (size_t)comm->nranks, me = (size_t)comm->rank;
    REFUSE_IF(zccl__check_wire(fn, comm, wire, datatype, true, op, recvcount, n, &w));
    const zccl_datatype_t idt = inner_type(wire);
    if (recvcount == 0) {
        ZCCL_CHECK(settle_stream(stream));
        return zccl_alltoall(NULL, NULL, 0, idt, comm, NULL);
    }
    REFUSE_IF(zccl__check_buf(fn, "sendbuf", sendbuf));
    REFUSE_IF(zccl__check_buf(fn, "recvbuf", recvbuf));
    const size_t rbytes = total / n;
    const bool in_place = (const char *)recvbuf == (const char *)sendbuf + me * rbytes;
    REFUSE_IF(zccl__check_overlap(fn, sendbuf, total, recvbuf, rbytes, in_place));
    REFUSE_IF(zccl__check_host_mem(fn, sendbuf, recvbuf));
    REFUSE_IF(alloc_all(fn, comm, w * n, w * n, recvcount * sizeof(float), &wsend, &wrecv, &acc));
    const size_t B = zccl__quant_block();
    for (size_t q = 0; q < n; q++) {
        put_hdr(wsend + q * w, recvcount, wire, B);
        zccl__quant_encode(wire, (const char *)sendbuf + q * rbytes, datatype, recvcount, B, wsend + q * w + HDR);
    }
    zccl_result_t res = settle_stream(stream);
    if (res == ZCCL_SUCCESS) res = zccl_alltoall(wsend, wrecv, w, idt, comm, NULL);
    if (res == ZCCL_SUCCESS) res = check_hdrs(fn, wrecv, w, n, me, recvcount, wire, B);
    if (res == ZCCL_SUCCESS) {
        reduce_strings(wire, wrecv, w, n, recvcount, B, op, acc);
        zccl__quant_narrow(acc, recvcount, datatype, recvbuf);
    }
    return res;
}

ZCCL_API zccl_result_t zccl_allreduce_wire(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                           zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm, zccl_stream_t stream) {
    if (wire == ZCCL_WIRE_FULL) return zccl_allreduce(sendbuf, recvbuf, count, datatype, op, comm, stream);
    const char *fn = "zccl_allreduce_wire";
    zccl_op_t o = {.coll = ZCCL_COLL_ALLTOALL, .count = count, .dt = datatype, .op = ZCCL_SUM, .comm = comm};
    uint8_t *wsend = NULL, *wrecv = NULL;
    float *acc = NULL;
    size_t bytes, w;
    REFUSE_IF(zccl__check_common(fn, comm, count, 1, datatype, 1, op, &bytes));
    const size_t n = (size_t)comm->nranks, me = (size_t)comm->rank;
    const size_t L = count / n + (count % n != 0); /* shard length; the last shards may be shorter or empty */
    REFUSE_IF(zccl__check_wire(fn, comm, wire, datatype, true, op, L, n, &w));
    const zccl_datatype_t idt = inner_type(wire);
    if (count == 0) {
        ZCCL_CHECK(settle_stream(stream));
        zccl_result_t res = zccl_alltoall(NULL, NULL, 0, idt, comm, NULL);
        return res != ZCCL_SUCCESS ? res : zccl_allgather(NULL, NULL, 0, idt, comm, NULL);
    }
    REFUSE_IF(zccl__check_buf(fn, "sendbuf", sendbuf));
    REFUSE_IF(zccl__check_buf(fn, "recvbuf", recvbuf));
    const bool in_place = sendbuf == recvbuf;
    REFUSE_IF(zccl__check_overlap(fn, sendbuf, bytes, recvbuf, bytes, in_place));
    REFUSE_IF(zccl__check_host_mem(fn, sendbuf, recvbuf));
    REFUSE_IF(alloc_all(fn, comm, w * n, w * n, L * sizeof(float), &wsend, &wrecv, &acc));
    const size_t B = zccl__quant_block(), es = zccl_type_size(datatype);
#define SHARD_LEN(q) ((q) * L >= count ? 0 : count - (q) * L < L ? count - (q) * L : L)
    for (size_t q = 0; q < n; q++) {
        const size_t c = SHARD_LEN(q), used = HDR + zccl__quant_bytes(wire, c, B);
        put_hdr(wsend + q * w, count, wire, B);
        zccl__quant_encode(wire, (const char *)sendbuf + q * L * es, datatype, c, B, wsend + q * w + HDR);
        memset(wsend + q * w + used, 0, w - used);
    }
    zccl_result_t res = settle_stream(stream);
    if (res == ZCCL_SUCCESS) res = zccl_alltoall(wsend, wrecv, w, idt, comm, NULL);
    /* every rank sees every rank's header here, so all of them stop before the all-gather alike */
    if (res == ZCCL_SUCCESS) res = check_hdrs(fn, wrecv, w, n, me, count, wire, B);
    if (res == ZCCL_SUCCESS) {
        /* Reduce this rank's shard, requantize it into its own place of the all-gather buffer, gather in place. */
        const size_t mine = SHARD_LEN(me), used = HDR + zccl__quant_bytes(wire, mine, B);
        reduce_strings(wire, wrecv, w, n, mine, B, op, acc);
        uint8_t *own = wrecv + me * w;
        put_hdr(own, count, wire, B);
        zccl__quant_encode(wire, acc, ZCCL_FLOAT32, mine, B, own + HDR);
        memset(own + used, 0, w - used);
        res = zccl_allgather(own, wrecv, w, idt, comm, NULL);
    }
    if (res == ZCCL_SUCCESS)
        for (size_t q = 0; q < n; q++)
            zccl__quant_decode(wire, wrecv + q * w + HDR, SHARD_LEN(q), B, (char *)recvbuf + q * L * es, datatype);
#undef SHARD_LEN
    return res;
}

/* ---- this rank's quantization, alone: the ZeRO layer's error feedback (lib/api/zccl_ext.h) ---- */

zccl_result_t zccl__wire_roundtrip(zccl__wire_call_t call, const void *src, size_t count, zccl_datatype_t datatype,
                                   zccl_wire_t wire, int nranks, float *out) {
    const char *fn = "zccl__wire_roundtrip";
    if (!zccl__quant_is_quantized(wire))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: wire %d is not a quantized format", fn, (int)wire);
    if (!zccl__quant_dtype_ok(datatype))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: datatype %d is not float32, float64, float16 or bfloat16", fn,
                           (int)datatype);
    if ((unsigned)call > ZCCL__WIRE_ALLREDUCE || nranks < 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: call %d, nranks %d", fn, (int)call, nranks);
    const size_t n = (size_t)nranks, B = zccl__quant_block(), es = zccl_type_size(datatype);
    /* The shards exactly as the calls above encode this rank's contribution: the all-gather one of count elements,
     * the reduce-scatter n of count each, the all-reduce n of L = ceil(count / n), the last ones shorter or empty. */
    const size_t L = call == ZCCL__WIRE_ALLREDUCE ? count / n + (count % n != 0) : count;
    const size_t nsh = call == ZCCL__WIRE_ALLGATHER ? 1 : n;
    const size_t total = call == ZCCL__WIRE_REDUCE_SCATTER ? count * n : count;
    if (total == 0) return ZCCL_SUCCESS;
    const size_t q = zccl__quant_bytes(wire, L, B);
    uint8_t *str = q == SIZE_MAX ? NULL : malloc(q ? q : 1);
    if (!str) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for a wire string of %zu elements", fn, L);
    for (size_t s = 0; s < nsh; s++) {
        const size_t first = s * L, c = first >= total ? 0 : total - first < L ? total - first : L;
        if (c == 0) continue;
        zccl__quant_encode(wire, (const char *)src + first * es, datatype, c, B, str);
        zccl__quant_decode(wire, str, c, B, out + first, ZCCL_FLOAT32); /* the value the owner's decode_add adds */
    }
    free(str);
    return ZCCL_SUCCESS;
}

/* ---- queued on a stream: the ZeRO layer's qgZ / qwZ (lib/api/zccl_ext.h) ---- */

typedef struct {
    zccl__wire_call_t call;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    zccl_datatype_t dt;
    zccl_redop_t op;
    zccl_wire_t wire;
    zccl_comm_t comm;
    zccl__wire_pre_t pre; /* NULL: none */
    void *pre_arg;
    int pre_tag;
} wire_task_t;

/* On the stream's thread, in the stream's order: the call runs there as if it had been made with no stream, after
 * the caller's pre step. A failed pre step refuses the call's first inner collective, so that the peers fail on it
 * quoting this rank's message instead of waiting. */
static zccl_result_t run_wire_task(const void *arg) {
    const wire_task_t *t = arg;
    if (t->pre) {
        const zccl_result_t r = t->pre(t->pre_arg, t->pre_tag);
        if (r != ZCCL_SUCCESS) return zccl__coll_refuse(t->comm, NULL, r);
    }
    switch (t->call) {
    case ZCCL__WIRE_ALLGATHER:
        return zccl_allgather_wire(t->sendbuf, t->recvbuf, t->count, t->dt, t->wire, t->comm, NULL);
    case ZCCL__WIRE_REDUCE_SCATTER:
        return zccl_reduce_scatter_wire(t->sendbuf, t->recvbuf, t->count, t->dt, t->op, t->wire, t->comm, NULL);
    case ZCCL__WIRE_ALLGATHER_HIER:
        return zccl_allgather_hier(t->sendbuf, t->recvbuf, t->count, t->dt, t->wire, t->comm, NULL);
    default:
        return zccl_allreduce_wire(t->sendbuf, t->recvbuf, t->count, t->dt, t->op, t->wire, t->comm, NULL);
    }
}

zccl_result_t zccl__wire_enqueue_pre(zccl__wire_call_t call, const void *sendbuf, void *recvbuf, size_t count,
                                     zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm,
                                     zccl_stream_t stream, zccl__wire_pre_t pre, void *pre_arg, int pre_tag) {
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl__wire_enqueue: comm is NULL");
    if ((unsigned)call > ZCCL__WIRE_ALLGATHER_HIER)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl__wire_enqueue: call %d out of range", (int)call);
    wire_task_t t = {call, sendbuf, recvbuf, count, datatype, op, wire, comm, pre, pre_arg, pre_tag};
    if (!stream) return run_wire_task(&t);
    wire_task_t *q = malloc(sizeof *q);
    if (!q) return zccl__error(ZCCL_SYSTEM_ERROR, "zccl__wire_enqueue: out of memory");
    *q = t;
    /* A host task on the stream (the shape of a group's part, lib/api/group.c): it takes no sequence number of its
     * own; the quantized call's inner collectives take theirs when it runs. */
    zccl_op_t o = {.coll = ZCCL_COLL_SEND, .comm = comm, .group = q, .run_group = run_wire_task, .release_group = free};
    return zccl__op_issue(&o, stream); /* owns q from here, run or not */
}

zccl_result_t zccl__wire_enqueue(zccl__wire_call_t call, const void *sendbuf, void *recvbuf, size_t count,
                                 zccl_datatype_t datatype, zccl_redop_t op, zccl_wire_t wire, zccl_comm_t comm,
                                 zccl_stream_t stream) {
    return zccl__wire_enqueue_pre(call, sendbuf, recvbuf, count, datatype, op, wire, comm, stream, NULL, NULL, 0);
}

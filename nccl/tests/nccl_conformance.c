/*
 * nccl_conformance.c — a program written against NVIDIA's nccl.h (CUDA's, not a copy) and linked only to zccl's
 * libnccl.so.2, as an NCCL application would be. No CUDA runtime: cudaStream_t comes from the header and no
 * CUDA library is linked; every buffer is host memory.
 *
 *   nccl_conformance world N [DEADLINE_S]   N ranks (forked), each: the collective matrix, groups, split, shrink,
 *                                           non-blocking init and calls, bad input
 *   nccl_conformance initall K [DEADLINE_S] one process, K ranks from ncclCommInitAll, grouped collectives
 *   nccl_conformance timeout [DEADLINE_S]   2 ranks: a grouped send whose receive never comes (set ZCCL_TIMEOUT_MS)
 *   nccl_conformance env                    the NCCL_* -> ZCCL_* mapping done at load (ctest sets the NCCL_* values)
 *   nccl_conformance devptr FAKE_LIBCUDA    1 rank: with a stand-in CUDA driver loaded, its "device" memory is
 *                                           refused with a message and host memory still works
 *
 * Rank 0 makes the unique id and hands it to the others through a pipe. The parent kills every rank and fails
 * once DEADLINE_S (default 240) passes. Every expected value is computed here, from the inputs, in double
 * precision and then wrapped or rounded to the datatype; nothing is taken from the library under test.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1, g_failures;

__attribute__((format(printf, 1, 2))) static void failf(const char *fmt, ...) {
    if (++g_failures > 30) return;
    char line[2048];
    int k = snprintf(line, sizeof line, "FAIL rank %d: ", g_rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + k, sizeof line - (size_t)k - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    if (write(2, line, strlen(line)) < 0) {} /* one write: lines of several ranks do not interleave */
}

#define CHECK(call)                                                                                                    \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != ncclSuccess) {                                                                                       \
            failf("%s:%d %s -> %d (%s): %s", __FILE__, __LINE__, #call, (int)r_, ncclGetErrorString(r_),              \
                  ncclGetLastError(NULL));                                                                             \
            return -1;                                                                                                 \
        }                                                                                                              \
    } while (0)

#define EXPECT_ERR(call, want, needle)                                                                                 \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != (want))                                                                                              \
            failf("%s:%d %s -> %d, expected %d", __FILE__, __LINE__, #call, (int)r_, (int)(want));                    \
        else if (!strstr(ncclGetLastError(NULL), (needle)))                                                            \
            failf("%s:%d %s: message '%s' does not mention '%s'", __FILE__, __LINE__, #call, ncclGetLastError(NULL),  \
                  (needle));                                                                                           \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- datatypes: encoding exact inputs, decoding outputs ------------------------------------------------------ */
static const ncclDataType_t all_types[] = {ncclInt8,    ncclUint8,   ncclInt32,    ncclUint32,
                                           ncclInt64,   ncclUint64,  ncclFloat16,  ncclFloat32,
                                           ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
#define NTYPES ((int)(sizeof all_types / sizeof all_types[0]))
static const char *type_name[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                  "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
static size_t type_size(ncclDataType_t t) {
    static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return s[t];
}
static int is_float(ncclDataType_t t) { return t >= ncclFloat16; }
static int is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64 || is_float(t); }
/* mantissa bits of the float types (for the tolerance of averages) */
static int mant_bits(ncclDataType_t t) {
    switch (t) {
    case ncclFloat16: return 10;
    case ncclFloat32: return 23;
    case ncclFloat64: return 52;
    case ncclBfloat16: return 7;
    case ncclFloat8e4m3: return 3;
    case ncclFloat8e5m2: return 2;
    default: return 60;
    }
}

/* Small binary float formats: exact encoding of values they represent (the inputs here are small integers). */
static uint32_t mini_encode(double v, int ebits, int mbits, int bias) {
    uint32_t sign = v < 0;
    v = fabs(v);
    if (v == 0) return sign << (ebits + mbits);
    int e;
    double m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    uint32_t exp = (uint32_t)(e - 1 + bias);
    uint32_t man = (uint32_t)((m * 2 - 1) * (double)(1u << mbits));
    return (sign << (ebits + mbits)) | (exp << mbits) | man;
}
static double mini_decode(uint32_t bits, int ebits, int mbits, int bias, int has_inf) {
    uint32_t sign = (bits >> (ebits + mbits)) & 1, exp = (bits >> mbits) & ((1u << ebits) - 1),
             man = bits & ((1u << mbits) - 1);
    double v;
    if (has_inf && exp == (1u << ebits) - 1) v = man ? NAN : INFINITY;
    else if (!has_inf && exp == (1u << ebits) - 1 && man == (1u << mbits) - 1) v = NAN;
    else if (exp == 0) v = ldexp((double)man, 1 - bias - mbits);
    else v = ldexp(1.0 + (double)man / (double)(1u << mbits), (int)exp - bias);
    return sign ? -v : v;
}

static void put(void *buf, ncclDataType_t t, size_t i, double v) {
    switch (t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)buf)[i] = (uint16_t)mini_encode(v, 5, 10, 15); break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = (uint16_t)mini_encode(v, 8, 7, 127); break;
    case ncclFloat8e4m3: ((uint8_t *)buf)[i] = (uint8_t)mini_encode(v, 4, 3, 7); break;
    case ncclFloat8e5m2: ((uint8_t *)buf)[i] = (uint8_t)mini_encode(v, 5, 2, 15); break;
    default: break;
    }
}
static double get(const void *buf, ncclDataType_t t, size_t i) {
    switch (t) {
    case ncclInt8: return ((const int8_t *)buf)[i];
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclUint32: return ((const uint32_t *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    case ncclUint64: return (double)((const uint64_t *)buf)[i];
    case ncclFloat16: return mini_decode(((const uint16_t *)buf)[i], 5, 10, 15, 1);
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclFloat64: return ((const double *)buf)[i];
    case ncclBfloat16: return mini_decode(((const uint16_t *)buf)[i], 8, 7, 127, 1);
    case ncclFloat8e4m3: return mini_decode(((const uint8_t *)buf)[i], 4, 3, 7, 0);
    case ncclFloat8e5m2: return mini_decode(((const uint8_t *)buf)[i], 5, 2, 15, 1);
    default: return NAN;
    }
}
/* An exact integer result as the datatype stores it: integer types wrap modulo 2^bits. */
static double wrap(ncclDataType_t t, double exact) {
    int64_t x = (int64_t)exact;
    switch (t) {
    case ncclInt8: return (int8_t)(uint8_t)x;
    case ncclUint8: return (uint8_t)x;
    case ncclInt32: return (int32_t)(uint32_t)x;
    case ncclUint32: return (uint32_t)x;
    default: return exact;
    }
}
static int close_enough(ncclDataType_t t, double got, double want) {
    if (!is_float(t)) return got == want;
    return fabs(got - want) <= fabs(want) * ldexp(1.0, -mant_bits(t)) + 1e-300;
}

/* ---- reduction matrix ---------------------------------------------------------------------------------------- */
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PREMUL, NOPS };
static const char *op_name[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
#define PREMUL_SCALAR 2.0

/* Input of rank r at element i for an op: small integers every type holds exactly, and whose sums, products,
 * scaled sums at up to 8 ranks each type also holds (integer products wrap as the type does). */
static double input(int op, ncclDataType_t t, int r, size_t i) {
    switch (op) {
    case OP_PROD: return ((size_t)r + i) % 3 == 0 ? 2.0 : 1.0;
    case OP_MAX:
    case OP_MIN: return (double)(((size_t)r * 3 + i) % 7) - (is_signed(t) ? 3.0 : 0.0);
    default: return (double)(((size_t)r + i) % 2);
    }
}
static double reduce_expect(int op, ncclDataType_t t, int n, size_t i) {
    double acc = input(op, t, 0, i);
    if (op == OP_PREMUL) acc *= PREMUL_SCALAR;
    for (int r = 1; r < n; r++) {
        double x = input(op, t, r, i);
        switch (op) {
        case OP_SUM: case OP_AVG: acc += x; break;
        case OP_PREMUL: acc += PREMUL_SCALAR * x; break;
        case OP_PROD: acc *= x; break;
        case OP_MAX: acc = x > acc ? x : acc; break;
        case OP_MIN: acc = x < acc ? x : acc; break;
        }
    }
    if (op == OP_AVG) acc = is_float(t) ? acc / n : trunc(acc / n);
    return wrap(t, acc);
}

static int make_op(int op, ncclDataType_t t, ncclComm_t comm, ncclRedOp_t *out, int residence_device,
                   void *scalar_store) {
    if (op != OP_PREMUL) {
        *out = (ncclRedOp_t)op;
        return 0;
    }
    put(scalar_store, t, 0, PREMUL_SCALAR);
    CHECK(ncclRedOpCreatePreMulSum(out, scalar_store, t,
                                   residence_device ? ncclScalarDevice : ncclScalarHostImmediate, comm));
    if ((int)*out < (int)ncclNumOps) failf("PreMulSum handle %d is below ncclNumOps", (int)*out);
    return 0;
}

static int reduction_matrix(ncclComm_t comm, int rank, int n, size_t count) {
    size_t maxb = count * (size_t)n * 8;
    char *sb = malloc(maxb), *rb = malloc(maxb);
    uint64_t scalar_store = 0;
    int root = 0;
    for (int ti = 0; ti < NTYPES; ti++) {
        ncclDataType_t t = all_types[ti];
        size_t es = type_size(t);
        for (int op = 0; op < NOPS; op++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                ncclRedOp_t rop;
                if (make_op(op, t, comm, &rop, inplace, &scalar_store) != 0) goto out;
                /* all-reduce */
                for (size_t i = 0; i < count; i++) put(sb, t, i, input(op, t, rank, i));
                memset(rb, 0xa5, count * es);
                if (inplace) memcpy(rb, sb, count * es);
                CHECK(ncclAllReduce(inplace ? rb : sb, rb, count, t, rop, comm, NULL));
                for (size_t i = 0; i < count; i++)
                    if (!close_enough(t, get(rb, t, i), reduce_expect(op, t, n, i))) {
                        failf("allreduce %s %s %s n=%d: [%zu] = %g, expected %g", type_name[ti], op_name[op],
                              inplace ? "in place" : "out of place", n, i, get(rb, t, i), reduce_expect(op, t, n, i));
                        break;
                    }
                /* reduce, to a root that moves on every call */
                root = (root + 1) % n;
                for (size_t i = 0; i < count; i++) put(sb, t, i, input(op, t, rank, i));
                memset(rb, 0xa5, count * es);
                if (inplace) memcpy(rb, sb, count * es);
                CHECK(ncclReduce(inplace ? rb : sb, (inplace || rank == root) ? rb : NULL, count, t, rop, root, comm,
                                 NULL));
                if (rank == root)
                    for (size_t i = 0; i < count; i++)
                        if (!close_enough(t, get(rb, t, i), reduce_expect(op, t, n, i))) {
                            failf("reduce %s %s %s root %d: [%zu] = %g, expected %g", type_name[ti], op_name[op],
                                  inplace ? "in place" : "out of place", root, i, get(rb, t, i),
                                  reduce_expect(op, t, n, i));
                            break;
                        }
                /* reduce-scatter: input element j of block b is input(op, t, rank, b*count + j) */
                for (size_t i = 0; i < count * (size_t)n; i++) put(sb, t, i, input(op, t, rank, i));
                char *out = inplace ? sb + (size_t)rank * count * es : rb;
                if (!inplace) memset(rb, 0xa5, count * es);
                CHECK(ncclReduceScatter(sb, out, count, t, rop, comm, NULL));
                for (size_t i = 0; i < count; i++) {
                    double want = reduce_expect(op, t, n, (size_t)rank * count + i);
                    if (!close_enough(t, get(out, t, i), want)) {
                        failf("reducescatter %s %s %s: [%zu] = %g, expected %g", type_name[ti], op_name[op],
                              inplace ? "in place" : "out of place", i, get(out, t, i), want);
                        break;
                    }
                }
                if (op == OP_PREMUL) CHECK(ncclRedOpDestroy(rop, comm));
            }
        }
    }
out:
    free(sb);
    free(rb);
    return g_failures ? -1 : 0;
}

/* ---- data movement: bytes, whatever the type -------------------------------------------------------------------- */
static unsigned char pat(int r, size_t i) { return (unsigned char)(r * 37 + i * 11 + 1); }

static int movement_matrix(ncclComm_t comm, int rank, int n, size_t count) {
    int ok = 0;
    for (int ti = 0; ti < NTYPES; ti++) {
        ncclDataType_t t = all_types[ti];
        size_t es = type_size(t), blk = count * es, all = blk * (size_t)n;
        unsigned char *sb = malloc(all), *rb = malloc(all);
        for (int inplace = 0; inplace < 2; inplace++) {
            int root = (ti + inplace) % n;
            const char *ip = inplace ? "in place" : "out of place";
            /* all-gather: block q is rank q's pattern */
            memset(rb, 0, all);
            for (size_t i = 0; i < blk; i++) (inplace ? rb + (size_t)rank * blk : sb)[i] = pat(rank, i);
            CHECK(ncclAllGather(inplace ? rb + (size_t)rank * blk : sb, rb, count, t, comm, NULL));
            for (size_t i = 0; i < all; i++)
                if (rb[i] != pat((int)(i / blk), i % blk)) {
                    failf("allgather %s %s: byte %zu wrong", type_name[ti], ip, i);
                    break;
                }
            /* broadcast and the in-place ncclBcast */
            memset(rb, 0, blk);
            for (size_t i = 0; i < blk; i++) (inplace ? rb : sb)[i] = rank == root ? pat(root, i) : 0;
            if (inplace && ti % 2) CHECK(ncclBcast(rb, count, t, root, comm, NULL));
            else CHECK(ncclBroadcast(inplace ? rb : sb, rb, count, t, root, comm, NULL));
            for (size_t i = 0; i < blk; i++)
                if (rb[i] != pat(root, i)) {
                    failf("%s %s %s root %d: byte %zu wrong", inplace && ti % 2 ? "bcast" : "broadcast",
                          type_name[ti], ip, root, i);
                    break;
                }
            /* all-to-all (NCCL defines it out of place only): block q of rank r goes to rank q */
            if (!inplace) {
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < blk; i++) sb[(size_t)q * blk + i] = pat(rank * n + q, i);
                memset(rb, 0, all);
                CHECK(ncclAlltoAll(sb, rb, count, t, comm, NULL));
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < blk; i++)
                        if (rb[(size_t)q * blk + i] != pat(q * n + rank, i)) {
                            failf("alltoall %s: block %d byte %zu wrong", type_name[ti], q, i);
                            q = n;
                            break;
                        }
            }
            /* gather: in place on the root when sendbuff == recvbuff + root*count */
            memset(rb, 0, all);
            const unsigned char *gsend = sb;
            if (inplace && rank == root) gsend = rb + (size_t)root * blk;
            for (size_t i = 0; i < blk; i++) ((unsigned char *)gsend)[i] = pat(rank + 50, i);
            CHECK(ncclGather(gsend, rank == root ? rb : NULL, count, t, root, comm, NULL));
            if (rank == root)
                for (size_t i = 0; i < all; i++)
                    if (rb[i] != pat((int)(i / blk) + 50, i % blk)) {
                        failf("gather %s %s root %d: byte %zu wrong", type_name[ti], ip, root, i);
                        break;
                    }
            /* scatter: in place on the root when recvbuff == sendbuff + root*count */
            if (rank == root)
                for (size_t i = 0; i < all; i++) sb[i] = pat((int)(i / blk) + 90, i % blk);
            unsigned char *srecv = (inplace && rank == root) ? sb + (size_t)root * blk : rb;
            if (srecv == rb) memset(rb, 0, blk);
            CHECK(ncclScatter(rank == root ? sb : NULL, srecv, count, t, root, comm, NULL));
            for (size_t i = 0; i < blk; i++)
                if (srecv[i] != pat(rank + 90, i)) {
                    failf("scatter %s %s root %d: byte %zu wrong", type_name[ti], ip, root, i);
                    break;
                }
        }
        free(sb);
        free(rb);
    }
    return ok;
}

/* ---- groups --------------------------------------------------------------------------------------------------- */
static int groups(ncclComm_t comm, int rank, int n) {
    const size_t count = 4099; /* odd, and large enough not to fit one eager chunk */
    int32_t *sb = malloc(count * (size_t)n * 4), *rb = malloc(count * (size_t)n * 4);
    for (int order = 0; order < 2; order++) { /* all-to-all as sends and receives: sends first, then receives first */
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++) sb[(size_t)q * count + i] = rank * 100000 + q * 1000 + (int)(i % 997);
        memset(rb, 0xff, count * (size_t)n * 4);
        CHECK(ncclGroupStart());
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < n; k++) {
                int q = (rank + k) % n;
                if ((pass == 0) == (order == 0)) CHECK(ncclSend(sb + (size_t)q * count, count, ncclInt32, q, comm, NULL));
                else CHECK(ncclRecv(rb + (size_t)q * count, count, ncclInt32, q, comm, NULL));
            }
        CHECK(ncclGroupEnd());
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++)
                if (rb[(size_t)q * count + i] != q * 100000 + rank * 1000 + (int)(i % 997)) {
                    failf("grouped all-to-all (%s first): from %d element %zu = %d", order ? "receives" : "sends", q,
                          i, rb[(size_t)q * count + i]);
                    q = n;
                    break;
                }
    }
    /* self send/recv alone in a group, receive posted first */
    for (size_t i = 0; i < count; i++) sb[i] = (int32_t)(i * 7 + (size_t)rank);
    memset(rb, 0, count * 4);
    CHECK(ncclGroupStart());
    CHECK(ncclRecv(rb, count, ncclInt32, rank, comm, NULL));
    CHECK(ncclSend(sb, count, ncclInt32, rank, comm, NULL));
    CHECK(ncclGroupEnd());
    if (memcmp(sb, rb, count * 4) != 0) failf("self send/recv in a group: data differs");
    /* mixed collectives in one group, nested one level: all-reduce + all-gather + broadcast + a ring shift */
    int32_t *ar = malloc(count * 4), *ag = malloc((size_t)n * 4), *bc = malloc(count * 4), *rs = malloc(count * 4);
    for (size_t i = 0; i < count; i++) ar[i] = (int32_t)((size_t)rank + i);
    int32_t mine = rank * 3 + 1;
    for (int q = 0; q < n; q++) ag[q] = -1;
    for (size_t i = 0; i < count; i++) bc[i] = rank == n - 1 ? (int32_t)(i ^ 0x55) : -1;
    int32_t *shift_send = sb, *shift_recv = rb;
    for (size_t i = 0; i < count; i++) shift_send[i] = rank * 10 + (int)(i % 10);
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(ar, ar, count, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclGroupStart()); /* nested: runs only at the outermost ncclGroupEnd */
    CHECK(ncclAllGather(&mine, ag, 1, ncclInt32, comm, NULL));
    CHECK(ncclRecv(shift_recv, count, ncclInt32, (rank + n - 1) % n, comm, NULL));
    CHECK(ncclSend(shift_send, count, ncclInt32, (rank + 1) % n, comm, NULL));
    CHECK(ncclGroupEnd());
    if (ag[0] != -1) failf("the nested ncclGroupEnd ran the group before the outermost one");
    CHECK(ncclBroadcast(bc, bc, count, ncclInt32, n - 1, comm, NULL));
    CHECK(ncclGroupEnd());
    for (size_t i = 0; i < count; i++) {
        int32_t want = (int32_t)((size_t)n * i) + n * (n - 1) / 2;
        if (ar[i] != want) { failf("grouped allreduce [%zu] = %d, expected %d", i, ar[i], want); break; }
    }
    for (int q = 0; q < n; q++)
        if (ag[q] != q * 3 + 1) failf("grouped allgather [%d] = %d", q, ag[q]);
    for (size_t i = 0; i < count; i++)
        if (bc[i] != (int32_t)(i ^ 0x55)) { failf("grouped broadcast [%zu] = %d", i, bc[i]); break; }
    int from = (rank + n - 1) % n;
    for (size_t i = 0; i < count; i++)
        if (shift_recv[i] != from * 10 + (int)(i % 10)) { failf("grouped ring shift [%zu] wrong", i); break; }
    /* ncclGroupSimulateEnd: nothing runs, an estimate comes back */
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    for (size_t i = 0; i < count; i++) ar[i] = 5;
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(ar, ar, count, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclGroupSimulateEnd(&sim));
    for (size_t i = 0; i < count; i++)
        if (ar[i] != 5) { failf("ncclGroupSimulateEnd ran the all-reduce"); break; }
    if (!(sim.estimatedTime >= 0.0f)) failf("ncclGroupSimulateEnd: estimatedTime %g", (double)sim.estimatedTime);
    free(ar), free(ag), free(bc), free(rs), free(sb), free(rb);
    return 0;
}

/* ---- split and shrink ------------------------------------------------------------------------------------------ */
static int split_shrink(ncclComm_t comm, int rank, int n) {
    /* colors by parity, keys reversing the order; with n > 2 the last rank takes no part */
    int color = (n > 2 && rank == n - 1) ? NCCL_SPLIT_NOCOLOR : rank % 2;
    ncclComm_t sub = (ncclComm_t)(uintptr_t)1;
    CHECK(ncclCommSplit(comm, color, -rank, &sub, NULL));
    if (color == NCCL_SPLIT_NOCOLOR) {
        if (sub != NULL) failf("split with NCCL_SPLIT_NOCOLOR returned a communicator");
    } else {
        int members[8], m = 0, cnt = -1, r = -1;
        for (int q = n - 1; q >= 0; q--)
            if (q % 2 == color && !(n > 2 && q == n - 1)) members[m++] = q;
        CHECK(ncclCommCount(sub, &cnt));
        CHECK(ncclCommUserRank(sub, &r));
        if (cnt != m) failf("split color %d: %d ranks, expected %d", color, cnt, m);
        if (r < 0 || r >= m || members[r] != rank) failf("split color %d: rank %d is not in key order", color, r);
        int v = rank, sum = 0;
        CHECK(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, sub, NULL));
        int want = 0;
        for (int k = 0; k < m; k++) want += members[k];
        if (sum != want) failf("allreduce on split communicator: %d, expected %d", sum, want);
        CHECK(ncclCommDestroy(sub));
    }
    if (n > 1) { /* the survivors of a communicator without its last rank */
        int excl = n - 1;
        if (rank != excl) {
            ncclComm_t s = NULL;
            CHECK(ncclCommShrink(comm, &excl, 1, &s, NULL, NCCL_SHRINK_DEFAULT));
            int cnt = -1, r = -1, v = rank + 1, sum = 0;
            CHECK(ncclCommCount(s, &cnt));
            CHECK(ncclCommUserRank(s, &r));
            if (cnt != n - 1 || r != rank) failf("shrink: rank %d of %d, expected %d of %d", r, cnt, rank, n - 1);
            CHECK(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, s, NULL));
            if (sum != (n - 1) * n / 2) failf("allreduce on shrunk communicator: %d", sum);
            CHECK(ncclCommDestroy(s));
        }
        int one = 1, all = 0; /* the excluded rank waits here until the survivors are done */
        CHECK(ncclAllReduce(&one, &all, 1, ncclInt32, ncclSum, comm, NULL));
    }
    return 0;
}

/* ---- non-blocking communicator ---------------------------------------------------------------------------------- */
static ncclResult_t wait_async(ncclComm_t c, double deadline_s) {
    ncclResult_t st = ncclInProgress;
    double end = now_s() + deadline_s;
    while (st == ncclInProgress && now_s() < end) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInternalError;
        if (st == ncclInProgress) usleep(1000);
    }
    return st;
}

static int nonblocking(ncclComm_t comm, int rank, int n) {
    ncclUniqueId id;
    if (rank == 0) CHECK(ncclGetUniqueId(&id));
    CHECK(ncclBroadcast(&id, &id, sizeof id, ncclUint8, 0, comm, NULL));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "nonblocking";
    ncclComm_t nb = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nb, n, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        failf("non-blocking ncclCommInitRankConfig -> %d: %s", (int)r, ncclGetLastError(NULL));
        return -1;
    }
    if ((r = wait_async(nb, 60)) != ncclSuccess) {
        failf("non-blocking init did not complete: %d: %s", (int)r, ncclGetLastError(NULL));
        return -1;
    }
    double v[3] = {rank, 1, -rank}, s[3];
    r = ncclAllReduce(v, s, 3, ncclFloat64, ncclSum, nb, NULL);
    if (r == ncclInProgress) r = wait_async(nb, 60);
    if (r != ncclSuccess) failf("non-blocking allreduce -> %d: %s", (int)r, ncclGetLastError(NULL));
    else if (s[0] != n * (n - 1) / 2.0 || s[1] != n || s[2] != -n * (n - 1) / 2.0)
        failf("non-blocking allreduce: %g %g %g", s[0], s[1], s[2]);
    r = ncclCommFinalize(nb);
    if (r == ncclInProgress) r = wait_async(nb, 60);
    if (r != ncclSuccess) failf("ncclCommFinalize -> %d: %s", (int)r, ncclGetLastError(NULL));
    CHECK(ncclCommDestroy(nb));
    return 0;
}

/* ---- ncclCommInitRankScalable with two ids (zccl uses the first) and the pnccl* aliases ----------------------- */
static int scalable(ncclComm_t comm, int rank, int n) {
    ncclUniqueId ids[2];
    memset(ids, 0, sizeof ids);
    if (rank == 0) CHECK(ncclGetUniqueId(&ids[0]));
    if (rank == n - 1) CHECK(ncclGetUniqueId(&ids[1]));
    CHECK(ncclBroadcast(&ids[0], &ids[0], sizeof ids[0], ncclUint8, 0, comm, NULL));
    CHECK(ncclBroadcast(&ids[1], &ids[1], sizeof ids[1], ncclUint8, n - 1, comm, NULL));
    ncclComm_t sc = NULL;
    CHECK(ncclCommInitRankScalable(&sc, n, rank, 2, ids, NULL));
    int cnt = -1, r = -1;
    CHECK(ncclCommCount(sc, &cnt));
    CHECK(pncclCommUserRank(sc, &r));
    if (cnt != n || r != rank) failf("ncclCommInitRankScalable: rank %d of %d", r, cnt);
    int64_t v = rank + 1, sum = 0;
    CHECK(pncclAllReduce(&v, &sum, 1, ncclInt64, ncclSum, sc, NULL)); /* the profiling alias does the same */
    if (sum != (int64_t)n * (n + 1) / 2) failf("pncclAllReduce on the scalable communicator: %lld", (long long)sum);
    CHECK(ncclCommDestroy(sc));
    return 0;
}

/* ---- configs from older and newer headers: read by their size ---------------------------------------------- */
static int config_versions(ncclComm_t comm, int rank, int n) {
    for (int which = 0; which < 2; which++) {
        ncclUniqueId id;
        if (rank == 0) CHECK(ncclGetUniqueId(&id));
        CHECK(ncclBroadcast(&id, &id, sizeof id, ncclUint8, 0, comm, NULL));
        /* 0: NCCL 2.14's layout (fields up to netName); 1: a later header with fields appended after ours */
        struct {
            ncclConfig_t c;
            int future[6];
        } big;
        memset(&big, 0x7f, sizeof big); /* fields beyond `size` hold garbage: they must not be read */
        ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
        if (which == 0) {
            memcpy(&big.c, &init, offsetof(ncclConfig_t, splitShare));
            big.c.size = offsetof(ncclConfig_t, splitShare);
            big.c.version = NCCL_VERSION(2, 14, 3);
        } else {
            big.c = init;
            big.c.size = sizeof big;
            big.c.version = NCCL_VERSION(2, 99, 0);
        }
        big.c.blocking = 1;
        ncclComm_t c = NULL;
        ncclResult_t r = ncclCommInitRankConfig(&c, n, id, rank, &big.c);
        if (r != ncclSuccess) {
            failf("config of size %zu (version %u) refused: %d: %s", big.c.size, big.c.version, (int)r,
                  ncclGetLastError(NULL));
            return -1;
        }
        int v = 1, sum = 0;
        CHECK(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, c, NULL));
        if (sum != n) failf("allreduce on a communicator from a size-%zu config: %d", big.c.size, sum);
        CHECK(ncclCommDestroy(c));
    }
    return 0;
}

/* ---- bad input: clear errors, no hang ----------------------------------------------------------------------- */
/* Whether the CUDA driver that libzccl loaded (if any: RTLD_NOLOAD never loads it) calls p device memory. */
static int driver_says_device(const void *p) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return 0;
    typedef int (*attr_fn)(void *, int, unsigned long long);
    attr_fn attr = (attr_fn)dlsym(h, "cuPointerGetAttribute");
    unsigned mt = 0;
    const int dev = attr && attr(&mt, 2 /* MEMORY_TYPE */, (unsigned long long)(uintptr_t)p) == 0 && mt == 2;
    dlclose(h);
    return dev;
}

static int bad_input(ncclComm_t comm, int rank, int n) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclComm_t c = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.magic = 0x12345678;
    EXPECT_ERR(ncclCommInitRankConfig(&c, n, id, rank, &cfg), ncclInvalidArgument, "magic");
    ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
    cfg2.size = 3;
    EXPECT_ERR(ncclCommInitRankConfig(&c, n, id, rank, &cfg2), ncclInvalidArgument, "size");
    ncclConfig_t cfg3 = NCCL_CONFIG_INITIALIZER;
    cfg3.blocking = 7;
    EXPECT_ERR(ncclCommInitRankConfig(&c, n, id, rank, &cfg3), ncclInvalidArgument, "blocking");
    EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
    EXPECT_ERR(ncclAllReduce(NULL, NULL, 1, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument, "datatype");
    EXPECT_ERR(ncclAllReduce(NULL, NULL, 1, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument, "comm");
    /* a PreMulSum handle belongs to the communicator that made it */
    ncclComm_t other = NULL;
    CHECK(ncclCommSplit(comm, 0, rank, &other, NULL));
    float scal = 2.0f, x = 1.0f, y = 0.0f;
    ncclRedOp_t op;
    CHECK(ncclRedOpCreatePreMulSum(&op, &scal, ncclFloat32, ncclScalarHostImmediate, other));
    ncclRedOp_t op_here;
    CHECK(ncclRedOpCreatePreMulSum(&op_here, &scal, ncclFloat32, ncclScalarHostImmediate, comm));
    if (op_here == op) {
        /* numbers may coincide across communicators; make this one distinct so the test means something */
        ncclRedOp_t op2;
        CHECK(ncclRedOpCreatePreMulSum(&op2, &scal, ncclFloat32, ncclScalarHostImmediate, other));
        CHECK(ncclRedOpDestroy(op, other));
        op = op2;
    }
    CHECK(ncclRedOpDestroy(op_here, comm));
    ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat32, op, comm, NULL);
    if (r != ncclInvalidArgument) failf("PreMulSum handle of another communicator: %d, expected ncclInvalidArgument", (int)r);
    /* the same call inside a group: ncclGroupEnd reports it, naming the grouped call; the group's other call runs */
    int gi = 1, go = 0;
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(&gi, &go, 1, ncclInt32, ncclSum, comm, NULL));
    ncclAllReduce(&x, &y, 1, ncclFloat32, op, comm, NULL); /* may fail here already or at ncclGroupEnd */
    r = ncclGroupEnd();
    if (r != ncclInvalidArgument) failf("grouped PreMulSum handle of another communicator: ncclGroupEnd -> %d", (int)r);
    else if (!strstr(ncclGetLastError(NULL), "call 2"))
        failf("ncclGroupEnd's message does not name the grouped call: %s", ncclGetLastError(NULL));
    if (go != n) failf("the valid call of the failed group: %d, expected %d", go, n);
    EXPECT_ERR(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "");
    CHECK(ncclRedOpDestroy(op, other));
    CHECK(ncclCommDestroy(other));
    /* memory, registration, windows, revoke, device */
    void *mem = NULL, *h = NULL;
    CHECK(ncclMemAlloc(&mem, 1 << 20));
    if (!mem || ((uintptr_t)mem & 4095)) failf("ncclMemAlloc: %p is not page aligned", mem);
    if (!driver_says_device(mem)) memset(mem, 1, 1 << 20); /* where a CUDA driver is present it is device memory */
    CHECK(ncclCommRegister(comm, mem, 1 << 20, &h));
    CHECK(ncclCommDeregister(comm, h));
    EXPECT_ERR(ncclCommDeregister(comm, h), ncclInvalidArgument, "not a registration");
    ncclWindow_t win;
    EXPECT_ERR(ncclCommWindowRegister(comm, mem, 1 << 20, &win, NCCL_WIN_DEFAULT), ncclInvalidUsage, "window");
    CHECK(ncclMemFree(mem));
    EXPECT_ERR(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclInvalidUsage, "ncclCommRevoke");
    int dev = -1;
    CHECK(ncclCommCuDevice(comm, &dev));
    if (dev != 0) failf("ncclCommCuDevice: %d", dev);
    ncclResult_t ae = ncclInternalError;
    CHECK(ncclCommGetAsyncError(comm, &ae));
    if (ae != ncclSuccess) failf("ncclCommGetAsyncError after bad input: %d", (int)ae);
    if (strcmp(ncclGetErrorString(ncclRemoteError), "") == 0) failf("empty error string");
    /* the device API's host functions (nccl_device.h, C++ only) exist and refuse with a message */
    typedef ncclResult_t (*devcomm_create_fn)(ncclComm_t, const void *, void *);
    devcomm_create_fn dcc = (devcomm_create_fn)dlsym(RTLD_DEFAULT, "ncclDevCommCreate");
    char devcomm[256];
    if (!dcc) failf("ncclDevCommCreate is not exported");
    else EXPECT_ERR(dcc(comm, NULL, devcomm), ncclInvalidUsage, "device API");
    typedef struct { int nRanks, rank, stride; } team_t;
    team_t (*world)(ncclComm_t) = (team_t(*)(ncclComm_t))dlsym(RTLD_DEFAULT, "ncclTeamWorld");
    if (!world) failf("ncclTeamWorld is not exported");
    else {
        team_t t = world(comm);
        if (t.nRanks != n || t.rank != rank || t.stride != 1)
            failf("ncclTeamWorld: {%d, %d, %d}", t.nRanks, t.rank, t.stride);
    }
    return 0;
}

/* ---- processes ------------------------------------------------------------------------------------------------ */
/* Rank 0 makes the unique id and writes it to the pipe once for every other rank; the others read it. Returns 0, or
 * the rank's exit status after saying what failed. */
static int share_id(int rank, int n, int id_fd_r, int id_fd_w, ncclUniqueId *id) {
    if (rank == 0) {
        CHECK(ncclGetUniqueId(id));
        for (int q = 1; q < n; q++)
            if (write(id_fd_w, id, sizeof *id) != (ssize_t)sizeof *id) { failf("pipe write"); return 1; }
    } else if (read(id_fd_r, id, sizeof *id) != (ssize_t)sizeof *id) {
        failf("pipe read");
        return 1;
    }
    return 0;
}

static int world_rank(int rank, int n, int id_fd_r, int id_fd_w) {
    g_rank = rank;
    ncclUniqueId id;
    int id_rc = share_id(rank, n, id_fd_r, id_fd_w, &id);
    if (id_rc != 0) return id_rc;
    int v = 0;
    CHECK(ncclGetVersion(&v));
    if (v != NCCL_VERSION_CODE) failf("ncclGetVersion: %d, header says %d", v, NCCL_VERSION_CODE);
    ncclComm_t comm = NULL;
    CHECK(ncclCommInitRank(&comm, n, id, rank));
    int cnt = -1, r = -1;
    CHECK(ncclCommCount(comm, &cnt));
    CHECK(ncclCommUserRank(comm, &r));
    if (cnt != n || r != rank) failf("communicator: rank %d of %d, expected %d of %d", r, cnt, rank, n);
    const char *what = getenv("NCCL_CONFORMANCE_PARTS"); /* default: all */
    if (!what || strstr(what, "reduce")) {
        reduction_matrix(comm, rank, n, 1031);
        reduction_matrix(comm, rank, n, 1);
        reduction_matrix(comm, rank, n, 70001); /* several chunks per block: the pipelined paths */
    }
    if (!what || strstr(what, "move")) {
        movement_matrix(comm, rank, n, 517);
        movement_matrix(comm, rank, n, 33333);
    }
    if (!what || strstr(what, "group")) groups(comm, rank, n);
    if (!what || strstr(what, "split")) split_shrink(comm, rank, n);
    if (!what || strstr(what, "nonblocking")) nonblocking(comm, rank, n);
    if (!what || strstr(what, "scalable")) scalable(comm, rank, n);
    if (!what || strstr(what, "config")) config_versions(comm, rank, n);
    if (!what || strstr(what, "bad")) bad_input(comm, rank, n);
    CHECK(ncclCommFinalize(comm));
    CHECK(ncclCommDestroy(comm));
    if (g_failures == 0) printf("rank %d of %d: all checks passed\n", rank, n);
    return g_failures ? 1 : 0;
}

/* rank 0 sends a large grouped message to rank 1, which never receives it */
static int timeout_rank(int rank, int n, int id_fd_r, int id_fd_w) {
    g_rank = rank;
    ncclUniqueId id;
    int id_rc = share_id(rank, n, id_fd_r, id_fd_w, &id);
    if (id_rc != 0) return id_rc;
    ncclComm_t comm = NULL;
    CHECK(ncclCommInitRank(&comm, n, id, rank));
    const char *t = getenv("ZCCL_TIMEOUT_MS");
    double limit_s = (t ? atof(t) : 60000) / 1000.0;
    if (rank == 0) {
        size_t count = (size_t)64 << 20; /* 256 MiB: far more than any transport buffers in flight */
        float *buf = calloc(count, sizeof *buf);
        double t0 = now_s();
        CHECK(ncclGroupStart());
        CHECK(ncclSend(buf, count, ncclFloat32, 1, comm, NULL));
        ncclResult_t r = ncclGroupEnd();
        double took = now_s() - t0;
        const char *msg = ncclGetLastError(comm);
        printf("rank 0: ncclGroupEnd -> %d (%s) after %.1f s: %s\n", (int)r, ncclGetErrorString(r), took, msg);
        if (r != ncclRemoteError) failf("unmatched grouped send: %d, expected ncclRemoteError", (int)r);
        if (!strstr(msg, "time")) failf("the message does not say it timed out: %s", msg);
        if (took > limit_s + 20) failf("took %.1f s with ZCCL_TIMEOUT_MS=%s", took, t ? t : "unset");
        ncclResult_t ae = ncclSuccess;
        CHECK(ncclCommGetAsyncError(comm, &ae));
        if (ae == ncclSuccess) failf("ncclCommGetAsyncError reports no error after the timeout");
        free(buf);
    } else {
        usleep((useconds_t)((limit_s + 5) * 1e6)); /* outlive rank 0's deadline, never posting the receive */
    }
    ncclCommAbort(comm);
    if (g_failures == 0) printf("rank %d: timeout checks passed\n", rank);
    return g_failures ? 1 : 0;
}

static int initall(int k) {
    g_rank = 0;
    ncclComm_t comms[8];
    CHECK(ncclCommInitAll(comms, k, NULL));
    int32_t *buf[8];
    const size_t count = 1000;
    for (int i = 0; i < k; i++) {
        int cnt = -1, r = -1;
        CHECK(ncclCommCount(comms[i], &cnt));
        CHECK(ncclCommUserRank(comms[i], &r));
        if (cnt != k || r != i) failf("ncclCommInitAll: comm %d is rank %d of %d", i, r, cnt);
        buf[i] = malloc(count * 4);
        for (size_t e = 0; e < count; e++) buf[i][e] = i * 1000 + (int)e;
    }
    CHECK(ncclGroupStart()); /* one thread drives every rank: only possible in a group */
    for (int i = 0; i < k; i++) CHECK(ncclAllReduce(buf[i], buf[i], count, ncclInt32, ncclSum, comms[i], NULL));
    CHECK(ncclGroupEnd());
    for (int i = 0; i < k; i++)
        for (size_t e = 0; e < count; e++)
            if (buf[i][e] != 1000 * k * (k - 1) / 2 + k * (int)e) {
                failf("ncclCommInitAll + grouped allreduce: comm %d [%zu] = %d", i, e, buf[i][e]);
                break;
            }
    /* split every rank from this one thread in one group (parity colors), then a grouped all-reduce on the halves */
    ncclComm_t subs[8];
    int vals[8];
    CHECK(ncclGroupStart());
    for (int i = 0; i < k; i++) CHECK(ncclCommSplit(comms[i], i % 2, i, &subs[i], NULL));
    CHECK(ncclGroupEnd());
    CHECK(ncclGroupStart());
    for (int i = 0; i < k; i++) {
        vals[i] = i;
        CHECK(ncclAllReduce(&vals[i], &vals[i], 1, ncclInt32, ncclSum, subs[i], NULL));
    }
    CHECK(ncclGroupEnd());
    for (int i = 0; i < k; i++) {
        int want = 0;
        for (int q = i % 2; q < k; q += 2) want += q;
        if (vals[i] != want) failf("grouped split of ncclCommInitAll ranks: comm %d sum %d, expected %d", i, vals[i], want);
        CHECK(ncclCommDestroy(subs[i]));
    }
    for (int i = 0; i < k; i++) {
        CHECK(ncclCommDestroy(comms[i]));
        free(buf[i]);
    }
    if (g_failures == 0) printf("ncclCommInitAll with %d ranks: all checks passed\n", k);
    return g_failures ? 1 : 0;
}

/* Device buffers and a cudaStream_t: zccl's fake CUDA driver (tests/fake_cuda, also loaded by zccl through
 * ZCCL_CUDA_LIBRARY, which the test sets) models the caller's stream S. Each rank: ncclMemAlloc gives device memory;
 * with a kernel still held on S and a kernel that writes the input queued behind it, ncclAllReduce on S returns at
 * once; S's next kernel (a copy of the output) runs only after the collective, with the right sum; host buffers
 * still complete before the call returns; a group of device collectives runs in order; a grouped device send is
 * refused naming why; a handle that is no stream is refused; ncclMemFree gives the device memory back. */
static const char *g_fake_cuda;

static int devptr_rank(int rank, int n, int id_fd_r, int id_fd_w) {
    g_rank = rank;
    void *h = dlopen(g_fake_cuda, RTLD_NOW);
    if (!h) { failf("cannot load %s: %s", g_fake_cuda, dlerror()); return 1; }
    void *(*user_stream)(void *) = (void *(*)(void *))dlsym(h, "fake_cuda_user_stream");
    int (*hold)(void *) = (int (*)(void *))dlsym(h, "fake_cuda_stream_hold");
    void (*release)(int) = (void (*)(int))dlsym(h, "fake_cuda_release");
    void (*scopy)(void *, void *, const void *, size_t) =
        (void (*)(void *, void *, const void *, size_t))dlsym(h, "fake_cuda_stream_copy");
    int (*ssync)(void *) = (int (*)(void *))dlsym(h, "cuStreamSynchronize");
    int (*ptr_attr)(void *, int, unsigned long long) =
        (int (*)(void *, int, unsigned long long))dlsym(h, "cuPointerGetAttribute");
    if (!user_stream || !hold || !release || !scopy || !ssync || !ptr_attr) {
        failf("%s lacks the stream model of tests/fake_cuda", g_fake_cuda);
        return 1;
    }
    ncclUniqueId id;
    int id_rc = share_id(rank, n, id_fd_r, id_fd_w, &id);
    if (id_rc != 0) return id_rc;
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, n, id, rank));
    cudaStream_t S = (cudaStream_t)user_stream(NULL);
    const size_t count = 4099, bytes = count * sizeof(float);
    float *ds = NULL, *dr = NULL, *in = malloc(bytes), *out = malloc(bytes), *want = malloc(bytes);
    CHECK(ncclMemAlloc((void **)&ds, bytes));
    CHECK(ncclMemAlloc((void **)&dr, bytes));
    unsigned mt = 0;
    if (ptr_attr(&mt, 2, (unsigned long long)(uintptr_t)ds) != 0 || mt != 2) failf("ncclMemAlloc gave no device memory");
    for (size_t i = 0; i < count; i++) {
        in[i] = (float)(rank + 1) * 0.5f + (float)(i % 7);
        want[i] = (float)(n * (n + 1)) * 0.25f + (float)n * (float)(i % 7);
        out[i] = -1.0f;
        dr[i] = -2.0f; /* the fake's device memory is host memory: the test reads it directly */
    }
    const int held = hold(S);
    scopy(S, ds, in, bytes);
    double t0 = now_s();
    CHECK(ncclAllReduce(ds, dr, count, ncclFloat32, ncclSum, comm, S));
    if (now_s() - t0 > 2.0) failf("ncclAllReduce on a stream did not return at once");
    scopy(S, out, dr, bytes);
    usleep(100000);
    if (dr[0] != -2.0f || out[0] != -1.0f) failf("the collective ran, or S's later kernel ran, before S reached the call");
    release(held);
    if (ssync(S) != 0) failf("S never passed the collective");
    for (size_t i = 0; i < count; i++)
        if (out[i] != want[i]) { failf("device all-reduce [%zu] = %g, expected %g", i, (double)out[i], (double)want[i]); break; }
    /* a group of device collectives: in order on S */
    for (size_t i = 0; i < count; i++) ds[i] = in[i];
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(ds, ds, count, ncclFloat32, ncclSum, comm, S));
    CHECK(ncclBroadcast(ds, dr, count, ncclFloat32, n - 1, comm, S));
    CHECK(ncclGroupEnd());
    if (ssync(S) != 0) failf("S never passed the grouped collectives");
    for (size_t i = 0; i < count; i++)
        if (dr[i] != want[i]) { failf("grouped device calls [%zu] = %g, expected %g", i, (double)dr[i], (double)want[i]); break; }
    /* host buffers: unchanged, complete when the call returns (after the device calls queued before) */
    float hs[16], hr[16];
    for (int i = 0; i < 16; i++) hs[i] = (float)(rank + i);
    CHECK(ncclAllReduce(hs, hr, 16, ncclFloat32, ncclSum, comm, S));
    if (hr[3] != (float)(n * (n - 1) / 2 + 3 * n)) failf("host all-reduce: %g", (double)hr[3]);
    ncclResult_t ae = ncclInternalError;
    CHECK(ncclCommGetAsyncError(comm, &ae));
    if (ae != ncclSuccess) failf("async error %d after good calls: %s", (int)ae, ncclGetLastError(NULL));
    /* refused at issue, on every rank alike (the collective is not entered) */
    CHECK(ncclGroupStart());
    ncclSend(ds, 4, ncclFloat32, (rank + 1) % n, comm, S);
    EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "send/recv on CUDA device memory");
    EXPECT_ERR(ncclAllReduce(ds, ds, 4, ncclFloat32, ncclSum, comm, (cudaStream_t)(uintptr_t)0x5150), ncclInvalidArgument,
               "is not a CUDA stream");
    EXPECT_ERR(ncclAllReduce(hs, dr, 4, ncclFloat32, ncclSum, comm, S), ncclInvalidArgument,
               "'sendbuf' is host memory but 'recvbuf' is CUDA device memory");
    CHECK(ncclMemFree(ds));
    CHECK(ncclMemFree(dr));
    if (ptr_attr(&mt, 2, (unsigned long long)(uintptr_t)ds) == 0) failf("ncclMemFree left the memory on the device");
    CHECK(ncclCommDestroy(comm));
    free(in);
    free(out);
    free(want);
    if (g_failures == 0) printf("rank %d: device buffers on a CUDA stream: checks passed\n", rank);
    return g_failures ? 1 : 0;
}

/* nccl/env.c ran when the library was loaded, before main: the ZCCL_* variables already hold the translations of
 * the NCCL_* values that Nccl.env_mapping sets (see nccl/tests/CMakeLists.txt). */
static int env_mapping(void) {
    static const struct { const char *var, *want; } expect[] = {
        {"ZCCL_DEBUG_SUBSYS", "^TCP,IB,TOPO"}, /* NCCL_DEBUG_SUBSYS=^NET,GRAPH,CALL: CALL has no counterpart */
        {"ZCCL_ALGO", "allreduce:tree;reducescatter:ring"}, /* NCCL_ALGO=allreduce:Tree;reducescatter:Ring */
        {"ZCCL_SOCKET_IFNAME", "=lo"},                        /* copied */
        {"ZCCL_IB_HCA", "mlx5_1"},                            /* set by the user: NCCL_IB_HCA=mlx5_0 loses */
        {"ZCCL_IB_TIMEOUT", "20"},
        {"ZCCL_IB_QPS_PER_CONN", "2"},                        /* NCCL_IB_QPS_PER_CONNECTION */
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        const char *v = getenv(expect[i].var);
        if (!v || strcmp(v, expect[i].want)) failf("%s is '%s', expected '%s'", expect[i].var, v ? v : "(unset)",
                                                   expect[i].want);
    }
    /* the mapping runs once at load; calling ncclResetDebugInit runs it again for variables set since */
    setenv("NCCL_IB_GID_INDEX", "3", 1);
    if (getenv("ZCCL_IB_GID_INDEX")) failf("ZCCL_IB_GID_INDEX set before NCCL_IB_GID_INDEX was");
    void (*reset)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "ncclResetDebugInit"); /* deprecated in the header */
    if (reset) reset();
    const char *g = getenv("ZCCL_IB_GID_INDEX");
    if (!g || strcmp(g, "3")) failf("after ncclResetDebugInit ZCCL_IB_GID_INDEX is '%s', expected 3", g ? g : "(unset)");
    if (g_failures == 0) printf("environment mapping: checks passed\n");
    return g_failures ? 1 : 0;
}

typedef int (*rank_fn)(int, int, int, int);

static int run_ranks(int n, rank_fn fn, double deadline_s) {
    int fds[2];
    if (pipe(fds) != 0) { perror("pipe"); return 1; }
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) { perror("fork"); return 1; }
        if (pids[r] == 0) {
            alarm((unsigned)deadline_s + 5); /* a rank that outlives its parent's deadline dies anyway */
            fflush(stdout);
            _exit(fn(r, n, fds[0], fds[1]));
        }
    }
    close(fds[0]);
    close(fds[1]);
    int failed = 0, left = n;
    double end = now_s() + deadline_s;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            left--;
            int r;
            for (r = 0; r < n && pids[r] != p; r++) {}
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "FAIL: rank %d %s %d\n", r, WIFEXITED(st) ? "exited with" : "killed by signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                failed = 1;
            }
            continue;
        }
        if (now_s() > end) {
            fprintf(stderr, "FAIL: deadline of %.0f s passed with %d rank(s) running: killing them\n", deadline_s, left);
            for (int r = 0; r < n; r++) kill(pids[r], SIGKILL);
            while (waitpid(-1, NULL, 0) > 0) {}
            return 1;
        }
        usleep(20000);
    }
    return failed;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s world N [DEADLINE_S] | initall K [DEADLINE_S] | timeout [DEADLINE_S]\n", argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "world") && argc >= 3) {
        int n = atoi(argv[2]);
        if (n < 1 || n > 8) { fprintf(stderr, "N must be 1..8\n"); return 2; }
        return run_ranks(n, world_rank, argc > 3 ? atof(argv[3]) : 240);
    }
    if (!strcmp(argv[1], "devptr") && argc >= 4) {
        g_fake_cuda = argv[2];
        return run_ranks(atoi(argv[3]), devptr_rank, argc > 4 ? atof(argv[4]) : 120);
    }
    if (!strcmp(argv[1], "env")) return env_mapping();
    if (!strcmp(argv[1], "timeout")) return run_ranks(2, timeout_rank, argc > 2 ? atof(argv[2]) : 120);
    if (!strcmp(argv[1], "initall") && argc >= 3) {
        int k = atoi(argv[2]);
        if (k < 1 || k > 8) { fprintf(stderr, "K must be 1..8\n"); return 2; }
        double deadline = argc > 3 ? atof(argv[3]) : 120;
        pid_t p = fork();
        if (p == 0) {
            alarm((unsigned)deadline);
            _exit(initall(k));
        }
        int st;
        waitpid(p, &st, 0);
        if (WIFSIGNALED(st)) {
            fprintf(stderr, "FAIL: ncclCommInitAll test killed by signal %d%s\n", WTERMSIG(st),
                    WTERMSIG(st) == SIGALRM ? " (deadline)" : "");
            return 1;
        }
        return WEXITSTATUS(st);
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}

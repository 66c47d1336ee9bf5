/*
 * gpu_conformance.cu — zccl collectives on CUDA device buffers, for tools/gpu-check (docs/gpu.md).
 *
 *   zcclrun -n N zccl_gpu_conformance [--quick] [--bw BYTES] [--cuda-stream]
 *
 * Every rank uses GPU (rank % device count). For each collective x datatype x op x in/out-of-place x count:
 *  1. the input is written by a kernel queued on the caller's stream that first spins for ~200 us, and the output
 *     buffer is poisoned before it: a call that did not wait for queued work would read the poison;
 *  2. the zccl call on the device buffers (blocking: NULL zccl stream; with --cuda-stream on a zccl stream bound to
 *     the caller's CUDA stream by zccl_stream_create_cuda, so the call returns at once and the order is the GPU's);
 *  3. a kernel queued after the call copies the output to a check buffer: a call that returned before its result
 *     was in device memory would leave the poison there;
 *  4. the check buffer must equal, bit for bit, the same collective run by zccl on host buffers with the same
 *     input (the CPU path, which the CPU suite checks against references; float32 SUM is also checked against
 *     double arithmetic here). Any difference prints FAIL and the program exits 1.
 * --register: the send and receive buffers of the device runs are two allocations made once and registered with
 *   zccl_comm_register, so that all-reduce, reduce-scatter, all-gather and broadcast run zccl's one-pass path over
 *   CUDA IPC (docs/gpu.md "CUDA IPC"; tools/gpu-check sets ZCCL_SHM_REG_MIN_BYTES=1 and reads zccl's INFO line that
 *   counts the calls that took it). The other collectives, PreMulSum and the host references take the normal path.
 * --bw BYTES: after the checks, a 2-rank all-reduce bandwidth of BYTES per rank against a device-to-device copy,
 *   twice: on unregistered buffers (staged through host memory) and on registered ones (the CUDA IPC path).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "zccl.h"

#define CK(call)                                                                                                 \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "rank %d: FAIL %s:%d: %s: %s\n", g_rank, __FILE__, __LINE__, #call,                  \
                    cudaGetErrorString(e_));                                                                   \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

static int g_rank, g_n;
static long g_checks, g_fail;
static zccl_comm_t g_comm;
static cudaStream_t g_s;
static bool g_register;               /* --register */
static uint8_t *g_dsend, *g_drecv;    /* the registered device buffers (--register) */
static size_t g_dbytes;
static zccl_stream_t g_zs; /* --cuda-stream: bound to g_s; NULL otherwise */
static long g_async;       /* --cuda-stream: calls that returned while g_s still had the spin kernel to run */

__global__ void spin_then_copy(uint8_t *dst, const uint8_t *src, size_t n, long long spin) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        long long t0 = clock64();
        while (clock64() - t0 < spin) {}
    }
    __syncthreads();
    /* only block 0 spins, so the copy is done by block 0's threads after it; other blocks wait on nothing: use one
     * block for the whole copy to keep the order simple */
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
__global__ void copy_after(uint8_t *dst, const uint8_t *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static const char *dt_name(int dt) {
    static const char *n[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
                              "bfloat16", "fp8e4m3", "fp8e5m2"};
    return n[dt];
}
static const char *op_name(int op) {
    static const char *n[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
    return n[op];
}

/* Element value v (a small integer 0..2, exact in every type) in dt's encoding. */
static void put(uint8_t *p, int dt, int v) {
    switch (dt) {
    case ZCCL_INT8: case ZCCL_UINT8: *p = (uint8_t)v; break;
    case ZCCL_INT32: case ZCCL_UINT32: { int32_t x = v; memcpy(p, &x, 4); break; }
    case ZCCL_INT64: case ZCCL_UINT64: { int64_t x = v; memcpy(p, &x, 8); break; }
    case ZCCL_FLOAT32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case ZCCL_FLOAT64: { double x = v; memcpy(p, &x, 8); break; }
    case ZCCL_FLOAT16: { uint16_t x = v == 0 ? 0 : v == 1 ? 0x3c00 : 0x4000; memcpy(p, &x, 2); break; }
    case ZCCL_BFLOAT16: { uint16_t x = v == 0 ? 0 : v == 1 ? 0x3f80 : 0x4000; memcpy(p, &x, 2); break; }
    case ZCCL_FLOAT8E4M3: *p = v == 0 ? 0 : v == 1 ? 0x38 : 0x40; break;
    case ZCCL_FLOAT8E5M2: *p = v == 0 ? 0 : v == 1 ? 0x3c : 0x40; break;
    }
}

enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE, C_ALLTOALL, C_GATHER, C_SCATTER, C_SENDRECV,
       C_COUNT };
static const char *coll_name[C_COUNT] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
                                         "alltoall", "gather", "scatter", "send/recv"};
static bool has_op(int c) { return c == C_ALLREDUCE || c == C_REDUCE_SCATTER || c == C_REDUCE; }

/* Input and output element counts of collective c with `count` (per-rank block) on this rank. */
static void sizes(int c, size_t count, size_t *in, size_t *out) {
    const size_t n = (size_t)g_n;
    switch (c) {
    case C_REDUCE_SCATTER: *in = count * n; *out = count; break;
    case C_ALLGATHER: case C_GATHER: *in = count; *out = count * n; break;
    case C_ALLTOALL: *in = *out = count * n; break;
    case C_SCATTER: *in = count * n; *out = count; break;
    default: *in = *out = count;
    }
}

/* Runs collective c; in place uses the library's in-place layout (recv holds the input where zccl expects it). */
static zccl_result_t run(int c, const void *s, void *r, size_t count, int dt, zccl_redop_t op, zccl_stream_t st) {
    const int root = g_n - 1;
    switch (c) {
    case C_ALLREDUCE: return zccl_allreduce(s, r, count, (zccl_datatype_t)dt, op, g_comm, st);
    case C_REDUCE_SCATTER: return zccl_reduce_scatter(s, r, count, (zccl_datatype_t)dt, op, g_comm, st);
    case C_ALLGATHER: return zccl_allgather(s, r, count, (zccl_datatype_t)dt, g_comm, st);
    case C_BROADCAST: return zccl_broadcast(s, r, count, (zccl_datatype_t)dt, root, g_comm, st);
    case C_REDUCE: return zccl_reduce(s, r, count, (zccl_datatype_t)dt, op, root, g_comm, st);
    case C_ALLTOALL: return zccl_alltoall(s, r, count, (zccl_datatype_t)dt, g_comm, st);
    case C_GATHER: return zccl_gather(s, r, count, (zccl_datatype_t)dt, root, g_comm, st);
    case C_SCATTER: return zccl_scatter(s, r, count, (zccl_datatype_t)dt, root, g_comm, st);
    case C_SENDRECV: { /* a ring shift: even ranks send first, odd ranks receive first */
        if (g_n == 1) return zccl_allgather(s, r, count, (zccl_datatype_t)dt, g_comm, st);
        const int to = (g_rank + 1) % g_n, from = (g_rank + g_n - 1) % g_n;
        zccl_result_t res;
        if (g_rank % 2 == 0) {
            if ((res = zccl_send(s, count, (zccl_datatype_t)dt, to, g_comm, st)) != ZCCL_SUCCESS) return res;
            return zccl_recv(r, count, (zccl_datatype_t)dt, from, g_comm, st);
        }
        if ((res = zccl_recv(r, count, (zccl_datatype_t)dt, from, g_comm, st)) != ZCCL_SUCCESS) return res;
        return zccl_send(s, count, (zccl_datatype_t)dt, to, g_comm, st);
    }
    }
    return ZCCL_INTERNAL_ERROR;
}

/* In place: where the input sits inside the output buffer (elements), or -1 when the collective has no in-place form. */
static long inplace_offset(int c, size_t count) {
    switch (c) {
    case C_ALLREDUCE: case C_BROADCAST: case C_REDUCE: return 0;
    case C_REDUCE_SCATTER: return -2; /* recv is inside send: handled by the caller (send buffer holds it all) */
    case C_ALLGATHER: return (long)(count * (size_t)g_rank);
    default: return -1;
    }
}

static void check_one(int c, int dt, int opi, bool in_place, size_t count) {
    const size_t es = zccl_type_size((zccl_datatype_t)dt);
    size_t nin, nout;
    sizes(c, count, &nin, &nout);
    const long ipo = inplace_offset(c, count);
    if (in_place && ipo == -1) return;
    /* inputs: a pattern of 0..2 per element, different per rank */
    std::vector<uint8_t> hin(nin * es), hout(nout * es, 0), got(nout * es);
    for (size_t i = 0; i < nin; i++) put(&hin[i * es], dt, (int)((i * 7 + (size_t)g_rank * 3 + (size_t)opi) % 3));
    zccl_redop_t op = opi == 5 ? ZCCL_SUM : (zccl_redop_t)opi;
    if (opi == 5) { /* PreMulSum with scalar 2 (host immediate) */
        uint8_t sc[8] = {0};
        put(sc, dt, 2);
        if (zccl_redop_create_premulsum(&op, sc, (zccl_datatype_t)dt, ZCCL_SCALAR_HOST_IMMEDIATE, g_comm) !=
            ZCCL_SUCCESS) {
            printf("rank %d: FAIL premulsum create %s: %s\n", g_rank, dt_name(dt), zccl_get_last_error(g_comm));
            g_fail++;
            return;
        }
    }
    /* the reference: the same call on host memory */
    zccl_result_t hr;
    if (c == C_REDUCE_SCATTER && in_place) {
        std::vector<uint8_t> io(hin);
        hr = run(c, io.data(), io.data() + (size_t)g_rank * count * es, count, dt, op, NULL);
        memcpy(hout.data(), io.data() + (size_t)g_rank * count * es, count * es);
    } else if (in_place) {
        std::vector<uint8_t> io(nout * es, 0);
        memcpy(io.data() + ipo * es, hin.data(), nin * es);
        hr = run(c, io.data() + ipo * es, io.data(), count, dt, op, NULL);
        hout = io;
    } else {
        hr = run(c, hin.data(), hout.data(), count, dt, op, NULL);
    }
    if (hr != ZCCL_SUCCESS) {
        printf("rank %d: FAIL host reference %s %s %s: %s\n", g_rank, coll_name[c], dt_name(dt), op_name(opi),
               zccl_get_last_error(g_comm));
        g_fail++;
        return;
    }
    /* the device run */
    const size_t dbytes = (nin > nout ? nin : nout) * es + 64;
    uint8_t *src, *dsend, *drecv, *dcheck;
    CK(cudaMalloc(&src, dbytes));
    if (g_register && dbytes <= g_dbytes) {
        dsend = g_dsend;
        drecv = g_drecv;
    } else {
        CK(cudaMalloc(&dsend, dbytes));
        CK(cudaMalloc(&drecv, dbytes));
    }
    CK(cudaMalloc(&dcheck, dbytes));
    CK(cudaMemcpy(src, hin.data(), nin * es, cudaMemcpyHostToDevice));
    CK(cudaMemsetAsync(dsend, 0xff, dbytes, g_s)); /* poison: stale data shows */
    CK(cudaMemsetAsync(drecv, 0xff, dbytes, g_s));
    CK(cudaMemsetAsync(dcheck, 0xee, dbytes, g_s));
    uint8_t *sp, *rp, *outp;
    if (c == C_REDUCE_SCATTER && in_place) {
        sp = dsend;
        rp = dsend + (size_t)g_rank * count * es;
        outp = rp;
    } else if (in_place) {
        sp = drecv + ipo * es;
        rp = drecv;
        outp = drecv;
    } else {
        sp = dsend;
        rp = drecv;
        outp = drecv;
    }
    spin_then_copy<<<1, 256, 0, g_s>>>(sp, src, nin * es, 400000); /* ~200 us at 2 GHz, then the input */
    CK(cudaGetLastError());
    zccl_result_t dr = run(c, sp, rp, count, dt, op, g_zs);
    if (g_zs && cudaStreamQuery(g_s) == cudaErrorNotReady) g_async++;
    copy_after<<<64, 256, 0, g_s>>>(dcheck, outp, nout * es);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(g_s)); /* with --cuda-stream: waits for the call through the completion word */
    if (g_zs) {
        const zccl_result_t sr = zccl_stream_synchronize(g_zs);
        if (dr == ZCCL_SUCCESS) dr = sr;
    }
    CK(cudaMemcpy(got.data(), dcheck, nout * es, cudaMemcpyDeviceToHost));
    g_checks++;
    bool root_only = (c == C_REDUCE || c == C_GATHER) && g_rank != g_n - 1;
    if (dr != ZCCL_SUCCESS) {
        printf("rank %d: FAIL %s %s %s %s count %zu: %s\n", g_rank, coll_name[c], dt_name(dt), op_name(opi),
               in_place ? "in-place" : "out-of-place", count, zccl_get_last_error(g_comm));
        g_fail++;
    } else if (!root_only && memcmp(got.data(), hout.data(), nout * es) != 0) {
        size_t i = 0;
        while (i < nout * es && got[i] == hout[i]) i++;
        printf("rank %d: FAIL %s %s %s %s count %zu: byte %zu is 0x%02x, host result 0x%02x%s\n", g_rank,
               coll_name[c], dt_name(dt), op_name(opi), in_place ? "in-place" : "out-of-place", count, i, got[i],
               hout[i], got[i] == 0xff || got[i] == 0xee ? " (poison: stream order broken)" : "");
        g_fail++;
    }
    if (dt == ZCCL_FLOAT32 && opi == ZCCL_SUM && c == C_ALLREDUCE && dr == ZCCL_SUCCESS) { /* vs double */
        for (size_t i = 0; i < count; i++) {
            double want = 0;
            for (int r = 0; r < g_n; r++) want += (double)((i * 7 + (size_t)r * 3) % 3);
            float g;
            memcpy(&g, &got[i * 4], 4);
            if ((double)g != want) {
                printf("rank %d: FAIL allreduce float32 sum [%zu] = %g, want %g\n", g_rank, i, g, want);
                g_fail++;
                break;
            }
        }
    }
    if (opi == 5) zccl_redop_destroy(op, g_comm);
    CK(cudaFree(src));
    if (dsend != g_dsend) {
        CK(cudaFree(dsend));
        CK(cudaFree(drecv));
    }
    CK(cudaFree(dcheck));
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int bandwidth(size_t bytes, bool reg) {
    const size_t count = bytes / 4;
    float *a, *b;
    void *ha = NULL, *hb = NULL;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    if (reg && (zccl_comm_register(g_comm, a, bytes, &ha) != ZCCL_SUCCESS ||
                zccl_comm_register(g_comm, b, bytes, &hb) != ZCCL_SUCCESS)) {
        printf("rank %d: FAIL registering the bandwidth buffers: %s\n", g_rank, zccl_get_last_error(g_comm));
        return 1;
    }
    CK(cudaMemset(a, 0, bytes));
    const int iters = 5;
    CK(cudaDeviceSynchronize());
    double t0 = now();
    for (int i = 0; i < iters; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_s));
    CK(cudaStreamSynchronize(g_s));
    const double copy_s = (now() - t0) / iters;
    if (zccl_allreduce(a, b, count, ZCCL_FLOAT32, ZCCL_SUM, g_comm, g_zs) != ZCCL_SUCCESS ||
        (g_zs && zccl_stream_synchronize(g_zs) != ZCCL_SUCCESS)) { /* warm-up */
        printf("rank %d: FAIL bandwidth all-reduce: %s\n", g_rank, zccl_get_last_error(g_comm));
        return 1;
    }
    zccl_barrier(g_comm, NULL);
    t0 = now();
    for (int i = 0; i < iters; i++)
        if (zccl_allreduce(a, b, count, ZCCL_FLOAT32, ZCCL_SUM, g_comm, g_zs) != ZCCL_SUCCESS) {
            printf("rank %d: FAIL bandwidth all-reduce: %s\n", g_rank, zccl_get_last_error(g_comm));
            return 1;
        }
    if (g_zs) {
        CK(cudaStreamSynchronize(g_s));
        if (zccl_stream_synchronize(g_zs) != ZCCL_SUCCESS) {
            printf("rank %d: FAIL bandwidth all-reduce: %s\n", g_rank, zccl_get_last_error(g_comm));
            return 1;
        }
    }
    const double ar_s = (now() - t0) / iters;
    const double busbw = 2.0 * (g_n - 1) / g_n * bytes / ar_s / 1e9;
    if (g_rank == 0)
        printf("BANDWIDTH %s ranks %d bytes %zu: all-reduce %.3f ms, bus bandwidth %.2f GB/s; device-to-device "
               "copy %.3f ms, %.2f GB/s; ratio %.3f\n", reg ? "registered (CUDA IPC one-pass)" : "unregistered (staged)",
               g_n, bytes, ar_s * 1e3, busbw, copy_s * 1e3, bytes / copy_s / 1e9, busbw / (bytes / copy_s / 1e9));
    if (ha) zccl_comm_deregister(g_comm, ha);
    if (hb) zccl_comm_deregister(g_comm, hb);
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 0;
}

int main(int argc, char **argv) {
    bool quick = false, cuda_stream = false;
    size_t bw = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--register")) g_register = true;
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc) bw = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--cuda-stream")) cuda_stream = true;
        else { fprintf(stderr, "usage: %s [--quick] [--register] [--bw BYTES] [--cuda-stream]\n", argv[0]); return 2; }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "FAIL: no CUDA device\n");
        return 1;
    }
    if (zccl_comm_init_env(&g_comm) != ZCCL_SUCCESS) {
        fprintf(stderr, "FAIL: zccl_comm_init_env: %s\n", zccl_get_last_error(NULL));
        return 1;
    }
    zccl_comm_rank(g_comm, &g_rank);
    zccl_comm_count(g_comm, &g_n);
    CK(cudaSetDevice(g_rank % ndev));
    CK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    if (cuda_stream && zccl_stream_create_cuda(g_s, &g_zs) != ZCCL_SUCCESS) {
        fprintf(stderr, "rank %d: FAIL zccl_stream_create_cuda: %s\n", g_rank, zccl_get_last_error(NULL));
        return 1;
    }
    const double t0 = now();
    std::vector<size_t> counts = {1, 4099};
    if (!quick) counts.push_back(262147);
    void *hs = NULL, *hr = NULL;
    if (g_register) { /* the largest device run: 262147 elements of 8 bytes per rank, times the ranks */
        g_dbytes = (size_t)262147 * 8 * (size_t)g_n + 64;
        CK(cudaMalloc(&g_dsend, g_dbytes));
        CK(cudaMalloc(&g_drecv, g_dbytes));
        if (zccl_comm_register(g_comm, g_dsend, g_dbytes, &hs) != ZCCL_SUCCESS ||
            zccl_comm_register(g_comm, g_drecv, g_dbytes, &hr) != ZCCL_SUCCESS) {
            fprintf(stderr, "rank %d: FAIL zccl_comm_register of device memory: %s\n", g_rank,
                    zccl_get_last_error(g_comm));
            return 1;
        }
    }
    for (size_t count : counts) {
        for (int c = 0; c < C_COUNT; c++) {
            for (int dt = 0; dt < ZCCL_NUM_TYPES; dt++) {
                /* the large count: the types of training (float32, bfloat16, fp8) only */
                if (count > 5000 && dt != ZCCL_FLOAT32 && dt != ZCCL_BFLOAT16 && dt != ZCCL_FLOAT8E4M3) continue;
                const int nops = has_op(c) ? 6 : 1;
                for (int op = 0; op < nops; op++)
                    for (int ip = 0; ip < 2; ip++) check_one(c, dt, op, ip == 1, count);
            }
        }
    }
    int rc = g_fail ? 1 : 0;
    if (g_register) {
        zccl_comm_deregister(g_comm, hs);
        zccl_comm_deregister(g_comm, hr);
        CK(cudaFree(g_dsend));
        CK(cudaFree(g_drecv));
        g_dsend = g_drecv = NULL;
    }
    if (bw && !rc) rc = bandwidth(bw, false);
    if (bw && !rc) rc = bandwidth(bw, true);
    printf("rank %d of %d: %ld checks, %ld failed, %.1f s%s%s\n", g_rank, g_n, g_checks, g_fail, now() - t0,
           rc ? "  FAIL" : "  PASS", g_zs ? " (stream-ordered: zccl_stream_create_cuda)" : "");
    if (g_zs) {
        printf("rank %d: %ld of %ld calls returned while the caller's stream was still busy\n", g_rank, g_async,
               g_checks);
        zccl_stream_destroy(g_zs);
    }
    zccl_comm_destroy(g_comm);
    return rc;
}

/*
 * nccl_stream_check.cu — zccl's libnccl.so.2 on CUDA device buffers and a cudaStream_t, for tools/gpu-check
 * (docs/gpu.md). Written against NVIDIA's nccl.h and the CUDA runtime only, as an NCCL application is.
 *
 *   LD_PRELOAD=build/nccl/lib/libnccl.so.2 zcclrun -n 2 nccl_stream_check ID_FILE
 *
 * Every rank uses GPU 0 (ranks share it). Rank 0 writes the unique id to ID_FILE, the others read it. For each
 * count: buffers from ncclMemAlloc (device memory), a kernel on the stream that spins, then writes the input; the
 * call on that stream (it must return before the GPU ran it); a kernel after it copies the output to a check
 * buffer; the stream is synchronised and the check buffer must hold the exact sum (small integers in float32).
 * Then a group of two device collectives (all-reduce, broadcast) on the same stream, and ncclCommGetAsyncError.
 * It also checks that ncclAllReduce is zccl's (dladdr: the library file is zccl's libnccl.so.2 and libzccl is
 * loaded). Prints "checks passed" or FAIL lines; exit status 1 on any failure.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>

static int g_rank = -1, g_fail;
#define FAILF(...) do { printf("rank %d: FAIL ", g_rank); printf(__VA_ARGS__); printf("\n"); g_fail++; } while (0)
#define CK(call)                                                                                                 \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) { FAILF("%s: %s", #call, cudaGetErrorString(e_)); exit(1); }                    \
    } while (0)
#define NC(call)                                                                                                 \
    do {                                                                                                       \
        ncclResult_t r_ = (call);                                                                              \
        if (r_ != ncclSuccess) { FAILF("%s: %d %s", #call, (int)r_, ncclGetLastError(NULL)); exit(1); }        \
    } while (0)

__global__ void spin_then_fill(float *dst, size_t n, int rank, long long spin) {
    if (threadIdx.x == 0) {
        long long t0 = clock64();
        while (clock64() - t0 < spin) {}
    }
    __syncthreads();
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = (float)(rank + 1) + (float)(i % 5);
}
__global__ void copy_after(float *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s ID_FILE (ranks from RANK / WORLD_SIZE, e.g. zcclrun)\n", argv[0]);
        return 2;
    }
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    g_rank = r ? atoi(r) : 0;
    const int n = w ? atoi(w) : 1;
    Dl_info info;
    if (!dladdr((void *)&ncclAllReduce, &info) || !info.dli_fname || !strstr(info.dli_fname, "nccl"))
        FAILF("cannot tell which library ncclAllReduce comes from");
    else if (!dlopen("libzccl.so.0", RTLD_NOLOAD | RTLD_LAZY))
        FAILF("ncclAllReduce comes from %s, but libzccl is not loaded: not zccl's libnccl.so.2", info.dli_fname);
    else if (g_rank == 0) printf("ncclAllReduce from %s\n", info.dli_fname);
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ncclUniqueId id;
    if (g_rank == 0) {
        NC(ncclGetUniqueId(&id));
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, argv[1]) != 0) {
            FAILF("cannot write %s", argv[1]);
            return 1;
        }
    } else {
        FILE *f = NULL;
        for (int i = 0; i < 3000 && !(f = fopen(argv[1], "rb")); i++) usleep(10000);
        if (!f || fread(&id, sizeof id, 1, f) != 1) { FAILF("cannot read the unique id from %s", argv[1]); return 1; }
        fclose(f);
    }
    ncclComm_t comm;
    NC(ncclCommInitRank(&comm, n, id, g_rank));
    long async_returns = 0, calls = 0;
    for (size_t count : {(size_t)1, (size_t)4099, (size_t)1 << 22}) {
        float *ds, *dr, *dc;
        NC(ncclMemAlloc((void **)&ds, count * 4));
        NC(ncclMemAlloc((void **)&dr, count * 4));
        CK(cudaMalloc(&dc, count * 4));
        cudaPointerAttributes pa;
        CK(cudaPointerGetAttributes(&pa, ds));
        if (pa.type != cudaMemoryTypeDevice)
            FAILF("ncclMemAlloc gave memory of type %d, not device memory", (int)pa.type);
        CK(cudaMemsetAsync(dr, 0xff, count * 4, s));
        CK(cudaMemsetAsync(dc, 0xee, count * 4, s));
        spin_then_fill<<<1, 256, 0, s>>>(ds, count, g_rank, 2000000); /* ~1 ms, then the input */
        CK(cudaGetLastError());
        const double t0 = now();
        NC(ncclAllReduce(ds, dr, count, ncclFloat32, ncclSum, comm, s));
        const double dt = now() - t0;
        calls++;
        if (cudaStreamQuery(s) == cudaErrorNotReady) async_returns++;
        copy_after<<<64, 256, 0, s>>>(dc, dr, count);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        std::vector<float> got(count);
        CK(cudaMemcpy(got.data(), dc, count * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i++) {
            const float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 5);
            if (got[i] != want) {
                FAILF("all-reduce count %zu [%zu] = %g, expected %g%s", count, i, got[i], want,
                      got[i] != got[i] ? " (poison: the stream order is broken)" : "");
                break;
            }
        }
        if (g_rank == 0) printf("count %zu: ncclAllReduce returned in %.1f us\n", count, dt * 1e6);
        /* a group of two device collectives on the same stream */
        NC(ncclGroupStart());
        NC(ncclAllReduce(ds, ds, count, ncclFloat32, ncclSum, comm, s));
        NC(ncclBroadcast(ds, dr, count, ncclFloat32, n - 1, comm, s));
        NC(ncclGroupEnd());
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(got.data(), dr, count * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i++) {
            const float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 5);
            if (got[i] != want) {
                FAILF("grouped calls count %zu [%zu] = %g, expected %g", count, i, got[i], want);
                break;
            }
        }
        NC(ncclMemFree(ds));
        NC(ncclMemFree(dr));
        CK(cudaFree(dc));
    }
    ncclResult_t ae = ncclInternalError;
    NC(ncclCommGetAsyncError(comm, &ae));
    if (ae != ncclSuccess) FAILF("ncclCommGetAsyncError: %d (%s)", (int)ae, ncclGetLastError(comm));
    NC(ncclCommDestroy(comm));
    printf("rank %d of %d: %ld of %ld calls returned before the GPU reached them\n", g_rank, n, async_returns, calls);
    if (async_returns == 0) FAILF("no call returned before the stream reached it: the call waited for the GPU");
    if (!g_fail) printf("rank %d: checks passed\n", g_rank);
    return g_fail ? 1 : 0;
}

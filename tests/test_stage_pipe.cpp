/*
 * test_stage_pipe.cpp — pipelined staging of device calls (lib/core/engine_stage.c, mem/mem_pipe.c; docs/gpu.md
 * "Pipelined staging") with the fake CUDA driver's copy engine: copies run later on a thread and write their
 * destination only when a link throttled to FAKE_CUDA_COPY_MBPS has carried them, so a chunk sent before its
 * device-to-host copy ran, a received chunk whose copy back is not waited for, or a phase that starts before the
 * previous one's reductions landed shows up as wrong elements.
 *
 * Every collective (all-reduce SUM/AVG in and out of place, reduce-scatter, all-gather, broadcast, reduce, all-to-all,
 * gather, scatter, send/recv) on "device" buffers at 1, 2 and 3 ranks over shm and tcp, counts 1 to 150001 with
 * 16 KiB chunks (up to ~40 chunks per transfer), each element compared with a reference the test computes from the
 * known inputs of all ranks. Also: the synchronous path (ZCCL_STAGE_DEPTH=0) gives the same results, transfers are
 * really chunked (the fake's device-to-host copy count), a rank on host memory and a rank on device memory in one
 * call fail on every rank naming it, and the fake's dma-buf export and attributes.
 */
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

namespace {

struct CeStats {
    long copies[4], bytes[4], kernels, max_in_flight, in_flight; /* [1] host->device, [2] device->host */
};
struct Fake {
    void (*mark)(const void *, size_t, int) = nullptr;
    void (*unmark)(const void *) = nullptr;
    void (*ce)(CeStats *) = nullptr;
};

bool open_fake(Fake *f) {
    void *h = dlopen(ZCCL_FAKE_CUDA_PATH, RTLD_NOW);
    if (!h) return false;
    *(void **)&f->mark = dlsym(h, "fake_cuda_mark");
    *(void **)&f->unmark = dlsym(h, "fake_cuda_unmark");
    *(void **)&f->ce = dlsym(h, "fake_cuda_ce_stats");
    return f->mark && f->unmark && f->ce;
}

/* A vector of "device" memory: marked for the fake driver for its lifetime. */
template <class T> struct Dev {
    Fake *f;
    std::vector<T> v;
    Dev(Fake *fk, size_t n, T fill = T()) : f(fk), v(n ? n : 1, fill) { f->mark(v.data(), v.size() * sizeof(T), 0); }
    ~Dev() { f->unmark(v.data()); }
    T *p() { return v.data(); }
    T &operator[](size_t i) { return v[i]; }
};

/* Inputs every rank can compute for every other: exact in float32 for the sums below. */
float fin(int rank, size_t i) { return (float)((rank + 1) * 3) + (float)(i % 101); }
int32_t iin(int rank, size_t i) { return (int32_t)(rank * 100003) + (int32_t)(i % 977) - 400; }

constexpr size_t kChunk = 16384;

int run_all(zccl_comm_t comm, int rank, int n, Fake &f, bool check_chunks) {
    for (size_t count : {size_t(1), size_t(4099), size_t(150001)}) {
        const size_t total = count * (size_t)n;
        /* all-reduce float32 SUM, out of place */
        {
            Dev<float> s(&f, count), r(&f, count, -1.f);
            for (size_t i = 0; i < count; i++) s[i] = fin(rank, i);
            CeStats a, b;
            f.ce(&a);
            ZT_CHECK(zccl_allreduce(s.p(), r.p(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL) == ZCCL_SUCCESS,
                   "allreduce: %s", zccl_get_last_error(NULL));
            f.ce(&b);
            for (size_t i = 0; i < count; i++) {
                float want = 0;
                for (int q = 0; q < n; q++) want += fin(q, i);
                ZT_CHECK(r[i] == want, "allreduce count %zu [%zu] = %g, want %g", count, i, r[i], want);
            }
            /* Any algorithm sends at least (n-1)/n of the vector out of this rank; in chunks of at most kChunk. */
            const size_t least = (count * 4 * (size_t)(n - 1) / (size_t)n) / kChunk;
            if (check_chunks && n > 1)
                ZT_CHECK((size_t)(b.copies[2] - a.copies[2]) >= least, "%ld device-to-host copies for %zu bytes out: "
                       "not chunked", b.copies[2] - a.copies[2], count * 4 * (size_t)(n - 1) / (size_t)n);
        }
        /* all-reduce float32 AVG in place; int32 SUM in place */
        {
            Dev<float> io(&f, count);
            for (size_t i = 0; i < count; i++) io[i] = fin(rank, i);
            ZT_CHECK(zccl_allreduce(io.p(), io.p(), count, ZCCL_FLOAT32, ZCCL_AVG, comm, NULL) == ZCCL_SUCCESS,
                   "allreduce avg: %s", zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++) {
                float sum = 0;
                for (int q = 0; q < n; q++) sum += fin(q, i);
                const float want = n > 1 ? sum / (float)n : sum;
                ZT_CHECK(io[i] == want, "avg count %zu [%zu] = %g, want %g", count, i, io[i], want);
            }
            Dev<int32_t> ii(&f, count);
            for (size_t i = 0; i < count; i++) ii[i] = iin(rank, i);
            ZT_CHECK(zccl_allreduce(ii.p(), ii.p(), count, ZCCL_INT32, ZCCL_SUM, comm, NULL) == ZCCL_SUCCESS,
                   "allreduce int32: %s", zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++) {
                int32_t want = 0;
                for (int q = 0; q < n; q++) want += iin(q, i);
                ZT_CHECK(ii[i] == want, "allreduce int32 [%zu] = %d, want %d", i, ii[i], want);
            }
        }
        /* reduce-scatter int32 SUM */
        {
            Dev<int32_t> s(&f, total), r(&f, count, -7);
            for (size_t i = 0; i < total; i++) s[i] = iin(rank, i);
            ZT_CHECK(zccl_reduce_scatter(s.p(), r.p(), count, ZCCL_INT32, ZCCL_SUM, comm, NULL) == ZCCL_SUCCESS,
                   "reduce_scatter: %s", zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++) {
                int32_t want = 0;
                for (int q = 0; q < n; q++) want += iin(q, (size_t)rank * count + i);
                ZT_CHECK(r[i] == want, "reduce_scatter [%zu] = %d, want %d", i, r[i], want);
            }
        }
        /* all-gather float32, out of place and in place */
        {
            Dev<float> s(&f, count), r(&f, total, -1.f);
            for (size_t i = 0; i < count; i++) s[i] = fin(rank, i);
            ZT_CHECK(zccl_allgather(s.p(), r.p(), count, ZCCL_FLOAT32, comm, NULL) == ZCCL_SUCCESS, "allgather: %s",
                   zccl_get_last_error(NULL));
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < count; i++)
                    ZT_CHECK(r[(size_t)q * count + i] == fin(q, i), "allgather [%d][%zu]", q, i);
            Dev<float> io(&f, total, -1.f);
            for (size_t i = 0; i < count; i++) io[(size_t)rank * count + i] = fin(rank, i);
            ZT_CHECK(zccl_allgather(io.p() + (size_t)rank * count, io.p(), count, ZCCL_FLOAT32, comm, NULL) ==
                       ZCCL_SUCCESS, "allgather in place: %s", zccl_get_last_error(NULL));
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < count; i++)
                    ZT_CHECK(io[(size_t)q * count + i] == fin(q, i), "allgather in place [%d][%zu]", q, i);
        }
        /* broadcast from the last rank, out of place */
        {
            Dev<int32_t> s(&f, count), r(&f, count, -1);
            for (size_t i = 0; i < count; i++) s[i] = iin(rank, i);
            ZT_CHECK(zccl_broadcast(s.p(), r.p(), count, ZCCL_INT32, n - 1, comm, NULL) == ZCCL_SUCCESS, "broadcast: %s",
                   zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++) ZT_CHECK(r[i] == iin(n - 1, i), "broadcast [%zu]", i);
        }
        /* reduce float32 SUM to rank 0 */
        {
            Dev<float> s(&f, count), r(&f, count, -1.f);
            for (size_t i = 0; i < count; i++) s[i] = fin(rank, i);
            ZT_CHECK(zccl_reduce(s.p(), r.p(), count, ZCCL_FLOAT32, ZCCL_SUM, 0, comm, NULL) == ZCCL_SUCCESS,
                   "reduce: %s", zccl_get_last_error(NULL));
            if (rank == 0)
                for (size_t i = 0; i < count; i++) {
                    float want = 0;
                    for (int q = 0; q < n; q++) want += fin(q, i);
                    ZT_CHECK(r[i] == want, "reduce [%zu] = %g, want %g", i, r[i], want);
                }
        }
        /* all-to-all int32: block q of rank r's input goes to rank q's block r */
        {
            Dev<int32_t> s(&f, total), r(&f, total, -1);
            for (size_t i = 0; i < total; i++) s[i] = iin(rank, i);
            ZT_CHECK(zccl_alltoall(s.p(), r.p(), count, ZCCL_INT32, comm, NULL) == ZCCL_SUCCESS, "alltoall: %s",
                   zccl_get_last_error(NULL));
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < count; i++)
                    ZT_CHECK(r[(size_t)q * count + i] == iin(q, (size_t)rank * count + i), "alltoall [%d][%zu]", q, i);
        }
        /* gather to rank n/2, scatter from rank 0 */
        {
            const int groot = n / 2;
            Dev<float> s(&f, count), r(&f, total, -1.f);
            for (size_t i = 0; i < count; i++) s[i] = fin(rank, i);
            ZT_CHECK(zccl_gather(s.p(), r.p(), count, ZCCL_FLOAT32, groot, comm, NULL) == ZCCL_SUCCESS, "gather: %s",
                   zccl_get_last_error(NULL));
            if (rank == groot)
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < count; i++)
                        ZT_CHECK(r[(size_t)q * count + i] == fin(q, i), "gather [%d][%zu]", q, i);
            Dev<int32_t> ss(&f, total), sr(&f, count, -1);
            for (size_t i = 0; i < total; i++) ss[i] = iin(0, i);
            ZT_CHECK(zccl_scatter(ss.p(), sr.p(), count, ZCCL_INT32, 0, comm, NULL) == ZCCL_SUCCESS, "scatter: %s",
                   zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++)
                ZT_CHECK(sr[i] == iin(0, (size_t)rank * count + i), "scatter [%zu]", i);
        }
        /* send/recv: rank 0 sends to rank 1, then rank 1 sends back (outside a group, ordered) */
        if (n > 1 && rank < 2) {
            Dev<float> s(&f, count), r(&f, count, -1.f);
            for (size_t i = 0; i < count; i++) s[i] = fin(rank, i);
            const int peer = 1 - rank;
            for (int turn = 0; turn < 2; turn++) {
                const bool sending = (turn == 0) == (rank == 0);
                zccl_result_t res = sending ? zccl_send(s.p(), count, ZCCL_FLOAT32, peer, comm, NULL)
                                            : zccl_recv(r.p(), count, ZCCL_FLOAT32, peer, comm, NULL);
                ZT_CHECK(res == ZCCL_SUCCESS, "%s: %s", sending ? "send" : "recv", zccl_get_last_error(NULL));
            }
            for (size_t i = 0; i < count; i++) ZT_CHECK(r[i] == fin(peer, i), "recv [%zu] = %g", i, r[i]);
        }
    }
    return 0;
}

using Param = std::tuple<int, const char *>;
class StagePipe : public ::testing::TestWithParam<Param> {};

zt::Options opts(const char *transport, const char *depth) {
    zt::Options o;
    o.env = {{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH},
             {"ZCCL_TRANSPORT", transport},
             {"FAKE_CUDA_COPY_MBPS", "1500"}, /* a slow "PCIe": copies land well after they were queued */
             {"ZCCL_STAGE_CHUNK_BYTES", "16K"},
             {"ZCCL_STAGE_DEPTH", depth}};
    o.deadline_s = 200;
    return o;
}

TEST_P(StagePipe, EveryCollectiveOnDeviceBuffersIsExact) {
    const int n = std::get<0>(GetParam());
    zt::run_ranks(n, [](zccl_comm_t comm, int rank, int nranks) -> int {
        Fake f;
        ZT_CHECK(open_fake(&f), "fake symbols");
        return run_all(comm, rank, nranks, f, true);
    }, opts(std::get<1>(GetParam()), "2"));
}

INSTANTIATE_TEST_SUITE_P(RanksTransports, StagePipe,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values("shm", "tcp")),
                         [](const ::testing::TestParamInfo<Param> &i) {
                             return std::string(std::get<1>(i.param)) + "_" + std::to_string(std::get<0>(i.param));
                         });

/* ZCCL_STAGE_DEPTH=0: the synchronous path (whole transfers copied before and after each phase), same results. */
TEST(StagePipeSync, DepthZeroIsTheSynchronousPathWithTheSameResults) {
    zt::run_ranks(3, [](zccl_comm_t comm, int rank, int nranks) -> int {
        Fake f;
        ZT_CHECK(open_fake(&f), "fake symbols");
        return run_all(comm, rank, nranks, f, false);
    }, opts("tcp", "0"));
}

/* Rank 0 on device memory, the others on host memory, in one all-reduce: device calls split their transfers, so the
 * ranks would disagree on the wire; the call descriptor says "on device memory" and every rank fails, none returns
 * success. Also with ZCCL_STAGE_DEPTH=0 (the synchronous path no longer stages the descriptors, so they are
 * compared there too). */
TEST(StagePipeMixed, HostAndDeviceRanksInOneCallFailOnEveryRank) {
    for (const char *depth : {"2", "0"})
    for (int nr : {2, 3}) {
        zt::run_ranks(nr, [](zccl_comm_t comm, int rank, int nranks) -> int {
            Fake f;
            ZT_CHECK(open_fake(&f), "fake symbols");
            const size_t count = 100000;
            std::vector<float> s(count, 1.f), r(count, -1.f);
            if (rank == 0) {
                f.mark(s.data(), count * 4, 0);
                f.mark(r.data(), count * 4, 0);
            }
            zccl_result_t res = zccl_allreduce(s.data(), r.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL);
            const std::string msg = zccl_get_last_error(NULL);
            ZT_CHECK(res != ZCCL_SUCCESS, "rank %d: a call mixing host and device ranks succeeded", rank);
            ZT_CHECK(msg.find("device memory") != std::string::npos,
                   "rank %d: the error does not say why: %s", rank, msg.c_str());
            if (rank == 0) {
                f.unmark(s.data());
                f.unmark(r.data());
            }
            (void)nranks;
            return 0;
        }, opts("tcp", depth));
    }
}

/* The fake driver's dma-buf export (for the GDR path): a page-aligned range of cuMemAlloc memory gives an fd that
 * maps the same bytes; misaligned ranges, memory the driver did not allocate and FAKE_CUDA_DMABUF_EXPORT=0 are
 * refused; the attributes follow FAKE_CUDA_CC / FAKE_CUDA_DMABUF / FAKE_CUDA_GDR. */
int dmabuf_body(bool export_ok) {
    void *h = dlopen(ZCCL_FAKE_CUDA_PATH, RTLD_NOW);
    ZT_CHECK(h, "dlopen");
    auto alloc = (int (*)(unsigned long long *, size_t))dlsym(h, "cuMemAlloc_v2");
    auto getfd = (int (*)(void *, unsigned long long, size_t, int, unsigned long long))dlsym(
        h, "cuMemGetHandleForAddressRange");
    auto attr = (int (*)(int *, int, int))dlsym(h, "cuDeviceGetAttribute");
    ZT_CHECK(alloc && getfd && attr, "symbols");
    int v = 0;
    ZT_CHECK(attr(&v, 75, 0) == 0 && v == 8 && attr(&v, 76, 0) == 0 && v == 0, "compute capability 8.0: %d", v);
    ZT_CHECK(attr(&v, 124, 0) == 0 && v == (export_ok ? 1 : 0), "DMA_BUF_SUPPORTED %d", v);
    ZT_CHECK(attr(&v, 116, 0) == 0 && v == 1, "GPU_DIRECT_RDMA_SUPPORTED %d", v);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned long long d = 0;
    ZT_CHECK(alloc(&d, 3 * page) == 0, "alloc");
    memset((void *)d, 0x5a, 3 * page);
    int fd = -1;
    const int r = getfd(&fd, d + page, 2 * page, 1, 0);
    if (!export_ok) {
        ZT_CHECK(r == 801, "export refused with NOT_SUPPORTED, got %d", r);
        return 0;
    }
    ZT_CHECK(r == 0 && fd >= 0, "export: %d", r);
    void *m = mmap(NULL, 3 * page, PROT_READ, MAP_SHARED, fd, 0);
    ZT_CHECK(m != MAP_FAILED, "mmap of the dma-buf fd");
    ZT_CHECK(((unsigned char *)m)[page + 5] == 0x5a, "the fd maps the allocation's bytes");
    munmap(m, 3 * page);
    close(fd);
    ZT_CHECK(getfd(&fd, d + 1, page, 1, 0) == 1, "misaligned start refused");
    ZT_CHECK(getfd(&fd, d, page + 1, 1, 0) == 1, "misaligned size refused");
    ZT_CHECK(getfd(&fd, d, 4 * page, 1, 0) == 1, "range beyond the allocation refused");
    std::vector<unsigned char> host(2 * page);
    ZT_CHECK(getfd(&fd, (unsigned long long)(uintptr_t)host.data(), page, 1, 0) == 1, "host memory refused");
    return 0;
}

TEST(FakeCudaGdr, DmaBufExportAndAttributes) {
    EXPECT_EQ(zt::run_in_child({{"FAKE_CUDA_CC", "80"}}, [] { return dmabuf_body(true); }), 0);
    EXPECT_EQ(zt::run_in_child({{"FAKE_CUDA_CC", "80"}, {"FAKE_CUDA_DMABUF", "0"}}, [] { return dmabuf_body(false); }), 0);
}

}  // namespace

namespace {
/* Two ranks on device memory calling different all-reduces (counts 1000 and 1001): the call descriptors are not
 * staged, so they are compared on arrival and every rank fails naming both calls, on the pipelined path and on the
 * synchronous one (which used to stage them and so never compared them). */
TEST(StagePipeMixed, DifferentDeviceCallsFailNamingBothOnBothPaths) {
    for (const char *depth : {"2", "0"}) {
        zt::Options o = opts("tcp", depth);
        o.env.push_back({"ZCCL_TIMEOUT_MS", "10000"});
        o.deadline_s = 60;
        zt::run_ranks(2, [](zccl_comm_t comm, int rank, int) -> int {
            Fake f;
            ZT_CHECK(open_fake(&f), "fake symbols");
            const size_t count = 1000 + (size_t)rank;
            Dev<float> s(&f, count, 1.f), r(&f, count, -1.f);
            zccl_result_t res = zccl_allreduce(s.p(), r.p(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL);
            const std::string msg = zccl_get_last_error(NULL);
            ZT_CHECK(res != ZCCL_SUCCESS, "rank %d: different calls succeeded", rank);
            ZT_CHECK(msg.find("different collectives") != std::string::npos && msg.find("count 1001") != std::string::npos,
                   "rank %d: %s", rank, msg.c_str());
            return 0;
        }, o);
    }
}
}  // namespace

/*
 * test_ipc.cpp — collectives on registered device buffers between processes of one host (lib/core/regmem.c's
 * one-pass path over CUDA IPC; docs/gpu.md "CUDA IPC"), on a machine without a GPU: the fake driver of
 * tests/fake_cuda (ZCCL_CUDA_LIBRARY) makes cuMemAlloc memory a shared memfd mapping and emulates cuIpcGetMemHandle /
 * cuIpcOpenMemHandle / cuIpcCloseMemHandle across processes. Every rank uses device 0: several ranks on one GPU.
 *
 * For 2 and 3 ranks over shared memory: all-reduce (SUM, AVG), reduce-scatter, all-gather and broadcast, in and out of
 * place, counts 1 to 300000, each result checked against a reference every rank computes from the known inputs of
 * all ranks; each call must have taken the direct path (zccl__reg_direct_calls), read peer mappings (the fake's count
 * of copies and kernels with an operand in an opened IPC mapping) and copied nothing through host memory (the fake's
 * count of copies with a host side). When one rank's buffer cannot be exported (host memory the fake marks as device
 * memory, registered), after deregistration, and for a call where one rank cannot open a peer's handle (the fake
 * fails the open: GPUs without peer access), every rank takes the staged path with the same results. Deregistering
 * closes the peers' handles of that rank's allocations before it returns, so they can be freed before the
 * communicator is destroyed.
 */
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" uint64_t zccl__reg_direct_calls(int mem_type); /* lib/core/regmem.h */
extern "C" bool zccl__mem_cuda_built(void);             /* mem/mem.h */
#include "harness/harness.h"
#include "zccl.h"

namespace {


struct IpcStats {
    long gets, opens, closes, mapped_now, peer_ops, host_copies;
};
struct FakeIpc {
    int (*alloc)(unsigned long long *, size_t);
    int (*free)(unsigned long long);
    void (*stats)(IpcStats *);
    void (*mark)(const void *, size_t, int);
    void (*unmark)(const void *);
    void (*fail_opens)(int);
    bool open() {
        void *h = dlopen(ZCCL_FAKE_CUDA_PATH, RTLD_NOW);
        if (!h) return false;
        *(void **)&alloc = dlsym(h, "cuMemAlloc_v2");
        *(void **)&free = dlsym(h, "cuMemFree_v2");
        *(void **)&stats = dlsym(h, "fake_cuda_ipc_stats");
        *(void **)&mark = dlsym(h, "fake_cuda_mark");
        *(void **)&unmark = dlsym(h, "fake_cuda_unmark");
        *(void **)&fail_opens = dlsym(h, "fake_cuda_ipc_fail_opens");
        return alloc && free && stats && mark && unmark && fail_opens;
    }
    void *dev(size_t bytes) {
        unsigned long long p = 0;
        return alloc(&p, bytes) == 0 ? (void *)(uintptr_t)p : nullptr;
    }
};

/* Rank r's inputs: small integers, so float sums are exact in any order. */
float fin(int r, size_t j) { return (float)((int)(j % 97) - 40 + 5 * r); }
int32_t iin(int r, size_t j) { return (int32_t)((uint32_t)r * 1000003u + (uint32_t)j * 7u); }

/* Which path a call took, from zccl's counter and the fake driver's. */
struct Path {
    FakeIpc *f;
    IpcStats s0{};
    uint64_t d0 = 0;
    explicit Path(FakeIpc *fk) : f(fk) { f->stats(&s0); d0 = zccl__reg_direct_calls(1); }
    /* 0 when the call ran directly over IPC (peer_read: it read peer memory) without host staging */
    bool direct(bool peer_read, const char **why) const {
        IpcStats s1;
        f->stats(&s1);
        if (zccl__reg_direct_calls(1) != d0 + 1) return *why = "the call did not take the direct path", false;
        if (s1.host_copies != s0.host_copies) return *why = "a copy went through host memory", false;
        if (peer_read && s1.peer_ops == s0.peer_ops) return *why = "no copy or kernel read a peer's mapping", false;
        return true;
    }
    bool staged() const { return zccl__reg_direct_calls(1) == d0; }
};

/* Runs every covered collective on count elements over the buffers given, and checks the results and the path. */
int run_all(zccl_comm_t c, int rank, int n, size_t count, FakeIpc &f, float *fsend, float *frecv, int32_t *isend,
            int32_t *irecv, bool expect_direct) {
    const size_t total = count * (size_t)n;
    const char *why = "";
    auto check_path = [&](const Path &p, bool peer_read, const char *what) -> int {
        if (expect_direct) ZT_CHECK(p.direct(peer_read, &why), "%s count %zu: %s", what, count, why);
        else ZT_CHECK(p.staged(), "%s count %zu: took the direct path with a buffer that is not IPC-able", what,
                       count);
        return 0;
    };
    /* all-reduce: rank i reduces block i of ceil(count / n) elements (none when the count is small) */
    const bool has_block = (size_t)rank * ((count + (size_t)n - 1) / (size_t)n) < count;
    /* all-reduce SUM, out of place */
    for (size_t j = 0; j < count; j++) fsend[j] = fin(rank, j);
    {
        Path p(&f);
        ZT_CHECK(zccl_allreduce(fsend, frecv, count, ZCCL_FLOAT32, ZCCL_SUM, c, NULL) == ZCCL_SUCCESS, "allreduce: %s",
                  zccl_get_last_error(NULL));
        if (check_path(p, has_block, "allreduce")) return 1;
    }
    for (size_t j = 0; j < count; j++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += fin(r, j);
        ZT_CHECK(frecv[j] == want, "allreduce count %zu [%zu] = %g, want %g", count, j, frecv[j], want);
        ZT_CHECK(fsend[j] == fin(rank, j), "allreduce changed its input [%zu]", j);
    }
    /* all-reduce AVG, in place */
    for (size_t j = 0; j < count; j++) frecv[j] = fin(rank, j);
    {
        Path p(&f);
        ZT_CHECK(zccl_allreduce(frecv, frecv, count, ZCCL_FLOAT32, ZCCL_AVG, c, NULL) == ZCCL_SUCCESS,
                  "allreduce avg: %s", zccl_get_last_error(NULL));
        if (check_path(p, has_block, "allreduce avg in place")) return 1;
    }
    for (size_t j = 0; j < count; j++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += fin(r, j);
        want /= (float)n;
        ZT_CHECK(std::fabs(frecv[j] - want) <= 1e-6f * std::fabs(want), "avg count %zu [%zu] = %g, want %g", count,
                  j, frecv[j], want);
    }
    /* reduce-scatter int32 SUM, out of place and in place (the result in the rank's block of the input) */
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t j = 0; j < total; j++) isend[j] = iin(rank, j);
        int32_t *out = inplace ? isend + (size_t)rank * count : irecv;
        Path p(&f);
        ZT_CHECK(zccl_reduce_scatter(isend, out, count, ZCCL_INT32, ZCCL_SUM, c, NULL) == ZCCL_SUCCESS,
                  "reduce_scatter: %s", zccl_get_last_error(NULL));
        if (check_path(p, true, "reduce_scatter")) return 1;
        for (size_t j = 0; j < count; j++) {
            uint32_t want = 0;
            for (int r = 0; r < n; r++) want += (uint32_t)iin(r, (size_t)rank * count + j);
            ZT_CHECK(out[j] == (int32_t)want, "reduce_scatter in_place %d count %zu [%zu] = %d, want %d", inplace,
                      count, j, out[j], (int32_t)want);
        }
    }
    /* all-gather int32, out of place and in place (the input is the rank's block of the output) */
    for (int inplace = 0; inplace < 2; inplace++) {
        int32_t *in = inplace ? irecv + (size_t)rank * count : isend;
        if (inplace) memset(irecv, 0xab, total * 4);
        for (size_t j = 0; j < count; j++) in[j] = iin(rank, j) ^ 0x5a5a;
        Path p(&f);
        ZT_CHECK(zccl_allgather(in, irecv, count, ZCCL_INT32, c, NULL) == ZCCL_SUCCESS, "allgather: %s",
                  zccl_get_last_error(NULL));
        if (check_path(p, true, "allgather")) return 1;
        for (int r = 0; r < n; r++)
            for (size_t j = 0; j < count; j++)
                ZT_CHECK(irecv[(size_t)r * count + j] == (iin(r, j) ^ 0x5a5a), "allgather in_place %d [%d][%zu]",
                          inplace, r, j);
    }
    /* broadcast float32 from the last rank out of place, from rank 0 in place */
    for (int inplace = 0; inplace < 2; inplace++) {
        const int root = inplace ? 0 : n - 1;
        for (size_t j = 0; j < count; j++) {
            fsend[j] = fin(rank, j) + 1000.f;
            frecv[j] = inplace ? fsend[j] : -1.f;
        }
        Path p(&f);
        ZT_CHECK(zccl_broadcast(inplace ? frecv : fsend, frecv, count, ZCCL_FLOAT32, root, c, NULL) == ZCCL_SUCCESS,
                  "broadcast: %s", zccl_get_last_error(NULL));
        if (check_path(p, rank != root, "broadcast")) return 1;
        for (size_t j = 0; j < count; j++)
            ZT_CHECK(frecv[j] == fin(root, j) + 1000.f, "broadcast in_place %d count %zu [%zu] = %g", inplace, count,
                      j, frecv[j]);
    }
    return 0;
}

class IpcCollectives : public ::testing::TestWithParam<int> {};

TEST_P(IpcCollectives, DeviceBuffersOverCudaIpc) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    const int nr = GetParam();
    zt::Options o;
    o.env = {{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH}, {"ZCCL_TRANSPORT", "shm"}, {"ZCCL_SHM_REG_MIN_BYTES", "1"}};
    o.deadline_s = 200;
    zt::run_ranks(nr, [](zccl_comm_t comm, int rank, int n) -> int {
        FakeIpc f;
        ZT_CHECK(f.open(), "fake driver symbols");
        /* A communicator of its own, so that the test sees its destruction close the handles. */
        zccl_comm_t c = NULL;
        ZT_CHECK(zccl_comm_split(comm, 0, rank, &c) == ZCCL_SUCCESS && c, "split: %s", zccl_get_last_error(NULL));
        const size_t maxc = 300000, total = maxc * (size_t)n;
        /* Float send and receive buffers in ONE allocation (two registrations share its handle: the cache), the
         * int32 buffers in another. */
        uint8_t *fa = (uint8_t *)f.dev(2 * total * 4), *ia = (uint8_t *)f.dev(2 * total * 4);
        ZT_CHECK(fa && ia, "cuMemAlloc");
        float *fsend = (float *)fa, *frecv = (float *)(fa + total * 4);
        int32_t *isend = (int32_t *)ia, *irecv = (int32_t *)(ia + total * 4);
        IpcStats s0;
        f.stats(&s0);
        void *h[4];
        ZT_CHECK(zccl_comm_register(c, fsend, total * 4, &h[0]) == ZCCL_SUCCESS, "register");
        ZT_CHECK(zccl_comm_register(c, frecv, total * 4, &h[1]) == ZCCL_SUCCESS, "register");
        ZT_CHECK(zccl_comm_register(c, isend, total * 4, &h[2]) == ZCCL_SUCCESS, "register");
        ZT_CHECK(zccl_comm_register(c, irecv, total * 4, &h[3]) == ZCCL_SUCCESS, "register");
        IpcStats s1;
        f.stats(&s1);
        ZT_CHECK(s1.gets - s0.gets == 2, "one IPC handle per allocation expected, got %ld", s1.gets - s0.gets);
        for (size_t count : {size_t(1), size_t(7), size_t(1000), size_t(4099), size_t(65537), maxc})
            if (run_all(c, rank, n, count, f, fsend, frecv, isend, irecv, true)) return 1;
        f.stats(&s1);
        ZT_CHECK(s1.opens - s0.opens == 2 * (n - 1), "each peer allocation opened once per communicator: %ld opens",
                  s1.opens - s0.opens);

        /* Fallback: rank 0's buffers are host memory the driver calls device memory (no cuMemAlloc: not IPC-able),
         * registered all the same; every rank must take the staged path, with the same results. */
        std::vector<float> hf(2 * 5000 * (size_t)n);
        std::vector<int32_t> hi(2 * 5000 * (size_t)n);
        float *fs = fsend, *fr = frecv;
        int32_t *is = isend, *ir = irecv;
        void *hh[2] = {NULL, NULL};
        if (rank == 0) {
            f.mark(hf.data(), hf.size() * 4, 0);
            f.mark(hi.data(), hi.size() * 4, 0);
            ZT_CHECK(zccl_comm_register(c, hf.data(), hf.size() * 4, &hh[0]) == ZCCL_SUCCESS, "register host-backed");
            ZT_CHECK(zccl_comm_register(c, hi.data(), hi.size() * 4, &hh[1]) == ZCCL_SUCCESS, "register host-backed");
            fs = hf.data();
            fr = hf.data() + 5000 * (size_t)n;
            is = hi.data();
            ir = hi.data() + 5000 * (size_t)n;
        }
        for (size_t count : {size_t(3), size_t(5000)})
            if (run_all(c, rank, n, count, f, fs, fr, is, ir, false)) return 1;
        if (rank == 0) {
            ZT_CHECK(zccl_comm_deregister(c, hh[0]) == ZCCL_SUCCESS, "deregister");
            ZT_CHECK(zccl_comm_deregister(c, hh[1]) == ZCCL_SUCCESS, "deregister");
            f.unmark(hf.data());
            f.unmark(hi.data());
        }
        /* A rank that cannot open a peer's handle (GPUs without peer access): on a new communicator (nothing opened
         * yet) the last rank's open fails; every rank must then take the staged path for that call, the next call
         * the direct one. */
        {
            zccl_comm_t c2 = NULL;
            ZT_CHECK(zccl_comm_split(comm, 0, rank, &c2) == ZCCL_SUCCESS && c2, "split: %s", zccl_get_last_error(NULL));
            void *g[2];
            ZT_CHECK(zccl_comm_register(c2, fsend, total * 4, &g[0]) == ZCCL_SUCCESS, "register");
            ZT_CHECK(zccl_comm_register(c2, frecv, total * 4, &g[1]) == ZCCL_SUCCESS, "register");
            if (rank == n - 1) f.fail_opens(1);
            for (int k = 0; k < 2; k++) {
                const size_t count = 100000;
                for (size_t j = 0; j < count; j++) fsend[j] = fin(rank, j) * (float)(k + 1);
                const uint64_t d0 = zccl__reg_direct_calls(1);
                ZT_CHECK(zccl_allreduce(fsend, frecv, count, ZCCL_FLOAT32, ZCCL_SUM, c2, NULL) == ZCCL_SUCCESS,
                          "allreduce with a failing open: %s", zccl_get_last_error(NULL));
                ZT_CHECK(zccl__reg_direct_calls(1) == d0 + (uint64_t)k, "call %d: direct path %s", k,
                          k == 0 ? "taken although a rank could not open a peer's buffer" : "not taken");
                for (size_t j = 0; j < count; j++) {
                    float want = 0;
                    for (int r = 0; r < n; r++) want += fin(r, j) * (float)(k + 1);
                    ZT_CHECK(frecv[j] == want, "failing open, call %d [%zu] = %g, want %g", k, j, frecv[j], want);
                }
            }
            for (void *x : g)
                ZT_CHECK(zccl_comm_deregister(c2, x) == ZCCL_SUCCESS, "deregister: %s", zccl_get_last_error(NULL));
            ZT_CHECK(zccl_comm_destroy(c2) == ZCCL_SUCCESS, "destroy");
        }

        /* Deregistered on every rank: each deregistration closed the peers' mappings of that rank's allocations
         * before it returned (the peers' deregistrations returned before their part of the calls below), and the
         * staged path again. */
        f.stats(&s1);
        ZT_CHECK(s1.mapped_now - s0.mapped_now == 2 * (n - 1), "%ld mappings open before deregistering",
                  s1.mapped_now - s0.mapped_now);
        ZT_CHECK(zccl_barrier(c, NULL) == ZCCL_SUCCESS, "barrier"); /* no peer deregisters before that count */
        for (void *x : h) ZT_CHECK(zccl_comm_deregister(c, x) == ZCCL_SUCCESS, "deregister: %s",
                                    zccl_get_last_error(NULL));
        if (run_all(c, rank, n, 777, f, fsend, frecv, isend, irecv, false)) return 1;
        IpcStats s2;
        f.stats(&s2);
        ZT_CHECK(s2.mapped_now == s0.mapped_now && s2.closes - s1.closes == 2 * (n - 1),
                  "after every rank deregistered: %ld mappings open, %ld closed", s2.mapped_now - s0.mapped_now,
                  s2.closes - s1.closes);
        /* So the allocations may be freed now, before the communicator is destroyed, and it goes on working. */
        ZT_CHECK(zccl_barrier(c, NULL) == ZCCL_SUCCESS, "barrier");
        f.free((uintptr_t)fa);
        f.free((uintptr_t)ia);
        {
            std::vector<float> a(5000, float(rank + 1)), b(5000);
            ZT_CHECK(zccl_allreduce(a.data(), b.data(), a.size(), ZCCL_FLOAT32, ZCCL_SUM, c, NULL) == ZCCL_SUCCESS,
                      "allreduce after the free: %s", zccl_get_last_error(NULL));
            ZT_CHECK(b[4999] == float(n * (n + 1) / 2), "allreduce after the free: %g", b[4999]);
        }
        ZT_CHECK(zccl_comm_destroy(c) == ZCCL_SUCCESS, "destroy");
        IpcStats s3;
        f.stats(&s3);
        ZT_CHECK(s3.mapped_now == s0.mapped_now, "after destroy: %ld mappings open", s3.mapped_now - s0.mapped_now);
        return 0;
    }, o);
}

INSTANTIATE_TEST_SUITE_P(Ranks, IpcCollectives, ::testing::Values(2, 3));

/* Two ranks as threads of one process (a forked child, so that the fake driver is loaded there only): the peer's
 * allocation is this process's own, read at its own address; nothing is opened (CUDA refuses a process's own
 * handle, and so does the fake). */
TEST(IpcThreads, RanksInOneProcessReadEachOtherDirectly) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        setenv("ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH, 1);
        setenv("ZCCL_TRANSPORT", "shm", 1);
        setenv("ZCCL_SHM_REG_MIN_BYTES", "1", 1);
        alarm(60);
        FakeIpc f;
        if (!f.open()) _exit(2);
        zccl_unique_id_t id;
        if (zccl_get_unique_id(&id) != ZCCL_SUCCESS) _exit(3);
        const size_t count = 50000;
        int rc[2] = {-1, -1};
        IpcStats s0, s1;
        f.stats(&s0);
        auto rank_fn = [&](int rank) -> int {
            zccl_comm_t c = NULL;
            ZT_CHECK(zccl_comm_init_rank(&c, 2, id, rank) == ZCCL_SUCCESS, "init: %s", zccl_get_last_error(NULL));
            float *buf = (float *)f.dev(2 * count * 4);
            ZT_CHECK(buf, "cuMemAlloc");
            void *h;
            ZT_CHECK(zccl_comm_register(c, buf, 2 * count * 4, &h) == ZCCL_SUCCESS, "register");
            for (size_t j = 0; j < count; j++) buf[j] = fin(rank, j);
            ZT_CHECK(zccl_allreduce(buf, buf + count, count, ZCCL_FLOAT32, ZCCL_SUM, c, NULL) == ZCCL_SUCCESS,
                      "allreduce: %s", zccl_get_last_error(NULL));
            for (size_t j = 0; j < count; j++)
                ZT_CHECK(buf[count + j] == fin(0, j) + fin(1, j), "[%zu] = %g", j, buf[count + j]);
            ZT_CHECK(zccl_comm_deregister(c, h) == ZCCL_SUCCESS, "deregister");
            ZT_CHECK(zccl_comm_destroy(c) == ZCCL_SUCCESS, "destroy");
            return 0;
        };
        std::thread t0([&] { rc[0] = rank_fn(0); }), t1([&] { rc[1] = rank_fn(1); });
        t0.join();
        t1.join();
        f.stats(&s1);
        if (rc[0] || rc[1]) _exit(4);
        if (zccl__reg_direct_calls(1) != 2) { fprintf(stderr, "direct calls: %llu, want 2\n",
                                                      (unsigned long long)zccl__reg_direct_calls(1)); _exit(5); }
        if (s1.opens != s0.opens || s1.host_copies != s0.host_copies) {
            fprintf(stderr, "opens %ld, host copies %ld\n", s1.opens - s0.opens, s1.host_copies - s0.host_copies);
            _exit(6);
        }
        _exit(0);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
}

/* Issue 24: a registered device buffer freed while registered. FAKE_CUDA_REUSE_FREED=1 makes the fake driver hand a
 * freed allocation's address to the next cuMemAlloc of its size, with new pages behind it (its CUDA buffer id is new).
 * Two ranks over shm, each with one registered allocation (send and receive halves):
 *   1. all-reduce: the direct path, exact;
 *   2. rank 0 frees its allocation and gets the same address back (still registered): the registration's IPC
 *      handle would give rank 1 the OLD pages, so it must not be used: every rank takes the staged path, exact;
 *   3. rank 0 registers the new allocation again (deregister, register): the direct path again, exact;
 *   4. rank 0 frees it (still registered) and calls with the freed pointer: rank 0 fails with ZCCL_INVALID_ARGUMENT
 *      naming the buffer ("freed while registered?"), rank 1 fails too, quoting it; nobody returns success. */
TEST(IpcFreed, ReallocatedBufferIsNotUsedAndAFreedOneFailsOnEveryRank) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    zt::Options o;
    o.env = {{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH}, {"ZCCL_TRANSPORT", "shm"}, {"ZCCL_SHM_REG_MIN_BYTES", "1"},
             {"FAKE_CUDA_REUSE_FREED", "1"}, {"ZCCL_TIMEOUT_MS", "20000"}};
    o.deadline_s = 60;
    zt::run_ranks(2, [](zccl_comm_t c, int rank, int n) -> int {
        FakeIpc f;
        ZT_CHECK(f.open(), "fake driver symbols");
        const size_t count = 20000, bytes = 2 * count * 4;
        float *buf = (float *)f.dev(bytes);
        ZT_CHECK(buf, "cuMemAlloc");
        void *h = nullptr;
        ZT_CHECK(zccl_comm_register(c, buf, bytes, &h) == ZCCL_SUCCESS, "register: %s", zccl_get_last_error(NULL));
        auto call = [&](int round, bool want_direct) -> int {
            for (size_t j = 0; j < count; j++) buf[j] = fin(rank, j) + (float)round;
            Path p(&f);
            const char *why = "";
            ZT_CHECK(zccl_allreduce(buf, buf + count, count, ZCCL_FLOAT32, ZCCL_SUM, c, NULL) == ZCCL_SUCCESS,
                     "round %d: allreduce: %s", round, zccl_get_last_error(NULL));
            if (want_direct) ZT_CHECK(p.direct(true, &why), "round %d: %s", round, why);
            else ZT_CHECK(p.staged(), "round %d: the direct path used a registration of freed memory", round);
            for (size_t j = 0; j < count; j++) {
                float want = 0;
                for (int r = 0; r < n; r++) want += fin(r, j) + (float)round;
                ZT_CHECK(buf[count + j] == want, "round %d [%zu] = %g, want %g", round, j, buf[count + j], want);
            }
            return 0;
        };
        if (call(1, true)) return 1;
        if (rank == 0) { /* freed and allocated again: the same address, other pages */
            ZT_CHECK(f.free((unsigned long long)(uintptr_t)buf) == 0, "cuMemFree");
            float *again = (float *)f.dev(bytes);
            ZT_CHECK(again == buf, "the fake driver did not reuse the address (%p, then %p)", (void *)buf,
                     (void *)again);
        }
        if (call(2, false)) return 1;
        if (rank == 0) {
            ZT_CHECK(zccl_comm_deregister(c, h) == ZCCL_SUCCESS, "deregister: %s", zccl_get_last_error(NULL));
            ZT_CHECK(zccl_comm_register(c, buf, bytes, &h) == ZCCL_SUCCESS, "register again: %s",
                     zccl_get_last_error(NULL));
        }
        if (call(3, true)) return 1;
        if (rank == 0) ZT_CHECK(f.free((unsigned long long)(uintptr_t)buf) == 0, "cuMemFree");
        const zccl_result_t r = zccl_allreduce(buf, buf + count, count, ZCCL_FLOAT32, ZCCL_SUM, c, NULL);
        const std::string msg = zccl_get_last_error(NULL);
        ZT_CHECK(r != ZCCL_SUCCESS, "rank %d: a call on a freed registered buffer succeeded", rank);
        if (rank == 0) ZT_CHECK(r == ZCCL_INVALID_ARGUMENT, "rank 0: %d, want ZCCL_INVALID_ARGUMENT: %s", (int)r,
                                msg.c_str());
        ZT_CHECK(msg.find("is not device memory that is allocated (freed while registered?)") != std::string::npos,
                 "rank %d: the error does not name the cause: %s", rank, msg.c_str());
        char addr[32];
        snprintf(addr, sizeof addr, "%p", (void *)buf);
        if (rank == 0) ZT_CHECK(msg.find(addr) != std::string::npos, "rank 0: the buffer %s is not named: %s", addr,
                                msg.c_str());
        return 0;
    }, o);
}

/* One rank (of 3, over shm and TCP) passes a host send buffer with a device receive buffer: that rank's call is
 * refused with the cause, and every other rank fails the same call too, quoting it, instead of waiting for it. */
TEST(IpcFreed, MixedHostAndDeviceBuffersOnOneRankFailOnEveryRank) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    zt::Options o;
    o.env = {{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH}, {"ZCCL_TIMEOUT_MS", "20000"}};
    o.deadline_s = 60;
    for (const char *tp : {"shm", "tcp"}) {
        o.env.push_back({"ZCCL_TRANSPORT", tp});
        zt::run_ranks(3, [](zccl_comm_t c, int rank, int n) -> int {
            FakeIpc f;
            ZT_CHECK(f.open(), "fake driver symbols");
            const size_t count = 4096;
            float *dev = (float *)f.dev(2 * count * 4);
            ZT_CHECK(dev, "cuMemAlloc");
            std::vector<float> host(count, 1.f);
            const float *send = rank == 1 ? host.data() : dev;
            const zccl_result_t r = zccl_allreduce(send, dev + count, count, ZCCL_FLOAT32, ZCCL_SUM, c, NULL);
            const std::string msg = zccl_get_last_error(NULL);
            ZT_CHECK(r != ZCCL_SUCCESS, "rank %d: a call mixing host and device buffers on rank 1 succeeded", rank);
            if (rank == 1) ZT_CHECK(r == ZCCL_INVALID_ARGUMENT, "rank 1: %d: %s", (int)r, msg.c_str());
            ZT_CHECK(msg.find("'sendbuf' is host memory but 'recvbuf' is CUDA device memory") != std::string::npos,
                     "rank %d: the error does not name the cause: %s", rank, msg.c_str());
            (void)n;
            return 0;
        }, o);
        o.env.pop_back();
    }
}

} // namespace

/*
 * test_mem.cpp — the memory-type layer (mem, docs/gpu.md) on a machine without a GPU:
 *  - the host table wraps the CPU kernels;
 *  - the CUDA kernels' element code (kernels/cuda/reduce_ops.cuh, compiled here by the host compiler) gives
 *    bit-identical results to the CPU kernels for every datatype x op, PreMulSum included;
 *  - without a CUDA driver every buffer is host memory and libzccl works (the reason is kept);
 *  - with the fake driver of tests/fake_cuda (ZCCL_CUDA_LIBRARY), chosen buffers are "device memory": the query, the
 *    per-call type and its errors naming the buffer, the CUDA table's copy/launch/error paths, and whole
 *    collectives on device buffers through the engine's staging (sends copied out, receives reduced on the device).
 * Anything that loads a driver runs in a forked child: the driver is opened once per process.
 */
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "kernels.h"
#include "mem.h"
}
#include "cuda/reduce_ops.cuh"
#include "harness/harness.h"
#include "zccl.h"

namespace {


struct FakeStats {
    long copies, launches, allocs, inits, ctx_syncs;
    long event_records, waits;
    void *last_wait_stream;
    unsigned long long last_wait_addr;
    uint32_t last_wait_value;
    int event_pending;
    char last_kernel[64];
    size_t last_count;
    uint32_t last_divisor;
};
struct Fake {
    void (*mark)(const void *, size_t, int);
    void (*stats)(FakeStats *);
    void (*fail_next)(int);
    void (*unmark)(const void *);
    void (*event_pending)(int);
};
/* The fake driver zccl loaded (same file, so dlopen returns the same object). */
bool open_fake(Fake *f) {
    void *h = dlopen(ZCCL_FAKE_CUDA_PATH, RTLD_NOW);
    if (!h) return false;
    *(void **)&f->mark = dlsym(h, "fake_cuda_mark");
    *(void **)&f->stats = dlsym(h, "fake_cuda_stats");
    *(void **)&f->fail_next = dlsym(h, "fake_cuda_fail_next");
    *(void **)&f->unmark = dlsym(h, "fake_cuda_unmark");
    *(void **)&f->event_pending = dlsym(h, "fake_cuda_event_pending");
    return f->mark && f->stats && f->fail_next && f->unmark && f->event_pending;
}
const std::vector<std::pair<const char *, const char *>> kFakeEnv = {{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH}};

/* Random bytes that are meaningful values of dt (floats: a mix of ordinary values, zeros, NaN, infinities). */
void fill(std::vector<uint8_t> &v, zccl_datatype_t dt, std::mt19937 &rng) {
    for (auto &b : v) b = (uint8_t)rng();
    const size_t es = zccl_type_size(dt), n = v.size() / es;
    for (size_t i = 0; i < n; i++) {
        float f = std::uniform_real_distribution<float>(-8.f, 8.f)(rng);
        if (i % 17 == 3) f = 0.f;
        if (i % 31 == 5) f = -0.f;
        if (i % 53 == 7) f = NAN;
        if (i % 61 == 9) f = INFINITY;
        uint8_t *p = &v[i * es];
        switch (dt) {
        case ZCCL_FLOAT32: memcpy(p, &f, 4); break;
        case ZCCL_FLOAT64: { double d = (double)f * 1.000001; memcpy(p, &d, 8); break; }
        case ZCCL_FLOAT16: { uint16_t h = zccl_float_to_half(f); memcpy(p, &h, 2); break; }
        case ZCCL_BFLOAT16: { uint16_t h = zccl_float_to_bf16(f); memcpy(p, &h, 2); break; }
        default: break; /* integers and fp8: every bit pattern is a value worth testing */
        }
    }
}

bool same_elem(const uint8_t *x, const uint8_t *y, zccl_datatype_t dt) {
    const size_t es = zccl_type_size(dt);
    if (!memcmp(x, y, es)) return true;
    /* two NaNs whose payloads differ are the same result */
    switch (dt) {
    case ZCCL_FLOAT32: { float a, b; memcpy(&a, x, 4); memcpy(&b, y, 4); return a != a && b != b; }
    case ZCCL_FLOAT64: { double a, b; memcpy(&a, x, 8); memcpy(&b, y, 8); return a != a && b != b; }
    case ZCCL_FLOAT16: { uint16_t a, b; memcpy(&a, x, 2); memcpy(&b, y, 2);
                         return std::isnan(zccl_half_to_float(a)) && std::isnan(zccl_half_to_float(b)); }
    case ZCCL_BFLOAT16: { uint16_t a, b; memcpy(&a, x, 2); memcpy(&b, y, 2);
                          return std::isnan(zccl_bf16_to_float(a)) && std::isnan(zccl_bf16_to_float(b)); }
    case ZCCL_FLOAT8E4M3: return std::isnan(zccl_e4m3_to_float(*x)) && std::isnan(zccl_e4m3_to_float(*y));
    case ZCCL_FLOAT8E5M2: return std::isnan(zccl_e5m2_to_float(*x)) && std::isnan(zccl_e5m2_to_float(*y));
    default: return false;
    }
}

template <int DT, int OP> void gpu_code_reduce(void *dst, const void *a, const void *b, size_t n, uint32_t div) {
    typedef typename zccl_cu::elem<DT>::type T;
    zccl_cu::reduce_range<DT, OP>((T *)dst, (const T *)a, (const T *)b, 0, n, 1, div);
}
template <int DT> void gpu_code_premul(void *dst, const void *src, size_t n, const void *scalar) {
    typedef typename zccl_cu::elem<DT>::type T;
    T s;
    memcpy(&s, scalar, sizeof s);
    for (size_t i = 0; i < n; i++) ((T *)dst)[i] = zccl_cu::elem<DT>::premul(s, ((const T *)src)[i]);
}

typedef void (*reduce_fn)(void *, const void *, const void *, size_t, uint32_t);
typedef void (*premul_fn)(void *, const void *, size_t, const void *);
template <int DT> void table_row(reduce_fn *row, premul_fn *pm) {
    row[0] = gpu_code_reduce<DT, 0>;
    row[1] = gpu_code_reduce<DT, 1>;
    row[2] = gpu_code_reduce<DT, 2>;
    row[3] = gpu_code_reduce<DT, 3>;
    *pm = gpu_code_premul<DT>;
}

} // namespace

TEST(MemLayer, HostTableWrapsTheCpuKernels) {
    const zccl_mem_ops_t *h = zccl__mem_ops(ZCCL_MEM_HOST);
    ASSERT_STREQ(h->name, "host");
    EXPECT_EQ(zccl__mem_ops(ZCCL_MEM_CUDA), &zccl__mem_cuda);
    std::mt19937 rng(7);
    for (int dt = 0; dt < ZCCL_NUM_TYPES; dt++) {
        const size_t n = 1000, es = zccl_type_size((zccl_datatype_t)dt);
        std::vector<uint8_t> a(n * es), b(n * es), want(n * es), got(n * es);
        fill(a, (zccl_datatype_t)dt, rng);
        fill(b, (zccl_datatype_t)dt, rng);
        for (int op = 0; op < ZCCL_NUM_OPS; op++) {
            const uint32_t div = op == ZCCL_AVG ? 3 : 1;
            zccl_kernel_reduce(want.data(), a.data(), b.data(), n, (zccl_datatype_t)dt,
                               op == ZCCL_AVG ? ZCCL_SUM : (zccl_redop_t)op, div);
            ASSERT_EQ(h->reduce(got.data(), a.data(), b.data(), n, (zccl_datatype_t)dt, (zccl_redop_t)op, div),
                      ZCCL_SUCCESS);
            for (size_t i = 0; i < n; i++)
                ASSERT_TRUE(same_elem(&got[i * es], &want[i * es], (zccl_datatype_t)dt)) << "dt " << dt << " op " << op
                                                                                         << " element " << i;
        }
        ASSERT_EQ(h->copy(got.data(), a.data(), n * es), ZCCL_SUCCESS);
        EXPECT_EQ(got, a);
    }
    void *p = nullptr;
    ASSERT_EQ(h->alloc(&p, 100), ZCCL_SUCCESS);
    EXPECT_EQ((uintptr_t)p % 4096, 0u);
    h->free(p);
}

/* The code every CUDA thread runs, compiled for the host, against the CPU kernels: all datatypes x ops, divisors
 * 1, 2, 3 and 7 for SUM (AVG's final step), PreMulSum's product with several scalars. */
TEST(MemLayer, CudaElementCodeMatchesCpuKernels) {
    reduce_fn tab[ZCCL_NUM_TYPES][4];
    premul_fn pm[ZCCL_NUM_TYPES];
    table_row<0>(tab[0], &pm[0]);
    table_row<1>(tab[1], &pm[1]);
    table_row<2>(tab[2], &pm[2]);
    table_row<3>(tab[3], &pm[3]);
    table_row<4>(tab[4], &pm[4]);
    table_row<5>(tab[5], &pm[5]);
    table_row<6>(tab[6], &pm[6]);
    table_row<7>(tab[7], &pm[7]);
    table_row<8>(tab[8], &pm[8]);
    table_row<9>(tab[9], &pm[9]);
    table_row<10>(tab[10], &pm[10]);
    table_row<11>(tab[11], &pm[11]);
    std::mt19937 rng(11);
    long checked = 0;
    for (int dt = 0; dt < ZCCL_NUM_TYPES; dt++) {
        const zccl_datatype_t t = (zccl_datatype_t)dt;
        const size_t n = 4096, es = zccl_type_size(t);
        std::vector<uint8_t> a(n * es), b(n * es), want(n * es), got(n * es);
        fill(a, t, rng);
        fill(b, t, rng);
        for (int op = 0; op < 4; op++) {
            for (uint32_t div : {1u, 2u, 3u, 7u}) {
                if (div > 1 && op != ZCCL_SUM) continue;
                zccl_kernel_reduce(want.data(), a.data(), b.data(), n, t, (zccl_redop_t)op, div);
                tab[dt][op](got.data(), a.data(), b.data(), n, div);
                for (size_t i = 0; i < n; i++, checked++)
                    ASSERT_TRUE(same_elem(&got[i * es], &want[i * es], t))
                        << "datatype " << dt << " op " << op << " divisor " << div << " element " << i;
            }
        }
        for (int k = 0; k < 4; k++) {
            std::vector<uint8_t> sc(es);
            fill(sc, t, rng);
            zccl_kernel_premul(want.data(), a.data(), n, t, sc.data());
            pm[dt](got.data(), a.data(), n, sc.data());
            for (size_t i = 0; i < n; i++, checked++)
                ASSERT_TRUE(same_elem(&got[i * es], &want[i * es], t)) << "premul datatype " << dt << " element " << i;
        }
    }
    EXPECT_GT(checked, 500000);
}

TEST(MemLayer, WithoutADriverEveryBufferIsHost) {
    const int rc = zt::run_in_child({{"ZCCL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"}}, [] {
        const char *why = nullptr;
        ZT_CHECK(!zccl__mem_cuda_available(&why), "a driver was loaded");
        ZT_CHECK(why && strstr(why, "/nonexistent/libcuda.so.1"), "reason does not name the file: %s", why);
        int x = 0, dev = 7;
        zccl_mem_type_t t = ZCCL_MEM_CUDA;
        ZT_CHECK(zccl__mem_query(&x, &t, &dev) == ZCCL_SUCCESS && t == ZCCL_MEM_HOST && dev == -1, "query");
        ZT_CHECK(zccl__mem_call_type("f", &x, &x, &t) == ZCCL_SUCCESS && t == ZCCL_MEM_HOST, "call type");
        /* the CUDA table without a driver: an error that says so, never a crash */
        ZT_CHECK(zccl__mem_cuda.copy(&dev, &x, sizeof x) == ZCCL_INVALID_USAGE, "copy without a driver");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "without a CUDA driver"), "message: %s", zccl_get_last_error(NULL));
        return 0;
    });
    EXPECT_EQ(rc, 0);
}

TEST(MemLayer, FakeDriverQueryAndCallType) {
    const int rc = zt::run_in_child(kFakeEnv, [] {
        Fake f;
        ZT_CHECK(zccl__mem_cuda_available(nullptr), "the fake driver did not load");
        ZT_CHECK(open_fake(&f), "fake symbols");
        std::vector<float> dev(64), dev2(64), host(64);
        f.mark(dev.data(), sizeof(float) * 64, 0);
        f.mark(dev2.data(), sizeof(float) * 64, 1);
        zccl_mem_type_t t;
        int d = -1;
        ZT_CHECK(zccl__mem_query(dev.data() + 3, &t, &d) == ZCCL_SUCCESS && t == ZCCL_MEM_CUDA && d == 0, "dev");
        ZT_CHECK(zccl__mem_query(host.data(), &t, &d) == ZCCL_SUCCESS && t == ZCCL_MEM_HOST && d == -1, "host");
        ZT_CHECK(zccl__mem_call_type("zccl_allreduce", host.data(), host.data(), &t) == ZCCL_SUCCESS &&
                        t == ZCCL_MEM_HOST, "host call");
        ZT_CHECK(zccl__mem_call_type("zccl_allreduce", host.data(), dev.data(), &t) == ZCCL_INVALID_ARGUMENT,
                    "mixed host/device accepted");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "'sendbuf' is host memory but 'recvbuf' is CUDA device memory"),
                    "message: %s", zccl_get_last_error(NULL));
        ZT_CHECK(zccl__mem_call_type("zccl_allreduce", dev.data(), dev2.data(), &t) == ZCCL_INVALID_ARGUMENT,
                    "two devices accepted");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "device 0 but 'recvbuf' on device 1"), "message: %s",
                    zccl_get_last_error(NULL));
        const zccl_result_t r = zccl__mem_call_type("zccl_broadcast", NULL, dev.data(), &t);
        if (zccl__mem_cuda_built()) {
            ZT_CHECK(r == ZCCL_SUCCESS && t == ZCCL_MEM_CUDA, "device call refused: %s", zccl_get_last_error(NULL));
        } else {
            ZT_CHECK(r == ZCCL_INVALID_USAGE, "device memory accepted without the CUDA kernels");
            ZT_CHECK(strstr(zccl_get_last_error(NULL), "zccl_broadcast: 'recvbuf'") &&
                            strstr(zccl_get_last_error(NULL), "built without the CUDA kernels"),
                        "message: %s", zccl_get_last_error(NULL));
        }
        return 0;
    });
    EXPECT_EQ(rc, 0);
}

TEST(MemLayer, FakeDriverCudaTable) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    const int rc = zt::run_in_child(kFakeEnv, [] {
        Fake f;
        ZT_CHECK(open_fake(&f), "fake symbols");
        const zccl_mem_ops_t *c = zccl__mem_ops(ZCCL_MEM_CUDA);
        void *da = nullptr, *db = nullptr;
        ZT_CHECK(c->alloc(&da, 4 * 100) == ZCCL_SUCCESS && c->alloc(&db, 4 * 100) == ZCCL_SUCCESS, "alloc");
        std::vector<float> h(100), out(100);
        for (int i = 0; i < 100; i++) h[i] = (float)i;
        ZT_CHECK(c->copy(da, h.data(), 400) == ZCCL_SUCCESS && c->copy(db, h.data(), 400) == ZCCL_SUCCESS, "copy");
        /* AVG is launched as the SUM kernel with the divisor */
        ZT_CHECK(c->reduce(da, da, db, 100, ZCCL_FLOAT32, ZCCL_AVG, 2) == ZCCL_SUCCESS, "reduce: %s",
                    zccl_get_last_error(NULL));
        FakeStats s;
        f.stats(&s);
        ZT_CHECK(!strcmp(s.last_kernel, "zccl_reduce_7_0") && s.last_count == 100 && s.last_divisor == 2,
                    "launched %s count %zu divisor %u", s.last_kernel, s.last_count, s.last_divisor);
        ZT_CHECK(c->copy(out.data(), da, 400) == ZCCL_SUCCESS, "copy back");
        for (int i = 0; i < 100; i++) ZT_CHECK(out[i] == (float)i, "element %d = %g", i, out[i]);
        /* a kernel the fake does not run: zccl reports the launch failure with the driver's words */
        ZT_CHECK(c->reduce(da, da, db, 10, ZCCL_BFLOAT16, ZCCL_MAX, 1) == ZCCL_SYSTEM_ERROR, "bf16 max");
        f.stats(&s);
        ZT_CHECK(!strcmp(s.last_kernel, "zccl_reduce_9_2"), "launched %s", s.last_kernel);
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "launching the reduction kernel failed: CUDA_ERROR_NOT_SUPPORTED"),
                    "message: %s", zccl_get_last_error(NULL));
        f.fail_next(1);
        ZT_CHECK(c->copy(out.data(), da, 400) == ZCCL_SYSTEM_ERROR, "failed copy not reported");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "cuMemcpyAsync of 400 bytes") &&
                        strstr(zccl_get_last_error(NULL), "CUDA_ERROR_UNKNOWN"), "message: %s", zccl_get_last_error(NULL));
        /* staging: a received block is copied to the device bounce buffer, then reduced there */
        zccl_mem_stage_t st = {};
        void *scr = nullptr;
        ZT_CHECK(zccl__mem_stage_scratch(&st, ZCCL_MEM_CUDA, 1000, &scr) == ZCCL_SUCCESS && scr, "scratch");
        zccl_mem_type_t t;
        ZT_CHECK(zccl__mem_query(scr, &t, NULL) == ZCCL_SUCCESS && t == ZCCL_MEM_CUDA, "scratch not on device");
        zccl__mem_stage_phase(&st);
        uint8_t *hb = nullptr, *hb2 = nullptr;
        ZT_CHECK(zccl__mem_stage_host(&st, 400, &hb) == ZCCL_SUCCESS, "host");
        ZT_CHECK(zccl__mem_stage_host(&st, 400, &hb2) == ZCCL_SUCCESS && hb2 >= hb + 400, "host bytes overlap");
        memcpy(hb, h.data(), 400);
        ZT_CHECK(zccl__mem_stage_recv_done(&st, ZCCL_MEM_CUDA, db, da, hb, 400, ZCCL_FLOAT32, ZCCL_SUM, 1) ==
                        ZCCL_SUCCESS, "recv_done: %s", zccl_get_last_error(NULL));
        ZT_CHECK(zccl__mem_query(st.bounce, &t, NULL) == ZCCL_SUCCESS && t == ZCCL_MEM_CUDA, "bounce on host");
        ZT_CHECK(c->copy(out.data(), db, 400) == ZCCL_SUCCESS, "copy back");
        for (int i = 0; i < 100; i++) ZT_CHECK(out[i] == 2.f * (float)i, "element %d = %g", i, out[i]);
        zccl__mem_stage_free(&st);
        c->free(da);
        c->free(db);
        return 0;
    });
    EXPECT_EQ(rc, 0);
}

/* The host-side sequencing of stream-ordered calls (mem/cuda_order.c) against the fake driver: what is queued on
 * the caller's stream, the tickets, waiting for the inputs, the completion word, and the errors. */
TEST(MemLayer, FakeDriverStreamOrderSequencing) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    const int rc = zt::run_in_child(kFakeEnv, [] {
        Fake f;
        ZT_CHECK(open_fake(&f), "fake symbols");
        void *h = dlopen(ZCCL_FAKE_CUDA_PATH, RTLD_NOW);
        auto user_stream = (void *(*)(void *))dlsym(h, "fake_cuda_user_stream");
        auto hold = (int (*)(void *))dlsym(h, "fake_cuda_stream_hold");
        auto release = (void (*)(int))dlsym(h, "fake_cuda_release");
        ZT_CHECK(user_stream && hold && release, "stream-order symbols of the fake driver");
        void *user = user_stream(nullptr);
        zccl_cuda_order_t *o = nullptr;
        ZT_CHECK(zccl__cuda_order_create(user, &o) == ZCCL_SUCCESS && o, "create: %s", zccl_get_last_error(NULL));
        const int held = hold(user); /* the caller's kernels before the calls are still running */
        zccl_cuda_ticket_t t1 = {}, t2 = {};
        FakeStats s;
        ZT_CHECK(zccl__cuda_order_issue(o, &t1) == ZCCL_SUCCESS && t1.value == 1 && t1.event, "issue 1");
        f.stats(&s);
        ZT_CHECK(s.event_records == 1 && s.waits == 1 && s.last_wait_stream == user && s.last_wait_value == 1,
                    "issue queued %ld records, %ld waits, value %u", s.event_records, s.waits, s.last_wait_value);
        const unsigned long long flag_addr = s.last_wait_addr;
        ZT_CHECK(zccl__cuda_order_issue(o, &t2) == ZCCL_SUCCESS && t2.value == 2, "issue 2");
        ZT_CHECK(t2.event != t1.event, "two calls share one event: the first would wait behind its own wait");
        f.stats(&s);
        ZT_CHECK(s.last_wait_value == 2 && s.last_wait_addr == flag_addr, "second wait %u", s.last_wait_value);
        ZT_CHECK(zccl__cuda_order_done(o) == 0, "nothing done yet");
        std::atomic<int> began{0};
        std::thread th([&] { began = zccl__cuda_order_begin(o, &t1, nullptr) == ZCCL_SUCCESS ? 1 : 2; });
        usleep(50000);
        ZT_CHECK(began == 0, "begin returned before the caller's earlier work ran");
        release(held); /* the stream reaches call 1's event; call 2's event lies behind call 1's wait */
        th.join();
        ZT_CHECK(began == 1, "begin 1 failed: %s", zccl_get_last_error(NULL));
        zccl__cuda_order_end(o, &t1);
        ZT_CHECK(zccl__cuda_order_done(o) == 1 && *(volatile uint32_t *)(uintptr_t)flag_addr == 1,
                    "completion word not written");
        ZT_CHECK(zccl__cuda_order_begin(o, &t2, nullptr) == ZCCL_SUCCESS, "begin 2");
        zccl__cuda_order_end(o, &t2);
        ZT_CHECK(zccl__cuda_order_done(o) == 2, "completion word");
        zccl_cuda_ticket_t t3 = {};
        ZT_CHECK(zccl__cuda_order_issue(o, &t3) == ZCCL_SUCCESS && t3.value == 3, "issue 3");
        f.fail_next(1); /* the event query reports a failed kernel before the call */
        ZT_CHECK(zccl__cuda_order_begin(o, &t3, nullptr) == ZCCL_UNHANDLED_CUDA_ERROR,
                    "failure before the call not reported");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "the work queued on that stream before it failed"), "message: %s",
                    zccl_get_last_error(NULL));
        zccl__cuda_order_end(o, &t3);
        zccl_cuda_ticket_t t4 = {};
        f.fail_next(2); /* cuStreamWaitValue32 fails */
        ZT_CHECK(zccl__cuda_order_issue(o, &t4) == ZCCL_SYSTEM_ERROR && t4.value == 0, "failed wait not reported");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "cuStreamWaitValue32"), "message: %s",
                    zccl_get_last_error(NULL));
        zccl__cuda_order_destroy(o);
        return 0;
    });
    EXPECT_EQ(rc, 0);
}

TEST(MemLayer, StreamOrderWithoutDriverIsAClearError) {
    const int rc = zt::run_in_child({{"ZCCL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"}}, [] {
        zccl_cuda_order_t *o = (zccl_cuda_order_t *)1;
        ZT_CHECK(zccl__cuda_order_create((void *)1, &o) == ZCCL_INVALID_USAGE && !o, "accepted");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "no CUDA driver is loaded"), "message: %s",
                    zccl_get_last_error(NULL));
        zccl_stream_t zs = (zccl_stream_t)1;
        ZT_CHECK(zccl_stream_create_cuda(NULL, &zs) == ZCCL_INVALID_USAGE && !zs, "public entry accepted");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "zccl_stream_create_cuda: a CUDA stream was given but no CUDA "
                           "driver is loaded: cannot load the CUDA driver library /nonexistent/libcuda.so.1"),
                    "message: %s", zccl_get_last_error(NULL));
        int dev = 5;
        ZT_CHECK(zccl_pointer_device(&dev, &dev) == ZCCL_SUCCESS && dev == -1, "host pointer");
        void *p = (void *)1;
        ZT_CHECK(zccl_mem_alloc_cuda(&p, 64) == ZCCL_INVALID_USAGE && !p, "device alloc without a driver");
        return 0;
    });
    EXPECT_EQ(rc, 0);
}

/* Whole collectives on "device" buffers through the engine's staging, at 2 and 3 ranks over shared memory and TCP. */
class MemFakeCollectives : public ::testing::TestWithParam<std::tuple<int, const char *>> {};

TEST_P(MemFakeCollectives, DeviceBuffersGiveTheRightResults) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    const int n = std::get<0>(GetParam());
    zt::Options o;
    o.env = {{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH}, {"ZCCL_TRANSPORT", std::get<1>(GetParam())}};
    o.deadline_s = 120;
    zt::run_ranks(n, [](zccl_comm_t comm, int rank, int nranks) -> int {
        Fake f;
        ZT_CHECK(open_fake(&f), "fake symbols");
        for (size_t count : {size_t(1), size_t(7), size_t(1000), size_t(300000)}) {
            const size_t total = count * (size_t)nranks;
            std::vector<float> send(total), recv(total);
            std::vector<int32_t> isend(count), irecv(total);
            f.mark(send.data(), total * 4, 0);
            f.mark(recv.data(), total * 4, 0);
            f.mark(isend.data(), count * 4, 0);
            f.mark(irecv.data(), total * 4, 0);
            for (size_t i = 0; i < total; i++) send[i] = (float)(rank + 1) + (float)(i % 13);
            FakeStats before, after;
            f.stats(&before);
            /* all-reduce, out of place, SUM */
            ZT_CHECK(zccl_allreduce(send.data(), recv.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL) ==
                            ZCCL_SUCCESS, "allreduce: %s", zccl_get_last_error(NULL));
            const float rsum = (float)(nranks * (nranks + 1) / 2);
            for (size_t i = 0; i < count; i++)
                ZT_CHECK(recv[i] == rsum + (float)nranks * (float)(i % 13), "allreduce count %zu [%zu] = %g", count,
                            i, recv[i]);
            f.stats(&after);
            if (nranks > 1) ZT_CHECK(after.launches > before.launches, "no kernel launched for the reduction");
            ZT_CHECK(after.ctx_syncs == before.ctx_syncs + 1, "the call did not wait for queued GPU work once");
            /* in place, AVG */
            std::vector<float> io(send.begin(), send.begin() + count);
            f.mark(io.data(), count * 4, 0);
            ZT_CHECK(zccl_allreduce(io.data(), io.data(), count, ZCCL_FLOAT32, ZCCL_AVG, comm, NULL) ==
                            ZCCL_SUCCESS, "allreduce avg: %s", zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++) {
                const float want = ((float)(nranks * (nranks + 1) / 2) + (float)nranks * (float)(i % 13)) / nranks;
                ZT_CHECK(std::fabs(io[i] - want) <= 1e-5f * std::fabs(want), "avg [%zu] = %g, want %g", i, io[i],
                            want);
            }
            /* all-gather int32 (copies only) */
            for (size_t i = 0; i < count; i++) isend[i] = rank * 1000003 + (int32_t)i;
            ZT_CHECK(zccl_allgather(isend.data(), irecv.data(), count, ZCCL_INT32, comm, NULL) == ZCCL_SUCCESS,
                        "allgather: %s", zccl_get_last_error(NULL));
            for (int r = 0; r < nranks; r++)
                for (size_t i = 0; i < count; i++)
                    ZT_CHECK(irecv[r * count + i] == r * 1000003 + (int32_t)i, "allgather [%d][%zu]", r, i);
            /* reduce-scatter int32 SUM: the integer kernel */
            std::vector<int32_t> rs_in(total), rs_out(count);
            f.mark(rs_in.data(), total * 4, 0);
            f.mark(rs_out.data(), count * 4, 0);
            for (size_t i = 0; i < total; i++) rs_in[i] = (int32_t)(i + 1) * (rank + 1);
            ZT_CHECK(zccl_reduce_scatter(rs_in.data(), rs_out.data(), count, ZCCL_INT32, ZCCL_SUM, comm, NULL) ==
                            ZCCL_SUCCESS, "reduce_scatter: %s", zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++)
                ZT_CHECK(rs_out[i] == (int32_t)(rank * count + i + 1) * (nranks * (nranks + 1) / 2),
                            "reduce_scatter [%zu] = %d", i, rs_out[i]);
            /* broadcast from the last rank, in place */
            std::vector<float> bc(count, (float)rank);
            f.mark(bc.data(), count * 4, 0);
            ZT_CHECK(zccl_broadcast(bc.data(), bc.data(), count, ZCCL_FLOAT32, nranks - 1, comm, NULL) ==
                            ZCCL_SUCCESS, "broadcast: %s", zccl_get_last_error(NULL));
            for (size_t i = 0; i < count; i++) ZT_CHECK(bc[i] == (float)(nranks - 1), "broadcast [%zu]", i);
            /* the same collective on host buffers touches no driver */
            std::vector<float> hs(count, 1.f), hr(count);
            f.stats(&before);
            ZT_CHECK(zccl_allreduce(hs.data(), hr.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL) ==
                            ZCCL_SUCCESS, "host allreduce");
            f.stats(&after);
            ZT_CHECK(after.copies == before.copies && after.launches == before.launches, "host call used CUDA");
            ZT_CHECK(hr[0] == (float)nranks, "host allreduce value");
            /* freed vectors are host memory again (their addresses may come back for host buffers) */
            for (const void *p : {(const void *)send.data(), (const void *)recv.data(), (const void *)isend.data(),
                                  (const void *)irecv.data(), (const void *)io.data(), (const void *)rs_in.data(),
                                  (const void *)rs_out.data(), (const void *)bc.data()})
                f.unmark(p);
        }
        /* device memory inside a group: refused, naming the buffer */
        std::vector<float> g(8);
        f.mark(g.data(), sizeof(float) * 8, 0);
        ZT_CHECK(zccl_group_start() == ZCCL_SUCCESS, "group start");
        const zccl_result_t r = zccl_allreduce(g.data(), g.data(), 8, ZCCL_FLOAT32, ZCCL_SUM, comm, NULL);
        zccl_group_end();
        ZT_CHECK(r == ZCCL_INVALID_USAGE, "device memory in a group accepted (%d)", (int)r);
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "'sendbuf' is CUDA device memory"), "message: %s",
                    zccl_get_last_error(NULL));
        return 0;
    }, o);
}

INSTANTIATE_TEST_SUITE_P(RanksTransports, MemFakeCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values("shm", "tcp")));

/* ---- zccl_stream_create_cuda: calls on device memory ordered with a caller's CUDA stream (the fake driver models
 * the caller's streams: holds, copies, event records and waits on the completion word; tests/fake_cuda) ---- */

namespace {
struct FakeOrder {
    void *(*user_stream)(void *ctx);
    int (*hold)(void *s);
    void (*release)(int id);
    void (*copy)(void *s, void *dst, const void *src, size_t n);
    void (*fail)(void *s);
    long (*pending)(void *s);
    void (*stats)(long out[4]);
    int (*sync)(void *s); /* the driver's cuStreamSynchronize */
};
bool open_fake_order(FakeOrder *f) {
    void *h = dlopen(ZCCL_FAKE_CUDA_PATH, RTLD_NOW);
    if (!h) return false;
    *(void **)&f->user_stream = dlsym(h, "fake_cuda_user_stream");
    *(void **)&f->hold = dlsym(h, "fake_cuda_stream_hold");
    *(void **)&f->release = dlsym(h, "fake_cuda_release");
    *(void **)&f->copy = dlsym(h, "fake_cuda_stream_copy");
    *(void **)&f->fail = dlsym(h, "fake_cuda_stream_fail");
    *(void **)&f->pending = dlsym(h, "fake_cuda_stream_pending");
    *(void **)&f->stats = dlsym(h, "fake_cuda_order_stats");
    *(void **)&f->sync = dlsym(h, "cuStreamSynchronize");
    return f->user_stream && f->hold && f->release && f->copy && f->fail && f->pending && f->stats && f->sync;
}
} // namespace

TEST(MemLayer, CudaStreamCreateErrors) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    const int rc = zt::run_in_child(kFakeEnv, [] {
        FakeOrder fo;
        ZT_CHECK(open_fake_order(&fo), "fake symbols");
        zccl_stream_t zs = nullptr;
        ZT_CHECK(zccl_stream_create_cuda(fo.user_stream(nullptr), NULL) == ZCCL_INVALID_ARGUMENT, "NULL out");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "argument 'stream' is NULL"), "message: %s",
                    zccl_get_last_error(NULL));
        ZT_CHECK(zccl_stream_create_cuda((void *)0x5150, &zs) == ZCCL_INVALID_ARGUMENT && !zs, "bad handle");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "'cuda_stream' (0x5150) is not a CUDA stream") &&
                        strstr(zccl_get_last_error(NULL), "CUDA_ERROR_INVALID_HANDLE"),
                    "message: %s", zccl_get_last_error(NULL));
        ZT_CHECK(zccl_stream_create_cuda(fo.user_stream((void *)0x77), &zs) == ZCCL_INVALID_ARGUMENT && !zs,
                    "a stream of a non-primary context accepted");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "which is not the primary context of device 0"), "message: %s",
                    zccl_get_last_error(NULL));
        ZT_CHECK(zccl_stream_create_cuda(fo.user_stream(nullptr), &zs) == ZCCL_SUCCESS && zs, "create: %s",
                    zccl_get_last_error(NULL));
        zccl_stream_t zs1 = nullptr;
        ZT_CHECK(zccl_stream_create_cuda(fo.user_stream((void *)0x101), &zs1) == ZCCL_INVALID_ARGUMENT && !zs1,
                    "a stream of device 1 accepted while zccl works on device 0");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "stream is on CUDA device 1, but zccl's CUDA memory layer "
                           "already works on device 0"), "message: %s", zccl_get_last_error(NULL));
        ZT_CHECK(zccl_stream_destroy(zs) == ZCCL_SUCCESS, "destroy");
        /* device memory through the public entries */
        void *d = nullptr;
        ZT_CHECK(zccl_mem_alloc_cuda(&d, 4096) == ZCCL_SUCCESS && d, "alloc: %s", zccl_get_last_error(NULL));
        int dev = -1;
        ZT_CHECK(zccl_pointer_device(d, &dev) == ZCCL_SUCCESS && dev == 0, "device of the allocation: %d", dev);
        std::vector<uint8_t> a(4096), b(4096);
        for (size_t i = 0; i < a.size(); i++) a[i] = (uint8_t)(i * 7 + 1);
        ZT_CHECK(zccl_mem_copy(d, a.data(), 4096) == ZCCL_SUCCESS && zccl_mem_copy(b.data(), d, 4096) ==
                        ZCCL_SUCCESS && a == b, "copies through device memory");
        ZT_CHECK(zccl_mem_free_cuda(a.data()) == ZCCL_INVALID_ARGUMENT, "host memory freed as device memory");
        ZT_CHECK(zccl_mem_free_cuda(d) == ZCCL_SUCCESS, "free");
        ZT_CHECK(zccl_pointer_device(d, &dev) == ZCCL_SUCCESS && dev == -1, "freed memory still device memory");
        return 0;
    });
    EXPECT_EQ(rc, 0);
}

class MemFakeCudaStream : public ::testing::TestWithParam<std::tuple<int, const char *>> {};

/* A collective on device buffers issued on a stream bound to the caller's CUDA stream S: returns while the kernel
 * that writes its input is still held on S; runs once S reaches the call; S's later kernel (a copy of the output)
 * waits for it; two calls queued before the first began; a host-buffer call on the same stream; a kernel that fails
 * before a call fails that call (and not the next); buffers of another device are refused at issue. */
TEST_P(MemFakeCudaStream, OrderedWithTheCallersStream) {
    if (!zccl__mem_cuda_built()) GTEST_SKIP() << "built without the CUDA kernels (no nvcc)";
    const int n = std::get<0>(GetParam());
    zt::Options o;
    o.env = {{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH}, {"ZCCL_TRANSPORT", std::get<1>(GetParam())}};
    o.deadline_s = 120;
    zt::run_ranks(n, [](zccl_comm_t comm, int rank, int nranks) -> int {
        Fake f;
        FakeOrder fo;
        ZT_CHECK(open_fake(&f) && open_fake_order(&fo), "fake symbols");
        void *S = fo.user_stream(nullptr);
        zccl_stream_t zs = nullptr;
        ZT_CHECK(zccl_stream_create_cuda(S, &zs) == ZCCL_SUCCESS, "create: %s", zccl_get_last_error(NULL));
        const size_t count = 5000, bytes = count * sizeof(float);
        std::vector<float> send(count, -1e9f), recv(count, -7.f), input(count), out(count, -3.f);
        f.mark(send.data(), bytes, 0);
        f.mark(recv.data(), bytes, 0);
        for (size_t i = 0; i < count; i++) input[i] = (float)(rank + 1) + (float)(i % 13);
        auto want = [&](size_t i) { return (float)(nranks * (nranks + 1) / 2) + (float)nranks * (float)(i % 13); };
        long st0[4], st1[4];
        fo.stats(st0);
        /* S: [held kernel][kernel writing the input] <call> [kernel reading the output] */
        const int held = fo.hold(S);
        fo.copy(S, send.data(), input.data(), bytes);
        const double t0 = zt::now_s();
        ZT_CHECK(zccl_allreduce(send.data(), recv.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, zs) == ZCCL_SUCCESS,
                    "allreduce: %s", zccl_get_last_error(NULL));
        ZT_CHECK(zt::now_s() - t0 < 2.0, "the call did not return at once");
        fo.copy(S, out.data(), recv.data(), bytes);
        usleep(100000);
        fo.stats(st1);
        ZT_CHECK(zccl_stream_query(zs) == ZCCL_IN_PROGRESS, "the call completed while its input was not written");
        ZT_CHECK(recv[0] == -7.f && out[0] == -3.f, "the output was written or read before the call ran");
        ZT_CHECK(st1[1] == st0[1] + 1 && st1[2] == st0[2] + 1, "issue queued %ld records and %ld waits on S",
                    st1[1] - st0[1], st1[2] - st0[2]);
        ZT_CHECK(st1[3] > st0[3], "zccl's thread did not wait for the call's event");
        ZT_CHECK(fo.pending(S) == 5, "S holds %ld items, expected hold, copy, record, wait, copy", fo.pending(S));
        fo.release(held);
        ZT_CHECK(fo.sync(S) == 0, "S never got past the call (the completion word was not written)");
        for (size_t i = 0; i < count; i++)
            ZT_CHECK(out[i] == want(i), "S's kernel after the call read [%zu] = %g, want %g", i, out[i], want(i));
        ZT_CHECK(zccl_stream_synchronize(zs) == ZCCL_SUCCESS, "synchronize: %s", zccl_get_last_error(NULL));

        /* two calls queued before the first can begin, in place; each has its own event */
        std::vector<float> io1(count), io2(count), out1(count), out2(count);
        f.mark(io1.data(), bytes, 0);
        f.mark(io2.data(), bytes, 0);
        const int held2 = fo.hold(S);
        fo.copy(S, io1.data(), input.data(), bytes);
        ZT_CHECK(zccl_allreduce(io1.data(), io1.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, zs) == ZCCL_SUCCESS,
                    "allreduce 1: %s", zccl_get_last_error(NULL));
        fo.copy(S, io2.data(), io1.data(), bytes); /* the second call's input is the first call's output */
        ZT_CHECK(zccl_allreduce(io2.data(), io2.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, zs) == ZCCL_SUCCESS,
                    "allreduce 2: %s", zccl_get_last_error(NULL));
        fo.copy(S, out2.data(), io2.data(), bytes);
        /* a larger third call: zccl's device scratch and bounce buffers grow while S waits (no cuMemFree then) */
        std::vector<float> big(8 * count, 1.f);
        f.mark(big.data(), 8 * bytes, 0);
        ZT_CHECK(zccl_allreduce(big.data(), big.data(), 8 * count, ZCCL_FLOAT32, ZCCL_SUM, comm, zs) ==
                        ZCCL_SUCCESS, "allreduce 3: %s", zccl_get_last_error(NULL));
        usleep(20000);
        fo.release(held2);
        ZT_CHECK(fo.sync(S) == 0, "S blocked after three queued calls");
        for (size_t i = 0; i < 8 * count; i++) ZT_CHECK(big[i] == (float)nranks, "big [%zu] = %g", i, big[i]);
        f.unmark(big.data());
        for (size_t i = 0; i < count; i++)
            ZT_CHECK(out2[i] == (float)nranks * want(i), "chained calls [%zu] = %g, want %g", i, out2[i],
                        (float)nranks * want(i));
        ZT_CHECK(zccl_stream_synchronize(zs) == ZCCL_SUCCESS, "synchronize: %s", zccl_get_last_error(NULL));

        /* host buffers on the same stream: queued as on any zccl stream, nothing queued on S */
        std::vector<int32_t> hs(100, rank + 1), hr(100, 0);
        fo.stats(st0);
        ZT_CHECK(zccl_allreduce(hs.data(), hr.data(), 100, ZCCL_INT32, ZCCL_SUM, comm, zs) == ZCCL_SUCCESS,
                    "host allreduce: %s", zccl_get_last_error(NULL));
        ZT_CHECK(zccl_stream_synchronize(zs) == ZCCL_SUCCESS, "host synchronize: %s", zccl_get_last_error(NULL));
        fo.stats(st1);
        ZT_CHECK(hr[0] == nranks * (nranks + 1) / 2 && hr[99] == hr[0], "host allreduce = %d", hr[0]);
        ZT_CHECK(st1[1] == st0[1] && st1[2] == st0[2], "a host call queued work on the CUDA stream");

        /* buffers of another device: refused when issued, S untouched */
        std::vector<float> other(16);
        f.mark(other.data(), sizeof(float) * 16, 1);
        ZT_CHECK(zccl_allreduce(other.data(), other.data(), 16, ZCCL_FLOAT32, ZCCL_SUM, comm, zs) ==
                        ZCCL_INVALID_ARGUMENT, "buffers of device 1 accepted on a stream of device 0");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "buffers are on CUDA device 1 but the CUDA stream is on device 0"),
                    "message: %s", zccl_get_last_error(NULL));
        ZT_CHECK(zccl_stream_synchronize(zs) == ZCCL_SUCCESS, "after a call every rank refused: %s",
                    zccl_get_last_error(NULL));
        /* refused on rank 0 only: the peers fail the call too, naming rank 0's reason, instead of waiting for it */
        if (nranks > 1) {
            std::vector<float> v(16, 1.f);
            f.mark(v.data(), sizeof(float) * 16, rank == 0 ? 1 : 0);
            const zccl_result_t r = zccl_allreduce(v.data(), v.data(), 16, ZCCL_FLOAT32, ZCCL_SUM, comm, zs);
            if (rank == 0) {
                ZT_CHECK(r == ZCCL_INVALID_ARGUMENT, "rank 0's buffers of device 1 accepted");
                ZT_CHECK(zccl_stream_synchronize(zs) == ZCCL_SUCCESS, "rank 0: %s", zccl_get_last_error(NULL));
            } else {
                ZT_CHECK(r == ZCCL_SUCCESS, "issue: %s", zccl_get_last_error(NULL));
                ZT_CHECK(fo.sync(S) == 0, "S blocked behind a call its peer refused");
                ZT_CHECK(zccl_stream_synchronize(zs) != ZCCL_SUCCESS, "a call rank 0 refused succeeded here");
                ZT_CHECK(strstr(zccl_get_last_error(NULL), "buffers are on CUDA device 1"),
                            "the peer's reason is not named: %s", zccl_get_last_error(NULL));
            }
            f.unmark(v.data());
        }

        /* a kernel of the caller that fails before the call: the call fails naming it, S goes on */
        std::vector<float> e(count, 1.f);
        f.mark(e.data(), bytes, 0);
        fo.fail(S);
        ZT_CHECK(zccl_allreduce(e.data(), e.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, zs) == ZCCL_SUCCESS,
                    "issue after a failed kernel: %s", zccl_get_last_error(NULL));
        ZT_CHECK(fo.sync(S) == 0, "S blocked after a failed call (the completion word was not written)");
        ZT_CHECK(zccl_stream_synchronize(zs) == ZCCL_UNHANDLED_CUDA_ERROR, "the failed kernel was not reported");
        ZT_CHECK(strstr(zccl_get_last_error(NULL), "the work queued on that stream before it failed") &&
                        strstr(zccl_get_last_error(NULL), "CUDA_ERROR_LAUNCH_FAILED"),
                    "message: %s", zccl_get_last_error(NULL));
        ZT_CHECK(e[0] == 1.f, "the failed call moved data");
        fo.stats(st1);
        ZT_CHECK(st1[0] == 0, "%ld device-wide waits while S waited for zccl (a deadlock on a GPU)", st1[0]);
        ZT_CHECK(zccl_stream_destroy(zs) == ZCCL_SUCCESS, "destroy");
        for (const void *p : {(const void *)send.data(), (const void *)recv.data(), (const void *)io1.data(),
                              (const void *)io2.data(), (const void *)e.data()})
            f.unmark(p);
        return 0;
    }, o);
}

INSTANTIATE_TEST_SUITE_P(RanksTransports, MemFakeCudaStream,
                         ::testing::Values(std::make_tuple(1, "shm"), std::make_tuple(2, "shm"),
                                           std::make_tuple(2, "tcp"), std::make_tuple(3, "shm")));

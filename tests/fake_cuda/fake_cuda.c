/*
 * fake_cuda.c — a stand-in for libcuda.so for the memory layer's tests on machines without a GPU (tests/test_mem.cpp,
 * loaded through ZCCL_CUDA_LIBRARY). It exports the driver entry points zccl resolves; "device memory" is host memory
 * that the test marked (fake_cuda_mark) or that cuMemAlloc returned, so copies are memmove and the CPU can check
 * every result. Kernel launches are recorded; the float32 and int32 reductions (SUM, AVG as SUM with a divisor) run
 * for real, any other kernel launch fails (CUDA_ERROR_NOT_SUPPORTED) so a test sees which kernel zccl chose.
 * fake_cuda_fail_next(n) makes the n-th following driver call fail, to exercise zccl's error paths.
 * CUDA IPC across processes is emulated in the block at the end of the file (cuMemAlloc memory is a memfd mapping).
 * Streams made with cuStreamCreate run their copies, kernels and event records later, in order, on a thread of their
 * own ("copy engine" block at the end), with host<->device copies throttled to FAKE_CUDA_COPY_MBPS per direction
 * (a PCIe link); FAKE_CUDA_SYNC=1 runs everything at once as before. Device attributes (compute capability, dma-buf
 * and GPUDirect RDMA support) and cuMemGetHandleForAddressRange (a dma-buf fd: the allocation's memfd) are set by
 * FAKE_CUDA_CC, FAKE_CUDA_DMABUF, FAKE_CUDA_GDR, FAKE_CUDA_DMABUF_EXPORT (block "GDR attributes").
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAKE_API __attribute__((visibility("default")))
typedef int CUresult;

/* The caller's CUDA streams and events, modelled (the stream-order block at the end of this file). */
static int fk_is_stream(void *s);
static void fk_enqueue_record(void *s, void *e);
static void fk_enqueue_wait(void *s, unsigned long long addr, uint32_t v);
static int fk_event_not_ready(void *e);
static CUresult fk_stream_sync(void *s);
static void fk_check_device_wide_wait(void);
static void fk_event_destroy(void *e);

/* The copy engine (cuStreamCreate streams run later, on a thread; the block at the end of this file). */
static int ce_is_stream(void *s);
static void ce_enqueue_copy(void *s, void *dst, const void *src, size_t n, int dir);
static void ce_enqueue_kernel(void *s, int dt, void *dst, const void *a, const void *b, size_t n, uint32_t div);
static void ce_enqueue_record(void *s, void *e);
static int ce_event_pending(void *e);
static CUresult ce_stream_sync(void *s);
static void ce_sync_all(void);
static int ce_event_destroy_later(void *e);
static CUresult ce_stream_create(void **s);
static int ce_dir(const void *dst, const void *src);
static CUresult fk_run_reduce(int dt, void *dst, const void *a, const void *b, size_t n, uint32_t div);
static int gdr_attribute(int attr, int *v);

typedef struct { uintptr_t lo, hi; int dev; unsigned long long id; } range_t;
#define FAKE_MAX_RANGES 65536 /* marked "device" ranges alive at once; running out aborts (never silently host) */
static range_t ranges[FAKE_MAX_RANGES];
static int nranges;
static unsigned long long next_buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID: one per allocation, never reused */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* What the test reads back. */
typedef struct {
    long copies, launches, allocs, inits, ctx_syncs;
    long event_records, waits;       /* stream order: cuEventRecord, cuStreamWaitValue32_v2 calls */
    void *last_wait_stream;
    unsigned long long last_wait_addr;
    uint32_t last_wait_value;
    int event_pending;               /* >0: cuEventQuery answers NOT_READY this many more times */
    char last_kernel[64];
    size_t last_count;
    uint32_t last_divisor;
} fake_cuda_stats_t;
static fake_cuda_stats_t stats;
static int fail_in = 0; /* >0: the fail_in-th next call fails */

static CUresult maybe_fail(void) {
    if (fail_in > 0 && --fail_in == 0) return 999; /* CUDA_ERROR_UNKNOWN */
    return 0;
}

FAKE_API void fake_cuda_mark(const void *p, size_t len, int dev) {
    pthread_mutex_lock(&mu);
    if (nranges >= FAKE_MAX_RANGES) { /* a test that marks without unmarking; one process runs many tests */
        fprintf(stderr, "fake_cuda: more than %d device ranges marked at once\n", FAKE_MAX_RANGES);
        abort();
    }
    ranges[nranges++] = (range_t){(uintptr_t)p, (uintptr_t)p + len, dev, ++next_buffer_id};
    pthread_mutex_unlock(&mu);
}
FAKE_API void fake_cuda_unmark(const void *p) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nranges; i++)
        if (ranges[i].lo == (uintptr_t)p) { ranges[i] = ranges[--nranges]; break; }
    pthread_mutex_unlock(&mu);
}
FAKE_API void fake_cuda_stats(fake_cuda_stats_t *out) { pthread_mutex_lock(&mu); *out = stats; pthread_mutex_unlock(&mu); }
FAKE_API void fake_cuda_fail_next(int n) { fail_in = n; }
FAKE_API void fake_cuda_event_pending(int n) { stats.event_pending = n; }

static const range_t *find(uintptr_t p) {
    for (int i = 0; i < nranges; i++)
        if (p >= ranges[i].lo && p < ranges[i].hi) return &ranges[i];
    return NULL;
}

/* The CUDA IPC emulation's hooks (defined in the block at the end of the file). */
static void *fake_ipc_alloc(size_t n);
static int fake_ipc_free(uintptr_t p);
static void fake_ipc_note(const uintptr_t *p, int n, int copy);

FAKE_API CUresult cuInit(unsigned flags) { (void)flags; stats.inits++; return 0; }
FAKE_API CUresult cuGetErrorString(CUresult r, const char **s) {
    *s = r == 999 ? "CUDA_ERROR_UNKNOWN (fake)" : r == 801 ? "CUDA_ERROR_NOT_SUPPORTED (fake)"
       : r == 719 ? "CUDA_ERROR_LAUNCH_FAILED (fake)" : r == 400 ? "CUDA_ERROR_INVALID_HANDLE (fake)" : "fake error";
    return 0;
}
FAKE_API CUresult cuPointerGetAttribute(void *data, int attr, unsigned long long ptr) {
    pthread_mutex_lock(&mu);
    const range_t *r = find((uintptr_t)ptr);
    pthread_mutex_unlock(&mu);
    if (!r) return 1; /* CUDA_ERROR_INVALID_VALUE: memory the driver never saw */
    if (attr == 2) *(unsigned *)data = 2; /* MEMORY_TYPE: DEVICE */
    else if (attr == 9) *(int *)data = r->dev;
    else if (attr == 7) *(unsigned long long *)data = r->id; /* BUFFER_ID: this allocation's, never reused */
    else return 1;
    return 0;
}
/* The buffer id of the allocation holding p (0: none), as cuPointerGetAttribute(BUFFER_ID) would answer. */
FAKE_API unsigned long long fake_cuda_buffer_id(const void *p) {
    pthread_mutex_lock(&mu);
    const range_t *r = find((uintptr_t)p);
    const unsigned long long id = r ? r->id : 0;
    pthread_mutex_unlock(&mu);
    return id;
}
FAKE_API CUresult cuDeviceGet(int *d, int ord) { *d = ord; return 0; }
FAKE_API CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    const int g = gdr_attribute(attr, v);
    if (g < 0) return 801; /* CUDA_ERROR_NOT_SUPPORTED */
    if (g) return 0;
    *v = 4;
    return 0;
}
static void *fake_ctx = (void *)0x1;
static __thread void *cur_ctx;
FAKE_API CUresult cuDevicePrimaryCtxRetain(void **c, int dev) { /* device d > 0: context 0x100 + d */
    *c = dev == 0 ? fake_ctx : (void *)(uintptr_t)(0x100 + dev);
    return 0;
}
FAKE_API CUresult cuCtxGetCurrent(void **c) { *c = cur_ctx; return 0; }
FAKE_API CUresult cuCtxSetCurrent(void *c) { cur_ctx = c; return 0; }
FAKE_API CUresult cuMemAlloc_v2(unsigned long long *p, size_t n) {
    CUresult f = maybe_fail();
    if (f) return f;
    void *m = fake_ipc_alloc(n); /* a shared memfd mapping, so other processes can open it (IPC block) */
    if (!m) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    fake_cuda_mark(m, n, 0);
    stats.allocs++;
    *p = (uintptr_t)m;
    return 0;
}
FAKE_API CUresult cuMemFree_v2(unsigned long long p) {
    fk_check_device_wide_wait(); /* a real cuMemFree may wait for the whole device */
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nranges; i++)
        if (ranges[i].lo == p) { ranges[i] = ranges[--nranges]; break; }
    pthread_mutex_unlock(&mu);
    if (!fake_ipc_free(p)) free((void *)(uintptr_t)p);
    return 0;
}
FAKE_API CUresult cuMemcpyAsync(unsigned long long dst, unsigned long long src, size_t n, void *stream) {
    CUresult f = maybe_fail();
    if (f) return f;
    if (ce_is_stream(stream)) ce_enqueue_copy(stream, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n,
                                              ce_dir((void *)(uintptr_t)dst, (const void *)(uintptr_t)src));
    else memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    stats.copies++;
    fake_ipc_note((const uintptr_t[]){(uintptr_t)dst, (uintptr_t)src}, 2, 1);
    return 0;
}
FAKE_API CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; return ce_stream_create(s); }
FAKE_API CUresult cuStreamSynchronize(void *s) {
    if (ce_is_stream(s)) return ce_stream_sync(s);
    return fk_is_stream(s) ? fk_stream_sync(s) : 0;
}
FAKE_API CUresult cuCtxSynchronize(void) {
    stats.ctx_syncs++;
    fk_check_device_wide_wait();
    ce_sync_all();
    return maybe_fail();
}
FAKE_API CUresult cuEventCreate(void **e, unsigned flags) {
    (void)flags;
    *e = calloc(1, 64); /* an event of its own: its pending records are counted in it (8 longs, see fk/ce blocks) */
    return maybe_fail();
}
FAKE_API CUresult cuEventRecord(void *e, void *s) {
    stats.event_records++;
    CUresult f = maybe_fail();
    if (f) return f;
    if (fk_is_stream(s)) fk_enqueue_record(s, e);
    else if (ce_is_stream(s)) ce_enqueue_record(s, e);
    return 0;
}
FAKE_API CUresult cuEventQuery(void *e) {
    CUresult f = maybe_fail();
    if (f) return f;
    if (stats.event_pending > 0) { stats.event_pending--; return 600; /* CUDA_ERROR_NOT_READY */ }
    if (ce_event_pending(e)) return 600;
    return fk_event_not_ready(e);
}
FAKE_API CUresult cuEventSynchronize(void *e) {
    for (int i = 0; i < 400000 && (ce_event_pending(e) || fk_event_not_ready(e) == 600); i++) usleep(50);
    return ce_event_pending(e) ? 999 : fk_event_not_ready(e);
}
FAKE_API CUresult cuEventDestroy_v2(void *e) {
    if (!ce_event_destroy_later(e)) fk_event_destroy(e);
    return 0;
}
FAKE_API CUresult cuStreamWaitValue32_v2(void *s, unsigned long long addr, uint32_t v, unsigned flags) {
    (void)flags;
    stats.waits++;
    stats.last_wait_stream = s;
    stats.last_wait_addr = addr;
    stats.last_wait_value = v;
    CUresult f = maybe_fail();
    if (f) return f;
    if (fk_is_stream(s)) fk_enqueue_wait(s, addr, v);
    return 0;
}
FAKE_API CUresult cuMemAllocHost_v2(void **p, size_t n) { *p = aligned_alloc(64, (n + 63) & ~(size_t)63); return *p ? 0 : 2; }
FAKE_API CUresult cuMemFreeHost(void *p) { free(p); return 0; }
FAKE_API CUresult cuMemHostGetDevicePointer_v2(unsigned long long *d, void *h, unsigned flags) {
    (void)flags;
    *d = (uintptr_t)h; /* unified addressing: the same address */
    return 0;
}
FAKE_API CUresult cuModuleLoadData(void **m, const void *image) {
    /* a real fatbin starts with the fatbin magic 0xba55ed50 */
    uint32_t magic;
    memcpy(&magic, image, 4);
    if (magic != 0xba55ed50u) return 200; /* CUDA_ERROR_INVALID_IMAGE */
    *m = (void *)0x3;
    return 0;
}
FAKE_API CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    (void)m;
    *f = strdup(name);
    return 0;
}
FAKE_API CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)extra;
    const char *name = f;
    CUresult fl = maybe_fail();
    if (fl) return fl;
    stats.launches++;
    snprintf(stats.last_kernel, sizeof stats.last_kernel, "%s", name);
    int dt = -1, op = -1;
    if (sscanf(name, "zccl_reduce_%d_%d", &dt, &op) != 2) return 801;
    void *dst = *(void **)params[0];
    const void *a = *(const void **)params[1], *b = *(const void **)params[2];
    const size_t n = *(const size_t *)params[3];
    const uint32_t div = *(const uint32_t *)params[4];
    stats.last_count = n;
    stats.last_divisor = div;
    fake_ipc_note((const uintptr_t[]){(uintptr_t)dst, (uintptr_t)a, (uintptr_t)b}, 3, 0);
    if (op < 0 || op > 3 || (dt != 7 && dt != 2 && dt != 8)) return 801;
    const int dtop = dt | op << 8; /* the kernel's datatype and op, as the queue carries them */
    if (ce_is_stream(stream)) { /* runs later, in the stream's order */
        ce_enqueue_kernel(stream, dtop, dst, a, b, n, div);
        return 0;
    }
    return fk_run_reduce(dtop, dst, a, b, n, div);
}

/* float32, int32 and float64 (ZCCL_DATATYPE 7, 2, 8) with SUM, PROD, MAX, MIN (0..3; AVG arrives as SUM with a
 * divisor); dtop = datatype | op << 8. One loop per op, the divisor applied in a second pass, so that the compiler
 * vectorizes them: a GPU's kernel costs the ranks no CPU, this one runs on theirs (bench/stage_bench). */
#define FK_LOOP(T, EXPR)                                                                                            \
    for (size_t i = 0; i < n; i++) {                                                                               \
        const T x = ((const T *)a)[i], y = ((const T *)b)[i];                                                      \
        ((T *)dst)[i] = (T)(EXPR);                                                                                  \
    }
#define FK_REDUCE(T, CALC)                                                                                          \
    switch (op) {                                                                                                   \
    case 0: FK_LOOP(T, CALC(x, y)) break;                                                                           \
    case 1: FK_LOOP(T, x * y) break;                                                                                \
    case 2: FK_LOOP(T, x > y ? x : y) break;                                                                        \
    default: FK_LOOP(T, x < y ? x : y) break;                                                                       \
    }                                                                                                               \
    if (div > 1)                                                                                                    \
        for (size_t i = 0; i < n; i++) ((T *)dst)[i] = (T)(((T *)dst)[i] / (T)div);
#define FK_ADD(x, y) ((x) + (y))
#define FK_ADD_I32(x, y) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))
static CUresult fk_run_reduce(int dtop, void *dst, const void *a, const void *b, size_t n, uint32_t div) {
    const int dt = dtop & 0xff, op = dtop >> 8;
    if (dt == 7) { FK_REDUCE(float, FK_ADD) return 0; }
    if (dt == 2) { FK_REDUCE(int32_t, FK_ADD_I32) return 0; }
    if (dt == 8) { FK_REDUCE(double, FK_ADD) return 0; }
    return 801;
}

/* ==== CUDA IPC emulation (issue 15: lib/core/regmem.c's direct path on device memory) =========================
 * cuMemAlloc memory is a memfd mapped MAP_SHARED; cuIpcGetMemHandle writes (pid, fd, size) into the 64-byte handle
 * and cuIpcOpenMemHandle in another process opens /proc/<pid>/fd/<fd> and maps it, marked as device memory, so the
 * two processes see the same bytes as CUDA IPC would give them. Like CUDA: the handle is of an allocation's base,
 * memory not from cuMemAlloc (fake_cuda_mark'ed host memory) cannot be exported, a process cannot open its own
 * handle, and cuIpcCloseMemHandle takes what cuIpcOpenMemHandle returned. fake_cuda_ipc_stats counts the calls,
 * the mappings open now, the copies and kernel operands that touched an opened peer mapping, and the copies with a
 * host-memory side (the staged path's). */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct { uintptr_t base; size_t size, map; int fd; int opened; } ipc_alloc_t;
static ipc_alloc_t ipc_allocs[512];
static int nipc;
typedef struct {
    long gets, opens, closes, mapped_now;
    long peer_ops;      /* copies and kernel launches with an operand in an opened peer mapping */
    long host_copies;   /* copies with one side in host memory (staging) */
} fake_cuda_ipc_stats_t;
static fake_cuda_ipc_stats_t ipc_stats;
static int ipc_fail_opens; /* >0: that many next cuIpcOpenMemHandle calls fail (a GPU pair without peer access) */
FAKE_API void fake_cuda_ipc_fail_opens(int n) { ipc_fail_opens = n; }
typedef struct { char magic[8]; int32_t pid; int32_t fd; uint64_t size; char pad[40]; } fake_handle_t;
typedef struct { char reserved[64]; } CUipcMemHandle;
_Static_assert(sizeof(fake_handle_t) == 64, "the handle is 64 bytes");

FAKE_API void fake_cuda_ipc_stats(fake_cuda_ipc_stats_t *out) {
    pthread_mutex_lock(&mu);
    *out = ipc_stats;
    pthread_mutex_unlock(&mu);
}

/* FAKE_CUDA_REUSE_FREED=1: cuMemFree leaves the allocation's addresses reserved (PROT_NONE: a CPU access of freed
 * "device" memory faults, as on a GPU) and the next cuMemAlloc of the same number of pages gets them back, mapped to
 * new pages; so a test can free a buffer and get the same address with other memory behind it (a registration
 * made before the free still holds the old pages, as a real NIC's would). Unset: freed memory is unmapped. */
typedef struct { uintptr_t base; size_t map; } freed_t;
static freed_t freed[64];
static int nfreed;
static int reuse_freed(void) {
    const char *e = getenv("FAKE_CUDA_REUSE_FREED");
    return e && *e == '1';
}

static void *fake_ipc_alloc(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), map = (n + page - 1) / page * page;
    int fd = memfd_create("fake-cuda-dev", 0);
    if (fd < 0) return NULL;
    void *p = MAP_FAILED, *at = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nfreed && reuse_freed(); i++)
        if (freed[i].map == (map ? map : page)) {
            at = (void *)freed[i].base;
            freed[i] = freed[--nfreed];
            break;
        }
    pthread_mutex_unlock(&mu);
    if (ftruncate(fd, (off_t)(map ? map : page)) == 0)
        p = mmap(at, map ? map : page, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);
    pthread_mutex_lock(&mu);
    const int room = nipc < 512;
    if (p != MAP_FAILED && room) ipc_allocs[nipc++] = (ipc_alloc_t){(uintptr_t)p, n, map ? map : page, fd, 0};
    pthread_mutex_unlock(&mu);
    if (p == MAP_FAILED || !room) {
        if (p != MAP_FAILED) munmap(p, map ? map : page);
        close(fd);
        return NULL;
    }
    return p;
}

static int fake_ipc_free(uintptr_t p) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nipc; i++)
        if (ipc_allocs[i].base == p && !ipc_allocs[i].opened) {
            ipc_alloc_t a = ipc_allocs[i];
            ipc_allocs[i] = ipc_allocs[--nipc];
            const int keep = reuse_freed() && nfreed < 64; /* reserved for the next allocation of this size */
            if (keep) freed[nfreed++] = (freed_t){a.base, a.map};
            pthread_mutex_unlock(&mu);
            if (!keep || mmap((void *)a.base, a.map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                              -1, 0) == MAP_FAILED)
                munmap((void *)a.base, a.map);
            close(a.fd);
            return 1;
        }
    pthread_mutex_unlock(&mu);
    return 0;
}

static void fake_ipc_note(const uintptr_t *p, int n, int copy) {
    pthread_mutex_lock(&mu);
    int peer = 0, host = 0;
    for (int k = 0; k < n; k++) {
        if (!find(p[k])) host = 1;
        for (int i = 0; i < nipc; i++)
            if (ipc_allocs[i].opened && p[k] >= ipc_allocs[i].base && p[k] < ipc_allocs[i].base + ipc_allocs[i].map)
                peer = 1;
    }
    ipc_stats.peer_ops += peer;
    if (copy) ipc_stats.host_copies += host;
    pthread_mutex_unlock(&mu);
}

FAKE_API CUresult cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long p) {
    pthread_mutex_lock(&mu);
    const range_t *r = find((uintptr_t)p);
    if (r) {
        if (base) *base = r->lo;
        if (size) *size = r->hi - r->lo;
    }
    pthread_mutex_unlock(&mu);
    return r ? 0 : 1; /* CUDA_ERROR_INVALID_VALUE */
}

FAKE_API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, unsigned long long p) {
    CUresult f = maybe_fail();
    if (f) return f;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nipc; i++)
        if (ipc_allocs[i].base == p && !ipc_allocs[i].opened) {
            fake_handle_t fh;
            memset(&fh, 0, sizeof fh);
            memcpy(fh.magic, "FAKEIPC", 8);
            fh.pid = (int32_t)getpid();
            fh.fd = ipc_allocs[i].fd;
            fh.size = ipc_allocs[i].size;
            memcpy(h, &fh, sizeof fh);
            ipc_stats.gets++;
            pthread_mutex_unlock(&mu);
            return 0;
        }
    pthread_mutex_unlock(&mu);
    return 1; /* CUDA_ERROR_INVALID_VALUE: not the base of a cuMemAlloc allocation */
}

FAKE_API CUresult cuIpcOpenMemHandle_v2(unsigned long long *out, CUipcMemHandle h, unsigned flags) {
    (void)flags;
    CUresult f = maybe_fail();
    if (f) return f;
    fake_handle_t fh;
    memcpy(&fh, &h, sizeof fh);
    if (memcmp(fh.magic, "FAKEIPC", 8) != 0) return 400; /* CUDA_ERROR_INVALID_HANDLE */
    if (ipc_fail_opens > 0) { ipc_fail_opens--; return 217; /* CUDA_ERROR_PEER_ACCESS_UNSUPPORTED */ }
    if (fh.pid == (int32_t)getpid()) return 201;      /* CUDA_ERROR_INVALID_CONTEXT: a process's own handle */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)fh.pid, (int)fh.fd);
    int fd = open(path, O_RDWR);
    if (fd < 0) return 400;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), map = fh.size ? (fh.size + page - 1) / page * page : page;
    void *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { close(fd); return 2; }
    pthread_mutex_lock(&mu);
    if (nipc >= 512) { pthread_mutex_unlock(&mu); munmap(p, map); close(fd); return 2; }
    ipc_allocs[nipc++] = (ipc_alloc_t){(uintptr_t)p, fh.size, map, fd, 1};
    ipc_stats.opens++;
    ipc_stats.mapped_now++;
    pthread_mutex_unlock(&mu);
    fake_cuda_mark(p, fh.size, 0);
    *out = (uintptr_t)p;
    return 0;
}

FAKE_API CUresult cuIpcCloseMemHandle(unsigned long long p) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nipc; i++)
        if (ipc_allocs[i].base == p && ipc_allocs[i].opened) {
            ipc_alloc_t a = ipc_allocs[i];
            ipc_allocs[i] = ipc_allocs[--nipc];
            ipc_stats.closes++;
            ipc_stats.mapped_now--;
            pthread_mutex_unlock(&mu);
            fake_cuda_unmark((void *)a.base);
            munmap((void *)a.base, a.map);
            close(a.fd);
            return 0;
        }
    pthread_mutex_unlock(&mu);
    return 1; /* CUDA_ERROR_INVALID_VALUE: not an opened IPC mapping */
}
/* ==== end of the CUDA IPC emulation ==== */

/* ==== Stream-order block (issue 15, zccl_stream_create_cuda): the caller's CUDA streams and events, modelled ====
 *
 * fake_cuda_user_stream(ctx) makes a stream of context ctx (NULL: device 0's primary context) whose work a "GPU"
 * thread of this library executes in order: event records (an event fires when its last record was executed), waits
 * on a 32-bit word (cuStreamWaitValue32 GEQ: blocks the stream until the word reaches the value), holds (a kernel
 * still running: blocks until fake_cuda_release), and copies (a kernel of the caller that reads or writes memory).
 * cuEventQuery answers NOT_READY while a record of the event is queued; cuStreamSynchronize on such a stream waits
 * until it is empty (at most 20 s, then CUDA_ERROR_UNKNOWN: it would never return on a GPU). cuCtxSynchronize and
 * cuMemFree while some stream is blocked on a word count a hazard (fake_cuda_order_stats): on a GPU they would wait
 * for that stream, which waits for zccl. Streams and events of other handles behave as before (records fire at once).
 */
#include <time.h>
#include <unistd.h>

enum { FK_RECORD, FK_WAIT, FK_HOLD, FK_COPY, FK_FAIL };
typedef struct fk_item {
    int kind;
    long *event;  /* FK_RECORD: the event's count of queued records */
    volatile uint32_t *word;
    uint32_t value;
    int hold;
    void *dst;
    const void *src;
    size_t n;
    struct fk_item *next;
} fk_item_t;
typedef struct fk_stream {
    unsigned magic;
    void *ctx;
    fk_item_t *head, *tail;
    long queued, executed;
    int failed; /* a kernel of the caller failed: events recorded after it report CUDA_ERROR_LAUNCH_FAILED */
    struct fk_stream *next;
} fk_stream_t;
#define FK_MAGIC 0x5eedf00du

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static fk_stream_t *fk_streams;
static int fk_released[1024];
static int fk_nholds;
static long fk_hazards, fk_user_records, fk_user_waits, fk_not_ready;
static pthread_t fk_gpu;
static int fk_gpu_started;

static int fk_is_stream(void *s) {
    pthread_mutex_lock(&fk_mu);
    int found = 0;
    for (fk_stream_t *f = fk_streams; f && !found; f = f->next) found = (void *)f == s;
    pthread_mutex_unlock(&fk_mu);
    return found;
}

static void fk_push(fk_stream_t *s, fk_item_t *it) { /* fk_mu held */
    it->next = NULL;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    s->queued++;
}

static void fk_enqueue_record(void *s, void *e) {
    fk_item_t *it = calloc(1, sizeof *it);
    it->kind = FK_RECORD;
    it->event = e;
    pthread_mutex_lock(&fk_mu);
    (*it->event)++;
    fk_user_records++;
    fk_push(s, it);
    pthread_mutex_unlock(&fk_mu);
}

static void fk_enqueue_wait(void *s, unsigned long long addr, uint32_t v) {
    fk_item_t *it = calloc(1, sizeof *it);
    it->kind = FK_WAIT;
    it->word = (volatile uint32_t *)(uintptr_t)addr;
    it->value = v;
    pthread_mutex_lock(&fk_mu);
    fk_user_waits++;
    fk_push(s, it);
    pthread_mutex_unlock(&fk_mu);
}

/* 600 (NOT_READY) while a record is queued, 719 (LAUNCH_FAILED) after a failed kernel, else 0. */
static int fk_event_not_ready(void *e) {
    if (!e) return 0;
    pthread_mutex_lock(&fk_mu);
    const long *ev = e;
    int r = ev[0] > 0 ? 600 : ev[1] ? 719 : 0;
    if (r == 600) fk_not_ready++;
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* An event: [0] records queued and not executed, [1] a failed kernel ran before its last record, [2] destroyed
 * (freed once its queued records have run, as the driver allows destroying an event with pending work). */
static void fk_event_destroy(void *e) {
    if (!e) return;
    long *ev = e;
    pthread_mutex_lock(&fk_mu);
    const int later = ev[0] > 0;
    if (later) ev[2] = 1;
    pthread_mutex_unlock(&fk_mu);
    if (!later) free(e);
}

/* Runs what can run at the head of every stream; fk_mu held. */
static void fk_step(void) {
    for (fk_stream_t *s = fk_streams; s; s = s->next) {
        while (s->head) {
            fk_item_t *it = s->head;
            if (it->kind == FK_WAIT && __atomic_load_n(it->word, __ATOMIC_ACQUIRE) < it->value) break;
            if (it->kind == FK_HOLD && !fk_released[it->hold]) break;
            if (it->kind == FK_RECORD) {
                it->event[0]--;
                if (s->failed) it->event[1] = 1;
                if (it->event[0] == 0 && it->event[2]) free(it->event); /* destroyed while a record was queued */
            }
            if (it->kind == FK_FAIL) s->failed = 1;
            if (it->kind == FK_COPY) memmove(it->dst, it->src, it->n);
            s->head = it->next;
            if (!s->head) s->tail = NULL;
            s->executed++;
            free(it);
        }
    }
}

static void *fk_gpu_main(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&fk_mu);
        fk_step();
        pthread_mutex_unlock(&fk_mu);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static CUresult fk_stream_sync(void *s) {
    fk_stream_t *f = s;
    for (int i = 0; i < 400000; i++) {
        pthread_mutex_lock(&fk_mu);
        const int empty = f->head == NULL;
        pthread_mutex_unlock(&fk_mu);
        if (empty) return 0;
        usleep(50);
    }
    return 999;
}

static void fk_check_device_wide_wait(void) {
    pthread_mutex_lock(&fk_mu);
    for (fk_stream_t *s = fk_streams; s; s = s->next)
        if (s->head && s->head->kind == FK_WAIT && *s->head->word < s->head->value) fk_hazards++;
    pthread_mutex_unlock(&fk_mu);
}

FAKE_API void *fake_cuda_user_stream(void *ctx) {
    fk_stream_t *s = calloc(1, sizeof *s);
    s->magic = FK_MAGIC;
    s->ctx = ctx ? ctx : fake_ctx;
    pthread_mutex_lock(&fk_mu);
    s->next = fk_streams;
    fk_streams = s;
    if (!fk_gpu_started) fk_gpu_started = pthread_create(&fk_gpu, NULL, fk_gpu_main, NULL) == 0;
    pthread_mutex_unlock(&fk_mu);
    return s;
}
/* A kernel of the caller that has not finished: the stream stops here until fake_cuda_release(id). */
FAKE_API int fake_cuda_stream_hold(void *s) {
    fk_item_t *it = calloc(1, sizeof *it);
    it->kind = FK_HOLD;
    pthread_mutex_lock(&fk_mu);
    it->hold = ++fk_nholds % 1024;
    fk_released[it->hold] = 0;
    fk_push(s, it);
    pthread_mutex_unlock(&fk_mu);
    return it->hold;
}
FAKE_API void fake_cuda_release(int id) {
    pthread_mutex_lock(&fk_mu);
    fk_released[id] = 1;
    pthread_mutex_unlock(&fk_mu);
}
/* A kernel of the caller that copies n bytes when the stream reaches it. */
FAKE_API void fake_cuda_stream_copy(void *s, void *dst, const void *src, size_t n) {
    fk_item_t *it = calloc(1, sizeof *it);
    it->kind = FK_COPY;
    it->dst = dst;
    it->src = src;
    it->n = n;
    pthread_mutex_lock(&fk_mu);
    fk_push(s, it);
    pthread_mutex_unlock(&fk_mu);
}
/* A kernel of the caller that fails when the stream reaches it (the stream goes on, as after an error). */
FAKE_API void fake_cuda_stream_fail(void *s) {
    fk_item_t *it = calloc(1, sizeof *it);
    it->kind = FK_FAIL;
    pthread_mutex_lock(&fk_mu);
    fk_push(s, it);
    pthread_mutex_unlock(&fk_mu);
}
/* Items queued on s and not executed yet. */
FAKE_API long fake_cuda_stream_pending(void *s) {
    fk_stream_t *f = s;
    pthread_mutex_lock(&fk_mu);
    long n = f->queued - f->executed;
    pthread_mutex_unlock(&fk_mu);
    return n;
}
/* out[0]: device-wide waits while a stream was blocked on a word (hazards); out[1]: event records on the caller's
 * streams; out[2]: waits queued on them; out[3]: cuEventQuery answers NOT_READY for their events. */
FAKE_API void fake_cuda_order_stats(long out[4]) {
    pthread_mutex_lock(&fk_mu);
    out[0] = fk_hazards;
    out[1] = fk_user_records;
    out[2] = fk_user_waits;
    out[3] = fk_not_ready;
    pthread_mutex_unlock(&fk_mu);
}

FAKE_API CUresult cuStreamGetCtx(void *s, void **ctx) {
    if (!s || s == (void *)0x2 || ce_is_stream(s)) { /* the default stream, or one of cuStreamCreate (zccl's) */
        *ctx = cur_ctx ? cur_ctx : fake_ctx;
        return 0;
    }
    if (!fk_is_stream(s)) return 400; /* CUDA_ERROR_INVALID_HANDLE */
    *ctx = ((fk_stream_t *)s)->ctx;
    return 0;
}
FAKE_API CUresult cuCtxGetDevice(int *dev) {
    void *c = cur_ctx ? cur_ctx : fake_ctx;
    const uintptr_t v = (uintptr_t)c;
    *dev = c == fake_ctx ? 0 : (v > 0x100 && v < 0x200) ? (int)(v - 0x100) : 0;
    return 0;
}
/* ==== end of the stream-order block ==== */


/* ==== Copy engine (issue 24): streams of cuStreamCreate run their work later, on a thread, in order ============
 *
 * Each stream has a thread that executes its queue: copies (cuMemcpyAsync), the emulated reduction kernels
 * (cuLaunchKernel) and event records (cuEventRecord: the event is done once the thread passes the record). A copy
 * between host and device memory holds its direction's "link" (host-to-device and device-to-host are separate, as a
 * PCIe link is full duplex) for bytes / FAKE_CUDA_COPY_MBPS (decimal MB/s; unset or 0: no throttle) and writes its
 * destination only at the end of that time, so a reader that does not wait for the copy's event sees old bytes.
 * Device-to-device copies and kernels are not throttled. cuStreamSynchronize waits for the queue to drain,
 * cuCtxSynchronize for every stream's. FAKE_CUDA_SYNC=1: cuStreamCreate returns the old fixed handle and every
 * operation runs at once in the caller's thread. fake_cuda_ce_stats reports the copies by direction and the most
 * copies that were ever queued or running at once across the streams (overlap shows as > 1).
 */
#include <errno.h>

enum { CE_COPY, CE_KERNEL, CE_RECORD };
enum { CE_D2D = 0, CE_H2D = 1, CE_D2H = 2, CE_H2H = 3 };
typedef struct ce_item {
    int kind, dir, dt;
    void *dst;
    const void *src, *b;
    size_t n;
    uint32_t div;
    long *event;
    struct ce_item *next;
} ce_item_t;
typedef struct ce_stream {
    unsigned magic;
    ce_item_t *head, *tail;
    long queued, executed;
    pthread_t th;
    struct ce_stream *next;
} ce_stream_t;
#define CE_MAGIC 0xce0c0de5u
/* Event layout (8 longs from cuEventCreate): [0..2] the stream-order block's, [3] records queued on copy-engine
 * streams, [4] records executed, [5] destroyed while a record was queued (the thread frees it). */

static pthread_mutex_t ce_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ce_cv = PTHREAD_COND_INITIALIZER;
static ce_stream_t *ce_streams;
static double ce_link_free[4]; /* per direction: when the link is free again (CLOCK_MONOTONIC seconds) */
typedef struct { long copies[4]; long bytes[4]; long kernels, max_in_flight, in_flight; } fake_cuda_ce_stats_t;
static fake_cuda_ce_stats_t ce_stats;

FAKE_API void fake_cuda_ce_stats(fake_cuda_ce_stats_t *out) {
    pthread_mutex_lock(&ce_mu);
    *out = ce_stats;
    pthread_mutex_unlock(&ce_mu);
}

static double ce_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double ce_mbps(void) {
    static double v = -1;
    if (v < 0) {
        const char *e = getenv("FAKE_CUDA_COPY_MBPS");
        v = e ? atof(e) : 0.0;
        if (v < 0) v = 0;
    }
    return v;
}

static int ce_is_stream(void *s) {
    if (!s || s == (void *)0x2) return 0;
    pthread_mutex_lock(&ce_mu);
    int found = 0;
    for (ce_stream_t *c = ce_streams; c && !found; c = c->next) found = (void *)c == s;
    pthread_mutex_unlock(&ce_mu);
    return found;
}

static int ce_dir(const void *dst, const void *src) {
    pthread_mutex_lock(&mu);
    const int dd = find((uintptr_t)dst) != NULL, sd = find((uintptr_t)src) != NULL;
    pthread_mutex_unlock(&mu);
    return dd && sd ? CE_D2D : dd ? CE_H2D : sd ? CE_D2H : CE_H2H;
}

static void ce_sleep_until(double t) {
    for (;;) {
        const double left = t - ce_now();
        if (left <= 0) return;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static void ce_run(ce_item_t *it) {
    if (it->kind == CE_COPY) {
        const double mbps = ce_mbps();
        if (mbps > 0 && (it->dir == CE_H2D || it->dir == CE_D2H)) {
            pthread_mutex_lock(&ce_mu);
            const double now = ce_now(), start = ce_link_free[it->dir] > now ? ce_link_free[it->dir] : now;
            const double end = start + (double)it->n / (mbps * 1e6);
            ce_link_free[it->dir] = end;
            pthread_mutex_unlock(&ce_mu);
            ce_sleep_until(end); /* the bytes arrive when the link has carried them */
        }
        memmove(it->dst, it->src, it->n);
    } else if (it->kind == CE_KERNEL) {
        fk_run_reduce(it->dt, it->dst, it->src, it->b, it->n, it->div);
    }
}

static void *ce_main(void *arg) {
    ce_stream_t *c = arg;
    pthread_mutex_lock(&ce_mu);
    for (;;) {
        while (!c->head) pthread_cond_wait(&ce_cv, &ce_mu);
        ce_item_t *it = c->head;
        pthread_mutex_unlock(&ce_mu);
        ce_run(it);
        pthread_mutex_lock(&ce_mu);
        if (it->kind == CE_RECORD) {
            it->event[4]++;
            if (it->event[5] && it->event[4] == it->event[3]) free(it->event);
        }
        if (it->kind == CE_COPY) ce_stats.in_flight--;
        c->head = it->next;
        if (!c->head) c->tail = NULL;
        c->executed++;
        free(it);
        pthread_cond_broadcast(&ce_cv);
    }
    return NULL;
}

static void ce_after_fork_child(void);
static void ce_before_fork(void);
static void ce_after_fork_parent(void);
static void ce_register_fork(void) { pthread_atfork(ce_before_fork, ce_after_fork_parent, ce_after_fork_child); }

/* A child of fork() (the test harness forks ranks) has the streams but not their threads: start them again. */
static void ce_after_fork_child(void) {
    pthread_mutex_init(&ce_mu, NULL);
    pthread_cond_init(&ce_cv, NULL);
    for (ce_stream_t *c = ce_streams; c; c = c->next) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&c->th, &at, ce_main, c) != 0) abort();
        pthread_attr_destroy(&at);
    }
}
static void ce_before_fork(void) { pthread_mutex_lock(&ce_mu); }
static void ce_after_fork_parent(void) { pthread_mutex_unlock(&ce_mu); }

static CUresult ce_stream_create(void **s) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, ce_register_fork);
    const char *sync = getenv("FAKE_CUDA_SYNC");
    if (sync && atoi(sync) == 1) { *s = (void *)0x2; return 0; }
    ce_stream_t *c = calloc(1, sizeof *c);
    if (!c) return 2;
    c->magic = CE_MAGIC;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    const int rc = pthread_create(&c->th, &at, ce_main, c);
    pthread_attr_destroy(&at);
    if (rc != 0) { free(c); return 2; }
    pthread_mutex_lock(&ce_mu);
    c->next = ce_streams;
    ce_streams = c;
    pthread_mutex_unlock(&ce_mu);
    *s = c;
    return 0;
}

static void ce_push(void *s, ce_item_t *it) {
    ce_stream_t *c = s;
    pthread_mutex_lock(&ce_mu);
    it->next = NULL;
    if (c->tail) c->tail->next = it;
    else c->head = it;
    c->tail = it;
    c->queued++;
    if (it->kind == CE_COPY) {
        ce_stats.copies[it->dir]++;
        ce_stats.bytes[it->dir] += (long)it->n;
        if (++ce_stats.in_flight > ce_stats.max_in_flight) ce_stats.max_in_flight = ce_stats.in_flight;
    }
    if (it->kind == CE_KERNEL) ce_stats.kernels++;
    if (it->kind == CE_RECORD) it->event[3]++;
    pthread_cond_broadcast(&ce_cv);
    pthread_mutex_unlock(&ce_mu);
}

static void ce_enqueue_copy(void *s, void *dst, const void *src, size_t n, int dir) {
    ce_item_t *it = calloc(1, sizeof *it);
    if (!it) abort();
    *it = (ce_item_t){.kind = CE_COPY, .dir = dir, .dst = dst, .src = src, .n = n};
    ce_push(s, it);
}

static void ce_enqueue_kernel(void *s, int dt, void *dst, const void *a, const void *b, size_t n, uint32_t div) {
    ce_item_t *it = calloc(1, sizeof *it);
    if (!it) abort();
    *it = (ce_item_t){.kind = CE_KERNEL, .dt = dt, .dst = dst, .src = a, .b = b, .n = n, .div = div};
    ce_push(s, it);
}

static void ce_enqueue_record(void *s, void *e) {
    ce_item_t *it = calloc(1, sizeof *it);
    if (!it) abort();
    *it = (ce_item_t){.kind = CE_RECORD, .event = e};
    ce_push(s, it);
}

static int ce_event_pending(void *e) {
    if (!e) return 0;
    pthread_mutex_lock(&ce_mu);
    const long *ev = e;
    const int p = ev[3] > ev[4];
    pthread_mutex_unlock(&ce_mu);
    return p;
}

static int ce_event_destroy_later(void *e) {
    if (!e) return 0;
    pthread_mutex_lock(&ce_mu);
    long *ev = e;
    const int later = ev[3] > ev[4];
    if (later) ev[5] = 1;
    pthread_mutex_unlock(&ce_mu);
    return later;
}

static CUresult ce_stream_sync(void *s) {
    ce_stream_t *c = s;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60; /* a queue that never drains: the GPU would hang; a test gets an error instead */
    pthread_mutex_lock(&ce_mu);
    int rc = 0;
    while (c->executed < c->queued && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&ce_cv, &ce_mu, &dl);
    const int done = c->executed >= c->queued;
    pthread_mutex_unlock(&ce_mu);
    return done ? 0 : 999;
}

static void ce_sync_all(void) {
    pthread_mutex_lock(&ce_mu);
    for (ce_stream_t *c = ce_streams; c; c = c->next)
        while (c->executed < c->queued) pthread_cond_wait(&ce_cv, &ce_mu);
    pthread_mutex_unlock(&ce_mu);
}

FAKE_API CUresult cuStreamDestroy_v2(void *s) { /* work queued before still runs (the thread stays) */
    if (ce_is_stream(s)) ce_stream_sync(s);
    return 0;
}

FAKE_API CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    (void)flags;
    /* Only the ordering zccl relies on: the stream's later work starts after the event's last record ran. */
    if (e && ce_is_stream(s)) {
        for (int i = 0; i < 1200000 && ce_event_pending(e); i++) usleep(50);
    }
    return 0;
}
/* ==== end of the copy engine ==== */

/* ==== GDR attributes (issue 24): what the simulated GPU supports, and dma-buf export ==========================
 * FAKE_CUDA_CC      compute capability as major*10+minor (default 90: Hopper; 80: Ampere, needs the GDR flush)
 * FAKE_CUDA_DMABUF  CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (default 1)
 * FAKE_CUDA_GDR     CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED (default 1)
 * FAKE_CUDA_DMABUF_EXPORT=0  cuMemGetHandleForAddressRange refuses (CUDA_ERROR_NOT_SUPPORTED)
 * FAKE_CUDA_PCI_BUSID=dddd:bb:dd.f  the PCI domain, bus and device attributes (ZCCL_GDR=auto's path rule looks the
 *                   GPU up by them in the topology); unset, those attributes fail
 * cuMemGetHandleForAddressRange(DMA_BUF_FD) on a page-aligned range of a cuMemAlloc allocation returns a dup of the
 * allocation's memfd (a real fd the caller must close; an RDMA stack without dma-buf sees an ordinary file); memory
 * marked device by the test (not from cuMemAlloc), misaligned or out-of-range requests fail with
 * CUDA_ERROR_INVALID_VALUE, as the driver does. fake_cuda_dmabuf_exports counts the fds handed out. */
static long dmabuf_exports;
FAKE_API long fake_cuda_dmabuf_exports(void) { return __atomic_load_n(&dmabuf_exports, __ATOMIC_RELAXED); }

static int env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

static int gdr_attribute(int attr, int *v) {
    const int cc = env_int("FAKE_CUDA_CC", 90);
    switch (attr) {
    case 75: *v = cc / 10; return 1;                        /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = cc % 10; return 1;                        /* COMPUTE_CAPABILITY_MINOR */
    case 116: *v = env_int("FAKE_CUDA_GDR", 1) != 0; return 1;    /* GPU_DIRECT_RDMA_SUPPORTED */
    case 124: *v = env_int("FAKE_CUDA_DMABUF", 1) != 0; return 1; /* DMA_BUF_SUPPORTED */
    case 33: case 34: case 50: {                            /* PCI_BUS_ID, PCI_DEVICE_ID, PCI_DOMAIN_ID */
        const char *b = getenv("FAKE_CUDA_PCI_BUSID");
        unsigned dom = 0, bus = 0, d = 0;
        if (!b || sscanf(b, "%x:%x:%x", &dom, &bus, &d) != 3) return -1; /* no bus id: the attribute fails */
        *v = (int)(attr == 33 ? bus : attr == 34 ? d : dom);
        return 1;
    }
    default: return 0;
    }
}

FAKE_API CUresult cuMemGetHandleForAddressRange(void *handle, unsigned long long dptr, size_t size, int type,
                                                unsigned long long flags) {
    (void)flags;
    CUresult f = maybe_fail();
    if (f) return f;
    if (type != 1) return 1;                                     /* only CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */
    if (!env_int("FAKE_CUDA_DMABUF_EXPORT", 1) || !env_int("FAKE_CUDA_DMABUF", 1)) return 801;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!size || dptr % page || size % page) return 1;           /* CUDA_ERROR_INVALID_VALUE: not page-aligned */
    pthread_mutex_lock(&mu);
    int fd = -1;
    for (int i = 0; i < nipc; i++)
        if (!ipc_allocs[i].opened && dptr >= ipc_allocs[i].base && dptr + size <= ipc_allocs[i].base + ipc_allocs[i].map)
            fd = ipc_allocs[i].fd;
    pthread_mutex_unlock(&mu);
    if (fd < 0) return 1;
    const int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return 2;
    *(int *)handle = d;
    __atomic_fetch_add(&dmabuf_exports, 1, __ATOMIC_RELAXED);
    return 0;
}
/* ==== end of the GDR attributes ==== */

/*
 * copy.c — the library's bulk copies.
 *
 * zccl_kernel_copy_stream: a streaming copy for data the copying core will not read again soon. Ordinary stores
 * first read each destination line into the cache (read-for-ownership), so a large copy moves three bytes over the
 * memory bus for every byte copied. Non-temporal stores write lines straight to memory and skip that read; glibc's
 * memcpy switches to them only for copies larger than a big share of the last-level cache, which the chunk-sized
 * copies of the transports never are.
 *
 * zccl_kernel_copy: memcpy, except at the page-offset distances where this CPU's `rep movsb` (glibc's memcpy from a
 * few KiB to a few hundred KiB) is slow: there a vector loop (kernels.h; bench/copy_distance shows the effect).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

void zccl_kernel_copy_stream(void *dst, const void *src, size_t bytes) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    /* Head: bring the destination to 16-byte alignment with an ordinary copy. */
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > bytes) head = bytes;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    size_t n = bytes / 64;
    for (size_t i = 0; i < n; i++, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, bytes % 64);
    _mm_sfence(); /* streamed stores are weakly ordered: publish them before anyone is told the data is there */
}

/* The vector loop of zccl_kernel_copy: the destination brought to 32-byte alignment by a short memcpy (below rep
 * movsb's threshold), then 128 bytes a step with unaligned loads and aligned stores, and the tail by memcpy. */
__attribute__((target("avx2"))) static void copy_avx2(uint8_t *d, const uint8_t *s, size_t bytes) {
    const size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    const size_t n = bytes / 128;
    for (size_t i = 0; i < n; i++, d += 128, s += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64)), e = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_store_si256((__m256i *)d, a), _mm256_store_si256((__m256i *)(d + 32), b);
        _mm256_store_si256((__m256i *)(d + 64), c), _mm256_store_si256((__m256i *)(d + 96), e);
    }
    memcpy(d, s, bytes % 128);
}

static int have_avx2(void) {
    static int avx2 = -1; /* two threads' first looks both compute the same answer */
    int v = __atomic_load_n(&avx2, __ATOMIC_RELAXED);
    if (v < 0) {
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&avx2, v, __ATOMIC_RELAXED);
    }
    return v;
}

static void rep_movsb(void *d, const void *s, size_t n) {
    __asm__ __volatile__("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

/* Times `rep movsb` of 64 KiB with the destination 16 bytes past the source's page offset against 80 bytes past it,
 * best of 3 rounds of 4 copies each (about 0.1-0.4 ms once per process). */
static int measure_rep_movsb_slow(void) {
    enum { N = 64 << 10 };
    uint8_t *buf = aligned_alloc(4096, 3 * N);
    if (!buf) return 0;
    memset(buf, 1, 3 * N);
    uint64_t best[2] = {UINT64_MAX, UINT64_MAX};
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 2; k++) {
            const uint64_t t0 = zccl__now_ns();
            for (int i = 0; i < 4; i++) rep_movsb(buf + N + (k ? 80 : 16), buf, N);
            const uint64_t t = zccl__now_ns() - t0;
            if (t < best[k]) best[k] = t;
        }
    free(buf);
    return best[0] > 2 * best[1];
}

static int slow = -1; /* -1: not measured yet; a racy first look measures twice at worst (the answer is the CPU's) */

void zccl_kernel_rep_movsb_force(int v) { __atomic_store_n(&slow, v < 0 ? -1 : v != 0, __ATOMIC_RELAXED); }

bool zccl_kernel_rep_movsb_slow(void) {
    int v = __atomic_load_n(&slow, __ATOMIC_RELAXED);
    if (v < 0) {
        v = measure_rep_movsb_slow();
        __atomic_store_n(&slow, v, __ATOMIC_RELAXED);
    }
    return v == 1;
}

bool zccl_kernel_copy_slow_at(const void *dst, const void *src) {
    const size_t ahead = ((uintptr_t)dst - (uintptr_t)src) & 4095; /* dst's distance past src within a page */
    return ahead >= 1 && ahead < 64 && zccl_kernel_rep_movsb_slow();
}

void zccl_kernel_copy(void *dst, const void *src, size_t bytes) {
    if (bytes >= 1024 && have_avx2() && zccl_kernel_copy_slow_at(dst, src)) copy_avx2(dst, src, bytes);
    else if (bytes) memcpy(dst, src, bytes);
}

#else
bool zccl_kernel_rep_movsb_slow(void) { return false; }
void zccl_kernel_rep_movsb_force(int v) { (void)v; }
bool zccl_kernel_copy_slow_at(const void *dst, const void *src) {
    (void)dst, (void)src;
    return false;
}
void zccl_kernel_copy_stream(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
void zccl_kernel_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}
#endif

/*
 * copy.c — a streaming copy for data the copying core will not read again soon.
 *
 * Ordinary stores first read each destination line into the cache (read-for-ownership), so a large copy moves
 * three bytes over the memory bus for every byte copied. Non-temporal stores write lines straight to memory and
 * skip that read; glibc's memcpy switches to them only for copies larger than a big share of the last-level
 * cache, which the chunk-sized copies of the transports never are.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#if defined(__x86_64__)
#include <emmintrin.h>

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
#else
void zccl_kernel_copy_stream(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
#endif

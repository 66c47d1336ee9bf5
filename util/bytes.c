/*
 * bytes.c — byte-size parser (see bytes.h): digits, an optional fraction, an optional binary unit, an optional
 * "iB"/"B". Integer arithmetic throughout, so 2^62 - 1 parses exactly.
 */
#include "bytes.h"

#include <stddef.h>

#define ZCCL_BYTES_LIMIT (UINT64_C(1) << 62)

int zccl__parse_bytes(const char *s, uint64_t *out) {
    if (!s || !out || *s < '0' || *s > '9') return -1;
    uint64_t whole = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (whole > (UINT64_MAX - 9) / 10) return -1; /* before multiplying: 2^64 must not wrap to 0 */
        whole = whole * 10 + (uint64_t)(*s - '0');
        if (whole >= ZCCL_BYTES_LIMIT) return -1;
    }
    uint64_t frac = 0, frac_div = 1; /* fraction = frac / frac_div */
    if (*s == '.') {
        s++;
        if (*s < '0' || *s > '9') return -1;
        for (; *s >= '0' && *s <= '9'; s++) {
            if (frac_div > UINT64_C(1) << 40) return -1; /* more digits than any unit can make whole */
            frac = frac * 10 + (uint64_t)(*s - '0');
            frac_div *= 10;
        }
    }
    int shift = 0;
    switch (*s) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    default: break;
    }
    if (shift) {
        s++;
        if (s[0] == 'i' && s[1] == 'B') s += 2;
        else if (*s == 'B' || *s == 'b') s++;
    } else if (*s == 'B' || *s == 'b') {
        s++;
    }
    if (*s != '\0') return -1;
    if (frac_div > 1 && !shift) return -1; /* "1.5" bytes */
    if (whole >= ZCCL_BYTES_LIMIT >> shift) return -1;
    uint64_t v = whole << shift;
    if (frac) {
        if (frac > (UINT64_MAX >> shift)) return -1; /* so many fraction digits that frac << shift overflows */
        const uint64_t scaled = frac << shift;
        if (scaled % frac_div) return -1; /* not a whole number of bytes */
        v += scaled / frac_div;
        if (v >= ZCCL_BYTES_LIMIT) return -1;
    }
    *out = v;
    return 0;
}

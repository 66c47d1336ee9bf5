/*
 * bytes.h — the one parser of byte sizes, shared by the library's ZCCL_* settings and the command-line tools
 * (zccl-bench, zccl-zero-plan compile util/bytes.c into themselves), so "25M", "25MiB" and "25MB" mean the same
 * everywhere. Self-contained: no other zccl header.
 */
#ifndef ZCCL_BYTES_H
#define ZCCL_BYTES_H
#include <stdint.h>

/**
 * Parses a size: a number, then optionally a binary unit K, M, G or T (any case; 2^10, 2^20, 2^30, 2^40), then
 * optionally "iB" (after a unit) or "B". "4096", "64K", "64KiB", "64kb", "1.5G" (a fraction only with a unit, and
 * only when the result is a whole number of bytes). No sign, no spaces, nothing after.
 * @param s    the text; NULL or "" is malformed.
 * @param out  the value in bytes; written only on success.
 * @return 0 on success; -1 when malformed, fractional, or at least 2^62.
 */
int zccl__parse_bytes(const char *s, uint64_t *out);

#endif

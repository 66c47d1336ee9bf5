/* digits.c — load and split the digits set (see digits.h). */
#include "digits.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

unsigned long long zt_rand_next(unsigned long long *state)
{
    unsigned long long z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double zt_rand_uniform(unsigned long long *state)
{
    return (double)(zt_rand_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

void zt_shuffle(size_t *idx, size_t n, unsigned long long *state)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(zt_rand_next(state) % i);
        size_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

/* Parses one CSV line of 64 pixels and a label into x[64], *y. Returns 0 or the 1-based bad field. */
static int parse_line(char *line, double *x, int *y)
{
    char *p = line;
    for (int f = 0; f <= ZT_PIXELS; f++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno) return f + 1;
        int last = f == ZT_PIXELS;
        if (last ? (*end != '\n' && *end != '\r' && *end != '\0') : *end != ',') return f + 1;
        if (last) {
            if (v < 0 || v >= ZT_CLASSES) return f + 1;
            *y = (int)v;
        } else {
            if (v < 0 || v > 16) return f + 1;
            x[f] = (double)v / 16.0;
        }
        p = end + 1;
    }
    return 0;
}

int zt_digits_load(const char *path, zt_digits_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        snprintf(err, errlen, "cannot open %s: %s", path, errno ? strerror(errno) : "zlib could not allocate");
        return -1;
    }
    size_t cap = 2048;
    out->x = malloc(cap * ZT_PIXELS * sizeof(double));
    out->y = malloc(cap * sizeof(int));
    char line[1024];
    size_t lineno = 0;
    int rc = 0;
    while (out->x && out->y && gzgets(gz, line, sizeof line)) {
        lineno++;
        if (line[0] == '\n' || line[0] == '\0') continue;
        if (!strchr(line, '\n') && !gzeof(gz)) {
            snprintf(err, errlen, "%s line %zu: longer than %zu bytes", path, lineno, sizeof line - 1);
            rc = -1;
            break;
        }
        if (out->n == cap) {
            cap *= 2;
            double *nx = realloc(out->x, cap * ZT_PIXELS * sizeof(double));
            int *ny = nx ? realloc(out->y, cap * sizeof(int)) : NULL;
            if (nx) out->x = nx;
            if (ny) out->y = ny;
            if (!nx || !ny) break;
        }
        int bad = parse_line(line, out->x + out->n * ZT_PIXELS, out->y + out->n);
        if (bad) {
            snprintf(err, errlen, "%s line %zu field %d: expected %s", path, lineno, bad,
                     bad == ZT_PIXELS + 1 ? "a label 0..9 ending the line" : "a pixel value 0..16 followed by ','");
            rc = -1;
            break;
        }
        out->n++;
    }
    int zerr = 0;
    const char *zmsg = gzerror(gz, &zerr);
    if (rc == 0 && (!out->x || !out->y)) {
        snprintf(err, errlen, "%s: out of memory after %zu samples", path, out->n);
        rc = -1;
    } else if (rc == 0 && zerr != Z_OK && zerr != Z_STREAM_END) {
        snprintf(err, errlen, "%s: gzip error after line %zu: %s", path, lineno, zmsg);
        rc = -1;
    } else if (rc == 0 && out->n == 0) {
        snprintf(err, errlen, "%s: no samples", path);
        rc = -1;
    }
    gzclose(gz);
    if (rc) zt_digits_free(out);
    return rc;
}

static void take(const zt_digits_t *all, const size_t *idx, size_t n, zt_digits_t *out)
{
    out->n = n;
    out->x = malloc((n ? n : 1) * ZT_PIXELS * sizeof(double));
    out->y = malloc((n ? n : 1) * sizeof(int));
    if (!out->x || !out->y) {
        fprintf(stderr, "zero_train: out of memory splitting %zu samples\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(out->x + i * ZT_PIXELS, all->x + idx[i] * ZT_PIXELS, ZT_PIXELS * sizeof(double));
        out->y[i] = all->y[idx[i]];
    }
}

void zt_digits_split(const zt_digits_t *all, int heldout_percent, zt_digits_t *train, zt_digits_t *heldout)
{
    size_t *idx = malloc(all->n * sizeof *idx);
    if (!idx) {
        fprintf(stderr, "zero_train: out of memory splitting %zu samples\n", all->n);
        exit(1);
    }
    for (size_t i = 0; i < all->n; i++) idx[i] = i;
    unsigned long long split_state = 0x5EEDD161705ULL; /* constant: the split never depends on --seed */
    zt_shuffle(idx, all->n, &split_state);
    size_t nh = all->n * (size_t)heldout_percent / 100;
    take(all, idx, all->n - nh, train);
    take(all, idx + (all->n - nh), nh, heldout);
    free(idx);
}

void zt_digits_free(zt_digits_t *d)
{
    free(d->x);
    free(d->y);
    memset(d, 0, sizeof *d);
}

/*
 * digits.h — the UCI optical-recognition digits set (1,797 8x8 images, pixel values 0..16, label 0..9) as shipped
 * in sklearn/datasets/data/digits.csv.gz: read with zlib, scaled to [0, 1], split into a fixed train and
 * held-out part.
 */
#ifndef ZT_DIGITS_H
#define ZT_DIGITS_H

#include <stddef.h>

#define ZT_PIXELS 64
#define ZT_CLASSES 10

typedef struct {
    size_t n;       /* samples */
    double *x;      /* n x ZT_PIXELS, row-major, pixel / 16 */
    int *y;         /* n labels in 0..9 */
} zt_digits_t;

/*
 * Reads PATH (gzip-compressed CSV, one image per line: 64 integers 0..16 then the label 0..9, no header).
 * Returns 0, or -1 after writing the cause (file, line, field) into err[errlen].
 */
int zt_digits_load(const char *path, zt_digits_t *out, char *err, size_t errlen);

/*
 * Fixed split, independent of the training seed: the samples are permuted with a constant seed and the last
 * heldout_percent% become the held-out set. Both outputs own their memory.
 */
void zt_digits_split(const zt_digits_t *all, int heldout_percent, zt_digits_t *train, zt_digits_t *heldout);

void zt_digits_free(zt_digits_t *d);

/* splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014). */
unsigned long long zt_rand_next(unsigned long long *state);
/* Uniform double in [0, 1) from the top 53 bits. */
double zt_rand_uniform(unsigned long long *state);
/* Fisher-Yates shuffle of idx[0..n) (Knuth, TAOCP vol. 2, Algorithm P). */
void zt_shuffle(size_t *idx, size_t n, unsigned long long *state);

#endif

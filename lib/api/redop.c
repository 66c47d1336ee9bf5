/*
 * redop.c — PreMulSum reduction handles (NCCL's ncclRedOpCreatePreMulSum / ncclRedOpDestroy).
 *
 * A handle is a number from ZCCL_NUM_OPS (5) up, valid on the communicator that made it, for the datatype it was
 * made for. The handles of every communicator live in one table guarded by a mutex: creating and destroying them
 * is rare, and an operation copies the scalar once when it is issued (zccl__redop_scalar), so the hot path never
 * looks here. A destroyed handle's row stays, marked dead, so that a later use is reported as "destroyed" rather
 * than "unknown"; its number is reused by the next creation on the same communicator.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include "api.h"

typedef struct {
    struct zccl_comm *comm;
    int handle;
    bool live;
    zccl_datatype_t dt;
    zccl_scalar_residence_t residence;
    uint8_t scalar[8];  /* HOST_IMMEDIATE: the value, read at creation */
    const void *ptr;    /* DEVICE: where the value is read when an operation is issued */
} redop_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static redop_t *tab;
static size_t ntab, captab;

static redop_t *find(struct zccl_comm *comm, int handle) {
    for (size_t i = 0; i < ntab; i++)
        if (tab[i].comm == comm && tab[i].handle == handle) return &tab[i];
    return NULL;
}

/* Whether len bytes at p can be read by this process: CUDA device memory (not mapped in a process without the
 * driver's unified addressing) and wild pointers fail. process_vm_readv on oneself reports EFAULT instead of
 * crashing. */
static bool host_readable(const void *p, size_t len, void *out) {
    struct iovec local = {out, len}, remote = {(void *)p, len};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)len;
}

ZCCL_API zccl_result_t zccl_redop_create_premulsum(zccl_redop_t *op, void *scalar, zccl_datatype_t datatype,
                                                   zccl_scalar_residence_t residence, zccl_comm_t comm) {
    const char *fn = "zccl_redop_create_premulsum";
    if (!op) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' is NULL", fn);
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (!scalar) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'scalar' is NULL", fn);
    if ((unsigned)datatype >= ZCCL_NUM_TYPES)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'datatype' = %d is not a zccl_datatype_t (0..%d)", fn,
                           (int)datatype, ZCCL_NUM_TYPES - 1);
    if (residence != ZCCL_SCALAR_DEVICE && residence != ZCCL_SCALAR_HOST_IMMEDIATE)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'residence' = %d is neither ZCCL_SCALAR_DEVICE (0) "
                           "nor ZCCL_SCALAR_HOST_IMMEDIATE (1)", fn, (int)residence);
    const size_t es = zccl_type_size(datatype);
    uint8_t value[8] = {0};
    if (!host_readable(scalar, es, value))
        return residence == ZCCL_SCALAR_DEVICE
                   ? zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'scalar' = %p with ZCCL_SCALAR_DEVICE: "
                                 "device-resident scalars need GPU memory support (this build reads host memory "
                                 "only)", fn, scalar)
                   : zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'scalar' = %p is not readable host memory", fn,
                                 scalar);
    pthread_mutex_lock(&mu);
    int h = ZCCL_NUM_OPS;
    while (find(comm, h) && find(comm, h)->live) h++;
    redop_t *e = find(comm, h);
    if (!e) {
        if (ntab == captab) {
            size_t cap = captab ? 2 * captab : 16;
            redop_t *p = realloc(tab, cap * sizeof *p);
            if (!p) {
                pthread_mutex_unlock(&mu);
                return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for a reduction handle", fn);
            }
            tab = p;
            captab = cap;
        }
        e = &tab[ntab++];
    }
    *e = (redop_t){.comm = comm, .handle = h, .live = true, .dt = datatype, .residence = residence,
                   .ptr = residence == ZCCL_SCALAR_DEVICE ? scalar : NULL};
    memcpy(e->scalar, value, sizeof value);
    pthread_mutex_unlock(&mu);
    *op = (zccl_redop_t)h;
    return ZCCL_SUCCESS;
}

/* Why handle op is not usable on comm (the caller holds mu). */
static zccl_result_t why_not(struct zccl_comm *comm, int op, const char *fn) {
    const redop_t *e = find(comm, op);
    if (e && !e->live)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d is a PreMulSum handle that was destroyed "
                           "(zccl_redop_destroy)", fn, op);
    for (size_t i = 0; i < ntab; i++)
        if (tab[i].handle == op && tab[i].live)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d is a PreMulSum handle of another "
                               "communicator; handles are valid only on the communicator that created them", fn, op);
    return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d is not a zccl_redop_t (0..%d) nor a PreMulSum "
                       "handle of this communicator", fn, op, ZCCL_NUM_OPS - 1);
}

ZCCL_API zccl_result_t zccl_redop_destroy(zccl_redop_t op, zccl_comm_t comm) {
    const char *fn = "zccl_redop_destroy";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if ((int)op >= 0 && (int)op < ZCCL_NUM_OPS)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d is a built-in operation, not a handle", fn,
                           (int)op);
    pthread_mutex_lock(&mu);
    redop_t *e = find(comm, (int)op);
    zccl_result_t res = ZCCL_SUCCESS;
    if (e && e->live) e->live = false;
    else res = why_not(comm, (int)op, fn);
    pthread_mutex_unlock(&mu);
    return res;
}

zccl_result_t zccl__redop_check(zccl_comm_t comm, zccl_redop_t op, zccl_datatype_t dt, const char *fn) {
    pthread_mutex_lock(&mu);
    const redop_t *e = find(comm, (int)op);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!e || !e->live) res = why_not(comm, (int)op, fn);
    else if (e->dt != dt)
        res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'op' = %d is a PreMulSum handle made for datatype %d, "
                          "used with datatype %d", fn, (int)op, (int)e->dt, (int)dt);
    pthread_mutex_unlock(&mu);
    return res;
}

bool zccl__redop_scalar(zccl_comm_t comm, zccl_redop_t op, uint8_t out[8]) {
    pthread_mutex_lock(&mu);
    const redop_t *e = find(comm, (int)op);
    bool ok = e && e->live;
    if (ok) {
        memcpy(out, e->scalar, 8);
        if (e->ptr) memcpy(out, e->ptr, zccl_type_size(e->dt)); /* ZCCL_SCALAR_DEVICE: read when issued */
    }
    pthread_mutex_unlock(&mu);
    return ok;
}

void zccl__redop_forget(zccl_comm_t comm) {
    pthread_mutex_lock(&mu);
    size_t w = 0;
    for (size_t i = 0; i < ntab; i++)
        if (tab[i].comm != comm) tab[w++] = tab[i];
    ntab = w;
    pthread_mutex_unlock(&mu);
}

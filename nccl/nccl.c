/*
 * nccl/nccl.c — libnccl.so.2 on top of zccl: every function of NCCL 2.28's nccl.h, under its nccl* name and its
 * pnccl* alias, mapped onto zccl's public API (include/zccl.h) and nothing else of zccl. docs/nccl.md lists what
 * each function does here.
 *
 * Built against CUDA's nccl.h when it is installed, else against nccl/abi/nccl.h (zccl's own description of the
 * same ABI); the static assertions below pin every shared value to zccl's.
 *
 * What differs from NCCL, by design of this CPU-only layer:
 *  - host buffers: the cudaStream_t argument is not used; every call has completed when it returns (a group: when
 *    ncclGroupEnd returns). Device buffers (zccl_pointer_device): the call runs on the zccl stream bound to
 *    (communicator, cudaStream_t) by zccl_stream_create_cuda, made on first use and destroyed with the
 *    communicator, so it returns at once and is ordered with the CUDA stream; zccl stages its data through host
 *    memory. A group's device collectives run one by one in recording order; grouped device send/recv is refused.
 *  - ncclGroupStart/End: the calls of a group are recorded here and handed to zccl's own group
 *    (zccl_group_start/end) at the outermost ncclGroupEnd, one thread per communicator when a group spans several
 *    (one thread driving several ranks, as after ncclCommInitAll). Communicator creation, split and shrink inside a
 *    group run on a thread each, started at once and joined by ncclGroupEnd.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nccl.h>
#include <zccl.h>

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
/* pnccl<Name>: the same function under NCCL's profiling name. */
#define PALIAS(name) extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")))

/* ---- the ABI: NCCL's values are zccl's ---------------------------------------------------------------------- */
_Static_assert(NCCL_MAJOR == 2 && NCCL_MINOR == 28, "this layer implements NCCL 2.28's API");
_Static_assert(sizeof(ncclUniqueId) == 128 && sizeof(ncclUniqueId) == sizeof(zccl_unique_id_t), "unique id size");
_Static_assert(NCCL_UNIQUE_ID_BYTES == ZCCL_UNIQUE_ID_BYTES, "unique id bytes");
_Static_assert(sizeof(ncclResult_t) == sizeof(zccl_result_t), "enum size");
_Static_assert(sizeof(ncclDataType_t) == sizeof(zccl_datatype_t) && sizeof(ncclRedOp_t) == sizeof(zccl_redop_t),
               "enum size");
_Static_assert((int)ncclSuccess == ZCCL_SUCCESS && (int)ncclUnhandledCudaError == ZCCL_UNHANDLED_CUDA_ERROR &&
                   (int)ncclSystemError == ZCCL_SYSTEM_ERROR && (int)ncclInternalError == ZCCL_INTERNAL_ERROR &&
                   (int)ncclInvalidArgument == ZCCL_INVALID_ARGUMENT &&
                   (int)ncclInvalidUsage == ZCCL_INVALID_USAGE && (int)ncclRemoteError == ZCCL_REMOTE_ERROR &&
                   (int)ncclInProgress == ZCCL_IN_PROGRESS,
               "result codes");
_Static_assert((int)ncclInt8 == ZCCL_INT8 && (int)ncclUint8 == ZCCL_UINT8 && (int)ncclInt32 == ZCCL_INT32 &&
                   (int)ncclUint32 == ZCCL_UINT32 && (int)ncclInt64 == ZCCL_INT64 && (int)ncclUint64 == ZCCL_UINT64 &&
                   (int)ncclFloat16 == ZCCL_FLOAT16 && (int)ncclFloat32 == ZCCL_FLOAT32 &&
                   (int)ncclFloat64 == ZCCL_FLOAT64 && (int)ncclBfloat16 == ZCCL_BFLOAT16 &&
                   (int)ncclFloat8e4m3 == ZCCL_FLOAT8E4M3 && (int)ncclFloat8e5m2 == ZCCL_FLOAT8E5M2,
               "datatypes");
_Static_assert((int)ncclSum == ZCCL_SUM && (int)ncclProd == ZCCL_PROD && (int)ncclMax == ZCCL_MAX &&
                   (int)ncclMin == ZCCL_MIN && (int)ncclAvg == ZCCL_AVG && (int)ncclNumOps == ZCCL_NUM_OPS,
               "reduction ops");
_Static_assert((int)ncclScalarDevice == ZCCL_SCALAR_DEVICE &&
                   (int)ncclScalarHostImmediate == ZCCL_SCALAR_HOST_IMMEDIATE,
               "scalar residence");
_Static_assert(NCCL_SPLIT_NOCOLOR == ZCCL_SPLIT_NOCOLOR, "split no-color");
_Static_assert(sizeof(size_t) == 8, "64-bit ABI");

#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_SIMINFO_MAGIC 0x74685283u
#define SHIM_COMM_MAGIC 0x6e63636cu /* "nccl" */
#define SHIM_REG_MAGIC 0x72656731u

/* ---- last error (per thread) -------------------------------------------------------------------------------- */
static __thread char last_err[1024];

static int warn_enabled(void) {
    const char *v = getenv("ZCCL_DEBUG");
    return v && (!strcasecmp(v, "WARN") || !strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"));
}

/* also used by device_api.c (hidden: not exported) */
__attribute__((format(printf, 2, 3))) ncclResult_t zccl_nccl_fail(ncclResult_t r, const char *fmt, ...);
#define fail zccl_nccl_fail
__attribute__((format(printf, 2, 3))) ncclResult_t zccl_nccl_fail(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
    if (warn_enabled()) fprintf(stderr, "zccl-nccl WARN %s\n", last_err);
    return r;
}

/* zccl's result as NCCL's, with zccl's message (read on this thread) kept for ncclGetLastError. */
static ncclResult_t from_zccl(zccl_result_t r, const char *fname) {
    switch (r) {
    case ZCCL_SUCCESS: return ncclSuccess;
    case ZCCL_IN_PROGRESS: return ncclInProgress;
    case ZCCL_TIMEOUT:
        /* NCCL has no timeout code: a peer that made no progress is a remote failure. */
        return fail(ncclRemoteError, "%s: timed out (zccl ZCCL_TIMEOUT, reported as ncclRemoteError): %s", fname,
                    zccl_get_last_error(NULL));
    case ZCCL_UNHANDLED_CUDA_ERROR:
    case ZCCL_SYSTEM_ERROR:
    case ZCCL_INTERNAL_ERROR:
    case ZCCL_INVALID_ARGUMENT:
    case ZCCL_INVALID_USAGE:
    case ZCCL_REMOTE_ERROR:
        return fail((ncclResult_t)r, "%s: %s", fname, zccl_get_last_error(NULL));
    default:
        return fail(ncclInternalError, "%s: zccl returned unknown result %d: %s", fname, (int)r,
                    zccl_get_last_error(NULL));
    }
}

/* ---- device pointers: asked of zccl's memory layer (the CUDA driver, where one is installed) -------------------- */
/* The CUDA device of p's memory, -1 for host memory (and for every pointer where no CUDA driver is present). */
static int buf_device(const void *p) {
    int d = -1;
    if (!p || zccl_pointer_device(p, &d) != ZCCL_SUCCESS) return -1;
    return d;
}

static int is_device_pointer(const void *p) { return buf_device(p) >= 0; }

static ncclResult_t check_host(const char *fname, const char *arg, const void *p) {
    if (is_device_pointer(p))
        return fail(ncclInvalidUsage,
                    "%s: '%s' (%p) is CUDA device memory, which this function does not take in zccl's NCCL layer: "
                    "pass host memory",
                    fname, arg, p);
    return ncclSuccess;
}

/* ---- communicators ------------------------------------------------------------------------------------------ */
struct reg {
    unsigned magic;
    struct ncclComm *comm;
    void *buff;
    size_t size;
    struct reg *next;
};

struct ncclComm {
    unsigned magic;
    zccl_comm_t z;
    int blocking;             /* NCCL config blocking (1 unless the config said 0) */
    ncclResult_t create_err;  /* creation in a group that failed (its message in create_msg) */
    char create_msg[1024];
    pthread_mutex_t lock;     /* registrations, CUDA streams */
    struct reg *regs;
    struct cstream *cstreams; /* one zccl stream per CUDA stream used with device buffers (zccl_stream_create_cuda) */
    ncclResult_t stream_err;  /* first error reported by one of them (ncclCommGetAsyncError) */
    char stream_msg[1024];
};

/* A CUDA stream that device-buffer calls of this communicator used, and the zccl stream bound to it. */
struct cstream {
    cudaStream_t cuda;
    zccl_stream_t z;
    struct cstream *next;
};

static ncclResult_t check_comm(const char *fname, ncclComm_t comm) {
    if (!comm) return fail(ncclInvalidArgument, "%s: 'comm' is NULL", fname);
    if (comm->magic != SHIM_COMM_MAGIC)
        return fail(ncclInvalidArgument, "%s: 'comm' (%p) is not a live communicator (destroyed, aborted, or not from "
                    "ncclCommInit*/ncclCommSplit/ncclCommShrink)", fname, (void *)comm);
    if (comm->create_err != ncclSuccess)
        return fail(ncclInvalidUsage, "%s: this communicator's creation failed: %s", fname, comm->create_msg);
    if (!comm->z) return fail(ncclInvalidUsage, "%s: this communicator is still being created (call ncclGroupEnd)", fname);
    return ncclSuccess;
}

static struct ncclComm *comm_new(int blocking) {
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->magic = SHIM_COMM_MAGIC;
    c->blocking = blocking;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

/* Waits for and destroys the communicator's zccl streams (before its zccl communicator goes); their first error is
 * kept in stream_err. */
static void cstreams_destroy(struct ncclComm *c) {
    pthread_mutex_lock(&c->lock);
    struct cstream *s = c->cstreams;
    c->cstreams = NULL;
    pthread_mutex_unlock(&c->lock);
    while (s) {
        struct cstream *n = s->next;
        zccl_result_t r = zccl_stream_destroy(s->z);
        if (r != ZCCL_SUCCESS && c->stream_err == ncclSuccess) {
            c->stream_err = (ncclResult_t)r;
            snprintf(c->stream_msg, sizeof c->stream_msg, "%s", zccl_get_last_error(NULL));
        }
        free(s);
        s = n;
    }
}

static void comm_free(struct ncclComm *c) {
    cstreams_destroy(c);
    pthread_mutex_lock(&c->lock);
    struct reg *r = c->regs;
    c->regs = NULL;
    pthread_mutex_unlock(&c->lock);
    while (r) {
        struct reg *n = r->next;
        r->magic = 0;
        free(r);
        r = n;
    }
    c->magic = 0;
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* A caller's ncclConfig_t, read by its size/magic/version: fields are only ever appended to ncclConfig_t, so a
 * caller built against an older header has a prefix of ours and one built against a newer header has ours first. */
struct parsed_config {
    int blocking; /* -1: not set */
    const char *name;
    int split_share;
};

#define CFG_HAS(cfg, field) ((cfg)->size >= offsetof(ncclConfig_t, field) + sizeof((cfg)->field))

static ncclResult_t parse_config(const char *fname, const ncclConfig_t *cfg, struct parsed_config *out) {
    out->blocking = -1;
    out->name = NULL;
    out->split_share = 0;
    if (!cfg) return ncclSuccess;
    if (cfg->magic != NCCL_CONFIG_MAGIC)
        return fail(ncclInvalidArgument, "%s: config->magic is 0x%x, not 0x%x: initialise the config with "
                    "NCCL_CONFIG_INITIALIZER before setting fields", fname, cfg->magic, NCCL_CONFIG_MAGIC);
    if (cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int) || cfg->size > 65536)
        return fail(ncclInvalidArgument, "%s: config->size is %zu, which is no ncclConfig_t layout (at least %zu for "
                    "the oldest, NCCL 2.14): initialise the config with NCCL_CONFIG_INITIALIZER",
                    fname, cfg->size, offsetof(ncclConfig_t, blocking) + sizeof(int));
    if (cfg->version < (unsigned)NCCL_VERSION(2, 14, 0))
        return fail(ncclInvalidArgument, "%s: config->version is %u; configs exist from NCCL 2.14 (21400) on: "
                    "initialise the config with NCCL_CONFIG_INITIALIZER", fname, cfg->version);
    if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (cfg->blocking != 0 && cfg->blocking != 1)
            return fail(ncclInvalidArgument, "%s: config->blocking is %d; it must be 0, 1 or NCCL_CONFIG_UNDEF_INT",
                        fname, cfg->blocking);
        out->blocking = cfg->blocking;
    }
    if (CFG_HAS(cfg, commName) && cfg->commName != NCCL_CONFIG_UNDEF_PTR) out->name = cfg->commName;
    if (CFG_HAS(cfg, splitShare) && cfg->splitShare != NCCL_CONFIG_UNDEF_INT) out->split_share = cfg->splitShare != 0;
    return ncclSuccess;
}

static int default_blocking(void) {
    const char *v = getenv("NCCL_COMM_BLOCKING"); /* NCCL's own default for configs that leave blocking unset */
    return (v && !strcmp(v, "0")) ? 0 : 1;
}

static void zconfig_from(zccl_config_t *zc, const struct parsed_config *pc, int blocking) {
    zccl_config_t init = ZCCL_CONFIG_INITIALIZER;
    *zc = init;
    zc->blocking = blocking;
    zc->comm_name = pc->name;
    zc->split_share = pc->split_share;
}

/* ---- groups (per thread) ------------------------------------------------------------------------------------ */
enum op_kind { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_ALLTOALL, OP_GATHER,
               OP_SCATTER, OP_SEND, OP_RECV };

struct op {
    enum op_kind kind;
    const char *fname;
    struct ncclComm *comm;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    ncclDataType_t datatype;
    ncclRedOp_t redop;
    int root; /* root, or peer for send/recv */
    cudaStream_t stream;
    int dev; /* the CUDA device of the buffers, -1 for host memory */
};

/* A creation (init, split, shrink) started inside a group: runs on its own thread until ncclGroupEnd joins it. */
struct job {
    pthread_t thread;
    struct ncclComm *comm; /* NULL for a split with NCCL_SPLIT_NOCOLOR */
    const char *fname;
    int kind; /* 0 init, 1 split, 2 shrink */
    int nranks, rank;
    zccl_unique_id_t id;
    struct ncclComm *parent;
    int color, key;
    int *exclude, nexclude;
    struct parsed_config pc;
    int has_config; /* else zccl's plain creation/split */
    ncclResult_t result;
    char msg[1024];
};

static __thread struct {
    int depth;
    struct op *ops;
    size_t nops, capops;
    struct job **jobs;
    size_t njobs, capjobs;
} grp;

/* The recording arrays of a thread are freed when it exits. */
static pthread_key_t grp_key;
static pthread_once_t grp_key_once = PTHREAD_ONCE_INIT;
static void grp_free(void *unused) {
    (void)unused;
    free(grp.ops);
    free(grp.jobs);
    grp.ops = NULL;
    grp.jobs = NULL;
    grp.capops = grp.capjobs = grp.nops = grp.njobs = 0;
}
static void grp_key_make(void) { pthread_key_create(&grp_key, grp_free); }
static void grp_track(void) {
    pthread_once(&grp_key_once, grp_key_make);
    pthread_setspecific(grp_key, &grp_key); /* any non-NULL value: the destructor runs at thread exit */
}

/* The zccl stream bound to (comm, CUDA stream), created on first use. */
static ncclResult_t cuda_stream_of(const struct op *o, zccl_stream_t *out) {
    struct ncclComm *c = o->comm;
    pthread_mutex_lock(&c->lock);
    struct cstream *s = c->cstreams;
    while (s && s->cuda != o->stream) s = s->next;
    ncclResult_t r = ncclSuccess;
    if (!s) {
        s = calloc(1, sizeof *s);
        zccl_result_t zr = s ? zccl_stream_create_cuda((void *)o->stream, &s->z) : ZCCL_SYSTEM_ERROR;
        if (zr != ZCCL_SUCCESS) {
            r = s ? from_zccl(zr, o->fname) : fail(ncclSystemError, "%s: out of memory", o->fname);
            free(s);
            s = NULL;
        } else {
            s->cuda = o->stream;
            s->next = c->cstreams;
            c->cstreams = s;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (s) *out = s->z;
    return r;
}

/* Before a host-buffer call: the communicator's device-buffer calls queued on its zccl streams run first (the
 * ranks must see the calls of a communicator in one order). An error they reported is returned here. */
static ncclResult_t drain_cuda_streams(const struct op *o) {
    struct ncclComm *c = o->comm;
    pthread_mutex_lock(&c->lock);
    ncclResult_t r = ncclSuccess;
    for (struct cstream *s = c->cstreams; s && r == ncclSuccess; s = s->next) {
        zccl_result_t zr = zccl_stream_synchronize(s->z);
        if (zr != ZCCL_SUCCESS) {
            if (c->stream_err == ncclSuccess) {
                c->stream_err = (ncclResult_t)zr;
                snprintf(c->stream_msg, sizeof c->stream_msg, "%s", zccl_get_last_error(NULL));
            }
            r = from_zccl(zr, o->fname);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

static ncclResult_t run_op(const struct op *o) {
    zccl_comm_t z = o->comm->z;
    zccl_stream_t zs = NULL; /* host buffers: the call has completed when it returns, as before */
    ncclResult_t sr = o->dev >= 0 ? cuda_stream_of(o, &zs) : (o->comm->cstreams ? drain_cuda_streams(o) : ncclSuccess);
    if (sr != ncclSuccess) return sr;
    zccl_datatype_t dt = (zccl_datatype_t)o->datatype;
    zccl_redop_t op = (zccl_redop_t)o->redop;
    zccl_result_t r;
    switch (o->kind) {
    case OP_ALLREDUCE: r = zccl_allreduce(o->sendbuf, o->recvbuf, o->count, dt, op, z, zs); break;
    case OP_BROADCAST: r = zccl_broadcast(o->sendbuf, o->recvbuf, o->count, dt, o->root, z, zs); break;
    case OP_REDUCE: r = zccl_reduce(o->sendbuf, o->recvbuf, o->count, dt, op, o->root, z, zs); break;
    case OP_ALLGATHER: r = zccl_allgather(o->sendbuf, o->recvbuf, o->count, dt, z, zs); break;
    case OP_REDUCESCATTER: r = zccl_reduce_scatter(o->sendbuf, o->recvbuf, o->count, dt, op, z, zs); break;
    case OP_SEND: r = zccl_send(o->sendbuf, o->count, dt, o->root, z, zs); break;
    case OP_RECV: r = zccl_recv(o->recvbuf, o->count, dt, o->root, z, zs); break;
    case OP_ALLTOALL:
        r = zccl_alltoall(o->sendbuf, o->recvbuf, o->count, dt, z, zs);
        break;
    case OP_GATHER:
        r = zccl_gather(o->sendbuf, o->recvbuf, o->count, dt, o->root, z, zs);
        break;
    case OP_SCATTER:
        r = zccl_scatter(o->sendbuf, o->recvbuf, o->count, dt, o->root, z, zs);
        break;
    default: return fail(ncclInternalError, "%s: unknown operation kind %d", o->fname, (int)o->kind);
    }
    return from_zccl(r, o->fname);
}

/* Checks NCCL makes when a call is issued (zccl repeats them, and more, when the call runs). */
static ncclResult_t check_op(const struct op *o) {
    ncclResult_t r = check_comm(o->fname, o->comm);
    if (r != ncclSuccess) return r;
    if ((int)o->datatype < 0 || (int)o->datatype >= (int)ncclNumTypes)
        return fail(ncclInvalidArgument, "%s: 'datatype' %d is not an ncclDataType_t (0..%d)", o->fname,
                    (int)o->datatype, (int)ncclNumTypes - 1);
    return ncclSuccess;
}

static ncclResult_t submit(const struct op *in) {
    struct op copy = *in, *o = &copy;
    /* device buffers run on the zccl stream bound to (comm, stream); zccl refuses a host/device mix, naming it */
    const int ds = buf_device(o->sendbuf), dr = buf_device(o->recvbuf);
    o->dev = ds >= 0 ? ds : dr;
    ncclResult_t r = check_op(o);
    if (r != ncclSuccess) return r;
    if (grp.depth == 0) return run_op(o);
    if (grp.nops == grp.capops) {
        size_t cap = grp.capops ? 2 * grp.capops : 64;
        struct op *n = realloc(grp.ops, cap * sizeof *n);
        if (!n) return fail(ncclSystemError, "%s: out of memory recording the call in the group", o->fname);
        if (!grp.ops) grp_track();
        grp.ops = n;
        grp.capops = cap;
    }
    grp.ops[grp.nops++] = *o;
    return ncclSuccess;
}

/* One communicator's part of a group: handed to zccl's group on one thread. */
struct part {
    struct ncclComm *comm;
    const struct op **ops;
    size_t nops;
    ncclResult_t result;
    char msg[1024];
    pthread_t thread;
};

static void run_part(struct part *p) {
    p->result = ncclSuccess;
    p->msg[0] = 0;
    /* Device-buffer collectives of a group run one by one, in recording order, on their CUDA streams (each rank
     * records the same order, so this is the group's meaning for collectives); zccl's groups take host memory. */
    size_t ndev = 0;
    for (size_t i = 0; i < p->nops; i++) {
        const struct op *o = p->ops[i];
        if (o->dev < 0) continue;
        ndev++;
        if (o->kind == OP_SEND || o->kind == OP_RECV) {
            p->result = fail(ncclInvalidUsage, "ncclGroupEnd: grouped call %zu (%s) is a send/recv on CUDA device "
                             "memory, which zccl's NCCL layer does not group yet; call it outside a group", i + 1,
                             o->fname);
            snprintf(p->msg, sizeof p->msg, "%s", last_err);
            return;
        }
    }
    if (ndev && ndev != p->nops) {
        p->result = fail(ncclInvalidUsage, "ncclGroupEnd: a group mixes calls on CUDA device memory and on host memory "
                         "on one communicator; zccl's NCCL layer runs them in separate groups");
        snprintf(p->msg, sizeof p->msg, "%s", last_err);
        return;
    }
    if (ndev) {
        for (size_t i = 0; i < p->nops && p->result == ncclSuccess; i++) {
            ncclResult_t r = run_op(p->ops[i]);
            if (r != ncclSuccess) {
                p->result = r;
                snprintf(p->msg, sizeof p->msg, "ncclGroupEnd: grouped call %zu on this communicator: %.900s", i + 1,
                         last_err);
            }
        }
        return;
    }
    zccl_result_t zr = zccl_group_start();
    if (zr != ZCCL_SUCCESS) {
        p->result = from_zccl(zr, "ncclGroupEnd (zccl_group_start)");
        snprintf(p->msg, sizeof p->msg, "%s", last_err);
        return;
    }
    for (size_t i = 0; i < p->nops; i++) {
        ncclResult_t r = run_op(p->ops[i]);
        if (r != ncclSuccess && p->result == ncclSuccess) {
            p->result = r;
            snprintf(p->msg, sizeof p->msg, "ncclGroupEnd: grouped call %zu on this communicator: %.900s", i + 1, last_err);
        }
    }
    zr = zccl_group_end();
    if (zr != ZCCL_SUCCESS && p->result == ncclSuccess) {
        p->result = from_zccl(zr, "ncclGroupEnd");
        snprintf(p->msg, sizeof p->msg, "%s", last_err);
    }
}

static void *part_thread(void *arg) {
    run_part(arg);
    return NULL;
}

static void *job_thread(void *arg);

static ncclResult_t join_jobs(void) {
    ncclResult_t first = ncclSuccess;
    char msg[1024] = "";
    for (size_t i = 0; i < grp.njobs; i++) {
        struct job *j = grp.jobs[i];
        pthread_join(j->thread, NULL);
        if (j->result != ncclSuccess && first == ncclSuccess) {
            first = j->result;
            snprintf(msg, sizeof msg, "%s", j->msg);
        }
        free(j->exclude);
        free(j);
    }
    grp.njobs = 0;
    if (first != ncclSuccess) return fail(first, "ncclGroupEnd: %.1000s", msg);
    return ncclSuccess;
}

/* Runs the recorded calls: each communicator's calls in one zccl group; several communicators on a thread each. */
static ncclResult_t run_group(void) {
    size_t n = grp.nops;
    ncclResult_t result = ncclSuccess;
    if (n == 0) return ncclSuccess;
    struct part *parts = calloc(n, sizeof *parts);
    const struct op **refs = calloc(n, sizeof *refs);
    if (!parts || !refs) {
        free(parts);
        free(refs);
        grp.nops = 0;
        return fail(ncclSystemError, "ncclGroupEnd: out of memory");
    }
    size_t nparts = 0, used = 0;
    for (size_t i = 0; i < n; i++) { /* communicators in order of first use; calls in recording order */
        size_t p;
        for (p = 0; p < nparts && parts[p].comm != grp.ops[i].comm; p++) {}
        if (p < nparts) continue;
        parts[nparts].comm = grp.ops[i].comm;
        parts[nparts].ops = refs + used;
        for (size_t k = i; k < n; k++)
            if (grp.ops[k].comm == grp.ops[i].comm) refs[used + parts[nparts].nops++] = &grp.ops[k];
        used += parts[nparts].nops;
        nparts++;
    }
    if (nparts == 1) {
        run_part(&parts[0]);
    } else {
        size_t started = 0;
        for (; started < nparts; started++)
            if (pthread_create(&parts[started].thread, NULL, part_thread, &parts[started]) != 0) break;
        if (started < nparts) { /* cannot run the communicators side by side: fail the rest, join the started */
            for (size_t p = started; p < nparts; p++) {
                parts[p].result = ncclSystemError;
                snprintf(parts[p].msg, sizeof parts[p].msg,
                         "ncclGroupEnd: cannot start a thread for communicator %zu of the group: %s", p + 1,
                         strerror(errno));
            }
        }
        for (size_t p = 0; p < started; p++) pthread_join(parts[p].thread, NULL);
    }
    for (size_t p = 0; p < nparts; p++)
        if (parts[p].result != ncclSuccess) {
            result = fail(parts[p].result, "%s", parts[p].msg);
            break;
        }
    free(parts);
    free(refs);
    grp.nops = 0;
    return result;
}

EXPORT ncclResult_t ncclGroupStart(void) {
    if (grp.depth >= 1024) return fail(ncclInvalidUsage, "ncclGroupStart: groups nested more than 1024 deep");
    grp.depth++;
    return ncclSuccess;
}
PALIAS(ncclGroupStart);

EXPORT ncclResult_t ncclGroupEnd(void) {
    if (grp.depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd: no group is open on this thread (ncclGroupEnd without a matching "
                    "ncclGroupStart)");
    if (--grp.depth > 0) return ncclSuccess;
    ncclResult_t rj = join_jobs();
    ncclResult_t ro = run_group();
    return rj != ncclSuccess ? rj : ro;
}
PALIAS(ncclGroupEnd);

static const char *coll_name(enum op_kind k) {
    switch (k) {
    case OP_ALLREDUCE: return "allreduce";
    case OP_BROADCAST: return "broadcast";
    case OP_REDUCE: return "reduce";
    case OP_ALLGATHER: return "allgather";
    case OP_REDUCESCATTER: return "reducescatter";
    default: return NULL;
    }
}

EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo) {
    if (!simInfo) return fail(ncclInvalidArgument, "ncclGroupSimulateEnd: 'simInfo' is NULL");
    if (simInfo->magic != NCCL_SIMINFO_MAGIC ||
        simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float) || simInfo->size > 65536)
        return fail(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo (magic 0x%x, size %zu) was not initialised "
                    "with NCCL_SIM_INFO_INITIALIZER", simInfo->magic, simInfo->size);
    if (grp.depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupSimulateEnd: no group is open on this thread");
    if (--grp.depth > 0) {
        simInfo->estimatedTime = 0.0f;
        return ncclSuccess;
    }
    ncclResult_t rj = join_jobs(); /* creations are not simulated: they have run */
    /* The estimate is zccl's tuner model (microseconds) for the collectives it predicts; other calls count 0. */
    double us = 0.0;
    for (size_t i = 0; i < grp.nops; i++) {
        const struct op *o = &grp.ops[i];
        const char *c = coll_name(o->kind);
        int nranks = 1;
        if (!c || zccl_comm_count(o->comm->z, &nranks) != ZCCL_SUCCESS) continue;
        size_t bytes = o->count * zccl_type_size((zccl_datatype_t)o->datatype);
        if (o->kind == OP_ALLGATHER || o->kind == OP_REDUCESCATTER) bytes *= (size_t)nranks;
        char name[64];
        double t = 0.0;
        if (zccl_comm_algo_choice(o->comm->z, c, bytes, name, sizeof name, &t) == ZCCL_SUCCESS) us += t;
    }
    grp.nops = 0;
    simInfo->estimatedTime = (float)us;
    return rj;
}
PALIAS(ncclGroupSimulateEnd);

/* ---- creation ----------------------------------------------------------------------------------------------- */
static void *job_thread(void *arg) {
    struct job *j = arg;
    zccl_comm_t z = NULL;
    zccl_result_t zr;
    if (j->kind == 0) {
        if (!j->has_config) {
            zr = zccl_comm_init_rank(&z, j->nranks, j->id, j->rank);
        } else {
            zccl_config_t zc;
            zconfig_from(&zc, &j->pc, 1);
            zr = zccl_comm_init_rank_config(&z, j->nranks, j->id, j->rank, &zc);
        }
    } else if (j->kind == 1) {
        if (!j->has_config) {
            zr = zccl_comm_split(j->parent->z, j->color, j->key, &z);
        } else {
            zccl_config_t zc;
            zconfig_from(&zc, &j->pc, 1);
            zr = zccl_comm_split_config(j->parent->z, j->color, j->key, &z, &zc);
        }
    } else {
        zr = zccl_comm_shrink(j->parent->z, j->exclude, j->nexclude, &z);
    }
    j->result = from_zccl(zr, j->fname);
    if (j->result != ncclSuccess) snprintf(j->msg, sizeof j->msg, "%s", last_err);
    if (j->comm) {
        j->comm->z = z;
        j->comm->create_err = j->result;
        snprintf(j->comm->create_msg, sizeof j->comm->create_msg, "%s", j->msg);
    } else if (z) {
        zccl_comm_destroy(z);
    }
    return NULL;
}

static ncclResult_t start_job(struct job *j) {
    if (grp.njobs == grp.capjobs) {
        size_t cap = grp.capjobs ? 2 * grp.capjobs : 16;
        struct job **n = realloc(grp.jobs, cap * sizeof *n);
        if (!n) return fail(ncclSystemError, "%s: out of memory", j->fname);
        if (!grp.jobs) grp_track();
        grp.jobs = n;
        grp.capjobs = cap;
    }
    int e = pthread_create(&j->thread, NULL, job_thread, j);
    if (e != 0) return fail(ncclSystemError, "%s: cannot start the creation thread: %s", j->fname, strerror(e));
    grp.jobs[grp.njobs++] = j;
    return ncclSuccess;
}

/* NCCL_DEBUG=VERSION (or INFO, TRACE) prints the version once, at the first communicator, as NCCL does. */
static pthread_once_t banner_once = PTHREAD_ONCE_INIT;
static void print_banner(void) {
    const char *d = getenv("NCCL_DEBUG");
    if (!d) d = getenv("ZCCL_DEBUG");
    if (d && (!strcasecmp(d, "VERSION") || !strcasecmp(d, "INFO") || !strcasecmp(d, "TRACE")))
        fprintf(stderr, "NCCL version %d.%d.%d (zccl %d.%d.%d: libnccl.so.2 over zccl, host memory only)\n",
                NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, ZCCL_MAJOR, ZCCL_MINOR, ZCCL_PATCH);
}

static ncclResult_t init_common(const char *fname, ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank,
                                ncclConfig_t *config) {
    pthread_once(&banner_once, print_banner);
    if (!comm) return fail(ncclInvalidArgument, "%s: 'comm' is NULL", fname);
    *comm = NULL;
    struct parsed_config pc;
    ncclResult_t r = parse_config(fname, config, &pc);
    if (r != ncclSuccess) return r;
    int blocking = pc.blocking >= 0 ? pc.blocking : (config ? default_blocking() : 1);
    struct ncclComm *c = comm_new(blocking);
    if (!c) return fail(ncclSystemError, "%s: out of memory", fname);
    zccl_unique_id_t zid;
    memcpy(&zid, id, sizeof zid);
    if (grp.depth > 0) { /* several ranks may be created by one thread in one group: each on a thread of its own */
        struct job *j = calloc(1, sizeof *j);
        if (!j) {
            comm_free(c);
            return fail(ncclSystemError, "%s: out of memory", fname);
        }
        *j = (struct job){.comm = c, .fname = fname, .kind = 0, .nranks = nranks, .rank = rank, .id = zid, .pc = pc,
                          .has_config = config != NULL};
        if ((r = start_job(j)) != ncclSuccess) {
            free(j);
            comm_free(c);
            return r;
        }
        *comm = c;
        return ncclSuccess;
    }
    zccl_result_t zr;
    if (!config) { /* plain ncclCommInitRank: zccl's plain creation */
        zr = zccl_comm_init_rank(&c->z, nranks, zid, rank);
    } else {
        zccl_config_t zc;
        zconfig_from(&zc, &pc, blocking);
        zr = zccl_comm_init_rank_config(&c->z, nranks, zid, rank, &zc);
    }
    r = from_zccl(zr, fname);
    if (r == ncclSuccess || r == ncclInProgress) {
        *comm = c;
        return r;
    }
    if (c->z) zccl_comm_destroy(c->z); /* a failed non-blocking creation still holds a handle */
    comm_free(c);
    return r;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: 'uniqueId' is NULL");
    zccl_unique_id_t zid;
    ncclResult_t r = from_zccl(zccl_get_unique_id(&zid), "ncclGetUniqueId");
    if (r == ncclSuccess) memcpy(uniqueId, &zid, sizeof zid);
    return r;
}
PALIAS(ncclGetUniqueId);

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return init_common("ncclCommInitRank", comm, nranks, &commId, rank, NULL);
}
PALIAS(ncclCommInitRank);

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config) {
    return init_common("ncclCommInitRankConfig", comm, nranks, &commId, rank, config);
}
PALIAS(ncclCommInitRankConfig);

/* Several ids only spread NCCL's bootstrap over several roots; zccl's bootstrap has one root: commIds[0]. */
EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                             ncclUniqueId *commIds, ncclConfig_t *config) {
    if (nId < 1) return fail(ncclInvalidArgument, "ncclCommInitRankScalable: 'nId' is %d; it must be at least 1", nId);
    if (!commIds) return fail(ncclInvalidArgument, "ncclCommInitRankScalable: 'commIds' is NULL");
    return init_common("ncclCommInitRankScalable", newcomm, nranks, &commIds[0], myrank, config);
}
PALIAS(ncclCommInitRankScalable);

/* Single process, ndev ranks: one unique id, every rank created in one group (a thread per rank). devlist names
 * CUDA devices, which this layer does not use: it is accepted and ignored. */
EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitAll: 'comm' is NULL");
    if (ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: 'ndev' is %d; it must be at least 1", ndev);
    if (grp.depth > 0) return fail(ncclInvalidUsage, "ncclCommInitAll: not allowed inside a group");
    (void)devlist;
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return r;
    for (int i = 0; i < ndev; i++) comm[i] = NULL;
    ncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; i++)
        r = init_common("ncclCommInitAll", &comm[i], ndev, &id, i, NULL);
    ncclResult_t re = ncclGroupEnd();
    if (r == ncclSuccess) r = re;
    if (r != ncclSuccess) {
        char msg[sizeof last_err];
        snprintf(msg, sizeof msg, "%s", last_err);
        for (int i = 0; i < ndev; i++)
            if (comm[i]) {
                if (comm[i]->z) zccl_comm_abort(comm[i]->z);
                comm_free(comm[i]);
                comm[i] = NULL;
            }
        snprintf(last_err, sizeof last_err, "%s", msg);
    }
    return r;
}
PALIAS(ncclCommInitAll);

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    const char *fname = "ncclCommSplit";
    ncclResult_t r = check_comm(fname, comm);
    if (r != ncclSuccess) return r;
    if (!newcomm) return fail(ncclInvalidArgument, "%s: 'newcomm' is NULL", fname);
    *newcomm = NULL;
    if (color < NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument, "%s: 'color' is %d; it must be >= 0 or NCCL_SPLIT_NOCOLOR (-1)", fname, color);
    struct parsed_config pc;
    if ((r = parse_config(fname, config, &pc)) != ncclSuccess) return r;
    int blocking = pc.blocking >= 0 ? pc.blocking : comm->blocking; /* no config: inherit */
    struct ncclComm *c = NULL;
    if (color != NCCL_SPLIT_NOCOLOR && !(c = comm_new(blocking))) return fail(ncclSystemError, "%s: out of memory", fname);
    if (grp.depth > 0) {
        struct job *j = calloc(1, sizeof *j);
        if (!j) {
            if (c) comm_free(c);
            return fail(ncclSystemError, "%s: out of memory", fname);
        }
        *j = (struct job){.comm = c, .fname = fname, .kind = 1, .parent = comm, .color = color, .key = key, .pc = pc,
                          .has_config = config != NULL};
        if ((r = start_job(j)) != ncclSuccess) {
            free(j);
            if (c) comm_free(c);
            return r;
        }
        *newcomm = c;
        return ncclSuccess;
    }
    zccl_comm_t z = NULL;
    zccl_result_t zr;
    if (!config) {
        zr = zccl_comm_split(comm->z, color, key, &z);
    } else {
        zccl_config_t zc;
        zconfig_from(&zc, &pc, 1); /* zccl completes a split before returning in both modes */
        zr = zccl_comm_split_config(comm->z, color, key, &z, &zc);
    }
    r = from_zccl(zr, fname);
    if (r != ncclSuccess) {
        if (z) zccl_comm_destroy(z);
        if (c) comm_free(c);
        return r;
    }
    if (c) {
        c->z = z;
        *newcomm = c;
    } else if (z) {
        zccl_comm_destroy(z);
    }
    return ncclSuccess;
}
PALIAS(ncclCommSplit);

EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                                   ncclConfig_t *config, int shrinkFlags) {
    const char *fname = "ncclCommShrink";
    ncclResult_t r = check_comm(fname, comm);
    if (r != ncclSuccess) return r;
    if (!newcomm) return fail(ncclInvalidArgument, "%s: 'newcomm' is NULL", fname);
    *newcomm = NULL;
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
        return fail(ncclInvalidArgument, "%s: 'shrinkFlags' is %d; it must be NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT",
                    fname, shrinkFlags);
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
        return fail(ncclInvalidArgument, "%s: 'excludeRanksList' is NULL or 'excludeRanksCount' (%d) negative", fname,
                    excludeRanksCount);
    struct parsed_config pc;
    if ((r = parse_config(fname, config, &pc)) != ncclSuccess) return r;
    int blocking = pc.blocking >= 0 ? pc.blocking : comm->blocking;
    struct ncclComm *c = comm_new(blocking);
    if (!c) return fail(ncclSystemError, "%s: out of memory", fname);
    /* NCCL_SHRINK_ABORT stops the parent's operations in flight first: every call of this layer has completed when
     * it returns, so there are none, and a broken parent is accepted by zccl_comm_shrink either way. */
    if (grp.depth > 0) {
        struct job *j = calloc(1, sizeof *j);
        int *ex = excludeRanksCount ? malloc((size_t)excludeRanksCount * sizeof *ex) : NULL;
        if (!j || (excludeRanksCount && !ex)) {
            free(j);
            free(ex);
            comm_free(c);
            return fail(ncclSystemError, "%s: out of memory", fname);
        }
        if (ex) memcpy(ex, excludeRanksList, (size_t)excludeRanksCount * sizeof *ex);
        *j = (struct job){.comm = c, .fname = fname, .kind = 2, .parent = comm, .exclude = ex,
                          .nexclude = excludeRanksCount, .pc = pc};
        if ((r = start_job(j)) != ncclSuccess) {
            free(ex);
            free(j);
            comm_free(c);
            return r;
        }
        *newcomm = c;
        return ncclSuccess;
    }
    r = from_zccl(zccl_comm_shrink(comm->z, excludeRanksList, excludeRanksCount, &c->z), fname);
    if (r != ncclSuccess) {
        if (c->z) zccl_comm_destroy(c->z);
        comm_free(c);
        return r;
    }
    *newcomm = c;
    return ncclSuccess;
}
PALIAS(ncclCommShrink);

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    ncclResult_t r = check_comm("ncclCommFinalize", comm);
    if (r != ncclSuccess) return r;
    return from_zccl(zccl_comm_finalize(comm->z), "ncclCommFinalize");
}
PALIAS(ncclCommFinalize);

static ncclResult_t check_live(const char *fname, ncclComm_t comm) {
    if (!comm) return fail(ncclInvalidArgument, "%s: 'comm' is NULL", fname);
    if (comm->magic != SHIM_COMM_MAGIC)
        return fail(ncclInvalidArgument, "%s: 'comm' (%p) is not a live communicator", fname, (void *)comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess; /* as NCCL: destroying NULL is a no-op */
    ncclResult_t r = check_live("ncclCommDestroy", comm);
    if (r != ncclSuccess) return r;
    if (comm->create_err == ncclSuccess && !comm->z)
        return fail(ncclInvalidUsage, "ncclCommDestroy: this communicator is still being created (call ncclGroupEnd)");
    cstreams_destroy(comm); /* their calls complete first: zccl_comm_destroy refuses a comm with queued calls */
    if (comm->z) r = from_zccl(zccl_comm_destroy(comm->z), "ncclCommDestroy");
    if (r == ncclSuccess) comm_free(comm);
    return r;
}
PALIAS(ncclCommDestroy);

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ncclResult_t r = check_live("ncclCommAbort", comm);
    if (r != ncclSuccess) return r;
    if (comm->create_err == ncclSuccess && !comm->z)
        return fail(ncclInvalidUsage, "ncclCommAbort: this communicator is still being created (call ncclGroupEnd)");
    if (comm->z) zccl_comm_abort(comm->z);
    comm_free(comm);
    return ncclSuccess;
}
PALIAS(ncclCommAbort);

/* An entry point zccl does not support: ncclInvalidUsage saying why, once comm is known to be a communicator. */
static ncclResult_t unsupported(const char *fname, ncclComm_t comm, const char *why) {
    ncclResult_t r = check_comm(fname, comm);
    return r != ncclSuccess ? r : fail(ncclInvalidUsage, "%s: %s", fname, why);
}

EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
    (void)revokeFlags;
    return unsupported("ncclCommRevoke", comm, "not supported by zccl (no operation of this layer is ever in flight "
                       "when a call returns; to stop one blocked on another thread use ncclCommAbort, then "
                       "ncclCommShrink on the survivors)");
}
PALIAS(ncclCommRevoke);

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    ncclResult_t r = check_live("ncclCommGetAsyncError", comm);
    if (r != ncclSuccess) return r;
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: 'asyncError' is NULL");
    if (comm->create_err != ncclSuccess) {
        *asyncError = comm->create_err;
        fail(comm->create_err, "%s", comm->create_msg);
        return ncclSuccess;
    }
    if (!comm->z) {
        *asyncError = ncclInProgress;
        return ncclSuccess;
    }
    zccl_result_t ae = ZCCL_SUCCESS;
    r = from_zccl(zccl_comm_get_async_error(comm->z, &ae), "ncclCommGetAsyncError");
    if (r != ncclSuccess) return r;
    if (ae == ZCCL_SUCCESS) { /* a device-buffer call that failed in the background on one of its zccl streams */
        pthread_mutex_lock(&comm->lock);
        for (struct cstream *s = comm->cstreams; s && comm->stream_err == ncclSuccess; s = s->next) {
            zccl_result_t q = zccl_stream_query(s->z);
            if (q != ZCCL_SUCCESS && q != ZCCL_IN_PROGRESS) {
                comm->stream_err = (ncclResult_t)q;
                snprintf(comm->stream_msg, sizeof comm->stream_msg, "%s", zccl_get_last_error(NULL));
            }
        }
        pthread_mutex_unlock(&comm->lock);
        if (comm->stream_err != ncclSuccess) {
            *asyncError = comm->stream_err;
            fail(comm->stream_err, "a call on device memory failed on its CUDA stream: %s", comm->stream_msg);
            return ncclSuccess;
        }
    }
    *asyncError = from_zccl(ae, "communicator error");
    return ncclSuccess;
}
PALIAS(ncclCommGetAsyncError);

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    ncclResult_t r = check_comm("ncclCommCount", comm);
    if (r != ncclSuccess) return r;
    return from_zccl(zccl_comm_count(comm->z, count), "ncclCommCount");
}
PALIAS(ncclCommCount);

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    ncclResult_t r = check_comm("ncclCommUserRank", comm);
    if (r != ncclSuccess) return r;
    return from_zccl(zccl_comm_rank(comm->z, rank), "ncclCommUserRank");
}
PALIAS(ncclCommUserRank);

/* No CUDA device is bound to a zccl communicator: always device 0, so that code indexing devices keeps working. */
EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    ncclResult_t r = check_comm("ncclCommCuDevice", comm);
    if (r != ncclSuccess) return r;
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: 'device' is NULL");
    *device = 0;
    return ncclSuccess;
}
PALIAS(ncclCommCuDevice);

/* ---- errors, version, debug --------------------------------------------------------------------------------- */
EXPORT const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the zccl developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}
PALIAS(ncclGetErrorString);

EXPORT const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm; /* messages are kept per thread, as zccl keeps them */
    return last_err;
}
PALIAS(ncclGetLastError);

EXPORT ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: 'version' is NULL");
    *version = NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH); /* the API implemented, as NCCL codes it */
    return ncclSuccess;
}
PALIAS(ncclGetVersion);

void zccl_nccl_env_map(void); /* nccl/env.c */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/* Re-reads the NCCL_* variables into their ZCCL_* counterparts (those still unset). zccl reads its settings once,
 * so logging already set up keeps its level. */
EXPORT void ncclResetDebugInit(void) { zccl_nccl_env_map(); }
PALIAS(ncclResetDebugInit);
#pragma GCC diagnostic pop

/* ---- memory and registration -------------------------------------------------------------------------------- */
EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: 'ptr' is NULL");
    *ptr = NULL;
    if (size == 0) return fail(ncclInvalidArgument, "ncclMemAlloc: 'size' is 0");
    /* CUDA device memory, as NCCL's, where zccl has a CUDA driver and its kernels; else host memory as before */
    zccl_result_t zr = zccl_mem_alloc_cuda(ptr, size);
    if (zr == ZCCL_SUCCESS) return ncclSuccess;
    if (zr != ZCCL_INVALID_USAGE) return from_zccl(zr, "ncclMemAlloc");
    int e = posix_memalign(ptr, 4096, size); /* host memory, page-aligned (NCCL_WIN_REQUIRED_ALIGNMENT) */
    if (e != 0) {
        *ptr = NULL;
        return fail(ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes of host memory: %s", size, strerror(e));
    }
    return ncclSuccess;
}
PALIAS(ncclMemAlloc);

EXPORT ncclResult_t ncclMemFree(void *ptr) {
    if (is_device_pointer(ptr)) return from_zccl(zccl_mem_free_cuda(ptr), "ncclMemFree");
    free(ptr);
    return ncclSuccess;
}
PALIAS(ncclMemFree);

/* Registration is recorded and has no other effect: zccl copies through its own transport buffers. */
EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
    ncclResult_t r = check_comm("ncclCommRegister", comm);
    if (r != ncclSuccess) return r;
    if (!handle) return fail(ncclInvalidArgument, "ncclCommRegister: 'handle' is NULL");
    *handle = NULL;
    if (!buff && size > 0) return fail(ncclInvalidArgument, "ncclCommRegister: 'buff' is NULL with size %zu", size);
    struct reg *g = malloc(sizeof *g);
    if (!g) return fail(ncclSystemError, "ncclCommRegister: out of memory");
    *g = (struct reg){SHIM_REG_MAGIC, comm, buff, size, NULL};
    pthread_mutex_lock(&comm->lock);
    g->next = comm->regs;
    comm->regs = g;
    pthread_mutex_unlock(&comm->lock);
    *handle = g;
    return ncclSuccess;
}
PALIAS(ncclCommRegister);

EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
    ncclResult_t r = check_comm("ncclCommDeregister", comm);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&comm->lock);
    struct reg **pp = &comm->regs;
    while (*pp && *pp != handle) pp = &(*pp)->next;
    struct reg *g = *pp;
    if (g) *pp = g->next;
    pthread_mutex_unlock(&comm->lock);
    if (!g)
        return fail(ncclInvalidArgument, "ncclCommDeregister: 'handle' %p is not a registration of this communicator "
                    "(already deregistered, or from another one)", handle);
    g->magic = 0;
    free(g);
    return ncclSuccess;
}
PALIAS(ncclCommDeregister);

EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags) {
    ncclResult_t r = check_comm("ncclCommWindowRegister", comm);
    if (r != ncclSuccess) return r;
    if (win) *win = NULL;
    (void)buff, (void)size, (void)winFlags;
    return unsupported("ncclCommWindowRegister", comm, "symmetric memory windows are GPU memory mapped by every "
                       "rank; zccl has no GPU support yet, so windows are not supported (use the collectives without "
                       "one)");
}
PALIAS(ncclCommWindowRegister);

EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
    (void)win;
    return unsupported("ncclCommWindowDeregister", comm, "no window can exist: zccl does not support symmetric "
                       "memory windows (ncclCommWindowRegister always fails)");
}
PALIAS(ncclCommWindowDeregister);

/* ---- reductions --------------------------------------------------------------------------------------------- */
EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                             ncclScalarResidence_t residence, ncclComm_t comm) {
    const char *fname = "ncclRedOpCreatePreMulSum";
    ncclResult_t r = check_comm(fname, comm);
    if (r != ncclSuccess) return r;
    if (!op) return fail(ncclInvalidArgument, "%s: 'op' is NULL", fname);
    if ((r = check_host(fname, "scalar", scalar)) != ncclSuccess) return r;
    zccl_redop_t zop;
    r = from_zccl(zccl_redop_create_premulsum(&zop, scalar, (zccl_datatype_t)datatype,
                                              (zccl_scalar_residence_t)residence, comm->z), fname);
    if (r == ncclSuccess) *op = (ncclRedOp_t)zop;
    return r;
}
PALIAS(ncclRedOpCreatePreMulSum);

EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
    ncclResult_t r = check_comm("ncclRedOpDestroy", comm);
    if (r != ncclSuccess) return r;
    return from_zccl(zccl_redop_destroy((zccl_redop_t)op, comm->z), "ncclRedOpDestroy");
}
PALIAS(ncclRedOpDestroy);

/* ---- collectives and point-to-point ------------------------------------------------------------------------- */
/* cudaStream_t is not used: the call (or, inside a group, ncclGroupEnd) returns once the operation is complete. */

/*
 * NAME(PARAMS...) builds the op from its arguments and submits it; SEND, RECV, COUNT, REDOP and ROOT (root, or peer
 * of a send/receive) are expressions of the parameters, which always include datatype, comm and stream. PALIAS
 * adds the pncclNAME twin.
 */
#define OP_ENTRY(NAME, KIND, SEND, RECV, COUNT, REDOP, ROOT, ...)                                              \
    EXPORT ncclResult_t NAME(__VA_ARGS__) {                                                                    \
        struct op o = {KIND, #NAME, comm, SEND, RECV, COUNT, datatype, REDOP, ROOT, stream, -1};               \
        return submit(&o);                                                                                     \
    }                                                                                                          \
    PALIAS(NAME)

OP_ENTRY(ncclAllReduce, OP_ALLREDUCE, sendbuff, recvbuff, count, op, 0, const void *sendbuff, void *recvbuff,
         size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclBroadcast, OP_BROADCAST, sendbuff, recvbuff, count, ncclSum, root, const void *sendbuff,
         void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclBcast, OP_BROADCAST, buff, buff, count, ncclSum, root, void *buff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclReduce, OP_REDUCE, sendbuff, recvbuff, count, op, root, const void *sendbuff, void *recvbuff,
         size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclAllGather, OP_ALLGATHER, sendbuff, recvbuff, sendcount, ncclSum, 0, const void *sendbuff,
         void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclReduceScatter, OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, op, 0, const void *sendbuff,
         void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
         cudaStream_t stream);
OP_ENTRY(ncclAlltoAll, OP_ALLTOALL, sendbuff, recvbuff, count, ncclSum, 0, const void *sendbuff, void *recvbuff,
         size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclGather, OP_GATHER, sendbuff, recvbuff, count, ncclSum, root, const void *sendbuff, void *recvbuff,
         size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclScatter, OP_SCATTER, sendbuff, recvbuff, count, ncclSum, root, const void *sendbuff, void *recvbuff,
         size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclSend, OP_SEND, sendbuff, NULL, count, ncclSum, peer, const void *sendbuff, size_t count,
         ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
OP_ENTRY(ncclRecv, OP_RECV, NULL, recvbuff, count, ncclSum, peer, void *recvbuff, size_t count,
         ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);

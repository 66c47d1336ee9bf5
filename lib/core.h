/*
 * core.h — what every internal file of zccl shares: error reporting, logging, configuration and small helpers.
 *
 * Layer rule (see docs/architecture.md): kernels/ and this header depend on nothing of zccl's; transport/ may
 * include core.h and transport.h; lib/ algorithm, engine and API files sit above the transports. Nothing below
 * includes anything above.
 */
#ifndef ZCCL_CORE_H
#define ZCCL_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "zccl.h"

#if defined(ZCCL_BUILDING_LIB)
#define ZCCL_API __attribute__((visibility("default")))
#else
#define ZCCL_API
#endif

/* ---- errors ------------------------------------------------------------------------------------------------ */

/**
 * Records the calling thread's last error message (kept for zccl_get_last_error) and logs it at WARN with the
 * location. Returns `res`, so callers write `return zccl__error(ZCCL_INVALID_ARGUMENT, "...", ...)`.
 * Only the place that first detects a failure calls it; callers above pass the code on (ZCCL_CHECK).
 */
#define zccl__error(res, ...) zccl__error_at(__FILE__, __LINE__, (res), __VA_ARGS__)
zccl_result_t zccl__error_at(const char *file, int line, zccl_result_t res, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/** Like zccl__error, for a failed system call: appends strerror(err). */
#define zccl__syserror(err, ...) zccl__syserror_at(__FILE__, __LINE__, (err), __VA_ARGS__)
zccl_result_t zccl__syserror_at(const char *file, int line, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/** Replaces the thread's last-error text (used to move a stream thread's error to the synchronizing thread). */
void zccl__set_last_error(const char *msg);
const char *zccl__last_error(void);

/** Propagates a failure, logging the call chain at TRACE (as NCCL's NCCLCHECK does at INFO). */
#define ZCCL_CHECK(call)                                                                        \
    do {                                                                                        \
        zccl_result_t zccl_res__ = (call);                                                      \
        if (zccl_res__ != ZCCL_SUCCESS) {                                                       \
            ZCCL_TRACE(ZCCL_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)zccl_res__);         \
            return zccl_res__;                                                                  \
        }                                                                                       \
    } while (0)
#define ZCCL_CHECK_GOTO(call, res, label)                                                       \
    do {                                                                                        \
        (res) = (call);                                                                         \
        if ((res) != ZCCL_SUCCESS) {                                                            \
            ZCCL_TRACE(ZCCL_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)(res));              \
            goto label;                                                                         \
        }                                                                                       \
    } while (0)

/* ---- logging ----------------------------------------------------------------------------------------------- */

typedef enum { ZCCL_LOG_NONE = 0, ZCCL_LOG_WARN = 1, ZCCL_LOG_INFO = 2, ZCCL_LOG_TRACE = 3 } zccl_log_level_t;
/** Subsystems, selectable with ZCCL_DEBUG_SUBSYS (comma list, ^ to exclude, ALL). TUNE: algorithm choices. */
enum {
    ZCCL_LOG_INIT = 1u << 0,
    ZCCL_LOG_BOOT = 1u << 1,
    ZCCL_LOG_SHM = 1u << 2,
    ZCCL_LOG_TCP = 1u << 3,
    ZCCL_LOG_COLL = 1u << 4,
    ZCCL_LOG_ENV = 1u << 5,
    ZCCL_LOG_TOPO = 1u << 6,
    ZCCL_LOG_TUNE = 1u << 7,
    ZCCL_LOG_IB = 1u << 8,
    ZCCL_LOG_ALL = 0xffffu
};
/** ZCCL_DEBUG_SUBSYS's names (upper case) and their bits, ZCCL_LOG_NSUBSYS entries, ALL last. */
typedef struct {
    const char *name;
    unsigned bit;
} zccl_log_subsys_t;
#define ZCCL_LOG_NSUBSYS 10
extern const zccl_log_subsys_t zccl__log_subsys[ZCCL_LOG_NSUBSYS];
/** The level a ZCCL_DEBUG value names (case-insensitive; "", NONE and VERSION: ZCCL_LOG_NONE), or -1. */
int zccl__log_level_of(const char *v);
extern int zccl__log_level; /* resolved from ZCCL_DEBUG on first use */
void zccl__log(zccl_log_level_t level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/** Sets the rank shown in every log line of this process (-1: unknown). */
void zccl__log_set_rank(int rank);
void zccl__log_init(void);

#define ZCCL_WARN(sub, ...) zccl__log(ZCCL_LOG_WARN, (sub), __FILE__, __LINE__, __VA_ARGS__)
#define ZCCL_INFO(sub, ...)                                                                     \
    do {                                                                                        \
        if (zccl__log_level >= ZCCL_LOG_INFO) zccl__log(ZCCL_LOG_INFO, (sub), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#ifdef ZCCL_NO_TRACE
#define ZCCL_TRACE(sub, ...) ((void)0)
#else
#define ZCCL_TRACE(sub, ...)                                                                    \
    do {                                                                                        \
        if (zccl__log_level >= ZCCL_LOG_TRACE) zccl__log(ZCCL_LOG_TRACE, (sub), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#endif

/* ---- configuration: the one table of ZCCL_* settings (lib/config.c) ----------------------------------------- */

typedef enum {
    ZCCL_CFG_DEBUG,            /* ZCCL_DEBUG */
    ZCCL_CFG_DEBUG_SUBSYS,     /* ZCCL_DEBUG_SUBSYS */
    ZCCL_CFG_SOCKET_IFNAME,    /* ZCCL_SOCKET_IFNAME */
    ZCCL_CFG_TRANSPORT,        /* ZCCL_TRANSPORT */
    ZCCL_CFG_SECRET,           /* ZCCL_SECRET */
    ZCCL_CFG_INIT_TIMEOUT_MS,  /* ZCCL_INIT_TIMEOUT_MS */
    ZCCL_CFG_TIMEOUT_MS,       /* ZCCL_TIMEOUT_MS */
    ZCCL_CFG_SHM_SLOT_BYTES,   /* ZCCL_SHM_SLOT_BYTES */
    ZCCL_CFG_SHM_SLOTS,        /* ZCCL_SHM_SLOTS */
    ZCCL_CFG_SHM_CMA,          /* ZCCL_SHM_CMA */
    ZCCL_CFG_CMA_THRESHOLD,    /* ZCCL_CMA_THRESHOLD */
    ZCCL_CFG_SPIN_US,          /* ZCCL_SPIN_US */
    ZCCL_CFG_CHUNK_BYTES,      /* ZCCL_CHUNK_BYTES */
    ZCCL_CFG_RS_ROUND_BYTES,   /* ZCCL_RS_ROUND_BYTES */
    ZCCL_CFG_TOPO_FILE,        /* ZCCL_TOPO_FILE */
    ZCCL_CFG_RING_ORDER,       /* ZCCL_RING_ORDER */
    ZCCL_CFG_CHECK,            /* ZCCL_CHECK */
    ZCCL_CFG_BUCKET_FIRST_BYTES, /* ZCCL_BUCKET_FIRST_BYTES */
    ZCCL_CFG_BUCKET_CAP_BYTES,   /* ZCCL_BUCKET_CAP_BYTES */
    ZCCL_CFG_BUCKETS_IN_FLIGHT,  /* ZCCL_BUCKETS_IN_FLIGHT */
    ZCCL_CFG_ZERO3_LIVE_BYTES,   /* ZCCL_ZERO3_MAX_LIVE_BYTES */
    ZCCL_CFG_ALGO,             /* ZCCL_ALGO */
    ZCCL_CFG_TUNER_CALIBRATE,  /* ZCCL_TUNER_CALIBRATE */
    ZCCL_CFG_TUNER_CACHE,      /* ZCCL_TUNER_CACHE */
    ZCCL_CFG_IB_DISABLE,       /* ZCCL_IB_DISABLE */
    ZCCL_CFG_IB_HCA,           /* ZCCL_IB_HCA */
    ZCCL_CFG_IB_GID_INDEX,     /* ZCCL_IB_GID_INDEX */
    ZCCL_CFG_IB_TIMEOUT,       /* ZCCL_IB_TIMEOUT */
    ZCCL_CFG_IB_RETRY_CNT,     /* ZCCL_IB_RETRY_CNT */
    ZCCL_CFG_IB_QPS_PER_CONN,  /* ZCCL_IB_QPS_PER_CONN */
    ZCCL_CFG_IB_ZCOPY_BYTES,   /* ZCCL_IB_ZCOPY_BYTES */
    ZCCL_CFG_COUNT
} zccl_cfg_id_t;

/** How a setting's value is read: text (its reader checks it), an integer, or a byte count (suffixes K, M, ...). */
typedef enum { ZCCL_CFG_TEXT = 0, ZCCL_CFG_INT, ZCCL_CFG_BYTES } zccl_cfg_kind_t;

typedef struct {
    const char *name;   /* environment variable */
    const char *deflt;  /* default value as text ("" = unset) */
    const char *help;   /* one line */
    zccl_cfg_kind_t kind;
    int64_t lo, hi;     /* ZCCL_CFG_INT / ZCCL_CFG_BYTES: accepted range, inclusive */
    const char *nccl;   /* NCCL's variable of the same meaning and grammar, read when `name` is unset; or NULL */
} zccl_cfg_desc_t;

/** The table, ZCCL_CFG_COUNT entries, in zccl_cfg_id_t order. */
extern const zccl_cfg_desc_t zccl__cfg_table[ZCCL_CFG_COUNT];
/** The value in force (the ZCCL_* variable, else its NCCL_* counterpart, else the default). Never NULL. */
const char *zccl__cfg_str(zccl_cfg_id_t id);
/** Prints, once per job, the unknown ZCCL_* names (stderr) and the NCCL_* ones read or ignored (INFO). */
void zccl__config_warn_unknown(void);
/** The environment variable that sets the value in force (the ZCCL_* or the NCCL_* name), or NULL for the default. */
const char *zccl__cfg_source(zccl_cfg_id_t id);
/**
 * Parses an integer or byte-count setting within the table's range (byte counts take bytes.c's suffixes: K/M/G/T
 * = powers of 1024). An invalid value is an error naming the variable, its value and the accepted range.
 */
zccl_result_t zccl__cfg_int(zccl_cfg_id_t id, int64_t *out);

/* ---- small helpers ----------------------------------------------------------------------------------------- */

uint64_t zccl__now_ns(void);
/** size_t multiply with overflow detection: returns false on overflow. */
static inline bool zccl__mul_ok(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
void *zccl__calloc(size_t n, size_t size); /* NULL on failure, caller reports */

#define ZCCL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZCCL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ZCCL_CACHELINE 64

#endif

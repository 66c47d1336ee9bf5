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
/** Sets the communicator name shown as "[name] " in this thread's log lines (NULL or "": none); returns the previous
 *  one so that a caller can restore it. The string must outlive its use. */
const char *zccl__log_set_tag(const char *tag);
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

/* ---- configuration: the one table of ZCCL_* settings (util/config.c; rows in each layer) ----------------------------------------- */

/** How a setting's value is read: text (its reader checks it), an integer, or a byte count (suffixes K, M, ...). */
typedef enum { ZCCL_CFG_TEXT = 0, ZCCL_CFG_INT, ZCCL_CFG_BYTES } zccl_cfg_kind_t;

/** One row of the settings table. */
typedef struct zccl_cfg_desc {
    const char *name;   /* environment variable */
    const char *deflt;  /* default value as text ("" = unset) */
    const char *help;   /* one line */
    zccl_cfg_kind_t kind;
    int64_t lo, hi;     /* ZCCL_CFG_INT / ZCCL_CFG_BYTES: accepted range, inclusive */
    bool must_match;    /* shapes the protocol or the schedules: every rank must have the same value (checked at
                           init through a hash each rank publishes) */
    const char *nccl;   /* NCCL's variable of the same meaning and grammar, read when `name` is unset; or NULL */
} zccl_cfg_desc_t;

/** A setting is named by its row. */
typedef const zccl_cfg_desc_t *zccl_cfg_id_t;

/**
 * Defines a row of the settings table in the layer that reads it and registers it in the table (an ELF section
 * the linker gathers), so each layer contributes its own rows and the bottom layer knows none of them:
 *     ZCCL_SETTING(zccl__set_foo) = {"ZCCL_FOO", "1", "what it does", .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1};
 * The layer's header declares `extern const zccl_cfg_desc_t zccl__set_foo;` and `#define ZCCL_CFG_FOO
 * (&zccl__set_foo)`.
 */
#define ZCCL_SETTING(var)                                                                                      \
    extern const zccl_cfg_desc_t var;                                                                          \
    __attribute__((used, section("zccl_settings"))) static const zccl_cfg_desc_t *const var##__row = &var;    \
    const zccl_cfg_desc_t var

/** Rows registered in this program (every layer linked into it), in link order. */
size_t zccl__cfg_count(void);
zccl_cfg_id_t zccl__cfg_at(size_t i);
/** The row named `name` (e.g. "ZCCL_DEBUG"; the first n characters when n > 0), or NULL. */
zccl_cfg_id_t zccl__cfg_find(const char *name, size_t n);
/** The value in force (the ZCCL_* variable, else its NCCL_* counterpart, else the default). Never NULL. */
const char *zccl__cfg_str(zccl_cfg_id_t id);
/** The environment variable that sets the value in force (the ZCCL_* or the NCCL_* name), or NULL for the default. */
const char *zccl__cfg_source(zccl_cfg_id_t id);
/**
 * Parses an integer or byte-count setting within the table's range (byte counts take bytes.c's suffixes: K/M/G/T
 * = powers of 1024). An invalid value is an error naming the variable, its value and the accepted range.
 */
zccl_result_t zccl__cfg_int(zccl_cfg_id_t id, int64_t *out);
/** Adds a line to zccl_config_describe's output after the table (e.g. whether a transport is built). */
typedef size_t (*zccl_cfg_note_fn)(char *buf, size_t len);

/* This layer's settings (util/config.c). */
extern const zccl_cfg_desc_t zccl__set_debug;
#define ZCCL_CFG_DEBUG (&zccl__set_debug)
extern const zccl_cfg_desc_t zccl__set_debug_subsys;
#define ZCCL_CFG_DEBUG_SUBSYS (&zccl__set_debug_subsys)
extern const zccl_cfg_desc_t zccl__set_socket_ifname;
#define ZCCL_CFG_SOCKET_IFNAME (&zccl__set_socket_ifname)

/* ---- small helpers ----------------------------------------------------------------------------------------- */

uint64_t zccl__now_ns(void);
/**
 * CPUs the `local` ranks of this host share, for the choices that depend on ranks per core (polling, the staged
 * path): the CPUs of this process's affinity mask; but when the mask holds a single CPU, or only the hardware threads
 * of one core on a machine with more (a launcher bound each rank to a core of its own: mpirun's, zccl-bench -np's and
 * zcclrun's default), `local`: one core per rank.
 */
int zccl__cpus_for_ranks(int local);
/** size_t multiply with overflow detection: returns false on overflow. */
static inline bool zccl__mul_ok(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
void *zccl__calloc(size_t n, size_t size); /* NULL on failure, caller reports */

#define ZCCL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZCCL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ZCCL_CACHELINE 64

#endif

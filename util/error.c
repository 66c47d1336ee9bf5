/* error.c — result strings and the per-thread last-error message. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "core.h"

static _Thread_local char last_error[1024];

ZCCL_API const char *zccl_get_error_string(zccl_result_t result) {
    switch (result) {
    case ZCCL_SUCCESS: return "no error";
    case ZCCL_UNHANDLED_CUDA_ERROR: return "unhandled cuda error";
    case ZCCL_SYSTEM_ERROR: return "unhandled system error (out of memory, sockets, shared memory, limits)";
    case ZCCL_INTERNAL_ERROR: return "internal error - please report this issue to the zccl developers";
    case ZCCL_INVALID_ARGUMENT: return "invalid argument";
    case ZCCL_INVALID_USAGE: return "invalid usage";
    case ZCCL_REMOTE_ERROR: return "remote process exited or there was a network error";
    case ZCCL_IN_PROGRESS: return "zccl operation in progress";
    case ZCCL_TIMEOUT: return "operation timed out";
    default: return "unknown result";
    }
}

ZCCL_API const char *zccl_get_last_error(zccl_comm_t comm) {
    (void)comm;
    return last_error;
}

const char *zccl__last_error(void) { return last_error; }

void zccl__set_last_error(const char *msg) { snprintf(last_error, sizeof last_error, "%s", msg ? msg : ""); }

static zccl_result_t record(const char *file, int line, zccl_result_t res, const char *suffix, const char *fmt,
                            va_list ap) {
    char msg[sizeof last_error];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (suffix && n >= 0 && (size_t)n < sizeof msg) snprintf(msg + n, sizeof msg - (size_t)n, "%s", suffix);
    snprintf(last_error, sizeof last_error, "%s", msg);
    zccl__log(ZCCL_LOG_WARN, ZCCL_LOG_ALL, file, line, "%s (%s)", msg, zccl_get_error_string(res));
    return res;
}

zccl_result_t zccl__error_at(const char *file, int line, zccl_result_t res, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(file, line, res, NULL, fmt, ap);
    va_end(ap);
    return res;
}

zccl_result_t zccl__syserror_at(const char *file, int line, int err, const char *fmt, ...) {
    char suffix[160];
    snprintf(suffix, sizeof suffix, ": %s (errno %d)", strerror(err), err);
    va_list ap;
    va_start(ap, fmt);
    record(file, line, ZCCL_SYSTEM_ERROR, suffix, fmt, ap);
    va_end(ap);
    return ZCCL_SYSTEM_ERROR;
}

ZCCL_API zccl_result_t zccl_get_version(int *version) {
    if (!version) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_get_version: argument 'version' is NULL");
    *version = ZCCL_VERSION_CODE;
    return ZCCL_SUCCESS;
}

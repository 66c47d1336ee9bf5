/*
 * comm_config.c — communicators created with a zccl_config_t (NCCL's ncclConfig_t): a name for the logs, and
 * NCCL's non-blocking mode, where creation returns ZCCL_IN_PROGRESS at once and continues on a thread of its own;
 * zccl_comm_get_async_error() reports ZCCL_IN_PROGRESS until it is done, and every operation on the communicator
 * returns ZCCL_IN_PROGRESS meanwhile (zccl__comm_ready). Also zccl_comm_finalize.
 *
 * The handle returned at once is the communicator's own struct (zccl__comm_init_into fills it in place), so
 * nothing moves when creation completes; the state word nb_state is written last, with release order, and read
 * with acquire order by every entry point.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api.h"
#include "stream.h"

/* The fields a caller compiled against the first zccl_config_t layout has (size covers at least these). */
#define CONFIG_MIN_SIZE (offsetof(zccl_config_t, split_share) + sizeof(int))

/* Validates config (NULL: defaults) into the effective values. */
static zccl_result_t read_config(const char *fn, const zccl_config_t *config, int *blocking, const char **name) {
    *blocking = 1;
    *name = NULL;
    if (!config) return ZCCL_SUCCESS;
    if (config->size < CONFIG_MIN_SIZE || config->size > (1u << 20))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: config field 'size' = %zu is not the size of a zccl_config_t "
                           "(%zu here; start from ZCCL_CONFIG_INITIALIZER)", fn, config->size, sizeof(zccl_config_t));
    if (config->magic != ZCCL_CONFIG_MAGIC)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: config field 'magic' = 0x%08x is not 0x%08x (start from "
                           "ZCCL_CONFIG_INITIALIZER)", fn, config->magic, (unsigned)ZCCL_CONFIG_MAGIC);
    if (config->version > ZCCL_VERSION_CODE)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: config field 'version' = %u is newer than this library (%d)",
                           fn, config->version, ZCCL_VERSION_CODE);
    if (config->blocking != 0 && config->blocking != 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: config field 'blocking' = %d must be 0 or 1", fn,
                           config->blocking);
    if (config->split_share != 0 && config->split_share != 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: config field 'split_share' = %d must be 0 or 1 (reserved)", fn,
                           config->split_share);
    *blocking = config->blocking;
    *name = config->comm_name;
    return ZCCL_SUCCESS;
}

/* The communicator whose non-blocking creation this thread runs: creation itself runs collectives on it. */
static _Thread_local struct zccl_comm *creating;

zccl_result_t zccl__comm_ready(zccl_comm_t comm, const char *fn) {
    const int st = __atomic_load_n(&comm->nb_state, __ATOMIC_ACQUIRE);
    if (st == ZCCL_SUCCESS) return ZCCL_SUCCESS;
    if (st == ZCCL_IN_PROGRESS) return creating == comm ? ZCCL_SUCCESS : ZCCL_IN_PROGRESS; /* not an error */
    return zccl__error((zccl_result_t)st, "%s: the communicator's non-blocking creation failed: %s", fn, comm->nb_msg);
}

bool zccl__comm_settle(struct zccl_comm *comm) {
    if (comm->nb_thread_running) {
        pthread_join(comm->nb_thread, NULL);
        comm->nb_thread_running = false;
    }
    if (comm->keep_shell && __atomic_load_n(&comm->nb_state, __ATOMIC_ACQUIRE) != ZCCL_SUCCESS) {
        free(comm);
        return true;
    }
    comm->keep_shell = false; /* a complete communicator: destroy frees all of it */
    return false;
}

typedef struct {
    struct zccl_comm *comm;
    int nranks, rank;
    zccl_id_info_t id;
} nb_job_t;

static void *nb_main(void *arg) {
    nb_job_t *j = arg;
    struct zccl_comm *comm = j->comm;
    const char *old = zccl__log_set_tag(comm->name);
    zccl_comm_t out = NULL;
    creating = comm;
    zccl_result_t res = zccl__comm_init_into(comm, &out, j->nranks, &j->id, j->rank);
    creating = NULL;
    if (res != ZCCL_SUCCESS) snprintf(comm->nb_msg, sizeof comm->nb_msg, "%s", zccl__last_error());
    zccl__log_set_tag(old);
    __atomic_store_n(&comm->nb_state, (int)res, __ATOMIC_RELEASE);
    free(j);
    return NULL;
}

ZCCL_API zccl_result_t zccl_comm_init_rank_config(zccl_comm_t *comm, int nranks, zccl_unique_id_t id, int rank,
                                                  const zccl_config_t *config) {
    const char *fn = "zccl_comm_init_rank_config";
    zccl__log_init();
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    *comm = NULL;
    int blocking;
    const char *name;
    ZCCL_CHECK(read_config(fn, config, &blocking, &name));
    if (nranks < 1 || nranks > 65536)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'nranks' = %d is outside [1, 65536]", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'rank' = %d is outside [0, nranks-1 = %d]", fn, rank,
                           nranks - 1);
    zccl_id_info_t info;
    ZCCL_CHECK(zccl__id_decode(&id, &info));
    struct zccl_comm *c = calloc(1, sizeof *c);
    if (!c) return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for a communicator", fn);
    if (name) snprintf(c->name, sizeof c->name, "%s", name);
    c->nonblocking = !blocking;
    if (blocking) {
        const char *old = zccl__log_set_tag(c->name);
        zccl_result_t res = zccl__comm_init_into(c, comm, nranks, &info, rank); /* frees c on failure */
        zccl__log_set_tag(old);
        return res;
    }
    nb_job_t *j = malloc(sizeof *j);
    if (!j) {
        free(c);
        return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory", fn);
    }
    *j = (nb_job_t){c, nranks, rank, info};
    c->keep_shell = true; /* a failed creation leaves the handle, for zccl_comm_get_async_error and destroy */
    c->nb_state = ZCCL_IN_PROGRESS;
    c->rank = c->tc.rank = rank;
    c->nranks = c->tc.nranks = nranks;
    int rc = pthread_create(&c->nb_thread, NULL, nb_main, j);
    if (rc != 0) {
        free(j);
        free(c);
        return zccl__syserror(rc, "%s: cannot start the thread of a non-blocking creation", fn);
    }
    c->nb_thread_running = true;
    *comm = c;
    return ZCCL_IN_PROGRESS;
}

ZCCL_API zccl_result_t zccl_comm_split_config(zccl_comm_t comm, int color, int key, zccl_comm_t *newcomm,
                                              const zccl_config_t *config) {
    const char *fn = "zccl_comm_split_config";
    if (newcomm) *newcomm = NULL;
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    ZCCL_CHECK(zccl__comm_ready(comm, fn));
    int blocking;
    const char *name;
    ZCCL_CHECK(read_config(fn, config, &blocking, &name));
    if (!config) blocking = !comm->nonblocking;
    ZCCL_CHECK(zccl_comm_split(comm, color, key, newcomm));
    if (*newcomm) {
        if (name) snprintf((*newcomm)->name, sizeof (*newcomm)->name, "%s", name);
        (*newcomm)->nonblocking = !blocking;
    }
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_comm_finalize(zccl_comm_t comm) {
    const char *fn = "zccl_comm_finalize";
    if (!comm) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument 'comm' is NULL", fn);
    if (comm->nb_thread_running) { /* wait for a non-blocking creation */
        pthread_join(comm->nb_thread, NULL);
        comm->nb_thread_running = false;
    }
    ZCCL_CHECK(zccl__comm_ready(comm, fn));
    zccl__stream_wait_comm(comm); /* every queued operation of comm has run */
    pthread_mutex_lock(&comm->exec_mutex); /* and none runs on another thread */
    pthread_mutex_unlock(&comm->exec_mutex);
    zccl_result_t e = __atomic_load_n(&comm->tc.async_error, __ATOMIC_ACQUIRE);
    if (e != ZCCL_SUCCESS)
        return zccl__error(e, "%s: the communicator is broken: %s", fn, comm->async_msg);
    return ZCCL_SUCCESS;
}

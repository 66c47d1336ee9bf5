/*
 * api.h — what the API layer's files share: creating a communicator (init, split and shrink all end in
 * zccl__comm_init) and releasing one with everything the layers below attached to it.
 */
#ifndef ZCCL_API_H
#define ZCCL_API_H

#include "bootstrap.h"
#include "comm.h"

/** Creates this rank's communicator of nranks ranks from a decoded unique id (lib/api/comm_init.c). */
zccl_result_t zccl__comm_init(zccl_comm_t *out, int nranks, const zccl_id_info_t *id, int rank);
/** Frees a communicator and its tuner (zccl__comm_free frees the core's part). */
void zccl__comm_release(struct zccl_comm *comm);

/** The first host of a Slurm node list ("node[01-04],x" -> "node01"); 0, or -1 if malformed or longer than len. */
int zccl__slurm_first_host(const char *list, char *out, size_t len);

/** Prints, once per job, the unknown ZCCL_* names (stderr) and the NCCL_* ones read or ignored (INFO)
 *  (config_check.c). */
void zccl__config_warn_unknown(void);

#endif

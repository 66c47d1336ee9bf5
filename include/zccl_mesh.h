/*
 * zccl_mesh.h — a named N-dimensional mesh over a communicator (3D parallelism: data x pipeline x tensor), one
 * communicator per dimension for each rank. Built on zccl_comm_split; docs/zero.md, "The mesh".
 *
 * Layout. The world's ranks are ordered by host (hosts in the order of their lowest rank; zccl's host identity:
 * hostname and boot id, the one that decides shared memory), then by rank; mesh position m of that order has the
 * coordinates of m in row-major order over the dimensions as given, the LAST dimension fastest. So the last
 * (innermost) dimensions are made of ranks next to each other on one host: with dims {"dp", "pp", "tp"} the tp groups
 * are consecutive ranks of one host and dp, the outermost, spans hosts — as Megatron-LM and the ZeRO++ paper place
 * tensor parallelism inside a node and data parallelism across nodes. The group of a rank along dimension d is the
 * set of ranks whose coordinates differ from its own only in d; its rank in that group's communicator is its
 * coordinate d.
 * Refusals: a shape whose sizes do not multiply to the world size, and (unless ZCCL_MESH_ALLOW_CROSS_HOST) one whose
 * innermost groups would contain ranks of two hosts; the message names the shape ("dp=2 x tp=3") and the group.
 */
#ifndef ZCCL_MESH_H
#define ZCCL_MESH_H

#include <stddef.h>
#include "zccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/** At most this many dimensions. */
#define ZCCL_MESH_MAX_DIMS 8
/** Longest dimension name, without the NUL. */
#define ZCCL_MESH_NAME_MAX 15
/** flags: allow an innermost group to span hosts (otherwise refused). */
#define ZCCL_MESH_ALLOW_CROSS_HOST 1

typedef struct zccl_mesh *zccl_mesh_t;

/**
 * Splits comm into the mesh. Collective over every rank of comm (one all-gather of each rank's host identity and a
 * hash of its arguments, then one zccl_comm_split per dimension), called in the same order as comm's collectives.
 * @param ndims  1..ZCCL_MESH_MAX_DIMS.
 * @param names  ndims distinct names, 1..ZCCL_MESH_NAME_MAX characters each, outermost first (e.g. "dp","pp","tp").
 * @param sizes  ndims sizes >= 1, product == the size of comm. Copied; need not outlive the call.
 * @param flags  0 or ZCCL_MESH_ALLOW_CROSS_HOST.
 * @param[out] mesh  the mesh (zccl_mesh_destroy); NULL on failure.
 * Errors, the same on every rank (each rank checks the gathered arguments of all): ZCCL_INVALID_ARGUMENT naming the
 * argument (comm/mesh/names/sizes NULL, ndims out of range, a name empty, too long or repeated, a size < 1; the other
 * ranks get ZCCL_INVALID_USAGE naming that rank), the shape that does not multiply to the world size, or the
 * innermost group that spans hosts (naming both hosts' ranks); ZCCL_INVALID_USAGE when ranks pass different
 * shapes; the errors of zccl_allgather and zccl_comm_split.
 */
zccl_result_t zccl_mesh_create(zccl_comm_t comm, int ndims, const char *const *names, const int *sizes, int flags,
                               zccl_mesh_t *mesh);

/** This rank's communicator along dimension `name` (owned by the mesh: do not destroy it), its coordinate there (its
 *  rank in that communicator) may be read with zccl_comm_rank. Errors: ZCCL_INVALID_ARGUMENT (NULL, unknown name). */
zccl_result_t zccl_mesh_comm(zccl_mesh_t mesh, const char *name, zccl_comm_t *dimcomm);

/** This rank's coordinate along dimension `name`. Errors: ZCCL_INVALID_ARGUMENT (NULL, unknown name). */
zccl_result_t zccl_mesh_coord(zccl_mesh_t mesh, const char *name, int *coord);

/** Destroys the per-dimension communicators (not the parent) and the mesh. NULL: nothing. */
zccl_result_t zccl_mesh_destroy(zccl_mesh_t mesh);

/**
 * The layout alone, without communication (zccl-topo --mesh and tests use it): host_of[r] is any integer naming rank
 * r's host (nranks entries). On success coords[r*ndims + d] is rank r's coordinate along dimension d. On refusal the
 * reason goes to why (len bytes, may be NULL) and the result is ZCCL_INVALID_ARGUMENT.
 */
zccl_result_t zccl_mesh_layout(int nranks, const int *host_of, int ndims, const char *const *names, const int *sizes,
                               int flags, int *coords, char *why, size_t len);

#ifdef __cplusplus
}
#endif
#endif

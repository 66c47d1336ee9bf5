/*
 * mesh.c — zccl_mesh_create and its accessors (include/zccl_mesh.h). One all-gather tells every rank every rank's
 * host and a hash of its arguments, so that every rank decides the same thing (refuse, or the same layout); then one
 * zccl_comm_split per dimension, with the ranks that share every other coordinate as one color.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"
#include "zccl_ext.h"
#include "zccl_mesh.h"

struct zccl_mesh {
    int ndims;
    char names[ZCCL_MESH_MAX_DIMS][ZCCL_MESH_NAME_MAX + 1];
    int coord[ZCCL_MESH_MAX_DIMS];
    zccl_comm_t comms[ZCCL_MESH_MAX_DIMS];
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

ZCCL_API zccl_result_t zccl_mesh_create(zccl_comm_t comm, int ndims, const char *const *names, const int *sizes,
                                        int flags, zccl_mesh_t *mesh) {
    const char *fn = "zccl_mesh_create";
    if (mesh) *mesh = NULL;
    if (!comm || !mesh) return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: argument '%s' is NULL", fn, comm ? "mesh" : "comm");
    int n, me;
    ZCCL_CHECK(zccl_comm_count(comm, &n));
    ZCCL_CHECK(zccl_comm_rank(comm, &me));
    /* The arguments alone (one host, any host layout allowed): what this rank can check before it knows the others. */
    char why[512] = "";
    int *zeros = calloc((size_t)n, sizeof *zeros), *coords = malloc((size_t)n * ZCCL_MESH_MAX_DIMS * sizeof *coords);
    uint64_t *all = malloc((size_t)n * 3 * sizeof *all);
    if (!zeros || !coords || !all) {
        free(zeros);
        free(coords);
        free(all);
        return zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory for %d ranks", fn, n);
    }
    const bool valid = (flags & ~ZCCL_MESH_ALLOW_CROSS_HOST) == 0 &&
                       zccl_mesh_layout(n, zeros, ndims, names, sizes, ZCCL_MESH_ALLOW_CROSS_HOST, coords, why,
                                        sizeof why) == ZCCL_SUCCESS;
    if (valid == false && !why[0]) snprintf(why, sizeof why, "argument 'flags' = %d is not 0 or ZCCL_MESH_ALLOW_CROSS_HOST", flags);
    uint64_t h = 1469598103934665603ull;
    if (valid) {
        h = fnv(h, &ndims, sizeof ndims);
        h = fnv(h, &flags, sizeof flags);
        for (int d = 0; d < ndims; d++) {
            h = fnv(h, names[d], strlen(names[d]) + 1);
            h = fnv(h, &sizes[d], sizeof sizes[d]);
        }
    }
    const uint64_t mine[3] = {zccl__host_hash(), h, valid ? 1u : 0u};
    zccl_result_t res = zccl_allgather(mine, all, 3, ZCCL_UINT64, comm, NULL);
    if (res == ZCCL_SUCCESS && !valid) res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: %s", fn, why);
    for (int r = 0; r < n && res == ZCCL_SUCCESS; r++)
        if (!all[3 * r + 2])
            res = zccl__error(ZCCL_INVALID_USAGE, "%s: rank %d passed invalid mesh arguments (its own error names "
                              "them), so no rank builds the mesh", fn, r);
    for (int r = 1; r < n && res == ZCCL_SUCCESS; r++)
        if (all[3 * r + 1] != all[1])
            res = zccl__error(ZCCL_INVALID_USAGE, "%s: rank %d passed a different mesh (names, sizes or flags) from "
                              "rank 0's; every rank must pass the same", fn, r);
    /* Hosts as the lowest rank of each (zccl's host identity). */
    for (int r = 0; r < n && res == ZCCL_SUCCESS; r++) {
        zeros[r] = r;
        for (int q = 0; q < r; q++)
            if (all[3 * q] == all[3 * r]) {
                zeros[r] = q;
                break;
            }
    }
    if (res == ZCCL_SUCCESS &&
        zccl_mesh_layout(n, zeros, ndims, names, sizes, flags, coords, why, sizeof why) != ZCCL_SUCCESS)
        res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s: %s", fn, why);
    struct zccl_mesh *m = NULL;
    if (res == ZCCL_SUCCESS && !(m = calloc(1, sizeof *m)))
        res = zccl__error(ZCCL_SYSTEM_ERROR, "%s: out of memory", fn);
    if (res == ZCCL_SUCCESS) {
        m->ndims = ndims;
        for (int d = 0; d < ndims; d++) {
            snprintf(m->names[d], sizeof m->names[d], "%s", names[d]);
            m->coord[d] = coords[me * ndims + d];
        }
        /* Along dimension d, the color is this rank's position over the other dimensions (row-major). */
        for (int d = 0; d < ndims && res == ZCCL_SUCCESS; d++) {
            int color = 0;
            for (int e = 0; e < ndims; e++)
                if (e != d) color = color * sizes[e] + m->coord[e];
            res = zccl_comm_split(comm, color, m->coord[d], &m->comms[d]);
        }
        if (res != ZCCL_SUCCESS) {
            zccl_mesh_destroy(m);
            m = NULL;
        }
    }
    free(zeros);
    free(coords);
    free(all);
    *mesh = m;
    return res;
}

static int dim_of(const struct zccl_mesh *m, const char *name) {
    for (int d = 0; d < m->ndims; d++)
        if (!strcmp(m->names[d], name)) return d;
    return -1;
}

ZCCL_API zccl_result_t zccl_mesh_comm(zccl_mesh_t mesh, const char *name, zccl_comm_t *dimcomm) {
    if (!mesh || !name || !dimcomm)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mesh_comm: argument '%s' is NULL",
                           !mesh ? "mesh" : !name ? "name" : "dimcomm");
    const int d = dim_of(mesh, name);
    if (d < 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mesh_comm: the mesh has no dimension named '%s'", name);
    *dimcomm = mesh->comms[d];
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_mesh_coord(zccl_mesh_t mesh, const char *name, int *coord) {
    if (!mesh || !name || !coord)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mesh_coord: argument '%s' is NULL",
                           !mesh ? "mesh" : !name ? "name" : "coord");
    const int d = dim_of(mesh, name);
    if (d < 0) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mesh_coord: the mesh has no dimension named '%s'", name);
    *coord = mesh->coord[d];
    return ZCCL_SUCCESS;
}

ZCCL_API zccl_result_t zccl_mesh_destroy(zccl_mesh_t mesh) {
    if (!mesh) return ZCCL_SUCCESS;
    zccl_result_t res = ZCCL_SUCCESS;
    for (int d = 0; d < mesh->ndims; d++)
        if (mesh->comms[d]) {
            const zccl_result_t r = zccl_comm_destroy(mesh->comms[d]);
            if (res == ZCCL_SUCCESS) res = r;
        }
    free(mesh);
    return res;
}

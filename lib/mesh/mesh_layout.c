/*
 * mesh_layout.c — where each rank sits in a named mesh (include/zccl_mesh.h, "Layout"): ranks ordered by host, then
 * by rank, mapped row-major onto the dimensions with the last one fastest; the checks that refuse a shape.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"
#include "zccl_mesh.h"

/* "dp=2 x pp=1 x tp=4" */
static void shape_text(int ndims, const char *const *names, const int *sizes, char *out, size_t len) {
    size_t o = 0;
    out[0] = '\0';
    for (int d = 0; d < ndims && o < len; d++)
        o += (size_t)snprintf(out + o, len - o, "%s%s=%d", d ? " x " : "", names[d], sizes[d]);
}

/* Host number of rank r, counting hosts in the order of their lowest rank (hostrank[q]: the lowest rank of q's host). */
static int host_index(const int *hostrank, int nranks, int r) {
    int h = 0;
    for (int q = 0; q < hostrank[r] && q < nranks; q++) h += hostrank[q] == q;
    return h;
}
static zccl_result_t refuse(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static zccl_result_t refuse(char *why, size_t len, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (why && len) snprintf(why, len, "%s", buf);
    return ZCCL_INVALID_ARGUMENT;
}

ZCCL_API zccl_result_t zccl_mesh_layout(int nranks, const int *host_of, int ndims, const char *const *names,
                                        const int *sizes, int flags, int *coords, char *why, size_t len) {
    if (nranks < 1 || !host_of || !coords) return refuse(why, len, "zccl_mesh_layout: nranks < 1 or a NULL array");
    if (ndims < 1 || ndims > ZCCL_MESH_MAX_DIMS)
        return refuse(why, len, "argument 'ndims' = %d is outside [1, %d]", ndims, ZCCL_MESH_MAX_DIMS);
    if (!names || !sizes) return refuse(why, len, "argument '%s' is NULL", names ? "sizes" : "names");
    for (int d = 0; d < ndims; d++) {
        if (!names[d] || !names[d][0] || strlen(names[d]) > ZCCL_MESH_NAME_MAX)
            return refuse(why, len, "argument 'names[%d]' is NULL, empty or longer than %d characters", d,
                          ZCCL_MESH_NAME_MAX);
        for (int e = 0; e < d; e++)
            if (!strcmp(names[d], names[e]))
                return refuse(why, len, "argument 'names': dimension '%s' is named twice (%d and %d)", names[d], e, d);
        if (sizes[d] < 1) return refuse(why, len, "argument 'sizes[%d]' (%s) = %d is not >= 1", d, names[d], sizes[d]);
    }
    char shape[256];
    shape_text(ndims, names, sizes, shape, sizeof shape);
    double prod = 1; /* exact up to 2^53, and a larger product differs from nranks anyway */
    for (int d = 0; d < ndims; d++) prod *= sizes[d];
    if (prod != (double)nranks)
        return refuse(why, len, "mesh shape %s has %.0f ranks, but the communicator has %d: the sizes must multiply "
                      "to the world size", shape, prod, nranks);
    /* order[m]: the rank at mesh position m — hosts in the order of their lowest rank, ranks ascending within. */
    int *order = malloc((size_t)nranks * sizeof *order), *hostrank = malloc((size_t)nranks * sizeof *hostrank);
    if (!order || !hostrank) {
        free(order);
        free(hostrank);
        return refuse(why, len, "out of memory for a mesh of %d ranks", nranks);
    }
    int m = 0;
    for (int r = 0; r < nranks; r++) hostrank[r] = -1;
    for (int r = 0; r < nranks; r++) {
        if (hostrank[r] >= 0) continue;
        for (int q = r; q < nranks; q++)
            if (host_of[q] == host_of[r]) {
                hostrank[q] = r; /* the host's lowest rank names it in messages */
                order[m++] = q;
            }
    }
    const int inner = sizes[ndims - 1];
    zccl_result_t res = ZCCL_SUCCESS;
    if (!(flags & ZCCL_MESH_ALLOW_CROSS_HOST))
        for (int g = 0; g < nranks && res == ZCCL_SUCCESS; g += inner)
            for (int k = 1; k < inner; k++)
                if (host_of[order[g + k]] != host_of[order[g]]) {
                    res = refuse(why, len, "mesh shape %s would put the %s group of ranks %d..%d (mesh positions) "
                                 "across hosts: rank %d is on host %d, rank %d on host %d (hosts numbered by their "
                                 "lowest rank: the hosts of ranks %d and %d); choose an innermost size that divides "
                                 "every host's rank count, or allow it (ZCCL_MESH_ALLOW_CROSS_HOST; zccl-topo: "
                                 "--mesh-allow-cross-host)", shape, names[ndims - 1], g, g + inner - 1, order[g],
                                 host_index(hostrank, nranks, order[g]), order[g + k],
                                 host_index(hostrank, nranks, order[g + k]), hostrank[order[g]],
                                 hostrank[order[g + k]]);
                    break;
                }
    if (res == ZCCL_SUCCESS)
        for (int p = 0; p < nranks; p++) {
            int rest = p;
            for (int d = ndims - 1; d >= 0; d--) {
                coords[order[p] * ndims + d] = rest % sizes[d];
                rest /= sizes[d];
            }
        }
    free(order);
    free(hostrank);
    return res;
}

/*
 * calldesc.c — printing a call descriptor (calldesc.h) for error messages.
 */
#include "calldesc.h"
#include <stdio.h>
#include "schedule.h"

static const char *coll_names[ZCCL_COLL_COUNT] = {"zccl_allreduce", "zccl_reduce_scatter", "zccl_allgather",
                                                  "zccl_broadcast", "zccl_reduce", "zccl_send", "zccl_recv",
                                                  "zccl_alltoall", "zccl_alltoallv", "zccl_gather", "zccl_scatter"};
static const char *dt_names[ZCCL_NUM_TYPES] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                                               "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
static const char *op_names[ZCCL_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

void zccl__desc_describe(const zccl_call_desc_t *d, uint64_t seq_base, char *buf, size_t len) {
    const unsigned long long shown = zccl__seq_after(d->seq, seq_base);
    const char *name = (d->flags & ZCCL_DESC_BARRIER) ? "zccl_barrier"
                       : d->coll < ZCCL_COLL_COUNT && coll_names[d->coll] ? coll_names[d->coll]
                                                      : "?";
    if (d->flags & ZCCL_DESC_BARRIER) {
        snprintf(buf, len, "#%llu zccl_barrier()", shown);
        return;
    }
    char op[24] = "", root[24] = "";
    if (d->op != 0xff) snprintf(op, sizeof op, ", op %s", d->op < ZCCL_NUM_OPS ? op_names[d->op] : "?");
    if (d->root >= 0) snprintf(root, sizeof root, ", root %d", (int)d->root);
    snprintf(buf, len, "#%llu %s%s(count %llu, %s%s%s)%s", shown, name, d->vhash ? "_v" : "",
             (unsigned long long)d->count, d->dt < ZCCL_NUM_TYPES && dt_names[d->dt] ? dt_names[d->dt] : "?", op, root,
             (d->flags & ZCCL_DESC_DEVICE) ? " on device memory" : "");
}

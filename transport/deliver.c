/*
 * deliver.c — where received bytes enter a collective: copied into the destination, or reduced with the second
 * operand straight from the transport's buffer (no extra pass over memory). Every transport calls it.
 */
#include <string.h>
#include "kernels.h"
#include "transport.h"

/* Receives at least this large stream into their destination with non-temporal stores: the user's buffer is bigger
 * than the cache and is not read again by this copy, so the read-for-ownership of every line would only waste
 * memory bandwidth. */
#define ZCCL_STREAM_COPY_MIN (4u << 20)

void zccl__xfer_deliver(zccl_xfer_t *x, const void *data, size_t len) {
    if (x->op2) {
        const size_t es = zccl_type_size(x->dt);
        zccl_kernel_reduce(x->dst + x->done, x->op2 + x->done, data, len / es, x->dt, x->op, x->divisor);
    } else if (x->dst + x->done != data) {
        if (x->bytes >= ZCCL_STREAM_COPY_MIN) zccl_kernel_copy_stream(x->dst + x->done, data, len);
        else zccl_kernel_copy(x->dst + x->done, data, len);
    }
    x->done += len;
}

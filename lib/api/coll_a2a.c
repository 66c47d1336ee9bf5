/* coll_a2a.c — public entry points of all-to-all, all-to-allv, gather and scatter. */
#include "core.h"

ZCCL_API zccl_result_t zccl_alltoall(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                     zccl_comm_t comm, zccl_stream_t stream) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_alltoall: not implemented yet");
}

ZCCL_API zccl_result_t zccl_alltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                                      void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                                      zccl_datatype_t datatype, zccl_comm_t comm, zccl_stream_t stream) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_alltoallv: not implemented yet");
}

ZCCL_API zccl_result_t zccl_gather(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                   int root, zccl_comm_t comm, zccl_stream_t stream) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_gather: not implemented yet");
}

ZCCL_API zccl_result_t zccl_scatter(const void *sendbuf, void *recvbuf, size_t count, zccl_datatype_t datatype,
                                    int root, zccl_comm_t comm, zccl_stream_t stream) {
    return zccl__error(ZCCL_INVALID_USAGE, "zccl_scatter: not implemented yet");
}

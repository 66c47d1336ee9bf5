/*
 * compose.hpp — collectives that zccl's C API does not have yet (all-to-all, gather, scatter), built from its
 * blocking zccl_send/zccl_recv. Each is one function so that it can be replaced by the native call
 * (zccl_alltoall, zccl_gather, zccl_scatter, group calls) when those land in include/zccl.h.
 *
 * Everything here moves bytes (ZCCL_UINT8): the callers pass byte counts and byte displacements, so any tensor
 * dtype can travel. No torch headers: this file sees only zccl.h.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <zccl.h>

namespace zccl_torch {

/*
 * All-to-all with per-peer byte counts (MPI_Alltoallv). send_bytes[p] bytes from sendbuf + send_displ[p] go to
 * peer p, which stores them at its recvbuf + recv_displ[me]; the block for this rank itself is copied locally.
 * Returns the first failing zccl call's result (its message stays in zccl_get_last_error on this thread).
 */
zccl_result_t compose_alltoallv(zccl_comm_t comm, const void *sendbuf, const size_t *send_bytes,
                                const size_t *send_displ, void *recvbuf, const size_t *recv_bytes,
                                const size_t *recv_displ);

/* Gather: root receives `bytes` bytes from every rank r into recvbufs[r] (recvbufs read on the root only; the
 * root's own block is copied locally). */
zccl_result_t compose_gather(zccl_comm_t comm, const void *sendbuf, size_t bytes, void *const *recvbufs, int root);

/* Scatter: rank r receives `bytes` bytes from the root's sendbufs[r] (sendbufs read on the root only). */
zccl_result_t compose_scatter(zccl_comm_t comm, const void *const *sendbufs, size_t bytes, void *recvbuf, int root);

} // namespace zccl_torch

/*
 * compose.cpp — all-to-all, gather and scatter from zccl_send/zccl_recv (see compose.hpp).
 *
 * zccl's send of a large message blocks until the peer posts the matching receive, so the order of the calls
 * decides whether a pattern deadlocks. All-to-all runs n-1 rounds; in round k rank r sends to (r+k) mod n and
 * receives from (r-k) mod n. Inside a round the ranks form cycles of the permutation r -> r+k; a rank sends first
 * unless its destination is below it (the cycle wraps there), in which case it receives first. Every cycle has at
 * least one rank of each kind (its smallest member sends first, its largest receives first), so every chain of
 * waiting ranks ends at a rank whose partner is ready: no round can deadlock, and rounds follow one another.
 */
#include "compose.hpp"

#include <cstring>

namespace zccl_torch {

namespace {

zccl_result_t send_bytes_to(zccl_comm_t comm, const void *buf, size_t bytes, int peer) {
    if (bytes == 0) return ZCCL_SUCCESS; /* both sides know the count: an empty block is not sent at all */
    return zccl_send(buf, bytes, ZCCL_UINT8, peer, comm, nullptr);
}

zccl_result_t recv_bytes_from(zccl_comm_t comm, void *buf, size_t bytes, int peer) {
    if (bytes == 0) return ZCCL_SUCCESS;
    return zccl_recv(buf, bytes, ZCCL_UINT8, peer, comm, nullptr);
}

} // namespace

zccl_result_t compose_alltoallv(zccl_comm_t comm, const void *sendbuf, const size_t *send_bytes,
                                const size_t *send_displ, void *recvbuf, const size_t *recv_bytes,
                                const size_t *recv_displ) {
    int n = 0, me = 0;
    zccl_result_t res = zccl_comm_count(comm, &n);
    if (res == ZCCL_SUCCESS) res = zccl_comm_rank(comm, &me);
    if (res != ZCCL_SUCCESS) return res;
    const char *src = static_cast<const char *>(sendbuf);
    char *dst = static_cast<char *>(recvbuf);
    if (send_bytes[me] > 0) std::memmove(dst + recv_displ[me], src + send_displ[me], send_bytes[me]);
    for (int k = 1; k < n; k++) {
        const int to = (me + k) % n;
        const int from = (me - k + n) % n;
        const bool send_first = to > me;
        if (send_first) res = send_bytes_to(comm, src + send_displ[to], send_bytes[to], to);
        if (res == ZCCL_SUCCESS) res = recv_bytes_from(comm, dst + recv_displ[from], recv_bytes[from], from);
        if (res == ZCCL_SUCCESS && !send_first) res = send_bytes_to(comm, src + send_displ[to], send_bytes[to], to);
        if (res != ZCCL_SUCCESS) return res;
    }
    return ZCCL_SUCCESS;
}

zccl_result_t compose_gather(zccl_comm_t comm, const void *sendbuf, size_t bytes, void *const *recvbufs, int root) {
    int n = 0, me = 0;
    zccl_result_t res = zccl_comm_count(comm, &n);
    if (res == ZCCL_SUCCESS) res = zccl_comm_rank(comm, &me);
    if (res != ZCCL_SUCCESS) return res;
    if (me != root) return send_bytes_to(comm, sendbuf, bytes, root);
    /* the root takes the blocks in rank order; every other rank makes exactly one send, so no cycle can form */
    for (int r = 0; r < n && res == ZCCL_SUCCESS; r++) {
        if (r == me) {
            if (bytes > 0 && recvbufs[r] != sendbuf) std::memmove(recvbufs[r], sendbuf, bytes);
        } else {
            res = recv_bytes_from(comm, recvbufs[r], bytes, r);
        }
    }
    return res;
}

zccl_result_t compose_scatter(zccl_comm_t comm, const void *const *sendbufs, size_t bytes, void *recvbuf, int root) {
    int n = 0, me = 0;
    zccl_result_t res = zccl_comm_count(comm, &n);
    if (res == ZCCL_SUCCESS) res = zccl_comm_rank(comm, &me);
    if (res != ZCCL_SUCCESS) return res;
    if (me != root) return recv_bytes_from(comm, recvbuf, bytes, root);
    for (int r = 0; r < n && res == ZCCL_SUCCESS; r++) {
        if (r == me) {
            if (bytes > 0 && sendbufs[r] != recvbuf) std::memmove(recvbuf, sendbufs[r], bytes);
        } else {
            res = send_bytes_to(comm, sendbufs[r], bytes, r);
        }
    }
    return res;
}

} // namespace zccl_torch

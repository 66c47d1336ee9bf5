/*
 * transport.h — the interface every transport implements: a const ops table plus the transfer descriptor the
 * progress engine hands it.
 *
 * A transport moves the bytes of one directed channel (this rank -> peer, or peer -> this rank). Channels are
 * FIFO: transfers between the same pair in the same direction complete in the order they were started, and the
 * engine starts them in schedule order on both sides, so no message carries a tag. Transports never block: each
 * progress() call does a bounded amount of work (about one chunk) and returns.
 */
#ifndef ZCCL_TRANSPORT_H
#define ZCCL_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core.h"

struct zccl_comm;

/** One send or receive in flight. The engine fills the first block; the transport owns `t`. */
typedef struct zccl_xfer {
    int peer;
    bool is_send;
    const uint8_t *src;   /* send: bytes to send */
    uint8_t *dst;         /* recv: where the result goes */
    const uint8_t *op2;   /* recv: second reduction operand (bytes aligned with dst), NULL = plain copy */
    size_t bytes;
    zccl_datatype_t dt;   /* recv with op2: how to reduce */
    zccl_redop_t op;
    uint32_t divisor;     /* >1: divide the reduced value (ZCCL_AVG's final step) */
    size_t done;          /* bytes sent (handed over) or delivered */
    bool complete;        /* send: the source buffer may be reused; recv: every byte delivered */
    bool started;         /* the transport has begun this transfer */
    uint64_t t[4];        /* transport-private state */
} zccl_xfer_t;

typedef struct zccl_transport_ops {
    const char *name;
    /** Comm-wide setup once every rank's info is known (map segments, probe capabilities). */
    zccl_result_t (*comm_setup)(struct zccl_comm *comm);
    /** Whether this transport can carry traffic between this rank and peer. */
    bool (*can_reach)(const struct zccl_comm *comm, int peer);
    /**
     * Advances x by about one chunk. Sets *progressed when anything moved, x->complete when finished.
     * Must only touch x if every earlier transfer on the same channel has completed (the engine ensures it).
     */
    zccl_result_t (*progress)(struct zccl_comm *comm, zccl_xfer_t *x, bool *progressed);
    /** A file descriptor to poll while waiting for x (POLLIN/POLLOUT in *events), or -1 if the transport wakes the
     *  rank's doorbell instead. */
    int (*wait_fd)(struct zccl_comm *comm, const zccl_xfer_t *x, short *events);
    /** Checks that peer is still alive. Called for every peer each time a sleeping rank wakes without progress
     *  (about every 50 ms), so it must be cheap; transports that cannot tell (TCP: loss shows as EOF) return success. */
    zccl_result_t (*check_peer)(struct zccl_comm *comm, int peer);
    /** Releases everything comm_setup created. */
    void (*comm_teardown)(struct zccl_comm *comm);
    /** Optional (NULL = never): whether peer left cleanly (destroyed its communicator after its last operation, so
     *  all it sent was delivered). The engine then does not count that peer's exit as a loss unless it still waits
     *  on a transfer with it. */
    bool (*departed)(const struct zccl_comm *comm, int peer);
    /** Optional (NULL = nothing to do): this rank gave up a collective after a lost peer or a timeout; make every
     *  peer that may still wait on it fail too instead of hanging (TCP: shut the connections down; shm: mark the
     *  inbox failed and wake the host's ranks). The listening socket stays, so zccl_comm_shrink still works. */
    void (*poison)(struct zccl_comm *comm);
} zccl_transport_ops_t;

extern const zccl_transport_ops_t zccl_transport_shm;
extern const zccl_transport_ops_t zccl_transport_tcp;
extern const zccl_transport_ops_t zccl_transport_ib; /* transport/ib.c; never reaches a peer when built without verbs */

/**
 * Hands `len` received bytes (a whole number of elements) to x at offset x->done: copies them to dst, or reduces
 * them with op2 into dst; then advances x->done. Shared by every transport so the reduction happens straight from
 * the transport's buffer, with no extra pass over memory.
 */
void zccl__xfer_deliver(zccl_xfer_t *x, const void *data, size_t len);

/**
 * Whether /dev/shm holds the inboxes of all ranks of this host: *need bytes (their total) against *avail (the least
 * free space any of them saw at start). Without room, ranks of one host talk over TCP instead.
 */
bool zccl__shm_room(const struct zccl_comm *comm, size_t *need, size_t *avail);

/** Whether process pid of this host has exited (gone, or a zombie not yet reaped). Defined in shm.c. */
bool zccl__local_pid_exited(int pid);

/** Wakes the given local rank's engine if it sleeps (shm doorbell; no-op for ranks without shm). */
void zccl__doorbell_ring(struct zccl_comm *comm, int peer);

#endif

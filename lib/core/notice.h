/*
 * notice.h — how a rank tells every peer, at once and with its reason, that it left a collective.
 *
 * A rank that refuses a call locally (an invalid argument on a valid communicator) or gives up a collective (a
 * mismatch it detected, a lost peer, a timeout) connects to every peer's connection service (the authenticated
 * listener every communicator has) and sends a notice: its rank, the collective's sequence number and its error
 * message. A peer that runs that collective or a later one fails with ZCCL_REMOTE_ERROR quoting the notice; a rank
 * that refused the same call itself ignores a "refused" notice (every rank refused: nothing moved). This works the
 * same over every transport, including a TCP connection that was never opened. See include/zccl.h, "Invalid calls".
 */
#ifndef ZCCL_NOTICE_H
#define ZCCL_NOTICE_H

#include <stdint.h>
#include "core.h"

struct zccl_comm;

#define ZCCL_NOTICE_REFUSED 1 /* the sender refused its call #seq locally: it did not take part */
#define ZCCL_NOTICE_GAVE_UP 2 /* the sender gave up call #seq: the communicator is broken from there on */
#define ZCCL_NOTICE_DEREG 3   /* the sender deregistered its region or allocation #seq: close the mapping of it */

/** Sent after a zccl_conn_hdr_t of kind ZCCL_CONN_NOTICE. */
typedef struct {
    uint64_t seq;
    int32_t kind;
    int32_t result;
    char text[496]; /* NUL-terminated */
} zccl_notice_msg_t;

/** Tells every peer, or only rank `only` when only >= 0 (bounded: about 2 s in all), and returns how many live peers
 *  it could not tell (logged; a refusal or give-up still reaches them through the transports' poison). Each peer has
 *  acted on the notice when it acknowledges it. */
int zccl__notice_send(struct zccl_comm *comm, int kind, uint64_t seq, const char *text, int only);
/** Records that this rank refused its call #seq (so the peers' "refused" notices for it are ignored). */
void zccl__notice_refused_here(struct zccl_comm *comm, uint64_t seq);
/** Service thread: reads the notice that follows a ZCCL_CONN_NOTICE header from `from` on fd (and closes fd). */
void zccl__notice_receive(struct zccl_comm *comm, int fd, int from);
/**
 * Whether a peer's notice applies to this rank's call #seq (a notice for #seq or an earlier call that this rank did
 * not refuse too): then ZCCL_REMOTE_ERROR naming the peer and quoting its reason; `what` names the call.
 * Cheap when no notice arrived since the last look (one atomic load).
 */
zccl_result_t zccl__notice_check(struct zccl_comm *comm, uint64_t seq, const char *what);
/** Frees the notices and the refusal record. */
void zccl__notice_free(struct zccl_comm *comm);

#endif

/*
 * doorbell.c — the wake-up word a waiting rank sleeps on (a futex). Peers on the same host ring it through the
 * shared-memory transport (zccl__doorbell_ring in shm.c); the communicator's service thread and zccl_comm_abort ring
 * this rank's own.
 */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "transport.h"

void zccl__doorbell_wait(zccl_tp_comm_t *comm, uint32_t seen, int timeout_ms) {
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, comm->doorbell, FUTEX_WAIT, seen, &ts, NULL, 0);
}

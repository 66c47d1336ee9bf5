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

uint32_t zccl__doorbell_announce(zccl_tp_comm_t *comm) {
    const uint32_t seen = __atomic_load_n(comm->doorbell, __ATOMIC_SEQ_CST);
    __atomic_store_n(comm->sleeping, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* pairs with the fence in zccl__doorbell_ring */
    return seen;
}

void zccl__doorbell_awake(zccl_tp_comm_t *comm) { __atomic_store_n(comm->sleeping, 0, __ATOMIC_SEQ_CST); }

void zccl__doorbell_wait(zccl_tp_comm_t *comm, uint32_t seen, int timeout_ms) {
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, comm->doorbell, FUTEX_WAIT, seen, &ts, NULL, 0);
}

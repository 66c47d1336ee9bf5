/*
 * doorbell.c — the wake-up word a waiting rank sleeps on (a futex). Peers on the same host ring it through the
 * shared-memory transport (zccl__doorbell_ring in shm.c); the communicator's service thread and zccl_comm_abort ring
 * this rank's own.
 */
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "transport.h"

uint32_t zccl__doorbell_announce(zccl_tp_comm_t *comm) {
    const uint32_t seen = __atomic_load_n(comm->doorbell, __ATOMIC_SEQ_CST);
    __atomic_store_n(comm->sleeping, comm->wait_yield ? 2u : 1u, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* pairs with the fence in zccl__doorbell_ring */
    return seen;
}

void zccl__doorbell_awake(zccl_tp_comm_t *comm) { __atomic_store_n(comm->sleeping, 0, __ATOMIC_SEQ_CST); }

void zccl__doorbell_wait(zccl_tp_comm_t *comm, uint32_t seen, int timeout_ms) {
    if (comm->wait_yield) {
        /* Stay runnable: a descheduled peer gets the core now, and this rank runs again as soon as the scheduler
         * comes back to it, without a wake-up to wait for. The clock is read every 16 looks. A wait longer than
         * ZCCL_YIELD_MAX_US is for a peer busy with bulk work or elsewhere: sleep on the futex for the rest, so that a
         * waiting rank does not keep taking turns on the core its peer works on. */
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        const int64_t yield_us = (int64_t)timeout_ms * 1000 < ZCCL_YIELD_MAX_US ? (int64_t)timeout_ms * 1000
                                                                                 : ZCCL_YIELD_MAX_US;
        int64_t us = 0;
        for (unsigned i = 1; __atomic_load_n(comm->doorbell, __ATOMIC_ACQUIRE) == seen; i++) {
            sched_yield();
            if ((i & 15) == 0) {
                clock_gettime(CLOCK_MONOTONIC, &t);
                us = (int64_t)(t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000;
                if (us >= yield_us) break;
            }
        }
        if (us < yield_us || us >= (int64_t)timeout_ms * 1000) return;
        /* From here a peer must wake us: say so, then sleep unless the word moved (zccl__doorbell_ring reads
         * `sleeping` again after its bump, so a peer that saw 2 before this store still wakes us). */
        __atomic_store_n(comm->sleeping, 1u, __ATOMIC_SEQ_CST);
        timeout_ms -= (int)(us / 1000);
    }
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, comm->doorbell, FUTEX_WAIT, seen, &ts, NULL, 0);
}

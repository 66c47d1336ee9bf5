/*
 * registry.c — the transports of this build, in order of preference, and the per-communicator state slots.
 * Adding a transport is one file with its ops table and one row here (docs/architecture.md, "Add a transport").
 */
#include <strings.h>
#include "transport.h"

extern const zccl_transport_ops_t zccl_transport_shm, zccl_transport_ib, zccl_transport_tcp;

const zccl_transport_ops_t *const zccl__transports[] = {
    &zccl_transport_shm, /* same host, shared memory */
    &zccl_transport_ib,  /* verbs (reaches nobody when built without libibverbs) */
    &zccl_transport_tcp, /* everything else */
    NULL,
};

const zccl_transport_ops_t *zccl__transport_by_name(const char *name) {
    for (size_t t = 0; zccl__transports[t]; t++)
        if (!strcasecmp(name, zccl__transports[t]->name)) return zccl__transports[t];
    return NULL;
}

void zccl__tp_set_state(zccl_tp_comm_t *tc, const zccl_transport_ops_t *ops, void *state) {
    for (int i = 0; i < ZCCL_TRANSPORT_MAX; i++)
        if (tc->priv[i].ops == ops) {
            tc->priv[i].state = state;
            if (!state) tc->priv[i].ops = NULL;
            return;
        }
    if (!state) return;
    for (int i = 0; i < ZCCL_TRANSPORT_MAX; i++)
        if (!tc->priv[i].ops) {
            tc->priv[i].ops = ops;
            tc->priv[i].state = state;
            return;
        }
}

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
_Static_assert(sizeof zccl__transports / sizeof zccl__transports[0] <= ZCCL_TRANSPORT_MAX + 1,
               "more transports than zccl_tp_comm_t has state slots");

const zccl_transport_ops_t *zccl__transport_by_name(const char *name) {
    for (size_t t = 0; zccl__transports[t]; t++)
        if (!strcasecmp(name, zccl__transports[t]->name)) return zccl__transports[t];
    return NULL;
}

int zccl__tp_slot(const zccl_transport_ops_t *ops) {
    for (int t = 0; t < ZCCL_TRANSPORT_MAX && zccl__transports[t]; t++)
        if (zccl__transports[t] == ops) return t;
    return -1;
}

void zccl__tp_set_state(zccl_tp_comm_t *tc, const zccl_transport_ops_t *ops, void *state) {
    const int i = zccl__tp_slot(ops);
    if (i >= 0) __atomic_store_n(&tc->priv[i], state, __ATOMIC_RELEASE);
}

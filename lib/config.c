/*
 * config.c — the one table of ZCCL_* environment settings. Every setting the library reads is listed here with
 * its default and a one-line description; `zccl-bench --env` prints the table with the values in force.
 * `.nccl` names NCCL's variable of the same meaning and value grammar: a job set up for NCCL keeps its settings,
 * the ZCCL_* name winning when both are set. NCCL variables without such a counterpart are ignored
 * (docs/configuration.md lists them).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bytes.h"
#include "core.h"
#include "zero.h" /* ZCCL_BUCKET_MAX_IN_FLIGHT */

/* transport/ib.c; weak so that programs linking only the configuration code (tests/fuzz) need not link the
 * transports: there it is absent (NULL) and the line below says so. */
bool zccl__ib_built(void) __attribute__((weak));

const zccl_cfg_desc_t zccl__cfg_table[ZCCL_CFG_COUNT] = {
    [ZCCL_CFG_DEBUG] = {"ZCCL_DEBUG", "", "log level on stderr: NONE, WARN, INFO or TRACE", .nccl = "NCCL_DEBUG"},
    [ZCCL_CFG_DEBUG_SUBSYS] = {"ZCCL_DEBUG_SUBSYS", "",
                               "log subsystems: INIT,BOOT,SHM,TCP,COLL,ENV,TOPO,TUNE,IB,ALL; ^ excludes",
        .nccl = "NCCL_DEBUG_SUBSYS"},
    [ZCCL_CFG_SOCKET_IFNAME] = {"ZCCL_SOCKET_IFNAME", "",
                                "interfaces for sockets, NCCL grammar: prefixes a,b; ^ excludes; = exact",
        .nccl = "NCCL_SOCKET_IFNAME"},
    [ZCCL_CFG_TRANSPORT] = {"ZCCL_TRANSPORT", "",
                            "force one transport for every peer: shm, ib (also between ranks of one host) or tcp"},
    [ZCCL_CFG_SECRET] = {"ZCCL_SECRET", "", "job secret, 32 hex digits (set by zcclrun) for zccl_comm_init_env"},
    [ZCCL_CFG_INIT_TIMEOUT_MS] = {"ZCCL_INIT_TIMEOUT_MS", "120000",
                                  "deadline for communicator creation (bootstrap and connections), ms",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = INT64_MAX / 1000000},
    [ZCCL_CFG_TIMEOUT_MS] = {"ZCCL_TIMEOUT_MS", "0", "deadline for a collective without peer progress, ms; 0 = none",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = INT64_MAX / 1000000},
    [ZCCL_CFG_SHM_SLOT_BYTES] = {"ZCCL_SHM_SLOT_BYTES", "128K", "bytes per shared-memory FIFO slot (chunk size)",
        .kind = ZCCL_CFG_BYTES, .lo = 4096, .hi = 64ll << 20},
    [ZCCL_CFG_SHM_SLOTS] = {"ZCCL_SHM_SLOTS", "8", "slots per shared-memory FIFO (per ordered pair of ranks)",
        .kind = ZCCL_CFG_INT, .lo = 2, .hi = 1024},
    [ZCCL_CFG_SHM_CMA] = {"ZCCL_SHM_CMA", "0",
                          "1: single-copy large messages with process_vm_readv; 0: pipelined copies through slots",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1},
    [ZCCL_CFG_CMA_THRESHOLD] = {"ZCCL_CMA_THRESHOLD", "64K", "message bytes from which shm uses the single copy",
        .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = INT64_MAX},
    [ZCCL_CFG_SPIN_US] = {"ZCCL_SPIN_US", "-1",
                          "microseconds a waiting rank polls before it sleeps on a futex; -1: 50 if the host's ranks "
                          "fit its cores, else 0 (sleep at once, leave the core to a peer)",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 10000000},
    [ZCCL_CFG_CHUNK_BYTES] = {"ZCCL_CHUNK_BYTES", "128K", "bytes handled per progress step (cache-sized)",
        .kind = ZCCL_CFG_BYTES, .lo = 4096, .hi = 256ll << 20},
    [ZCCL_CFG_RS_ROUND_BYTES] = {"ZCCL_RS_ROUND_BYTES", "4M",
                                 "bytes per block and round of ring reduce-scatter (bounds scratch memory)",
        .kind = ZCCL_CFG_BYTES, .lo = 64, .hi = 1ll << 40},
    [ZCCL_CFG_CHECK] = {"ZCCL_CHECK", "0",
                        "1: before each collective, verify that every rank called the same one (sequence number, "
                        "operation, count, datatype, op, root); costs one small all-gather per collective",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1},
    [ZCCL_CFG_ALGO] = {"ZCCL_ALGO", "",
                       "algorithms the tuner may choose, NCCL_ALGO grammar: ring,direct; ^ excludes; per collective "
                       "sections allreduce:ring;reducescatter:^ring (docs/tuning.md); unset: all"},
    [ZCCL_CFG_TUNER_CALIBRATE] = {"ZCCL_TUNER_CALIBRATE", "1",
                                  "1: measure alpha/beta per link class and gamma at init (a few ms); 0: built-in "
                                  "defaults (or ZCCL_TUNER_CACHE)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1},
    [ZCCL_CFG_TUNER_CACHE] = {"ZCCL_TUNER_CACHE", "",
                              "file of measured tuner parameters keyed by host and link; read at init when every "
                              "rank finds its entries there, else written after calibration"},
    [ZCCL_CFG_IB_DISABLE] = {"ZCCL_IB_DISABLE", "0", "1: never use the InfiniBand/RoCE verbs transport (TCP between "
                             "hosts)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1, .nccl = "NCCL_IB_DISABLE"},
    [ZCCL_CFG_IB_HCA] = {"ZCCL_IB_HCA", "",
                         "RDMA devices to use, NCCL grammar [^][=]hca[:port],...: prefixes, = exact, ^ excludes; "
                         "unset = first active port of any device", .nccl = "NCCL_IB_HCA"},
    [ZCCL_CFG_IB_GID_INDEX] = {"ZCCL_IB_GID_INDEX", "-1",
                               "GID table index (RoCE); -1 = the first RoCE v2 IPv4-mapped GID, else the first GID",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 65535, .nccl = "NCCL_IB_GID_INDEX"},
    [ZCCL_CFG_IB_TIMEOUT] = {"ZCCL_IB_TIMEOUT", "18",
                             "IB local ACK timeout exponent: 4.096 us * 2^value per try, 1..31",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = 31, .nccl = "NCCL_IB_TIMEOUT"},
    [ZCCL_CFG_IB_RETRY_CNT] = {"ZCCL_IB_RETRY_CNT", "7", "IB transport retries before a send fails, 0..7",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 7, .nccl = "NCCL_IB_RETRY_CNT"},
    [ZCCL_CFG_IB_QPS_PER_CONN] = {"ZCCL_IB_QPS_PER_CONN", "1",
                                  "queue pairs per IB connection (chunks striped over them), 1..16",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = 16, .nccl = "NCCL_IB_QPS_PER_CONNECTION"},
    [ZCCL_CFG_IB_ZCOPY_BYTES] = {"ZCCL_IB_ZCOPY_BYTES", "0",
                                 "IB transfers of at least this many bytes use the user's buffer directly through "
                                 "the registration cache (no staging copy); 0 = always stage. The cache cannot see "
                                 "free(): set it only when communication buffers stay allocated",
        .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = 1ll << 40},
    [ZCCL_CFG_TOPO_FILE] = {"ZCCL_TOPO_FILE", "",
                            "topology of this machine for VMs that hide it: hwloc XML export or NCCL topology file",
        .nccl = "NCCL_TOPO_FILE"},
    [ZCCL_CFG_RING_ORDER] = {"ZCCL_RING_ORDER", "topo",
                             "ring order: topo (neighbours share NUMA node/package/host), rank (0,1,...,n-1), or "
                             "an explicit permutation such as 3,1,0,2"},
    [ZCCL_CFG_BUCKET_FIRST_BYTES] = {"ZCCL_BUCKET_FIRST_BYTES", "1M",
                                     "gradient bucket plans (zccl_zero.h): target bytes of the first bucket to launch",
        .kind = ZCCL_CFG_BYTES, .lo = 1, .hi = INT64_MAX / 2},
    [ZCCL_CFG_BUCKET_CAP_BYTES] = {"ZCCL_BUCKET_CAP_BYTES", "25M",
                                   "gradient bucket plans: target bytes of every later bucket",
        .kind = ZCCL_CFG_BYTES, .lo = 1, .hi = INT64_MAX / 2},
    [ZCCL_CFG_BUCKETS_IN_FLIGHT] = {"ZCCL_BUCKETS_IN_FLIGHT", "2",
                                    "gradient bucket plans: most buckets communicating at once (1..64); also the "
                                    "full-size buffers a reduce-scatter plan keeps",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = ZCCL_BUCKET_MAX_IN_FLIGHT},
    [ZCCL_CFG_ZERO3_LIVE_BYTES] = {"ZCCL_ZERO3_MAX_LIVE_BYTES", "1G",
                                   "ZeRO-3 stores: most bytes of gathered layer parameters alive at once (prefetch "
                                   "stops there)",
        .kind = ZCCL_CFG_BYTES, .lo = 1, .hi = INT64_MAX / 2},
};

const char *zccl__cfg_source(zccl_cfg_id_t id) {
    if ((unsigned)id >= ZCCL_CFG_COUNT) return NULL;
    const zccl_cfg_desc_t *d = &zccl__cfg_table[id];
    const char *v = getenv(d->name);
    if (v && *v) return d->name;
    v = d->nccl ? getenv(d->nccl) : NULL;
    return (v && *v) ? d->nccl : NULL;
}

const char *zccl__cfg_str(zccl_cfg_id_t id) {
    if ((unsigned)id >= ZCCL_CFG_COUNT) return "";
    const char *src = zccl__cfg_source(id);
    return src ? getenv(src) : zccl__cfg_table[id].deflt;
}

zccl_result_t zccl__cfg_int(zccl_cfg_id_t id, int64_t *out) {
    const zccl_cfg_desc_t *d = &zccl__cfg_table[id];
    const char *v = zccl__cfg_str(id);
    const char *name = zccl__cfg_source(id) ? zccl__cfg_source(id) : d->name; /* the variable to blame */
    /* a leading '-' for settings that allow negative values; the rest is bytes.c's grammar (K, M, G, T; KiB; KB) */
    const bool neg = v[0] == '-';
    uint64_t u;
    if (d->kind == ZCCL_CFG_TEXT) return zccl__error(ZCCL_INTERNAL_ERROR, "%s is not a numeric setting", d->name);
    if (zccl__parse_bytes(v + neg, &u) != 0 || u > (uint64_t)INT64_MAX) goto bad;
    if (d->kind == ZCCL_CFG_INT && strpbrk(v, "kKmMgGtTbB")) goto bad; /* counts, switches and times: plain numbers */
    *out = neg ? -(int64_t)u : (int64_t)u;
    if (*out < d->lo || *out > d->hi) goto bad;
    return ZCCL_SUCCESS;
bad:
    if (d->kind == ZCCL_CFG_BYTES)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=\"%s\" is not a byte count in [%lld, %lld] (suffixes "
                           "K, M, G, T allowed, also as KiB or KB: powers of 1024)", name, v, (long long)d->lo,
                           (long long)d->hi);
    if (d->lo == 0 && d->hi == 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=\"%s\" is not 0 or 1", name, v);
    return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=\"%s\" is not an integer in [%lld, %lld]", name, v,
                       (long long)d->lo, (long long)d->hi);
}

ZCCL_API size_t zccl_config_describe(char *buf, size_t len) {
    size_t need = 0;
    for (int i = 0; i < ZCCL_CFG_COUNT; i++) {
        const zccl_cfg_desc_t *d = &zccl__cfg_table[i];
        const char *v = zccl__cfg_str((zccl_cfg_id_t)i), *src = zccl__cfg_source((zccl_cfg_id_t)i);
        char from[80] = "", also[80] = "";
        if (src && src == d->nccl) snprintf(from, sizeof from, " (from %s)", src);
        if (d->nccl) snprintf(also, sizeof also, "; NCCL name %s", d->nccl);
        int n = snprintf(buf && need < len ? buf + need : NULL, buf && need < len ? len - need : 0,
                         "%s=%s%s (default %s%s): %s\n", d->name, *v ? v : "(unset)", from,
                         *d->deflt ? d->deflt : "unset", also, d->help);
        if (n > 0) need += (size_t)n;
    }
    /* Not a setting, but what decides whether the ZCCL_IB_* settings mean anything. */
    int n = snprintf(buf && need < len ? buf + need : NULL, buf && need < len ? len - need : 0, "%s\n",
                     zccl__ib_built && zccl__ib_built() ? "IB transport: built (libibverbs, librdmacm)"
                                      : "IB transport: absent (built without libibverbs/librdmacm)");
    if (n > 0) need += (size_t)n;
    return need;
}

/*
 * settings.c — the core layer's rows of the ZCCL_* settings table (util/config.c gathers every layer's
 * rows; `zccl-bench --env` prints them with the values in force; docs/configuration.md explains each).
 */
#include <stdint.h>
#include "comm.h"

ZCCL_SETTING(zccl__set_secret) = {.name = "ZCCL_SECRET", .deflt = "", .help = "job secret, 32 hex digits (set by zcclrun) for zccl_comm_init_env"};
ZCCL_SETTING(zccl__set_init_timeout_ms) = {.name = "ZCCL_INIT_TIMEOUT_MS", .deflt = "120000",
                                  .help = "deadline for communicator creation (bootstrap and connections), ms",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = INT64_MAX / 1000000};
ZCCL_SETTING(zccl__set_timeout_ms) = {.name = "ZCCL_TIMEOUT_MS", .deflt = "0", .help = "deadline for a collective without peer progress, ms; 0 = none",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = INT64_MAX / 1000000};
ZCCL_SETTING(zccl__set_spin_us) = {.name = "ZCCL_SPIN_US", .deflt = "-1",
                          .help = "microseconds a waiting rank polls before it sleeps on a futex; -1: 50 if the host's ranks "
                          "fit its cores, else 0 (no polling; then ZCCL_WAIT_YIELD says how it waits)",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 10000000};
ZCCL_SETTING(zccl__set_wait_yield) = {.name = "ZCCL_WAIT_YIELD", .deflt = "-1",
                          .help = "how a rank waits once its ZCCL_SPIN_US has passed: 0 sleeps on a futex until a "
                          "peer wakes it, 1 stays runnable and hands its core over (sched_yield) between looks; -1: 1 "
                          "if the host has more ranks than cores, else 0 (docs/performance.md)",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 1};
ZCCL_SETTING(zccl__set_machine_ranks) = {.name = "ZCCL_MACHINE_RANKS", .deflt = "0",
                          .help = "ranks that share this machine's cores when that is more than the host's own (zcclrun "
                          "--hostfile sets it where several of its netns/localhost hosts run on this machine); the -1 "
                          "(automatic) choices of ZCCL_SPIN_US, ZCCL_WAIT_YIELD, ZCCL_STREAM_SPIN_US and ZCCL_SHM_STAGED "
                          "count max(this, the host's ranks) against the CPUs; 0: the host's ranks",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1 << 20};
ZCCL_SETTING(zccl__set_stream_spin_us) = {.name = "ZCCL_STREAM_SPIN_US", .deflt = "-1",
                          .help = "microseconds an idle zccl stream thread polls for its next operation, and "
                          "zccl_stream_synchronize for the last completion, before sleeping; -1: ZCCL_SPIN_US's value "
                          "when the host has two cores per local rank (the caller's thread and the stream's), else 0",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 10000000};
ZCCL_SETTING(zccl__set_chunk_bytes) = {.name = "ZCCL_CHUNK_BYTES", .deflt = "128K", .help = "bytes handled per progress step (cache-sized)",
        .kind = ZCCL_CFG_BYTES, .lo = 4096, .hi = 256ll << 20};
ZCCL_SETTING(zccl__set_rs_round_bytes) = {.name = "ZCCL_RS_ROUND_BYTES", .deflt = "4M",
                                 .help = "bytes per block and round of ring reduce-scatter (bounds scratch memory)",
        .kind = ZCCL_CFG_BYTES, .lo = 64, .hi = 1ll << 40, .must_match = true};
ZCCL_SETTING(zccl__set_check) = {.name = "ZCCL_CHECK", .deflt = "0",
                        .help = "1: before each collective, verify that every rank called the same one (sequence number, "
                        "operation, count, datatype, op, root); costs one small all-gather per collective. 0: each "
                        "channel's first message is the call's descriptor, and broadcast, reduce, gather and scatter "
                        "send it to every peer, so every rank fails a call another rank refused or rooted elsewhere. "
                        "-1: as 0 without the every-peer exchange (lower latency for rooted collectives; a rank that "
                        "needs no data from the refusing one fails only its next call)",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 1, .must_match = true};
ZCCL_SETTING(zccl__set_ring_order) = {.name = "ZCCL_RING_ORDER", .deflt = "topo",
                             .help = "ring order: topo (neighbours share NUMA node/package/host), rank (0,1,...,n-1), or "
                             "an explicit permutation such as 3,1,0,2", .must_match = true};

/* Pipelined staging of device calls (engine_stage.c, docs/gpu.md): both shape the wire (every rank splits a device
 * call's transfers alike), so they must match. Defaults measured with the throttled fake driver (bench/stage_bench). */
ZCCL_SETTING(zccl__set_stage_chunk_bytes) = {.name = "ZCCL_STAGE_CHUNK_BYTES", .deflt = "512K",
        .help = "device calls through host staging: bytes per chunk; the copy of one chunk to or from the GPU "
        "overlaps the transfer of others", .kind = ZCCL_CFG_BYTES, .lo = 4096, .hi = 1ll << 30, .must_match = true};
ZCCL_SETTING(zccl__set_stage_depth) = {.name = "ZCCL_STAGE_DEPTH", .deflt = "4",
        .help = "device calls through host staging: chunks per sending channel copied ahead of the wire; 0: no "
        "pipelining (each phase's sends copied out whole before it, receives copied in after it)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1024, .must_match = true};

/* Which ranks count as one host for the hierarchical collectives (lib/api/coll_hier.c) and the ZeRO-3 store's hpZ
 * (lib/zero/zero3.c, through zccl__host_key): read there only, so that one machine can stand for several hosts in
 * tests and benchmarks while its transports still see the real host. */
ZCCL_SETTING(zccl__set_host_id) = {.name = "ZCCL_HOST_ID", .deflt = "",
        .help = "host identity of this rank for the hierarchical collectives (zccl_*_hier) and the ZeRO-3 store's "
        "hpZ (zccl_zero3_options_t.hpz): ranks with equal values "
        "count as one host; empty: the real host (hostname and boot id). Transports and topology keep the real host"};

/*
 * settings.c — the zero layer's rows of the ZCCL_* settings table (util/config.c gathers every layer's
 * rows; `zccl-bench --env` prints them with the values in force; docs/configuration.md explains each).
 */
#include <stdint.h>
#include "zero.h"

ZCCL_SETTING(zccl__set_bucket_first_bytes) = {.name = "ZCCL_BUCKET_FIRST_BYTES", .deflt = "1M",
                                     .help = "gradient bucket plans (zccl_zero.h): target bytes of the first bucket to launch",
        .kind = ZCCL_CFG_BYTES, .lo = 1, .hi = INT64_MAX / 2};
ZCCL_SETTING(zccl__set_bucket_cap_bytes) = {.name = "ZCCL_BUCKET_CAP_BYTES", .deflt = "25M",
                                   .help = "gradient bucket plans: target bytes of every later bucket",
        .kind = ZCCL_CFG_BYTES, .lo = 1, .hi = INT64_MAX / 2};
ZCCL_SETTING(zccl__set_buckets_in_flight) = {.name = "ZCCL_BUCKETS_IN_FLIGHT", .deflt = "2",
                                    .help = "gradient bucket plans: most buckets communicating at once (1..64); also the "
                                    "full-size buffers a reduce-scatter plan keeps",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = ZCCL_BUCKET_MAX_IN_FLIGHT};
ZCCL_SETTING(zccl__set_zero3_live_bytes) = {.name = "ZCCL_ZERO3_MAX_LIVE_BYTES", .deflt = "1G",
                                   .help = "ZeRO-3 stores: most bytes of gathered layer parameters alive at once (prefetch "
                                   "stops there)",
        .kind = ZCCL_CFG_BYTES, .lo = 1, .hi = INT64_MAX / 2};
ZCCL_SETTING(zccl__set_bucket_register) = {.name = "ZCCL_BUCKET_REGISTER", .deflt = "1",
                                  .help = "1: gradient bucket plans and ZeRO-3 stores whose ranks share one host "
                                  "allocate their bucket buffers and gathered layers (a pool) with zccl_mem_alloc and "
                                  "register them, so their collectives take the registered one-pass path; 0: ordinary "
                                  "memory (docs/zero.md)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1};
ZCCL_SETTING(zccl__set_bucket_check) = {.name = "ZCCL_BUCKET_CHECK", .deflt = "0",
                               .help = "1: gradient bucket plans checksum every gradient region at mark_ready and check it "
                               "at the bucket's launch and after its completion, failing on a write through a stale "
                               "gradient pointer (debugging; costs extra passes over the gradients, docs/zero.md)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1};

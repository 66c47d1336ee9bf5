/*
 * settings.c — the tuner layer's rows of the ZCCL_* settings table (util/config.c gathers every layer's
 * rows; `zccl-bench --env` prints them with the values in force; docs/configuration.md explains each).
 */
#include <stdint.h>
#include "tuner.h"

ZCCL_SETTING(zccl__set_algo) = {.name = "ZCCL_ALGO", .deflt = "",
                       .help = "algorithms the tuner may choose, NCCL_ALGO grammar: ring,direct; ^ excludes; per collective "
                       "sections allreduce:ring;reducescatter:^ring (docs/tuning.md); unset: all", .must_match = true};
ZCCL_SETTING(zccl__set_tuner_calibrate) = {.name = "ZCCL_TUNER_CALIBRATE", .deflt = "1",
                                  .help = "1: measure alpha/beta per link class and gamma at init (a few ms); 0: built-in "
                                  "defaults (or ZCCL_TUNER_CACHE)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1, .must_match = true};
ZCCL_SETTING(zccl__set_deterministic) = {.name = "ZCCL_DETERMINISTIC", .deflt = "0",
                               .help = "1: the tuner never measures (built-in defaults, or ZCCL_TUNER_CACHE read and never "
                               "written), so every run with the same settings chooses the same algorithms and sums in the "
                               "same order: bitwise reproducible results (docs/tuning.md)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1, .must_match = true};
ZCCL_SETTING(zccl__set_tuner_cache) = {.name = "ZCCL_TUNER_CACHE", .deflt = "",
                              .help = "file of measured tuner parameters keyed by host and link; read at init when every "
                              "rank finds its entries there, else written after calibration"};

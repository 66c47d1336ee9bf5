/*
 * topo_settings.c — the topology layer's rows of the ZCCL_* settings table (util/config.c gathers every layer's
 * rows; `zccl-bench --env` prints them with the values in force; docs/configuration.md explains each).
 */
#include <stdint.h>
#include "topo_model.h"

ZCCL_SETTING(zccl__set_topo_file) = {.name = "ZCCL_TOPO_FILE", .deflt = "",
                            .help = "topology of this machine for VMs that hide it: hwloc XML export or NCCL topology file", .nccl = "NCCL_TOPO_FILE"};

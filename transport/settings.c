/*
 * settings.c — the transport layer's rows of the ZCCL_* settings table (util/config.c gathers every layer's
 * rows; `zccl-bench --env` prints them with the values in force; docs/configuration.md explains each).
 */
#include <stdint.h>
#include "transport.h"

ZCCL_SETTING(zccl__set_shm_slot_bytes) = {.name = "ZCCL_SHM_SLOT_BYTES", .deflt = "128K", .help = "bytes per shared-memory FIFO slot (chunk size)",
        .kind = ZCCL_CFG_BYTES, .lo = 4096, .hi = 64ll << 20, .must_match = true};
ZCCL_SETTING(zccl__set_shm_slots) = {.name = "ZCCL_SHM_SLOTS", .deflt = "8", .help = "slots per shared-memory FIFO (per ordered pair of ranks)",
        .kind = ZCCL_CFG_INT, .lo = 2, .hi = 1024, .must_match = true};
ZCCL_SETTING(zccl__set_shm_cma) = {.name = "ZCCL_SHM_CMA", .deflt = "-1",
                          .help = "1: single-copy large messages with process_vm_readv where the kernel lets a rank read "
                          "its peer (probed per pair at init); 0: pipelined copies through slots; -1: 1 unless the "
                          "tuner's calibration measured the slots faster at 1 MiB on some host (then 0)",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 1, .must_match = true};
ZCCL_SETTING(zccl__set_cma_threshold) = {.name = "ZCCL_CMA_THRESHOLD", .deflt = "128K", .help = "message bytes from which shm uses the single copy",
        .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = INT64_MAX, .must_match = true};
ZCCL_SETTING(zccl__set_ib_disable) = {.name = "ZCCL_IB_DISABLE", .deflt = "0", .help = "1: never use the InfiniBand/RoCE verbs transport (TCP between "
                             "hosts)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1, .must_match = true, .nccl = "NCCL_IB_DISABLE"};
ZCCL_SETTING(zccl__set_ib_hca) = {.name = "ZCCL_IB_HCA", .deflt = "",
                         .help = "RDMA devices/ports to use as rails (at most 4; chunks striped over them), NCCL "
                         "grammar [^][=]hca[:port],...: prefixes, = exact, ^ excludes; unset = every active port",
                         .nccl = "NCCL_IB_HCA"};
ZCCL_SETTING(zccl__set_ib_gid_index) = {.name = "ZCCL_IB_GID_INDEX", .deflt = "-1",
                               .help = "GID table index (RoCE); -1 = the first RoCE v2 IPv4-mapped GID, else the first GID",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = 65535, .nccl = "NCCL_IB_GID_INDEX"};
ZCCL_SETTING(zccl__set_ib_timeout) = {.name = "ZCCL_IB_TIMEOUT", .deflt = "18",
                             .help = "IB local ACK timeout exponent: 4.096 us * 2^value per try, 1..31",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = 31, .nccl = "NCCL_IB_TIMEOUT"};
ZCCL_SETTING(zccl__set_ib_retry_cnt) = {.name = "ZCCL_IB_RETRY_CNT", .deflt = "7", .help = "IB transport retries before a send fails, 0..7",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 7, .nccl = "NCCL_IB_RETRY_CNT"};
ZCCL_SETTING(zccl__set_ib_qps_per_conn) = {.name = "ZCCL_IB_QPS_PER_CONN", .deflt = "1",
                                  .help = "queue pairs per IB connection and rail (chunks striped over them), 1..16",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = 16, .must_match = true, .nccl = "NCCL_IB_QPS_PER_CONNECTION"};
ZCCL_SETTING(zccl__set_ib_zcopy_bytes) = {.name = "ZCCL_IB_ZCOPY_BYTES", .deflt = "0",
                                 .help = "IB transfers of at least this many bytes use the user's buffer directly through "
                                 "the registration cache (no staging copy); 0 = always stage. The cache cannot see "
                                 "free(): set it only when communication buffers stay allocated",
        .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = 1ll << 40};
ZCCL_SETTING(zccl__set_transport) = {.name = "ZCCL_TRANSPORT", .deflt = "",
                            .help = "force one transport for every peer: shm, ib (also between ranks of one host) or tcp", .must_match = true};
ZCCL_SETTING(zccl__set_socket_user_timeout_ms) = {.name = "ZCCL_SOCKET_USER_TIMEOUT_MS", .deflt = "30000",
        .help = "TCP data connections: a peer that acknowledges nothing (sent data or keepalive probes) for this long "
                "is lost (TCP_USER_TIMEOUT with keepalive), even with ZCCL_TIMEOUT_MS=0; 0 = the kernel's defaults "
                "(about 15 minutes)",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 24ll * 3600 * 1000};

/* GPUDirect RDMA (transport/ib_gdr_probe.c, transport/gdr.h, docs/gpu.md "GPUDirect RDMA"). */
ZCCL_SETTING(zccl__set_gdr) = {.name = "ZCCL_GDR", .deflt = "auto",
        .help = "GPUDirect RDMA for device buffers over verbs: auto (where the NIC and GPU support it and their PCIe "
        "path is within ZCCL_NET_GDR_LEVEL), 1 (wherever NIC and GPU support it, any path), 0 (never: staged)"};
ZCCL_SETTING(zccl__set_net_gdr_level) = {.name = "ZCCL_NET_GDR_LEVEL", .deflt = "PXB",
        .help = "farthest GPU-NIC PCIe path for GPUDirect RDMA: LOC, PIX, PXB, PHB, SYS (or NCCL's 0..4)",
        .nccl = "NCCL_NET_GDR_LEVEL"};
ZCCL_SETTING(zccl__set_net_gdr_read) = {.name = "ZCCL_NET_GDR_READ", .deflt = "-1",
        .help = "1: the NIC reads device memory for sends; 0: sends staged, receives still direct; -1: from compute "
        "capability 8.0 on", .kind = ZCCL_CFG_INT, .lo = -1, .hi = 1, .nccl = "NCCL_NET_GDR_READ"};
ZCCL_SETTING(zccl__set_dmabuf_enable) = {.name = "ZCCL_DMABUF_ENABLE", .deflt = "1",
        .help = "1: register device memory as dma-buf (ibv_reg_dmabuf_mr) where the NIC and GPU can; 0: only the "
        "peer-memory module", .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1, .nccl = "NCCL_DMABUF_ENABLE"};
ZCCL_SETTING(zccl__set_gdr_flush_disable) = {.name = "ZCCL_GDR_FLUSH_DISABLE", .deflt = "0",
        .help = "1: no flush (1-byte RDMA read) after data lands in device memory, also before Hopper",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 1, .nccl = "NCCL_GDR_FLUSH_DISABLE"};
ZCCL_SETTING(zccl__set_gdr_fake_peermem) = {.name = "ZCCL_GDR_FAKE_PEERMEM", .deflt = "0",
        .help = "test only (the fake CUDA driver over soft-RoCE, where device memory is host memory): 1 = act as if "
        "the peer-memory module were loaded, so fake device buffers are registered with ibv_reg_mr and take the GDR "
        "path; 2 = the same, but every registration of device memory is refused (one rank's refusal); never set it "
        "with a real GPU", .kind = ZCCL_CFG_INT, .lo = 0, .hi = 2};
ZCCL_SETTING(zccl__set_tcp_rails) = {.name = "ZCCL_TCP_RAILS", .deflt = "-1",
        .help = "TCP rails (interfaces) to stripe large transfers over between hosts: -1 = every usable interface whose "
                "subnet the peer also has; 1 = one connection per direction (the bootstrap interface); N = at most N",
        .kind = ZCCL_CFG_INT, .lo = -1, .hi = ZCCL_RAIL_MAX};
ZCCL_SETTING(zccl__set_nsocks_perthread) = {.name = "ZCCL_NSOCKS_PERTHREAD", .deflt = "1",
        .help = "TCP sockets per rail and direction of a pair (a pair uses the smaller of the two ranks' values; "
                "rails x sockets is at most 16)",
        .kind = ZCCL_CFG_INT, .lo = 1, .hi = 8, .nccl = "NCCL_NSOCKS_PERTHREAD"};
ZCCL_SETTING(zccl__set_tcp_stripe_min_bytes) = {.name = "ZCCL_TCP_STRIPE_MIN_BYTES", .deflt = "256K",
        .help = "TCP transfers of at least this many bytes are split over every socket of the pair (contiguous "
                "element ranges); smaller ones go whole over the sender's home rail",
        .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = INT64_MAX, .must_match = true};
ZCCL_SETTING(zccl__set_min_nchannels) = {.name = "ZCCL_MIN_NCHANNELS", .deflt = "0",
        .help = "TCP between hosts: every transfer of at least 64 bytes per part is split over at least this many of "
                "the pair's sockets (channels), whatever ZCCL_TCP_STRIPE_MIN_BYTES says; 0 or 1: no minimum",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 64, .nccl = "NCCL_MIN_NCHANNELS", .must_match = true};
ZCCL_SETTING(zccl__set_max_nchannels) = {.name = "ZCCL_MAX_NCHANNELS", .deflt = "0",
        .help = "TCP between hosts: a transfer is split over at most this many of the pair's sockets (channels); "
                "0: all of them; 1: none split",
        .kind = ZCCL_CFG_INT, .lo = 0, .hi = 64, .nccl = "NCCL_MAX_NCHANNELS", .must_match = true};
ZCCL_SETTING(zccl__set_rail_timeout_ms) = {.name = "ZCCL_RAIL_TIMEOUT_MS", .deflt = "2000",
        .help = "TCP rails: a lane whose sent bytes the peer's kernel has not acknowledged this long after "
                "retransmissions (TCP_INFO, while waiting) has lost its rail and moves to the next live rail of the "
                "pair; also each attempt to connect on a rail",
        .kind = ZCCL_CFG_INT, .lo = 100, .hi = 24ll * 3600 * 1000};

/*
 * topo.h — zccl's machine model: what the machine looks like (packages, NUMA nodes, cores, caches, the PCI tree
 * with its GPUs and NICs, distance matrices), how far apart two devices are (NCCL's path classes), where a rank
 * runs (its locality), and the ring order that follows from the localities of all ranks.
 *
 * Layer rule (docs/architecture.md): topology/ includes core.h and nothing above it. The model is built through
 * hwloc (the live machine, an hwloc XML file, an hwloc synthetic description) or from an NCCL topology XML read
 * with libxml2; whatever the source, the model has the same shape, so paths, localities and rings do not care
 * where it came from. docs/topology.md explains the rules used here.
 *
 * A model is immutable once created and may be read from several threads.
 */
#ifndef ZCCL_TOPO_H
#define ZCCL_TOPO_H

#include <hwloc.h>
#include <stddef.h>
#include <stdint.h>
#include "core.h"
#include "zccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the model and its sources ------------------------------------------------------------------------------ */

typedef struct zccl_topo zccl_topo_t;

/** Where a model came from. */
typedef enum {
    ZCCL_TOPO_SRC_LIVE = 0,   /**< this machine, discovered by hwloc */
    ZCCL_TOPO_SRC_HWLOC_XML,  /**< an hwloc XML export (v1 or v2 format), e.g. `lstopo machine.xml` */
    ZCCL_TOPO_SRC_NCCL_XML,   /**< an NCCL topology file (`<system version="1">`), as given to NCCL_TOPO_FILE */
    ZCCL_TOPO_SRC_SYNTHETIC   /**< an hwloc synthetic description such as "pack:2 numa:2 core:4 pu:2" */
} zccl_topo_source_t;

/** Flags for zccl_topo_create_file(). */
enum {
    /** The file describes the machine this process runs on (ZCCL_TOPO_FILE on a VM): bindings are read from the OS
     *  and interpreted with the file's CPU numbering. Without it the model is of another machine. */
    ZCCL_TOPO_THIS_SYSTEM = 1u << 0
};

/**
 * Discovers this machine with hwloc, keeping the PCI tree (bridges, PCI devices and OS devices are kept when
 * hwloc rates them important, so every GPU, NIC and the switches above them are in the model).
 * On success *out owns a new model (zccl_topo_destroy); on failure *out is untouched.
 */
zccl_result_t zccl_topo_create_live(zccl_topo_t **out);

/**
 * Loads an hwloc XML export (either format: hwloc 1.x and 2.x exports both load). Every I/O object in the file is
 * kept. `flags`: ZCCL_TOPO_THIS_SYSTEM or 0. A missing or unreadable file, or one hwloc rejects, is
 * ZCCL_INVALID_ARGUMENT with the path and the reason.
 */
zccl_result_t zccl_topo_create_hwloc_xml(const char *path, unsigned flags, zccl_topo_t **out);

/**
 * Loads an NCCL topology XML (`<system version="1">` holding `<cpu numaid affinity>` elements, nested `<pci busid
 * class vendor link_speed link_width>` elements for switches and devices, and `<gpu>`, `<nic>`/`<net>` inside
 * devices), parsed with libxml2. Such files describe the I/O side only: each `<cpu>` becomes one package with one
 * NUMA node, and each PU of its affinity mask counts as a core. An element without a required attribute or with a
 * malformed one is ZCCL_INVALID_ARGUMENT naming the file, line and attribute.
 */
zccl_result_t zccl_topo_create_nccl_xml(const char *path, unsigned flags, zccl_topo_t **out);

/**
 * Loads a topology file of either kind, told apart by the XML root element (`<topology>`: hwloc, `<system>`:
 * NCCL). This is what ZCCL_TOPO_FILE names; the communicator passes ZCCL_TOPO_THIS_SYSTEM.
 */
zccl_result_t zccl_topo_create_file(const char *path, unsigned flags, zccl_topo_t **out);

/** Builds a model from an hwloc synthetic description (no I/O devices), e.g. "pack:2 numa:2 core:4 pu:2". */
zccl_result_t zccl_topo_create_synthetic(const char *description, zccl_topo_t **out);

/** Frees a model (NULL is fine). */
void zccl_topo_destroy(zccl_topo_t *topo);

/** The source of the model and its origin: the file path, the synthetic description or "this machine". */
zccl_topo_source_t zccl_topo_source(const zccl_topo_t *topo);
const char *zccl_topo_origin(const zccl_topo_t *topo);
/** The hwloc topology the model was built from, or NULL for an NCCL XML model. Owned by the model. */
hwloc_topology_t zccl_topo_hwloc(const zccl_topo_t *topo);

/* ---- counts, CPU side --------------------------------------------------------------------------------------- */

/** Object counts of a model. For an NCCL XML model packages = numa_nodes = cpus and cores = pus. */
typedef struct {
    int packages;    /**< sockets (hwloc Package objects) */
    int numa_nodes;  /**< NUMA nodes, memory-only ones included */
    int cores;       /**< cores (PUs where the source does not know cores) */
    int pus;         /**< processing units (hardware threads) */
    int cpus;        /**< CPU attachment points of I/O: distinct non-I/O objects that hold PCI trees or devices
                          (an NCCL file: its `<cpu>` elements) */
    int gpus;        /**< GPUs, see zccl_topo_dev_kind_t */
    int nics;        /**< NICs */
    int pci_devices; /**< PCI devices other than bridges, GPUs and NICs included */
    int switches;    /**< PCIe switches (an hwloc upstream port merged with its downstream ports; an NCCL bridge) */
} zccl_topo_counts_t;

/** Fills *out with the counts of the model. */
void zccl_topo_counts(const zccl_topo_t *topo, zccl_topo_counts_t *out);

/** One NUMA node. */
typedef struct {
    int os_index;           /**< the OS's number of the node (what numactl calls it) */
    int package;            /**< logical index of the package whose CPUs include the node's CPUs; -1: none/several */
    uint64_t memory;        /**< local memory in bytes, 0 if unknown */
    hwloc_bitmap_t cpuset;  /**< the node's PUs (OS indexes); empty for memory-only nodes */
} zccl_topo_numa_t;

int zccl_topo_numa_count(const zccl_topo_t *topo);
/** The i-th NUMA node in logical order (0 <= i < zccl_topo_numa_count). */
const zccl_topo_numa_t *zccl_topo_numa(const zccl_topo_t *topo, int i);
/** PUs (OS indexes) of the i-th package in logical order; the whole machine when the source has no packages. */
hwloc_const_cpuset_t zccl_topo_package_cpuset(const zccl_topo_t *topo, int i);

/** One kind of cache: `count` caches of `size` bytes at `level`. */
typedef struct {
    int level;          /**< 1 for L1 ... */
    char type;          /**< 'd' data, 'i' instruction, 'u' unified */
    uint64_t size;      /**< bytes per cache */
    unsigned linesize;  /**< bytes per line, 0 if unknown */
    int count;          /**< caches of this kind in the machine */
} zccl_topo_cache_t;

int zccl_topo_cache_count(const zccl_topo_t *topo);
/** The i-th kind of cache, ordered by level, then type (d, i, u), then size. */
const zccl_topo_cache_t *zccl_topo_cache(const zccl_topo_t *topo, int i);

/* ---- the I/O side: CPU attachments, PCI tree, devices ------------------------------------------------------- */

/** Where I/O hangs off the CPU side: a package, a NUMA node, a group or the machine (an NCCL `<cpu>`). */
typedef struct {
    char label[48];         /**< e.g. "Package L#0", "NUMANode P#1", "Machine", "CPU numa 2" */
    int package;            /**< logical index of its package; -1 when it spans several or there is none */
    hwloc_bitmap_t cpuset;  /**< its PUs (OS indexes); the "CPU affinity" of devices below it */
    hwloc_bitmap_t nodeset; /**< its NUMA nodes (OS indexes); the "NUMA affinity" of devices below it */
} zccl_topo_cpu_t;

int zccl_topo_cpu_count(const zccl_topo_t *topo);
const zccl_topo_cpu_t *zccl_topo_cpu(const zccl_topo_t *topo, int i);

/** Nodes of the PCI tree. */
typedef enum {
    ZCCL_TOPO_PCI_HOSTBRIDGE = 0, /**< a host bridge (root complex) */
    ZCCL_TOPO_PCI_SWITCH,         /**< a PCIe switch */
    ZCCL_TOPO_PCI_DEVICE          /**< an endpoint (any PCI function that is not a bridge) */
} zccl_topo_pci_kind_t;

#define ZCCL_TOPO_BUSID_LEN 16 /* "dddd:bb:dd.f" and its NUL */

/**
 * One node of the PCI tree, at switch granularity: hwloc shows every bridge (root port, switch upstream port, each
 * downstream port); the model makes root ports transparent and merges each upstream port with the downstream ports
 * right below it into one switch, the way NCCL walks sysfs two levels at a time. An NCCL file is already at that
 * granularity: each bridge `<pci>` is a switch.
 */
typedef struct {
    zccl_topo_pci_kind_t kind;
    char busid[ZCCL_TOPO_BUSID_LEN]; /**< device/switch upstream port "0000:3b:00.0"; host bridge "0000:[3a-3f]" */
    int parent;                      /**< index of the parent node, -1: attached to CPU attachment `cpu` */
    int cpu;                         /**< index of the CPU attachment the tree hangs off */
    int dev;                         /**< for a DEVICE: index into the device list (zccl_topo_dev_at), else -1 */
    int ports;                       /**< for a SWITCH: bridges merged into it (1 + downstream ports) */
    double link_gbs;                 /**< upstream link bandwidth in GB/s, 0 if unknown */
} zccl_topo_pci_t;

int zccl_topo_pci_count(const zccl_topo_t *topo);
/** The i-th node of the PCI tree; parents come before their children. */
const zccl_topo_pci_t *zccl_topo_pci_node(const zccl_topo_t *topo, int i);

/**
 * What a device is. A GPU is a PCI device of class 0x0300/0x0302/0x0380 from NVIDIA (0x10de) or AMD (0x1002), or
 * one that has a CUDA, NVML or RSMI OS device (in NCCL files, a `<gpu>` element); a NIC is a PCI device of class
 * 0x02xx (in NCCL files also a `<nic>` element) — its Net/OpenFabrics OS devices (eth0, mlx5_0) are listed in
 * osdev; OSDEV is an OS device that hangs off the CPU side directly (e.g. a block device without PCI information).
 */
typedef enum {
    ZCCL_TOPO_DEV_GPU = 0,
    ZCCL_TOPO_DEV_NIC,
    ZCCL_TOPO_DEV_PCI,   /**< any other PCI device */
    ZCCL_TOPO_DEV_OSDEV,
    ZCCL_TOPO_DEV_KINDS
} zccl_topo_dev_kind_t;

#define ZCCL_TOPO_MAX_OSDEVS 8
#define ZCCL_TOPO_NAME_LEN 32

/** One device. */
typedef struct {
    zccl_topo_dev_kind_t kind;
    int index;                        /**< position among the devices of its kind (GPU0, GPU1, NIC0 ...) */
    int id;                           /**< position in the list of all devices (zccl_topo_dev_at) */
    char busid[ZCCL_TOPO_BUSID_LEN];  /**< PCI bus id, "" for an OSDEV or a NIC without PCI information */
    unsigned vendor, device;          /**< PCI ids, 0 if unknown */
    unsigned class_id;                /**< base class and subclass, e.g. 0x0302; 0 if unknown */
    double link_gbs;                  /**< PCIe link bandwidth in GB/s, 0 if unknown */
    char link[24];                    /**< the link as the source gave it: "16 GT/s x16", "15.75 GB/s", "" */
    int numa;                         /**< OS index of the first NUMA node of its CPU attachment, -1 if none */
    int cpu;                          /**< index of its CPU attachment (zccl_topo_cpu) */
    int pci;                          /**< its node in the PCI tree, -1 for an OSDEV */
    int nosdevs;                      /**< OS device names, in the source's order: eth0, mlx5_0, cuda0, nvml0... */
    char osdev[ZCCL_TOPO_MAX_OSDEVS][ZCCL_TOPO_NAME_LEN];
    char name[64];                    /**< product name if the source has it (hwloc's PCIDevice info), else "" */
    int rdma;                         /**< NICs: 1 when RDMA-capable (InfiniBand, RoCE, EFA, iWARP), 0 when the source
                                           shows only an Ethernet/socket port; always 0 for other kinds */
    char rdma_why[40];                /**< NICs: the evidence for `rdma` ("OpenFabrics mlx5_0", "class 0x0207
                                           InfiniBand", "EFA 1d0f:efa0", "net mlx5_bond_0"), or "" */
} zccl_topo_dev_t;

/** Devices of one kind. */
int zccl_topo_dev_count(const zccl_topo_t *topo, zccl_topo_dev_kind_t kind);
/** The i-th device of a kind (GPU i, NIC i), or NULL when out of range. */
const zccl_topo_dev_t *zccl_topo_dev(const zccl_topo_t *topo, zccl_topo_dev_kind_t kind, int i);
/** All devices, in discovery order (a depth-first walk of the tree). */
int zccl_topo_dev_total(const zccl_topo_t *topo);
const zccl_topo_dev_t *zccl_topo_dev_at(const zccl_topo_t *topo, int id);
/** The first device with this PCI bus id (case-insensitive), or NULL. Bus ids repeat only in odd exports. */
const zccl_topo_dev_t *zccl_topo_dev_by_busid(const zccl_topo_t *topo, const char *busid);
/** Writes the device's NUMA nodes as a list ("0", "0,1", "-" for none) into buf; returns buf. */
char *zccl_topo_dev_numa_list(const zccl_topo_t *topo, const zccl_topo_dev_t *dev, char *buf, size_t len);

/** One hwloc distance matrix (NUMA latencies, GPU NVLink bandwidths...). */
typedef struct {
    char name[48];               /**< hwloc's name for it ("NUMALatency", "NVLinkBandwidth"), or "" */
    unsigned long kind;          /**< hwloc's HWLOC_DISTANCES_KIND_* bits */
    int n;                       /**< objects described */
    char (*labels)[ZCCL_TOPO_NAME_LEN]; /**< n labels: "NUMA P#0", "cuda1", "PU L#3" */
    uint64_t *values;            /**< n*n values, row-major: values[i*n+j] from object i to object j */
} zccl_topo_distances_t;

int zccl_topo_distances_count(const zccl_topo_t *topo);
const zccl_topo_distances_t *zccl_topo_distances(const zccl_topo_t *topo, int i);

/* ---- paths -------------------------------------------------------------------------------------------------- */

/**
 * NCCL's path classes, closest first: LOC the same device; PIX through at most one PCIe switch; PXB through several
 * switches without the host bridge; PHB through a host bridge (the CPU of one NUMA node); SYS across the
 * interconnect between sockets/NUMA nodes; NET to another host.
 */
typedef enum {
    ZCCL_PATH_LOC = 0,
    ZCCL_PATH_PIX,
    ZCCL_PATH_PXB,
    ZCCL_PATH_PHB,
    ZCCL_PATH_SYS,
    ZCCL_PATH_NET,
    ZCCL_PATH_COUNT
} zccl_path_t;

/** "LOC", "PIX", ... ("?" out of range). */
const char *zccl_topo_path_name(zccl_path_t path);

/**
 * Classifies the path between two devices of one model. When `hops` is not NULL it receives the number of links
 * on the path (device to switch, switch to switch, to the host bridge, to the CPU, across CPUs). Devices in one
 * switch are PIX; under one switch but through more than one switch PXB; under the same CPU attachment, or
 * attachments whose NUMA nodes overlap, PHB; otherwise SYS.
 */
zccl_path_t zccl_topo_path(const zccl_topo_t *topo, const zccl_topo_dev_t *a, const zccl_topo_dev_t *b, int *hops);

/**
 * Classifies the path between a set of CPUs (a rank's binding) and a device: PHB when the set lies within the
 * device's CPU attachment, SYS otherwise (a rank that may run anywhere is not near anything).
 */
zccl_path_t zccl_topo_path_cpuset(const zccl_topo_t *topo, hwloc_const_cpuset_t cpus, const zccl_topo_dev_t *dev);

/**
 * The NIC(s) a device pairs with: the nearest RDMA-capable NIC(s) (zccl_topo_dev_t.rdma), even when an Ethernet-only
 * port sits closer; only when the model has no RDMA-capable NIC at all, the nearest NIC(s) of any kind
 * (zccl_topo_rdma_nic_count() == 0 tells the caller which rule applied). Nearest: the best path class first, then
 * the fewest hops; all NICs that tie are listed. Writes up to `max` NIC indexes (zccl_topo_dev(topo,
 * ZCCL_TOPO_DEV_NIC, i)) into `nics` in NIC order and returns how many tie (0 when the model has no NIC). *path and
 * *hops (either may be NULL) receive the class and length.
 */
int zccl_topo_nearest_nics(const zccl_topo_t *topo, const zccl_topo_dev_t *dev, int *nics, int max,
                           zccl_path_t *path, int *hops);

/**
 * The OS device names of the NIC(s) the GPU at PCI bus id `busid` pairs with (zccl_topo_nearest_nics: every NIC
 * that ties for nearest, each with all its names in the model's order, e.g. "mlx5_0", "ib0", "eth2"): the rails a
 * rank on that GPU starts its traffic on, as NCCL pairs a GPU with its NIC. Writes up to `max` names into `names`
 * and returns how many; 0 when the model has no GPU at that bus id, no NIC, or no NIC nearer than the others (every
 * NIC ties, as on a machine whose NICs all hang off the host bridge: then no rail is preferred).
 */
int zccl_topo_gpu_nic_names(const zccl_topo_t *topo, const char *busid, char (*names)[ZCCL_TOPO_NAME_LEN], int max);

/** NICs of the model that are RDMA-capable (zccl_topo_dev_t.rdma); 0 means GPU/NIC pairing falls back to any NIC. */
int zccl_topo_rdma_nic_count(const zccl_topo_t *topo);

/**
 * GPUDirect RDMA's path rule (topo_gdr.c): whether `gpu` would move data straight to and from the NIC it pairs with
 * (zccl_topo_nearest_nics; the first of ties), which must be RDMA-capable and within `level` (LOC <= PIX <= PXB <=
 * PHB <= SYS). *nic gets that NIC's index (-1: none), *path the class, why (len bytes) a sentence saying why or why
 * not. The NIC's and GPU's own support is probed elsewhere (transport/ib_gdr_probe.c).
 */
bool zccl_topo_gdr_pair(const zccl_topo_t *topo, const zccl_topo_dev_t *gpu, zccl_path_t level, int *nic,
                        zccl_path_t *path, char *why, size_t len);
/** Parses a GDR level as NCCL_NET_GDR_LEVEL takes it: LOC, PIX, PXB, PHB (or NODE), SYS in any case, or NCCL's
 *  numbers 0..4 (larger: SYS). Returns 0, or -1 for anything else. */
int zccl_topo_gdr_level_parse(const char *s, zccl_path_t *out);

/* ---- nvidia-smi's view: NVLink counts and the NODE class ---------------------------------------------------- */

/**
 * The classes `nvidia-smi topo -m` prints, closest first: X the device itself; NV the GPUs share NVLinks (directly
 * or through NVSwitches; the count comes with it); PIX, PXB as zccl_path_t; PHB under one PCIe host bridge; NODE
 * under different host bridges of one NUMA node / CPU (zccl_path_t calls both PHB, as NCCL does); SYS across the
 * interconnect between NUMA nodes or sockets. In an NCCL file each top-level <pci> of a <cpu> counts as its own host
 * bridge (NCCL files do not record host bridges).
 */
typedef enum {
    ZCCL_SMI_X = 0,
    ZCCL_SMI_NV,
    ZCCL_SMI_PIX,
    ZCCL_SMI_PXB,
    ZCCL_SMI_PHB,
    ZCCL_SMI_NODE,
    ZCCL_SMI_SYS,
    ZCCL_SMI_COUNT
} zccl_smi_path_t;

/**
 * Classifies the path between two devices as nvidia-smi does. When `nvlinks` is not NULL it receives the number of
 * NVLinks between the two (0 unless the class is ZCCL_SMI_NV).
 */
zccl_smi_path_t zccl_topo_smi_path(const zccl_topo_t *topo, const zccl_topo_dev_t *a, const zccl_topo_dev_t *b,
                                   int *nvlinks);

/** Writes the class as nvidia-smi prints it ("NV12", "NODE", "X") into buf (at least 8 bytes); returns buf. */
char *zccl_topo_smi_name(zccl_smi_path_t path, int nvlinks, char *buf, size_t len);

/**
 * NVLinks between two GPUs: links that join them directly, plus, when both have links to NVSwitches, the smaller of
 * their two switch link counts (every GPU of an NVSwitch system reaches every other through all its switch links,
 * which nvidia-smi prints as NV12 on an 8-GPU A100 machine). 0 for non-GPUs, the same GPU, or no NVLink data.
 */
int zccl_topo_nvlinks(const zccl_topo_t *topo, const zccl_topo_dev_t *a, const zccl_topo_dev_t *b);

/**
 * Where the model's NVLink counts came from: "NCCL <nvlink> elements", "hwloc NVLinkBandwidth", "NVML", or NULL
 * when the source has no NVLink information (then no pair is NV#).
 */
const char *zccl_topo_nvlink_source(const zccl_topo_t *topo);

/** Flags for zccl_topo_create_live_ex(). */
enum {
    /** Ask NVML (libnvidia-ml.so.1, opened with dlopen when present) for the NVLinks between GPUs. NVML start-up
     *  takes a noticeable time, so communicators do not ask for it; zccl-topo does. Without the library the model
     *  has no NVLink information (zccl_topo_nvlink_source() is NULL or hwloc's). */
    ZCCL_TOPO_NVML = 1u << 1
};

/** zccl_topo_create_live() with flags (ZCCL_TOPO_NVML or 0). */
zccl_result_t zccl_topo_create_live_ex(unsigned flags, zccl_topo_t **out);

/* ---- locality of a rank ------------------------------------------------------------------------------------- */

/** Value of zccl_locality_t.nic_path when the host has no NIC. */
#define ZCCL_TOPO_NO_NIC 15

/**
 * Where a rank runs: a fixed-size, pointer-free record (40 bytes, native byte order) that ranks exchange at init
 * so that each knows every other rank's place. -1 in a field means "unknown, or the binding spans several".
 */
typedef struct {
    uint64_t host;     /**< host identity supplied by the caller (a hash of hostname and boot id); equal = same host */
    int32_t package;   /**< logical index of the package holding the whole binding */
    int32_t numa;      /**< OS index of the NUMA node holding the whole binding */
    int32_t core;      /**< logical index of the core holding the whole binding */
    int32_t first_pu;  /**< OS index of the first PU of the binding */
    int32_t last_pu;   /**< OS index of the last PU of the binding */
    int32_t npus;      /**< PUs in the binding */
    int32_t nic_path;  /**< closeness to the host's NICs, smaller is closer: the zccl_path_t from the binding to the
                            nearest NIC (PHB or SYS), ZCCL_TOPO_NO_NIC without NIC. Callers may put any score here. */
    uint32_t flags;    /**< reserved, 0 */
} zccl_locality_t;

/** Locality of a set of PUs (OS indexes) in the model; `host` is copied into the result. */
zccl_result_t zccl_topo_locality_of(const zccl_topo_t *topo, hwloc_const_cpuset_t cpus, uint64_t host,
                                    zccl_locality_t *out);

/**
 * Locality of the calling process: its CPU binding (hwloc_get_cpubind) read in the model's numbering. The model
 * must describe this machine: a live model, or a file loaded with ZCCL_TOPO_THIS_SYSTEM.
 */
zccl_result_t zccl_topo_locality_self(const zccl_topo_t *topo, uint64_t host, zccl_locality_t *out);

/** How a simulated or launched rank is bound, as mpirun's --bind-to. */
typedef enum { ZCCL_BIND_NONE = 0, ZCCL_BIND_CORE, ZCCL_BIND_NUMA } zccl_bind_t;
/** How ranks are spread before binding, as mpirun's --map-by (gpu: local rank i next to GPU i). */
typedef enum { ZCCL_MAP_CORE = 0, ZCCL_MAP_NUMA, ZCCL_MAP_PACKAGE, ZCCL_MAP_GPU } zccl_map_t;

/**
 * Whether ranks can be placed on cores: false for a model without CPU cores (an NCCL file whose <cpu> elements give
 * no affinity mask, or that lists GPUs and NICs with no <cpu> at all). zccl_topo_place*() then fail with
 * ZCCL_INVALID_ARGUMENT saying so.
 */
int zccl_topo_has_cores(const zccl_topo_t *topo);

/**
 * The cpuset local rank `rank` of `nranks` on this host would be bound to. map core: rank r on core r; map numa /
 * package: round robin over the NUMA nodes (with cores) / packages, filling each one's cores in order; map gpu: the
 * cores of GPU r's CPU attachment (GPU r mod gpus; an error without GPUs). Ranks beyond the cores wrap around
 * (oversubscription). bind core: that core; bind numa: its NUMA node; bind none: the whole machine.
 * `out` must be allocated by the caller (hwloc_bitmap_alloc).
 */
zccl_result_t zccl_topo_place_cpuset(const zccl_topo_t *topo, int rank, int nranks, zccl_bind_t bind, zccl_map_t map,
                                     hwloc_bitmap_t out);

/** Localities of `nranks` ranks placed on one host as zccl_topo_place_cpuset says; out[nranks]. */
zccl_result_t zccl_topo_place(const zccl_topo_t *topo, int nranks, zccl_bind_t bind, zccl_map_t map, uint64_t host,
                              zccl_locality_t *out);

/** "none"/"core"/"numa", "core"/"numa"/"package"/"gpu"; parse returns -1 for an unknown word. */
const char *zccl_topo_bind_name(zccl_bind_t bind);
const char *zccl_topo_map_name(zccl_map_t map);
int zccl_topo_bind_parse(const char *word);
int zccl_topo_map_parse(const char *word);

/* ---- ring order --------------------------------------------------------------------------------------------- */

/**
 * Orders ranks into a ring: order[i] is the rank at position i, and the ring is order[0] -> order[1] -> ... ->
 * order[n-1] -> order[0]. Ranks of one host are contiguous; within a host, ranks of a package are contiguous, and
 * within it those of a NUMA node, then of a core, so neighbours share the closest level and each boundary is
 * crossed as few times as possible (a single host with P packages: P package crossings). With several hosts each
 * host's segment starts and ends at its ranks with the smallest nic_path (ties broken towards an exit in another
 * package, then another NUMA node), which costs one extra crossing when entry and exit must share a package.
 * A pure function: the same input gives the same order on every rank. n >= 1; order[n].
 */
zccl_result_t zccl_topo_ring_order(const zccl_locality_t *ranks, int n, int *order);

/** How many ring edges cross each level; each edge is counted once, at the outermost level it crosses. */
typedef struct {
    int host;     /**< edges between hosts */
    int package;  /**< same host, different packages */
    int numa;     /**< same package, different NUMA nodes */
    int core;     /**< same NUMA node, different cores */
    int local;    /**< same core (or both unknown at every level) */
} zccl_ring_crossings_t;

/**
 * Counts the boundary crossings of the ring `order` (n entries, n edges including the closing one; a ring of one
 * rank has none). Fields equal to -1 compare equal to each other.
 */
void zccl_topo_ring_crossings(const zccl_locality_t *ranks, int n, const int *order, zccl_ring_crossings_t *out);

/** Writes "0 2 4 6 7 5 3 1" (the order) into buf like snprintf; returns the length it needed. */
size_t zccl_topo_ring_format(const int *order, int n, char *buf, size_t len);

/** True when order[n] holds each of 0..n-1 once. */
int zccl_topo_ring_is_permutation(const int *order, int n);

#ifdef __cplusplus
}
#endif
/* This layer's rows of the settings table (topology/topo_settings.c). */
extern const zccl_cfg_desc_t zccl__set_topo_file;
#define ZCCL_CFG_TOPO_FILE (&zccl__set_topo_file)

#endif

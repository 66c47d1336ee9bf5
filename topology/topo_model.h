/*
 * topo_model.h — the inside of zccl_topo_t, shared by the files of topology/ only. The builders (topo_hwloc*.c,
 * topo_nccl.c) fill it through the append helpers; everything else reads it through topo.h.
 */
#ifndef ZCCL_TOPO_MODEL_H
#define ZCCL_TOPO_MODEL_H

#include "core.h"
#include "topo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    hwloc_bitmap_t cpuset;
    int package;  /* logical index, -1 unknown */
    int numa;     /* OS index of the NUMA node holding the core, -1 unknown */
} zccl_topo_core_t;

/* One NVLink entry as a source gives it: `count` links from device `dev` (a GPU's device id) to the PCI device
 * `target` (a bus id). `to_switch`: the target is an NVSwitch, not a GPU (an NCCL tclass 0x0680xx, hwloc's
 * "NVSwitch" subtype). Targets that are neither a GPU of the model nor a switch (a POWER CPU) are ignored. */
typedef struct {
    int dev;
    char target[ZCCL_TOPO_BUSID_LEN];
    int count;
    int to_switch;
} zccl__topo_nvl_t;

struct zccl_topo {
    zccl_topo_source_t source;
    char origin[512];
    hwloc_topology_t hw;   /* NULL for NCCL XML */
    int this_system;       /* bindings may be read from the OS with this model's numbering */
    int hw_packages;       /* Package objects the source has (0 possible); packages[] has at least one entry */
    int pus;

    hwloc_bitmap_t machine;  /* every PU */
    int npackages, cap_packages;
    hwloc_bitmap_t *packages;
    int nnuma, cap_numa;
    zccl_topo_numa_t *numa;
    int ncores, cap_cores;
    zccl_topo_core_t *cores;
    int ncaches, cap_caches;
    zccl_topo_cache_t *caches;

    int ncpus, cap_cpus;
    zccl_topo_cpu_t *cpus;
    int npci, cap_pci;
    zccl_topo_pci_t *pci;
    int ndevs, cap_devs;
    zccl_topo_dev_t *devs;
    int nkind[ZCCL_TOPO_DEV_KINDS];
    int *kind_ids[ZCCL_TOPO_DEV_KINDS];  /* device ids per kind, filled by zccl__topo_finish */
    int ndist, cap_dist;
    zccl_topo_distances_t *dist;

    /* NVLinks as the builder found them, resolved into `nvl` (ngpus x ngpus link counts) by zccl__topo_finish. */
    int nraw_nvl, cap_raw_nvl;
    zccl__topo_nvl_t *raw_nvl;
    int *nvl;
    const char *nvl_source;  /* static string, NULL: no NVLink information */
};

/** A zeroed model with its machine bitmap allocated; NULL when out of memory. */
zccl_topo_t *zccl__topo_alloc(zccl_topo_source_t source, const char *origin);

/**
 * Appends one zeroed element to a growable array and returns it (NULL when out of memory, reported by the caller).
 * `arr` is the address of the array pointer, `n` and `cap` its length and capacity.
 */
void *zccl__topo_push(void *arr, int *n, int *cap, size_t elem);

/** Appends a CPU attachment with copies of the two sets; returns its index or -1 when out of memory. */
int zccl__topo_add_cpu(zccl_topo_t *t, const char *label, int package, hwloc_const_bitmap_t cpuset,
                       hwloc_const_bitmap_t nodeset);
/** Appends a PCI tree node; returns its index or -1 when out of memory. */
int zccl__topo_add_pci(zccl_topo_t *t, zccl_topo_pci_kind_t kind, const char *busid, int parent, int cpu,
                       double link_gbs);
/** Appends a device (kind decided later by zccl__topo_classify); returns it or NULL when out of memory. */
zccl_topo_dev_t *zccl__topo_add_dev(zccl_topo_t *t, int pci, int cpu);
/** Adds an OS device name to a device (names beyond ZCCL_TOPO_MAX_OSDEVS are dropped with a TRACE message). */
void zccl__topo_dev_add_osdev(zccl_topo_dev_t *d, const char *name);

/** Records NVLinks from GPU device `dev` (see zccl__topo_nvl_t); returns ZCCL_SYSTEM_ERROR when out of memory. */
zccl_result_t zccl__topo_add_nvlink(zccl_topo_t *t, int dev, const char *target, int count, int to_switch);

/** Marks a NIC RDMA-capable with the evidence (the first evidence found is kept). */
void zccl__topo_set_rdma(zccl_topo_dev_t *d, const char *why);

/** Whether an OS device / NCCL <net> name is one of an RDMA device (mlx5_0, ib0, rdmap197s0, efa_0, bnxt_re0...). */
bool zccl__topo_rdma_name(const char *name);

/** Asks NVML (dlopen of libnvidia-ml.so.1) for the NVLinks of the model's GPUs (topo_nvml.c); absent NVML is not
 *  an error: the model keeps what it had. */
zccl_result_t zccl__topo_nvml(zccl_topo_t *t);
/** The same with another library file (the tests' fake NVML). The caller runs zccl__topo_finish afterwards. */
zccl_result_t zccl__topo_nvml_from(zccl_topo_t *t, const char *file);

/** GPU/NIC/PCI from the PCI ids alone (before OS-device hints are applied). */
zccl_topo_dev_kind_t zccl__topo_kind_from_ids(unsigned vendor, unsigned class_id);

/**
 * Completes a model once a builder has filled it: package/NUMA/core fallbacks for sources that lack them, device
 * indexes per kind, device NUMA nodes. Returns ZCCL_SYSTEM_ERROR when out of memory.
 */
zccl_result_t zccl__topo_finish(zccl_topo_t *t);

/** Formats a PCI address as "dddd:bb:dd.f". */
void zccl__topo_busid(char *buf, unsigned domain, unsigned bus, unsigned dev, unsigned func);

/** The name of the XML root element of a file (topo_file.c); an error when the file cannot be read as XML. */
zccl_result_t zccl__topo_xml_root(const char *path, char *name, size_t len);

/** Loads an hwloc topology that is already configured (set_xml/set_synthetic or nothing for live) into a model. */
zccl_result_t zccl__topo_from_hwloc(hwloc_topology_t hw, zccl_topo_source_t source, const char *origin,
                                    int this_system, zccl_topo_t **out);
/** Walks hwloc's I/O tree into the model's CPU attachments, PCI nodes and devices (topo_hwloc_pci.c). */
zccl_result_t zccl__topo_hwloc_io(zccl_topo_t *t);

#ifdef __cplusplus
}
#endif

#endif

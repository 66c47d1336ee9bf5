/*
 * topo_model.c — the model's storage: allocation, the append helpers the builders use, the finishing pass that
 * gives every source the same shape, and the read accessors of topo.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "topo_model.h"

zccl_topo_t *zccl__topo_alloc(zccl_topo_source_t source, const char *origin) {
    zccl_topo_t *t = zccl__calloc(1, sizeof *t);
    if (!t) return NULL;
    t->source = source;
    snprintf(t->origin, sizeof t->origin, "%s", origin ? origin : "");
    t->machine = hwloc_bitmap_alloc();
    if (!t->machine) {
        free(t);
        return NULL;
    }
    return t;
}

void *zccl__topo_push(void *arr, int *n, int *cap, size_t elem) {
    void **p = (void **)arr;
    if (*n == *cap) {
        int ncap = *cap ? 2 * *cap : 8;
        void *grown = realloc(*p, (size_t)ncap * elem);
        if (!grown) return NULL;
        *p = grown;
        *cap = ncap;
    }
    char *slot = (char *)*p + (size_t)(*n)++ * elem;
    memset(slot, 0, elem);
    return slot;
}

int zccl__topo_add_cpu(zccl_topo_t *t, const char *label, int package, hwloc_const_bitmap_t cpuset,
                       hwloc_const_bitmap_t nodeset) {
    zccl_topo_cpu_t *c = zccl__topo_push(&t->cpus, &t->ncpus, &t->cap_cpus, sizeof *c);
    if (!c) return -1;
    snprintf(c->label, sizeof c->label, "%s", label);
    c->package = package;
    c->cpuset = cpuset ? hwloc_bitmap_dup(cpuset) : hwloc_bitmap_alloc();
    c->nodeset = nodeset ? hwloc_bitmap_dup(nodeset) : hwloc_bitmap_alloc();
    if (!c->cpuset || !c->nodeset) return -1; /* freed with the model */
    return t->ncpus - 1;
}

int zccl__topo_add_pci(zccl_topo_t *t, zccl_topo_pci_kind_t kind, const char *busid, int parent, int cpu,
                       double link_gbs) {
    zccl_topo_pci_t *p = zccl__topo_push(&t->pci, &t->npci, &t->cap_pci, sizeof *p);
    if (!p) return -1;
    p->kind = kind;
    snprintf(p->busid, sizeof p->busid, "%s", busid ? busid : "");
    p->parent = parent;
    p->cpu = cpu;
    p->dev = -1;
    p->ports = kind == ZCCL_TOPO_PCI_SWITCH ? 1 : 0;
    p->link_gbs = link_gbs;
    return t->npci - 1;
}

zccl_topo_dev_t *zccl__topo_add_dev(zccl_topo_t *t, int pci, int cpu) {
    zccl_topo_dev_t *d = zccl__topo_push(&t->devs, &t->ndevs, &t->cap_devs, sizeof *d);
    if (!d) return NULL;
    d->id = t->ndevs - 1;
    d->pci = pci;
    d->cpu = cpu;
    d->numa = -1;
    d->kind = ZCCL_TOPO_DEV_PCI;
    if (pci >= 0) t->pci[pci].dev = d->id;
    return d;
}

void zccl__topo_dev_add_osdev(zccl_topo_dev_t *d, const char *name) {
    if (d->nosdevs == ZCCL_TOPO_MAX_OSDEVS) {
        ZCCL_TRACE(ZCCL_LOG_TOPO, "topology: device %s has more than %d OS devices; %s not listed", d->busid,
                   ZCCL_TOPO_MAX_OSDEVS, name);
        return;
    }
    snprintf(d->osdev[d->nosdevs++], ZCCL_TOPO_NAME_LEN, "%s", name);
}

zccl_result_t zccl__topo_add_nvlink(zccl_topo_t *t, int dev, const char *target, int count, int to_switch) {
    if (count <= 0) return ZCCL_SUCCESS;
    zccl__topo_nvl_t *l = zccl__topo_push(&t->raw_nvl, &t->nraw_nvl, &t->cap_raw_nvl, sizeof *l);
    if (!l) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    l->dev = dev;
    snprintf(l->target, sizeof l->target, "%s", target ? target : "");
    l->count = count;
    l->to_switch = to_switch;
    return ZCCL_SUCCESS;
}

void zccl__topo_set_rdma(zccl_topo_dev_t *d, const char *why) {
    if (d->rdma) return;
    d->rdma = 1;
    snprintf(d->rdma_why, sizeof d->rdma_why, "%s", why);
}

bool zccl__topo_rdma_name(const char *name) {
    /* Names the kernel's RDMA drivers give their devices: mlx4_/mlx5_ (ConnectX, InfiniBand or RoCE), rdmap... (EFA,
     * as udev renames it), efa_, bnxt_re, irdma (Intel E810/X722), qedr, hfi1, erdma, cxgb4 (Chelsio iWARP), and
     * the soft-RoCE/iWARP rxe/siw; ib0 is an IPoIB netdev, so its port is InfiniBand. */
    static const char *const prefixes[] = {"mlx4_", "mlx5_", "rdmap", "efa", "bnxt_re", "irdma", "i40iw", "qedr",
                                           "hfi1", "erdma", "cxgb4", "rxe", "siw", "ib", "roce", "hns_"};
    if (!name) return false;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return true;
    return false;
}

/* What the PCI ids alone say about a NIC: class 0x0207 is an InfiniBand controller; Amazon's EFA functions are
 * 1d0f:efa0-efa3 (ENA, 1d0f:ec20, is Ethernet only); Mellanox/NVIDIA ConnectX ports (vendor 0x15b3) are InfiniBand
 * or RoCE. Anything else needs an OS device or <net> entry to count as RDMA-capable. */
static void rdma_from_ids(zccl_topo_dev_t *d) {
    char why[40];
    if (d->class_id == 0x0207) zccl__topo_set_rdma(d, "class 0x0207 InfiniBand");
    if (d->vendor == 0x1d0f && (d->device & 0xfff0) == 0xefa0) {
        snprintf(why, sizeof why, "EFA %04x:%04x", d->vendor, d->device);
        zccl__topo_set_rdma(d, why);
    }
    if (d->vendor == 0x15b3) zccl__topo_set_rdma(d, "Mellanox/NVIDIA ConnectX");
}

/* Resolves the builder's NVLink entries into GPU x GPU link counts. */
static zccl_result_t finish_nvlinks(zccl_topo_t *t) {
    int n = t->nkind[ZCCL_TOPO_DEV_GPU];
    free(t->nvl);
    t->nvl = NULL;
    if (t->nraw_nvl == 0 || n == 0) return ZCCL_SUCCESS;
    int *direct = zccl__calloc((size_t)n * n, sizeof(int)), *sw = zccl__calloc((size_t)n, sizeof(int));
    t->nvl = zccl__calloc((size_t)n * n, sizeof(int));
    if (!direct || !sw || !t->nvl) {
        free(direct);
        free(sw);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    }
    for (int i = 0; i < t->nraw_nvl; i++) {
        const zccl__topo_nvl_t *l = &t->raw_nvl[i];
        const zccl_topo_dev_t *a = &t->devs[l->dev];
        if (a->kind != ZCCL_TOPO_DEV_GPU) continue;
        const zccl_topo_dev_t *b = zccl_topo_dev_by_busid(t, l->target);
        if (b && b->kind == ZCCL_TOPO_DEV_GPU && b->id != a->id) direct[a->index * n + b->index] += l->count;
        else if (l->to_switch) sw[a->index] += l->count;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j) continue;
            /* Each side may list the same links (NCCL dumps both GPUs' views): count them once. */
            int d = direct[i * n + j] > direct[j * n + i] ? direct[i * n + j] : direct[j * n + i];
            int s = sw[i] < sw[j] ? sw[i] : sw[j];
            t->nvl[i * n + j] = d + s;
        }
    free(direct);
    free(sw);
    return ZCCL_SUCCESS;
}

zccl_topo_dev_kind_t zccl__topo_kind_from_ids(unsigned vendor, unsigned class_id) {
    bool gpu_class = class_id == 0x0300 || class_id == 0x0302 || class_id == 0x0380;
    if (gpu_class && (vendor == 0x10de || vendor == 0x1002)) return ZCCL_TOPO_DEV_GPU;
    if ((class_id >> 8) == 0x02) return ZCCL_TOPO_DEV_NIC;
    return ZCCL_TOPO_DEV_PCI;
}

void zccl__topo_busid(char *buf, unsigned domain, unsigned bus, unsigned dev, unsigned func) {
    snprintf(buf, ZCCL_TOPO_BUSID_LEN, "%04x:%02x:%02x.%01x", domain & 0xffffu, bus & 0xffu, dev & 0x1fu,
             func & 0x7u);
}

/* Sources without packages (an hwloc synthetic "core:4", a v1 XML with none) get one package: the machine. */
static zccl_result_t finish_cpu_side(zccl_topo_t *t) {
    if (t->npackages == 0) {
        hwloc_bitmap_t *slot = zccl__topo_push(&t->packages, &t->npackages, &t->cap_packages, sizeof *slot);
        if (!slot || !(*slot = hwloc_bitmap_dup(t->machine))) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    }
    for (int i = 0; i < t->nnuma; i++) {
        zccl_topo_numa_t *m = &t->numa[i];
        m->package = -1;
        for (int p = 0; p < t->npackages && !hwloc_bitmap_iszero(m->cpuset); p++)
            if (hwloc_bitmap_isincluded(m->cpuset, t->packages[p])) m->package = p;
    }
    for (int i = 0; i < t->ncores; i++) {
        zccl_topo_core_t *c = &t->cores[i];
        c->package = -1;
        c->numa = -1;
        for (int p = 0; p < t->npackages; p++)
            if (hwloc_bitmap_isincluded(c->cpuset, t->packages[p])) c->package = p;
        for (int m = 0; m < t->nnuma && c->numa < 0; m++)
            if (hwloc_bitmap_isincluded(c->cpuset, t->numa[m].cpuset)) c->numa = t->numa[m].os_index;
    }
    t->pus = hwloc_bitmap_weight(t->machine);
    if (t->pus < 0) t->pus = 0;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__topo_finish(zccl_topo_t *t) {
    ZCCL_CHECK(finish_cpu_side(t));
    for (int k = 0; k < ZCCL_TOPO_DEV_KINDS; k++) t->nkind[k] = 0;
    for (int i = 0; i < t->ndevs; i++) t->nkind[t->devs[i].kind]++;
    for (int k = 0; k < ZCCL_TOPO_DEV_KINDS; k++) {
        free(t->kind_ids[k]);
        t->kind_ids[k] = zccl__calloc((size_t)t->nkind[k] + 1, sizeof(int));
        if (!t->kind_ids[k]) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        t->nkind[k] = 0;
    }
    for (int i = 0; i < t->ndevs; i++) {
        zccl_topo_dev_t *d = &t->devs[i];
        d->index = t->nkind[d->kind];
        t->kind_ids[d->kind][t->nkind[d->kind]++] = i;
        d->numa = d->cpu >= 0 ? hwloc_bitmap_first(t->cpus[d->cpu].nodeset) : -1;
        if (d->kind == ZCCL_TOPO_DEV_NIC) {
            rdma_from_ids(d);
            for (int k = 0; k < d->nosdevs && !d->rdma; k++)
                if (zccl__topo_rdma_name(d->osdev[k])) {
                    char why[40];
                    snprintf(why, sizeof why, "RDMA device %s", d->osdev[k]);
                    zccl__topo_set_rdma(d, why);
                }
        } else {
            d->rdma = 0;
            d->rdma_why[0] = '\0';
        }
    }
    return finish_nvlinks(t);
}

void zccl_topo_destroy(zccl_topo_t *t) {
    if (!t) return;
    for (int i = 0; i < t->npackages; i++) hwloc_bitmap_free(t->packages[i]);
    for (int i = 0; i < t->nnuma; i++) hwloc_bitmap_free(t->numa[i].cpuset);
    for (int i = 0; i < t->ncores; i++) hwloc_bitmap_free(t->cores[i].cpuset);
    for (int i = 0; i < t->ncpus; i++) {
        hwloc_bitmap_free(t->cpus[i].cpuset);
        hwloc_bitmap_free(t->cpus[i].nodeset);
    }
    for (int i = 0; i < t->ndist; i++) {
        free(t->dist[i].labels);
        free(t->dist[i].values);
    }
    for (int k = 0; k < ZCCL_TOPO_DEV_KINDS; k++) free(t->kind_ids[k]);
    free(t->raw_nvl);
    free(t->nvl);
    free(t->packages);
    free(t->numa);
    free(t->cores);
    free(t->caches);
    free(t->cpus);
    free(t->pci);
    free(t->devs);
    free(t->dist);
    hwloc_bitmap_free(t->machine);
    if (t->hw) hwloc_topology_destroy(t->hw);
    free(t);
}

/* ---- accessors ---------------------------------------------------------------------------------------------- */

zccl_topo_source_t zccl_topo_source(const zccl_topo_t *t) { return t->source; }
const char *zccl_topo_origin(const zccl_topo_t *t) { return t->origin; }
hwloc_topology_t zccl_topo_hwloc(const zccl_topo_t *t) { return t->hw; }

void zccl_topo_counts(const zccl_topo_t *t, zccl_topo_counts_t *out) {
    memset(out, 0, sizeof *out);
    out->packages = t->hw_packages;
    out->numa_nodes = t->nnuma;
    out->cores = t->ncores;
    out->pus = t->pus;
    out->cpus = t->ncpus;
    out->gpus = t->nkind[ZCCL_TOPO_DEV_GPU];
    out->nics = t->nkind[ZCCL_TOPO_DEV_NIC];
    out->pci_devices = 0;
    for (int i = 0; i < t->npci; i++) {
        if (t->pci[i].kind == ZCCL_TOPO_PCI_DEVICE) out->pci_devices++;
        if (t->pci[i].kind == ZCCL_TOPO_PCI_SWITCH) out->switches++;
    }
}

int zccl_topo_numa_count(const zccl_topo_t *t) { return t->nnuma; }
const zccl_topo_numa_t *zccl_topo_numa(const zccl_topo_t *t, int i) {
    return i >= 0 && i < t->nnuma ? &t->numa[i] : NULL;
}
hwloc_const_cpuset_t zccl_topo_package_cpuset(const zccl_topo_t *t, int i) {
    return i >= 0 && i < t->npackages ? t->packages[i] : NULL;
}
int zccl_topo_cache_count(const zccl_topo_t *t) { return t->ncaches; }
const zccl_topo_cache_t *zccl_topo_cache(const zccl_topo_t *t, int i) {
    return i >= 0 && i < t->ncaches ? &t->caches[i] : NULL;
}
int zccl_topo_cpu_count(const zccl_topo_t *t) { return t->ncpus; }
const zccl_topo_cpu_t *zccl_topo_cpu(const zccl_topo_t *t, int i) {
    return i >= 0 && i < t->ncpus ? &t->cpus[i] : NULL;
}
int zccl_topo_pci_count(const zccl_topo_t *t) { return t->npci; }
const zccl_topo_pci_t *zccl_topo_pci_node(const zccl_topo_t *t, int i) {
    return i >= 0 && i < t->npci ? &t->pci[i] : NULL;
}
int zccl_topo_dev_count(const zccl_topo_t *t, zccl_topo_dev_kind_t kind) {
    return (unsigned)kind < ZCCL_TOPO_DEV_KINDS ? t->nkind[kind] : 0;
}
const zccl_topo_dev_t *zccl_topo_dev(const zccl_topo_t *t, zccl_topo_dev_kind_t kind, int i) {
    if ((unsigned)kind >= ZCCL_TOPO_DEV_KINDS || i < 0 || i >= t->nkind[kind]) return NULL;
    return &t->devs[t->kind_ids[kind][i]];
}
int zccl_topo_dev_total(const zccl_topo_t *t) { return t->ndevs; }
const zccl_topo_dev_t *zccl_topo_dev_at(const zccl_topo_t *t, int id) {
    return id >= 0 && id < t->ndevs ? &t->devs[id] : NULL;
}
const zccl_topo_dev_t *zccl_topo_dev_by_busid(const zccl_topo_t *t, const char *busid) {
    for (int i = 0; busid && i < t->ndevs; i++)
        if (t->devs[i].busid[0] && strcasecmp(t->devs[i].busid, busid) == 0) return &t->devs[i];
    return NULL;
}
int zccl_topo_rdma_nic_count(const zccl_topo_t *t) {
    int n = 0;
    for (int i = 0; i < t->nkind[ZCCL_TOPO_DEV_NIC]; i++) n += t->devs[t->kind_ids[ZCCL_TOPO_DEV_NIC][i]].rdma != 0;
    return n;
}
const char *zccl_topo_nvlink_source(const zccl_topo_t *t) { return t->nvl ? t->nvl_source : NULL; }
int zccl_topo_has_cores(const zccl_topo_t *t) { return t->ncores > 0; }
int zccl_topo_distances_count(const zccl_topo_t *t) { return t->ndist; }
const zccl_topo_distances_t *zccl_topo_distances(const zccl_topo_t *t, int i) {
    return i >= 0 && i < t->ndist ? &t->dist[i] : NULL;
}

char *zccl_topo_dev_numa_list(const zccl_topo_t *t, const zccl_topo_dev_t *dev, char *buf, size_t len) {
    if (!len) return buf;
    buf[0] = '\0';
    if (dev->cpu < 0 || hwloc_bitmap_iszero(t->cpus[dev->cpu].nodeset)) {
        snprintf(buf, len, "-");
        return buf;
    }
    size_t used = 0;
    int i;
    hwloc_bitmap_foreach_begin(i, t->cpus[dev->cpu].nodeset) {
        int n = snprintf(buf + used, len - used, "%s%d", used ? "," : "", i);
        if (n < 0 || (size_t)n >= len - used) break;
        used += (size_t)n;
    }
    hwloc_bitmap_foreach_end();
    return buf;
}

const char *zccl_topo_path_name(zccl_path_t path) {
    static const char *const names[ZCCL_PATH_COUNT] = {"LOC", "PIX", "PXB", "PHB", "SYS", "NET"};
    return (unsigned)path < ZCCL_PATH_COUNT ? names[path] : "?";
}

/*
 * topo_path.c — NCCL's path classes between devices of one model, and each device's nearest NICs.
 *
 * The PCI tree is at switch granularity (topo_hwloc_pci.c), so classes follow from the lowest node two devices
 * share: a switch with no other switch on the way is PIX, a switch reached through other switches is PXB, a host
 * bridge is PHB. Devices in different PCI trees meet at the CPU side: the same CPU attachment, or attachments of
 * one package whose NUMA nodes overlap, is PHB (through the root complex of one CPU); anything else crosses the
 * socket interconnect, SYS. Hops count links, the CPU-to-CPU link included, and break ties between NICs of one class.
 */
#include "topo_model.h"

#define MAX_DEPTH 64
#define GPU_NICS_MAX 64 /* NICs tying for nearest that zccl_topo_gpu_nic_names reads */

/* The device's PCI node and its ancestors, nearest first; returns how many. */
static int chain(const zccl_topo_t *t, const zccl_topo_dev_t *d, int *out) {
    int n = 0;
    for (int p = d->pci; p >= 0 && n < MAX_DEPTH; p = t->pci[p].parent) out[n++] = p;
    return n;
}

static zccl_path_t cpu_side_path(const zccl_topo_t *t, int ca, int cb) {
    if (ca == cb) return ZCCL_PATH_PHB;
    if (ca < 0 || cb < 0) return ZCCL_PATH_SYS;
    const zccl_topo_cpu_t *a = &t->cpus[ca], *b = &t->cpus[cb];
    if (a->package >= 0 && b->package >= 0 && a->package != b->package) return ZCCL_PATH_SYS;
    return hwloc_bitmap_intersects(a->nodeset, b->nodeset) ? ZCCL_PATH_PHB : ZCCL_PATH_SYS;
}

zccl_path_t zccl_topo_path(const zccl_topo_t *t, const zccl_topo_dev_t *a, const zccl_topo_dev_t *b, int *hops) {
    int h = 0;
    zccl_path_t path;
    if (a == b || a->id == b->id) {
        path = ZCCL_PATH_LOC;
        goto out;
    }
    int ca[MAX_DEPTH], cb[MAX_DEPTH];
    int na = chain(t, a, ca), nb = chain(t, b, cb);
    for (int i = 0; i < na; i++) {
        for (int j = 0; j < nb; j++) {
            if (ca[i] != cb[j]) continue;
            /* Lowest common node: i links up from a, j links up from b. */
            const zccl_topo_pci_t *c = &t->pci[ca[i]];
            h = i + j;
            if (c->kind == ZCCL_TOPO_PCI_HOSTBRIDGE) {
                path = ZCCL_PATH_PHB;
                goto out;
            }
            int switches = 1;
            for (int k = 1; k < i; k++) switches += t->pci[ca[k]].kind == ZCCL_TOPO_PCI_SWITCH;
            for (int k = 1; k < j; k++) switches += t->pci[cb[k]].kind == ZCCL_TOPO_PCI_SWITCH;
            path = switches == 1 ? ZCCL_PATH_PIX : ZCCL_PATH_PXB;
            goto out;
        }
    }
    /* Separate trees: up to the CPU side (one link per node, at least one for a device without PCI). */
    h = (na ? na : 1) + (nb ? nb : 1);
    path = cpu_side_path(t, a->cpu, b->cpu);
    if (path == ZCCL_PATH_SYS) h++;
out:
    if (hops) *hops = h;
    return path;
}

zccl_path_t zccl_topo_path_cpuset(const zccl_topo_t *t, hwloc_const_cpuset_t cpus, const zccl_topo_dev_t *dev) {
    if (!cpus || dev->cpu < 0 || hwloc_bitmap_iszero(cpus)) return ZCCL_PATH_SYS;
    const zccl_topo_cpu_t *c = &t->cpus[dev->cpu];
    return hwloc_bitmap_isincluded(cpus, c->cpuset) ? ZCCL_PATH_PHB : ZCCL_PATH_SYS;
}

int zccl_topo_nearest_nics(const zccl_topo_t *t, const zccl_topo_dev_t *dev, int *nics, int max, zccl_path_t *path,
                           int *hops) {
    zccl_path_t best = ZCCL_PATH_COUNT;
    int best_hops = 0, found = 0;
    /* RDMA-capable NICs only, unless the model has none: an Ethernet-only port next to the GPU carries no GPU
     * traffic between hosts, whatever its distance. */
    bool rdma_only = zccl_topo_rdma_nic_count(t) > 0;
    for (int i = 0; i < t->nkind[ZCCL_TOPO_DEV_NIC]; i++) {
        const zccl_topo_dev_t *nic = &t->devs[t->kind_ids[ZCCL_TOPO_DEV_NIC][i]];
        if (nic->id == dev->id || (rdma_only && !nic->rdma)) continue;
        int h;
        zccl_path_t p = zccl_topo_path(t, dev, nic, &h);
        if (p < best || (p == best && h < best_hops)) {
            best = p;
            best_hops = h;
            found = 0;
        }
        if (p == best && h == best_hops) {
            if (found < max && nics) nics[found] = i;
            found++;
        }
    }
    if (path) *path = found ? best : ZCCL_PATH_COUNT;
    if (hops) *hops = found ? best_hops : 0;
    return found;
}

int zccl_topo_gpu_nic_names(const zccl_topo_t *t, const char *busid, char (*names)[ZCCL_TOPO_NAME_LEN], int max) {
    const zccl_topo_dev_t *gpu = t && busid && busid[0] ? zccl_topo_dev_by_busid(t, busid) : NULL;
    if (!gpu || gpu->kind != ZCCL_TOPO_DEV_GPU || max <= 0) return 0;
    int nics[GPU_NICS_MAX];
    const int found = zccl_topo_nearest_nics(t, gpu, nics, GPU_NICS_MAX, NULL, NULL);
    int candidates = 0;
    const bool rdma_only = zccl_topo_rdma_nic_count(t) > 0;
    for (int i = 0; i < t->nkind[ZCCL_TOPO_DEV_NIC]; i++)
        candidates += !rdma_only || t->devs[t->kind_ids[ZCCL_TOPO_DEV_NIC][i]].rdma;
    if (found == 0 || (found == candidates && found > 1)) return 0; /* no NIC nearer than the others */
    int n = 0;
    for (int j = 0; j < found && j < GPU_NICS_MAX; j++) {
        const zccl_topo_dev_t *nic = zccl_topo_dev(t, ZCCL_TOPO_DEV_NIC, nics[j]);
        for (int o = 0; nic && o < nic->nosdevs && n < max; o++)
            snprintf(names[n++], ZCCL_TOPO_NAME_LEN, "%s", nic->osdev[o]);
    }
    return n;
}

/* ---- nvidia-smi's classes ----------------------------------------------------------------------------------- */

int zccl_topo_nvlinks(const zccl_topo_t *t, const zccl_topo_dev_t *a, const zccl_topo_dev_t *b) {
    if (!t || !a || !b || !t->nvl || a->kind != ZCCL_TOPO_DEV_GPU || b->kind != ZCCL_TOPO_DEV_GPU || a->id == b->id)
        return 0;
    return t->nvl[a->index * t->nkind[ZCCL_TOPO_DEV_GPU] + b->index];
}

/* The top of a device's PCI tree: its host bridge, or in a source without host bridges (NCCL files) the topmost
 * node below the CPU, which stands for one. -1 for a device without PCI. */
static int tree_root(const zccl_topo_t *t, const zccl_topo_dev_t *d) {
    int p = d->pci;
    while (p >= 0 && t->pci[p].parent >= 0 && t->pci[p].kind != ZCCL_TOPO_PCI_HOSTBRIDGE) p = t->pci[p].parent;
    return p;
}

zccl_smi_path_t zccl_topo_smi_path(const zccl_topo_t *t, const zccl_topo_dev_t *a, const zccl_topo_dev_t *b,
                                   int *nvlinks) {
    int nv = 0;
    zccl_smi_path_t cls;
    if (a->id == b->id) {
        cls = ZCCL_SMI_X;
    } else if ((nv = zccl_topo_nvlinks(t, a, b)) > 0) {
        cls = ZCCL_SMI_NV;
    } else {
        switch (zccl_topo_path(t, a, b, NULL)) {
        case ZCCL_PATH_LOC: cls = ZCCL_SMI_X; break;
        case ZCCL_PATH_PIX: cls = ZCCL_SMI_PIX; break;
        case ZCCL_PATH_PXB: cls = ZCCL_SMI_PXB; break;
        case ZCCL_PATH_PHB: {
            /* One host bridge (or, in a source without host bridges, one top-level PCI tree): PHB; otherwise the
             * path runs between host bridges inside one NUMA node / CPU: NODE. */
            int ra = tree_root(t, a), rb = tree_root(t, b);
            cls = ra >= 0 && ra == rb ? ZCCL_SMI_PHB : ZCCL_SMI_NODE;
            break;
        }
        default: cls = ZCCL_SMI_SYS; break;
        }
    }
    if (nvlinks) *nvlinks = nv;
    return cls;
}

char *zccl_topo_smi_name(zccl_smi_path_t path, int nvlinks, char *buf, size_t len) {
    static const char *const names[ZCCL_SMI_COUNT] = {"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"};
    if (!buf || !len) return buf;
    if (path == ZCCL_SMI_NV) snprintf(buf, len, "NV%d", nvlinks);
    else snprintf(buf, len, "%s", (unsigned)path < ZCCL_SMI_COUNT ? names[path] : "?");
    return buf;
}

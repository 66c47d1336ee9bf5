/*
 * topo_hwloc_pci.c — hwloc's I/O tree into the model: CPU attachments, the PCI tree at switch granularity, and the
 * devices (GPUs, NICs, other PCI devices, OS devices that hang off the CPU side).
 *
 * hwloc lists every PCI bridge: the root port below a host bridge, then for a PCIe switch its upstream port and
 * one bridge per downstream port, and so on for cascaded switches. Path classes are about switches, not ports, so
 * we count bridge levels below each host bridge: level 0 (the root port) is transparent, an odd level opens a
 * switch and the even level below it (its downstream ports) is merged into that switch. That is the pairing NCCL
 * makes when it walks a device's sysfs path two directories at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hwloc.h>
#include "topo_model.h"

typedef struct {
    zccl_topo_t *t;
    hwloc_obj_t *cpu_obj; /* the hwloc object of each CPU attachment, in attachment order */
    int ncpu_obj, cap_cpu_obj;
} walker_t;

static int attachment(walker_t *w, hwloc_obj_t o) {
    for (int i = 0; i < w->ncpu_obj; i++)
        if (w->cpu_obj[i] == o) return i;
    char label[48], type[32];
    hwloc_obj_type_snprintf(type, sizeof type, o, 0);
    if (o->type == HWLOC_OBJ_MACHINE) snprintf(label, sizeof label, "%s", type);
    else if (o->type == HWLOC_OBJ_NUMANODE) snprintf(label, sizeof label, "%s P#%u", type, o->os_index);
    else snprintf(label, sizeof label, "%s L#%u", type, o->logical_index);
    hwloc_obj_t pkg = o->type == HWLOC_OBJ_PACKAGE ? o : hwloc_get_ancestor_obj_by_type(w->t->hw, HWLOC_OBJ_PACKAGE, o);
    hwloc_obj_t *slot = zccl__topo_push(&w->cpu_obj, &w->ncpu_obj, &w->cap_cpu_obj, sizeof *slot);
    if (!slot) return -1;
    *slot = o;
    return zccl__topo_add_cpu(w->t, label, pkg ? (int)pkg->logical_index : -1, o->cpuset, o->nodeset);
}

static bool name_starts(const char *name, const char *prefix) {
    return name && strncmp(name, prefix, strlen(prefix)) == 0;
}

/*
 * What an OS device below a PCI device says about it: CUDA/NVML/RSMI mean GPU. An OpenFabrics device does not make
 * a NIC: NICs are PCI class 0x02xx (old InfiniBand HCAs of class 0x0c06 stay plain PCI devices), as EXPECTED.md and
 * NCCL count them.
 */
static void apply_osdev_hint(zccl_topo_dev_t *d, hwloc_obj_t os) {
    const char *sub = os->subtype;
    hwloc_obj_osdev_type_t type = os->attr->osdev.type;
    bool cuda = (sub && strcmp(sub, "CUDA") == 0) || name_starts(os->name, "cuda");
    bool smi = (sub && (strcmp(sub, "NVML") == 0 || strcmp(sub, "RSMI") == 0)) || name_starts(os->name, "nvml") ||
               name_starts(os->name, "rsmi");
    bool gpu = (type == HWLOC_OBJ_OSDEV_COPROC && cuda) || (type == HWLOC_OBJ_OSDEV_GPU && smi);
    if (gpu) d->kind = ZCCL_TOPO_DEV_GPU;
    /* An OpenFabrics (verbs) device makes the NIC RDMA-capable: InfiniBand HCAs, RoCE ports, EFA, usNIC. Kept
     * for any device; zccl__topo_finish clears it on devices that did not end up NICs. */
    if (type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
        char why[40];
        snprintf(why, sizeof why, "OpenFabrics %.24s", os->name ? os->name : "?");
        zccl__topo_set_rdma(d, why);
    }
}

static zccl_result_t walk_io(walker_t *w, hwloc_obj_t o, int parent, int cpu, int level);

static zccl_result_t walk_children(walker_t *w, hwloc_obj_t o, int parent, int cpu, int level) {
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) ZCCL_CHECK(walk_io(w, c, parent, cpu, level));
    return ZCCL_SUCCESS;
}

static zccl_result_t add_pci_device(walker_t *w, hwloc_obj_t o, int parent, int cpu) {
    zccl_topo_t *t = w->t;
    const struct hwloc_pcidev_attr_s *a = &o->attr->pcidev;
    char busid[ZCCL_TOPO_BUSID_LEN];
    zccl__topo_busid(busid, a->domain, a->bus, a->dev, a->func);
    int node = zccl__topo_add_pci(t, ZCCL_TOPO_PCI_DEVICE, busid, parent, cpu, a->linkspeed);
    zccl_topo_dev_t *d = node < 0 ? NULL : zccl__topo_add_dev(t, node, cpu);
    if (!d) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    memcpy(d->busid, busid, sizeof busid);
    d->vendor = a->vendor_id;
    d->device = a->device_id;
    d->class_id = a->class_id;
    d->link_gbs = a->linkspeed;
    if (a->linkspeed > 0) snprintf(d->link, sizeof d->link, "%.2f GB/s", a->linkspeed);
    const char *product = hwloc_obj_get_info_by_name(o, "PCIDevice");
    snprintf(d->name, sizeof d->name, "%s", product ? product : "");
    d->kind = zccl__topo_kind_from_ids(a->vendor_id, a->class_id);
    int id = d->id;
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
        if (c->type == HWLOC_OBJ_OS_DEVICE) {
            zccl_topo_dev_t *dd = &t->devs[id]; /* re-read: walking children may grow the array */
            zccl__topo_dev_add_osdev(dd, c->name ? c->name : "?");
            apply_osdev_hint(dd, c);
        } else {
            ZCCL_CHECK(walk_io(w, c, node, cpu, 1));
        }
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t add_bridge(walker_t *w, hwloc_obj_t o, int parent, int cpu, int level) {
    zccl_topo_t *t = w->t;
    const struct hwloc_bridge_attr_s *b = &o->attr->bridge;
    if (b->upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
        char busid[ZCCL_TOPO_BUSID_LEN];
        snprintf(busid, sizeof busid, "%04x:[%02x-%02x]", (unsigned)b->downstream.pci.domain & 0xffffu,
                 b->downstream.pci.secondary_bus, b->downstream.pci.subordinate_bus);
        int node = zccl__topo_add_pci(t, ZCCL_TOPO_PCI_HOSTBRIDGE, busid, parent, cpu, 0);
        if (node < 0) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        return walk_children(w, o, node, cpu, 0);
    }
    if (level == 0) return walk_children(w, o, parent, cpu, 1); /* root port: transparent */
    if (level % 2 == 0 && parent >= 0 && t->pci[parent].kind == ZCCL_TOPO_PCI_SWITCH) {
        t->pci[parent].ports++; /* a downstream port of the switch above */
        return walk_children(w, o, parent, cpu, level + 1);
    }
    const struct hwloc_pcidev_attr_s *u = &b->upstream.pci;
    char busid[ZCCL_TOPO_BUSID_LEN];
    zccl__topo_busid(busid, u->domain, u->bus, u->dev, u->func);
    int node = zccl__topo_add_pci(t, ZCCL_TOPO_PCI_SWITCH, busid, parent, cpu, u->linkspeed);
    if (node < 0) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    /* An odd level opens a switch; the next level holds its downstream ports. */
    return walk_children(w, o, node, cpu, level % 2 ? level + 1 : level + 2);
}

static zccl_result_t walk_io(walker_t *w, hwloc_obj_t o, int parent, int cpu, int level) {
    switch (o->type) {
    case HWLOC_OBJ_BRIDGE: return add_bridge(w, o, parent, cpu, level);
    case HWLOC_OBJ_PCI_DEVICE: return add_pci_device(w, o, parent, cpu);
    case HWLOC_OBJ_OS_DEVICE: {
        /* An OS device that is not below a PCI device: a block device or NIC the OS could not place on PCI. */
        zccl_topo_dev_t *d = zccl__topo_add_dev(w->t, -1, cpu);
        if (!d) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        d->kind = ZCCL_TOPO_DEV_OSDEV;
        zccl__topo_dev_add_osdev(d, o->name ? o->name : "?");
        snprintf(d->name, sizeof d->name, "%s", o->subtype ? o->subtype : "");
        return ZCCL_SUCCESS;
    }
    default: return ZCCL_SUCCESS;
    }
}

static zccl_result_t walk_cpu_side(walker_t *w, hwloc_obj_t o) {
    if (o->io_arity > 0) {
        int cpu = attachment(w, o);
        if (cpu < 0) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        ZCCL_CHECK(walk_children(w, o, -1, cpu, 0));
    }
    for (hwloc_obj_t c = o->first_child; c; c = c->next_sibling) ZCCL_CHECK(walk_cpu_side(w, c));
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__topo_hwloc_io(zccl_topo_t *t) {
    walker_t w = {.t = t};
    zccl_result_t res = walk_cpu_side(&w, hwloc_get_root_obj(t->hw));
    free(w.cpu_obj);
    return res;
}

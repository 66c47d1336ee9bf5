/*
 * topo_hwloc.c — models built through hwloc: the live machine, hwloc XML files (v1 and v2 exports) and synthetic
 * descriptions. This file loads the topology and reads the CPU side (packages, NUMA nodes, cores, caches) and the
 * distance matrices; topo_hwloc_pci.c reads the I/O side.
 *
 * hwloc drops every I/O object by default. We ask for all of them from files (the file is all we will ever know
 * about that machine) and for the important ones on the live machine (GPUs, NICs, storage, the bridges above them;
 * not every chipset function).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hwloc.h>
#include "topo_model.h"

static zccl_result_t read_packages_numa_cores(zccl_topo_t *t) {
    hwloc_topology_t hw = t->hw;
    hwloc_bitmap_copy(t->machine, hwloc_topology_get_topology_cpuset(hw));
    t->hw_packages = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
    for (int i = 0; i < t->hw_packages; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_PACKAGE, (unsigned)i);
        hwloc_bitmap_t *slot = zccl__topo_push(&t->packages, &t->npackages, &t->cap_packages, sizeof *slot);
        if (!slot || !(*slot = hwloc_bitmap_dup(o->cpuset))) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    }
    int nnuma = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nnuma; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        zccl_topo_numa_t *m = zccl__topo_push(&t->numa, &t->nnuma, &t->cap_numa, sizeof *m);
        if (!m || !(m->cpuset = hwloc_bitmap_dup(o->cpuset))) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        m->os_index = (int)o->os_index;
        m->memory = o->attr ? o->attr->numanode.local_memory : 0;
    }
    /* Cores: hwloc's Core objects; a source without them (synthetic "pu:4") gets one core per PU. */
    hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int ncores = hwloc_get_nbobjs_by_type(hw, core_type);
    for (int i = 0; i < ncores; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(hw, core_type, (unsigned)i);
        zccl_topo_core_t *c = zccl__topo_push(&t->cores, &t->ncores, &t->cap_cores, sizeof *c);
        if (!c || !(c->cpuset = hwloc_bitmap_dup(o->cpuset))) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    }
    return ZCCL_SUCCESS;
}

static int cache_cmp(const void *pa, const void *pb) {
    const zccl_topo_cache_t *a = pa, *b = pb;
    if (a->level != b->level) return a->level - b->level;
    if (a->type != b->type) return a->type - b->type;
    return a->size < b->size ? -1 : a->size > b->size;
}

/* Caches are summarised per (level, type, size): "L2 unified 1 MiB x 16". Hybrid CPUs give two L2 lines. */
static zccl_result_t read_caches(zccl_topo_t *t) {
    int depth = hwloc_topology_get_depth(t->hw);
    for (int d = 0; d < depth; d++) {
        hwloc_obj_type_t type = hwloc_get_depth_type(t->hw, d);
        if (!hwloc_obj_type_is_cache(type)) continue;
        for (hwloc_obj_t o = hwloc_get_next_obj_by_depth(t->hw, d, NULL); o;
             o = hwloc_get_next_obj_by_depth(t->hw, d, o)) {
            char kind = o->attr->cache.type == HWLOC_OBJ_CACHE_DATA          ? 'd'
                        : o->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION ? 'i'
                                                                             : 'u';
            zccl_topo_cache_t *c = NULL;
            for (int i = 0; i < t->ncaches; i++)
                if (t->caches[i].level == (int)o->attr->cache.depth && t->caches[i].type == kind &&
                    t->caches[i].size == o->attr->cache.size)
                    c = &t->caches[i];
            if (!c) {
                c = zccl__topo_push(&t->caches, &t->ncaches, &t->cap_caches, sizeof *c);
                if (!c) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
                c->level = (int)o->attr->cache.depth;
                c->type = kind;
                c->size = o->attr->cache.size;
                c->linesize = o->attr->cache.linesize;
            }
            c->count++;
        }
    }
    if (t->ncaches > 1) qsort(t->caches, (size_t)t->ncaches, sizeof *t->caches, cache_cmp);
    return ZCCL_SUCCESS;
}

static void object_label(hwloc_obj_t o, char *buf, size_t len) {
    char type[16];
    hwloc_obj_type_snprintf(type, sizeof type, o, 0);
    if (o->type == HWLOC_OBJ_OS_DEVICE && o->name) snprintf(buf, len, "%s", o->name);
    else if (o->type == HWLOC_OBJ_NUMANODE) snprintf(buf, len, "NUMA P#%u", o->os_index);
    else if (o->type == HWLOC_OBJ_PU) snprintf(buf, len, "PU P#%u", o->os_index);
    else snprintf(buf, len, "%s L#%u", type, o->logical_index);
}

/* The model's device for an hwloc object of a distance matrix: a PCI device, or the PCI device above an OS device. */
static const zccl_topo_dev_t *dev_of(zccl_topo_t *t, hwloc_obj_t o) {
    while (o && o->type == HWLOC_OBJ_OS_DEVICE) o = o->parent;
    if (!o || o->type != HWLOC_OBJ_PCI_DEVICE) return NULL;
    char busid[ZCCL_TOPO_BUSID_LEN];
    const struct hwloc_pcidev_attr_s *a = &o->attr->pcidev;
    zccl__topo_busid(busid, a->domain, a->bus, a->dev, a->func);
    return zccl_topo_dev_by_busid(t, busid);
}

/*
 * hwloc's "NVLinkBandwidth" matrix (its NVML backend, or a file exported with it) into NVLink entries. hwloc stores
 * bandwidth, MB/s summed over the links: 20000 per NVLink 1 link, 25000 per NVLink 2 link, 50000 per NVLink 3/4
 * link; the file does not say which version, so the link width is the largest of 50000, 25000 and 20000 that divides
 * every GPU value of the matrix (a P100 pair at 40000 is NV2; a V100 machine whose pairs all have two links, 50000,
 * would read as NV1). Peers that are NVSwitches (subtype "NVSwitch") are switch links; CPUs are ignored.
 */
static zccl_result_t read_nvlink_bandwidth(zccl_topo_t *t, struct hwloc_distances_s *h) {
    static const uint64_t widths[] = {50000, 25000, 20000};
    uint64_t width = 0;
    for (size_t w = 0; w < sizeof widths / sizeof *widths && !width; w++) {
        bool divides = true;
        for (unsigned i = 0; i < h->nbobjs; i++)
            for (unsigned j = 0; j < h->nbobjs; j++)
                if (i != j && h->values[i * h->nbobjs + j] % widths[w]) divides = false;
        if (divides) width = widths[w];
    }
    if (!width) {
        ZCCL_WARN(ZCCL_LOG_TOPO, "topology from %s: NVLinkBandwidth values are not multiples of a known NVLink "
                                 "width; NVLink counts left out", t->origin);
        return ZCCL_SUCCESS;
    }
    for (unsigned i = 0; i < h->nbobjs; i++) {
        const zccl_topo_dev_t *a = dev_of(t, h->objs[i]);
        if (!a || a->kind != ZCCL_TOPO_DEV_GPU) continue;
        for (unsigned j = 0; j < h->nbobjs; j++) {
            uint64_t v = h->values[i * h->nbobjs + j];
            if (i == j || v == 0) continue;
            hwloc_obj_t peer = h->objs[j];
            bool nvswitch = peer && peer->subtype && strcmp(peer->subtype, "NVSwitch") == 0;
            const zccl_topo_dev_t *b = dev_of(t, peer);
            if (!nvswitch && (!b || b->kind != ZCCL_TOPO_DEV_GPU)) continue;
            char target[ZCCL_TOPO_BUSID_LEN];
            if (b) snprintf(target, sizeof target, "%s", b->busid);
            else snprintf(target, sizeof target, "nvsw%u", j);
            ZCCL_CHECK(zccl__topo_add_nvlink(t, a->id, target, (int)(v / width), nvswitch));
        }
    }
    t->nvl_source = "hwloc NVLinkBandwidth";
    return ZCCL_SUCCESS;
}

static zccl_result_t read_distances(zccl_topo_t *t) {
    unsigned nr = 0;
    if (hwloc_distances_get(t->hw, &nr, NULL, 0, 0) < 0 || nr == 0) return ZCCL_SUCCESS;
    struct hwloc_distances_s **all = zccl__calloc(nr, sizeof *all);
    if (!all) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    zccl_result_t res = ZCCL_SUCCESS;
    if (hwloc_distances_get(t->hw, &nr, all, 0, 0) < 0) {
        free(all);
        return ZCCL_SUCCESS; /* distances are optional: a matrix we cannot read is left out */
    }
    for (unsigned i = 0; i < nr && res == ZCCL_SUCCESS; i++) {
        struct hwloc_distances_s *h = all[i];
        zccl_topo_distances_t *d = zccl__topo_push(&t->dist, &t->ndist, &t->cap_dist, sizeof *d);
        if (!d) {
            res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
            break;
        }
        const char *name = hwloc_distances_get_name(t->hw, h);
        snprintf(d->name, sizeof d->name, "%s", name ? name : "");
        d->kind = h->kind;
        d->n = (int)h->nbobjs;
        d->labels = zccl__calloc(h->nbobjs ? h->nbobjs : 1, sizeof *d->labels);
        d->values = zccl__calloc((size_t)h->nbobjs * h->nbobjs + 1, sizeof *d->values);
        if (!d->labels || !d->values) {
            res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
            break;
        }
        for (unsigned j = 0; j < h->nbobjs; j++) object_label(h->objs[j], d->labels[j], ZCCL_TOPO_NAME_LEN);
        memcpy(d->values, h->values, (size_t)h->nbobjs * h->nbobjs * sizeof *d->values);
        if (strcmp(d->name, "NVLinkBandwidth") == 0) res = read_nvlink_bandwidth(t, h);
    }
    for (unsigned i = 0; i < nr; i++) hwloc_distances_release(t->hw, all[i]);
    free(all);
    return res;
}

zccl_result_t zccl__topo_from_hwloc(hwloc_topology_t hw, zccl_topo_source_t source, const char *origin,
                                    int this_system, zccl_topo_t **out) {
    zccl_topo_t *t = zccl__topo_alloc(source, origin);
    if (!t) {
        hwloc_topology_destroy(hw);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the topology model");
    }
    t->hw = hw;
    t->this_system = this_system;
    zccl_result_t res;
    ZCCL_CHECK_GOTO(read_packages_numa_cores(t), res, fail);
    ZCCL_CHECK_GOTO(read_caches(t), res, fail);
    ZCCL_CHECK_GOTO(zccl__topo_hwloc_io(t), res, fail);
    ZCCL_CHECK_GOTO(read_distances(t), res, fail);
    ZCCL_CHECK_GOTO(zccl__topo_finish(t), res, fail);
#define S_(n) ((n) == 1 ? "" : "s")
    ZCCL_INFO(ZCCL_LOG_TOPO, "topology from %s: %d package%s, %d NUMA node%s, %d core%s, %d PU%s, %d GPU%s, %d NIC%s",
              t->origin, t->hw_packages, S_(t->hw_packages), t->nnuma, S_(t->nnuma), t->ncores, S_(t->ncores), t->pus,
              S_(t->pus), t->nkind[ZCCL_TOPO_DEV_GPU], S_(t->nkind[ZCCL_TOPO_DEV_GPU]), t->nkind[ZCCL_TOPO_DEV_NIC],
              S_(t->nkind[ZCCL_TOPO_DEV_NIC]));
#undef S_
    *out = t;
    return ZCCL_SUCCESS;
fail:
    zccl_topo_destroy(t);
    return res;
}

/* A new hwloc topology that keeps instruction caches (hwloc drops them by default) and the given I/O objects. */
static zccl_result_t new_hwloc(hwloc_topology_t *hw, enum hwloc_type_filter_e io) {
    if (hwloc_topology_init(hw) < 0) return zccl__syserror(errno, "hwloc_topology_init failed");
    hwloc_topology_set_icache_types_filter(*hw, HWLOC_TYPE_FILTER_KEEP_ALL);
    hwloc_topology_set_io_types_filter(*hw, io);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl_topo_create_live(zccl_topo_t **out) { return zccl_topo_create_live_ex(0, out); }

zccl_result_t zccl_topo_create_live_ex(unsigned flags, zccl_topo_t **out) {
    if (!out) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_create_live: out is NULL");
    if (flags & ~(unsigned)ZCCL_TOPO_NVML)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_create_live_ex: unknown flags 0x%x", flags);
    hwloc_topology_t hw;
    ZCCL_CHECK(new_hwloc(&hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT));
    /* Every rank loads the topology at init: skip the backends that are slow and tell nothing about placement
     * (OpenCL initialises every platform, GL queries X displays). PCI classes find the GPUs without them. */
    hwloc_topology_set_components(hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "opencl");
    hwloc_topology_set_components(hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "gl");
    if (hwloc_topology_load(hw) < 0) {
        int err = errno;
        hwloc_topology_destroy(hw);
        return zccl__syserror(err, "hwloc could not discover this machine");
    }
    zccl_topo_t *t;
    ZCCL_CHECK(zccl__topo_from_hwloc(hw, ZCCL_TOPO_SRC_LIVE, "this machine", 1, &t));
    if (flags & ZCCL_TOPO_NVML) {
        zccl_result_t res = zccl__topo_nvml(t);
        if (res == ZCCL_SUCCESS) res = zccl__topo_finish(t);
        if (res != ZCCL_SUCCESS) {
            zccl_topo_destroy(t);
            return res;
        }
    }
    *out = t;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl_topo_create_hwloc_xml(const char *path, unsigned flags, zccl_topo_t **out) {
    if (!path || !out) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_create_hwloc_xml: path or out is NULL");
    char root[64];
    ZCCL_CHECK(zccl__topo_xml_root(path, root, sizeof root)); /* names a missing or non-XML file clearly */
    if (strcmp(root, "topology") != 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s is not an hwloc XML topology: its root element is <%s>%s", path,
                           root, strcmp(root, "system") == 0 ? " (an NCCL topology file?)" : "");
    hwloc_topology_t hw;
    ZCCL_CHECK(new_hwloc(&hw, HWLOC_TYPE_FILTER_KEEP_ALL));
    if (flags & ZCCL_TOPO_THIS_SYSTEM) hwloc_topology_set_flags(hw, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM);
    if (hwloc_topology_set_xml(hw, path) < 0) {
        int err = errno;
        hwloc_topology_destroy(hw);
        return zccl__error(ZCCL_INVALID_ARGUMENT, "hwloc cannot read %s as an XML topology: %s", path, strerror(err));
    }
    if (hwloc_topology_load(hw) < 0) {
        int err = errno;
        hwloc_topology_destroy(hw);
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s is not a valid hwloc XML topology (hwloc: %s)", path,
                           strerror(err));
    }
    return zccl__topo_from_hwloc(hw, ZCCL_TOPO_SRC_HWLOC_XML, path, (flags & ZCCL_TOPO_THIS_SYSTEM) != 0, out);
}

zccl_result_t zccl_topo_create_synthetic(const char *description, zccl_topo_t **out) {
    if (!description || !out)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_create_synthetic: description or out is NULL");
    hwloc_topology_t hw;
    ZCCL_CHECK(new_hwloc(&hw, HWLOC_TYPE_FILTER_KEEP_NONE));
    if (hwloc_topology_set_synthetic(hw, description) < 0) {
        hwloc_topology_destroy(hw);
        return zccl__error(ZCCL_INVALID_ARGUMENT, "invalid hwloc synthetic topology \"%s\"", description);
    }
    if (hwloc_topology_load(hw) < 0) {
        int err = errno;
        hwloc_topology_destroy(hw);
        return zccl__error(ZCCL_INVALID_ARGUMENT, "hwloc could not build synthetic topology \"%s\": %s",
                           description, strerror(err));
    }
    return zccl__topo_from_hwloc(hw, ZCCL_TOPO_SRC_SYNTHETIC, description, 0, out);
}

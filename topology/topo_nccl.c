/*
 * topo_nccl.c — models from NCCL topology files (the XML given to NCCL_TOPO_FILE, published by cloud vendors whose
 * VMs hide the PCI tree), parsed with libxml2.
 *
 *   <system version="1">
 *     <cpu numaid="0" affinity="0000ffff,..." arch vendor familyid modelid>
 *       <pci busid="ffff:ff:01.0" class="0x060400" link_speed="16 GT/s" link_width="16">   a switch
 *         <pci busid="0000:10:1c.0" class="0x030200" vendor="0x10de" ...> <gpu dev="0" .../> </pci>
 *         <pci busid="0000:10:1b.0" class="0x020000" ...> <nic> <net name="mlx5_0" .../> </nic> </pci>
 *       </pci>
 *       <nic> <net .../> </nic>                                                          a NIC without PCI
 *     </cpu>
 *   </system>
 *
 * Each <cpu> is one CPU attachment, one package and one NUMA node (the file has no finer CPU information; each PU
 * of its affinity counts as a core). A <pci> of class 0x0604xx, or one that holds other <pci> elements, is a
 * switch; any other <pci> is a device.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include "topo_model.h"

typedef struct {
    zccl_topo_t *t;
    const char *path;
} reader_t;

static bool is_elem(xmlNodePtr n, const char *name) {
    return n->type == XML_ELEMENT_NODE && xmlStrcmp(n->name, (const xmlChar *)name) == 0;
}

/* Copies an attribute into buf ("" when absent); returns whether it was present. */
static bool attr(xmlNodePtr n, const char *name, char *buf, size_t len) {
    xmlChar *v = xmlGetProp(n, (const xmlChar *)name);
    snprintf(buf, len, "%s", v ? (const char *)v : "");
    xmlFree(v);
    return v != NULL;
}

/* A hexadecimal attribute ("0x10de", "10de"); absent is 0. Malformed values are an error naming the place. */
static zccl_result_t attr_hex(reader_t *r, xmlNodePtr n, const char *name, unsigned *out) {
    char v[64];
    *out = 0;
    if (!attr(n, name, v, sizeof v) || !v[0]) return ZCCL_SUCCESS;
    char *end;
    errno = 0;
    unsigned long x = strtoul(v, &end, 16);
    if (errno || *end || x > 0xffffffffu)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%ld: <%s> attribute %s=\"%s\" is not a hexadecimal number",
                           r->path, xmlGetLineNo(n), (const char *)n->name, name, v);
    *out = (unsigned)x;
    return ZCCL_SUCCESS;
}

static zccl_result_t parse_busid(reader_t *r, xmlNodePtr n, char *busid) {
    char v[64];
    unsigned dom, bus, dev, fn;
    char tail;
    if (!attr(n, "busid", v, sizeof v))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%ld: <pci> without busid", r->path, xmlGetLineNo(n));
    if (sscanf(v, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4 || dom > 0xffff || bus > 0xff || dev > 0x1f ||
        fn > 7)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%ld: <pci> busid=\"%s\" is not a PCI address dddd:bb:dd.f",
                           r->path, xmlGetLineNo(n), v);
    zccl__topo_busid(busid, dom, bus, dev, fn);
    return ZCCL_SUCCESS;
}

/* "16 GT/s" x 16 lanes -> GB/s, with 8b/10b encoding up to 5 GT/s and 128b/130b above. */
static double link_gbs(const char *speed, int width) {
    double gts = strtod(speed, NULL);
    if (gts <= 0 || width <= 0) return 0;
    double encoding = gts <= 5.0 ? 0.8 : 128.0 / 130.0;
    return gts * width * encoding / 8.0;
}

static zccl_result_t read_pci(reader_t *r, xmlNodePtr n, int parent, int cpu);

/*
 * The <net> entries of a <nic>: their names become OS device names. NCCL writes a <net> for each network device
 * its network plugin found; an InfiniBand/RoCE/EFA device has a port GUID (guid="0x1e95b50003fd7010") and may allow
 * GPUDirect RDMA (gdr="1"), while its socket transport's Ethernet interfaces have neither. RDMA device names
 * (mlx5_0, rdmap..., efa_0) are recognised when the model is finished.
 */
static void read_nic_names(zccl_topo_dev_t *d, xmlNodePtr nic) {
    for (xmlNodePtr c = nic->children; c; c = c->next) {
        if (!is_elem(c, "net")) continue;
        char name[ZCCL_TOPO_NAME_LEN], guid[40], gdr[8], why[40];
        if (!attr(c, "name", name, sizeof name) || !name[0]) snprintf(name, sizeof name, "net");
        zccl__topo_dev_add_osdev(d, name);
        if (attr(c, "guid", guid, sizeof guid) && strtoull(guid, NULL, 0) != 0) {
            snprintf(why, sizeof why, "net %.20s has a GUID", name);
            zccl__topo_set_rdma(d, why);
        }
        if (attr(c, "gdr", gdr, sizeof gdr) && strcmp(gdr, "1") == 0) {
            snprintf(why, sizeof why, "net %.20s gdr=1", name);
            zccl__topo_set_rdma(d, why);
        }
    }
}

/* <nvlink target="0000:c3:00.0" count="2" tclass="0x068000"/> inside a <gpu>: links to another GPU, or to an
 * NVSwitch (tclass 0x0680xx, a "bridge, other" PCI class). A malformed count is an error naming the place. */
static zccl_result_t read_nvlinks(reader_t *r, int dev, xmlNodePtr gpu) {
    for (xmlNodePtr c = gpu->children; c; c = c->next) {
        if (!is_elem(c, "nvlink")) continue;
        char target[64], count_s[16], busid[ZCCL_TOPO_BUSID_LEN];
        unsigned tclass, dom, bus, d, fn;
        char tail;
        ZCCL_CHECK(attr_hex(r, c, "tclass", &tclass));
        if (!attr(c, "target", target, sizeof target) ||
            sscanf(target, "%x:%x:%x.%x%c", &dom, &bus, &d, &fn, &tail) != 4 || dom > 0xffff || bus > 0xff ||
            d > 0x1f || fn > 7)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%ld: <nvlink> target=\"%s\" is not a PCI address",
                               r->path, xmlGetLineNo(c), target);
        zccl__topo_busid(busid, dom, bus, d, fn);
        long count = 1;
        if (attr(c, "count", count_s, sizeof count_s)) {
            char *end;
            count = strtol(count_s, &end, 10);
            if (end == count_s || *end || count < 0 || count > 1024)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%ld: <nvlink> count=\"%s\" is not a link count",
                                   r->path, xmlGetLineNo(c), count_s);
        }
        if (tclass > 0xffff) tclass >>= 8;
        ZCCL_CHECK(zccl__topo_add_nvlink(r->t, dev, busid, (int)count, tclass == 0x0680));
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t read_device(reader_t *r, xmlNodePtr n, const char *busid, int parent, int cpu, unsigned cls,
                                 double gbs, const char *link) {
    unsigned vendor, device;
    ZCCL_CHECK(attr_hex(r, n, "vendor", &vendor));
    ZCCL_CHECK(attr_hex(r, n, "device", &device));
    int node = zccl__topo_add_pci(r->t, ZCCL_TOPO_PCI_DEVICE, busid, parent, cpu, gbs);
    zccl_topo_dev_t *d = node < 0 ? NULL : zccl__topo_add_dev(r->t, node, cpu);
    if (!d) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    snprintf(d->busid, sizeof d->busid, "%s", busid);
    d->vendor = vendor;
    d->device = device;
    d->class_id = cls;
    d->link_gbs = gbs;
    snprintf(d->link, sizeof d->link, "%s", link);
    /* NCCL files often leave out the vendor: then the class decides, as it does for NCCL. */
    d->kind = zccl__topo_kind_from_ids(vendor ? vendor : 0x10de, d->class_id);
    for (xmlNodePtr c = n->children; c; c = c->next) {
        if (is_elem(c, "gpu")) {
            char dev[16], name[ZCCL_TOPO_NAME_LEN];
            d->kind = ZCCL_TOPO_DEV_GPU;
            if (attr(c, "dev", dev, sizeof dev)) {
                snprintf(name, sizeof name, "cuda%s", dev);
                zccl__topo_dev_add_osdev(d, name);
            }
            int id = d->id; /* read_nvlinks appends to other arrays only, but keep the id, not the pointer */
            ZCCL_CHECK(read_nvlinks(r, id, c));
            d = &r->t->devs[id];
        } else if (is_elem(c, "nic")) {
            if (d->kind == ZCCL_TOPO_DEV_PCI) d->kind = ZCCL_TOPO_DEV_NIC;
            read_nic_names(d, c);
        }
    }
    return ZCCL_SUCCESS;
}

static zccl_result_t read_pci(reader_t *r, xmlNodePtr n, int parent, int cpu) {
    char busid[ZCCL_TOPO_BUSID_LEN], speed[16], width_s[16], link[24] = "";
    unsigned cls;
    ZCCL_CHECK(parse_busid(r, n, busid));
    ZCCL_CHECK(attr_hex(r, n, "class", &cls));
    attr(n, "link_speed", speed, sizeof speed);
    attr(n, "link_width", width_s, sizeof width_s);
    int width = atoi(width_s);
    double gbs = link_gbs(speed, width);
    if (speed[0] && width > 0) snprintf(link, sizeof link, "%s x%d", speed, width);
    else if (speed[0]) snprintf(link, sizeof link, "%s", speed);
    /* NCCL writes class and programming interface (0x030200); a 16-bit class (0x0302) is accepted too. */
    if (cls > 0xffff) cls >>= 8;
    bool has_pci_child = false;
    for (xmlNodePtr c = n->children; c; c = c->next) has_pci_child |= is_elem(c, "pci");
    if (cls != 0x0604 && !has_pci_child) return read_device(r, n, busid, parent, cpu, cls, gbs, link);
    int node = zccl__topo_add_pci(r->t, ZCCL_TOPO_PCI_SWITCH, busid, parent, cpu, gbs);
    if (node < 0) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    for (xmlNodePtr c = n->children; c; c = c->next)
        if (is_elem(c, "pci")) ZCCL_CHECK(read_pci(r, c, node, cpu));
    return ZCCL_SUCCESS;
}

static zccl_result_t read_cpu(reader_t *r, xmlNodePtr n, int index) {
    zccl_topo_t *t = r->t;
    char numa_s[16], aff[512], arch[32], vendor[32];
    int numa = index;
    if (attr(n, "numaid", numa_s, sizeof numa_s)) {
        char *end;
        long v = strtol(numa_s, &end, 10);
        if (end == numa_s || *end || v < 0 || v > 65535)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%ld: <cpu> numaid=\"%s\" is not a NUMA node number",
                               r->path, xmlGetLineNo(n), numa_s);
        numa = (int)v;
    }
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc(), nodes = hwloc_bitmap_alloc();
    zccl_result_t res = ZCCL_SUCCESS;
    if (!cpus || !nodes) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        goto out;
    }
    if (attr(n, "affinity", aff, sizeof aff) && aff[0] && hwloc_bitmap_sscanf(cpus, aff) < 0) {
        res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%ld: <cpu> affinity=\"%s\" is not a CPU mask", r->path,
                          xmlGetLineNo(n), aff);
        goto out;
    }
    hwloc_bitmap_set(nodes, (unsigned)numa);
    attr(n, "arch", arch, sizeof arch);
    attr(n, "vendor", vendor, sizeof vendor);
    char label[48];
    snprintf(label, sizeof label, "CPU numa %d", numa);
    int package = t->npackages;
    int cpu = zccl__topo_add_cpu(t, label, package, cpus, nodes);
    hwloc_bitmap_t *pkg = zccl__topo_push(&t->packages, &t->npackages, &t->cap_packages, sizeof *pkg);
    zccl_topo_numa_t *m = zccl__topo_push(&t->numa, &t->nnuma, &t->cap_numa, sizeof *m);
    if (cpu < 0 || !pkg || !(*pkg = hwloc_bitmap_dup(cpus)) || !m || !(m->cpuset = hwloc_bitmap_dup(cpus))) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        goto out;
    }
    m->os_index = numa;
    hwloc_bitmap_or(t->machine, t->machine, cpus);
    int pu;
    hwloc_bitmap_foreach_begin(pu, cpus) {
        zccl_topo_core_t *c = zccl__topo_push(&t->cores, &t->ncores, &t->cap_cores, sizeof *c);
        if (!c || !(c->cpuset = hwloc_bitmap_alloc())) {
            res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
            break;
        }
        hwloc_bitmap_only(c->cpuset, (unsigned)pu);
    }
    hwloc_bitmap_foreach_end();
    for (xmlNodePtr c = n->children; c && res == ZCCL_SUCCESS; c = c->next) {
        if (is_elem(c, "pci")) {
            res = read_pci(r, c, -1, cpu);
        } else if (is_elem(c, "nic")) {
            zccl_topo_dev_t *d = zccl__topo_add_dev(t, -1, cpu);
            if (!d) res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
            else {
                d->kind = ZCCL_TOPO_DEV_NIC;
                read_nic_names(d, c);
            }
        }
    }
out:
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
    return res;
}

static zccl_result_t read_system(reader_t *r, xmlDocPtr doc) {
    xmlNodePtr root = xmlDocGetRootElement(doc);
    if (!root || !is_elem(root, "system"))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: root element is <%s>, an NCCL topology file has <system>",
                           r->path, root ? (const char *)root->name : "(none)");
    char version[16];
    if (attr(root, "version", version, sizeof version) && strcmp(version, "1") != 0)
        ZCCL_WARN(ZCCL_LOG_TOPO, "%s: NCCL topology version \"%s\" (zccl knows version 1); reading it anyway",
                  r->path, version);
    int ncpu = 0, loose = 0;
    for (xmlNodePtr c = root->children; c; c = c->next) {
        if (is_elem(c, "cpu")) ZCCL_CHECK(read_cpu(r, c, ncpu++));
        else loose += is_elem(c, "pci") || is_elem(c, "nic");
    }
    if (ncpu == 0 && loose == 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s: <system> holds no <cpu>, <pci> or <nic> element", r->path);
    r->t->hw_packages = r->t->npackages;
    if (loose) {
        /* Devices outside any <cpu> (vendor files that list GPUs and NICs only): they hang off one CPU attachment
         * without CPUs or NUMA node, so paths between them still follow the PCI tree, and nothing claims cores. */
        int cpu = zccl__topo_add_cpu(r->t, "CPU (not in the file)", -1, NULL, NULL);
        if (cpu < 0) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
        for (xmlNodePtr c = root->children; c; c = c->next) {
            if (is_elem(c, "pci")) {
                ZCCL_CHECK(read_pci(r, c, -1, cpu));
            } else if (is_elem(c, "nic")) {
                zccl_topo_dev_t *d = zccl__topo_add_dev(r->t, -1, cpu);
                if (!d) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
                d->kind = ZCCL_TOPO_DEV_NIC;
                read_nic_names(d, c);
            }
        }
    }
    return ZCCL_SUCCESS;
}

/* Parses the file; XML_PARSE_NOERROR keeps libxml2 quiet, the error is reported once through zccl__error. */
static zccl_result_t xml_read(const char *path, xmlDocPtr *out) {
    FILE *f = fopen(path, "r");
    if (!f) return zccl__error(ZCCL_INVALID_ARGUMENT, "cannot open topology file %s: %s", path, strerror(errno));
    fclose(f);
    xmlParserCtxtPtr ctx = xmlNewParserCtxt();
    if (!ctx) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the XML parser");
    xmlDocPtr doc = xmlCtxtReadFile(ctx, path, NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    zccl_result_t res = ZCCL_SUCCESS;
    if (!doc) {
        const xmlError *e = xmlCtxtGetLastError(ctx);
        char msg[256] = "unknown error";
        if (e && e->message) {
            snprintf(msg, sizeof msg, "%s", e->message);
            size_t l = strlen(msg);
            if (l && msg[l - 1] == '\n') msg[l - 1] = '\0';
        }
        res = zccl__error(ZCCL_INVALID_ARGUMENT, "%s:%d: not well-formed XML: %s", path, e ? e->line : 0, msg);
    }
    xmlFreeParserCtxt(ctx);
    if (res == ZCCL_SUCCESS) *out = doc;
    return res;
}

zccl_result_t zccl_topo_create_nccl_xml(const char *path, unsigned flags, zccl_topo_t **out) {
    if (!path || !out) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_create_nccl_xml: path or out is NULL");
    xmlDocPtr doc;
    ZCCL_CHECK(xml_read(path, &doc));
    zccl_topo_t *t = zccl__topo_alloc(ZCCL_TOPO_SRC_NCCL_XML, path);
    if (!t) {
        xmlFreeDoc(doc);
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the topology model");
    }
    t->this_system = (flags & ZCCL_TOPO_THIS_SYSTEM) != 0;
    reader_t r = {.t = t, .path = path};
    zccl_result_t res = read_system(&r, doc);
    xmlFreeDoc(doc);
    t->nvl_source = "NCCL <nvlink> elements";
    if (res == ZCCL_SUCCESS) res = zccl__topo_finish(t);
    if (res != ZCCL_SUCCESS) {
        zccl_topo_destroy(t);
        return res;
    }
#define S_(n) ((n) == 1 ? "" : "s")
    ZCCL_INFO(ZCCL_LOG_TOPO, "topology from NCCL file %s: %d CPU%s, %d GPU%s, %d NIC%s", path, t->ncpus, S_(t->ncpus),
              t->nkind[ZCCL_TOPO_DEV_GPU], S_(t->nkind[ZCCL_TOPO_DEV_GPU]), t->nkind[ZCCL_TOPO_DEV_NIC],
              S_(t->nkind[ZCCL_TOPO_DEV_NIC]));
#undef S_
    *out = t;
    return ZCCL_SUCCESS;
}

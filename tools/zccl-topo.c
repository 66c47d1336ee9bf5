/*
 * zccl-topo — what zccl sees of a machine and what it would do with it: a summary (sockets, NUMA nodes, cores,
 * caches, GPUs and NICs with bus id, link speed and NUMA node), a path matrix like `nvidia-smi topo -m` (NV#, PIX,
 * PXB, PHB, NODE, SYS), the RDMA-capable NIC each GPU pairs with, and the ring zccl would build for a simulated
 * placement of ranks (files without CPU cores get everything but the ring). Output as text, JSON (jansson) or Graphviz DOT, which
 * `dot` renders to SVG or PNG. The machine is this one, ZCCL_TOPO_FILE, or another one given with --xml
 * (hwloc export), --nccl-xml (NCCL topology file) or --synthetic (hwloc synthetic description).
 *
 * docs/topology.md shows the output and explains every column.
 */
#include <errno.h>
#include <jansson.h>
#include "core.h"
#include "transport.h"
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "topo.h"
#include "gdr.h"
#include "zccl_mesh.h"
#include "zccl_version.h"

static void print_gdr(const zccl_topo_t *t);

extern char **environ;

typedef enum { OUT_TEXT, OUT_JSON, OUT_DOT, OUT_SVG, OUT_PNG } out_mode_t;

typedef struct {
    const char *xml, *nccl_xml, *synthetic, *render_file;
    const char *mode_opt; /* the output option given (--json, --dot, --svg, --png); NULL: the text summary */
    out_mode_t mode;
    int ranks, hosts;       /* ranks: 0 = default */
    int bind, map;          /* map: -1 = default */
    const char *mesh;       /* --mesh SPEC: print the mesh's groups instead of the machine */
    int mesh_flags;
    bool rails;             /* --rails: this host's TCP rails instead of the machine model */
} opts_t;

typedef struct {
    int placed;    /* 0: the model has no CPU cores, so no placement or ring (the rest of the report stands) */
    int n, hosts;
    zccl_bind_t bind;
    zccl_map_t map;
    zccl_locality_t *loc;
    int *order, *identity;
    zccl_ring_crossings_t cross, cross_identity;
} sim_t;

static void usage(FILE *f) {
    fprintf(f,
            "usage: zccl-topo [SOURCE] [PLACEMENT] [OUTPUT]\n"
            "Shows the machine model zccl builds (hwloc), the path classes between GPUs and NICs as nvidia-smi\n"
            "topo -m prints them (NV# from NCCL <nvlink>, hwloc or NVML data; NODE), the RDMA-capable NIC each GPU\n"
            "pairs with, and the ring zccl would order for a placement of ranks (not for a file without CPU cores).\n\n"
            "SOURCE (default: the file named by ZCCL_TOPO_FILE if set, else this machine)\n"
            "  --xml FILE          an hwloc XML export of a machine (lstopo FILE.xml), v1 or v2 format\n"
            "  --nccl-xml FILE     an NCCL topology file (<system version=\"1\">, as given to NCCL_TOPO_FILE)\n"
            "  --synthetic DESC    an hwloc synthetic topology, e.g. \"pack:2 numa:2 core:4 pu:2\"\n\n"
            "PLACEMENT of the simulated ranks (as mpirun --map-by / --bind-to)\n"
            "  --ranks N           ranks in all (default: one per GPU, else one per core up to 16)\n"
            "  --hosts H           spread the ranks over H identical hosts, in blocks (default 1)\n"
            "  --bind core|numa|none   what each rank is bound to (default core)\n"
            "  --map core|numa|package|gpu   how ranks are spread before binding (default: gpu when the\n"
            "                      machine has GPUs, else package, i.e. round robin over the sockets)\n\n"
            "MESH (zccl_mesh.h; instead of the machine report)\n"
            "  --mesh DPxPPxTP     the groups zccl_mesh_create forms for --ranks (default: the product) ranks\n"
            "                      placed on --hosts hosts in blocks, as zcclrun places them: AxB is dp x tp,\n"
            "                      AxBxC dp x pp x tp, or name=size,name=size,... (outermost first)\n"
            "  --mesh-allow-cross-host   accept an innermost group that spans hosts\n\n"
            "OUTPUT (default: text)\n"
            "  --json              JSON document\n"
            "  --dot               Graphviz DOT of the PCI tree and the ring\n"
            "  --svg FILE, --png FILE   render the DOT picture with Graphviz's dot into FILE\n"
            "  (one output format at a time: --json, --dot, --svg and --png exclude each other)\n"
            "  --rails             this host's TCP rails (interfaces zccl stripes over between hosts, ZCCL_SOCKET_IFNAME\n"
            "                      and ZCCL_TCP_RAILS applied) and the rail each local rank starts on (--ranks N, default\n"
            "                      4), then exit\n"
            "  --version           print the version and exit\n"
            "  -h, --help          this text\n");
}

static int bad(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "zccl-topo: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry 'zccl-topo --help'.\n");
    return 2;
}

static int parse_count(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof range, "an integer in [%d, %d]", lo, hi);
        fprintf(stderr, "zccl-topo: %s needs %s, got \"%s\"\nTry 'zccl-topo --help'.\n", opt, range, v ? v : "");
        return 2;
    }
    *out = (int)x;
    return 0;
}

static int parse_args(int argc, char **argv, opts_t *o) {
    memset(o, 0, sizeof *o);
    o->hosts = 1;
    o->bind = ZCCL_BIND_CORE;
    o->map = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--version")) {
            printf("zccl-topo (zccl) %s\n", ZCCL_VERSION_STRING);
            exit(0);
        } else if ((!strcmp(a, "--json") || !strcmp(a, "--dot") || !strcmp(a, "--svg") ||
                    !strcmp(a, "--png")) && o->mode_opt && strcmp(o->mode_opt, a))
            return bad("give one output format: %s and %s were both given", o->mode_opt, a);
        else if (!strcmp(a, "--mesh-allow-cross-host")) o->mesh_flags = ZCCL_MESH_ALLOW_CROSS_HOST, takes = false;
        else if (!strcmp(a, "--mesh")) {
            if (!v) return bad("--mesh needs a shape such as 2x4 or dp=2,tp=4%s%s", "", "");
            o->mesh = v;
        } else if (!strcmp(a, "--json")) o->mode = OUT_JSON, o->mode_opt = a, takes = false;
        else if (!strcmp(a, "--rails")) o->rails = true, takes = false;
        else if (!strcmp(a, "--dot")) o->mode = OUT_DOT, o->mode_opt = a, takes = false;
        else if (!v && (!strcmp(a, "--xml") || !strcmp(a, "--nccl-xml") || !strcmp(a, "--synthetic") ||
                        !strcmp(a, "--svg") || !strcmp(a, "--png") || !strcmp(a, "--ranks") ||
                        !strcmp(a, "--hosts") || !strcmp(a, "--bind") || !strcmp(a, "--map")))
            return bad("option %s needs a value%s", a, "");
        else if (!strcmp(a, "--xml")) o->xml = v;
        else if (!strcmp(a, "--nccl-xml")) o->nccl_xml = v;
        else if (!strcmp(a, "--synthetic")) o->synthetic = v;
        else if (!strcmp(a, "--svg")) o->mode = OUT_SVG, o->mode_opt = a, o->render_file = v;
        else if (!strcmp(a, "--png")) o->mode = OUT_PNG, o->mode_opt = a, o->render_file = v;
        else if (!strcmp(a, "--ranks")) {
            if (parse_count(a, v, 1, 65536, &o->ranks)) return 2;
        } else if (!strcmp(a, "--hosts")) {
            if (parse_count(a, v, 1, 4096, &o->hosts)) return 2;
        } else if (!strcmp(a, "--bind")) {
            if ((o->bind = zccl_topo_bind_parse(v)) < 0)
                return bad("--bind: \"%s\" is not core, numa or none%s", v, "");
        } else if (!strcmp(a, "--map")) {
            if ((o->map = zccl_topo_map_parse(v)) < 0)
                return bad("--map: \"%s\" is not core, numa, package or gpu%s", v, "");
        } else return bad("unknown argument \"%s\"%s", a, "");
        if (takes) i++;
    }
    if (!!o->xml + !!o->nccl_xml + !!o->synthetic > 1)
        return bad("give one of --xml, --nccl-xml and --synthetic%s%s", "", "");
    if (o->ranks && o->ranks < o->hosts) return bad("--ranks must be at least --hosts%s%s", "", "");
    return 0;
}

static zccl_result_t load(const opts_t *o, zccl_topo_t **t) {
    if (o->xml) return zccl_topo_create_hwloc_xml(o->xml, 0, t);
    if (o->nccl_xml) return zccl_topo_create_nccl_xml(o->nccl_xml, 0, t);
    if (o->synthetic) return zccl_topo_create_synthetic(o->synthetic, t);
    /* ZCCL_TOPO_FILE: the same setting the library reads (util/config.c), here for the machine it describes. */
    const char *file = zccl__cfg_str(ZCCL_CFG_TOPO_FILE);
    if (file && *file) return zccl_topo_create_file(file, ZCCL_TOPO_THIS_SYSTEM, t);
    return zccl_topo_create_live_ex(ZCCL_TOPO_NVML, t);
}

/* ---- the simulated placement and its ring ------------------------------------------------------------------- */

static zccl_result_t simulate(const zccl_topo_t *t, const opts_t *o, sim_t *s) {
    zccl_topo_counts_t c;
    zccl_topo_counts(t, &c);
    memset(s, 0, sizeof *s);
    s->hosts = o->hosts;
    if (!zccl_topo_has_cores(t)) return ZCCL_SUCCESS; /* s->placed = 0: the reports say why */
    s->placed = 1;
    s->n = o->ranks ? o->ranks : (c.gpus ? c.gpus : (c.cores < 16 ? c.cores : 16)) * o->hosts;
    if (s->n < 1) s->n = 1;
    s->bind = (zccl_bind_t)o->bind;
    s->map = o->map >= 0 ? (zccl_map_t)o->map : c.gpus ? ZCCL_MAP_GPU : ZCCL_MAP_PACKAGE;
    s->loc = calloc((size_t)s->n, sizeof *s->loc);
    s->order = calloc((size_t)s->n, sizeof *s->order);
    s->identity = calloc((size_t)s->n, sizeof *s->identity);
    if (!s->loc || !s->order || !s->identity) {
        fprintf(stderr, "zccl-topo: out of memory for %d ranks\n", s->n);
        return ZCCL_SYSTEM_ERROR;
    }
    for (int h = 0, first = 0; h < s->hosts; h++) {
        int local = s->n / s->hosts + (h < s->n % s->hosts);
        zccl_result_t res = zccl_topo_place(t, local, s->bind, s->map, (uint64_t)h, s->loc + first);
        if (res != ZCCL_SUCCESS) return res;
        first += local;
    }
    for (int i = 0; i < s->n; i++) s->identity[i] = i;
    zccl_result_t res = zccl_topo_ring_order(s->loc, s->n, s->order);
    if (res != ZCCL_SUCCESS) return res;
    zccl_topo_ring_crossings(s->loc, s->n, s->order, &s->cross);
    zccl_topo_ring_crossings(s->loc, s->n, s->identity, &s->cross_identity);
    return ZCCL_SUCCESS;
}

/* ---- small formatting helpers ------------------------------------------------------------------------------- */

static const char *kind_name(zccl_topo_dev_kind_t k) {
    static const char *const n[] = {"GPU", "NIC", "PCI", "OSDEV"};
    return (unsigned)k < ZCCL_TOPO_DEV_KINDS ? n[k] : "?";
}

static void bytes_text(uint64_t b, char *buf, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    double v = (double)b;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    snprintf(buf, len, v == (double)(uint64_t)v ? "%.0f %s" : "%.1f %s", v, u[i]);
}

static void osdev_list(const zccl_topo_dev_t *d, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->nosdevs && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%s", i ? "," : "", d->osdev[i]);
        if (n > 0) used += (size_t)n;
    }
    if (!d->nosdevs) snprintf(buf, len, "-");
}

static void dev_label(const zccl_topo_dev_t *d, char *buf, size_t len) {
    snprintf(buf, len, "%s%d", kind_name(d->kind), d->index);
}

static const char *source_name(zccl_topo_source_t s) {
    static const char *const n[] = {"live", "hwloc-xml", "nccl-xml", "synthetic"};
    return (unsigned)s < 4 ? n[s] : "?";
}

static const char *class_name(unsigned cls) {
    switch (cls >> 8) {
    case 0x01: return "storage";
    case 0x02: return "network";
    case 0x03: return "display";
    case 0x04: return "multimedia";
    case 0x05: return "memory";
    case 0x06: return "bridge";
    case 0x0c: return "serial bus";
    case 0x12: return "accelerator";
    default: return "other";
    }
}

/* The devices in the matrix: GPUs, then NICs. */
static int matrix_devs(const zccl_topo_t *t, const zccl_topo_dev_t **out, int max) {
    int n = 0;
    for (int k = ZCCL_TOPO_DEV_GPU; k <= ZCCL_TOPO_DEV_NIC; k++)
        for (int i = 0; i < zccl_topo_dev_count(t, (zccl_topo_dev_kind_t)k) && n < max; i++)
            out[n++] = zccl_topo_dev(t, (zccl_topo_dev_kind_t)k, i);
    return n;
}

/* ---- text --------------------------------------------------------------------------------------------------- */

static void text_tree(const zccl_topo_t *t, int node, int depth) {
    const zccl_topo_pci_t *p = zccl_topo_pci_node(t, node);
    printf("%*s", 4 + 2 * depth, "");
    if (p->kind == ZCCL_TOPO_PCI_HOSTBRIDGE) printf("HostBridge %s\n", p->busid);
    else if (p->kind == ZCCL_TOPO_PCI_SWITCH) {
        printf("Switch %s", p->busid);
        if (p->ports > 1) printf(" (%d downstream port%s)", p->ports - 1, p->ports == 2 ? "" : "s");
        if (p->link_gbs > 0) printf(" link %.2f GB/s", p->link_gbs);
        printf("\n");
    } else {
        const zccl_topo_dev_t *d = zccl_topo_dev_at(t, p->dev);
        char os[160], lab[16];
        osdev_list(d, os, sizeof os);
        dev_label(d, lab, sizeof lab);
        printf("%s %s %04x:%04x class 0x%04x (%s)%s%s%s%s\n", d->kind <= ZCCL_TOPO_DEV_NIC ? lab : "PCI", d->busid,
               d->vendor, d->device, d->class_id, class_name(d->class_id), d->link[0] ? " link " : "", d->link,
               d->nosdevs ? " " : "", d->nosdevs ? os : "");
    }
    for (int i = 0; i < zccl_topo_pci_count(t); i++)
        if (zccl_topo_pci_node(t, i)->parent == node) text_tree(t, i, depth + 1);
}

static void text_devices(const zccl_topo_t *t, zccl_topo_dev_kind_t kind, const char *title) {
    int n = zccl_topo_dev_count(t, kind);
    printf("\n%s (%d)\n", title, n);
    for (int i = 0; i < n; i++) {
        const zccl_topo_dev_t *d = zccl_topo_dev(t, kind, i);
        char os[160], numa[64];
        osdev_list(d, os, sizeof os);
        zccl_topo_dev_numa_list(t, d, numa, sizeof numa);
        if (kind == ZCCL_TOPO_DEV_OSDEV) {
            printf("  %-6s %-14s NUMA %-5s %s\n", os, d->name[0] ? d->name : "-", numa,
                   zccl_topo_cpu(t, d->cpu) ? zccl_topo_cpu(t, d->cpu)->label : "-");
            continue;
        }
        printf("  %s%-3d %-12s %04x:%04x class 0x%04x  link %-12s NUMA %-5s %s", kind_name(kind), i,
               d->busid[0] ? d->busid : "-", d->vendor, d->device, d->class_id, d->link[0] ? d->link : "?", numa, os);
        if (kind == ZCCL_TOPO_DEV_GPU) {
            int nics[64];
            zccl_path_t path;
            int found = zccl_topo_nearest_nics(t, d, nics, 64, &path, NULL);
            if (found) {
                printf("  nearest %sNIC", zccl_topo_rdma_nic_count(t) ? "RDMA " : "");
                for (int k = 0; k < found && k < 64; k++) printf("%s%d", k ? ",NIC" : " NIC", nics[k]);
                printf(" (%s)", zccl_topo_path_name(path));
            }
        }
        if (kind == ZCCL_TOPO_DEV_NIC) printf("  %s%s%s", d->rdma ? "RDMA (" : "Ethernet only", d->rdma_why,
                                               d->rdma ? ")" : "");
        if (d->name[0]) printf("  \"%s\"", d->name);
        printf("\n");
    }
}

static void text_matrix(const zccl_topo_t *t) {
    const zccl_topo_dev_t *devs[256];
    int n = matrix_devs(t, devs, 256);
    printf("\nPaths between GPUs and NICs\n");
    if (n == 0) {
        printf("  (no GPU or NIC)\n");
        return;
    }
    printf("%8s", "");
    for (int j = 0; j < n; j++) {
        char lab[16];
        dev_label(devs[j], lab, sizeof lab);
        printf(" %-6s", lab);
    }
    printf(" %-24s %s\n", "CPU Affinity", "NUMA Affinity");
    for (int i = 0; i < n; i++) {
        char lab[16], cpus[256] = "-", numa[64];
        dev_label(devs[i], lab, sizeof lab);
        printf("  %-6s", lab);
        for (int j = 0; j < n; j++) {
            char cls[16];
            int nv;
            zccl_smi_path_t p = zccl_topo_smi_path(t, devs[i], devs[j], &nv);
            printf(" %-6s", zccl_topo_smi_name(p, nv, cls, sizeof cls));
        }
        const zccl_topo_cpu_t *c = zccl_topo_cpu(t, devs[i]->cpu);
        if (c && !hwloc_bitmap_iszero(c->cpuset)) hwloc_bitmap_list_snprintf(cpus, sizeof cpus, c->cpuset);
        printf(" %-24s %s\n", cpus, zccl_topo_dev_numa_list(t, devs[i], numa, sizeof numa));
    }
    const char *nvl = zccl_topo_nvlink_source(t);
    printf("\nLegend (as nvidia-smi topo -m):\n"
           "  X    = self\n"
           "  SYS  = path across the interconnect between NUMA nodes / sockets (e.g. QPI, UPI, Infinity Fabric)\n"
           "  NODE = path between PCIe host bridges within one NUMA node / CPU\n"
           "  PHB  = path through one PCIe host bridge (the CPU)\n"
           "  PXB  = path through several PCIe switches, without the host bridge\n"
           "  PIX  = path through at most one PCIe switch\n"
           "  NV#  = GPUs joined by # NVLinks (directly or through NVSwitches)\n"
           "  (NCCL's classes, used for NIC pairing and in --json \"paths\", call NODE PHB)\n"
           "  NVLink data: %s\n", nvl ? nvl : "none in this source");
    if (zccl_topo_dev_count(t, ZCCL_TOPO_DEV_NIC) > 0 && zccl_topo_dev_count(t, ZCCL_TOPO_DEV_GPU) > 0) {
        int rdma = zccl_topo_rdma_nic_count(t);
        printf("\nGPU/NIC pairing: %s\n",
               rdma ? "each GPU uses its nearest RDMA-capable NIC (InfiniBand/RoCE/EFA), even when an Ethernet-only "
                      "port is closer"
                    : "no RDMA-capable NIC in this topology: each GPU pairs with its nearest NIC of any kind "
                      "(Ethernet only)");
        for (int i = 0; i < zccl_topo_dev_count(t, ZCCL_TOPO_DEV_GPU); i++) {
            const zccl_topo_dev_t *g = zccl_topo_dev(t, ZCCL_TOPO_DEV_GPU, i);
            int nics[64];
            zccl_path_t path;
            int found = zccl_topo_nearest_nics(t, g, nics, 64, &path, NULL);
            printf("  GPU%-3d ->", i);
            for (int k = 0; k < found && k < 64; k++) {
                const zccl_topo_dev_t *nic = zccl_topo_dev(t, ZCCL_TOPO_DEV_NIC, nics[k]);
                printf("%s NIC%d %s", k ? "," : "", nics[k], nic->nosdevs ? nic->osdev[nic->nosdevs - 1] : nic->busid);
            }
            if (!found) {
                printf(" -\n");
                continue;
            }
            /* nvidia-smi's class of the pair, and NCCL's when it differs (NODE is PHB to NCCL) */
            char cls[16];
            int nv;
            zccl_topo_smi_name(zccl_topo_smi_path(t, g, zccl_topo_dev(t, ZCCL_TOPO_DEV_NIC, nics[0]), &nv), nv, cls,
                               sizeof cls);
            if (strcmp(cls, zccl_topo_path_name(path)) == 0) printf(" (%s)\n", cls);
            else printf(" (%s; NCCL class %s)\n", cls, zccl_topo_path_name(path));
        }
        print_gdr(t);
    }
}

/* Per GPU: would device buffers move NIC <-> GPU directly (the path rule with the settings in force)? */
static void print_gdr(const zccl_topo_t *t) {
    zccl_gdr_cfg_t cfg;
    if (zccl__gdr_cfg(&cfg) != ZCCL_SUCCESS) {
        printf("\nGPUDirect RDMA: %s\n", zccl__last_error());
        return;
    }
    zccl_nic_gdr_t nic = {.nic_dmabuf = -1};
    zccl__gdr_probe_peermem("/", &nic);
    printf("\nGPUDirect RDMA by the path rule (ZCCL_GDR=%s, ZCCL_NET_GDR_LEVEL=%s; the NIC's dma-buf and the GPU's "
           "attributes are probed when a communicator opens the NIC; this machine: %s)\n",
           cfg.mode < 0 ? "auto" : cfg.mode ? "1" : "0", zccl_topo_path_name(cfg.level), nic.peermem_what);
    for (int i = 0; i < zccl_topo_dev_count(t, ZCCL_TOPO_DEV_GPU); i++) {
        const zccl_topo_dev_t *g = zccl_topo_dev(t, ZCCL_TOPO_DEV_GPU, i);
        int k = -1;
        zccl_path_t path;
        char why[160];
        bool ok = zccl_topo_gdr_pair(t, g, cfg.level, &k, &path, why, sizeof why);
        const char *verdict = cfg.mode == 0 ? "no" : ok ? "yes" : cfg.mode == 1 && k >= 0 ? "yes (forced)" : "no";
        printf("  GPU%-3d %-12s", i, verdict);
        if (k >= 0) printf(" NIC%d", k);
        printf(": %s%s\n", cfg.mode == 0 ? "ZCCL_GDR=0; " : "", why);
    }
}

static const char *no_cores_text(const zccl_topo_t *t) {
    return zccl_topo_source(t) == ZCCL_TOPO_SRC_NCCL_XML
               ? "rank placement on cores is not available from this file: it lists GPUs and NICs but no CPU cores "
                 "(no <cpu> affinity mask)"
               : "rank placement on cores is not available: the topology has no CPU cores";
}

static void text_ring(const zccl_topo_t *t, const sim_t *s) {
    if (!s->placed) {
        printf("\nRing: %s\n", no_cores_text(t));
        return;
    }
    printf("\nRing for %d rank%s on %d host%s (map %s, bind %s)\n", s->n, s->n == 1 ? "" : "s", s->hosts,
           s->hosts == 1 ? "" : "s", zccl_topo_map_name(s->map), zccl_topo_bind_name(s->bind));
    printf("  %5s %5s %8s %5s %5s %8s %5s  %s\n", "rank", "host", "package", "numa", "core", "first PU", "PUs",
           "NIC path");
    for (int r = 0; r < s->n; r++) {
        const zccl_locality_t *l = &s->loc[r];
        printf("  %5d %5llu %8d %5d %5d %8d %5d  %s\n", r, (unsigned long long)l->host, l->package, l->numa, l->core,
               l->first_pu, l->npus,
               l->nic_path == ZCCL_TOPO_NO_NIC ? "-" : zccl_topo_path_name((zccl_path_t)l->nic_path));
    }
    printf("  (-1: the binding spans several; NIC path: from the binding to the nearest NIC)\n");
    size_t need = zccl_topo_ring_format(s->order, s->n, NULL, 0) + 1;
    char *text = malloc(need);
    if (text) {
        zccl_topo_ring_format(s->order, s->n, text, need);
        printf("  ring: %s\n", text);
        free(text);
    }
    printf("  crossings: host %d, package %d, numa %d, core %d, same core %d\n", s->cross.host, s->cross.package,
           s->cross.numa, s->cross.core, s->cross.local);
    printf("  (ring in rank order: host %d, package %d, numa %d, core %d, same core %d)\n", s->cross_identity.host,
           s->cross_identity.package, s->cross_identity.numa, s->cross_identity.core, s->cross_identity.local);
}

static void text_report(const zccl_topo_t *t, const sim_t *s) {
    zccl_topo_counts_t c;
    zccl_topo_counts(t, &c);
    printf("zccl-topo: %s (%s)\n", zccl_topo_origin(t), source_name(zccl_topo_source(t)));
    printf("\nMachine: %d package%s, %d NUMA node%s, %d cores, %d PUs, %d GPU%s, %d NIC%s\n", c.packages,
           c.packages == 1 ? "" : "s", c.numa_nodes, c.numa_nodes == 1 ? "" : "s", c.cores, c.pus, c.gpus,
           c.gpus == 1 ? "" : "s", c.nics, c.nics == 1 ? "" : "s");
    for (int i = 0; i < zccl_topo_numa_count(t); i++) {
        const zccl_topo_numa_t *m = zccl_topo_numa(t, i);
        char cpus[256] = "none", mem[48] = "";
        if (!hwloc_bitmap_iszero(m->cpuset)) hwloc_bitmap_list_snprintf(cpus, sizeof cpus, m->cpuset);
        if (m->memory) {
            char sz[32];
            bytes_text(m->memory, sz, sizeof sz);
            snprintf(mem, sizeof mem, " memory %s", sz);
        }
        printf("  NUMA %-3d package %-3d PUs %-*s%s\n", m->os_index, m->package, mem[0] ? 24 : 0, cpus, mem);
    }
    if (zccl_topo_cache_count(t)) {
        printf("Caches:");
        for (int i = 0; i < zccl_topo_cache_count(t); i++) {
            const zccl_topo_cache_t *k = zccl_topo_cache(t, i);
            char sz[32];
            bytes_text(k->size, sz, sizeof sz);
            printf("%s L%d%s %s x%d", i ? "," : "", k->level, k->type == 'u' ? "" : k->type == 'd' ? "d" : "i", sz,
                   k->count);
        }
        printf("\n");
    }
    text_devices(t, ZCCL_TOPO_DEV_GPU, "GPUs");
    text_devices(t, ZCCL_TOPO_DEV_NIC, "NICs");
    if (zccl_topo_dev_count(t, ZCCL_TOPO_DEV_OSDEV)) text_devices(t, ZCCL_TOPO_DEV_OSDEV, "OS devices outside PCI");
    printf("\nPCI tree (%d PCI devices, %d switches; root ports hidden, switch ports merged)\n", c.pci_devices,
           c.switches);
    for (int i = 0; i < zccl_topo_cpu_count(t); i++) {
        const zccl_topo_cpu_t *cpu = zccl_topo_cpu(t, i);
        char numa[64] = "-";
        if (!hwloc_bitmap_iszero(cpu->nodeset)) hwloc_bitmap_list_snprintf(numa, sizeof numa, cpu->nodeset);
        printf("  %s (NUMA %s)\n", cpu->label, numa);
        for (int k = 0; k < zccl_topo_pci_count(t); k++) {
            const zccl_topo_pci_t *p = zccl_topo_pci_node(t, k);
            if (p->parent < 0 && p->cpu == i) text_tree(t, k, 0);
        }
    }
    for (int i = 0; i < zccl_topo_distances_count(t); i++) {
        const zccl_topo_distances_t *d = zccl_topo_distances(t, i);
        printf("\nDistances \"%s\" (%s, %d objects)\n", d->name,
               (d->kind & HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH) ? "bandwidth" : "latency", d->n);
        if (d->n > 32) {
            printf("  (too wide for text: see --json)\n");
            continue;
        }
        int w = 8;
        for (int j = 0; j < d->n; j++) w = (int)strlen(d->labels[j]) > w ? (int)strlen(d->labels[j]) : w;
        printf("  %-*s", w, "");
        for (int j = 0; j < d->n; j++) printf(" %*s", w, d->labels[j]);
        printf("\n");
        for (int r = 0; r < d->n; r++) {
            printf("  %-*s", w, d->labels[r]);
            for (int j = 0; j < d->n; j++) printf(" %*llu", w, (unsigned long long)d->values[r * d->n + j]);
            printf("\n");
        }
    }
    text_matrix(t);
    text_ring(t, s);
}

/* ---- JSON (jansson) ----------------------------------------------------------------------------------------- */

static json_t *json_set_list(hwloc_const_bitmap_t set) {
    char buf[1024] = "";
    if (set && !hwloc_bitmap_iszero(set)) hwloc_bitmap_list_snprintf(buf, sizeof buf, set);
    return json_string(buf);
}

static json_t *json_dev(const zccl_topo_t *t, const zccl_topo_dev_t *d) {
    json_t *o = json_object(), *os = json_array(), *numa = json_array();
    for (int i = 0; i < d->nosdevs; i++) json_array_append_new(os, json_string(d->osdev[i]));
    const zccl_topo_cpu_t *cpu = zccl_topo_cpu(t, d->cpu);
    if (cpu) {
        int n;
        hwloc_bitmap_foreach_begin(n, cpu->nodeset) { json_array_append_new(numa, json_integer(n)); }
        hwloc_bitmap_foreach_end();
    }
    json_object_set_new(o, "index", json_integer(d->index));
    json_object_set_new(o, "busid", d->busid[0] ? json_string(d->busid) : json_null());
    char hex[3][8];
    snprintf(hex[0], sizeof hex[0], "0x%04x", d->vendor & 0xffffu);
    snprintf(hex[1], sizeof hex[1], "0x%04x", d->device & 0xffffu);
    snprintf(hex[2], sizeof hex[2], "0x%04x", d->class_id & 0xffffu);
    json_object_set_new(o, "vendor", json_string(hex[0]));
    json_object_set_new(o, "device", json_string(hex[1]));
    json_object_set_new(o, "class", json_string(hex[2]));
    json_object_set_new(o, "link", json_string(d->link));
    json_object_set_new(o, "link_gbs", json_real(d->link_gbs));
    json_object_set_new(o, "numa", numa);
    json_object_set_new(o, "cpu_affinity", json_set_list(cpu ? cpu->cpuset : NULL));
    json_object_set_new(o, "osdevs", os);
    json_object_set_new(o, "name", json_string(d->name));
    if (d->kind == ZCCL_TOPO_DEV_NIC) {
        json_object_set_new(o, "rdma", json_boolean(d->rdma));
        json_object_set_new(o, "rdma_evidence", d->rdma ? json_string(d->rdma_why) : json_null());
    }
    if (d->kind == ZCCL_TOPO_DEV_GPU) {
        int nics[64];
        zccl_path_t path;
        int hops, found = zccl_topo_nearest_nics(t, d, nics, 64, &path, &hops);
        json_t *near = json_array();
        for (int k = 0; k < found && k < 64; k++)
            json_array_append_new(near, json_string(zccl_topo_dev(t, ZCCL_TOPO_DEV_NIC, nics[k])->busid));
        json_object_set_new(o, "nearest_nics", near);
        json_object_set_new(o, "nearest_nic_path", found ? json_string(zccl_topo_path_name(path)) : json_null());
        json_object_set_new(o, "nearest_nic_hops", found ? json_integer(hops) : json_null());
        json_object_set_new(o, "nearest_nic_rdma", json_boolean(found && zccl_topo_rdma_nic_count(t) > 0));
    }
    return o;
}

static json_t *json_report(const zccl_topo_t *t, const sim_t *s) {
    zccl_topo_counts_t c;
    zccl_topo_counts(t, &c);
    json_t *root = json_object(), *m = json_object();
    json_object_set_new(root, "source", json_string(source_name(zccl_topo_source(t))));
    json_object_set_new(root, "origin", json_string(zccl_topo_origin(t)));
    json_object_set_new(m, "packages", json_integer(c.packages));
    json_object_set_new(m, "numa_nodes", json_integer(c.numa_nodes));
    json_object_set_new(m, "cores", json_integer(c.cores));
    json_object_set_new(m, "pus", json_integer(c.pus));
    json_object_set_new(m, "cpus", json_integer(c.cpus));
    json_object_set_new(m, "gpus", json_integer(c.gpus));
    json_object_set_new(m, "nics", json_integer(c.nics));
    json_object_set_new(m, "pci_devices", json_integer(c.pci_devices));
    json_object_set_new(m, "switches", json_integer(c.switches));
    json_object_set_new(root, "machine", m);
    json_t *numa = json_array();
    for (int i = 0; i < zccl_topo_numa_count(t); i++) {
        const zccl_topo_numa_t *n = zccl_topo_numa(t, i);
        json_t *o = json_object();
        json_object_set_new(o, "os_index", json_integer(n->os_index));
        json_object_set_new(o, "package", json_integer(n->package));
        json_object_set_new(o, "cpus", json_set_list(n->cpuset));
        json_object_set_new(o, "memory", json_integer((json_int_t)n->memory));
        json_array_append_new(numa, o);
    }
    json_object_set_new(root, "numa_nodes", numa);
    json_t *caches = json_array();
    for (int i = 0; i < zccl_topo_cache_count(t); i++) {
        const zccl_topo_cache_t *k = zccl_topo_cache(t, i);
        char type[2] = {k->type, 0};
        json_t *o = json_object();
        json_object_set_new(o, "level", json_integer(k->level));
        json_object_set_new(o, "type", json_string(type));
        json_object_set_new(o, "size", json_integer((json_int_t)k->size));
        json_object_set_new(o, "linesize", json_integer(k->linesize));
        json_object_set_new(o, "count", json_integer(k->count));
        json_array_append_new(caches, o);
    }
    json_object_set_new(root, "caches", caches);
    const char *keys[] = {"gpus", "nics", "other_pci", "osdevs"};
    for (int k = 0; k < ZCCL_TOPO_DEV_KINDS; k++) {
        json_t *a = json_array();
        for (int i = 0; i < zccl_topo_dev_count(t, (zccl_topo_dev_kind_t)k); i++)
            json_array_append_new(a, json_dev(t, zccl_topo_dev(t, (zccl_topo_dev_kind_t)k, i)));
        json_object_set_new(root, keys[k], a);
    }
    json_t *tree = json_array();
    for (int i = 0; i < zccl_topo_pci_count(t); i++) {
        const zccl_topo_pci_t *p = zccl_topo_pci_node(t, i);
        const char *kinds[] = {"hostbridge", "switch", "device"};
        json_t *o = json_object();
        json_object_set_new(o, "kind", json_string(kinds[p->kind]));
        json_object_set_new(o, "busid", json_string(p->busid));
        json_object_set_new(o, "parent", p->parent >= 0 ? json_integer(p->parent) : json_null());
        json_object_set_new(o, "cpu", json_string(zccl_topo_cpu(t, p->cpu) ? zccl_topo_cpu(t, p->cpu)->label : ""));
        if (p->kind == ZCCL_TOPO_PCI_SWITCH) json_object_set_new(o, "ports", json_integer(p->ports));
        json_object_set_new(o, "link_gbs", json_real(p->link_gbs));
        json_array_append_new(tree, o);
    }
    json_object_set_new(root, "pci_tree", tree);
    json_t *dists = json_array();
    for (int i = 0; i < zccl_topo_distances_count(t); i++) {
        const zccl_topo_distances_t *d = zccl_topo_distances(t, i);
        json_t *o = json_object(), *labels = json_array(), *rows = json_array();
        for (int j = 0; j < d->n; j++) {
            json_t *row = json_array();
            json_array_append_new(labels, json_string(d->labels[j]));
            for (int k = 0; k < d->n; k++)
                json_array_append_new(row, json_integer((json_int_t)d->values[j * d->n + k]));
            json_array_append_new(rows, row);
        }
        json_object_set_new(o, "name", json_string(d->name));
        json_object_set_new(o, "kind", json_integer((json_int_t)d->kind));
        json_object_set_new(o, "objects", labels);
        json_object_set_new(o, "values", rows);
        json_array_append_new(dists, o);
    }
    json_object_set_new(root, "distances", dists);
    const zccl_topo_dev_t *devs[256];
    int n = matrix_devs(t, devs, 256);
    json_t *paths = json_object(), *labels = json_array(), *rows = json_array();
    for (int i = 0; i < n; i++) {
        char lab[16];
        json_t *row = json_array();
        dev_label(devs[i], lab, sizeof lab);
        json_array_append_new(labels, json_string(lab));
        for (int j = 0; j < n; j++) {
            zccl_path_t p = zccl_topo_path(t, devs[i], devs[j], NULL);
            json_array_append_new(row, json_string(i == j ? "X" : zccl_topo_path_name(p)));
        }
        json_array_append_new(rows, row);
    }
    json_object_set_new(paths, "devices", labels);
    json_object_set_new(paths, "matrix", rows);
    json_object_set_new(root, "paths", paths);
    json_t *smi = json_object(), *smi_rows = json_array();
    for (int i = 0; i < n; i++) {
        json_t *row = json_array();
        for (int j = 0; j < n; j++) {
            char cls[16];
            int nv;
            zccl_smi_path_t p = zccl_topo_smi_path(t, devs[i], devs[j], &nv);
            json_array_append_new(row, json_string(zccl_topo_smi_name(p, nv, cls, sizeof cls)));
        }
        json_array_append_new(smi_rows, row);
    }
    json_object_set_new(smi, "devices", json_deep_copy(labels));
    json_object_set_new(smi, "matrix", smi_rows);
    const char *nvl = zccl_topo_nvlink_source(t);
    json_object_set_new(smi, "nvlink_source", nvl ? json_string(nvl) : json_null());
    json_object_set_new(root, "smi_paths", smi);
    json_object_set_new(root, "rdma_nics", json_integer(zccl_topo_rdma_nic_count(t)));
    if (!s->placed) {
        json_object_set_new(root, "ring", json_null());
        json_object_set_new(root, "ring_unavailable", json_string(no_cores_text(t)));
        return root;
    }
    json_t *ring = json_object(), *place = json_array(), *order = json_array(), *cross = json_object();
    for (int r = 0; r < s->n; r++) {
        const zccl_locality_t *l = &s->loc[r];
        json_t *o = json_object();
        json_object_set_new(o, "rank", json_integer(r));
        json_object_set_new(o, "host", json_integer((json_int_t)l->host));
        json_object_set_new(o, "package", json_integer(l->package));
        json_object_set_new(o, "numa", json_integer(l->numa));
        json_object_set_new(o, "core", json_integer(l->core));
        json_object_set_new(o, "first_pu", json_integer(l->first_pu));
        json_object_set_new(o, "npus", json_integer(l->npus));
        json_object_set_new(o, "nic_path", l->nic_path == ZCCL_TOPO_NO_NIC
                                               ? json_null()
                                               : json_string(zccl_topo_path_name((zccl_path_t)l->nic_path)));
        json_array_append_new(place, o);
        json_array_append_new(order, json_integer(s->order[r]));
    }
    json_object_set_new(cross, "host", json_integer(s->cross.host));
    json_object_set_new(cross, "package", json_integer(s->cross.package));
    json_object_set_new(cross, "numa", json_integer(s->cross.numa));
    json_object_set_new(cross, "core", json_integer(s->cross.core));
    json_object_set_new(cross, "same_core", json_integer(s->cross.local));
    json_object_set_new(ring, "ranks", json_integer(s->n));
    json_object_set_new(ring, "hosts", json_integer(s->hosts));
    json_object_set_new(ring, "map", json_string(zccl_topo_map_name(s->map)));
    json_object_set_new(ring, "bind", json_string(zccl_topo_bind_name(s->bind)));
    json_object_set_new(ring, "placement", place);
    json_object_set_new(ring, "order", order);
    json_object_set_new(ring, "crossings", cross);
    json_object_set_new(root, "ring", ring);
    return root;
}

/* ---- DOT ---------------------------------------------------------------------------------------------------- */

/* DOT string contents: quotes and backslashes escaped. Labels here are bus ids and OS device names. */
static void dot_str(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        fputc(*s, f);
    }
}

/* Whether a PCI node is on the way to a GPU or NIC (the picture leaves the rest out). */
static bool pci_shown(const zccl_topo_t *t, int node) {
    const zccl_topo_pci_t *p = zccl_topo_pci_node(t, node);
    if (p->kind == ZCCL_TOPO_PCI_DEVICE) return zccl_topo_dev_at(t, p->dev)->kind <= ZCCL_TOPO_DEV_NIC;
    for (int i = 0; i < zccl_topo_pci_count(t); i++)
        if (zccl_topo_pci_node(t, i)->parent == node && pci_shown(t, i)) return true;
    return false;
}

static void dot_report(FILE *f, const zccl_topo_t *t, const sim_t *s) {
    zccl_topo_counts_t c;
    zccl_topo_counts(t, &c);
    const char *origin = zccl_topo_origin(t), *slash = strrchr(origin, '/');
    fprintf(f, "digraph zccl_topo {\n  graph [fontname=\"Helvetica\", fontsize=12, labelloc=t, label=\"");
    dot_str(f, slash && zccl_topo_source(t) != ZCCL_TOPO_SRC_SYNTHETIC ? slash + 1 : origin);
    fprintf(f, "\\n%d packages, %d NUMA nodes, %d cores, %d PUs, %d GPUs, %d NICs\"];\n", c.packages, c.numa_nodes,
            c.cores, c.pus, c.gpus, c.nics);
    fprintf(f, "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n"
               "  edge [dir=none, fontname=\"Helvetica\", fontsize=9];\n"
               "  subgraph cluster_pci {\n"
               "    label=\"PCI tree (GPUs, NICs and the switches above them)\"; color=\"#999999\";\n");
    for (int i = 0; i < zccl_topo_cpu_count(t); i++) {
        const zccl_topo_cpu_t *cpu = zccl_topo_cpu(t, i);
        char pus[128] = "-", numa[64] = "-";
        if (!hwloc_bitmap_iszero(cpu->cpuset)) hwloc_bitmap_list_snprintf(pus, sizeof pus, cpu->cpuset);
        if (!hwloc_bitmap_iszero(cpu->nodeset)) hwloc_bitmap_list_snprintf(numa, sizeof numa, cpu->nodeset);
        fprintf(f, "    cpu%d [label=\"", i);
        dot_str(f, cpu->label);
        fprintf(f, "\\nNUMA %s\\nPUs %s\", fillcolor=\"#dbe5f1\"];\n", numa, pus);
        if (i > 0) fprintf(f, "    cpu%d -> cpu%d [style=dashed, label=\"SYS\"];\n", i - 1, i);
    }
    fprintf(f, "    { rank=same;");
    for (int i = 0; i < zccl_topo_cpu_count(t); i++) fprintf(f, " cpu%d;", i);
    fprintf(f, " }\n");
    for (int i = 0; i < zccl_topo_pci_count(t); i++) {
        if (!pci_shown(t, i)) continue;
        const zccl_topo_pci_t *p = zccl_topo_pci_node(t, i);
        fprintf(f, "    pci%d [label=\"", i);
        if (p->kind == ZCCL_TOPO_PCI_HOSTBRIDGE) {
            fprintf(f, "HostBridge\\n");
            dot_str(f, p->busid);
            fprintf(f, "\", fillcolor=\"#eeeeee\"];\n");
        } else if (p->kind == ZCCL_TOPO_PCI_SWITCH) {
            fprintf(f, "PCIe switch\\n");
            dot_str(f, p->busid);
            fprintf(f, "\", fillcolor=\"#fff2cc\"];\n");
        } else {
            const zccl_topo_dev_t *d = zccl_topo_dev_at(t, p->dev);
            char lab[16], os[160];
            dev_label(d, lab, sizeof lab);
            osdev_list(d, os, sizeof os);
            fprintf(f, "%s %s", lab, d->busid);
            if (d->nosdevs) {
                fprintf(f, "\\n");
                dot_str(f, os);
            }
            if (d->link[0]) {
                fprintf(f, "\\n");
                dot_str(f, d->link);
            }
            fprintf(f, "\", fillcolor=\"%s\"];\n", d->kind == ZCCL_TOPO_DEV_GPU ? "#d5e8d4" : "#dae8fc");
        }
        if (p->parent >= 0) fprintf(f, "    pci%d -> pci%d;\n", p->parent, i);
        else fprintf(f, "    cpu%d -> pci%d;\n", p->cpu, i);
    }
    if (!s->placed) {
        fprintf(f, "  }\n}\n");
        return;
    }
    fprintf(f, "  }\n  subgraph cluster_ring {\n    label=\"ring of %d ranks (map %s, bind %s): crossings host %d, "
               "package %d, numa %d\"; color=\"#999999\";\n    edge [dir=forward];\n",
            s->n, zccl_topo_map_name(s->map), zccl_topo_bind_name(s->bind), s->cross.host, s->cross.package,
            s->cross.numa);
    for (int r = 0; r < s->n; r++) {
        const zccl_locality_t *l = &s->loc[r];
        fprintf(f, "    r%d [label=\"rank %d\\nhost %llu pkg %d\\nnuma %d core %d\", shape=ellipse, "
                   "fillcolor=\"%s\"];\n",
                r, r, (unsigned long long)l->host, l->package, l->numa, l->core,
                l->package % 2 ? "#f8cecc" : "#e1d5e7");
    }
    for (int i = 0; i < s->n && s->n > 1; i++) {
        const zccl_locality_t *a = &s->loc[s->order[i]], *b = &s->loc[s->order[(i + 1) % s->n]];
        const char *style = a->host != b->host         ? "color=\"#b85450\", penwidth=2.5, label=\"host\""
                            : a->package != b->package ? "color=\"#d6b656\", penwidth=2, label=\"package\""
                                                       : "color=\"#666666\"";
        fprintf(f, "    r%d -> r%d [%s];\n", s->order[i], s->order[(i + 1) % s->n], style);
    }
    fprintf(f, "  }\n}\n");
}

/* Pipes the DOT text into `dot -T<fmt> -o file`. */
static int render(const zccl_topo_t *t, const sim_t *s, const char *fmt, const char *file) {
    int fds[2];
    if (pipe(fds) < 0) {
        perror("zccl-topo: pipe");
        return 1;
    }
    char tflag[16], oflag[4096];
    snprintf(tflag, sizeof tflag, "-T%s", fmt);
    snprintf(oflag, sizeof oflag, "-o%s", file);
    char *argv[] = {"dot", tflag, oflag, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[0], STDIN_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    int err = posix_spawnp(&pid, "dot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[0]);
    if (err) {
        close(fds[1]);
        if (err == ENOENT)
            fprintf(stderr, "zccl-topo: --%s needs Graphviz's `dot`, which is not installed (Debian/Ubuntu: "
                            "apt-get install graphviz); --dot prints the DOT text instead\n", fmt);
        else fprintf(stderr, "zccl-topo: cannot run dot: %s\n", strerror(err));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* dot may exit early (bad output path): its status reports it, not a signal */
    FILE *f = fdopen(fds[1], "w");
    if (f) {
        dot_report(f, t, s);
        fclose(f);
    } else close(fds[1]);
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "zccl-topo: dot failed to write %s\n", file);
        return 1;
    }
    printf("zccl-topo: wrote %s\n", file);
    return 0;
}

/* ---- --mesh: the groups of zccl_mesh_create for a simulated placement ---------------------------------------- */

static int mesh_report(const opts_t *o) {
    char names_buf[ZCCL_MESH_MAX_DIMS][ZCCL_MESH_NAME_MAX + 1];
    const char *names[ZCCL_MESH_MAX_DIMS];
    int sizes[ZCCL_MESH_MAX_DIMS], nd = 0;
    const bool named = strchr(o->mesh, '=') != NULL;
    const char *p = o->mesh;
    while (*p) {
        if (nd == ZCCL_MESH_MAX_DIMS) return bad("--mesh \"%s\": more than 8 dimensions%s", o->mesh, "");
        if (named) {
            const char *eq = strchr(p, '=');
            if (!eq || eq == p || eq - p > ZCCL_MESH_NAME_MAX) return bad("--mesh \"%s\": expected name=size%s", o->mesh, "");
            snprintf(names_buf[nd], sizeof names_buf[nd], "%.*s", (int)(eq - p), p);
            p = eq + 1;
        }
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || (*end && *end != (named ? ',' : 'x')))
            return bad("--mesh \"%s\": a size is not an integer in [1, 65536]%s", o->mesh, "");
        sizes[nd++] = (int)v;
        p = *end ? end + 1 : end;
    }
    static const char *const d1[] = {"dp"}, *const d2[] = {"dp", "tp"}, *const d3[] = {"dp", "pp", "tp"};
    for (int d = 0; d < nd; d++) {
        if (!named && nd > 3) return bad("--mesh \"%s\": give names (dp=2,ep=2,...) for more than 3 dimensions%s", o->mesh, "");
        names[d] = named ? names_buf[d] : nd == 1 ? d1[d] : nd == 2 ? d2[d] : d3[d];
    }
    long long prod = 1;
    for (int d = 0; d < nd; d++) prod *= sizes[d];
    const int n = o->ranks ? o->ranks : prod <= 65536 ? (int)prod : 65536;
    if (n < o->hosts) return bad("--ranks must be at least --hosts%s%s", "", "");
    int *host = malloc((size_t)n * sizeof *host), *coords = malloc((size_t)n * (size_t)nd * sizeof *coords);
    if (!host || !coords) return 1;
    for (int h = 0, r = 0; h < o->hosts; h++)
        for (int k = 0; k < n / o->hosts + (h < n % o->hosts); k++) host[r++] = h;
    char why[512];
    if (zccl_mesh_layout(n, host, nd, names, sizes, o->mesh_flags, coords, why, sizeof why) != ZCCL_SUCCESS) {
        fprintf(stderr, "zccl-topo: %s\n", why);
        free(host);
        free(coords);
        return 1;
    }
    printf("mesh ");
    for (int d = 0; d < nd; d++) printf("%s%s=%d", d ? " x " : "", names[d], sizes[d]);
    printf(" over %d ranks on %d host%s (blocks of consecutive ranks per host, as zcclrun places them)\n", n,
           o->hosts, o->hosts > 1 ? "s" : "");
    printf("%-6s %-6s", "rank", "host");
    for (int d = 0; d < nd; d++) printf(" %6s", names[d]);
    printf("\n");
    for (int r = 0; r < n; r++) {
        printf("%-6d %-6d", r, host[r]);
        for (int d = 0; d < nd; d++) printf(" %6d", coords[r * nd + d]);
        printf("\n");
    }
    /* Groups along each dimension, innermost first: the ranks sharing every other coordinate. */
    for (int d = nd - 1; d >= 0; d--) {
        printf("%s groups (%d ranks each)%s:\n", names[d], sizes[d], d == nd - 1 ? ", innermost" : "");
        int *done = calloc((size_t)n, sizeof *done);
        if (!done) break;
        for (int r = 0, g = 0; r < n; r++) {
            if (done[r]) continue;
            printf("  %s group %d: ranks", names[d], g++);
            for (int c = 0; c < sizes[d]; c++)
                for (int q = r; q < n; q++) {
                    bool same = coords[q * nd + d] == c;
                    for (int e = 0; e < nd && same; e++)
                        if (e != d && coords[q * nd + e] != coords[r * nd + e]) same = false;
                    if (!same) continue;
                    done[q] = 1;
                    printf(" %d", q);
                }
            int lo = n, hi = -1;
            for (int q = 0; q < n; q++)
                if (done[q] == 1) lo = host[q] < lo ? host[q] : lo, hi = host[q] > hi ? host[q] : hi, done[q] = 2;
            if (lo == hi) printf("  (host %d)\n", lo);
            else printf("  (hosts %d..%d: across hosts)\n", lo, hi);
        }
        free(done);
    }
    free(host);
    free(coords);
    return 0;
}

/* --rails: the rails of this host as a rank's TCP transport lists them (transport/rail.c), and rank i of the host's
 * lane 0 (its small messages) on rail i mod R, as every pair with another host that has the same subnets plans it. */
static int rails_report(const opts_t *o) {
    zccl_rail_addr_t r[ZCCL_RAIL_MAX];
    char tried[512];
    int n = 0;
    int64_t cap = -1, socks = 1;
    if (zccl__tcp_rails_list(r, ZCCL_RAIL_MAX, &n, tried, sizeof tried) != ZCCL_SUCCESS ||
        zccl__cfg_int(ZCCL_CFG_TCP_RAILS, &cap) != ZCCL_SUCCESS || zccl__cfg_int(ZCCL_CFG_NSOCKS_PERTHREAD, &socks) != ZCCL_SUCCESS) {
        fprintf(stderr, "zccl-topo: %s\n", zccl_get_last_error(NULL));
        return 1;
    }
    if (cap >= 0 && n > (cap ? cap : 1)) n = (int)(cap ? cap : 1);
    /* In the order pairs plan them: by netmask length, then subnet (rail.c's common_rails). */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            const uint32_t a = ntohl(((const struct sockaddr_in *)&r[j - 1].addr.sa)->sin_addr.s_addr),
                           b = ntohl(((const struct sockaddr_in *)&r[j].addr.sa)->sin_addr.s_addr);
            const uint32_t ma = r[j - 1].prefix ? ~0u << (32 - r[j - 1].prefix) : 0, mb = r[j].prefix ? ~0u << (32 - r[j].prefix) : 0;
            if (r[j - 1].prefix < r[j].prefix || (r[j - 1].prefix == r[j].prefix && (a & ma) <= (b & mb))) break;
            zccl_rail_addr_t t = r[j];
            r[j] = r[j - 1];
            r[j - 1] = t;
        }
    printf("TCP rails of this host (%s): %d\n", *zccl__cfg_str(ZCCL_CFG_SOCKET_IFNAME) ? "ZCCL_SOCKET_IFNAME" : "every up, "
           "non-loopback, non-container IPv4 interface", n);
    for (int i = 0; i < n; i++) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&r[i].addr.sa;
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        printf("  rail %d: %s %s/%u\n", i, r[i].ifname, ip, r[i].prefix);
    }
    printf("  (up IPv4 interfaces seen: %s)\n", tried[0] ? tried : "none");
    if (n * socks < 2) {
        printf("Fewer than two lanes: every pair with another host uses one TCP connection per direction.\n");
        return 0;
    }
    const int ranks = o->ranks > 0 ? o->ranks : 4;
    printf("Lanes per direction with a peer on the same %d subnet%s: %lld; local rank i starts on rail i mod %d:\n", n,
           n == 1 ? "" : "s", (long long)ZCCL_MIN(n * socks, ZCCL_TCP_SOCKS_MAX), n);
    for (int i = 0; i < ranks; i++) printf("  local rank %d: rail %d (%s)\n", i, i % n, r[i % n].ifname);
    return 0;
}

int main(int argc, char **argv) {
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    if (o.mesh) return mesh_report(&o);
    if (o.rails) return rails_report(&o);
    zccl_topo_t *t = NULL;
    if (load(&o, &t) != ZCCL_SUCCESS) {
        fprintf(stderr, "zccl-topo: %s\n", zccl_get_last_error(NULL));
        return 1;
    }
    sim_t s;
    if (simulate(t, &o, &s) != ZCCL_SUCCESS) {
        fprintf(stderr, "zccl-topo: cannot simulate the placement: %s\n", zccl_get_last_error(NULL));
        zccl_topo_destroy(t);
        return 1;
    }
    rc = 0;
    switch (o.mode) {
    case OUT_TEXT: text_report(t, &s); break;
    case OUT_DOT: dot_report(stdout, t, &s); break;
    case OUT_SVG: rc = render(t, &s, "svg", o.render_file); break;
    case OUT_PNG: rc = render(t, &s, "png", o.render_file); break;
    case OUT_JSON: {
        json_t *root = json_report(t, &s);
        if (!root || json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0) {
            fprintf(stderr, "zccl-topo: cannot write JSON\n");
            rc = 1;
        } else printf("\n");
        json_decref(root);
        break;
    }
    }
    free(s.loc);
    free(s.order);
    free(s.identity);
    zccl_topo_destroy(t);
    return rc;
}

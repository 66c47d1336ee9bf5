/*
 * topo_locality.c — where a rank runs: its locality record from a CPU set (its binding, read from the OS or
 * simulated), and the placements zccl-topo and the tests simulate (mpirun's --map-by / --bind-to).
 */
#include <errno.h>
#include <string.h>
#include "topo_model.h"

static bool holds(hwloc_const_bitmap_t set, hwloc_const_cpuset_t cpus) {
    return !hwloc_bitmap_iszero(set) && hwloc_bitmap_isincluded(cpus, set);
}

zccl_result_t zccl_topo_locality_of(const zccl_topo_t *t, hwloc_const_cpuset_t cpus, uint64_t host,
                                    zccl_locality_t *out) {
    if (!t || !cpus || !out) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_locality_of: NULL argument");
    if (hwloc_bitmap_iszero(cpus)) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_locality_of: empty CPU set");
    zccl_locality_t l;
    memset(&l, 0, sizeof l);
    l.host = host;
    l.first_pu = hwloc_bitmap_first(cpus);
    l.last_pu = hwloc_bitmap_last(cpus);
    l.npus = hwloc_bitmap_weight(cpus);
    /* The first container wins: NUMA nodes of one cpuset (DDR and HBM/CXL tiers) resolve to the first one. */
    l.package = l.numa = l.core = -1;
    for (int p = 0; p < t->npackages && l.package < 0; p++)
        if (holds(t->packages[p], cpus)) l.package = p;
    for (int m = 0; m < t->nnuma && l.numa < 0; m++)
        if (holds(t->numa[m].cpuset, cpus)) l.numa = t->numa[m].os_index;
    for (int c = 0; c < t->ncores && l.core < 0; c++)
        if (holds(t->cores[c].cpuset, cpus)) l.core = c;
    l.nic_path = ZCCL_TOPO_NO_NIC;
    bool rdma_only = zccl_topo_rdma_nic_count(t) > 0; /* the NICs that carry traffic between hosts */
    for (int i = 0; i < t->nkind[ZCCL_TOPO_DEV_NIC]; i++) {
        const zccl_topo_dev_t *nic = &t->devs[t->kind_ids[ZCCL_TOPO_DEV_NIC][i]];
        if (rdma_only && !nic->rdma) continue;
        zccl_path_t p = zccl_topo_path_cpuset(t, cpus, nic);
        if ((int)p < l.nic_path) l.nic_path = (int32_t)p;
    }
    *out = l;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl_topo_locality_self(const zccl_topo_t *t, uint64_t host, zccl_locality_t *out) {
    if (!t || !out) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_locality_self: NULL argument");
    if (!t->this_system)
        return zccl__error(ZCCL_INVALID_USAGE, "the topology from %s describes another machine: load it with "
                                               "ZCCL_TOPO_THIS_SYSTEM to read this process's binding with it",
                           t->origin);
    if (hwloc_bitmap_iszero(t->machine))
        return zccl__error(ZCCL_INVALID_ARGUMENT, "the topology from %s lists no CPUs (GPUs and NICs only): this "
                                                  "process's place on the CPUs is unknown", t->origin);
    hwloc_topology_t hw = t->hw, own = NULL;
    if (!hw) { /* an NCCL file: a bare live topology is enough to ask the OS for the binding */
        if (hwloc_topology_init(&own) < 0 || hwloc_topology_load(own) < 0) {
            int err = errno;
            if (own) hwloc_topology_destroy(own);
            return zccl__syserror(err, "hwloc could not read this machine to get the CPU binding");
        }
        hw = own;
    }
    zccl_result_t res = ZCCL_SUCCESS;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    } else if (hwloc_get_cpubind(hw, set, HWLOC_CPUBIND_PROCESS) < 0 && hwloc_get_cpubind(hw, set, 0) < 0) {
        res = zccl__syserror(errno, "hwloc_get_cpubind failed");
    } else {
        hwloc_bitmap_and(set, set, t->machine);
        if (hwloc_bitmap_iszero(set)) {
            ZCCL_WARN(ZCCL_LOG_TOPO, "this process's CPU binding has no PU of the topology from %s; "
                                     "taking the whole machine", t->origin);
            hwloc_bitmap_copy(set, t->machine);
        }
        res = zccl_topo_locality_of(t, set, host, out);
    }
    hwloc_bitmap_free(set);
    if (own) hwloc_topology_destroy(own);
    return res;
}

/* The k-th core (wrapping) among those that `keep` accepts, or -1 when none does. */
typedef bool (*core_filter_t)(const zccl_topo_t *t, const zccl_topo_core_t *c, int arg);
static int kth_core(const zccl_topo_t *t, core_filter_t keep, int arg, int k) {
    int n = 0;
    for (int i = 0; i < t->ncores; i++) n += keep(t, &t->cores[i], arg);
    if (n == 0) return -1;
    k %= n;
    for (int i = 0; i < t->ncores; i++)
        if (keep(t, &t->cores[i], arg) && k-- == 0) return i;
    return -1;
}
static bool in_package(const zccl_topo_t *t, const zccl_topo_core_t *c, int p) { return c->package == p; }
static bool in_numa(const zccl_topo_t *t, const zccl_topo_core_t *c, int m) { return c->numa == t->numa[m].os_index; }
static bool in_cpu(const zccl_topo_t *t, const zccl_topo_core_t *c, int cpu) {
    return hwloc_bitmap_isincluded(c->cpuset, t->cpus[cpu].cpuset);
}
static bool any_core(const zccl_topo_t *t, const zccl_topo_core_t *c, int unused) { return true; }

/* Round robin over the groups that have cores: rank r goes to the (r % G)-th group, its (r / G)-th core. */
static int round_robin(const zccl_topo_t *t, core_filter_t keep, int ngroups, int rank) {
    int with_cores = 0;
    for (int g = 0; g < ngroups; g++) with_cores += kth_core(t, keep, g, 0) >= 0;
    if (with_cores == 0) return rank % t->ncores;
    int want = rank % with_cores;
    for (int g = 0; g < ngroups; g++) {
        if (kth_core(t, keep, g, 0) < 0) continue;
        if (want-- == 0) return kth_core(t, keep, g, rank / with_cores);
    }
    return rank % t->ncores;
}

static zccl_result_t gpu_core(const zccl_topo_t *t, int rank, int *core) {
    int ngpus = t->nkind[ZCCL_TOPO_DEV_GPU];
    if (ngpus == 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "--map gpu: the topology from %s has no GPU", t->origin);
    int cpu = t->devs[t->kind_ids[ZCCL_TOPO_DEV_GPU][rank % ngpus]].cpu;
    int before = 0; /* earlier ranks whose GPU hangs off the same CPU attachment take the first cores */
    for (int r = 0; r < rank; r++) before += t->devs[t->kind_ids[ZCCL_TOPO_DEV_GPU][r % ngpus]].cpu == cpu;
    *core = cpu >= 0 ? kth_core(t, in_cpu, cpu, before) : -1;
    if (*core < 0) *core = kth_core(t, any_core, 0, rank);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl_topo_place_cpuset(const zccl_topo_t *t, int rank, int nranks, zccl_bind_t bind, zccl_map_t map,
                                     hwloc_bitmap_t out) {
    if (!t || !out || rank < 0 || rank >= nranks)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_place_cpuset: rank %d of %d", rank, nranks);
    if (t->ncores == 0)
        return zccl__error(ZCCL_INVALID_ARGUMENT,
                           "rank placement on cores is not available: the topology from %s lists no CPU cores%s",
                           t->origin, t->source == ZCCL_TOPO_SRC_NCCL_XML
                                          ? " (its <cpu> elements give no affinity mask, or it has none)"
                                          : "");
    int core = 0;
    switch (map) {
    case ZCCL_MAP_CORE: core = rank % t->ncores; break;
    case ZCCL_MAP_NUMA: core = round_robin(t, in_numa, t->nnuma, rank); break;
    case ZCCL_MAP_PACKAGE: core = round_robin(t, in_package, t->npackages, rank); break;
    case ZCCL_MAP_GPU: ZCCL_CHECK(gpu_core(t, rank, &core)); break;
    default: return zccl__error(ZCCL_INVALID_ARGUMENT, "unknown rank mapping %d", (int)map);
    }
    const zccl_topo_core_t *c = &t->cores[core];
    switch (bind) {
    case ZCCL_BIND_CORE: hwloc_bitmap_copy(out, c->cpuset); break;
    case ZCCL_BIND_NUMA:
        hwloc_bitmap_copy(out, c->package >= 0 ? t->packages[c->package] : t->machine);
        for (int m = 0; m < t->nnuma; m++)
            if (t->numa[m].os_index == c->numa) hwloc_bitmap_copy(out, t->numa[m].cpuset);
        break;
    case ZCCL_BIND_NONE: hwloc_bitmap_copy(out, t->machine); break;
    default: return zccl__error(ZCCL_INVALID_ARGUMENT, "unknown binding %d", (int)bind);
    }
    return ZCCL_SUCCESS;
}

zccl_result_t zccl_topo_place(const zccl_topo_t *t, int nranks, zccl_bind_t bind, zccl_map_t map, uint64_t host,
                              zccl_locality_t *out) {
    if (!t || !out || nranks < 1) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_place: %d ranks", nranks);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    zccl_result_t res = ZCCL_SUCCESS;
    for (int r = 0; r < nranks && res == ZCCL_SUCCESS; r++) {
        res = zccl_topo_place_cpuset(t, r, nranks, bind, map, set);
        if (res == ZCCL_SUCCESS) res = zccl_topo_locality_of(t, set, host, &out[r]);
    }
    hwloc_bitmap_free(set);
    return res;
}

static const char *const bind_names[] = {"none", "core", "numa"};
static const char *const map_names[] = {"core", "numa", "package", "gpu"};

const char *zccl_topo_bind_name(zccl_bind_t b) { return (unsigned)b < 3 ? bind_names[b] : "?"; }
const char *zccl_topo_map_name(zccl_map_t m) { return (unsigned)m < 4 ? map_names[m] : "?"; }
int zccl_topo_bind_parse(const char *w) {
    for (int i = 0; w && i < 3; i++)
        if (strcmp(w, bind_names[i]) == 0) return i;
    return -1;
}
int zccl_topo_map_parse(const char *w) {
    if (w && (strcmp(w, "socket") == 0)) return ZCCL_MAP_PACKAGE;
    for (int i = 0; w && i < 4; i++)
        if (strcmp(w, map_names[i]) == 0) return i;
    return -1;
}

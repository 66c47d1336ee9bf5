/*
 * topo_nvml.c — NVLinks of this machine's GPUs from NVML, opened with dlopen so that zccl neither links against nor
 * needs the NVIDIA driver: where libnvidia-ml.so.1 is absent (no driver, a CPU-only host) the model simply has no
 * NVML NVLink data. Only zccl_topo_create_live_ex(ZCCL_TOPO_NVML) comes here.
 *
 * The few NVML types used are declared here from NVML's documented C ABI (nvml.h is not needed to build):
 * nvmlReturn_t is an int (0 = success), nvmlDevice_t an opaque pointer, nvmlPciInfo_t the v3 layout below. For
 * each GPU and each link index until NVML says the index does not exist: an active link's remote PCI address is
 * another GPU of the model (a direct link), or an NVSwitch (nvmlDeviceGetNvLinkRemoteDeviceType == switch, or,
 * without that entry point, any remote that is not a GPU), or an IBM CPU port (ignored).
 *
 * Never run against a real driver on this project's machines (no NVIDIA driver); tests/fake_nvml/fake_nvml.c stands
 * in for it (zccl__topo_nvml_from), which checks the logic, not NVML's ABI. docs/topology.md says so.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "topo_model.h"

typedef int nvml_ret_t;
typedef void *nvml_device_t;
typedef struct {
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} nvml_pci_t;

enum { NVML_OK = 0, NVML_ENABLED = 1, NVML_REMOTE_GPU = 0, NVML_REMOTE_IBMNPU = 1, NVML_REMOTE_SWITCH = 2 };
#define NVML_MAX_LINKS 18 /* NVML_NVLINK_MAX_LINKS of current drivers; the loop stops earlier when NVML says so */

typedef struct {
    nvml_ret_t (*init)(void);
    nvml_ret_t (*shutdown)(void);
    nvml_ret_t (*count)(unsigned *);
    nvml_ret_t (*handle)(unsigned, nvml_device_t *);
    nvml_ret_t (*pci)(nvml_device_t, nvml_pci_t *);
    nvml_ret_t (*link_state)(nvml_device_t, unsigned, int *);
    nvml_ret_t (*remote_pci)(nvml_device_t, unsigned, nvml_pci_t *);
    nvml_ret_t (*remote_type)(nvml_device_t, unsigned, int *); /* optional */
} nvml_api_t;

static void *sym(void *lib, const char *a, const char *b) {
    void *f = dlsym(lib, a);
    return f || !b ? f : dlsym(lib, b);
}

static void busid_of(const nvml_pci_t *p, char *buf) { zccl__topo_busid(buf, p->domain, p->bus, p->device, 0); }

zccl_result_t zccl__topo_nvml(zccl_topo_t *t) { return zccl__topo_nvml_from(t, "libnvidia-ml.so.1"); }

zccl_result_t zccl__topo_nvml_from(zccl_topo_t *t, const char *file) {
    if (t->nkind[ZCCL_TOPO_DEV_GPU] == 0) return ZCCL_SUCCESS;
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        ZCCL_INFO(ZCCL_LOG_TOPO, "topology: NVML (%s) is not available: %s; no NVLink data", file, dlerror());
        return ZCCL_SUCCESS;
    }
    nvml_api_t api;
    *(void **)&api.init = sym(lib, "nvmlInit_v2", "nvmlInit");
    *(void **)&api.shutdown = sym(lib, "nvmlShutdown", NULL);
    *(void **)&api.count = sym(lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    *(void **)&api.handle = sym(lib, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    *(void **)&api.pci = sym(lib, "nvmlDeviceGetPciInfo_v3", NULL);
    *(void **)&api.link_state = sym(lib, "nvmlDeviceGetNvLinkState", NULL);
    *(void **)&api.remote_pci = sym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", NULL);
    *(void **)&api.remote_type = sym(lib, "nvmlDeviceGetNvLinkRemoteDeviceType", NULL);
    zccl_result_t res = ZCCL_SUCCESS;
    unsigned n = 0;
    if (!api.init || !api.shutdown || !api.count || !api.handle || !api.pci || !api.link_state || !api.remote_pci) {
        ZCCL_WARN(ZCCL_LOG_TOPO, "topology: %s lacks the NVLink entry points (driver too old?); no NVLink data",
                  file);
        goto out;
    }
    if (api.init() != NVML_OK) {
        ZCCL_WARN(ZCCL_LOG_TOPO, "topology: nvmlInit failed; no NVLink data");
        goto out;
    }
    int before = t->nraw_nvl; /* entries from hwloc's NVLinkBandwidth matrix, if its NVML backend made one */
    if (api.count(&n) == NVML_OK) {
        bool any = false;
        for (unsigned g = 0; g < n && res == ZCCL_SUCCESS; g++) {
            nvml_device_t dev;
            nvml_pci_t pci;
            char busid[ZCCL_TOPO_BUSID_LEN], remote[ZCCL_TOPO_BUSID_LEN];
            if (api.handle(g, &dev) != NVML_OK || api.pci(dev, &pci) != NVML_OK) continue;
            busid_of(&pci, busid);
            const zccl_topo_dev_t *a = zccl_topo_dev_by_busid(t, busid);
            if (!a || a->kind != ZCCL_TOPO_DEV_GPU) continue; /* hidden from hwloc (cgroup), or not a GPU */
            int id = a->id;
            for (unsigned link = 0; link < NVML_MAX_LINKS && res == ZCCL_SUCCESS; link++) {
                int active = 0, type = -1;
                if (api.link_state(dev, link, &active) != NVML_OK) break; /* no such link index */
                if (active != NVML_ENABLED || api.remote_pci(dev, link, &pci) != NVML_OK) continue;
                busid_of(&pci, remote);
                const zccl_topo_dev_t *b = zccl_topo_dev_by_busid(t, remote);
                bool gpu = b && b->kind == ZCCL_TOPO_DEV_GPU;
                if (api.remote_type && api.remote_type(dev, link, &type) == NVML_OK) {
                    if (type == NVML_REMOTE_IBMNPU) continue;
                } else {
                    type = gpu ? NVML_REMOTE_GPU : NVML_REMOTE_SWITCH;
                }
                res = zccl__topo_add_nvlink(t, id, remote, 1, type == NVML_REMOTE_SWITCH && !gpu);
                any = true;
            }
        }
        if (any && res == ZCCL_SUCCESS) { /* NVML's own answer replaces hwloc's (counting both would double) */
            memmove(t->raw_nvl, t->raw_nvl + before, (size_t)(t->nraw_nvl - before) * sizeof *t->raw_nvl);
            t->nraw_nvl -= before;
            t->nvl_source = "NVML";
        }
    }
    api.shutdown();
out:
    dlclose(lib);
    return res;
}

/*
 * fake_nvml.c — a stand-in for libnvidia-ml.so.1 with the entry points topology/topo_nvml.c resolves, so that its
 * logic runs on machines without an NVIDIA driver (tests/test_topology.cpp, TopologyNvml.*). It describes four GPUs
 * whose bus ids are those of tests/topology/gpus-nics-only.xml:
 *   GPU0 0000:01:00.0 and GPU1 0000:02:00.0: 3 direct links to each other (links 0-2), link 3 inactive;
 *   GPU2 0000:11:00.0: links 0-5 to NVSwitch 0000:c0:00.0, link 6 to an IBM NPU (ignored);
 *   GPU3 0000:12:00.0: links 0-6 to NVSwitch 0000:c1:00.0 (7 links: more than GPU2's 6 switch links, fewer than
 *   GPU2's 6 + 1 if the NPU link were wrongly counted as a switch link);
 * every GPU has 8 link indexes (7 and above answer "invalid argument", which ends the scan).
 * The types follow topo_nvml.c's declarations of NVML's ABI; this checks the logic, not that ABI.
 */
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct {
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} nvml_pci_t;

enum { OK = 0, INVALID = 2, NOT_INIT = 1 };
enum { REMOTE_GPU = 0, REMOTE_NPU = 1, REMOTE_SWITCH = 2 };

static int inited;
static const unsigned gpu_bus[4] = {0x01, 0x02, 0x11, 0x12};

static int fill(nvml_pci_t *p, unsigned bus) {
    memset(p, 0, sizeof *p);
    p->domain = 0;
    p->bus = bus;
    p->device = 0;
    snprintf(p->bus_id, sizeof p->bus_id, "00000000:%02X:00.0", bus);
    snprintf(p->bus_id_legacy, sizeof p->bus_id_legacy, "0000:%02X:00.0", bus);
    return OK;
}

static int gpu_of(void *dev) {
    long g = (long)dev - 1;
    return g >= 0 && g < 4 ? (int)g : -1;
}

/* The remote end of link `l` of GPU g: -1 no such link index, 0 inactive, else 1 with bus and type. */
static int link_of(int g, unsigned l, unsigned *bus, int *type) {
    if (l >= 7) return -1;
    switch (g) {
    case 0: case 1:
        if (l > 2) return 0;
        *bus = gpu_bus[1 - g];
        *type = REMOTE_GPU;
        return 1;
    case 2:
        *bus = l < 6 ? 0xc0 : 0x04;
        *type = l < 6 ? REMOTE_SWITCH : REMOTE_NPU;
        return 1;
    case 3:
        *bus = 0xc1;
        *type = REMOTE_SWITCH;
        return 1;
    }
    return -1;
}

EXPORT int nvmlInit_v2(void) { inited = 1; return OK; }
EXPORT int nvmlShutdown(void) { inited = 0; return OK; }
EXPORT int nvmlDeviceGetCount_v2(unsigned *n) {
    if (!inited) return NOT_INIT;
    *n = 4;
    return OK;
}
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **dev) {
    if (!inited || i >= 4) return INVALID;
    *dev = (void *)(long)(i + 1);
    return OK;
}
EXPORT int nvmlDeviceGetPciInfo_v3(void *dev, nvml_pci_t *p) {
    int g = gpu_of(dev);
    return g < 0 ? INVALID : fill(p, gpu_bus[g]);
}
EXPORT int nvmlDeviceGetNvLinkState(void *dev, unsigned l, int *active) {
    unsigned bus;
    int type, g = gpu_of(dev), r = g < 0 ? -1 : link_of(g, l, &bus, &type);
    if (r < 0) return INVALID;
    *active = r; /* NVML_FEATURE_ENABLED = 1 */
    return OK;
}
EXPORT int nvmlDeviceGetNvLinkRemotePciInfo_v2(void *dev, unsigned l, nvml_pci_t *p) {
    unsigned bus;
    int type, g = gpu_of(dev);
    if (g < 0 || link_of(g, l, &bus, &type) != 1) return INVALID;
    return fill(p, bus);
}
EXPORT int nvmlDeviceGetNvLinkRemoteDeviceType(void *dev, unsigned l, int *t) {
    unsigned bus;
    int g = gpu_of(dev);
    if (g < 0 || link_of(g, l, &bus, t) != 1) return INVALID;
    return OK;
}

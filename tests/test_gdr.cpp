/*
 * test_gdr.cpp — GPUDirect RDMA's settings, probes and path rule (topology/topo_gdr.c, transport/ib_gdr_probe.c,
 * mem/mem_gdr.c; docs/gpu.md "GPUDirect RDMA"), without a GPU or an RDMA NIC: the rule on hand-written topology
 * files, the level grammar (NCCL names and numbers, NCCL_* names mapped), the peer-memory probe on a fake sysfs tree,
 * the decision with the fake CUDA driver's attributes (flush before Hopper), the dma-buf export's errors, and the
 * lines zccl-topo and zccl_config_describe print.
 */
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "gdr.h"
#include "mem.h"
#include "mem_gdr.h"
#include "topo.h"
}
#include "harness/harness.h"
#include "zccl.h"

namespace {

struct TopoDeleter {
    void operator()(zccl_topo_t *t) const { zccl_topo_destroy(t); }
};
using Topo = std::unique_ptr<zccl_topo_t, TopoDeleter>;

Topo load(const char *name) {
    zccl_topo_t *raw = nullptr;
    const std::string path = std::string(ZCCL_TEST_TOPO_DIR) + "/" + name;
    EXPECT_EQ(zccl_topo_create_file(path.c_str(), 0, &raw), ZCCL_SUCCESS) << path;
    return Topo(raw);
}

std::string run(const std::string &env_and_cmd) {
    std::string out;
    FILE *p = popen((env_and_cmd + " 2>&1").c_str(), "r");
    if (!p) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    return out;
}

TEST(Gdr, LevelGrammarNamesAndNcclNumbers) {
    zccl_path_t l;
    const std::pair<const char *, zccl_path_t> ok[] = {{"LOC", ZCCL_PATH_LOC}, {"pix", ZCCL_PATH_PIX},
                                                       {"PXB", ZCCL_PATH_PXB}, {"PHB", ZCCL_PATH_PHB},
                                                       {"node", ZCCL_PATH_PHB}, {"SYS", ZCCL_PATH_SYS},
                                                       {"0", ZCCL_PATH_LOC}, {"2", ZCCL_PATH_PXB},
                                                       {"4", ZCCL_PATH_SYS}, {"7", ZCCL_PATH_SYS}};
    for (auto &c : ok) {
        ASSERT_EQ(zccl_topo_gdr_level_parse(c.first, &l), 0) << c.first;
        EXPECT_EQ(l, c.second) << c.first;
    }
    for (const char *bad : {"", "PXN", "-1", "2x", "NET"}) EXPECT_EQ(zccl_topo_gdr_level_parse(bad, &l), -1) << bad;
}

TEST(Gdr, PathRuleOnTopologyFiles) {
    Topo t = load("gpus-nics-only.xml"); /* GPU0, GPU1 PIX to NIC0; GPU2, GPU3 PHB */
    ASSERT_TRUE(t);
    char why[160];
    int nic;
    zccl_path_t path;
    const zccl_topo_dev_t *g0 = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, 0), *g2 = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, 2);
    EXPECT_TRUE(zccl_topo_gdr_pair(t.get(), g0, ZCCL_PATH_PXB, &nic, &path, why, sizeof why)) << why;
    EXPECT_EQ(nic, 0);
    EXPECT_EQ(path, ZCCL_PATH_PIX);
    EXPECT_FALSE(zccl_topo_gdr_pair(t.get(), g0, ZCCL_PATH_LOC, &nic, &path, why, sizeof why));
    EXPECT_NE(std::string(why).find("farther than the GDR level LOC"), std::string::npos) << why;
    EXPECT_FALSE(zccl_topo_gdr_pair(t.get(), g2, ZCCL_PATH_PXB, &nic, &path, why, sizeof why));
    EXPECT_EQ(path, ZCCL_PATH_PHB);
    EXPECT_NE(std::string(why).find("PHB"), std::string::npos) << why;
    EXPECT_TRUE(zccl_topo_gdr_pair(t.get(), g2, ZCCL_PATH_PHB, &nic, &path, why, sizeof why)) << why;
    Topo e = load("eth-only.xml");
    ASSERT_TRUE(e);
    EXPECT_FALSE(zccl_topo_gdr_pair(e.get(), zccl_topo_dev(e.get(), ZCCL_TOPO_DEV_GPU, 0), ZCCL_PATH_SYS, &nic, &path,
                                    why, sizeof why));
    EXPECT_NE(std::string(why).find("no RDMA-capable NIC"), std::string::npos) << why;
}

TEST(Gdr, ZcclTopoSaysPerGpuWhetherAndWhyNot) {
    const std::string tool = std::string(ZCCL_TOOLS_DIR) + "/zccl-topo --nccl-xml " + ZCCL_TEST_TOPO_DIR +
                             "/gpus-nics-only.xml";
    std::string out = run("env -u ZCCL_GDR -u ZCCL_NET_GDR_LEVEL -u NCCL_NET_GDR_LEVEL " + tool);
    EXPECT_NE(out.find("ZCCL_GDR=auto, ZCCL_NET_GDR_LEVEL=PXB"), std::string::npos) << out;
    EXPECT_NE(out.find("GPU0   yes          NIC0: GPU-NIC path PIX"), std::string::npos) << out;
    EXPECT_NE(out.find("GPU2   no           NIC0: GPU-NIC path PHB is farther"), std::string::npos) << out;
    out = run("env -u ZCCL_NET_GDR_LEVEL NCCL_NET_GDR_LEVEL=PHB " + tool); /* NCCL's name, mapped */
    EXPECT_NE(out.find("GPU2   yes          NIC0"), std::string::npos) << out;
    out = run("env ZCCL_GDR=0 " + tool);
    EXPECT_NE(out.find("GPU0   no           NIC0: ZCCL_GDR=0"), std::string::npos) << out;
    out = run("env ZCCL_GDR=1 " + tool);
    EXPECT_NE(out.find("GPU2   yes (forced)"), std::string::npos) << out;
    out = run("env ZCCL_GDR=maybe " + tool);
    EXPECT_NE(out.find("ZCCL_GDR=maybe: expected auto, 0 or 1"), std::string::npos) << out;
}

TEST(Gdr, SettingsErrorsNameTheVariable) {
    EXPECT_EQ(zt::run_in_child({{"ZCCL_GDR", "2"}}, [] {
        zccl_gdr_cfg_t c;
        return zccl__gdr_cfg(&c) == ZCCL_INVALID_ARGUMENT && strstr(zccl_get_last_error(nullptr), "ZCCL_GDR=2") ? 0 : 1;
    }), 0);
    EXPECT_EQ(zt::run_in_child({{"NCCL_NET_GDR_LEVEL", "PXN"}}, [] {
        unsetenv("ZCCL_NET_GDR_LEVEL");
        zccl_gdr_cfg_t c;
        return zccl__gdr_cfg(&c) == ZCCL_INVALID_ARGUMENT &&
                       strstr(zccl_get_last_error(nullptr), "NCCL_NET_GDR_LEVEL=PXN") ? 0 : 1;
    }), 0);
    EXPECT_EQ(zt::run_in_child({{"NCCL_GDR_FLUSH_DISABLE", "1"}, {"NCCL_DMABUF_ENABLE", "0"}, {"NCCL_NET_GDR_READ", "0"}}, [] {
        unsetenv("ZCCL_GDR_FLUSH_DISABLE");
        unsetenv("ZCCL_DMABUF_ENABLE");
        unsetenv("ZCCL_NET_GDR_READ");
        zccl_gdr_cfg_t c;
        return zccl__gdr_cfg(&c) == ZCCL_SUCCESS && c.flush_disable && !c.dmabuf && c.read_setting == 0 ? 0 : 1;
    }), 0);
}

TEST(Gdr, PeerMemoryProbeReadsSysfs) {
    char dir[] = "/tmp/zccl-gdr-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    const std::string root = dir;
    zccl_nic_gdr_t n;
    zccl__gdr_probe_peermem(root.c_str(), &n);
    EXPECT_FALSE(n.peermem) << n.peermem_what;
    for (const char *d : {"/sys", "/sys/module", "/sys/module/nvidia_peermem"}) mkdir((root + d).c_str(), 0755);
    FILE *f = fopen((root + "/sys/module/nvidia_peermem/version").c_str(), "w");
    ASSERT_TRUE(f);
    fputs("1.0\n", f);
    fclose(f);
    zccl__gdr_probe_peermem(root.c_str(), &n);
    EXPECT_TRUE(n.peermem);
    EXPECT_NE(std::string(n.peermem_what).find("nvidia_peermem"), std::string::npos) << n.peermem_what;
    unlink((root + "/sys/module/nvidia_peermem/version").c_str());
    rmdir((root + "/sys/module/nvidia_peermem").c_str());
    rmdir((root + "/sys/module").c_str());
    rmdir((root + "/sys").c_str());
    rmdir(dir);
}

/* With the fake driver: dma-buf on both sides -> gdr, flush before Hopper only; no dma-buf and no peer memory ->
 * staged, naming both; ZCCL_GDR=0 -> staged. */
int decide_body(bool want_gdr, bool want_flush, const char *want_text, int nic_dmabuf, bool peermem) {
    zccl_gdr_cfg_t c;
    ZT_CHECK(zccl__gdr_cfg(&c) == ZCCL_SUCCESS, "%s", zccl_get_last_error(nullptr));
    zccl_nic_gdr_t nic = {};
    nic.nic_dmabuf = nic_dmabuf;
    nic.peermem = peermem;
    snprintf(nic.peermem_what, sizeof nic.peermem_what, "%s", peermem ? "peer memory (test)" : "no peer memory (test)");
    bool flush = false;
    char buf[400];
    const bool g = zccl__gdr_decide(&c, &nic, 0, &flush, buf, sizeof buf);
    ZT_CHECK(g == want_gdr && flush == want_flush && strstr(buf, want_text), "gdr %d flush %d: %s", g, flush, buf);
    return 0;
}

TEST(Gdr, DecisionWithTheFakeDriverAttributes) {
    const char *lib = ZCCL_FAKE_CUDA_PATH;
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}, {"FAKE_CUDA_CC", "80"}},
                    [] { return decide_body(true, true, "gdr (dma-buf", 1, false); }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}, {"FAKE_CUDA_CC", "90"}},
                    [] { return decide_body(true, false, "flush not needed", 1, false); }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}, {"FAKE_CUDA_CC", "80"}, {"ZCCL_GDR_FLUSH_DISABLE", "1"}},
                    [] { return decide_body(true, false, "ZCCL_GDR_FLUSH_DISABLE", 1, false); }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}, {"FAKE_CUDA_CC", "80"}},
                    [] { return decide_body(false, false, "staged: neither dma-buf (NIC no", 0, false); }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}, {"FAKE_CUDA_DMABUF", "0"}},
                    [] { return decide_body(true, false, "gdr (peer memory", 1, true); }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}, {"ZCCL_GDR", "0"}},
                    [] { return decide_body(false, false, "staged: ZCCL_GDR=0", 1, true); }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"}},
                    [] { return decide_body(false, false, "staged: no CUDA driver", 1, true); }), 0);
}

/* Bad input to the export: misaligned ranges, memory the driver did not allocate, a driver that refuses. */
TEST(Gdr, DmaBufExportErrorsNameTheCause) {
    const char *lib = ZCCL_FAKE_CUDA_PATH;
    auto body = [](bool refuse) -> int {
        zccl_gpu_gdr_t g;
        zccl__mem_gpu_gdr(0, &g);
        ZT_CHECK(g.driver && g.export_entry, "%s", g.why);
        void *d = nullptr;
        ZT_CHECK(zccl_mem_alloc_cuda(&d, 1 << 16) == ZCCL_SUCCESS, "alloc: %s", zccl_get_last_error(nullptr));
        int fd = -1;
        const long page = sysconf(_SC_PAGESIZE);
        if (refuse) {
            ZT_CHECK(zccl__mem_gpu_dmabuf_fd(d, (size_t)page, &fd) == ZCCL_INVALID_USAGE &&
                       strstr(zccl_get_last_error(nullptr), "cannot be exported"), "%s", zccl_get_last_error(nullptr));
            return 0;
        }
        ZT_CHECK(zccl__mem_gpu_dmabuf_fd(d, (size_t)page, &fd) == ZCCL_SUCCESS && fd >= 0, "%s",
               zccl_get_last_error(nullptr));
        close(fd);
        ZT_CHECK(zccl__mem_gpu_dmabuf_fd((char *)d + 1, (size_t)page, &fd) == ZCCL_INVALID_ARGUMENT &&
                   strstr(zccl_get_last_error(nullptr), "page-aligned"), "%s", zccl_get_last_error(nullptr));
        ZT_CHECK(zccl__mem_gpu_dmabuf_fd(d, 100, &fd) == ZCCL_INVALID_ARGUMENT, "size 100");
        std::vector<char> host(3 * (size_t)page);
        char *aligned = (char *)(((uintptr_t)host.data() + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1));
        ZT_CHECK(zccl__mem_gpu_dmabuf_fd(aligned, (size_t)page, &fd) == ZCCL_INVALID_USAGE, "host memory exported");
        zccl_mem_free_cuda(d);
        return 0;
    };
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}}, [&] { return body(false); }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}, {"FAKE_CUDA_DMABUF_EXPORT", "0"}}, [&] { return body(true); }), 0);
}

/* Issue 24, what the registration caches rely on: CU_POINTER_ATTRIBUTE_BUFFER_ID is new for every allocation (also
 * one at an address freed before: FAKE_CUDA_REUSE_FREED=1 hands it back), and freed memory is unknown to the driver:
 * zccl__mem_buffer_id fails with ZCCL_INVALID_ARGUMENT naming the pointer and the likely cause. */
TEST(Gdr, BufferIdsAreNewPerAllocationAndFreedMemoryIsUnknown) {
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", ZCCL_FAKE_CUDA_PATH}, {"FAKE_CUDA_REUSE_FREED", "1"}}, [] {
        void *a = nullptr, *b = nullptr, *c = nullptr;
        ZT_CHECK(zccl_mem_alloc_cuda(&a, 1 << 16) == ZCCL_SUCCESS && zccl_mem_alloc_cuda(&b, 1 << 16) == ZCCL_SUCCESS,
                 "alloc: %s", zccl_get_last_error(nullptr));
        uint64_t ia = 0, ib = 0, ia2 = 0, ic = 0;
        ZT_CHECK(zccl__mem_buffer_id(a, "device buffer", &ia) == ZCCL_SUCCESS && ia != 0, "%s",
                 zccl_get_last_error(nullptr));
        ZT_CHECK(zccl__mem_buffer_id((char *)a + 1000, "device buffer", &ia2) == ZCCL_SUCCESS && ia2 == ia,
                 "an address inside the allocation has its id: %llu vs %llu", (unsigned long long)ia2,
                 (unsigned long long)ia);
        ZT_CHECK(zccl__mem_buffer_id(b, "device buffer", &ib) == ZCCL_SUCCESS && ib != ia, "two allocations, one id");
        ZT_CHECK(zccl_mem_free_cuda(a) == ZCCL_SUCCESS, "free");
        ZT_CHECK(zccl__mem_buffer_id(a, "device buffer", &ia2) == ZCCL_INVALID_ARGUMENT, "freed memory has an id");
        char want[160];
        snprintf(want, sizeof want, "device buffer %p is not device memory that is allocated (freed while "
                 "registered?)", a);
        ZT_CHECK(strstr(zccl_get_last_error(nullptr), want), "%s", zccl_get_last_error(nullptr));
        zccl_mem_type_t t;
        ZT_CHECK(zccl__mem_query(a, &t, nullptr) == ZCCL_SUCCESS && t == ZCCL_MEM_HOST, "freed memory is device");
        ZT_CHECK(zccl_mem_alloc_cuda(&c, 1 << 16) == ZCCL_SUCCESS && c == a, "the freed address did not come back "
                 "(%p, %p)", a, c);
        ZT_CHECK(zccl__mem_buffer_id(c, "device buffer", &ic) == ZCCL_SUCCESS && ic != ia && ic != ib,
                 "a reallocation at the same address kept an old id (%llu)", (unsigned long long)ic);
        zccl_mem_free_cuda(b);
        zccl_mem_free_cuda(c);
        return 0;
    }), 0);
}

TEST(Gdr, ConfigDescribeSaysIt) {
    EXPECT_EQ(zt::run_in_child({{"ZCCL_GDR", "0"}, {"NCCL_NET_GDR_LEVEL", "PIX"}}, [] {
        unsetenv("ZCCL_NET_GDR_LEVEL");
        std::string s(zccl_config_describe(nullptr, 0) + 1, '\0');
        zccl_config_describe(&s[0], s.size());
        return s.find("GPUDirect RDMA: ZCCL_GDR=0, path level PIX") != std::string::npos &&
                       s.find("NCCL_NET_GDR_LEVEL") != std::string::npos ? 0 : 1;
    }), 0);
}

}  // namespace

/* The GDR data path's test hooks (issue 24; tests/rdma/vm_gdr.sh uses them in the soft-RoCE VM): ZCCL_GDR_FAKE_PEERMEM
 * makes the sysfs probe of the real root say "peer memory" (never a fake root), and the fake driver's PCI attributes
 * give the bus id ZCCL_GDR=auto looks the GPU up by. */
TEST(Gdr, FakePeerMemorySwitchAndPciBusId) {
    const char *lib = ZCCL_FAKE_CUDA_PATH;
    EXPECT_EQ(zt::run_in_child({{"ZCCL_GDR_FAKE_PEERMEM", "2"}, {"ZCCL_CUDA_LIBRARY", lib},
                                {"FAKE_CUDA_PCI_BUSID", "0000:3b:00.0"}}, [] {
        zccl_nic_gdr_t n;
        zccl__gdr_probe_peermem("/", &n);
        ZT_CHECK(n.peermem && strstr(n.peermem_what, "ZCCL_GDR_FAKE_PEERMEM=2, test only, device registrations "
                                                     "refused"), "%s", n.peermem_what);
        zccl__gdr_probe_peermem("/nonexistent-root", &n);
        ZT_CHECK(!n.peermem, "a fake sysfs root must not see the switch: %s", n.peermem_what);
        zccl_gdr_cfg_t c;
        ZT_CHECK(zccl__gdr_cfg(&c) == ZCCL_SUCCESS && c.fake_peermem == 2, "%s", zccl_get_last_error(nullptr));
        zccl_gpu_gdr_t g;
        zccl__mem_gpu_gdr(0, &g);
        ZT_CHECK(!strcmp(g.busid, "0000:3b:00.0"), "bus id '%s'", g.busid);
        return 0;
    }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_CUDA_LIBRARY", lib}}, [] {
        unsetenv("FAKE_CUDA_PCI_BUSID");
        zccl_gpu_gdr_t g;
        zccl__mem_gpu_gdr(0, &g);
        ZT_CHECK(!g.busid[0], "no bus id expected without FAKE_CUDA_PCI_BUSID, got '%s'", g.busid);
        return 0;
    }), 0);
    EXPECT_EQ(zt::run_in_child({{"ZCCL_GDR_FAKE_PEERMEM", "3"}}, [] {
        zccl_gdr_cfg_t c;
        ZT_CHECK(zccl__gdr_cfg(&c) != ZCCL_SUCCESS && strstr(zccl_get_last_error(nullptr), "ZCCL_GDR_FAKE_PEERMEM"),
                 "%s", zccl_get_last_error(nullptr));
        return 0;
    }), 0);
}

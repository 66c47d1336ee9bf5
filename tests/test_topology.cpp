// Topology: the machine model (hwloc synthetic topologies, the real machines in ../shared/topologies checked against
// EXPECTED.md there), path classes, rank localities and the ring order.
#include <gtest/gtest.h>

// The suite globs tests/test_*.cpp; these tests need topology/ built into zccl_internal, whose include directories
// then hold topo.h. Until the build has it, one test says so instead of the whole suite failing to link.
#if !__has_include("topo.h")
TEST(Topology, NotBuilt) {
    GTEST_SKIP() << "topology/ is not part of zccl_internal in this build (see docs/topology.md)";
}
#else

#include <algorithm>
#include <cstdio>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "topo.h"
#include "topo_model.h" // zccl__topo_nvml_from, zccl__topo_finish (TopologyNvml)

namespace {

struct TopoDeleter {
    void operator()(zccl_topo_t *t) const { zccl_topo_destroy(t); }
};
using Topo = std::unique_ptr<zccl_topo_t, TopoDeleter>;

Topo synthetic(const char *desc) {
    zccl_topo_t *t = nullptr;
    EXPECT_EQ(zccl_topo_create_synthetic(desc, &t), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    return Topo(t);
}

zccl_topo_counts_t counts(const zccl_topo_t *t) {
    zccl_topo_counts_t c;
    zccl_topo_counts(t, &c);
    return c;
}

std::string write_temp(const std::string &name, const std::string &text) {
    std::string path = testing::TempDir() + "zccl_topo_" + name;
    std::ofstream(path) << text;
    return path;
}

zccl_locality_t loc(uint64_t host, int package, int numa, int core, int nic_path = ZCCL_PATH_PHB) {
    zccl_locality_t l{};
    l.host = host;
    l.package = package;
    l.numa = numa;
    l.core = core;
    l.first_pu = l.last_pu = core;
    l.npus = 1;
    l.nic_path = nic_path;
    return l;
}

std::vector<int> ring(const std::vector<zccl_locality_t> &ranks) {
    std::vector<int> order(ranks.size(), -1);
    EXPECT_EQ(zccl_topo_ring_order(ranks.data(), (int)ranks.size(), order.data()), ZCCL_SUCCESS);
    EXPECT_TRUE(zccl_topo_ring_is_permutation(order.data(), (int)order.size()));
    return order;
}

zccl_ring_crossings_t crossings(const std::vector<zccl_locality_t> &ranks, const std::vector<int> &order) {
    zccl_ring_crossings_t c;
    zccl_topo_ring_crossings(ranks.data(), (int)ranks.size(), order.data(), &c);
    return c;
}

// ---- synthetic machines: expectations follow from the description -------------------------------------------

TEST(TopologySynthetic, CountsFollowTheDescription) {
    Topo t = synthetic("pack:2 numa:2 core:4 pu:2");
    ASSERT_TRUE(t);
    zccl_topo_counts_t c = counts(t.get());
    EXPECT_EQ(c.packages, 2);
    EXPECT_EQ(c.numa_nodes, 4);
    EXPECT_EQ(c.cores, 16);
    EXPECT_EQ(c.pus, 32);
    EXPECT_EQ(c.gpus, 0);
    EXPECT_EQ(c.nics, 0);
    EXPECT_EQ(zccl_topo_source(t.get()), ZCCL_TOPO_SRC_SYNTHETIC);
    for (int i = 0; i < 4; i++) {
        const zccl_topo_numa_t *m = zccl_topo_numa(t.get(), i);
        ASSERT_NE(m, nullptr);
        EXPECT_EQ(m->package, i / 2) << "NUMA node " << i;
        EXPECT_EQ(hwloc_bitmap_weight(m->cpuset), 8);
    }
}

TEST(TopologySynthetic, CachesAreSummarisedPerLevel) {
    Topo t = synthetic("pack:2 l3:1 core:4 l2:1 l1d:1 pu:2");
    ASSERT_TRUE(t);
    ASSERT_EQ(zccl_topo_cache_count(t.get()), 3);
    EXPECT_EQ(zccl_topo_cache(t.get(), 0)->level, 1);
    EXPECT_EQ(zccl_topo_cache(t.get(), 0)->count, 8);
    EXPECT_EQ(zccl_topo_cache(t.get(), 1)->level, 2);
    EXPECT_EQ(zccl_topo_cache(t.get(), 2)->level, 3);
    EXPECT_EQ(zccl_topo_cache(t.get(), 2)->count, 2);
}

TEST(TopologySynthetic, LocalityOfABinding) {
    Topo t = synthetic("pack:2 numa:2 core:4 pu:2");
    ASSERT_TRUE(t);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    zccl_locality_t l;
    // PUs 10-11 are core 5: package 0, its second NUMA node (OS index 1).
    hwloc_bitmap_set_range(set, 10, 11);
    ASSERT_EQ(zccl_topo_locality_of(t.get(), set, 42, &l), ZCCL_SUCCESS);
    EXPECT_EQ(l.host, 42u);
    EXPECT_EQ(l.package, 0);
    EXPECT_EQ(l.numa, 1);
    EXPECT_EQ(l.core, 5);
    EXPECT_EQ(l.first_pu, 10);
    EXPECT_EQ(l.last_pu, 11);
    EXPECT_EQ(l.npus, 2);
    EXPECT_EQ(l.nic_path, ZCCL_TOPO_NO_NIC);
    // One PU of package 1.
    hwloc_bitmap_only(set, 17);
    ASSERT_EQ(zccl_topo_locality_of(t.get(), set, 0, &l), ZCCL_SUCCESS);
    EXPECT_EQ(l.package, 1);
    EXPECT_EQ(l.numa, 2);
    EXPECT_EQ(l.core, 8);
    // A NUMA node: no single core.
    hwloc_bitmap_zero(set);
    hwloc_bitmap_set_range(set, 24, 31);
    ASSERT_EQ(zccl_topo_locality_of(t.get(), set, 0, &l), ZCCL_SUCCESS);
    EXPECT_EQ(l.package, 1);
    EXPECT_EQ(l.numa, 3);
    EXPECT_EQ(l.core, -1);
    // Across packages: nothing is known below the host.
    hwloc_bitmap_set_range(set, 0, 31);
    ASSERT_EQ(zccl_topo_locality_of(t.get(), set, 0, &l), ZCCL_SUCCESS);
    EXPECT_EQ(l.package, -1);
    EXPECT_EQ(l.numa, -1);
    EXPECT_EQ(l.core, -1);
    EXPECT_EQ(l.npus, 32);
    hwloc_bitmap_zero(set);
    EXPECT_EQ(zccl_topo_locality_of(t.get(), set, 0, &l), ZCCL_INVALID_ARGUMENT);
    hwloc_bitmap_free(set);
}

TEST(TopologySynthetic, PlacementsFollowMpirunMapping) {
    Topo t = synthetic("pack:2 numa:2 core:4 pu:2");
    ASSERT_TRUE(t);
    std::vector<zccl_locality_t> l(8);
    // map package: round robin over the packages, filling cores in order.
    ASSERT_EQ(zccl_topo_place(t.get(), 8, ZCCL_BIND_CORE, ZCCL_MAP_PACKAGE, 0, l.data()), ZCCL_SUCCESS);
    for (int r = 0; r < 8; r++) {
        EXPECT_EQ(l[r].package, r % 2) << "rank " << r;
        EXPECT_EQ(l[r].core, (r % 2) * 8 + r / 2) << "rank " << r;
        EXPECT_EQ(l[r].npus, 2);
    }
    // map core: consecutive cores.
    ASSERT_EQ(zccl_topo_place(t.get(), 8, ZCCL_BIND_CORE, ZCCL_MAP_CORE, 0, l.data()), ZCCL_SUCCESS);
    for (int r = 0; r < 8; r++) EXPECT_EQ(l[r].core, r);
    // bind numa: the NUMA node, no core.
    ASSERT_EQ(zccl_topo_place(t.get(), 8, ZCCL_BIND_NUMA, ZCCL_MAP_NUMA, 0, l.data()), ZCCL_SUCCESS);
    for (int r = 0; r < 8; r++) {
        EXPECT_EQ(l[r].numa, r % 4);
        EXPECT_EQ(l[r].core, -1);
        EXPECT_EQ(l[r].npus, 8);
    }
    // bind none: the whole machine.
    ASSERT_EQ(zccl_topo_place(t.get(), 4, ZCCL_BIND_NONE, ZCCL_MAP_CORE, 0, l.data()), ZCCL_SUCCESS);
    EXPECT_EQ(l[0].package, -1);
    EXPECT_EQ(l[0].npus, 32);
    // map gpu needs GPUs.
    EXPECT_EQ(zccl_topo_place(t.get(), 4, ZCCL_BIND_CORE, ZCCL_MAP_GPU, 0, l.data()), ZCCL_INVALID_ARGUMENT);
}

TEST(TopologySynthetic, EightRanksOverTwoPackagesCrossTwice) {
    Topo t = synthetic("pack:2 numa:2 core:4 pu:2");
    ASSERT_TRUE(t);
    std::vector<zccl_locality_t> l(8);
    ASSERT_EQ(zccl_topo_place(t.get(), 8, ZCCL_BIND_CORE, ZCCL_MAP_PACKAGE, 0, l.data()), ZCCL_SUCCESS);
    std::vector<int> order = ring(l);
    zccl_ring_crossings_t c = crossings(l, order);
    EXPECT_EQ(c.host, 0);
    EXPECT_EQ(c.package, 2);
    EXPECT_EQ(c.numa, 0); // 4 ranks per package fill its first NUMA node
    std::vector<int> identity = {0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT_EQ(crossings(l, identity).package, 8); // rank order alternates packages
}

TEST(TopologySynthetic, InvalidDescriptionIsAnError) {
    zccl_topo_t *t = nullptr;
    EXPECT_EQ(zccl_topo_create_synthetic("pack:2 bogus:3", &t), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(t, nullptr);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("bogus"), std::string::npos);
}

// ---- this machine ----------------------------------------------------------------------------------------------

TEST(TopologyLive, ThisMachineAndThisProcess) {
    zccl_topo_t *raw = nullptr;
    ASSERT_EQ(zccl_topo_create_live(&raw), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    Topo t(raw);
    zccl_topo_counts_t c = counts(t.get());
    EXPECT_GE(c.pus, 1);
    EXPECT_GE(c.cores, 1);
    EXPECT_GE(c.numa_nodes, 1);
    zccl_locality_t l;
    ASSERT_EQ(zccl_topo_locality_self(t.get(), 7, &l), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    EXPECT_EQ(l.host, 7u);
    EXPECT_GE(l.npus, 1);
    EXPECT_GE(l.first_pu, 0);
}

// ---- files: errors -----------------------------------------------------------------------------------------------

TEST(TopologyFiles, BadFilesAreClearErrors) {
    zccl_topo_t *t = nullptr;
    EXPECT_EQ(zccl_topo_create_file("/nonexistent/topo.xml", 0, &t), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("/nonexistent/topo.xml"), std::string::npos);
    EXPECT_EQ(zccl_topo_create_hwloc_xml("/nonexistent/topo.xml", 0, &t), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(zccl_topo_create_nccl_xml("/nonexistent/topo.xml", 0, &t), ZCCL_INVALID_ARGUMENT);

    std::string broken = write_temp("broken.xml", "<system version=\"1\"><cpu numaid=\"0\">\n</system>\n");
    EXPECT_EQ(zccl_topo_create_nccl_xml(broken.c_str(), 0, &t), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("not well-formed"), std::string::npos);

    std::string other = write_temp("other.xml", "<html><body/></html>\n");
    EXPECT_EQ(zccl_topo_create_file(other.c_str(), 0, &t), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("<html>"), std::string::npos);
    EXPECT_EQ(zccl_topo_create_nccl_xml(other.c_str(), 0, &t), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(zccl_topo_create_hwloc_xml(other.c_str(), 0, &t), ZCCL_INVALID_ARGUMENT);

    std::string busid = write_temp("busid.xml", "<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ff\">\n"
                                                "<pci busid=\"zz:1\" class=\"0x030200\"/>\n</cpu></system>\n");
    EXPECT_EQ(zccl_topo_create_nccl_xml(busid.c_str(), 0, &t), ZCCL_INVALID_ARGUMENT);
    std::string msg = zccl_get_last_error(nullptr);
    EXPECT_NE(msg.find(":3:"), std::string::npos) << msg; // the line of the bad element
    EXPECT_NE(msg.find("zz:1"), std::string::npos) << msg;

    std::string nocpu = write_temp("nocpu.xml", "<system version=\"1\"></system>\n");
    EXPECT_EQ(zccl_topo_create_nccl_xml(nocpu.c_str(), 0, &t), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(t, nullptr);
}

// A small NCCL file with every path class: two switches under CPU 0 (one nested), a GPU on the root complex of
// CPU 0 and a GPU and a NIC under CPU 1.
const char *kPathsXml = R"(<system version="1">
  <cpu numaid="0" affinity="0000000f">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
      <pci busid="0000:02:00.0" class="0x030200" vendor="0x10de" link_speed="16 GT/s" link_width="16"/>
      <pci busid="0000:03:00.0" class="0x020000" vendor="0x15b3" link_speed="16 GT/s" link_width="16">
        <nic><net name="mlx5_0" dev="0"/></nic>
      </pci>
      <pci busid="0000:04:00.0" class="0x060400">
        <pci busid="0000:05:00.0" class="0x030200" vendor="0x10de"><gpu dev="1"/></pci>
      </pci>
    </pci>
    <pci busid="0000:06:00.0" class="0x030000" vendor="0x1002" link_speed="8 GT/s" link_width="8"/>
  </cpu>
  <cpu numaid="1" affinity="000000f0">
    <pci busid="0000:81:00.0" class="0x030200" vendor="0x10de"/>
    <pci busid="0000:82:00.0" class="0x020700" vendor="0x15b3"/>
  </cpu>
</system>
)";

TEST(TopologyPaths, ClassesOfAHandWrittenNcclFile) {
    std::string path = write_temp("paths.xml", kPathsXml);
    zccl_topo_t *raw = nullptr;
    ASSERT_EQ(zccl_topo_create_file(path.c_str(), 0, &raw), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    Topo t(raw);
    zccl_topo_counts_t c = counts(t.get());
    EXPECT_EQ(c.gpus, 4);
    EXPECT_EQ(c.nics, 2);
    EXPECT_EQ(c.cpus, 2);
    EXPECT_EQ(c.packages, 2);
    EXPECT_EQ(c.pus, 8);
    EXPECT_EQ(c.switches, 2);
    auto dev = [&](const char *busid) {
        const zccl_topo_dev_t *d = zccl_topo_dev_by_busid(t.get(), busid);
        EXPECT_NE(d, nullptr) << busid;
        return d;
    };
    auto cls = [&](const char *a, const char *b) { return zccl_topo_path(t.get(), dev(a), dev(b), nullptr); };
    EXPECT_EQ(cls("0000:02:00.0", "0000:02:00.0"), ZCCL_PATH_LOC);
    EXPECT_EQ(cls("0000:02:00.0", "0000:03:00.0"), ZCCL_PATH_PIX);
    EXPECT_EQ(cls("0000:05:00.0", "0000:03:00.0"), ZCCL_PATH_PXB);
    EXPECT_EQ(cls("0000:03:00.0", "0000:05:00.0"), ZCCL_PATH_PXB);
    EXPECT_EQ(cls("0000:06:00.0", "0000:02:00.0"), ZCCL_PATH_PHB);
    EXPECT_EQ(cls("0000:81:00.0", "0000:02:00.0"), ZCCL_PATH_SYS);
    EXPECT_EQ(cls("0000:81:00.0", "0000:82:00.0"), ZCCL_PATH_PHB);
    EXPECT_STREQ(zccl_topo_path_name(ZCCL_PATH_PXB), "PXB");
    EXPECT_STREQ(zccl_topo_path_name(ZCCL_PATH_NET), "NET");

    const zccl_topo_dev_t *amd = dev("0000:06:00.0");
    EXPECT_EQ(amd->kind, ZCCL_TOPO_DEV_GPU);
    EXPECT_NEAR(amd->link_gbs, 8 * 8 * (128.0 / 130.0) / 8, 1e-9);
    EXPECT_STREQ(amd->link, "8 GT/s x8");
    EXPECT_STREQ(dev("0000:05:00.0")->osdev[0], "cuda1");
    EXPECT_STREQ(dev("0000:03:00.0")->osdev[0], "mlx5_0");

    // Nearest NICs: best class first, hops break ties.
    int nics[4];
    zccl_path_t p;
    ASSERT_EQ(zccl_topo_nearest_nics(t.get(), dev("0000:05:00.0"), nics, 4, &p, nullptr), 1);
    EXPECT_EQ(p, ZCCL_PATH_PXB);
    EXPECT_STREQ(zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_NIC, nics[0])->busid, "0000:03:00.0");
    ASSERT_EQ(zccl_topo_nearest_nics(t.get(), dev("0000:81:00.0"), nics, 4, &p, nullptr), 1);
    EXPECT_EQ(p, ZCCL_PATH_PHB);
    EXPECT_STREQ(zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_NIC, nics[0])->busid, "0000:82:00.0");

    // A rank's CPUs and a device.
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_bitmap_only(set, 1);
    EXPECT_EQ(zccl_topo_path_cpuset(t.get(), set, dev("0000:02:00.0")), ZCCL_PATH_PHB);
    EXPECT_EQ(zccl_topo_path_cpuset(t.get(), set, dev("0000:81:00.0")), ZCCL_PATH_SYS);
    zccl_locality_t l;
    ASSERT_EQ(zccl_topo_locality_of(t.get(), set, 0, &l), ZCCL_SUCCESS);
    EXPECT_EQ(l.nic_path, ZCCL_PATH_PHB);
    EXPECT_EQ(l.package, 0);
    EXPECT_EQ(l.numa, 0);
    hwloc_bitmap_free(set);

    // map gpu places rank i next to GPU i.
    std::vector<zccl_locality_t> ranks(4);
    ASSERT_EQ(zccl_topo_place(t.get(), 4, ZCCL_BIND_CORE, ZCCL_MAP_GPU, 0, ranks.data()), ZCCL_SUCCESS);
    for (int r = 0; r < 4; r++) {
        const zccl_topo_dev_t *g = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, r);
        EXPECT_EQ(ranks[r].numa, g->numa) << "rank " << r;
    }
    zccl_locality_t self;
    EXPECT_EQ(zccl_topo_locality_self(t.get(), 0, &self), ZCCL_INVALID_USAGE); // a file of another machine
}

// ---- the real machines in ../shared/topologies ---------------------------------------------------------------

const std::string kTopoDir = std::string(ZCCL_SHARED_DIR) + "/topologies";

// EXPECTED.md: "## <dir>/<file>" headers, each followed by a fenced block of fact lines.
std::map<std::string, std::vector<std::string>> read_expected() {
    std::map<std::string, std::vector<std::string>> facts;
    std::ifstream in(kTopoDir + "/EXPECTED.md");
    std::string line, section;
    bool fenced = false;
    while (std::getline(in, line)) {
        if (line.rfind("## ", 0) == 0) section = line.substr(3);
        else if (line.rfind("```", 0) == 0) fenced = !fenced;
        else if (fenced && !section.empty() && !line.empty()) facts[section].push_back(line);
    }
    return facts;
}

std::vector<std::string> list_xml(const std::string &sub) {
    std::vector<std::string> files;
    if (DIR *d = opendir((kTopoDir + "/" + sub).c_str())) {
        while (struct dirent *e = readdir(d)) {
            std::string n = e->d_name;
            if (n.size() > 4 && n.compare(n.size() - 4, 4, ".xml") == 0) files.push_back(sub + "/" + n);
        }
        closedir(d);
    }
    std::sort(files.begin(), files.end());
    return files;
}

// "key=value" fields of a fact line, plus the words without '=' in order.
struct Fact {
    std::vector<std::string> words;
    std::map<std::string, std::string> kv;
};
Fact parse_fact(const std::string &line) {
    Fact f;
    std::istringstream in(line);
    std::string w;
    while (in >> w) {
        size_t eq = w.find('=');
        if (eq == std::string::npos) f.words.push_back(w);
        else f.kv[w.substr(0, eq)] = w.substr(eq + 1);
    }
    return f;
}

std::string osdevs_of(const zccl_topo_dev_t *d) {
    if (!d->nosdevs) return "-";
    std::string s;
    for (int i = 0; i < d->nosdevs; i++) s += (i ? "," : "") + std::string(d->osdev[i]);
    return s;
}

std::string numa_of(const zccl_topo_t *t, const zccl_topo_dev_t *d) {
    char buf[128];
    return zccl_topo_dev_numa_list(t, d, buf, sizeof buf);
}

std::set<std::string> split_set(const std::string &s) {
    std::set<std::string> out;
    std::istringstream in(s);
    std::string w;
    while (std::getline(in, w, ',')) out.insert(w);
    return out;
}

bool skip_without_shared(std::vector<std::string> &files, const std::string &sub) {
    files = list_xml(sub);
    return files.empty();
}

void check_hwloc_file(const std::string &rel, const std::vector<std::string> &facts) {
    zccl_topo_t *raw = nullptr;
    ASSERT_EQ(zccl_topo_create_file((kTopoDir + "/" + rel).c_str(), 0, &raw), ZCCL_SUCCESS)
        << zccl_get_last_error(nullptr);
    Topo t(raw);
    EXPECT_EQ(zccl_topo_source(t.get()), ZCCL_TOPO_SRC_HWLOC_XML);
    zccl_topo_counts_t c = counts(t.get());
    int gpus = 0, nics = 0;
    for (const std::string &line : facts) {
        SCOPED_TRACE(line);
        Fact f = parse_fact(line);
        ASSERT_FALSE(f.words.empty() && f.kv.empty());
        if (f.kv.count("packages")) {
            EXPECT_EQ(c.packages, std::stoi(f.kv["packages"]));
            EXPECT_EQ(c.numa_nodes, std::stoi(f.kv["numa"]));
            EXPECT_EQ(c.cores, std::stoi(f.kv["cores"]));
            EXPECT_EQ(c.pus, std::stoi(f.kv["pus"]));
        } else if (f.words[0] == "GPU" || f.words[0] == "NIC") {
            (f.words[0] == "GPU" ? gpus : nics)++;
            // Bus ids are not unique in every export (32em64t has two 0000:04:00.0): match the class too.
            const zccl_topo_dev_t *d = nullptr;
            unsigned cls = (unsigned)std::stoul(f.kv["class"], nullptr, 16);
            for (int i = 0; i < zccl_topo_dev_total(t.get()); i++) {
                const zccl_topo_dev_t *x = zccl_topo_dev_at(t.get(), i);
                if (f.kv["pci"] == x->busid && x->class_id == cls) d = x;
            }
            ASSERT_NE(d, nullptr);
            EXPECT_EQ(d->kind, f.words[0] == "GPU" ? ZCCL_TOPO_DEV_GPU : ZCCL_TOPO_DEV_NIC);
            EXPECT_EQ(d->class_id, std::stoul(f.kv["class"], nullptr, 16));
            EXPECT_EQ(d->vendor, std::stoul(f.kv["vendor"], nullptr, 16));
            EXPECT_EQ(numa_of(t.get(), d), f.kv["numa"]);
            EXPECT_EQ(osdevs_of(d), f.kv["osdevs"]);
        } else if (f.words[0] == "OSDEV-NOPCI") {
            ASSERT_GE(f.words.size(), 2u);
            const zccl_topo_dev_t *found = nullptr;
            for (int i = 0; i < zccl_topo_dev_count(t.get(), ZCCL_TOPO_DEV_OSDEV); i++) {
                const zccl_topo_dev_t *d = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_OSDEV, i);
                if (f.words[1] == d->osdev[0]) found = d;
            }
            ASSERT_NE(found, nullptr);
            EXPECT_EQ(numa_of(t.get(), found), f.kv["numa"]);
        } else {
            ADD_FAILURE() << "fact not understood";
        }
    }
    EXPECT_EQ(c.gpus, gpus) << "GPUs in " << rel;
    EXPECT_EQ(c.nics, nics) << "NICs in " << rel;
}

void check_nccl_file(const std::string &rel, const std::vector<std::string> &facts) {
    zccl_topo_t *raw = nullptr;
    ASSERT_EQ(zccl_topo_create_file((kTopoDir + "/" + rel).c_str(), 0, &raw), ZCCL_SUCCESS)
        << zccl_get_last_error(nullptr);
    Topo t(raw);
    EXPECT_EQ(zccl_topo_source(t.get()), ZCCL_TOPO_SRC_NCCL_XML);
    zccl_topo_counts_t c = counts(t.get());
    for (const std::string &line : facts) {
        SCOPED_TRACE(line);
        Fact f = parse_fact(line);
        if (f.kv.count("gpus")) {
            EXPECT_EQ(c.gpus, std::stoi(f.kv["gpus"]));
            EXPECT_EQ(c.nics, std::stoi(f.kv["nics"]));
            EXPECT_EQ(c.cpus, std::stoi(f.kv["cpus"]));
            continue;
        }
        ASSERT_EQ(f.words.size(), 2u);
        const zccl_topo_dev_t *d = zccl_topo_dev_by_busid(t.get(), f.words[1].c_str());
        ASSERT_NE(d, nullptr);
        EXPECT_EQ(d->kind, f.words[0] == "GPU" ? ZCCL_TOPO_DEV_GPU : ZCCL_TOPO_DEV_NIC);
        EXPECT_EQ(numa_of(t.get(), d), f.kv["numa"]);
        if (f.words[0] != "GPU") continue;
        int nics[64];
        zccl_path_t path;
        int n = zccl_topo_nearest_nics(t.get(), d, nics, 64, &path, nullptr);
        std::set<std::string> got;
        for (int i = 0; i < n; i++) got.insert(zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_NIC, nics[i])->busid);
        EXPECT_EQ(got, split_set(f.kv["nearest_nic"]));
        EXPECT_STREQ(zccl_topo_path_name(path), f.kv["path"].c_str());
    }
}

TEST(TopologySharedFiles, HwlocExportsMatchExpected) {
    std::vector<std::string> files;
    if (skip_without_shared(files, "hwloc"))
        GTEST_SKIP() << "no hwloc topology files in " << kTopoDir << "/hwloc (the shared folder is absent)";
    auto facts = read_expected();
    for (const std::string &rel : files) {
        SCOPED_TRACE(rel);
        ASSERT_TRUE(facts.count(rel)) << rel << " has no section in EXPECTED.md";
        check_hwloc_file(rel, facts[rel]);
    }
}

TEST(TopologySharedFiles, NcclFilesMatchExpected) {
    std::vector<std::string> files;
    if (skip_without_shared(files, "nccl"))
        GTEST_SKIP() << "no NCCL topology files in " << kTopoDir << "/nccl (the shared folder is absent)";
    auto facts = read_expected();
    for (const std::string &rel : files) {
        SCOPED_TRACE(rel);
        ASSERT_TRUE(facts.count(rel)) << rel << " has no section in EXPECTED.md";
        check_nccl_file(rel, facts[rel]);
    }
}

TEST(TopologySharedFiles, RingsOnEveryMachineArePermutations) {
    std::vector<std::string> files = list_xml("hwloc"), nccl = list_xml("nccl");
    files.insert(files.end(), nccl.begin(), nccl.end());
    if (files.empty()) GTEST_SKIP() << "no topology files in " << kTopoDir;
    for (const std::string &rel : files) {
        SCOPED_TRACE(rel);
        zccl_topo_t *raw = nullptr;
        ASSERT_EQ(zccl_topo_create_file((kTopoDir + "/" + rel).c_str(), 0, &raw), ZCCL_SUCCESS);
        Topo t(raw);
        zccl_topo_counts_t c = counts(t.get());
        int n = std::min(c.cores, 32);
        std::vector<zccl_locality_t> l(n);
        ASSERT_EQ(zccl_topo_place(t.get(), n, ZCCL_BIND_CORE, ZCCL_MAP_PACKAGE, 0, l.data()), ZCCL_SUCCESS);
        std::set<int> packages;
        for (const zccl_locality_t &x : l) packages.insert(x.package);
        zccl_ring_crossings_t cr = crossings(l, ring(l));
        EXPECT_EQ(cr.package, packages.size() > 1 ? (int)packages.size() : 0);
    }
}

// ---- the zccl-topo tool ----------------------------------------------------------------------------------------

#ifdef ZCCL_TOOLS_DIR
const std::string kTopoTool = std::string(ZCCL_TOOLS_DIR) + "/zccl-topo";
#else
const std::string kTopoTool;
#endif

// Runs zccl-topo with args; returns its exit status and fills out with stdout.
int run_tool(const std::string &args, std::string *out) {
    std::string cmd = kTopoTool + " " + args + " 2>/dev/null";
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    out->clear();
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool tool_missing() {
    std::ifstream f(kTopoTool);
    return kTopoTool.empty() || !f.good();
}

TEST(TopologyTool, SharedFilesInEveryOutputFormat) {
    if (tool_missing()) GTEST_SKIP() << "zccl-topo is not built (" << kTopoTool << ")";
    std::vector<std::string> files = list_xml("hwloc"), nccl = list_xml("nccl");
    if (files.empty() && nccl.empty()) GTEST_SKIP() << "no topology files in " << kTopoDir;
    auto facts = read_expected();
    std::string out;
    for (const std::string &rel : files) {
        SCOPED_TRACE(rel);
        std::string path = kTopoDir + "/" + rel;
        ASSERT_EQ(run_tool("--xml " + path, &out), 0);
        Fact c = parse_fact(facts[rel].at(0));
        std::ostringstream want;
        int p = std::stoi(c.kv["packages"]), m = std::stoi(c.kv["numa"]);
        want << "Machine: " << p << " package" << (p == 1 ? "" : "s") << ", " << m << " NUMA node"
             << (m == 1 ? "" : "s") << ", " << c.kv["cores"] << " cores, " << c.kv["pus"] << " PUs";
        EXPECT_NE(out.find(want.str()), std::string::npos) << want.str() << "\n" << out.substr(0, 400);
        ASSERT_EQ(run_tool("--json --xml " + path, &out), 0);
        EXPECT_EQ(out.front(), '{');
        ASSERT_EQ(run_tool("--dot --ranks 4 --bind numa --xml " + path, &out), 0);
        EXPECT_EQ(out.rfind("digraph", 0), 0u);
    }
    for (const std::string &rel : nccl) {
        SCOPED_TRACE(rel);
        std::string path = kTopoDir + "/" + rel;
        ASSERT_EQ(run_tool("--nccl-xml " + path, &out), 0);
        for (const std::string &line : facts[rel]) {
            Fact f = parse_fact(line);
            if (f.words.size() == 2 && f.words[0] == "GPU") // "GPU3   0000:... nearest NIC NIC1 (PIX)"
                EXPECT_NE(out.find("(" + f.kv["path"] + ")"), std::string::npos) << line;
        }
        ASSERT_EQ(run_tool("--json --ranks 16 --hosts 2 --nccl-xml " + path, &out), 0);
        ASSERT_EQ(run_tool("--dot --nccl-xml " + path, &out), 0);
    }
}

TEST(TopologyTool, BadArgumentsAndFiles) {
    if (tool_missing()) GTEST_SKIP() << "zccl-topo is not built (" << kTopoTool << ")";
    std::string out;
    EXPECT_EQ(run_tool("--help", &out), 0);
    EXPECT_NE(out.find("--nccl-xml"), std::string::npos);
    EXPECT_EQ(run_tool("--bogus", &out), 2);
    EXPECT_EQ(run_tool("--ranks 0", &out), 2);
    EXPECT_EQ(run_tool("--bind socket", &out), 2);
    EXPECT_EQ(run_tool("--xml", &out), 2);
    EXPECT_EQ(run_tool("--json --dot", &out), 2); /* two output formats: refused, not the last one silently */
    EXPECT_TRUE(out.empty()) << out;
    EXPECT_EQ(run_tool("--svg /dev/null --png /dev/null", &out), 2);
    EXPECT_EQ(run_tool("--json --json", &out), 0);
    EXPECT_EQ(run_tool("--xml /nonexistent.xml", &out), 1);
    EXPECT_EQ(run_tool("--synthetic 'pack:2 core:2 pu:1' --map gpu", &out), 1);
    EXPECT_EQ(run_tool("--synthetic 'pack:2 core:2 pu:1' --ranks 4", &out), 0);
    EXPECT_NE(out.find("crossings: host 0, package 2"), std::string::npos) << out;
}

// ---- RDMA-capable NICs, files without CPU cores, nvidia-smi's classes (tests/topology/*.xml) -------------------

const std::string kOwnTopoDir = ZCCL_TEST_TOPO_DIR;
constexpr int ZCCL_GPU_NICS_TEST_MAX = 8;

Topo load_file(const std::string &path) {
    zccl_topo_t *raw = nullptr;
    EXPECT_EQ(zccl_topo_create_file(path.c_str(), 0, &raw), ZCCL_SUCCESS) << path << ": " << zccl_get_last_error(nullptr);
    return Topo(raw);
}

// The NICs a device pairs with, as bus ids, and the class.
std::set<std::string> paired(const zccl_topo_t *t, const zccl_topo_dev_t *d, zccl_path_t *path = nullptr) {
    int nics[64];
    zccl_path_t p;
    int n = zccl_topo_nearest_nics(t, d, nics, 64, &p, nullptr);
    std::set<std::string> out;
    for (int i = 0; i < n; i++) out.insert(zccl_topo_dev(t, ZCCL_TOPO_DEV_NIC, nics[i])->busid);
    if (path) *path = p;
    return out;
}

// The nearest NICs of any kind, computed here from zccl_topo_path and the hop counts: what pairing did before RDMA
// mattered, so a test can show the Ethernet port really is the closer one.
std::set<std::string> nearest_any(const zccl_topo_t *t, const zccl_topo_dev_t *d) {
    std::vector<std::pair<std::pair<int, int>, std::string>> all;
    for (int i = 0; i < zccl_topo_dev_count(t, ZCCL_TOPO_DEV_NIC); i++) {
        const zccl_topo_dev_t *nic = zccl_topo_dev(t, ZCCL_TOPO_DEV_NIC, i);
        int hops;
        zccl_path_t p = zccl_topo_path(t, d, nic, &hops);
        all.push_back({{(int)p, hops}, nic->busid});
    }
    std::set<std::string> out;
    if (all.empty()) return out;
    auto best = std::min_element(all.begin(), all.end())->first;
    for (auto &x : all)
        if (x.first == best) out.insert(x.second);
    return out;
}

std::string smi(const zccl_topo_t *t, const zccl_topo_dev_t *a, const zccl_topo_dev_t *b) {
    char buf[16];
    int nv;
    zccl_smi_path_t p = zccl_topo_smi_path(t, a, b, &nv);
    return zccl_topo_smi_name(p, nv, buf, sizeof buf);
}

const zccl_topo_dev_t *by_busid(const zccl_topo_t *t, const char *busid) {
    const zccl_topo_dev_t *d = zccl_topo_dev_by_busid(t, busid);
    EXPECT_NE(d, nullptr) << busid;
    return d;
}

// zccl_topo_gpu_nic_names: the rails a rank on a GPU starts on (issue 23, "Rails": as NCCL pairs a GPU with its NIC).
std::vector<std::string> gpu_nic_names(const zccl_topo_t *t, const char *busid, int max = ZCCL_GPU_NICS_TEST_MAX) {
    char names[ZCCL_GPU_NICS_TEST_MAX][ZCCL_TOPO_NAME_LEN];
    const int n = zccl_topo_gpu_nic_names(t, busid, names, max);
    return std::vector<std::string>(names, names + n);
}

TEST(TopoGpuRails, EachGpuNamesThePortsOfItsNearestNic) {
    Topo t = load_file(kOwnTopoDir + "/gpu-rails.xml");
    ASSERT_TRUE(t);
    const zccl_topo_t *m = t.get();
    EXPECT_EQ(gpu_nic_names(m, "0000:01:00.0"), (std::vector<std::string>{"rxe0", "rxe1"}));
    EXPECT_EQ(gpu_nic_names(m, "0000:02:00.0"), (std::vector<std::string>{"rxe2", "rxe3"}));
    EXPECT_EQ(gpu_nic_names(m, "0000:02:00.0", 1), (std::vector<std::string>{"rxe2"})); // at most max names
    // The third GPU is as far from both NICs: no rail is preferred (rank order applies).
    EXPECT_TRUE(gpu_nic_names(m, "0000:03:00.0").empty());
    // Not a GPU, not in the model, no bus id, no model: nothing.
    EXPECT_TRUE(gpu_nic_names(m, "0000:11:00.0").empty());
    EXPECT_TRUE(gpu_nic_names(m, "0000:99:00.0").empty());
    EXPECT_TRUE(gpu_nic_names(m, "").empty());
    EXPECT_TRUE(gpu_nic_names(nullptr, "0000:01:00.0").empty());
    // The pairing that zccl-topo prints agrees: GPU 0000:01:00.0 with the NIC of rxe0/rxe1.
    zccl_path_t p;
    EXPECT_EQ(paired(m, by_busid(m, "0000:01:00.0"), &p), std::set<std::string>{"0000:11:00.0"});
}

TEST(TopoGpuRails, AnRdmaNicIsPreferredOverACloserEthernetPort) {
    Topo t = load_file(kOwnTopoDir + "/eth-nearer-than-ib.xml");
    ASSERT_TRUE(t);
    EXPECT_EQ(gpu_nic_names(t.get(), "0000:11:00.0"), (std::vector<std::string>{"mlx5_0"}));
}

TEST(TopologyRdma, NcclFileGpuPairsWithTheHcaNotTheCloserEthernetPort) {
    Topo t = load_file(kOwnTopoDir + "/eth-nearer-than-ib.xml");
    ASSERT_TRUE(t);
    const zccl_topo_t *m = t.get();
    EXPECT_EQ(zccl_topo_rdma_nic_count(m), 2);
    EXPECT_EQ(by_busid(m, "0000:12:00.0")->rdma, 0); // eth0: guid 0x0, gdr 0
    EXPECT_EQ(by_busid(m, "0000:21:00.0")->rdma, 1); // mlx5_0, class 0x0207, a port GUID
    EXPECT_EQ(by_busid(m, "0000:1c:00.0")->rdma, 0); // Intel port without <nic>
    EXPECT_EQ(by_busid(m, "0000:1d:00.0")->rdma, 1); // ConnectX in Ethernet class: RoCE
    EXPECT_EQ(by_busid(m, "0000:11:00.0")->rdma, 0); // not a NIC
    // GPU0: the Ethernet port shares its switch (PIX), the HCA is under another switch of the same CPU (PHB).
    const zccl_topo_dev_t *g0 = by_busid(m, "0000:11:00.0"), *g1 = by_busid(m, "0000:1b:00.0");
    EXPECT_EQ(nearest_any(m, g0), std::set<std::string>{"0000:12:00.0"});
    zccl_path_t p;
    EXPECT_EQ(paired(m, g0, &p), std::set<std::string>{"0000:21:00.0"});
    EXPECT_EQ(p, ZCCL_PATH_PHB);
    EXPECT_EQ(smi(m, g0, by_busid(m, "0000:21:00.0")), "NODE");
    EXPECT_EQ(smi(m, g0, by_busid(m, "0000:12:00.0")), "PIX");
    // GPU1: an Intel port in its switch (PIX), the RoCE port one switch further (PXB).
    EXPECT_EQ(nearest_any(m, g1), std::set<std::string>{"0000:1c:00.0"});
    EXPECT_EQ(paired(m, g1, &p), std::set<std::string>{"0000:1d:00.0"});
    EXPECT_EQ(p, ZCCL_PATH_PXB);
}

TEST(TopologyRdma, HwlocOpenFabricsDeviceMakesANicRdmaCapable) {
    Topo t = load_file(kOwnTopoDir + "/hwloc-eth-nearer-than-roce.xml");
    ASSERT_TRUE(t);
    const zccl_topo_t *m = t.get();
    ASSERT_EQ(zccl_topo_dev_count(m, ZCCL_TOPO_DEV_GPU), 1);
    ASSERT_EQ(zccl_topo_dev_count(m, ZCCL_TOPO_DEV_NIC), 2);
    const zccl_topo_dev_t *gpu = zccl_topo_dev(m, ZCCL_TOPO_DEV_GPU, 0);
    const zccl_topo_dev_t *eth = by_busid(m, "0000:05:00.0"), *roce = by_busid(m, "0000:41:00.0");
    EXPECT_EQ(eth->rdma, 0);
    EXPECT_EQ(roce->rdma, 1);
    EXPECT_STREQ(roce->rdma_why, "OpenFabrics bnxt_re0");
    EXPECT_EQ(nearest_any(m, gpu), std::set<std::string>{"0000:05:00.0"});
    EXPECT_EQ(paired(m, gpu), std::set<std::string>{"0000:41:00.0"});
    EXPECT_EQ(smi(m, gpu, eth), "PIX");
    EXPECT_EQ(smi(m, gpu, roce), "NODE"); // another host bridge of the same NUMA node
    // The rank locality's NIC distance follows the RDMA NIC too (PHB either way here: one NUMA node).
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_bitmap_only(set, 0);
    zccl_locality_t l;
    ASSERT_EQ(zccl_topo_locality_of(m, set, 0, &l), ZCCL_SUCCESS);
    EXPECT_EQ(l.nic_path, ZCCL_PATH_PHB);
    hwloc_bitmap_free(set);
}

TEST(TopologyRdma, FallsBackToTheNearestNicOfAnyKindWhenNoneIsRdma) {
    Topo t = load_file(kOwnTopoDir + "/eth-only.xml");
    ASSERT_TRUE(t);
    EXPECT_EQ(zccl_topo_rdma_nic_count(t.get()), 0);
    const zccl_topo_dev_t *g = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, 0);
    ASSERT_NE(g, nullptr);
    zccl_path_t p;
    EXPECT_EQ(paired(t.get(), g, &p), nearest_any(t.get(), g));
    EXPECT_EQ(paired(t.get(), g), std::set<std::string>{"0000:12:00.0"});
    EXPECT_EQ(p, ZCCL_PATH_PIX);
}

// EXPECTED.md lists each NIC's OS devices and class: a NIC with an InfiniBand class or an RDMA device name among
// them (mlx4_/mlx5_ HCAs, rdmap... EFA, usnic_ verbs devices) is RDMA-capable; every GPU must pair with such a NIC
// whenever the file has one, and with the nearest NIC of any kind otherwise.
TEST(TopologyRdma, SharedFilesPairGpusWithRdmaNics) {
    std::vector<std::string> files = list_xml("hwloc");
    if (files.empty()) GTEST_SKIP() << "no hwloc topology files in " << kTopoDir << "/hwloc (the shared folder is absent)";
    auto facts = read_expected();
    int files_with_choice = 0;
    for (const std::string &rel : files) {
        SCOPED_TRACE(rel);
        Topo t = load_file(kTopoDir + "/" + rel);
        ASSERT_TRUE(t);
        std::set<std::string> rdma, all;
        for (const std::string &line : facts[rel]) {
            Fact f = parse_fact(line);
            if (f.words.empty() || f.words[0] != "NIC") continue;
            all.insert(f.kv["pci"]);
            bool r = f.kv["class"] == "0x0207";
            for (const std::string &os : split_set(f.kv["osdevs"]))
                r |= os.rfind("mlx", 0) == 0 || os.rfind("rdmap", 0) == 0 || os.rfind("usnic_", 0) == 0;
            if (r) rdma.insert(f.kv["pci"]);
        }
        for (int i = 0; i < zccl_topo_dev_count(t.get(), ZCCL_TOPO_DEV_NIC); i++) {
            const zccl_topo_dev_t *n = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_NIC, i);
            EXPECT_EQ(n->rdma != 0, rdma.count(n->busid) > 0) << n->busid << " " << n->rdma_why;
        }
        EXPECT_EQ(zccl_topo_rdma_nic_count(t.get()), (int)rdma.size());
        for (int i = 0; i < zccl_topo_dev_count(t.get(), ZCCL_TOPO_DEV_GPU); i++) {
            const zccl_topo_dev_t *g = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, i);
            std::set<std::string> got = paired(t.get(), g);
            if (all.empty()) {
                EXPECT_TRUE(got.empty());
                continue;
            }
            ASSERT_FALSE(got.empty()) << g->busid;
            if (rdma.empty()) {
                EXPECT_EQ(got, nearest_any(t.get(), g)) << g->busid;
            } else {
                for (const std::string &b : got) EXPECT_TRUE(rdma.count(b)) << g->busid << " paired with " << b;
                files_with_choice += nearest_any(t.get(), g) != got;
            }
        }
    }
    // 32em64t (GPUs tie between I350 ports and mlx5_0) and g4dnmetal (EFA and ENA side by side) must have changed.
    EXPECT_GT(files_with_choice, 0);
    if (std::find(files.begin(), files.end(), "hwloc/g4dnmetal.xml") != files.end()) {
        Topo t = load_file(kTopoDir + "/hwloc/g4dnmetal.xml");
        for (int i = 0; i < zccl_topo_dev_count(t.get(), ZCCL_TOPO_DEV_GPU); i++)
            EXPECT_EQ(paired(t.get(), zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, i)),
                      std::set<std::string>{"0000:c5:00.0"}); // the EFA, not the ENA next to it
    }
}

TEST(TopologyNoCores, VendorFileWithGpusAndNicsOnly) {
    Topo t = load_file(kOwnTopoDir + "/gpus-nics-only.xml");
    ASSERT_TRUE(t);
    const zccl_topo_t *m = t.get();
    zccl_topo_counts_t c = counts(m);
    EXPECT_EQ(c.gpus, 4);
    EXPECT_EQ(c.nics, 3);
    EXPECT_EQ(c.cores, 0);
    EXPECT_EQ(c.pus, 0);
    EXPECT_FALSE(zccl_topo_has_cores(m));
    std::vector<zccl_locality_t> l(4);
    EXPECT_EQ(zccl_topo_place(m, 4, ZCCL_BIND_CORE, ZCCL_MAP_GPU, 0, l.data()), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("rank placement on cores is not available"),
              std::string::npos)
        << zccl_get_last_error(nullptr);
    // Pairing and classes still follow the PCI tree: EFA functions (1d0f:efa1) are RDMA, the ENA (1d0f:ec20) not.
    const zccl_topo_dev_t *g0 = by_busid(m, "0000:01:00.0"), *g1 = by_busid(m, "0000:02:00.0");
    const zccl_topo_dev_t *g2 = by_busid(m, "0000:11:00.0"), *g3 = by_busid(m, "0000:12:00.0");
    EXPECT_EQ(paired(m, g0), std::set<std::string>{"0000:03:00.0"});
    EXPECT_EQ(nearest_any(m, g2), std::set<std::string>{"0000:13:00.0"});
    std::set<std::string> efas = {"0000:03:00.0", "0000:23:00.0"};
    EXPECT_EQ(paired(m, g2), efas);
    // NVLinks: 4 listed by each side of the pair are 4, not 8; no NVLink between GPUs 2 and 3.
    EXPECT_EQ(zccl_topo_nvlinks(m, g0, g1), 4);
    EXPECT_EQ(zccl_topo_nvlinks(m, g1, g0), 4);
    EXPECT_EQ(smi(m, g0, g1), "NV4");
    EXPECT_EQ(smi(m, g2, g3), "PIX");
    EXPECT_EQ(smi(m, g0, g2), "NODE");
    EXPECT_EQ(smi(m, g0, g0), "X");
    EXPECT_STREQ(zccl_topo_nvlink_source(m), "NCCL <nvlink> elements");

    // Loaded as this machine's file (ZCCL_TOPO_FILE), it cannot say where this process runs: a clear error, which
    // the communicator turns into "locality unknown" (lib/core/comm_setup.c).
    zccl_topo_t *self_raw = nullptr;
    ASSERT_EQ(zccl_topo_create_file((kOwnTopoDir + "/gpus-nics-only.xml").c_str(), ZCCL_TOPO_THIS_SYSTEM, &self_raw),
              ZCCL_SUCCESS);
    Topo self_topo(self_raw);
    zccl_locality_t self;
    EXPECT_EQ(zccl_topo_locality_self(self_topo.get(), 0, &self), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("lists no CPUs"), std::string::npos);

    // A <cpu> without affinity mask gives no cores either.
    std::string path = write_temp("nocpumask.xml", R"(<system version="1"><cpu numaid="0">
      <pci busid="0000:01:00.0" class="0x030200" vendor="0x10de"/>
      <pci busid="0000:02:00.0" class="0x020700" vendor="0x15b3"/></cpu></system>)");
    Topo u = load_file(path);
    ASSERT_TRUE(u);
    EXPECT_FALSE(zccl_topo_has_cores(u.get()));
    EXPECT_EQ(paired(u.get(), by_busid(u.get(), "0000:01:00.0")), std::set<std::string>{"0000:02:00.0"});
    // An empty <system> is still an error.
    std::string empty = write_temp("empty.xml", R"(<system version="1"></system>)");
    zccl_topo_t *raw = nullptr;
    EXPECT_EQ(zccl_topo_create_file(empty.c_str(), 0, &raw), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(raw, nullptr);
}

// Counts the NVLinks each <gpu> of an NCCL file gives to NVSwitches (tclass 0x068000) and to each other GPU, read
// from the text with regular expressions: a reference independent of the libxml2 reader.
struct NvlRef {
    std::map<std::string, int> to_switch;
    std::map<std::pair<std::string, std::string>, int> direct;
};
NvlRef nvlink_reference(const std::string &path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    NvlRef ref;
    std::string gpu;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t pci = text.find("<pci busid=\"", pos), nvl = text.find("<nvlink ", pos);
        if (pci == std::string::npos && nvl == std::string::npos) break;
        if (pci < nvl) {
            size_t b = pci + 12;
            std::string busid = text.substr(b, text.find('"', b) - b);
            size_t close = text.find('>', pci);
            if (text.find("class=\"0x0302", pci) < close) gpu = busid;
            pos = close;
        } else {
            size_t end = text.find("/>", nvl);
            std::string e = text.substr(nvl, end - nvl);
            auto val = [&](const std::string &k) {
                size_t a = e.find(k + "=\"") + k.size() + 2;
                return e.substr(a, e.find('"', a) - a);
            };
            if (val("tclass") == "0x068000") ref.to_switch[gpu] += std::stoi(val("count"));
            else ref.direct[{gpu, val("target")}] += std::stoi(val("count"));
            pos = end;
        }
    }
    return ref;
}

TEST(TopologySmi, NvlinkCountsOfTheRealA100File) {
    std::string path = kTopoDir + "/nccl/topo_8A100_4CX6.xml";
    if (!std::ifstream(path).good()) GTEST_SKIP() << path << " is absent (the shared folder is absent)";
    NvlRef ref = nvlink_reference(path);
    ASSERT_EQ(ref.to_switch.size(), 8u);
    Topo t = load_file(path);
    ASSERT_TRUE(t);
    int n = zccl_topo_dev_count(t.get(), ZCCL_TOPO_DEV_GPU);
    ASSERT_EQ(n, 8);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const zccl_topo_dev_t *a = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, i), *b = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, j);
            int d = std::max(ref.direct[{a->busid, b->busid}], ref.direct[{b->busid, a->busid}]);
            int want = i == j ? 0 : d + std::min(ref.to_switch[a->busid], ref.to_switch[b->busid]);
            EXPECT_EQ(zccl_topo_nvlinks(t.get(), a, b), want) << a->busid << " " << b->busid;
            EXPECT_EQ(smi(t.get(), a, b), i == j ? "X" : "NV" + std::to_string(want));
        }
    EXPECT_EQ(smi(t.get(), zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, 0), zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, 1)),
              "NV12"); // what nvidia-smi topo -m prints on an 8-GPU A100 (6 NVSwitches x 2 links)
    // Files without <nvlink> have no NVLink pairs.
    for (const std::string &rel : {"nccl/ndv4-topo.xml", "nccl/p4d-24xl-topo.xml"}) {
        Topo u = load_file(kTopoDir + "/" + rel);
        ASSERT_TRUE(u);
        EXPECT_EQ(zccl_topo_nvlink_source(u.get()), nullptr) << rel;
    }
}

TEST(TopologySmi, NvlinkBandwidthOfAnHwlocExport) {
    std::string path = kTopoDir + "/hwloc/power8gpudistances.xml";
    if (!std::ifstream(path).good()) GTEST_SKIP() << path << " is absent (the shared folder is absent)";
    Topo t = load_file(path);
    ASSERT_TRUE(t);
    EXPECT_STREQ(zccl_topo_nvlink_source(t.get()), "hwloc NVLinkBandwidth");
    // Reference: the file's matrix, whose GPU pairs hold 40000 MB/s = 2 NVLink 1 links of 20000 (P100, POWER8).
    const zccl_topo_distances_t *nv = nullptr;
    for (int i = 0; i < zccl_topo_distances_count(t.get()); i++)
        if (std::string(zccl_topo_distances(t.get(), i)->name) == "NVLinkBandwidth") nv = zccl_topo_distances(t.get(), i);
    ASSERT_NE(nv, nullptr);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const zccl_topo_dev_t *a = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, i), *b = zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, j);
            int ia = -1, ib = -1;
            for (int k = 0; k < nv->n; k++) {
                if (std::string(nv->labels[k]) == "nvml" + std::to_string(i)) ia = k;
                if (std::string(nv->labels[k]) == "nvml" + std::to_string(j)) ib = k;
            }
            ASSERT_GE(ia, 0);
            ASSERT_GE(ib, 0);
            int want = i == j ? 0 : (int)(nv->values[ia * nv->n + ib] / 20000);
            EXPECT_EQ(zccl_topo_nvlinks(t.get(), a, b), want) << i << " " << j;
            if (i != j) EXPECT_EQ(smi(t.get(), a, b), want ? "NV" + std::to_string(want) : "SYS") << i << " " << j;
        }
    EXPECT_EQ(zccl_topo_nvlinks(t.get(), zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, 0),
                                zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, 1)), 2);
}

// PHB against NODE, checked with hwloc itself: two devices whose NCCL class is PHB share a host bridge (PHB) or sit
// under different host bridges (NODE), found by walking hwloc's parents of the PCI objects.
hwloc_obj_t host_bridge(hwloc_topology_t hw, const zccl_topo_dev_t *d) {
    unsigned dom, bus, dev, fn;
    if (sscanf(d->busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return nullptr;
    for (hwloc_obj_t o = hwloc_get_next_pcidev(hw, nullptr); o; o = hwloc_get_next_pcidev(hw, o)) {
        const auto &a = o->attr->pcidev;
        if (a.domain != dom || a.bus != bus || a.dev != dev || a.func != fn || a.class_id != d->class_id) continue;
        for (hwloc_obj_t p = o->parent; p; p = p->parent)
            if (p->type == HWLOC_OBJ_BRIDGE && p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) return p;
    }
    return nullptr;
}

TEST(TopologySmi, PhbAndNodeInHwlocExports) {
    std::vector<std::string> files = list_xml("hwloc");
    if (files.empty()) GTEST_SKIP() << "no hwloc topology files in " << kTopoDir << "/hwloc (the shared folder is absent)";
    int node = 0, phb = 0;
    for (const std::string &rel : files) {
        SCOPED_TRACE(rel);
        Topo t = load_file(kTopoDir + "/" + rel);
        ASSERT_TRUE(t);
        std::vector<const zccl_topo_dev_t *> devs;
        for (int k : {ZCCL_TOPO_DEV_GPU, ZCCL_TOPO_DEV_NIC})
            for (int i = 0; i < zccl_topo_dev_count(t.get(), (zccl_topo_dev_kind_t)k); i++)
                devs.push_back(zccl_topo_dev(t.get(), (zccl_topo_dev_kind_t)k, i));
        for (const zccl_topo_dev_t *a : devs)
            for (const zccl_topo_dev_t *b : devs) {
                if (a == b || zccl_topo_nvlinks(t.get(), a, b)) continue;
                zccl_path_t p = zccl_topo_path(t.get(), a, b, nullptr);
                std::string got = smi(t.get(), a, b);
                if (p != ZCCL_PATH_PHB) {
                    EXPECT_EQ(got, zccl_topo_path_name(p)) << a->busid << " " << b->busid;
                    continue;
                }
                hwloc_obj_t ha = host_bridge(zccl_topo_hwloc(t.get()), a), hb = host_bridge(zccl_topo_hwloc(t.get()), b);
                ASSERT_TRUE(ha && hb) << a->busid << " " << b->busid;
                EXPECT_EQ(got, ha == hb ? "PHB" : "NODE") << a->busid << " " << b->busid;
                (ha == hb ? phb : node)++;
            }
    }
    EXPECT_GT(node, 0);
    EXPECT_GT(phb, 0);
    // g4dn.metal as nvidia-smi shows it: GPUs 0 and 1 share a host bridge, 0 and 2 do not, 0 and 4 are on two sockets.
    if (std::find(files.begin(), files.end(), "hwloc/g4dnmetal.xml") != files.end()) {
        Topo t = load_file(kTopoDir + "/hwloc/g4dnmetal.xml");
        auto g = [&](int i) { return zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, i); };
        EXPECT_EQ(smi(t.get(), g(0), g(1)), "PHB");
        EXPECT_EQ(smi(t.get(), g(0), g(2)), "NODE");
        EXPECT_EQ(smi(t.get(), g(0), g(4)), "SYS");
    }
}

TEST(TopologyLive, NvmlIsAskedOnlyWhenPresent) {
    zccl_topo_t *raw = nullptr;
    ASSERT_EQ(zccl_topo_create_live_ex(ZCCL_TOPO_NVML, &raw), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    Topo t(raw);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml) {
        // This machine has no NVIDIA driver: the model is built without NVML's data (hwloc's matrix at most).
        const char *src = zccl_topo_nvlink_source(t.get());
        EXPECT_TRUE(src == nullptr || std::string(src) == "hwloc NVLinkBandwidth") << src;
    } else {
        dlclose(nvml);
    }
    raw = nullptr;
    EXPECT_EQ(zccl_topo_create_live_ex(0x100, &raw), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(raw, nullptr);
}

#ifdef ZCCL_FAKE_NVML_PATH
// topo_nvml.c's logic against tests/fake_nvml/fake_nvml.c (no NVIDIA driver here): NVML's answer replaces the
// file's NVLinks, direct links listed by both GPUs count once, a GPU pair on NVSwitches shares the smaller switch link
// count, an IBM NPU link and inactive links are ignored. The fake's header lists its links.
TEST(TopologyNvml, FakeLibraryGivesLinkCounts) {
    Topo t = load_file(kOwnTopoDir + "/gpus-nics-only.xml");
    ASSERT_TRUE(t);
    auto g = [&](int i) { return zccl_topo_dev(t.get(), ZCCL_TOPO_DEV_GPU, i); };
    ASSERT_EQ(zccl_topo_nvlinks(t.get(), g(0), g(1)), 4); // the file's <nvlink> count
    ASSERT_EQ(zccl__topo_nvml_from(t.get(), "/nonexistent/libnvidia-ml.so.1"), ZCCL_SUCCESS);
    ASSERT_EQ(zccl__topo_finish(t.get()), ZCCL_SUCCESS);
    EXPECT_STREQ(zccl_topo_nvlink_source(t.get()), "NCCL <nvlink> elements"); // absent library: nothing changes
    EXPECT_EQ(zccl_topo_nvlinks(t.get(), g(0), g(1)), 4);
    ASSERT_EQ(zccl__topo_nvml_from(t.get(), ZCCL_FAKE_NVML_PATH), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    ASSERT_EQ(zccl__topo_finish(t.get()), ZCCL_SUCCESS);
    EXPECT_STREQ(zccl_topo_nvlink_source(t.get()), "NVML");
    EXPECT_EQ(zccl_topo_nvlinks(t.get(), g(0), g(1)), 3);
    EXPECT_EQ(zccl_topo_nvlinks(t.get(), g(1), g(0)), 3);
    EXPECT_EQ(zccl_topo_nvlinks(t.get(), g(2), g(3)), 6); // min(6 switch links, 7): GPU2's NPU link not counted
    EXPECT_EQ(zccl_topo_nvlinks(t.get(), g(0), g(2)), 0);
    EXPECT_EQ(smi(t.get(), g(2), g(3)), "NV6");
    EXPECT_EQ(smi(t.get(), g(0), g(2)), "NODE");
    EXPECT_EQ(zccl_topo_dev_count(t.get(), ZCCL_TOPO_DEV_GPU), 4); // finishing twice keeps the model's shape
    EXPECT_EQ(zccl_topo_dev_count(t.get(), ZCCL_TOPO_DEV_NIC), 3);
    EXPECT_EQ(zccl_topo_rdma_nic_count(t.get()), 2);
}
#endif

TEST(TopologyTool, PairingNoCoresAndSmiClasses) {
    if (tool_missing()) GTEST_SKIP() << "zccl-topo is not built (" << kTopoTool << ")";
    std::string out;
    ASSERT_EQ(run_tool("--nccl-xml " + kOwnTopoDir + "/gpus-nics-only.xml", &out), 0) << out;
    EXPECT_NE(out.find("rank placement on cores is not available from this file"), std::string::npos) << out;
    EXPECT_NE(out.find("  GPU0   X      NV4    NODE   NODE   PIX"), std::string::npos) << out;
    EXPECT_NE(out.find("GPU2   -> NIC0 0000:03:00.0, NIC2 0000:23:00.0"), std::string::npos) << out;
    ASSERT_EQ(run_tool("--json --nccl-xml " + kOwnTopoDir + "/gpus-nics-only.xml", &out), 0) << out;
    EXPECT_NE(out.find("\"ring\": null"), std::string::npos) << out;
    EXPECT_NE(out.find("\"ring_unavailable\""), std::string::npos);
    ASSERT_EQ(run_tool("--dot --nccl-xml " + kOwnTopoDir + "/gpus-nics-only.xml", &out), 0);
    EXPECT_EQ(out.rfind("digraph", 0), 0u);
    ASSERT_EQ(run_tool("--nccl-xml " + kOwnTopoDir + "/eth-only.xml", &out), 0);
    EXPECT_NE(out.find("no RDMA-capable NIC in this topology"), std::string::npos) << out;
    ASSERT_EQ(run_tool("--nccl-xml " + kOwnTopoDir + "/eth-nearer-than-ib.xml", &out), 0);
    EXPECT_NE(out.find("GPU0   -> NIC1 mlx5_0 (NODE; NCCL class PHB)"), std::string::npos) << out;
    EXPECT_NE(out.find("Ethernet only"), std::string::npos);
    ASSERT_EQ(run_tool("--xml " + kOwnTopoDir + "/hwloc-eth-nearer-than-roce.xml", &out), 0);
    EXPECT_NE(out.find("GPU0   -> NIC1 bnxt_re0"), std::string::npos) << out;
    std::string a100 = kTopoDir + "/nccl/topo_8A100_4CX6.xml";
    if (std::ifstream(a100).good()) {
        ASSERT_EQ(run_tool("--nccl-xml " + a100, &out), 0);
        EXPECT_NE(out.find("  GPU0   X      NV12   NV12"), std::string::npos) << out;
    }
}

// ---- ring order on hand-made localities ---------------------------------------------------------------------------

TEST(TopologyRing, OneRankAndTwoRanks) {
    std::vector<zccl_locality_t> one = {loc(0, 0, 0, 0)};
    EXPECT_EQ(ring(one), std::vector<int>{0});
    EXPECT_EQ(crossings(one, {0}).package, 0);
    std::vector<zccl_locality_t> two = {loc(0, 0, 0, 0), loc(0, 1, 1, 4)};
    EXPECT_EQ(crossings(two, ring(two)).package, 2);
    std::vector<int> order(1);
    EXPECT_EQ(zccl_topo_ring_order(one.data(), 0, order.data()), ZCCL_INVALID_ARGUMENT);
    EXPECT_EQ(zccl_topo_ring_order(nullptr, 1, order.data()), ZCCL_INVALID_ARGUMENT);
}

TEST(TopologyRing, NeighboursShareTheClosestLevel) {
    // 8 ranks, listed in an interleaved order, on 2 packages x 2 NUMA nodes x 2 cores.
    std::vector<zccl_locality_t> l;
    for (int r = 0; r < 8; r++) {
        int core = (r % 2) * 4 + (r / 2) % 4; // rank 0 -> core 0, rank 1 -> core 4, rank 2 -> core 1 ...
        l.push_back(loc(0, core / 4, core / 2, core));
    }
    std::vector<int> order = ring(l);
    zccl_ring_crossings_t c = crossings(l, order);
    EXPECT_EQ(c.package, 2);
    EXPECT_EQ(c.numa, 2); // one NUMA boundary inside each package
    EXPECT_EQ(c.core, 4);
    EXPECT_EQ(order, (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
    char text[64];
    zccl_topo_ring_format(order.data(), 8, text, sizeof text);
    EXPECT_STREQ(text, "0 2 4 6 1 3 5 7");
}

TEST(TopologyRing, MultiHostEntersAndLeavesNearTheNic) {
    // 3 hosts, each 8 ranks over 2 packages; the NIC is next to package 1 (PHB), package 0 is SYS away.
    std::vector<zccl_locality_t> l;
    for (int h = 0; h < 3; h++)
        for (int r = 0; r < 8; r++)
            l.push_back(loc(100 + h, r % 2, r % 2, r, r % 2 ? ZCCL_PATH_PHB : ZCCL_PATH_SYS));
    std::vector<int> order = ring(l);
    zccl_ring_crossings_t c = crossings(l, order);
    EXPECT_EQ(c.host, 3);
    EXPECT_EQ(c.package, 3 * 2); // entry and exit share package 1: one extra crossing per host
    for (size_t i = 0; i < order.size(); i++) {
        const zccl_locality_t &a = l[order[i]], &b = l[order[(i + 1) % order.size()]];
        if (a.host == b.host) continue;
        EXPECT_EQ(a.nic_path, ZCCL_PATH_PHB) << "host " << a.host << " is left through a rank far from the NIC";
        EXPECT_EQ(b.nic_path, ZCCL_PATH_PHB) << "host " << b.host << " is entered through a rank far from the NIC";
    }
    // Hosts are contiguous and in the order of their lowest rank.
    EXPECT_EQ(l[order[0]].host, 100u);
    EXPECT_EQ(l[order[8]].host, 101u);
    EXPECT_EQ(l[order[16]].host, 102u);
}

TEST(TopologyRing, MultiHostWithANicPerPackageCrossesOnce) {
    std::vector<zccl_locality_t> l;
    for (int h = 0; h < 4; h++)
        for (int r = 0; r < 8; r++) l.push_back(loc(7 * h + 3, r / 4, r / 4, r));
    zccl_ring_crossings_t c = crossings(l, ring(l));
    EXPECT_EQ(c.host, 4);
    EXPECT_EQ(c.package, 4); // enter in one package, leave from the other
}

TEST(TopologyRing, DeterministicAndIndependentOfHostHashValues) {
    std::mt19937 rng(1234);
    std::vector<zccl_locality_t> l;
    for (int r = 0; r < 64; r++) {
        int pkg = (int)(rng() % 2), numa = pkg * 2 + (int)(rng() % 2);
        l.push_back(loc(rng() % 3, pkg, numa, numa * 8 + (int)(rng() % 8), (int)(rng() % 2) + ZCCL_PATH_PHB));
    }
    std::vector<int> a = ring(l), b = ring(l);
    EXPECT_EQ(a, b);
}

TEST(TopologyRing, RandomPlacementsArePermutationsWithContiguousGroups) {
    std::mt19937 rng(42);
    for (int iter = 0; iter < 200; iter++) {
        int n = 1 + (int)(rng() % 48), hosts = 1 + (int)(rng() % 4);
        std::vector<zccl_locality_t> l;
        for (int r = 0; r < n; r++) {
            int pkg = (int)(rng() % 3) - 1; // -1: unbound
            int numa = pkg < 0 ? -1 : pkg * 2 + (int)(rng() % 2);
            int core = numa < 0 || rng() % 4 == 0 ? -1 : numa * 4 + (int)(rng() % 4);
            l.push_back(loc(rng() % hosts, pkg, numa, core, (int)(rng() % 3) + ZCCL_PATH_PHB));
        }
        std::vector<int> order = ring(l);
        ASSERT_EQ((int)order.size(), n);
        std::set<uint64_t> host_set;
        std::set<std::pair<uint64_t, int>> pkg_set;
        for (const zccl_locality_t &x : l) {
            host_set.insert(x.host);
            pkg_set.insert({x.host, x.package});
        }
        zccl_ring_crossings_t c = crossings(l, order);
        int h = (int)host_set.size();
        EXPECT_EQ(c.host, h > 1 ? h : 0) << "iteration " << iter;
        if (h == 1) {
            int p = (int)pkg_set.size();
            EXPECT_EQ(c.package, p > 1 ? p : 0) << "iteration " << iter;
        } else {
            // A host segment with p packages crosses p - 1 package boundaries, or p when entry and exit share one.
            EXPECT_LE(c.package, (int)pkg_set.size()) << "iteration " << iter;
        }
        std::vector<int> again = ring(l);
        EXPECT_EQ(order, again);
    }
}

} // namespace

#endif // __has_include("topo.h")

// zccl-zero-plan (tools/zccl-zero-plan.c) against numbers this test computes on its own: the parameter totals from
// ../shared/models/README.md's table, the ZeRO paper's per-rank memory formulas, the ring communication volumes,
// and the bucket layout rule of include/zccl_zero.h re-derived here from the TSV file. Skipped when ../shared is
// absent.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kModels = std::string(ZCCL_SHARED_DIR) + "/models";
const std::string kTool = std::string(ZCCL_TOOLS_DIR) + "/zccl-zero-plan";

struct ToolRun {
    int status = -1;
    std::string out;
};

ToolRun run_tool(const std::string &args) {
    ToolRun r;
    // The bucket settings would change the defaults; the test states every size it relies on.
    std::string cmd = "env -u ZCCL_BUCKET_FIRST_BYTES -u ZCCL_BUCKET_CAP_BYTES -u ZCCL_BUCKETS_IN_FLIGHT -u ZCCL_QUANT_BLOCK " + kTool + " " + args + " 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) r.out += buf;
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

// key=value pairs of the last line starting with "plan ".
std::map<std::string, std::string> plan_fields(const std::string &out) {
    std::map<std::string, std::string> f;
    std::istringstream in(out);
    std::string line, last;
    while (std::getline(in, line))
        if (line.rfind("plan ", 0) == 0) last = line;
    std::istringstream words(last);
    std::string w;
    while (words >> w) {
        size_t eq = w.find('=');
        if (eq != std::string::npos) f[w.substr(0, eq)] = w.substr(eq + 1);
    }
    return f;
}

// The README table row "| file | tensors | parameters |" with thousands separators.
bool readme_totals(const std::string &file, unsigned long long *tensors, unsigned long long *params) {
    std::ifstream in(kModels + "/README.md");
    std::string line;
    while (std::getline(in, line)) {
        if (line.find("| " + file + " |") != 0) continue;
        std::vector<std::string> cells;
        std::string cell;
        std::istringstream row(line);
        while (std::getline(row, cell, '|')) {
            std::string digits;
            for (char c : cell)
                if (c >= '0' && c <= '9') digits += c;
            cells.push_back(digits);
        }
        // cells: "", file (digits of its name), tensors, parameters
        if (cells.size() < 4) return false;
        *tensors = std::stoull(cells[2]);
        *params = std::stoull(cells[3]);
        return true;
    }
    return false;
}

std::vector<unsigned long long> tsv_numels(const std::string &file) {
    std::vector<unsigned long long> v;
    std::ifstream in(kModels + "/" + file);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#' || line.rfind("name\t", 0) == 0) continue;
        size_t t = line.rfind('\t');
        v.push_back(std::stoull(line.substr(t + 1)));
    }
    return v;
}

// The layout rule of zccl_bucket_plan_create (zccl_zero.h), re-derived: reverse definition order; a parameter
// starts at a multiple of align; the open bucket is closed when the parameter would end past the target
// (first_bytes for bucket 0, cap_bytes after), unless the bucket is empty; buckets padded to nranks*align.
std::vector<unsigned long long> expected_buckets(const std::vector<unsigned long long> &numel, unsigned long long es,
                                                 unsigned long long first, unsigned long long cap,
                                                 unsigned long long align, unsigned long long nranks) {
    std::vector<unsigned long long> elems;
    unsigned long long used = 0;
    int in_bucket = 0;
    for (size_t k = numel.size(); k-- > 0;) {
        unsigned long long target = (elems.empty() ? first : cap) / es;
        unsigned long long start = (used + align - 1) / align * align;
        if (in_bucket && start + numel[k] > target) {
            elems.push_back(used);
            used = 0;
            in_bucket = 0;
            start = 0;
        }
        used = start + numel[k];
        in_bucket++;
    }
    elems.push_back(used);
    unsigned long long gran = align * nranks;
    for (auto &e : elems) e = (e + gran - 1) / gran * gran;
    return elems;
}

unsigned long long ceil_div(unsigned long long a, unsigned long long b) { return (a + b - 1) / b; }

class PlanTool : public ::testing::Test {
  protected:
    void SetUp() override {
        std::ifstream probe(kModels + "/README.md");
        if (!probe) GTEST_SKIP() << "../shared/models is absent (" << kModels << "): zccl-zero-plan test skipped";
    }
};

TEST_F(PlanTool, MemoryBucketsAndVolumesMatchIndependentFormulas) {
    struct Case {
        const char *file;
        const char *dtype;
        unsigned long long B;
    };
    for (const char *file : {"gpt2-124m.tsv", "llama2-7b.tsv"}) {
        unsigned long long tensors = 0, psi = 0;
        ASSERT_TRUE(readme_totals(file, &tensors, &psi)) << "no row for " << file << " in README.md";
        std::vector<unsigned long long> numel = tsv_numels(file);
        unsigned long long sum = 0;
        for (auto n : numel) sum += n;
        ASSERT_EQ(numel.size(), tensors) << file;
        ASSERT_EQ(sum, psi) << file << ": the TSV lines do not add up to README.md's total";
        for (const char *opt : {"adam", "sgd"}) {
            for (auto dt : {Case{file, "bf16", 2}, Case{file, "fp32", 4}}) {
                // K: optimizer bytes per parameter (ZeRO paper: 12 for mixed-precision Adam).
                unsigned long long K = std::string(opt) == "adam" ? (dt.B == 2 ? 12 : 8) : (dt.B == 2 ? 8 : 4);
                for (unsigned long long N : {1ULL, 4ULL, 64ULL}) {
                    for (int S = 0; S <= 3; S++) {
                        const unsigned long long first = 1 << 20, cap = 25 << 20, align = 64 / dt.B;
                        std::string args = "--model " + kModels + "/" + file + " --ranks " + std::to_string(N) +
                                           " --stage " + std::to_string(S) + " --dtype " + dt.dtype +
                                           " --optimizer " + opt + " --first-bucket " + std::to_string(first) +
                                           " --bucket-cap " + std::to_string(cap);
                        SCOPED_TRACE(args);
                        ToolRun r = run_tool(args);
                        ASSERT_EQ(r.status, 0) << r.out;
                        auto f = plan_fields(r.out);
                        ASSERT_FALSE(f.empty()) << r.out;
                        EXPECT_EQ(std::stoull(f["psi"]), psi);
                        EXPECT_EQ(std::stoull(f["tensors"]), tensors);
                        unsigned long long p = ceil_div(dt.B * psi, S >= 3 ? N : 1);
                        unsigned long long g = ceil_div(dt.B * psi, S >= 2 ? N : 1);
                        unsigned long long o = ceil_div(K * psi, S >= 1 ? N : 1);
                        EXPECT_EQ(std::stoull(f["params_bytes"]), p);
                        EXPECT_EQ(std::stoull(f["grads_bytes"]), g);
                        EXPECT_EQ(std::stoull(f["optimizer_bytes"]), o);
                        EXPECT_EQ(std::stoull(f["total_bytes"]), p + g + o);
                        auto buckets = expected_buckets(numel, dt.B, first, cap, align, N);
                        unsigned long long padded = 0;
                        for (auto e : buckets) padded += e;
                        EXPECT_EQ(std::stoull(f["buckets"]), buckets.size());
                        EXPECT_EQ(std::stoull(f["bucket_bytes"]), padded * dt.B);
                        // Padded layout: the sharded quantities use padded/N elements.
                        EXPECT_EQ(std::stoull(f["layout_optimizer_bytes"]), K * (S >= 1 ? padded / N : padded));
                        // Ring volumes per rank: all-reduce 2(N-1)/N, reduce-scatter / all-gather (N-1)/N.
                        unsigned long long v = (N - 1) * dt.B * psi;
                        unsigned long long ar = ceil_div(2 * v, N), one = ceil_div(v, N);
                        unsigned long long want = S == 0 ? ar : S == 1 ? ar + one : S == 2 ? 2 * one : 3 * one;
                        EXPECT_EQ(std::stoull(f["comm_bytes"]), want);
                        EXPECT_EQ(std::stoull(f["paper_comm_bytes"]), S == 3 ? ceil_div(3 * v, N) : ar);
                    }
                }
            }
        }
    }
}

TEST_F(PlanTool, PaperExampleLlama7BOn64Ranks) {
    // The ZeRO paper's Figure 1 arithmetic for mixed-precision Adam: (2 + 2 + 12) psi / N at stage 3.
    ToolRun r = run_tool("--model " + kModels + "/llama2-7b.tsv --ranks 64 --stage 3");
    ASSERT_EQ(r.status, 0) << r.out;
    auto f = plan_fields(r.out);
    EXPECT_EQ(std::stoull(f["total_bytes"]), 16ULL * 6738415616ULL / 64);
    r = run_tool("--model " + kModels + "/llama2-7b.tsv --ranks 64 --stage 0");
    EXPECT_EQ(std::stoull(plan_fields(r.out)["total_bytes"]), 16ULL * 6738415616ULL);
}

TEST_F(PlanTool, DefaultBucketSizesAreOneAndTwentyFiveMiB) {
    ToolRun a = run_tool("--model " + kModels + "/gpt2-124m.tsv --ranks 4 --stage 0");
    ToolRun b = run_tool("--model " + kModels + "/gpt2-124m.tsv --ranks 4 --stage 0 --first-bucket 1M --bucket-cap 25M");
    ASSERT_EQ(a.status, 0) << a.out;
    EXPECT_EQ(plan_fields(a.out)["buckets"], plan_fields(b.out)["buckets"]);
    auto expect = expected_buckets(tsv_numels("gpt2-124m.tsv"), 2, 1 << 20, 25 << 20, 32, 4);
    EXPECT_EQ(std::stoull(plan_fields(a.out)["buckets"]), expect.size());
}

TEST_F(PlanTool, BadArgumentsNameTheirCause) {
    const std::string gpt2 = "--model " + kModels + "/gpt2-124m.tsv";
    struct Bad {
        std::string args;
        int status;
        const char *says;
    };
    for (const Bad &b : {Bad{"--model /nonexistent/model.tsv --ranks 4 --stage 1", 1, "/nonexistent/model.tsv"},
                         Bad{gpt2 + " --ranks 4 --stage 4", 2, "--stage '4'"},
                         Bad{gpt2 + " --ranks 0 --stage 1", 2, "--ranks '0'"},
                         Bad{gpt2 + " --ranks -3 --stage 1", 2, "--ranks '-3'"},
                         Bad{gpt2 + " --stage 1", 2, "--ranks N is required"},
                         Bad{"--ranks 2 --stage 1", 2, "--model FILE is required"},
                         Bad{gpt2 + " --ranks 2 --stage 1 --dtype int8", 2, "--dtype 'int8'"},
                         Bad{gpt2 + " --ranks 2 --stage 1 --optimizer lamb", 2, "--optimizer 'lamb'"},
                         Bad{gpt2 + " --ranks 2 --stage 1 --bucket-cap 0", 2, "--bucket-cap '0'"}}) {
        ToolRun r = run_tool(b.args);
        EXPECT_EQ(r.status, b.status) << b.args << "\n" << r.out;
        EXPECT_NE(r.out.find(b.says), std::string::npos) << b.args << "\n" << r.out;
    }
}

TEST_F(PlanTool, MalformedModelFileNamesTheLine) {
    std::string path = ::testing::TempDir() + "zero_plan_bad.tsv";
    {
        std::ofstream out(path);
        out << "# bad\n# parameters: 2 tensors, 30 elements\nname\tshape\tnumel\na\t2x5\t10\nb\t4x5\t21\n";
    }
    ToolRun r = run_tool("--model " + path + " --ranks 2 --stage 0");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("line 5 (b): shape '4x5' does not multiply to numel 21"), std::string::npos) << r.out;
    std::remove(path.c_str());
}

// --offload cpu: GPU and host bytes per rank for a model small enough to lay out by hand (no ../shared needed).
// Model: a 10x10 (100), b 30, c 6, bf16 (B = 2), 2 ranks, first bucket 64 bytes (32 elements), cap 128 bytes (64),
// align 4. Reverse order: c -> bucket 0 [0,6); b would end at 8+30 = 38 > 32 -> bucket 1 [0,30); a would end at
// 32+100 > 64 -> bucket 2 [0,100). Padded to multiples of 8: 8, 32, 104 = 144 elements; shard per rank 72.
// Host: state 12 x 72 = 864 (fp32 master, momentum, variance), staging 2 x 2 x 72 = 288 (gradient shard,
// parameter shard). GPU: parameters 2 x 144 = 288 plus the scheduler's gradient buffers: stage 2 (K = 2
// full-size buffers of the largest bucket 2 x 104 x 2 = 416, shard accumulators 2 x 72 = 144) = 848; stage 1
// (all-reduce buffers of every bucket, 288) = 576.
TEST(PlanToolOffload, SmallModelByHand) {
    std::string path = ::testing::TempDir() + "zero_plan_offload.tsv";
    {
        std::ofstream out(path);
        out << "# tiny\nname\tshape\tnumel\na\t10x10\t100\nb\t30\t30\nc\t2x3\t6\n";
    }
    const std::string base = "--model " + path + " --ranks 2 --dtype bf16 --first-bucket 64 --bucket-cap 128 "
                              "--align 4 --offload cpu";
    struct Case {
        int stage;
        bool pin;
        unsigned long long gpu;
    };
    for (const Case &c : {Case{2, true, 848}, Case{2, false, 848}, Case{1, true, 576}}) {
        std::string args = base + " --stage " + std::to_string(c.stage) + (c.pin ? " --pin-memory" : "");
        SCOPED_TRACE(args);
        ToolRun r = run_tool(args);
        ASSERT_EQ(r.status, 0) << r.out;
        auto f = plan_fields(r.out);
        EXPECT_EQ(f["offload"], "cpu") << r.out;
        EXPECT_EQ(f["buckets"], "3") << r.out;
        EXPECT_EQ(f["host_state_bytes"], "864") << r.out;
        EXPECT_EQ(f["host_staging_bytes"], "288") << r.out;
        EXPECT_EQ(f["host_bytes"], "1152") << r.out;
        EXPECT_EQ(f["pinned_host_bytes"], c.pin ? "1152" : "0") << r.out;
        EXPECT_EQ(f["pin_memory"], c.pin ? "1" : "0") << r.out;
        EXPECT_EQ(std::stoull(f["gpu_bytes"]), c.gpu) << r.out;
        EXPECT_NE(r.out.find(c.pin ? "pinned (page-locked)" : "pageable"), std::string::npos) << r.out;
    }
    // Without --offload the line carries no offload fields (unchanged output).
    ToolRun r = run_tool("--model " + path + " --ranks 2 --stage 2");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(plan_fields(r.out).count("offload"), 0u) << r.out;
    // Refusals name their cause.
    for (auto &bad : std::vector<std::pair<std::string, std::string>>{
             {"--model " + path + " --ranks 2 --stage 3 --offload cpu", "--offload cpu needs --stage 1 or 2"},
             {"--model " + path + " --ranks 2 --stage 2 --offload cpu --optimizer sgd", "needs --optimizer adam"},
             {"--model " + path + " --ranks 2 --stage 2 --pin-memory", "--pin-memory needs --offload cpu"},
             {"--model " + path + " --ranks 2 --stage 2 --offload nvme", "--offload 'nvme'"}}) {
        ToolRun b = run_tool(bad.first);
        EXPECT_EQ(b.status, 2) << bad.first << "\n" << b.out;
        EXPECT_NE(b.out.find(bad.second), std::string::npos) << bad.first << "\n" << b.out;
    }
    std::remove(path.c_str());
}

// GPT-2 124M from examples/models (in the repository): host state is 12 bytes per element of the rank's padded
// shard and staging 2 x B per element, the shard re-derived here from the layout rule.
TEST(PlanToolOffload, Gpt2FromExamplesModels) {
    // ZCCL_SHARED_DIR is "<source>/../shared" (tests/CMakeLists.txt): the source tree is its prefix.
    std::string src = ZCCL_SHARED_DIR;
    src = src.substr(0, src.rfind("/../shared"));
    const std::string file = src + "/examples/models/gpt2-124m.tsv";
    std::vector<unsigned long long> numel;
    {
        std::ifstream in(file);
        ASSERT_TRUE(in.good()) << file;
        std::string line;
        while (std::getline(in, line)) {
            if (line.empty() || line[0] == '#' || line.rfind("name\t", 0) == 0) continue;
            numel.push_back(std::stoull(line.substr(line.rfind('\t') + 1)));
        }
    }
    for (unsigned long long N : {4ULL, 16ULL}) {
        auto buckets = expected_buckets(numel, 2, 1 << 20, 25 << 20, 32, N);
        unsigned long long padded = 0, largest = 0;
        for (auto e : buckets) padded += e, largest = std::max(largest, e);
        const unsigned long long shard = padded / N;
        ToolRun r = run_tool("--model " + file + " --ranks " + std::to_string(N) +
                             " --stage 2 --first-bucket 1M --bucket-cap 25M --offload cpu --pin-memory");
        ASSERT_EQ(r.status, 0) << r.out;
        auto f = plan_fields(r.out);
        EXPECT_EQ(std::stoull(f["host_state_bytes"]), 12 * shard);
        EXPECT_EQ(std::stoull(f["host_staging_bytes"]), 2 * 2 * shard);
        EXPECT_EQ(std::stoull(f["pinned_host_bytes"]), 12 * shard + 4 * shard);
        EXPECT_EQ(std::stoull(f["gpu_bytes"]), 2 * padded + 2 * largest * 2 + 2 * shard);
        // The optimizer state left the GPU: without offload the table's layout optimizer bytes are the same 12/elem.
        EXPECT_EQ(std::stoull(f["layout_optimizer_bytes"]), 12 * shard);
    }
}

// --tp T --pp P (3D parallelism), on a model small enough to work out by hand (no ../shared needed).
// Model, definition order: a 16x4 (64), b 10 (1-D), c 7x2 (14), d 30 (1-D), e 3x4 (12); psi = 130, 5 tensors.
// Pipeline, P = 2: stage 0 ends at the first tensor whose running sum S reaches psi/2 = 65 (2 S >= 130):
//   S = 64 (a), 74 (b) -> stage 0 = a, b (74 elements), stage 1 = c, d, e (56).
// Tensor parallel, T = 2, every 2+-D tensor split along its first dimension, rounded up; 1-D replicated:
//   a 16/2 = 8 rows x 4 = 32; b 10; c ceil(7/2) = 4 rows x 2 = 8 (2 x 8 - 14 = 2 padding over the 2 TP ranks);
//   d 30; e ceil(3/2) = 2 rows x 4 = 8 (padding 2 x 8 - 12 = 4). tp_padding = 6, 3 split tensors.
//   Per TP rank: stage 0 32 + 10 = 42, stage 1 8 + 30 + 8 = 46 -> the most loaded is stage 1 (although stage 0
//   holds more of the full model): local_psi = 46, 3 tensors c, d, e; world = 2 x 2 x 2 = 8.
// ZeRO stage 2 on N = 2, bf16 (B = 2), mixed-precision Adam (K = 12): params 2 x 46 = 92, grads 2 x 46 / 2 = 46,
//   optimizer 12 x 46 / 2 = 276, total 414. Stage 3: params 46, grads 46, optimizer 276, total 368.
// Buckets of the local list (first 16 bytes = 8 elements, cap 64 bytes = 32, align 4, padded to 2 x 4 = 8):
//   reverse order e (8) -> bucket 0 [0,8); d would end at 8 + 30 > 8 -> bucket 1 [0,30); c would start at 32 and
//   end at 40 > 32 -> bucket 2 [0,8). Padded 8, 32, 8 = 48 elements (96 bytes), shard 24: layout params 96
//   (stage 2; 48 at stage 3), grads 48, optimizer 12 x 24 = 288.
// Traffic per rank, ring on local_psi: (N-1) B psi = 92; stage 2 reduce-scatter 46 + all-gather 46 = 92;
//   stage 3 46 + 2 x 46 = 138 (paper 3 x 92 / 2 = 138).
class PlanTool3D : public ::testing::Test {
  protected:
    void SetUp() override {
        path_ = ::testing::TempDir() + "zero_plan_3d.tsv";
        std::ofstream out(path_);
        out << "# 3d by hand\nname\tshape\tnumel\na\t16x4\t64\nb\t10\t10\nc\t7x2\t14\nd\t30\t30\ne\t3x4\t12\n";
    }
    void TearDown() override { std::remove(path_.c_str()); }
    std::string base() const {
        return "--model " + path_ + " --ranks 2 --dtype bf16 --first-bucket 16 --bucket-cap 64 --align 4";
    }
    std::string path_;
};

TEST_F(PlanTool3D, HandComputedTp2Pp2) {
    struct Case {
        int stage;
        const char *params, *layout_params, *total, *comm, *paper;
    };
    for (const Case &c : {Case{2, "92", "96", "414", "92", "92"}, Case{3, "46", "48", "368", "138", "138"}}) {
        std::string args = base() + " --tp 2 --pp 2 --stage " + std::to_string(c.stage);
        SCOPED_TRACE(args);
        ToolRun r = run_tool(args);
        ASSERT_EQ(r.status, 0) << r.out;
        auto f = plan_fields(r.out);
        // The existing fields keep the model's totals in tensors= and psi=; the formulas run on local_psi.
        EXPECT_EQ(f["tensors"], "5") << r.out;
        EXPECT_EQ(f["psi"], "130") << r.out;
        EXPECT_EQ(f["ranks"], "2") << r.out;
        EXPECT_EQ(f["tp"], "2") << r.out;
        EXPECT_EQ(f["pp"], "2") << r.out;
        EXPECT_EQ(f["world"], "8") << r.out;
        EXPECT_EQ(f["local_psi"], "46") << r.out;
        EXPECT_EQ(f["local_tensors"], "3") << r.out;
        EXPECT_EQ(f["pp_stage"], "1") << r.out;
        EXPECT_EQ(f["pp_psi"], "74,56") << r.out;
        EXPECT_EQ(f["pp_local_psi"], "42,46") << r.out;
        EXPECT_EQ(f["tp_split_tensors"], "3") << r.out;
        EXPECT_EQ(f["tp_padding"], "6") << r.out;
        EXPECT_EQ(f["params_bytes"], c.params) << r.out;
        EXPECT_EQ(f["grads_bytes"], "46") << r.out;
        EXPECT_EQ(f["optimizer_bytes"], "276") << r.out;
        EXPECT_EQ(f["total_bytes"], c.total) << r.out;
        EXPECT_EQ(f["buckets"], "3") << r.out;
        EXPECT_EQ(f["bucket_bytes"], "96") << r.out;
        EXPECT_EQ(f["layout_params_bytes"], c.layout_params) << r.out;
        EXPECT_EQ(f["layout_grads_bytes"], "48") << r.out;
        EXPECT_EQ(f["layout_optimizer_bytes"], "288") << r.out;
        EXPECT_EQ(f["comm_bytes"], c.comm) << r.out;
        EXPECT_EQ(f["paper_comm_bytes"], c.paper) << r.out;
        EXPECT_NE(r.out.find("world 8 = 2 data-parallel (ZeRO) x 2 tensor-parallel x 2 pipeline-parallel"),
                  std::string::npos) << r.out;
        EXPECT_NE(r.out.find("pipeline stages, parameters (per TP rank): 74 (42) 56 (46)"), std::string::npos)
            << r.out;
        EXPECT_NE(r.out.find("most loaded: stage 1, tensors 2..4 (c .. e)"), std::string::npos) << r.out;
    }
    // The buckets hold only the local tensors (e, d, c of stage 1).
    ToolRun r = run_tool(base() + " --tp 2 --pp 2 --stage 2 --list-buckets");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("bucket 0: 8 elements (8 used, shard 4), 1 parameters: e"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("bucket 2: 8 elements (8 used, shard 4), 1 parameters: c"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("parameters: a"), std::string::npos) << r.out;
    // One degree at a time. T = 2, P = 1: 32 + 10 + 8 + 30 + 8 = 88. T = 1, P = 2: stage 0 (74) is the most loaded.
    // P = 5 = the tensor count: thresholds 26, 52, 78, 104 fall in a, b, c, d -> one tensor each; per TP rank (T = 2)
    // 32, 10, 8, 30, 8 -> stage 0.
    struct One {
        std::string opts;
        const char *local_psi, *pp_stage, *pp_psi, *pp_local_psi, *world;
    };
    for (const One &o : {One{"--tp 2", "88", "0", "130", "88", "4"}, One{"--pp 2", "74", "0", "74,56", "74,56", "4"},
                         One{"--tp 2 --pp 5", "32", "0", "64,10,14,30,12", "32,10,8,30,8", "20"}}) {
        ToolRun q = run_tool(base() + " --stage 1 " + o.opts);
        ASSERT_EQ(q.status, 0) << o.opts << "\n" << q.out;
        auto f = plan_fields(q.out);
        EXPECT_EQ(f["local_psi"], o.local_psi) << o.opts << "\n" << q.out;
        EXPECT_EQ(f["pp_stage"], o.pp_stage) << o.opts << "\n" << q.out;
        EXPECT_EQ(f["pp_psi"], o.pp_psi) << o.opts << "\n" << q.out;
        EXPECT_EQ(f["pp_local_psi"], o.pp_local_psi) << o.opts << "\n" << q.out;
        EXPECT_EQ(f["world"], o.world) << o.opts << "\n" << q.out;
        // Stage 1 on N = 2: optimizer 12 local_psi / 2.
        EXPECT_EQ(std::stoull(f["optimizer_bytes"]), 6 * std::stoull(o.local_psi)) << o.opts << "\n" << q.out;
    }
}

// Every stage keeps at least one tensor: sizes 1, 1, 100 and P = 3 put both thresholds (34, 68) in the last tensor;
// stage 0 is cut at tensor n - P + 0 = 0 and stage 1 at 1.
TEST_F(PlanTool3D, EveryStageGetsATensor) {
    std::string path = ::testing::TempDir() + "zero_plan_3d_skew.tsv";
    {
        std::ofstream out(path);
        out << "x\t1\t1\ny\t1\t1\nz\t10x10\t100\n";
    }
    ToolRun r = run_tool("--model " + path + " --ranks 1 --stage 0 --pp 3");
    ASSERT_EQ(r.status, 0) << r.out;
    auto f = plan_fields(r.out);
    EXPECT_EQ(f["pp_psi"], "1,1,100") << r.out;
    EXPECT_EQ(f["pp_stage"], "2") << r.out;
    EXPECT_EQ(f["local_psi"], "100") << r.out;
    EXPECT_EQ(f["params_bytes"], "200") << r.out;
    std::remove(path.c_str());
}

// T = P = 1 is the tool without these options: the same bytes, no new fields, and the numbers of the tool before
// --tp/--pp existed (GPT-2 small's plan line below was printed by that binary, commit c5bc75f).
TEST_F(PlanTool3D, OneByOneIsTheOldOutput) {
    ToolRun plain = run_tool(base() + " --stage 2"), ones = run_tool(base() + " --stage 2 --tp 1 --pp 1");
    ASSERT_EQ(plain.status, 0) << plain.out;
    EXPECT_EQ(plain.out, ones.out);
    auto f = plan_fields(plain.out);
    EXPECT_EQ(f.count("tp") + f.count("pp") + f.count("world") + f.count("local_psi"), 0u) << plain.out;
    EXPECT_EQ(plain.out.find("parallel   world"), std::string::npos) << plain.out;
    // psi = 130 on 2 ranks, stage 2: 2 x 130, 2 x 130 / 2, 12 x 130 / 2.
    EXPECT_EQ(f["params_bytes"], "260");
    EXPECT_EQ(f["grads_bytes"], "130");
    EXPECT_EQ(f["optimizer_bytes"], "780");
    std::string src = ZCCL_SHARED_DIR;
    src = src.substr(0, src.rfind("/../shared"));
    const std::string gpt2 = "--model " + src + "/examples/models/gpt2-124m.tsv --ranks 4 --stage 2 "
                             "--first-bucket 1M --bucket-cap 25M";
    const std::string old_line =
        "plan tensors=148 psi=124439808 ranks=4 stage=2 dtype=bf16 optimizer=adam B=2 K=12 params_bytes=248879616 "
        "grads_bytes=62219904 optimizer_bytes=373319424 total_bytes=684418944 layout_params_bytes=248879616 "
        "layout_grads_bytes=62219904 layout_optimizer_bytes=373319424 buckets=10 bucket_bytes=248879616 "
        "comm_bytes=373319424 paper_comm_bytes=373319424\n";
    for (const char *extra : {"", " --tp 1", " --pp 1 --tp 1"}) {
        ToolRun r = run_tool(gpt2 + extra);
        ASSERT_EQ(r.status, 0) << r.out;
        ASSERT_GE(r.out.size(), old_line.size());
        EXPECT_EQ(r.out.substr(r.out.size() - old_line.size()), old_line) << extra << "\n" << r.out;
    }
}

TEST_F(PlanTool3D, BadValuesNameTheOptionAndValue) {
    struct Bad {
        std::string opts;
        const char *says;
    };
    for (const Bad &b : {Bad{"--tp 0", "--tp '0': need an integer in [1, 65536]"},
                         Bad{"--pp -1", "--pp '-1': need an integer in [1, 65536]"},
                         Bad{"--tp two", "--tp 'two'"}, Bad{"--pp 2.5", "--pp '2.5'"},
                         Bad{"--tp 65537", "--tp '65537'"}, Bad{"--pp", "option '--pp' needs a value"},
                         Bad{"--pp 6", "--pp '6': more pipeline stages than the 5 tensors"}}) {
        ToolRun r = run_tool(base() + " --stage 2 " + b.opts);
        EXPECT_EQ(r.status, 2) << b.opts << "\n" << r.out;
        EXPECT_NE(r.out.find(b.says), std::string::npos) << b.opts << "\n" << r.out;
    }
}

// GPT-2 small from examples/models against the rule re-derived here from the TSV's shapes: stages, per-TP-rank
// counts (wte's 50257 rows are odd: ceil(50257/2) = 25129 rows per TP rank at T = 2) and the stage-2 bytes.
TEST(PlanTool3DGpt2, StagesAndShardsMatchTheRule) {
    std::string src = ZCCL_SHARED_DIR;
    src = src.substr(0, src.rfind("/../shared"));
    const std::string file = src + "/examples/models/gpt2-124m.tsv";
    std::vector<unsigned long long> numel, rows;
    {
        std::ifstream in(file);
        ASSERT_TRUE(in.good()) << file;
        std::string line;
        while (std::getline(in, line)) {
            if (line.empty() || line[0] == '#' || line.rfind("name\t", 0) == 0) continue;
            size_t t1 = line.find('\t'), t2 = line.rfind('\t');
            std::string shape = line.substr(t1 + 1, t2 - t1 - 1);
            numel.push_back(std::stoull(line.substr(t2 + 1)));
            rows.push_back(shape.find('x') == std::string::npos ? 0 : std::stoull(shape));
        }
    }
    unsigned long long psi = 0;
    for (auto n : numel) psi += n;
    for (auto tp : std::vector<std::pair<unsigned long long, unsigned long long>>{{2, 2}, {4, 1}, {1, 4}, {2, 3}}) {
        const unsigned long long T = tp.first, P = tp.second, n = numel.size();
        std::vector<unsigned long long> local(n), spsi, slocal;
        for (size_t i = 0; i < n; i++) local[i] = rows[i] ? ceil_div(rows[i], T) * (numel[i] / rows[i]) : numel[i];
        // Stage k < P-1 takes tensors until its running sum S reaches (k+1) psi / P or only P-1-k tensors are left.
        size_t i = 0;
        unsigned long long run = 0;
        for (unsigned long long k = 0; k < P; k++) {
            unsigned long long a = 0, b = 0;
            do {
                run += numel[i], a += numel[i], b += local[i];
                i++;
            } while (k + 1 == P ? i < n : (n - i > P - 1 - k && run * P < (k + 1) * psi));
            spsi.push_back(a);
            slocal.push_back(b);
        }
        size_t best = std::max_element(slocal.begin(), slocal.end()) - slocal.begin();
        std::string want_psi, want_local;
        for (unsigned long long k = 0; k < P; k++) {
            want_psi += (k ? "," : "") + std::to_string(spsi[k]);
            want_local += (k ? "," : "") + std::to_string(slocal[k]);
        }
        std::string args = "--model " + file + " --ranks 4 --stage 2 --tp " + std::to_string(T) + " --pp " +
                           std::to_string(P);
        SCOPED_TRACE(args);
        ToolRun r = run_tool(args);
        ASSERT_EQ(r.status, 0) << r.out;
        auto f = plan_fields(r.out);
        EXPECT_EQ(f["pp_psi"], want_psi);
        EXPECT_EQ(f["pp_local_psi"], want_local);
        EXPECT_EQ(std::stoull(f["pp_stage"]), best);
        EXPECT_EQ(std::stoull(f["local_psi"]), slocal[best]);
        EXPECT_EQ(std::stoull(f["world"]), 4 * T * P);
        EXPECT_EQ(std::stoull(f["params_bytes"]), 2 * slocal[best]);
        EXPECT_EQ(std::stoull(f["grads_bytes"]), ceil_div(2 * slocal[best], 4));
        EXPECT_EQ(std::stoull(f["optimizer_bytes"]), ceil_div(12 * slocal[best], 4));
        EXPECT_EQ(std::stoull(f["comm_bytes"]), 2 * ceil_div(3 * 2 * slocal[best], 4));
        if (T == 2) EXPECT_EQ(f["tp_padding"], "768");  // wte: 2 x 25129 x 768 - 50257 x 768
    }
}

}  // namespace

// --hosts: the bytes that leave each host per step, full precision and with ZeRO++'s options, against numbers
// computed here. Model: a (1000, 1-D) and b (10x30); 4 ranks on 2 hosts, bf16, one bucket (first bucket 1 MiB),
// alignment 1: the bucket holds b then a, 1300 elements, shard 325. Wire size of a shard of n elements (zccl.h,
// zccl_wire_t; B = 128): 16 + 4 ceil(n/128) + n (int8) or ceil(n/2) (int4), rounded up to 8:
//   int4(325) = 16 + 12 + 163 = 191 -> 192;  int8(325) = 16 + 12 + 325 = 353 -> 360
//   int8(250) = 16 + 8 + 250 = 274 -> 280;   int8(75) = 16 + 4 + 75 = 95 -> 96
// Gradients: full 2 x 1300 = 2600 bytes, int4 4 x 192 = 768, int8 4 x 360 = 1440. Stage-3 weights gathered per
// tensor (shards 250 and 75): full 2 x 4 x 325 = 2600, int8 4 x (280 + 96) = 1504. Half of each leaves a host.
TEST(PlanToolHosts, CrossHostBytesPerZeroPlusPlusOption) {
    std::string path = ::testing::TempDir() + "zero_plan_hosts.tsv";
    {
        std::ofstream out(path);
        out << "# two tensors\nname\tshape\tnumel\na\t1000\t1000\nb\t10x30\t300\n";
    }
    const std::string base = "--model " + path + " --ranks 4 --hosts 2 --dtype bf16 --first-bucket 1M --align 1";
    auto total_of = [](const std::string &out, const std::string &row) -> long long {
        std::istringstream in(out);
        std::string line;
        while (std::getline(in, line))
            if (line.rfind("  " + row, 0) == 0) {
                std::istringstream w(line.substr(2 + row.size()));
                long long g, f, b, t;
                if (w >> g >> f >> b >> t) return t;
            }
        return -1;
    };
    ToolRun r = run_tool(base + " --stage 3");
    ASSERT_EQ(r.status, 0) << r.out;
    auto f = plan_fields(r.out);
    EXPECT_EQ(f["hosts"], "2");
    EXPECT_EQ(f["cross_host_full_bytes"], "3900") << r.out;        // (2600 + 2600 + 2600) / 2
    EXPECT_EQ(total_of(r.out, "qwZ (weights int8)"), 2804) << r.out; // (2600 + 1504 + 1504) / 2
    EXPECT_EQ(total_of(r.out, "qwZ + hpZ "), 2052) << r.out;         // (2600 + 1504) / 2
    EXPECT_EQ(f["cross_host_zeropp_bytes"], "1136") << r.out;      // (768 + 1504) / 2
    EXPECT_NE(r.out.find("1300 more parameter bytes per rank"), std::string::npos) << r.out; // hpZ: 2 x 1300 / G = 2
    r = run_tool(base + " --stage 2 --wire int8");
    ASSERT_EQ(r.status, 0) << r.out;
    f = plan_fields(r.out);
    EXPECT_EQ(f["cross_host_full_bytes"], "2600") << r.out;   // (2600 + 2600) / 2
    EXPECT_EQ(f["cross_host_zeropp_bytes"], "2020") << r.out; // (1440 + 2600) / 2
    r = run_tool(base + " --stage 0");
    ASSERT_EQ(r.status, 0) << r.out;
    f = plan_fields(r.out);
    EXPECT_EQ(f["cross_host_full_bytes"], "2600") << r.out;  // 2 x 2600 / 2
    EXPECT_EQ(f["cross_host_zeropp_bytes"], "768") << r.out; // 2 x 768 / 2
    // Without --hosts the output is unchanged (no such fields); refusals name their cause.
    r = run_tool("--model " + path + " --ranks 4 --stage 3");
    EXPECT_EQ(plan_fields(r.out).count("hosts"), 0u) << r.out;
    for (auto &bad : std::vector<std::pair<std::string, std::string>>{
             {"--model " + path + " --ranks 4 --stage 3 --wire int8", "need --hosts"},
             {"--model " + path + " --ranks 4 --stage 3 --hosts 3", "--hosts 3 does not divide --ranks 4"},
             {"--model " + path + " --ranks 4 --stage 3 --hosts 2 --wire int2", "--wire 'int2'"},
             {"--model " + path + " --ranks 4 --stage 3 --hosts 2 --weight-wire full", "--weight-wire 'full'"}}) {
        ToolRun b = run_tool(bad.first);
        EXPECT_EQ(b.status, 2) << bad.first << "\n" << b.out;
        EXPECT_NE(b.out.find(bad.second), std::string::npos) << bad.first << "\n" << b.out;
    }
    std::remove(path.c_str());
}

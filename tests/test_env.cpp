// test_env.cpp — what the library reads from the environment besides its own ZCCL_* settings: NCCL's names for
// the settings that have one (the settings table, column .nccl), the report of unknown ZCCL_* and ignored NCCL_* names
// (zccl_config_check), and Slurm's job variables in zccl_comm_init_env.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "api.h"
#include "core.h"
#include "comm.h"
int zccl__slurm_first_host(const char *list, char *out, size_t len);
}
#include "harness/harness.h"
#include "zccl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

// Sets a variable for one scope and puts back what was there before.
struct Env {
    std::string name;
    bool had;
    std::string old;
    Env(const char *n, const char *v) : name(n) {
        const char *o = getenv(n);
        had = o != nullptr;
        if (had) old = o;
        if (v) setenv(n, v, 1);
        else unsetenv(n);
    }
    ~Env() {
        if (had) setenv(name.c_str(), old.c_str(), 1);
        else unsetenv(name.c_str());
    }
};

std::string check_text(int *ninvalid) {
    std::string t(zccl_config_check(nullptr, 0, ninvalid) + 1, '\0');
    t.resize(zccl_config_check(&t[0], t.size(), nullptr));
    return t;
}

std::string describe() {
    std::string t(zccl_config_describe(nullptr, 0) + 1, '\0');
    t.resize(zccl_config_describe(&t[0], t.size()));
    return t;
}

zccl_cfg_id_t id_of(const char *name) {
    zccl_cfg_id_t id = zccl__cfg_find(name, 0);
    if (!id) ADD_FAILURE() << name << " is not in the settings table";
    return id;
}

// The NCCL names zccl honours, written out here independently of the settings table (docs/configuration.md's list).
const std::map<std::string, std::string> kNcclNames = {
    {"NCCL_DEBUG", "ZCCL_DEBUG"},
    {"NCCL_DEBUG_SUBSYS", "ZCCL_DEBUG_SUBSYS"},
    {"NCCL_SOCKET_IFNAME", "ZCCL_SOCKET_IFNAME"},
    {"NCCL_TOPO_FILE", "ZCCL_TOPO_FILE"},
    {"NCCL_IB_DISABLE", "ZCCL_IB_DISABLE"},
    {"NCCL_IB_HCA", "ZCCL_IB_HCA"},
    {"NCCL_IB_GID_INDEX", "ZCCL_IB_GID_INDEX"},
    {"NCCL_IB_TIMEOUT", "ZCCL_IB_TIMEOUT"},
    {"NCCL_IB_RETRY_CNT", "ZCCL_IB_RETRY_CNT"},
    {"NCCL_IB_QPS_PER_CONNECTION", "ZCCL_IB_QPS_PER_CONN"},
    {"NCCL_NET_GDR_LEVEL", "ZCCL_NET_GDR_LEVEL"},
    {"NCCL_NET_GDR_READ", "ZCCL_NET_GDR_READ"},
    {"NCCL_DMABUF_ENABLE", "ZCCL_DMABUF_ENABLE"},
    {"NCCL_GDR_FLUSH_DISABLE", "ZCCL_GDR_FLUSH_DISABLE"},
    {"NCCL_NSOCKS_PERTHREAD", "ZCCL_NSOCKS_PERTHREAD"},
    {"NCCL_MIN_NCHANNELS", "ZCCL_MIN_NCHANNELS"},
    {"NCCL_MAX_NCHANNELS", "ZCCL_MAX_NCHANNELS"},
};

}  // namespace

TEST(EnvNccl, TableHasExactlyTheDocumentedNames) {
    std::map<std::string, std::string> got;
    for (size_t i = 0; i < zccl__cfg_count(); i++)
        if (zccl__cfg_at(i)->nccl) got[zccl__cfg_at(i)->nccl] = zccl__cfg_at(i)->name;
    EXPECT_EQ(got, kNcclNames);
}

TEST(EnvNccl, NcclNameIsReadWhenTheZcclNameIsUnset) {
    for (const auto &kv : kNcclNames) {
        Env z(kv.second.c_str(), nullptr), n(kv.first.c_str(), nullptr);
        const zccl_cfg_id_t id = id_of(kv.second.c_str());
        EXPECT_EQ(zccl__cfg_source(id), nullptr) << kv.first;
    }
    {
        Env z("ZCCL_IB_TIMEOUT", nullptr), n("NCCL_IB_TIMEOUT", "22");
        int64_t v = 0;
        ASSERT_EQ(zccl__cfg_int(ZCCL_CFG_IB_TIMEOUT, &v), ZCCL_SUCCESS);
        EXPECT_EQ(v, 22);
        EXPECT_STREQ(zccl__cfg_source(ZCCL_CFG_IB_TIMEOUT), "NCCL_IB_TIMEOUT");
        EXPECT_NE(describe().find("ZCCL_IB_TIMEOUT=22 (from NCCL_IB_TIMEOUT)"), std::string::npos) << describe();
        int bad = -1;
        std::string t = check_text(&bad);
        EXPECT_EQ(bad, 0) << t;
        EXPECT_NE(t.find("nccl: NCCL_IB_TIMEOUT=22 is read as ZCCL_IB_TIMEOUT"), std::string::npos) << t;
    }
    {   // the ZCCL_* name wins
        Env z("ZCCL_IB_TIMEOUT", "9"), n("NCCL_IB_TIMEOUT", "22");
        int64_t v = 0;
        ASSERT_EQ(zccl__cfg_int(ZCCL_CFG_IB_TIMEOUT, &v), ZCCL_SUCCESS);
        EXPECT_EQ(v, 9);
        EXPECT_STREQ(zccl__cfg_source(ZCCL_CFG_IB_TIMEOUT), "ZCCL_IB_TIMEOUT");
    }
    {   // a bad NCCL value is an error that names the NCCL variable
        Env z("ZCCL_IB_QPS_PER_CONN", nullptr), n("NCCL_IB_QPS_PER_CONNECTION", "99");
        int64_t v = 0;
        EXPECT_EQ(zccl__cfg_int(ZCCL_CFG_IB_QPS_PER_CONN, &v), ZCCL_INVALID_ARGUMENT);
        const std::string err = zccl__last_error();
        EXPECT_NE(err.find("NCCL_IB_QPS_PER_CONNECTION=\"99\" is not an integer in [1, 16]"), std::string::npos) << err;
        int bad = -1;
        std::string t = check_text(&bad);
        EXPECT_EQ(bad, 1) << t;
    }
    {   // text settings too
        Env z("ZCCL_SOCKET_IFNAME", nullptr), n("NCCL_SOCKET_IFNAME", "^docker,lo");
        EXPECT_STREQ(zccl__cfg_str(ZCCL_CFG_SOCKET_IFNAME), "^docker,lo");
        Env z2("ZCCL_DEBUG", nullptr), n2("NCCL_DEBUG", "VERSION");
        EXPECT_STREQ(zccl__cfg_str(ZCCL_CFG_DEBUG), "VERSION");
        int bad = -1;
        std::string t = check_text(&bad);
        EXPECT_EQ(bad, 0) << t;  // NCCL_DEBUG=VERSION is a valid level (nothing printed)
    }
    {   // NCCL's own subsystem names in NCCL_DEBUG_SUBSYS are not errors
        Env z("ZCCL_DEBUG_SUBSYS", nullptr), n("NCCL_DEBUG_SUBSYS", "INIT,NET,GRAPH");
        int bad = -1;
        std::string t = check_text(&bad);
        EXPECT_EQ(bad, 0) << t;
    }
}

TEST(EnvNccl, UnknownAndIgnoredNamesAreReported) {
    Env a("ZCCL_DEBUGG", "INFO"), b("NCCL_ALGO", "Tree"), c("NCCL_DEBUG", "INFO"), d("ZCCL_DEBUG", nullptr),
        e("ZCCL_LOCAL_BIND", "none");
    int bad = -1;
    std::string t = check_text(&bad);
    EXPECT_EQ(bad, 0) << t;
    EXPECT_NE(t.find("unknown: ZCCL_DEBUGG=INFO"), std::string::npos) << t;
    EXPECT_NE(t.find("ignored: NCCL_ALGO=Tree"), std::string::npos) << t;
    EXPECT_EQ(t.find("ignored: NCCL_DEBUG=INFO"), std::string::npos) << t;  // honoured, so not "ignored"
    EXPECT_NE(t.find("nccl: NCCL_DEBUG=INFO is read as ZCCL_DEBUG"), std::string::npos) << t;
    EXPECT_EQ(t.find("ZCCL_LOCAL_BIND"), std::string::npos) << t;  // zcclrun's own variable is known
}

/* ---- Slurm ------------------------------------------------------------------------------------------------- */

TEST(EnvSlurm, FirstHostOfANodeList) {
    const std::vector<std::pair<const char *, const char *>> ok = {
        {"node01", "node01"},          {"node[01-04]", "node01"},       {"node[07,01-04]", "node07"},
        {"a,b", "a"},                  {"gpu[3-4],cpu[1-2]", "gpu3"},   {"r[1-2]-n[003,5]", "r1-n003"},
        {"n[9]", "n9"},                {"x-[10-12]-ib", "x-10-ib"},
    };
    for (const auto &c : ok) {
        char out[64] = "?";
        EXPECT_EQ(zccl__slurm_first_host(c.first, out, sizeof out), 0) << c.first;
        EXPECT_STREQ(out, c.second) << c.first;
    }
    for (const char *bad : {"", "node[", "node[a-b]", "node]", "[", ",a"}) {
        char out[64];
        EXPECT_EQ(zccl__slurm_first_host(bad, out, sizeof out), -1) << bad;
    }
    char small[4];
    EXPECT_EQ(zccl__slurm_first_host("node[01-02]", small, sizeof small), -1);
}

namespace {

const char *const kJobVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ZCCL_SECRET",
                                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID", "SLURM_NTASKS",
                                "SLURM_LOCALID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_ID",
                                "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST"};

zt::EnvList clean_env() {
    zt::EnvList e;
    for (const char *v : kJobVars) e.push_back({v, std::nullopt});
    e.push_back({"ZCCL_INIT_TIMEOUT_MS", std::string("30000")});
    e.push_back({"ZCCL_TIMEOUT_MS", std::string("30000")});
    return e;
}

/* A TCP port in [12000, 32000) that nothing listens on now (the range of the ports derived from SLURM_JOB_ID). */
int free_port_in_slurm_range() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    int port = 0;
    int p = 12000 + (int)(getpid() * 7 % 20000);
    for (int i = 0; i < 20000 && !port; i++, p = 12000 + (p - 12000 + 1) % 20000) {
        a.sin_port = htons((uint16_t)p);
        if (bind(fd, (sockaddr *)&a, sizeof a) == 0) port = p;
    }
    close(fd);
    return port;
}

/* Creates the communicator from the environment, checks rank and size, and sums rank+1 over the job. */
int job_body(int expect_rank, int expect_n) {
    zccl_comm_t comm = nullptr;
    zccl_result_t r = zccl_comm_init_env(&comm);
    if (r != ZCCL_SUCCESS) {
        fprintf(stderr, "rank %d: zccl_comm_init_env: %s\n", expect_rank, zccl_get_last_error(nullptr));
        return 1;
    }
    int rank = -1, n = -1;
    zccl_comm_rank(comm, &rank);
    zccl_comm_count(comm, &n);
    double x = rank + 1, sum = 0;
    r = zccl_allreduce(&x, &sum, 1, ZCCL_FLOAT64, ZCCL_SUM, comm, nullptr);
    zccl_comm_destroy(comm);
    if (rank != expect_rank || n != expect_n || r != ZCCL_SUCCESS || sum != expect_n * (expect_n + 1) / 2.0) {
        fprintf(stderr, "rank %d of %d (expected %d of %d), allreduce %d, sum %g\n", rank, n, expect_rank, expect_n,
                (int)r, sum);
        return 1;
    }
    return 0;
}

}  // namespace

// Inside an srun step: rank and size from SLURM_PROCID/SLURM_NTASKS, the root on the node list's first host, the
// port from SLURM_JOB_ID (12000 + (job + 7919 step) mod 20000; the job id is picked so that the port is free).
TEST(EnvSlurm, StepVariablesMakeAJob) {
    const int port = free_port_in_slurm_range();
    ASSERT_GT(port, 0);
    const int n = 3;
    zt::Options o;
    o.deadline_s = 90;
    o.init_comm = false;
    o.env = clean_env();
    o.rank_env = [=](int r) {
        return zt::EnvList{{"SLURM_STEP_ID", std::string("3")},
                           {"SLURM_PROCID", std::to_string(r)},
                           {"SLURM_NTASKS", std::to_string(n)},
                           {"SLURM_LOCALID", std::to_string(r)},
                           {"SLURM_JOB_ID", std::to_string(port - 12000 + 20000 - 7919 * 3 % 20000)},
                           {"SLURM_JOB_NODELIST", std::string("nosuchhost[1-2]")},
                           {"SLURM_STEP_NODELIST", std::string("localhost,nosuchhost2")}};
    };
    zt::run_ranks(n, [n](zccl_comm_t, int rank, int) { return job_body(rank, n); }, o);
}

// A port derived from the job id is really the one used: with it taken, rank 0 says so.
TEST(EnvSlurm, DerivedPortIsTheOneUsed) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    int port = 0;
    for (int p = 12000 + (getpid() % 19000); p < 32000 && !port; p++) {
        a.sin_port = htons((uint16_t)p);
        if (bind(fd, (sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0) port = p;
    }
    ASSERT_GT(port, 0);
    zt::Options o;
    o.deadline_s = 60;
    o.init_comm = false;
    o.expect_success = false;
    o.env = clean_env();
    o.env.push_back({"SLURM_STEPID", std::string("0")});
    o.env.push_back({"SLURM_PROCID", std::string("0")});
    o.env.push_back({"SLURM_NTASKS", std::string("1")});
    o.env.push_back({"SLURM_JOB_ID", std::to_string(port - 12000)});
    o.env.push_back({"SLURM_JOB_NODELIST", std::string("localhost")});
    zt::GroupResult g = zt::run_ranks(1, [](zccl_comm_t, int rank, int) { return job_body(rank, 1); }, o);
    close(fd);
    ASSERT_EQ(g.procs.size(), 1u);
    EXPECT_FALSE(g.procs[0].ok()) << g.report();
    EXPECT_NE(g.procs[0].output.find("MASTER_PORT=" + std::to_string(port)), std::string::npos) << g.report();
}

// RANK/WORLD_SIZE (torchrun, zcclrun under srun) win over Slurm's; a batch script's shell (no step id) is no job.
TEST(EnvSlurm, LauncherVariablesWinAndBatchShellIsNoStep) {
    std::vector<Env> env;
    env.reserve(32);
    for (const char *v : kJobVars) env.emplace_back(v, nullptr);
    env.emplace_back("SLURM_PROCID", "0");
    env.emplace_back("SLURM_NTASKS", "4");
    env.emplace_back("SLURM_JOB_ID", "77");
    env.emplace_back("SLURM_JOB_NODELIST", "localhost");
    zccl_comm_t comm = nullptr;
    EXPECT_EQ(zccl_comm_init_env(&comm), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("SLURM_PROCID/SLURM_NTASKS (srun)"), std::string::npos)
        << zccl_get_last_error(nullptr);
    {   // in a step, but RANK says rank 5 of WORLD_SIZE 4: the RANK pair is read (and rejected), not Slurm's
        Env s("SLURM_STEP_ID", "0"), r("RANK", "5"), w("WORLD_SIZE", "4");
        EXPECT_EQ(zccl_comm_init_env(&comm), ZCCL_INVALID_ARGUMENT);
        EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("RANK=5"), std::string::npos)
            << zccl_get_last_error(nullptr);
    }
    {   // in a step without MASTER_ADDR or a node list
        Env s("SLURM_STEP_ID", "0"), l("SLURM_JOB_NODELIST", nullptr);
        EXPECT_EQ(zccl_comm_init_env(&comm), ZCCL_INVALID_ARGUMENT);
        EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("SLURM_STEP_NODELIST or SLURM_JOB_NODELIST"),
                  std::string::npos) << zccl_get_last_error(nullptr);
    }
    EXPECT_EQ(comm, nullptr);
}

/* ---- torchrun's agent store ------------------------------------------------------------------------------------ */

// Under torchrun's static rendezvous the agent's store listens on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
// the bootstrap root takes MASTER_PORT+1 instead of failing on a busy port.
TEST(EnvTorchrun, AgentStoreKeepsMasterPort) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t alen = sizeof a;
    ASSERT_EQ(bind(fd, (sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    ASSERT_EQ(getsockname(fd, (sockaddr *)&a, &alen), 0);
    const int port = ntohs(a.sin_port);
    const int n = 2;
    for (bool agent : {true, false}) {
        zt::Options o;
        o.deadline_s = 60;
        o.init_comm = false;
        o.expect_success = agent;
        o.env = clean_env();
        o.rank_env = [=](int r) {
            zt::EnvList e = {{"RANK", std::to_string(r)},
                             {"WORLD_SIZE", std::to_string(n)},
                             {"MASTER_ADDR", std::string("127.0.0.1")},
                             {"MASTER_PORT", std::to_string(port)},
                             {"TORCHELASTIC_RUN_ID", std::string("test")}};
            if (agent) e.push_back({"TORCHELASTIC_USE_AGENT_STORE", std::string("True")});
            if (!agent) e.push_back({"ZCCL_INIT_TIMEOUT_MS", std::string("3000")});
            return e;
        };
        zt::GroupResult g = zt::run_ranks(n, [n](zccl_comm_t, int rank, int) { return job_body(rank, n); }, o);
        if (!agent) {  // without the variable the busy port is an error that names it (the reference case)
            ASSERT_EQ(g.procs.size(), 2u);
            EXPECT_FALSE(g.procs[0].ok());
            EXPECT_NE(g.procs[0].output.find("MASTER_PORT=" + std::to_string(port)), std::string::npos) << g.report();
        }
    }
    close(fd);
}

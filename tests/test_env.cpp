// test_env.cpp — what the library reads from the environment besides its own ZCCL_* settings: NCCL's names for
// the settings that have one (lib/config.c, column .nccl), the report of unknown ZCCL_* and ignored NCCL_* names
// (zccl_config_check), and Slurm's job variables in zccl_comm_init_env.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "core.h"
}
#include "zccl.h"

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
    for (int i = 0; i < ZCCL_CFG_COUNT; i++)
        if (std::string(zccl__cfg_table[i].name) == name) return (zccl_cfg_id_t)i;
    ADD_FAILURE() << name << " is not in the settings table";
    return ZCCL_CFG_COUNT;
}

// The NCCL names zccl honours, written out here independently of lib/config.c (docs/configuration.md's list).
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
};

}  // namespace

TEST(EnvNccl, TableHasExactlyTheDocumentedNames) {
    std::map<std::string, std::string> got;
    for (int i = 0; i < ZCCL_CFG_COUNT; i++)
        if (zccl__cfg_table[i].nccl) got[zccl__cfg_table[i].nccl] = zccl__cfg_table[i].name;
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
        EXPECT_NE(std::string(zccl__last_error()).find("NCCL_IB_QPS_PER_CONNECTION=\"99\" is not an integer in [1, 16]"),
                  std::string::npos) << zccl__last_error();
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

/*
 * test_settings_match.cpp — settings that shape the protocol or the schedules (lib/core/comm.c: must_match) must be the
 * same on every rank. When one rank differs, communicator creation fails at once on every rank with
 * ZCCL_INVALID_USAGE naming the setting and the ranks, instead of stalling until ZCCL_INIT_TIMEOUT_MS or failing
 * later with an internal error. Settings that may differ (a per-rank debug level) do not trip it.
 */
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

namespace {

struct Case {
    const char *name, *value;
};
/* gtest prints the parameter in test names and failures: the setting and its value instead of the struct's bytes. */
[[maybe_unused]] static void PrintTo(const Case &c, std::ostream *os) { *os << c.name << "=" << c.value; }

class SettingsMatch : public ::testing::TestWithParam<Case> {};

TEST_P(SettingsMatch, OneRankDifferentFailsInitEverywhereNamingIt) {
    const Case c = GetParam();
    Options o;
    o.deadline_s = 30; /* the check runs right after the bootstrap: far below ZCCL_INIT_TIMEOUT_MS */
    o.init_comm = false;
    o.env = {{"ZCCL_INIT_TIMEOUT_MS", "20000"}};
    const std::string name = c.name, value = c.value;
    o.rank_env = [name, value](int r) { return r == 2 ? EnvList{{name, value}} : EnvList{}; };
    zccl_unique_id_t id;
    ASSERT_EQ(zccl_get_unique_id(&id), ZCCL_SUCCESS);
    const double t0 = now_s();
    run_ranks(3, [id, name](zccl_comm_t, int rank, int nranks) -> int {
        zccl_comm_t comm = nullptr;
        zccl_result_t r = zccl_comm_init_rank(&comm, nranks, id, rank);
        const std::string msg = zccl_get_last_error(nullptr);
        if (r != ZCCL_INVALID_USAGE || msg.find(name) == std::string::npos || msg.find("rank 2") == std::string::npos) {
            fprintf(stderr, "[rank %d] FAIL: init returned %d, message \"%s\" (want ZCCL_INVALID_USAGE naming %s and "
                    "rank 2)\n", rank, (int)r, msg.c_str(), name.c_str());
            return 1;
        }
        return 0;
    }, o);
    EXPECT_LT(now_s() - t0, 15.0) << "the mismatch must be found at once, not by the init deadline";
}

INSTANTIATE_TEST_SUITE_P(Settings, SettingsMatch,
                         ::testing::Values(Case{"ZCCL_CHECK", "1"}, Case{"ZCCL_SHM_SLOTS", "4"},
                                           Case{"ZCCL_TRANSPORT", "tcp"}, Case{"ZCCL_RS_ROUND_BYTES", "64K"},
                                           Case{"ZCCL_ALGO", "ring"}, Case{"ZCCL_STAGE_DEPTH", "0"},
                                           Case{"ZCCL_STAGE_CHUNK_BYTES", "1M"}),
                         [](const ::testing::TestParamInfo<Case> &i) { return std::string(i.param.name).substr(5); });

TEST(SettingsMatchOk, PerRankDebugLevelMayDiffer) {
    Options o;
    o.deadline_s = 30;
    o.rank_env = [](int r) { return r == 1 ? EnvList{{"ZCCL_DEBUG", "WARN"}, {"ZCCL_SPIN_US", "0"}} : EnvList{}; };
    run_ranks(3, [](zccl_comm_t comm, int rank, int nranks) -> int {
        int32_t x = rank + 1, y = 0;
        if (zccl_allreduce(&x, &y, 1, ZCCL_INT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS || y != nranks * (nranks + 1) / 2) {
            fprintf(stderr, "[rank %d] FAIL: allreduce %d: %s\n", rank, y, zccl_get_last_error(comm));
            return 1;
        }
        return 0;
    }, o);
}

}  // namespace

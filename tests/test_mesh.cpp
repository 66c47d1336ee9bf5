/*
 * test_mesh.cpp — the named mesh (include/zccl_mesh.h).
 * MeshLayout.*: the pure layout on synthetic host layouts: 2 hosts x 4 ranks as dp=2 x tp=4 (every tp group on one
 * host, every dp group across both), hosts interleaved by rank, 3D 2x2x2, a tp group that would span hosts refused
 * naming the shape and accepted with ZCCL_MESH_ALLOW_CROSS_HOST, shapes that do not multiply to the world refused.
 * MeshComm.*: 8 forked ranks on this host as dp=2 x tp=4 and as dp=2 x pp=2 x tp=2: each dimension's communicator has
 * the size and members the test derives from the layout rule, and an all-reduce in each group (of world ranks,
 * int64, exact) gives the sum the test computes; a shape that does not divide the world and ranks passing different
 * shapes fail on every rank.
 */
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"
#include "zccl_mesh.h"

using namespace zt;

namespace {
const char *const kDpTp[] = {"dp", "tp"};
const char *const kDpPpTp[] = {"dp", "pp", "tp"};
}  // namespace

TEST(MeshLayout, TwoHostsDp2Tp4KeepsTpInsideAHostAndDpAcross) {
    for (int interleaved = 0; interleaved < 2; interleaved++) {
        std::vector<int> host(8), coords(16);
        for (int r = 0; r < 8; r++) host[r] = interleaved ? r % 2 : r / 4;
        const int sizes[] = {2, 4};
        char why[512] = "";
        ASSERT_EQ(zccl_mesh_layout(8, host.data(), 2, kDpTp, sizes, 0, coords.data(), why, sizeof why), ZCCL_SUCCESS)
            << why;
        for (int a = 0; a < 8; a++)
            for (int b = 0; b < 8; b++) {
                const bool same_tp = coords[2 * a] == coords[2 * b];     /* same dp coordinate: one tp group */
                const bool same_dp = coords[2 * a + 1] == coords[2 * b + 1];
                if (same_tp) EXPECT_EQ(host[a], host[b]) << "tp group across hosts: ranks " << a << ", " << b;
                if (same_dp && a != b) EXPECT_NE(host[a], host[b]) << "dp group inside a host: ranks " << a << ", " << b;
            }
        /* every coordinate pair is taken exactly once */
        std::vector<int> seen(8, 0);
        for (int r = 0; r < 8; r++) seen[coords[2 * r] * 4 + coords[2 * r + 1]]++;
        for (int s : seen) EXPECT_EQ(s, 1);
    }
}

TEST(MeshLayout, ThreeDimensionsLastFastest) {
    std::vector<int> host(8, 0), coords(24);
    const int sizes[] = {2, 2, 2};
    ASSERT_EQ(zccl_mesh_layout(8, host.data(), 3, kDpPpTp, sizes, 0, coords.data(), nullptr, 0), ZCCL_SUCCESS);
    for (int r = 0; r < 8; r++) {
        EXPECT_EQ(coords[3 * r + 0], r / 4);
        EXPECT_EQ(coords[3 * r + 1], (r / 2) % 2);
        EXPECT_EQ(coords[3 * r + 2], r % 2);
    }
}

TEST(MeshLayout, TpAcrossHostsRefusedNamingTheShapeUnlessAllowed) {
    std::vector<int> host = {0, 0, 0, 1, 1, 1}, coords(12);
    const int sizes[] = {3, 2};
    char why[512] = "";
    EXPECT_EQ(zccl_mesh_layout(6, host.data(), 2, kDpTp, sizes, 0, coords.data(), why, sizeof why),
              ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(why).find("dp=3 x tp=2"), std::string::npos) << why;
    EXPECT_NE(std::string(why).find("across hosts"), std::string::npos) << why;
    EXPECT_EQ(zccl_mesh_layout(6, host.data(), 2, kDpTp, sizes, ZCCL_MESH_ALLOW_CROSS_HOST, coords.data(), why,
                               sizeof why),
              ZCCL_SUCCESS)
        << why;
}

TEST(MeshLayout, ShapesThatDoNotMultiplyToTheWorldAreRefused) {
    std::vector<int> host(8, 0), coords(24);
    char why[512] = "";
    const int s33[] = {3, 3}, s23[] = {2, 3}, s0[] = {0, 8};
    EXPECT_EQ(zccl_mesh_layout(8, host.data(), 2, kDpTp, s33, 0, coords.data(), why, sizeof why), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(why).find("dp=3 x tp=3"), std::string::npos) << why;
    EXPECT_EQ(zccl_mesh_layout(8, host.data(), 2, kDpTp, s23, 0, coords.data(), why, sizeof why), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(why).find("dp=2 x tp=3"), std::string::npos) << why;
    EXPECT_EQ(zccl_mesh_layout(8, host.data(), 2, kDpTp, s0, 0, coords.data(), why, sizeof why), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(why).find("sizes[0]"), std::string::npos) << why;
    const char *const dup[] = {"tp", "tp"};
    const int s24[] = {2, 4};
    EXPECT_EQ(zccl_mesh_layout(8, host.data(), 2, dup, s24, 0, coords.data(), why, sizeof why), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(why).find("named twice"), std::string::npos) << why;
}

namespace {

/* On one host the mesh position is the rank: rank r's coordinates are r's digits in the mixed radix `sizes`. */
int digit(int r, const std::vector<int> &sizes, int d) {
    for (int e = (int)sizes.size() - 1; e > d; e--) r /= sizes[e];
    return r % sizes[d];
}

int check_mesh(zccl_comm_t comm, int rank, int n, const char *const *names, const std::vector<int> &sizes) {
    zccl_mesh_t mesh;
    if (zccl_mesh_create(comm, (int)sizes.size(), names, sizes.data(), 0, &mesh) != ZCCL_SUCCESS) {
        child_log(rank, "zccl_mesh_create: %s", zccl_get_last_error(comm));
        return 1;
    }
    int bad = 0;
    for (int d = 0; d < (int)sizes.size(); d++) {
        zccl_comm_t dc;
        int cnt = -1, dr = -1, coord = -1;
        if (zccl_mesh_comm(mesh, names[d], &dc) != ZCCL_SUCCESS || zccl_comm_count(dc, &cnt) != ZCCL_SUCCESS ||
            zccl_comm_rank(dc, &dr) != ZCCL_SUCCESS || zccl_mesh_coord(mesh, names[d], &coord) != ZCCL_SUCCESS) {
            child_log(rank, "dimension %s: accessors failed", names[d]);
            return 1;
        }
        if (cnt != sizes[d] || dr != digit(rank, sizes, d) || coord != dr) {
            child_log(rank, "dimension %s: size %d rank %d coord %d, wanted size %d rank %d", names[d], cnt, dr, coord,
                      sizes[d], digit(rank, sizes, d));
            bad++;
        }
        /* The members of this rank's group: every rank whose other digits equal ours. */
        int64_t want = 0, v = rank;
        for (int q = 0; q < n; q++) {
            bool same = true;
            for (int e = 0; e < (int)sizes.size(); e++)
                if (e != d && digit(q, sizes, e) != digit(rank, sizes, e)) same = false;
            if (same) want += q;
        }
        if (zccl_allreduce(&v, &v, 1, ZCCL_INT64, ZCCL_SUM, dc, NULL) != ZCCL_SUCCESS || v != want) {
            child_log(rank, "dimension %s: all-reduce of world ranks gave %lld, wanted %lld (%s)", names[d],
                      (long long)v, (long long)want, zccl_get_last_error(dc));
            bad++;
        }
    }
    zccl_mesh_destroy(mesh);
    return bad ? 1 : 0;
}

}  // namespace

TEST(MeshComm, EightRanksDp2Tp4AndDp2Pp2Tp2) {
    Options o;
    o.deadline_s = 120;
    run_ranks(8, [](zccl_comm_t comm, int rank, int n) {
        if (check_mesh(comm, rank, n, kDpTp, {2, 4})) return 1;
        return check_mesh(comm, rank, n, kDpPpTp, {2, 2, 2});
    }, o);
}

TEST(MeshComm, RefusedShapeAndDifferentShapesFailOnEveryRank) {
    Options o;
    o.deadline_s = 60;
    run_ranks(8, [](zccl_comm_t comm, int rank, int) {
        zccl_mesh_t mesh = nullptr;
        const int s33[] = {3, 3};
        zccl_result_t res = zccl_mesh_create(comm, 2, kDpTp, s33, 0, &mesh);
        std::string msg = zccl_get_last_error(comm);
        if (res != ZCCL_INVALID_ARGUMENT || mesh || msg.find("dp=3 x tp=3") == std::string::npos) {
            child_log(rank, "3x3 on 8 ranks: got %d '%s'", (int)res, msg.c_str());
            return 1;
        }
        const int s24[] = {2, 4}, s42[] = {4, 2};
        res = zccl_mesh_create(comm, 2, kDpTp, rank == 5 ? s42 : s24, 0, &mesh);
        msg = zccl_get_last_error(comm);
        if (res != ZCCL_INVALID_USAGE || mesh || msg.find("different mesh") == std::string::npos) {
            child_log(rank, "different shapes: got %d '%s'", (int)res, msg.c_str());
            return 1;
        }
        /* the communicator still works */
        int64_t v = 1;
        if (zccl_allreduce(&v, &v, 1, ZCCL_INT64, ZCCL_SUM, comm, NULL) != ZCCL_SUCCESS || v != 8) return 1;
        return 0;
    }, o);
}

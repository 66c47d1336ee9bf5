/*
 * nccl/device_api.c — the host-side entry points of NCCL 2.28's device API (nccl_device.h: device communicators,
 * teams, barrier and LL all-to-all requirements). zccl has no GPU kernels, so everything that would set up device
 * resources fails with ncclInvalidUsage and a message; the team queries answer for a machine without load/store
 * peers: the LSA team (ranks reachable by GPU loads and stores) is the calling rank alone, the rail team is the whole
 * communicator, so that world = LSA x rail still holds. The C++ header is not usable from C: the few types are
 * declared here with NCCL's layout (ncclTeam: three ints).
 */
#include <nccl.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))
#define PALIAS(name) extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")))

__attribute__((format(printf, 2, 3))) ncclResult_t zccl_nccl_fail(ncclResult_t r, const char *fmt, ...);

typedef struct {
    int nRanks, rank, stride;
} team_t; /* struct ncclTeam */

#define NO_GPU "zccl has no GPU support yet, so NCCL's device API (nccl_device.h) is not available"

EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm) {
    (void)comm, (void)reqs, (void)outDevComm;
    return zccl_nccl_fail(ncclInvalidUsage, "ncclDevCommCreate: " NO_GPU);
}
PALIAS(ncclDevCommCreate);

EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void *devComm) {
    (void)comm, (void)devComm;
    return zccl_nccl_fail(ncclInvalidUsage, "ncclDevCommDestroy: " NO_GPU " (no device communicator can exist)");
}
PALIAS(ncclDevCommDestroy);

EXPORT ncclResult_t ncclLsaBarrierCreateRequirement(team_t team, int nBarriers, void *outHandle, void *outReq) {
    (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
    return zccl_nccl_fail(ncclInvalidUsage, "ncclLsaBarrierCreateRequirement: " NO_GPU);
}
PALIAS(ncclLsaBarrierCreateRequirement);

EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, team_t team, int nBarriers, void *outHandle,
                                                    void *outReq) {
    (void)comm, (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
    return zccl_nccl_fail(ncclInvalidUsage, "ncclGinBarrierCreateRequirement: " NO_GPU);
}
PALIAS(ncclGinBarrierCreateRequirement);

EXPORT ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void *outHandle, void *outReq) {
    (void)nBlocks, (void)nSlots, (void)outHandle, (void)outReq;
    return zccl_nccl_fail(ncclInvalidUsage, "ncclLLA2ACreateRequirement: " NO_GPU);
}
PALIAS(ncclLLA2ACreateRequirement);

/* Sizes device buffers only: 0 slots (and the message), as nothing can use them. */
EXPORT int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
    (void)maxElts, (void)maxEltSize;
    zccl_nccl_fail(ncclInvalidUsage, "ncclLLA2ACalcSlots: " NO_GPU "; returning 0 slots");
    return 0;
}
PALIAS(ncclLLA2ACalcSlots);

static team_t team_of(ncclComm_t comm, int whole) {
    team_t t = {1, 0, 1};
    int n = 1, r = 0;
    if (ncclCommCount(comm, &n) != ncclSuccess || ncclCommUserRank(comm, &r) != ncclSuccess) return t;
    if (whole) t.nRanks = n, t.rank = r;
    return t;
}

EXPORT team_t ncclTeamWorld(ncclComm_t comm) { return team_of(comm, 1); }
PALIAS(ncclTeamWorld);
EXPORT team_t ncclTeamLsa(ncclComm_t comm) { return team_of(comm, 0); }
PALIAS(ncclTeamLsa);
EXPORT team_t ncclTeamRail(ncclComm_t comm) { return team_of(comm, 1); }
PALIAS(ncclTeamRail);

/* The world rank of member `rank` of a team the caller belongs to: members are stride apart in world ranks. */
EXPORT int ncclTeamRankToWorld(ncclComm_t comm, team_t team, int rank) {
    int me = 0;
    if (ncclCommUserRank(comm, &me) != ncclSuccess) return -1;
    return me + (rank - team.rank) * team.stride;
}
PALIAS(ncclTeamRankToWorld);

/* The LSA team is the caller alone: its own world rank is LSA rank 0, every other one has none (-1). */
EXPORT int ncclTeamRankToLsa(ncclComm_t comm, team_t team, int rank) {
    int me = 0;
    if (ncclCommUserRank(comm, &me) != ncclSuccess) return -1;
    return ncclTeamRankToWorld(comm, team, rank) == me ? 0 : -1;
}
PALIAS(ncclTeamRankToLsa);

/* Not in nccl.h; NVIDIA's library exports it (ncclResetDebugInit's worker). */
void zccl_nccl_env_map(void); /* nccl/env.c */
EXPORT void ncclResetDebugInitInternal(void) { zccl_nccl_env_map(); }

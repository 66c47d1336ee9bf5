/*
 * test_regmem.cpp — zccl_mem_alloc / zccl_mem_free / zccl_comm_register / zccl_comm_deregister: argument errors
 * name the argument; memory from zccl_mem_alloc is page-aligned, zeroed and shared (a forked child sees the
 * parent's writes); a registered range of malloc'd memory is accepted but never enables the direct path, and
 * registered all-reduces stay right when the registration ends between calls; a rank lost before a registered call
 * is an error naming it, not a hang; deregistering closes the peers' mappings before it returns, so the memory can be
 * freed while the communicator lives on (RegMem.DeregisterClosesPeerMappings; tools/sanitize.sh address runs it).
 * The conformance matrix over
 * registered buffers is in test_collectives.cpp (Registered/CollectivesMatrix).
 */
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "zccl.h"

using namespace zt;

TEST(RegMem, AllocFreeErrorsNameTheArgument) {
    EXPECT_EQ(zccl_mem_alloc(nullptr, 10), ZCCL_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("'ptr'"), std::string::npos);
    void *p = nullptr;
    ASSERT_EQ(zccl_mem_alloc(&p, 10000), ZCCL_SUCCESS);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ((uintptr_t)p % 4096, 0u);
    for (size_t k = 0; k < 10000; k++) ASSERT_EQ(((uint8_t *)p)[k], 0) << "byte " << k;
    /* Shared: a forked child's write is seen by the parent. */
    pid_t c = fork();
    if (c == 0) {
        ((uint8_t *)p)[4242] = 0x5c;
        _exit(0);
    }
    int st = 0;
    ASSERT_EQ(waitpid(c, &st, 0), c);
    EXPECT_EQ(((uint8_t *)p)[4242], 0x5c);
    EXPECT_EQ(zccl_mem_free((uint8_t *)p + 8), ZCCL_INVALID_ARGUMENT); /* not the start of a block */
    EXPECT_EQ(zccl_mem_free(p), ZCCL_SUCCESS);
    EXPECT_EQ(zccl_mem_free(p), ZCCL_INVALID_ARGUMENT); /* freed already */
    EXPECT_NE(std::string(zccl_get_last_error(nullptr)).find("zccl_mem_free"), std::string::npos);
    EXPECT_EQ(zccl_mem_free(nullptr), ZCCL_SUCCESS);
}

namespace {

int register_body(zccl_comm_t comm, int rank, int n) {
    int bad = 0;
    auto expect = [&](bool ok, const char *what) {
        if (!ok) {
            fprintf(stderr, "rank %d: FAIL %s (%s)\n", rank, what, zccl_get_last_error(comm));
            bad++;
        }
    };
    void *h = nullptr;
    char x[16];
    expect(zccl_comm_register(nullptr, x, 16, &h) == ZCCL_INVALID_ARGUMENT, "register: NULL comm");
    expect(zccl_comm_register(comm, nullptr, 16, &h) == ZCCL_INVALID_ARGUMENT, "register: NULL buf");
    expect(zccl_comm_register(comm, x, 0, &h) == ZCCL_INVALID_ARGUMENT, "register: 0 bytes");
    expect(zccl_comm_register(comm, x, 16, nullptr) == ZCCL_INVALID_ARGUMENT, "register: NULL handle");
    expect(zccl_comm_deregister(comm, x) == ZCCL_INVALID_ARGUMENT, "deregister: not a handle");

    /* 1 Mi floats: above ZCCL_SHM_REG_MIN_BYTES. Rank 0 uses zccl memory, the others malloc'd memory that they
     * register too (accepted, but it cannot be shared): every call must fall back and stay right. */
    const size_t count = 1 << 20;
    float *s = nullptr, *r = nullptr;
    std::vector<float> ms, mr;
    if (rank == 0) {
        expect(zccl_mem_alloc((void **)&s, count * 4) == ZCCL_SUCCESS, "mem_alloc send");
        expect(zccl_mem_alloc((void **)&r, count * 4) == ZCCL_SUCCESS, "mem_alloc recv");
    } else {
        ms.resize(count), mr.resize(count);
        s = ms.data(), r = mr.data();
    }
    if (!s || !r) return 2;
    void *hs = nullptr, *hr = nullptr;
    expect(zccl_comm_register(comm, s, count * 4, &hs) == ZCCL_SUCCESS, "register send");
    expect(zccl_comm_register(comm, r, count * 4, &hr) == ZCCL_SUCCESS, "register recv");
    for (int round = 0; round < 3; round++) {
        for (size_t k = 0; k < count; k++) s[k] = (float)((k + (size_t)rank * 3 + (size_t)round) % 1000);
        expect(zccl_allreduce(s, r, count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) == ZCCL_SUCCESS, "allreduce");
        size_t wrong = 0;
        for (size_t k = 0; k < count; k++) {
            float want = 0;
            for (int q = 0; q < n; q++) want += (float)((k + (size_t)q * 3 + (size_t)round) % 1000);
            wrong += r[k] != want;
        }
        expect(wrong == 0, "allreduce result");
        if (round == 1 && rank == 0) { /* registration ends between calls: still right */
            expect(zccl_comm_deregister(comm, hs) == ZCCL_SUCCESS, "deregister send");
            expect(zccl_comm_deregister(comm, hs) == ZCCL_INVALID_ARGUMENT, "deregister twice");
            hs = nullptr;
        }
    }
    if (hs) expect(zccl_comm_deregister(comm, hs) == ZCCL_SUCCESS, "deregister send");
    expect(zccl_comm_deregister(comm, hr) == ZCCL_SUCCESS, "deregister recv");
    if (rank == 0) {
        expect(zccl_mem_free(s) == ZCCL_SUCCESS, "mem_free send");
        expect(zccl_mem_free(r) == ZCCL_SUCCESS, "mem_free recv");
    }
    return bad ? 1 : 0;
}

}  // namespace

// A /dev/shm too small for the block: zccl_mem_alloc fails naming /dev/shm (the pages are reserved at the call),
// instead of succeeding and raising SIGBUS at a later write. A child in its own mount namespace mounts a 1 MiB
// tmpfs over /dev/shm (needs root; skipped otherwise).
TEST(RegMem, FullDevShmIsAnErrorNotALaterSigbus) {
    const int rc = run_in_child({}, []() -> int {
        if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
            mount("zccl-test", "/dev/shm", "tmpfs", 0, "size=1m") != 0)
            return 77;
        void *p = nullptr;
        if (zccl_mem_alloc(&p, 256u << 10) != ZCCL_SUCCESS) return 3; /* fits: must work */
        memset(p, 1, 256u << 10);
        zccl_mem_free(p);
        p = nullptr;
        const zccl_result_t r = zccl_mem_alloc(&p, 4u << 20); /* does not fit */
        if (r == ZCCL_SUCCESS) {
            memset(p, 1, 4u << 20); /* before the fix: SIGBUS here */
            return 4;
        }
        if (r != ZCCL_SYSTEM_ERROR) return 5;
        if (!strstr(zccl_get_last_error(nullptr), "/dev/shm")) return 6;
        return 0;
    }, 60);
    if (rc == 77) GTEST_SKIP() << "cannot mount a small tmpfs over /dev/shm here (needs root and mount namespaces)";
    EXPECT_EQ(rc, 0) << "3: a block that fits failed; 4: a block that does not fit was returned (128+" << SIGBUS
                     << ": SIGBUS); 5: wrong error code; 6: message does not name /dev/shm";
}

/* A process that died without freeing its regions leaves /dev/shm/zccl-mem-<id>-p<pid>; a later process with the
 * same pid must skip those names, not fail (the suite forks thousands of ranks: pids are reused, and registered
 * buffers then fell back to ordinary memory, failing the tests that count them). The test finds the id of a
 * region it allocates, takes the next 300 names of its own pid as a dead process would have left them, and
 * allocates again: that must work, in a region whose name is past them, and leave the stale files alone. */
TEST(RegMem, StaleNamesOfADeadProcessWithThisPidAreSkipped) {
    const int pid = (int)getpid();
    auto name = [pid](unsigned long long id) {
        return "/dev/shm/zccl-mem-" + std::to_string(id) + "-p" + std::to_string(pid);
    };
    auto exists = [](const std::string &p) { return access(p.c_str(), F_OK) == 0; };
    void *a = nullptr;
    ASSERT_EQ(zccl_mem_alloc(&a, 4096), ZCCL_SUCCESS) << zccl_get_last_error(nullptr);
    unsigned long long k = 0;
    for (unsigned long long id = 1; id < 100000 && !k; id++)
        if (exists(name(id)) && !exists(name(id + 1))) k = id; /* the newest region of this process */
    ASSERT_NE(k, 0u) << "no /dev/shm/zccl-mem-*-p" << pid << " after zccl_mem_alloc";
    std::vector<std::string> stale;
    for (unsigned long long id = k + 1; id <= k + 300; id++) {
        FILE *f = fopen(name(id).c_str(), "w");
        ASSERT_NE(f, nullptr) << name(id);
        fclose(f);
        stale.push_back(name(id));
    }
    void *b = nullptr;
    const zccl_result_t r = zccl_mem_alloc(&b, 8192);
    const std::string msg = zccl_get_last_error(nullptr);
    const bool past = exists(name(k + 301));
    for (const auto &p : stale) {
        EXPECT_TRUE(exists(p)) << p << " was removed: another process's name";
        unlink(p.c_str());
    }
    EXPECT_EQ(r, ZCCL_SUCCESS) << msg;
    EXPECT_TRUE(past) << "the new region is not " << name(k + 301);
    if (b) memset(b, 1, 8192);
    EXPECT_EQ(zccl_mem_free(b), ZCCL_SUCCESS);
    EXPECT_EQ(zccl_mem_free(a), ZCCL_SUCCESS);
}

TEST(RegMem, RegistrationErrorsAndMixedBuffersFallBack) {
    Options o;
    o.deadline_s = 120;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}};
    run_ranks(3, register_body, o);
}

namespace {

/* Rank 1 registers like rank 0, then exits without calling the collective: rank 0, waiting for its descriptor,
 * must fail naming the lost rank instead of hanging. */
int lost_peer_body(zccl_comm_t comm, int rank, int) {
    const size_t count = 1 << 18;
    float *s = nullptr, *r = nullptr;
    void *hs = nullptr, *hr = nullptr;
    if (zccl_mem_alloc((void **)&s, count * 4) != ZCCL_SUCCESS || zccl_mem_alloc((void **)&r, count * 4) != ZCCL_SUCCESS ||
        zccl_comm_register(comm, s, count * 4, &hs) != ZCCL_SUCCESS ||
        zccl_comm_register(comm, r, count * 4, &hr) != ZCCL_SUCCESS)
        return 2;
    if (rank == 1) _exit(0);
    zccl_result_t res = zccl_allreduce(s, r, count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr);
    std::string msg = zccl_get_last_error(comm);
    if (res != ZCCL_REMOTE_ERROR || msg.find("rank 1") == std::string::npos) {
        fprintf(stderr, "expected ZCCL_REMOTE_ERROR naming rank 1, got %d: %s\n", (int)res, msg.c_str());
        return 1;
    }
    return 0;
}

}  // namespace

TEST(RegMem, LostPeerDuringRegisteredCallIsAnErrorNotAHang) {
    Options o;
    o.deadline_s = 60;
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}};
    run_ranks(2, lost_peer_body, o);
}

extern "C" uint64_t zccl__reg_direct_calls(int mem_type); /* lib/core/regmem.h */

namespace {

/* How many mappings of zccl_mem_alloc regions of process `pid` this process has (/proc/self/maps). */
int mappings_of(long pid) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *m = strstr(line, "/zccl-mem-");
        const char *p = m ? strstr(m, "-p") : nullptr;
        if (p && strtol(p + 2, nullptr, 10) == pid) n++;
    }
    fclose(f);
    return n;
}

/* Every rank's buffers are zccl_mem_alloc memory, registered: an all-reduce runs straight out of the peers'
 * buffers, so the peers map rank 0's. Rank 0 deregisters; when that returns the peers map none of rank 0's memory
 * any more, rank 0 frees it, and the communicator goes on working. */
int dereg_body(zccl_comm_t comm, int rank, int n) {
    auto failed = [&](const std::string &what) {
        fprintf(stderr, "rank %d: FAIL %s (%s)\n", rank, what.c_str(), zccl_get_last_error(comm));
        return 1;
    };
    int64_t pid = getpid();
    std::vector<int64_t> pids((size_t)n);
    if (zccl_allgather(&pid, pids.data(), 1, ZCCL_INT64, comm, nullptr) != ZCCL_SUCCESS) return failed("allgather");
    const size_t count = 1 << 16; /* 256 KiB: above ZCCL_SHM_REG_MIN_BYTES */
    float *s = nullptr, *r = nullptr;
    if (zccl_mem_alloc((void **)&s, count * 4) != ZCCL_SUCCESS ||
        zccl_mem_alloc((void **)&r, count * 4) != ZCCL_SUCCESS)
        return failed("mem_alloc");
    void *hs = nullptr, *hr = nullptr;
    if (zccl_comm_register(comm, s, count * 4, &hs) != ZCCL_SUCCESS ||
        zccl_comm_register(comm, r, count * 4, &hr) != ZCCL_SUCCESS)
        return failed("register");
    for (size_t k = 0; k < count; k++) s[k] = (float)(k % 100 + (size_t)rank);
    const uint64_t d0 = zccl__reg_direct_calls(0);
    if (zccl_allreduce(s, r, count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS) return failed("allreduce");
    for (size_t k = 0; k < count; k++)
        if (r[k] != (float)((k % 100) * (size_t)n + (size_t)(n * (n - 1) / 2))) return failed("allreduce result");
    if (zccl__reg_direct_calls(0) != d0 + 1) return failed("the all-reduce did not take the direct path");
    if (rank != 0 && mappings_of((long)pids[0]) < 1) return failed("no mapping of rank 0's buffers to watch");
    if (zccl_barrier(comm, nullptr) != ZCCL_SUCCESS) return failed("barrier");
    if (rank == 0) {
        if (zccl_comm_deregister(comm, hs) != ZCCL_SUCCESS || zccl_comm_deregister(comm, hr) != ZCCL_SUCCESS)
            return failed("deregister");
    }
    if (zccl_barrier(comm, nullptr) != ZCCL_SUCCESS) return failed("barrier");
    if (rank != 0 && mappings_of((long)pids[0]) != 0)
        return failed("rank 0's deregistered buffers are still mapped here: " +
                      std::to_string(mappings_of((long)pids[0])) + " mappings");
    if (rank == 0 && (zccl_mem_free(s) != ZCCL_SUCCESS || zccl_mem_free(r) != ZCCL_SUCCESS)) return failed("mem_free");
    std::vector<float> a(count, float(rank + 1)), b(count);
    if (zccl_allreduce(a.data(), b.data(), count, ZCCL_FLOAT32, ZCCL_SUM, comm, nullptr) != ZCCL_SUCCESS)
        return failed("allreduce after the free");
    if (b[count - 1] != float(n * (n + 1) / 2)) return failed("allreduce after the free: wrong sum");
    if (rank != 0) {
        if (zccl_comm_deregister(comm, hs) != ZCCL_SUCCESS || zccl_comm_deregister(comm, hr) != ZCCL_SUCCESS)
            return failed("deregister");
        if (zccl_mem_free(s) != ZCCL_SUCCESS || zccl_mem_free(r) != ZCCL_SUCCESS) return failed("mem_free");
    }
    return 0;
}

}  // namespace

TEST(RegMem, DeregisterClosesPeerMappings) {
    Options o;
    o.deadline_s = 60;
    /* The staged path off: its staging regions are zccl_mem_alloc memory the peers map too. */
    o.env = {{"ZCCL_TRANSPORT", std::string("shm")}, {"ZCCL_SHM_STAGED", std::string("0")},
             {"ZCCL_TIMEOUT_MS", std::string("20000")}};
    run_ranks(3, dereg_body, o);
}

/*
 * harness.h — multi-process test harness for zccl.
 *
 * Every rank of a test communicator is a separate process forked from the GoogleTest process. Children never run
 * GoogleTest assertions (they are separate processes whose failures GoogleTest cannot see): a child returns an exit
 * code (0 = success) and prints diagnostics, prefixed with its rank, on stderr. The parent collects exit statuses
 * and the children's output, enforces a deadline (SIGKILL of every remaining child, then a test failure naming
 * the ranks still running), and asserts on the aggregate.
 *
 * Two levels:
 *   - ProcessGroup: fork arbitrary functions as child processes, kill or wait for them with a deadline. Fault
 *     tests use it directly (kill a rank part-way, start an impostor process next to the real ranks, ...).
 *   - run_ranks(): the common case. Creates a unique id in the parent (zccl_get_unique_id), forks nranks
 *     children; each applies the environment overrides (before its first zccl call), calls
 *     zccl_comm_init_rank, runs the body, destroys the communicator (zccl_comm_abort instead when the body
 *     failed, so that peers stop waiting at once) and _exits with the body's code.
 *
 * Children's stdout and stderr are captured into per-process anonymous files; the parent includes their tails in
 * failure messages (and echoes them all when ZCCL_TEST_VERBOSE=1 is set in the test's environment).
 */
#ifndef ZCCL_TEST_HARNESS_H
#define ZCCL_TEST_HARNESS_H

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zccl.h"

namespace zt {

/** Environment overrides applied in a child before it runs anything: value nullopt means unsetenv. */
using EnvList = std::vector<std::pair<std::string, std::optional<std::string>>>;

/** Outcome of one child process. */
struct ProcStatus {
    std::string name;              /**< "rank 3", "impostor", ... */
    pid_t pid = -1;
    bool exited = false;           /**< terminated by _exit/exit: exit_code is valid */
    int exit_code = -1;
    int term_signal = 0;           /**< signal that killed it (0 if it exited) */
    bool killed_at_deadline = false;
    double elapsed_s = 0;          /**< from spawn to reap */
    std::string output;            /**< captured stdout+stderr (possibly truncated to the last 64 KiB) */

    bool ok() const { return exited && exit_code == 0; }
    /** "exited with code 3", "killed by signal 11 (Segmentation fault)", "killed at deadline". */
    std::string describe() const;
};

/** Outcome of a group of children. */
struct GroupResult {
    std::vector<ProcStatus> procs;
    bool deadline_exceeded = false;
    double deadline_s = 0;
    double elapsed_s = 0;
    std::string setup_error;       /**< non-empty if the group could not even start (fork, unique id, ...) */

    bool all_ok() const;
    /** A multi-line report: deadline line, one line per failed process with its output tail. */
    std::string report(size_t tail_bytes = 4000) const;
};

/** A function run in a child process; its return value is the child's exit code (clamped to 0..255; non-zero
 *  values that would wrap to 0 become 255). */
using ChildFn = std::function<int()>;

/**
 * Runs fn in one forked child with `env` set (setenv, overwriting) and returns its exit status: fn's return value,
 * 128 + the signal that ended it, or 128 + SIGALRM when it ran past deadline_s seconds (alarm(2) in the child).
 * For tests that need a fresh process (the memory layer decides once per process whether a CUDA driver exists).
 */
int run_in_child(const std::vector<std::pair<const char *, const char *>> &env, const ChildFn &fn,
                 unsigned deadline_s = 120);

/**
 * A set of forked child processes that share one deadline. Destroying a group SIGKILLs and reaps any child that
 * is still running.
 */
class ProcessGroup {
  public:
    explicit ProcessGroup(double deadline_s = 60.0);
    ~ProcessGroup();
    ProcessGroup(const ProcessGroup &) = delete;
    ProcessGroup &operator=(const ProcessGroup &) = delete;

    /** Forks a child that applies env, then runs fn and _exits with its code. Returns the child's index (or -1
     *  if fork failed; the failure is recorded in the result's setup_error). */
    int spawn(const std::string &name, ChildFn fn, const EnvList &env = {});

    size_t size() const;
    pid_t pid(int index) const;
    /** Sends sig to one child if it is still running. */
    void kill(int index, int sig);
    /** True while the child has not been reaped. */
    bool running(int index);
    /** Waits for one child until it exits or timeout_s passes (bounded by the group deadline). True if reaped. */
    bool wait_one(int index, double timeout_s);
    /** Waits for every child up to the group deadline; on timeout SIGKILLs the rest. Idempotent. */
    GroupResult wait_all();
    /** Seconds since the group was created. */
    double elapsed() const;
    /** Records a setup failure (reported by wait_all; makes the result fail). */
    void fail_setup(const std::string &why);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/** Body of a rank: returns 0 on success, non-zero on failure (after printing what failed on stderr). */
using RankBody = std::function<int(zccl_comm_t comm, int rank, int nranks)>;

struct Options {
    double deadline_s = 60.0;
    /** Environment overrides for every rank (e.g. {"ZCCL_TRANSPORT", "shm"}). */
    EnvList env;
    /** Extra per-rank overrides, applied after env (may be empty). */
    std::function<EnvList(int rank)> rank_env;
    /** When false the harness does not create a unique id or a communicator: the body gets comm == NULL and
     *  creates its own (zccl_comm_init_env tests, tests that pass a crafted id). */
    bool init_comm = true;
    /** Use this id instead of calling zccl_get_unique_id() in the parent. */
    std::optional<zccl_unique_id_t> id;
    /** When true (the default) run_ranks records a GoogleTest failure if any rank fails or the deadline passes. */
    bool expect_success = true;
};

/** The default options with deadline_s seconds for the ranks. */
inline Options deadline_options(double deadline_s) {
    Options o;
    o.deadline_s = deadline_s;
    return o;
}

/**
 * Runs body on nranks forked ranks (see the file comment) and waits for them with opts.deadline_s.
 * Records a GoogleTest failure naming the failed ranks, their status and output tails when opts.expect_success.
 */
GroupResult run_ranks(int nranks, RankBody body, const Options &opts = Options());

/**
 * Starts the ranks like run_ranks but returns at once so that the test can act on them (kill a rank, start an
 * extra process with group->spawn). Rank r is child index r. Call wait_all() on the group for the result.
 * *id_out (if not NULL) receives the id the ranks use.
 */
std::unique_ptr<ProcessGroup> start_ranks(int nranks, RankBody body, const Options &opts,
                                          zccl_unique_id_t *id_out = nullptr, std::string *error = nullptr);

/** Receives exactly len bytes from fd within timeout_s seconds; false on close, error or timeout. */
bool recv_exact(int fd, void *buf, size_t len, double timeout_s);

/** Shared anonymous memory mapped before fork, visible to the parent and every child (MAP_SHARED). */
class SharedMem {
  public:
    explicit SharedMem(size_t bytes);
    ~SharedMem();
    SharedMem(const SharedMem &) = delete;
    SharedMem &operator=(const SharedMem &) = delete;
    void *data() const { return p_; }
    size_t size() const { return n_; }
    template <class T> T *as() const { return static_cast<T *>(p_); }

  private:
    void *p_ = nullptr;
    size_t n_ = 0;
};

/**
 * A barrier for forked processes that does not depend on zccl: construct it (placement new) in a SharedMem before
 * forking. wait() returns false when the barrier was aborted by some process (abort(): e.g. a rank that hit a fatal
 * error, so that the others stop instead of waiting for it) or when timeout_s passed.
 */
class ShmBarrier {
  public:
    explicit ShmBarrier(int nprocs) : n_(nprocs) {}
    bool wait(double timeout_s = 60.0);
    void abort() { aborted_.store(1); }
    bool aborted() const { return aborted_.load() != 0; }

  private:
    std::atomic<int> count_{0};
    std::atomic<int> generation_{0};
    std::atomic<int> aborted_{0};
    int n_;
};

/** A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back, close). */
int free_tcp_port();

/** Child-side helper: printf-like diagnostic on stderr prefixed with "[rank R pid P] ". Thread-safe enough. */
void child_log(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Child-side report of a failed check: "FILE:LINE: check failed: COND: MESSAGE" on stderr in one write, prefixed
 *  as child_log's lines are when rank >= 0. Used by the ZT_ check macros below. */
void check_failed(int rank, const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/** Monotonic seconds. */
double now_s();

}  // namespace zt

/*
 * Checks for code that runs in a child process (a rank body, a forked helper), where GoogleTest assertions would go
 * unseen: when cond is false, report it (zt::check_failed, with a printf-style message) and return 1 from the
 * enclosing function, which the parent sees as the child's failed exit status.
 *   ZT_CHECK(cond, fmt, ...)        report on stderr
 *   ZT_CHILD_CHECK(cond, fmt, ...)  report prefixed with the rank (a variable `rank` in scope), as child_log does
 *   ZT_OK(call), ZT_CHILD_OK(call)  call must return ZCCL_SUCCESS; the report quotes its result and last error
 */
#define ZT_FAIL_IF(who, failed, what, ...)                                                                     \
    do {                                                                                                       \
        if (failed) {                                                                                          \
            zt::check_failed(who, __FILE__, __LINE__, what, __VA_ARGS__);                                      \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)
#define ZT_CHECK_AS(who, cond, ...) ZT_FAIL_IF(who, !(cond), #cond, __VA_ARGS__)
#define ZT_OK_AS(who, call)                                                                                    \
    do {                                                                                                       \
        zccl_result_t zt_res_ = (call);                                                                        \
        ZT_FAIL_IF(who, zt_res_ != ZCCL_SUCCESS, #call, "%s: %s", zccl_get_error_string(zt_res_),              \
                   zccl_get_last_error(nullptr));                                                              \
    } while (0)
#define ZT_CHECK(cond, ...) ZT_CHECK_AS(-1, cond, __VA_ARGS__)
#define ZT_CHILD_CHECK(cond, ...) ZT_CHECK_AS(rank, cond, __VA_ARGS__)
#define ZT_OK(call) ZT_OK_AS(-1, call)
#define ZT_CHILD_OK(call) ZT_OK_AS(rank, call)

#endif

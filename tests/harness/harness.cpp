/* harness.cpp — see harness.h. */
#include "harness/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <chrono>
#include <poll.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

#include <gtest/gtest.h>

namespace zt {

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void child_log(int rank, const char *fmt, ...) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "[rank %d pid %d] ", rank, (int)getpid());
    if (n < 0) n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : std::min((size_t)m, sizeof buf - (size_t)n - 2));
    if (len == 0 || buf[len - 1] != '\n') buf[len++] = '\n';
    ssize_t w = write(2, buf, len); /* one write: lines of concurrent ranks do not interleave */
    (void)w;
}

void check_failed(int rank, const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (rank >= 0) {
        child_log(rank, "%s:%d: check failed: %s: %s", file, line, cond, msg);
        return;
    }
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s:%d: check failed: %s: %s\n", file, line, cond, msg);
    size_t len = n < 0 ? 0 : std::min((size_t)n, sizeof buf - 1);
    if (len && buf[len - 1] != '\n') buf[len - 1] = '\n';
    ssize_t w = write(2, buf, len); /* one write, as child_log */
    (void)w;
}

/* ------------------------------------------------------------------------------------------------------------ */

std::string ProcStatus::describe() const {
    char b[160];
    if (killed_at_deadline) {
        snprintf(b, sizeof b, "killed at deadline (still running after %.1f s)", elapsed_s);
    } else if (exited) {
        snprintf(b, sizeof b, "exited with code %d after %.2f s", exit_code, elapsed_s);
    } else if (term_signal) {
        snprintf(b, sizeof b, "killed by signal %d (%s) after %.2f s", term_signal, strsignal(term_signal),
                 elapsed_s);
    } else {
        snprintf(b, sizeof b, "not started");
    }
    return b;
}

bool GroupResult::all_ok() const {
    if (!setup_error.empty() || deadline_exceeded) return false;
    for (const auto &p : procs)
        if (!p.ok()) return false;
    return true;
}

static std::string tail_of(const std::string &s, size_t n) {
    if (s.size() <= n) return s;
    return "...[" + std::to_string(s.size() - n) + " bytes cut]...\n" + s.substr(s.size() - n);
}

std::string GroupResult::report(size_t tail_bytes) const {
    std::ostringstream o;
    if (!setup_error.empty()) o << "setup failed: " << setup_error << "\n";
    if (deadline_exceeded) {
        std::vector<std::string> ranks, others;
        for (const auto &p : procs) {
            if (!p.killed_at_deadline) continue;
            if (p.name.rfind("rank ", 0) == 0) ranks.push_back(p.name.substr(5));
            else others.push_back(p.name);
        }
        o << "deadline exceeded (" << deadline_s << " s):";
        if (!ranks.empty()) {
            o << " ranks ";
            for (size_t i = 0; i < ranks.size(); i++) o << (i ? "," : "") << ranks[i];
        }
        for (const auto &n : others) o << " " << n;
        o << " still running\n";
    }
    for (const auto &p : procs) {
        if (p.ok()) continue;
        o << p.name << " (pid " << p.pid << "): " << p.describe() << "\n";
        if (!p.output.empty()) {
            std::string t = tail_of(p.output, tail_bytes);
            std::istringstream in(t);
            std::string line;
            while (std::getline(in, line)) o << "    | " << line << "\n";
        }
    }
    return o.str();
}

/* ------------------------------------------------------------------------------------------------------------ */

namespace {
struct Child {
    ProcStatus st;
    int out_fd = -1;
    double t_spawn = 0;
    bool reaped = false;
};

constexpr size_t kMaxOutput = 64 * 1024;

std::string read_output(int fd) {
    std::string s;
    if (fd < 0) return s;
    struct stat sb;
    if (fstat(fd, &sb) != 0) return s;
    off_t size = sb.st_size;
    off_t start = size > (off_t)kMaxOutput ? size - (off_t)kMaxOutput : 0;
    if (lseek(fd, start, SEEK_SET) < 0) return s;
    char buf[8192];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        s.append(buf, (size_t)r);
    }
    if (start > 0) s = "...[output truncated]...\n" + s;
    return s;
}

bool verbose() {
    const char *v = getenv("ZCCL_TEST_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}
}  // namespace

struct ProcessGroup::Impl {
    double deadline_s;
    double t0;
    std::vector<Child> kids;
    std::string setup_error;
    bool finished = false;
    GroupResult result;

    void reap(Child &c, int status) {
        c.reaped = true;
        c.st.elapsed_s = now_s() - c.t_spawn;
        if (WIFEXITED(status)) {
            c.st.exited = true;
            c.st.exit_code = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
            c.st.term_signal = WTERMSIG(status);
        }
        c.st.output = read_output(c.out_fd);
        if (c.out_fd >= 0) close(c.out_fd);
        c.out_fd = -1;
        if (verbose() && !c.st.output.empty())
            fprintf(stderr, "---- %s (pid %d) output ----\n%s", c.st.name.c_str(), (int)c.st.pid,
                    c.st.output.c_str());
    }

    /* Non-blocking poll of one child; true if it is (now) reaped. */
    bool poll(Child &c) {
        if (c.reaped) return true;
        if (c.st.pid <= 0) return true;
        int status = 0;
        pid_t r = waitpid(c.st.pid, &status, WNOHANG);
        if (r == c.st.pid) {
            reap(c, status);
            return true;
        }
        if (r < 0 && errno == ECHILD) { /* reaped elsewhere: should not happen */
            c.reaped = true;
            return true;
        }
        return false;
    }

    void kill_and_reap(Child &c, bool at_deadline) {
        if (c.reaped || c.st.pid <= 0) return;
        ::kill(c.st.pid, SIGKILL);
        int status = 0;
        pid_t r;
        do r = waitpid(c.st.pid, &status, 0);
        while (r < 0 && errno == EINTR);
        if (r == c.st.pid) reap(c, status);
        else c.reaped = true;
        c.st.killed_at_deadline = at_deadline;
    }
};

ProcessGroup::ProcessGroup(double deadline_s) : impl_(new Impl) {
    impl_->deadline_s = deadline_s;
    impl_->t0 = now_s();
}

ProcessGroup::~ProcessGroup() {
    for (auto &c : impl_->kids) impl_->kill_and_reap(c, false);
    for (auto &c : impl_->kids)
        if (c.out_fd >= 0) close(c.out_fd);
}

void ProcessGroup::fail_setup(const std::string &why) { impl_->setup_error += why + "; "; }

double ProcessGroup::elapsed() const { return now_s() - impl_->t0; }
size_t ProcessGroup::size() const { return impl_->kids.size(); }
pid_t ProcessGroup::pid(int index) const { return impl_->kids.at((size_t)index).st.pid; }

void ProcessGroup::kill(int index, int sig) {
    Child &c = impl_->kids.at((size_t)index);
    if (!impl_->poll(c)) ::kill(c.st.pid, sig);
}

bool ProcessGroup::running(int index) { return !impl_->poll(impl_->kids.at((size_t)index)); }

int ProcessGroup::spawn(const std::string &name, ChildFn fn, const EnvList &env) {
    Child c;
    c.st.name = name;
    c.out_fd = (int)memfd_create("zccl-test-output", 0);
    if (c.out_fd < 0) {
        FILE *f = tmpfile();
        if (f) c.out_fd = dup(fileno(f));
        if (f) fclose(f);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        impl_->setup_error += "fork(" + name + ") failed: " + strerror(errno) + "; ";
        if (c.out_fd >= 0) close(c.out_fd);
        return -1;
    }
    if (pid == 0) {
        /* ---- child: no GoogleTest from here on; leave only through _exit ---- */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(253);
        if (c.out_fd >= 0) {
            dup2(c.out_fd, 1);
            dup2(c.out_fd, 2);
            close(c.out_fd);
        }
        setvbuf(stdout, nullptr, _IOLBF, 0);
        setvbuf(stderr, nullptr, _IONBF, 0);
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, nullptr);
        for (const auto &kv : env) {
            if (kv.second) setenv(kv.first.c_str(), kv.second->c_str(), 1);
            else unsetenv(kv.first.c_str());
        }
        int rc = 254;
        try {
            rc = fn();
        } catch (const std::exception &e) {
            fprintf(stderr, "[%s pid %d] uncaught exception: %s\n", name.c_str(), (int)getpid(), e.what());
            rc = 254;
        } catch (...) {
            fprintf(stderr, "[%s pid %d] uncaught exception\n", name.c_str(), (int)getpid());
            rc = 254;
        }
        fflush(stdout);
        fflush(stderr);
        if (rc < 0 || rc > 255) rc = 255;
        _exit(rc);
    }
    c.st.pid = pid;
    c.t_spawn = now_s();
    impl_->kids.push_back(std::move(c));
    return (int)impl_->kids.size() - 1;
}

bool ProcessGroup::wait_one(int index, double timeout_s) {
    Child &c = impl_->kids.at((size_t)index);
    double end = std::min(now_s() + timeout_s, impl_->t0 + impl_->deadline_s);
    useconds_t nap = 500;
    for (;;) {
        if (impl_->poll(c)) return true;
        if (now_s() >= end) return false;
        usleep(nap);
        if (nap < 10000) nap *= 2;
    }
}

GroupResult ProcessGroup::wait_all() {
    Impl &m = *impl_;
    if (m.finished) return m.result;
    double end = m.t0 + m.deadline_s;
    useconds_t nap = 500;
    bool deadline = false;
    for (;;) {
        bool all = true;
        for (auto &c : m.kids) all = m.poll(c) && all;
        if (all) break;
        if (now_s() >= end) {
            deadline = true;
            break;
        }
        usleep(nap);
        if (nap < 10000) nap *= 2;
    }
    if (deadline)
        for (auto &c : m.kids) m.kill_and_reap(c, true);
    GroupResult r;
    r.deadline_exceeded = deadline;
    r.deadline_s = m.deadline_s;
    r.elapsed_s = now_s() - m.t0;
    r.setup_error = m.setup_error;
    for (auto &c : m.kids) r.procs.push_back(c.st);
    m.result = r;
    m.finished = true;
    return r;
}

/* ------------------------------------------------------------------------------------------------------------ */

std::unique_ptr<ProcessGroup> start_ranks(int nranks, RankBody body, const Options &opts,
                                          zccl_unique_id_t *id_out, std::string *error) {
    auto group = std::make_unique<ProcessGroup>(opts.deadline_s);
    zccl_unique_id_t id;
    memset(&id, 0, sizeof id);
    if (opts.id) {
        id = *opts.id;
    } else if (opts.init_comm) {
        zccl_result_t res = zccl_get_unique_id(&id);
        if (res != ZCCL_SUCCESS) {
            std::string e = std::string("zccl_get_unique_id failed: ") + zccl_get_error_string(res) + ": " +
                            zccl_get_last_error(nullptr);
            if (error) *error = e;
            group->fail_setup(e);
            return group;
        }
    }
    if (id_out) *id_out = id;
    const bool init = opts.init_comm;
    /* Ranks start only once all are forked: a child forked while the bootstrap root thread of this process
     * allocates can inherit a held allocator lock (gcc 12's AddressSanitizer does not guard fork). Each child waits
     * for end-of-file on this pipe, which comes when the parent closes its write end after the last fork. */
    int gate[2] = {-1, -1};
    if (pipe(gate) != 0) gate[0] = gate[1] = -1;
    for (int r = 0; r < nranks; r++) {
        EnvList env = opts.env;
        if (opts.rank_env) {
            EnvList extra = opts.rank_env(r);
            env.insert(env.end(), extra.begin(), extra.end());
        }
        group->spawn("rank " + std::to_string(r),
                     [=]() -> int {
                         if (gate[1] >= 0) {
                             close(gate[1]);
                             char c;
                             while (read(gate[0], &c, 1) < 0 && errno == EINTR) {
                             }
                             close(gate[0]);
                         }
                         zccl_comm_t comm = nullptr;
                         if (init) {
                             zccl_result_t res = zccl_comm_init_rank(&comm, nranks, id, r);
                             if (res != ZCCL_SUCCESS) {
                                 child_log(r, "zccl_comm_init_rank(nranks=%d, rank=%d) failed: %s: %s", nranks, r,
                                           zccl_get_error_string(res), zccl_get_last_error(nullptr));
                                 return 100;
                             }
                         }
                         int rc = body(comm, r, nranks);
                         if (comm) {
                             if (rc == 0) {
                                 zccl_result_t res = zccl_comm_destroy(comm);
                                 if (res != ZCCL_SUCCESS) {
                                     child_log(r, "zccl_comm_destroy failed: %s: %s", zccl_get_error_string(res),
                                               zccl_get_last_error(nullptr));
                                     rc = 101;
                                 }
                             } else {
                                 child_log(r, "body failed with code %d; aborting the communicator", rc);
                                 zccl_comm_abort(comm);
                             }
                         }
                         if (rc != 0 && (rc & 0xff) == 0) rc = 255;
                         return rc;
                     },
                     env);
    }
    if (gate[1] >= 0) close(gate[1]);
    if (gate[0] >= 0) close(gate[0]);
    return group;
}

GroupResult run_ranks(int nranks, RankBody body, const Options &opts) {
    std::unique_ptr<ProcessGroup> g = start_ranks(nranks, std::move(body), opts);
    GroupResult r = g->wait_all();
    if (opts.expect_success && !r.all_ok()) ADD_FAILURE() << "multi-process run of " << nranks << " ranks failed:\n"
                                                          << r.report();
    return r;
}

/* ------------------------------------------------------------------------------------------------------------ */

SharedMem::SharedMem(size_t bytes) : n_(bytes) {
    void *p = mmap(nullptr, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "SharedMem: mmap(%zu) failed: %s\n", bytes, strerror(errno));
        abort();
    }
    p_ = p;
}

SharedMem::~SharedMem() {
    if (p_) munmap(p_, n_ ? n_ : 1);
}

bool ShmBarrier::wait(double timeout_s) {
    if (aborted()) return false;
    const int gen = generation_.load();
    if (count_.fetch_add(1) + 1 == n_) {
        count_.store(0);
        generation_.fetch_add(1);
        return true;
    }
    const double end = now_s() + timeout_s;
    for (int spin = 0; generation_.load() == gen; spin++) {
        if (aborted()) return false;
        if (spin < 64) {
            sched_yield();
            continue;
        }
        if ((spin & 63) == 0 && now_s() > end) return false;
        usleep(50);
    }
    return true;
}

int free_tcp_port() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        socklen_t len = sizeof a;
        if (getsockname(fd, (struct sockaddr *)&a, &len) == 0) port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}


bool recv_exact(int fd, void *buf, size_t len, double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    size_t got = 0;
    while (got < len) {
        const double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
        if (left <= 0) return false;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t r = recv(fd, (char *)buf + got, len - got, MSG_DONTWAIT);
        if (r == 0) return false;
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            return false;
        }
        got += (size_t)r;
    }
    return true;
}

int run_in_child(const std::vector<std::pair<const char *, const char *>> &env, const ChildFn &fn,
                 unsigned deadline_s) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) return 127;
    if (pid == 0) {
        alarm(deadline_s);
        for (auto &e : env) setenv(e.first, e.second, 1);
        _exit(fn());
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

}  // namespace zt

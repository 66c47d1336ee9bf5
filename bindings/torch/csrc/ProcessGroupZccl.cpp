/*
 * ProcessGroupZccl.cpp — the "zccl" torch.distributed backend: its Work, construction through the store, the lane
 * threads, abort and shutdown. The operations are in collectives.cpp and p2p.cpp; argument checks run in the
 * caller's thread, the zccl calls and the local work around them on the lanes (see ProcessGroupZccl.hpp).
 */
#include <Python.h> /* first, as Python asks; only for releasing the GIL in the destructor */
#include <sched.h>

#include "ProcessGroupZccl.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "tensors.hpp"

#if ZCCL_TORCH_CUDA
#include <c10/core/impl/VirtualGuardImpl.h>
#endif

namespace zccl_torch {

/* ---- Work ---------------------------------------------------------------------------------------------------- */

WorkZccl::WorkZccl(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int spinUs)
    : c10d::Work(rank, type), spinUs_(spinUs), outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

std::vector<at::Tensor> WorkZccl::result() { return outputs_; }

int WorkZccl::sourceRank() const {
    const int r = source_.load();
    return r >= 0 ? r : c10d::Work::sourceRank(); /* the base class throws: not a receive from any source */
}

c10::intrusive_ptr<c10::ivalue::Future> WorkZccl::getFuture() { return future_; }

namespace {
/* Polls done() for up to us microseconds, yielding the core between looks. */
template <typename Done> void poll_yielding(int us, Done done) {
    if (us <= 0 || done()) return;
    const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    do
        sched_yield();
    while (!done() && std::chrono::steady_clock::now() < end);
}
} // namespace

bool WorkZccl::wait(std::chrono::milliseconds timeout) {
    poll_yielding(spinUs_, [this] { return done_.load(std::memory_order_acquire); });
    return c10d::Work::wait(timeout); /* returns at once when done: torch's checks and the error */
}

void WorkZccl::complete(std::exception_ptr error) {
    finish(error);
    done_.store(true, std::memory_order_release);
    if (error)
        future_->setError(error);
    else
        future_->markCompleted(c10::IValue(outputs_));
}

/* ---- construction: ids through the store --------------------------------------------------------------------- */

namespace {

zccl_comm_t init_comm(c10d::Store &store, const std::string &key, int rank, int size,
                      std::vector<uint8_t> *uid = nullptr) {
    zccl_unique_id_t id;
    if (rank == 0) {
        if (zccl_get_unique_id(&id) != ZCCL_SUCCESS)
            throw std::runtime_error(std::string("zccl_torch: zccl_get_unique_id failed: ") +
                                     zccl_get_last_error(nullptr));
        std::vector<uint8_t> bytes(reinterpret_cast<uint8_t *>(&id), reinterpret_cast<uint8_t *>(&id) + sizeof id);
        store.set(key, bytes);
    } else {
        std::vector<uint8_t> bytes = store.get(key); /* waits up to the store's timeout */
        if (bytes.size() != sizeof id)
            throw std::runtime_error("zccl_torch: store key '" + key + "' holds " + std::to_string(bytes.size()) +
                                     " bytes, not a zccl unique id (" + std::to_string(sizeof id) + " bytes)");
        std::memcpy(&id, bytes.data(), sizeof id);
    }
    if (uid) uid->assign(reinterpret_cast<uint8_t *>(&id), reinterpret_cast<uint8_t *>(&id) + sizeof id);
    zccl_comm_t comm = nullptr;
    zccl_result_t res = zccl_comm_init_rank(&comm, size, id, rank);
    if (res != ZCCL_SUCCESS)
        throw std::runtime_error(std::string("zccl_torch: creating the communicator failed on rank ") +
                                 std::to_string(rank) + " of " + std::to_string(size) + ": " +
                                 zccl_get_error_string(res) + ": " + zccl_get_last_error(nullptr));
    return comm;
}

} // namespace

ProcessGroupZccl::ProcessGroupZccl(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : BackendBase(rank, size), store_(store), timeout_(timeout) {
    if (const char *e = std::getenv("ZCCL_TORCH_SPIN_US")) { /* before any communicator exists */
        char *end = nullptr;
        const long v = std::strtol(e, &end, 10);
        if (!*e || *end || v < 0 || v > 1000000)
            throw std::invalid_argument(std::string("zccl_torch: ZCCL_TORCH_SPIN_US=") + e +
                                        ": not a number of microseconds from 0 to 1000000");
        spinUs_ = static_cast<int>(v);
    }
    /* The process group's timeout becomes zccl's collective deadline (read when a communicator is created),
     * unless the user set ZCCL_TIMEOUT_MS. */
    const bool set_timeout = std::getenv("ZCCL_TIMEOUT_MS") == nullptr && timeout.count() > 0;
    if (set_timeout) setenv("ZCCL_TIMEOUT_MS", std::to_string(timeout.count()).c_str(), 1);
    std::vector<uint8_t> uid;
    try {
        lanes_[0].comm = init_comm(*store_, "zccl_torch/uid/0", rank, size, &uid);
        lanes_[1].comm = init_comm(*store_, "zccl_torch/uid/1", rank, size);
    } catch (...) {
        if (set_timeout) unsetenv("ZCCL_TIMEOUT_MS");
        if (lanes_[0].comm) zccl_comm_destroy(lanes_[0].comm);
        throw;
    }
    if (set_timeout) unsetenv("ZCCL_TIMEOUT_MS");
    received_.reset(new std::atomic<uint64_t>[static_cast<size_t>(size)]);
    for (int r = 0; r < size; r++) received_[r] = 0;
    if (size > 1) { /* collective: also where ZCCL_TORCH_ANY_SOURCE=0, which may differ between ranks */
        try {
            setupAnnouncements(uid);
        } catch (...) {
            releaseAnnouncements();
            zccl_comm_destroy(lanes_[1].comm);
            zccl_comm_destroy(lanes_[0].comm);
            throw;
        }
    }
    cpu_set_t set;
    const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    const int local = std::max(nLocal_, 1);
    /* Unbound ranks whose callers and lanes outnumber the CPUs: the scheduler sometimes puts one rank's caller
     * beside another rank's lane, and every call of that job runs about 2x slower (docs/torch.md, "Bind the
     * ranks"). Said once per process, on the first group only, where binding would fit (a CPU per local rank). */
    static bool hinted = false;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (!hinted && local > 1 && 2 * local > cpus && local <= cpus && online > 0 && cpus >= online) {
        hinted = true;
        TORCH_WARN("zccl_torch: rank ", rank, " is not bound to CPUs (it may run on all ", cpus, ") while ", local,
                   " ranks share this host: bind each rank to its own CPUs (zcclrun does by default; under torchrun, "
                   "e.g. os.sched_setaffinity from LOCAL_RANK before init_process_group), or calls can run about "
                   "2x slower when the scheduler places two ranks' threads on one CPU (docs/torch.md)");
    }
    if (spinUs_ < 0) { /* auto (see "Waiting" in ProcessGroupZccl.hpp) */
        spinUs_ = (local > cpus || cpus >= 2 * local) ? 250 : 0;
    }
    regs_->comm = lanes_[0].comm;
    for (int i = 0; i < 2; i++) lanes_[i].thread = std::thread([this, i] { runLane(i); });
}

/* Collective, on lanes_[0].comm before the lanes start: the ranks learn which of them share this host (an all-gather
 * of a host id), the first of each host's ranks creates the segment of counters, the others map it, and every rank
 * then agrees (all-reduce MIN) whether all of them have it; if one does not (no /dev/shm room), every announcement
 * goes through the store instead. */
void ProcessGroupZccl::setupAnnouncements(const std::vector<uint8_t> &uid) {
    const char *any = std::getenv("ZCCL_TORCH_ANY_SOURCE");
    anySource_ = !(any && std::strcmp(any, "0") == 0);
    const bool through_store = any && std::strcmp(any, "store") == 0;
    std::string host = "?";
    char name[256] = {0};
    if (gethostname(name, sizeof name - 1) == 0) host = name;
    if (FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) { /* two containers may share a name */
        char boot[64] = {0};
        if (std::fgets(boot, sizeof boot, f)) host += boot;
        std::fclose(f);
    }
    uint64_t mine = std::hash<std::string>()(host), id = 1469598103934665603ull;
    for (uint8_t b : uid) id = (id ^ b) * 1099511628211ull;
    std::vector<uint64_t> hosts(static_cast<size_t>(size_));
    zcheck(zccl_allgather(&mine, hosts.data(), 1, ZCCL_UINT64, lanes_[0].comm, nullptr));
    localIndex_.assign(static_cast<size_t>(size_), -1);
    int first = -1;
    for (int r = 0; r < size_; r++)
        if (hosts[r] == mine) {
            if (first < 0) first = r;
            localIndex_[r] = nLocal_++;
        }
    char shm[96];
    std::snprintf(shm, sizeof shm, "/zccl_torch_%016llx_%08llx", static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(mine & 0xffffffffu));
    const size_t bytes = static_cast<size_t>(nLocal_) * nLocal_ * sizeof(uint64_t);
    void *p = MAP_FAILED;
    if (rank_ == first && nLocal_ > 1) {
        int fd = shm_open(shm, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0) {
            if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
                p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
        }
    }
    zccl_result_t bres = zccl_barrier(lanes_[0].comm, nullptr); /* created before the others open it */
    if (bres != ZCCL_SUCCESS) {
        if (p != MAP_FAILED) {
            shm_unlink(shm);
            munmap(p, bytes);
        }
        zcheck(bres);
    }
    if (rank_ != first && nLocal_ > 1) {
        int fd = shm_open(shm, O_RDWR, 0600);
        if (fd >= 0) {
            p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
        }
    }
    /* [0]: every rank mapped it ("store" on one rank: the store for all); [1]: no rank turned announcements off */
    uint64_t ok[2] = {!through_store && (nLocal_ <= 1 || p != MAP_FAILED), anySource_}, all[2] = {0, 0};
    zccl_result_t res = zccl_allreduce(ok, all, 2, ZCCL_UINT64, ZCCL_MIN, lanes_[0].comm, nullptr);
    if (rank_ == first && nLocal_ > 1) shm_unlink(shm); /* after the others opened it, or failed to */
    zcheck(res);
    anySource_ = all[1] != 0;
    if (p != MAP_FAILED) {
        localCounters_ = static_cast<uint64_t *>(p);
        localBytes_ = bytes;
    }
    if (!all[0] || nLocal_ <= 1) releaseAnnouncements(); /* the store for every pair, on every rank alike */
}

void ProcessGroupZccl::releaseAnnouncements() {
    if (localCounters_) munmap(localCounters_, localBytes_);
    localCounters_ = nullptr;
}

void ProcessGroupZccl::dropRegistrations() {
    std::lock_guard<std::mutex> g(regs_->mutex); /* waits for a deleter that is deregistering now */
    regs_->comm = nullptr; /* destroying or aborting the communicator ends its registrations */
}

at::Tensor ProcessGroupZccl::emptyRegistered(int64_t numel, at::ScalarType dtype) {
    const char *op = "empty_registered";
    if (numel < 0) refuse(op, "numel " + std::to_string(numel) + " is negative");
    const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
    if (esize <= 0) refuse(op, std::string("dtype ") + c10::toString(dtype) + " has no fixed element size");
    if (numel > INT64_MAX / esize) refuse(op, "numel " + std::to_string(numel) + " elements overflow a byte count");
    const size_t bytes = static_cast<size_t>(numel * esize);
    std::shared_ptr<Registrations> regs = regs_;
    std::lock_guard<std::mutex> g(regs->mutex);
    if (!regs->comm || shut_ || aborted_) refuse(op, "the process group was shut down or aborted");
    void *p = nullptr;
    zccl_result_t res = zccl_mem_alloc(&p, bytes);
    if (res != ZCCL_SUCCESS)
        throw std::runtime_error(std::string("zccl_torch: empty_registered: zccl_mem_alloc of ") +
                                 std::to_string(bytes) + " bytes failed: " + zccl_get_last_error(nullptr));
    void *handle = nullptr;
    res = zccl_comm_register(regs->comm, p, bytes ? bytes : 1, &handle);
    if (res != ZCCL_SUCCESS) {
        std::string why = zccl_get_last_error(regs->comm);
        zccl_mem_free(p);
        throw std::runtime_error("zccl_torch: empty_registered: zccl_comm_register failed: " + why);
    }
    auto deleter = [regs, handle](void *ptr) {
        bool keep = false;
        {
            std::lock_guard<std::mutex> lk(regs->mutex);
            if (regs->comm) {
                zccl_result_t r = zccl_comm_deregister(regs->comm, handle);
                /* a peer that could not be told may still map the block: it is freed only with the process */
                if (r == ZCCL_REMOTE_ERROR || r == ZCCL_INVALID_USAGE) {
                    keep = true;
                    TORCH_WARN("zccl_torch: a registered tensor's memory is kept until the process ends: ",
                               zccl_get_last_error(regs->comm));
                }
            }
        }
        if (!keep) zccl_mem_free(ptr);
    };
    return at::from_blob(p, {numel}, deleter, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

ProcessGroupZccl::~ProcessGroupZccl() {
    /* Python drops the last reference with the GIL held (destroy_process_group). Joining the lanes and closing
     * the communicators must not hold it: a lane may be completing a future whose callbacks need it, and other
     * Python threads (multiprocessing's queue feeder) would stall meanwhile. */
    PyThreadState *saved = nullptr;
    if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
    shutdown();
    releaseAnnouncements(); /* here, not in shutdown(): a send racing shutdown() may still add to a counter */
    if (saved) PyEval_RestoreThread(saved);
}

void ProcessGroupZccl::stopLanes() {
    for (auto &l : lanes_) {
        {
            std::lock_guard<std::mutex> g(l.mutex);
            l.stop = true;
        }
        l.cv.notify_all();
    }
    for (auto &l : lanes_)
        if (l.thread.joinable()) l.thread.join();
    std::thread announcer;
    { /* the announcements of the sends queued so far still reach the store, unless the group was aborted (then
       * nobody waits for them, and the store may be what failed) */
        std::lock_guard<std::mutex> g(announcer_.mutex);
        announcer_.stop = true;
        if (aborted_) announcer_.dsts.clear();
        announcer = std::move(announcer_.thread);
    }
    announcer_.cv.notify_all();
    if (announcer.joinable()) announcer.join();
}

void ProcessGroupZccl::shutdown() {
    std::lock_guard<std::mutex> once(shutdownMutex_);
    if (shut_) return;
    shut_ = true;
    if (!block_.works.empty()) { /* a coalescing block that was never ended: nothing of it ran */
        auto err = std::make_exception_ptr(std::runtime_error(
            "zccl_torch: the process group was shut down inside a coalescing block (endCoalescing was not called)"));
        for (auto &w : block_.works) w->complete(err);
        block_ = Job();
        blockDepth_ = 0;
    }
    stopLanes(); /* the lanes finish what is queued first */
    dropRegistrations();
    if (!aborted_)
        for (auto &l : lanes_) {
            /* a communicator broken by a lost peer or a deadline has nothing left to complete: abort it, which
             * closes its connections without waiting for anyone */
            zccl_result_t broken = ZCCL_SUCCESS;
            zccl_comm_get_async_error(l.comm, &broken);
            if (broken != ZCCL_SUCCESS)
                zccl_comm_abort(l.comm);
            else
                zccl_comm_destroy(l.comm);
        }
    for (auto &l : lanes_) l.comm = nullptr;
}

/* zccl_comm_abort frees the communicator and may be called while another thread is blocked inside one of its
 * calls. Each lane checks `aborted_` under its mutex before it starts a job, and abort() holds that mutex while it
 * aborts the lane's communicator, so an idle lane never touches a freed one. A busy lane is normally blocked inside
 * zccl (the reason to abort), which the abort wakes; a job made of several zccl calls (a coalescing block, bitwise
 * reductions, PREMUL_SUM's handle creation) that is between two of them at that instant can still reach the freed communicator: zccl's API has
 * no way to close that window until it offers an abort that does not free. */
void ProcessGroupZccl::abort() {
    {
        std::lock_guard<std::mutex> once(shutdownMutex_);
        if (shut_ || aborted_) return;
        dropRegistrations();
        for (auto &l : lanes_) {
            std::lock_guard<std::mutex> g(l.mutex);
            aborted_ = true;
            zccl_comm_abort(l.comm); /* blocked calls return within ~50 ms; queued jobs fail without running */
        }
    }
    shutdown();
}

/* ---- lanes ----------------------------------------------------------------------------------------------------- */

namespace {
/* Set on a lane while it runs a single send ahead of an undecided receive from any source (runAnyJob). */
thread_local bool t_undecidedAny = false;
/* What an operation that a lane did not run because of abort() completes with. */
std::exception_ptr aborted_error() {
    return std::make_exception_ptr(std::runtime_error("zccl_torch: the process group was aborted"));
}
/* Waits for w without holding the GIL: the lane completes w's future, whose callbacks (DDP's Python comm hooks) may
 * need it. */
void wait_unlocked(WorkZccl &w) {
    if (!Py_IsInitialized() || !PyGILState_Check()) {
        w.wait();
        return;
    }
    PyThreadState *st = PyEval_SaveThread();
    try {
        w.wait();
    } catch (...) {
        PyEval_RestoreThread(st);
        throw;
    }
    PyEval_RestoreThread(st);
}
} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::enqueue(int lane, c10d::OpType type, const char *name,
                                                         std::vector<at::Tensor> outputs, Post fn) {
    if (shut_ || aborted_) refuse(name, "the process group was shut down or aborted");
    seq_++;
    auto work = c10::make_intrusive<WorkZccl>(rank_, type, std::move(outputs), spinUs_);
    Job single;
    Job &job = inBlock() ? block_ : single; /* in a block: recorded, queued by the outermost endBlock */
    int cuda_device = -1;
    for (const auto &t : work->result())
        if (t.defined() && t.device().is_cuda()) cuda_device = t.device().index();
    if (cuda_device >= 0) job.cuda_device = cuda_device;
    job.works.push_back(work);
    job.names.emplace_back(name);
    job.posts.push_back(std::move(fn));
    single.runahead = type == c10d::OpType::SEND;
    if (!inBlock() && t_undecidedAny && type == c10d::OpType::RECV)
        refuse(name, "a receive issued by a callback of a send that runs while a receive from any source waits for "
                     "its sender would overtake it; issue it after that receive has completed");
    if (!inBlock() && std::this_thread::get_id() == lanes_[lane].thread.get_id()) {
        /* Called on the lane's own thread: a future callback (the lane completes futures, running their callbacks)
         * that issues an operation and waits for it, as PowerSGD's hook does. Queued, it would wait for ever behind
         * the job that runs the callback; it runs here and now instead, between two jobs of the lane, which is the
         * same point in the lane's order on every rank (the callback of the same operation). */
        runJob(lanes_[lane], single);
    } else if (!inBlock()) {
        push(lane, std::move(single));
        if (cuda_device >= 0) wait_unlocked(*work); /* device memory: complete on return (ProcessGroupZccl.hpp) */
    }
    return work;
}

c10::intrusive_ptr<WorkZccl> ProcessGroupZccl::endBlock(c10d::OpType type, const char *name,
                                                        std::vector<at::Tensor> outputs) {
    if (!inBlock()) refuse(name, "no coalescing block is open (startCoalescing was not called)");
    auto work = c10::make_intrusive<WorkZccl>(rank_, type, std::move(outputs), spinUs_);
    block_.works.push_back(work);
    block_.names.emplace_back(name);
    block_.posts.emplace_back(); /* completes with the block */
    if (--blockDepth_ == 0) {
        Job job = std::move(block_);
        block_ = Job();
        job.grouped = true;
        if (shut_ || aborted_) {
            auto err = std::make_exception_ptr(
                std::runtime_error(std::string("zccl_torch: ") + name + ": the process group was shut down or aborted"));
            for (auto &w : job.works) w->complete(err);
        } else {
            const bool cuda = job.cuda_device >= 0;
            push(0, std::move(job));
            if (cuda) wait_unlocked(*work);
        }
    }
    return work;
}

void ProcessGroupZccl::push(int lane, Job job) {
    Lane &l = lanes_[lane];
    {
        std::lock_guard<std::mutex> g(l.mutex);
        l.queue.push_back(std::move(job));
        l.pushed.fetch_add(1, std::memory_order_release);
    }
    l.cv.notify_one(); /* no system call while the lane polls (no waiter on the condition variable) */
}

namespace {

/* Runs body; an error comes back as one exception whose message names the operation, the rank and zccl's
 * message: c10::DistBackendError where torch has it (>= 2.1; Python sees torch.distributed.DistBackendError, a
 * RuntimeError), else std::runtime_error. A deadline that passed says " Timed out " and " timeout " (what torch's
 * own tests and its users match, as with gloo and NCCL). */
std::exception_ptr backend_error(const std::string &msg) {
#if ZCCL_TORCH_DIST_BACKEND_ERROR
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
#else
    return std::make_exception_ptr(std::runtime_error(msg));
#endif
}

std::exception_ptr guarded(const std::string &what, int rank, int size, const std::function<void()> &body) {
    const std::string where = "zccl_torch: " + what + " failed on rank " + std::to_string(rank) + " of " +
                              std::to_string(size) + ": ";
    try {
        body();
    } catch (const ZcclFailure &f) {
        if (f.result == ZCCL_TIMEOUT)
            return backend_error(where + "Timed out waiting for a peer (" + zccl_get_error_string(f.result) +
                                 "; zccl's timeout is ZCCL_TIMEOUT_MS, the process group's timeout unless set): " +
                                 f.message);
        return backend_error(where + zccl_get_error_string(f.result) + ": " + f.message);
    } catch (const std::exception &e) {
        return backend_error(where + e.what());
    } catch (...) {
        return backend_error(where + "unknown error");
    }
    return nullptr;
}

} // namespace

void ProcessGroupZccl::runJob(Lane &l, Job &job) {
    std::exception_ptr error;
    if (!job.grouped) {
        error = guarded(job.names[0], rank_, size_, [&] {
            Finish f = job.posts[0](l.comm);
            if (f) f();
        });
    } else {
        /* The block's name in messages: "coalesced block of 3 operations (allreduce, send, recv)". */
        std::string what;
        size_t ops = 0;
        for (size_t i = 0; i < job.posts.size(); i++)
            if (job.posts[i]) what += (ops++ ? ", " : "") + job.names[i];
        what = "coalesced block of " + std::to_string(ops) + " operation" + (ops == 1 ? "" : "s") + " (" + what + ")";
        std::vector<Finish> finishes;
        error = guarded(what + ": zccl_group_start", rank_, size_, [] { zcheck(zccl_group_start()); });
        if (!error) {
            for (size_t i = 0; i < job.posts.size() && !error; i++)
                if (job.posts[i])
                    error = guarded(what + ": recording " + job.names[i], rank_, size_,
                                    [&] { finishes.push_back(job.posts[i](l.comm)); });
            /* always closed, also after a recording error (the calls recorded so far then run; the peers' matching
             * calls would otherwise wait for them until zccl's deadline) */
            std::exception_ptr end = guarded(what, rank_, size_, [] { zcheck(zccl_group_end()); });
            if (!error) error = end;
        }
        for (size_t i = 0; i < finishes.size() && !error; i++)
            if (finishes[i]) error = guarded(what, rank_, size_, finishes[i]);
    }
#if ZCCL_TORCH_CUDA
    if (job.cuda_device >= 0 && !error) { /* the local torch work around the zccl calls, on this thread's stream */
        error = guarded(job.names[0], rank_, size_, [&] {
            c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).synchronizeDevice(
                static_cast<c10::DeviceIndex>(job.cuda_device));
        });
    }
#endif
    /* The calls' closures hold their tensors: drop them before the waiters wake, so a tensor the caller deletes
     * after wait() is freed by that delete (a registered tensor's block goes back at once), not later by this
     * thread. The Works themselves still hold their outputs until this thread lets go of them, just after. */
    job.posts.clear();
    for (auto &w : job.works) w->complete(error);
}

/* A lane's part of a receive from any source (ProcessGroupZccl.hpp, "Receive from any source"). Each lane waits
 * here until a sender is chosen; meanwhile it runs the single sends at the front of its queue, and once both lanes
 * are here (every earlier operation has run), they take turns looking at the counters (pollSource). The lane that carries messages
 * from the chosen sender receives; an error (no announcement before the deadline, an abort, the store) is reported
 * by the lane that met it. */
void ProcessGroupZccl::runAnyJob(int lane, Job &job) {
    std::shared_ptr<AnyRecv> a = job.any;
    const std::string &name = job.names[0];
    Lane &l = lanes_[lane];
    {
        std::lock_guard<std::mutex> g(a->mutex);
        if (++a->arrived == 1) a->since = std::chrono::steady_clock::now();
    }
    bool reporter = false;
    auto pause = std::chrono::microseconds(20);
    while (!a->decided) {
        Job ahead;
        bool have = false;
        {
            std::lock_guard<std::mutex> g(l.mutex);
            if (!aborted_ && !l.queue.empty() && l.queue.front().runahead) {
                ahead = std::move(l.queue.front());
                l.queue.pop_front();
                have = true;
            }
        }
        if (have) {
            t_undecidedAny = true; /* its callbacks may not receive inline meanwhile (enqueue) */
            runJob(l, ahead);
            t_undecidedAny = false;
            continue;
        }
        bool mine = false;
        {
            std::lock_guard<std::mutex> g(a->mutex);
            if (!a->decided && a->arrived == 2 && !a->polling) mine = a->polling = true;
        }
        if (mine) {
            int src = -1;
            bool found = false;
            std::exception_ptr error =
                aborted_ ? aborted_error() : guarded(name, rank_, size_, [&] { found = pollSource(name, a->since, &src); });
            bool now = false;
            {
                std::lock_guard<std::mutex> g(a->mutex);
                a->polling = false;
                if (error || found) {
                    a->src = src;
                    a->error = error;
                    a->decided = now = true;
                    reporter = error != nullptr;
                }
            }
            if (now) {
                for (auto &other : lanes_) { /* wake the other lane (its wait below) */
                    std::lock_guard<std::mutex> g(other.mutex);
                    other.cv.notify_all();
                }
                break;
            }
        }
        std::unique_lock<std::mutex> g(l.mutex);
        l.cv.wait_for(g, pause, [&] { return a->decided || (!l.queue.empty() && l.queue.front().runahead); });
        pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
    if (a->error) {
        if (reporter) {
            job.posts.clear();
            for (auto &w : job.works) w->complete(a->error);
        }
        return;
    }
    const int src = a->src;
    if (lane != (src < rank_ ? 0 : 1)) return;
    bool aborted;
    {
        std::lock_guard<std::mutex> g(l.mutex); /* as runLane before a job: abort() frees the comm under it */
        aborted = aborted_;
    }
    std::exception_ptr error =
        aborted ? aborted_error() : guarded(name, rank_, size_, [&] { a->recv(l.comm, src); });
    a->recv = nullptr; /* drops the tensors before the waiters wake, as runJob does */
    for (auto &w : job.works) {
        w->setSourceRank(src);
        w->complete(error);
    }
}

void ProcessGroupZccl::runLane(int lane) {
    Lane &l = lanes_[lane];
    at::NoGradGuard no_grad; /* in-place copies into tensors that require grad (DDP's buckets do not) */
    uint64_t taken = 0; /* jobs this lane took from its queue */
    for (;;) {
        Job job;
        bool aborted = false;
        poll_yielding(spinUs_, [&] { return l.pushed.load(std::memory_order_acquire) != taken; });
        {
            std::unique_lock<std::mutex> g(l.mutex);
            l.cv.wait(g, [&] { return l.stop || !l.queue.empty(); });
            if (l.queue.empty()) return;
            job = std::move(l.queue.front());
            l.queue.pop_front();
            taken++;
            aborted = aborted_; /* under the lane's mutex: see abort() */
        }
        if (job.any) {
            runAnyJob(lane, job); /* both lanes pass through it, aborted or not */
        } else if (aborted) {
            auto error = aborted_error();
            for (auto &w : job.works) w->complete(error);
        } else {
            runJob(l, job);
        }
    }
}

} // namespace zccl_torch

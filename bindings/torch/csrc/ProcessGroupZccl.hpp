/*
 * ProcessGroupZccl.hpp — a torch.distributed backend ("zccl") on top of zccl's public C API (include/zccl.h).
 *
 * One source for two torch generations: torch 1.x derives custom backends from c10d::ProcessGroup, torch 2.x from
 * c10d::Backend (wrapped by a ProcessGroup that dispatches on device). TORCH_VERSION_MAJOR from torch/version.h
 * picks the base; the operation signatures are the same in both.
 *
 * Execution. Every operation returns a Work at once and runs on a worker thread of the process group ("lane"),
 * which calls zccl's blocking functions and then does the local work around them (copies out of non-contiguous
 * tensors, bitwise reductions). zccl's streams would run the zccl calls alone, and a communicator may be driven by
 * one thread at a time, so one thread per communicator is the simpler equivalent.
 *
 * An operation is a "Post": run on the lane, it issues its zccl calls and returns a "Finish" (possibly empty), the
 * local work that needs their results. Alone, the Finish runs right after the Post. In a coalescing block
 * (startCoalescing/endCoalescing, torch 1.13's batch_isend_irecv, and the *_coalesced operations) the Posts are
 * collected on the caller's thread and run as ONE job on lane 0: zccl_group_start, every Post (zccl records the
 * calls), zccl_group_end (zccl runs them together: all send/recv of the block progress concurrently in any posting
 * order, then the collectives in order), then every Finish; the Works of the block complete together.
 *
 * Device memory (torch >= 2.4). CUDA tensors go to the same lanes, whose zccl calls take device pointers: zccl
 * waits for the work already queued on the device before it reads them and returns with the result in device memory
 * (docs/gpu.md, "How a call on device memory runs"). The lane then synchronizes the device, which covers the local
 * torch work it queued around the calls, and the caller's thread waits for the job before the operation returns: a
 * CUDA operation is complete when it returns, so kernels the caller queues afterwards, on any stream, see its result.
 * Correct and simple, not overlapped: binding the operation to the caller's current stream instead (zccl's CUDA
 * stream order) is the next step. Compiled against torch 1.13 (CPU) here; never run on a GPU yet.
 *
 * A future's callbacks run on the lane that completed it; an operation such a callback issues on that same lane
 * runs at once on it (inside the callback), so that a callback may wait for it (PowerSGD's hook does).
 *
 * Lane 0 (communicator comms_[0]) runs the collectives, the coalescing blocks and single point-to-point messages
 * from a lower to a higher rank; lane 1 (comms_[1], a second communicator of the same ranks) runs single messages
 * from a higher to a lower rank, so that two ranks that both isend() before they irecv() outside a block do not
 * deadlock on zccl's blocking send. Messages sent in a block are received in a block (they travel on comms_[0]).
 *
 * Receive from any source (recvAnysource; csrc/p2p.cpp). zccl receives only from a named rank, so the senders
 * announce their messages: each single send (outside a block) adds 1 to a counter of the pair (S, D), in a
 * shared-memory segment of the group when D is on the sender's host (one atomic add), else in the process group's
 * store ("zccl_torch/p2p/S/D"), on a helper thread ("announcer") so that the send never waits for the store. An
 * any-source receive is queued on BOTH lanes; once both have reached it (every earlier receive has run, no later one
 * has started) the lanes take turns looking at the counters until some rank S has announced more messages to this
 * rank than this rank has received from S (outside blocks; counted when each receive runs), pick one such S (round
 * robin), and the lane that carries messages from S receives it while the other lane goes on. So a message is
 * received from any source in the order its sender sent it, and a named receive posted after it gets the sender's
 * next one. While no sender is chosen, single sends queued right behind the job on either lane run ahead of it (a
 * rank may irecv() from any source and then isend(), as with gloo: every rank of a ring doing so would otherwise
 * wait for ever); nothing else passes it. ZCCL_TORCH_ANY_SOURCE=0 on any rank turns the announcements off and
 * recvAnysource is then refused; =store announces every send through the store, as if every rank were on its own
 * host (the tests use it).
 *
 * Waiting. A caller in Work.wait() and an idle lane first poll (the Work's done flag; the lane's count of queued
 * jobs) for up to ZCCL_TORCH_SPIN_US microseconds, with sched_yield between looks, and only then sleep on a condition
 * variable. Waking a sleeping caller cost the lane 10-20 us per operation on the 2-core VM (measured around
 * c10d::Work::finish), which is most of a 256 KiB operation's overhead; a polling waiter needs no wake-up, and a
 * polling lane needs none from push(). Auto (-1) polls 250 us when the host has more of the group's ranks than CPUs
 * (zccl's own waits then yield too: ZCCL_WAIT_YIELD) or at least two CPUs per rank, and not at all when the ranks fit
 * the CPUs with fewer than two each: there zccl's waits poll without yielding (ZCCL_SPIN_US), and callers polling
 * beside them made 4 KiB-1 MiB calls at 2 ranks on 2 CPUs up to 8x slower (docs/torch.md, "Waiting").
 */
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <zccl.h>

namespace zccl_torch {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

/* A Work completed by the lane thread: finish() wakes wait(), then the future is marked (DDP's comm hooks chain
 * on it) with the output tensors or with the error. */
class WorkZccl : public c10d::Work {
  public:
    /* spinUs: how long wait() polls first (the group's ZCCL_TORCH_SPIN_US, "Waiting" above). */
    WorkZccl(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int spinUs);
    std::vector<at::Tensor> result() override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
    void complete(std::exception_ptr error);
    /* Polls for up to the group's ZCCL_TORCH_SPIN_US, handing the core over between looks (sched_yield), before
     * torch's own wait on a condition variable: see "Waiting" below. */
    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    /* The sender of a receive from any source (recvAnysource), set before complete(); -1 otherwise, and then
     * sourceRank() throws as torch's base class does. */
    int sourceRank() const override;
    void setSourceRank(int r) { source_ = r; }

  private:
    std::atomic<int> source_{-1};
    std::atomic<bool> done_{false}; /* set by complete(), after torch's finish() */
    const int spinUs_;
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupZccl : public BackendBase {
  public:
    /* Collective over the group: rank 0 creates zccl unique ids and publishes them through store. */
    ProcessGroupZccl(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                     std::chrono::milliseconds timeout);
    ~ProcessGroupZccl() override;

    const std::string getBackendName() const override { return "zccl"; }

    /* Sequence numbers, as gloo keeps them: every operation the caller issues counts one (in issue order, the
     * same on every rank of a correct program); torch asks for them (object collectives on subgroups, its
     * desync debugging) and refuses a backend without them. set...() restarts the count at 0. */
    void setSequenceNumberForGroup() override { seq_ = 0; }
    uint64_t getSequenceNumberForGroup() override { return seq_; }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
    /* torch >= 2.7 asks before it coalesces batch_isend_irecv on a non-NCCL backend: zccl groups them. */
    bool supportsCoalescing() const override { return true; }
#endif

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts = c10d::BroadcastOptions()) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts = c10d::AllreduceOptions()) override;
    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor> &tensors,
        const c10d::AllreduceCoalescedOptions &opts = c10d::AllreduceCoalescedOptions()) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts = c10d::ReduceOptions()) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &opts = c10d::AllgatherOptions()) override;
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &opts = c10d::AllgatherOptions())
        override;
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputLists,
                                                       std::vector<at::Tensor> &inputs,
                                                       const c10d::AllgatherOptions &opts = c10d::AllgatherOptions())
        override;
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts = c10d::GatherOptions()) override;
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts = c10d::ScatterOptions()) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(
        std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
        const c10d::ReduceScatterOptions &opts = c10d::ReduceScatterOptions()) override;
    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor &output, at::Tensor &input,
        const c10d::ReduceScatterOptions &opts = c10d::ReduceScatterOptions()) override;
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outputSplits,
                                                 std::vector<int64_t> &inputSplits,
                                                 const c10d::AllToAllOptions &opts = c10d::AllToAllOptions()) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &opts = c10d::AllToAllOptions()) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dstRank, int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int srcRank, int tag) override;
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors, int tag) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts = c10d::BarrierOptions()) override;
    void monitoredBarrier(const c10d::BarrierOptions &opts, bool waitAllRanks = false) override;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    /* torch >= 2.1's coalescing manager: the operations between the two calls form one zccl group (see above);
     * endCoalescing's Work completes with them. */
    void startCoalescing() override { beginBlock(); }
    c10::intrusive_ptr<c10d::Work> endCoalescing() override;
    /* FSDP's coalesced forms: the tensors' all-gathers / reduce-scatters as one zccl group, completed as one Work. */
    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &opts = c10d::AllgatherOptions()) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::ReduceScatterOptions &opts = c10d::ReduceScatterOptions()) override;
#else
    /* torch 1.13's coalescing manager (batch_isend_irecv, distributed_c10d._coalescing_manager): the operations
     * between the two calls form one zccl group; their own Works complete together when it has run. */
    void startCoalescing() override { beginBlock(); }
    void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>> &reqs) override;
#endif

    /* Frees the communicators without waiting for peers: operations in progress fail within ~50 ms, queued ones
     * fail without running. The group cannot be used afterwards. Idempotent, safe from any thread and after
     * shutdown() (then it does nothing). */
    void abort();
    /* Completes queued operations, then destroys the communicators (also done by the destructor). Idempotent and
     * safe from any thread: a second call (or one racing the first) returns once the first has finished. */
    void shutdown();
    std::chrono::milliseconds timeout() const { return timeout_; }

    /* zccl's quantized collectives (include/zccl.h, the _wire calls; csrc/quantized.cpp): not c10d::Backend
     * operations; zccl_torch.all_reduce_quantized, all_gather_quantized, reduce_scatter_quantized and
     * quantized_allreduce_hook call them. wire: a zccl_wire_t value (1 int8, 2 int4, 3 fp8e4m3, 4 fp8e5m2, 0 full);
     * CPU tensors of float32/float64/float16/bfloat16; average: ZCCL_AVG instead of ZCCL_SUM; hier: the
     * hierarchical variants of include/zccl_hier.h (float32/float16/bfloat16; the flat call on one host). */
    c10::intrusive_ptr<c10d::Work> allreduceWire(at::Tensor &tensor, int wire, bool average, bool hier);
    c10::intrusive_ptr<c10d::Work> allgatherWire(at::Tensor &output, at::Tensor &input, int wire, bool hier);
    c10::intrusive_ptr<c10d::Work> reduceScatterWire(at::Tensor &output, at::Tensor &input, int wire, bool average,
                                                     bool hier);

    /* A 1-D CPU tensor of `numel` elements of `dtype` whose storage is zccl_mem_alloc memory (host memory the
     * other ranks of this host can map; zero-filled, whole pages) registered with the communicator that runs this
     * group's collectives (zccl_comm_register). A collective whose tensors are all such tensors on every rank of a
     * group whose ranks share one host, of at least ZCCL_SHM_REG_MIN_BYTES, runs in one pass out of the peers'
     * buffers instead of through the staging slots (include/zccl.h, "Registered buffers"); otherwise it takes the
     * usual path with the same result. The tensor owns its memory: when its storage is freed it is deregistered
     * (the peers close their mappings) and freed; after the group's shutdown/abort it is only freed. numel 0 gives
     * an empty tensor (one page reserved). Throws (ValueError in Python) for numel < 0, a dtype of no fixed size,
     * or a group already shut down; RuntimeError naming zccl's message when /dev/shm has no room. */
    at::Tensor emptyRegistered(int64_t numel, at::ScalarType dtype);

    /* What runs on a lane: see "Execution" above. */
    using Finish = std::function<void()>;
    using Post = std::function<Finish(zccl_comm_t)>;

  private:
    /* The shared state of one receive from any source, whose job sits on both lanes ("Receive from any source"). */
    struct AnyRecv {
        std::mutex mutex;
        int arrived = 0;               /* lanes that reached the job */
        bool polling = false;          /* a lane is asking the store now */
        std::atomic<bool> decided{false}; /* src or error is set */
        int src = -1;
        std::exception_ptr error;
        std::chrono::steady_clock::time_point since; /* when the first lane arrived (the deadline counts from it) */
        std::function<void(zccl_comm_t, int)> recv; /* receives from src on the comm of src's lane */
    };
    /* One lane job: a single operation (grouped = false, one entry), or a coalescing block run as one zccl group.
     * A Post may be empty: the Work of endCoalescing / a *_coalesced call, completed with the block. */
    struct Job {
        bool grouped = false;
        int cuda_device = -1; /* >= 0: the job's tensors are on this CUDA device ("Device memory" above) */
        std::vector<c10::intrusive_ptr<WorkZccl>> works;
        std::vector<std::string> names;
        std::vector<Post> posts;
        bool runahead = false; /* a single send: may run before an undecided receive from any source ahead of it */
        /* Set for a receive from any source: the job is queued on both lanes (see "Receive from any source"). */
        std::shared_ptr<AnyRecv> any;
    };
    struct Lane {
        zccl_comm_t comm = nullptr;
        std::thread thread;
        std::mutex mutex;
        std::condition_variable cv;
        std::deque<Job> queue;
        std::atomic<uint64_t> pushed{0}; /* jobs ever queued: the lane polls it while idle */
        bool stop = false;
    };
    /* ZCCL_TORCH_SPIN_US: how long an idle lane and a waiting caller poll (yielding the core between looks)
     * before they sleep; see "Waiting". */
    int spinUs_ = -1; /* -1: auto, decided when the group's host ranks are known */

    c10::intrusive_ptr<c10d::Work> enqueue(int lane, c10d::OpType type, const char *name,
                                           std::vector<at::Tensor> outputs, Post fn);
    /* Coalescing blocks nest (a *_coalesced call inside startCoalescing/endCoalescing); the outermost end queues
     * the block. endBlock returns a Work that completes with the block and carries `outputs`. */
    c10::intrusive_ptr<c10d::Work> allreduce_sparse_coo(std::vector<at::Tensor> &tensors,
                                                        const c10d::AllreduceOptions &opts);
    void beginBlock() { blockDepth_++; }
    c10::intrusive_ptr<WorkZccl> endBlock(c10d::OpType type, const char *name, std::vector<at::Tensor> outputs);
    bool inBlock() const { return blockDepth_ > 0; }
    void push(int lane, Job job);
    void runJob(Lane &l, Job &job);
    void runLane(int lane);
    void stopLanes();
    /* Receive from any source: the announcer thread (started by the first single send), the announcement of one
     * message to rank dst, the choice of a sender (polls the store), and a lane's part of an any-source job. */
    void announce(int dst);
    void runAnnouncer();
    bool pollSource(const std::string &name, std::chrono::steady_clock::time_point since, int *src);
    void runAnyJob(int lane, Job &job);
    /* Announcement counters of the ranks on this host, in a shared-memory segment of the group (counters[s][d] over
     * local indices): a send to a rank of this host is announced there, with one atomic add on the caller's
     * thread; only sends to other hosts go through the store. */
    void setupAnnouncements(const std::vector<uint8_t> &uid);
    void releaseAnnouncements();
    uint64_t *localCounter(int src, int dst) const {
        return localCounters_ + static_cast<size_t>(localIndex_[src]) * nLocal_ + localIndex_[dst];
    }
    bool isLocal(int r) const { return localCounters_ && localIndex_[r] >= 0; }
    std::vector<int> localIndex_; /* per rank: its index among this host's ranks, -1 on another host */
    int nLocal_ = 0;
    uint64_t *localCounters_ = nullptr; /* nullptr: every announcement through the store */
    size_t localBytes_ = 0;
    bool anySource_ = true; /* ZCCL_TORCH_ANY_SOURCE is not 0 on any rank (agreed at construction) */
    std::unique_ptr<std::atomic<uint64_t>[]> received_; /* per source: messages received outside blocks */
    int nextSource_ = 0;                               /* round robin start of the next choice */
    std::mutex anyPushMutex_; /* an any-source job enters both lanes' queues at the same point of their order */
    struct Announcer {
        std::thread thread;
        std::mutex mutex;
        std::condition_variable cv;
        std::deque<int> dsts;
        bool stop = false;
        bool warned = false;
    } announcer_;

    c10::intrusive_ptr<c10d::Store> store_;
    std::chrono::milliseconds timeout_;
    Lane lanes_[2];
    std::atomic<bool> aborted_{false};
    std::atomic<bool> shut_{false};
    std::mutex shutdownMutex_; /* serialises shutdown()/abort() */
    std::atomic<uint64_t> seq_{0};
    uint64_t monitoredSeq_ = 0;
    int blockDepth_ = 0; /* touched by the caller's thread only */
    Job block_;
    /* emptyRegistered's tensors outlive the group if Python keeps them: their deleters share this, and deregister
     * only while `comm` is set (cleared under `mutex` before the communicators are destroyed or aborted). */
    struct Registrations {
        std::mutex mutex;
        zccl_comm_t comm = nullptr;
    };
    std::shared_ptr<Registrations> regs_ = std::make_shared<Registrations>();
    void dropRegistrations();
};

} // namespace zccl_torch

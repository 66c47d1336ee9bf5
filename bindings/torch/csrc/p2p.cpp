/*
 * p2p.cpp — ProcessGroupZccl's all-to-alls (zccl_alltoall / zccl_alltoallv), send/recv, barriers (the monitored
 * one through the store), and the coalescing blocks (one zccl group each; see ProcessGroupZccl.hpp).
 */
#include "ProcessGroupZccl.hpp"

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <numeric>
#include <thread>
#include <sstream>
#include <stdexcept>

#include "tensors.hpp"

namespace zccl_torch {

/* ---- all-to-all ----------------------------------------------------------------------------------------------- */

namespace {

/* Per-rank byte counts and displacements for alltoall_base's split sizes (rows of dim 0); empty splits mean equal
 * blocks of size(0)/n rows. */
void split_bytes(const char *op, const at::Tensor &t, const std::vector<int64_t> &splits, int n, const char *what,
                 std::vector<size_t> *bytes, std::vector<size_t> *displ) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : nbytes(t) / rows;
    std::vector<int64_t> s = splits;
    if (s.empty()) {
        if (rows % n != 0)
            refuse(op, std::string(what) + " has " + std::to_string(rows) + " rows, not divisible by the " +
                           std::to_string(n) + " ranks (pass split sizes)");
        s.assign(n, rows / n);
    }
    if (static_cast<int>(s.size()) != n)
        refuse(op, std::string(what) + " split sizes have " + std::to_string(s.size()) + " entries, expected " +
                       std::to_string(n));
    int64_t sum = 0;
    for (int64_t v : s) {
        if (v < 0) refuse(op, std::string(what) + " split sizes contain a negative value");
        displ->push_back(static_cast<size_t>(sum) * row_bytes);
        bytes->push_back(static_cast<size_t>(v) * row_bytes);
        sum += v;
    }
    if (sum != rows)
        refuse(op, std::string(what) + " split sizes sum to " + std::to_string(sum) + " but the tensor has " +
                       std::to_string(rows) + " rows");
}

} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                               std::vector<int64_t> &outputSplits,
                                                               std::vector<int64_t> &inputSplits,
                                                               const c10d::AllToAllOptions &) {
    const char *op = "alltoall_base";
    check_tensor(op, input, "input");
    check_tensor(op, output, "output");
    check_same_dtype(op, input, output, "the output");
    std::vector<size_t> sb, sd, rb, rd;
    split_bytes(op, input, inputSplits, size_, "the input", &sb, &sd);
    split_bytes(op, output, outputSplits, size_, "the output", &rb, &rd);
    const bool equal = inputSplits.empty() && outputSplits.empty();
    if (equal) check_numel(op, output, input.numel(), "the output");
    Dense in = Dense::in(input), out = Dense::out(output);
    /* zccl_alltoallv is never in place: an output that shares memory with the input gets a scratch buffer */
    if (!equal && out.buf.numel() > 0 && in.buf.numel() > 0 && out.buf.storage().is_alias_of(in.buf.storage()))
        out.buf = at::empty_like(out.buf, at::MemoryFormat::Contiguous);
    return enqueue(0, c10d::OpType::ALLTOALL_BASE, op, {output}, [in, out, sb, sd, rb, rd, equal](zccl_comm_t comm) {
        /* counts and displacements in bytes (ZCCL_UINT8), so any dtype travels */
        if (equal)
            zcheck(zccl_alltoall(in.ptr(), out.ptr(), sb.empty() ? 0 : sb[0], ZCCL_UINT8, comm, nullptr));
        else
            zcheck(zccl_alltoallv(in.ptr(), sb.data(), sd.data(), out.ptr(), rb.data(), rd.data(), ZCCL_UINT8, comm,
                                  nullptr));
        return Finish([in, out] { out.finish(); });
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::alltoall(std::vector<at::Tensor> &outputs,
                                                          std::vector<at::Tensor> &inputs,
                                                          const c10d::AllToAllOptions &) {
    const char *op = "alltoall";
    if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_)
        refuse(op, "expects " + std::to_string(size_) + " input and output tensors (one per rank), got " +
                       std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
    for (int r = 0; r < size_; r++) {
        check_tensor(op, inputs[r], "input");
        check_tensor(op, outputs[r], "output");
        check_same_dtype(op, inputs[0], inputs[r], "an input tensor");
        check_same_dtype(op, inputs[0], outputs[r], "an output tensor");
    }
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(0, c10d::OpType::ALLTOALL, op, outputs, [ins, outs](zccl_comm_t comm) {
        /* pack the inputs back to back as bytes, exchange, unpack: uneven sizes are allowed */
        std::vector<at::Tensor> flat;
        std::vector<size_t> sb, sd, rb, rd;
        size_t off = 0;
        for (auto &t : ins) {
            flat.push_back(t.contiguous().view({-1}).view(at::kByte));
            sb.push_back(nbytes(t));
            sd.push_back(off);
            off += nbytes(t);
        }
        at::Tensor send = at::cat(flat);
        off = 0;
        for (auto &t : outs) {
            rb.push_back(nbytes(t));
            rd.push_back(off);
            off += nbytes(t);
        }
        at::Tensor recv = at::empty({static_cast<int64_t>(off)}, at::kByte);
        zcheck(zccl_alltoallv(send.data_ptr(), sb.data(), sd.data(), recv.data_ptr(), rb.data(), rd.data(), ZCCL_UINT8,
                              comm, nullptr));
        return Finish([send, recv, outs, rb, rd] {
            for (size_t r = 0; r < outs.size(); r++)
                outs[r].copy_(recv.narrow(0, rd[r], rb[r]).view(outs[r].scalar_type()).view(outs[r].sizes()));
        });
    });
}

/* ---- point to point ------------------------------------------------------------------------------------------- */

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::send(std::vector<at::Tensor> &tensors, int dstRank, int /*tag*/) {
    const char *op = "send";
    check_single(op, tensors, "tensor");
    if (dstRank < 0 || dstRank >= size_)
        refuse(op, "destination rank " + std::to_string(dstRank) + " is outside [0, " + std::to_string(size_) + ")");
    if (dstRank == rank_ && !inBlock())
        refuse(op, "a send to this rank itself completes only inside batch_isend_irecv or a coalescing block, "
                   "together with the matching receive from itself");
    Dense d = Dense::in(tensors[0]);
    if (shut_ || aborted_) refuse(op, "the process group was shut down or aborted");
    if (!inBlock()) announce(dstRank); /* for a receive from any source on dstRank (ProcessGroupZccl.hpp) */
    /* alone: messages from lower to higher ranks travel on lane 0, the others on lane 1; in a block everything is
     * recorded in the block's group on lane 0 (see ProcessGroupZccl.hpp) */
    return enqueue(rank_ < dstRank ? 0 : 1, c10d::OpType::SEND, op, tensors, [d, dstRank](zccl_comm_t comm) {
        zcheck(zccl_send(d.ptr(), nbytes(d.buf), ZCCL_UINT8, dstRank, comm, nullptr));
        return Finish([d] {}); /* keeps a contiguous copy alive until a group has run */
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::recv(std::vector<at::Tensor> &tensors, int srcRank, int /*tag*/) {
    const char *op = "recv";
    check_single(op, tensors, "tensor");
    if (srcRank < 0 || srcRank >= size_)
        refuse(op, "source rank " + std::to_string(srcRank) + " is outside [0, " + std::to_string(size_) + ")");
    if (srcRank == rank_ && !inBlock())
        refuse(op, "a receive from this rank itself completes only inside batch_isend_irecv or a coalescing block, "
                   "together with the matching send to itself");
    Dense d = Dense::out(tensors[0]);
    /* counted when it runs, so that a receive from any source queued before it sees it as not yet received */
    std::atomic<uint64_t> *count = inBlock() ? nullptr : &received_[srcRank];
    return enqueue(srcRank < rank_ ? 0 : 1, c10d::OpType::RECV, op, tensors, [d, srcRank, count](zccl_comm_t comm) {
        zcheck(zccl_recv(d.ptr(), nbytes(d.buf), ZCCL_UINT8, srcRank, comm, nullptr));
        if (count) (*count)++;
        return Finish([d] { d.finish(); });
    });
}

/* ---- receive from any source (ProcessGroupZccl.hpp, "Receive from any source") -------------------------------- */

namespace {
std::string announced_key(int src, int dst) {
    return "zccl_torch/p2p/" + std::to_string(src) + "/" + std::to_string(dst);
}
} // namespace

void ProcessGroupZccl::announce(int dst) {
    if (!anySource_) return;
    if (isLocal(dst)) { /* this host: the pair's counter in the group's segment */
        __atomic_fetch_add(localCounter(rank_, dst), 1, __ATOMIC_RELEASE);
        return;
    }
    {
        std::lock_guard<std::mutex> g(announcer_.mutex);
        if (announcer_.stop) return; /* shut down: the send is refused anyway */
        if (!announcer_.thread.joinable()) announcer_.thread = std::thread([this] { runAnnouncer(); });
        announcer_.dsts.push_back(dst);
    }
    announcer_.cv.notify_one();
}

void ProcessGroupZccl::runAnnouncer() {
    for (;;) {
        int dst;
        {
            std::unique_lock<std::mutex> g(announcer_.mutex);
            announcer_.cv.wait(g, [&] { return announcer_.stop || !announcer_.dsts.empty(); });
            if (announcer_.dsts.empty()) return;
            dst = announcer_.dsts.front();
            announcer_.dsts.pop_front();
        }
        try {
            store_->add(announced_key(rank_, dst), 1);
        } catch (const std::exception &e) {
            if (!announcer_.warned)
                TORCH_WARN("zccl_torch: announcing a send to rank ", dst, " in the store failed (a receive from any "
                           "source on that rank will not see it): ", e.what());
            announcer_.warned = true;
        }
    }
}

/* One look at the counters (shared memory for this host's ranks, the store for the others): a rank that announced more messages to this one than this one has received from it
 * (round robin from the last choice). Throws when the process group's timeout has passed since `since`. */
bool ProcessGroupZccl::pollSource(const std::string &name, std::chrono::steady_clock::time_point since, int *src) {
    for (int k = 0; k < size_; k++) {
        const int s = (nextSource_ + k) % size_;
        if (s == rank_) continue;
        const uint64_t announced = isLocal(s) ? __atomic_load_n(localCounter(s, rank_), __ATOMIC_ACQUIRE)
                                              : static_cast<uint64_t>(store_->add(announced_key(s, rank_), 0));
        if (announced > received_[s]) {
            nextSource_ = (s + 1) % size_;
            received_[s]++;
            *src = s;
            return true;
        }
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since);
    if (timeout_.count() > 0 && waited >= timeout_)
        throw ZcclFailure{ZCCL_TIMEOUT, name + ": no rank announced a message to rank " + std::to_string(rank_) +
                                            " within " + std::to_string(timeout_.count()) +
                                            " ms (the process group's timeout)"};
    return false;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::recvAnysource(std::vector<at::Tensor> &tensors, int /*tag*/) {
    const char *op = "recvAnysource";
    check_single(op, tensors, "tensor");
    if (!anySource_)
        refuse(op, "not supported: ZCCL_TORCH_ANY_SOURCE=0 on this or another rank of the group (the senders do not "
                   "announce their messages); "
                   "pass src= to recv/irecv");
    if (size_ < 2) refuse(op, "a group of one rank has no other rank to receive from");
    if (inBlock())
        refuse(op, "a receive from any source cannot be part of a coalescing block or batch_isend_irecv (name the "
                   "source)");
    for (auto &l : lanes_)
        if (std::this_thread::get_id() == l.thread.get_id())
            refuse(op, "a receive from any source cannot be issued from a future's callback");
    if (tensors[0].device().is_cuda()) refuse(op, "CPU tensors only (a CUDA tensor was given)");
    if (shut_ || aborted_) refuse(op, "the process group was shut down or aborted");
    seq_++;
    Dense d = Dense::out(tensors[0]);
    auto work = c10::make_intrusive<WorkZccl>(rank_, c10d::OpType::RECVANYSOURCE, tensors, spinUs_);
    auto any = std::make_shared<AnyRecv>();
    any->recv = [d](zccl_comm_t comm, int src) {
        zcheck(zccl_recv(d.ptr(), nbytes(d.buf), ZCCL_UINT8, src, comm, nullptr));
        d.finish();
    };
    Job job;
    job.works.push_back(work);
    job.names.emplace_back(op);
    job.posts.emplace_back();
    job.any = any;
    std::lock_guard<std::mutex> g(anyPushMutex_);
    push(0, job);
    push(1, std::move(job));
    return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::barrier(const c10d::BarrierOptions &) {
    return enqueue(0, c10d::OpType::BARRIER, "barrier", {}, [](zccl_comm_t comm) {
        zcheck(zccl_barrier(comm, nullptr));
        return Finish();
    });
}

/* ---- coalescing blocks ------------------------------------------------------------------------------------- */

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::endCoalescing() {
    /* carries the block's outputs, as ProcessGroupNCCL's coalesced Work does */
    std::vector<at::Tensor> outs;
    for (auto &w : block_.works)
        for (auto &t : w->result()) outs.push_back(t);
    return endBlock(c10d::OpType::UNKNOWN, "endCoalescing", outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                                 std::vector<at::Tensor> &inputs,
                                                                                 const c10d::AllgatherOptions &opts) {
    const char *op = "allgather_into_tensor_coalesced";
    if (outputs.size() != inputs.size()) refuse(op, "needs as many outputs as inputs");
    for (size_t i = 0; i < inputs.size(); i++) { /* all checked before anything is recorded */
        check_tensor(op, inputs[i], "input");
        check_tensor(op, outputs[i], "output");
        check_same_dtype(op, inputs[i], outputs[i], "an output");
        check_numel(op, outputs[i], inputs[i].numel() * size_, "an output");
    }
    beginBlock(); /* one zccl group */
    for (size_t i = 0; i < inputs.size(); i++) _allgather_base(outputs[i], inputs[i], opts);
    return endBlock(c10d::OpType::ALLGATHER_COALESCED, op, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs, const c10d::ReduceScatterOptions &opts) {
    const char *op = "reduce_scatter_tensor_coalesced";
    if (outputs.size() != inputs.size()) refuse(op, "needs as many outputs as inputs");
    for (size_t i = 0; i < inputs.size(); i++) {
        check_tensor(op, inputs[i], "input");
        check_tensor(op, outputs[i], "output");
        check_same_dtype(op, outputs[i], inputs[i], "an input");
        check_numel(op, inputs[i], outputs[i].numel() * size_, "an input");
        resolve_reduction(op, opts.reduceOp, outputs[i].scalar_type());
    }
    beginBlock(); /* one zccl group */
    for (size_t i = 0; i < inputs.size(); i++) _reduce_scatter_base(outputs[i], inputs[i], opts);
    return endBlock(c10d::OpType::_REDUCE_SCATTER_BASE, op, outputs);
}
#else
void ProcessGroupZccl::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>> &) {
    /* torch 1.13 keeps the Works that isend/irecv/... returned in the block; they complete with the group */
    endBlock(c10d::OpType::UNKNOWN, "endCoalescing", {});
}
#endif

/* Monitored barrier through the store, as gloo's reports: every rank checks in under a per-call key, rank 0 waits
 * for all of them until the timeout and names the ranks that did not arrive, then releases the others. The timeout
 * and the messages are gloo's (ProcessGroupGloo::monitoredBarrier; torch's tests match them): an unset timeout
 * (kUnsetTimeout, -1) means the group's, 0 means none left; "Rank R failed to pass monitoredBarrier in T ms",
 * "Ranks R, S failed ..." with waitAllRanks, "Rank 0 timed out in monitoredBarrier after T ms" when rank 0's time is
 * spent before it waits for a rank, and on the others "Rank R successfully reached monitoredBarrier, but received
 * errors while waiting for send/recv from rank 0". */
void ProcessGroupZccl::monitoredBarrier(const c10d::BarrierOptions &opts, bool waitAllRanks) {
    const uint64_t seq = monitoredSeq_++;
    const std::string base = "zccl_torch/monitored_barrier/" + std::to_string(seq) + "/";
    const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (rank_ != 0) {
        std::string msg;
        try {
            store_->set(base + std::to_string(rank_), std::vector<uint8_t>{1});
            store_->wait({base + "done"}, timeout);
            std::vector<uint8_t> v = store_->get(base + "done");
            msg.assign(v.begin(), v.end());
        } catch (const std::exception &e) {
            msg = e.what();
        }
        if (msg != "ok")
            throw std::runtime_error("zccl_torch: Rank " + std::to_string(rank_) +
                                     " successfully reached monitoredBarrier, but received errors while waiting for "
                                     "send/recv from rank 0: " + msg);
        return;
    }
    std::vector<int> missing;
    bool out_of_time = false;
    for (int r = 1; r < size_; r++) {
        const std::string key = base + std::to_string(r);
        if (!waitAllRanks && std::chrono::steady_clock::now() >= deadline && !store_->check({key})) {
            out_of_time = true;
            break;
        }
        while (!store_->check({key}) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (!store_->check({key})) {
            missing.push_back(r);
            if (!waitAllRanks) break;
        }
    }
    std::string msg = "ok";
    if (out_of_time) {
        msg = "zccl_torch: Rank 0 timed out in monitoredBarrier after " + std::to_string(timeout.count()) + " ms";
    } else if (!missing.empty()) {
        std::ostringstream os;
        os << "zccl_torch: [Rank 0]: Rank" << (missing.size() > 1 ? "s " : " ");
        for (size_t i = 0; i < missing.size(); i++) os << (i ? ", " : "") << missing[i];
        os << " failed to pass monitoredBarrier in " << timeout.count() << " ms";
        msg = os.str();
    }
    store_->set(base + "done", std::vector<uint8_t>(msg.begin(), msg.end()));
    if (msg != "ok") throw std::runtime_error(msg);
}

} // namespace zccl_torch

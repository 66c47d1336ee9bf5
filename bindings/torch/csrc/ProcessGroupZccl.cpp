/*
 * ProcessGroupZccl.cpp — the "zccl" torch.distributed backend: argument checks in the caller's thread, the zccl
 * calls and the local work around them on the group's lane threads (see ProcessGroupZccl.hpp).
 */
#include <Python.h> /* first, as Python asks; only for releasing the GIL in the destructor */

#include "ProcessGroupZccl.hpp"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "compose.hpp"

namespace zccl_torch {

namespace {

/* ---- errors ------------------------------------------------------------------------------------------------ */

/* Thrown on a lane by a failing zccl call; carries zccl's per-thread message, read on the thread that failed. */
struct ZcclFailure {
    zccl_result_t result;
    std::string message;
};

void zcheck(zccl_result_t res) {
    if (res != ZCCL_SUCCESS) throw ZcclFailure{res, zccl_get_last_error(nullptr)};
}

[[noreturn]] void refuse(const char *op, const std::string &why) {
    throw std::invalid_argument(std::string("zccl_torch: ") + op + ": " + why);
}

/* ---- tensors and datatypes ---------------------------------------------------------------------------------- */

bool to_zccl_type(at::ScalarType st, zccl_datatype_t *out) {
    switch (st) {
    case at::kHalf: *out = ZCCL_FLOAT16; return true;
    case at::kBFloat16: *out = ZCCL_BFLOAT16; return true;
    case at::kFloat: *out = ZCCL_FLOAT32; return true;
    case at::kDouble: *out = ZCCL_FLOAT64; return true;
    case at::kChar: *out = ZCCL_INT8; return true;
    case at::kByte: *out = ZCCL_UINT8; return true;
    case at::kBool: *out = ZCCL_UINT8; return true; /* 0/1 bytes: MIN/MAX are AND/OR */
    case at::kInt: *out = ZCCL_INT32; return true;
    case at::kLong: *out = ZCCL_INT64; return true;
    default: return false;
    }
}

void check_tensor(const char *op, const at::Tensor &t, const char *what) {
    if (!t.defined()) refuse(op, std::string(what) + " is an undefined tensor");
    if (!t.device().is_cpu())
        refuse(op, std::string(what) + " is on device " + t.device().str() + "; zccl takes CPU tensors only");
    if (t.layout() != at::kStrided)
        refuse(op, std::string(what) + " is not a dense (strided) tensor; sparse tensors are not supported");
}

void check_single(const char *op, const std::vector<at::Tensor> &v, const char *what) {
    if (v.size() != 1)
        refuse(op, std::string("expects exactly one ") + what + " tensor (one per process), got " +
                       std::to_string(v.size()));
    check_tensor(op, v[0], what);
}

size_t nbytes(const at::Tensor &t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

/* A tensor the zccl call reads or writes: the tensor itself when it is contiguous, else a contiguous copy
 * (inputs) or a contiguous scratch tensor written back by finish() (outputs). */
struct Dense {
    at::Tensor user, buf;
    static Dense in(const at::Tensor &t) { return Dense{t, t.is_contiguous() ? t : t.contiguous()}; }
    static Dense out(const at::Tensor &t) {
        return Dense{t, t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous)};
    }
    static Dense inout(const at::Tensor &t) { return Dense{t, t.is_contiguous() ? t : t.contiguous()}; }
    void *ptr() const { return buf.data_ptr(); }
    void finish() const {
        if (!buf.is_same(user)) user.copy_(buf);
    }
};

/* ---- reductions --------------------------------------------------------------------------------------------- */

/* How a c10d reduction runs on zccl: natively (op, datatype), with PREMUL_SUM's factor applied first, or, for
 * bitwise AND/OR/XOR on integers (zccl has no bitwise ops), as an all-gather followed by a local reduction in rank
 * order (identical on every rank). */
struct Reduction {
    zccl_datatype_t type = ZCCL_FLOAT32;
    zccl_redop_t op = ZCCL_SUM;
    bool bitwise = false;
    c10d::ReduceOp::RedOpType bitwise_op = c10d::ReduceOp::BAND;
    bool premul = false;
    double factor = 1.0;
    at::Tensor factor_tensor;
};

const char *redop_name(c10d::ReduceOp::RedOpType op) {
    static const char *names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
    return op <= c10d::ReduceOp::PREMUL_SUM ? names[op] : "unknown";
}

Reduction resolve_reduction(const char *opname, const c10d::ReduceOp &rop, at::ScalarType st) {
    const c10d::ReduceOp::RedOpType op = rop.op_;
    Reduction r;
    if (!to_zccl_type(st, &r.type))
        refuse(opname, std::string("dtype ") + c10::toString(st) + " cannot be reduced by zccl (supported: float16, "
                       "bfloat16, float32, float64, int8, uint8, int32, int64, bool)");
    const bool is_bool = st == at::kBool;
    const bool is_int = at::isIntegralType(st, /*includeBool=*/true);
    switch (op) {
    case c10d::ReduceOp::SUM: r.op = is_bool ? ZCCL_MAX : ZCCL_SUM; break; /* bool sum saturates: OR */
    case c10d::ReduceOp::PRODUCT: r.op = is_bool ? ZCCL_MIN : ZCCL_PROD; break; /* bool product: AND */
    case c10d::ReduceOp::MIN: r.op = ZCCL_MIN; break;
    case c10d::ReduceOp::MAX: r.op = ZCCL_MAX; break;
    case c10d::ReduceOp::AVG:
        if (is_bool) refuse(opname, "ReduceOp.AVG is not defined for bool tensors");
        r.op = ZCCL_AVG;
        break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
        if (!is_int)
            refuse(opname, std::string("ReduceOp.") + redop_name(op) + " needs an integer or bool tensor, got " +
                               c10::toString(st));
        if (is_bool && op == c10d::ReduceOp::BAND) {
            r.op = ZCCL_MIN;
        } else if (is_bool && op == c10d::ReduceOp::BOR) {
            r.op = ZCCL_MAX;
        } else {
            r.bitwise = true;
            r.bitwise_op = op;
        }
        break;
    case c10d::ReduceOp::PREMUL_SUM: {
        if (!at::isFloatingType(st))
            refuse(opname, std::string("ReduceOp.PREMUL_SUM needs a floating-point tensor, got ") + c10::toString(st));
        auto *sup = dynamic_cast<c10d::NCCLPreMulSumSupplement *>(rop.supplement_.get());
        if (sup == nullptr) refuse(opname, "ReduceOp.PREMUL_SUM without its factor");
        r.premul = true;
        r.op = ZCCL_SUM; /* zccl has no PreMulSum yet: scale locally, then sum */
#if TORCH_VERSION_MAJOR >= 2
        if (sup->tensor_factor.defined()) r.factor_tensor = sup->tensor_factor;
#else
        if (!sup->tensor_factors.empty()) r.factor_tensor = sup->tensor_factors[0];
#endif
        if (r.factor_tensor.defined()) {
            check_tensor(opname, r.factor_tensor, "PREMUL_SUM factor");
        } else {
            r.factor = sup->double_factor;
        }
        break;
    }
    default: refuse(opname, std::string("unsupported reduction ") + std::to_string(int(op)));
    }
    return r;
}

void apply_premul(const Reduction &r, at::Tensor &buf) {
    if (!r.premul) return;
    if (r.factor_tensor.defined())
        buf.mul_(r.factor_tensor.to(buf.scalar_type()));
    else
        buf.mul_(r.factor);
}

/* Bitwise all-reduce of `count` elements in place: every rank's block gathered, then combined in rank order. */
void allreduce_bitwise(zccl_comm_t comm, const Reduction &r, at::Tensor &flat) {
    int n = 0;
    zcheck(zccl_comm_count(comm, &n));
    at::Tensor all = at::empty({n, flat.numel()}, flat.options());
    zcheck(zccl_allgather(flat.data_ptr(), all.data_ptr(), nbytes(flat), ZCCL_UINT8, comm, nullptr));
    at::Tensor acc = all[0].clone();
    for (int i = 1; i < n; i++) {
        if (r.bitwise_op == c10d::ReduceOp::BAND)
            acc.bitwise_and_(all[i]);
        else if (r.bitwise_op == c10d::ReduceOp::BOR)
            acc.bitwise_or_(all[i]);
        else
            acc.bitwise_xor_(all[i]);
    }
    flat.view({-1}).copy_(acc);
}

/* All-reduce of a contiguous tensor in place, with whatever the reduction needs around the zccl call. */
void allreduce_dense(zccl_comm_t comm, const Reduction &r, at::Tensor &buf) {
    if (r.bitwise) return allreduce_bitwise(comm, r, buf);
    apply_premul(r, buf);
    zcheck(zccl_allreduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), r.type, r.op, comm, nullptr));
}

void check_same_dtype(const char *op, const at::Tensor &a, const at::Tensor &b, const char *what) {
    if (a.scalar_type() != b.scalar_type())
        refuse(op, std::string(what) + " has dtype " + c10::toString(b.scalar_type()) + ", expected " +
                       c10::toString(a.scalar_type()));
}

void check_numel(const char *op, const at::Tensor &t, int64_t want, const char *what) {
    if (t.numel() != want)
        refuse(op, std::string(what) + " has " + std::to_string(t.numel()) + " elements, expected " +
                       std::to_string(want));
}


} // namespace

/* ---- Work ---------------------------------------------------------------------------------------------------- */

WorkZccl::WorkZccl(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

std::vector<at::Tensor> WorkZccl::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> WorkZccl::getFuture() { return future_; }

void WorkZccl::complete(std::exception_ptr error) {
    finish(error);
    if (error)
        future_->setError(error);
    else
        future_->markCompleted(c10::IValue(outputs_));
}

/* ---- construction: ids through the store --------------------------------------------------------------------- */

namespace {

zccl_comm_t init_comm(c10d::Store &store, const std::string &key, int rank, int size) {
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
    /* The process group's timeout becomes zccl's collective deadline (read when a communicator is created),
     * unless the user set ZCCL_TIMEOUT_MS. */
    const bool set_timeout = std::getenv("ZCCL_TIMEOUT_MS") == nullptr && timeout.count() > 0;
    if (set_timeout) setenv("ZCCL_TIMEOUT_MS", std::to_string(timeout.count()).c_str(), 1);
    try {
        lanes_[0].comm = init_comm(*store_, "zccl_torch/uid/0", rank, size);
        lanes_[1].comm = init_comm(*store_, "zccl_torch/uid/1", rank, size);
    } catch (...) {
        if (set_timeout) unsetenv("ZCCL_TIMEOUT_MS");
        if (lanes_[0].comm) zccl_comm_destroy(lanes_[0].comm);
        throw;
    }
    if (set_timeout) unsetenv("ZCCL_TIMEOUT_MS");
    for (int i = 0; i < 2; i++) lanes_[i].thread = std::thread([this, i] { runLane(i); });
}

ProcessGroupZccl::~ProcessGroupZccl() {
    /* Python drops the last reference with the GIL held (destroy_process_group). Joining the lanes and closing
     * the communicators must not hold it: a lane may be completing a future whose callbacks need it, and other
     * Python threads (multiprocessing's queue feeder) would stall meanwhile. */
    PyThreadState *saved = nullptr;
    if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
    shutdown();
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
}

void ProcessGroupZccl::shutdown() {
    if (shut_) return;
    shut_ = true;
    stopLanes(); /* the lanes finish what is queued first */
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
 * zccl (the reason to abort), which the abort wakes; a job made of several zccl calls (all-to-all, bitwise
 * reductions) that is between two of them at that instant can still reach the freed communicator: zccl's API has
 * no way to close that window until it offers an abort that does not free. */
void ProcessGroupZccl::abort() {
    if (shut_) return;
    for (auto &l : lanes_) {
        std::lock_guard<std::mutex> g(l.mutex);
        aborted_ = true;
        zccl_comm_abort(l.comm); /* blocked calls return within ~50 ms; queued jobs fail without running */
    }
    shutdown();
}

/* ---- lanes ----------------------------------------------------------------------------------------------------- */

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::enqueue(int lane, c10d::OpType type, const char *name,
                                                         std::vector<at::Tensor> outputs,
                                                         std::function<void(zccl_comm_t)> fn) {
    if (shut_ || aborted_) refuse(name, "the process group was shut down or aborted");
    auto work = c10::make_intrusive<WorkZccl>(rank_, type, std::move(outputs));
    const int rank = rank_, size = size_;
    const std::string op(name);
    auto wrapped = [fn = std::move(fn), op, rank, size](zccl_comm_t comm) {
        try {
            fn(comm);
        } catch (const ZcclFailure &f) {
            throw std::runtime_error("zccl_torch: " + op + " failed on rank " + std::to_string(rank) + " of " +
                                     std::to_string(size) + ": " + zccl_get_error_string(f.result) + ": " +
                                     f.message);
        } catch (const std::exception &e) {
            throw std::runtime_error("zccl_torch: " + op + " failed on rank " + std::to_string(rank) + " of " +
                                     std::to_string(size) + ": " + e.what());
        }
    };
    Lane &l = lanes_[lane];
    {
        std::lock_guard<std::mutex> g(l.mutex);
        l.queue.emplace_back(work, std::move(wrapped));
    }
    l.cv.notify_one();
    return work;
}

void ProcessGroupZccl::runLane(int lane) {
    Lane &l = lanes_[lane];
    at::NoGradGuard no_grad; /* in-place copies into tensors that require grad (DDP's buckets do not) */
    for (;;) {
        std::pair<c10::intrusive_ptr<WorkZccl>, std::function<void(zccl_comm_t)>> job;
        bool aborted = false;
        {
            std::unique_lock<std::mutex> g(l.mutex);
            l.cv.wait(g, [&] { return l.stop || !l.queue.empty(); });
            if (l.queue.empty()) return;
            job = std::move(l.queue.front());
            l.queue.pop_front();
            aborted = aborted_; /* under the lane's mutex: see abort() */
        }
        std::exception_ptr error;
        if (aborted) {
            error = std::make_exception_ptr(std::runtime_error("zccl_torch: the process group was aborted"));
        } else {
            try {
                job.second(l.comm);
            } catch (...) {
                error = std::current_exception();
            }
        }
        job.first->complete(error);
    }
}

/* ---- collectives ---------------------------------------------------------------------------------------------- */

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::broadcast(std::vector<at::Tensor> &tensors,
                                                           const c10d::BroadcastOptions &opts) {
    const char *op = "broadcast";
    check_single(op, tensors, "tensor");
    if (opts.rootRank < 0 || opts.rootRank >= size_) refuse(op, "root rank " + std::to_string(opts.rootRank) +
                                                                    " is outside [0, " + std::to_string(size_) + ")");
    Dense d = Dense::inout(tensors[0]);
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(0, c10d::OpType::BROADCAST, op, tensors, [d, root](zccl_comm_t comm) {
        zcheck(zccl_broadcast(d.ptr(), d.ptr(), nbytes(d.buf), ZCCL_UINT8, root, comm, nullptr));
        d.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allreduce(std::vector<at::Tensor> &tensors,
                                                           const c10d::AllreduceOptions &opts) {
    const char *op = "allreduce";
    check_single(op, tensors, "tensor");
    Reduction r = resolve_reduction(op, opts.reduceOp, tensors[0].scalar_type());
    Dense d = Dense::inout(tensors[0]);
    return enqueue(0, c10d::OpType::ALLREDUCE, op, tensors, [d, r](zccl_comm_t comm) {
        at::Tensor buf = d.buf;
        allreduce_dense(comm, r, buf);
        d.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                                     const c10d::AllreduceCoalescedOptions &opts) {
    const char *op = "allreduce_coalesced";
    if (tensors.empty()) refuse(op, "no tensors");
    for (auto &t : tensors) {
        check_tensor(op, t, "tensor");
        check_same_dtype(op, tensors[0], t, "a tensor");
    }
    Reduction r = resolve_reduction(op, opts.reduceOp, tensors[0].scalar_type());
    std::vector<at::Tensor> ts = tensors;
    return enqueue(0, c10d::OpType::ALLREDUCE_COALESCED, op, tensors, [ts, r](zccl_comm_t comm) {
        std::vector<at::Tensor> flat;
        for (auto &t : ts) flat.push_back(t.reshape({-1}));
        at::Tensor buf = at::cat(flat); /* one zccl call for the whole list */
        allreduce_dense(comm, r, buf);
        int64_t off = 0;
        for (auto &t : ts) {
            t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
            off += t.numel();
        }
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::reduce(std::vector<at::Tensor> &tensors,
                                                        const c10d::ReduceOptions &opts) {
    const char *op = "reduce";
    check_single(op, tensors, "tensor");
    if (opts.rootRank < 0 || opts.rootRank >= size_) refuse(op, "root rank " + std::to_string(opts.rootRank) +
                                                                    " is outside [0, " + std::to_string(size_) + ")");
    Reduction r = resolve_reduction(op, opts.reduceOp, tensors[0].scalar_type());
    Dense d = Dense::inout(tensors[0]);
    const int root = static_cast<int>(opts.rootRank), me = rank_;
    return enqueue(0, c10d::OpType::REDUCE, op, tensors, [d, r, root, me](zccl_comm_t comm) {
        at::Tensor buf = d.buf;
        if (r.bitwise) { /* all ranks compute it; only the root's tensor changes */
            at::Tensor tmp = buf.clone();
            allreduce_bitwise(comm, r, tmp);
            if (me == root) buf.copy_(tmp);
        } else {
            at::Tensor src = buf;
            if (r.premul) {
                src = buf.clone();
                apply_premul(r, src);
            }
            zcheck(zccl_reduce(src.data_ptr(), me == root ? buf.data_ptr() : nullptr, buf.numel(), r.type, r.op,
                               root, comm, nullptr));
        }
        if (me == root) d.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                                           std::vector<at::Tensor> &inputs,
                                                           const c10d::AllgatherOptions &) {
    const char *op = "allgather";
    check_single(op, inputs, "input");
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
        refuse(op, "expects one list of " + std::to_string(size_) + " output tensors (one per rank)");
    for (auto &t : outputs[0]) {
        check_tensor(op, t, "output");
        check_same_dtype(op, inputs[0], t, "an output tensor");
        check_numel(op, t, inputs[0].numel(), "an output tensor");
    }
    Dense in = Dense::in(inputs[0]);
    std::vector<at::Tensor> outs = outputs[0];
    return enqueue(0, c10d::OpType::ALLGATHER, op, outs, [in, outs](zccl_comm_t comm) {
        at::Tensor all = at::empty({static_cast<int64_t>(outs.size()), in.buf.numel()}, in.buf.options());
        zcheck(zccl_allgather(in.ptr(), all.data_ptr(), nbytes(in.buf), ZCCL_UINT8, comm, nullptr));
        for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(all[r].view(outs[r].sizes()));
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::_allgather_base(at::Tensor &output, at::Tensor &input,
                                                                 const c10d::AllgatherOptions &) {
    const char *op = "_allgather_base";
    check_tensor(op, input, "input");
    check_tensor(op, output, "output");
    check_same_dtype(op, input, output, "the output");
    check_numel(op, output, input.numel() * size_, "the output");
    Dense in = Dense::in(input), out = Dense::out(output);
    return enqueue(0, c10d::OpType::_ALLGATHER_BASE, op, {output}, [in, out](zccl_comm_t comm) {
        zcheck(zccl_allgather(in.ptr(), out.ptr(), nbytes(in.buf), ZCCL_UINT8, comm, nullptr));
        out.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputLists,
                                                                     std::vector<at::Tensor> &inputs,
                                                                     const c10d::AllgatherOptions &) {
    const char *op = "allgather_coalesced";
    if (static_cast<int>(outputLists.size()) != size_)
        refuse(op, "expects " + std::to_string(size_) + " output lists (one per rank), got " +
                       std::to_string(outputLists.size()));
    for (auto &t : inputs) check_tensor(op, t, "input");
    for (auto &list : outputLists) {
        if (list.size() != inputs.size())
            refuse(op, "every output list must hold " + std::to_string(inputs.size()) + " tensors (one per input)");
        for (size_t i = 0; i < list.size(); i++) {
            check_tensor(op, list[i], "output");
            check_same_dtype(op, inputs[i], list[i], "an output tensor");
            check_numel(op, list[i], inputs[i].numel(), "an output tensor");
        }
    }
    std::vector<at::Tensor> ins = inputs, flatOut;
    for (auto &list : outputLists) flatOut.insert(flatOut.end(), list.begin(), list.end());
    auto lists = outputLists;
    return enqueue(0, c10d::OpType::ALLGATHER_COALESCED, op, flatOut, [ins, lists](zccl_comm_t comm) {
        /* the inputs as bytes back to back, gathered in one zccl call, then unpacked */
        std::vector<at::Tensor> bytes;
        for (auto &t : ins) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
        at::Tensor packed = bytes.empty() ? at::empty({0}, at::kByte) : at::cat(bytes);
        const int64_t per = packed.numel();
        at::Tensor all = at::empty({static_cast<int64_t>(lists.size()) * per}, at::kByte);
        zcheck(zccl_allgather(packed.data_ptr(), all.data_ptr(), per, ZCCL_UINT8, comm, nullptr));
        for (size_t r = 0; r < lists.size(); r++) {
            int64_t off = static_cast<int64_t>(r) * per;
            for (auto &t : lists[r]) {
                const int64_t nb = static_cast<int64_t>(nbytes(t));
                at::Tensor src = all.narrow(0, off, nb).view(t.scalar_type()).view(t.sizes());
                t.copy_(src);
                off += nb;
            }
        }
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::gather(std::vector<std::vector<at::Tensor>> &outputs,
                                                        std::vector<at::Tensor> &inputs,
                                                        const c10d::GatherOptions &opts) {
    const char *op = "gather";
    check_single(op, inputs, "input");
    if (opts.rootRank < 0 || opts.rootRank >= size_) refuse(op, "root rank " + std::to_string(opts.rootRank) +
                                                                    " is outside [0, " + std::to_string(size_) + ")");
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
        if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
            refuse(op, "the root expects one list of " + std::to_string(size_) + " output tensors");
        for (auto &t : outputs[0]) {
            check_tensor(op, t, "output");
            check_same_dtype(op, inputs[0], t, "an output tensor");
            check_numel(op, t, inputs[0].numel(), "an output tensor");
        }
        outs = outputs[0];
    } else if (!outputs.empty() && !outputs[0].empty()) {
        refuse(op, "only the root passes output tensors (rank " + std::to_string(rank_) + " is not the root " +
                       std::to_string(root) + ")");
    }
    Dense in = Dense::in(inputs[0]);
    return enqueue(0, c10d::OpType::GATHER, op, outs, [in, outs, root](zccl_comm_t comm) {
        std::vector<Dense> d;
        std::vector<void *> ptrs;
        for (auto &t : outs) d.push_back(Dense::out(t));
        for (auto &x : d) ptrs.push_back(x.ptr());
        zcheck(compose_gather(comm, in.ptr(), nbytes(in.buf), ptrs.empty() ? nullptr : ptrs.data(), root));
        for (auto &x : d) x.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::scatter(std::vector<at::Tensor> &outputs,
                                                         std::vector<std::vector<at::Tensor>> &inputs,
                                                         const c10d::ScatterOptions &opts) {
    const char *op = "scatter";
    check_single(op, outputs, "output");
    if (opts.rootRank < 0 || opts.rootRank >= size_) refuse(op, "root rank " + std::to_string(opts.rootRank) +
                                                                    " is outside [0, " + std::to_string(size_) + ")");
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> ins;
    if (rank_ == root) {
        if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
            refuse(op, "the root expects one list of " + std::to_string(size_) + " input tensors");
        for (auto &t : inputs[0]) {
            check_tensor(op, t, "input");
            check_same_dtype(op, outputs[0], t, "an input tensor");
            check_numel(op, t, outputs[0].numel(), "an input tensor");
        }
        ins = inputs[0];
    } else if (!inputs.empty() && !inputs[0].empty()) {
        refuse(op, "only the root passes input tensors (rank " + std::to_string(rank_) + " is not the root " +
                       std::to_string(root) + ")");
    }
    Dense out = Dense::out(outputs[0]);
    return enqueue(0, c10d::OpType::SCATTER, op, outputs, [out, ins, root](zccl_comm_t comm) {
        std::vector<at::Tensor> d;
        std::vector<const void *> ptrs;
        for (auto &t : ins) d.push_back(t.contiguous());
        for (auto &x : d) ptrs.push_back(x.data_ptr());
        zcheck(compose_scatter(comm, ptrs.empty() ? nullptr : ptrs.data(), nbytes(out.buf), out.ptr(), root));
        out.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::reduce_scatter(std::vector<at::Tensor> &outputs,
                                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                                const c10d::ReduceScatterOptions &opts) {
    const char *op = "reduce_scatter";
    check_single(op, outputs, "output");
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
        refuse(op, "expects one list of " + std::to_string(size_) + " input tensors (one per rank)");
    for (auto &t : inputs[0]) {
        check_tensor(op, t, "input");
        check_same_dtype(op, outputs[0], t, "an input tensor");
    }
    check_numel(op, inputs[0][rank_], outputs[0].numel(), "this rank's input tensor");
    Reduction r = resolve_reduction(op, opts.reduceOp, outputs[0].scalar_type());
    std::vector<at::Tensor> ins = inputs[0];
    Dense out = Dense::out(outputs[0]);
    const int me = rank_;
    return enqueue(0, c10d::OpType::REDUCE_SCATTER, op, outputs, [ins, out, r, me](zccl_comm_t comm) {
        std::vector<at::Tensor> flat;
        std::vector<size_t> counts;
        for (auto &t : ins) {
            flat.push_back(t.reshape({-1}));
            counts.push_back(static_cast<size_t>(t.numel()));
        }
        at::Tensor all = at::cat(flat);
        if (r.bitwise) {
            allreduce_bitwise(comm, r, all);
            const int64_t off = std::accumulate(counts.begin(), counts.begin() + me, int64_t(0));
            out.buf.view({-1}).copy_(all.narrow(0, off, counts[me]));
        } else {
            apply_premul(r, all);
            /* uneven blocks are allowed by torch's list form; zccl_reduce_scatter_v takes them as they are */
            zcheck(zccl_reduce_scatter_v(all.data_ptr(), out.ptr(), counts.data(), r.type, r.op, comm, nullptr));
        }
        out.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                                      const c10d::ReduceScatterOptions &opts) {
    const char *op = "_reduce_scatter_base";
    check_tensor(op, input, "input");
    check_tensor(op, output, "output");
    check_same_dtype(op, output, input, "the input");
    check_numel(op, input, output.numel() * size_, "the input");
    Reduction r = resolve_reduction(op, opts.reduceOp, output.scalar_type());
    Dense in = Dense::in(input), out = Dense::out(output);
    const int me = rank_;
    return enqueue(0, c10d::OpType::_REDUCE_SCATTER_BASE, op, {output}, [in, out, r, me](zccl_comm_t comm) {
        at::Tensor src = in.buf;
        if (r.bitwise) {
            at::Tensor all = src.reshape({-1}).clone();
            allreduce_bitwise(comm, r, all);
            out.buf.view({-1}).copy_(all.narrow(0, me * out.buf.numel(), out.buf.numel()));
        } else {
            if (r.premul) {
                src = src.clone();
                apply_premul(r, src);
            }
            zcheck(zccl_reduce_scatter(src.data_ptr(), out.ptr(), out.buf.numel(), r.type, r.op, comm, nullptr));
        }
        out.finish();
    });
}

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
    Dense in = Dense::in(input), out = Dense::out(output);
    return enqueue(0, c10d::OpType::ALLTOALL_BASE, op, {output}, [in, out, sb, sd, rb, rd](zccl_comm_t comm) {
        zcheck(compose_alltoallv(comm, in.ptr(), sb.data(), sd.data(), out.ptr(), rb.data(), rd.data()));
        out.finish();
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
        /* pack the inputs back to back, exchange, unpack: uneven sizes are allowed */
        std::vector<at::Tensor> flat;
        std::vector<size_t> sb, sd, rb, rd;
        size_t off = 0;
        for (auto &t : ins) {
            flat.push_back(t.reshape({-1}));
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
        zcheck(compose_alltoallv(comm, send.data_ptr(), sb.data(), sd.data(), recv.data_ptr(), rb.data(),
                                 rd.data()));
        for (size_t r = 0; r < outs.size(); r++)
            outs[r].copy_(recv.narrow(0, rd[r], rb[r]).view(outs[r].scalar_type()).view(outs[r].sizes()));
    });
}

/* ---- point to point ------------------------------------------------------------------------------------------- */

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::send(std::vector<at::Tensor> &tensors, int dstRank, int /*tag*/) {
    const char *op = "send";
    check_single(op, tensors, "tensor");
    if (dstRank < 0 || dstRank >= size_ || dstRank == rank_)
        refuse(op, "destination rank " + std::to_string(dstRank) + " is outside [0, " + std::to_string(size_) +
                       ") or is this rank");
    Dense d = Dense::in(tensors[0]);
    /* messages from lower to higher ranks travel on lane 0, the others on lane 1 (see ProcessGroupZccl.hpp) */
    return enqueue(rank_ < dstRank ? 0 : 1, c10d::OpType::SEND, op, tensors, [d, dstRank](zccl_comm_t comm) {
        zcheck(zccl_send(d.ptr(), nbytes(d.buf), ZCCL_UINT8, dstRank, comm, nullptr));
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::recv(std::vector<at::Tensor> &tensors, int srcRank, int /*tag*/) {
    const char *op = "recv";
    check_single(op, tensors, "tensor");
    if (srcRank < 0 || srcRank >= size_ || srcRank == rank_)
        refuse(op, "source rank " + std::to_string(srcRank) + " is outside [0, " + std::to_string(size_) +
                       ") or is this rank");
    Dense d = Dense::out(tensors[0]);
    return enqueue(srcRank < rank_ ? 0 : 1, c10d::OpType::RECV, op, tensors, [d, srcRank](zccl_comm_t comm) {
        zcheck(zccl_recv(d.ptr(), nbytes(d.buf), ZCCL_UINT8, srcRank, comm, nullptr));
        d.finish();
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::recvAnysource(std::vector<at::Tensor> &, int) {
    refuse("recvAnysource", "not supported: zccl receives only from a named rank (pass src= to recv/irecv)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::barrier(const c10d::BarrierOptions &) {
    return enqueue(0, c10d::OpType::BARRIER, "barrier", {}, [](zccl_comm_t comm) {
        zcheck(zccl_barrier(comm, nullptr));
    });
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::endCoalescing() {
    return enqueue(0, c10d::OpType::UNKNOWN, "endCoalescing", {}, [](zccl_comm_t) {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                                 std::vector<at::Tensor> &inputs,
                                                                                 const c10d::AllgatherOptions &) {
    const char *op = "allgather_into_tensor_coalesced";
    if (outputs.size() != inputs.size()) refuse(op, "needs as many outputs as inputs");
    std::vector<Dense> ins, outs;
    for (size_t i = 0; i < inputs.size(); i++) {
        check_tensor(op, inputs[i], "input");
        check_tensor(op, outputs[i], "output");
        check_same_dtype(op, inputs[i], outputs[i], "an output");
        check_numel(op, outputs[i], inputs[i].numel() * size_, "an output");
        ins.push_back(Dense::in(inputs[i]));
        outs.push_back(Dense::out(outputs[i]));
    }
    return enqueue(0, c10d::OpType::ALLGATHER_COALESCED, op, outputs, [ins, outs](zccl_comm_t comm) {
        for (size_t i = 0; i < ins.size(); i++) {
            zcheck(zccl_allgather(ins[i].ptr(), outs[i].ptr(), nbytes(ins[i].buf), ZCCL_UINT8, comm, nullptr));
            outs[i].finish();
        }
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs, const c10d::ReduceScatterOptions &opts) {
    const char *op = "reduce_scatter_tensor_coalesced";
    if (outputs.size() != inputs.size()) refuse(op, "needs as many outputs as inputs");
    std::vector<c10::intrusive_ptr<c10d::Work>> parts;
    for (size_t i = 0; i < inputs.size(); i++) /* each one is checked, then queued; they run in this order */
        parts.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
    /* a Work that completes after the last part (same lane, in order) and carries every output */
    return enqueue(0, c10d::OpType::_REDUCE_SCATTER_BASE, op, outputs, [parts](zccl_comm_t) {
        for (auto &w : parts) w->wait(); /* already complete: rethrows a part's error */
    });
}
#endif

/* Monitored barrier through the store, as gloo's reports: every rank checks in under a per-call key, rank 0 waits
 * for all of them until the timeout and names the ranks that did not arrive, then releases the others. */
void ProcessGroupZccl::monitoredBarrier(const c10d::BarrierOptions &opts, bool waitAllRanks) {
    const uint64_t seq = monitoredSeq_++;
    const std::string base = "zccl_torch/monitored_barrier/" + std::to_string(seq) + "/";
    const auto timeout = opts.timeout.count() > 0 ? opts.timeout : timeout_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (rank_ != 0) {
        store_->set(base + std::to_string(rank_), std::vector<uint8_t>{1});
        store_->wait({base + "done"}, timeout);
        std::vector<uint8_t> v = store_->get(base + "done");
        std::string msg(v.begin(), v.end());
        if (msg != "ok") throw std::runtime_error(msg);
        return;
    }
    std::vector<int> missing;
    for (int r = 1; r < size_; r++) {
        const std::string key = base + std::to_string(r);
        while (!store_->check({key}) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (!store_->check({key})) {
            missing.push_back(r);
            if (!waitAllRanks) break;
        }
    }
    std::string msg = "ok";
    if (!missing.empty()) {
        std::ostringstream os;
        os << "zccl_torch: monitoredBarrier: rank" << (missing.size() > 1 ? "s " : " ");
        for (size_t i = 0; i < missing.size(); i++) os << (i ? ", " : "") << missing[i];
        os << " did not reach the barrier within " << timeout.count() << " ms";
        msg = os.str();
    }
    store_->set(base + "done", std::vector<uint8_t>(msg.begin(), msg.end()));
    if (msg != "ok") throw std::runtime_error(msg);
}

} // namespace zccl_torch

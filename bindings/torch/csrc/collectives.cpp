/*
 * collectives.cpp — ProcessGroupZccl's collectives over zccl's own: broadcast, all-reduce (also coalesced, as one
 * zccl group), reduce, the all-gathers, gather and scatter, the reduce-scatters. Each lane function issues its
 * zccl calls and returns the local work that needs their results (see ProcessGroupZccl.hpp, "Execution").
 */
#include "ProcessGroupZccl.hpp"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "tensors.hpp"

namespace zccl_torch {

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
        return Finish([d] { d.finish(); });
    });
}

/* Sparse COO all-reduce (DDP's sparse embedding gradients), SUM only, as gloo: every rank all-gathers every rank's
 * coalesced (index, value) pairs — first the pair counts with a description of the tensor, so that ranks whose
 * shapes or types differ all fail alike, then the indices and the values as uneven all-gathers — and coalesces
 * their concatenation in rank order, which sums the duplicates. Every rank builds the same concatenation, so the
 * result is bitwise the same on every rank. Two dependent rounds: not inside a coalescing block. */
c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allreduce_sparse_coo(std::vector<at::Tensor> &tensors,
                                                                      const c10d::AllreduceOptions &opts) {
    const char *op = "allreduce";
    if (tensors.size() != 1)
        refuse(op, "expects exactly one tensor (one per process), got " + std::to_string(tensors.size()));
    const at::Tensor &t0 = tensors[0];
    if (t0.layout() != at::kSparse)
        refuse(op, "the tensor's layout is not strided or sparse COO; only those are supported");
    if (!t0.device().is_cpu()) refuse(op, "a sparse tensor must be on the CPU (it is on " + t0.device().str() + ")");
    if (opts.reduceOp.op_ != c10d::ReduceOp::SUM)
        refuse(op, std::string("a sparse tensor is reduced with SUM only (as gloo does), not ") +
                       redop_name(opts.reduceOp.op_));
    if (inBlock()) refuse(op, "a sparse all-reduce cannot be part of a coalescing block (it needs two rounds)");
    at::Tensor t = t0;
    const int n = size_;
    return enqueue(0, c10d::OpType::ALLREDUCE, op, tensors, [t, n](zccl_comm_t comm) {
        at::Tensor c = t.coalesce();
        at::Tensor idx = c._indices().t().contiguous(); /* nnz x sparse_dim, int64 */
        at::Tensor val = c._values().contiguous();      /* nnz x the dense dimensions */
        const int64_t sd = c.sparse_dim();
        int64_t per = 1; /* elements of one value row */
        for (int64_t d = sd; d < c.dim(); d++) per *= c.size(d);
        /* what must agree: dims, sizes, dtype; hashed (FNV-1a) next to the pair count */
        uint64_t h = 1469598103934665603ull;
        auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
        mix(static_cast<uint64_t>(c.dim()));
        mix(static_cast<uint64_t>(sd));
        for (int64_t d = 0; d < c.dim(); d++) mix(static_cast<uint64_t>(c.size(d)));
        mix(static_cast<uint64_t>(c.scalar_type()));
        int64_t mine[2] = {c._nnz(), static_cast<int64_t>(h)};
        std::vector<int64_t> all(2 * static_cast<size_t>(n));
        zcheck(zccl_allgather(mine, all.data(), 2, ZCCL_INT64, comm, nullptr));
        int64_t total = 0;
        for (int r = 0; r < n; r++) {
            if (all[2 * r + 1] != all[1])
                throw std::runtime_error("zccl_torch allreduce: rank " + std::to_string(r) +
                                         "'s sparse tensor differs from rank 0's in its sizes, dimensions or dtype");
            total += all[2 * r];
        }
        std::vector<int64_t> vsizes{total};
        for (int64_t d = sd; d < c.dim(); d++) vsizes.push_back(c.size(d));
        at::Tensor aidx = at::empty({total, sd}, idx.options());
        at::Tensor aval = at::empty(vsizes, val.options());
        if (total > 0) {
            std::vector<size_t> ic(static_cast<size_t>(n)), vc(static_cast<size_t>(n));
            for (int r = 0; r < n; r++) {
                ic[r] = static_cast<size_t>(all[2 * r] * sd);
                vc[r] = static_cast<size_t>(all[2 * r] * per) * val.element_size();
            }
            zcheck(zccl_allgather_v(idx.numel() ? idx.data_ptr() : nullptr, aidx.data_ptr(), ic.data(), ZCCL_INT64,
                                    comm, nullptr));
            zcheck(zccl_allgather_v(val.numel() ? val.data_ptr() : nullptr, aval.data_ptr(), vc.data(), ZCCL_UINT8,
                                    comm, nullptr));
        }
        at::Tensor sum = at::sparse_coo_tensor(aidx.t(), aval, c.sizes(), c.options()).coalesce();
        return Finish([t, sum]() mutable { t.copy_(sum); });
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allreduce(std::vector<at::Tensor> &tensors,
                                                           const c10d::AllreduceOptions &opts) {
    const char *op = "allreduce";
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
        return allreduce_sparse_coo(tensors, opts);
    check_single(op, tensors, "tensor");
    Reduction r = resolve_reduction(op, opts.reduceOp, tensors[0].scalar_type());
    Dense d = Dense::inout(tensors[0]);
    return enqueue(0, c10d::OpType::ALLREDUCE, op, tensors, [d, r](zccl_comm_t comm) {
        Finish reduced = allreduce_dense(comm, r, d.buf);
        return Finish([d, reduced] {
            reduced();
            d.finish();
        });
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
    /* one all-reduce per tensor, all in one zccl group; the Work completes with the group */
    beginBlock();
    for (auto &t : tensors) {
        Dense d = Dense::inout(t);
        enqueue(0, c10d::OpType::ALLREDUCE, op, {t}, [d, r](zccl_comm_t comm) {
            Finish reduced = allreduce_dense(comm, r, d.buf);
            return Finish([d, reduced] {
                reduced();
                d.finish();
            });
        });
    }
    return endBlock(c10d::OpType::ALLREDUCE_COALESCED, op, tensors);
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
            Finish reduced = allreduce_bitwise(comm, r, tmp);
            return Finish([d, tmp, reduced, me, root] {
                reduced();
                if (me == root) {
                    d.buf.copy_(tmp);
                    d.finish();
                }
            });
        }
        at::Tensor src = buf;
        if (r.premul) {
            src = buf.clone();
            apply_premul(r, src);
        }
        RedOp rop(r, comm);
        zcheck(zccl_reduce(src.data_ptr(), me == root ? buf.data_ptr() : nullptr, buf.numel(), r.type, rop.get(),
                           root, comm, nullptr));
        return Finish([d, src, me, root] {
            if (me == root) d.finish();
        });
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
        return Finish([in, all, outs] {
            for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(all[r].view(outs[r].sizes()));
        });
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
        return Finish([in, out] { out.finish(); });
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
    std::vector<at::Tensor> flatOut;
    for (auto &list : outputLists) flatOut.insert(flatOut.end(), list.begin(), list.end());
    /* one all-gather per input into a scratch tensor, all in one zccl group, then unpacked per rank */
    beginBlock();
    for (size_t i = 0; i < inputs.size(); i++) {
        Dense in = Dense::in(inputs[i]);
        std::vector<at::Tensor> outs;
        for (auto &list : outputLists) outs.push_back(list[i]);
        enqueue(0, c10d::OpType::ALLGATHER, op, outs, [in, outs](zccl_comm_t comm) {
            at::Tensor all = at::empty({static_cast<int64_t>(outs.size()), in.buf.numel()}, in.buf.options());
            zcheck(zccl_allgather(in.ptr(), all.data_ptr(), nbytes(in.buf), ZCCL_UINT8, comm, nullptr));
            return Finish([in, all, outs] {
                for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(all[r].view(outs[r].sizes()));
            });
        });
    }
    return endBlock(c10d::OpType::ALLGATHER_COALESCED, op, flatOut);
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
    const int n = size_;
    return enqueue(0, c10d::OpType::GATHER, op, outs, [in, outs, root, n](zccl_comm_t comm) {
        /* zccl_gather fills one buffer of n blocks on the root; c10d's outputs are n separate tensors */
        at::Tensor all;
        if (!outs.empty()) all = at::empty({n, in.buf.numel()}, in.buf.options());
        zcheck(zccl_gather(in.ptr(), all.defined() ? all.data_ptr() : nullptr, nbytes(in.buf), ZCCL_UINT8, root, comm,
                           nullptr));
        return Finish([in, all, outs] {
            for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(all[r].view(outs[r].sizes()));
        });
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
        /* the root's n tensors packed into the one buffer zccl_scatter reads */
        at::Tensor all;
        if (!ins.empty()) {
            std::vector<at::Tensor> flat;
            for (auto &t : ins) flat.push_back(t.reshape({-1}));
            all = at::cat(flat);
        }
        zcheck(zccl_scatter(all.defined() ? all.data_ptr() : nullptr, out.ptr(), nbytes(out.buf), ZCCL_UINT8, root,
                            comm, nullptr));
        return Finish([out, all] { out.finish(); });
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
            Finish reduced = allreduce_bitwise(comm, r, all);
            const int64_t off = std::accumulate(counts.begin(), counts.begin() + me, int64_t(0));
            const int64_t cnt = static_cast<int64_t>(counts[me]);
            return Finish([out, all, reduced, off, cnt] {
                reduced();
                out.buf.view({-1}).copy_(all.narrow(0, off, cnt));
                out.finish();
            });
        }
        apply_premul(r, all);
        RedOp rop(r, comm);
        /* uneven blocks are allowed by torch's list form; zccl_reduce_scatter_v takes them as they are */
        zcheck(zccl_reduce_scatter_v(all.data_ptr(), out.ptr(), counts.data(), r.type, rop.get(), comm, nullptr));
        return Finish([out, all] { out.finish(); });
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
            Finish reduced = allreduce_bitwise(comm, r, all);
            return Finish([out, all, reduced, me] {
                reduced();
                out.buf.view({-1}).copy_(all.narrow(0, me * out.buf.numel(), out.buf.numel()));
                out.finish();
            });
        }
        if (r.premul) {
            src = src.clone();
            apply_premul(r, src);
        }
        RedOp rop(r, comm);
        zcheck(zccl_reduce_scatter(src.data_ptr(), out.ptr(), out.buf.numel(), r.type, rop.get(), comm, nullptr));
        return Finish([in, out, src] { out.finish(); });
    });
}

} // namespace zccl_torch

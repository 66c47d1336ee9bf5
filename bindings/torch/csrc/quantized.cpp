/*
 * quantized.cpp — zccl's quantized collectives (include/zccl.h, zccl_wire_t and the _wire calls: ZeRO++'s qwZ and
 * qgZ) on torch tensors. They are not c10d::Backend operations (torch has no such call): zccl_torch/__init__.py
 * exposes them as all_reduce_quantized / all_gather_quantized / reduce_scatter_quantized and the DDP
 * communication hook quantized_allreduce_hook; with hier they call the hierarchical variants (include/zccl_hier.h:
 * full precision inside a host, the wire format between hosts). They run on lane 0 in issue order with the group's
 * other operations, like every collective of the process group, and return an ordinary Work.
 */
#include "ProcessGroupZccl.hpp"
#include "tensors.hpp"
#include "zccl_hier.h"

namespace zccl_torch {

namespace {

/* The wire formats take float32, float64, float16 and bfloat16 host tensors. */
zccl_datatype_t wire_type(const char *op, const at::Tensor &t, const char *what) {
    check_tensor(op, t, what);
    if (!t.device().is_cpu())
        refuse(op, std::string(what) + " is on device " + t.device().str() + "; the quantized collectives take CPU "
                       "tensors only (zccl's _wire calls encode in host memory)");
    zccl_datatype_t dt;
    const at::ScalarType st = t.scalar_type();
    if (!to_zccl_type(st, &dt) || (st != at::kFloat && st != at::kDouble && st != at::kHalf && st != at::kBFloat16))
        refuse(op, std::string(what) + " has dtype " + c10::toString(st) + "; the quantized formats take float32, "
                       "float64, float16 and bfloat16");
    return dt;
}

zccl_wire_t check_wire(const char *op, int wire) {
    if (wire < 0 || wire >= ZCCL_NUM_WIRES)
        refuse(op, "wire " + std::to_string(wire) + " is not a zccl wire format (0 full .. " +
                       std::to_string(ZCCL_NUM_WIRES - 1) + ")");
    return static_cast<zccl_wire_t>(wire);
}

/* A pair of tensors of one wire call: both floating CPU tensors of one dtype, `big` holding nranks times the
 * elements of `small`. Returns their datatype. */
zccl_datatype_t wire_pair(const char *op, const at::Tensor &small, const char *small_name, const at::Tensor &big,
                          const char *big_name, int nranks) {
    const zccl_datatype_t dt = wire_type(op, small, small_name);
    wire_type(op, big, big_name);
    const std::string the_big = std::string("the ") + big_name;
    check_same_dtype(op, small, big, the_big.c_str());
    check_numel(op, big, small.numel() * nranks, the_big.c_str());
    return dt;
}

} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allreduceWire(at::Tensor &tensor, int wire, bool average,
                                                               bool hier) {
    const char *op = "all_reduce_quantized";
    const zccl_datatype_t dt = wire_type(op, tensor, "tensor");
    const zccl_wire_t w = check_wire(op, wire);
    Dense d = Dense::inout(tensor);
    const zccl_redop_t rop = average ? ZCCL_AVG : ZCCL_SUM;
    const auto call = hier ? zccl_allreduce_hier : zccl_allreduce_wire;
    return enqueue(0, c10d::OpType::ALLREDUCE, op, {tensor}, [d, dt, w, rop, call](zccl_comm_t comm) {
        zcheck(call(d.ptr(), d.ptr(), static_cast<size_t>(d.buf.numel()), dt, rop, w, comm, nullptr));
        return Finish([d] { d.finish(); });
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::allgatherWire(at::Tensor &output, at::Tensor &input, int wire,
                                                               bool hier) {
    const char *op = "all_gather_quantized";
    const zccl_datatype_t dt = wire_pair(op, input, "input", output, "output", size_);
    const zccl_wire_t w = check_wire(op, wire);
    Dense in = Dense::in(input), out = Dense::out(output);
    const auto call = hier ? zccl_allgather_hier : zccl_allgather_wire;
    return enqueue(0, c10d::OpType::_ALLGATHER_BASE, op, {output}, [in, out, dt, w, call](zccl_comm_t comm) {
        zcheck(call(in.ptr(), out.ptr(), static_cast<size_t>(in.buf.numel()), dt, w, comm, nullptr));
        return Finish([in, out] { out.finish(); });
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZccl::reduceScatterWire(at::Tensor &output, at::Tensor &input, int wire,
                                                                   bool average, bool hier) {
    const char *op = "reduce_scatter_quantized";
    const zccl_datatype_t dt = wire_pair(op, output, "output", input, "input", size_);
    const zccl_wire_t w = check_wire(op, wire);
    Dense in = Dense::in(input), out = Dense::out(output);
    const zccl_redop_t rop = average ? ZCCL_AVG : ZCCL_SUM;
    const auto call = hier ? zccl_reduce_scatter_hier : zccl_reduce_scatter_wire;
    return enqueue(0, c10d::OpType::_REDUCE_SCATTER_BASE, op, {output}, [in, out, dt, w, rop, call](zccl_comm_t comm) {
        zcheck(call(in.ptr(), out.ptr(), static_cast<size_t>(out.buf.numel()), dt, rop, w, comm, nullptr));
        return Finish([in, out] { out.finish(); });
    });
}

} // namespace zccl_torch

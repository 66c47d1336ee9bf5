/*
 * tensors.hpp — what every operation of ProcessGroupZccl needs around its zccl calls: errors that carry zccl's
 * message, torch dtype -> zccl datatype, contiguous stand-ins for non-contiguous tensors, and how a c10d reduction
 * runs on zccl (natively, PREMUL_SUM through a zccl PreMulSum handle, bitwise ones through an all-gather).
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <zccl.h>

namespace zccl_torch {
/* ---- errors ------------------------------------------------------------------------------------------------ */

/* Thrown on a lane by a failing zccl call; carries zccl's per-thread message, read on the thread that failed. */
struct ZcclFailure {
    zccl_result_t result;
    std::string message;
};

inline void zcheck(zccl_result_t res) {
    if (res != ZCCL_SUCCESS) throw ZcclFailure{res, zccl_get_last_error(nullptr)};
}

[[noreturn]] inline void refuse(const char *op, const std::string &why) {
    throw std::invalid_argument(std::string("zccl_torch: ") + op + ": " + why);
}

/* ---- tensors and datatypes ---------------------------------------------------------------------------------- */

/* torch >= 2.1 has the fp8 dtypes float8_e4m3fn and float8_e5m2. */
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define ZCCL_TORCH_FP8 1
#endif

inline bool to_zccl_type(at::ScalarType st, zccl_datatype_t *out) {
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
#ifdef ZCCL_TORCH_FP8
    /* torch's e4m3fn is OCP E4M3 (no infinities, S.1111.111 NaN), its e5m2 OCP E5M2: zccl's two fp8 types. zccl
     * saturates a reduction that overflows (as NCCL does); torch's own casts give NaN (e4m3fn) or inf (e5m2). */
    case at::kFloat8_e4m3fn: *out = ZCCL_FLOAT8E4M3; return true;
    case at::kFloat8_e5m2: *out = ZCCL_FLOAT8E5M2; return true;
#endif
    default: return false;
    }
}

/* CUDA tensors: torch >= 2.4 (the device-generic synchronizeDevice used after a job on device memory; the
 * ProcessGroupZccl.hpp "Device memory" note). zccl itself refuses device memory when it was built without its CUDA
 * kernels or no CUDA driver is loaded, with a message naming the buffer. */
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define ZCCL_TORCH_CUDA 1
#else
#define ZCCL_TORCH_CUDA 0
#endif

/* c10::DistBackendError (torch >= 2.1): the lanes' errors are of that type (torch.distributed.DistBackendError). */
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define ZCCL_TORCH_DIST_BACKEND_ERROR 1
#include <c10/util/Exception.h>
#else
#define ZCCL_TORCH_DIST_BACKEND_ERROR 0
#endif

inline void check_tensor(const char *op, const at::Tensor &t, const char *what) {
    if (!t.defined()) refuse(op, std::string(what) + " is an undefined tensor");
    if (t.device().is_cuda() && !ZCCL_TORCH_CUDA)
        refuse(op, std::string(what) + " is on device " + t.device().str() + "; this build of zccl_torch (torch " +
                       TORCH_VERSION + ") takes CPU tensors only: CUDA tensors need torch >= 2.4");
    if (!t.device().is_cpu() && !t.device().is_cuda())
        refuse(op, std::string(what) + " is on device " + t.device().str() + "; zccl takes CPU and CUDA tensors");
    if (t.layout() != at::kStrided)
        refuse(op, std::string(what) + " is not a dense (strided) tensor; of sparse tensors only all_reduce takes "
                       "one (COO, SUM, on the CPU)");
}

inline void check_single(const char *op, const std::vector<at::Tensor> &v, const char *what) {
    if (v.size() != 1)
        refuse(op, std::string("expects exactly one ") + what + " tensor (one per process), got " +
                       std::to_string(v.size()));
    check_tensor(op, v[0], what);
}

inline size_t nbytes(const at::Tensor &t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

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

/* How a c10d reduction runs on zccl: natively (op, datatype); PREMUL_SUM through a PreMulSum handle made when the
 * operation runs (native_premul: the factor is a Python float, or a CPU tensor of one element read then), or as
 * scale-then-sum (premul: a factor tensor of several elements, multiplied elementwise into a copy of the input,
 * then ZCCL_SUM); bitwise AND/OR/XOR on integers (zccl has no bitwise ops) as an all-gather followed by a local
 * reduction in rank order (identical on every rank). */
struct Reduction {
    zccl_datatype_t type = ZCCL_FLOAT32;
    zccl_redop_t op = ZCCL_SUM;
    bool bitwise = false;
    c10d::ReduceOp::RedOpType bitwise_op = c10d::ReduceOp::BAND;
    bool native_premul = false;
    bool premul = false;
    double factor = 1.0;
    at::Tensor factor_tensor;
};

inline const char *redop_name(c10d::ReduceOp::RedOpType op) {
    static const char *names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
    return op <= c10d::ReduceOp::PREMUL_SUM ? names[op] : "unknown";
}

inline Reduction resolve_reduction(const char *opname, const c10d::ReduceOp &rop, at::ScalarType st) {
    const c10d::ReduceOp::RedOpType op = rop.op_;
    Reduction r;
    if (!to_zccl_type(st, &r.type))
        refuse(opname, std::string("dtype ") + c10::toString(st) + " cannot be reduced by zccl (supported: float16, "
                       "bfloat16, float32, float64, int8, uint8, int32, int64, bool, and on torch >= 2.1 "
                       "float8_e4m3fn, float8_e5m2)");
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
        r.op = ZCCL_SUM;
#if TORCH_VERSION_MAJOR >= 2
        if (sup->tensor_factor.defined()) r.factor_tensor = sup->tensor_factor;
#else
        if (!sup->tensor_factors.empty()) r.factor_tensor = sup->tensor_factors[0];
#endif
        if (r.factor_tensor.defined()) {
            check_tensor(opname, r.factor_tensor, "PREMUL_SUM factor");
            if (r.factor_tensor.numel() == 1)
                r.native_premul = true; /* its value is read when the operation runs, as NCCL reads it then */
            else
                r.premul = true; /* elementwise factors: no zccl scalar can express them */
        } else {
            r.factor = sup->double_factor;
            r.native_premul = true;
        }
        break;
    }
    default: refuse(opname, std::string("unsupported reduction ") + std::to_string(int(op)));
    }
    return r;
}

inline void apply_premul(const Reduction &r, at::Tensor &buf) {
    if (r.premul) buf.mul_(r.factor_tensor.to(buf.scalar_type()));
}

/* What a lane operation returns: local work that needs the results of the zccl calls it issued (run at once
 * alone, after zccl_group_end in a coalescing block). Same type as ProcessGroupZccl::Finish. */
using Finish = std::function<void()>;

/* The zccl reduction to pass for r on comm: r.op, or a PreMulSum handle created now from the factor in r's
 * datatype (ZCCL_SCALAR_HOST_IMMEDIATE) and destroyed with this object; an operation issued or recorded in a group
 * before that keeps its copy of the scalar (zccl.h), so the handle never has to outlive the call. */
class RedOp {
  public:
    RedOp(const Reduction &r, zccl_comm_t comm) : op_(r.op) {
        if (!r.native_premul) return;
        const double f = r.factor_tensor.defined() ? r.factor_tensor.to(at::kDouble).item<double>() : r.factor;
        unsigned char scalar[8] = {0};
        switch (r.type) {
        case ZCCL_FLOAT16: { at::Half h(static_cast<float>(f)); std::memcpy(scalar, &h, sizeof h); break; }
        case ZCCL_BFLOAT16: { at::BFloat16 h(static_cast<float>(f)); std::memcpy(scalar, &h, sizeof h); break; }
        case ZCCL_FLOAT32: { float v = static_cast<float>(f); std::memcpy(scalar, &v, sizeof v); break; }
        case ZCCL_FLOAT64: std::memcpy(scalar, &f, sizeof f); break;
#ifdef ZCCL_TORCH_FP8
        case ZCCL_FLOAT8E4M3: { c10::Float8_e4m3fn h(static_cast<float>(f)); std::memcpy(scalar, &h, 1); break; }
        case ZCCL_FLOAT8E5M2: { c10::Float8_e5m2 h(static_cast<float>(f)); std::memcpy(scalar, &h, 1); break; }
#endif
        default: throw std::invalid_argument("PREMUL_SUM on a datatype without a float scalar");
        }
        zcheck(zccl_redop_create_premulsum(&op_, scalar, r.type, ZCCL_SCALAR_HOST_IMMEDIATE, comm));
        comm_ = comm;
    }
    ~RedOp() {
        if (comm_) zccl_redop_destroy(op_, comm_);
    }
    RedOp(const RedOp &) = delete;
    RedOp &operator=(const RedOp &) = delete;
    zccl_redop_t get() const { return op_; }

  private:
    zccl_redop_t op_;
    zccl_comm_t comm_ = nullptr;
};

/* Bitwise all-reduce in place: every rank's block gathered, then (in the Finish) combined in rank order. */
inline Finish allreduce_bitwise(zccl_comm_t comm, const Reduction &r, const at::Tensor &flat) {
    int n = 0;
    zcheck(zccl_comm_count(comm, &n));
    at::Tensor all = at::empty({n, flat.numel()}, flat.options());
    zcheck(zccl_allgather(flat.data_ptr(), all.data_ptr(), nbytes(flat), ZCCL_UINT8, comm, nullptr));
    const c10d::ReduceOp::RedOpType op = r.bitwise_op;
    return [all, flat, n, op] {
        at::Tensor acc = all[0].clone();
        for (int i = 1; i < n; i++) {
            if (op == c10d::ReduceOp::BAND)
                acc.bitwise_and_(all[i]);
            else if (op == c10d::ReduceOp::BOR)
                acc.bitwise_or_(all[i]);
            else
                acc.bitwise_xor_(all[i]);
        }
        flat.view({-1}).copy_(acc.view({-1}));
    };
}

/* All-reduce of a contiguous tensor in place, with whatever the reduction needs around the zccl call. */
inline Finish allreduce_dense(zccl_comm_t comm, const Reduction &r, at::Tensor buf) {
    if (r.bitwise) return allreduce_bitwise(comm, r, buf);
    at::Tensor src = buf;
    if (r.premul) {
        src = buf.clone();
        apply_premul(r, src);
    }
    RedOp op(r, comm);
    zcheck(zccl_allreduce(src.data_ptr(), buf.data_ptr(), buf.numel(), r.type, op.get(), comm, nullptr));
    return [src] {}; /* keeps the scaled copy alive until a group has run */
}

inline void check_same_dtype(const char *op, const at::Tensor &a, const at::Tensor &b, const char *what) {
    if (a.scalar_type() != b.scalar_type())
        refuse(op, std::string(what) + " has dtype " + c10::toString(b.scalar_type()) + ", expected " +
                       c10::toString(a.scalar_type()));
}

inline void check_numel(const char *op, const at::Tensor &t, int64_t want, const char *what) {
    if (t.numel() != want)
        refuse(op, std::string(what) + " has " + std::to_string(t.numel()) + " elements, expected " +
                       std::to_string(want));
}

} // namespace zccl_torch

/*
 * module.cpp — the Python module zccl_torch._C: the process-group class and the factory that
 * torch.distributed.Backend.register_backend calls (zccl_torch/__init__.py).
 */
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "ProcessGroupZccl.hpp"

namespace py = pybind11;
using zccl_torch::ProcessGroupZccl;

PYBIND11_MODULE(_C, m) {
    m.doc() = "zccl backend for torch.distributed (import zccl_torch to register it)";
    /* The base class (ProcessGroup on torch 1.x, Backend on 2.x) is bound by torch.distributed, which
     * zccl_torch/__init__.py imports before this module. */
    py::class_<ProcessGroupZccl, zccl_torch::BackendBase, c10::intrusive_ptr<ProcessGroupZccl>>(m, "ProcessGroupZccl")
        .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                         std::chrono::milliseconds timeout) {
                 return c10::make_intrusive<ProcessGroupZccl>(store, rank, size, timeout);
             }),
             py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
             py::call_guard<py::gil_scoped_release>())
        .def("abort", &ProcessGroupZccl::abort, py::call_guard<py::gil_scoped_release>(),
             "Frees the communicators without waiting for peers; running and queued operations fail.")
        .def("shutdown", &ProcessGroupZccl::shutdown, py::call_guard<py::gil_scoped_release>(),
             "Completes queued operations, then destroys the communicators.")
        .def_property_readonly("timeout", &ProcessGroupZccl::timeout)
        .def("_allreduce_wire", &ProcessGroupZccl::allreduceWire, py::arg("tensor"), py::arg("wire"),
             py::arg("average"), py::arg("hier") = false, py::call_guard<py::gil_scoped_release>(),
             "zccl_allreduce_wire on a CPU tensor, in place (zccl_torch.all_reduce_quantized)")
        .def("_allgather_wire", &ProcessGroupZccl::allgatherWire, py::arg("output"), py::arg("input"),
             py::arg("wire"), py::arg("hier") = false, py::call_guard<py::gil_scoped_release>(),
             "zccl_allgather_wire (zccl_torch.all_gather_quantized)")
        .def(
            "_empty_registered",
            [](ProcessGroupZccl &pg, int64_t numel, const at::Tensor &like) {
                return pg.emptyRegistered(numel, like.scalar_type());
            },
            py::arg("numel"), py::arg("like"), py::call_guard<py::gil_scoped_release>(),
            "1-D CPU tensor of numel elements of like's dtype in registered zccl_mem_alloc memory "
            "(zccl_torch.empty_registered)")
        .def("_reduce_scatter_wire", &ProcessGroupZccl::reduceScatterWire, py::arg("output"), py::arg("input"),
             py::arg("wire"), py::arg("average"), py::arg("hier") = false,
             py::call_guard<py::gil_scoped_release>(),
             "zccl_reduce_scatter_wire (zccl_torch.reduce_scatter_quantized)");
    m.def("zccl_version", [] {
        int v = 0;
        zccl_get_version(&v);
        return v;
    });
    m.attr("TORCH_VERSION_MAJOR_BUILT") = TORCH_VERSION_MAJOR;
}

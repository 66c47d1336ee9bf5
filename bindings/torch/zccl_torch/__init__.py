"""zccl backend for torch.distributed.

``import zccl_torch`` registers the backend ``"zccl"``; then
``torch.distributed.init_process_group("zccl", ...)`` works as with gloo (CPU tensors).
"""
import inspect

import torch
import torch.distributed as dist  # binds ProcessGroup/Backend, the base class of ours

try:
    from ._C import ProcessGroupZccl, zccl_version  # noqa: F401
except ImportError as e:
    import os

    raise ImportError(
        f"zccl_torch: the compiled part (zccl_torch._C) is missing next to {os.path.dirname(__file__)} ({e}). "
        "This is probably the source tree's copy: build it in place (cd bindings/torch && python3 setup.py "
        "build_ext --inplace), or put the build tree's copy (build/bindings/torch/python) first on PYTHONPATH, "
        "or pip install ./bindings/torch") from e

__all__ = ["ProcessGroupZccl", "zccl_version", "BACKEND"]

BACKEND = "zccl"


def _create(store, rank, size, timeout):
    return ProcessGroupZccl(store, rank, size, timeout)


def _register():
    if hasattr(dist.Backend, BACKEND.upper()):
        return  # already registered (module imported again under another name)
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:  # torch >= 2.0: one backend per device type
        # CUDA tensors need torch >= 2.4 (the extension refuses them, saying so, on older torch)
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    else:  # torch 1.x: the creator returns the whole ProcessGroup
        dist.Backend.register_backend(BACKEND, _create)


_register()

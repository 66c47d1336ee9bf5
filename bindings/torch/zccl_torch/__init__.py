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


def _coalesce_batch_p2p():
    """torch 2.0-2.6 run batch_isend_irecv's operations one by one on CPU ("backward support for gloo"); zccl's
    sends block until received, so a ring of sends (every rank sends before it receives) would wait for ever, and a
    send to this rank itself has no partner. torch 1.x and >= 2.7 (supportsCoalescing) put them in one coalescing
    block, which zccl runs as one group: on 2.0-2.6 zccl groups get that block here; other groups keep torch's."""
    try:
        major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return
    c10d = dist.distributed_c10d
    if major != 2 or minor >= 7 or not hasattr(c10d, "_coalescing_manager") or \
            getattr(c10d.batch_isend_irecv, "_zccl", False):
        return
    original = c10d.batch_isend_irecv

    def batch_isend_irecv(p2p_op_list):
        if p2p_op_list:
            group = p2p_op_list[0].group
            device = p2p_op_list[0].tensor.device
            pg = group if group is not None else c10d._get_default_group()
            if device.type == "cpu" and c10d.get_backend(pg) == BACKEND:
                c10d._check_p2p_op_list(p2p_op_list)
                with c10d._coalescing_manager(group, device, async_ops=True) as cm:
                    for op in p2p_op_list:
                        op.op(op.tensor, op.peer, op.group, op.tag)
                return cm.works
        return original(p2p_op_list)

    batch_isend_irecv._zccl = True
    batch_isend_irecv.__doc__ = original.__doc__
    c10d.batch_isend_irecv = batch_isend_irecv
    dist.batch_isend_irecv = batch_isend_irecv


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
_coalesce_batch_p2p()

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

__all__ = ["ProcessGroupZccl", "zccl_version", "BACKEND", "WIRES", "all_reduce_quantized", "all_gather_quantized",
           "reduce_scatter_quantized", "quantized_allreduce_hook", "QuantizedHookState", "empty_registered"]

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


# ---- registered buffers (include/zccl.h, zccl_mem_alloc / zccl_comm_register; docs/torch.md) -------------------

def empty_registered(size, dtype=torch.float32, group=None):
    """A CPU tensor of shape `size` (an int or a sequence of ints) and `dtype`, zero-filled, whose memory the other
    ranks of this host can map and which is registered with `group`'s communicator (the default group when None;
    its CPU backend must be zccl). A collective of `group` whose tensors are all such tensors on every rank, when
    every rank of the group is on one host and the call moves at least ZCCL_SHM_REG_MIN_BYTES (default 32 KiB),
    runs in one pass straight out of the peers' tensors instead of through the staging slots: use it for buffers
    that are reduced or gathered again and again (flat gradient buckets, ZeRO shards). Anywhere else the call takes
    the usual path with the same result (float sums: bitwise the same as the staged and direct paths', which also add
    in rank order; a ring or tree the tuner picks for ordinary tensors may differ in the last bits).
    The memory is deregistered and freed with the tensor's storage (only freed after the group was destroyed); it
    comes from /dev/shm (whole pages). Raises ValueError for a group that is not zccl's or was shut down, a
    negative size or a dtype of no fixed size; RuntimeError with zccl's message when /dev/shm has no room."""
    shape = (int(size),) if isinstance(size, int) else tuple(int(d) for d in size)
    numel = 1
    for d in shape:
        if d < 0:
            raise ValueError(f"zccl_torch.empty_registered: size {size!r} has a negative dimension")
        numel *= d
    b = _zccl_backend(group, "empty_registered")
    return b._empty_registered(numel, torch.empty(0, dtype=dtype)).view(shape)


# ---- quantized collectives (include/zccl.h, zccl_wire_t; docs/torch.md "Quantized collectives") ----------------

#: The wire formats by name, as zccl_wire_name spells them, and their zccl_wire_t values.
WIRES = {"full": 0, "int8": 1, "int4": 2, "fp8e4m3": 3, "fp8e5m2": 4}


def _zccl_backend(group, what):
    """zccl's ProcessGroupZccl behind a process group (the default group when None)."""
    c10d = dist.distributed_c10d
    pg = group if group is not None else c10d._get_default_group()
    b = pg._get_backend(torch.device("cpu")) if hasattr(pg, "_get_backend") else pg  # torch 2.x / 1.x
    if not isinstance(b, ProcessGroupZccl):
        raise ValueError(f"zccl_torch.{what}: the group's CPU backend is {dist.get_backend(pg)!r}, not 'zccl' "
                         f"({what} is zccl's own call)")
    return b


def _wire_value(wire, what):
    if wire not in WIRES:
        raise ValueError(f"zccl_torch.{what}: wire {wire!r} is not one of {sorted(WIRES)}")
    return WIRES[wire]


def _average(op, what):
    if op == dist.ReduceOp.SUM:
        return False
    if op == dist.ReduceOp.AVG:
        return True
    raise ValueError(f"zccl_torch.{what}: op {op} is not SUM or AVG (a quantized reduction's error bound is a sum's)")


def _finish(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def all_reduce_quantized(tensor, wire="int8", op=dist.ReduceOp.SUM, group=None, async_op=False,
                         hierarchical=False):
    """All-reduce of a CPU tensor (float32, float64, float16, bfloat16), in place, with block-quantized bytes on the
    wire: zccl_allreduce_wire (a quantized reduce-scatter through one all-to-all, then a quantized all-gather; every
    rank gets bitwise the same result). wire: "int8", "int4", "fp8e4m3", "fp8e5m2" or "full"; op: SUM or AVG.
    Error per element: the bound zccl.h states for zccl_allreduce_wire (two quantizations; amax over blocks of
    ZCCL_QUANT_BLOCK elements from each of the nranks shards' first element). hierarchical=True: zccl_allreduce_hier
    (include/zccl_hier.h: float32 inside each host, the wire format only between hosts, its bound; float32,
    float16, bfloat16; the flat call when all ranks share one host or hosts differ in size). Returns a Work when
    async_op, else None once done. Raises ValueError for a group that is not zccl's, a bad wire or op; the call
    itself refuses other dtypes and non-CPU tensors naming them."""
    b = _zccl_backend(group, "all_reduce_quantized")
    return _finish(b._allreduce_wire(tensor, _wire_value(wire, "all_reduce_quantized"),
                                     _average(op, "all_reduce_quantized"), bool(hierarchical)), async_op)


def all_gather_quantized(output, input, wire="int8", group=None, async_op=False, hierarchical=False):
    """qwZ: all-gather of each rank's CPU tensor `input` into `output` (world_size x input.numel() elements of the
    same dtype, rank order), each input quantized once (zccl_allgather_wire; every rank, the sender too, decodes
    the same bytes, so the output is bitwise equal on every rank). Error: one quantization (zccl.h).
    hierarchical=True: zccl_allgather_hier (the same output; each wire string crosses between hosts once per host)."""
    b = _zccl_backend(group, "all_gather_quantized")
    return _finish(b._allgather_wire(output, input, _wire_value(wire, "all_gather_quantized"), bool(hierarchical)),
                   async_op)


def reduce_scatter_quantized(output, input, wire="int4", op=dist.ReduceOp.SUM, group=None, async_op=False,
                             hierarchical=False):
    """qgZ: reduce-scatter of `input` (world_size x output.numel() elements) into this rank's `output`, each
    rank's block quantized once and sent through one all-to-all, the owner summing in float32 in rank order
    (zccl_reduce_scatter_wire). Error: the bound of zccl.h's zccl_reduce_scatter_wire. hierarchical=True:
    zccl_reduce_scatter_hier (ZeRO++'s two-hop qgZ shape: float32 inside the host, quantized once between hosts)."""
    b = _zccl_backend(group, "reduce_scatter_quantized")
    return _finish(b._reduce_scatter_wire(output, input, _wire_value(wire, "reduce_scatter_quantized"),
                                          _average(op, "reduce_scatter_quantized"), bool(hierarchical)), async_op)


class QuantizedHookState:
    """State of quantized_allreduce_hook: the wire format, the process group (None: the default group) and whether
    to use the hierarchical all-reduce (float32 inside each host, the wire format only between hosts)."""

    def __init__(self, wire="int8", process_group=None, hierarchical=False):
        _wire_value(wire, "QuantizedHookState")
        self.wire = wire
        self.process_group = process_group
        self.hierarchical = bool(hierarchical)


def quantized_allreduce_hook(state, bucket):
    """DDP communication hook: averages each gradient bucket with all_reduce_quantized (AVG fused into the
    reduction), so each bucket crosses the wire block-quantized. Register it with
    ``ddp.register_comm_hook(QuantizedHookState("int8", pg), zccl_torch.quantized_allreduce_hook)`` (a wire name
    alone is accepted as the state). Every rank gets bitwise the same averaged gradient, so the replicas stay
    identical. The buffer is the bucket's float tensor on the CPU."""
    if isinstance(state, str):
        state = QuantizedHookState(state)
    b = _zccl_backend(state.process_group, "quantized_allreduce_hook")
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    work = b._allreduce_wire(tensor, WIRES[state.wire], True, state.hierarchical)
    return work.get_future().then(lambda fut: fut.value()[0])


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

"""Helpers the torch benchmarks of bench/ share (torch_compare, torch_vs_bench, torch_wait_ab, deepspeed_shm_compare):
size arguments, table labels, nccl-tests' bus bandwidth, the test harness's port choice, and a timed loop of
torch.distributed calls. Imports no torch at load (the call helpers import it when called)."""
import os
import sys

_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bindings", "torch", "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
import harness  # noqa: E402  free_port (below the ephemeral range), ninja_shim


def parse_size(s):
    """'256K', '64M', '1G', '4096' (also '256KiB', '64MB') -> bytes, powers of 1024."""
    t = s.upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(t[:-1] if t[-1:] in "KMG" else t) * mult
    except ValueError:
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: bad size '{s}' (e.g. 256K, 64M)") from None


def human(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m} {unit}"
    return f"{b} B"


def busbw(op, nbytes, n, t):
    """nccl-tests' bus bandwidth in GB/s of a call on nbytes (the whole vector) that took t seconds on n ranks."""
    algbw = nbytes / t / 1e9
    return algbw * (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n)


def bind_rank(rank, bind):
    """core: rank r on the r-th CPU of this process's mask, as zccl-bench -np binds its ranks; none: unbound, as
    torchrun leaves them."""
    if bind == "core":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})


def collective_call(op, count, n, rand=None, empty=None):
    """fn(async_op) making one torch.distributed call of `op` on `count` float32 elements (the whole vector):
    all_reduce in place, all_gather_into_tensor and reduce_scatter_tensor out of place; tensors from rand(c) and
    empty(c) (default torch.rand and torch.empty), made once here."""
    import torch
    import torch.distributed as dist
    rand, empty = rand or torch.rand, empty or torch.empty
    if op == "all_reduce":
        t = rand(count)
        return lambda a: dist.all_reduce(t, async_op=a)
    if op == "all_gather_into_tensor":
        o, i = empty(count), rand(count // n)
        return lambda a: dist.all_gather_into_tensor(o, i, async_op=a)
    if op == "reduce_scatter_tensor":
        o, i = empty(count // n), rand(count)
        return lambda a: dist.reduce_scatter_tensor(o, i, async_op=a)
    raise ValueError(op)


def time_calls(fn, mode, iters, warm):
    """Seconds per call of fn (collective_call's), the slowest rank's (collective: every rank of the default group):
    `warm` blocking calls, a barrier, then `iters` calls, "blocking" one after the other or "async" all issued with
    async_op=True and then waited for (as nccl-tests and zccl-bench queue theirs on a stream)."""
    import torch
    import torch.distributed as dist
    import time
    for _ in range(warm):
        fn(False)
    dist.barrier()
    t0 = time.perf_counter()
    if mode == "blocking":
        for _ in range(iters):
            fn(False)
    else:
        for w in [fn(True) for _ in range(iters)]:
            w.wait()
    tt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    return tt.item()


free_port = harness.free_port
ninja_shim = harness.ninja_shim

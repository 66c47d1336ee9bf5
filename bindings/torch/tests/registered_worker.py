"""Rank functions for test_registered.py: zccl_torch.empty_registered tensors (zccl_mem_alloc memory registered with
the group's communicator) in all_reduce, all_gather_into_tensor, reduce_scatter_tensor and broadcast, checked
against the result the test computes, and whether the calls took zccl's direct (one-pass) path, read from the INFO
line a communicator prints when it is destroyed (lib/core/regmem.c: "direct path (one pass over the peers'
registered buffers): N calls on host memory ... in this process")."""
import gc
import glob
import os
import re
import tempfile
import time

import torch
import torch.distributed as dist

import zccl_torch

BIG = 50_021      # elements: at 4 bytes and more, above ZCCL_SHM_REG_MIN_BYTES (32 KiB)
SMALL = 37        # below it: the usual path


def values(rank, count, dtype, salt=0):
    """Rank r's contribution: integers in [-50, 50] (exact in every dtype used here, and in their sums)."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * count + salt)
    return torch.randint(-50, 51, (count,), generator=g).to(dtype)


def reference_sum(n, count, dtype, salt=0):
    return sum(values(r, count, torch.float64, salt) for r in range(n))


def direct_calls_at_shutdown(group):
    """Shuts group's zccl backend down (destroying its communicators) with fd 2 sent to a file; returns the process's
    direct-path call count on host memory from the INFO line, or 0 when no such line was printed."""
    backend = zccl_torch._zccl_backend(group, "test")
    with tempfile.TemporaryFile(mode="w+") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            backend.shutdown()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read()
    m = re.findall(r"direct path \(one pass over the peers' registered buffers\): (\d+) calls on host memory", text)
    return int(m[-1]) if m else 0


def run_calls(rank, n, alloc, group):
    """Every call on tensors from alloc(count, dtype); returns (number of calls that move at least 32 KiB, problems)."""
    problems, big_calls = [], 0
    for dtype in (torch.float32, torch.float64, torch.int32, torch.bfloat16):
        for count in (BIG, SMALL):
            big = count * torch.empty(0, dtype=dtype).element_size() >= 32 << 10
            # all_reduce, in place
            t = alloc(count, dtype)
            t.copy_(values(rank, count, dtype))
            dist.all_reduce(t, group=group)
            if not torch.equal(t.to(torch.float64), reference_sum(n, count, dtype)):
                problems.append(f"all_reduce {dtype} {count}")
            big_calls += big
            # all_gather_into_tensor: output n * count
            inp, out = alloc(count, dtype), alloc(n * count, dtype)
            inp.copy_(values(rank, count, dtype, 1))
            dist.all_gather_into_tensor(out, inp, group=group)
            want = torch.cat([values(r, count, torch.float64, 1) for r in range(n)])
            if not torch.equal(out.to(torch.float64), want):
                problems.append(f"all_gather_into_tensor {dtype} {count}")
            big_calls += n * count * inp.element_size() >= 32 << 10
            # reduce_scatter_tensor: input n * count
            inp, out = alloc(n * count, dtype), alloc(count, dtype)
            inp.copy_(values(rank, n * count, dtype, 2))
            dist.reduce_scatter_tensor(out, inp, group=group)
            want = reference_sum(n, n * count, dtype, 2)[rank * count:(rank + 1) * count]
            if not torch.equal(out.to(torch.float64), want):
                problems.append(f"reduce_scatter_tensor {dtype} {count}")
            big_calls += n * count * inp.element_size() >= 32 << 10
            # broadcast from the last rank
            t = alloc(count, dtype)
            t.copy_(values(rank, count, dtype, 3))
            dist.broadcast(t, src=n - 1, group=group)
            if not torch.equal(t.to(torch.float64), values(n - 1, count, torch.float64, 3)):
                problems.append(f"broadcast {dtype} {count}")
            big_calls += big
    return big_calls, problems


def shm_blocks():
    return len(glob.glob(f"/dev/shm/zccl-mem-*-p{os.getpid()}"))


def blocks_left(base, within_s=5.0):
    """Blocks above base once freed tensors are gone: the backend's lane thread drops its own references to a call's
    tensors just after it completes the call's Work, so the last tensor's block may go a moment after the caller's
    `del`; a block still there after within_s is a leak."""
    deadline = time.monotonic() + within_s
    while True:
        gc.collect()
        left = shm_blocks() - base
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def collectives(rank, n):
    """The calls on ordinary tensors in a subgroup (no direct path may be counted), then on registered tensors in
    the default group (each call of at least 32 KiB counted); a tensor shaped by empty_registered; results exact."""
    plain = dist.new_group(list(range(n)))
    _, problems_plain = run_calls(rank, n, lambda c, d: torch.zeros(c, dtype=d), plain)
    direct_plain = direct_calls_at_shutdown(plain)
    del plain
    blocks0 = shm_blocks()
    big_calls, problems = run_calls(rank, n, lambda c, d: zccl_torch.empty_registered(c, dtype=d), None)
    t2 = zccl_torch.empty_registered((3, 5), dtype=torch.float64)
    shape_ok = tuple(t2.shape) == (3, 5) and t2.dtype == torch.float64 and float(t2.abs().sum()) == 0.0
    del t2
    blocks_after_free = blocks_left(blocks0)     # every registered tensor above is gone: their blocks freed
    kept = zccl_torch.empty_registered(BIG)      # outlives the group's communicators
    kept.fill_(1.0)
    direct = direct_calls_at_shutdown(None)
    kept.add_(1.0)                               # still ordinary memory to use
    kept_ok = float(kept.sum()) == 2.0 * BIG
    del kept
    gc.collect()
    try:
        zccl_torch.empty_registered(4)
        refused_after_shutdown = ""
    except ValueError as e:
        refused_after_shutdown = str(e)
    return dict(problems=problems_plain + problems, direct_plain=direct_plain, direct=direct, big_calls=big_calls,
                shape_ok=shape_ok, blocks_after_free=blocks_after_free, kept_ok=kept_ok,
                refused_after_shutdown=refused_after_shutdown, blocks_end=blocks_left(blocks0))


def bad_input(rank, n):
    errors = {}
    for name, call in (("negative", lambda: zccl_torch.empty_registered(-1)),
                       ("negative_dim", lambda: zccl_torch.empty_registered((2, -3))),
                       ("gloo", lambda: zccl_torch.empty_registered(4, group=dist.new_group(backend="gloo")))):
        try:
            call()
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    return errors

"""Ranks that fail on purpose: one killed inside an all-reduce, and ranks that disagree on size or dtype."""
import os
import signal
import time

import torch
import torch.distributed as dist


def killed_mid_allreduce(rank, n, victim):
    """The victim starts a large all-reduce and kills itself while it runs; the others report what wait() raised
    and how long it took."""
    dist.all_reduce(torch.ones(8))  # everyone connected
    big = torch.ones(16 << 20)  # 64 MiB: the all-reduce is still running when the victim dies
    work = dist.all_reduce(big, async_op=True)
    if rank == victim:
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        work.wait()
        while True:  # the first call may have finished before the victim died: the next one cannot
            dist.all_reduce(big)
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0}


def mismatched(rank, n):
    """Rank 0 passes a different element count ("size"), then a different dtype ("dtype"), from the others; each
    case on its own group (a failed collective breaks its communicators for good)."""
    groups = {"size": None, "dtype": dist.new_group(list(range(n)))}
    out = {}
    for what, group in groups.items():
        dist.all_reduce(torch.ones(8), group=group)
        if what == "size":
            t = torch.ones(4096 + (1000 if rank == 0 else 0))
        else:
            t = torch.ones(4096, dtype=torch.float64 if rank == 0 else torch.float32)
        t0 = time.monotonic()
        try:
            dist.all_reduce(t, group=group)
            out[what] = {"error": None, "seconds": time.monotonic() - t0}
        except RuntimeError as e:
            out[what] = {"error": str(e), "seconds": time.monotonic() - t0}
    return out


def abort_unblocks(rank, n):
    """Rank 0 starts an all-reduce that rank 1 never joins, then aborts the group from its main thread: wait()
    must raise promptly instead of waiting for the peer or the timeout."""
    dist.all_reduce(torch.ones(8))
    if rank == 1:
        time.sleep(3.0)  # stays away from the collective until rank 0 has aborted
        return {"error": None, "seconds": 0.0}
    pg = dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):  # torch 2.x: zccl's object is the group's CPU backend
        pg = pg._get_backend(torch.device("cpu"))
    work = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    time.sleep(0.3)
    t0 = time.monotonic()
    pg.abort()
    try:
        work.wait()
        return {"error": None, "seconds": time.monotonic() - t0}
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0}


def timeout_names_peer(rank, n):
    """A group created with a 3 s timeout: rank 1 stays away from its all-reduce for 6 s, so rank 0's fails after
    about 3 s (zccl's deadline, taken from the group's timeout), naming rank 1."""
    import datetime

    g = dist.new_group(list(range(n)), timeout=datetime.timedelta(seconds=3))
    dist.all_reduce(torch.ones(8), group=g)
    if rank == 1:
        time.sleep(6.0)
        return {"error": None, "seconds": 0.0}
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 16), group=g)
        return {"error": None, "seconds": time.monotonic() - t0}
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0}

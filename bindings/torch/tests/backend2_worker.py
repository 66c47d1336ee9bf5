"""Rank functions for test_backend2.py: the parts of the c10d Backend / Work API that torch 2.x and its frameworks
use (sequence numbers, timeouts, the Work API, in-place layouts, shutdown/abort, registration)."""
import datetime
import time

import torch
import torch.distributed as dist


def backend(group=None):
    """zccl's own object: torch 1.x's process group itself, torch 2.x's CPU backend of the group."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):
        return pg._get_backend(torch.device("cpu"))
    return pg


def sequence_numbers(rank, n):
    """Every operation counts one, the same on every rank; set restarts at 0; object collectives on a subgroup
    (which need them on torch 2.x) carry the objects."""
    be = backend()
    be._set_sequence_number_for_group()
    s0 = be._get_sequence_number_for_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    dist.broadcast(torch.ones(2), 0)
    s1 = be._get_sequence_number_for_group()
    sub = dist.new_group([0, 1])
    objs = None
    if rank in (0, 1):
        got = [None, None]
        dist.all_gather_object(got, {"rank": rank, "text": "x" * (rank + 3)}, group=sub)
        lst = [f"from {rank}", rank * 10]
        dist.broadcast_object_list(lst, src=1, group=sub)
        objs = (got, lst)
    return {"s0": s0, "s1": s1, "objs": objs}


def timeout_message(rank, n):
    """Rank 1 stays away from an all-reduce for longer than the group's 2 s timeout: rank 0's raises with the
    words torch's tests and users match, as DistBackendError where torch has it."""
    g = dist.new_group(list(range(n)), timeout=datetime.timedelta(seconds=2))
    dist.all_reduce(torch.ones(8), group=g)
    if rank == 1:
        time.sleep(5.0)
        return None
    try:
        dist.all_reduce(torch.ones(1 << 12), group=g)
    except RuntimeError as e:
        return {"msg": str(e), "type": type(e).__name__,
                "dist_backend_error": isinstance(e, dist.DistBackendError) if hasattr(dist, "DistBackendError")
                else None}
    return {"msg": None}


def work_api(rank, n):
    """getFuture / result / wait(timeout): a wait shorter than the peer's delay raises and the Work still
    completes afterwards with the right value."""
    out = {}
    t = torch.full((5,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    val = fut.wait()
    out["future"] = [x.tolist() for x in val]
    out["result"] = [x.tolist() for x in w.result()]
    out["wait_true"] = w.wait(timeout=datetime.timedelta(seconds=30))
    out["completed"] = w.is_completed() and w.is_success()
    # rank 1 joins 1.5 s late: rank 0's 0.2 s wait raises, its later wait() completes
    if rank == 1:
        time.sleep(1.5)
    t2 = torch.full((3,), float(rank + 1))
    w2 = dist.all_reduce(t2, async_op=True)
    out["short_wait_error"] = None
    if rank == 0:
        try:
            w2.wait(timeout=datetime.timedelta(milliseconds=200))
        except RuntimeError as e:
            out["short_wait_error"] = str(e)
    w2.wait()
    out["late"] = t2.tolist()
    # a chained future (DDP's comm hooks do this)
    t3 = torch.full((4,), float(rank))
    fut3 = dist.all_reduce(t3, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    out["then"] = fut3.wait().tolist()
    return out


def in_place(rank, n):
    """All-gather whose input is the output's own slice, reduce-scatter whose output is the input's own slice
    (FSDP2 and DeepSpeed do both): correct, and the output tensor is the one the caller passed."""
    k = 7
    out = torch.full((n * k,), -1.0)
    mine = out.narrow(0, rank * k, k)
    mine.copy_(torch.arange(k, dtype=torch.float32) + 100 * rank)
    ptr = out.data_ptr()
    dist.all_gather_into_tensor(out, mine)
    ag = out.tolist()
    inp = torch.cat([torch.arange(k, dtype=torch.float32) * (r + 1) + rank for r in range(n)])
    own = inp.narrow(0, rank * k, k)
    dist.reduce_scatter_tensor(own, inp)
    rs = own.tolist()
    return {"ag": ag, "rs": rs, "same_storage": out.data_ptr() == ptr}


def shutdown_twice(rank, n):
    """shutdown() and abort() are idempotent; an operation after them raises naming the cause."""
    dist.all_reduce(torch.ones(4))
    dist.barrier()
    be = backend()
    be.shutdown()
    be.shutdown()
    be.abort()
    be.abort()
    try:
        dist.all_reduce(torch.ones(4))
        after = None
    except (RuntimeError, ValueError) as e:  # refused before it runs: ValueError
        after = str(e)
    return {"after": after}


def registration(rank, n):
    caps = getattr(dist.Backend, "backend_capability", None)
    return {"caps": caps.get("zccl") if caps else None, "name": dist.get_backend(),
            "type": type(backend()).__name__}


def fp8(rank, n):
    """torch >= 2.1's float8_e4m3fn and float8_e5m2 (zccl's FLOAT8E4M3 / E5M2): all_reduce SUM, AVG, MIN, MAX and
    PREMUL_SUM, reduce_scatter_tensor, all_gather_into_tensor, broadcast, isend/irecv. The inputs are multiples of
    0.5 up to 1, so every partial sum at up to 4 ranks is exact in both formats and any summation order gives the
    reference; returns the failures."""
    fails = []
    count = 24

    def vals(r, dt):
        return (((torch.arange(count) + 3 * r) % 3) * 0.5).to(dt)  # 0, 0.5, 1

    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        xs = [vals(r, dt).float() for r in range(n)]
        stack = torch.stack(xs)
        cases = {"sum": (dist.ReduceOp.SUM, stack.sum(0)), "min": (dist.ReduceOp.MIN, stack.min(0).values),
                 "max": (dist.ReduceOp.MAX, stack.max(0).values),
                 "premul 0.5": (dist._make_nccl_premul_sum(0.5), stack.sum(0) * 0.5)}
        if n in (2, 4):  # sum / n exact in the format
            cases["avg"] = (dist.ReduceOp.AVG, stack.sum(0) / n)
        for name, (op, ref) in cases.items():
            t = vals(rank, dt)
            dist.all_reduce(t, op=op)
            if not torch.equal(t.float(), ref.to(dt).float()):
                fails.append(f"{dt} all_reduce {name}: {t.float()[:6].tolist()} != {ref[:6].tolist()}")
        out = torch.empty(count // n if count % n == 0 else 0, dtype=dt)
        if count % n == 0:
            dist.reduce_scatter_tensor(out, vals(rank, dt))
            want = stack.sum(0)[rank * (count // n):(rank + 1) * (count // n)]
            if not torch.equal(out.float(), want):
                fails.append(f"{dt} reduce_scatter_tensor")
        g = torch.empty(count * n, dtype=dt)
        dist.all_gather_into_tensor(g, vals(rank, dt))
        if not torch.equal(g.float(), torch.cat(xs)):
            fails.append(f"{dt} all_gather_into_tensor")
        b = vals(rank, dt)
        dist.broadcast(b, src=n - 1)
        if not torch.equal(b.float(), xs[n - 1]):
            fails.append(f"{dt} broadcast")
        got = torch.empty(count, dtype=dt)
        reqs = [dist.isend(vals(rank, dt), (rank + 1) % n), dist.irecv(got, (rank - 1) % n)]
        for q in reqs:
            q.wait()
        if not torch.equal(got.float(), xs[(rank - 1) % n]):
            fails.append(f"{dt} isend/irecv")
    return fails

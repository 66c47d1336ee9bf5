"""Every c10d operation x dtype on one rank of a job, checked against references this file computes itself.

Each rank builds every rank's input from (rank, case) alone, so it can compute the expected result without any
communication. Returns a list of failures (empty: all passed); the test prints them.
"""
import functools

import torch
import torch.distributed as dist

R = dist.ReduceOp
# reductions by name (torch 1.13's ReduceOp does not compare with other types)
OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul"]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
ALL = FLOATS + INTS + [torch.bool]
COUNT = 37  # odd, not a multiple of any vector width


def values(rank, dtype, count=COUNT, small=False, salt=0):
    """Small integers (exact in every dtype): 1..2 for products, 0..4 otherwise, 0/1 for bool."""
    i = torch.arange(count, dtype=torch.int64) + 7 * rank + salt
    if dtype == torch.bool:
        return (i % 2 == 1) | (i % 3 == 0)
    v = (i % 2 + 1) if small else (i % 5)
    return v.to(dtype)


def reference(op, dtype, n, count=COUNT, factor=None):
    xs = [values(r, dtype, count, small=(op == "product")) for r in range(n)]
    if dtype == torch.bool:
        b = torch.stack(xs)
        if op in ("sum", "max", "bor"):
            return b.any(0)
        if op in ("product", "min", "band"):
            return b.all(0)
        if op == "bxor":
            return functools.reduce(torch.logical_xor, xs)
    wide = torch.stack([x.to(torch.float64 if dtype.is_floating_point else torch.int64) for x in xs])
    if op == "sum":
        out = wide.sum(0)
    elif op == "product":
        out = wide.prod(0)
    elif op == "min":
        out = wide.min(0).values
    elif op == "max":
        out = wide.max(0).values
    elif op == "avg":
        out = wide.sum(0) / n if dtype.is_floating_point else torch.div(wide.sum(0), n, rounding_mode="trunc")
    elif op == "band":
        out = functools.reduce(torch.bitwise_and, list(wide))
    elif op == "bor":
        out = functools.reduce(torch.bitwise_or, list(wide))
    elif op == "bxor":
        out = functools.reduce(torch.bitwise_xor, list(wide))
    elif op == "premul":
        out = (wide * factor).sum(0)
    return out.to(dtype)


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2)
    if a.dtype.is_floating_point:
        return torch.allclose(a, b, rtol=1e-6, atol=0)
    return torch.equal(a, b)


def valid(op, dtype):
    if op in ("band", "bor", "bxor"):
        return not dtype.is_floating_point
    if op == "avg":
        return dtype != torch.bool
    if op == "premul":
        return dtype.is_floating_point
    return True


def make_op(op, factor=None):
    return dist._make_nccl_premul_sum(factor) if op == "premul" else getattr(R, op.upper())


def check(fails, cond, what):
    if not cond:
        fails.append(what)


def run(rank, n):
    fails = []
    ops = OPS
    factor = 0.5

    # ---- all_reduce: every op x dtype; invalid pairs must raise naming the cause ----
    for op in ops:
        for dt in ALL:
            name = f"all_reduce {op} {dt}"
            t = values(rank, dt, small=(op == "product"))
            if not valid(op, dt):
                try:
                    dist.all_reduce(t, op=make_op(op, factor))
                    fails.append(f"{name}: accepted an invalid combination")
                except (ValueError, RuntimeError) as e:
                    check(fails, "zccl_torch" in str(e), f"{name}: unclear error {e}")
                continue
            dist.all_reduce(t, op=make_op(op, factor))
            check(fails, same(t, reference(op, dt, n, factor=factor)), f"{name}: {t} != {reference(op, dt, n, factor=factor)}")

    # premul with a tensor factor, and a large all-reduce (several chunks)
    t = values(rank, torch.float32)
    try:  # torch 1.13 takes one factor tensor per device, torch 2.x one tensor
        premul = dist._make_nccl_premul_sum([torch.tensor([0.25])])
    except TypeError:
        premul = dist._make_nccl_premul_sum(torch.tensor([0.25]))
    dist.all_reduce(t, op=premul)
    check(fails, same(t, reference("premul", torch.float32, n, factor=0.25)), "all_reduce premul tensor factor")
    big = 300_000
    t = values(rank, torch.float32, big)
    dist.all_reduce(t)
    check(fails, same(t, reference("sum", torch.float32, n, big)), "all_reduce 300k float32")

    # non-contiguous tensors: copied and written back
    base = torch.stack([values(rank, torch.float32), values(rank, torch.float32, salt=1)], 1)  # 37x2
    view = base.t()  # 2x37, not contiguous
    dist.all_reduce(view)
    exp = torch.stack([reference("sum", torch.float32, n),
                       torch.stack([values(r, torch.float32, salt=1) for r in range(n)]).sum(0)])
    check(fails, same(view.contiguous(), exp), "all_reduce non-contiguous")

    # all_reduce_coalesced (deprecated API, still the c10d op)
    ts = [values(rank, torch.float64), values(rank, torch.float64, 5)]
    dist.all_reduce_coalesced(ts, op=make_op("max"))
    check(fails, same(ts[0], reference("max", torch.float64, n)) and
          same(ts[1], reference("max", torch.float64, n, 5)), "all_reduce_coalesced")

    # async: Work, future, result
    t = values(rank, torch.int64)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    w.wait()
    check(fails, w.is_completed(), "work not completed after wait")
    check(fails, same(fut.wait()[0], reference("sum", torch.int64, n)), "future value")
    check(fails, same(w.result()[0], reference("sum", torch.int64, n)), "work.result()")

    for dt in ALL:
        # ---- broadcast from every root ----
        for root in range(n):
            t = values(rank, dt)
            dist.broadcast(t, src=root)
            check(fails, same(t, values(root, dt)), f"broadcast {dt} root {root}")
        # ---- reduce to the last root, SUM / MAX / BXOR ----
        root = n - 1
        for op in ("sum", "max", "bxor"):
            if not valid(op, dt):
                continue
            t = values(rank, dt)
            dist.reduce(t, dst=root, op=make_op(op))
            if rank == root:
                check(fails, same(t, reference(op, dt, n)), f"reduce {op} {dt}")
        # ---- all_gather (list), all_gather_into_tensor ----
        outs = [torch.zeros(COUNT, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, values(rank, dt))
        check(fails, all(same(outs[r], values(r, dt)) for r in range(n)), f"all_gather {dt}")
        flat = torch.zeros(n * COUNT, dtype=dt)
        dist.all_gather_into_tensor(flat, values(rank, dt))
        check(fails, same(flat, torch.cat([values(r, dt) for r in range(n)])), f"all_gather_into_tensor {dt}")
        # ---- gather / scatter to and from root 0 ----
        root = 0
        gl = [torch.zeros(COUNT, dtype=dt) for _ in range(n)] if rank == root else None
        dist.gather(values(rank, dt), gather_list=gl, dst=root)
        if rank == root:
            check(fails, all(same(gl[r], values(r, dt)) for r in range(n)), f"gather {dt}")
        out = torch.zeros(COUNT, dtype=dt)
        sl = [values(r, dt, salt=3) for r in range(n)] if rank == root else None
        dist.scatter(out, scatter_list=sl, src=root)
        check(fails, same(out, values(rank, dt, salt=3)), f"scatter {dt}")
        # ---- reduce_scatter (list) and reduce_scatter_tensor, SUM and MIN ----
        for op in ("sum", "min", "bor"):
            if not valid(op, dt):
                continue
            full = reference(op, dt, n, COUNT * n)
            inp = values(rank, dt, COUNT * n)
            out = torch.zeros(COUNT, dtype=dt)
            dist.reduce_scatter_tensor(out, inp, op=make_op(op))
            check(fails, same(out, full[rank * COUNT:(rank + 1) * COUNT]), f"reduce_scatter_tensor {op} {dt}")
            out = torch.zeros(COUNT, dtype=dt)
            dist.reduce_scatter(out, list(values(rank, dt, COUNT * n).chunk(n)), op=make_op(op))
            check(fails, same(out, full[rank * COUNT:(rank + 1) * COUNT]), f"reduce_scatter {op} {dt}")
        # ---- all_to_all_single: equal and uneven splits ----
        rows = 3 * n
        inp = torch.stack([values(rank, dt, 2, salt=j) for j in range(rows)])  # rows x 2
        out = torch.zeros_like(inp)
        dist.all_to_all_single(out, inp)
        exp = torch.cat([torch.stack([values(r, dt, 2, salt=j) for j in range(rows)])[3 * rank:3 * rank + 3]
                         for r in range(n)])
        check(fails, same(out, exp), f"all_to_all_single equal {dt}")
        # rank r sends (r + p) % 3 rows to p
        split = lambda src, dst: (src + dst) % 3  # noqa: E731
        in_splits = [split(rank, p) for p in range(n)]
        out_splits = [split(p, rank) for p in range(n)]
        inp = torch.stack([values(rank, dt, 2, salt=j) for j in range(sum(in_splits))]) if sum(in_splits) else \
            torch.zeros(0, 2, dtype=dt)
        out = torch.zeros(sum(out_splits), 2, dtype=dt)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        parts = []
        for p in range(n):
            off = sum(split(p, q) for q in range(rank))
            parts += [values(p, dt, 2, salt=off + j) for j in range(split(p, rank))]
        exp = torch.stack(parts) if parts else torch.zeros(0, 2, dtype=dt)
        check(fails, same(out, exp), f"all_to_all_single uneven {dt}")
        # ---- all_to_all (lists, uneven sizes) ----
        ins = [values(rank, dt, rank + p + 1, salt=p) for p in range(n)]
        outs = [torch.zeros(p + rank + 1, dtype=dt) for p in range(n)]
        dist.all_to_all(outs, ins)
        check(fails, all(same(outs[p], values(p, dt, p + rank + 1, salt=rank)) for p in range(n)), f"all_to_all {dt}")

    # all-to-all with 4 MiB blocks: larger than zccl's shared-memory FIFO, so a transfer completes only while its
    # receiver is receiving (zccl_alltoall progresses all of them together)
    blk = 1 << 20
    inp = torch.cat([values(rank, torch.float32, blk, salt=p) for p in range(n)])
    out = torch.empty(n * blk)
    dist.all_to_all_single(out, inp)
    check(fails, all(same(out[p * blk:(p + 1) * blk], values(p, torch.float32, blk, salt=rank)) for p in range(n)),
          "all_to_all_single 4 MiB blocks")

    # all_gather_coalesced (deprecated API, still a c10d op)
    outs = [[torch.zeros(3), torch.zeros(2, 2)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [values(rank, torch.float32, 3), values(rank, torch.float32, 4).view(2, 2)])
    check(fails, all(same(outs[r][0], values(r, torch.float32, 3)) and same(outs[r][1], values(r, torch.float32, 4).view(2, 2))
                     for r in range(n)), "all_gather_coalesced")

    # ---- point to point: a ring, and a pairwise exchange where both sides send first (large messages) ----
    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        big = 1 << 20  # 4 MiB of float32: zccl's blocking send waits for the receiver
        s = values(rank, torch.float32, big)
        r = torch.zeros(big)
        reqs = [dist.isend(s, nxt), dist.irecv(r, prv)]
        for q in reqs:
            q.wait()
        check(fails, same(r, values(prv, torch.float32, big)), "isend/irecv ring (both send first)")
        if n % 2 == 0:
            peer = rank ^ 1
            t = values(rank, torch.int64)
            if rank % 2 == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                got = torch.zeros_like(t)
                dist.recv(got, peer)
                dist.send(t, peer)
                t = got
            check(fails, same(t, values(rank ^ 1, torch.int64)), "send/recv pair")
        # recv from any source: test_anysource.py

    # ---- every dtype over isend/irecv (a ring), and a broadcast into a non-contiguous view ----
    if n > 1:
        for dt in ALL:
            got = torch.zeros(COUNT, dtype=dt)
            reqs = [dist.isend(values(rank, dt), (rank + 1) % n), dist.irecv(got, (rank - 1) % n)]
            for q in reqs:
                q.wait()
            check(fails, same(got, values((rank - 1) % n, dt)), f"isend/irecv {dt}")
    base = torch.zeros(COUNT, 3)
    view = base[:, 1]  # stride 3
    if rank == 0:
        view.copy_(values(0, torch.float32))
    dist.broadcast(view, src=0)
    check(fails, same(base[:, 1].contiguous(), values(0, torch.float32)) and not base[:, 0].any(),
          "broadcast into a strided view")

    # ---- barriers ----
    dist.barrier()
    if n > 1:
        # torch's Python monitored_barrier() accepts only gloo; the process group's own method is the c10d op
        import datetime
        pg = dist.distributed_c10d._get_default_group()
        pg.monitored_barrier(datetime.timedelta(seconds=20), True)

    # ---- sub-groups (new_group): the even ranks ----
    evens = list(range(0, n, 2))
    g = dist.new_group(evens)
    if rank in evens:
        t = values(rank, torch.float32)
        dist.all_reduce(t, group=g)
        exp = torch.stack([values(r, torch.float32) for r in evens]).sum(0)
        check(fails, same(t, exp), "all_reduce on new_group(evens)")
    dist.barrier()
    return fails

"""Coalescing blocks (one zccl group each) and PREMUL_SUM's native path on one rank of a job, checked against
references this file computes itself (from rank and case alone). Returns a list of failures (empty: passed)."""
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ops_worker import check, reference, same, values

BLK = 1 << 19  # 2 MiB of float32 per peer: beyond zccl's shared-memory FIFO, so a lone blocking send would wait


def _coalesced(ops):
    """Runs ops() inside torch's coalescing manager (torch 1.13: _coalescing_manager(group, reqs); torch >= 2.1
    takes keyword arguments and returns its own Work), then waits for every Work the ops returned."""
    reqs = []
    pg = c10d._get_default_group()
    try:
        mgr = c10d._coalescing_manager(pg, reqs)
    except TypeError:
        mgr = c10d._coalescing_manager(group=pg)
    with mgr:
        works = ops()
    for w in works:
        w.wait()


def _a2a_p2p(rank, n, order, self_too, blk):
    """An all-to-all written as batch_isend_irecv: block p of this rank's input goes to rank p."""
    ins = [values(rank, torch.float32, blk, salt=p) for p in range(n)]
    outs = [torch.zeros(blk) for _ in range(n)]
    peers = [p for p in range(n) if self_too or p != rank]
    if not peers:  # one rank without its self block: torch refuses an empty list
        return True
    sends = [dist.P2POp(dist.isend, ins[p], p) for p in peers]
    recvs = [dist.P2POp(dist.irecv, outs[p], p) for p in peers]
    if order == "sends_first":
        ops = sends + recvs
    elif order == "recvs_first":
        ops = recvs + sends
    else:  # interleaved, each rank in a different rotation
        ops = [x for pair in zip(sends, recvs) for x in pair]
        ops = ops[2 * rank % len(ops):] + ops[:2 * rank % len(ops)] if ops else ops
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    ok = all(same(outs[p], values(p, torch.float32, blk, salt=rank)) for p in peers)
    ok = ok and (self_too or not outs[rank].any())
    return ok


def run(rank, n):
    fails = []

    # ---- batch_isend_irecv: an all-to-all in every posting order, with and without the block to oneself ----
    for order in ("sends_first", "recvs_first", "interleaved"):
        for self_too in (False, True):
            check(fails, _a2a_p2p(rank, n, order, self_too, BLK if order != "interleaved" else 1000),
                  f"batch_isend_irecv all-to-all {order} self={self_too}")
    # a ring shift where every rank sends first (two lanes were needed for this before groups)
    got = torch.zeros(BLK)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, values(rank, torch.float32, BLK), (rank + 1) % n),
                                   dist.P2POp(dist.irecv, got, (rank - 1) % n)])
    for w in reqs:
        w.wait()
    check(fails, same(got, values((rank - 1) % n, torch.float32, BLK)), "batch_isend_irecv ring")
    # several messages to the same peer keep their order; non-contiguous receive buffers are written back
    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        base = torch.zeros(7, 3)
        a, b = torch.zeros(7), base[:, 2]
        ops = [dist.P2POp(dist.irecv, a, prv), dist.P2POp(dist.irecv, b, prv),
               dist.P2POp(dist.isend, values(rank, torch.float32, 7, salt=1), nxt),
               dist.P2POp(dist.isend, values(rank, torch.float32, 7, salt=2), nxt)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(fails, same(a, values(prv, torch.float32, 7, salt=1)) and
              same(base[:, 2].contiguous(), values(prv, torch.float32, 7, salt=2)) and not base[:, :2].any(),
              "batch_isend_irecv ordered messages, strided receive")

    # a self send without its receive: the group refuses it, naming the cause, on this rank only
    try:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(3), rank)]):
            w.wait()
        fails.append("batch_isend_irecv: a self send without its receive was accepted")
    except RuntimeError as e:
        check(fails, "zccl_torch" in str(e) and "coalesced block" in str(e), f"self send error unclear: {e}")
    # outside a block a self send is refused at once
    try:
        dist.isend(torch.ones(3), rank)
        fails.append("isend to oneself outside a block was accepted")
    except (ValueError, RuntimeError) as e:
        check(fails, "itself" in str(e), f"isend to oneself error unclear: {e}")

    # ---- a coalesced block of mixed collectives and messages (torch's coalescing manager) ----
    ar = values(rank, torch.float32)
    bx = values(rank, torch.int32)
    bc = values(rank, torch.int64)
    ag = [torch.zeros(5, dtype=torch.float64) for _ in range(n)]
    rs = torch.zeros(4)
    pm = values(rank, torch.float64)
    ring = torch.zeros(9)

    def block():
        w = [dist.all_reduce(ar, async_op=True),
             dist.all_reduce(bx, op=dist.ReduceOp.BXOR, async_op=True),  # all-gather + local reduction after the group
             dist.broadcast(bc, src=n - 1, async_op=True),
             dist.all_gather(ag, values(rank, torch.float64, 5), async_op=True),
             dist.reduce_scatter_tensor(rs, values(rank, torch.float32, 4 * n), async_op=True),
             dist.all_reduce(pm, op=dist._make_nccl_premul_sum(0.25), async_op=True)]
        if n > 1:
            w.append(dist.irecv(ring, (rank - 1) % n))
            w.append(dist.isend(values(rank, torch.float32, 9, salt=5), (rank + 1) % n))
        return w

    if int(torch.__version__.split(".")[0]) >= 2:
        # torch 2.x's coalescing manager records the all_reduces of a block and issues them as ONE
        # allreduce_coalesced with the first one's operator (it refuses mixing them with all-gathers or
        # reduce-scatters): the block is two SUM all-reduces and a ring of messages, one zccl group
        ar2 = values(rank, torch.float32, salt=3)
        with c10d._coalescing_manager(group=c10d._get_default_group(), device=torch.device("cpu"),
                                      async_ops=True) as cm:
            dist.all_reduce(ar)
            dist.all_reduce(ar2)
            if n > 1:
                dist.irecv(ring, (rank - 1) % n)
                dist.isend(values(rank, torch.float32, 9, salt=5), (rank + 1) % n)
        cm.wait()
        check(fails, same(ar, reference("sum", torch.float32, n)), "2.x block: all_reduce")
        want2 = sum(values(r, torch.float32, salt=3).double() for r in range(n)).float()
        check(fails, same(ar2, want2), "2.x block: second all_reduce")
        if n > 1:
            check(fails, same(ring, values((rank - 1) % n, torch.float32, 9, salt=5)), "2.x block: isend/irecv ring")
        block = None
    if block is not None:
        _coalesced(block)
        check(fails, same(ar, reference("sum", torch.float32, n)), "block: all_reduce")
        check(fails, same(bx, reference("bxor", torch.int32, n)), "block: all_reduce BXOR")
        check(fails, same(bc, values(n - 1, torch.int64)), "block: broadcast")
        check(fails, all(same(ag[r], values(r, torch.float64, 5)) for r in range(n)), "block: all_gather")
        full = reference("sum", torch.float32, n, 4 * n)
        check(fails, same(rs, full[4 * rank:4 * rank + 4]), "block: reduce_scatter_tensor")
        check(fails, same(pm, reference("premul", torch.float64, n, factor=0.25)), "block: all_reduce PREMUL_SUM")
        if n > 1:
            check(fails, same(ring, values((rank - 1) % n, torch.float32, 9, salt=5)), "block: isend/irecv ring")

    # ---- native all-to-all in place (the same tensor as input and output), equal and uneven splits ----
    t = torch.stack([values(rank, torch.int64, 3, salt=p) for p in range(n)])  # row p goes to rank p
    dist.all_to_all_single(t, t)
    check(fails, all(same(t[p], values(p, torch.int64, 3, salt=rank)) for p in range(n)), "all_to_all_single in place")
    t = torch.stack([values(rank, torch.int64, 3, salt=p) for p in range(n)])
    dist.all_to_all_single(t, t, [1] * n, [1] * n)  # explicit splits: zccl_alltoallv, given a scratch output
    check(fails, all(same(t[p], values(p, torch.int64, 3, salt=rank)) for p in range(n)),
          "all_to_all_single in place, explicit splits")
    # ---- gather / scatter with the last rank as root, into and out of strided tensors ----
    root = n - 1
    gbase = torch.zeros(5, 2 * n, dtype=torch.int16) if rank == root else None
    gl = [gbase[:, 2 * r] for r in range(n)] if rank == root else None
    dist.gather(values(rank, torch.int16, 5), gather_list=gl, dst=root)
    if rank == root:
        check(fails, all(same(gl[r].contiguous(), values(r, torch.int16, 5)) for r in range(n)) and
              not gbase[:, 1::2].any(), "gather to the last rank, strided outputs")
    sbase = torch.zeros(5, 2)
    sl = [values(r, torch.float32, 10, salt=4).view(5, 2)[:, 1] for r in range(n)] if rank == root else None
    dist.scatter(sbase[:, 0], scatter_list=sl, src=root)
    check(fails, same(sbase[:, 0].contiguous(), values(rank, torch.float32, 10, salt=4).view(5, 2)[:, 1].contiguous())
          and not sbase[:, 1].any(), "scatter from the last rank, strided input and output")

    # ---- PREMUL_SUM's native path (a zccl PreMulSum handle): float factors and one-element tensor factors ----
    third = 1.0 / 3.0
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        exp = _premul_ref(dt, n, third)
        t = values(rank, dt)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(third))
        check(fails, same(t, exp), f"premul all_reduce float factor {dt}: {t} != {exp}")
        t = values(rank, dt)
        dist.reduce(t, dst=0, op=dist._make_nccl_premul_sum(third))
        if rank == 0:
            check(fails, same(t, exp), f"premul reduce {dt}")
        full = _premul_ref(dt, n, third, 3 * n)
        out = torch.zeros(3, dtype=dt)
        dist.reduce_scatter_tensor(out, values(rank, dt, 3 * n), op=dist._make_nccl_premul_sum(third))
        check(fails, same(out, full[3 * rank:3 * rank + 3]), f"premul reduce_scatter_tensor {dt}")
        out = torch.zeros(3, dtype=dt)
        dist.reduce_scatter(out, list(values(rank, dt, 3 * n).chunk(n)), op=dist._make_nccl_premul_sum(third))
        check(fails, same(out, full[3 * rank:3 * rank + 3]), f"premul reduce_scatter {dt}")
    for shape in ((), (1,)):  # a 0-dim and a one-element CPU tensor factor, read when the operation runs
        f = torch.tensor(0.75).reshape(shape)
        try:
            op = dist._make_nccl_premul_sum([f])
        except TypeError:
            op = dist._make_nccl_premul_sum(f)
        t = values(rank, torch.float32)
        dist.all_reduce(t, op=op)
        check(fails, same(t, _premul_ref(torch.float32, n, 0.75)), f"premul tensor factor shape {shape}")
    dist.barrier()
    return fails


def _premul_ref(dt, n, factor, count=None):
    """sum over ranks of (factor * x_r), each product rounded to dt (as zccl and NCCL compute it)."""
    kw = {} if count is None else {"count": count}
    prods = [(values(r, dt, **kw) * torch.tensor(factor, dtype=dt)).double() for r in range(n)]
    return torch.stack(prods).sum(0).to(dt)

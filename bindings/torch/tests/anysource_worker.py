"""Receives from any source (recv/irecv without src) on one rank of a job; each function returns a list of failures.

Every message carries its sender's rank and a per-sender sequence number, so the receiver checks what it got and
from whom without any other communication.
"""
import torch
import torch.distributed as dist


def _msg(src, seq, count=5):
    return torch.tensor([src, seq] + [src * 1000 + seq] * (count - 2), dtype=torch.int64)


def _check(fails, cond, what):
    if not cond:
        fails.append(what)


def torch_pattern(rank, n):
    """The pattern of torch's own test_send_recv_any_source: each rank in turn receives 2(n-1) messages from any
    source, half with recv() (which returns the sender) and half with irecv() + Work._source_rank(); every other
    rank sends it two."""
    fails = []
    got = []
    for dst in range(n):
        if dst == rank:
            for _ in range(n - 1):
                for how in ("recv", "irecv"):
                    out = torch.full((5,), -1, dtype=torch.int64)
                    if how == "recv":
                        sender = dist.recv(out)
                    else:
                        w = dist.irecv(out)
                        w.wait()
                        sender = w._source_rank()
                    got.append(sender)
                    _check(fails, out[0].item() == sender, f"{how}: reported sender {sender}, data from {out[0].item()}")
        else:
            dist.send(_msg(rank, 0), dst)
            dist.send(_msg(rank, 1), dst)
    expect = sorted(r for r in range(n) if r != rank for _ in range(2))
    _check(fails, sorted(got) == expect, f"senders {sorted(got)}, expected {expect}")
    return fails


def ordering(rank, n, per=3):
    """Rank 0 receives per*(n-1) messages from any source: each sender's arrive in the order it sent them. Then a
    receive from any source posted before a named receive from the same sender gets that sender's first message."""
    fails = []
    if rank == 0:
        seen = {}
        for _ in range(per * (n - 1)):
            out = torch.zeros(5, dtype=torch.int64)
            src = dist.recv(out)
            _check(fails, torch.equal(out, _msg(src, seen.get(src, 0))),
                   f"message {seen.get(src, 0)} of rank {src}: got {out.tolist()}")
            seen[src] = seen.get(src, 0) + 1
        _check(fails, seen == {r: per for r in range(1, n)}, f"messages per sender {seen}")
        dist.barrier()  # rank 1's next two messages are sent after the loop above (it could pick them otherwise)
        a, b = torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
        w = dist.irecv(a)  # any source, posted first
        dist.recv(b, src=1)
        w.wait()
        _check(fails, w._source_rank() == 1 and torch.equal(a, _msg(1, 100)), f"any-source first: {a.tolist()}")
        _check(fails, torch.equal(b, _msg(1, 101)), f"named after it: {b.tolist()}")
    else:
        for k in range(per):
            dist.send(_msg(rank, k), 0)
        dist.barrier()
        if rank == 1:
            dist.send(_msg(1, 100), 0)
            dist.send(_msg(1, 101), 0)
    return fails


def ring_and_collective(rank, n, count=1 << 20):
    """Every rank irecv()s from any source and then isend()s 8 MiB to the next (the sends must not wait behind the
    receives); then a receive from any source posted before an all_reduce, its sender sending before the all_reduce
    (a collective queued behind a receive from any source waits until the sender is chosen: a sender that sent only
    after the collective would wait for ever, unlike with gloo; docs/torch.md)."""
    fails = []
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    out = torch.zeros(count, dtype=torch.int64)
    w = dist.irecv(out)
    s = dist.isend(torch.arange(count, dtype=torch.int64) + prv * 0 + rank, nxt)
    w.wait()
    s.wait()
    _check(fails, w._source_rank() == prv, f"ring: sender {w._source_rank()}, expected {prv}")
    _check(fails, torch.equal(out, torch.arange(count, dtype=torch.int64) + prv), "ring: wrong data")
    t = torch.ones(3)
    if rank == 0:
        got = torch.zeros(5, dtype=torch.int64)
        w = dist.irecv(got)
        dist.all_reduce(t)
        w.wait()
        _check(fails, w._source_rank() == n - 1 and torch.equal(got, _msg(n - 1, 7)), f"before all_reduce: {got.tolist()}")
    else:
        if rank == n - 1:
            dist.send(_msg(rank, 7), 0)
        dist.all_reduce(t)
    _check(fails, torch.equal(t, torch.full((3,), float(n))), f"all_reduce {t.tolist()}")
    return fails


def timeout_then_usable(rank, n):
    """Rank 0 waits for a message nobody sends: a timeout error naming it; the group still works afterwards."""
    fails = []
    if rank == 0:
        try:
            dist.recv(torch.zeros(1))
            fails.append("a receive from any source without a sender returned")
        except RuntimeError as e:
            _check(fails, " Timed out " in str(e) and "recvAnysource" in str(e), f"timeout message: {e}")
    dist.barrier()
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    _check(fails, torch.equal(t, torch.full((2,), float(sum(range(n))))), f"all_reduce after: {t.tolist()}")
    if rank == 1:
        dist.send(_msg(1, 5), 0)
    if rank == 0:
        got = torch.zeros(5, dtype=torch.int64)
        _check(fails, dist.recv(got) == 1 and torch.equal(got, _msg(1, 5)), f"after the timeout: {got.tolist()}")
    return fails


def refused_when_off(rank, n):
    """ZCCL_TORCH_ANY_SOURCE=0: refused on the caller's thread, naming the setting."""
    fails = []
    try:
        dist.recv(torch.zeros(1))
        fails.append("accepted with ZCCL_TORCH_ANY_SOURCE=0")
    except (ValueError, RuntimeError) as e:
        _check(fails, "ZCCL_TORCH_ANY_SOURCE=0" in str(e), f"unclear refusal: {e}")
    return fails

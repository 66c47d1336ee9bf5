"""Rank functions for test_quantized.py: zccl_torch's quantized collectives (all_reduce_quantized,
all_gather_quantized, reduce_scatter_quantized) against the exact result and the per-element error bound that
include/zccl.h states, recomputed here in float64 from its formulas; and the DDP hook quantized_allreduce_hook."""
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import zccl_torch

U = 2.0 ** -24
TINY = 2.0 ** -140
# output conversion of zccl.h ("Output conversion"): u_out * |y| + a_out
OUT_CONV = {torch.float32: (0.0, 0.0), torch.float64: (0.0, 0.0), torch.float16: (2.0 ** -11, 2.0 ** -25),
            torch.bfloat16: (2.0 ** -8, 2.0 ** -134)}


def block():
    return int(os.environ.get("ZCCL_QUANT_BLOCK", "128"))


def block_amax(v, b):
    """amax of each element's block: blocks of b consecutive elements from v's first element (a shard's start)."""
    m = v.numel()
    if m == 0:
        return v.clone()
    pad = (-m) % b
    a = torch.cat([v.abs(), torch.zeros(pad, dtype=v.dtype)]).view(-1, b).amax(1)
    return a.repeat_interleave(b)[:m]


def quant_err(x, amax, wire, dtype):
    """E(x_i) of one quantization (zccl.h, zccl_wire_t), float64 tensors x and amax; E64 for float64 data."""
    x = x.abs()
    if wire == "int8":
        e = amax / 254
    elif wire == "int4":
        e = amax / 14
    elif wire == "fp8e4m3":
        e = 2.0 ** -4 * x + 2.0 ** -10 * amax / 448
    elif wire == "fp8e5m2":
        e = 2.0 ** -3 * x + 2.0 ** -17 * amax / 57344
    else:
        raise ValueError(wire)
    e = e + 2.0 ** -21 * amax + TINY
    if dtype == torch.float64:
        e = (1 + U) * e + U * x
    return e


def rs_bound(parts, wire, dtype, average):
    """Reduce-scatter of one shard: parts[q] is rank q's float64 slice (blocks from its first element). Returns
    (S, R): the exact sum (or mean) and the bound R_i of zccl_reduce_scatter_wire."""
    b = block()
    n = len(parts)
    s = sum(parts)
    es = [quant_err(p, block_amax(p, b), wire, dtype) for p in parts]
    r = sum(es) + (n - 1) * U * sum(p.abs() + e for p, e in zip(parts, es))
    if average:
        return s / n, r / n + U * s.abs() / n
    return s, r


def with_output(y_abs, bound, dtype):
    u_out, a_out = OUT_CONV[dtype]
    return bound + u_out * (y_abs + bound) + a_out


def rank_input(rank, count, dtype, seed):
    """Rank r's data: normal values of rank-dependent scale, one huge element and one all-zero stretch (a block with
    one outlier, a block of zeros), exact in dtype (rounded first)."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(count, generator=g, dtype=torch.float64) * (1 + rank)
    x[count // 3] = 300.0 * (1 + rank)
    x[count // 2:count // 2 + 200] = 0.0
    return x.to(dtype)


def check(got, ref, bound):
    """(worst excess over the bound, worst error): the first must be <= 0."""
    err = (got.double() - ref).abs()
    return float((err - bound).max()), float(err.max())


def direct(rank, n, cases):
    out = {}
    for name, call, wire, dtype_name, op in cases:
        dtype = getattr(torch, dtype_name)
        avg = op == "avg"
        rop = dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM
        seed = sum(name.encode()) % 1000  # the same on every rank (hash() is salted per process)
        if call == "all_reduce":
            count = 1000
            xs = [rank_input(q, count, dtype, seed).double() for q in range(n)]
            t = rank_input(rank, count, dtype, seed)
            zccl_torch.all_reduce_quantized(t, wire=wire, op=rop)
            got = t
            L = math.ceil(count / n)
            refs, bounds = [], []
            for q in range(n):  # shard q: elements [q L, (q+1) L)
                lo, hi = min(q * L, count), min((q + 1) * L, count)
                s, r = rs_bound([x[lo:hi] for x in xs], wire, dtype, avg)
                # second quantization: z within R of S; amax of z's block <= max over the block of |S_j| + R_j
                zmax = s.abs() + r
                e2 = quant_err(zmax, block_amax(zmax, block()), wire, torch.float32)
                refs.append(s)
                bounds.append(with_output(s.abs(), r + e2, dtype))
            ref, bound = torch.cat(refs), torch.cat(bounds)
        elif call == "all_gather":
            count = 700
            xs = [rank_input(q, count, dtype, seed).double() for q in range(n)]
            got = torch.empty(n * count, dtype=dtype)
            zccl_torch.all_gather_quantized(got, rank_input(rank, count, dtype, seed), wire=wire)
            ref = torch.cat(xs)
            bound = torch.cat([with_output(x.abs(), quant_err(x, block_amax(x, block()), wire, dtype), dtype)
                               for x in xs])
        elif call == "reduce_scatter":
            count = 400  # per rank
            xs = [rank_input(q, n * count, dtype, seed).double() for q in range(n)]
            got = torch.empty(count, dtype=dtype)
            work = zccl_torch.reduce_scatter_quantized(got, rank_input(rank, n * count, dtype, seed), wire=wire,
                                                       op=rop, async_op=True)
            work.wait()
            lo = rank * count
            ref, r = rs_bound([x[lo:lo + count] for x in xs], wire, dtype, avg)
            bound = with_output(ref.abs(), r, dtype)
        else:
            raise ValueError(call)
        excess, worst = check(got, ref, bound)
        out[name] = {"excess": excess, "worst": worst, "finite": bool(torch.isfinite(got).all()),
                     "bytes": got.double().numpy().tobytes()}
    return out


def hier_bound(xs, hosts, segments, wire, second, avg, dtype):
    """The bound of include/zccl_hier.h's hierarchical reductions, for element i of the reduced vector: xs[q] is rank
    q's float64 input, hosts the ranks of each host, segments the (lo, hi) element ranges whose wire blocks start at
    lo (the inter-host call's shards). P_h, a_h: host h's exact partial sum and sum of magnitudes; the host's float32
    sum p~ is within (G-1) u a_h, so p_h = |P_h| + (G-1) u a_h bounds it, and E_h = E(p_h; amax of p_h over the
    block). R = (G-1) u sum_h a_h + sum_h E_h + (H-1) u sum_h (p_h + E_h). second: the reduced vector is quantized
    again (the all-reduce's all-gather), adding E(|S| + R; amax of |S| + R over the block). Returns (S, bound)."""
    b = block()
    H, G = len(hosts), len(hosts[0])
    s = sum(xs)
    R = torch.zeros_like(s)
    for lo, hi in segments:
        if hi <= lo:
            continue
        a = [sum(xs[q][lo:hi].abs() for q in h) for h in hosts]
        P = [sum(xs[q][lo:hi] for q in h) for h in hosts]
        p = [Ph.abs() + (G - 1) * U * ah for Ph, ah in zip(P, a)]
        E = [quant_err(ph, block_amax(ph, b), wire, torch.float32) for ph in p]
        r = (G - 1) * U * sum(a) + sum(E) + (H - 1) * U * sum(ph + e for ph, e in zip(p, E))
        if second:
            z = s[lo:hi].abs() + r
            r = r + quant_err(z, block_amax(z, b), wire, torch.float32)
        R[lo:hi] = r
    if avg:
        n = len(xs)
        return s / n, R / n + U * (s.abs() + R) / n
    return s, R


def hier(rank, n, cases):
    """The hierarchical variants (hierarchical=True) on a group whose ranks see ZCCL_HOST_ID = h<rank // 2>: 2 ranks
    per simulated host. Each result within hier_bound (the all-gather: the flat bound; its output is the flat call's),
    bitwise equal on every rank where every rank holds the same output."""
    os.environ["ZCCL_HOST_ID"] = f"h{rank // 2}"
    g = dist.new_group(list(range(n)))  # a fresh communicator: it reads ZCCL_HOST_ID
    hosts = [list(range(h, min(h + 2, n))) for h in range(0, n, 2)]
    out = {}
    for name, call, wire, dtype_name, op in cases:
        dtype = getattr(torch, dtype_name)
        avg = op == "avg"
        rop = dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM
        seed = sum(name.encode()) % 1000
        if call == "all_reduce":
            count = 1001
            xs = [rank_input(q, count, dtype, seed).double() for q in range(n)]
            t = rank_input(rank, count, dtype, seed)
            zccl_torch.all_reduce_quantized(t, wire=wire, op=rop, group=g, hierarchical=True)
            got = t
            flat = rank_input(rank, count, dtype, seed)
            zccl_torch.all_reduce_quantized(flat, wire=wire, op=rop, group=g)
            G, H = 2, len(hosts)
            C = math.ceil(count / G)
            L = math.ceil(C / H)
            segs = [(l * C + h * L, min(l * C + min((h + 1) * L, C), count)) for l in range(G) for h in range(H)]
            ref, r = hier_bound(xs, hosts, segs, wire, True, avg, dtype)
            bound = with_output(ref.abs(), r, dtype)
        elif call == "all_gather":
            count = 700
            xs = [rank_input(q, count, dtype, seed).double() for q in range(n)]
            got = torch.empty(n * count, dtype=dtype)
            zccl_torch.all_gather_quantized(got, rank_input(rank, count, dtype, seed), wire=wire, group=g,
                                            hierarchical=True)
            flat = None  # the hierarchical all-gather's output is the flat call's, bitwise (zccl_hier.h)
            ref = torch.cat(xs)
            bound = torch.cat([with_output(x.abs(), quant_err(x, block_amax(x, block()), wire, dtype), dtype)
                               for x in xs])
        elif call == "reduce_scatter":
            count = 400
            xs = [rank_input(q, n * count, dtype, seed).double() for q in range(n)]
            got = torch.empty(count, dtype=dtype)
            zccl_torch.reduce_scatter_quantized(got, rank_input(rank, n * count, dtype, seed), wire=wire, op=rop,
                                                group=g, hierarchical=True)
            flat = torch.empty(count, dtype=dtype)
            zccl_torch.reduce_scatter_quantized(flat, rank_input(rank, n * count, dtype, seed), wire=wire, op=rop,
                                                group=g)
            lo = rank * count
            full, r = hier_bound(xs, hosts, [(lo, lo + count)], wire, False, avg, dtype)
            ref, r = full[lo:lo + count], r[lo:lo + count]
            bound = with_output(ref.abs(), r, dtype)
        else:
            raise ValueError(call)
        excess, worst = check(got, ref, bound)
        out[name] = {"excess": excess, "worst": worst, "finite": bool(torch.isfinite(got).all()),
                     "bytes": got.double().numpy().tobytes(),
                     "differs_from_flat": flat is None or not torch.equal(got, flat)}
    dist.destroy_process_group(g)
    return out


def _msg(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return f"{type(e).__name__}: {e}"
    return "no error"


def refusals(rank, n):
    gloo = dist.new_group(backend="gloo")
    m = {
        "int32": _msg(lambda: zccl_torch.all_reduce_quantized(torch.ones(8, dtype=torch.int32))),
        "wire": _msg(lambda: zccl_torch.all_reduce_quantized(torch.ones(8), wire="int3")),
        "op": _msg(lambda: zccl_torch.all_reduce_quantized(torch.ones(8), op=dist.ReduceOp.MAX)),
        "gloo": _msg(lambda: zccl_torch.all_reduce_quantized(torch.ones(8), group=gloo)),
        "size": _msg(lambda: zccl_torch.all_gather_quantized(torch.empty(5), torch.ones(3))),
        "mixed": _msg(lambda: zccl_torch.reduce_scatter_quantized(torch.empty(3), torch.ones(3 * n,
                                                                                       dtype=torch.float64))),
    }
    after = torch.ones(3)
    dist.all_reduce(after)  # the group still works after every refusal
    m["after"] = after.tolist()
    return m


def ddp(rank, n, path, wires, steps):
    """Trains the digits MLP with DDP over zccl: full precision, then with the quantized hook for each wire, from
    the same initial weights and batches, on the first HELD_OUT rows' complement. Returns each run's per-step
    losses, its loss and accuracy on the held-out rows (the last HELD_OUT), and its final parameters' bytes."""
    import ddp_worker as dw

    x, y = dw.load(path)
    xt, yt, xh, yh = x[:-HELD_OUT], y[:-HELD_OUT], x[-HELD_OUT:], y[-HELD_OUT:]
    pg = dist.distributed_c10d._get_default_group()
    out = {}
    per = dw.BATCH // n
    for wire in ["none"] + list(wires):
        net = DDP(dw.model(), process_group=pg, bucket_cap_mb=0.004)
        if wire != "none":
            net.register_comm_hook(zccl_torch.QuantizedHookState(wire, pg), zccl_torch.quantized_allreduce_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for step in range(steps):
            start = (step * dw.BATCH) % (xt.shape[0] - dw.BATCH)
            xb, yb = xt[start + rank * per:start + (rank + 1) * per], yt[start + rank * per:start + (rank + 1) * per]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with torch.no_grad():
            logits = net.module(xh)
            held = (float(nn.functional.cross_entropy(logits, yh)), float((logits.argmax(1) == yh).double().mean()))
        params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        out[wire] = (losses, held, params.numpy().tobytes())
    return out


HELD_OUT = 397

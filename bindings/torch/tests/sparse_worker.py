"""Rank functions for test_sparse.py: all_reduce of sparse COO tensors (DDP's sparse embedding gradients)."""
import torch
import torch.distributed as dist


def rank_tensor(rank, n, shape, dtype, dense_tail):
    """Rank r's sparse tensor: nnz and positions depend on the rank, with duplicates inside a rank and across ranks;
    values are small integers, so every sum is exact in any order."""
    g = torch.Generator().manual_seed(1000 + rank)
    nnz = 0 if (rank == 1 and n > 2) else 5 + 3 * rank  # one rank contributes nothing when n > 2
    rows = torch.randint(0, shape[0], (nnz,), generator=g)
    idx = rows.unsqueeze(0)
    if len(shape) - dense_tail == 2:
        idx = torch.stack([rows, torch.randint(0, shape[1], (nnz,), generator=g)])
    vshape = (nnz,) + tuple(shape[len(shape) - dense_tail:])
    vals = torch.randint(-9, 10, vshape, generator=g).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape)


def sums(rank, n, cases):
    out = {}
    for name, shape, dtype_name, dense_tail in cases:
        dtype = getattr(torch, dtype_name)
        t = rank_tensor(rank, n, shape, dtype, dense_tail)
        ref = sum(rank_tensor(r, n, shape, dtype, dense_tail).to_dense().double() for r in range(n))
        dist.all_reduce(t)
        got = t.to_dense().double()
        out[name] = {"sparse": t.is_sparse, "max_err": float((got - ref).abs().max()) if got.numel() else 0.0,
                     "bytes": t.coalesce()._values().double().numpy().tobytes()}
    return out


def refusals(rank, n):
    msgs = {}
    t = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (4,))
    try:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    except Exception as e:  # noqa: BLE001
        msgs["max"] = str(e)
    # shapes that differ between ranks: every rank fails, naming the cause
    u = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (4 + rank,))
    try:
        dist.all_reduce(u)
    except Exception as e:  # noqa: BLE001
        msgs["shape"] = str(e)
    # the group still works
    d = torch.ones(3)
    dist.all_reduce(d)
    msgs["after"] = d.tolist()
    return msgs

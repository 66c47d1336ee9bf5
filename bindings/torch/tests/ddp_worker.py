"""DDP (+ ZeroRedundancyOptimizer) training on the handwritten-digits set, once over zccl and once over gloo, in
the same processes from the same initial weights and batches. Returns per-step losses and final parameters."""
import gzip
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 60
BATCH = 64  # global batch per step, split evenly across ranks

DIGITS_PATHS = [os.environ.get("ZCCL_DIGITS", ""), "/work/shared/data/digits.csv.gz",
                os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data", "digits.csv.gz")]


def find_digits():
    for p in DIGITS_PATHS:
        if p and os.path.exists(p):
            return p
    try:  # python3-sklearn ships the same file
        import sklearn.datasets

        p = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "digits.csv.gz")
        return p if os.path.exists(p) else None
    except ImportError:
        return None


def load(path):
    with gzip.open(path, "rt") as f:
        rows = [list(map(int, line.split(","))) for line in f if line.strip()]
    t = torch.tensor(rows, dtype=torch.float32)
    return t[:, :64] / 16.0, t[:, 64].long()


def model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 10))


def train(rank, n, x, y, pg, config):
    net = DDP(model(), process_group=pg, bucket_cap_mb=0.004)  # several buckets: DDP overlaps them
    if config == "fp16_hook":
        net.register_comm_hook(pg, default_hooks.fp16_compress_hook)
    if config == "zero":
        opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, process_group=pg, lr=3e-3)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    losses = []
    per = BATCH // n
    for step in range(STEPS):
        start = (step * BATCH) % (x.shape[0] - BATCH)
        xb = x[start + rank * per:start + (rank + 1) * per]
        yb = y[start + rank * per:start + (rank + 1) * per]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    return losses, params.numpy().copy()  # numpy pickles by value; a tensor would travel as a shared-memory handle


def run(rank, n, path):
    x, y = load(path)
    gloo = dist.new_group(backend="gloo")
    zccl = dist.distributed_c10d._get_default_group()
    out = {}
    for config in ("sgd", "zero", "fp16_hook"):
        for name, pg in (("zccl", zccl), ("gloo", gloo)):
            out[(config, name)] = train(rank, n, x, y, pg, config)
    return out

"""A DDP job for tests/netns/wire_train_hosts.sh, started by zcclrun on netns hosts (env:// from zcclrun's RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT): trains an MLP 64-256-256-10 on the digits data for --steps steps of a global
batch of 64, with DDP's default all-reduce (--wire none) or zccl_torch.quantized_allreduce_hook (--wire FORMAT,
--hier for the hierarchical all-reduce), one bucket per step (bucket_cap_mb=25). Rank 0 prints one line:
  ddp_hosts: wire=W hier=H steps=N ranks=R loss0=... heldout_loss=... heldout_accuracy=... replicas_equal=1
replicas_equal: every rank's final parameters are bitwise equal (their hashes all-gathered over the group)."""
import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_worker  # noqa: E402  (the digits loader)
import zccl_torch  # noqa: E402

HELD_OUT = 397
BATCH = 64

ap = argparse.ArgumentParser()
ap.add_argument("--wire", default="none")
ap.add_argument("--hier", action="store_true")
ap.add_argument("--steps", type=int, default=300)
a = ap.parse_args()

dist.init_process_group("zccl")
rank, n = dist.get_rank(), dist.get_world_size()
path = ddp_worker.find_digits()
if path is None:
    if rank == 0:
        print("ddp_hosts: SKIP: digits.csv.gz not found (../shared/data, ZCCL_DIGITS, or python3-sklearn)")
    dist.destroy_process_group()
    sys.exit(0)
x, y = ddp_worker.load(path)
xt, yt, xh, yh = x[:-HELD_OUT], y[:-HELD_OUT], x[-HELD_OUT:], y[-HELD_OUT:]
torch.manual_seed(4321)
net = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)),
          bucket_cap_mb=25)
if a.wire != "none":
    net.register_comm_hook(zccl_torch.QuantizedHookState(a.wire, None, a.hier), zccl_torch.quantized_allreduce_hook)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
per = BATCH // n
loss0 = None
for step in range(a.steps):
    start = (step * BATCH) % (xt.shape[0] - BATCH)
    lo = start + rank * per
    opt.zero_grad()
    loss = nn.functional.cross_entropy(net(xt[lo:lo + per]), yt[lo:lo + per])
    loss.backward()
    opt.step()
    if loss0 is None:
        loss0 = loss.item()
with torch.no_grad():
    logits = net.module(xh)
    hl, acc = float(nn.functional.cross_entropy(logits, yh)), float((logits.argmax(1) == yh).double().mean())
params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
h = torch.tensor(list(hashlib.sha256(params.numpy().tobytes()).digest()[:8]), dtype=torch.uint8)
hs = torch.empty(n * 8, dtype=torch.uint8)
dist.all_gather_into_tensor(hs, h) if hasattr(dist, "all_gather_into_tensor") else dist._all_gather_base(hs, h)
equal = int(all(torch.equal(hs[i * 8:(i + 1) * 8], h) for i in range(n)))
if rank == 0:
    print(f"ddp_hosts: wire={a.wire} hier={int(a.hier)} steps={a.steps} ranks={n} loss0={loss0:.6f} "
          f"heldout_loss={hl:.6f} heldout_accuracy={acc:.4f} replicas_equal={equal}", flush=True)
dist.destroy_process_group()

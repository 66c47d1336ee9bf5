#!/usr/bin/env python3
"""torch_ddp_check.py - PyTorch DDP over zccl's libnccl.so.2, for tools/gpu-check (docs/gpu.md).

    python3 tests/gpu/torch_ddp_check.py --nccl-lib build/nccl/lib/libnccl.so.2 [--steps 20] [--timeout 240]

Trains a small MLP three times from the same seed on the same data with SGD:
  1. one process, the whole batch (the reference, no torch.distributed);
  2. two processes on the one GPU (cuda:0), DistributedDataParallel with backend "nccl", each on half of the batch,
     started with LD_PRELOAD of zccl's libnccl.so.2, so every NCCL call of torch goes to zccl (checked: libzccl is
     mapped in each worker).
With equal halves and a mean loss, DDP's averaged gradient is the whole batch's gradient, so the loss of every step
(the mean of the two halves' losses) and the final weights must equal the reference up to float32 rounding
(relative 1e-5). TF32 is off. Prints PASS or FAIL lines; exit 0 on PASS, 1 on FAIL, 77 with a line
"SKIPPED: reason" where torch or CUDA is not available.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

N, D_IN, D_HID = 64, 32, 64


def skip(why):
    print("SKIPPED: " + why)
    sys.exit(77)


def make(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.Tanh(), torch.nn.Linear(D_HID, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D_IN, generator=g)
    y = torch.randn(N, 1, generator=g)
    return model, x, y


def train(torch, model, x, y, steps, reduce_loss=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        l = loss.detach().clone()
        if reduce_loss:
            l = reduce_loss(l)
        losses.append(float(l))
    return losses


def worker(args):
    import torch
    import torch.distributed as dist
    torch.backends.cuda.matmul.allow_tf32 = False
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    model, x, y = make(torch)
    model = model.cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    half = N // world
    xs, ys = x[rank * half:(rank + 1) * half].cuda(), y[rank * half:(rank + 1) * half].cuda()

    def mean_over_ranks(t):
        dist.all_reduce(t)
        return t / world

    losses = train(torch, ddp, xs, ys, args.steps, mean_over_ranks)
    torch.cuda.synchronize()
    with open("/proc/self/maps") as f:
        maps = f.read()
    params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "params": params, "zccl_mapped": "libzccl" in maps,
                   "nccl_version": list(torch.cuda.nccl.version())}, f)
    dist.destroy_process_group()


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nccl-lib")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means: no torch here
        skip("PyTorch is not importable here (%s)" % e)
    if not torch.cuda.is_available():
        skip("torch %s: torch.cuda.is_available() is False (no GPU or a CPU-only build)" % torch.__version__)
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        skip("torch %s was built without the NCCL backend" % torch.__version__)
    if not args.nccl_lib or not os.path.exists(args.nccl_lib):
        print("FAIL: --nccl-lib %s does not exist" % args.nccl_lib)
        return 1
    print("torch %s, CUDA %s, GPU %s" % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)))
    torch.backends.cuda.matmul.allow_tf32 = False
    model, x, y = make(torch)
    ref = train(torch, model.cuda(), x.cuda(), y.cuda(), args.steps)
    ref_params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="zccl-ddp-")
    procs, outs = [], []
    t0 = time.time()
    for r in range(2):
        out = os.path.join(tmp, "rank%d.json" % r)
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), LD_PRELOAD=os.path.abspath(args.nccl_lib),
                   NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "WARN"))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--steps",
                                       str(args.steps), "--out", out], env=env))
        outs.append(out)
    rc = 0
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, args.timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            print("FAIL: DDP rank %d did not finish within %.0f s" % (r, args.timeout))
            for q in procs:
                q.kill()
            return 1
        if p.returncode != 0:
            print("FAIL: DDP rank %d exited with %d" % (r, p.returncode))
            rc = 1
    if rc:
        return 1
    res = [json.load(open(o)) for o in outs]
    fails = 0
    for r, d in enumerate(res):
        if not d["zccl_mapped"]:
            print("FAIL: rank %d: libzccl is not mapped: torch did not use zccl's libnccl.so.2" % r)
            fails += 1
    for step, (a, b) in enumerate(zip(ref, res[0]["losses"])):
        if not close(a, b):
            print("FAIL: step %d: DDP loss %.9g, one-process loss %.9g" % (step, b, a))
            fails += 1
            break
    if res[0]["losses"] != res[1]["losses"]:
        print("FAIL: the two ranks report different losses")
        fails += 1
    for r, d in enumerate(res):
        for pi, (pa, pb) in enumerate(zip(ref_params, d["params"])):
            bad = [i for i, (u, v) in enumerate(zip(pa, pb)) if not close(u, v)]
            if bad:
                print("FAIL: rank %d parameter %d element %d: %.9g, one-process %.9g" % (r, pi, bad[0], pb[bad[0]],
                                                                                     pa[bad[0]]))
                fails += 1
                break
    print("DDP 2 processes on one GPU through zccl (NCCL %s as torch sees it), %d steps, %.1f s: loss %.6g -> %.6g, "
          "one-process %.6g -> %.6g" % (".".join(map(str, res[0]["nccl_version"])), args.steps, time.time() - t0,
                                        res[0]["losses"][0], res[0]["losses"][-1], ref[0], ref[-1]))
    print("PASS" if not fails else "FAIL: %d difference(s)" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

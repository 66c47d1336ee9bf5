"""Rank functions for test_frameworks.py: the same small model trained on the same data by torch's frameworks over
a given backend; each returns the model's full parameters after training (a flat list of floats)."""
import torch
import torch.distributed as dist
import torch.nn as nn

STEPS = 4
LR = 0.05


def model():
    torch.manual_seed(0)  # identical initial parameters on every rank and for every backend
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own data, the same for each backend
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def flat(params):
    return torch.cat([p.detach().reshape(-1).float() for p in params]).tolist()


def local_reference(n):
    """The same training in one process: each step's gradient is the mean over the n ranks' batches (what data
    parallel training averages), an independent reference for the distributed runs."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for s in range(STEPS):
        opt.zero_grad()
        loss = sum(nn.functional.mse_loss(m(x), y) for x, y in (batch(r, s) for r in range(n))) / n
        loss.backward()
        opt.step()
    return flat(m.parameters())


def _train(m, opt, rank, forward=None):
    forward = forward or m
    for s in range(STEPS):
        x, y = batch(rank, s)
        opt.zero_grad()
        nn.functional.mse_loss(forward(x), y).backward()
        opt.step()


def bf16_hook(state, bucket):
    t = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size())

    def back(fut):
        out = bucket.buffer()
        out.copy_(fut.value()[0])
        return out

    return dist.all_reduce(t, async_op=True).get_future().then(back)


def ddp(rank, n, hook):
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = DDP(model())
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # DDP refuses torch's bf16_compress_hook and bf16_compress_wrapper without CUDA and NCCL (it checks their
        # names); the same compression written out: the bucket in bfloat16, averaged, back into the bucket
        m.register_comm_hook(None, bf16_hook)
    elif hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                 random_seed=0)
        m.register_comm_hook(state, ps.powerSGD_hook)
    _train(m, torch.optim.SGD(m.parameters(), lr=LR), rank)
    out = {"params": flat(m.module.parameters())}
    if hasattr(m, "_get_ddp_logging_data"):
        out["backend_name"] = m._get_ddp_logging_data().get("backend_name")
    return out


def zero(rank, n):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = DDP(model())
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    _train(m, opt, rank)
    return {"params": flat(m.module.parameters())}


def fsdp(rank, n, strategy):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    m = FSDP(model(), sharding_strategy=getattr(ShardingStrategy, strategy), device_id=torch.device("cpu"),
             use_orig_params=True)
    _train(m, torch.optim.SGD(m.parameters(), lr=LR), rank)
    with FSDP.summon_full_params(m):
        return {"params": flat(m.parameters())}


def _cpu_stream_shim():
    """torch 2.6's CPU stream has no record_event/wait_event, which FSDP2 calls on its streams (gloo needs this
    too): both become no-ops, correct on CPU where every operation of a stream runs in program order."""
    s = torch.cpu.Stream
    if not hasattr(s, "record_event"):
        s.record_event = lambda self, event=None: torch.cpu.Event() if hasattr(torch.cpu, "Event") else None
    if not hasattr(s, "wait_event"):
        s.wait_event = lambda self, event: None
    if not hasattr(s, "wait_stream"):
        s.wait_stream = lambda self, other: None


def fsdp2(rank, n):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    _cpu_stream_shim()
    m = model()
    # reshard_after_forward=False: the backward pass reuses the forward's unsharded parameters. With resharding,
    # torch 2.6 on CPU all-gathers them again in place into storage autograd saved ("modified by an inplace
    # operation", with gloo as with zccl: the CPU path lacks the CUDA path's stream/version handling)
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=False)
    fully_shard(m, reshard_after_forward=False)
    _train(m, torch.optim.SGD(m.parameters(), lr=LR), rank)
    return {"params": flat(p.full_tensor() for p in m.parameters())}


def dtensor(rank, n):
    """A 2-D mesh (2 x 2): redistribute between shardings and a partial sum, each checked against the local
    reference; then a matmul of sharded DTensors."""
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
        from torch.distributed._tensor.placement_types import _Partial as Partial
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("host", "local"))
    torch.manual_seed(5)
    full = torch.randn(8, 12)
    errs = []
    d = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    for pl in ([Replicate(), Shard(0)], [Shard(1), Replicate()], [Replicate(), Replicate()], [Shard(0), Shard(1)]):
        d = d.redistribute(mesh, pl)
        if not torch.equal(d.full_tensor(), full):
            errs.append(f"redistribute to {pl}: wrong")
    # a partial sum over both dimensions: every rank contributes (rank+1) * full
    local = full * (rank + 1)
    p = DTensor.from_local(local, mesh, [Partial(), Partial()])
    got = p.redistribute(mesh, [Replicate(), Replicate()]).to_local()
    want = full * sum(r + 1 for r in range(n))
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
        errs.append(f"partial sum: max error {(got - want).abs().max().item()}")
    a = distribute_tensor(full, mesh, [Shard(0), Replicate()])
    b = distribute_tensor(full.t().contiguous(), mesh, [Replicate(), Shard(1)])
    mm = (a @ b).full_tensor()
    if not torch.allclose(mm, full @ full.t(), rtol=1e-4, atol=1e-4):
        errs.append("matmul of sharded DTensors: wrong")
    return {"errors": errs, "mm": mm.reshape(-1).tolist(), "sub": mesh["local"].get_group().size()}

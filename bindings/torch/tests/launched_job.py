"""A job started by a launcher (torchrun, mpirun): env:// rendezvous, one all-reduce, prints the result."""
import os

import torch
import torch.distributed as dist

import zccl_torch  # noqa: F401

for src, dst in (("OMPI_COMM_WORLD_RANK", "RANK"), ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"),
                 ("PMI_RANK", "RANK"), ("PMI_SIZE", "WORLD_SIZE")):
    if src in os.environ and dst not in os.environ:
        os.environ[dst] = os.environ[src]
dist.init_process_group("zccl")  # env://
rank, n = dist.get_rank(), dist.get_world_size()
t = torch.full((5,), float(rank + 1))
dist.all_reduce(t)
assert t.tolist() == [n * (n + 1) / 2] * 5, t
print(f"zccl_torch launched rank {rank} of {n}: all_reduce ok", flush=True)
dist.destroy_process_group()

"""Rank function for test_deepspeed.py: DeepSpeed's ZeRO (stage 1, 2, 3) on CPU over a torch.distributed backend
(the one the harness initialised: DeepSpeed's init_distributed(dist_backend=...) then adopts it, as it does for a
user who initialised torch.distributed first). Returns the losses of every step and the final parameters."""
import os

import torch
import torch.nn as nn

import frameworks_worker as fw

STEPS = 4


def zero(rank, n, stage, backend):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n))
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)
    m = fw.model()
    config = {
        "train_micro_batch_size_per_gpu": 6,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "SGD", "params": {"lr": fw.LR}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 64, "allgather_bucket_size": 64,
                              "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=config)
    losses = []
    for s in range(STEPS):
        x, y = fw.batch(rank, s)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            params = fw.flat(engine.module.parameters())
    else:
        params = fw.flat(engine.module.parameters())
    return {"losses": losses, "params": params, "backend": torch.distributed.get_backend()}

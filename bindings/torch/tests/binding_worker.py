"""Rank functions for test_launchers.py's binding hint (run under harness.run_ranks with capture_stderr=True)."""
import os


def stderr_after_group(rank, n):
    """The rank's stderr so far (its process group exists) and the CPUs it may run on."""
    import torch.distributed as dist

    dist.barrier()
    with open(os.environ["ZCCL_TEST_STDERR_FILE"]) as f:
        return {"stderr": f.read(), "cpus": len(os.sched_getaffinity(0))}

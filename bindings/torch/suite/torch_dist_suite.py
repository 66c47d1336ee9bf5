"""torch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py, _DistTestBase) run
against the "zccl" backend, or against gloo for the side-by-side counts, as torch's test_distributed_spawn.py runs
it for gloo: one class deriving from TestDistBackend and _DistTestBase whose setUp spawns the ranks. zccl is
given gloo's CPU features (DistTestCases.backend_feature "ddp", "subgroup", and "plugin"); tests that check
`BACKEND == "gloo"` themselves (gloo-only features) skip or take their non-gloo branch.

Not part of ctest (it takes long; docs/torch.md says how long). In the torch 2.6 root (tools/torch2-root.sh):
  tools/torch2-root.sh -- env BACKEND=zccl python3 -m pytest -q -rs bindings/torch/suite/torch_dist_suite.py
  tools/torch2-root.sh -- env BACKEND=gloo python3 -m pytest -q -rs bindings/torch/suite/torch_dist_suite.py
(WORLD_SIZE defaults to 2, TEMP_DIR to a fresh directory; -k picks a subset.) Every spawned rank imports this
file again, so the setup below runs in each of them.
"""
import os
import tempfile

os.environ.setdefault("BACKEND", "zccl")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="zccl_dist_suite_"))

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ["BACKEND"] == "zccl":
    import zccl_torch  # noqa: F401  registers "zccl"

    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("zccl")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

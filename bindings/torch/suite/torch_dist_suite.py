"""torch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py, _DistTestBase) run
against the "zccl" backend, or against gloo for the side-by-side counts, as torch's test/distributed/
test_distributed_spawn.py runs it for gloo: one class deriving from TestDistBackend and _DistTestBase whose setUp
spawns the ranks (env BACKEND, WORLD_SIZE, TEMP_DIR, INIT_METHOD as torch's run_test.py sets them).

Not part of ctest (it takes long). tools/torch-suite.sh runs it for both backends in the torch 2.6 root
(tools/torch2-root.sh) and writes the comparison; by hand, in the root:
  env BACKEND=zccl python3 -m pytest -q -rs bindings/torch/suite/torch_dist_suite.py [-k EXPR]
(WORLD_SIZE defaults to 2, TEMP_DIR to a fresh directory, INIT_METHOD to a file:// in it.) Every spawned rank
imports this file again, so the setup below runs in each of them.

What is patched for BACKEND=zccl, and why (nothing of torch's is edited; docs/torch.md, "torch's own distributed
suite"):

1. distributed_test.py decides most skips when it is imported, from its module global BACKEND (read from the
   environment): `skip_but_pass_in_sandcastle_if(BACKEND != "gloo", ...)`, `require_backend_is_available({"gloo"})`,
   `BACKEND not in DistTestCases.backend_feature["ddp"]`, ... A plugin backend would lose every test that names
   gloo (sparse all-reduce, get_future, batch_isend_irecv, timeouts, monitored_barrier, most of DDP). So the module
   is imported with BACKEND=gloo in the environment -- its decorators then select exactly gloo's tests, and the
   zccl run and the gloo run execute the same selection -- and right after the import its global
   `distributed_test.BACKEND` and os.environ["BACKEND"] are set to "zccl", so everything that runs later
   (init_process_group(backend=BACKEND) in TestDistBackend._run, new_group, get_backend checks) uses zccl.
2. One test helper branches on BACKEND at run time to choose its model: _test_accumulate_gradients_no_sync
   (`if BACKEND == "mpi" or BACKEND == "gloo": <CPU model>`, else nothing for a CPU backend: an
   UnboundLocalError, not a backend result). It is wrapped to see BACKEND "gloo" while it runs (the backend in use
   stays zccl: the group was made before). It is the only run-time `BACKEND == "gloo"` branch in the file
   (torch 2.6); the others compare with "nccl"/"mpi".
3. zccl is added to DistTestCases.backend_feature "ddp", "subgroup" and "plugin" (checked at run time by a few
   helpers; "plugin" makes require_backend_is_available accept it).

Tests written for gloo's own behaviour (its error messages, its DDP logging fields) therefore run against zccl
too; the comparison says which failures are such gloo-only expectations.
"""
import functools
import os
import tempfile

WANTED = os.environ.setdefault("BACKEND", "zccl")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="zccl_dist_suite_"))
os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(os.environ["TEMP_DIR"], "init_method_file"))

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if WANTED == "zccl":
    import zccl_torch  # noqa: F401  registers "zccl"

    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("zccl")
    os.environ["BACKEND"] = "gloo"  # (1) the import-time skips see gloo

import torch.testing._internal.distributed.distributed_test as distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if WANTED == "zccl":
    os.environ["BACKEND"] = "zccl"  # (1) everything at run time uses zccl
    distributed_test.BACKEND = "zccl"

    _accumulate = DistributedTest._DistTestBase._test_accumulate_gradients_no_sync

    @functools.wraps(_accumulate)
    def _accumulate_as_gloo(self, *args, **kwargs):  # (2)
        distributed_test.BACKEND = "gloo"
        try:
            return _accumulate(self, *args, **kwargs)
        finally:
            distributed_test.BACKEND = "zccl"

    DistributedTest._DistTestBase._test_accumulate_gradients_no_sync = _accumulate_as_gloo

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

"""Every c10d operation through the zccl backend at 1-4 ranks, against references computed by the test."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import harness  # noqa: E402
import ops_worker  # noqa: E402


@pytest.mark.parametrize("n,init", [(1, "tcp"), (2, "env"), (3, "file"), (4, "tcp")])
def test_every_op_and_dtype(n, init):
    res = harness.run_ranks(ops_worker.run, n, init=init, timeout=150)
    fails = {r: f for r, f in res.items() if f}
    assert not fails, "\n".join(f"rank {r}: {x}" for r, f in fails.items() for x in f)

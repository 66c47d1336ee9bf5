"""Coalescing blocks as zccl groups (batch_isend_irecv all-to-alls in every posting order, a mixed block) and
PREMUL_SUM's native path, at 1-4 ranks, against references computed by the test."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import groups_worker  # noqa: E402
import harness  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_groups_and_premul(n):
    res = harness.run_ranks(groups_worker.run, n, init="tcp", timeout=120)
    fails = {r: f for r, f in res.items() if f}
    assert not fails, "\n".join(f"rank {r}: {x}" for r, f in fails.items() for x in f)

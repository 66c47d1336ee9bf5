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


def test_every_op_polling_where_auto_sleeps():
    """ZCCL_TORCH_SPIN_US=250 at 2 ranks (auto: no polling when the ranks fit the CPUs with fewer than two each, as
    on a 2-core machine): callers and lanes poll before they sleep (ProcessGroupZccl.hpp, "Waiting"); same checks.
    The cases above cover auto, which polls at 1, 3 and 4 ranks on 2 cores and not at 2."""
    res = harness.run_ranks(ops_worker.run, 2, timeout=150, env={"ZCCL_TORCH_SPIN_US": "250"})
    fails = {r: f for r, f in res.items() if f}
    assert not fails, "\n".join(f"rank {r}: {x}" for r, f in fails.items() for x in f)


def _nothing(rank, n):
    return None


@pytest.mark.parametrize("value", ["abc", "-1", "", "2000000"])
def test_spin_setting_checked(value):
    """A ZCCL_TORCH_SPIN_US that is not 0..1000000 microseconds fails the group's creation naming it."""
    with pytest.raises(harness.RankFailure, match=f"ZCCL_TORCH_SPIN_US={value}: not a number of microseconds"):
        harness.run_ranks(_nothing, 2, timeout=60, env={"ZCCL_TORCH_SPIN_US": value})

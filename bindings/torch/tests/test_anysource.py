"""recv/irecv without src through the zccl backend (recvAnysource, Work._source_rank()): torch's own pattern, the
order of each sender's messages, sends queued behind a receive from any source, a collective behind one, the
timeout, and the switch that turns it off."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import harness  # noqa: E402
import anysource_worker as w  # noqa: E402


def _ok(res):
    fails = {r: f for r, f in res.items() if f}
    assert not fails, "\n".join(f"rank {r}: {x}" for r, f in fails.items() for x in f)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_torch_pattern(n):
    _ok(harness.run_ranks(w.torch_pattern, n, timeout=120))


@pytest.mark.parametrize("n", [2, 4])
def test_each_senders_order(n):
    _ok(harness.run_ranks(w.ordering, n, timeout=120))


@pytest.mark.parametrize("n", [2, 3])
def test_sends_and_collectives_behind_it(n):
    _ok(harness.run_ranks(w.ring_and_collective, n, timeout=120))


def test_timeout_leaves_the_group_usable():
    # zccl's own deadline stays long: rank 1 waits in the barrier while rank 0 times out
    _ok(harness.run_ranks(w.timeout_then_usable, 2, timeout=120, pg_timeout_s=3, env={"ZCCL_TIMEOUT_MS": "60000"}))


def test_refused_when_turned_off():
    _ok(harness.run_ranks(w.refused_when_off, 2, timeout=60, env={"ZCCL_TORCH_ANY_SOURCE": "0"}))

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


# "shm": the default, announcements between ranks of one host in the group's shared-memory segment; "store": as
# between hosts, every announcement through the process group's store (ZCCL_TORCH_ANY_SOURCE=store)
PATHS = {"shm": {}, "store": {"ZCCL_TORCH_ANY_SOURCE": "store"}}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_torch_pattern(n, path):
    _ok(harness.run_ranks(w.torch_pattern, n, timeout=120, env=PATHS[path]))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [2, 4])
def test_each_senders_order(n, path):
    _ok(harness.run_ranks(w.ordering, n, timeout=120, env=PATHS[path]))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [2, 3])
def test_sends_and_collectives_behind_it(n, path):
    _ok(harness.run_ranks(w.ring_and_collective, n, timeout=120, env=PATHS[path]))


def test_one_rank_asking_for_the_store_moves_everyone_to_it():
    """ZCCL_TORCH_ANY_SOURCE=store on rank 1 only: the ranks agree at creation, so announcements still match."""
    _ok(harness.run_ranks(w.torch_pattern, 3, timeout=120, env={"ZCCL_TORCH_ANY_SOURCE_RANK1": "store"}))


def test_timeout_leaves_the_group_usable():
    # zccl's own deadline stays long: rank 1 waits in the barrier while rank 0 times out
    _ok(harness.run_ranks(w.timeout_then_usable, 2, timeout=120, pg_timeout_s=10, env={"ZCCL_TIMEOUT_MS": "60000"}))


def test_refused_when_turned_off():
    _ok(harness.run_ranks(w.refused_when_off, 2, timeout=60, env={"ZCCL_TORCH_ANY_SOURCE": "0"}))


def test_one_rank_turning_it_off_turns_it_off_for_all():
    """ZCCL_TORCH_ANY_SOURCE=0 on rank 1 only: rank 0 refuses too (its peers would never announce)."""
    _ok(harness.run_ranks(w.refused_when_off, 2, timeout=60, env={"ZCCL_TORCH_ANY_SOURCE_RANK1": "0"}))

"""Failures must surface as errors that name their cause, within the process group's timeout, never as hangs."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import fault_worker  # noqa: E402
import harness  # noqa: E402

PG_TIMEOUT_S = 10


def test_killed_rank_is_named_within_timeout():
    res = harness.run_ranks(fault_worker.killed_mid_allreduce, 3, args=(2,), expect_dead=(2,),
                            pg_timeout_s=PG_TIMEOUT_S, timeout=60)
    for rank in (0, 1):
        err = res[rank]["error"]
        assert "rank 2" in err, f"rank {rank}'s error does not name the killed rank: {err}"
        assert res[rank]["seconds"] < PG_TIMEOUT_S, f"rank {rank} took {res[rank]['seconds']:.1f} s"


@pytest.mark.parametrize("check", ["0", "1"])
def test_mismatch_is_an_error_not_a_hang(check):
    res = harness.run_ranks(fault_worker.mismatched, 2, pg_timeout_s=PG_TIMEOUT_S, timeout=60,
                            env={"ZCCL_CHECK": check})
    for rank, cases in res.items():
        for what, r in cases.items():
            assert r["error"] is not None, f"rank {rank}: a {what}-mismatched all-reduce succeeded"
            assert r["seconds"] < PG_TIMEOUT_S + 2, f"rank {rank}, {what}: the error took {r['seconds']:.1f} s"
            if check == "1":  # zccl's argument check names both calls
                assert "ZCCL_CHECK: ranks called different collectives" in r["error"], r["error"]
            else:
                assert "rank" in r["error"], r["error"]


def test_abort_unblocks_a_waiting_collective():
    res = harness.run_ranks(fault_worker.abort_unblocks, 2, pg_timeout_s=PG_TIMEOUT_S, timeout=45)
    assert res[0]["error"] is not None, "an all-reduce without its peer completed"
    assert res[0]["seconds"] < 2.0, f"abort took {res[0]['seconds']:.1f} s to unblock wait()"


def test_group_timeout_is_the_collective_deadline():
    res = harness.run_ranks(fault_worker.timeout_names_peer, 2, pg_timeout_s=PG_TIMEOUT_S, timeout=45)
    err, secs = res[0]["error"], res[0]["seconds"]
    assert err is not None, "an all-reduce without its peer completed"
    assert "rank 1" in err and "timed out" in err, err
    assert 2.5 < secs < 5.5, f"the 3 s group timeout fired after {secs:.1f} s"

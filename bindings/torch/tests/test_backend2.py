"""The c10d Backend / Work API that torch 2.x and its frameworks use, on the torch this python has (1.13 on
Debian 12, 2.6 in the Debian 13 root of tools/torch2-root.sh); each check against values the test computes."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import backend2_worker as w  # noqa: E402
import harness  # noqa: E402

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def test_sequence_numbers_count_operations_and_subgroup_objects_travel():
    res = harness.run_ranks(w.sequence_numbers, 3, timeout=90)
    for r, v in res.items():
        assert v["s0"] == 0, v
        assert v["s1"] == 4, f"rank {r}: 4 operations counted as {v['s1'] - v['s0']}"
    for r in (0, 1):
        got, lst = res[r]["objs"]
        assert got == [{"rank": 0, "text": "xxx"}, {"rank": 1, "text": "xxxx"}], got
        assert lst == ["from 1", 10], lst


def test_timeout_says_timed_out():
    res = harness.run_ranks(w.timeout_message, 2, timeout=60)
    msg = res[0]["msg"]
    assert msg is not None, "an all-reduce without its peer completed"
    assert " Timed out " in msg and " timeout" in msg and "rank 1" in msg, msg
    if hasattr(dist, "DistBackendError"):
        assert res[0]["dist_backend_error"], f"raised {res[0]['type']}, not DistBackendError: {msg}"


def test_work_future_result_and_wait_timeout():
    n = 2
    res = harness.run_ranks(w.work_api, n, timeout=60)
    total = float(sum(range(1, n + 1)))
    for r, v in res.items():
        assert v["future"] == [[total] * 5] and v["result"] == [[total] * 5], v
        assert v["wait_true"] is True and v["completed"], v
        assert v["late"] == [total] * 3, v
        assert v["then"] == [2.0 * sum(range(n))] * 4, v
    assert res[0]["short_wait_error"] is not None, "wait(200 ms) returned before the late peer joined"


@pytest.mark.parametrize("n", [2, 3])
def test_in_place_all_gather_and_reduce_scatter(n):
    k = 7
    res = harness.run_ranks(w.in_place, n, timeout=60)
    ag = [float(i + 100 * r) for r in range(n) for i in range(k)]
    for r, v in res.items():
        assert v["ag"] == ag, (r, v["ag"])
        want = [float(sum(i * (r + 1) + q for q in range(n))) for i in range(k)]
        assert v["rs"] == want, (r, v["rs"], want)
        assert v["same_storage"]


def test_shutdown_and_abort_are_idempotent():
    res = harness.run_ranks(w.shutdown_twice, 2, timeout=60)
    for r, v in res.items():
        assert v["after"] and "shut down or aborted" in v["after"], v


def test_registered_for_cpu_and_cuda():
    res = harness.run_ranks(w.registration, 1, timeout=60)
    v = res[0]
    assert v["name"] == "zccl" and v["type"] == "ProcessGroupZccl", v
    if TORCH2:
        assert v["caps"] == ["cpu", "cuda"], v


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8 dtypes (torch >= 2.1)")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_fp8_dtypes(n):
    res = harness.run_ranks(w.fp8, n, timeout=120)
    fails = {r: f for r, f in res.items() if f}
    assert not fails, "\n".join(f"rank {r}: {x}" for r, f in fails.items() for x in f)

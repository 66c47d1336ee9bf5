"""zccl_torch.empty_registered: CPU tensors in registered zccl_mem_alloc memory. Every collective's result is
checked exactly (integer-valued data, exact in every dtype used) on 2 and 3 ranks; the calls of at least 32 KiB on
registered tensors must take zccl's direct path (counted by the library, read from its INFO line) and the same
calls on ordinary tensors must not; freed tensors give their /dev/shm blocks back; a tensor outlives its group."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import harness  # noqa: E402
import registered_worker as w  # noqa: E402

INFO = {"ZCCL_DEBUG": "INFO", "ZCCL_DEBUG_SUBSYS": "COLL"}


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_on_registered_tensors(n):
    res = harness.run_ranks(w.collectives, n, env=INFO, timeout=180)
    for r, v in res.items():
        assert v["problems"] == [], (r, v["problems"])
        assert v["direct_plain"] == 0, f"rank {r}: ordinary tensors took the direct path {v['direct_plain']} times"
        assert v["direct"] >= v["big_calls"] > 0, \
            f"rank {r}: {v['direct']} direct-path calls for {v['big_calls']} registered calls of at least 32 KiB"
        assert v["shape_ok"], r
        assert v["blocks_after_free"] == 0, f"rank {r}: {v['blocks_after_free']} /dev/shm blocks left after free"
        assert v["kept_ok"], r
        assert "shut down" in v["refused_after_shutdown"], (r, v["refused_after_shutdown"])
        assert v["blocks_end"] == 0, f"rank {r}: {v['blocks_end']} /dev/shm blocks left"


def test_bad_input():
    res = harness.run_ranks(w.bad_input, 2, timeout=90)
    for r, v in res.items():
        assert "negative" in (v["negative"] or ""), (r, v)
        assert "negative" in (v["negative_dim"] or ""), (r, v)
        assert "not 'zccl'" in (v["gloo"] or ""), (r, v)

"""all_reduce of sparse COO tensors through zccl (SUM, CPU, as gloo): results against the dense sum the test
computes, bitwise equal across ranks; other ops and ranks whose tensors differ refused on every rank."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import harness  # noqa: E402
import sparse_worker as w  # noqa: E402

CASES = [
    ("vector_f32", (50,), "float32", 0),
    ("embedding_rows_f64", (40, 6), "float64", 1),  # DDP's sparse embedding gradient: rows x a dense tail
    ("matrix_2d_bf16", (12, 9), "bfloat16", 0),
]


@pytest.mark.parametrize("n", [2, 3])
def test_sparse_all_reduce_sums_like_dense(n):
    res = harness.run_ranks(w.sums, n, timeout=90, args=(CASES,))
    for name, *_ in CASES:
        for r, v in res.items():
            assert v[name]["sparse"], (r, name)
            assert v[name]["max_err"] == 0.0, (r, name, v[name]["max_err"])
        assert len({v[name]["bytes"] for v in res.values()}) == 1, f"{name}: ranks differ"


def test_sparse_all_reduce_refusals():
    res = harness.run_ranks(w.refusals, 2, timeout=90)
    for r, v in res.items():
        assert "SUM only" in v.get("max", ""), (r, v)
        assert "differs from rank 0's" in v.get("shape", ""), (r, v)
        assert v["after"] == [2.0, 2.0, 2.0], (r, v)

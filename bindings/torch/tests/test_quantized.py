"""zccl_torch's quantized collectives (ZeRO++'s qwZ / qgZ formats through zccl's _wire calls) and the DDP hook.

Every result is checked against the exact sum the test computes, within the per-element bound of include/zccl.h
recomputed in the worker, bitwise equal on every rank, and not exact (a call that silently sent full precision
would pass a bound but fail that). The hook trains DDP on the digits data: replicas bitwise equal, the loss falls,
and the held-out accuracy and loss end close to full precision's."""
import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import harness  # noqa: E402
import quantized_worker as w  # noqa: E402

# (name, call, wire, dtype, op)
CASES = [
    ("ar_int8_f32_sum", "all_reduce", "int8", "float32", "sum"),
    ("ar_int4_bf16_avg", "all_reduce", "int4", "bfloat16", "avg"),
    ("ar_e4m3_f16_sum", "all_reduce", "fp8e4m3", "float16", "sum"),
    ("ar_int8_f64_avg", "all_reduce", "int8", "float64", "avg"),
    ("ag_int8_f32", "all_gather", "int8", "float32", None),
    ("ag_int4_f16", "all_gather", "int4", "float16", None),
    ("ag_e5m2_bf16", "all_gather", "fp8e5m2", "bfloat16", None),
    ("rs_int4_f32_sum", "reduce_scatter", "int4", "float32", "sum"),
    ("rs_int8_bf16_avg", "reduce_scatter", "int8", "bfloat16", "avg"),
]


def check_cases(res, cases, source):
    """Every rank's result of every case: finite, within the bound (excess <= 0), not exact, and bitwise equal on
    every rank where every rank holds the same output (all but the reduce-scatter)."""
    for name, call, *_ in cases:
        for r, v in res.items():
            c = v[name]
            assert c["finite"], (r, name)
            assert c["excess"] <= 0.0, f"{name} rank {r}: error exceeds {source}'s bound by {c['excess']}"
            assert c["worst"] > 0.0, f"{name} rank {r}: exact result, so the wire was not quantized"
        if call != "reduce_scatter":
            assert len({v[name]["bytes"] for v in res.values()}) == 1, f"{name}: ranks differ"


@pytest.mark.parametrize("n", [2, 3])
def test_quantized_collectives_within_the_stated_bound(n):
    check_cases(harness.run_ranks(w.direct, n, timeout=120, args=(CASES,)), CASES, "zccl.h")


HIER_CASES = [
    ("har_int8_f32_sum", "all_reduce", "int8", "float32", "sum"),
    ("har_int4_bf16_avg", "all_reduce", "int4", "bfloat16", "avg"),
    ("hag_int8_f32", "all_gather", "int8", "float32", None),
    ("hrs_int4_f32_sum", "reduce_scatter", "int4", "float32", "sum"),
    ("hrs_e4m3_f16_avg", "reduce_scatter", "fp8e4m3", "float16", "avg"),
]


@pytest.mark.parametrize("n", [4, 6])
def test_hierarchical_quantized_collectives_within_their_bound(n):
    """2 ranks per simulated host (ZCCL_HOST_ID): 2 and 3 hosts; the hierarchical calls' own bound (zccl_hier.h)."""
    res = harness.run_ranks(w.hier, n, timeout=180, args=(HIER_CASES,))
    check_cases(res, HIER_CASES, "zccl_hier.h")
    for name, *_ in HIER_CASES:
        # the two-hop sum rounds differently from the flat call's: equal bytes on every rank mean it ran flat
        assert any(v[name]["differs_from_flat"] for v in res.values()), f"{name}: equals the flat call: not hier"


def test_quantized_refusals_name_their_cause():
    res = harness.run_ranks(w.refusals, 2, timeout=90)
    for r, m in res.items():
        assert "dtype" in m["int32"] and "Int" in m["int32"], (r, m["int32"])
        assert "ValueError" in m["wire"] and "int3" in m["wire"], (r, m["wire"])
        assert "ValueError" in m["op"] and "SUM or AVG" in m["op"], (r, m["op"])
        assert "ValueError" in m["gloo"] and "not 'zccl'" in m["gloo"], (r, m["gloo"])
        assert "output" in m["size"] and "no error" not in m["size"], (r, m["size"])
        assert "no error" not in m["mixed"] and "dtype" in m["mixed"], (r, m["mixed"])
        assert m["after"] == [2.0, 2.0, 2.0], (r, m)


def test_ddp_quantized_hook_trains_like_full_precision():
    import ddp_worker

    path = ddp_worker.find_digits()
    if path is None:
        pytest.skip("digits.csv.gz not found (../shared/data, ZCCL_DIGITS, or python3-sklearn)")
    res = harness.run_ranks(w.ddp, 2, timeout=240, args=(path, ("int8", "int4"), 150))
    full_losses, (full_loss, full_acc), full_params = res[0]["none"]
    assert full_params == res[1]["none"][2]
    assert full_acc > 0.75, full_acc
    for wire in ("int8", "int4"):
        losses, (loss, acc), params = res[0][wire]
        assert params == res[1][wire][2], f"{wire}: the replicas' parameters differ"
        assert loss < 0.5 * losses[0], f"{wire}: held-out loss {loss} against a first step's {losses[0]}"
        # Not worse than full precision by more than the wire's allowance (doing better is fine). A run is
        # deterministic for a given torch and CPU, but 150 steps of SGD are short and noisy: on an AMD EPYC VM int4
        # ended 2.5 points and 14% behind on torch 2.6 (0.5 points and 6% on 1.13), int8 within 1 point and 2%
        # (2026-12-07).
        acc_tol, loss_tol = {"int8": (0.02, 0.10), "int4": (0.04, 0.20)}[wire]
        assert acc >= full_acc - acc_tol, f"{wire}: held-out accuracy {acc}, full precision {full_acc}"
        assert loss <= (1 + loss_tol) * full_loss, f"{wire}: held-out loss {loss}, full {full_loss}"
        assert losses != full_losses, f"{wire}: losses equal full precision's bitwise: the hook sent full precision"

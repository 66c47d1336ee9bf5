"""Helpers the torch benchmarks of bench/ share (torch_compare, torch_vs_bench, deepspeed_shm_compare): size
arguments, table labels, nccl-tests' bus bandwidth, and the test harness's port choice. Imports no torch."""
import os
import sys

_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bindings", "torch", "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
import harness  # noqa: E402  free_port (below the ephemeral range), ninja_shim


def parse_size(s):
    """'256K', '64M', '1G', '4096' (also '256KiB', '64MB') -> bytes, powers of 1024."""
    t = s.upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(t[:-1] if t[-1:] in "KMG" else t) * mult
    except ValueError:
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: bad size '{s}' (e.g. 256K, 64M)") from None


def human(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m} {unit}"
    return f"{b} B"


def busbw(op, nbytes, n, t):
    """nccl-tests' bus bandwidth in GB/s of a call on nbytes (the whole vector) that took t seconds on n ranks."""
    algbw = nbytes / t / 1e9
    return algbw * (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n)


free_port = harness.free_port
ninja_shim = harness.ninja_shim

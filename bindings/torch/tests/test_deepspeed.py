"""DeepSpeed's ZeRO stages 1-3 on CPU with dist_backend="zccl" train to the same losses and parameters as with
gloo. DeepSpeed is not packaged in Debian: the test takes a source tree (0.16.x runs on torch 2.6; 0.19 needs a
newer torch) from ZCCL_DEEPSPEED_SRC, else /opt/deepspeed (where tools/torch2-root.sh mounts
/var/cache/zccl/deepspeed), and skips with the reason without one."""
import os
import sys

import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import torch  # noqa: E402

import harness  # noqa: E402

SRC = os.environ.get("ZCCL_DEEPSPEED_SRC", "/opt/deepspeed")
VER = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])

pytestmark = [
    pytest.mark.skipif(not os.path.isdir(os.path.join(SRC, "deepspeed")),
                       reason=f"no DeepSpeed source tree at {SRC} (set ZCCL_DEEPSPEED_SRC; tools/torch2-root.sh "
                              "mounts /var/cache/zccl/deepspeed there)"),
    pytest.mark.skipif(VER < (2, 1), reason=f"DeepSpeed 0.16 needs torch >= 2.1 (this is {torch.__version__})"),
]


@pytest.fixture(scope="module")
def env():
    shim = harness.ninja_shim()
    paths = [SRC, shim] + [p for p in sys.path if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    sys.path[:0] = [SRC, shim]
    return {"DS_ACCELERATOR": "cpu", "PYTHONPATH": os.environ["PYTHONPATH"]}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_trains_as_with_gloo(env, stage):
    import deepspeed_worker as dw

    n = 2
    out = {}
    for backend in ("gloo", "zccl"):
        out[backend] = harness.run_ranks(dw.zero, n, backend=backend, args=(stage, backend), env=env, timeout=420)
    # The reference itself: DeepSpeed 0.16.9's stage 3 on gloo once ended with rank 1 holding garbage parameters
    # (6810.66 where rank 0 had 0.0023) and matched zccl bit for bit when run again (2026-12-06). A reference whose
    # replicas differ is run once more; zccl gets no such second chance.
    if any(out["gloo"][r]["params"] != out["gloo"][0]["params"] for r in range(n)):
        print(f"stage {stage}: gloo's replicas differ; running the gloo reference again")
        out["gloo"] = harness.run_ranks(dw.zero, n, backend="gloo", args=(stage, "gloo"), env=env, timeout=420)
    for backend, res in out.items():
        for r in range(n):
            assert res[r]["params"] == res[0]["params"], f"{backend}: rank {r}'s parameters differ from rank 0's"
    zl, gl = torch.tensor(out["zccl"][0]["losses"]), torch.tensor(out["gloo"][0]["losses"])
    assert torch.allclose(zl, gl, rtol=1e-5, atol=1e-6), f"losses: zccl {zl.tolist()} gloo {gl.tolist()}"
    zp, gp = torch.tensor(out["zccl"][0]["params"]), torch.tensor(out["gloo"][0]["params"])
    assert torch.allclose(zp, gp, rtol=1e-5, atol=1e-6), f"parameters differ by {(zp - gp).abs().max().item()}"
    assert zl[-1] != zl[0], "training changed nothing"

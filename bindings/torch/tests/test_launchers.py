"""The backend bootstraps under the launchers people use: torchrun, Open MPI's mpirun and zcclrun (env://)."""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not importable by this python (apt-get install python3-torch)")

import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "launched_job.py")


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # where zccl_torch was found
    return e


def check(out, n):
    for r in range(n):
        assert f"launched rank {r} of {n}: all_reduce ok" in out, out


def torchrun_broken():
    """Debian 12's torch 1.13 under Python 3.11: Std.from_str returns None and torchrun dies before starting
    anything (AttributeError in elastic/multiprocessing/api.py), whatever the job."""
    try:
        from torch.distributed.elastic.multiprocessing.api import Std

        return Std.from_str("0") is None
    except Exception:  # noqa: BLE001
        return False


def tcpstore_lacks_libuv():
    """Debian 13's torch 2.6 is built without libuv, and torchrun's rendezvous creates its TCPStore with the
    default use_libuv=True, which such a torch refuses whatever USE_LIBUV says."""
    import torch.distributed as dist

    try:
        dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True).set("k", "v")
        return False
    except TypeError:  # torch 1.x: no use_libuv argument, no libuv
        return False
    except RuntimeError as e:
        return "libuv" in str(e)


@pytest.mark.skipif(tcpstore_lacks_libuv(), reason="this torch has no libuv TCPStore and torchrun asks for one "
                                                   "(Debian 13's torch 2.6: USE_LIBUV=0 reaches only env:// and "
                                                   "tcp:// init); env:// is covered by zcclrun and mpirun below")
@pytest.mark.skipif(torchrun_broken(), reason="this torch's torchrun is broken on this Python (Std.from_str "
                                              "returns None: torch 1.13 with Python 3.11); env:// is covered by "
                                              "test_ops")
def test_torchrun():
    port = harness.free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), JOB]  # 1.x spells them with _
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    check(p.stdout, 2)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (openmpi-bin)")
def test_mpirun():
    port = harness.free_port()
    e = env()
    e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PYTHONPATH",
           sys.executable, JOB]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=90)
    if p.returncode != 0 and "mpich" in (p.stdout + p.stderr).lower():
        pytest.skip("mpirun is MPICH's, not Open MPI's")
    assert p.returncode == 0, p.stdout + p.stderr
    check(p.stdout, 2)


def zcclrun():
    p = os.environ.get("ZCCLRUN") or shutil.which("zcclrun")
    if not p:
        guess = os.path.join(HERE, "..", "..", "..", "build", "tools", "zcclrun")
        p = guess if os.path.exists(guess) else None
    return p


@pytest.mark.skipif(zcclrun() is None, reason="zcclrun not found (set ZCCLRUN or build the tools target)")
def test_zcclrun():
    cmd = [zcclrun(), "-n", "3", "--timeout", "80", sys.executable, JOB]
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    check(p.stdout, 3)


HINT = "is not bound to CPUs"


def _hint_applies(n):
    cpus, online = len(os.sched_getaffinity(0)), os.cpu_count()
    if cpus < online:
        pytest.skip(f"this test process is bound to {cpus} of {online} CPUs: the ranks would count as bound")
    if not (n <= cpus < 2 * n):
        pytest.skip(f"the hint is for {n} ranks on {n}..{2 * n - 1} CPUs (callers and lanes outnumber them, binding "
                    f"fits); this machine has {cpus}")


def test_unbound_ranks_are_told_to_bind():
    """2 unbound ranks on 2-3 CPUs: each says once, at its group's creation, that it should be bound (docs/torch.md,
    "Bind the ranks"); bound ranks (a CPU each, as zcclrun binds them) say nothing."""
    import binding_worker as bw

    _hint_applies(2)
    res = harness.run_ranks(bw.stderr_after_group, 2, capture_stderr=True)
    for r, out in res.items():
        assert out["stderr"].count(HINT) == 1, f"rank {r}: expected the hint once on stderr, got:\n{out['stderr']}"
        assert "zcclrun" in out["stderr"] and "docs/torch.md" in out["stderr"]
    res = harness.run_ranks(bw.stderr_after_group, 2, capture_stderr=True, bind=True)
    for r, out in res.items():
        assert out["cpus"] == 1
        assert HINT not in out["stderr"], f"rank {r} is bound and still got the hint:\n{out['stderr']}"

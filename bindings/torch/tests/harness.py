"""Runs a function on N ranks of a torch.distributed job, each in its own process, with a deadline.

run_ranks(fn, n, ...) starts n processes; each initialises a process group (zccl or gloo), calls fn(rank, n, *args)
and sends back its return value or its traceback. A process still running at the deadline is killed and the call
fails naming it; so does a process that exits without reporting.

The processes come from multiprocessing's fork server with torch and torch.distributed imported once in the
server (not zccl_torch, nor anything that reads ZCCL_* settings): each rank is a fork of a process that has never
run a torch op, so no thread pool is copied, and a rank starts in milliseconds instead of re-importing torch (1.5 s
here, several seconds when four ranks import at once on two cores). A rank's settings (env) are applied before it
imports zccl_torch, as with spawn; a PYTHONPATH among them is also put on the rank's sys.path, since the server's
interpreter started before it. ZCCL_TORCH_TEST_START=spawn starts every rank from scratch instead.
"""
import datetime
import multiprocessing
import os
import queue
import random
import re
import shutil
import socket
import tempfile
import time
import traceback


def free_port():
    """A free TCP port below net.ipv4.ip_local_port_range, where no connect() is handed it as its source port (a
    port from that range can be taken by one between this probe and the store's bind); the kernel's choice when
    the range leaves no room."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    rng = random.SystemRandom()
    for _ in range(64 if lo - 20000 >= 1000 else 0):
        p = rng.randrange(20000, lo - 1)  # p + 1 too: torchrun's agent store moves zccl's root there
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("", p))
                b.bind(("", p + 1))
            return p
        except OSError:
            continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ninja_shim():
    """A folder holding a `ninja` Python module that names /usr/bin/ninja: DeepSpeed's op builder imports the module,
    and Debian ships only the binary (ninja-build). Put the folder on PYTHONPATH."""
    d = tempfile.mkdtemp(prefix="zccl_ninja_shim_")
    os.makedirs(os.path.join(d, "ninja"))
    with open(os.path.join(d, "ninja", "__init__.py"), "w") as f:
        f.write("import os, sys\nBIN_DIR = '/usr/bin'\n__version__ = '1.11'\n"
                "def ninja():\n    os.execv('/usr/bin/ninja', ['ninja'] + sys.argv[1:])\n")
    return d


def _exit_barrier(dist, rank, n, timeout_s=10.0):
    """Keeps rank 0, which hosts the TCP store, alive until every other rank has made its last store call.

    A rank that is not in a subgroup may still be polling new_group's store-based barrier when the members have
    finished; if rank 0 exits then, that poll fails with "Broken pipe". Two phases: everyone arrives; then each
    rank other than 0 says it has left (its last store call) and rank 0 waits for n-1 of those. Bounded: a rank
    that failed never arrives, and the others give up after timeout_s (their results are already reported)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - the function destroyed the group itself
        return
    deadline = time.monotonic() + timeout_s
    try:
        store.add("zccl_harness/arrived", 1)
        while store.add("zccl_harness/arrived", 0) < n:
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        if rank != 0:
            store.add("zccl_harness/left", 1)
            return
        while store.add("zccl_harness/left", 0) < n - 1 and time.monotonic() < deadline:
            time.sleep(0.005)
    except Exception:  # noqa: BLE001 - the store is gone: nothing left to protect
        return


def _entry(fn, rank, n, backend, init, env, pg_timeout_s, args, results, dump_at, stack_file, exit_together,
           stderr_dir=None, bind=False):
    import faulthandler

    if stderr_dir:  # the rank's stderr (warnings, zccl's log) into a file fn can read: $ZCCL_TEST_STDERR_FILE
        path = os.path.join(stderr_dir, f"stderr{rank}.txt")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ["ZCCL_TEST_STDERR_FILE"] = path
    if bind:  # rank r on the r-th CPU of the inherited mask, as zcclrun binds by default
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})

    stacks = open(stack_file, "w")
    # a hung rank shows where it hung, just before the parent's deadline (the child starts seconds late: imports)
    faulthandler.dump_traceback_later(max(1.0, dump_at - time.time()), exit=False, file=stacks)
    try:
        # a key NAME_RANK<r> sets NAME on rank r only (a setting that differs between ranks)
        for k, v in env.items():
            m = re.fullmatch(r"(.+)_RANK(\d+)", k)
            if not m:
                os.environ[k] = v
            elif int(m.group(2)) == rank:
                os.environ[m.group(1)] = v
        import sys
        for d in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
            if d and d not in sys.path:
                sys.path.insert(0, d)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        import zccl_torch  # noqa: F401  registers "zccl"

        kw = dict(rank=rank, world_size=n, timeout=datetime.timedelta(seconds=pg_timeout_s))
        if init == "env":
            dist.init_process_group(backend, init_method="env://", **kw)
        else:
            dist.init_process_group(backend, init_method=init, **kw)
        out = fn(rank, n, *args)
        results.put((rank, "ok", out))
        if exit_together:
            _exit_barrier(dist, rank, n)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))


class RankFailure(AssertionError):
    pass


_ctx = None


def _context():
    global _ctx
    if _ctx is None:
        method = os.environ.get("ZCCL_TORCH_TEST_START", "forkserver")
        if method not in multiprocessing.get_all_start_methods():
            method = "spawn"
        _ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            _ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return _ctx


def run_ranks(fn, n, backend="zccl", init="tcp", timeout=90, env=None, pg_timeout_s=60, args=(), expect_dead=(),
              capture_stderr=False, bind=False):
    """Returns {rank: fn's result} (return plain data or numpy arrays: tensors travel as shared-memory handles that
    die with their process). init: 'tcp', 'file' or 'env'. Ranks in expect_dead may exit silently.
    capture_stderr: each rank's stderr goes to a file from before its process group exists, whose path fn finds in
    $ZCCL_TEST_STDERR_FILE. bind: rank r is bound to the r-th CPU of the inherited mask before anything else."""
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    env = dict(env or {})
    tmp = None
    if init == "tcp":
        init_url = f"tcp://127.0.0.1:{port}"
    elif init == "file":
        tmp = tempfile.mkdtemp(prefix="zccl_torch_")
        init_url = f"file://{tmp}/store"
    elif init == "env":
        init_url = "env"
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    else:
        raise ValueError(init)
    stack_dir = tempfile.mkdtemp(prefix="zccl_torch_stacks_")
    stderr_dir = stack_dir if capture_stderr else None
    stack_file = lambda r: os.path.join(stack_dir, f"rank{r}.txt")  # noqa: E731
    procs = [ctx.Process(target=_entry, args=(fn, r, n, backend, init_url, env, pg_timeout_s, args, results,
                                                       time.time() + timeout - 3, stack_file(r), not expect_dead, stderr_dir,
                                                       bind),
                         daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    try:
        return _collect(procs, results, n, timeout, expect_dead, stack_file)
    finally:
        shutil.rmtree(stack_dir, ignore_errors=True)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _collect(procs, results, n, timeout, expect_dead, stack_file):
    got, errors = {}, []
    deadline = time.monotonic() + timeout
    want = n - len(expect_dead)
    while len(got) + len(errors) < n and time.monotonic() < deadline:
        try:
            rank, status, value = results.get(timeout=0.2)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
            continue
        if status == "ok":
            got[rank] = value
        else:
            errors.append(f"rank {rank}:\n{value}")
        if len(got) >= want and all(r in got or r in expect_dead for r in range(n)):
            break
    hung = [r for r, p in enumerate(procs) if p.is_alive() and r not in got and r not in expect_dead]
    for p in procs:
        p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if errors:
        raise RankFailure("\n".join(errors))
    missing = [r for r in range(n) if r not in got and r not in expect_dead]
    if hung:
        stacks = ""
        for r in hung:
            try:
                with open(stack_file(r)) as f:
                    stacks += f"\n--- rank {r}, 3 s before the deadline:\n" + f.read()
            except OSError:
                pass
        raise RankFailure(f"ranks {hung} did not finish within {timeout} s (killed){stacks}")
    if missing:
        raise RankFailure(f"ranks {missing} exited without reporting (exit codes "
                          f"{[procs[r].exitcode for r in missing]})")
    return got

#!/usr/bin/env python3
"""Benchmark: does a long blocked queue make scheduling or submitting slower?

(a) One ``scheduler.schedule`` pass with an empty queue vs with 10,000
    queued jobs that cannot start, per policy, printed as ratios against
    the empty-queue pass measured in the same run. Blocked shapes:
    "full" (no free core: backfill can stop at once), "gpus" (cores idle,
    every job wants more GPUs than are free), "mem" (cores idle, memory
    short) and "split" (--numa-local jobs: the node with cores has no
    memory, the node with memory has no cores; the slowest rejection).
    The backfill policies scan the whole queue in the last three.
(b) ``bench_submit_latency(socket_path)``: wall time of ``dispatch new``
    against an empty queue and against 10,000 blocked jobs, through a real
    daemon. Run with ``--socket PATH`` for a daemon you started, or
    ``--start-daemon`` to start a throwaway one under --no-cgroups.

Prints figures only; it asserts nothing.

    python bench/bench_queue.py [--repeat N] [--socket PATH | --start-daemon] [--blocked N]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpc_batch.resources import Allocation, Budget, GiB, Limits, Machine, Node, Request  # noqa: E402
from hpc_batch.scheduler import POLICIES, QueuedJob, RunningJob, schedule  # noqa: E402

N_BLOCKED = 10_000

# Two 32-core nodes of 256 GiB and 4 GPUs, default admin limits.
MACHINE = Machine(
    (Node(0, tuple(range(32)), 256 * GiB), Node(1, tuple(range(32, 64)), 256 * GiB)),
    gpus=(0, 1, 2, 3),
)
LIMITS = Limits()


def _scenario(shape: str):
    """Running jobs and a queue of N_BLOCKED jobs none of which can start."""
    if shape == "full":
        # Every job core is busy until far in the future.
        running = [
            RunningJob(1, Allocation(tuple(range(2, 32)), ((0, 64 * GiB),), (), False), 1e12),
            RunningJob(2, Allocation(tuple(range(32, 64)), ((1, 64 * GiB),), (), False), 1e12),
        ]
        req = Request(cpus=1)
    elif shape == "gpus":
        # Two GPUs busy, 61 cores idle; every queued job wants 3 GPUs.
        running = [RunningJob(1, Allocation((2,), ((0, 8 * GiB),), (0, 1), False), 1e12)]
        req = Request(cpus=1, gpus=3)
    elif shape == "mem":
        # Cores idle but only 6 GiB free in all; every job wants 16 GiB.
        running = [RunningJob(1, Allocation((2,), ((0, 249 * GiB), (1, 255 * GiB)), (), False), 1e12)]
        req = Request(cpus=1, mem=16 * GiB)
    else:
        # Node 0: 1 free core, 244 GiB free; node 1: 31 free cores, 2 GiB free.
        running = [
            RunningJob(1, Allocation(tuple(range(2, 31)), ((0, 10 * GiB),), (), False), 1e12),
            RunningJob(2, Allocation((32,), ((1, 254 * GiB),), (), False), 1e12),
        ]
        req = Request(cpus=4, mem=16 * GiB, numa_local=True)
    budget = Budget(req.mem or 8 * GiB, req.mem is None)
    # Short max_time so strict-backfill's time test passes and fit is tried.
    queue = [QueuedJob(i, req, budget, 60.0) for i in range(10, 10 + N_BLOCKED)]
    return running, queue


def _time_pass(policy, queue, running, repeat: int) -> float:
    """Median seconds of one schedule() pass, state carried like the daemon."""
    state: dict = {}
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        d = schedule(policy, queue, running, MACHINE, LIMITS, state, 1000.0)
        samples.append(time.perf_counter() - t0)
        assert not d.starts, "benchmark queue must stay blocked"
        state = d.state
    return statistics.median(samples)


def bench_schedule_pass(repeat: int = 30) -> None:
    """Part (a): print blocked-queue pass time as a ratio of the empty pass."""
    print(f"(a) one scheduling pass, {N_BLOCKED} blocked jobs vs an empty queue (median of {repeat})")
    print(f"    {'policy':<16} {'shape':<8} {'empty':>10} {'blocked':>10} {'ratio':>8}")
    for shape in ("full", "gpus", "mem", "split"):
        running, queue = _scenario(shape)
        for policy in POLICIES:
            empty = _time_pass(policy, [], running, repeat)
            blocked = _time_pass(policy, queue, running, repeat)
            print(f"    {policy:<16} {shape:<8} {empty * 1e6:>8.1f}us {blocked * 1e3:>8.3f}ms "
                  f"{blocked / empty:>7.1f}x")


# --- (b) submit latency through a real daemon --------------------------------

def _dispatch() -> list[str]:
    """The ``dispatch`` of this venv, else the one on PATH, else the module."""
    here = Path(sys.executable).parent / "dispatch"
    if here.exists():
        return [str(here)]
    found = shutil.which("dispatch")
    return [found] if found else [sys.executable, "-m", "hpc_batch.cli"]


def _submit(socket_path: str, *args: str) -> tuple[float, int | None]:
    """Run ``dispatch new ARGS``; return (seconds, job id or None)."""
    env = dict(os.environ, HPC_BATCH_SOCKET=socket_path, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    r = subprocess.run([*_dispatch(), "new", *args], env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"dispatch new failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    m = re.search(r"^job (\d+)", r.stdout, re.M)
    return took, int(m.group(1)) if m else None


def _kill(socket_path: str, ids) -> int:
    """``dispatch kill`` each id; return how many failed."""
    env = dict(os.environ, HPC_BATCH_SOCKET=socket_path, PYTHONPATH=str(ROOT))
    with ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(lambda i: subprocess.run([*_dispatch(), "kill", str(i)], env=env,
                                                     capture_output=True).returncode, ids))
    return sum(1 for c in codes if c != 0)


def bench_submit_latency(socket_path: str, n_blocked: int = N_BLOCKED, samples: int = 15,
                         clean_queue: bool = True) -> None:
    """Part (b): time ``dispatch new`` with an empty queue and with ``n_blocked``.

    An exclusive ``sleep`` job occupies the machine so that everything after
    it stays queued. At the end the queued jobs are removed (newest first,
    while the blocker still holds the machine) unless ``clean_queue`` is
    False (a throwaway daemon), and then the blocker is killed. Filling the
    queue costs one ``dispatch`` process per job: minutes for 10,000.
    """
    print(f"(b) dispatch new latency via {socket_path} (median of {samples})")
    queued: list[int] = []
    blocker = None
    try:
        def probe(ids: list[int] | None) -> float:
            times = []
            for _ in range(samples):
                took, jid = _submit(socket_path, "--cpu", "1", "--no-output", "--", "true")
                times.append(took)
                if ids is not None and jid is not None:
                    ids.append(jid)
            return statistics.median(times)

        empty = probe(None)  # these start at once: the queue is empty
        _, blocker = _submit(socket_path, "--exclusive", "--no-output", "--", "sleep", "3600")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:  # order of the filler does not matter
            for _, jid in ex.map(lambda _: _submit(socket_path, "--cpu", "1", "--no-output", "--", "true"),
                                 range(n_blocked)):
                if jid is not None:
                    queued.append(jid)
        print(f"    filled the queue with {n_blocked} jobs in {time.perf_counter() - t0:.1f}s")
        blocked = probe(queued)
        print(f"    empty queue  {empty * 1e3:8.1f} ms   (the job starts at once)")
        print(f"    {n_blocked} blocked {blocked * 1e3:8.1f} ms   ratio {blocked / empty:.2f}x")
    finally:
        failed = _kill(socket_path, sorted(queued, reverse=True)) if clean_queue else 0
        if blocker is not None:
            failed += _kill(socket_path, [blocker])
        if failed:
            print(f"    warning: {failed} dispatch kill calls failed; check the queue")


def _start_daemon(tmp: str) -> tuple[subprocess.Popen, str]:
    """Start a throwaway daemon in user mode; return it and its socket."""
    sock = os.path.join(tmp, "sock")
    cmd = [sys.executable, "-m", "hpc_batch.daemon", "--no-cgroups", "--socket", sock,
           "--state-dir", os.path.join(tmp, "state"), "--no-dev-dir", "--admin-group", "staff"]
    with open(os.path.join(tmp, "log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, cwd=str(ROOT))
    for _ in range(100):
        if os.path.exists(sock) or proc.poll() is not None:
            break
        time.sleep(0.1)
    if not os.path.exists(sock):
        proc.terminate()
        raise RuntimeError(f"daemon did not start; see {tmp}/log")
    return proc, sock


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=30, help="passes timed per figure in (a)")
    p.add_argument("--socket", help="run (b) against this running daemon")
    p.add_argument("--start-daemon", action="store_true", help="run (b) against a throwaway daemon")
    p.add_argument("--blocked", type=int, default=N_BLOCKED, help="queue length for (b)")
    args = p.parse_args()
    bench_schedule_pass(args.repeat)
    if args.socket:
        bench_submit_latency(args.socket, args.blocked)
    elif args.start_daemon:
        tmp = tempfile.mkdtemp(prefix="hpc-batch-bench-")
        proc, sock = _start_daemon(tmp)
        try:
            bench_submit_latency(sock, args.blocked, clean_queue=False)
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("(b) skipped: pass --socket PATH or --start-daemon to time dispatch new")
    return 0


if __name__ == "__main__":
    sys.exit(main())

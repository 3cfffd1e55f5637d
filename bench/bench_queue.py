#!/usr/bin/env python3
"""Benchmark: does a long blocked queue make one scheduling pass slower?

One ``scheduler.schedule`` pass with an empty queue vs with 10,000 queued
jobs that cannot start, per policy, printed as ratios against the
empty-queue pass measured in the same run. Blocked shapes: "full" (no free
core: backfill can stop at once), "gpus" (cores idle, every job wants more
GPUs than are free), "mem" (cores idle, memory short) and "split"
(--numa-local jobs: the node with cores has no memory, the node with memory
has no cores; the slowest rejection). The backfill policies scan the whole
queue in the last three. Pure Python against a made-up machine: no daemon.
What a long queue costs a client through a real daemon is a figure of
bench/run.

Prints figures only; it asserts nothing.

    python bench/bench_queue.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpc_batch.core.resources import Allocation, Budget, GiB, Limits, Machine, Node, Request  # noqa: E402
from hpc_batch.core.scheduler import POLICIES, QueuedJob, RunningJob, schedule  # noqa: E402

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
    """Print the blocked-queue pass time as a ratio of the empty pass."""
    print(f"one scheduling pass, {N_BLOCKED} blocked jobs vs an empty queue (median of {repeat})")
    print(f"    {'policy':<16} {'shape':<8} {'empty':>10} {'blocked':>10} {'ratio':>8}")
    for shape in ("full", "gpus", "mem", "split"):
        running, queue = _scenario(shape)
        for policy in POLICIES:
            empty = _time_pass(policy, [], running, repeat)
            blocked = _time_pass(policy, queue, running, repeat)
            print(f"    {policy:<16} {shape:<8} {empty * 1e6:>8.1f}us {blocked * 1e3:>8.3f}ms "
                  f"{blocked / empty:>7.1f}x")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=30, help="passes timed per figure")
    args = p.parse_args()
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1 (got {args.repeat})")
    bench_schedule_pass(args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())

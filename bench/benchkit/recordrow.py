"""A job's start with its reproducibility record against the same start without one (issue 22).

The record adds one thing before the job's first instruction: the start
snapshot of its sentinels, taken by the shepherd just before it forks the
job (``shepherd/record/recorder.py``). Everything else (static sections, the
executable's hash, the GPU query) runs after the start, on the housekeeping
CPUs. Two daemons on the same CPUs, one with ``--records none``, take the
probe in turn.
"""

from __future__ import annotations

import os
import statistics
import time

from shepherd.base import sysread
from shepherd.record import sentinels

from . import probe
from .client import submit_to_stamp
from .context import Context
from .report import Figure
from .stats import summarize


def _snapshot_cost(cpus: list[int], runs: int) -> str:
    """One line: the start snapshot alone, timed in this process on the job's CPUs."""
    src = sysread.Source("/")
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sentinels.snapshot(src, cpus, cpus, cpus, None)
        took.append(time.perf_counter() - t0)
    return (f"The start snapshot alone (`sentinels.snapshot` on CPUs {cpus}, no cgroup), timed in this "
            f"process {runs} times: {summarize(took, 'ms').text()}.")


def measure(ctx: Context, figs: dict[str, Figure]) -> None:
    """Row record_start: submit to first instruction, a record against none, alternating."""
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    with_record = ctx.daemon("record", cpus=cpus)
    without = ctx.daemon("norecord", cpus=cpus, args=("--records", "none"))
    argv, _ = probe.build(ctx.scratch)
    rec: list[float] = []
    bare: list[float] = []
    for d in (with_record, without):
        d.wait_idle()
    for i in range(ctx.plan.runs):   # which goes first alternates
        pair = [(with_record, rec), (without, bare)] if i % 2 == 0 else [(without, bare), (with_record, rec)]
        for d, into in pair:
            into.append(submit_to_stamp(d, argv, f"recstamp.{i}.log"))
    fig = figs["record_start"]
    fig.value, fig.baseline = summarize(rec, "ms"), summarize(bare, "ms")
    diffs = sorted(a - b for a, b in zip(rec, bare))
    fig.details.append(f"Paired differences (record - none, same round): median "
                       f"{statistics.median(diffs) * 1e3:+.1f} ms [{diffs[0] * 1e3:+.1f} to {diffs[-1] * 1e3:+.1f}].")
    fig.details.append(_snapshot_cost(sorted(cpus), max(ctx.plan.runs, 20)))

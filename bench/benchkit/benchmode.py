"""A benchmark job's start against a plain job's, and its shepherd's wakeups while it runs (issue 21).

A ``--benchmark`` start does more in the daemon than a plain one (``Starting.quiet``:
IRQs steered to the housekeeping CPUs, cpufreq read or set, the partition tried, the
record saved), all before the shepherd is spawned; then nothing more until the job
ends, so its shepherd sleeps as a plain job's does.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from hpc_batch.daemon import probe as hpc_probe
from hpc_batch.daemon.benchmode import quiet

from . import probe
from .client import submit_to_stamp
from .context import Context
from .report import Figure
from .scratchd import ScratchDaemon
from .shepherd import _footprint, _shepherds
from .stats import summarize

BENCH = ("--benchmark", "--cpu", "1")


def _show(d: ScratchDaemon, job: int) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(d.dispatch("show", "--json", str(job)).stdout)
    return shown


def _what_the_start_did(shown: dict[str, Any]) -> str:
    """One line from a benchmark job's record: IRQs moved and refused, the cpufreq policy, the partition."""
    rec = shown.get("quiet") or {}
    irqs = rec.get("irqs") or {}
    part = rec.get("partition")
    part_text = part.get("state") if isinstance(part, dict) else part
    return (f"What a benchmark start did here (job {shown.get('id')}'s record): {len(irqs.get('moved') or [])} "
            f"IRQs moved to CPU {irqs.get('to')}, {len(irqs.get('unmovable') or {})} refused; cpufreq "
            f"{(rec.get('cpufreq') or {}).get('policy')}; partition {part_text or 'none (--no-cgroups)'}; "
            f"{len(shown.get('shortfalls') or [])} shortfalls recorded.")


def _quiet_cost(ctx: Context, shown: dict[str, Any], housekeeping: list[int], runs: int) -> str:
    """One line: the daemon's extra work for a benchmark job, timed here alone: its start
    (the counters read, then ``quiet.begin``, as ``BenchCores.start_counters`` and ``quiet_cores`` do) and
    its end (``quiet.end``), with the CPUs and housekeeping CPUs the daemon gave the job."""
    cpus = tuple(shown.get("cpus") or ())
    held = tuple(shown.get("held_cpus") or cpus)
    jdir = os.path.join(ctx.scratch, "quiet-cost")
    os.makedirs(jdir, exist_ok=True)
    settings = quiet.Settings(ledger=os.path.join(ctx.scratch, quiet.LEDGER))   # the daemon's defaults
    starts, ends = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        try:
            hpc_probe.read(time.time(), "/", held)
            rec = quiet.begin(jdir, cpus, held, tuple(housekeeping), settings, alone=False)
        finally:
            t1 = time.perf_counter()
            quiet.end(jdir, settings)   # always: what begin moved goes back
            t2 = time.perf_counter()
        starts.append(t1 - t0)
        ends.append(t2 - t1)
    moved = len((rec.get("irqs") or {}).get("moved") or [])
    return (f"The daemon's extra work alone, timed in this process with the same code and CPUs "
            f"({moved} IRQs moved each time), {runs} times: start {summarize(starts, 'ms').text()}, "
            f"end {summarize(ends, 'ms').text()}.")


def daemon(ctx: Context) -> ScratchDaemon | None:
    """The daemon of these rows: on the 2 CPUs of (1), the lower reserved, so it and its shepherds run
    there and both kinds of job get the same other CPU. None on a machine with fewer than 2 CPUs."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        return None
    return ctx.daemon("benchmark", cpus=set(cpus), args=("--reserve-cpu", "1"))


def measure(ctx: Context, figs: dict[str, Figure]) -> None:
    """Rows bench_start and bench_wakeups, on a daemon of their own."""
    d = daemon(ctx)
    if d is None:
        for key in ("bench_start", "bench_wakeups"):
            figs[key].missing = "needs 2 CPUs: one for housekeeping, one for the job"
        return
    argv, _ = probe.build(ctx.scratch)
    bench: list[float] = []
    plain: list[float] = []
    d.wait_idle()
    for i in range(ctx.plan.runs):  # alternate, the benchmark job first and then second
        pair = [("bench", BENCH), ("plain", ())] if i % 2 == 0 else [("plain", ()), ("bench", BENCH)]
        for kind, options in pair:
            took = submit_to_stamp(d, argv, f"{kind}stamp.{i}.log", *options)
            (bench if kind == "bench" else plain).append(took)
    fig = figs["bench_start"]
    fig.value, fig.baseline = summarize(bench, "ms"), summarize(plain, "ms")
    diffs = sorted(b - p for b, p in zip(bench, plain))
    fig.details.append(f"Paired differences (benchmark - plain, same round): median "
                       f"{statistics.median(diffs) * 1e3:+.1f} ms [{diffs[0] * 1e3:+.1f} to {diffs[-1] * 1e3:+.1f}].")

    woke: list[int] = []
    base: list[int] = []
    shown: list[dict[str, Any]] = []
    for _ in range(ctx.plan.shepherd_rounds):
        for options, into in ((BENCH, woke), ((), base)):   # one CPU for jobs: one job at a time
            d.wait_idle()
            job = d.submit(*options, "--no-output", "--", "sleep", "3600")
            try:
                into += _footprint(_shepherds(d, [job]), ctx.plan.window)[2]
                shown.append(_show(d, job))
            finally:
                d.dispatch("kill", str(job), check=False)
    d.wait_idle()
    figs["bench_wakeups"].value = summarize(woke, "count")
    figs["bench_wakeups"].baseline = summarize(base, "count")
    cpus = {"benchmark" if s.get("benchmark") else "plain": s.get("cpus") for s in shown}
    fig.details.append(f"CPUs the jobs got: {cpus}; the daemon's own is reserved (`--reserve-cpu 1`).")
    fig.details.append(_what_the_start_did(shown[0]))
    fig.details.append(_quiet_cost(ctx, shown[0], d.call("status")["result"]["housekeeping"], ctx.plan.runs))

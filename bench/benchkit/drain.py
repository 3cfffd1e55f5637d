"""Drain rates: one bulk `--array` submit (records on and off, the daemon pinned to its housekeeping CPUs
and not) and a loop of single submits, against the design floor and task-spooler, all alternating round
by round."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from functools import partial

from . import cpushare, floor, spooler
from .context import Context
from .report import Figure, second_target
from .rows import DRAIN_VS_TSP
from .scratchd import DISPATCH, DaemonError, ScratchDaemon
from .stats import rates, summarize

USAGE = 2  # dispatch's exit status for a command line it does not accept


def has_array(d: ScratchDaemon) -> bool:
    """Whether this dispatch takes ``new --array``: a one-element array is submitted, or refused as usage."""
    r = d.dispatch("new", "--array", "1-1", "--no-output", "--", "true", check=False)
    if r.returncode == USAGE:
        return False
    if r.returncode != 0:
        raise DaemonError(f"dispatch new --array 1-1 exited {r.returncode}: {r.stderr.strip()}")
    d.wait_idle()
    return True


def _loop(d: ScratchDaemon, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        r = subprocess.run([DISPATCH, "new", "--no-output", "--", "true"], env=d.env, cwd=d.work,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise DaemonError(f"dispatch new exited {r.returncode}: {r.stderr.decode().strip()}")
    return d.wait_idle(poll=0.01) - t0


def _array(d: ScratchDaemon, n: int) -> float:
    t0 = time.perf_counter()
    d.dispatch("new", "--array", f"1-{n}", "--no-output", "--", "true")
    return d.wait_idle(poll=0.01) - t0


SLOTS = 2  # the drain's slots: *d* is pinned to 2 CPUs, tsp runs -S 2, the floor 2 at a time


def _costed(n: int, seconds: list[float], cpu: list[cpushare.PerJob], run: Callable[[], float],
            daemon: ScratchDaemon | None = None) -> None:
    """*run()*, a drain of *n* jobs: its seconds into *seconds*, what each job cost into *cpu*."""
    pids = (daemon.proc.pid if daemon.proc else None, daemon.fork_server()) if daemon else (None, None)
    before = cpushare.read(*pids)
    seconds.append(run())
    cpu.append(cpushare.per_job(before, cpushare.read(*pids), n))


def measure(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Rows drain_* on *d* (pinned to 2 CPUs) and a `--records none` twin; each round drains every kind once."""
    plan, n = ctx.plan, ctx.plan.drain_jobs
    client, about = spooler.find(ctx.install)
    ctx.notes.append(f"task-spooler: {about}" + (f" ({client})" if client else ""))
    spool = spooler.Spooler(client, os.path.join(ctx.scratch, "tsp"), SLOTS, n) if client else None
    array = has_array(d)
    bare = ctx.daemon("norecords", cpus=d.cpus, args=("--records", "none")) if array else None
    free = ctx.daemon("unpinned", cpus=d.cpus, args=("--housekeeping-cpus", "none")) if array else None
    ts: list[float] = []
    fl: list[float] = []
    arr: list[float] = []
    arr_bare: list[float] = []
    arr_free: list[float] = []
    loop: list[float] = []
    single: list[float] = []
    cpu: dict[str, list[cpushare.PerJob]] = {k: [] for k in ("floor", "array", "bare", "free", "loop")}
    try:
        for i in range(plan.drain_runs):
            ctx.say(f"drain round {i + 1} of {plan.drain_runs}: {n} jobs each")
            if spool is not None:
                ts.append(spool.drain(["true"], n))
            _costed(n, fl, cpu["floor"], lambda: floor.drain(os.path.join(ctx.scratch, "floor-drain"), n, SLOTS))
            d.wait_idle()
            if array and bare is not None and free is not None:
                # Which goes first turns round by round, so none always follows the floor's disk writes.
                twins = [(d, arr, "array"), (bare, arr_bare, "bare"), (free, arr_free, "free")]
                for daemon, into, kind in twins[i % 3:] + twins[:i % 3]:
                    daemon.wait_idle()
                    _costed(n, into, cpu[kind], partial(_array, daemon, n), daemon)
            for _ in range(plan.submit_refs):
                single.append(d.timed("new", "--no-output", "--", "true"))
                d.wait_idle()
            _costed(n, loop, cpu["loop"], lambda: _loop(d, n), d)
    finally:
        if spool is not None:
            spool.stop()
    for twin in (bare, free):
        if twin is not None:
            twin.stop()
    a, lo, fr, nr = figs["drain_array"], figs["drain_loop"], figs["drain_floor"], figs["drain_norecords"]
    un = figs["drain_unpinned"]
    tsp = summarize(rates(n, ts), "jobs/s") if ts else None
    fr.value = a.baseline = nr.baseline = un.baseline = summarize(rates(n, fl), "jobs/s")
    fr.baseline = tsp
    fr.baseline_missing = None if tsp else about
    if array:
        a.value = summarize(rates(n, arr), "jobs/s")
        nr.value = summarize(rates(n, arr_bare), "jobs/s")
        un.value = summarize(rates(n, arr_free), "jobs/s")
        un.details.append(f"Beside row (3) on the same rounds: {un.value.median / a.value.median:.2f}x its rate.")
        a.details.append(second_target(f"`tsp -S 2` ({tsp.text()})" if tsp else "`tsp -S 2`",
                                       a.value.median / tsp.median if tsp else None, DRAIN_VS_TSP))
    else:
        a.missing = nr.missing = un.missing = "no --array: dispatch new refuses it as a usage error"
    for fig, kind in ((fr, "floor"), (a, "array"), (nr, "bare"), (un, "free"), (lo, "loop")):
        if cpu[kind]:
            fig.details.append(cpushare.describe(cpu[kind]))
    lo.value = summarize(rates(n, loop), "jobs/s")
    lo.baseline = summarize([1 / s for s in single], "jobs/s")
    lo.details.append(f"One submit with the daemon idle took {summarize(single, 'ms').text()}.")
    lo.details.append(f"Beside the design floor (3a) the loop reaches {lo.value.median / fr.value.median:.2f}x "
                      "its rate.")
    if tsp is not None:
        lo.details.append(f"Beside `tsp -S 2` ({tsp.text()}) the loop reaches "
                          f"{lo.value.median / tsp.median:.2f}x its rate.")

"""Drain rates: one bulk `--array` submit and a loop of single submits, against task-spooler."""

from __future__ import annotations

import os
import subprocess
import time

from . import spooler
from .context import Context
from .report import Figure
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


def measure(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Rows drain_array and drain_loop on *d* (pinned to 2 CPUs); each round drains every kind once."""
    plan, n = ctx.plan, ctx.plan.drain_jobs
    client, about = spooler.find(ctx.install)
    ctx.notes.append(f"task-spooler: {about}" + (f" ({client})" if client else ""))
    spool = spooler.Spooler(client, os.path.join(ctx.scratch, "tsp"), 2, n) if client else None
    array = has_array(d)
    ts: list[float] = []
    arr: list[float] = []
    loop: list[float] = []
    single: list[float] = []
    try:
        for i in range(plan.drain_runs):
            ctx.say(f"drain round {i + 1} of {plan.drain_runs}: {n} jobs each")
            if spool is not None:
                ts.append(spool.drain(["true"], n))
            d.wait_idle()
            if array:
                arr.append(_array(d, n))
            for _ in range(plan.submit_refs):
                single.append(d.timed("new", "--no-output", "--", "true"))
                d.wait_idle()
            loop.append(_loop(d, n))
    finally:
        if spool is not None:
            spool.stop()
    a, lo = figs["drain_array"], figs["drain_loop"]
    tsp = summarize(rates(n, ts), "jobs/s") if ts else None
    a.baseline = tsp
    a.baseline_missing = None if tsp else about
    if array:
        a.value = summarize(rates(n, arr), "jobs/s")
    else:
        a.missing = "no --array: dispatch new refuses it as a usage error"
    lo.value = summarize(rates(n, loop), "jobs/s")
    lo.baseline = summarize([1 / s for s in single], "jobs/s")
    lo.details.append(f"One submit with the daemon idle took {summarize(single, 'ms').text()}.")
    if tsp is not None:
        lo.details.append(f"Beside `tsp -S 2` ({tsp.text()}) the loop reaches "
                          f"{lo.value.median / tsp.median:.2f}x its rate.")

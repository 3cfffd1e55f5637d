"""The shepherd's footprint while its job is silent: PSS, RSS and wakeups."""

from __future__ import annotations

import os
import subprocess
import time

from . import floor, procs
from .context import Context
from .report import Figure
from .rows import MANY_MIN_JOB_MEM, MANY_SHEPHERDS, SHEPHERD_PSS_BOUND
from .scratchd import PYTHON, DaemonError, ScratchDaemon
from .stats import summarize


def _settle(pids: list[int], timeout: float = 10.0, quiet: float = 0.2) -> None:
    """Wait until none of *pids* has been woken for *quiet* seconds (each is parked).

    One that keeps waking is measured anyway once *timeout* passes: its
    wakeups are then the figure, not a reason to give up.
    """
    deadline = time.monotonic() + timeout
    last = [procs.wakeups(p) for p in pids]
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = [procs.wakeups(p) for p in pids]
        if now == last:
            return
        last = now


def _footprint(pids: list[int], window: float) -> tuple[list[int], list[int], list[int]]:
    """PSS, RSS and wakeups over *window* seconds of each of *pids*, once they settled."""
    _settle(pids)
    mem = [procs.memory(p) for p in pids]
    before = [procs.wakeups(p) for p in pids]
    time.sleep(window)
    woke = [procs.wakeups(p) - b for p, b in zip(pids, before)]
    return [m[0] for m in mem], [m[1] for m in mem], woke


def _shepherds(d: ScratchDaemon, jobs: list[int], timeout: float = 20.0) -> list[int]:
    """The shepherds' pids once every one of *jobs* runs (each found through its job's pidfile)."""
    dirs = [procs.job_dir(d.state, j) for j in jobs]
    deadline = time.monotonic() + timeout
    while True:
        found = [procs.shepherd_of(j) for j in dirs]
        if all(found) and d.counts()["running"] == len(jobs):
            return [p for p in found if p is not None]
        if time.monotonic() > deadline:
            # Say what became of them: a job that ended (say, out of pids on an old daemon) never gets one.
            rows = d.dispatch("list", "--finished", check=False).stdout.splitlines()
            mine = [r for r in rows if len(r.split()) > 1 and r.split()[1] in {str(j) for j in jobs}]
            log = d.log_text().splitlines()[-20:]
            raise DaemonError(f"the shepherds of jobs {jobs} did not all appear within {timeout:.0f} s "
                              f"(found: {found}; counts: {d.counts()}); the jobs: {mine}; "
                              f"the daemon's log ends: {log}")
        time.sleep(0.02)


def _jobs_footprint(d: ScratchDaemon, k: int, window: float) -> tuple[list[int], list[int], list[int]]:
    """PSS, RSS and wakeups of the shepherds of *k* silent jobs on *d*, killed afterwards."""
    d.wait_idle()
    jobs = [d.submit("--no-output", "--", "sleep", "3600") for _ in range(k)]
    try:
        return _footprint(_shepherds(d, jobs), window)
    finally:
        for j in jobs:
            d.dispatch("kill", str(j), check=False)
        d.wait_idle()


def _floor_pss(ctx: Context, k: int) -> list[int]:
    """PSS of each of *k* of the design floor's forked shepherds, their jobs silent."""
    with floor.silent(os.path.join(ctx.scratch, "floor-silent"), k) as pids:
        return _footprint(pids, 0.0)[0]


def measure_many(ctx: Context, figs: dict[str, Figure]) -> None:
    """Row shepherd_pss_many (5b): its floor always; its shepherds only where a daemon can run that many
    jobs (one whose jobs' budgets are floored at MANY_MIN_JOB_MEM, see rows)."""
    fig, n = figs["shepherd_pss_many"], MANY_SHEPHERDS
    cpus = len(os.sched_getaffinity(0))
    d = ctx.daemon("many", args=("--min-job-mem", f"{MANY_MIN_JOB_MEM >> 20}M")) if cpus >= n else None
    pss, base = [], []
    for _ in range(ctx.plan.shepherd_rounds):
        if d is not None:
            pss += _jobs_footprint(d, n, 0.0)[0]
        base += _floor_pss(ctx, n)
    fig.baseline = summarize(base, "MiB")
    if d is None:
        fig.missing = (f"needs {n} CPUs to run {n} jobs at once under --no-cgroups; this machine lets the "
                       f"benchmark use {cpus}")
    else:
        fig.value = summarize(pss, "MiB")
        d.stop()


def measure(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Rows shepherd_*: per round, one silent job per offered CPU, as many of the design floor's shepherds,
    then as many sleeping pythons; then row (5b)."""
    k = d.offered_cpus()
    pss, rss, woke, bpss, brss, bwoke, fpss = [], [], [], [], [], [], []
    for _ in range(ctx.plan.shepherd_rounds):
        p, r, w = _jobs_footprint(d, k, ctx.plan.window)
        pss += p
        rss += r
        woke += w
        fpss += _floor_pss(ctx, k)
        sleepers = [subprocess.Popen([PYTHON, "-E", "-s", "-S", "-c", "import time; time.sleep(3600)"],
                                     stdin=subprocess.DEVNULL) for _ in range(k)]
        try:
            p, r, w = _footprint([s.pid for s in sleepers], ctx.plan.window)
        finally:
            for s in sleepers:
                s.kill()
                s.wait()
        bpss += p
        brss += r
        bwoke += w
    label = f"{k} shepherd{'s' if k > 1 else ''} running"
    figs["shepherd_pss"].label += f" ({label})"
    pss_fig = figs["shepherd_pss"]
    pss_fig.value, pss_fig.baseline = summarize(pss, "MiB"), summarize(fpss, "MiB")
    py = summarize(bpss, "MiB")
    within = pss_fig.value.median <= SHEPHERD_PSS_BOUND
    pss_fig.details.append(f"As many sleeping `python -E -s -S`: {py.text()}; the shepherds are "
                           f"{pss_fig.value.median / py.median:.2f}x that. Against issue 24's target of "
                           f"{py.show(SHEPHERD_PSS_BOUND)}: {'met' if within else 'not met'}.")
    figs["shepherd_rss"].value, figs["shepherd_rss"].baseline = summarize(rss, "MiB"), summarize(brss, "MiB")
    figs["shepherd_wakeups"].value = summarize(woke, "count")
    figs["shepherd_wakeups"].baseline = summarize(bwoke, "count")

"""Restart after a crash: from starting a new daemon until it serves every job it had."""

from __future__ import annotations

import time
from typing import Any

from .context import Context
from .report import Figure
from .scratchd import DaemonError
from .stats import summarize


def measure(ctx: Context, figs: dict[str, Figure]) -> None:
    """Row restart: the daemon with jobs and an empty one are killed and restarted in turn."""
    total = ctx.plan.restart_jobs
    held = ctx.daemon("restart-jobs", args=("--max-queued-per-user", str(total + 10)))
    bare = ctx.daemon("restart-empty")
    try:
        running = min(total, held.offered_cpus())
        held.submit_many(["sleep", "3600"], total)
        deadline = time.monotonic() + 60
        while held.counts() != {"running": running, "queued": total - running, "waiting": 0}:
            if time.monotonic() > deadline:
                raise DaemonError(f"expected {running} running jobs, have {held.counts()}")
            time.sleep(0.02)

        def all_back(reply: dict[str, Any]) -> bool:
            states = [j["state"] for j in reply["result"]["jobs"]]
            return states.count("running") == running and states.count("queued") == total - running

        loaded: list[float] = []
        empty: list[float] = []
        for _ in range(ctx.plan.restart_runs):
            for d, ready, times in ((held, all_back, loaded), (bare, lambda reply: True, empty)):
                d.kill9()
                t0 = time.perf_counter()
                d.spawn()
                times.append(d.wait_serving(ready) - t0)
        # What a user would see: the real client lists every job.
        rows = held.dispatch("list").stdout.splitlines()
        if len(rows) != total:
            raise DaemonError(f"dispatch list shows {len(rows)} jobs after the restarts, not {total}")
    finally:
        held.stop()
        bare.stop()
    f = figs["restart"]
    f.label = f"restart with {total} jobs ({running} running, {total - running} queued) until it serves again"
    if running < total:
        f.details.append(f"Only {running} of the {total} jobs can run at once here: under `--no-cgroups` each "
                         "takes a whole CPU and the daemon offers the CPUs it may use; the rest are queued.")
    f.value, f.baseline = summarize(loaded, "s"), summarize(empty, "s")

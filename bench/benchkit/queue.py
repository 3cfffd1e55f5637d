"""Client cost behind a long queue: `dispatch list` and `dispatch new`, long queue against empty."""

from __future__ import annotations

import time

from .context import Context
from .report import Figure
from .scratchd import DaemonError, ScratchDaemon
from .stats import summarize


def _blocked(ctx: Context, name: str, room: int) -> ScratchDaemon:
    """A daemon whose every CPU is held by one job, so whatever comes next queues."""
    d = ctx.daemon(name, args=("--max-queued-per-user", str(room)))
    d.submit("--exclusive", "--no-output", "--", "sleep", "3600")
    if d.counts()["running"] != 1:
        raise DaemonError(f"the blocking job of daemon {name} did not start")
    return d


def _fill(ctx: Context, d: ScratchDaemon, total: int) -> None:
    have = d.counts()["queued"]
    t0 = time.perf_counter()
    d.submit_many(["true"], total - have)
    ctx.say(f"queued {total - have} jobs in {time.perf_counter() - t0:.1f} s (now {total})")


def measure(ctx: Context, figs: dict[str, Figure]) -> None:
    """Rows queue_list and queue_new: the two daemons take turns, one sample each."""
    plan = ctx.plan
    room = max(plan.queue_new, plan.queue_list) + 2 * plan.runs + 10
    empty, full = _blocked(ctx, "queue-empty", room), _blocked(ctx, "queue-long", room)
    try:
        _fill(ctx, full, plan.queue_list)
        base, lst = [], []
        for _ in range(plan.runs):
            base.append(empty.timed("list"))
            lst.append(full.timed("list"))
        _fill(ctx, full, plan.queue_new)
        base_new, new = [], []
        for _ in range(plan.runs):
            base_new.append(empty.timed("new", "--", "true"))
            new.append(full.timed("new", "--", "true"))
    finally:
        empty.stop()
        full.stop()
    figs["queue_list"].value, figs["queue_list"].baseline = summarize(lst, "ms"), summarize(base, "ms")
    figs["queue_new"].value, figs["queue_new"].baseline = summarize(new, "ms"), summarize(base_new, "ms")

"""A bulk submit at the per-user cap, stored a slice per turn: another client's answers meanwhile."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .context import Context
from .report import Figure
from .scratchd import DaemonError, ScratchDaemon
from .stats import summarize


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _pinging(d: ScratchDaemon, stop: threading.Event, took: list[float]) -> None:
    """Another client's pings, back to back, until *stop*: each answer's time goes in *took*."""
    while not stop.is_set():
        t0 = time.perf_counter()
        if not d.call("ping").get("ok"):
            raise DaemonError("a ping was refused")
        took.append(time.perf_counter() - t0)


def _pinged(d: ScratchDaemon, during: Callable[[], Any]) -> tuple[list[float], Any]:
    """The ping times while *during()* runs, and what it gave."""
    took: list[float] = []
    stop = threading.Event()
    t = threading.Thread(target=_pinging, args=(d, stop, took), daemon=True)
    t.start()
    try:
        out = during()
    finally:
        stop.set()
        t.join()
    return took, out


def measure(ctx: Context, figs: dict[str, Figure]) -> None:
    """Row bulk_loop."""
    n = ctx.plan.bulk_jobs
    d = ScratchDaemon(os.path.join(ctx.scratch, "bulk"), None,
                      ("--max-queued-per-user", str(n + 10), "--keep-finished", "10"))
    ctx.daemons.append(d)
    d.start()
    d.dispatch("new", "--name", "hold", "--no-output", "--", "sleep", "3600")
    worst, base, stored = [], [], []
    for _ in range(ctx.plan.bulk_runs):
        alone, _ = _pinged(d, lambda: time.sleep(0.5))
        base.append(_p99(alone))
        t0 = time.perf_counter()
        took, reply = _pinged(d, lambda: d.dispatch("new", "--json", "--no-output", "--after", "hold",
                                                    "--array", f"1-{n}", "--", "true"))
        stored.append(time.perf_counter() - t0)
        worst.append(_p99(took))
        bulk = json.loads(reply.stdout)
        d.dispatch("kill", f"{bulk['id']}-{bulk['last']}")
    f = figs["bulk_loop"]
    f.value, f.baseline = summarize(worst, "ms"), summarize(base, "ms")
    f.details.append(f"The {n:,}-job submit was answered after {summarize(stored, 's').text()} "
                     f"(stored a slice per turn, then entered).")
    d.stop()

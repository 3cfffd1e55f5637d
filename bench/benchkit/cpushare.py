"""The CPU a drained job costs, and which processes spent it (rows 3, 3a, 3b, 3c and 4).

A drain's rate on a small machine moves with the host (its file system's state, its other
tenants) by a tenth or more from run to run; the CPU each job costs moves less, and says where
the gap to the design floor lies. Everything is read from /proc (proc(5)) before and after a
drain:

- the machine's busy time, from ``/proc/stat``: user, nice, system, irq and softirq (not idle,
  iowait or steal; guest time is already in user), in all and per CPU;
- for a daemon: its main thread's time, its process's (every thread, those that exited too), its
  fork server's own, and the fork server's reaped children's: the shepherds, each of which has
  reaped its job (a process's ``cutime``/``cstime`` count the children it waited for, and theirs).

What is left (the clients, the benchmark itself, kernel threads, other tenants) is "everything
else".
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from .procs import read_text

TICK = 1 / os.sysconf("SC_CLK_TCK")   # seconds in a clock tick, the unit of every figure read here
BUSY_COLUMNS = (0, 1, 2, 5, 6)        # of a cpu line, after its name: user nice system irq softirq
MAIN, THREADS, SERVER, SHEPHERDS = ("the daemon's main thread", "its other threads", "its fork server",
                                    "the shepherds and their jobs")
PARTS = (MAIN, THREADS, SERVER, SHEPHERDS)
REST = "everything else"


def busy_ticks(stat_text: str) -> dict[str, int]:
    """Busy ticks of each ``cpu`` line of a /proc/stat text: ``{"cpu": all, "cpu0": ..., ...}``."""
    out = {}
    for line in stat_text.splitlines():
        words = line.split()
        if words and words[0].startswith("cpu"):
            values = [int(w) for w in words[1:]]
            out[words[0]] = sum(values[i] for i in BUSY_COLUMNS if i < len(values))
    return out


def task_ticks(stat_line: str) -> tuple[int, int, int, int]:
    """``(utime, stime, cutime, cstime)`` of a /proc/PID/stat line (fields 14 to 17; the command
    name, in parentheses, may hold spaces and parentheses of its own)."""
    rest = stat_line[stat_line.rindex(")") + 2:].split()
    utime, stime, cutime, cstime = (int(rest[i]) for i in range(11, 15))
    return utime, stime, cutime, cstime


@dataclass(frozen=True)
class Reading:
    """Ticks at one moment: the machine's busy time (by cpu line) and each part's (PARTS)."""

    busy: dict[str, int]
    parts: dict[str, int] = field(default_factory=dict)


def read(daemon: int | None = None, fork_server: int | None = None, proc: str = "/proc") -> Reading:
    """The machine's busy ticks, and the parts of *daemon* (a pid) and its *fork_server* that can be read."""
    parts: dict[str, int] = {}
    whole = read_text(f"{proc}/{daemon}/stat") if daemon else None
    main = read_text(f"{proc}/{daemon}/task/{daemon}/stat") if daemon else None
    if whole is not None and main is not None:
        u, s, _, _ = task_ticks(whole)
        mu, ms, _, _ = task_ticks(main)
        parts[MAIN], parts[THREADS] = mu + ms, (u + s) - (mu + ms)
    server = read_text(f"{proc}/{fork_server}/stat") if fork_server else None
    if server is not None:
        u, s, cu, cs = task_ticks(server)
        parts[SERVER], parts[SHEPHERDS] = u + s, cu + cs
    return Reading(busy_ticks(read_text(f"{proc}/stat") or ""), parts)


@dataclass(frozen=True)
class PerJob:
    """Seconds of CPU a job, between two readings: busy in all, on the busiest CPU, and by part."""

    total: float
    busiest: tuple[str, float]
    parts: dict[str, float]


def per_job(before: Reading, after: Reading, jobs: int) -> PerJob:
    """What the *jobs* run between *before* and *after* cost each (parts read both times only)."""
    def each(ticks: int) -> float:
        return ticks * TICK / jobs
    cpus = {k: each(after.busy[k] - before.busy[k]) for k in after.busy if k in before.busy}
    total = cpus.pop("cpu", 0.0)
    busiest = max(cpus.items(), key=lambda kv: kv[1]) if cpus else ("cpu", total)
    parts = {k: each(after.parts[k] - before.parts[k]) for k in PARTS if k in after.parts and k in before.parts}
    if parts:
        parts[REST] = total - sum(parts.values())
    return PerJob(total, busiest, parts)


def describe(samples: Iterable[PerJob]) -> str:
    """One sentence for a row's note: the medians of *samples*, in ms a job."""
    runs = list(samples)
    if not runs:
        return ""

    def ms(values: Iterable[float]) -> str:
        return f"{statistics.median(values) * 1e3:.2f}"
    busiest = statistics.mode(r.busiest[0] for r in runs)
    text = (f"CPU a job (median of {len(runs)}): {ms(r.total for r in runs)} ms busy in all, "
            f"{ms(r.busiest[1] for r in runs if r.busiest[0] == busiest)} of them on {busiest}")
    names = [k for k in (*PARTS, REST) if all(k in r.parts for r in runs)]
    if names:
        text += "; " + ", ".join(f"{k} {ms(r.parts[k] for r in runs)}" for k in names)
    return text + " (from /proc: bench/benchkit/cpushare.py)."

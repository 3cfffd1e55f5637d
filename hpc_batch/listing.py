"""Formatting for ``dispatch list`` (pure: the caller passes the clock).

Columns: ``<username> <id> <command> <start> <uptime> <max-time> <mem>
<exclusive> <gpus>``, then ``<state> <exit>`` with ``--finished``. Start is
the local time the job began: ``HH:MM:SS`` today, ``YYYY-MM-DD HH:MM``
earlier. Queued jobs show ``-`` and ``queued``. ``+`` after the memory marks
a budget spread over more than one NUMA node. ``<gpus>`` is ``-``, the count,
or count and worst link (``2:NV12``) with ``!`` when the set crosses a host
bridge or the socket interconnect (``4:SYS!``).
"""

import time
from typing import Any

from .durations import format_clock, format_duration

GiB = 1 << 30
MiB = 1 << 20


def format_mem(n: int | None) -> str:
    """Compact memory size: ``32G``, ``1.5G``, ``512M``."""
    if n is None:
        return "-"
    if n >= GiB:
        return f"{n // GiB}G" if n % GiB == 0 else f"{n / GiB:.1f}G"
    return f"{max(1, round(n / MiB))}M"


def format_start(started: float, now: float) -> str:
    """``HH:MM:SS`` for a job that started today (local time), else ``YYYY-MM-DD HH:MM``."""
    s, n = time.localtime(started), time.localtime(now)
    if (s.tm_year, s.tm_yday) == (n.tm_year, n.tm_yday):
        return time.strftime("%H:%M:%S", s)
    return time.strftime("%Y-%m-%d %H:%M", s)


def one_line(text: str) -> str:
    """*text* with control characters escaped, so every job stays on one row."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _note(job: dict[str, Any]) -> str:
    notes = []
    res = job.get("result") or {}
    if res.get("kind") == "oom":
        notes.append("budget " + ("assigned by default" if job.get("mem_assigned")
                                  else "requested with --max-mem")
                     + f" was {format_mem(job.get('mem'))}")
    elif res.get("note"):
        notes.append(res["note"])
    if job.get("output_error"):
        notes.append(f"output not delivered: {job['output_error']}")
    if job.get("output_note"):
        notes.append(job["output_note"])
    return f" ({one_line('; '.join(notes))})" if notes else ""


def format_row(job: dict[str, Any], now: float, finished: bool) -> str:
    """One line of ``dispatch list``."""
    if job["state"] == "queued" or job.get("started") is None:
        start, uptime = "-", "queued"
    else:
        start = format_start(job["started"], now)
        uptime = format_clock((job.get("ended") or now) - job["started"])
    mem = format_mem(job.get("mem")) + ("+" if job.get("spread") else "")
    cols = [one_line(job["user"]), str(job["id"]), one_line(job["command"]), start, uptime,
            format_duration(job["max_time"]), mem, "yes" if job.get("exclusive") else "no",
            one_line(str(job.get("gpu_label") or "-"))]
    line = " ".join(cols)
    if finished:
        line += f" {job['state']} {job.get('exit') or '-'}" + _note(job)
    return line


def format_rows(jobs: list[dict[str, Any]], now: float, finished: bool) -> list[str]:
    """Every line of ``dispatch list``, in job id order."""
    return [format_row(j, now, finished) for j in sorted(jobs, key=lambda j: j["id"])]

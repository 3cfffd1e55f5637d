"""One row of ``dispatch list``: the text form, shared by the client and the daemon (pure).

Columns: ``<username> <id> <command> <start> <uptime> <max-time> <mem>
<exclusive> <cpus> <gpus>``, then ``<state> <exit>`` with ``--finished``. Start is
the local time the job began: ``HH:MM:SS`` today, ``YYYY-MM-DD HH:MM``
earlier. Queued jobs show ``-`` and ``queued``. ``+`` after the memory marks
a budget spread over more than one NUMA node. ``<gpus>`` is ``-``, the count,
or count and worst link (``2:NV12``) with ``!`` when the set crosses a host
bridge or the socket interconnect (``4:SYS!``). ``<cpus>`` is the CPUs
(threads) the job holds and, after a slash, the physical cores they are
on (``4/2c``: both threads of two cores); ``-`` before it starts. A
benchmark job holds CPUs outside its cpuset: ``2+2i/2c`` is two CPUs in its
cpuset and two held idle (their siblings), on two cores.

The row of a job that never started depends on nothing but the job (no
clock, no time zone), so the daemon writes those itself for a text listing
(``handlers.list_page``) and the client formats only the others; both with
``format_row``. For the table form the daemon sends ``table_row``'s values
instead, which hold no clock at all.
"""

import time

from shepherd.base.verdicts import VERDICTS

from .cut import one_line
from .durations import format_clock, format_duration
from .sizes import format_mem

TYPE_CHECKING = False
if TYPE_CHECKING:   # dispatch list formats its rows with this module: keep typing off that path
    from typing import Any


def format_start(started: float, now: float) -> str:
    """``HH:MM:SS`` for a job that started today (local time), else ``YYYY-MM-DD HH:MM``."""
    s, n = time.localtime(started), time.localtime(now)
    if (s.tm_year, s.tm_yday) == (n.tm_year, n.tm_yday):
        return time.strftime("%H:%M:%S", s)
    return time.strftime("%Y-%m-%d %H:%M", s)


def format_row(job: "dict[str, Any]", now: float, finished: bool) -> str:
    """One line of ``dispatch list``."""
    if job.get("started") is None:
        start, uptime = "-", job["state"] if job["state"] in ("queued", "waiting") else "-"
    else:
        start = format_start(job["started"], now)
        uptime = format_clock((job.get("ended") or now) - job["started"])
    mem = format_mem(job.get("mem")) + ("+" if job.get("spread") else "")
    command = f"[{job['name']}]{job['command']}" if job.get("name") else job["command"]
    cols = [one_line(job["user"]), str(job["id"]), one_line(command), start, uptime,
            format_duration(job["max_time"]), mem, "yes" if job.get("exclusive") else "no",
            cpu_column(job), one_line(str(job.get("gpu_label") or "-"))]
    line = " ".join(cols)
    if finished:
        # Accounting goes before <state> <exit>, so those stay the last words (notes aside).
        line += _usage(job) + f" {job['state']} {job.get('exit') or '-'}" + _note(job)
    return line


# A job as the table form of ``dispatch list`` reads it (client/listtable.py): its summary's
# fields, with the cpus and the note already in their words. The daemon sends each job as a
# list of these values (a fraction of a summary's bytes), or the client makes one from a summary.
TABLE_FIELDS = ("id", "user", "name", "command", "state", "started", "ended", "max_time", "mem", "spread",
                "exclusive", "cpus", "gpu_label", "exit", "note", "cpu_time", "peak_mem", "verdict", "array")


def table_row(job: "dict[str, Any]") -> "list[Any]":
    """A job's summary as TABLE_FIELDS' values; like the plain row, accounting only for a job
    that finished."""
    stats = (job.get("stats") or {}) if job["state"] == "finished" else {}
    return [job["id"], job["user"], job.get("name"), job["command"], job["state"], job.get("started"),
            job.get("ended"), job["max_time"], job.get("mem"), bool(job.get("spread")),
            bool(job.get("exclusive")), cpu_column(job), job.get("gpu_label"), job.get("exit"),
            _note(job)[2:-1] or None, stats.get("cpu_time"), stats.get("peak_mem"), stats.get("verdict"),
            array_cell(job.get("array"))]


def array_cell(array: "dict[str, Any] | None") -> "str | None":
    """An array element's cell, ``6_3`` (Slurm's ARRAY_INDEX), or None for a job submitted alone."""
    from .arrayref import element_name
    return element_name(array["first"], array["index"]) if array else None


def cpu_column(job: "dict[str, Any]") -> str:
    """``<cpus>``: held CPUs / physical cores (``4/2c``), or ``-`` for a job that holds none."""
    held, cores = job.get("held_cpus") or job.get("cpus"), job.get("cores")
    if not held:
        return "-"
    idle = len(held) - len(job.get("cpus") or held)
    used = f"{len(held) - idle}+{idle}i" if idle > 0 else str(len(held))
    return f"{used}/{len(cores) if cores else len(held)}c"


def _note(job: "dict[str, Any]") -> str:
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


def _usage(job: "dict[str, Any]") -> str:
    """`` cpu 12.3s peak 210M clean`` for a finished job that ran: what accounting measured, and
    its record's verdict (one word) when it has one."""
    stats = job.get("stats") or {}
    if job["state"] != "finished" or job.get("started") is None:
        return ""
    cpu = stats.get("cpu_time")
    peak = stats.get("peak_mem")
    if cpu is None and peak is None:
        return ""
    verdict = stats.get("verdict")
    return (f" cpu {cpu:.1f}s" if isinstance(cpu, (int, float)) else " cpu -") + \
        (f" peak {format_mem(peak)}" if isinstance(peak, int) else " peak -") + \
        (f" {verdict}" if verdict in VERDICTS else "")

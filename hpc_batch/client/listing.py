"""Formatting for ``dispatch list``, ``show`` and ``status`` (pure: the caller passes the clock).

A list row is ``core/listrows.py``'s (the daemon writes some of them too).
"""

from __future__ import annotations

import time

from ..core.cut import one_line
from ..core.durations import format_duration
from ..core.listrows import _note
from ..core.listrows import cpu_column as cpu_column  # where callers and tests have found them
from ..core.listrows import format_row as format_row
from ..core.listrows import format_start as format_start
from ..core.sizes import format_mem

TYPE_CHECKING = False
if TYPE_CHECKING:   # dispatch new formats its line with this module: keep typing off that path
    from typing import Any



def format_cores(cores: list[list[int]]) -> str:
    """Cores as ``show`` writes them: threads of one core joined by ``+``, cores by commas (``0+40,1+41``)."""
    return ",".join("+".join(map(str, core)) for core in cores)


SHOW_FIELDS = (
    ("id", "id"), ("array", "array"), ("name", "name"), ("user", "user"), ("command", "command"), ("cwd", "directory"),
    ("state", "state"), ("position", "place in queue"), ("why", "waiting because"),
    ("after", "after"), ("benchmark", "benchmark"), ("cpus", "cpus"), ("cores", "cores"),
    ("idle_cpus", "held idle"), ("l3_idle", "held for its L3"), ("numa_nodes", "numa nodes"), ("gpus", "gpus"),
    ("gpu_label", "gpu set"), ("mem", "memory budget"), ("max_time", "max time"), ("deadline", "deadline"),
    ("cgroup", "cgroup"), ("output", "output"), ("notify", "notify"), ("submitted", "submitted"),
    ("started", "started"), ("ended", "ended"), ("wall", "wall time"), ("exit", "result"), ("cpu_time", "cpu time"),
    ("peak_mem", "peak memory"), ("aslr", "aslr"), ("thp", "transparent huge pages"),
    ("shortfalls", "fell short"),
)


def format_show(job: dict[str, Any], now: float) -> list[str]:
    """``dispatch show`` for people: one ``field: value`` line each, those that apply."""
    lines = []
    for key, label in SHOW_FIELDS:
        value = job.get(key)
        if value is None or value == [] or value == "":
            continue
        if key in ("submitted", "started", "ended", "deadline"):
            text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        elif key in ("max_time", "wall"):
            text = format_duration(value) if value >= 1 else f"{value:.2f}s"
        elif key == "cpu_time":
            text = f"{value:.2f}s"
        elif key in ("mem", "peak_mem"):
            text = format_mem(value)
            if key == "mem":
                text += (" (assigned by default)" if job.get("mem_assigned") else " (requested)") + \
                    (", spread over NUMA nodes" if job.get("spread") else "")
        elif key == "after":
            text = ", ".join(map(str, value)) + (" (only if they exit 0)" if job.get("after_ok") else "")
        elif key in ("cpus", "gpus", "numa_nodes", "idle_cpus", "l3_idle"):
            text = ",".join(map(str, value))
            if key == "idle_cpus":
                text += " (in no job's cpuset, charged to this one)"
        elif key == "shortfalls":
            text = "; ".join(value) if value else "nothing recorded"
        elif key == "cores":
            threads = {len(core) for core in value}
            text = (f"{len(value)} ({format_cores(value)}; "
                    f"{'/'.join(map(str, sorted(threads)))} thread{'s' if threads != {1} else ''} each)")
        elif key == "exit":
            text = f"{job['exit']}" + _note(job) if job["state"] == "finished" else ""
        elif key == "array":
            text = array_words(value)
        elif key == "notify":
            text = ", ".join(value.get("forms") or ())
            text += f" ({value['command']})" if value.get("command") else ""
        else:
            text = str(value)
        if text:
            lines.append(f"{label}: {one_line(text)}")
    lines += [f"{label}: {one_line(text)}" for label, text in describe(job.get("quiet"))]
    return lines


def array_words(array: dict[str, Any]) -> str:
    """An element's ``show`` line: ``6_3 (index 3 of array 6_*: 5 jobs, at most 2 at once)``."""
    from ..core.arrayref import WHOLE, element_name
    size = f"{array['count']} jobs" if array.get("count") else "its size not recorded"
    cap = f", at most {array['limit']} at once" if array.get("limit") else ""
    return (f"{element_name(array['first'], array['index'])} (index {array['index']} of array "
            f"{element_name(array['first'], WHOLE)}: {size}{cap})")


def format_array(doc: dict[str, Any]) -> list[str]:
    """``dispatch show 6_*`` for people: the array as a whole, one ``field: value`` line each."""
    from ..core.arrayref import WHOLE, element_name
    held = len(doc["ids"])
    states = ", ".join(f"{n} {state}" for state, n in sorted(doc["states"].items()))
    lines = [f"array: {element_name(doc['first'], WHOLE)}",
             f"jobs: {doc['count']} ({doc['first']}-{doc['last']})" if doc["count"] > 1 else
             f"jobs: 1 ({doc['first']})",
             f"at most at once: {doc['limit'] or 'no cap'}", f"user: {doc['user']}"]
    if doc.get("name"):
        lines.append(f"name: {doc['name']}")
    lines.append(f"states: {states}" + (f" ({doc['count'] - held} more ended and left the list: "
                                        f"dispatch history --array {doc['first']})" if held < doc["count"] else ""))
    return [one_line(line) for line in lines]


def format_rows(jobs: list[dict[str, Any]], now: float, finished: bool) -> list[str]:
    """Every line of ``dispatch list``, in job id order."""
    return [format_row(j, now, finished) for j in sorted(jobs, key=lambda j: j["id"])]


def describe(rec: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A benchmark job's record as ``dispatch show`` lines: (label, text) pairs (pure)."""
    if not rec:
        return []
    if "error" in rec:
        return [("quiet cores", f"not set up: {rec['error']}")]
    from ..core.cputopo import format_cpulist  # show only: off dispatch new's path
    out = []
    irqs = rec.get("irqs") or {}
    each = irqs.get("each") or {}
    moved = irqs.get("moved") or []
    text = f"{len(moved)} moved to CPUs {irqs.get('to') or '-'}"
    if moved:
        text += f" (IRQs {format_cpulist(moved)})"
    if irqs.get("refused"):
        text += "; refused: " + ", ".join(
            f"{irq} ({each[str(irq)]['errno']}: {each[str(irq)]['error']})" if str(irq) in each else str(irq)
            for irq in irqs["refused"])
    if irqs.get("still_on_job_cpus"):
        text += "; still on the job's CPUs: " + ", ".join(
            f"{irq} (effective {each.get(str(irq), {}).get('effective') or 'unknown'})"
            for irq in irqs["still_on_job_cpus"])
    out.append(("interrupts", text))
    if rec.get("irqbalance"):
        ban = rec.get("irqbalance_ban")
        out.append(("irqbalance", rec["irqbalance"] + (f"; {ban}" if ban else "")))
    part = rec.get("partition") or {}
    if part:
        text = part.get("partition") or "-"
        if part.get("state") and part.get("state") != text:
            text += f" (read back: {part['state']})"
        if part.get("reason") and part.get("partition") != "isolated":
            text += f": {part['reason']}"
        out.append(("cpu partition", text))
    freq = rec.get("cpufreq") or {}
    if freq:
        st = freq.get("state") or {}
        govs = sorted({p.get("scaling_governor") for p in st.get("policies") or ()} - {None})
        text = f"{freq.get('policy')}: driver {st.get('driver') or 'none'}"
        if govs:
            text += f", governor {'/'.join(govs)}"
        if freq.get("changed"):
            text += f", {len(freq['changed'])} settings changed"
        out.append(("frequency", f"{text}; {freq.get('turbo')}"))
    undone = rec.get("undone")
    if undone:
        text = f"{undone['restored']} restored"
        if undone.get("handed"):
            text += f", {undone['handed']} handed to running benchmark jobs"
        if undone.get("left"):
            text += "; left alone: " + "; ".join(undone["left"])
        out.append(("undone at its end", text))
    return out


def format_status(st: dict[str, Any]) -> list[str]:
    """``dispatch status`` for people."""
    lines = [f"policy {st['policy']}; memory budgeted {st['memory']}",
             f"jobs: {st['jobs']['running']} running, {st['jobs']['queued']} queued, "
             f"{st['jobs']['waiting']} waiting on other jobs"]
    lines.append("node  cpus total/reserved/in use/free   cores total/reserved/in use/free   "
                 "memory total/reserved/in use/free   gpus total/in use/free")
    for n in st["nodes"]:
        c, m, g = n["cpus"], n["mem"], n["gpus"]
        k = n.get("cores") or c
        mem = "/".join(_mem(m[key]) for key in ("total", "reserved", "in_use", "free"))
        lines.append(f"{n['id']:>4}  {c['total']}/{c['reserved']}/{c['in_use']}/{c['free']}".ljust(36)
                     + f"  {k['total']}/{k['reserved']}/{k['in_use']}/{k['free']}".ljust(37)
                     + f"  {mem}".ljust(38) + f"  {g['total']}/{g['in_use']}/{g['free']}")
    idle = {n["id"]: n.get("held_idle") for n in st["nodes"] if n.get("held_idle")}
    if idle:
        lines.append("held idle by benchmark jobs (siblings and L3 neighbours, in no job's cpuset): "
                     + ", ".join(f"{v} CPU{'s' if v != 1 else ''} on node {k}" for k, v in idle.items()))
    if st.get("housekeeping"):
        from ..core.cputopo import format_cpulist
        lines.append(f"housekeeping CPUs (never given to benchmark jobs): {format_cpulist(st['housekeeping'])}")
    extra = st["gpus_without_node"]
    if extra["total"]:
        lines.append(f"GPUs with no NUMA node: {extra['total']} total, {extra['in_use']} in use")
    if st.get("cpu_unit") == "thread":
        lines.append("CPUs are handed out as single threads (--cpu-unit thread): jobs may share a core")
    else:
        lines.append("CPUs are handed out in whole cores: a job gets every thread of its cores")
    head = st.get("head")
    if not head:
        lines.append("head: none (the queue is empty)")
    elif head.get("user") is None:   # another user's, and the list is not public
        lines.append(f"head: job {head['id']} (another user's)")
    else:
        lines.append(f"head: job {head['id']} ({head['user']}): {head['why']}")
    return lines


def _mem(n: int) -> str:
    from ..core.sizes import format_mem
    return format_mem(n) if n else "0"

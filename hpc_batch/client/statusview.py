"""``dispatch status`` for a person at a terminal: a labelled summary, and the machine map.

Pure: the reply of a ``status`` request in, lines out; the width, whether to
colour and whether the terminal takes non-ASCII are parameters (the CLI and
``statusscreen`` decide them). The plain format of a piped ``dispatch status``
is ``listing.format_status``, kept as it was for scripts.

A line is built as segments of (text, style) and only painted once cut to
the width, so an escape sequence never counts as room and never gets cut in
half. Every string that came from a user (a user name, a reason that may
quote one) goes through ``one_line``, so it cannot move the cursor or change
the terminal's colours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..core.cputopo import format_cpulist
from ..core.cut import one_line
from ..core.sizes import format_size
from ..defaults import STATUS_INTERVAL_RANGE

Seg = tuple[str, str | None]    # (text, style name or None)
Line = list[Seg]

COLUMNS = ("NODE", "RESOURCE", "TOTAL", "RESERVED", "IN USE", "FREE")
# SGR parameters of each style; a job's colour is JOB_COLOURS[id % len], so it keeps it between redraws.
STYLES = {"head": "1", "free": "32", "reserved": "2", "busy": "31", "note": "2"}
JOB_COLOURS = ("36", "35", "34", "33", "96", "95", "94", "93")
LABEL_MAX = 16      # widest job label in a map cell ("#ID USER"), cut beyond
IDLE_MARK, HOUSEKEEPING_MARK = "~", "H"
LEGEND = f"[ ] a core: CPU number, then #JOB USER; {IDLE_MARK} held idle (benchmark); {HOUSEKEEPING_MARK} housekeeping"


def render(st: dict[str, Any], width: int, colour: bool, unicode: bool = True) -> list[str]:
    """The summary, then the machine map: lines cut to *width*, painted when *colour*."""
    return [paint(cut(line, width, unicode), colour) for line in view(st, width)]


def view(st: dict[str, Any], width: int) -> list[Line]:
    """The summary, a blank line, then the machine map (cores wrapped at *width*), unpainted."""
    return summary(st) + [[]] + machine_map(st, width)


def parse_interval(text: str) -> float:
    """``--interval``: seconds, whole or with a fraction (``2``, ``0.5``), within STATUS_INTERVAL_RANGE.

    Raises ValueError with the one line to show.
    """
    low, high = STATUS_INTERVAL_RANGE
    digits = text.strip()
    whole, dot, frac = digits.partition(".")
    if not (whole.isascii() and whole.isdigit() and (not dot or (frac.isascii() and frac.isdigit()))):
        raise ValueError(f"--interval {text!r}: expected seconds, such as 2 or 0.5")
    seconds = float(digits)
    if not low <= seconds <= high:
        raise ValueError(f"--interval {text!r}: expected {low:g} to {high:g} seconds")
    return seconds


def summary(st: dict[str, Any]) -> list[Line]:
    """The policy, the queue and its head, then a table of each node's resources with a header."""
    jobs = st["jobs"]
    unit = ("whole cores: a job gets every thread of its cores" if st.get("cpu_unit") != "thread"
            else "single threads (--cpu-unit thread): jobs may share a core")
    pairs = [("policy", st["policy"]), ("memory", f"budgeted {st['memory']}"), ("CPUs", f"handed out as {unit}")]
    if st.get("housekeeping"):
        pairs.append(("housekeeping", f"CPUs {format_cpulist(st['housekeeping'])} "
                                      f"(the daemon's; never given to benchmark jobs)"))
    pairs.append(("jobs", f"{jobs['running']} running, {jobs['queued']} queued, "
                          f"{jobs['waiting']} waiting on other jobs"))
    pairs.append(("head", _head(st.get("head"))))
    key = max(len(k) for k, _ in pairs)
    lines: list[Line] = [[(k.ljust(key + 2), "head"), (one_line(str(v)), None)] for k, v in pairs]
    lines.append([])
    return lines + _table(st)


def _head(head: dict[str, Any] | None) -> str:
    if not head:
        return "none (the queue is empty)"
    if head.get("user") is None:
        return f"job {head['id']} (another user's)"
    return f"job {head['id']} ({head['user']}): {head['why']}"


def _table(st: dict[str, Any]) -> list[Line]:
    """Each node's CPUs, cores (when a core has several threads), memory and GPUs, labelled."""
    gpus = any(n["gpus"]["total"] for n in st["nodes"]) or st["gpus_without_node"]["total"]
    rows: list[tuple[str, ...]] = []
    for n in st["nodes"]:
        node = str(n["id"])
        idle = n.get("held_idle")
        rows.append((node, "CPUs", *_counts(n["cpus"]), f"{idle} held idle by benchmark jobs" if idle else ""))
        cores = n.get("cores")
        if cores and cores["total"] != n["cpus"]["total"]:
            rows.append(("", "cores", *_counts(cores), ""))
        rows.append(("", "memory", *_counts(n["mem"], _size), ""))
        if gpus:
            rows.append(("", "GPUs", *_counts(n["gpus"]), ""))
    if st["gpus_without_node"]["total"]:
        rows.append(("-", "GPUs", *_counts(st["gpus_without_node"]), "no NUMA node"))
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]

    def cells(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    out: list[Line] = [[(cells(COLUMNS), "head")]]
    for row in rows:
        out.append([(cells(row[:len(COLUMNS)]), None)] + ([("  " + row[-1], "note")] if row[-1] else []))
    return out


def _counts(q: dict[str, int], fmt: Callable[[int], str] = str) -> tuple[str, str, str, str]:
    return (fmt(q["total"]), fmt(q["reserved"]), fmt(q["in_use"]), fmt(q["free"]))


def _size(n: int) -> str:
    return format_size(n) if n else "0"


def machine_map(st: dict[str, Any], width: int) -> list[Line]:
    """NUMA nodes, then cache groups, then cores with their threads, each CPU with its holder; then GPUs.

    Cores are laid side by side and wrap at *width*. A CPU shows the job
    holding it (``#ID USER``), ``busy`` for one the caller may not see,
    ``reserved`` or ``free``, and a mark for held idle or housekeeping.
    """
    m = st.get("map")
    if not m:
        return [[("machine map: this hpc-batchd does not send one; it is older than this dispatch", "note")]]
    owner: dict[int, tuple[dict[str, Any], bool]] = {}
    for job in m["jobs"]:
        owner.update({c: (job, False) for c in job["cpus"]})
        owner.update({c: (job, True) for c in job["idle"]})
    reserved, housekeeping = set(m["reserved"]), set(st.get("housekeeping") or ())
    cpus = [c for n in m["nodes"] for group in n["caches"] for core in group for c in core]
    number = len(str(max(cpus, default=0)))
    labels = {c: _cpu_label(c, owner.get(c), c in reserved, c in housekeeping) for c in cpus}
    room = min(LABEL_MAX, max((len(text) for _, text, _ in labels.values()), default=4))
    level = m.get("cache_level")
    lines: list[Line] = [[("MACHINE", "head"), ("  " + LEGEND, "note")]]
    for node in m["nodes"]:
        node_cpus = [c for group in node["caches"] for core in group for c in core]
        lines.append([(f"NUMA node {node['id']}", "head"), (f"  CPUs {format_cpulist(node_cpus)}", None)])
        for group in node["caches"]:
            if level is not None:
                lines.append([(f"  L{level} cache: CPUs {format_cpulist(c for core in group for c in core)}",
                               None)])
            cores = [_core_cell(core, labels, number, room) for core in group]
            lines += _wrap(cores, "    ", width)
    if m["gpus"]:
        lines.append([("GPUs", "head")])
        gpu_owner = {g: job for job in m["jobs"] for g in job["gpus"]}
        cells = []
        for g in m["gpus"]:
            node = "no node" if g["node"] is None else f"node {g['node']}"
            text, style = _job_label(gpu_owner[g["index"]]) if g["index"] in gpu_owner else ("free", "free")
            cells.append([(f"[GPU {g['index']} ({node}) ", None), (_fit(text, room), style), ("]", None)])
        lines += _wrap(cells, "    ", width)
    return lines


def _cpu_label(cpu: int, held: tuple[dict[str, Any], bool] | None, reserved: bool,
               housekeeping: bool) -> tuple[str, str, str]:
    """(mark, label, style) of one CPU."""
    mark = IDLE_MARK if held is not None and held[1] else HOUSEKEEPING_MARK if housekeeping else " "
    if held is not None:
        text, style = _job_label(held[0])
        return mark, text, style + (";2" if held[1] else "")
    return (mark, "reserved", "reserved") if reserved else (mark, "free", "free")


def _job_label(job: dict[str, Any]) -> tuple[str, str]:
    """``#ID USER`` (the user escaped) and the job's colour, or ``busy`` for jobs the caller may not see."""
    if job.get("id") is None:
        return "busy", "busy"
    user = one_line(str(job["user"])) if job.get("user") is not None else "?"
    return f"#{job['id']} {user}", JOB_COLOURS[int(job["id"]) % len(JOB_COLOURS)]


def _core_cell(core: Iterable[int], labels: dict[int, tuple[str, str, str]], number: int, room: int) -> Line:
    cell: Line = [("[", None)]
    for i, cpu in enumerate(core):
        mark, text, style = labels[cpu]
        if i:
            cell.append((" | ", None))
        cell.append((f"{cpu:>{number}}{mark} {_fit(text, room)}", style))
    cell.append(("]", None))
    return cell


def _fit(text: str, room: int) -> str:
    """*text* padded or cut to *room* characters; a cut one ends in ``+`` (a job label, never a mark)."""
    return text.ljust(room) if len(text) <= room else text[:room - 1] + "+"


def _wrap(cells: list[Line], indent: str, width: int) -> list[Line]:
    """Cells side by side after *indent*, one space apart, a new line before one that would pass *width*."""
    lines: list[Line] = []
    line: Line = [(indent, None)]
    used = len(indent)
    for cell in cells:
        size = sum(len(t) for t, _ in cell)
        if used > len(indent) and used + 1 + size > width:
            lines.append(line)
            line, used = [(indent, None)], len(indent)
        if used > len(indent):
            line.append((" ", None))
            used += 1
        line += cell
        used += size
    if used > len(indent):
        lines.append(line)
    return lines


def cut(line: Line, width: int, unicode: bool = True) -> Line:
    """*line* cut to *width* characters; a cut line ends in an ellipsis (``>`` without unicode)."""
    if sum(len(t) for t, _ in line) <= width:
        return line
    out: Line = []
    left = max(width - 1, 0)
    for text, style in line:
        if left <= 0:
            break
        out.append((text[:left], style))
        left -= len(text[:left])
    return out + ([("\u2026" if unicode else ">", None)] if width > 0 else [])


def paint(line: Line, colour: bool) -> str:
    """The text of *line*, each styled segment in its SGR colour when *colour*; trailing blanks dropped."""
    if not colour:
        return "".join(t for t, _ in line).rstrip()
    parts = []
    for text, style in line:
        code = STYLES.get(style, style) if style else None
        parts.append(f"\x1b[{code}m{text}\x1b[0m" if code and text.strip() else text)
    return "".join(parts).rstrip()


def frame(lines: list[Line], rows: int) -> list[Line]:
    """As many of *lines* as fit a screen of *rows*; a map taller than that ends in a line saying how much
    is hidden (one redraw of ``--watch``: the caller puts its title above, so one row is kept for it)."""
    room = max(rows - 1, 1)
    if len(lines) <= room:
        return lines
    hidden = len(lines) - (room - 1)
    return lines[:room - 1] + [[(f"... {hidden} more lines: enlarge the terminal, or run "
                                 f"dispatch status --map | less", "note")]]

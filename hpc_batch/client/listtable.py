"""``dispatch list`` as a table: a header, aligned columns, cut to a width (pure).

The plain form (``core/listrows.py``) is for pipes and stays as the spec has it;
this is the form for a terminal, and for ``--format``/``--no-header`` anywhere.
COLUMNS is the one definition of a column: the name ``--format`` takes, its
header, its alignment, whether it may be cut to fit, and how a job (the
fields ``core/listrows.TABLE_FIELDS`` names) becomes its cell. Every cell
goes through ``one_line``, so a command or name cannot put a control
sequence on whoever lists it, and widths are counted in terminal cells (a
CJK character is two).
"""

from __future__ import annotations

from ..bounds import SHOWN_CHARS
from ..core.cut import MARK, one_line
from ..core.durations import format_duration
from ..core.listrows import TABLE_FIELDS, format_start, table_row
from ..core.sizes import format_mem

TYPE_CHECKING = False
if TYPE_CHECKING:   # dispatch list imports this: keep typing off its path
    from collections.abc import Callable
    from typing import Any

GAP = " "           # between two columns, as squeue and ps have it
MIN_CUT = 8         # a cut column keeps at least this many cells (or its header's width)


def format_elapsed(seconds: float) -> str:
    """Elapsed time as Slurm's ``squeue`` shows it: ``M:SS``, ``H:MM:SS``, then ``D-HH:MM:SS``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def _uptime(job: dict[str, Any], now: float) -> str:
    if job["started"] is None:
        return "-"
    return format_elapsed((job["ended"] or now) - job["started"])


def _start(job: dict[str, Any], now: float) -> str:
    return "-" if job["started"] is None else format_start(job["started"], now)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cpu_time(job: dict[str, Any], now: float) -> str:
    return f"{job['cpu_time']:.1f}s" if _number(job["cpu_time"]) else "-"


def _peak(job: dict[str, Any], now: float) -> str:
    return format_mem(job["peak_mem"]) if _number(job["peak_mem"]) else "-"


def _memo(fn: Callable[[Any], str]) -> Callable[[Any], str]:
    """*fn* remembering its answers: a long queue's jobs share a few max-times and budgets."""
    seen: dict[Any, str] = {}

    def cached(value: Any) -> str:
        text = seen.get(value)
        if text is None:
            text = seen[value] = fn(value)
        return text
    return cached


_duration, _mem = _memo(format_duration), _memo(format_mem)


def job_of(row: list) -> dict[str, Any]:
    """A job of the table: a ``list`` reply's row (``TABLE_FIELDS``' values) by field name."""
    return dict(zip(TABLE_FIELDS, row))


def job_of_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A job of the table from its summary (``list --json``'s, or an older daemon's reply)."""
    return job_of(table_row(summary))


class Column:
    """One column: the *name* --format takes, its *header*, numbers *right*-aligned, a *cut* column
    shrinks to fit the width, and *cell* turns (job, now) into its text (``job_of``'s job)."""

    __slots__ = ("name", "header", "right", "cut", "cell")

    def __init__(self, name: str, header: str, cell: Callable[[dict[str, Any], float], str],
                 right: bool = False, cut: bool = False):
        self.name, self.header, self.cell, self.right, self.cut = name, header, cell, right, cut


# In the plain format's order, with the name (its own column here) after the id.
COLUMNS = {c.name: c for c in (
    Column("user", "USER", lambda j, now: j["user"], cut=True),
    Column("id", "ID", lambda j, now: str(j["id"]), right=True),
    # (.get: a daemon before arrays could be named sends no such value)
    Column("array", "ARRAY", lambda j, now: j.get("array") or "-"),
    Column("name", "NAME", lambda j, now: j["name"] or "-", cut=True),
    Column("command", "COMMAND", lambda j, now: j["command"], cut=True),
    Column("start", "START", _start),
    Column("uptime", "TIME", _uptime, right=True),
    Column("max-time", "MAX-TIME", lambda j, now: _duration(j["max_time"]), right=True),
    Column("mem", "MEM", lambda j, now: _mem(j["mem"]) + ("+" if j["spread"] else ""), right=True),
    Column("exclusive", "EXCL", lambda j, now: "yes" if j["exclusive"] else "no"),
    Column("cpus", "CPUS", lambda j, now: j["cpus"], right=True),
    Column("gpus", "GPUS", lambda j, now: str(j["gpu_label"] or "-"), right=True),
    Column("cpu", "CPU", _cpu_time, right=True),
    Column("peak", "PEAK", _peak, right=True),
    Column("verdict", "VERDICT", lambda j, now: str(j["verdict"] or "-")),
    Column("state", "STATE", lambda j, now: j["state"]),
    Column("exit", "EXIT", lambda j, now: str(j["exit"] or "-"), right=True),
    Column("note", "NOTE", lambda j, now: j["note"] or "-", cut=True),
)}

# What a terminal shows without --format: squeue's order (id, state, who, then times), the command
# last so that it takes the width left; user only with --all, the end of a job only with --finished.
DEFAULT = ("id", "state", "name", "start", "uptime", "max-time", "mem", "cpus", "gpus", "command")


def default_columns(all_users: bool, finished: bool, arrays: bool = False) -> list[str]:
    """The columns of a terminal's ``dispatch list`` for ``--all`` and ``--finished``, and with
    ARRAY after the id when *arrays* (some job listed is an array's element)."""
    cols = list(DEFAULT)
    if arrays:
        cols.insert(cols.index("id") + 1, "array")
    if all_users:
        cols.insert(cols.index("name"), "user")
    if finished:
        cols.insert(cols.index("command"), "exit")
        cols.append("note")
    return cols


class FormatError(ValueError):
    """A --format naming no column, or one that does not exist."""


def _cut(text: str) -> str:
    """*text* escaped and cut for an error message (a megabyte of junk is not echoed back)."""
    return one_line(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def parse_format(text: str) -> list[str]:
    """``--format``'s comma-separated column names (any case), in the order given."""
    words = [word.strip() for word in text.split(",")]
    for word in words:
        if word.lower() not in COLUMNS:
            what = "an empty column name" if not word else f"unknown column '{_cut(word)}'"
            raise FormatError(f"--format '{_cut(text)}': {what}; give comma-separated names of: "
                              + ",".join(COLUMNS))
    return [word.lower() for word in words]


def cell_width(text: str) -> int:
    """How many terminal cells *text* takes: two for a wide (East Asian) character, none for a
    combining one. *text* is already escaped (no control characters)."""
    if text.isascii():
        return len(text)
    from unicodedata import combining, east_asian_width
    return sum(0 if combining(c) else 2 if east_asian_width(c) in "WF" else 1 for c in text)


def cut_to(text: str, width: int) -> str:
    """*text* in at most *width* cells, ending in MARK when it had to be cut."""
    if cell_width(text) <= width:
        return text
    if width <= len(MARK):
        return MARK[:max(width, 0)]
    room = width - len(MARK)
    if text.isascii():
        return text[:room] + MARK
    from unicodedata import combining, east_asian_width
    used = 0
    for i, c in enumerate(text):
        w = 0 if combining(c) else 2 if east_asian_width(c) in "WF" else 1
        if used + w > room:
            return text[:i] + MARK
        used += w
    return text + MARK


def _fit(natural: list[int], floors: list[int], cut: list[bool], room: int) -> list[int]:
    """The columns' widths in *room* cells: when they do not fit, the cut columns share what the
    others leave, the narrow ones whole and the wide ones down to one level, none under its floor."""
    if sum(natural) <= room or not any(cut):
        return natural
    widths = list(natural)
    left = room - sum(w for w, c in zip(natural, cut) if not c)
    # Narrowest first: each takes its width or an even share of what is left, whichever is less.
    shrinkable = sorted((i for i in range(len(widths)) if cut[i]), key=lambda i: natural[i])
    for n, i in enumerate(shrinkable):
        widths[i] = max(floors[i], min(natural[i], left // (len(shrinkable) - n)))
        left -= widths[i]
    return widths


def render(jobs: list[dict[str, Any]], columns: list[str], now: float, width: int | None = None,
           header: bool = True) -> list[str]:
    """The lines of the table: a header (unless not *header*), then one row a job (``job_of``'s),
    in the order given. *width* (terminal cells) cuts the cut columns so that no line is wider,
    and cuts a line wider still; None leaves every cell whole."""
    cols = [COLUMNS[name] for name in columns]
    cells = []
    for c in cols:
        col = [c.cell(j, now) for j in jobs]
        if not all(map(str.isprintable, col)):
            col = [t if t.isprintable() else one_line(t) for t in col]
        cells.append(([c.header] if header else []) + col)
    # Widths are counted per column: a column of ASCII text (nearly always) costs len() a cell.
    narrow = [all(map(str.isascii, col)) for col in cells]
    natural = [max(map(len if ascii_only else cell_width, col), default=0)
               for col, ascii_only in zip(cells, narrow)]
    widths = natural
    if width is not None:
        room = width - len(GAP) * (len(cols) - 1)
        floors = [min(max(MIN_CUT, len(c.header)), n) for c, n in zip(cols, natural)]
        widths = _fit(natural, floors, [c.cut for c in cols], room)
    last = len(cols) - 1
    padded = [_pad(col, w, w < n, c.right, k == last, ascii_only)
              for k, (c, col, w, n, ascii_only) in enumerate(zip(cols, cells, widths, natural, narrow))]
    lines = [GAP.join(row) for row in zip(*padded)]
    if width is not None and sum(widths) + len(GAP) * last > width:
        lines = [cut_to(line, width) for line in lines]
    return lines


def _pad(col: list[str], w: int, cut: bool, right: bool, last: bool, ascii_only: bool) -> list[str]:
    """A column's cells cut to *w* cells (when *cut*) and padded to them; the last column is not
    padded on the right, so that no line ends in blanks."""
    if cut:
        col = [cut_to(t, w) for t in col]
    if ascii_only:   # a cell a character: str's own padding
        return [t.rjust(w) for t in col] if right else col if last else [t.ljust(w) for t in col]
    if right:
        return [" " * (w - cell_width(t)) + t for t in col]
    return col if last else [t + " " * (w - cell_width(t)) for t in col]

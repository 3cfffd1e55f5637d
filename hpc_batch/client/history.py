"""``dispatch history`` and ``dispatch report``: the client's side of the history archive.

Both ask the daemon for pages of finished jobs (``protocol.History``), newest
first, until they have the number asked for, and print them oldest first.
``history`` lists them; ``report`` hands them to ``report.py`` (pure), which
sets a series of runs side by side.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ..bounds import shown
from ..core.cut import one_line
from ..core.durations import DurationError, format_duration, parse_duration


class BadValue(ValueError):
    """A flag value the daemon would refuse: said by the client, as a usage error."""


def parse_time(text: str, now: float) -> float:
    """``--since``/``--until``: a date (2026-12-01), a date and time (2026-12-01T09:30, local time),
    or a duration ago (7d, 12h, 1h30m); seconds since 1970."""
    import datetime
    try:
        return now - parse_duration(text)
    except DurationError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadValue(f"{shown(text)} is not a time: give a date (2026-12-01), a date and time "
                       f"(2026-12-01T09:30) or a duration ago (7d, 12h)") from None
    return when.timestamp()


def request_fields(a: dict[str, Any], now: float) -> dict[str, Any]:
    """The ``history`` request's fields from a parsed command line (docopt's dict)."""
    from ..core.arrays import is_range, parse_range
    from ..core.jobnames import NAME_RULE, split_ref, valid_name
    from ..wire import protocol
    fields: dict[str, Any] = {}
    ranges = []
    for word in a.get("<job>") or ():
        if is_range(word):
            try:
                ids = parse_range(word, 1 << 30)
            except ValueError as exc:
                raise BadValue(str(exc)) from None
            ranges.append([ids[0], ids[-1]])
        elif _whole(word, 1, 1 << 53):
            ranges.append([int(word), int(word)])
        else:
            raise BadValue(f"{shown(word)}: name jobs here by id or FIRST-LAST range (a name goes to --name)")
    if len(ranges) > protocol.HISTORY_ID_RANGES:
        raise BadValue(f"name at most {protocol.HISTORY_ID_RANGES} ids or ranges (use --array or --name for "
                       f"a whole series)")
    if ranges:
        fields["ids"] = ranges
    if a.get("--name") is not None:
        if not valid_name(a["--name"]):
            raise BadValue(f"--name {shown(a['--name'])}: {NAME_RULE}")
        fields["name"] = a["--name"]
    if a.get("--array") is not None:
        text = a["--array"]
        if not _whole(text, 1, 1 << 53):
            raise BadValue(f"--array {shown(text)}: give the first job id of the bulk submit, as list shows it")
        fields["array"] = int(text)
    for flag, key, choices in (("--state", "result", protocol.HISTORY_RESULTS),
                               ("--verdict", "verdict", protocol.HISTORY_VERDICTS)):
        if a.get(flag) is not None:
            if a[flag] not in choices:
                raise BadValue(f"{flag} {shown(a[flag])}: expected one of {', '.join(choices)}")
            fields[key] = a[flag]
    for flag in ("--since", "--until"):
        if a.get(flag) is not None:
            try:
                fields[flag[2:]] = parse_time(a[flag], now)
            except BadValue as exc:
                raise BadValue(f"{flag} {exc}") from None
    if a.get("--setup") is not None:
        digest = protocol.setup_digest(a["--setup"])
        if digest is None:
            raise BadValue(f"--setup {shown(a['--setup'])}: give a setup digest (sha256:...) or at least its "
                           f"first 8 hex digits, as report and show --record print it")
        fields["setup"] = digest
    if a.get("--user") is not None:
        if split_ref(f"{a['--user']}:x") is None:
            raise BadValue(f"--user {shown(a['--user'])}: not a login name")
        fields["user"] = a["--user"]
    if a.get("--all"):
        fields["all"] = True
    return fields


def limit_of(a: dict[str, Any]) -> int:
    text = "100" if a.get("--limit") is None else a["--limit"]
    if not _whole(text, 1, 1_000_000):
        raise BadValue(f"--limit {shown(text)}: expected a whole number from 1 to 1000000")
    return int(text)


def _whole(text: str, low: int, high: int) -> bool:
    """Whether *text* is a whole number from *low* to *high* (ASCII digits; thousands of them are not)."""
    return text.isascii() and text.isdigit() and len(text) <= len(str(high)) and low <= int(text) <= high


def fetch(conn, fields: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
    """Up to *limit* rows, newest first, paged; (rows, None-or-the refusal reply)."""
    from ..wire.protocol import HISTORY_PAGE_ROWS
    rows: list[dict[str, Any]] = []
    c = conn()
    before = None
    while len(rows) < limit:
        ask = dict(fields, limit=min(HISTORY_PAGE_ROWS, limit - len(rows)))
        if before is not None:
            ask["before"] = before
        reply = c.call("history", **ask)
        if not reply.get("ok"):
            c.close()
            return None, reply
        rows += reply["result"]["jobs"]
        before = reply["result"].get("more")
        if before is None:
            break
    c.close()
    return rows, {}


def cmd_history(conn, a: dict[str, Any], out) -> int:
    """``dispatch history``."""
    now = time.time()
    try:
        fields, limit = request_fields(a, now), limit_of(a)
    except BadValue as exc:
        return out.fail(str(exc), 2, "usage")
    rows, refusal = fetch(conn, fields, limit)
    if rows is None:
        return out.refused(refusal, "history failed")
    rows.reverse()
    if out.json:
        out.doc({"jobs": rows})
        return 0
    width = _width()
    for line in format_history(rows, width):
        print(line)
    if not rows:
        print("no finished jobs match" + ("" if fields else " (none in your history yet)"), file=sys.stderr)
    return 0


COLUMNS = ("ID", "NAME", "ARRAY", "ENDED", "WALL", "CPU", "EXIT", "VERDICT", "COMMAND")


def format_history(rows: list[dict[str, Any]], width: int | None) -> list[str]:
    """The history as a table with a header, aligned; the command cut to *width* (None: whole)."""
    if not rows:
        return []
    table = [COLUMNS] + [_cells(r) for r in rows]
    sizes = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    lines = []
    for row in table:
        line = "  ".join(cell.ljust(size) for cell, size in zip(row, sizes)) + "  " + row[-1]
        lines.append(_cut(line, width))
    return lines


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    from ..core.listrows import array_cell
    array = r.get("array")
    ended = r.get("ended")
    return (str(r["id"]), one_line(r.get("name") or "-"),
            (isinstance(array, dict) and array.get("first") is not None and array_cell(array)) or "-",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(ended)) if ended else "-",
            _seconds(r.get("wall_s")), _seconds(r.get("cpu_s")), one_line(str(r.get("exit") or "-")),
            r.get("verdict") or "-", one_line(r.get("command") or ""))


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}s" if value < 60 else format_duration(value)


def _cut(line: str, width: int | None) -> str:
    if width is None or len(line) <= width:
        return line
    return line[:max(width - 3, 0)] + "..."


def _width() -> int | None:
    """The terminal's width when stdout is one; None (nothing cut) when it is piped."""
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except OSError:
        return None


def cmd_report(conn, a: dict[str, Any], out) -> int:
    """``dispatch report``."""
    from . import report
    now = time.time()
    try:
        fields = request_fields(a, now)
        limit = limit_of({"--limit": "1000" if a.get("--limit") is None else a["--limit"]})
        fmt = report.plot_format(a["--plot"]) if a.get("--plot") is not None else None
        if a.get("--metric") is not None:
            from shepherd.record.figures import name_problem
            if name_problem(a["--metric"]):
                raise BadValue(f"--metric {shown(a['--metric'])}: {name_problem(a['--metric'])}, as the job "
                               f"wrote it to $HPC_BATCH_METRICS_FILE")
    except (BadValue, ValueError) as exc:
        return out.fail(str(exc), 2, "usage")
    if not any(k in fields for k in ("ids", "name", "array", "setup")):
        return out.fail("name the runs: job ids or FIRST-LAST ranges, --name, --array or --setup", 2, "usage")
    rows, refusal = fetch(conn, fields, limit)
    if rows is None:
        return out.refused(refusal, "report failed")
    rows.reverse()
    if not rows:
        return out.fail("no finished jobs of yours match (dispatch history lists them)", 3, "not_found")
    metric = a.get("--metric")
    said = selection(a)
    if a.get("--plot"):
        status = _write_plot(a["--plot"], report.svg(rows, said, metric=metric), fmt, out)
        if status:
            return status
    if out.json:
        out.doc(report.report_json(rows, said, metric=metric))
        return 0
    width = _width() or 100
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print(report.format_report(rows, said, metric=metric, width=width, colour=colour, local=_local))
    if not a.get("--no-plot"):
        print()
        print(report.terminal_plot(rows, metric=metric, width=width, colour=colour))
    return 0


def _local(epoch: float):
    """The local time of *epoch*, for the report's start column."""
    import datetime
    return datetime.datetime.fromtimestamp(epoch).astimezone()


def selection(a: dict[str, Any]) -> str:
    """What the command line selected, in words: ``name bench, array 6, since 7d``."""
    parts = [f"{flag[2:]} {a[flag]}" for flag in ("--name", "--array", "--setup", "--since", "--until", "--user")
             if a.get(flag) is not None]
    if a.get("<job>"):
        parts.insert(0, "jobs " + ",".join(a["<job>"]))
    if a.get("--metric"):
        parts.append(f"metric {a['--metric']}")
    return ", ".join(parts)


def _write_plot(path: str, text: str, fmt: str | None, out) -> int:
    """Write the SVG as the user (this process is the user's): a new file, or one of theirs replaced."""
    target = os.path.abspath(os.path.expanduser(path))
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return out.fail(f"--plot {path}: cannot write it ({exc.strerror})", 1, "refused")
    if not out.json:
        print(f"plot written to {target}", file=sys.stderr)
    return 0

"""``dispatch report``: which runs of a series can be believed, and how spread out those are (pure).

The command fetches the rows of the selected finished jobs from the daemon
(``history``) and hands them here; this module returns strings and plain
data only. It reads no clock, no terminal and no file: the width, the
colour, and how an epoch time becomes a local one are parameters.

- :func:`format_report`: one line a run, then the summary of all runs and
  of the clean ones, the outliers, whether the runs are comparable, and
  why runs were noisy;
- :func:`terminal_plot`: the series in the terminal, one mark a run;
- :func:`svg`: the same picture as a standalone SVG document;
- :func:`report_json`: all of it for ``--json`` (docs/json.md);
- :func:`plot_format`: what ``--plot FILE`` writes, or why not.

Reading the rows is ``reportruns.py``'s, drawing ``reportplot.py``'s, the
statistics ``hpc_batch/core/series.py``'s.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ..core import series as stats
from ..core.cputopo import format_cpulist
from ..core.cut import one_line
from . import reportplot, reportruns
from .reportruns import Run, Series, cause_words, decimals, number

WIDTH = 100         # the default width; the CLI passes the terminal's
MIN_WIDTH = 40      # narrower than this, lines are cut at 40 anyway: a table needs some room
NAME_CUT = 24       # characters of a job name in the table's name column
DIGEST_SHOWN = 19   # characters of a setup digest shown: "sha256:" and 12 hex digits
NA = "n/a"
VERDICT_COLOURS = {"clean": reportplot.ANSI["o"], "noisy": reportplot.ANSI["x"], "unknown": reportplot.ANSI["?"]}
WRAP_LINES = 6      # lines a list (of ids, of causes) takes at most; then it is cut


def utc(epoch: float) -> datetime:
    """*epoch* as a UTC time: the default conversion (the CLI passes the local one)."""
    return datetime.fromtimestamp(epoch, timezone.utc)


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."


def _wrap(text: str, width: int, indent: str = "    ") -> list[str]:
    """*text* over lines of *width*, the later ones indented; past WRAP_LINES the rest is cut."""
    lines = textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]
    if len(lines) > WRAP_LINES:
        lines = lines[:WRAP_LINES - 1] + [_fit(indent + " ".join(x.strip() for x in lines[WRAP_LINES - 1:]), width)]
    return lines


def _ids(ids: list[int]) -> str:
    return format_cpulist(ids, ", ") if ids else "none"


def _num(value: float | None, places: int) -> str:
    return NA if value is None else number(value, places)


def _percent(value: float | None) -> str:
    if value is None:
        return NA
    text = f"{100 * value:.1f} %"
    return text if len(text) <= 10 else f"{100 * value:.3g} %"


def figure_name(s: Series) -> str:
    """What the summary is of: ``wall time (s)`` or ``metric NAME (UNIT)``, escaped."""
    if s.metric is None:
        return "wall time (s)"
    unit = f" ({one_line(s.unit)})" if s.unit else ""
    return f"metric {one_line(s.metric)}{unit}"


def verdict_words(run: Run) -> str:
    """The verdict and its first cause in a few words (``noisy: device IRQs (+1)``), and a failed exit."""
    if run.verdict is None:
        said = "no verdict"
    elif run.cause is not None:
        more = f" (+{len(run.causes) - 1})" if len(run.causes) > 1 else ""
        said = f"{run.verdict}: {cause_words(run.cause)}{more}"
    else:
        said = run.verdict
    if not run.ok:
        said += f", exit {one_line(run.exit)}" if run.exit.isdigit() else f", {one_line(run.exit)}"
    return said


def _mark(run: Run) -> str:
    return ("*" if run.setup_differs else "") + ("!" if run.outlier else "")


def _table(head: list[str], body: list[list[str]], right: set[int], width: int,
           paint: Callable[[str], str] | None = None) -> list[str]:
    """Columns aligned under *head* (those in *right* to the right), two spaces apart, the last one free.

    *paint* colours the last column of the body once each line is cut to *width* (escapes take no room).
    """
    sizes = [max(len(row[i]) for row in [head, *body]) for i in range(len(head) - 1)]
    start = sum(sizes) + 2 * len(sizes)
    lines = []
    for n, row in enumerate([head, *body]):
        cells = [row[i].rjust(sizes[i]) if i in right else row[i].ljust(sizes[i]) for i in range(len(sizes))]
        line = _fit("  ".join([*cells, row[-1]]).rstrip(), width)
        lines.append(line[:start] + paint(line[start:]) if paint is not None and n > 0 else line)
    return lines


def _paint_verdict(said: str) -> str:
    """The verdict word at the start of *said* in its colour (ANSI): green, red, yellow."""
    for word, code in VERDICT_COLOURS.items():
        if said.startswith(word):
            return f"{code}{word}{reportplot.RESET}{said[len(word):]}"
    return said


def _when(local: Callable[[float], datetime], epoch: float | None) -> datetime | None:
    """*epoch* as *local* gives it; None for none, or one no calendar holds (a row's nonsense)."""
    try:
        return None if epoch is None else local(epoch)
    except (OverflowError, OSError, ValueError):
        return None


def _run_lines(s: Series, local: Callable[[float], datetime], width: int, colour: bool) -> list[str]:
    figures = [r.figure for r in s.runs if r.figure is not None]
    places = decimals(figures)
    wall_places = places if s.metric is None else decimals([r.wall_s for r in s.runs if r.wall_s is not None])
    cpu_places = decimals([r.cpu_s for r in s.runs if r.cpu_s is not None])
    starts = [_when(local, r.started) for r in s.runs]
    zones = {t.tzname() for t in starts if t is not None}
    zone = zones.pop() if len(zones) == 1 else None      # one zone: said once, in the header
    names = {r.name for r in s.runs}
    by_name = len(names) > 1
    head = ["id", f"started ({one_line(zone)})" if zone else "started"]
    head += ["name"] if by_name else []
    head += ["wall s", "cpu s"]
    head += [_fit(one_line(s.metric), 16)] if s.metric is not None else []
    head += ["", "verdict"]
    right = {0, 2 + by_name, 3 + by_name} | ({4 + by_name} if s.metric is not None else set())
    body = []
    for run, start in zip(s.runs, starts):
        named = "" if zone or start is None or start.tzname() is None else f" {one_line(str(start.tzname()))}"
        when = "-" if start is None else start.strftime("%Y-%m-%d %H:%M:%S") + named
        row = [str(run.id), when]
        row += [_fit(one_line(run.name) if run.name is not None else "-", NAME_CUT)] if by_name else []
        row += [_num(run.wall_s, wall_places) if run.wall_s is not None else "-",
                _num(run.cpu_s, cpu_places) if run.cpu_s is not None else "-"]
        row += [_num(run.figure, places) if run.figure is not None else "-"] if s.metric is not None else []
        row += [_mark(run), verdict_words(run)]
        body.append(row)
    return _table(head, body, right, width, _paint_verdict if colour else None)


def _summary_lines(s: Series, width: int) -> list[str]:
    places = decimals([r.figure for r in s.runs if r.figure is not None])
    head = [_fit(figure_name(s), 32), "n", "median", "IQR", "min", "max", "CV"]
    body = []
    for label, st in (("all", s.stats_all), ("clean", s.stats_clean)):
        body.append([f"  {label}", str(st.n), _num(st.median, places), _num(st.iqr, places),
                     _num(st.min, places), _num(st.max, places), _percent(st.cv)])
    lines = _table(head, body, {1, 2, 3, 4, 5, 6}, width)
    lines += _wrap(f"  clean: verdict clean and exit 0; quartiles: {stats.QUANTILE_METHOD}; "
                   f"CV: sample standard deviation / |mean|", width)
    return lines


def _outlier_lines(s: Series, width: int) -> list[str]:
    places = decimals([r.figure for r in s.runs if r.figure is not None])
    said = ", ".join(f"{r.id} ({_num(r.figure, places)})" for r in s.runs if r.outlier) or "none"
    if s.stats_all.n < 3:
        said = f"{NA} (fewer than 3 runs with the figure)"
    return _wrap(f"outliers (median ± {stats.OUTLIER_K:g} × scaled MAD, of all runs): {said}", width)


def _setup_lines(s: Series, width: int) -> list[str]:
    if not s.runs:
        return [f"setup: {NA} (no runs)"]
    if not s.digests:
        return ["setup: not known (no run has a setup digest)"]
    if s.same_setup:
        return [_fit(f"setup: all {len(s.runs)} runs the same ({one_line(next(iter(s.digests)))[:DIGEST_SHOWN]})",
                     width)]
    if len(s.digests) == 1:
        lines = _wrap("setup: the runs with a digest share it; some have none", width)
    else:
        lines = _wrap(f"setup: NOT comparable: {len(s.digests)} different setups (* marks a run unlike run "
                      f"{s.reference})", width)
    for digest, ids in s.digests.items():
        first = " (the first run's)" if s.reference in ids else ""
        lines += _wrap(f"  {one_line(digest)[:DIGEST_SHOWN]}  {_count(len(ids))}: {_ids(ids)}{first}", width,
                       " " * (DIGEST_SHOWN + 4))
    if s.without_digest:
        lines += _wrap(f"  {'no digest':{DIGEST_SHOWN}}  {_count(len(s.without_digest))}: "
                       f"{_ids(s.without_digest)}", width, " " * (DIGEST_SHOWN + 4))
    return lines


def _count(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _causes(tally: dict[str, int]) -> str:
    merged: dict[str, int] = {}
    for cause, n in tally.items():      # two names with the same words (old and new thresholds) add up
        merged[cause_words(cause)] = merged.get(cause_words(cause), 0) + n
    return ", ".join(f"{words} {n}" for words, n in merged.items())


def _verdict_lines(s: Series, width: int) -> list[str]:
    total = len(s.runs)
    # A run may give several causes: each counts once per run that gave it.
    lines = _wrap(f"noisy: {len(s.noisy)} of {_count(total)}"
                  + (f"; runs per cause: {_causes(s.noisy_causes)}" if s.noisy else ""), width)
    if s.unknown:
        lines += _wrap(f"unknown: {len(s.unknown)} of {_count(total)}; runs per cause: {_causes(s.unknown_causes)}",
                       width)
    if s.no_verdict:
        lines += _wrap(f"no verdict (no record): {len(s.no_verdict)} of {_count(total)}: {_ids(s.no_verdict)}",
                       width)
    return lines


def format_report(rows: list[dict[str, Any]], selection: str | None = None, *, metric: str | None = None,
                  width: int = WIDTH, colour: bool = False, local: Callable[[float], datetime] = utc) -> str:
    """The report for people: the runs in id order, then the summary, the outliers, the setups, the verdicts.

    *selection* says which jobs were asked for (``name bench, last 7 days``);
    *metric* names the job's own figure to summarise (default: the wall
    time); *local* turns an epoch time into the time to show (default UTC;
    the CLI passes ``lambda t: datetime.fromtimestamp(t).astimezone()``).
    Every line fits *width* (at least MIN_WIDTH); every string from the rows
    is escaped onto one line. With *colour* (and only then) the verdicts
    are green, red and yellow (ANSI).
    """
    width = max(width, MIN_WIDTH)
    s = reportruns.read(rows, metric)
    lines = [_fit(f"report: {one_line(selection)}", width)] if selection else []
    if not s.runs:
        lines.append("no runs")
    else:
        names = {r.name for r in s.runs}
        said = f"{_count(len(s.runs))}, ids {_ids([r.id for r in s.runs])}"
        if len(names) == 1 and None not in names:
            said += f", name {one_line(str(next(iter(names))))}"
        lines.append(_fit(said, width))
    if s.metric is not None or s.lacking:
        lack = f"; {len(s.lacking)} of {len(s.runs)} lack it: {_ids(s.lacking)}" if s.lacking else ""
        how = ", the last value each run wrote" if s.metric is not None else ""
        lines += _wrap(f"figure: {_fit(figure_name(s), width)}{how}{lack}", width)
        if len(s.units) > 1:
            lines += _wrap("units differ between runs: " + ", ".join(_fit(one_line(u), 20) for u in s.units)
                           + " (the figures do not compare)", width)
    if s.runs:
        lines.append("")
        lines += _run_lines(s, local, width, colour)
        legend = [m for m, used in (("* setup unlike the first run's", any(r.setup_differs for r in s.runs)),
                                    ("! outlier", bool(s.outliers))) if used]
        if legend:
            lines.append(_fit("  " + "; ".join(legend), width))
    lines.append("")
    lines += _summary_lines(s, width)
    lines += _outlier_lines(s, width)
    lines += _setup_lines(s, width)
    lines += _verdict_lines(s, width)
    return "\n".join(lines)


def terminal_plot(rows: list[dict[str, Any]], *, metric: str | None = None, width: int = WIDTH,
                  colour: bool = False, height: int = reportplot.HEIGHT) -> str:
    """The series in the terminal: one mark a run in id order, its figure up the y axis.

    ``o`` clean, ``x`` noisy, ``?`` unknown or no verdict; with *colour*
    (and only then) also green, red and yellow (ANSI). Fits *width*.
    """
    return reportplot.terminal(reportruns.read(rows, metric), figure_name, max(width, MIN_WIDTH), colour, height)


def svg(rows: list[dict[str, Any]], selection: str | None = None, *, metric: str | None = None) -> str:
    """The same picture as a standalone SVG 1.1 document (``--plot FILE.svg``)."""
    s = reportruns.read(rows, metric)
    return reportplot.svg(s, one_line(selection or f"{_count(len(s.runs))}"), figure_name(s))


def plot_format(path: str) -> str:
    """``svg`` for a path ending in ``.svg`` (any case); ValueError saying so for anything else.

    Only SVG is written: the picture needs no plotting package (none is
    installed with the daemon), and a browser opens it.
    """
    name = path.rsplit("/", 1)[-1]
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name.lstrip(".") else ""
    if suffix == "svg":
        return "svg"
    said = f"'.{one_line(suffix)}'" if suffix else "no suffix"
    raise ValueError(f"--plot {one_line(path)}: only SVG is written, to a file ending in .svg ({said} given); "
                     f"open it in a browser")


def _run_json(run: Run, s: Series) -> dict[str, Any]:
    return {"id": run.id, "name": run.name, "started": run.started, "wall_s": run.wall_s, "cpu_s": run.cpu_s,
            "verdict": run.verdict, "cause": run.cause, "causes": list(run.causes), "exit": run.exit,
            "clean": run.clean, "setup_digest": run.setup_digest, "setup_differs": run.setup_differs,
            "outlier": run.outlier, "metric": run.figure if s.metric is not None else None}


def report_json(rows: list[dict[str, Any]], selection: str | None = None, *,
                metric: str | None = None) -> dict[str, Any]:
    """``dispatch report --json``: the runs and everything :func:`format_report` says of them (docs/json.md)."""
    s = reportruns.read(rows, metric)
    differ = [r.id for r in s.runs if r.setup_differs]
    return {
        "selection": selection,
        "metric": None if s.metric is None else {"name": s.metric, "unit": s.unit, "units": s.units,
                                                  "lacking": s.lacking},
        "runs": [_run_json(r, s) for r in s.runs],
        "summary": {"all": s.stats_all.as_dict(), "clean": s.stats_clean.as_dict(),
                    "quantiles": stats.QUANTILE_METHOD, "stdev": "sample (n - 1)", "cv": "stdev / |mean|"},
        "outliers": {"method": stats.OUTLIER_METHOD, "ids": s.outliers},
        "comparable": {"same_setup": s.same_setup, "setup_digests": s.digests, "reference": s.reference,
                       "differ": differ, "without_digest": s.without_digest},
        "noisy": {"count": len(s.noisy), "ids": s.noisy, "by_cause": s.noisy_causes},
        "unknown": {"count": len(s.unknown), "ids": s.unknown, "by_cause": s.unknown_causes},
    }

"""The runs of ``dispatch report``: the daemon's history rows read into one series (pure).

Each row is one finished job (the ``history`` verb's row; every key present,
values may be null). :func:`read` puts them in id order, takes each run's
*figure* (its wall time, or with a metric the last value the job wrote for
it), and works out what the report says of them: the statistics of all runs
and of the clean ones (``hpc_batch/core/series.py``), the outliers, which
runs share a setup digest, and why runs were noisy. The text, the JSON and
the pictures (``report.py``, ``reportplot.py``) only lay this out.

A *clean* run is one whose verdict is ``clean`` and that exited 0: a run that
failed, timed out or was killed has a time that measures something else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shepherd.record import verdict

from ..core import series
from ..core.cut import one_line

# A cause in a few words: the verdict's own words (shepherd/record/verdict.py, the one definition), and
# what a row from before causes were recorded says.
CAUSE_WORDS = {**verdict.CAUSE_WORDS, "unstated": "cause not given"}
CAUSE_CUT = 40      # characters of a cause's words (a name the daemon did not check)
NUMBER_CUT = 12     # characters of a figure written with fixed decimals; longer, it is written 1.234e+300


def cause_words(cause: str) -> str:
    """*cause* in a few words: ``device_interrupts`` -> ``device IRQs``; escaped, at most CAUSE_CUT characters."""
    words = CAUSE_WORDS.get(cause)
    if words is None and cause.startswith("unknown:"):
        words = cause[len("unknown:"):].replace("_", " ") + " not known"
    text = one_line(words if words is not None else cause)
    return text if len(text) <= CAUSE_CUT else text[:CAUSE_CUT - 3] + "..."


def decimals(values: list[float]) -> int:
    """Decimals that show about four significant digits of the series' typical figure (0 to 6).

    One rule for a column, the summary and the plots' axes: figures lined up
    with the same decimals, enough to see the spread of runs a percent apart.
    """
    finite = sorted(abs(v) for v in values if v)
    if not finite:
        return 2
    return max(0, min(6, 3 - math.floor(math.log10(finite[len(finite) // 2]))))


def number(value: float, places: int) -> str:
    """*value* with *places* decimals, or in four significant digits where that would be long (1e300)."""
    text = f"{value:.{places}f}"
    return text if len(text) <= NUMBER_CUT else f"{value:.4g}"


@dataclass(frozen=True)
class Run:
    """One run as the report shows it. ``figure`` is what the summary counts (None: the run lacks it)."""

    id: int
    name: str | None
    started: float | None
    wall_s: float | None
    cpu_s: float | None
    verdict: str | None         # clean, noisy, unknown; None: the job has no record
    causes: tuple[str, ...]
    exit: str                   # as ``dispatch list`` shows it: "0", "3", "killed", ...
    ok: bool                    # exited with status 0
    setup_digest: str | None
    figure: float | None
    setup_differs: bool | None  # from the first run with a digest; None where this run has none
    outlier: bool

    @property
    def clean(self) -> bool:
        """Whether the run counts among the clean ones: verdict clean and exit 0."""
        return self.verdict == "clean" and self.ok

    @property
    def cause(self) -> str | None:
        """The verdict's first cause, or None."""
        return self.causes[0] if self.causes else None


@dataclass(frozen=True)
class Series:
    """The runs in id order and what the report says of them."""

    runs: list[Run]
    metric: str | None          # None: the figure is the wall time
    unit: str | None            # "s" for the wall time; a metric's unit as the first run with it gave it
    units: list[str]            # every unit the metric came in (more than one: the figures do not compare)
    lacking: list[int]          # ids of the runs without the figure
    stats_all: series.Stats
    stats_clean: series.Stats
    outliers: list[int]         # ids
    digests: dict[str, list[int]]   # setup digest -> ids, in order of first appearance
    without_digest: list[int]
    reference: int | None       # the run whose digest the others are held to
    noisy: list[int]
    noisy_causes: dict[str, int]    # cause -> noisy runs that gave it, most first
    unknown: list[int]
    unknown_causes: dict[str, int]
    no_verdict: list[int]

    @property
    def same_setup(self) -> bool | None:
        """True: every run has the one setup digest; False: two or more; None: no run has one,
        or some have none and the others agree (it cannot be told)."""
        if len(self.digests) > 1:
            return False
        if not self.digests or self.without_digest:
            return None
        return True


def _number(value: Any) -> float | None:
    """A finite int or float within ±series.LIMIT as a float; anything else (null, text, NaN, true, 1e300) None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:           # an int past a float's range
        return None
    return value if math.isfinite(value) and abs(value) <= series.LIMIT else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _metric(row: dict[str, Any], name: str) -> tuple[float | None, str | None]:
    """The last value a run wrote for metric *name* (its final word on it), and its unit."""
    metrics = row.get("metrics")
    entry = metrics.get(name) if isinstance(metrics, dict) else None
    if not isinstance(entry, dict):
        return None, None
    last = _number(entry.get("last"))
    values = entry.get("values")
    if last is None and isinstance(values, list) and values:
        last = _number(values[-1])
    unit = entry.get("unit")
    return last, unit if isinstance(unit, str) else None


def _tally(causes: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in causes:
        counts[c] = counts.get(c, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def read(rows: list[dict[str, Any]], metric: str | None = None) -> Series:
    """The series of *rows* (``history`` rows), its figure the wall time or, with *metric*, that metric."""
    rows = sorted(rows, key=lambda r: r["id"])
    figures: list[float | None] = []
    units: list[str] = []
    for row in rows:
        if metric is None:
            figures.append(_number(row.get("wall_s")))
        else:
            value, unit = _metric(row, metric)
            figures.append(value)
            if value is not None and unit is not None and unit not in units:
                units.append(unit)
    have = [(row["id"], f) for row, f in zip(rows, figures) if f is not None]
    flagged = {have[i][0] for i in series.outliers([f for _, f in have])}
    digests: dict[str, list[int]] = {}
    reference = None
    for row in rows:
        d = row.get("setup_digest")
        if isinstance(d, str):
            digests.setdefault(d, []).append(row["id"])
            reference = reference if reference is not None else row["id"]
    first = next(iter(digests), None)
    runs = []
    for row, figure in zip(rows, figures):
        digest = row.get("setup_digest") if isinstance(row.get("setup_digest"), str) else None
        verdict = row.get("verdict") if row.get("verdict") in ("clean", "noisy", "unknown") else None
        causes = tuple(str(c) for c in row.get("causes") or () if c is not None)
        if not causes and verdict in ("noisy", "unknown"):
            causes = ("unstated",)
        runs.append(Run(
            id=row["id"], name=_text(row.get("name")), started=_number(row.get("started")),
            wall_s=_number(row.get("wall_s")), cpu_s=_number(row.get("cpu_s")), verdict=verdict,
            causes=causes, exit=str(row.get("exit")), ok=row.get("result") == "exited" and str(row.get("exit")) == "0",
            setup_digest=digest, figure=figure, setup_differs=None if digest is None else digest != first,
            outlier=row["id"] in flagged))
    noisy = [r for r in runs if r.verdict == "noisy"]
    unknown = [r for r in runs if r.verdict == "unknown"]
    return Series(
        runs=runs, metric=metric, unit="s" if metric is None else (units[0] if units else None), units=units,
        lacking=[r.id for r in runs if r.figure is None],
        stats_all=series.describe([r.figure for r in runs if r.figure is not None]),
        stats_clean=series.describe([r.figure for r in runs if r.figure is not None and r.clean]),
        outliers=[r.id for r in runs if r.outlier], digests=digests,
        without_digest=[r.id for r in runs if r.setup_digest is None], reference=reference,
        noisy=[r.id for r in noisy], noisy_causes=_tally([c for r in noisy for c in dict.fromkeys(r.causes)]),
        unknown=[r.id for r in unknown], unknown_causes=_tally([c for r in unknown for c in dict.fromkeys(r.causes)]),
        no_verdict=[r.id for r in runs if r.verdict is None])

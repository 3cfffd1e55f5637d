"""The benchmark table: figures, their targets, and the markdown and JSON written (pure)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .stats import Summary

_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, "<": operator.lt, ">=": operator.ge}


@dataclass(frozen=True)
class Target:
    """A goal for one figure: *on* (``ratio``, ``median``, ``max`` or ``excess``) *op* *bound*.

    *text* is the goal as the issue words it; *bound* is in the figure's base
    unit (seconds, bytes, a count), or a plain number for a ratio. ``excess``
    is the value's median less the baseline's ("at most 5 ms more").
    """

    text: str
    on: str
    op: str
    bound: float

    def met(self, value: Summary | None, ratio: float | None, baseline: Summary | None = None) -> bool | None:
        """Whether the goal holds; None when the figure it needs is missing."""
        if self.on == "ratio":
            x = ratio
        elif self.on == "excess":
            x = None if value is None or baseline is None else value.median - baseline.median
        elif value is None:
            x = None
        else:
            x = value.high if self.on == "max" else value.median
        return None if x is None else _OPS[self.op](x, self.bound)


@dataclass
class Figure:
    """One row of the table: a measured value beside its same-run baseline."""

    key: str                      # stable id (the JSON and the smoke test use it)
    label: str                    # the figure, in markdown
    how: str                      # how it is measured (a numbered note under the table)
    target: Target | None = None  # None: informational
    baseline_label: str = ""
    value: Summary | None = None
    baseline: Summary | None = None
    missing: str | None = None           # why there is no value ("n/a (...)")
    baseline_missing: str | None = None  # why there is no baseline
    details: list[str] = field(default_factory=list)  # extra lines for the note
    variant: str = ""  # "b": numbered after the row before it, as (3b), so later rows keep their numbers

    @property
    def ratio(self) -> float | None:
        """value / baseline, on the medians."""
        if self.value is None or self.baseline is None or self.baseline.median == 0:
            return None
        return self.value.median / self.baseline.median

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.value, self.ratio, self.baseline)

    def is_complete(self) -> bool:
        """Every part measured, or missing with a reason said."""
        has_value = self.value is not None or bool(self.missing)
        has_base = (not self.baseline_label) or self.baseline is not None or bool(self.baseline_missing)
        return has_value and has_base


def numbers(figures: list[Figure]) -> list[str]:
    """Each row's number: 1, 2, 3, then a variant of 3 as ``3b``, then 4 (a variant never advances it)."""
    out, n = [], 0
    for f in figures:
        if f.variant and n:
            out.append(f"{n}{f.variant}")
        else:
            n += 1
            out.append(str(n))
    return out


def second_target(what: str, ratio: float | None, target: Target) -> str:
    """A note line judging a row against a second baseline: ``Against X: 0.25x; target >= 0.3x: no.``"""
    if ratio is None:
        return f"Against {what}: not measured; target {target.text}: n/a."
    word = "yes" if target.met(None, ratio) else "no"
    return f"Against {what}: {ratio:.2f}x; target {target.text}: {word}."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _met_word(fig: Figure) -> str:
    if fig.target is None:
        return "-"
    met = fig.met
    return "n/a" if met is None else ("yes" if met else "no")


def table_rows(figures: list[Figure]) -> list[list[str]]:
    """The cells of each row: figure, value, baseline, ratio, target, met?"""
    rows = []
    for i, f in zip(numbers(figures), figures):
        value = f.value.text() if f.value is not None else f"n/a ({f.missing})"
        if not f.baseline_label:
            base = "-"
        elif f.baseline is not None:
            base = f"{f.baseline_label} {f.baseline.text()}"
        else:
            base = f"{f.baseline_label}: n/a ({f.baseline_missing})"
        ratio = "-" if f.ratio is None else f"{f.ratio:.2f}x"
        rows.append([f"{f.label} ({i})", value, base, ratio, f.target.text if f.target else "-", _met_word(f)])
    return rows


def markdown(figures: list[Figure], machine: list[tuple[str, str]], command: str,
             notes: list[str], title: str = "Benchmarks", sections: list[str] | None = None) -> str:
    """The whole docs/benchmarks.md text; *sections*: more markdown lines, after the table's notes."""
    head = ["figure", "value: median [min-max]", "baseline, same run", "ratio", "target", "met?"]
    lines = [f"# {title}", "",
             "Written by `bench/run`; do not edit by hand. Regenerate it (as root, from the",
             "repository root) with:", "", "```sh", command, "```", "",
             "Every value is the median of several runs with their min and max in brackets,",
             "next to a baseline measured in the same run, interleaved with it where the",
             "figure allows. Ratios are value / baseline on the medians; a target on a",
             "ratio is judged on that ratio, any other on the median (wakeups: on the",
             "max; \"ms more\": on the median less the baseline's). Absolute times depend",
             "on the machine; compare ratios.", "",
             "## Machine", ""]
    lines += [f"- {k}: {v}" for k, v in machine]
    lines += ["", "## Figures", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table_rows(figures)]
    num = numbers(figures)
    judged = [f for f in figures if f.target is not None]
    met = [f for f in judged if f.met]
    unknown = [f for f in judged if f.met is None]
    def listed(fs: list[Figure]) -> str:
        return ", ".join(f"({num[figures.index(f)]})" for f in fs) or "none"

    missed = [f for f in judged if f.met is False]
    lines += ["", f"Targets met: {len(met)} of {len(judged)}: {listed(met)}. Not met: {listed(missed)}."
              + (f" Not measured: {listed(unknown)}." if unknown else "")]
    lines += ["", "## How each figure is measured", ""]
    for i, f in zip(num, figures):
        if f.variant and not i.isdigit():   # a nested item of the row before, so markdown keeps it apart
            lines.append(f"   - ({i}) {f.how}")
            lines += [f"     {d}" for d in f.details]
            continue
        lines.append(f"{i}. {f.how}")
        lines += [f"   {d}" for d in f.details]
    if sections:
        lines += [""] + sections
    if notes:
        lines += ["", "## Notes on this run", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def as_json(figures: list[Figure], machine: list[tuple[str, str]], command: str,
            notes: list[str]) -> dict[str, Any]:
    """The same report as data, in base units."""
    return {
        "command": command,
        "machine": dict(machine),
        "notes": notes,
        "figures": [{
            "key": f.key, "number": number, "label": f.label,
            "value": f.value.as_dict() if f.value else None, "missing": f.missing,
            "baseline_label": f.baseline_label,
            "baseline": f.baseline.as_dict() if f.baseline else None, "baseline_missing": f.baseline_missing,
            "ratio": f.ratio, "target": f.target.text if f.target else None, "met": f.met,
            "complete": f.is_complete(),
        } for number, f in zip(numbers(figures), figures)],
    }

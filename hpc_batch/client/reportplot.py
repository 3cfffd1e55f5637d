"""The pictures of ``dispatch report``: the series in the terminal, and as an SVG document (pure).

Both draw one mark a run, in id order along the x axis, its figure up the y
axis, the mark's shape saying its verdict: clean ``o``, noisy ``x``, unknown
(or no verdict) ``?``.

The SVG is written here with the standard library rather than a plotting
package: hpc-batch is installed as root, system-wide, on machines that run
benchmarks, and a dependency such as matplotlib would bring a large tree of
packages (and their updates) onto each of them for one picture; an SVG file
opens in every browser and scales to any size. No script, no stylesheet, no
font or image from elsewhere: the document stands alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from xml.sax.saxutils import escape

from ..core.cut import one_line
from .reportruns import Run, Series, decimals, number

HEIGHT = 10         # lines of the terminal plot's area
SPACING = 3         # columns between two runs when there is room
MARKS = {"clean": "o", "noisy": "x"}        # anything else: "?"
RANK = {"o": 0, "?": 1, "x": 2}             # where several runs share a column, the worst mark shows
ANSI = {"o": "\x1b[32m", "x": "\x1b[31m", "?": "\x1b[33m"}
RESET = "\x1b[0m"
MEDIAN = "."        # the clean runs' median, across the terminal plot's empty cells


def mark(run: Run) -> str:
    """The run's mark: ``o`` clean, ``x`` noisy, ``?`` unknown or no verdict."""
    return MARKS.get(run.verdict or "", "?")


def _range(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:        # one figure: a band around it, so it sits in the middle
        pad = abs(lo) * 0.01 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def terminal(s: Series, figure_name: Callable[[Series], str], width: int, colour: bool, height: int = HEIGHT) -> str:
    """The terminal plot of *s* in *width* columns; ANSI colour only with *colour*."""
    clean_median = s.stats_clean.median
    figures = [r.figure for r in s.runs if r.figure is not None]
    n = len(s.runs)
    title = f"{figure_name(s)}, one mark a run, in id order"
    if not figures:
        return _cut(title, width) + "\n" + ("nothing to plot: no runs" if not s.runs else
                                            "nothing to plot: no run has the figure")
    lo, hi = _range(figures)
    places = decimals(figures)
    height = max(height, 3)
    mid = (height - 1) // 2
    labels = {r: number(hi - (hi - lo) * r / (height - 1), places) for r in (0, mid, height - 1)}
    label_w = max(len(v) for v in labels.values())
    room = max(width - label_w - 2, 1)
    span = min(room, SPACING * n)
    legend = "o clean  x noisy  ? unknown" + (f"  {MEDIAN} median of clean runs" if clean_median is not None else "")
    notes = [f"{n} runs in {room} columns: where runs share one, the worst mark shows"] if n > room else []
    notes += [f"{len(s.lacking)} of {n} runs lack the figure: no mark"] if s.lacking else []

    def row_of(v: float) -> int:
        return height - 1 - round((v - lo) / (hi - lo) * (height - 1))

    grid = [[" "] * span for _ in range(height)]
    for i, run in enumerate(s.runs):
        if run.figure is None:
            continue
        col = i * span // n
        row = row_of(run.figure)
        here = grid[row][col]
        m = mark(run)
        if here == " " or RANK.get(m, 0) > RANK.get(here, 0):
            grid[row][col] = m
    if clean_median is not None:
        line = grid[row_of(clean_median)]
        for col, cell in enumerate(line):
            if cell == " ":
                line[col] = MEDIAN
    lines = [_cut(title, width), _cut(legend, width)] + [_cut(note, width) for note in notes]
    for r, cells in enumerate(grid):
        drawn = "".join(f"{ANSI[c]}{c}{RESET}" if colour and c in ANSI else c for c in cells).rstrip()
        lines.append(f"{labels.get(r, ''):>{label_w}} |{drawn}")
    lines.append(" " * label_w + " +" + "-" * span)
    first, last = str(s.runs[0].id), str(s.runs[-1].id)
    last_col = (n - 1) * span // n
    axis = first
    if n > 1 and last_col + 1 - len(last) > len(first):
        axis = first + " " * (last_col + 1 - len(last) - len(first)) + last
    lines.append(" " * (label_w + 2) + axis)
    return "\n".join(lines)


# -- SVG -----------------------------------------------------------------------------
SVG_W, SVG_H = 800, 420
LEFT, RIGHT, TOP, BOTTOM = 80, 190, 50, 70
COLOURS = {"clean": "#2a9d4a", "noisy": "#d62828", "unknown": "#e09f00"}
BAND = "#4a7bd0"
TICKS = 5           # y-axis labels
X_LABELS = 10       # run ids under the x axis, at most


def _point(run: Run, x: float, y: float, places: int, unit: str) -> str:
    """One run's element: a circle (clean), a cross (noisy) or a diamond (unknown), with its title."""
    kind = run.verdict if run.verdict in ("clean", "noisy") else "unknown"
    said = f"run {run.id}: {number(run.figure or 0.0, places)}{unit}, {run.verdict or 'no verdict'}"
    said += f" ({', '.join(run.causes)})" if run.causes else ""
    tip = f"<title>{escape(_cut(one_line(said), 300))}</title>"
    colour = COLOURS[kind]
    if kind == "clean":
        return f'<circle class="run clean" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{colour}">{tip}</circle>'
    if kind == "noisy":
        a, b, c, e = x - 4.5, x + 4.5, y - 4.5, y + 4.5
        d = f"M{a:.1f},{c:.1f} L{b:.1f},{e:.1f} M{a:.1f},{e:.1f} L{b:.1f},{c:.1f}"
        return f'<path class="run noisy" d="{d}" stroke="{colour}" stroke-width="2.5" fill="none">{tip}</path>'
    pts = f"{x:.1f},{y - 5.5:.1f} {x + 5.5:.1f},{y:.1f} {x:.1f},{y + 5.5:.1f} {x - 5.5:.1f},{y:.1f}"
    return f'<polygon class="run unknown" points="{pts}" fill="{colour}">{tip}</polygon>'


def _legend(has_clean: bool) -> list[str]:
    x, y0 = SVG_W - RIGHT + 20, TOP + 10
    shapes = [
        ("clean", lambda y: f'<circle cx="{x + 6}" cy="{y}" r="4.5" fill="{COLOURS["clean"]}"/>'),
        ("noisy", lambda y: f'<path d="M{x + 1.5},{y - 4.5} L{x + 10.5},{y + 4.5} M{x + 1.5},{y + 4.5} '
                            f'L{x + 10.5},{y - 4.5}" stroke="{COLOURS["noisy"]}" stroke-width="2.5"/>'),
        ("unknown or no verdict", lambda y: f'<polygon points="{x + 6},{y - 5.5} {x + 11.5},{y} {x + 6},{y + 5.5} '
                                            f'{x + 0.5},{y}" fill="{COLOURS["unknown"]}"/>'),
        ("outlier", lambda y: f'<circle cx="{x + 6}" cy="{y}" r="8" fill="none" stroke="#333"/>'),
    ]
    if has_clean:
        shapes += [
            ("median of clean runs", lambda y: f'<line x1="{x}" y1="{y}" x2="{x + 12}" y2="{y}" stroke="{BAND}" '
                                               f'stroke-width="2" stroke-dasharray="4 2"/>'),
            ("IQR of clean runs", lambda y: f'<rect x="{x}" y="{y - 4.5}" width="12" height="9" fill="{BAND}" '
                                            f'fill-opacity="0.18"/>'),
        ]
    out = ['<g class="legend" font-size="12">']
    for i, (words, shape) in enumerate(shapes):
        y = y0 + 22 * i
        out += [shape(y), f'<text x="{x + 20}" y="{y + 4}">{escape(words)}</text>']
    return out + ["</g>"]


def svg(s: Series, selection: str, figure: str) -> str:
    """*s* as a standalone SVG 1.1 document: a point a run, the clean runs' median and IQR, a legend.

    *selection* and *figure* (what the y axis is) must be on one line
    already (``one_line``); every text is XML-escaped here.
    """
    pw, ph = SVG_W - LEFT - RIGHT, SVG_H - TOP - BOTTOM
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{SVG_W}" height="{SVG_H}" '
           f'viewBox="0 0 {SVG_W} {SVG_H}" font-family="sans-serif">',
           f"<title>{escape(_cut(f'dispatch report: {selection}', 300))}</title>",
           f'<rect width="{SVG_W}" height="{SVG_H}" fill="white"/>',
           f'<text x="{LEFT}" y="24" font-size="14">{escape(_cut(selection, 90))}</text>']
    figures = [r.figure for r in s.runs if r.figure is not None]
    n = len(s.runs)
    clean = s.stats_clean
    if figures:
        lo, hi = _range(figures + [v for v in (clean.q1, clean.q3) if v is not None])
        pad = (hi - lo) * 0.06
        lo, hi = lo - pad, hi + pad
    else:
        lo, hi = 0.0, 1.0
    places = decimals(figures)

    def y_of(v: float) -> float:
        return TOP + ph - (v - lo) / (hi - lo) * ph

    def x_of(i: int) -> float:
        return LEFT + (i + 0.5) * pw / max(n, 1)

    out.append(f'<g class="axes" stroke="#333" stroke-width="1">'
               f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}"/>'
               f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}"/></g>')
    out.append('<g class="ticks" font-size="11" fill="#333">')
    for k in range(TICKS):
        v = lo + (hi - lo) * k / (TICKS - 1)
        y = y_of(v)
        out.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#333"/>')
        out.append(f'<text x="{LEFT - 7}" y="{y + 4:.1f}" text-anchor="end">{number(v, places)}</text>')
    every = max(1, math.ceil(n / X_LABELS))
    for i in range(0, n, every):
        x = x_of(i)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + ph}" x2="{x:.1f}" y2="{TOP + ph + 4}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 17}" text-anchor="middle">{s.runs[i].id}</text>')
    out.append("</g>")
    out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{SVG_H - 28}" font-size="12" text-anchor="middle">'
               f'run (job id), in id order</text>')
    out.append(f'<text transform="translate(18 {TOP + ph / 2:.1f}) rotate(-90)" font-size="12" '
               f'text-anchor="middle">{escape(_cut(figure, 60))}</text>')
    if clean.q1 is not None and clean.q3 is not None and clean.median is not None:
        top, bottom = y_of(clean.q3), y_of(clean.q1)
        out.append(f'<rect class="iqr" x="{LEFT}" y="{top:.1f}" width="{pw}" height="{max(bottom - top, 0.5):.1f}" '
                   f'fill="{BAND}" fill-opacity="0.18"/>')
        ym = y_of(clean.median)
        out.append(f'<line class="median" x1="{LEFT}" y1="{ym:.1f}" x2="{LEFT + pw}" y2="{ym:.1f}" stroke="{BAND}" '
                   f'stroke-width="2" stroke-dasharray="6 3"/>')
    unit = " s" if s.metric is None else (f" {s.unit}" if s.unit else "")
    out.append('<g class="runs">')
    for i, run in enumerate(s.runs):
        if run.figure is None:
            continue
        x, y = x_of(i), y_of(run.figure)
        out.append(_point(run, x, y, places, unit))
        if run.outlier:
            out.append(f'<circle class="outlier" cx="{x:.1f}" cy="{y:.1f}" r="8" fill="none" stroke="#333"/>')
    out.append("</g>")
    if not s.runs:
        out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{TOP + ph / 2:.1f}" text-anchor="middle">no runs</text>')
    elif s.lacking:
        out.append(f'<text x="{LEFT}" y="{SVG_H - 8}" font-size="11">{len(s.lacking)} of {n} runs lack the '
                   f'figure and are not drawn</text>')
    out += _legend(clean.median is not None)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."

"""Summaries of repeated measurements: median, min and max, with a unit (pure)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# How a value of each unit is shown; samples are kept in the base unit
# (seconds, jobs/s, bytes, counts) and scaled only when printed.
_SCALE = {"ms": (1e3, "{:.1f}"), "s": (1.0, "{:.2f}"), "jobs/s": (1.0, "{:.1f}"),
          "MiB": (1 / (1 << 20), "{:.2f}"), "count": (1.0, "{:.0f}")}


@dataclass(frozen=True)
class Summary:
    """Median, min and max of *n* samples, in *unit* (samples in base units)."""

    median: float
    low: float
    high: float
    n: int
    unit: str

    def show(self, x: float) -> str:
        """One number of this summary's unit, scaled and rounded: ``12.3 ms``."""
        scale, fmt = _SCALE[self.unit]
        return f"{fmt.format(x * scale)} {self.unit}" if self.unit != "count" else fmt.format(x)

    def text(self) -> str:
        """``median [min-max]`` (just the median for a single sample)."""
        if self.n == 1:
            return self.show(self.median)
        scale, fmt = _SCALE[self.unit]
        span = f"{fmt.format(self.low * scale)}-{fmt.format(self.high * scale)}"
        return f"{self.show(self.median)} [{span}]"

    def as_dict(self) -> dict[str, float | int | str]:
        """JSON-safe form, in base units."""
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n, "unit": self.unit}


def summarize(samples: Sequence[float], unit: str) -> Summary:
    """Summarize *samples* (at least one) taken in *unit*'s base unit."""
    if not samples:
        raise ValueError("no samples to summarize")
    if unit not in _SCALE:
        raise ValueError(f"unknown unit {unit!r}")
    return Summary(statistics.median(samples), min(samples), max(samples), len(samples), unit)


def rates(counts: int, seconds: list[float]) -> list[float]:
    """Jobs per second for each run that moved *counts* jobs in the given seconds."""
    return [counts / s for s in seconds]

"""The statistics of a series of runs: one figure a run (a wall time, a job's own metric) (pure).

``dispatch report`` asks two things of a series: how spread out its figures
are, and which runs stand apart. The choices, each named where it is shown:

- Quantiles (the quartiles, the median) are the *linear* method, Hyndman and
  Fan's type 7: the default of R's ``quantile``, NumPy's ``percentile`` and
  Python's ``statistics.quantiles(method="inclusive")``. For a sorted series
  ``x[0..n-1]`` the p-quantile is ``x[h]`` interpolated, ``h = (n - 1) * p``.
- The standard deviation is the sample's (divisor n - 1); the coefficient of
  variation is that over the mean's magnitude (a spread relative to the
  figure's size: 0.02 is "2 % spread").
- An outlier lies more than ``OUTLIER_K`` (3) scaled MADs from the median: the
  MAD (median absolute deviation) times 1.4826, which makes it estimate the
  standard deviation of normal data (Leys et al., J. Exp. Soc. Psychol. 2013,
  recommend 3 as "very conservative"). Unlike mean ± 3 sd, one wild run cannot
  hide itself by inflating the spread. When the MAD is 0 (more than half the
  runs have exactly the median's figure: a coarse clock, an integer count),
  the scale falls back to the mean absolute deviation times 1.2533 (its
  factor for normal data; IBM SPSS's modified z-score does the same), so a
  run away from a series of identical ones is flagged; when that is 0 too,
  every figure is the same and none is an outlier.

Figures must be finite and within ±``LIMIT`` (so that their squares and sums
stay finite): the reader of the rows leaves out a run without such a figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

QUANTILE_METHOD = "linear (Hyndman-Fan type 7)"
MAD_SCALE = 1.4826          # MAD to a normal's standard deviation (1 / the 0.75 quantile of N(0, 1))
MEAN_AD_SCALE = 1.2533      # mean absolute deviation to a normal's standard deviation (sqrt(pi / 2))
OUTLIER_K = 3.0
LIMIT = 1e150               # the largest figure's magnitude: its square, times a billion runs, is still finite
OUTLIER_METHOD = (f"median ± {OUTLIER_K:g} × scaled MAD ({MAD_SCALE} × median absolute deviation; "
                  f"{MEAN_AD_SCALE} × mean absolute deviation where the MAD is 0)")


@dataclass(frozen=True)
class Stats:
    """The summary of a series. Each figure is None where the series is too short to have it:
    none for an empty series; ``stdev`` and ``cv`` need two values, ``cv`` a mean other than 0."""

    n: int
    median: float | None
    q1: float | None
    q3: float | None
    iqr: float | None
    min: float | None
    max: float | None
    mean: float | None
    stdev: float | None
    cv: float | None

    def as_dict(self) -> dict[str, Any]:
        """The figures by name, as ``report --json`` writes them."""
        return asdict(self)


def quantile(ordered: Sequence[float], p: float) -> float:
    """The *p*-quantile (0 <= p <= 1) of the sorted, non-empty *ordered*, by the linear method (type 7)."""
    if not ordered:
        raise ValueError("no quantile of an empty series")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"quantile {p} is outside 0..1")
    h = (len(ordered) - 1) * p
    lo = math.floor(h)
    if lo + 1 >= len(ordered):
        return float(ordered[-1])
    return ordered[lo] + (h - lo) * (ordered[lo + 1] - ordered[lo])


def _median(values: Sequence[float]) -> float:
    return quantile(sorted(values), 0.5)


def describe(values: Sequence[float]) -> Stats:
    """n, median, quartiles and IQR (type 7), min, max, mean, sample standard deviation and CV of *values*."""
    if not values:
        return Stats(0, None, None, None, None, None, None, None, None, None)
    if not all(math.isfinite(v) and abs(v) <= LIMIT for v in values):
        raise ValueError(f"a series' figures must be finite and within ±{LIMIT:g}")
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    q1, med, q3 = (quantile(ordered, p) for p in (0.25, 0.5, 0.75))
    mean = math.fsum(ordered) / n
    stdev = math.sqrt(math.fsum((v - mean) ** 2 for v in ordered) / (n - 1)) if n > 1 else None
    cv = stdev / abs(mean) if stdev is not None and mean != 0 else None
    return Stats(n, med, q1, q3, q3 - q1, ordered[0], ordered[-1], mean, stdev, cv)


def scaled_mad(values: Sequence[float]) -> float:
    """1.4826 × the median absolute deviation from the median of *values* (non-empty)."""
    med = _median(values)
    return MAD_SCALE * _median([abs(v - med) for v in values])


def outlier_scale(values: Sequence[float]) -> float:
    """The spread outliers are measured in: the scaled MAD, or where it is 0 the scaled mean absolute deviation."""
    scale = scaled_mad(values)
    if scale == 0:
        med = _median(values)
        scale = MEAN_AD_SCALE * math.fsum(abs(v - med) for v in values) / len(values)
    return scale


def outliers(values: Sequence[float]) -> list[int]:
    """The indexes of the values more than OUTLIER_K × :func:`outlier_scale` from the median.

    Fewer than three values have none: with two, each is as far from the
    median as the other.
    """
    if len(values) < 3:
        return []
    med = _median(values)
    bound = OUTLIER_K * outlier_scale(values)
    return [i for i, v in enumerate(values) if abs(v - med) > bound]

"""The statistics of a series of runs (hpc_batch/core/series.py), against values computed by hand.

Quantiles are the linear method (type 7): h = (n - 1) p, x[floor h] plus the
fraction of h times the step to the next value. The standard deviation is
the sample's (n - 1). The hand computations are written beside each row.
"""

import math
import random
import statistics

import pytest

from hpc_batch.core import series
from hpc_batch.core.series import describe, outliers, quantile, scaled_mad

NONE = dict.fromkeys(("median", "q1", "q3", "iqr", "min", "max", "mean", "stdev", "cv"))

DESCRIBED = [
    ("empty", [], dict(NONE, n=0)),
    # one value: every quantile is it; no spread can be told
    ("one", [5.0], dict(n=1, median=5.0, q1=5.0, q3=5.0, iqr=0.0, min=5.0, max=5.0, mean=5.0, stdev=None, cv=None)),
    # q1: h = 0.25 -> 1 + 0.25 * 2 = 1.5; sd = sqrt((1 + 1) / 1)
    ("two", [1.0, 3.0], dict(n=2, median=2.0, q1=1.5, q3=2.5, iqr=1.0, min=1.0, max=3.0, mean=2.0,
                             stdev=math.sqrt(2), cv=math.sqrt(2) / 2)),
    # 1..10: q1 h = 2.25 -> 3.25; median h = 4.5 -> 5.5; q3 h = 6.75 -> 7.75 (R's quantile(1:10));
    # sum of squares about 5.5 = 82.5, / 9
    ("one to ten", [float(i) for i in range(1, 11)],
     dict(n=10, median=5.5, q1=3.25, q3=7.75, iqr=4.5, min=1.0, max=10.0, mean=5.5,
          stdev=math.sqrt(82.5 / 9), cv=math.sqrt(82.5 / 9) / 5.5)),
    # q1 h = 1.75 -> 4; median h = 3.5 -> 4.5; q3 h = 5.25 -> 5 + 0.25 * 2 = 5.5; sum of squares about 5 = 32
    ("textbook", [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0],
     dict(n=8, median=4.5, q1=4.0, q3=5.5, iqr=1.5, min=2.0, max=9.0, mean=5.0,
          stdev=math.sqrt(32 / 7), cv=math.sqrt(32 / 7) / 5)),
    # unsorted in: sorted 1, 5, 9; q1 h = 0.5 -> 3; sd = sqrt((16 + 0 + 16) / 2) = 4
    ("unsorted", [9.0, 1.0, 5.0], dict(n=3, median=5.0, q1=3.0, q3=7.0, iqr=4.0, min=1.0, max=9.0, mean=5.0,
                                       stdev=4.0, cv=0.8)),
    # a mean of 0 has no coefficient of variation
    ("mean zero", [-1.0, 1.0], dict(n=2, median=0.0, q1=-0.5, q3=0.5, iqr=1.0, min=-1.0, max=1.0, mean=0.0,
                                    stdev=math.sqrt(2), cv=None)),
    # a negative mean: the CV is over its magnitude
    ("negative", [-4.0, -6.0], dict(n=2, median=-5.0, q1=-5.5, q3=-4.5, iqr=1.0, min=-6.0, max=-4.0, mean=-5.0,
                                    stdev=math.sqrt(2), cv=math.sqrt(2) / 5)),
]


@pytest.mark.parametrize(("values", "want"), [(v, w) for _, v, w in DESCRIBED], ids=[d for d, _, _ in DESCRIBED])
def test_describe_by_hand(values, want):
    got = describe(values).as_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == (None if value is None else pytest.approx(value)), key


def test_quantile_ends_and_refusals():
    xs = [1.0, 2.0, 4.0, 8.0]
    assert quantile(xs, 0) == 1.0 and quantile(xs, 1) == 8.0
    assert quantile(xs, 0.9) == pytest.approx(4.0 + 0.7 * 4.0)      # h = 2.7
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile(xs, 1.5)


def test_figures_must_be_finite():
    for bad in (math.nan, math.inf, -2 * series.LIMIT):
        with pytest.raises(ValueError):
            describe([1.0, bad])


def test_the_quartiles_are_the_standard_librarys_inclusive_ones_and_the_stdev_the_samples():
    rng = random.Random(30)
    for n in range(2, 40):
        xs = [rng.lognormvariate(2, 0.3) for _ in range(n)]
        st = describe(xs)
        q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        assert (st.q1, st.median, st.q3) == (pytest.approx(q1), pytest.approx(med), pytest.approx(q3))
        assert st.stdev == pytest.approx(statistics.stdev(xs))
        assert st.median == pytest.approx(statistics.median(xs))


def test_scaled_mad_by_hand():
    # median 3; deviations 2, 1, 0, 1, 97 -> their median 1
    assert scaled_mad([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(1.4826)
    assert series.MAD_SCALE == 1.4826


OUTLIERS = [
    # median 10; deviations 0, .1, .1, 0, .2, .2, 5 -> MAD .1, scaled .14826, bound .44478
    ("one slow run", [10.0, 10.1, 9.9, 10.0, 10.2, 9.8, 15.0], [6]),
    # median 4.5; deviations .5 (x5), 2.5, 2.5, 4.5 -> MAD .5, scaled .7413, bound 2.2239
    ("textbook", [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], [0, 6, 7]),
    # MAD 0 (four of five at the median): mean absolute deviation 40 / 5 = 8, x 1.2533 = 10.03, bound 30.08
    ("mad zero, one apart", [10.0, 10.0, 10.0, 10.0, 50.0], [4]),
    # MAD 0: mean absolute deviation .25, x 1.2533 = .3133, bound .94 < 1
    ("mad zero, a step", [10.0, 10.0, 10.0, 11.0], [3]),
    # MAD 0 and mean absolute deviation 0: all the same, nothing stands apart
    ("all the same", [3.0, 3.0, 3.0], []),
    ("two", [1.0, 100.0], []),
    ("one", [1.0], []),
    ("none", [], []),
    # a quiet series: no run is 3 scaled MADs out
    ("quiet", [12.30, 12.38, 12.46, 12.42, 12.30, 12.38, 12.34], []),
]


@pytest.mark.parametrize(("values", "want"), [(v, w) for _, v, w in OUTLIERS], ids=[d for d, _, _ in OUTLIERS])
def test_outliers_by_hand(values, want):
    assert outliers(values) == want


def test_the_methods_are_named():
    assert "type 7" in series.QUANTILE_METHOD and "linear" in series.QUANTILE_METHOD
    assert "1.4826" in series.OUTLIER_METHOD and "median" in series.OUTLIER_METHOD and "3" in series.OUTLIER_METHOD

"""bench/benchkit's "at most N more" target (the --benchmark start row): judged on the median
less the baseline's median, n/a without a baseline."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "bench"))

from benchkit.report import Figure, Target
from benchkit.stats import summarize


def _fig(value, base):
    f = Figure("bench_start", "x", "how", Target("<= 5 ms more", "excess", "<=", 0.005), "plain")
    f.value = summarize(value, "ms") if value else None
    f.baseline = summarize(base, "ms") if base else None
    return f


def test_excess_is_the_difference_of_the_medians():
    assert _fig([0.104, 0.050, 0.200], [0.100, 0.010, 0.300]).met is True     # +4 ms
    assert _fig([0.106, 0.050, 0.200], [0.100, 0.010, 0.300]).met is False    # +6 ms
    assert _fig([0.090], [0.100]).met is True                                 # faster is fine


def test_excess_without_a_baseline_is_not_judged():
    assert _fig([0.1], None).met is None
    assert _fig(None, [0.1]).met is None

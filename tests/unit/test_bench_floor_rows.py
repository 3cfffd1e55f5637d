"""bench/benchkit's design floor rows (issue 34): their numbering, their targets, and the second
target of row (3) judged in its note (pure)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "bench"))

from benchkit import report, rows
from benchkit.context import FULL
from benchkit.report import Figure, Target
from benchkit.stats import summarize


def _fig(key, variant="", target=None):
    return Figure(key, key, "how", target, "base", variant=variant)


def test_a_variant_takes_the_number_before_it_and_later_rows_keep_theirs():
    figs = [_fig("a"), _fig("b"), _fig("c"), _fig("c2", "a"), _fig("c3", "b"), _fig("d")]
    assert report.numbers(figs) == ["1", "2", "3", "3a", "3b", "4"]


def test_a_variant_first_is_numbered_as_a_row():
    assert report.numbers([_fig("x", "b"), _fig("y")]) == ["1", "2"]


def test_the_table_and_its_summary_use_those_numbers():
    floor = _fig("floor", "a", Target(">= 0.8x", "ratio", ">=", 0.8))
    floor.value, floor.baseline = summarize([8.0], "jobs/s"), summarize([10.0], "jobs/s")   # 0.8x: met
    plain = _fig("plain", "", Target(">= 0.5x", "ratio", ">=", 0.5))
    plain.value, plain.baseline = summarize([1.0], "jobs/s"), summarize([10.0], "jobs/s")   # 0.1x: not met
    text = report.markdown([plain, floor], [], "bench/run", [])
    assert "| plain (1) |" in text and "| floor (1a) |" in text
    assert "Targets met: 1 of 2: (1a). Not met: (1)." in text
    assert "\n1. how\n   - (1a) how\n" in text      # a nested item, not a paragraph run into row (1)'s
    assert [f["number"] for f in report.as_json([plain, floor], [], "cmd", [])["figures"]] == ["1", "1a"]


def test_the_drain_rows_are_numbered_3_3a_3b_3c_4_and_the_shepherd_rows_5_5b_6_7():
    table = rows.table(FULL)
    num = dict(zip((f.key for f in table), report.numbers(table)))
    assert [num[k] for k in ("drain_array", "drain_floor", "drain_norecords", "drain_unpinned", "drain_loop")] == [
        "3", "3a", "3b", "3c", "4"]
    assert [num[k] for k in ("shepherd_pss", "shepherd_pss_many", "shepherd_rss", "shepherd_wakeups")] == [
        "5", "5b", "6", "7"]
    assert num["bulk_loop"] == str(sum(1 for f in table if not f.variant))   # the rows after them keep theirs


def test_every_measured_row_belongs_to_one_group():
    keys = [k for group in rows.GROUPS.values() for k in group] + ["vm"]   # vm: filled from --vm-json
    assert sorted(keys) == sorted(f.key for f in rows.table(FULL)) and len(set(keys)) == len(keys)


def test_the_drain_and_shepherd_rows_are_judged_against_the_floor():
    figs = {f.key: f for f in rows.table(FULL)}
    drain, bare = figs["drain_array"], figs["drain_norecords"]
    drain.value, bare.value = summarize([50.0], "jobs/s"), summarize([400.0], "jobs/s")
    drain.baseline = bare.baseline = summarize([500.0], "jobs/s")
    assert drain.met is False and bare.met is True            # 0.1x < 0.5x; 0.8x >= 0.8x
    assert figs["drain_floor"].target is None                 # the floor is a measure, not a goal
    assert figs["drain_unpinned"].target is None              # so is the placement's cost
    assert figs["drain_unpinned"].baseline_label == "the design floor"
    pss = figs["shepherd_pss"]
    pss.value, pss.baseline = summarize([2.6 * rows.MiB], "MiB"), summarize([2.0 * rows.MiB], "MiB")
    assert pss.met is True                                    # 1.3x
    pss.value = summarize([2.7 * rows.MiB], "MiB")
    assert pss.met is False
    many = figs["shepherd_pss_many"]
    many.value = summarize([1.1 * rows.MiB], "MiB")
    assert many.met is False
    many.value = summarize([0.9 * rows.MiB], "MiB")
    assert many.met is True


def test_the_second_target_is_judged_in_a_line():
    assert report.second_target("`tsp -S 2`", 0.25, rows.DRAIN_VS_TSP) == \
        "Against `tsp -S 2`: 0.25x; target >= 0.3x tsp: no."
    assert report.second_target("tsp", 0.3, rows.DRAIN_VS_TSP).endswith(": yes.")
    assert report.second_target("tsp", None, rows.DRAIN_VS_TSP) == "Against tsp: not measured; target >= 0.3x tsp: n/a."

"""The soak's figures rendered as docs/benchmarks.md's section (bench/benchkit/soak.py), from a made-up report."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "bench"))

from benchkit.soak import section


def _report(around_each=None):
    rest = {"rss": 26 << 20, "rss_anon": 14 << 20, "fds": 19, "threads": 3, "state": 1 << 20, "journal": 0,
            "history": 1 << 20}
    answers = {"n": 1000, "answered": 990,
               "steady": {"n": 900, "p50": 0.0007, "p99": 0.0158, "max": 0.0672},
               "around_events": {"n": 90, "p99": 0.1106, "max": 0.1707},
               "unanswered_around_events": 10, "unanswered_otherwise": 0}
    if around_each is not None:
        answers["around_each"] = around_each
    return {"minutes": 60.0, "seed": 31, "knob": 60, "date": "2026-12-05 19:00 UTC", "cpus": 2,
            "load_at_start": 0.5, "load_at_end": 0.4,
            "margins": {"rss": [0.2, 10 << 20], "fds": 2, "threads": 2, "state": 1 << 20, "journal": 4 << 20,
                        "alive_s": 10},
            "events": {"reload": 12, "restart": 6, "kill9": 6},
            "alice": {"rounds": 10, "jobs": 100, "array": 50, "chain": 30, "killed": 10, "benchmark": 10},
            "bob": {"jobs": 20, "refused": {"queue_full": 5, "too_large": 2, "busy": 1}, "large_accepted": 2,
                    "unanswered": 0, "extra_in_history": 0, "stuck": []},
            "history_rows": 120, "baseline": rest, "end": rest, "end_fresh": rest, "peaks": {"rss": 30 << 20},
            "answers": answers}


def test_answers_around_events_are_given_by_kind_when_the_report_has_them():
    text = "\n".join(section(_report({"reload": {"n": 60, "p99": 0.0212, "max": 0.0305},
                                       "restart": {"n": 20, "p99": 0.1106, "max": 0.1707},
                                       "kill9": {"n": 0, "p99": None, "max": None}})))
    assert "By kind: reloads p99 21.2 ms, max 30.5 ms (60); restarts p99 110.6 ms, max 170.7 ms (20). " in text
    assert "kill -9`s p99" not in text   # a kind no answer overlapped is left out
    assert "not met on this loaded host" in text   # the restarts' 170.7 ms is over the 100 ms target


def test_a_report_from_before_the_breakdown_still_renders():
    text = "\n".join(section(_report()))
    assert "By kind" not in text and "overlapping one, p99 110.6 ms, max 170.7 ms (90)" in text

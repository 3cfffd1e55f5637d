"""dispatch report's views (hpc_batch/client/report.py): the text, the terminal plot, the SVG and the JSON.

Built from tables of history rows in the daemon's row contract (every key
present, values may be null). Nothing here reads a clock or a terminal: the
width, the colour and the time zone are passed.
"""

import json
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from hpc_batch.client import report, reportruns
from hpc_batch.core import series
from shepherd.record import verdict as shepherd_verdict

T0 = 1764583200.0       # 2025-12-01 10:00:00 UTC
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
SVG = "{http://www.w3.org/2000/svg}"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def row(id, wall, verdict="clean", causes=(), digest=D1, name="bench", result="exited", exit="0", metrics=None,
        started=None):
    """One row of ``history``, as the daemon sends it."""
    start = T0 + 600 * (id - 100) if started is None else started
    return {"id": id, "user": "alice", "name": name, "array": None, "state": "finished", "result": result,
            "exit": exit, "submitted": start - 1, "started": start, "ended": None if wall is None else start + wall,
            "wall_s": wall, "cpu_s": None if wall is None else round(wall * 3.9, 3), "verdict": verdict,
            "causes": list(causes), "reasons": [f"reason for {c}" for c in causes], "setup_digest": digest,
            "record_digest": None, "metrics": metrics if metrics is not None else {}}


NOISY = {104: ["device_interrupts"], 108: ["others_cpu_fraction", "device_interrupts"], 111: ["device_interrupts"],
         115: ["others_cpu_fraction"], 119: ["others_l3_fraction"]}


def twenty():
    """20 runs, 101-120, 5 of them noisy (and slower); one clean run far out."""
    out = []
    for i in range(20):
        jid = 101 + i
        wall = 12.30 + 0.04 * (i % 5) + (0.9 if jid in NOISY else 0.0) + (3.0 if jid == 113 else 0.0)
        out.append(row(jid, wall, "noisy" if jid in NOISY else "clean", NOISY.get(jid, ())))
    return out


def table_lines(out):
    """The run lines of a text report: those that start with a job id."""
    return [line for line in out.splitlines() if re.match(r"\s*\d+\s+\d{4}-", line)]


def fits(out, width):
    return all(len(line) <= width for line in out.splitlines())


def printable(out):
    return all(line.isprintable() for line in out.splitlines())


# -- the text --------------------------------------------------------------------------

def test_a_series_of_twenty_with_five_noisy():
    rows = twenty()
    out = report.format_report(list(reversed(rows)), "name bench, last 7 days", width=100)
    lines = out.splitlines()
    assert lines[0] == "report: name bench, last 7 days"
    assert lines[1] == "20 runs, ids 101-120, name bench"
    runs = table_lines(out)
    assert [int(line.split()[0]) for line in runs] == list(range(101, 121))      # id order, whatever came in
    assert runs[0].split()[1:5] == ["2025-12-01", "10:10:00", "12.30", "47.97"]
    assert runs[3].endswith("noisy: device IRQs") and runs[7].endswith("noisy: busy CPU (+1)")
    assert runs[18].endswith("noisy: L3 neighbours") and runs[0].endswith("clean")
    head = next(line for line in lines if line.lstrip().startswith("id"))
    assert head.split() == ["id", "started", "(UTC)", "wall", "s", "cpu", "s", "verdict"]
    # the summary: all 20, the 15 clean apart, figures as core/series computes them
    everything = series.describe([r["wall_s"] for r in rows])
    clean = series.describe([r["wall_s"] for r in rows if r["verdict"] == "clean"])
    all_line = next(line for line in lines if line.startswith("  all "))
    clean_line = next(line for line in lines if line.startswith("  clean "))
    assert all_line.split() == ["all", "20", f"{everything.median:.2f}", f"{everything.iqr:.2f}",
                                f"{everything.min:.2f}", f"{everything.max:.2f}", f"{100 * everything.cv:.1f}", "%"]
    assert clean_line.split()[:3] == ["clean", "15", f"{clean.median:.2f}"]
    assert "type 7" in out and "linear" in out
    outliers = next(line for line in lines if line.startswith("outliers"))
    assert "scaled MAD" in outliers and "113 (15.38)" in outliers
    assert "setup: all 20 runs the same (sha256:111111111111)" in lines
    assert "noisy: 5 of 20 runs; runs per cause: device IRQs 3, busy CPU 2, L3 neighbours 1" in lines
    assert fits(out, 100) and printable(out) and "\x1b" not in out


def test_colour_only_when_asked_and_only_on_the_verdicts():
    rows = twenty()
    rows[0].update(verdict="unknown", causes=["unknown:cpufreq"])
    plain = report.format_report(rows, "x", width=100)
    coloured = report.format_report(rows, "x", width=100, colour=True)
    assert "\x1b" not in plain
    assert ANSI.sub("", coloured) == plain
    runs = table_lines(coloured)
    assert runs[0].endswith("\x1b[33munknown\x1b[0m: no cpufreq") and runs[1].endswith("\x1b[32mclean\x1b[0m")
    assert runs[3].endswith("\x1b[31mnoisy\x1b[0m: device IRQs")
    assert fits(report.format_report(rows, "x", width=40), 40)
    assert all(len(ANSI.sub("", line)) <= 40 for line in report.format_report(rows, "x", width=40,
                                                                              colour=True).splitlines())


def test_the_selection_is_optional():
    out = report.format_report(twenty())
    assert out.splitlines()[0] == "20 runs, ids 101-120, name bench"
    assert report.report_json(twenty())["selection"] is None
    assert ET.fromstring(report.svg(twenty())).find(f"{SVG}title").text == "dispatch report: 20 runs"


def test_the_marks_say_which_runs_are_outliers():
    out = report.format_report(twenty(), "x", width=100)
    marked = {int(line.split()[0]) for line in table_lines(out) if " ! " in line}
    assert marked == set(reportruns.read(twenty()).outliers) and 113 in marked
    assert "! outlier" in out


def test_two_setup_digests_mark_the_runs_unlike_the_first():
    rows = twenty()
    for r in rows:
        if r["id"] in (109, 110, 117):
            r["setup_digest"] = D2
    rows[5]["setup_digest"] = None      # 106: no record
    out = report.format_report(rows, "x", width=100)
    starred = [int(line.split()[0]) for line in table_lines(out) if re.search(r"\s\*!?\s", line)]
    assert starred == [109, 110, 117]
    lines = out.splitlines()
    at = lines.index("setup: NOT comparable: 2 different setups (* marks a run unlike run 101)")
    assert lines[at + 1].split() == ["sha256:111111111111", "16", "runs:", "101-105,", "107-108,", "111-116,",
                                     "118-120", "(the", "first", "run's)"]
    assert lines[at + 2].split() == ["sha256:222222222222", "3", "runs:", "109-110,", "117"]
    assert lines[at + 3].split() == ["no", "digest", "1", "run:", "106"]
    doc = report.report_json(rows, "x")
    assert doc["comparable"] == {"same_setup": False, "setup_digests": {D1: [101, 102, 103, 104, 105, 107, 108, 111,
                                                                             112, 113, 114, 115, 116, 118, 119, 120],
                                                                        D2: [109, 110, 117]},
                                 "reference": 101, "differ": [109, 110, 117], "without_digest": [106]}
    assert [r["setup_differs"] for r in doc["runs"][4:10]] == [False, None, False, False, True, True]


@pytest.mark.parametrize("n", [0, 1, 2])
def test_zero_one_and_two_runs(n):
    rows = [row(101 + i, 10.0 + i) for i in range(n)]
    out = report.format_report(rows, "name nothing", width=80)
    assert fits(out, 80) and printable(out)
    lines = out.splitlines()
    clean_line = next(line for line in lines if line.startswith("  clean "))
    if n == 0:
        assert lines[1] == "no runs" and not table_lines(out)
        assert clean_line.split() == ["clean", "0", "n/a", "n/a", "n/a", "n/a", "n/a"]
        assert "setup: n/a (no runs)" in lines and "noisy: 0 of 0 runs" in lines
    else:
        assert len(table_lines(out)) == n
        assert clean_line.split()[:2] == ["clean", str(n)]
        assert clean_line.endswith("n/a") == (n == 1)      # one run has no spread
    assert any(line.startswith("outliers") and "n/a (fewer than 3 runs" in line for line in lines)
    plot = report.terminal_plot(rows, width=80)
    assert fits(plot, 80)
    assert ("nothing to plot" in plot) == (n == 0)
    doc = report.report_json(rows, "name nothing")
    json.dumps(doc, allow_nan=False)
    assert doc["summary"]["all"]["n"] == n and len(doc["runs"]) == n
    assert doc["comparable"]["same_setup"] is (None if n == 0 else True)
    if n < 2:
        assert doc["summary"]["all"]["stdev"] is None and doc["summary"]["all"]["cv"] is None
    root = ET.fromstring(report.svg(rows, "name nothing"))
    assert len(_points(root)) == n


HOSTILE = "\x1b[2J\x1b]0;owned\x07line one\nline two\r\t" + "N" * 4096


def test_hostile_strings_stay_escaped_on_one_line_and_cut_to_the_width():
    rows = twenty()
    for r in rows[:3]:
        r["name"] = HOSTILE + str(r["id"])         # names differ: a name column
    rows[3]["causes"] = [HOSTILE, "x\ny"]
    rows[4]["causes"] = ["unknown:" + HOSTILE]
    rows[4]["verdict"] = "unknown"
    rows[5]["exit"] = HOSTILE
    rows[5]["result"] = "killed"
    rows[6]["setup_digest"] = "sha256:\x1b[31m" + "9" * 4000
    rows[7]["metrics"] = {HOSTILE: {"values": [1.0], "last": 1.0, "unit": HOSTILE}}
    for width in (40, 72, 100, 200):
        for metric in (None, HOSTILE):
            out = report.format_report(rows, HOSTILE, metric=metric, width=width)
            assert fits(out, width) and printable(out), width
            assert "\x1b" not in out and "\x07" not in out
            assert "\\x1b[2J" in out       # escaped, not dropped
            plot = report.terminal_plot(rows, metric=metric, width=width)
            assert fits(plot, width) and printable(plot)
    doc = report.svg(rows, HOSTILE, metric=HOSTILE)
    root = ET.fromstring(doc)          # valid XML: no raw control characters, everything escaped
    assert "\x1b" not in doc and "\x07" not in doc
    assert root.find(f"{SVG}title").text.startswith("dispatch report: \\x1b[2J")
    assert json.loads(json.dumps(report.report_json(rows, HOSTILE)))["runs"][0]["name"] == HOSTILE + "101"


def test_a_metric_is_summarised_instead_of_the_wall_time_and_runs_without_it_are_counted():
    rows = [row(101 + i, 10.0 + i, metrics={"gflops": {"values": [80.0, 90.0 + i], "last": 90.0 + i,
                                                       "unit": "GFLOP/s"}}) for i in range(6)]
    rows[2]["metrics"] = {}
    rows[4]["metrics"] = {"other": {"values": [1.0], "last": 1.0, "unit": "s"}}
    out = report.format_report(rows, "x", metric="gflops", width=100)
    assert "figure: metric gflops (GFLOP/s), the last value each run wrote; 2 of 6 lack it: 103, 105" in out
    runs = table_lines(out)
    assert [line.split()[5] for line in runs] == ["90.00", "91.00", "-", "93.00", "-", "95.00"]
    all_line = next(line for line in out.splitlines() if line.startswith("  all "))
    assert all_line.split()[:3] == ["all", "4", "92.00"]
    doc = report.report_json(rows, "x", metric="gflops")
    assert doc["metric"] == {"name": "gflops", "unit": "GFLOP/s", "units": ["GFLOP/s"], "lacking": [103, 105]}
    assert [r["metric"] for r in doc["runs"]] == [90.0, 91.0, None, 93.0, None, 95.0]
    assert doc["summary"]["all"]["n"] == 4 and doc["summary"]["all"]["median"] == 92.0
    assert report.report_json(rows, "x")["metric"] is None
    assert report.report_json(rows, "x")["summary"]["all"]["median"] == pytest.approx(12.5)
    rows[5]["metrics"]["gflops"]["unit"] = "MFLOP/s"
    assert "units differ between runs: GFLOP/s, MFLOP/s" in report.format_report(rows, "x", metric="gflops", width=100)


def test_failed_runs_are_listed_but_never_clean():
    rows = [row(101, 10.0), row(102, 10.1), row(103, 0.2, result="exited", exit="3"),
            row(104, 60.0, result="timeout", exit="timeout"), row(105, 10.2, verdict=None, digest=None)]
    out = report.format_report(rows, "x", width=100)
    runs = table_lines(out)
    assert runs[2].endswith("clean, exit 3") and runs[3].endswith("clean, timeout")
    assert runs[4].endswith("no verdict")
    doc = report.report_json(rows, "x")
    assert doc["summary"]["clean"]["n"] == 2 and doc["summary"]["all"]["n"] == 5
    assert [r["clean"] for r in doc["runs"]] == [True, True, False, False, False]
    assert "no verdict (no record): 1 of 5 runs: 105" in out


def test_times_are_shown_in_the_zone_given():
    plus2 = timezone(timedelta(hours=2), "CEST")
    out = report.format_report([row(101, 1.0)], "x", local=lambda t: datetime.fromtimestamp(t, plus2))
    assert table_lines(out)[0].split()[1:3] == ["2025-12-01", "12:10:00"]
    assert "started (CEST)" in out
    mixed = [row(101, 1.0), row(102, 1.0)]
    zones = {T0 + 600: timezone.utc, T0 + 1200: plus2}
    out = report.format_report(mixed, "x", local=lambda t: datetime.fromtimestamp(t, zones[t]))
    assert [line.split()[3] for line in table_lines(out)] == ["UTC", "CEST"]      # two zones: each row says its own


def test_noisy_and_unknown_runs_are_counted_per_cause_in_a_few_words():
    rows = twenty()
    rows[0].update(verdict="unknown", causes=["unknown:cpufreq", "unknown:throttle_counters"])
    rows[1].update(verdict="unknown", causes=["unknown:cpufreq"])
    rows[2].update(verdict="noisy", causes=[])          # a verdict from before causes
    doc = report.report_json(rows, "x")
    assert doc["noisy"] == {"count": 6, "ids": [103, 104, 108, 111, 115, 119],
                            "by_cause": {"device_interrupts": 3, "others_cpu_fraction": 2, "others_l3_fraction": 1,
                                         "unstated": 1}}
    assert doc["unknown"] == {"count": 2, "ids": [101, 102],
                              "by_cause": {"unknown:cpufreq": 2, "unknown:throttle_counters": 1}}
    out = report.format_report(rows, "x", width=120)
    assert "unknown: 2 of 20 runs; runs per cause: no cpufreq 2, no throttle counters 1" in out
    assert "cause not given 1" in out


def test_cause_words_cover_the_verdicts_thresholds_and_fall_back_to_the_name():
    assert set(shepherd_verdict.THRESHOLDS) <= set(reportruns.CAUSE_WORDS)
    assert reportruns.cause_words("device_interrupts") == "device IRQs"
    assert reportruns.cause_words("others_cpu_fraction") == "busy CPU"
    assert reportruns.cause_words("others_l3_fraction") == "L3 neighbours"
    assert reportruns.cause_words("unknown:gpu_clocks") == "gpu clocks not known"
    assert reportruns.cause_words("a_new_threshold") == "a_new_threshold"
    assert len(reportruns.cause_words("z" * 500)) == reportruns.CAUSE_CUT


def test_json_has_the_documented_fields():
    doc = report.report_json(twenty(), "name bench")
    json.dumps(doc, allow_nan=False)
    assert set(doc) == {"selection", "metric", "runs", "summary", "outliers", "comparable", "noisy", "unknown"}
    assert set(doc["runs"][0]) == {"id", "name", "started", "wall_s", "cpu_s", "verdict", "cause", "causes", "exit",
                                   "clean", "setup_digest", "setup_differs", "outlier", "metric"}
    assert doc["runs"][3]["cause"] == "device_interrupts" and doc["runs"][3]["verdict"] == "noisy"
    stats = {"n", "median", "q1", "q3", "iqr", "min", "max", "mean", "stdev", "cv"}
    assert set(doc["summary"]["all"]) == stats and set(doc["summary"]["clean"]) == stats
    assert doc["summary"]["all"]["n"] == 20 and doc["summary"]["clean"]["n"] == 15
    assert doc["summary"]["quantiles"] == series.QUANTILE_METHOD
    assert doc["outliers"]["method"] == series.OUTLIER_METHOD and 113 in doc["outliers"]["ids"]
    assert doc["comparable"]["same_setup"] is True and doc["comparable"]["setup_digests"] == {D1: list(range(101, 121))}


def test_the_json_fields_are_in_docs_json_md():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text()
    section = text[text.index("### `dispatch report --json`"):]
    doc = report.report_json(twenty(), "x", metric="gflops")
    names = set(doc) | set(doc["runs"][0]) | set(doc["summary"]) | set(doc["summary"]["all"]) | \
        set(doc["outliers"]) | set(doc["comparable"]) | set(doc["noisy"]) | set(doc["metric"])
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, missing


# -- the terminal plot -------------------------------------------------------------------

def test_the_plot_has_one_mark_a_run_by_verdict_and_no_colour_unless_asked():
    rows = twenty()
    rows[0].update(verdict="unknown", causes=["unknown:cpufreq"])
    plain = report.terminal_plot(rows, width=80)
    assert "\x1b" not in plain and fits(plain, 80)
    lines = plain.splitlines()
    area = [line for line in lines if re.match(r"^ *[0-9.]* \|", line)]
    assert len(area) == 10
    assert area[0].startswith("15.38 |") and area[-1].startswith("12.30 |")
    body = "".join(line.split("|", 1)[1] for line in area)
    assert body.count("x") == 5 and body.count("o") == 14 and body.count("?") == 1
    assert lines[-1].split() == ["101", "120"] and set(lines[-2].strip()) == {"+", "-"}
    coloured = report.terminal_plot(rows, width=80, colour=True)
    assert "\x1b[31mx\x1b[0m" in coloured and "\x1b[32mo\x1b[0m" in coloured and "\x1b[33m?\x1b[0m" in coloured
    assert ANSI.sub("", coloured).splitlines() == [line for line in lines]


def test_a_crowded_plot_still_fits_and_says_so():
    rows = [row(1000 + i, 5.0 + (i % 7) * 0.01, "noisy" if i % 10 == 0 else "clean") for i in range(300)]
    for width in (40, 80):
        plot = report.terminal_plot(rows, width=width)
        assert fits(plot, width)
        assert "300 runs in" in plot
        assert "x" in plot        # a noisy run sharing a column with clean ones shows


def test_huge_tiny_and_odd_figures_neither_crash_nor_overflow_the_width():
    walls = [1e150, -1e150, 1e-300, 1e300, 2 ** 2000, "12", True, float("nan"), 3.0]
    rows = [row(101 + i, 1.0) for i in range(len(walls))]
    for r, wall in zip(rows, walls):
        r["wall_s"], r["cpu_s"] = wall, None
    rows[0]["started"], rows[1]["started"] = 1e150, -1e20      # no calendar has them
    out = report.format_report(rows, "x", width=60)
    assert fits(out, 60) and printable(out)
    runs = [line.split() for line in out.splitlines() if re.match(r"\s*1\d\d\s", line)]
    assert [r[1] for r in runs[:3]] == ["-", "-", "2025-12-01"]
    # a run without a figure: "-", and left out of the summary
    assert [r[-3] for r in runs] == ["1e+150", "-1e+150", "0", "-", "-", "-", "-", "-", "3"]
    assert next(line for line in out.splitlines() if line.startswith("  all ")).split()[1] == "4"
    assert "figure: wall time (s); 5 of 9 lack it: 104-108" in out
    plot = report.terminal_plot(rows, width=60)
    assert fits(plot, 60) and "1e+150" in plot and "-1e+150" in plot
    ET.fromstring(report.svg(rows, "x"))
    json.dumps(report.report_json(rows, "x"), allow_nan=False)


def test_the_plot_of_one_figure_repeated_and_of_runs_without_the_figure():
    same = [row(101 + i, 7.0) for i in range(4)]
    plot = report.terminal_plot(same, width=60)
    area = [line.split("|", 1)[1] for line in plot.splitlines() if "|" in line]
    assert fits(plot, 60) and "".join(area).count("o") == 4 and area[5].startswith("o..o")     # in the middle
    lacking = report.terminal_plot([row(101, 1.0), row(102, 2.0)], metric="gflops", width=60)
    assert "nothing to plot: no run has the figure" in lacking


# -- the SVG ------------------------------------------------------------------------------

def _points(root):
    return [e for e in root.iter() if "run" in (e.get("class") or "").split()]


def test_the_svg_is_a_standalone_document_with_a_point_a_run():
    rows = twenty()
    rows[0].update(verdict="unknown", causes=["unknown:cpufreq"])
    doc = report.svg(rows, "name bench & <friends>")
    assert doc.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg"')
    root = ET.fromstring(doc)
    assert root.tag == f"{SVG}svg" and root.get("version") == "1.1"
    points = _points(root)
    assert len(points) == 20
    kinds = [p.get("class").split()[1] for p in points]
    assert kinds.count("noisy") == 5 and kinds.count("unknown") == 1 and kinds.count("clean") == 14
    assert {p.tag for p in points} == {f"{SVG}circle", f"{SVG}path", f"{SVG}polygon"}
    assert points[3].find(f"{SVG}title").text == "run 104: 13.32 s, noisy (device_interrupts)"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "name bench & <friends>" in texts and "wall time (s)" in texts
    assert {"clean", "noisy", "unknown or no verdict", "median of clean runs", "IQR of clean runs"} <= set(texts)
    assert "run (job id), in id order" in texts
    assert root.find(f".//{SVG}line[@class='median']") is not None
    assert root.find(f".//{SVG}rect[@class='iqr']") is not None
    # nothing from elsewhere, nothing that runs
    assert not any(e.tag in (f"{SVG}script", f"{SVG}image", f"{SVG}foreignObject", f"{SVG}style")
                   for e in root.iter())
    assert not any("href" in k for e in root.iter() for k in e.attrib)
    assert "url(" not in doc and "javascript" not in doc.lower()


def test_the_svg_median_line_sits_at_the_clean_median():
    rows = twenty()
    root = ET.fromstring(report.svg(rows, "x"))
    median = float(root.find(f".//{SVG}line[@class='median']").get("y1"))
    clean = [p for p in _points(root) if "clean" in p.get("class")]
    at_median = [float(p.get("cy")) for p, r in zip(clean, [r for r in rows if r["verdict"] == "clean"])
                 if r["wall_s"] == pytest.approx(series.describe(
                     [x["wall_s"] for x in rows if x["verdict"] == "clean"]).median)]
    assert at_median and all(abs(y - median) < 0.2 for y in at_median)


def test_without_clean_runs_there_is_no_median_line():
    rows = [row(101 + i, 3.0 + i, "noisy", ["swap_pages"]) for i in range(3)]
    root = ET.fromstring(report.svg(rows, "x"))
    assert root.find(f".//{SVG}line[@class='median']") is None and len(_points(root)) == 3


# -- --plot FILE ----------------------------------------------------------------------------

def test_only_svg_is_written():
    assert report.plot_format("runs.svg") == "svg"
    assert report.plot_format("/tmp/Runs.SVG") == "svg"
    for bad, said in (("runs.png", "'.png' given"), ("runs", "no suffix given"), (".svg", "no suffix given"),
                      ("dir.svg/runs.pdf", "'.pdf' given")):
        with pytest.raises(ValueError, match="only SVG is written") as exc:
            report.plot_format(bad)
        assert said in str(exc.value)
    with pytest.raises(ValueError) as exc:
        report.plot_format("a\nb.png")
    assert "\n" not in str(exc.value)

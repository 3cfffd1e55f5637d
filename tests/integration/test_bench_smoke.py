"""bench/run --smoke: every figure of docs/benchmarks.md is still produced, so the suite cannot rot.

Tiny sizes and few runs through real scratch daemons; nothing here is about
speed. Each figure must come with a value, or be n/a with the reason said
where the bench cannot measure it (no `--array` yet, the VM row). The run
never installs task-spooler (scripts/test does, when it can); when `tsp` is
here its baseline must have been measured.
"""

import hashlib
import json
import os
import subprocess
import sys

import pytest
from conftest import kill_shepherds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "bench", "run")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")

# Rows the bench may leave n/a, and the word its reason must contain.
MAY_BE_MISSING = {"drain_array": "--array", "drain_norecords": "--array", "drain_unpinned": "--array", "vm": "VM",
                  "bench_start": "2 CPUs", "bench_wakeups": "2 CPUs", "shepherd_pss_many": "CPUs"}

pytestmark = pytest.mark.timeout(300)


def _digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def _has_task_spooler():
    r = subprocess.run(["sh", "-c", "tsp -h"], capture_output=True, text=True)
    return "spooler" in (r.stdout + r.stderr).lower()


def _bench(*args, timeout=240):
    return subprocess.run([sys.executable, RUN, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_smoke_run_produces_every_figure(users, scratch):
    md, js = os.path.join(scratch, "bench.md"), os.path.join(scratch, "bench.json")
    docs_before = _digest(DOCS)
    try:
        r = _bench("--smoke", "--no-install", "--output", md, "--json", js, "--scratch", scratch)
    finally:
        kill_shepherds(scratch)
    assert r.returncode == 0, f"bench/run --smoke exited {r.returncode}\n{r.stderr[-4000:]}"
    assert _digest(DOCS) == docs_before, "a smoke run must not touch docs/benchmarks.md"
    assert not [d for d in os.listdir(scratch) if d.startswith("hpcb-bench-")], "scratch directory left behind"

    with open(js) as f:
        report = json.load(f)
    with open(md) as f:
        text = f.read()
    figures = {f["key"]: f for f in report["figures"]}
    for key in ("new", "latency", "drain_array", "drain_floor", "drain_norecords", "drain_unpinned", "drain_loop",
                "shepherd_pss",
                "shepherd_pss_many", "shepherd_rss",
                "shepherd_wakeups", "queue_new", "queue_list", "output", "restart", "vm", "wait",
                "bench_start", "bench_wakeups", "record_start"):
        assert key in figures, f"figure {key} is gone from the report"
    for key, fig in figures.items():
        assert fig["complete"], f"{key}: neither a value nor a reason"
        if fig["value"] is None:
            word = MAY_BE_MISSING.get(key)
            assert word and word in (fig["missing"] or ""), f"{key} was not measured: {fig['missing']}"
        else:
            v = fig["value"]
            assert v["n"] >= 1 and v["min"] <= v["median"] <= v["max"], f"{key}: {v}"
        if fig["baseline_label"] and key != "drain_floor":
            assert fig["baseline"] is not None, f"{key}: no baseline: {fig['baseline_missing']}"
    if _has_task_spooler():
        assert figures["drain_floor"]["baseline"] is not None, figures["drain_floor"]["baseline_missing"]
    else:
        assert "task-spooler" in figures["drain_floor"]["baseline_missing"]
    # Rows (3), (3b) and (3c) are judged against the design floor (3a), measured in the same run.
    assert figures["drain_array"]["baseline"] == figures["drain_floor"]["value"]
    assert figures["drain_norecords"]["baseline"] == figures["drain_floor"]["value"]
    assert figures["drain_unpinned"]["baseline"] == figures["drain_floor"]["value"]
    assert [figures[k]["number"] for k in ("drain_array", "drain_floor", "drain_norecords", "drain_unpinned",
                                           "drain_loop")] == ["3", "3a", "3b", "3c", "4"]

    # The markdown: one table row per figure, with the machine and the command that made it.
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| figure ")]
    assert len(rows) == len(figures)
    for fig, row in zip(report["figures"], rows):
        assert row.startswith(f"| {fig['label']} ("), row
        assert len(row.split(" | ")) == 6, row
    assert "bench/run --smoke --no-install --output" in text
    for name in ("CPU", "cores", "memory", "kernel", "python", "date", "scratch file system"):
        assert f"- {name}: " in text
    assert "- scratch file system: unknown" not in text      # the scratch directory is on some mount


@pytest.mark.parametrize("args,says", [
    (["--smoke"], "--smoke needs --output"),
    (["--smoke", "--output", DOCS], "must not write docs/benchmarks.md"),
    (["--only", "client,nonsense"], "--only takes group names"),
    (["--runs", "0"], "--runs must be at least 1"),
])
def test_bad_command_lines_are_refused_in_one_line(args, says):
    docs_before = _digest(DOCS)
    r = _bench(*args, timeout=60)
    assert r.returncode == 2
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _digest(DOCS) == docs_before


# --- bench/verdict: how often the record's verdict is right ----------------------------------------------------

VERDICT = os.path.join(ROOT, "bench", "verdict")
KINDS = ("quiet", "busy", "membw", "irq", "sibling", "swap", "throttle")


def _verdict(*args, timeout=280):
    return subprocess.run([sys.executable, VERDICT, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_verdict_smoke_gives_the_table_and_names_what_it_cannot_measure(users, scratch):
    md, js = os.path.join(scratch, "verdict.md"), os.path.join(scratch, "verdict.json")
    docs_before = _digest(DOCS)
    try:
        r = _verdict("--smoke", "--output", md, "--json", js, "--scratch", scratch)
    finally:
        kill_shepherds(scratch)
    assert r.returncode == 0, f"bench/verdict --smoke exited {r.returncode}\n{r.stderr[-4000:]}"
    assert _digest(DOCS) == docs_before
    assert not [d for d in os.listdir(scratch) if d.startswith("hpcb-verdict-")], "scratch directory left behind"
    with open(js) as f:
        report = json.load(f)
    with open(md) as f:
        text = f.read()

    # Every kind is either measured (its rows) or named as not measured with the reason; never both.
    rows = report["table"]["rows"]
    measured = {row["kind"] for row in rows} - {"all injected"}
    not_measured = report["not_measured"]
    assert measured | set(not_measured) == set(KINDS) and not measured & set(not_measured), (measured, not_measured)
    assert {"quiet", "busy"} <= measured
    assert "throttle" in not_measured                       # never injected on purpose
    with open("/proc/swaps") as f:
        if len(f.read().strip().splitlines()) < 2:
            assert "no swap space" in not_measured["swap"]
    smt = open("/sys/devices/system/cpu/smt/control").read().strip() if os.path.exists(
        "/sys/devices/system/cpu/smt/control") else "notsupported"
    if smt in ("notsupported", "off", "forceoff", "notimplemented"):
        assert "no SMT sibling" in not_measured["sibling"]
    for kind, why in not_measured.items():
        line = next(x for x in text.splitlines() if x.startswith(f"| all | {kind} | "))
        assert line.split(" | ")[2:4] == ["0", f"not measured: {why}"] and "%" not in line.replace(why, "")

    # The table's shape: per workload its quiet row, each measured kind, the injected kinds pooled.
    workloads = ("cpu", "memory")
    assert [(r["workload"], r["kind"]) for r in rows] == [
        (w, k) for w in workloads for k in [*[k for k in KINDS if k in measured], "all injected"]]
    for row in rows:
        if row["kind"] != "all injected":
            assert row["runs"] == 2, row
        for name in ("called_noisy", "recall", "right_cause", "false_alarms", "missed"):
            share = row[name]
            assert 0 <= share["num"] <= share["den"] <= row["runs"], (name, row)
    assert all(r["time_s"] > 0 and r["verdict"] in ("clean", "noisy", "unknown") for r in report["runs"])
    assert all(len(r["causes"]) == len(r["reasons"]) for r in report["runs"])
    head = "| workload | kind | runs | median slowdown | called noisy | recall | right cause | false alarms | missed |"
    assert head in text and "All runs together: recall " in text
    assert "bench/verdict --smoke --output" in text and "- CPU: " in text


@pytest.mark.parametrize("args,says", [
    (["--kinds", "busy,nonsense"], "--kinds takes names from"),
    (["--workloads", "gpu"], "--workloads takes cpu and memory"),
    (["--thresholds", "device_irqs_per_cpu_s=1"], "--thresholds judges the runs of --from-json"),
])
def test_verdict_bad_command_lines_are_refused_in_one_line(args, says):
    r = _verdict(*args, timeout=60)
    assert r.returncode == 2
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

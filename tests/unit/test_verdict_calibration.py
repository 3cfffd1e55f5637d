"""bench/verdict's arithmetic (benchkit/calibration.py) and the pure parts of its runs (benchkit/verdictrun.py).

The table is the issue's: recall (of the runs more than 2 % slower than the
quiet median, the share called noisy), right cause (of those, the share
whose causes name the kind injected), false alarms (of the runs within 1 %,
the share called noisy), missed (of the runs called clean or unknown, the
share more than 2 % slower); a share with nothing to count is n/a.
"""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "bench"))

from benchkit import calibration, verdictrun
from benchkit.calibration import Share

from shepherd.record import verdict


def run(kind, time_s, called, causes=(), workload="cpu", **figures):
    return {"workload": workload, "kind": kind, "time_s": time_s, "verdict": called, "causes": list(causes),
            "figures": figures}


QUIET = [run("quiet", t, "unknown", ["unknown:cpufreq"]) for t in (1.00, 1.00, 1.005, 0.995, 1.03)]


def by_kind(tab, workload="cpu"):
    return {r["kind"]: r for r in tab["rows"] if r["workload"] == workload}


def test_shares_say_na_with_nothing_to_count():
    assert Share(0, 0).text() == "n/a" and Share(0, 0).value is None
    assert Share(19, 20).text() == "95% (19/20)" and Share(19, 20).value == 0.95
    assert Share(0, 3).as_dict() == {"num": 0, "den": 3, "value": 0.0}


def test_the_four_figures_of_a_kind():
    busy = [run("busy", 1.5, "noisy", ["others_cpu_fraction"]),       # slow, noisy, right cause
            run("busy", 1.4, "noisy", ["device_irqs_per_cpu_s"]),     # slow, noisy, wrong cause
            run("busy", 1.3, "unknown", ["unknown:cpufreq"]),          # slow, missed
            run("busy", 1.006, "noisy", ["nivcsw_per_cpu_s"]),         # within 1 %: a false alarm
            run("busy", 1.015, "unknown")]                             # between 1 and 2 %: in neither
    tab = calibration.table(QUIET + busy)
    assert tab["quiet_medians"] == {"cpu": 1.0}
    row = by_kind(tab)["busy"]
    assert row["runs"] == 5 and row["median_slowdown"] == pytest.approx(0.3)
    assert row["recall"] == Share(2, 3)
    assert row["right_cause"] == Share(1, 2)
    assert row["false_alarms"] == Share(1, 1)
    assert row["missed"] == Share(1, 2)
    assert row["called_noisy"] == Share(3, 5)
    assert row["causes"] == {"device_irqs_per_cpu_s": 1, "nivcsw_per_cpu_s": 1, "others_cpu_fraction": 1}


def test_quiet_runs_have_no_cause_to_name_and_their_false_alarms_count():
    noisy_quiet = [run("quiet", 1.0, "noisy", ["device_irqs_per_cpu_s"]), run("quiet", 1.0, "unknown")]
    row = by_kind(calibration.table(noisy_quiet))["quiet"]
    assert row["false_alarms"] == Share(1, 2)
    assert row["right_cause"] == Share(0, 0) and row["right_cause"].text() == "n/a"
    assert row["recall"].text() == "n/a"              # nothing slower than its own median by 2 %


def test_pooled_rows_and_targets():
    injected = [run("irq", 1.2, "noisy", ["device_irqs_per_cpu_s", "others_cpu_fraction"]) for _ in range(19)]
    injected.append(run("irq", 1.2, "unknown"))
    injected += [run("membw", 1.1, "noisy", ["others_l3_fraction"], workload="memory")] * 2
    injected += [run("quiet", 1.0, "unknown", workload="memory")] * 3
    tab = calibration.table(QUIET + injected)
    kinds = [(r["workload"], r["kind"]) for r in tab["rows"]]
    assert kinds == [("cpu", "quiet"), ("cpu", "irq"), ("cpu", "all injected"),
                     ("memory", "quiet"), ("memory", "membw"), ("memory", "all injected")]
    pooled = tab["all"]
    assert pooled["recall"] == Share(21, 23)             # the slow quiet run counts, and the missed irq run
    assert pooled["right_cause"] == Share(21, 21)        # quiet runs have nothing to name
    assert tab["targets"] == {"recall": False, "right_cause": True, "missed": False}
    assert by_kind(tab)["all injected"]["right_cause"] == Share(19, 19)


def test_untimed_runs_count_only_in_the_verdicts_columns():
    runs = [{**r, "time_s": None} for r in QUIET] + [run("sibling", None, "noisy", ["others_l3_fraction"]),
                                                     run("sibling", None, "unknown")]
    tab = calibration.table(runs)
    row = by_kind(tab)["sibling"]
    assert tab["quiet_medians"] == {}
    assert row["median_slowdown"] is None and row["recall"].text() == "n/a" and row["missed"].text() == "n/a"
    assert row["called_noisy"] == Share(1, 2) and row["noisy_named"] == Share(1, 1)
    text = "\n".join(calibration.markdown(tab, runs, verdict.CAUSE_WORDS, verdicts_only=True))
    assert "| cpu | sibling | 2 | 50% (1/2) | 100% (1/1) | L3 neighbours 1 |" in text
    assert "recall" not in text and "median slowdown" not in text


def test_records_without_causes_are_not_counted_for_the_cause():
    old = [{**run("busy", 1.5, "noisy"), "causes": None}]
    tab = calibration.table(QUIET + old)
    row = by_kind(tab)["busy"]
    assert row["recall"] == Share(1, 1) and row["right_cause"].text() == "n/a" and row["no_causes"] == 1
    assert "no `causes`" in "\n".join(calibration.markdown(tab, QUIET + old, {}))


def test_kinds_not_measured_are_named_never_passed():
    tab = calibration.table(QUIET, {"sibling": "no SMT sibling of CPU 1 outside the job's CPUs (SMT: notsupported)",
                                    "swap": "no swap space (/proc/swaps lists none)"})
    text = "\n".join(calibration.markdown(tab, QUIET, verdict.CAUSE_WORDS))
    rows = [line for line in text.splitlines() if line.startswith("| all | ")]
    assert len(rows) == 2
    for line in rows:
        cells = line.split(" | ")
        assert cells[2] == "0" and cells[3].startswith("not measured: ") and "%" not in line
    assert [r["kind"] for r in tab["rows"]] == ["quiet"]      # and in no row, pooled or not


def test_every_kind_names_causes_the_verdict_can_give():
    for kind in calibration.KINDS:
        assert set(kind.causes) <= set(verdict.THRESHOLDS), kind
    assert calibration.KIND["irq"].causes == ("device_irqs_per_cpu_s", "device_interrupts")
    assert {name for name, _ in calibration.FIGURES} <= set(verdict.THRESHOLDS)


def test_what_an_interrupt_costs():
    irq = [run("irq", 1.10, "noisy", device_irqs_per_cpu_s=2000.0),    # 10 % for 2000/s: 50 us each
           run("irq", 1.03, "noisy", device_irqs_per_cpu_s=1000.0),    # 30 us
           run("irq", 0.99, "unknown", device_irqs_per_cpu_s=1000.0)]  # not slowed: no estimate
    cost = calibration.table(QUIET + irq)["irq_cost_s"]
    assert cost["n"] == 2 and cost["median"] == pytest.approx(40e-6)
    assert calibration.table(QUIET)["irq_cost_s"] is None


def test_the_section_and_its_json():
    runs = QUIET + [run("busy", 1.5, "noisy", ["others_cpu_fraction"], others_cpu_fraction=0.5)]
    report = {"command": "bench/verdict --runs 5", "date": "2026-12-04 08:00 UTC", "machine": [("CPU", "x")],
              "setup": ["jobs on CPU 1"], "notes": ["a note"], "runs": runs,
              "not_measured": {"swap": "no swap"}, "failures": [], "words": verdict.CAUSE_WORDS}
    lines = calibration.section(report)
    assert lines[0] == "## How often the verdict is right"
    text = "\n".join(lines)
    assert "`bench/verdict --runs 5`" in text and "- CPU: x" in text and "- a note" in text
    assert "| cpu | busy | 1 | +50.0% | 100% (1/1) | 100% (1/1) | 100% (1/1) | n/a | n/a | busy CPU 1 |" in text
    assert "| cpu | busy | - | - | 50.0% [50.0%-50.0%] |" in text
    assert "not measured: no swap" in text
    json.dumps(calibration.as_json(calibration.table(runs)))


# --- verdictrun's pure parts -----------------------------------------------------------------------------


@pytest.mark.parametrize("mib", [1, 2, 8])
def test_the_pointer_chase_is_one_cycle_through_every_slot(mib):
    """The memory workload's array, built from arithmetic runs, is a full-period LCG: one cycle."""
    code = verdictrun.WORKLOAD.split("    def work():")[0].replace("sys.argv[1], int(sys.argv[2]), sys.argv[3], "
                                                                 "int(sys.argv[4])", f"'memory', 0, '-', {mib}")
    scope: dict = {}
    exec(code, scope)
    a, n = scope["a"], scope["n"]
    assert len(a) == n == mib * (1 << 20) // 8
    seen, i = 0, 0
    while True:
        i = a[i]
        seen += 1
        if i == 0:
            break
    assert seen == n


def test_the_workload_times_its_work_alone():
    for workload in verdictrun.WORKLOADS:
        out = subprocess.run(verdictrun.job_argv(sys.executable, workload, 1000, "-", 1), capture_output=True,
                             text=True, check=True).stdout
        assert 0 < verdictrun.work_seconds(out) < 5
    with pytest.raises(verdictrun.RunError, match="no timing"):
        verdictrun.work_seconds("Traceback ...\nMemoryError\n")


def test_figures_from_a_records_delta():
    delta = {"cpus": [1], "wall_s": {"value": 2.0, "source": "clock"},
             "interrupts": {"value": {"36": {"total": 600, "desc": "PCI-MSIX 1-edge virtio1-req.0"},
                                      "11": {"total": 50, "desc": "GICv3 27 Level arch_timer"},
                                      "LOC": {"total": 500, "desc": "Local timer interrupts"},
                                      "RES": {"total": 20, "desc": "Rescheduling interrupts"}},
                            "source": "/proc/interrupts"},
             "context_switches": {"value": {"nivcsw": 30, "nvcsw": 2}, "source": "wait4(2) rusage"},
             "others_cpu": {"value": {"job": {"others_fraction": 0.25}, "l3": {"others_fraction": 0.5}},
                            "source": "/proc/stat"},
             "swap": {"value": {"pswpin": 3, "pswpout": 4}, "source": "/proc/vmstat"}}
    f = verdictrun.figures(delta)
    assert f["device_irqs"] == 600 and f["device_irqs_per_cpu_s"] == 300        # arm64's timer is no device
    assert f["ipis_per_cpu_s"] == 10 and f["nivcsw_per_cpu_s"] == 15
    assert f["others_cpu_fraction"] == 0.25 and f["others_l3_fraction"] == 0.5 and f["others_node_fraction"] is None
    assert f["swap_pages"] == 7
    short = verdictrun.figures({**delta, "wall_s": {"value": 0.25, "source": "clock"}})
    assert short["device_irqs_per_cpu_s"] == 600        # as the verdict: over at least RATE_SPAN (1 s)
    assert verdictrun.figures({})["device_irqs_per_cpu_s"] == 0


def test_rejudged_runs_take_the_thresholds_given():
    delta = {"cpus": [1], "wall_s": {"value": 2.0, "source": "clock"},
             "interrupts": {"value": {"36": {"counts": [600], "total": 600, "desc": "x virtio1-req.0"}},
                            "source": "/proc/interrupts"},
             "facts": {"cpufreq": {"value": True, "source": "s"}, "throttle_counters": {"value": True, "source": "s"}},
             "swap": {"value": {"pswpin": 0, "pswpout": 0}, "source": "/proc/vmstat"}}
    runs = [{**run("irq", 1.2, "noisy", ["device_interrupts"]), "delta": delta}]
    assert verdictrun.rejudge(runs, {"device_irqs_per_cpu_s": 400})[0]["verdict"] == "unknown"   # others not seen
    again = verdictrun.rejudge(runs, {"device_irqs_per_cpu_s": 200})[0]
    assert again["causes"] == ["device_irqs_per_cpu_s", "unknown:others_cpu"] and again["verdict"] == "noisy"
    assert again["recorded_verdict"] == "noisy" and again["reasons"][0].startswith("600 device interrupts")
    assert verdictrun.parse_thresholds("device_irqs_per_cpu_s=5,device_interrupts=none") == {
        "device_irqs_per_cpu_s": 5.0, "device_interrupts": None}
    with pytest.raises(ValueError):
        verdictrun.parse_thresholds("no_such=1")


def test_rounds_interleave_every_kind():
    order = verdictrun.interleaved(["cpu", "memory"], ["quiet", "busy"], 2)
    assert order[:4] == [("cpu", "quiet", 0), ("memory", "quiet", 0), ("cpu", "busy", 0), ("memory", "busy", 0)]
    assert len(order) == 8 and order[4] == ("cpu", "quiet", 1)


def test_topology_from_a_sysfs_tree(tmp_path):
    cpu = tmp_path / "devices/system/cpu"
    for n, sib in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        (cpu / f"cpu{n}/topology").mkdir(parents=True)
        (cpu / f"cpu{n}/topology/thread_siblings_list").write_text(sib + "\n")
        (cpu / f"cpu{n}/cache/index3").mkdir(parents=True)
        (cpu / f"cpu{n}/cache/index3/shared_cpu_list").write_text("0-3\n")
        (cpu / f"cpu{n}/cache/index3/size").write_text("32768K\n")
    (cpu / "smt").mkdir()
    (cpu / "smt/control").write_text("on\n")
    sysfs = str(tmp_path)
    assert verdictrun.l3_peers(1, sysfs) == [0, 1, 2, 3] and verdictrun.l3_mib(1, sysfs) == 32
    assert verdictrun.smt_siblings(1, sysfs) == [3] and verdictrun.smt_control(sysfs) == "on"
    inj = verdictrun.Injector("python3", None, "no disk", [0, 1, 2, 3], sysfs)
    assert inj.other_l3_cpu([1], [1, 3]) == 0                 # another core of the L3, not the held sibling
    assert inj.plan("sibling", [1], [1, 3])[1] == {"on": [3], "held": True}
    assert inj.why_not("irq", [1], [1, 3]) == "no disk"
    assert "cannot be injected" in inj.why_not("throttle", [1], [1, 3])
    assert "no thermal throttle counters" in inj.why_not("throttle", [1], [1, 3])
    lone = verdictrun.Injector("python3", None, "", [1], sysfs)
    assert "no CPU shares CPU 1's L3" in lone.why_not("membw", [1], [1, 3])

"""The record's sentinels and verdict: snapshots of fixture trees in the kernel's formats, their delta, the verdict.

Each test copies tests/fixtures/sentinels/intel-8cpu (the start state of a
job on CPUs 2 and 3, L3 0-3, node 0-7, cgroup job-12), takes the start
snapshot, moves the tree's counters the way a run would (rewriting the files
in the kernel's formats), takes the end snapshot and judges the delta.
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from shepherd.base import sysread
from shepherd.record import sentinels, verdict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TREE = FIXTURES / "sentinels" / "intel-8cpu"
CGROUP = "/sys/fs/cgroup/hpc-batch/job-12"
JOB, L3, NODE = [2, 3], [0, 1, 2, 3], list(range(8))
WALL = 3.0        # the run each test pretends took place between the two snapshots
QUIET_OWN = {"nivcsw": 12, "nvcsw": 40}


# --- moving a tree's counters, in the kernel's formats -----------------------------


def _rewrite(path: Path, edit) -> None:
    path.write_text("".join(edit(line) for line in path.read_text().splitlines(keepends=True)))


def add_interrupts(root: Path, name: str, by: dict[int, int]) -> None:
    """Raise line *name* of proc/interrupts on the given CPUs (columns are ``%10u `` after ``<name>: ``)."""
    def edit(line):
        label, colon, rest = line.partition(":")
        if label.strip() != name:
            return line
        for cpu, n in by.items():
            at = 1 + 11 * cpu          # the header here lists CPU0..CPU7 in order
            rest = rest[:at] + "%10d" % (int(rest[at:at + 10]) + n) + rest[at + 10:]
        return label + colon + rest
    _rewrite(root / "proc/interrupts", edit)


STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def add_stat(root: Path, cpu: int, **ticks: int) -> None:
    """Raise counters of proc/stat's ``cpu<cpu>`` line."""
    def edit(line):
        if not line.startswith(f"cpu{cpu} "):
            return line
        name, *values = line.split()
        for field, n in ticks.items():
            i = STAT_FIELDS.index(field)
            values[i] = str(int(values[i]) + n)
        return " ".join([name, *values]) + "\n"
    _rewrite(root / "proc/stat", edit)


def add_keyed(root: Path, rel: str, **by: int) -> None:
    """Raise ``key value`` lines (vmstat, memory.events, cpu.stat)."""
    def edit(line):
        key, _, value = line.partition(" ")
        return f"{key} {int(value) + by[key]}\n" if key in by else line
    _rewrite(root / rel, edit)


def add_psi(root: Path, rel: str, some_usec: int) -> None:
    def edit(line):
        if not line.startswith("some "):
            return line
        total = int(re.search(r"total=(\d+)", line).group(1))
        return re.sub(r"total=\d+", f"total={total + some_usec}", line)
    _rewrite(root / rel, edit)


def add_throttle(root: Path, cpu: int, **by: int) -> None:
    for name, n in by.items():
        path = root / f"sys/devices/system/cpu/cpu{cpu}/thermal_throttle/{name}"
        path.write_text(f"{int(path.read_text()) + n}\n")


def quiet_run(root: Path) -> None:
    """What a quiet 3-second run on CPUs 2-3 leaves: the timer ticking, the job's own CPU time, others elsewhere."""
    add_interrupts(root, "LOC", {2: 3000, 3: 2990})
    add_interrupts(root, "RES", {2: 10, 3: 4})
    add_interrupts(root, "eno1", {7: 5000})               # the network, on a CPU that is not the job's
    add_interrupts(root, "nvme0q1", {0: 80})
    for cpu in JOB:
        add_stat(root, cpu, user=290, system=10)          # 3 s each: the job's 6 s below
    add_stat(root, 7, system=20, softirq=30)              # housekeeping elsewhere on the node
    add_keyed(root, f"{CGROUP.lstrip('/')}/cpu.stat", usage_usec=6_000_000, user_usec=5_800_000,
              system_usec=200_000)
    add_psi(root, f"{CGROUP.lstrip('/')}/cpu.pressure", 1000)
    add_psi(root, "proc/pressure/cpu", 200_000)


@pytest.fixture
def root(tmp_path):
    copy = tmp_path / "root"
    shutil.copytree(TREE, copy, symlinks=True)
    return copy


def run(root: Path, *moves, own=QUIET_OWN, cgroup=CGROUP, cpus=JOB, held=()):
    """Start snapshot, the run's counter moves, end snapshot; the delta as if WALL seconds had passed."""
    src = sysread.Source(str(root))
    start = sentinels.snapshot(src, cpus, NODE, L3, cgroup, held)
    for move in moves:
        move(root)
    end = sentinels.snapshot(src, cpus, NODE, L3, cgroup, held)
    start["time"]["monotonic"]["value"] = end["time"]["monotonic"]["value"] - WALL
    return start, end, sentinels.delta(start, end, own)


# --- snapshots -------------------------------------------------------------------------


def test_snapshot_of_the_fixture(root):
    snap = sentinels.snapshot(sysread.Source(str(root)), [3, 2], NODE, L3, CGROUP)
    assert snap["cpus"] == [2, 3]
    lines = snap["interrupts"]["value"]["lines"]
    assert lines["122"] == {"counts": [9120, 1410], "desc": "PCI-MSI-0000:00:17.0 2-edge nvme0q2"}
    assert lines["LOC"]["counts"] == [18223410, 18011234]
    assert "121" not in lines and "TRM" not in lines      # zero on both job CPUs: left out
    assert "ERR" not in lines and "MIS" not in lines      # machine-wide counts, not per CPU
    assert snap["interrupts"]["source"] == "/proc/interrupts"
    busy = snap["cpu_busy"]["value"]
    assert busy["job"] == {"busy": 601223 + 990 + 150112 + 2201 + 598110 + 1001 + 149887 + 2012, "steal": 0}
    assert snap["throttle"]["value"]["2"]["package_throttle_count"] == 5
    assert snap["vmstat"] == {"value": {"pswpin": 1021, "pswpout": 3310}, "source": "/proc/vmstat"}
    assert snap["pressure"]["memory"]["value"] == {"some": 2201334, "full": 1102223}
    assert snap["cgroup"]["cpu.stat"]["value"]["usage_usec"] == 1200
    assert snap["cgroup"]["memory.events"]["source"] == CGROUP + "/memory.events"   # the machine path
    assert snap["facts"]["cpufreq"]["value"] is True
    assert snap["facts"]["throttle_counters"]["value"] is True
    json.dumps(snap)


def test_the_real_interrupts_recording_parses():
    text = (FIXTURES / "quiet/dev-container-real/proc/interrupts").read_text()
    parsed = sentinels.interrupts(text, [1])
    assert parsed["lines"]["36"] == {"counts": [1331658], "desc": "PCI-MSIX-0000:00:02.0 1-edge virtio1-req.0"}
    assert parsed["lines"]["LOC"] == {"counts": [552550], "desc": "Local timer interrupts"}
    assert parsed["lines"]["42"]["desc"] == "PCI-MSIX-0000:00:04.0 2-edge virtio3-tx"
    assert "41" not in parsed["lines"]                    # 3811 on CPU 0, none on CPU 1
    assert "ERR" not in parsed["lines"] and "MIS" not in parsed["lines"]
    assert "ERR" not in sentinels.interrupts(text, [0])["lines"]


def test_an_offline_cpu_has_no_column():
    text = ("           CPU0       CPU2       CPU3       \n"
            " 24:          5          6          7   IO-APIC   5-edge      nvme0q1\n"
            "LOC:        100        200        300   Local timer interrupts\n"
            "ERR:          4\n")
    parsed = sentinels.interrupts(text, [1, 3])
    assert parsed["lines"]["24"]["counts"] == [None, 7]
    assert parsed["lines"]["LOC"]["counts"] == [None, 300]
    assert "ERR" not in parsed["lines"]
    assert sentinels.interrupts(text, [5])["lines"] == {}


def test_other_layouts_are_split_and_full_width_counts_read():
    # arm64 prints its IPI lines with the counts right after the colon (no space of their own), and a
    # count of 10 digits fills its column: both must still give each CPU its own count.
    text = ("           CPU0       CPU1       CPU2       \n"
            " 11: 4294967295       7000       7001     GICv3  27 Level     arch_timer\n"
            "IPI0:       120        130        140       Rescheduling interrupts\n"
            "IPI5:         0          0          0       Timer broadcast interrupts\n"
            "Err:          0\n")
    lines = sentinels.interrupts(text, [0, 2])["lines"]
    assert lines["11"] == {"counts": [4294967295, 7001], "desc": "GICv3 27 Level arch_timer"}
    assert lines["IPI0"] == {"counts": [120, 140], "desc": "Rescheduling interrupts"}
    assert "IPI5" not in lines and "Err" not in lines


def test_missing_files_give_null_with_a_reason_never_an_exception(tmp_path):
    src = sysread.Source(str(tmp_path))
    start = sentinels.snapshot(src, JOB, NODE, L3, CGROUP)
    for key in ("interrupts", "cpu_busy", "throttle", "vmstat"):
        assert start[key]["value"] is None and start[key]["error"], key
    assert start["pressure"]["io"] == {"value": None, "source": "/proc/pressure/io",
                                       "error": "No such file or directory"}
    assert start["cgroup"]["cpu.stat"]["value"] is None
    assert start["facts"]["cpufreq"]["value"] is False
    d = sentinels.delta(start, sentinels.snapshot(src, JOB, NODE, L3, CGROUP), QUIET_OWN)
    assert d["interrupts"]["value"] is None and d["interrupts"]["error"].startswith("start: ")
    assert d["others_cpu"]["value"] is None
    v = verdict.judge(d)
    assert v["verdict"] == "unknown"
    assert any("interrupts on the job's CPUs not known" in r for r in v["reasons"])
    json.dumps(v)


def test_an_unreadable_file_is_null_with_a_reason(root):
    (root / "proc/vmstat").write_text("nr_free_pages 3\n")
    (root / "proc/stat").write_text("intr 0\n")
    snap = sentinels.snapshot(sysread.Source(str(root)), JOB, NODE, L3, CGROUP)
    assert snap["vmstat"]["error"] == "ValueError: no pswpin, pswpout"
    assert snap["cpu_busy"]["error"] == "ValueError: no per-CPU lines"


# --- verdicts ----------------------------------------------------------------------------


def test_a_quiet_run_is_clean(root):
    start, end, d = run(root, quiet_run)
    assert d["wall_s"]["value"] == WALL
    moved = d["interrupts"]["value"]
    assert moved["LOC"] == {"counts": [3000, 2990], "total": 5990, "desc": "Local timer interrupts",
                            "per_s": round(5990 / WALL, 3)}
    assert set(moved) == {"LOC", "RES"}                   # eno1 and nvme0q1 moved on other CPUs only
    others = d["others_cpu"]["value"]
    assert others["job"]["others_s"] == 0.0
    assert others["node"]["others_s"] == pytest.approx(0.5)
    assert d["cgroup"]["cpu.stat"]["value"]["usage_usec"] == 6_000_000
    assert d["context_switches"]["value"]["nivcsw_per_cpu_s"] == 2.0
    v = verdict.judge(d)
    assert v == {"verdict": "clean", "reasons": [], "causes": [], "thresholds": verdict.THRESHOLDS, "notes": []}
    json.dumps(d)


def test_interrupts_on_the_jobs_cpus_are_judged_by_their_rate_naming_them(root):
    limit = verdict.THRESHOLDS["device_irqs_per_cpu_s"]
    many = int(limit * WALL * len(JOB)) + 15             # just over the rate, over the 3 s on 2 CPUs
    def nvme(r):
        add_interrupts(r, "122", {3: many - 3})
        add_interrupts(r, "130", {2: 3})
    v = verdict.judge(run(root, quiet_run, nvme)[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"] == [f"{many} device interrupts on CPUs 2-3 (IRQ 122 nvme0q2: {many - 3}, IRQ 130 eno1: 3) "
                            f"in 3 s: {verdict._num(many / WALL / 2)} per CPU-second, more than {limit}"]
    assert v["causes"] == ["device_irqs_per_cpu_s"]


def test_a_few_device_interrupts_are_no_noise_unless_the_count_is_judged(root):
    # A few disk interrupts (a VM's managed IRQ that cannot be steered) cost the run nothing measurable:
    # the rate is judged; the old count (device_interrupts) only when an admin sets it.
    _, _, d = run(root, quiet_run, lambda r: add_interrupts(r, "122", {3: 12}))
    assert verdict.THRESHOLDS["device_interrupts"] is None
    assert verdict.judge(d)["verdict"] == "clean"
    v = verdict.judge(d, {"device_interrupts": 0})
    assert v["verdict"] == "noisy" and v["causes"] == ["device_interrupts"]
    assert v["reasons"] == ["12 device interrupts on CPUs 3 (IRQ 122 nvme0q2: 12) in 3 s, more than 0"]
    assert verdict.judge(d, {"device_irqs_per_cpu_s": 5})["verdict"] == "clean"     # 12 / 3 s / 2 CPUs = 2
    assert verdict.judge(d, {"device_irqs_per_cpu_s": 1.9})["causes"] == ["device_irqs_per_cpu_s"]


def test_thermal_and_machine_check_interrupts_are_noisy(root):
    v = verdict.judge(run(root, quiet_run, lambda r: add_interrupts(r, "TRM", {2: 1}))[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"] == ["1 thermal or machine-check interrupts on CPUs 2 (TRM: 1) in 3 s, more than 0"]
    assert v["causes"] == ["error_interrupts"]


def test_an_ipi_storm_is_noisy_and_the_usual_trickle_is_not(root):
    v = verdict.judge(run(root, quiet_run, lambda r: add_interrupts(r, "CAL", {2: 6000, 3: 1000}))[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"][0].startswith("7014 inter-processor interrupts on CPUs 2-3 (CAL: 7000, RES: 14) in 3 s: "
                                      "1.17e+03 per CPU-second")
    assert v["causes"] == ["ipis_per_cpu_s"]


def test_rising_throttle_counters_are_noisy(root):
    def hot(r):
        add_throttle(r, 3, core_throttle_count=2, core_throttle_total_time_ms=40)
        for cpu in range(8):        # the package's counters read the same from every CPU of it
            add_throttle(r, cpu, package_throttle_count=1, package_throttle_total_time_ms=15)
    _, _, d = run(root, quiet_run, hot)
    assert d["throttle"]["value"]["core_throttle_count"] == {"2": 0, "3": 2}
    v = verdict.judge(d)
    assert v["verdict"] == "noisy"
    assert v["reasons"] == ["thermal throttling on CPUs 2-3: core 2 events (40 ms), package 1 events (15 ms) in 3 s, "
                            "more than 0 events"]
    assert v["causes"] == ["throttle_events"]


def test_throttling_elsewhere_in_time_only_still_counts(root):
    v = verdict.judge(run(root, quiet_run, lambda r: add_throttle(r, 2, core_throttle_total_time_ms=5))[2])
    assert v["verdict"] == "noisy" and "core 0 events (5 ms)" in v["reasons"][0]


def test_swap_activity_is_noisy(root):
    v = verdict.judge(run(root, quiet_run, lambda r: add_keyed(r, "proc/vmstat", pswpin=120, pswpout=30))[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"] == ["swapping on the machine: 120 pages in, 30 out (/proc/vmstat) in 3 s, more than 0"]
    assert v["causes"] == ["swap_pages"]


def test_memory_events_and_cpu_max_throttling_are_noisy(root):
    def squeezed(r):
        add_keyed(r, f"{CGROUP.lstrip('/')}/memory.events", high=3, max=1)
        add_keyed(r, f"{CGROUP.lstrip('/')}/cpu.stat", nr_periods=30, nr_throttled=4, throttled_usec=120_000)
        add_psi(r, f"{CGROUP.lstrip('/')}/memory.pressure", 90_000)
    v = verdict.judge(run(root, quiet_run, squeezed)[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"] == [
        "the job's memory.events rose: high 3, max 1 in 3 s, more than 0",
        "cpu.max throttled the job in 4 periods (0.12 s), more than 0",
        "the job's tasks waited for memory 3% of the run (memory.pressure some 0.09 s), more than 1%",
    ]
    assert v["causes"] == ["memory_events", "cpu_throttled_periods", "job_memory_pressure"]


def test_others_cpu_time_on_the_jobs_cpus_is_noisy_beyond_the_ticks_resolution(root):
    v = verdict.judge(run(root, quiet_run, lambda r: add_stat(r, 2, user=30))[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"][0] == ("others used 0.3 s of CPU time on the job's CPUs (2 CPUs) in 3 s: "
                               "5% of their time, more than 2%")
    assert v["causes"][0] == "others_cpu_fraction"
    # Three ticks are within what /proc/stat can tell apart (two ticks a CPU): not judged.
    assert verdict.judge(run(root, quiet_run, lambda r: add_stat(r, 3, steal=3))[2])["verdict"] == "clean"


def test_others_on_the_l3_and_node(root):
    def neighbours(r):
        add_stat(r, 0, user=150)     # 1.5 s of the L3's 12 CPU-seconds: 12.5%
        add_stat(r, 6, user=300)
        add_stat(r, 5, user=100)     # node: 0.5 housekeeping + 1.5 + 3 + 1 = 6 s of 24: 25%, not more
    v = verdict.judge(run(root, quiet_run, neighbours)[2])
    assert v["reasons"] == ["others used 1.5 s of CPU time on the job's L3 (4 CPUs) in 3 s: 12.5% of their time, "
                            "more than 10%"]
    assert v["causes"] == ["others_l3_fraction"]


def test_others_on_a_held_sibling_are_noisy_however_large_the_l3(root):
    # A benchmark job on CPUs 2-3 holds CPUs 5-6 idle (say, their SMT siblings). A busy loop on one of
    # them for the whole run is half of the held CPUs' time, however small a share of an L3 it is.
    _, end, d = run(root, quiet_run, lambda r: add_stat(r, 6, user=300), held=(5, 6))
    assert end["held_cpus"] == [5, 6]
    held = d["others_cpu"]["value"]["held"]
    assert held == {"cpus": 2, "busy_s": 3.0, "others_s": 3.0, "resolution_s": 0.04, "others_fraction": 0.5}
    v = verdict.judge(d)
    assert v["causes"][0] == "others_held_fraction", v
    assert v["reasons"][0] == ("others used 3 s of CPU time on the CPUs the job holds idle (2 CPUs) in 3 s: "
                               "50% of their time, more than 10%")
    # Idle held CPUs (what a quiet run leaves there) are no noise; without held CPUs there is no group.
    assert "others_held_fraction" not in verdict.judge(run(root, quiet_run, held=(5, 6))[2])["causes"]
    assert "held" not in run(root, quiet_run)[2]["others_cpu"]["value"]


def test_involuntary_context_switches_are_noisy_above_the_rate(root):
    v = verdict.judge(run(root, quiet_run, own={"nivcsw": 900, "nvcsw": 3})[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"][0].startswith("the job's processes were preempted 900 times (nivcsw) in 3 s on 2 CPUs: "
                                      f"150 per CPU-second, more than {verdict.THRESHOLDS['nivcsw_per_cpu_s']}")
    assert v["causes"] == ["nivcsw_per_cpu_s"]


def test_no_cpufreq_is_unknown(root):
    cpu = root / "sys/devices/system/cpu"
    for n in range(8):
        (cpu / f"cpu{n}/cpufreq").unlink()
    # The policies still govern the CPUs: that is enough.
    assert verdict.judge(run(root, quiet_run)[2])["verdict"] == "clean"
    shutil.rmtree(cpu / "cpufreq")
    _, _, d = run(root, quiet_run)
    assert d["facts"]["cpufreq"]["value"] is False
    v = verdict.judge(d)
    assert v["verdict"] == "unknown"
    assert v["reasons"] == ["no cpufreq for CPUs 2-3 (a VM?): their clock is not known"]
    assert v["causes"] == ["unknown:cpufreq"]


def test_no_throttle_counters_is_unknown_and_noise_still_wins(root):
    for n in range(8):
        shutil.rmtree(root / f"sys/devices/system/cpu/cpu{n}/thermal_throttle")
    start, _, d = run(root, quiet_run)
    assert start["throttle"]["error"] == "no thermal_throttle directory for CPUs 2-3"
    v = verdict.judge(d)
    assert v["verdict"] == "unknown"
    assert v["reasons"][0].startswith("no thermal throttle counters for CPUs 2-3")
    v = verdict.judge(run(root, quiet_run, lambda r: add_keyed(r, "proc/vmstat", pswpout=8))[2])
    assert v["verdict"] == "noisy"
    assert v["reasons"][0].startswith("swapping on the machine")
    assert v["reasons"][1].startswith("no thermal throttle counters")
    assert v["causes"] == ["swap_pages", "unknown:throttle_counters"]   # noisy findings first, as the reasons


def test_one_job_cpu_without_throttle_counters_is_unknown(root):
    shutil.rmtree(root / "sys/devices/system/cpu/cpu3/thermal_throttle")
    start, _, d = run(root, quiet_run)
    assert start["throttle"]["value"]["absent"] == [3]
    assert start["facts"]["throttle_counters"]["value"] is False
    assert verdict.judge(d)["verdict"] == "unknown"


def test_without_a_cgroup_the_usage_comes_from_the_rusage(root):
    _, end, d = run(root, quiet_run, own={**QUIET_OWN, "usage_usec": 6_000_000}, cgroup=None)
    assert end["cgroup"]["memory.events"]["error"] == sentinels.NO_CGROUP
    assert d["others_cpu"]["value"]["job"]["others_s"] == 0.0
    v = verdict.judge(d)
    assert v["verdict"] == "clean"
    assert v["notes"][0] == f"memory.events not judged (start: {sentinels.NO_CGROUP})"
    # Without either, others' time is not known: a note, not a reason.
    v = verdict.judge(run(root, quiet_run, cgroup=None)[2])
    assert v["verdict"] == "clean" and any("CPU time of others not judged" in n for n in v["notes"])


def test_thresholds_can_be_raised_or_switched_off(root):
    _, _, d = run(root, quiet_run, lambda r: add_interrupts(r, "122", {3: 12}))
    assert verdict.judge(d, {"device_interrupts": 12})["verdict"] == "clean"
    assert verdict.judge(d, {"device_interrupts": 11})["verdict"] == "noisy"
    off = verdict.judge(d, {"device_interrupts": None})
    assert off["verdict"] == "clean" and off["thresholds"]["device_interrupts"] is None


@pytest.mark.parametrize("overrides", [{"device_irqs": 1}, {"swap_pages": -1}, {"swap_pages": "0"},
                                       {"swap_pages": True}])
def test_bad_thresholds_are_refused(overrides):
    with pytest.raises(ValueError):
        verdict.check_thresholds(overrides)


def test_every_threshold_is_a_number_or_reported_only():
    assert all(v is None or (isinstance(v, (int, float)) and v >= 0) for v in verdict.THRESHOLDS.values())
    assert [n for n, v in verdict.THRESHOLDS.items() if v is None] == ["device_interrupts"]
    assert verdict.check_thresholds(None) == verdict.THRESHOLDS


def test_every_cause_has_its_words():
    """Each threshold is a cause, and so is each unknown:<what> judge can give; each says itself in a few words."""
    assert set(verdict.THRESHOLDS) <= set(verdict.CAUSE_WORDS)
    unknowns = {c for c in verdict.CAUSE_WORDS if c.startswith(verdict.UNKNOWN)}
    assert set(verdict.CAUSE_WORDS) == set(verdict.THRESHOLDS) | unknowns
    assert all(0 < len(w) <= 24 for w in verdict.CAUSE_WORDS.values())


def test_a_delta_of_another_shape_is_unknown_with_its_cause():
    v = verdict.judge({"cpus": [2], "wall_s": {"value": 1.0, "source": "clock"},
                       "interrupts": {"value": {"9": {"total": "x"}}, "source": "/proc/interrupts"}})
    assert v["verdict"] == "unknown"
    assert v["causes"][0] == "unknown:interrupts" and v["reasons"][0].startswith("could not judge interrupts")
    assert len(v["causes"]) == len(v["reasons"]) and set(v["causes"]) <= set(verdict.CAUSE_WORDS)


def gpu(reasons_end: dict) -> list:
    quiet = {"gpu_idle": {"value": "Not Active", "source": "nvidia-smi --query-gpu"},
             "sw_thermal_slowdown": {"value": "Not Active", "source": "nvidia-smi --query-gpu"}}
    end = {k: {"value": v, "source": "nvidia-smi --query-gpu"} for k, v in reasons_end.items()}
    return [{"uuid": {"value": "GPU-0f1e", "source": "nvidia-smi --query-gpu"},
             "start": {"clocks_event_reasons": quiet}, "end": {"clocks_event_reasons": {**quiet, **end}}}]


def test_a_gpu_slowdown_is_noisy(root):
    _, _, d = run(root, quiet_run)
    assert verdict.judge(d, gpu=gpu({"gpu_idle": "Active"}))["verdict"] == "clean"
    v = verdict.judge(d, gpu=gpu({"sw_thermal_slowdown": "Active", "hw_power_brake_slowdown": "Active"}))
    assert v["verdict"] == "noisy"
    assert v["reasons"] == ["GPU slowdown: GPU-0f1e sw_thermal_slowdown at end, GPU-0f1e hw_power_brake_slowdown "
                            "at end, more than 0"]
    assert v["causes"] == ["gpu_slowdown_reasons"]


@pytest.mark.parametrize("name,desc,kind", [
    ("LOC", "Local timer interrupts", "timer"), ("11", "GICv3 27 Level arch_timer", "timer"),
    ("IPI5", "Timer broadcast interrupts", "timer"), ("IPI0", "Rescheduling interrupts", "ipi"),
    ("RES", "Rescheduling interrupts", "ipi"), ("MCE", "Machine check exceptions", "error"),
    ("122", "PCI-MSI 2-edge nvme0q2", "device"), ("NMI", "Non-maskable interrupts", "other"),
])
def test_line_kinds(name, desc, kind):
    assert verdict.line_kind(name, desc) == kind


def test_on_this_machine():
    src = sysread.Source("/")
    start = sentinels.snapshot(src, [0], [0], [0], None)
    d = sentinels.delta(start, sentinels.snapshot(src, [0], [0], [0], None), {"nivcsw": 0, "nvcsw": 0,
                                                                                "usage_usec": 0})
    assert start["interrupts"]["value"] is not None
    assert start["cpu_busy"]["value"] is not None
    assert verdict.judge(d)["verdict"] in ("clean", "noisy", "unknown")
    json.dumps([start, d])

"""Reading records: dispatch show --record (render) and dispatch record diff (differences, format_diff).

The records are built by hand in the record's schema 1 (docs/record.md):
sections of fields ``{"value", "source"}`` (null ones with ``error``), the
shapes the shepherd's collector writes (frequency policies grouped in a
list, memory per node keyed by node number, the read-back cgroup files,
a GPU list, the sentinels' start/end/delta and the verdict).
"""

import copy
import json

from hpc_batch.client import recorddiff
from hpc_batch.client.recorddiff import Difference, classify, differences, format_diff, render


def f(value, source="/proc/x"):
    return {"value": value, "source": source}


def null(source, error="No such file or directory"):
    return {"value": None, "source": source, "error": error}


def record(job=12, cpus="2-3", policies="2-3", node="0"):
    """A small, complete record of a job on *cpus* (cpufreq *policies*, memory on *node*)."""
    return {
        "schema": 1,
        "job": job,
        "complete": True,
        "collector": {
            "job": f(job, "hpc-batch"), "version": f("0.1.0", "hpc-batch"), "commit": f("50c4f96", "hpc-batch"),
            "schema": f(1, "hpc-batch"), "hostname": f("node1", "/proc/sys/kernel/hostname"),
            "boot_id": f("6f1c7a4e-0b1d-4f1e-9d55-2f8e3c1a9b70", "/proc/sys/kernel/random/boot_id"),
            "uptime_s": f(86400.5 + job, "/proc/uptime"), "utc": f(f"2026-12-01T16:{job:02d}:00.000000Z", "clock"),
            "monotonic_s": f(1000.0 + job, "clock"),
        },
        "kernel": {
            "release": f("6.1.0-18-amd64", "/proc/sys/kernel/osrelease"),
            "cmdline": f("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=UUID=1234 ro quiet isolcpus=2-7 nohz_full=2-7",
                         "/proc/cmdline"),
            "isolated": f("2-7", "/sys/devices/system/cpu/isolated"),
            "nohz_full": null("/sys/devices/system/cpu/nohz_full"),
            "cgroup_mode": f("unified", "/proc/mounts"),
        },
        "cpu": {
            "vendor": f("GenuineIntel", "/proc/cpuinfo"),
            "model_name": f("Intel(R) Xeon(R) Gold 6248", "/proc/cpuinfo"),
            "microcode": f("0x5003604", "/proc/cpuinfo"),
            "smt_active": f(True, "/sys/devices/system/cpu/smt/active"),
            "caches": f([{"level": 3, "type": "Unified", "size": "28160K", "shared_cpu_lists": ["0-19,40-59"]}],
                        "/sys/devices/system/cpu/cpu*/cache/index*/{level,type,size,shared_cpu_list}"),
            "vulnerabilities": {"spectre_v2": f("Mitigation: Enhanced IBRS",
                                                "/sys/devices/system/cpu/vulnerabilities/spectre_v2")},
        },
        "frequency": {
            "available": True,
            "policies": [{"policies": policies, "cpus": cpus, "shared": False,
                          "scaling_driver": f("intel_pstate", "/sys/devices/system/cpu/cpufreq/policy2/scaling_driver"),
                          "scaling_governor": f("performance",
                                                "/sys/devices/system/cpu/cpufreq/policy2/scaling_governor")}],
            "boost": null("/sys/devices/system/cpu/cpufreq/boost"),
            "intel_pstate_no_turbo": f(0, "/sys/devices/system/cpu/intel_pstate/no_turbo"),
        },
        "memory": {
            "nodes": {node: {"mem_total_kb": f(196000000, f"/sys/devices/system/node/node{node}/meminfo"),
                             "mem_free_kb": f(150000000 - job, f"/sys/devices/system/node/node{node}/meminfo")}},
            "thp_enabled": f("madvise", "/sys/kernel/mm/transparent_hugepage/enabled"),
            "swap_free_kb": f(0, "/proc/meminfo"),
        },
        "allocation": {
            "requested": {"cpus": f(2, "request"), "mem": f(8 << 30, "request")},
            "read_back": {"cpus_effective": f(cpus, f"/sys/fs/cgroup/hpc-batch/job-{job}/cpuset.cpus.effective"),
                          "partition": f("member", f"/sys/fs/cgroup/hpc-batch/job-{job}/cpuset.cpus.partition"),
                          "mems_effective": f(node, f"/sys/fs/cgroup/hpc-batch/job-{job}/cpuset.mems.effective"),
                          "memory_max": f(8 << 30, f"/sys/fs/cgroup/hpc-batch/job-{job}/memory.max"),
                          "pids_max": f("max", f"/sys/fs/cgroup/hpc-batch/job-{job}/pids.max")},
        },
        "gpu": [],
        "software": {
            "argv": f(["./bench", "--size", "4096"], "request"),
            "environment": {"keys": f(["HOME", "PATH"], "environment"), "bytes": f(64, "environment"),
                            "sha256": f("a" * 64, "environment"), "submitted_sha256": f("c" * 64, "environment")},
            "pid": f(4000 + job, "fork(2)"),
        },
        "sentinels": {
            "start": {"time": {"monotonic": f(1000.0 + job, "clock")}},
            "end": {"time": {"monotonic": f(1003.1 + job, "clock")}},
            "delta": {"wall_s": 3.1, "interrupts": {}, "pswpin": 0, "pswpout": 0},
        },
        "verdict": {"verdict": "clean", "reasons": [], "thresholds": {"device_irqs": 0, "swap_pages": 0}},
        "digest": f"sha256:{job:064x}",
    }


def gpu(index, uuid, temp, reasons):
    q = "nvidia-smi --query-gpu"
    return {"index": f(index, q), "uuid": f(uuid, q), "name": f("NVIDIA H100 80GB HBM3", q),
            "pci_bus_id": f(f"00000000:{0x18 + index:02X}:00.0", q), "driver_version": f("550.54.15", q),
            "cuda_version": f("12.4", "nvidia-smi -q -d COMPUTE"), "topo": f("X NV18 SYS", "nvidia-smi topo -m"),
            "start": {"temperature_c": f(temp, q), "clocks_event_reasons": {k: f(v, q) for k, v in reasons.items()}},
            "end": {"temperature_c": f(temp + 20, q),
                    "clocks_event_reasons": {k: f(v, q) for k, v in reasons.items()}}}


# -- differences ------------------------------------------------------------------
def test_the_same_job_run_twice_differs_only_in_what_never_counts():
    a, b = record(job=12), record(job=14)
    diffs = differences(a, b)
    assert diffs, "times, ids and the digest differ"
    assert {classify(*d) for d in diffs} <= {"ignored", "run"}
    out = format_diff(diffs, "job 12", "job 14")
    assert out.splitlines()[0] == ("comparable: same machine, kernel, CPU, frequency, memory, allocation shape, "
                                   "IRQs, GPUs and software")
    assert max(len(line) for line in out.splitlines()) <= recorddiff.WIDTH
    assert "job 12" in out.splitlines()[1] and "job 14" in out.splitlines()[2]
    for hidden in ("utc", "monotonic", "uptime", "digest", "pid", "boot_id"):
        assert hidden not in out
    assert "mem_free_kb: 149999988 | 149999986" in out      # state at the start: reported, apart


def test_values_compare_never_sources_or_reasons():
    a, b = record(), record()
    b["kernel"]["release"]["source"] = "uname(2)"
    b["kernel"]["nohz_full"]["error"] = "Permission denied"
    assert differences(a, b) == []


def test_a_field_that_could_not_be_read_differs_from_one_that_was():
    a, b = record(), record()
    b["kernel"]["nohz_full"] = f("2-7", "/sys/devices/system/cpu/nohz_full")
    assert differences(a, b) == [Difference("kernel", "nohz_full", None, "2-7")]


def test_environments_differing_by_one_key_are_not_comparable_and_say_which_key():
    a, b = record(), record()
    b["software"]["environment"] = {"keys": f(["HOME", "OMP_NUM_THREADS", "PATH"], "environment"),
                                    "bytes": f(82, "environment"), "sha256": f("b" * 64, "environment"),
                                    "submitted_sha256": f("d" * 64, "environment")}
    diffs = differences(a, b)
    assert [(d.section, d.key) for d in diffs if classify(*d) == "setup"] == [
        ("software", "environment.keys"), ("software", "environment.submitted_sha256")]
    # The whole block's digest and size count the job's own id too: shown, not counted.
    assert {(d.key, classify(*d)) for d in diffs if d.key in ("environment.bytes", "environment.sha256")} == {
        ("environment.bytes", "noted"), ("environment.sha256", "noted")}
    out = format_diff(diffs, "job 12", "job 13")
    lines = out.splitlines()
    assert lines[0] == "not comparable: 2 differences in software"
    assert "    environment.keys: only in b: OMP_NUM_THREADS" in lines
    assert "    environment.bytes: 64 | 82" in lines
    sha = lines.index("    environment.submitted_sha256:")   # too wide for one line: a and b on their own
    assert lines[sha + 1] == "      a: " + "c" * 64 and lines[sha + 2] == "      b: " + "d" * 64


def test_the_first_line_counts_setup_differences_per_section_in_record_order():
    a, b = record(), record()
    b["software"]["argv"] = f(["./bench", "--size", "8192"], "request")
    b["frequency"]["policies"][0]["scaling_governor"] = f("powersave", "/sys/.../scaling_governor")
    b["frequency"]["policies"][0]["scaling_driver"] = f("acpi-cpufreq", "/sys/.../scaling_driver")
    b["frequency"]["boost"] = f(1, "/sys/devices/system/cpu/cpufreq/boost")
    out = format_diff(differences(a, b), "a.json", "b.json")
    assert out.splitlines()[0] == "not comparable: 3 differences in frequency, 1 in software"
    assert "    policies[0].scaling_governor: performance | powersave" in out.splitlines()
    assert "    boost: null | 1" in out.splitlines()
    assert "    argv: ./bench --size 4096 | ./bench --size 8192" in out.splitlines()
    assert recorddiff.comparable(differences(a, b)) is False


def test_a_kernel_command_line_differing_by_one_word_names_the_word():
    a, b = record(), record()
    b["kernel"]["cmdline"]["value"] += " mitigations=off"
    out = format_diff(differences(a, b), "a", "b")
    assert "  kernel" in out.splitlines()
    assert "    cmdline: only in b: mitigations=off" in out.splitlines()


def test_the_same_shape_on_other_cpus_and_node_is_comparable_and_says_where_each_ran():
    a, b = record(cpus="2-3", policies="2-3", node="0"), record(cpus="22-23", policies="22-23", node="1")
    diffs = differences(a, b)
    out = format_diff(diffs, "job 12", "job 13")
    assert out.splitlines()[0].startswith("comparable:"), out
    # per-node memory pairs node 0 with node 1: their totals match, nothing about it counts
    assert ("memory", "nodes.0(b:1).mem_total_kb") not in [(d.section, d.key) for d in diffs]
    assert "    read_back.cpus_effective: 2-3 | 22-23" in out.splitlines()
    assert "    policies[0].cpus: 2-3 | 22-23" in out.splitlines()


def test_a_wider_allocation_is_a_setup_difference():
    a, b = record(cpus="2-3"), record(cpus="2-5")
    b["allocation"]["requested"]["cpus"] = f(4, "request")
    diffs = differences(a, b)
    setup = {d.key for d in diffs if classify(*d) == "setup"}
    assert {"requested.cpus", "read_back.cpus_effective"} <= setup
    assert format_diff(diffs, "a", "b").startswith("not comparable: 1 difference in frequency, 2 in allocation")


def test_memory_limit_and_pids_max_count_though_pids_do_not():
    a, b = record(), record()
    b["allocation"]["read_back"]["pids_max"] = f(4096, "/sys/fs/cgroup/hpc-batch/job-12/pids.max")
    b["software"]["pid"] = f(1, "fork(2)")
    assert [(d.key, classify(*d)) for d in differences(a, b)] == [("read_back.pids_max", "setup"), ("pid", "ignored")]
    assert classify("allocation", "read_back.pids.max", "max", 4096) == "setup"
    assert classify("software", "children[0].pid", 3, 4) == "ignored"


def test_another_machine_and_microcode_are_setup_the_tool_version_only_noted():
    a, b = record(), record()
    b["collector"]["hostname"]["value"] = "node2"
    b["collector"]["version"]["value"] = "0.2.0"
    b["cpu"]["microcode"]["value"] = "0x5003605"
    out = format_diff(differences(a, b), "a", "b")
    lines = out.splitlines()
    assert lines[0] == "not comparable: 1 difference in collector, 1 in cpu"
    noted = lines.index("where each ran and what recorded it (not counted):")
    assert lines[noted + 1:noted + 3] == ["  collector", "    version: 0.1.0 | 0.2.0"]


def test_gpus_compare_entry_by_entry_uuid_noted_temperatures_reported():
    a, b = record(), record()
    a["gpu"] = [gpu(0, "GPU-0a1b", 35, {"sw_thermal_slowdown": "Not Active"})]
    b["gpu"] = [gpu(2, "GPU-9f8e", 41, {"sw_thermal_slowdown": "Active"})]
    b["gpu"][0]["topo"] = f("SYS NV18 X", "nvidia-smi topo -m")
    diffs = differences(a, b)
    kinds = {d.key: classify(*d) for d in diffs}
    assert kinds == {"[0].index": "noted", "[0].uuid": "noted", "[0].pci_bus_id": "noted", "[0].topo": "noted",
                     "[0].start.temperature_c": "run", "[0].start.clocks_event_reasons.sw_thermal_slowdown": "run",
                     "[0].end.temperature_c": "run", "[0].end.clocks_event_reasons.sw_thermal_slowdown": "run"}
    assert format_diff(diffs, "a", "b").startswith("comparable:")
    b["gpu"][0]["driver_version"]["value"] = "535.104.05"
    b["gpu"].append(gpu(3, "GPU-77", 30, {}))
    more = differences(a, b)
    assert Difference("gpu", "[1].name", None, "NVIDIA H100 80GB HBM3") in more
    # the driver, and the second GPU's name, driver and CUDA version
    assert format_diff(more, "a", "b").startswith("not comparable: 4 differences in gpu")


def test_verdicts_and_sentinel_deltas_are_reported_apart_and_never_decide():
    a, b = record(), record()
    b["verdict"] = {"verdict": "noisy", "reasons": ["12 device interrupts on CPUs 2,3 (IRQ 24 nvme0q1: 12)"],
                    "thresholds": {"device_irqs": 0, "swap_pages": 0}}
    b["sentinels"]["delta"]["interrupts"] = {"24": {"counts": [12, 0], "desc": "nvme0q1"}}
    b["sentinels"]["start"]["interrupts"] = {"24": 1}
    b["complete"] = False
    diffs = differences(a, b)
    out = format_diff(diffs, "a", "b").splitlines()
    assert out[0].startswith("comparable:")
    run = out.index("the machine's state and the runs (reported, not counted):")
    assert out[run + 1] == "  complete: true | false"
    assert "  verdict" in out[run:] and "    verdict: clean | noisy" in out[run:]
    assert "    delta.interrupts.24.counts: null | 12, 0" in out[run:]
    assert not any("start" in line for line in out)
    long_reason = "core throttle count on CPU 2 rose by 3 in 3.1 s, more than 0"
    b["verdict"]["reasons"].append(long_reason)
    out = format_diff(differences(a, b), "a", "b").splitlines()
    assert out[out.index("    reasons:") + 2] == "      only in b: " + long_reason


def test_a_section_one_record_lacks_lists_each_of_the_others_values():
    a, b = record(), record()
    del a["cpu"]["vulnerabilities"]
    a["kernel"] = null("/proc/sys/kernel", "the record is incomplete")
    diffs = differences(a, b)
    assert Difference("cpu", "vulnerabilities.spectre_v2", None, "Mitigation: Enhanced IBRS") in diffs
    assert Difference("kernel", "release", None, "6.1.0-18-amd64") in diffs
    assert Difference("kernel", "nohz_full", None, None) not in diffs


def test_long_values_are_cut_to_the_width_around_the_first_difference():
    a, b = record(), record()
    a["cpu"]["model_name"]["value"] = "x" * 150 + "A" + "y" * 50
    b["cpu"]["model_name"]["value"] = "x" * 150 + "B" + "y" * 50
    out = format_diff(differences(a, b), "a", "b", width=80)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert any(line.startswith("      a: ...xxxxxxxxxxA") for line in out.splitlines()), out


def test_control_characters_in_user_strings_stay_escaped_on_one_line():
    a, b = record(), record()
    b["software"]["argv"] = f(["./bench", "--name", "a\nb\x1b[31m"], "request")
    out = format_diff(differences(a, b), "a", "b\n")
    assert "a\\nb\\x1b[31m" in out and "b\\n" in out
    assert "\x1b" not in out and out.count("\n") == len(out.splitlines()) - 1


def test_diff_json_has_every_shown_difference_with_its_kind():
    a, b = record(job=12), record(job=13)
    b["software"]["argv"] = f(["./bench"], "request")
    out = recorddiff.diff_json(differences(a, b), "12", "13")
    json.dumps(out)
    assert out["comparable"] is False and out["summary"] == "not comparable: 1 difference in software"
    assert {"section": "software", "key": "argv", "a": ["./bench", "--size", "4096"], "b": ["./bench"],
            "kind": "setup"} in out["differences"]
    assert all(d["kind"] != "ignored" for d in out["differences"])


def test_identical_records_say_so():
    a = record()
    out = format_diff(differences(a, copy.deepcopy(a)), "a", "b")
    assert out.splitlines()[0].startswith("comparable:") and out.splitlines()[-1] == "nothing else differs"


# -- render -----------------------------------------------------------------------
def test_render_puts_the_verdict_first_then_the_sections_in_order():
    rec = record()
    rec["verdict"] = {"verdict": "noisy", "reasons": ["swap: 40 pages in, 0 out in 3.1 s, more than 0"],
                      "thresholds": {"swap_pages": 0, "device_irqs": 0},
                      "notes": ["cpu.stat not judged (no cgroup (--no-cgroups))", "context switches not judged"]}
    lines = render(rec).splitlines()
    assert lines[:6] == ["verdict: noisy", "  - swap: 40 pages in, 0 out in 3.1 s, more than 0",
                         "  thresholds: device_irqs=0, swap_pages=0",
                         "  note: cpu.stat not judged (no cgroup (--no-cgroups))",
                         "  note: context switches not judged", "record: schema 1, job 12, complete"]
    heads = [line for line in lines if line and not line.startswith(" ") and ":" not in line]
    assert heads == ["collector", "kernel", "cpu", "frequency", "memory", "allocation", "gpu", "software",
                     "sentinels"]


def test_render_one_line_per_value_with_the_reason_for_nulls():
    lines = render(record()).splitlines()
    assert "  hostname: node1" in lines
    assert "  nohz_full: null (No such file or directory)" in lines
    assert "  read_back.memory_max: 8589934592" in lines
    assert "  policies[0].scaling_governor: performance" in lines
    assert "  nodes.0.mem_total_kb: 196000000" in lines
    assert "  environment.keys: HOME, PATH" in lines
    assert "  argv: ./bench --size 4096" in lines
    assert "  caches[0].shared_cpu_lists: 0-19,40-59" in lines
    assert "  gpu: (none)" not in lines and "  (none)" in lines     # a job without GPUs
    assert "  delta.wall_s: 3.1" in lines
    assert "  (the raw start and end snapshots: --json)" in lines
    assert not any("monotonic: 1012" in line for line in lines if line.startswith("  start"))


def test_render_bounds_each_line_and_escapes():
    rec = record()
    rec["software"]["argv"] = f(["./bench", "x" * 500, "\x07bell"], "request")
    names = [f"threshold_number_{i}" for i in range(12)]
    rec["verdict"]["thresholds"] = dict.fromkeys(names, 0.25)
    lines = render(rec, width=72).splitlines()
    said = " ".join(line.strip() for line in lines[:lines.index("record: schema 1, job 12, complete")])
    assert all(f"{name}=0.25" in said for name in names)        # every threshold, wrapped rather than cut
    assert max(map(len, lines)) <= 72
    at = next(i for i, line in enumerate(lines) if line.startswith("  argv: ./bench xxx"))
    argv = lines[at:at + recorddiff.RENDER_LINES]       # wrapped, then cut
    assert all(line.startswith("      x") for line in argv[1:]) and argv[-1].endswith(" more)")
    assert not lines[at + recorddiff.RENDER_LINES].startswith("      ")
    assert "\x07" not in render(rec) and "'\\x07bell'" in render(rec, width=1000)   # shell-quoted, escaped


def test_render_wraps_a_long_value_and_a_long_reason_then_cuts_the_value():
    rec = record()
    words = [f"option{i}=value{i}" for i in range(60)]
    rec["kernel"]["cmdline"]["value"] = " ".join(words)
    reason = " ".join(["others used 0.4 s of CPU time on the job's CPUs"] * 4)
    rec["verdict"] = {"verdict": "noisy", "reasons": [reason], "thresholds": {}}
    lines = render(rec, width=60).splitlines()
    assert max(map(len, lines)) <= 60
    said = lines[1:lines.index("record: schema 1, job 12, complete")]
    assert said[0].startswith("  - others used") and all(line.startswith("      ") for line in said[1:])
    assert " ".join(line.strip() for line in said) == "- " + reason
    at = next(i for i, line in enumerate(lines) if line.startswith("  cmdline: "))
    cmdline = lines[at:at + recorddiff.RENDER_LINES]
    assert cmdline[0] == "  cmdline: option0=value0 option1=value1 option2=value2"
    assert lines[at + recorddiff.RENDER_LINES] == "  isolated: 2-7" and cmdline[-1].endswith(" more)")


def test_render_says_when_the_record_is_incomplete_and_has_no_verdict():
    rec = record()
    rec["complete"] = False
    rec["verdict"] = None
    del rec["sentinels"]["end"]
    lines = render(rec).splitlines()
    assert lines[0] == "verdict: none (the record is incomplete)"
    assert lines[1] == "record: schema 1, job 12, INCOMPLETE (the job's end was not recorded)"

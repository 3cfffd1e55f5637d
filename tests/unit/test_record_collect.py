"""The record's static sections (shepherd.record.collect) over fixture trees, an empty root and this machine."""

import datetime
import json
import os
import subprocess
import sys
import time

import pytest

from shepherd.base import sysread
from shepherd.record import collect

pytestmark = pytest.mark.timeout(60)
FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
XEON = os.path.join(FIXTURES, "record", "xeon-2s")
JOB_CGROUP = "/sys/fs/cgroup/hpc-batch/job-12"


def src(*parts):
    return sysread.Source(os.path.join(FIXTURES, *parts))


def sysfs_only(tmp_path, machine):
    """A root whose /sys is one of tests/fixtures/sysfs's trees (they hold /sys's contents)."""
    (tmp_path / "sys").symlink_to(os.path.abspath(os.path.join(FIXTURES, "sysfs", machine)))
    return sysread.Source(str(tmp_path))


def fields(tree, path=""):
    """Every (dotted path, field) under *tree*; a field is a dict with a ``source``."""
    if isinstance(tree, dict) and "source" in tree:
        yield path, tree
    elif isinstance(tree, dict):
        for key, sub in tree.items():
            yield from fields(sub, f"{path}.{key}" if path else key)
    elif isinstance(tree, list):
        for i, sub in enumerate(tree):
            yield from fields(sub, f"{path}[{i}]")


def well_formed(tree):
    """Each field has a value and a source, or a null value, a source and a reason."""
    for path, f in fields(tree):
        assert isinstance(f["source"], str) and f["source"], path
        if f["value"] is None:
            assert set(f) == {"value", "source", "error"} and f["error"], path
        else:
            assert set(f) == {"value", "source"}, path


def value(section, dotted):
    node = section
    for key in dotted.split("."):
        node = node[key]
    return node["value"]


# -- parsers ------------------------------------------------------------------
def test_cpulists_round_trip():
    assert collect.parse_cpulist("0-2,5,8-9") == [0, 1, 2, 5, 8, 9]
    assert collect.parse_cpulist("3 1 2") == [1, 2, 3]
    assert collect.parse_cpulist("") == []
    assert collect.format_cpulist([9, 0, 1, 2, 5, 8]) == "0-2,5,8-9"
    with pytest.raises(ValueError):
        collect.parse_cpulist("4-2")


def test_cgroup_mode_names_the_three_layouts():
    unified = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
    # The hybrid lines are this project's dev container's own /proc/mounts.
    hybrid = ("tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
              "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
              "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
    legacy = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    assert collect.cgroup_mode(unified) == "unified"
    assert collect.cgroup_mode(hybrid) == "hybrid"
    assert collect.cgroup_mode(legacy) == "v1"
    assert collect.cgroup_mode("proc /proc proc rw 0 0\n") == "none"


# -- collector and kernel -----------------------------------------------------
def test_collector_says_who_and_when():
    c = collect.collector(sysread.Source(XEON), 12, "1.4.0", "6d4c9ee")
    assert value(c, "job") == 12 and value(c, "version") == "1.4.0" and value(c, "commit") == "6d4c9ee"
    assert value(c, "schema") == collect.SCHEMA == 1
    assert c["hostname"] == {"value": "node17", "source": "/proc/sys/kernel/hostname"}
    assert value(c, "boot_id") == "3f1c9d2e-8a47-4b6e-9c0d-5e2f7a1b8c34"
    assert value(c, "uptime_s") == 864231.57
    assert c["utc"]["source"] == "clock"
    utc = datetime.datetime.strptime(c["utc"]["value"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    assert abs(utc.timestamp() - time.time()) < 300      # the clock now, not a fixture's or a local time
    assert c["monotonic_s"]["source"] == "clock" and c["monotonic_s"]["value"] > 0
    assert collect.collector(sysread.Source(XEON), 12, "1.4.0", None)["commit"]["error"]
    well_formed(c)


def test_kernel_section():
    k = collect.kernel(sysread.Source(XEON))
    assert value(k, "sysname") == "Linux" and value(k, "release") == "6.8.0-45-generic"
    assert value(k, "version").startswith("#45-Ubuntu SMP") and value(k, "machine") == "x86_64"
    assert "nohz_full=2,3,6,7" in value(k, "cmdline")
    assert value(k, "isolated") == "2-3,6-7" and value(k, "nohz_full") == "2-3,6-7"
    assert k["cgroup_mode"] == {"value": "unified", "source": "/proc/mounts"}
    well_formed(k)


# -- cpu ----------------------------------------------------------------------
def test_cpu_identity_smt_numa_vulnerabilities():
    c = collect.cpu(sysread.Source(XEON))
    assert value(c, "vendor") == "GenuineIntel"
    assert value(c, "model_name") == "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz"
    assert (value(c, "family"), value(c, "model"), value(c, "stepping")) == (6, 85, 7)
    assert value(c, "microcode") == "0x5003604"
    assert value(c, "smt_control") == "on" and value(c, "smt_active") is True
    assert value(c, "online") == "0-7"
    assert value(c, "numa_distances") == {"0": [10, 21], "1": [21, 10]}
    assert value(c, "vulnerabilities.tsx_async_abort") == "Mitigation: TSX disabled"
    assert c["vulnerabilities"]["l1tf"]["source"] == "/sys/devices/system/cpu/vulnerabilities/l1tf"
    well_formed(c)


def test_caches_deduplicated_with_their_sharers():
    caches = value(collect.cpu(sysread.Source(XEON)), "caches")
    assert [(e["level"], e["type"], e["size"]) for e in caches] == [
        (1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "28160K")]
    assert caches[0]["shared_cpu_lists"] == ["0,4", "1,5", "2,6", "3,7"]
    assert caches[3]["shared_cpu_lists"] == ["0-1,4-5", "2-3,6-7"]


def test_caches_of_an_80_cpu_tree_without_sizes(tmp_path):
    caches = value(collect.cpu(sysfs_only(tmp_path, "intel-2s-xeon-gold-6248")), "caches")
    l3 = [e for e in caches if e["level"] == 3]
    assert l3 == [{"level": 3, "type": "Unified", "size": None, "shared_cpu_lists": ["0-19,40-59", "20-39,60-79"]}]
    l1d = next(e for e in caches if (e["level"], e["type"]) == (1, "Data"))
    assert len(l1d["shared_cpu_lists"]) == 40 and l1d["shared_cpu_lists"][5] == "5,45"


def test_caches_of_a_hybrid_part_keep_both_kinds_of_l2(tmp_path):
    caches = value(collect.cpu(sysfs_only(tmp_path, "intel-i9-12900k-hybrid")), "caches")
    l2 = next(e for e in caches if e["level"] == 2)["shared_cpu_lists"]
    assert "0-1" in l2 and "16-19" in l2 and "20-23" in l2 and len(l2) == 10


def test_caches_read_each_cache_once(monkeypatch):
    reads = []
    real = sysread.Source.value

    def counting(self, path, parse=None):
        reads.append(path)
        return real(self, path, parse)
    monkeypatch.setattr(sysread.Source, "value", counting)
    collect.caches(sysread.Source(XEON))
    # 8 CPUs x 4 indexes, but only 4 + 4 + 4 + 2 distinct caches, 4 files each.
    assert len([p for p in reads if "/cache/" in p]) == 14 * 4


# -- frequency ----------------------------------------------------------------
def test_frequency_intel_pstate_turbo():
    f = collect.frequency(src("quiet", "intel-pstate-turbo"), [4, 5])
    assert f["available"] is True and value(f, "ungoverned_cpus") == ""
    [p] = f["policies"]
    assert p["policies"] == "4-5" and p["cpus"] == "4-5" and p["shared"] is False
    assert value(p, "scaling_driver") == "intel_pstate" and value(p, "scaling_governor") == "powersave"
    assert (value(p, "scaling_min_freq"), value(p, "cpuinfo_max_freq")) == (400000, 4700000)
    assert value(p, "energy_performance_preference") == "balance_performance"
    assert p["scaling_governor"]["source"] == "/sys/devices/system/cpu/cpufreq/policy{4-5}/scaling_governor"
    assert value(f, "intel_pstate_no_turbo") == 0 and value(f, "intel_pstate_status") == "active"
    assert f["boost"]["value"] is None and f["boost"]["error"]
    [cpus] = f["per_cpu"]
    assert cpus["cpus"] == "4-5" and value(cpus, "energy_perf_bias") == 6
    assert cpus["idle_states"]["value"] is None and cpus["idle_states"]["error"]
    well_formed(f)


def test_frequency_acpi_cpufreq_shared_policy_and_global_boost():
    s = src("quiet", "acpi-cpufreq-boost")
    f = collect.frequency(s, [5, 6])
    assert value(f, "boost") == 1
    shared = next(p for p in f["policies"] if p["policies"] == "6")
    assert shared["shared"] is True and shared["cpus"] == "6" and value(shared, "scaling_governor") == "schedutil"
    own = next(p for p in f["policies"] if p["policies"] == "5")
    assert own["shared"] is False and value(own, "scaling_driver") == "acpi-cpufreq"
    [p] = collect.frequency(s, [6, 7])["policies"]
    assert p["shared"] is False and p["cpus"] == "6-7"


def test_frequency_amd_pstate_per_policy_boost():
    f = collect.frequency(src("quiet", "amd-pstate-epp"), [0, 1, 2, 3])
    [p] = f["policies"]
    assert value(p, "boost") == 1 and value(p, "scaling_driver") == "amd-pstate-epp" and p["cpus"] == "0-3"
    assert value(f, "amd_pstate_status") == "active"
    assert f["boost"]["value"] is None and "No such file" in f["boost"]["error"]


def test_frequency_without_cpufreq_is_unavailable():
    f = collect.frequency(src("quiet", "dev-container-real"), [0, 1])
    assert f["available"] is False and f["policies"] == []
    assert value(f, "ungoverned_cpus") == "0-1"
    well_formed(f)


def test_frequency_groups_cpus_with_idle_states_and_epb():
    f = collect.frequency(sysread.Source(XEON), [2, 3, 6])
    assert [(p["policies"], value(p, "scaling_governor")) for p in f["policies"]] == [
        ("2-3", "performance"), ("6", "powersave")]
    assert [(g["cpus"], value(g, "energy_perf_bias")) for g in f["per_cpu"]] == [("2-3", 0), ("6", 6)]
    states = value(f["per_cpu"][0], "idle_states")
    assert [(s["name"], s["disable"]) for s in states] == [("POLL", 0), ("C1", 0), ("C1E", 0), ("C6", 1)]
    assert value(f, "cpuidle_driver") == "intel_idle" and value(f, "cpuidle_governor") == "menu"
    assert f["per_cpu"][0]["idle_states"]["source"] == "/sys/devices/system/cpu/cpu{2-3}/cpuidle/state*/{name,disable}"
    well_formed(f)


# -- memory -------------------------------------------------------------------
def test_memory_of_the_jobs_node():
    m = collect.memory(sysread.Source(XEON), [1])
    assert list(m["nodes"]) == ["1"]
    assert value(m, "nodes.1.mem_total_kb") == 197974016 and value(m, "nodes.1.mem_free_kb") == 190455128
    assert m["nodes"]["1"]["mem_total_kb"]["source"] == "/sys/devices/system/node/node1/meminfo"
    assert value(m, "thp_enabled") == "never" and value(m, "thp_defrag") == "madvise"
    assert (value(m, "numa_balancing"), value(m, "swappiness"), value(m, "zone_reclaim_mode")) == (0, 10, 0)
    assert (value(m, "hugepages_total"), value(m, "hugepagesize_kb")) == (512, 2048)
    assert (value(m, "swap_total_kb"), value(m, "swap_free_kb")) == (8388604, 8388604)
    assert value(m, "swaps") == [{"filename": "/dev/nvme0n1p3", "type": "partition", "size_kb": 8388604,
                                  "used_kb": 0, "priority": -2}]
    well_formed(m)


def test_memory_without_mems_reads_every_node():
    m = collect.memory(sysread.Source(XEON), [])
    assert list(m["nodes"]) == ["0", "1"]
    assert value(m, "nodes.0.nr_hugepages") == {"1048576kB": 0, "2048kB": 512}


# -- allocation read back -----------------------------------------------------
def test_read_back_of_the_job_cgroup():
    r = collect.read_back(sysread.Source(XEON), JOB_CGROUP)
    assert {k: f["value"] for k, f in r.items()} == {
        "cpus_effective": "2-3", "partition": "isolated", "mems_effective": "1",
        "memory_max": 17179869184, "memory_swap_max": 0, "pids_max": "max"}
    assert r["pids_max"]["source"] == f"{JOB_CGROUP}/pids.max"


def test_read_back_without_a_cgroup_or_with_a_gone_one():
    r = collect.read_back(sysread.Source(XEON), None)
    assert all(f["value"] is None and f["error"] == "no cgroup (--no-cgroups)" for f in r.values())
    gone = collect.read_back(sysread.Source(XEON), "/sys/fs/cgroup/hpc-batch/job-13")
    assert all(f["value"] is None and "No such file" in f["error"] for f in gone.values())
    well_formed(r)
    well_formed(gone)


# -- whole record -------------------------------------------------------------
def test_sources_name_machine_paths_never_the_fixture():
    text = json.dumps(collect.sections(sysread.Source(XEON), 12, "1.4.0", None, [2, 3], [1], JOB_CGROUP))
    assert "fixtures" not in text and XEON not in text


def test_an_empty_root_gives_reasons_not_exceptions(tmp_path):
    record = collect.sections(sysread.Source(str(tmp_path)), 1, "1.4.0", None, [0, 1], [0], JOB_CGROUP)
    well_formed(record)
    found = dict(fields(record))
    machine = {p: f for p, f in found.items() if f["source"] not in ("clock", "hpc-batch")}
    assert machine and all(f["value"] is None for p, f in machine.items() if p != "frequency.ungoverned_cpus")
    assert record["frequency"]["available"] is False
    assert record["cpu"]["vulnerabilities"]["value"] is None
    assert "No such file" in record["memory"]["nodes"]["0"]["mem_total_kb"]["error"]
    assert "no node directories" in collect.memory(sysread.Source(str(tmp_path)), [])["nodes"]["error"]


def test_garbled_files_give_reasons(tmp_path):
    for rel, text in (("proc/uptime", "soon"), ("sys/devices/system/cpu/smt/active", "yes"),
                      ("proc/meminfo", "HugePages_Total: many\n"), ("sys/devices/system/node/node0/distance", "x")):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    s = sysread.Source(str(tmp_path))
    assert "ValueError" in collect.collector(s, 1, "v", None)["uptime_s"]["error"]
    c = collect.cpu(s)
    assert "ValueError" in c["smt_active"]["error"] and "node0" in c["numa_distances"]["error"]
    m = collect.memory(s, [])
    assert "ValueError" in m["hugepages_total"]["error"] and "no 'SwapTotal' line" in m["swap_total_kb"]["error"]


def test_this_machine_every_section():
    cpus = sorted(os.sched_getaffinity(0))
    record = collect.sections(sysread.Source("/"), 1, "1.4.0", None, cpus, [], None)
    well_formed(record)
    json.dumps(record)
    assert value(record["kernel"], "release") == os.uname().release
    assert value(record["collector"], "hostname") == os.uname().nodename
    assert record["cpu"]["model_name"]["value"]


def test_loads_as_the_shepherd_run_as_a_file_finds_it():
    # shepherd/ first on the path, no site: the record and the base are top-level packages there.
    here = os.path.join(os.path.dirname(__file__), "..", "..", "shepherd")
    code = ("from record import collect; from base import sysread\n"
            "print(collect.kernel(sysread.Source('/'))['release']['value'])")
    out = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", code], cwd=here, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == os.uname().release


class _XeonAsMachine(sysread.Source):
    """The Xeon fixture seen as the machine itself (root "/", so what is fixed for the boot is kept
    per process), counting each read; *changed* overrides files, as a change at run time would."""

    def __init__(self):
        super().__init__("/")
        self.reads: list[str] = []
        self.changed: dict[str, str] = {}

    def path(self, path):
        return os.path.join(XEON, path.lstrip("/"))

    def read(self, path, limit=sysread.READ_LIMIT):
        self.reads.append(path)
        return self.changed[path] if path in self.changed else super().read(path, limit)


def test_vulnerabilities_are_read_once_until_smt_or_the_microcode_changes(monkeypatch):
    monkeypatch.setattr(collect, "_BOOT", {})
    src = _XeonAsMachine()
    vuln = "/sys/devices/system/cpu/vulnerabilities/"

    def vulnerability_reads():
        before = len(src.reads)
        c = collect.cpu(src)
        return c["vulnerabilities"], [p for p in src.reads[before:] if p.startswith(vuln)]

    first, reads = vulnerability_reads()
    assert value({"v": first["l1tf"]}, "v") and len(reads) == len(first) > 5
    again, reads = vulnerability_reads()
    assert again == first and reads == []      # the fork server's reading serves every shepherd
    src.changed["/sys/devices/system/cpu/smt/control"] = "off\n"
    _, reads = vulnerability_reads()
    assert len(reads) == len(first)            # SMT switched off rewrites some of them: read again
    src.changed["/proc/cpuinfo"] = src.read("/proc/cpuinfo").replace("0x5003604", "0x5003707")
    _, reads = vulnerability_reads()
    assert len(reads) == len(first)            # so does a late microcode load

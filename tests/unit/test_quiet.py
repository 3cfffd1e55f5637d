"""Quiet cores (daemon.benchmode: quiet, irqsteer, cpufreq, cpupartition) over fixture trees copied to tmp dirs."""

import errno
import os
import shutil
import socket
import struct
import tempfile
import threading

import pytest

from hpc_batch.client import listing
from hpc_batch.core.cputopo import parse_cpulist
from hpc_batch.daemon import cgroups
from hpc_batch.daemon.benchmode import cpufreq, cpupartition, irqsteer, kfiles, quiet
from shepherd.record import recorder

pytestmark = pytest.mark.timeout(60)
FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "quiet")


@pytest.fixture
def tree(tmp_path):
    def copy(machine):
        root = tmp_path / machine
        shutil.copytree(os.path.join(FIXTURES, machine), root)
        return str(root)
    return copy


def aff(root, irq):
    return kfiles.read(root, irqsteer.affinity_path(irq))


def pol(root, n, name):
    return kfiles.read(root, f"{cpufreq.CPUFREQ}/policy{n}/{name}")


def as_kernel(monkeypatch, refuse=None, pending=()):
    """kfiles.write as the kernel answers in a fixture tree: the IRQs in *refuse* ({irq: errno})
    refuse every write; a write taken moves the IRQ's effective_affinity_list (where the tree has
    one) to the lowest CPU written, except for the IRQs in *pending* (a move the kernel defers)."""
    real, refuse = kfiles.write, refuse or {}

    def write(root, rel, value):
        parts = rel.split("/")
        if rel.startswith("proc/irq/") and parts[-1] == "smp_affinity_list":
            irq = int(parts[2])
            if irq in refuse:
                raise OSError(refuse[irq], os.strerror(refuse[irq]))
            real(root, rel, value)
            if irq not in pending and os.path.exists(kfiles.join(root, irqsteer.effective_path(irq))):
                real(root, irqsteer.effective_path(irq), str(min(parse_cpulist(value))))
            return
        real(root, rel, value)
    monkeypatch.setattr(kfiles, "write", write)
    return real


# -- interrupts ---------------------------------------------------------------
def test_plan_moves_only_irqs_touching_held_cpus():
    writes = irqsteer.plan({0: "0", 8: "0-7", 9: "4", 10: "6-7", 11: "junk"}, held=(4, 5), housekeeping=(0, 1))
    assert [(irqsteer.irq_of(w), w.old, w.new) for w in writes] == [(8, "0-7", "0-1"), (9, "4", "0-1")]


def test_plan_needs_somewhere_to_go():
    assert irqsteer.plan({8: "0-7"}, held=(0, 1), housekeeping=(0, 1)) == []
    assert irqsteer.plan({8: "0-7"}, held=(), housekeeping=(0,)) == []


def test_begin_moves_and_end_restores(tree, tmp_path, monkeypatch):
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    as_kernel(monkeypatch)
    before = irqsteer.read_affinities(root)
    rec = quiet.begin(jdir, (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    assert rec["irqs"]["moved"] == [8, 9, 120, 121, 122]
    assert rec["irqs"]["refused"] == [] and rec["irqs"]["to"] == "0-1"
    assert rec["irqs"]["still_on_job_cpus"] == []
    assert all(aff(root, i) == "0-1" for i in (8, 9, 120, 121, 122))
    assert aff(root, 0) == "0" and aff(root, 123) == "6-7" and aff(root, 130) == "0-3"
    assert os.stat(os.path.join(jdir, quiet.FILE)).st_mode & 0o777 == 0o600
    undone = quiet.end(jdir, quiet.Settings(root=root))
    assert undone == {"restored": 5, "handed": 0, "left": []}
    assert irqsteer.read_affinities(root) == before
    assert not quiet.pending(jdir) and quiet.end(jdir, quiet.Settings(root=root)) is None


def test_refused_irq_is_recorded_refused(tree, tmp_path, monkeypatch):
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    real = as_kernel(monkeypatch, refuse={120: errno.EIO})   # what the kernel answers for a managed IRQ
    rec = quiet.begin(jdir, (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    assert rec["irqs"]["refused"] == [120] and 120 not in rec["irqs"]["moved"]
    monkeypatch.setattr(kfiles, "write", real)
    assert quiet.end(jdir, quiet.Settings(root=root))["restored"] == 4
    assert aff(root, 120) == "0-7" and aff(root, 8) == "0-7"


def test_restore_only_where_still_ours(tree, tmp_path):
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    quiet.begin(jdir, (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    kfiles.write(root, irqsteer.affinity_path(9), "2")     # an admin (or irqbalance) moved it since
    kfiles.write(root, irqsteer.affinity_path(8), "1,0")   # same CPUs, other spelling: still ours
    undone = quiet.end(jdir, quiet.Settings(root=root))
    assert undone["restored"] == 4 and len(undone["left"]) == 1 and "irq/9/" in undone["left"][0]
    assert aff(root, 9) == "2" and aff(root, 8) == "0-7"


def test_restore_after_a_crash_midway(tree, tmp_path, monkeypatch):
    """The daemon dies after two writes: a later daemon undoes those two and touches nothing else."""
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    real, count = kfiles.write, []

    def dies(r, rel, value):
        if len(count) == 2:
            raise SystemExit("killed")
        count.append(rel)
        real(r, rel, value)
    monkeypatch.setattr(kfiles, "write", dies)
    with pytest.raises(SystemExit):
        quiet.begin(jdir, (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    monkeypatch.setattr(kfiles, "write", real)
    assert aff(root, 8) == "0-1" and aff(root, 9) == "0-1" and aff(root, 120) == "0-7"
    undone = quiet.end(jdir, quiet.Settings(root=root))   # a new daemon: it knows only the file
    assert undone["restored"] == 2 and undone["left"] == []
    assert all(aff(root, i) == v for i, v in ((8, "0-7"), (9, "0-7"), (120, "0-7"), (121, "4")))


def test_an_irq_two_jobs_steer_goes_back_when_the_last_one_ends(tree, tmp_path):
    root = tree("intel-pstate-turbo")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    s = quiet.Settings(cpufreq="enforce", allow_turbo_off=True, root=root)
    ra = quiet.begin(str(a), (4,), (4, 5), (0, 1), s, alone=True)
    rb = quiet.begin(str(b), (6,), (6, 7), (0, 1), s, alone=False)
    assert ra["irqs"]["moved"] == [8, 9, 120, 121, 122]
    # IRQs 8, 9 and 120 were on 0-7 before A moved them: B holds them too, as well as its own 123.
    assert rb["irqs"]["moved"] == [8, 9, 120, 123]
    assert {k: rb["irqs"]["each"]["8"][k] for k in ("result", "old", "new")} == \
        {"result": "moved", "old": "0-7", "new": "0-1"}   # old: before hpc-batch's first change
    assert ra["cpufreq"]["turbo"] == "turbo off (intel_pstate/no_turbo)"
    assert rb["cpufreq"]["turbo"] == "turbo off (as found)"
    undone = quiet.end(str(a), s, others=[(str(b), (6, 7))])
    # Back: 121, 122, no_turbo and A's two policies' governor and minimum; 8, 9, 120 stay for B.
    assert undone == {"restored": 7, "handed": 3, "left": []}
    assert aff(root, 121) == "4" and aff(root, 8) == "0-1" and kfiles.read(root, cpufreq.NO_TURBO) == "0"
    assert pol(root, 4, "scaling_governor") == "powersave"
    undone = quiet.end(str(b), s, others=[])   # the last one out puts everything back
    assert undone["left"] == [] and irqsteer.read_affinities(root) == {
        0: "0", 8: "0-7", 9: "0-7", 120: "0-7", 121: "4", 122: "5", 123: "6-7", 130: "0-3"}
    assert quiet.load_ledger(s).entries == {}


def test_file_from_another_boot_undoes_nothing(tree, tmp_path):
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    os.makedirs(os.path.join(root, "proc/sys/kernel/random"))
    boot = os.path.join(root, "proc/sys/kernel/random/boot_id")
    with open(boot, "w") as f:
        f.write("1111\n")
    quiet.begin(jdir, (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    with open(boot, "w") as f:
        f.write("2222\n")
    undone = quiet.end(jdir, quiet.Settings(root=root))
    assert undone["restored"] == 0 and "rebooted" in undone["left"][0] and aff(root, 8) == "0-1"
    assert not quiet.pending(jdir)


def test_show_lines(tree, tmp_path, monkeypatch):
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    as_kernel(monkeypatch, refuse={120: errno.EIO}, pending=(8,))
    rec = quiet.begin(jdir, (4,), (4, 5), (0, 1), quiet.Settings(cpufreq="enforce", root=root), True)
    rec["undone"] = quiet.end(jdir, quiet.Settings(root=root))
    lines = dict(listing.describe(rec))
    assert lines["interrupts"] == ("4 moved to CPUs 0-1 (IRQs 8-9,121-122); refused: 120 (EIO: Input/output error); "
                                   "still on the job's CPUs: 8 (effective 4), 120 (effective 5)")
    assert lines["irqbalance"] == "not running"
    assert lines["cpu partition"] == "allocation-only: no cgroups"
    assert lines["frequency"] == ("enforce: driver intel_pstate, governor powersave, 4 settings changed; "
                                  "turbo on (--allow-turbo-off not given)")
    assert lines["undone at its end"] == "8 restored"
    assert listing.describe(None) == [] and listing.describe({"error": "boom"}) == [("quiet cores", "not set up: boom")]


# -- what the start did to each IRQ, in the job's record ------------------------
MOVED_8 = {"result": "moved", "old": "0-7", "new": "0-1", "effective": "0"}


@pytest.mark.parametrize("machine,held,refuse,pending,irq,entry,still", [
    pytest.param("intel-pstate-turbo", (4, 5), {}, (), 8, MOVED_8, [], id="moved"),
    pytest.param("intel-pstate-turbo", (4, 5), {121: errno.EPERM}, (), 121,
                 {"result": "refused", "errno": "EPERM", "error": "Operation not permitted",
                  "old": "4", "new": "0-1", "effective": "4"}, [121], id="refused EPERM"),
    pytest.param("intel-pstate-turbo", (4, 5), {9: errno.EIO}, (), 9,   # delivered to CPU 1 anyway
                 {"result": "refused", "errno": "EIO", "error": "Input/output error",
                  "old": "0-7", "new": "0-1", "effective": "1"}, [], id="refused EIO"),
    pytest.param("intel-pstate-turbo", (4, 5), {}, (120,), 120,
                 {"result": "moved", "old": "0-7", "new": "0-1", "effective": "5"}, [120],
                 id="effective read back on a job CPU"),
    pytest.param("acpi-cpufreq-boost", (2, 3), {}, (), 24,
                 {"result": "moved", "old": "0-7", "new": "0-1", "effective": None,
                  "effective_error": irqsteer.NO_EFFECTIVE}, [], id="effective_affinity_list missing"),
    pytest.param("acpi-cpufreq-boost", (2, 3), {25: errno.EIO}, (), 25,   # no effective: by its affinity
                 {"result": "refused", "errno": "EIO", "error": "Input/output error", "old": "2", "new": "0-1",
                  "effective": None, "effective_error": irqsteer.NO_EFFECTIVE}, [25],
                 id="refused, effective_affinity_list missing"),
])
def test_record_says_what_each_irq_did(tree, tmp_path, monkeypatch, machine, held, refuse, pending, irq,
                                       entry, still):
    root, jdir = tree(machine), str(tmp_path)
    as_kernel(monkeypatch, refuse=refuse, pending=pending)
    settings = quiet.Settings(root=root)
    rec = quiet.begin(jdir, held[:1], held, (0, 1), settings, alone=True)
    irqs = rec["irqs"]
    assert irqs["each"][str(irq)] == entry
    assert irqs["still_on_job_cpus"] == still
    assert (irq in irqs["refused"], irq in irqs["moved"]) == (irq in refuse, irq not in refuse)
    assert set(irqs["each"]) == {str(i) for i in irqs["moved"] + irqs["refused"]}
    # The record copies what was done, not the planned writes.
    field = recorder.quiet_field(jdir)
    assert field["source"] == "quiet.json" and field["value"]["irqs"] == irqs and "writes" not in field["value"]
    # The machine's ledger holds for the job what the kernel took, never what it refused.
    held_now = quiet.load_ledger(settings).held_by(quiet.holder_of(jdir))
    assert (irqsteer.affinity_path(irq) in held_now) == (irq not in refuse)


def test_the_issues_machine_irq_36_refused_and_still_on_the_job_cpu(tmp_path, monkeypatch):
    """The real recording: 19 IRQs on CPUs 0-1, the job on CPU 1; IRQ 36 refuses with EPERM."""
    root = str(tmp_path / "m")
    shutil.copytree(os.path.join(FIXTURES, "dev-container-real"), root)
    as_kernel(monkeypatch, refuse={36: errno.EPERM})
    rec = quiet.begin(str(tmp_path), (1,), (1,), (0,), quiet.Settings(root=root), alone=True)
    irqs = recorder.quiet_field(str(tmp_path))["value"]["irqs"]
    assert len(irqs["moved"]) == 18 and irqs["refused"] == [36] and irqs["still_on_job_cpus"] == [36]
    assert irqs["each"]["36"] == {"result": "refused", "errno": "EPERM", "error": "Operation not permitted",
                                  "old": "0-1", "new": "0", "effective": "1"}
    assert all(irqs["each"][str(i)]["effective"] == "0" for i in irqs["moved"])
    assert dict(listing.describe(rec))["interrupts"].endswith(
        "refused: 36 (EPERM: Operation not permitted); still on the job's CPUs: 36 (effective 1)")


def test_a_refused_write_is_never_restored(tree, tmp_path, monkeypatch):
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    real = as_kernel(monkeypatch, refuse={121: errno.EPERM})
    quiet.begin(jdir, (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    monkeypatch.setattr(kfiles, "write", real)
    kfiles.write(root, irqsteer.affinity_path(121), "0-1")   # moved since by someone else, to what we tried
    undone = quiet.end(jdir, quiet.Settings(root=root))
    assert undone == {"restored": 4, "handed": 0, "left": []} and aff(root, 121) == "0-1"


def test_a_refused_write_is_never_handed_over(tree, tmp_path, monkeypatch):
    root = tree("intel-pstate-turbo")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    real = as_kernel(monkeypatch, refuse={120: errno.EIO})
    quiet.begin(str(a), (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    quiet.begin(str(b), (6,), (6, 7), (0, 1), quiet.Settings(root=root), alone=False)
    monkeypatch.setattr(kfiles, "write", real)
    kfiles.write(root, irqsteer.affinity_path(120), "0-1")   # someone else's since
    assert quiet.end(str(a), quiet.Settings(root=root), others=[(str(b), (6, 7))])["handed"] == 2   # 8, 9
    assert quiet.end(str(b), quiet.Settings(root=root))["restored"] == 3   # 8, 9 and its own 123
    assert aff(root, 120) == "0-1" and aff(root, 8) == "0-7"


def test_each_irq_is_bounded_keeping_the_refused_and_those_still_on_job_cpus(tree, tmp_path, monkeypatch):
    root = tree("intel-pstate-turbo")
    monkeypatch.setattr(irqsteer, "EACH_CAP", 2)
    as_kernel(monkeypatch, refuse={122: errno.EIO})
    irqs = quiet.begin(str(tmp_path), (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)["irqs"]
    assert list(irqs["each"]) == ["8", "122"] and irqs["each_cut"] == 3
    assert irqs["moved"] == [8, 9, 120, 121] and irqs["refused"] == [122] and irqs["still_on_job_cpus"] == [122]


def test_real_recording_parses():
    root = os.path.join(FIXTURES, "dev-container-real")
    affs = irqsteer.read_affinities(root)
    assert affs and all(v for v in affs.values())
    assert irqsteer.plan(affs, held=(1,), housekeeping=(0,))


# -- frequency ----------------------------------------------------------------
def test_record_reads_intel_pstate(tree, tmp_path):
    root = tree("intel-pstate-turbo")
    before = {p: pol(root, 4, p) for p in ("scaling_governor", "scaling_min_freq")}
    rec = quiet.begin(str(tmp_path), (4,), (4, 5), (0, 1), quiet.Settings(root=root), alone=True)
    f = rec["cpufreq"]
    assert f["policy"] == "record" and f["turbo"] == "turbo on" and f["changed"] == []
    st = f["state"]
    assert st["driver"] == "intel_pstate" and st["no_turbo"] == "0" and st["intel_pstate"] == "active"
    assert st["amd_pstate"] is None and st["epb"] == {"6": "4-5"}
    assert len(st["policies"]) == 1   # policies 4 and 5 alike: one entry
    p = st["policies"][0]
    assert p["cpus"] == "4-5" and p["scaling_governor"] == "powersave" and p["scaling_min_freq"] == "400000"
    assert p["energy_performance_preference"] == "balance_performance" and p["shared"] is False
    full = cpufreq.read_state(root, (4, 5))
    assert set(full["policies"]) == {"policy4", "policy5"} and full["epb"] == {"4": "6", "5": "6"}
    assert {p: pol(root, 4, p) for p in before} == before


def test_enforce_and_restore_governor_and_min(tree, tmp_path):
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    s = quiet.Settings(cpufreq="enforce", root=root)
    rec = quiet.begin(jdir, (4,), (4, 5), (0, 1), s, alone=False)
    for n in (4, 5):
        assert pol(root, n, "scaling_governor") == "performance"
        assert pol(root, n, "scaling_min_freq") == "4700000"
    assert pol(root, 3, "scaling_governor") == "powersave" and pol(root, 3, "scaling_min_freq") == "400000"
    assert rec["cpufreq"]["turbo"].startswith("turbo on")
    assert kfiles.read(root, cpufreq.NO_TURBO) == "0"
    kfiles.write(root, f"{cpufreq.CPUFREQ}/policy5/scaling_min_freq", "1000000")   # someone else's since
    undone = quiet.end(jdir, s)
    assert pol(root, 4, "scaling_governor") == "powersave" and pol(root, 4, "scaling_min_freq") == "400000"
    assert pol(root, 5, "scaling_governor") == "powersave" and pol(root, 5, "scaling_min_freq") == "1000000"
    assert len(undone["left"]) == 1 and "policy5/scaling_min_freq" in undone["left"][0]


@pytest.mark.parametrize("allowed,alone,expect_off", [(True, True, True), (True, False, False),
                                                      (False, True, False)])
def test_machine_wide_turbo_rules(tree, tmp_path, allowed, alone, expect_off):
    """The machine-wide switch goes off only for a job alone on the machine (--exclusive)."""
    root, jdir = tree("intel-pstate-turbo"), str(tmp_path)
    s = quiet.Settings(cpufreq="enforce", allow_turbo_off=allowed, root=root)
    rec = quiet.begin(jdir, (4,), (4, 5), (0, 1), s, alone=alone)
    assert kfiles.read(root, cpufreq.NO_TURBO) == ("1" if expect_off else "0")
    assert rec["cpufreq"]["turbo"].startswith("turbo off" if expect_off else "turbo on")
    quiet.end(jdir, s)
    assert kfiles.read(root, cpufreq.NO_TURBO) == "0"


def test_acpi_global_boost_and_shared_policy(tree, tmp_path):
    root, jdir = tree("acpi-cpufreq-boost"), str(tmp_path)
    s = quiet.Settings(cpufreq="enforce", allow_turbo_off=True, root=root)
    rec = quiet.begin(jdir, (6,), (6,), (0, 1), s, alone=True)
    assert pol(root, 6, "scaling_governor") == "schedutil"   # policy6 also governs CPU 7
    assert any("policy6" in n for n in rec["cpufreq"]["notes"])
    assert rec["cpufreq"]["turbo"] == "turbo off (cpufreq/boost)"
    assert kfiles.read(root, cpufreq.BOOST) == "0"
    quiet.end(jdir, s)
    assert kfiles.read(root, cpufreq.BOOST) == "1"
    rec = quiet.begin(jdir, (2,), (2,), (0, 1), s, alone=False)
    assert pol(root, 2, "scaling_governor") == "performance" and pol(root, 2, "scaling_min_freq") == "2400000"
    assert kfiles.read(root, cpufreq.BOOST) == "1" and rec["cpufreq"]["turbo"].startswith("turbo on")
    quiet.end(jdir, s)
    assert pol(root, 2, "scaling_governor") == "schedutil" and pol(root, 2, "scaling_min_freq") == "1200000"


def test_amd_per_policy_boost_is_the_jobs_own(tree, tmp_path):
    root, jdir = tree("amd-pstate-epp"), str(tmp_path)
    s = quiet.Settings(cpufreq="enforce", allow_turbo_off=True, root=root)
    rec = quiet.begin(jdir, (3,), (3,), (0,), s, alone=False)
    assert rec["cpufreq"]["state"]["amd_pstate"] == "active" and rec["cpufreq"]["state"]["boost"] is None
    assert rec["cpufreq"]["turbo"] == "turbo off (per-policy boost)"
    assert pol(root, 3, "boost") == "0" and pol(root, 2, "boost") == "1"
    assert rec["irqs"]["moved"] == [30, 31]
    quiet.end(jdir, s)
    assert pol(root, 3, "boost") == "1" and pol(root, 3, "scaling_governor") == "powersave"


def test_enforce_without_cpufreq(tmp_path):
    (tmp_path / "root").mkdir()
    rec = quiet.begin(str(tmp_path), (1,), (1,), (0,), quiet.Settings(cpufreq="enforce", root=str(tmp_path / "root")),
                      alone=True)
    assert rec["cpufreq"]["state"]["policies"] == [] and "no cpufreq" in rec["cpufreq"]["notes"][0]


# -- isolated partition -------------------------------------------------------
@pytest.mark.parametrize("text,state,reason", [
    ("isolated", "isolated", None), ("member", "member", None), ("root", "root", None),
    ("isolated invalid (Cpu list in cpuset.cpus not exclusive)", "isolated invalid",
     "Cpu list in cpuset.cpus not exclusive"),
    ("root invalid (Parent is not a partition root)", "root invalid", "Parent is not a partition root"),
    (None, "unsupported", None)])
def test_partition_state_parsing(text, state, reason):
    assert cpupartition.parse_state(text) == (state, reason)


def _cgroup(tmp_path, exclusive=True, partition=True):
    parent = tmp_path / "hpc-batch"
    cg = parent / "job-7"
    cg.mkdir(parents=True)
    if partition:
        (cg / cpupartition.PARTITION).write_text("member\n")
    if exclusive:
        (parent / cpupartition.EXCLUSIVE).write_text("9\n")
        (cg / cpupartition.EXCLUSIVE).write_text("\n")
    return str(cg), str(parent)


def test_isolated_partition_and_release(tmp_path):
    cg, parent = _cgroup(tmp_path)
    rec = cpupartition.isolate(cg, (4, 5))
    assert rec["partition"] == "isolated" and rec["state"] == "isolated" and rec["reason"] is None
    assert kfiles.read("/", os.path.join(parent, cpupartition.EXCLUSIVE)) == "4-5,9"
    assert kfiles.read("/", os.path.join(cg, cpupartition.EXCLUSIVE)) == "4-5"
    kfiles.write("/", os.path.join(parent, cpupartition.EXCLUSIVE), "2,4-5,9")   # another job's since
    assert cpupartition.release(cg, rec) is None
    assert kfiles.read("/", os.path.join(parent, cpupartition.EXCLUSIVE)) == "2,9"


def test_invalid_partition_falls_back_to_exclusive(tmp_path, monkeypatch):
    cg, _ = _cgroup(tmp_path)
    real = kfiles.write

    def kernel(r, rel, value):   # how the kernel reports a partition it cannot make
        real(r, rel, "isolated invalid (Parent is not a partition root)" if value == "isolated" else value)
    monkeypatch.setattr(kfiles, "write", kernel)
    rec = cpupartition.isolate(cg, (4, 5))
    assert rec["partition"] == "exclusive" and rec["state"].startswith("isolated invalid")
    assert rec["reason"] == "Parent is not a partition root"
    assert kfiles.read("/", os.path.join(cg, cpupartition.PARTITION)) == "member"


def test_no_partition_support(tmp_path):
    cg, _ = _cgroup(tmp_path, exclusive=False, partition=False)
    rec = cpupartition.isolate(cg, (4,))
    assert rec["partition"] == "allocation-only" and "no cpuset partitions" in rec["reason"]


def test_begin_records_partition_and_end_releases(tree, tmp_path):
    root = tree("intel-pstate-turbo")
    cg, parent = _cgroup(tmp_path)
    jdir = tmp_path / "jobdir"
    jdir.mkdir()
    rec = quiet.begin(str(jdir), (4,), (4, 5), (0, 1), quiet.Settings(root=root), True, cgroup=cg)
    assert rec["partition"] == {"partition": "isolated", "state": "isolated", "reason": None}
    quiet.end(str(jdir), quiet.Settings(root=root))
    assert kfiles.read("/", os.path.join(parent, cpupartition.EXCLUSIVE)) == "9"


def test_the_shepherds_stand_in_leaves_the_partition_and_has_it_back(tree, tmp_path, monkeypatch):
    """--housekeeping-cpus none with shepherds running (shepherdcpus): their explicit list gives up
    the job's CPUs before its partition is made, and has them back once the job's cgroup is gone."""
    root = tree("intel-pstate-turbo")
    cg, parent = _cgroup(tmp_path)
    shepherds = os.path.join(parent, cgroups.SHEPHERDS)
    os.mkdir(shepherds)
    for where in (parent, shepherds):
        with open(os.path.join(where, "cpuset.cpus.effective" if where == parent else "cpuset.cpus"), "w") as f:
            f.write("0-9\n")
    real_write, real_isolate = cgroups._write, cpupartition.isolate

    def populated(path, value):   # the kernel will not empty a populated cpuset's list
        if not value.strip():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, value)
    seen = []

    def isolate(c, cpus):
        seen.append(kfiles.read(shepherds, "cpuset.cpus"))
        return real_isolate(c, cpus)
    monkeypatch.setattr(cgroups, "_write", populated)
    monkeypatch.setattr(cpupartition, "isolate", isolate)
    settings = quiet.Settings(root=root, shepherds_root=parent)
    jdir = tmp_path / "jobdir"
    jdir.mkdir()
    quiet.begin(str(jdir), (4,), (4, 5), (0, 1), settings, True, cgroup=cg)
    assert seen == ["0-3,5-9"]
    shutil.rmtree(cg)   # the shepherd removes the job's cgroup before its end is seen
    quiet.end(str(jdir), settings)
    assert kfiles.read(shepherds, "cpuset.cpus") == "0-9"


# -- irqbalance ---------------------------------------------------------------
def test_irqbalance_not_running(tree):
    assert quiet.irqbalance(tree("intel-pstate-turbo"))["active"] is False


def test_irqbalance_by_systemd_unit(tmp_path):
    units = tmp_path / "run/systemd/units"
    units.mkdir(parents=True)
    os.symlink("0123abcd", units / "invocation:irqbalance.service")
    ib = quiet.irqbalance(str(tmp_path))
    assert ib["active"] and "systemd unit" in ib["how"]


def test_irqbalance_by_process_without_systemd(tmp_path):
    kfiles_dir = tmp_path / "proc/321"
    kfiles_dir.mkdir(parents=True)
    (kfiles_dir / "comm").write_text("irqbalance\n")
    assert quiet.irqbalance(str(tmp_path))["how"] == "process 321 runs"
    (tmp_path / "run/systemd/system").mkdir(parents=True)   # on systemd, the unit decides, not a scan
    assert quiet.irqbalance(str(tmp_path))["active"] is False


def test_irqbalance_recorded_and_banned_only_when_opted_in(tmp_path):
    short = tempfile.mkdtemp(prefix="q", dir="/tmp")   # a unix socket's path has at most 107 bytes
    root = os.path.join(short, "r")
    shutil.copytree(os.path.join(FIXTURES, "intel-pstate-turbo"), root)
    os.makedirs(os.path.join(root, "proc/321"))
    with open(os.path.join(root, "proc/321/comm"), "w") as f:
        f.write("irqbalance\n")
    os.makedirs(os.path.join(root, "etc/default"))
    with open(os.path.join(root, "etc/default/irqbalance"), "w") as f:
        f.write('# admin\nIRQBALANCE_BANNED_CPULIST="7"\n')
    sock_dir = os.path.join(root, irqsteer.IRQBALANCE_SOCKET_DIR)
    os.makedirs(sock_dir)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)   # as irqbalance does
    server.bind(os.path.join(sock_dir, "irqbalance321.sock"))
    server.listen(1)
    got = []

    def serve():
        for _ in range(2):
            conn, _ = server.accept()
            data, anc, _, _ = conn.recvmsg(100, socket.CMSG_SPACE(12))
            uid = [struct.unpack("iII", d)[1] for lvl, typ, d in anc
                   if (lvl, typ) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)]
            got.append((data, uid))   # irqbalance ignores a command without uid 0 credentials
            conn.close()
    t = threading.Thread(target=serve)
    t.start()
    rec = quiet.begin(str(tmp_path), (4,), (4, 5), (0, 1), quiet.Settings(root=root), True)
    assert rec["irqbalance"].startswith("active (its control socket is open)")
    assert "--irqbalance-ban" in rec["irqbalance"]
    assert quiet.ban(quiet.Settings(root=root), {4, 5}) == ""   # not opted in: irqbalance untouched
    note = quiet.ban(quiet.Settings(root=root, irqbalance_ban=True), {4, 5})
    last = quiet.ban(quiet.Settings(root=root, irqbalance_ban=True), set())
    t.join(10)
    server.close()
    shutil.rmtree(short)
    assert got == [(b"settings cpus 4-5,7", [0]), (b"settings cpus NULL", [0])]
    assert note == "irqbalance told to ban CPUs 4-5,7" and last == "irqbalance back to its own banned CPUs"


def test_irqbalance_own_choice(tmp_path):
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "sys/devices/system/cpu"))
    for name, value in (("isolated", "2-3"), ("nohz_full", "3,5")):
        with open(os.path.join(root, f"sys/devices/system/cpu/{name}"), "w") as f:
            f.write(value + "\n")
    assert irqsteer.base_banned(root) == {2, 3, 5}
    os.makedirs(os.path.join(root, "etc/sysconfig"))
    with open(os.path.join(root, "etc/sysconfig/irqbalance"), "w") as f:
        f.write("IRQBALANCE_BANNED_CPULIST=8-9\n")
    assert irqsteer.base_banned(root) == {8, 9}
    with open(os.path.join(root, "etc/sysconfig/irqbalance"), "w") as f:
        f.write('IRQBALANCE_BANNED_CPUS="00000001,0000ff00"\nIRQBALANCE_BANNED_CPULIST=8-9\n')
    assert irqsteer.base_banned(root) == set(range(8, 16)) | {32}


# -- daemon flags -------------------------------------------------------------
def test_daemon_flags():
    from hpc_batch import defaults
    from hpc_batch.daemon import main as daemon
    cfg = daemon.parse_args([])
    assert (cfg.cpufreq, cfg.allow_turbo_off, cfg.irqbalance_ban) == (defaults.CPUFREQ, False, False)
    assert defaults.CPUFREQ == "record"
    cfg = daemon.parse_args(["--cpufreq", "enforce", "--allow-turbo-off", "--irqbalance-ban"])
    assert (cfg.cpufreq, cfg.allow_turbo_off, cfg.irqbalance_ban) == ("enforce", True, True)
    for argv, needle in ((["--cpufreq", "pin"], "choose record or enforce"),
                         (["--allow-turbo-off"], "needs --cpufreq enforce")):
        with pytest.raises(daemon.ConfigError) as e:
            daemon.parse_args(argv)
        assert e.value.status == 2 and needle in str(e.value)

"""The setup digest (hpc_batch/core/setup.py): equal exactly when dispatch record diff says "comparable".

Two kinds of fixture records: the hand-built ones of test_recorddiff.py, and
records assembled as the shepherd does, from its own collectors over the
tests/fixtures/record/xeon-2s tree (a two-node Xeon: CPUs 0-1 and 4-5 on node
0 with governor powersave, 2-3 performance and 6-7 powersave with C6 off on
CPU 6, on node 1), the daemon's part from jobrecord.spec. Each table row
changes one thing; the property test holds the digest to comparable() over
every pair of all of them.
"""

import copy
import itertools
import json
import os
import re

import pytest
from test_recorddiff import f, gpu, record

from hpc_batch.client import recorddiff
from hpc_batch.core import resources, setup
from hpc_batch.core.cputopo import Cache, Cpu, CpuTopology
from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.jobs import Job
from hpc_batch.core.setup import comparable, differences, setup_digest
from hpc_batch.daemon import jobrecord
from shepherd.base import records, sysread
from shepherd.record import bounds, collect, software

XEON = os.path.join(os.path.dirname(__file__), "..", "fixtures", "record", "xeon-2s")


def _xeon():
    l3 = {0: Cache(3, "Unified", 0, (0, 1, 4, 5)), 1: Cache(3, "Unified", 1, (2, 3, 6, 7))}
    node = {c: 0 if c in (0, 1, 4, 5) else 1 for c in range(8)}
    cpus = {c: Cpu(c, node[c], c, (c,), (l3[node[c]],)) for c in range(8)}
    nodes = (resources.Node(0, (0, 1, 4, 5), 16 << 30), resources.Node(1, (2, 3, 6, 7), 16 << 30))
    return resources.Machine(nodes=nodes, cpu_topology=CpuTopology(cpus))


def real(job, cpus, argv=("./bench", "--n", "3"), env=None, others=None):
    """A record of *job* on *cpus* of the Xeon fixture, put together as shepherd/record/recorder.py does."""
    machine = _xeon()
    node = 0 if cpus[0] in (0, 1, 4, 5) else 1
    alloc = resources.Allocation(cpus=tuple(cpus), mem_by_node=((node, 1 << 30),), gpus=(), exclusive=False,
                                 cores=tuple((c,) for c in cpus))
    j = Job(id=job, uid=1000, gid=1000, user="alice", argv=list(argv), cwd="/home/alice", submitted=0.0, max_time=60,
            request=JobRequest.from_dict({"cpus": len(cpus)}))
    conf = jobrecord.spec(j, alloc, machine, {job: alloc, **(others or {})}, housekeeping=(0,), thresholds={},
                          nvidia_smi=None, root="/", cgroups=False, cpu_unit="core")
    rec = {"schema": 1, "job": job, "complete": True}
    rec.update(collect.sections(sysread.Source(XEON), job, "1.4.0", None, list(cpus), [node], None))
    launch = records.LaunchSpec.from_dict({
        "id": job, "user": "alice", "uid": 1000, "gid": 1000, "cwd": "/home/alice", "argv": list(argv),
        "env": env if env is not None else {"PATH": "/usr/bin", "HOME": "/home/alice", "HPC_BATCH_JOB_ID": str(job)}})
    rec["software"] = software.software(launch, False)
    rec["allocation"] = {"requested": conf["requested"], "read_back": rec["allocation"]["read_back"]}
    rec["machine"] = dict(conf["machine"], quiet={"value": None, "source": "quiet.json",
                                                  "error": "not a benchmark job, or nothing was changed"})
    rec["gpu"] = []
    rec["sentinels"] = {"delta": {"wall_s": 3.0 + job / 100, "interrupts": {}}}
    rec["verdict"] = {"verdict": "clean", "reasons": [], "causes": []}
    rec["digest"] = bounds.digest(rec)
    return rec


def both(a, b):
    """(digests equal, comparable) for records *a* and *b*."""
    return setup_digest(a) == setup_digest(b), comparable(differences(a, b))


def test_a_digest_is_sha256_and_none_for_what_is_not_a_record():
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", setup_digest(record()))
    assert setup_digest({}) is None and setup_digest({"job": 3, "verdict": {}}) is None
    assert setup_digest(None) is None and setup_digest([]) is None
    assert setup_digest({"schema": 1}) is not None     # a record cut to nothing still has its (empty) setup


# -- hand-built records: one change a row ------------------------------------------------

def _set(path, value):
    def change(rec):
        node = rec
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[keys[-1]] = value
        return rec
    return change


def _env_values(job_id):
    def change(rec):
        rec["software"]["environment"]["values"] = f({"HOME": "/home/a", "HPC_BATCH_JOB_ID": job_id}, "launch spec")
        return rec
    return change


def _with_gpus(*gpus):
    def change(rec):
        rec["gpu"] = list(gpus)
        return rec
    return change


def _reordered(rec):
    """Every dict's keys in reverse order: a record read back from another writer."""
    def flip(node):
        if isinstance(node, dict):
            return {k: flip(node[k]) for k in reversed(list(node))}
        if isinstance(node, list):
            return [flip(v) for v in node]
        return node
    return flip(rec)


def _del(path):
    def change(rec):
        node = rec
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]
        return rec
    return change


def _noisy(rec):
    rec["verdict"] = {"verdict": "noisy", "reasons": ["12 device interrupts on CPUs 2,3"],
                      "causes": ["device_interrupts"], "thresholds": {"device_irqs": 0}}
    rec["sentinels"]["delta"]["interrupts"] = {"24": {"counts": [12, 0], "desc": "nvme0q1"}}
    rec["complete"] = False
    return rec


def _base_gpu(rec):
    rec["gpu"] = [gpu(0, "GPU-0a1b", 35, {"sw_thermal_slowdown": "Not Active"})]
    return rec


def _same(rec):
    return rec


def _machine(node_cpus, l3_cpus, neighbours, housekeeping=(0,)):
    return _set("machine", {"housekeeping_cpus": list(housekeeping), "node_cpus": node_cpus, "l3_cpus": l3_cpus,
                            "jobs_on_same_node": neighbours})


def _held(cpus, cores, idle):
    return _set("allocation.requested", {"cpus": f(len(cpus), "request"), "held": cpus, "cores": cores, "idle": idle})


def _quiet(moved, still, to):
    return _set("machine", {"quiet": f({"housekeeping": "0", "irqs": {
        "to": to, "moved": moved, "refused": [], "still_on_job_cpus": still,
        "each": {str(i): {"result": "moved", "old": "0-7", "new": to, "effective": "0"} for i in moved}},
        "cpufreq": {"policy": "record", "changed": [[f"policy{moved[0] % 8}", "scaling_governor"]]}}, "quiet.json")})


# (what changes, what both records get first, the change to the second, whether the setup stays the same)
CHANGES = [
    ("another job id, times, pid, free memory, digest", _same, lambda r: record(job=14), True),
    ("the same shape on other CPUs, policies and node", _same,
     lambda r: record(cpus="22-23", policies="22-23", node="1"), True),
    ("a noisy verdict, its sentinels, an incomplete record", _same, _noisy, True),
    ("the job's own metrics", _same,
     _set("metrics", f({"gflops": {"values": [1.5], "last": 1.5, "unit": "GFLOP/s"}}, "metrics file")), True),
    ("another source and another reason for a null", _same,
     lambda r: _set("kernel.nohz_full.error", "EPERM")(_set("kernel.release.source", "uname(2)")(r)), True),
    ("hpc-batch's version, the boot id", _same,
     lambda r: _set("collector.boot_id.value", "b")(_set("collector.version.value", "9.9")(r)), True),
    ("the environment's whole digest and size (they count the job id)", _same,
     lambda r: _set("software.environment.sha256.value", "e" * 64)(_set("software.environment.bytes.value", 99)(r)),
     True),
    ("--record-env values differing only in the job's id", _env_values("12"), _env_values("99"), True),
    ("a whole number written as a float", _same, _set("allocation.requested.cpus.value", 2.0), True),
    ("a null dropped (absent and null read the same)", _same, _del("kernel.nohz_full"), True),
    ("every dict's keys in another order", _same, _reordered, True),
    ("what the size bound cut", _same, _set("cut", ["sentinels.start.interrupts"]), True),
    ("the node's and L3's CPUs of the same count elsewhere, other neighbours",
     _machine([0, 1, 2, 3], [0, 1], []), _machine([20, 21, 22, 23], [20, 21], [7]), True),
    ("held CPUs and cores of the same shape elsewhere",
     _held([2, 3], [[2, 3]], [3]), _held([22, 23], [[22, 23]], [23]), True),
    ("other IRQs moved away at a benchmark job's start, one still there",
     _quiet([24], [], "0-1"), _quiet([24, 25, 31], [31], "0,4"), True),
    ("another kernel", _same, _set("kernel.release.value", "6.1.0-19-amd64"), False),
    ("mitigations=off on the command line", _same, _set("kernel.cmdline.value", "ro quiet mitigations=off"), False),
    ("another CPU model", _same, _set("cpu.model_name.value", "Intel(R) Xeon(R) Gold 6348"), False),
    ("another microcode", _same, _set("cpu.microcode.value", "0x5003605"), False),
    ("another governor", _same, _set("frequency.policies.0.scaling_governor.value", "powersave"), False),
    ("a wider allocation", _same,
     lambda r: _set("allocation.requested.cpus.value", 4)(record(cpus="2-5", policies="2-5")), False),
    ("another executable", _set("software.executable", {"sha256": f("e" * 64, "the executable")}),
     _set("software.executable", {"sha256": f("f" * 64, "the executable")}), False),
    ("another argv", _same, _set("software.argv.value", ["./bench", "--size", "8192"]), False),
    ("another submitted environment", _same, _set("software.environment.submitted_sha256.value", "d" * 64), False),
    ("another machine", _same, _set("collector.hostname.value", "node2"), False),
    ("THP on", _same, _set("memory.thp_enabled.value", "always"), False),
    ("nohz_full read where it was not", _same,
     _set("kernel.nohz_full", f("2-7", "/sys/devices/system/cpu/nohz_full")), False),
    ("true written as 1", _same, _set("cpu.smt_active.value", 1), False),
    ("other housekeeping CPUs", _machine([0, 1, 2, 3], [0, 1], []), _machine([0, 1, 2, 3], [0, 1], [], (0, 1)),
     False),
    ("two cores instead of one of two threads", _held([2, 3], [[2, 3]], [3]), _held([2, 3], [[2], [3]], [3]), False),
    ("a benchmark job's other cpufreq policy", _quiet([24], [], "0-1"),
     lambda r: _set("machine.quiet.value.cpufreq.policy", "enforce")(_quiet([24], [], "0-1")(r)), False),
    ("another user variable with --record-env", _env_values("12"),
     lambda r: _set("software.environment.values.value.HOME", "/x")(r), False),
]


def _pair(base, change):
    a = base(record(job=12))
    b = change(copy.deepcopy(a))
    return a, b


@pytest.mark.parametrize(("base", "change", "same"), [(b, c, s) for _, b, c, s in CHANGES],
                         ids=[d for d, _, _, _ in CHANGES])
def test_one_change_moves_the_digest_exactly_when_it_makes_the_records_incomparable(base, change, same):
    a, b = _pair(base, change)
    assert both(a, b) == (same, same), [d for d in differences(a, b) if setup.classify(*d) == "setup"]


def test_gpus_of_the_same_model_elsewhere_keep_the_digest_another_driver_does_not():
    a = _base_gpu(record())
    elsewhere = _with_gpus(gpu(2, "GPU-9f8e", 41, {"sw_thermal_slowdown": "Active"}))(record())
    assert both(a, elsewhere) == (True, True)
    driver = copy.deepcopy(elsewhere)
    driver["gpu"][0]["driver_version"]["value"] = "535.104.05"
    assert both(a, driver) == (False, False)
    two = _with_gpus(gpu(0, "GPU-0a1b", 35, {}), gpu(1, "GPU-77", 30, {}))(record())
    assert both(a, two) == (False, False)


# -- records assembled as the shepherd does ------------------------------------------------

def test_real_records_of_the_same_shape_on_other_cpus_share_the_digest():
    a, b = real(21, [0, 1]), real(22, [4, 5], others={30: resources.Allocation((2,), ((1, 1),), (), False)})
    assert a["digest"] != b["digest"]                  # the records differ: times, ids, placement, neighbours
    assert both(a, b) == (True, True)


@pytest.mark.parametrize(("cpus", "what"), [
    ([2, 3], "governor performance, EPB 0"),
    ([6, 7], "C6 disabled on CPU 6 and node 1's memory"),
    ([0, 1, 4], "three CPUs"),
])
def test_real_records_of_another_setup_differ(cpus, what):
    a, b = real(21, [0, 1]), real(22, cpus)
    assert both(a, b) == (False, False), what


def test_real_records_of_another_command_or_environment_differ():
    a = real(21, [0, 1])
    assert both(a, real(22, [0, 1], argv=("./bench", "--n", "4"))) == (False, False)
    assert both(a, real(22, [0, 1], env={"PATH": "/usr/bin", "HOME": "/home/bob", "HPC_BATCH_JOB_ID": "22"})) == \
        (False, False)
    assert both(a, real(22, [0, 1], env={"PATH": "/usr/bin", "HOME": "/home/alice", "HPC_BATCH_JOB_ID": "9"})) == \
        (True, True)


def _fixtures():
    out = {"hand 12": record(job=12), "hand 13": record(job=13),
           "hand elsewhere": record(cpus="22-23", policies="22-23", node="1"), "hand gpu": _base_gpu(record())}
    for desc, base, change, _ in CHANGES:
        a, b = _pair(base, change)
        out[f"hand: {desc} (before)"] = a
        out[f"hand: {desc}"] = b
    for job, cpus in ((21, [0, 1]), (22, [4, 5]), (23, [2, 3]), (24, [6, 7]), (25, [0, 1, 4])):
        out[f"xeon {cpus}"] = real(job, cpus)
    return out


def test_property_over_every_pair_of_fixture_records_digest_equality_is_comparable():
    recs = _fixtures()
    digests = {name: setup_digest(rec) for name, rec in recs.items()}
    wrong, answers = [], []
    for (na, a), (nb, b) in itertools.combinations(recs.items(), 2):
        same, comp = digests[na] == digests[nb], comparable(differences(a, b))
        answers.append(comp)
        if same != comp:
            wrong.append(f"{na} / {nb}: digests {'equal' if same else 'differ'}, comparable() is {comp}")
    assert not wrong, "\n".join(wrong)
    # and no trivial mix: both answers are well represented
    assert answers.count(True) > 200 and answers.count(False) > 1000, (answers.count(True), answers.count(False))


def test_recorddiff_uses_the_cores_rules_and_the_per_job_variables_are_the_shepherds():
    assert recorddiff.classify is setup.classify and recorddiff.differences is setup.differences
    assert recorddiff.comparable is setup.comparable and recorddiff.Difference is setup.Difference
    assert setup.PER_JOB_VARS == software.PER_JOB_VARS


def test_placement_counts_and_the_quiet_outcome_are_classified_as_docs_say():
    assert setup.classify("allocation", "requested.held", [2, 3], [22, 23]) == "noted"
    assert setup.classify("allocation", "requested.cores[0]", [2, 3], [22]) == "setup"
    assert setup.classify("machine", "node_cpus", [0, 1], [2, 3]) == "noted"
    assert setup.classify("machine", "housekeeping_cpus", [0], [1]) == "setup"
    assert setup.classify("machine", "quiet.irqs.each.24.effective", "0", "1") == "run"
    assert setup.classify("machine", "quiet.irqs.to", "0-1", "2-3") == "noted"
    assert setup.classify("machine", "quiet.cpufreq.policy", "record", "enforce") == "setup"
    assert setup.classify("software", "environment.values.HPC_BATCH_JOB_ID", "1", "2") == "noted"
    assert setup.classify("metrics", "gflops.last", 1.0, 2.0) == "run"


def _awkward():
    """A record whose keys need escaping, sort by their quotes and separators, and number CPUs."""
    rec = record()
    rec["cpu"]["n\u00e9e \"q\\"] = f("x")
    rec["cpu"]["n"] = f("y")
    rec["cpu"]["n, b"] = f("z")
    rec["cpu"]["n~"] = f("t")          # after "n\u00e9..." as JSON text, before "n\xe9..." as the characters
    rec["frequency"] = {"value": {"cpu10": {"governor": "performance"}, "cpu2": {"governor": "powersave"},
                                  "list": [{"a": 1}, {"a": [1, 2.0]}]}, "source": "/sys"}
    return rec


@pytest.mark.parametrize("make", [lambda: real(7, [0, 1]), lambda: real(8, [2, 3]), _awkward])
def test_terms_are_ordered_by_the_json_text_of_their_paths_as_every_digest_before(make):
    # Archived digests were taken of terms sorted by json.dumps of each path; the walk now builds
    # that text as it goes, and must order the terms the same way, or every digest would move.
    terms = setup.setup_terms(make())
    assert len(terms) > 10
    texts = [json.dumps(t[0]) for t in terms]
    assert texts == sorted(texts) and len(set(texts)) == len(texts)


# Taken by the code of 095760d, which sorted the terms with a json.dumps of each path.
DIGESTS_BEFORE = [
    (lambda: real(7, [0, 1]), "sha256:bcf16ace04fc17bbd41bb8c8db6aa5167944970261ea8caf1122e943ac4d4048"),
    (_awkward, "sha256:8df7cc2f4d1ce7c9af8563ec4a535c3a044fdcbaac0eb44222f49082ba7b0505"),
]


@pytest.mark.parametrize("make,before", DIGESTS_BEFORE)
def test_a_digest_taken_before_the_walk_built_its_sort_text_is_unchanged(make, before):
    assert setup_digest(make()) == before


def test_the_kinds_kept_between_records_are_bounded_and_change_no_digest(monkeypatch):
    monkeypatch.setattr(setup, "KINDS_KEPT", 8)
    setup._KINDS.clear()
    rec = real(7, [0, 1])
    assert setup_digest(rec) == DIGESTS_BEFORE[0][1]
    assert 0 < len(setup._KINDS) <= 8
    many = copy.deepcopy(rec)
    many["software"]["names"] = {f"v{i}": f(str(i)) for i in range(50)}   # a user's names: new paths
    first = setup_digest(many)
    assert len(setup._KINDS) <= 8
    setup._KINDS.clear()
    assert setup_digest(many) == first   # the same with nothing kept

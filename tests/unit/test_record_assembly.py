"""The record's assembly (shepherd/record/) and the daemon's part of it (hpc_batch/daemon/jobrecord.py)."""

import hashlib
import json

import pytest

from hpc_batch.core import resources
from hpc_batch.core.cputopo import Cache, Cpu, CpuTopology
from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.jobs import Job
from hpc_batch.daemon import jobrecord
from shepherd.base import records
from shepherd.record import bounds, software, verdict


def _spec(**kw):
    spec = {"id": 7, "user": "alice", "uid": 1000, "gid": 1000, "cwd": "/home/alice",
            "argv": ["./bench", "--n", "3"], "env": {"PATH": "/usr/bin", "HOME": "/home/alice", "TOKEN": "s3cret"}}
    spec.update(kw)
    return records.LaunchSpec.from_dict(spec)


def test_the_environment_is_keys_a_digest_and_a_size_never_values_unless_asked():
    sw = software.software(_spec(), env_values=False)
    env = sw["environment"]
    assert env["keys"]["value"] == ["HOME", "PATH", "TOKEN"]
    block = b"HOME=/home/alice\0PATH=/usr/bin\0TOKEN=s3cret\0"
    assert env["sha256"]["value"] == hashlib.sha256(block).hexdigest()
    assert env["bytes"]["value"] == len(block)
    assert "values" not in env and "s3cret" not in json.dumps(sw)
    asked = software.software(_spec(), env_values=True)["environment"]
    assert asked["values"]["value"]["TOKEN"] == "s3cret"
    assert asked["sha256"] == env["sha256"]          # the same environment, the same digest


def test_the_digest_does_not_depend_on_key_order_and_changes_with_one_value():
    a = {"schema": 1, "job": 3, "kernel": {"cmdline": {"value": "quiet", "source": "/proc/cmdline"}}}
    b = {"kernel": {"cmdline": {"source": "/proc/cmdline", "value": "quiet"}}, "job": 3, "schema": 1}
    assert bounds.digest(a) == bounds.digest(b)
    assert bounds.digest(a) == bounds.digest(dict(a, digest="sha256:whatever"))   # the digest leaves itself out
    c = json.loads(json.dumps(a))
    c["kernel"]["cmdline"]["value"] = "quiet isolcpus=2"
    assert bounds.digest(c) != bounds.digest(a)


@pytest.mark.parametrize("rec", [{}, {"schema": 1, "job": 7, "kernel": {"release": "6.1"}, "zeta": [1, 2.5, None]},
                                 {"digest": "sha256:stale", "b": "\u00e9\n\"", "a": True}])
def test_a_written_record_is_its_canonical_text_with_its_digest_of_that_text(rec):
    data = bounds.bounded(dict(rec))
    out = json.loads(data)
    body = {k: v for k, v in rec.items() if k != "digest"}
    assert out == dict(body, digest=bounds.digest(rec)) and out["digest"] != "sha256:stale"
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert data.startswith(canonical[:-1]) and data.endswith(b'"digest":"' + out["digest"].encode() + b'"}')
    assert out["digest"] == "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_user_strings_are_capped_and_a_huge_record_is_cut_to_its_bound_naming_what_went():
    long_arg = "x" * 100_000
    sw = software.software(_spec(argv=["./bench", long_arg], env={f"K{i}": "v" * 100 for i in range(5000)}), True)
    assert len(sw["argv"]["value"][1]) < bounds.STRING_CAP + 64
    assert sw["environment"]["count"]["value"] == 5000
    assert len(sw["environment"]["keys"]["value"]) == bounds.LIST_CAP
    rec = {"schema": 1, "job": 1, "complete": True, "collector": {}, "software": sw,
           "sentinels": {"start": {"interrupts": {"x": "y" * 300_000}}, "end": {}, "delta": {}},
           "verdict": {"verdict": "unknown", "reasons": []}}
    data = bounds.bounded(rec)
    assert len(data) <= bounds.MAX_BYTES
    out = json.loads(data)
    assert "sentinels.start.interrupts" in out["cut"]
    assert out["digest"] == bounds.digest(out)
    assert out["verdict"]["verdict"] == "unknown"


def test_a_record_nothing_can_be_cut_from_keeps_what_identifies_the_run():
    rec = {"schema": 1, "job": 1, "complete": True, "collector": {"x": "y" * 400_000},
           "verdict": {"verdict": "noisy", "reasons": ["r"]}}
    out = json.loads(bounds.bounded(rec))
    assert out["verdict"]["verdict"] == "noisy" and "collector" not in out and out["cut"]


def test_admin_thresholds_are_checked_against_the_verdicts_names():
    name = sorted(verdict.THRESHOLDS)[0]
    assert jobrecord.parse_thresholds([f"{name}=2.5"]) == {name: 2.5}
    with pytest.raises(jobrecord.ThresholdError, match="NAME=VALUE"):
        jobrecord.parse_thresholds(["no_such_threshold=1"])
    with pytest.raises(jobrecord.ThresholdError, match="not a number"):
        jobrecord.parse_thresholds([f"{name}=lots"])
    with pytest.raises(jobrecord.ThresholdError, match="from 0 up"):
        jobrecord.parse_thresholds([f"{name}=-1"])
    with pytest.raises(jobrecord.ThresholdError):
        jobrecord.parse_thresholds([f"{name}=nan"])


def _machine():
    # Two nodes of two 2-thread cores; one L3 per node.
    l3 = {0: Cache(3, "Unified", 0, (0, 1, 2, 3)), 1: Cache(3, "Unified", 1, (4, 5, 6, 7))}
    cpus = {c: Cpu(c, c // 4, (c % 4) // 2, (c - c % 2, c - c % 2 + 1), (l3[c // 4],)) for c in range(8)}
    nodes = (resources.Node(0, (0, 1, 2, 3), 16 << 30), resources.Node(1, (4, 5, 6, 7), 16 << 30))
    return resources.Machine(nodes=nodes, cpu_topology=CpuTopology(cpus))


def test_the_daemons_part_names_the_neighbours_on_the_same_node_and_l3_by_id():
    m = _machine()
    job = Job(id=9, uid=1000, gid=1000, user="alice", argv=["x"], cwd="/", submitted=0.0, max_time=60,
              request=JobRequest.from_dict({"cpus": 2, "record_to": "/home/alice/r", "record_is_dir": True,
                                             "record_env": True}))
    mine = resources.Allocation(cpus=(0, 1), mem_by_node=((0, 1 << 30),), gpus=(), exclusive=False)
    near = resources.Allocation(cpus=(2, 3), mem_by_node=((0, 1 << 30),), gpus=(), exclusive=False)
    far = resources.Allocation(cpus=(4, 5), mem_by_node=((1, 1 << 30),), gpus=(), exclusive=False)
    out = jobrecord.spec(job, mine, m, {9: mine, 3: near, 4: far}, housekeeping=(0,), thresholds={},
                         nvidia_smi=None, root="/", cgroups=True, cpu_unit="core")
    assert out["machine"]["jobs_on_same_node"] == [3] and out["machine"]["jobs_on_same_l3"] == [3]
    assert out["node_cpus"] == [0, 1, 2, 3] and out["l3_cpus"] == [0, 1, 2, 3]
    assert out["requested"]["l3_ids"] == [0] and out["mems"] == [0]
    assert out["to"] == "/home/alice/r/record.9.json" and out["env_values"] is True
    assert "record_to" not in out["requested"]["request"]
    assert out["gpus"] == [] and out["nvidia_smi"] is None

"""--metrics-file's pure half (state -> snapshot -> registry -> text) and its writer.

The text is read back with prometheus_client's own parser, so what is
checked is what Prometheus would see, sample by sample.
"""

import errno
import logging
import os
import stat
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpc_batch.core import gputopo, metrics
from hpc_batch.core.jobs import RESULTS, Job, Result, move
from hpc_batch.core.resources import Allocation, Limits, Machine, Node
from hpc_batch.daemon import main as daemon
from hpc_batch.daemon import metrics_file
from hpc_batch.daemon.ratelog import RateLimited

GiB = 1 << 30
T0 = 1_800_000_000.0

# Two nodes of 4 CPUs and 16 GiB; GPU 0 hangs off node 0, GPU 1 off node 1, GPU 2 off no known node.
MACHINE = Machine(nodes=(Node(0, (0, 1, 2, 3), 16 * GiB), Node(1, (4, 5, 6, 7), 16 * GiB)), gpus=(0, 1, 2),
                  topology=gputopo.Topology((0, 1, 2), {}, {0: 0, 1: 1, 2: None}))
LIMITS = Limits(reserve_cpu=1, reserve_mem=2 * GiB, min_job_mem=GiB)


def job(job_id, user, state="queued", alloc=None, result=None):
    """A job record in *state*, moved there through the life-cycle table."""
    j = Job(id=job_id, uid=1000 + len(user), gid=100, user=user, argv=["true"], cwd="/", submitted=T0,
            max_time=60, budget={"mem": GiB}, state="waiting" if state == "waiting" else "queued")
    if alloc is not None:
        move(j, "running", T0, alloc=alloc.to_dict())
    if result is not None:
        move(j, "finished", T0 + 1, result)
    return j


def parse(text):
    """{(sample name, frozenset of label items): value} and {family name: type}."""
    samples, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return samples, types


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


A1 = Allocation((4, 5), ((1, 4 * GiB),), (1,), False)        # alice: 2 CPUs, 4 GiB and GPU 1 on node 1
B1 = Allocation((1,), ((0, 3 * GiB),), (2,), False)          # bob: 1 CPU, 3 GiB on node 0, GPU 2


def state():
    jobs = [job(1, "alice", "running", A1), job(2, "alice"), job(3, "alice"), job(4, "alice", "waiting"),
            job(5, "bob", "running", B1),
            job(6, "bob", alloc=Allocation((0,), ((0, GiB),), (), False), result=Result("exited", code=3)),
            job(7, "carol", result=Result("cancelled"))]
    tally = metrics.Tally(start_time=T0 - 50)
    for event, result in [("submitted", None)] * 7 + [("started", None)] * 3 + [
            ("finished", "exited"), ("finished", "cancelled"), ("finished", "exited"), ("finished", "bogus")]:
        tally.note(event, result)
    return jobs, tally


def test_every_value_of_a_known_state():
    jobs, tally = state()
    snap = metrics.take(jobs, MACHINE, LIMITS, [A1, B1], tally, "9.8.7")
    samples, types = parse(metrics.render(snap).decode())
    p = "hpc_batch_"
    # Per user: every user with a job remembered, zeros included.
    for user, (waiting, queued, running) in {"alice": (1, 2, 1), "bob": (0, 0, 1), "carol": (0, 0, 0)}.items():
        assert value(samples, p + "jobs_waiting", user=user) == waiting
        assert value(samples, p + "jobs_queued", user=user) == queued
        assert value(samples, p + "jobs_running", user=user) == running
    # Counters since the start; every result kind present, an unknown kind not counted.
    assert value(samples, p + "jobs_submitted_total") == 7 and value(samples, p + "jobs_started_total") == 3
    finished = {kind: value(samples, p + "jobs_finished_total", result=kind) for kind in RESULTS}
    assert finished == {kind: {"exited": 2, "cancelled": 1}.get(kind, 0) for kind in RESULTS}
    # Per node: totals, the reserve (off node 0), what the running jobs hold.
    expect = {
        "cpus": {"0": 4, "1": 4}, "cpus_reserved": {"0": 1, "1": 0}, "cpus_in_use": {"0": 1, "1": 2},
        "memory_bytes": {"0": 16 * GiB, "1": 16 * GiB}, "memory_reserved_bytes": {"0": 2 * GiB, "1": 0},
        "memory_in_use_bytes": {"0": 3 * GiB, "1": 4 * GiB},
        "gpus": {"0": 1, "1": 1, "unknown": 1}, "gpus_in_use": {"0": 0, "1": 1, "unknown": 1},
    }
    for name, per_node in expect.items():
        got = {dict(labels)["node"]: v for (n, labels), v in samples.items() if n == p + name}
        assert got == per_node, name
    assert value(samples, p + "daemon_start_time_seconds") == T0 - 50
    assert value(samples, p + "daemon_info", version="9.8.7") == 1
    # Types as Prometheus reads them, and nothing but hpc_batch_* in the file.
    assert types[p + "jobs_finished"] == "counter" and types[p + "jobs_queued"] == "gauge"
    assert types[p + "daemon_info"] == "gauge"     # the text format has no info type
    assert all(name.startswith(p) for name, _ in samples)
    assert len(samples) == 3 * 3 + 2 + len(RESULTS) + 6 * 2 + 2 * 3 + 2


def test_no_gpus_and_no_jobs():
    plain = Machine(nodes=(Node(0, (0, 1), 4 * GiB),))
    snap = metrics.take([], plain, Limits(reserve_cpu=0, reserve_mem=0), [], metrics.Tally(T0), "1")
    samples, _ = parse(metrics.render(snap).decode())
    assert value(samples, "hpc_batch_gpus", node="0") == 0
    assert not [n for n, labels in samples if dict(labels).get("node") == "unknown"]
    assert not [n for n, _ in samples if n == "hpc_batch_jobs_queued"]


def test_snapshots_are_equal_exactly_when_the_file_would_be():
    jobs, tally = state()
    a = metrics.take(jobs, MACHINE, LIMITS, [A1, B1], tally, "1")
    assert a == metrics.take(list(reversed(jobs)), MACHINE, LIMITS, [A1, B1], tally, "1")
    tally.note("submitted")
    b = metrics.take(jobs, MACHINE, LIMITS, [A1, B1], tally, "1")
    assert b != a and metrics.render(b) != metrics.render(a)
    assert metrics.take(jobs, MACHINE, LIMITS, [A1], tally, "1") != b


def test_tally_round_trip_and_refusals():
    t = metrics.Tally(T0, submitted=5, started=4, finished={"exited": 3, "oom": 1})
    assert metrics.Tally.from_text(t.to_text()) == t
    for bad in ('[]', '{"start_time": "x", "submitted": 1, "started": 1, "finished": {}}',
                f'{{"start_time": {T0}, "submitted": -1, "started": 1, "finished": {{}}}}',
                f'{{"start_time": {T0}, "submitted": 1, "started": true, "finished": {{}}}}',
                f'{{"start_time": {T0}, "submitted": 1, "started": 1, "finished": {{"nope": 1}}}}',
                f'{{"start_time": {T0}, "submitted": 1, "started": 1, "finished": {{"oom": 1.5}}}}'):
        with pytest.raises(ValueError):
            metrics.Tally.from_text(bad)


# -- the writer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,needle", [
    ("metrics.txt", "must end in .prom"), (".prom", "must end in .prom"),
    ("no-such-dir/m.prom", "does not exist"), ("adir.prom", "is a directory"),
])
def test_bad_paths_are_refused_with_the_reason(tmp_path, name, needle):
    (tmp_path / "adir.prom").mkdir()
    with pytest.raises(metrics_file.MetricsError) as info:
        metrics_file.check(str(tmp_path / name))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_flag_is_checked_as_it_is_parsed(tmp_path, monkeypatch):
    # So a reload whose new flags name a bad path keeps the old flags (reload_args parses them first).
    monkeypatch.chdir(tmp_path)
    assert daemon.parse_args(["--metrics-file", "hpc.prom"]).metrics_file == str(tmp_path / "hpc.prom")
    assert daemon.parse_args([]).metrics_file is None
    with pytest.raises(daemon.ConfigError) as info:
        daemon.parse_args(["--metrics-file", "gone/hpc.prom"])
    assert info.value.status == 78 and "does not exist" in str(info.value)


def test_write_replaces_whole_with_0640_whatever_the_umask(tmp_path):
    path = str(tmp_path / "m.prom")
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    os.symlink(target, path)                          # a link at the path is replaced, never followed
    old = os.umask(0o077)
    try:
        metrics_file.write_atomic(path, b"a 1\n")
    finally:
        os.umask(old)
    assert open(path, "rb").read() == b"a 1\n" and target.read_text() == "keep"
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "m.prom"]


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "m.prom")
    metrics_file.write_atomic(path, b"old 1\n")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(metrics_file.os, "write", full)
    with pytest.raises(OSError):
        metrics_file.write_atomic(path, b"new 2\n")
    assert open(path, "rb").read() == b"old 1\n" and os.listdir(tmp_path) == ["m.prom"]


def fake_engine():
    jobs, _ = state()
    return SimpleNamespace(jobs={j.id: j for j in jobs}, machine=MACHINE, limits=LIMITS,
                           table=SimpleNamespace(allocs=lambda: [A1, B1]))


def test_writes_are_coalesced_and_only_on_change(tmp_path):
    path = str(tmp_path / "m.prom")
    eng = fake_engine()
    mf = metrics_file.MetricsFile(path, eng)
    assert mf.tick(T0) is None and os.path.exists(path)          # at start
    first = os.stat(path).st_ino
    mf.job_event(2, "submitted")
    assert mf.tick(T0 + 0.3) == T0 + metrics_file.INTERVAL     # changed, but too soon: look again then
    assert os.stat(path).st_ino == first
    assert mf.tick(T0 + 1.0) is None and os.stat(path).st_ino != first
    samples, _ = parse(open(path).read())
    assert value(samples, "hpc_batch_jobs_submitted_total") == 1
    second = os.stat(path).st_ino
    assert mf.tick(T0 + 5) is None and os.stat(path).st_ino == second    # nothing changed: no write
    mf.job_event(6, "finished")                                  # the result comes from the job record
    assert mf.tick(T0 + 5.5) == T0 + 6                           # looked a moment ago: at most once a second
    assert mf.tick(T0 + 6) is None
    samples, _ = parse(open(path).read())
    assert value(samples, "hpc_batch_jobs_finished_total", result="exited") == 1


def test_a_failing_write_is_logged_once_retried_and_never_raised(tmp_path, caplog, monkeypatch):
    d = tmp_path / "textfile"
    d.mkdir()
    mf = metrics_file.MetricsFile(str(d / "m.prom"), fake_engine())
    d.rmdir()                                                    # the directory vanished under the daemon
    seconds = iter(range(1000))                                  # one second a line: inside the log's interval
    monkeypatch.setattr(metrics_file, "rlog", RateLimited(logging.getLogger("hpc-batchd"), clock=seconds.__next__))
    with caplog.at_level(logging.ERROR, logger="hpc-batchd"):
        assert mf.tick(T0) == T0 + metrics_file.RETRY
        assert mf.tick(T0 + 1) == T0 + metrics_file.RETRY        # waits for the retry
        assert mf.tick(T0 + metrics_file.RETRY) == T0 + 2 * metrics_file.RETRY
    lines = [r.getMessage() for r in caplog.records if "metrics file" in r.getMessage()]
    assert len(lines) == 1 and "keeping the old one" in lines[0]
    d.mkdir()
    assert mf.tick(T0 + 2 * metrics_file.RETRY) is None and (d / "m.prom").exists()


def test_counters_carried_across_a_reload_and_a_bad_hand_over_ignored(tmp_path, caplog):
    eng = fake_engine()
    mf = metrics_file.MetricsFile(str(tmp_path / "m.prom"), eng)
    for event in ("submitted", "submitted", "started"):
        mf.job_event(1, event)
    again = metrics_file.MetricsFile(str(tmp_path / "m.prom"), eng, mf.tally.to_text())
    assert again.tally == mf.tally
    with caplog.at_level(logging.WARNING, logger="hpc-batchd"):
        fresh = metrics_file.MetricsFile(str(tmp_path / "m.prom"), eng, "{not json")
    assert fresh.tally.submitted == 0 and "counting from zero" in caplog.text

"""hpc-batchd --metrics-file: a real daemon, real users, the file read with prometheus_client's parser.

The state is built with the real dispatch as two test users: a job that
exited 3, one killed while running, an exclusive one running, three queued
behind it and one waiting for it to end. The file must say exactly that, value by
value, and keep saying it (counters included) across a reload.
"""

import json
import os
import signal
import subprocess

import pytest
from conftest import Daemon, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(120)
P = "hpc_batch_"


def read_metrics(path):
    """{(sample name, frozenset of labels): value} of the file as Prometheus would read it, or None."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def by_label(samples, name, label):
    """{label value: value} of one metric."""
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name}


def one(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def state_of(d, job, user):
    return json.loads(d.ok("show", str(job), "--json", user=user))["state"]


def wait_metrics(path, predicate, what):
    """The parsed file once *predicate* holds for it (polled, with a deadline); shows the file if it never does."""
    try:
        return wait_for(lambda: (s := read_metrics(path)) is not None and predicate(s) and s, timeout=30, what=what)
    except AssertionError as exc:
        try:
            with open(path) as f:
                text = f.read()
        except OSError as why:
            text = str(why)
        raise AssertionError(f"{exc}; the file says:\n{text}") from None


def test_the_file_says_what_the_daemon_holds(daemon_factory, users, scratch):
    textdir = os.path.join(scratch, "textfile")
    os.mkdir(textdir)
    path = os.path.join(textdir, "hpc_batch.prom")
    d = daemon_factory("--metrics-file", path)
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    # Written at start, before any job.
    first = wait_metrics(path, lambda s: one(s, P + "jobs_submitted_total") == 0, "the file at start")
    start_time = one(first, P + "daemon_start_time_seconds")
    assert start_time is not None and one(first, P + "daemon_info", version=_version()) == 1
    assert os.stat(path).st_mode & 0o777 == 0o640     # not everyone's: per-user counts (node_exporter reads by group)
    quiet = ("--no-output",)

    exited = d.submit("sh", "-c", "exit 3", flags=quiet, user=alice)
    d.wait_finished(exited, user=alice)
    killed = d.submit("sleep", "60", flags=quiet, user=bob)
    wait_for(lambda: state_of(d, killed, bob) == "running", what="job to run")
    d.ok("kill", str(killed), user=bob)
    d.wait_finished(killed, user=bob)
    big = d.submit("sleep", "60", flags=quiet + ("--exclusive",), user=bob)   # the whole machine
    wait_for(lambda: state_of(d, big, bob) == "running", what="exclusive job to run")
    for who in (alice, bob, alice):
        d.submit("true", flags=quiet, user=who)
    d.submit("true", flags=quiet + ("--after", str(big)), user=bob)

    s = wait_metrics(path, lambda s: one(s, P + "jobs_submitted_total") == 7, "seven submits in the file")
    jobs = {name: by_label(s, P + "jobs_" + name, "user") for name in ("waiting", "queued", "running")}
    assert jobs == {"waiting": {alice: 0, bob: 1}, "queued": {alice: 2, bob: 1}, "running": {alice: 0, bob: 1}}
    assert one(s, P + "jobs_started_total") == 3
    finished = by_label(s, P + "jobs_finished_total", "result")
    assert finished.pop("exited") == 1 and finished.pop("killed") == 1
    assert set(finished.values()) == {0} and "cancelled" in finished and "oom" in finished
    assert one(s, P + "daemon_start_time_seconds") == start_time
    # Per NUMA node: the figures dispatch status shows, the exclusive job holding every offered CPU.
    status = json.loads(d.ok("status", "--json"))
    shown = json.loads(d.ok("show", str(big), "--json", user=bob))
    for node in status["nodes"]:
        n = str(node["id"])
        for metric, key, part in (("cpus", "cpus", "total"), ("cpus_reserved", "cpus", "reserved"),
                                  ("cpus_in_use", "cpus", "in_use"), ("memory_bytes", "mem", "total"),
                                  ("memory_reserved_bytes", "mem", "reserved"),
                                  ("memory_in_use_bytes", "mem", "in_use"), ("gpus", "gpus", "total"),
                                  ("gpus_in_use", "gpus", "in_use")):
            assert one(s, P + metric, node=n) == node[key][part], (metric, n)
        assert node["cpus"]["in_use"] == node["cpus"]["total"] - node["cpus"]["reserved"] > 0
    assert sum(by_label(s, P + "cpus_in_use", "node").values()) == len(shown["cpus"])
    assert sum(by_label(s, P + "memory_in_use_bytes", "node").values()) == shown["mem"]
    assert set(by_label(s, P + "cpus", "node")) == {str(n["id"]) for n in status["nodes"]}

    # A reload re-execs the daemon: the flag and the counters carry over, the start time too.
    seen = d.log().count("ready on")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: d.log().count("ready on") > seen and d.ping(), what="reload")
    d.submit("true", flags=quiet, user=bob)
    s = wait_metrics(path, lambda s: one(s, P + "jobs_submitted_total") == 8, "a submit after the reload")
    assert one(s, P + "jobs_started_total") == 3 and one(s, P + "daemon_start_time_seconds") == start_time
    assert one(s, P + "jobs_queued", user=bob) == 2
    # End the exclusive job: everything behind it runs and ends.
    d.ok("kill", str(big), user=bob)
    s = wait_metrics(path, lambda s: one(s, P + "jobs_finished_total", result="exited") == 6, "the queue drained")
    assert one(s, P + "jobs_finished_total", result="killed") == 2 and one(s, P + "jobs_started_total") == 8
    assert all(v == 0 for name in ("waiting", "queued", "running")
               for v in by_label(s, P + "jobs_" + name, "user").values())
    assert set(by_label(s, P + "cpus_in_use", "node").values()) == {0}
    assert os.listdir(textdir) == ["hpc_batch.prom"]     # no temporary file left behind


def _version():
    from hpc_batch import __version__
    return __version__


def _refusal(scratch, *args, env=None):
    r = subprocess.run(Daemon(scratch, args).command(), capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, **(env or {})))
    lines = [line for line in r.stderr.splitlines() if "refusing" in line or "--metrics-file" in line]
    return r.returncode, lines


@pytest.mark.parametrize("name,needle", [
    ("no-such-dir/hpc.prom", "does not exist; create it"),
    ("hpc.txt", "must end in .prom"),
])
def test_a_bad_path_is_refused_at_start(scratch, users, name, needle):
    rc, lines = _refusal(scratch, "--metrics-file", os.path.join(scratch, name))
    assert rc == 78 and len(lines) == 1 and needle in lines[0], lines


def test_without_prometheus_client_only_the_flag_is_refused(daemon_factory, scratch, users):
    # A prometheus_client that cannot be imported, ahead of the real one: as if the extra were missing.
    stub = os.path.join(scratch, "stub", "prometheus_client")
    os.makedirs(stub)
    with open(os.path.join(stub, "__init__.py"), "w") as f:
        f.write("raise ModuleNotFoundError(\"No module named 'prometheus_client'\", name='prometheus_client')\n")
    env = {"PYTHONPATH": os.path.dirname(stub)}
    rc, lines = _refusal(scratch, "--metrics-file", os.path.join(scratch, "hpc.prom"), env=env)
    assert rc == 78 and len(lines) == 1 and "pip install 'hpc-batch[metrics]'" in lines[0], lines
    assert not os.path.exists(os.path.join(scratch, "hpc.prom"))
    # Without the flag the daemon never imports it: it starts and runs jobs.
    d = daemon_factory(env=env)
    assert d.ok("status").startswith("policy ")

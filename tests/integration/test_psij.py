"""PSI/J jobs through the hpc-batch executor, against a real daemon with the real dispatch.

The executor is found the way a user's PSI/J finds it (the descriptor the
test venv's install of the wheel put in psij-descriptors/), submits with
dispatch new, and learns each start and end from the daemon's watch stream.
psij_portable.py is one PSI/J script run unchanged through hpc-batch and
PSI/J's own local executor (and, in test_psij_slurm.py, Slurm), here also as
a test user.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import wait_for
from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    ResourceSpecV1,
    SubmitException,
)
from test_gpus import _fake

from hpc_batch.client.connection import Connection

pytestmark = pytest.mark.timeout(120)
HERE = os.path.dirname(os.path.abspath(__file__))
PORTABLE = os.path.join(HERE, "psij_portable.py")
LONG = timedelta(seconds=60)     # a bound on job.wait, never a sleep


@pytest.fixture
def hb(daemon_factory, users):
    return daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")


@pytest.fixture
def ex(hb):
    return JobExecutor.get_instance("hpc-batch", url=hb.socket)


def hold(flag: Path, then: str = "true") -> list[str]:
    """sh -c arguments: wait for *flag* to exist, then run *then*."""
    return ["-c", f'while [ ! -e "{flag}" ]; do sleep 0.05; done; {then}']


class Seen:
    """The states callbacks report, per job, in order."""

    def __init__(self):
        self.states: dict[str, list[str]] = {}
        self.cv = threading.Condition()

    def __call__(self, job, status):
        with self.cv:
            self.states.setdefault(job.id, []).append(status.state.name)
            self.cv.notify_all()

    def of(self, job, until: str | None = None) -> list[str]:
        """*job*'s states; with *until*, once that one has been reported (a callback runs after Job.wait wakes)."""
        with self.cv:
            if until is not None:
                assert self.cv.wait_for(lambda: until in self.states.get(job.id, []), timeout=30), self.states
            return list(self.states.get(job.id, []))


def run(ex, spec, seen=None) -> tuple:
    job = Job(spec)
    if seen is not None:
        job.set_job_status_callback(seen)
    ex.submit(job)
    status = job.wait(timeout=LONG)
    assert status is not None, f"{job} did not end"
    return job, status


def test_the_executor_is_found_by_name_from_the_installed_wheel(hb):
    assert "hpc-batch" in JobExecutor.get_executor_names()
    ex = JobExecutor.get_instance("hpc-batch", url=f"unix://{hb.socket}")
    assert type(ex).__name__ == "HpcBatchJobExecutor" and ex.name == "hpc-batch"
    site = Path(type(ex).__psij_file__).parents[2]    # hpc_batch/psij/executor.py, loaded by path from the install
    assert (site / "psij-descriptors" / "hpc_batch.py").is_file()
    with pytest.raises(ValueError, match="absolute path"):
        JobExecutor.get_instance("hpc-batch", url="relative.sock")


def test_each_mapped_field(hb, ex, scratch, monkeypatch):
    work = Path(scratch)
    (work / "sub").mkdir()
    (work / "in.txt").write_text("input line\n")
    monkeypatch.setenv("PSIJ_FORWARDED", "from the submitter")
    cores = min(2, os.cpu_count() or 1)
    script = ('echo "args=$#:$1:$2"; echo "var=$PSIJ_VAR fwd=$PSIJ_FORWARDED"; pwd; nproc; cat; '
              'echo to-err >&2; exit 0')
    spec = JobSpec(executable="/bin/sh", arguments=["-c", script, "sh", "a  b", "*"], directory=work / "sub",
                   name="fields", inherit_environment=False, environment={"PSIJ_VAR": "v 1"},
                   stdin_path=work / "in.txt", stdout_path=work / "out.txt", stderr_path=work / "err.txt",
                   resources=ResourceSpecV1(cpu_cores_per_process=cores, memory=512 << 20),
                   attributes=JobAttributes(duration=timedelta(minutes=7),
                                            custom_attributes={"hpc-batch.numa-local-mem": True}))
    job, status = run(ex, spec)
    assert (status.state, status.exit_code) == (JobState.COMPLETED, 0), status.message
    assert (work / "out.txt").read_text() == f"args=2:a  b:*\nvar=v 1 fwd=\n{work / 'sub'}\n{cores}\ninput line\n"
    assert (work / "err.txt").read_text() == "to-err\n"
    assert status.metadata["nativeId"] == job.native_id and status.metadata["output"] == str(work / "out.txt")
    shown = json.loads(hb.ok("show", "--json", job.native_id))
    assert (shown["name"], shown["max_time"], shown["mem"], shown["cwd"]) == ("fields", 420, 512 << 20,
                                                                               str(work / "sub"))
    assert len(shown["cpus"]) == cores and shown["request"]["numa_local"] is True and shown["exclusive"] is False

    # inherit_environment (PSI/J's default) forwards the submitter's environment; exclusive takes the machine.
    spec = JobSpec(executable="/bin/sh", arguments=["-c", 'echo "fwd=$PSIJ_FORWARDED"; nproc'],
                   directory=work, stdout_path=work / "inherit.txt",
                   resources=ResourceSpecV1(exclusive_node_use=True))
    job, status = run(ex, spec)
    assert status.state == JobState.COMPLETED
    shown = json.loads(hb.ok("show", "--json", job.native_id))
    offered = sum(n["cpus"]["total"] - n["cpus"]["reserved"] for n in json.loads(hb.ok("status", "--json"))["nodes"])
    assert (work / "inherit.txt").read_text() == f"fwd=from the submitter\n{offered}\n"
    assert len(shown["cpus"]) == offered and shown["exclusive"] is True
    assert shown["name"] == "sh" and shown["max_time"] == 600   # the executable's name, PSI/J's default duration


def test_failures(hb, ex, scratch):
    work = Path(scratch)
    seen = Seen()

    def spec(*args, **kw):
        kw.setdefault("stdout_path", work / "o")
        return JobSpec(executable="/bin/sh", arguments=["-c", *args], directory=work, **kw)

    job, status = run(ex, spec("echo partial; exit 3"), seen)
    assert (status.state, status.exit_code, status.message) == (JobState.FAILED, 3, None)
    assert seen.of(job, "FAILED") == ["QUEUED", "ACTIVE", "FAILED"]
    assert (work / "o").read_text() == "partial\n"

    job, status = run(ex, spec("kill -SEGV $$"))
    assert (status.state, status.exit_code, status.message) == (JobState.FAILED, 139, "killed by SIGSEGV")

    job, status = run(ex, spec("exec sleep 60", attributes=JobAttributes(duration=timedelta(seconds=1))))
    assert (status.state, status.exit_code) == (JobState.FAILED, None)
    assert status.message.startswith("ran past its duration") and status.metadata["result"] == "timeout"

    job, status = run(ex, JobSpec(executable=str(work / "missing"), directory=work), seen)
    assert status.state == JobState.FAILED and status.message.startswith("could not be run: ")
    assert "missing" in status.message
    assert seen.of(job, "FAILED") == ["QUEUED", "ACTIVE", "FAILED"]   # its shepherd started; the exec failed


def test_cancel_running_and_queued(hb, ex, scratch):
    work = Path(scratch)
    seen = Seen()
    # An exclusive job holds the machine, so the next one stays queued until it ends.
    running = Job(JobSpec(executable="/bin/sh", arguments=hold(work / "never"), directory=work,
                          resources=ResourceSpecV1(exclusive_node_use=True)))
    queued = Job(JobSpec(executable="/bin/true", directory=work))
    for job in (running, queued):
        job.set_job_status_callback(seen)
        ex.submit(job)
    assert running.wait(timeout=LONG, target_states=[JobState.ACTIVE]).state == JobState.ACTIVE
    assert queued.status.state == JobState.QUEUED
    queued.cancel()
    status = queued.wait(timeout=LONG)
    assert (status.state, status.message) == (JobState.CANCELED, "cancelled by root before it started")
    assert seen.of(queued, "CANCELED") == ["QUEUED", "CANCELED"]
    running.cancel()
    status = running.wait(timeout=LONG)
    assert status.state == JobState.CANCELED and status.metadata["result"] == "killed"
    assert seen.of(running, "CANCELED") == ["QUEUED", "ACTIVE", "CANCELED"]
    running.cancel()      # already final: nothing to do, no error


def test_callbacks_fire_in_order_and_active_comes_at_the_start(hb, ex, scratch):
    work = Path(scratch)
    per_job, per_executor = Seen(), Seen()
    ex.set_job_status_callback(per_executor)
    first = Job(JobSpec(executable="/bin/sh", arguments=hold(work / "go1"), directory=work,
                        resources=ResourceSpecV1(exclusive_node_use=True)))
    second = Job(JobSpec(executable="/bin/sh", arguments=hold(work / "go2", "echo done"), directory=work,
                         stdout_path=work / "second.out"))
    for job in (first, second):
        job.set_job_status_callback(per_job)
        ex.submit(job)
    first.wait(timeout=LONG, target_states=[JobState.ACTIVE])
    assert second.status.state == JobState.QUEUED
    (work / "go1").touch()
    # second starts once first has ended, and is reported ACTIVE while it still waits for go2:
    # the start is pushed by the daemon, not found at the end.
    assert second.wait(timeout=LONG, target_states=[JobState.ACTIVE]).state == JobState.ACTIVE
    assert not (work / "go2").exists() and second.status.state == JobState.ACTIVE
    assert first.status.state == JobState.COMPLETED
    (work / "go2").touch()
    assert second.wait(timeout=LONG).state == JobState.COMPLETED
    assert (work / "second.out").read_text() == "done\n"
    for seen in (per_job, per_executor):
        for job in (first, second):
            assert seen.of(job, "COMPLETED") == ["QUEUED", "ACTIVE", "COMPLETED"]


def test_a_gpu_job(daemon_factory, users, scratch):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", env=_fake(scratch))
    ex = JobExecutor.get_instance("hpc-batch", url=d.socket)
    work = Path(scratch)
    spec = JobSpec(executable="/bin/sh", arguments=["-c", 'echo "$CUDA_VISIBLE_DEVICES"'], directory=work,
                   stdout_path=work / "gpus.out",
                   resources=ResourceSpecV1(gpu_cores_per_process=2, memory=256 << 20),
                   attributes=JobAttributes(custom_attributes={"hpc-batch.gpu-link": "NV",
                                                               "hpc-batch.numa-local-gpu": True}))
    job, status = run(ex, spec)
    assert status.state == JobState.COMPLETED, status.message
    assert (work / "gpus.out").read_text() == "0,1\n"      # an NVLink pair (the fake's 0-1 and 2-3)
    shown = json.loads(d.ok("show", "--json", job.native_id))
    assert shown["gpus"] == [0, 1] and shown["request"]["gpu_link"] == "NV"
    # Three GPUs joined by NVLink do not exist there: refused at submit, not queued for ever.
    spec.resources = ResourceSpecV1(gpu_cores_per_process=3)
    with pytest.raises(InvalidJobException, match="hpc-batch refused the job"):
        ex.submit(Job(spec))


def test_refusals_use_psijs_exceptions(daemon_factory, users, scratch):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", "--max-lifetime", "1h")
    ex = JobExecutor.get_instance("hpc-batch", url=d.socket)
    work = Path(scratch)

    def refused(exc_type, needle, **kw):
        kw.setdefault("directory", work)
        job = Job(JobSpec(executable="/bin/true", **kw))
        with pytest.raises(exc_type) as info:
            ex.submit(job)
        assert needle in info.value.message, info.value.message
        assert job.status.state == JobState.NEW and job.native_id is None   # nothing was queued
        return info.value

    refused(InvalidJobException, "asks for 2 nodes", resources=ResourceSpecV1(node_count=2))
    refused(InvalidJobException, "--cpu 64 can never fit", resources=ResourceSpecV1(cpu_cores_per_process=64))
    refused(InvalidJobException, "exceeds the limit", attributes=JobAttributes(duration=timedelta(hours=2)))
    refused(InvalidJobException, "does not exist", stdout_path=work / "no" / "such" / "dir" / "out")
    refused(InvalidJobException, "does not exist", directory=work / "nowhere")
    refused(InvalidJobException, "unknown custom attribute",
            attributes=JobAttributes(custom_attributes={"hpc-batch.cpu": 2}))
    assert json.loads(d.ok("list", "--finished", "--json"))["jobs"] == []
    gone = JobExecutor.get_instance("hpc-batch", url=str(work / "no.sock"))
    with pytest.raises(SubmitException) as info:
        gone.submit(Job(JobSpec(executable="/bin/true")))
    assert info.value.transient and "cannot reach hpc-batchd" in info.value.message


def test_attach_and_list(hb, ex, scratch):
    work = Path(scratch)
    native = hb.submit("sh", *hold(work / "go", "exit 4"), cwd=scratch)
    assert str(native) in ex.list()
    job = Job()
    ex.attach(job, str(native))
    assert job.native_id == str(native) and job.status.state in (JobState.QUEUED, JobState.ACTIVE)
    (work / "go").touch()
    status = job.wait(timeout=LONG)
    assert (status.state, status.exit_code) == (JobState.FAILED, 4)
    assert str(native) not in ex.list()
    with pytest.raises(InvalidJobException, match="no such job"):
        ex.attach(Job(), "999")


def test_the_end_is_learned_across_a_daemon_restart(hb, ex, scratch):
    work = Path(scratch)
    job = Job(JobSpec(executable="/bin/sh", arguments=hold(work / "go", "echo survived"), directory=work,
                      stdout_path=work / "o"))
    ex.submit(job)
    job.wait(timeout=LONG, target_states=[JobState.ACTIVE])
    hb.stop()                      # the job runs on under its shepherd
    (work / "go").touch()
    wait_for(lambda: (work / "o").exists(), what="the job to end while the daemon is down")
    assert job.status.state == JobState.ACTIVE      # nobody could say otherwise yet
    hb.start()
    status = job.wait(timeout=LONG)
    assert (status.state, status.exit_code) == (JobState.COMPLETED, 0)
    assert (work / "o").read_text() == "survived\n"


def test_watch_streams_only_the_callers_own_job_changes(hb, users, scratch):
    conn = Connection(hb.socket)
    conn.sock.settimeout(30)
    conn.send("watch")
    assert conn.receive()["event"] == "watching"
    alice = users["alice"].pw_name
    theirs = hb.submit("true", flags=("--no-output",), user=alice, cwd=scratch)
    hb.wait_finished(theirs, user=alice)
    mine = hb.submit("sh", "-c", "exit 5", flags=("--no-output",), cwd=scratch)
    events = [conn.receive(), conn.receive()]
    conn.close()
    # Alice's job ended first; had her changes leaked they would have come before these.
    assert [(e["event"], e["job"]["id"], e["job"]["state"]) for e in events] == [
        ("job", mine, "running"), ("job", mine, "finished")]
    assert events[1]["job"]["result"]["code"] == 5 and events[1]["job"]["exit"] == "5"
    assert "command" not in events[1]["job"]


def _portable(executor, work, user=None, url=None, env=None):
    """Run psij_portable.py (as *user*, from a copy that user can read); its JSON, paths made relative."""
    script = os.path.join(work, "psij_portable.py")
    shutil.copy(PORTABLE, script)
    argv = [sys.executable, script, executor, work] + ([url] if url else [])
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": os.path.expanduser("~"),
           **(env or {})}
    if user:
        argv = ["runuser", "-u", user, "--", "env", f"HOME=/home/{user}", *argv]
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.replace(work, "<work>"))


EXPECTED = {
    "hello": ("COMPLETED", 0, {"stdout": "hello two  words *\n"}),
    "env": ("COMPLETED", 0, {"stdout": "value with spaces\n"}),
    "directory": ("COMPLETED", 0, {"stdout": "<work>/sub\n"}),
    "streams": ("COMPLETED", 0, {"stdout": "to-out\n", "stderr": "to-err\n"}),
    "stdin": ("COMPLETED", 0, {"stdout": "line one\nline two\n"}),
    "fails": ("FAILED", 3, {"stdout": "failing\n"}),
}


def test_the_same_script_gives_the_same_results_through_psijs_local_executor(hb, scratch):
    results = {}
    for executor in ("hpc-batch", "local"):
        work = os.path.join(scratch, executor)
        os.mkdir(work)
        results[executor] = _portable(executor, work, url=hb.socket if executor == "hpc-batch" else None)
    assert results["hpc-batch"] == results["local"]
    got = results["hpc-batch"]
    for key, (final, code, files) in EXPECTED.items():
        assert (got[key]["final"], got[key]["exit_code"]) == (final, code), (key, got[key])
        assert {k: got[key][k] for k in files} == files, key
        assert got[key]["states"] == ["QUEUED", "ACTIVE", final], key
    assert got["user"]["stdout"] == "root\n"


def test_a_test_user_runs_the_script_and_the_jobs_run_as_them(hb, users, scratch):
    alice = users["alice"]
    work = os.path.join(scratch, "alice")
    os.mkdir(work)
    os.chown(work, alice.pw_uid, alice.pw_gid)
    got = _portable("hpc-batch", work, user=alice.pw_name, url=hb.socket)
    for key, (final, code, files) in EXPECTED.items():
        assert (got[key]["final"], got[key]["exit_code"]) == (final, code), (key, got[key])
        assert {k: got[key][k] for k in files} == files, key
    assert got["user"]["stdout"] == f"{alice.pw_name}\n"
    assert os.stat(os.path.join(work, "hello.out")).st_uid == alice.pw_uid
    jobs = json.loads(hb.ok("list", "--all", "--finished", "--json"))["jobs"]
    assert {j["user"] for j in jobs} == {alice.pw_name} and len(jobs) == len(got)

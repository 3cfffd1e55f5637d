"""Reload (SIGHUP), crashes and shepherd deaths: every job keeps its real outcome."""

import json
import os
import signal
import subprocess

import pytest
from conftest import DISPATCH, exit_of, wait_for

pytestmark = pytest.mark.timeout(120)


def _running(d, job):
    d.wait_running(job)
    status = os.path.join(d.state_dir, "jobs", str(job), "status.json")
    wait_for(lambda: os.path.exists(status), what="shepherd status")


def test_sighup_reexecs_and_keeps_running_job(daemon, scratch):
    flag = os.path.join(scratch, "go")
    job = daemon.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 5")
    _running(daemon, job)
    pid = daemon.proc.pid
    daemon.proc.send_signal(signal.SIGHUP)
    # Same pid, re-executed: it answers again and still lists the job as running.
    wait_for(lambda: "reloading" in daemon.log() and daemon.ping(), what="reload")
    wait_for(lambda: daemon.log().count("ready on") >= 2, what="second ready line")
    assert daemon.proc.pid == pid and daemon.proc.poll() is None
    assert "finished" not in daemon.rows("--finished")[job]
    later = daemon.submit("true")
    assert later == job + 1
    open(flag, "w").close()
    assert exit_of(daemon.wait_finished(job)) == "5"


def test_attach_survives_reload(daemon, scratch):
    flag = os.path.join(scratch, "go")
    job = daemon.submit("sh", "-c", f"echo before; while [ ! -e {flag} ]; do sleep 0.05; done; echo after")
    _running(daemon, job)
    p = subprocess.Popen([DISPATCH, "attach", str(job)], env={"HPC_BATCH_SOCKET": daemon.socket},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "before\n"
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: daemon.log().count("ready on") >= 2, what="reload")
    open(flag, "w").close()
    out, err = p.communicate(timeout=60)
    assert out == "after\n", err
    assert "exit 0" in err and "restarted" in err


def test_pid_reuse_is_not_adopted(daemon_factory, users, scratch):
    d = daemon_factory()
    flag = os.path.join(scratch, "go")
    job = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done")
    _running(d, job)
    jdir = os.path.join(d.state_dir, "jobs", str(job))
    d.kill9()
    # The shepherd dies without a record, and a stranger takes over its pidfile's pid.
    with open(os.path.join(jdir, "shepherd.pid")) as f:
        shepherd_pid = int(f.read().split()[0])
    os.kill(shepherd_pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{shepherd_pid}") or
             open(f"/proc/{shepherd_pid}/stat").read().split()[2] == "Z", what="shepherd gone")
    stranger = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(jdir, "shepherd.pid"), "w") as f:
        f.write(f"{stranger.pid} 12345\n")
    try:
        d2 = daemon_factory()
        row = d2.wait_finished(job)
        assert exit_of(row) == "lost" and "shepherd" in row   # vanished unseen: how it ended is unknown
        assert stranger.poll() is None   # the stranger was neither adopted nor harmed
    finally:
        stranger.kill()
        open(flag, "w").close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_admin_kills_shepherd(daemon, scratch, sig):
    job = daemon.submit("sh", "-c", "sleep 60 & sleep 60; wait")
    _running(daemon, job)
    jdir = os.path.join(daemon.state_dir, "jobs", str(job))
    with open(os.path.join(jdir, "shepherd.pid")) as f:
        shepherd_pid = int(f.read().split()[0])
    with open(os.path.join(jdir, "status.json")) as f:
        job_pid = json.load(f)["job_pid"]
    with open(f"/proc/{shepherd_pid}/cmdline", "rb") as f:
        cmdline = f.read().split(b"\0")
    assert b"--job" in cmdline and str(job).encode() in cmdline and b"root" in cmdline
    os.kill(shepherd_pid, sig)
    row = daemon.wait_finished(job)
    assert exit_of(row) == "killed" and "shepherd was killed" in row

    def group_gone():
        try:
            os.killpg(job_pid, 0)
            return False
        except ProcessLookupError:
            return True
    wait_for(group_gone, what="job's processes gone")


def test_daemon_down_message_and_reconnect(daemon_factory, users):
    d = daemon_factory()
    d.stop()
    r = d.dispatch("list")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and d.socket in r.stderr
    d2 = daemon_factory()
    assert d2.dispatch("list").returncode == 0


def test_job_whose_shepherd_never_started_runs_once(daemon_factory, users, scratch):
    d = daemon_factory()
    job = d.submit("sh", "-c", "echo ran >> " + os.path.join(scratch, "runs") + "; exit 9")
    d.wait_finished(job)
    d.stop()
    # Rewind it to the moment between "recorded as running" and the shepherd's start.
    jdir = os.path.join(d.state_dir, "jobs", str(job))
    with open(os.path.join(jdir, "job.json")) as f:
        rec = json.load(f)
    rec.update(state="running", ended=None, result=None, stats={})
    with open(os.path.join(jdir, "job.json"), "w") as f:
        json.dump(rec, f)
    launch = {"id": job, "user": "root", "uid": 0, "gid": 0, "cwd": scratch, "argv": rec["argv"],
              "env": {"PATH": "/usr/bin:/bin"}, "output": None, "admin_gid": 0, "cpus": None,
              "cgroup": None, "shepherd_cgroup": None}
    with open(os.path.join(jdir, "launch.json"), "w") as f:
        json.dump(launch, f)
    for name in ("shepherd.pid", "exit.json", "delivery.json", "status.json"):
        try:
            os.unlink(os.path.join(jdir, name))
        except FileNotFoundError:
            pass
    d2 = daemon_factory()
    wait_for(lambda: d2.jobs("--finished").get(job, {}).get("exit") == "9", timeout=30, backoff=0.2,
             what="rerun result")
    with open(os.path.join(scratch, "runs")) as f:
        assert f.read() == "ran\nran\n"     # once before the rewind, exactly once after

"""Out of pids (issue 20, F8): a hostile user against a root daemon, and shepherds that cannot fork.

The stand-in for a machine out of pids is a cgroup v1 pids group: fork()
inside it fails with EAGAIN once ``pids.max`` tasks are in it, exactly as
when the kernel's pid_max or threads-max is reached (RLIMIT_NPROC would not
do: root's forks ignore it, and the daemon, fork server and shepherds are
root's). Either the whole daemon runs in the group (under --no-cgroups its
fork server, shepherds and jobs with it), or one shepherd started by hand.
Skipped where this host has no v1 pids controller (on a cgroup v2 host the
same would need a v2 group with pids.max; not written yet).
"""

import itertools
import os
import signal
import subprocess
import sys
import time

import pytest
from ci_host import require
from conftest import exit_of, wait_for
from test_hostile import alive, job_dir

from hpc_batch.daemon import launcher
from shepherd.base import records

pytestmark = pytest.mark.timeout(240)
PIDS = "/sys/fs/cgroup/pids"
_serial = itertools.count()


@pytest.fixture
def pids_group():
    """A fresh pids group of our own; whatever is left in it at the end is killed, then it goes."""
    require(os.path.isfile(os.path.join(PIDS, "cgroup.procs")),
            "no cgroup v1 pids controller at /sys/fs/cgroup/pids on this host")
    path = os.path.join(PIDS, f"hpcb-test-{os.getpid()}-{next(_serial)}")
    os.mkdir(path)
    yield path
    _set_max(path, "max")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = _procs(path)
        if not left:
            break
        for pid in left:   # every process in it was started by this test (its daemon or shepherd)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    os.rmdir(path)


def _procs(group):
    with open(os.path.join(group, "cgroup.procs")) as f:
        return [int(p) for p in f.read().split()]


def _set_max(group, value):
    with open(os.path.join(group, "pids.max"), "w") as f:
        f.write(str(value))


def _current(group):
    with open(os.path.join(group, "pids.current")) as f:
        return int(f.read())


def _inside(group):
    """A wrap that moves the command into *group* before it runs (exec keeps the pid)."""
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh"]


def _fork_servers(d):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if b"--fork-server" in argv and int(stat[stat.rfind(b")") + 2:].split()[1]) == d.proc.pid:
            found.append(int(entry))
    return found


HOG = """\
import os, signal, time
while True:            # fork until the machine says no, and hold every pid
    try:
        pid = os.fork()
    except OSError:    # full: and a pid another task frees (a shepherd's short-lived child) is taken too
        time.sleep(0.01)
        continue
    if pid == 0:
        signal.pause()
        os._exit(0)
"""


def test_out_of_pids_other_users_jobs_wait_then_run(daemon_factory, users, scratch, pids_group):
    """Alice takes every pid; bob's jobs wait in the queue, then run with their own exit codes."""
    _set_max(pids_group, 40)
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", wrap=_inside(pids_group))
    try:
        _alice_takes_every_pid(d, users, scratch, pids_group)
    except BaseException:
        print(f"--- daemon log:\n{d.log()}")
        raise


def _alice_takes_every_pid(d, users, scratch, pids_group):
    alice, bob = users["alice"], users["bob"]
    (server,) = wait_for(lambda: _fork_servers(d), what="the fork server")
    hog = os.path.join(scratch, "hog.py")
    with open(hog, "w") as f:
        f.write(HOG)
    os.chmod(hog, 0o644)
    attack = d.submit(sys.executable, "-I", hog, user=alice.pw_name, cwd=alice.pw_dir, flags=("--no-output",))
    wait_for(lambda: _current(pids_group) >= 40, what="alice's job to take every pid")

    victims = {d.submit("sh", "-c", f"exit {code}", user=bob.pw_name, cwd=bob.pw_dir,
                        flags=("--no-output",)): str(code) for code in (3, 4, 5)}
    # The first in line is tried (its shepherd cannot be forked, or cannot fork it) and goes back
    # to the queue, more than once; the others wait behind it (fifo-strict).
    first = min(victims)
    wait_for(lambda: d.log().count(f"job {first}: ") >= 2 and "queued again" in d.log(),
             timeout=60, what=f"bob's job {first} to be tried twice and queued again")
    rows = d.rows("--finished", user=bob.pw_name)
    assert all(" queued " in rows[job] for job in victims), rows
    assert os.path.exists(os.path.join(job_dir(d, first), "launch.json"))   # it was started, and is queued
    alive(d, bob.pw_name)

    d.ok("kill", str(attack), user=alice.pw_name)
    assert exit_of(d.wait_finished(attack, timeout=60, user=alice.pw_name)) == "killed"
    for job, code in victims.items():
        row = d.wait_finished(job, timeout=60, user=bob.pw_name)
        assert exit_of(row) == code, f"{row}\n--- daemon log:\n{d.log()}"
    log = d.log()
    assert "Traceback" not in log and "fork server failed" not in log, log
    assert _fork_servers(d) == [server]       # the same server, still serving: bob's jobs came from it
    assert d.proc.poll() is None


def _hand_made_job(scratch, user, argv, **spec):
    """A job directory with a launch spec, as the daemon writes one; returns it."""
    jdir = os.path.join(scratch, "job")
    os.mkdir(jdir, 0o755)
    launch = {"id": 1, "user": user.pw_name, "uid": user.pw_uid, "gid": user.pw_gid, "cwd": user.pw_dir,
              "argv": argv, "env": {"PATH": "/usr/bin:/bin"}, "output": None, "umask": 0o022,
              "admin_gid": None, "cpus": None, "cgroup": None, "shepherd_cgroup": None, "deadline": None,
              "kill_grace": 1.0, "delivery_limit": 30.0, "max_output_buffer": 1 << 20, "fork_retry": 60.0}
    launch.update(spec)
    records.write_json(os.path.join(jdir, records.LAUNCH), launch)
    return jdir


def _shepherd_in(group, user, jdir):
    """Start a shepherd for *jdir* by hand, alone in *group*."""
    exe, argv, env = launcher.shepherd_argv(1, user.pw_name, jdir)
    return subprocess.Popen([*_inside(group), *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _record(jdir, kind=records.ExitRecord, name=records.EXIT):
    return records.read_record(os.path.join(jdir, name), kind)


def test_a_shepherd_that_cannot_fork_its_job_says_so_and_keeps_the_spec(users, scratch, pids_group):
    """Alone in a group with room for itself only: no traceback, a record the daemon can act on."""
    bob = users["bob"]
    log = os.path.join(scratch, "bob.log")
    jdir = _hand_made_job(scratch, bob, ["true"], output=log, fork_retry=1.0)
    _set_max(pids_group, 1)
    proc = _shepherd_in(pids_group, bob, jdir)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    rec = _record(jdir)
    assert rec.not_started == "EAGAIN" and "cannot fork the job" in rec.error, rec.to_dict()
    assert rec.status is None and rec.code is None
    # The spec stays (the daemon queues the job again with its environment); nothing was delivered.
    assert records.read_json(os.path.join(jdir, records.LAUNCH))["argv"] == ["true"]
    delivery = _record(jdir, records.DeliveryRecord, records.DELIVERY)
    assert delivery.ok and "never started" in delivery.note
    assert not os.path.exists(log)


def test_a_stop_while_the_fork_is_retried_ends_the_job_unrun(users, scratch, pids_group):
    bob = users["bob"]
    jdir = _hand_made_job(scratch, bob, ["true"])
    _set_max(pids_group, 1)
    proc = _shepherd_in(pids_group, bob, jdir)
    wait_for(lambda: launcher.request_stop(jdir, "killed"), what="the shepherd's control FIFO")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    rec = _record(jdir)
    assert rec.stopped == "killed" and rec.not_started is None and "before it could start" in rec.stop_note


def test_past_the_buffer_bound_the_relay_waits_for_a_pid(users, scratch, pids_group):
    """Room for the shepherd and its job only: the job waits on its pipe until the relay can be forked."""
    bob = users["bob"]
    log = os.path.join(bob.pw_dir, f"hpcb-test-relay-{os.getpid()}.log")
    size = 4 << 20    # more than the buffer and the 1 MiB pipe together: the job must wait
    jdir = _hand_made_job(scratch, bob, ["head", "-c", str(size), "/dev/zero"], output=log,
                          max_output_buffer=64 << 10)
    _set_max(pids_group, 2)
    proc = _shepherd_in(pids_group, bob, jdir)
    buf = os.path.join(jdir, records.OUTPUT)
    try:
        wait_for(lambda: os.path.exists(buf) and os.path.getsize(buf) == 64 << 10, what="the buffer to fill")
        wait_for(lambda: _current(pids_group) == 2, what="the shepherd and its job")
        assert proc.poll() is None and not os.path.exists(log)     # held: neither ended nor relayed
        _set_max(pids_group, 10)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    rec = _record(jdir)
    assert rec.code == 0 and rec.error is None, rec.to_dict()
    assert os.path.getsize(log) == size
    delivery = _record(jdir, records.DeliveryRecord, records.DELIVERY)
    assert delivery.ok and "went straight to" in delivery.note, delivery.to_dict()
    assert not os.path.exists(buf)
    os.unlink(log)

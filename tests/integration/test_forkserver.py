"""Shepherds forked by the resident fork server: named in ps, no child of the daemon, independent of the server;
and exec'd by the daemon when no server can be had."""

import os
import signal
import subprocess

import pytest
from conftest import USERS, exit_of, wait_for

pytestmark = pytest.mark.timeout(120)


def _cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [w.decode() for w in f.read().split(b"\0") if w]


def _ppid(pid):
    """The parent's pid, or None once *pid* is gone (a server's short-lived fork shares its command line)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rfind(b")") + 2:].split()[1])


def _pids_whose_cmdline(pred):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if pred(_cmdline(int(entry))):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _fork_servers(daemon):
    return [p for p in _pids_whose_cmdline(lambda argv: "--fork-server" in argv) if _ppid(p) == daemon.proc.pid]


def _shepherd_of(daemon, job):
    jdir = os.path.join(daemon.state_dir, "jobs", str(job))
    found = _pids_whose_cmdline(lambda argv: argv[:3] == ["hpc-batch-shepherd", "--job", str(job)]
                                and argv[-1] == jdir)
    return found[0] if found else None


def test_a_forked_shepherd_shows_its_job_and_user_and_is_not_the_daemons_child(daemon, scratch):
    job = daemon.submit("sleep", "30", flags=("--no-output",), user=USERS["alice"])
    pid = wait_for(lambda: _shepherd_of(daemon, job), what="the shepherd in ps")
    argv = _cmdline(pid)
    assert argv[3:5] == ["--user", USERS["alice"]], argv
    assert _ppid(pid) == _fork_servers(daemon)[0]   # the server's child: the daemon's restarts never touch it
    assert len(_fork_servers(daemon)) == 1
    daemon.ok("kill", str(job), user=USERS["alice"])
    assert exit_of(daemon.wait_finished(job, user=USERS["alice"])) == "killed"


def test_jobs_outlive_the_fork_server_and_it_comes_back(daemon, scratch):
    flag = os.path.join(scratch, "go")
    job = daemon.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 6", flags=("--no-output",))
    wait_for(lambda: _shepherd_of(daemon, job), what="the shepherd in ps")
    # The job running (its shepherd wrote status.json after forking it): the server answered the
    # daemon long before. A kill before that answer is another case (the daemon asks a new server).
    status = os.path.join(daemon.state_dir, "jobs", str(job), "status.json")
    wait_for(lambda: os.path.exists(status), what="the job to be forked")
    (server,) = _fork_servers(daemon)
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not _fork_servers(daemon) or _fork_servers(daemon) != [server], what="the server to die")
    open(flag, "w").close()
    row = daemon.wait_finished(job)
    assert exit_of(row) == "6", f"{row}\n--- daemon log:\n{daemon.log()}"
    # The next job gets a new server (or, failing that, an exec'd shepherd): it runs either way.
    nxt = daemon.submit("sh", "-c", "exit 4", flags=("--no-output",))
    assert exit_of(daemon.wait_finished(nxt)) == "4"
    assert len(_fork_servers(daemon)) == 1


def test_an_admin_can_kill_a_forked_shepherd(daemon, scratch):
    job = daemon.submit("sleep", "30", flags=("--no-output",))
    pid = wait_for(lambda: _shepherd_of(daemon, job), what="the shepherd in ps")
    os.kill(pid, signal.SIGTERM)
    row = daemon.wait_finished(job)
    assert exit_of(row) == "killed", row


def test_with_no_fork_server_to_be_had_the_shepherd_is_execd_and_runs_the_job(daemon_factory, users, scratch):
    # The fork server imports ctypes at its start; the daemon and a shepherd
    # that has already started do not need to load it again. So in a mount
    # namespace of the daemon's own, once the daemon is up, _ctypes is
    # covered with an empty file and the running server killed: every
    # server the daemon starts from then on dies at its imports, which is
    # the failure the exec fallback is there for.
    import _ctypes

    d = daemon_factory(wrap=["unshare", "--mount", "--propagation", "private", "--"])
    (server,) = wait_for(lambda: _fork_servers(d), what="the first fork server")
    subprocess.run(["nsenter", "--target", str(d.proc.pid), "--mount", "--",
                    "mount", "--bind", "/dev/null", _ctypes.__file__], check=True)
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: server not in _fork_servers(d), what="the server to die")

    alice = users["alice"]
    work = os.path.join(scratch, "alice-work")
    os.mkdir(work)
    os.chown(work, alice.pw_uid, alice.pw_gid)
    flag = os.path.join(scratch, "go")
    job = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; echo through exec; id -un",
                   user=USERS["alice"], cwd=work)
    pid = wait_for(lambda: _exec_shepherd_of(d, job), timeout=30, what="an exec'd shepherd for the job")
    assert _ppid(pid) == d.proc.pid, "an exec'd shepherd is spawned by the daemon itself"
    assert "the shepherd fork server failed" in d.log()
    open(flag, "w").close()
    assert exit_of(d.wait_finished(job, user=USERS["alice"])) == "0"
    with open(os.path.join(work, f"output.{job}.log")) as f:
        assert f.read() == f"through exec\n{USERS['alice']}\n"
    assert _fork_servers(d) == []   # it gave up on them: no server was started again


def _exec_shepherd_of(daemon, job):
    """The pid of the job's shepherd if it was exec'd (``python -E -s -S .../hpc-batch-shepherd.py ...``)."""
    jdir = os.path.join(daemon.state_dir, "jobs", str(job))
    found = _pids_whose_cmdline(lambda argv: argv[1:4] == ["-E", "-s", "-S"]
                                and argv[4].endswith("/hpc-batch-shepherd.py")
                                and argv[5:7] == ["--job", str(job)] and argv[-1] == jdir)
    return found[0] if found else None

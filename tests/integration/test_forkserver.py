"""Shepherds forked by the resident fork server: named in ps, no child of the daemon, independent of the server;
and exec'd by the daemon when no server can be had."""

import json
import os
import shutil
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
    # Only the fork server imports its own module from the shepherd's directory
    # at its start: the daemon has it loaded already, and an exec'd shepherd
    # never needs it. So in a mount namespace of the daemon's own, once the
    # daemon is up, that file is covered with an empty one and the running
    # server killed: every server the daemon starts from then on dies at its
    # imports, which is the failure the exec fallback is there for.
    d = daemon_factory(wrap=["unshare", "--mount", "--propagation", "private", "--"])
    (server,) = wait_for(lambda: _fork_servers(d), what="the first fork server")
    script = next(a for a in _cmdline(server) if a.endswith("/hpc-batch-shepherd.py"))
    subprocess.run(["nsenter", "--target", str(d.proc.pid), "--mount", "--",
                    "mount", "--bind", "/dev/null", os.path.join(os.path.dirname(script), "forkserver.py")],
                   check=True)
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


# -- a fork server that dies with a start request in it ------------------------------------------
# The daemon cannot ask a dead server whether it forked: it must find out from the job's directory,
# and a shepherd that was forked must be the only one that ever runs the job.

def _hold_forks(server):
    """strace on the fork server: each fork it makes comes back to it only after ten minutes, so the
    server can be killed with a shepherd forked and its answer not yet written. The shepherd is
    not traced and runs on."""
    return _strace(server, "-e", "trace=clone,clone3,fork,vfork",
                   "-e", "inject=clone,clone3,fork,vfork:delay_exit=600000000")


def _strace(pid, *args):
    strace = shutil.which("strace")
    assert strace, "strace is missing: scripts/install-host-deps --host installs it"
    tracer = subprocess.Popen([strace, "-qq", "-o", "/dev/null", "-p", str(pid), *args])
    wait_for(lambda: tracer.poll() is not None or _tracer_of(pid) == tracer.pid, what="strace to attach")
    assert tracer.poll() is None, "strace could not attach to the fork server"
    return tracer


def _kill_held(server, tracer):
    """SIGKILL a server strace holds in its fork, without letting it answer.

    Killed under strace, it would wait at its exit for strace (busy with the delay) with its socket
    open. So it is stopped first: when strace goes, it leaves its fork and stops before it runs a
    line, and is killed there.
    """
    os.kill(server, signal.SIGSTOP)
    tracer.kill()
    tracer.wait()
    wait_for(lambda: _state(server) == "T" and _tracer_of(server) == 0, what="the server to stop untraced")
    os.kill(server, signal.SIGKILL)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()[0].decode()


def _tracer_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    return None


def _alice_dir(users, scratch):
    alice = users["alice"]
    work = os.path.join(scratch, "alice-work")
    os.mkdir(work)
    os.chown(work, alice.pw_uid, alice.pw_gid)
    return work


def _runs(path):
    """The lines each run of a job appended to *path*: one line a run."""
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def test_a_fork_server_killed_after_forking_before_answering_leaves_the_job_its_real_end(daemon, users, scratch):
    (server,) = wait_for(lambda: _fork_servers(daemon), what="the fork server")
    tracer = _hold_forks(server)
    try:
        work = _alice_dir(users, scratch)
        runs = os.path.join(work, "runs")
        job = daemon.submit("sh", "-c", f"echo ran >> {runs}; exit 7", flags=("--no-output",),
                            user=USERS["alice"], cwd=work)
        # The server's shepherd runs the whole job while the server waits in its fork: the
        # worst case, a job already over when the daemon learns its server is gone.
        jdir = os.path.join(daemon.state_dir, "jobs", str(job))
        wait_for(lambda: os.path.exists(os.path.join(jdir, "exit.json")) and not _shepherd_of(daemon, job),
                 what="the forked shepherd to run the job and end")
        assert _ppid(server) == daemon.proc.pid and _tracer_of(server) == tracer.pid   # still unanswered
        _kill_held(server, tracer)
        row = daemon.wait_finished(job, user=USERS["alice"])
    finally:
        tracer.kill()
        tracer.wait()
    assert exit_of(row) == "7", f"{row}\n--- daemon log:\n{daemon.log()}"
    assert _runs(runs) == ["ran"]
    log = daemon.log()
    assert "the shepherd fork server failed (it exited)" in log, log
    assert f"job {job}: the fork server died before it answered" in log, log
    # The next job gets a new server, which answers.
    nxt = daemon.submit("sh", "-c", "exit 4", flags=("--no-output",))
    assert exit_of(daemon.wait_finished(nxt)) == "4"
    assert len(_fork_servers(daemon)) == 1


def test_a_fork_server_killed_while_stopped_with_a_bulk_waiting_starts_each_job_once(daemon, users, scratch):
    (server,) = wait_for(lambda: _fork_servers(daemon), what="the fork server")
    work = _alice_dir(users, scratch)
    commands = os.path.join(work, "commands")
    with open(commands, "w") as f:
        for code in range(1, 6):
            f.write(f"echo {code} >> {work}/runs.{code}; exit {code}\n")
    # The submit is answered before its starts are written and sent to the server: a trace of the
    # daemon's sends says when the first start's request is in the stopped server.
    strace = shutil.which("strace")
    assert strace, "strace is missing: scripts/install-host-deps --host installs it"
    trace = os.path.join(scratch, "sends.trace")
    tracer = subprocess.Popen([strace, "-qq", "-e", "trace=sendto", "-s", "128", "-o", trace,
                               "-p", str(daemon.proc.pid)])
    wait_for(lambda: tracer.poll() is not None or _tracer_of(daemon.proc.pid) == tracer.pid,
             what="strace to attach to the daemon")
    os.kill(server, signal.SIGSTOP)
    try:
        out = daemon.ok("new", "--no-output", "--commands", commands, "--json", user=USERS["alice"], cwd=work)
        first = json.loads(out)["ids"][0]

        def sent():
            with open(trace, "rb") as f:
                return f'"{first} {USERS["alice"]} '.encode() in f.read()
        wait_for(sent, what="the daemon to send the first start to the stopped server")
    finally:
        os.kill(server, signal.SIGKILL)
        tracer.kill()
        tracer.wait()
    ids = json.loads(out)["ids"]
    assert len(ids) == 5, out
    r = daemon.dispatch("wait", "--json", *map(str, ids), user=USERS["alice"])
    ends = {j["id"]: j for j in json.loads(r.stdout)["jobs"]}
    for code, job in enumerate(ids, 1):
        assert ends[job]["wait_status"] == code, f"{ends[job]}\n--- daemon log:\n{daemon.log()}"
        assert _runs(os.path.join(work, f"runs.{code}")) == [str(code)]
    assert r.returncode == 1   # the first nonzero status, as always
    # A server that dies with bytes unread resets its end: proof the request was in it.
    assert "the shepherd fork server failed ([Errno 104] Connection reset by peer)" in daemon.log(), daemon.log()


def test_a_shepherd_forked_by_a_dead_server_that_starts_late_never_runs_a_job_that_ran(daemon, users, scratch):
    # The server forks the shepherd and is killed as it writes its answer; the shepherd is held
    # before it takes the job's lock, so the daemon finds nothing in the job's directory and asks a
    # new server, whose shepherd runs the job. When the first one then goes on, it must leave the
    # job alone: run it again, or fail on the launch spec that the other consumed, and it would
    # overwrite the job's exit record.
    (server,) = wait_for(lambda: _fork_servers(daemon), what="the fork server")
    tracer = _strace(server, "-f", "-e", "trace=write,flock",
                     "-e", "inject=write:signal=SIGKILL", "-e", "inject=flock:delay_enter=600000000")
    try:
        work = _alice_dir(users, scratch)
        runs = os.path.join(work, "runs")
        job = daemon.submit("sh", "-c", f"echo ran >> {runs}; exit 9", flags=("--no-output",),
                            user=USERS["alice"], cwd=work)
        row = daemon.wait_finished(job, user=USERS["alice"])
        assert exit_of(row) == "9", f"{row}\n--- daemon log:\n{daemon.log()}"
        (late,) = [p for p in _pids_whose_cmdline(lambda argv: argv[:3] == ["hpc-batch-shepherd", "--job", str(job)])
                   if _tracer_of(p) == tracer.pid]
        assert _in_flock(late), "the late shepherd is held before its lock"
        assert _state(server) in (None, "Z"), "the first server was killed before it answered"
    finally:
        tracer.kill()   # the late shepherd goes on from its flock
        tracer.wait()
    wait_for(lambda: _gone(late), what="the late shepherd to give up")
    assert _runs(runs) == ["ran"]
    with open(os.path.join(daemon.state_dir, "jobs", str(job), "exit.json")) as f:
        assert json.load(f)["code"] == 9   # not overwritten by the late one
    assert "the shepherd fork server failed (it exited)" in daemon.log()


def _gone(pid):
    return _state(pid) in (None, "Z")


def _in_flock(pid):
    """True while *pid* is stopped at its entry to flock(2) (x86_64: syscall 73)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().split()[0] == "73"
    except (OSError, IndexError):
        return False

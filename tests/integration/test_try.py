"""./scripts/try leaves nothing behind: no scratch directory, no daemon, no job.

Each run uses the test venv as it is (``HPC_BATCH_TRY_VENV``: no pip install
in the middle of a test run) and a scratch ``TMPDIR``, so "nothing behind" is
checked as an empty directory and no process with an argument under it.
"""

import os
import select
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import BIN, wait_for

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRY = os.path.join(ROOT, "scripts", "try")


def _env(tmpdir, venv=None, **extra):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TMPDIR": tmpdir,
           "HPC_BATCH_TRY_VENV": venv or os.path.dirname(BIN), "SHELL": "/bin/sh"}
    env.update(extra)
    return env


def _argv_has(needle):
    """Pids (not this test's) with an argument that contains *needle*."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(needle.encode() in a for a in argv):
            found.append(int(pid))
    return found


def _assert_nothing_left(tmpdir):
    assert os.listdir(tmpdir) == [], f"scripts/try left {os.listdir(tmpdir)} in {tmpdir}"
    assert _argv_has(tmpdir + "/") == [], "a process of scripts/try's outlived it"


def test_a_demo_run_prints_the_job_and_leaves_nothing_behind(scratch):
    r = subprocess.run([TRY], env=_env(scratch), capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "hello from job 1 on CPU" in r.stdout and "finished 0" in r.stdout, r.stdout
    _assert_nothing_left(scratch)


def test_the_shell_has_the_venvs_commands_and_its_status_is_the_exit_status(scratch):
    script = "command -v dispatch\ncommand -v hpc-batchd\ndispatch new --wait -- echo hi\nexit 3\n"
    r = subprocess.run([TRY, "--shell"], env=_env(scratch), input=script, capture_output=True, text=True,
                       timeout=90)
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines()[:2] == [os.path.join(BIN, "dispatch"), os.path.join(BIN, "hpc-batchd")]
    assert "job 1 finished: exit 0" in r.stdout + r.stderr
    assert "failed (exit 3); the daemon log's end:" in r.stderr and "ready on" in r.stderr
    _assert_nothing_left(scratch)


def test_ctrl_c_ends_the_jobs_and_the_daemon_and_removes_the_scratch_directory(scratch):
    marker = f"try-test-{uuid.uuid4().hex}"
    p = subprocess.Popen([TRY, "--shell"], env=_env(scratch), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        p.stdin.write(f"dispatch new -- sh -c 'sleep 600; :' {marker}\necho READY\n".encode())
        p.stdin.flush()
        seen = b""
        deadline = time.monotonic() + 60
        while b"READY\n" not in seen:
            assert time.monotonic() < deadline, f"no READY from the shell: {seen!r}"
            if select.select([p.stdout], [], [], 1)[0]:
                chunk = os.read(p.stdout.fileno(), 4096)
                assert chunk, f"the shell ended early: {seen!r} {p.stderr.read()!r}"
                seen += chunk
        wait_for(lambda: _argv_has(marker), timeout=30, what="the job to run")
        os.killpg(p.pid, signal.SIGINT)       # what a terminal's Ctrl-C sends: the foreground group
        assert p.wait(timeout=60) == 130, p.stderr.read()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert _argv_has(marker) == [], "the job outlived scripts/try"
    _assert_nothing_left(scratch)


def test_a_daemon_that_cannot_start_fails_the_run_and_leaves_nothing_behind(scratch):
    fake = os.path.join(scratch, "venv")
    os.makedirs(os.path.join(fake, "bin"))
    for name, body in (("dispatch", "exit 0"), ("hpc-batchd", "echo 'cannot start: a test says so' >&2; exit 1")):
        path = os.path.join(fake, "bin", name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\n{body}\n")
        os.chmod(path, 0o755)
    tmp = os.path.join(scratch, "tmp")
    os.mkdir(tmp)
    r = subprocess.run([TRY], env=_env(tmp, venv=fake), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "the daemon did not start" in r.stderr and "cannot start: a test says so" in r.stderr
    _assert_nothing_left(tmp)


def test_an_unknown_argument_or_venv_is_a_one_line_error(scratch):
    r = subprocess.run([TRY, "--shel"], env=_env(scratch), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'--shel'" in r.stderr
    r = subprocess.run([TRY], env=_env(scratch, venv=scratch), capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "has no bin/dispatch and bin/hpc-batchd" in r.stderr
    _assert_nothing_left(scratch)


def test_print_bin_prints_the_bin_directory_alone(scratch):
    r = subprocess.run([TRY, "--print-bin"], env=_env(scratch), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == BIN + "\n"
    assert sys.executable.startswith(r.stdout.strip())

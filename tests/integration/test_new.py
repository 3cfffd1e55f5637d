"""dispatch new: exit codes, signals, timeouts, errors, output delivery, environment."""

import os
import re

import pytest
from conftest import exit_of

pytestmark = pytest.mark.timeout(120)


def test_exit_code_and_output_delivered(daemon, scratch):
    out = daemon.ok("new", "--", "sh", "-c", "echo hello; echo err >&2; exit 3")
    m = re.match(r"job (\d+) (running|queued); memory (\S+) \(assigned by default\), not enforced: the daemon runs "
                 r"with --no-cgroups; output to (\S+)", out)
    assert m, out
    job = int(m.group(1))
    assert m.group(4) == os.path.join(scratch, f"output.{job}.log")
    row = daemon.wait_finished(job)
    assert exit_of(row) == "3"
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        assert f.read().splitlines() == ["hello", "err"]
    # The buffer in the state directory is dropped once delivered.
    assert not os.path.exists(os.path.join(daemon.state_dir, "jobs", str(job), "output"))


def test_death_by_signal_reported(daemon):
    job = daemon.submit("sh", "-c", "kill -SEGV $$")
    assert exit_of(daemon.wait_finished(job)) == "SIGSEGV"


def test_timeout(daemon):
    job = daemon.submit("sleep", "60", flags=("--max-time", "2s"))
    row = daemon.wait_finished(job, timeout=30)
    assert exit_of(row) == "timeout"
    assert " 2s " in row


def test_missing_command_is_error_with_errno(daemon, scratch):
    job = daemon.submit("no-such-command-xyz")
    assert exit_of(daemon.wait_finished(job)) == "error"
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        text = f.read()
    assert "No such file or directory" in text and "ENOENT" in text


def test_output_to_directory_and_file(daemon, scratch):
    d = os.path.join(scratch, "results")
    os.mkdir(d)
    j1 = daemon.submit("echo", "one", flags=("--output", d))
    j2 = daemon.submit("echo", "two", flags=("--output", os.path.join(d, "run1.log")))
    daemon.wait_finished(j1)
    daemon.wait_finished(j2)
    with open(os.path.join(d, f"output.{j1}.log")) as f:
        assert f.read() == "one\n"
    with open(os.path.join(d, "run1.log")) as f:
        assert f.read() == "two\n"


def test_no_output_discards(daemon, scratch):
    job = daemon.submit("echo", "gone", flags=("--no-output",))
    assert exit_of(daemon.wait_finished(job)) == "0"
    assert not os.path.exists(os.path.join(scratch, f"output.{job}.log"))
    assert not os.path.exists(os.path.join(daemon.state_dir, "jobs", str(job), "output"))


def test_unwritable_output_refused_at_submit(daemon, scratch):
    r = daemon.dispatch("new", "--output", "/nonexistent/dir/x.log", "--", "true")
    assert r.returncode != 0
    assert "/nonexistent/dir" in r.stderr and r.stderr.count("\n") == 1
    assert daemon.rows("--all", "--finished") == {}


def test_leading_assignments_become_environment(daemon, scratch):
    job = daemon.submit("FOO=bar", "HPC_BATCH_JOB_ID=999", "sh", "-c", 'echo "$FOO $HPC_BATCH_JOB_ID $0"', "CC=gcc")
    daemon.wait_finished(job)
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        assert f.read() == f"bar {job} CC=gcc\n"


def test_clean_environment_by_default(daemon, scratch):
    job = daemon.submit("env", env={"SECRET_TOKEN": "s3cret"})
    daemon.wait_finished(job)
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        env = dict(line.split("=", 1) for line in f.read().splitlines())
    assert set(env) == {"PATH", "HOME", "USER", "SHELL", "LANG", "HPC_BATCH_JOB_ID", "CUDA_VISIBLE_DEVICES",
                        "CUDA_DEVICE_ORDER", "HPC_BATCH_METRICS_FILE"}
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["HPC_BATCH_JOB_ID"] == str(job)
    assert env["HPC_BATCH_METRICS_FILE"].startswith(f"/tmp/hpc-batch-metrics.{job}.")   # the job's own figures


def test_env_forwarded_but_daemon_values_win(daemon, scratch):
    job = daemon.submit("env", flags=("--env",), env={"SECRET_TOKEN": "s3cret", "CUDA_VISIBLE_DEVICES": "0,1,2",
                                                       "HPC_BATCH_JOB_ID": "77"})
    daemon.wait_finished(job)
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        env = dict(line.split("=", 1) for line in f.read().splitlines())
    assert env["SECRET_TOKEN"] == "s3cret"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["HPC_BATCH_JOB_ID"] == str(job)
    # Dropped from state once the job started.
    with open(os.path.join(daemon.state_dir, "jobs", str(job), "job.json")) as f:
        assert "s3cret" not in f.read()


@pytest.mark.parametrize("flags,needle", [
    (("--max-time", "1x"), "invalid duration"),
    (("--max-time", "2h1d"), "invalid duration"),
    (("--cpu", "0"), "--cpu"),
    (("--max-mem", "lots"), "--max-mem"),
    (("--bogus",), "unknown option '--bogus'"),
])
def test_bad_flags_exit_2(daemon, flags, needle):
    r = daemon.dispatch("new", *flags, "--", "true")
    assert r.returncode == 2, r
    assert needle in r.stderr


def test_max_time_above_lifetime_refused(daemon_factory, users):
    d = daemon_factory("--max-lifetime", "1h")
    r = d.dispatch("new", "--max-time", "2h", "--", "true")
    assert r.returncode == 1 and "--max-lifetime" in r.stderr
    job = d.submit("true")
    assert " 1h " in d.wait_finished(job)


def test_never_fitting_request_refused(daemon):
    r = daemon.dispatch("new", "--cpu", "4096", "--", "true")
    assert r.returncode == 6 and "never fit" in r.stderr


@pytest.mark.parametrize("args", [("--help",), ("new", "--help"), ("list", "--help"),
                                  ("attach", "--help"), ("kill", "--help")])
def test_help_everywhere(daemon, args):
    r = daemon.dispatch(*args)
    assert r.returncode == 0 and "Usage" in r.stdout


def test_version(daemon):
    from hpc_batch import __version__
    assert daemon.ok("--version").strip() == f"dispatch {__version__}"


def test_unreachable_daemon_one_line(scratch):
    import subprocess

    from conftest import DISPATCH
    sock = os.path.join(scratch, "nothing.sock")
    r = subprocess.run([DISPATCH, "list"], env={"HPC_BATCH_SOCKET": sock, "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and sock in r.stderr and "not be running" in r.stderr

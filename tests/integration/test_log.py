"""dispatch log: a job's output so far, -f following it to its end; attach to a job that has ended."""

import os
import select
import signal
import subprocess

import pytest
from conftest import DISPATCH, wait_for

from hpc_batch.wire.protocol import LOG_PAGE_BYTES

pytestmark = pytest.mark.timeout(120)


def _held(flag: str, before: str, after: str = "") -> tuple[str, ...]:
    """A job that writes *before*, waits for *flag* to exist, then writes *after*."""
    return ("sh", "-c", f"printf '{before}'; while [ ! -e {flag} ]; do sleep 0.05; done; printf '{after}'")


def _own_dir(scratch, pw) -> str:
    """A directory of *scratch* that *pw* owns: its submits' logs go there."""
    d = os.path.join(scratch, pw.pw_name)
    os.mkdir(d)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def _follow(daemon, job, *args):
    return subprocess.Popen([DISPATCH, "log", *args, str(job)], env={"HPC_BATCH_SOCKET": daemon.socket},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=daemon.base)


def test_log_prints_a_running_jobs_output_so_far_and_exits_0(daemon, scratch):
    flag = os.path.join(scratch, "go")
    job = daemon.submit(*_held(flag, "first\\n", "second\\n"))
    r = wait_for(lambda: (lambda r: r if r.stdout else None)(daemon.dispatch("log", str(job))),
                 what="the job's first line in its log")
    assert (r.returncode, r.stdout, r.stderr) == (0, "first\n", "")
    open(flag, "w").close()
    daemon.wait_finished(job)


def test_log_follow_prints_everything_then_the_end_and_exits_with_the_jobs_status(daemon, scratch):
    flag = os.path.join(scratch, "go")
    job = daemon.submit("sh", "-c", f"echo first; while [ ! -e {flag} ]; do sleep 0.05; done; echo second; exit 5")
    p = _follow(daemon, job, "-f")
    assert p.stdout.readline() == "first\n"
    open(flag, "w").close()
    out, err = p.communicate(timeout=60)
    assert out == "second\n"
    assert f"job {job} finished: exit 5" in err
    assert p.returncode == 5


def test_log_follow_of_a_killed_job_exits_as_wait_does(daemon):
    job = daemon.submit("sh", "-c", "echo up; sleep 60")
    p = _follow(daemon, job, "--follow")
    assert p.stdout.readline() == "up\n"
    daemon.ok("kill", str(job))
    _, err = p.communicate(timeout=30)
    assert "exit killed" in err and p.returncode == 240


def test_ctrl_c_stops_following_cleanly_and_the_job_runs_on(daemon):
    job = daemon.submit("sh", "-c", "echo up; sleep 60")
    p = _follow(daemon, job, "-f")
    assert p.stdout.readline() == "up\n"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert daemon.jobs()[job]["state"] == "running"
    daemon.ok("kill", str(job))


def test_log_follow_of_a_queued_job_waits_for_it_to_start(daemon_factory, users, scratch):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    flag = os.path.join(scratch, "go")
    blocker = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done", flags=("--cpu", "2"))
    job = d.submit("sh", "-c", "echo started; exit 0")
    r = d.dispatch("log", str(job))
    assert r.returncode == 0 and r.stdout == "" and f"job {job} is queued" in r.stderr
    p = _follow(d, job, "-f")
    # The follower must be waiting before the blocker goes: under load the job could otherwise start
    # and end before the client even connects, and it would rightly say "finished".
    ready, _, _ = select.select([p.stderr], [], [], 60)
    first = p.stderr.readline() if ready else ""
    assert "waiting for it to start" in first, first
    open(flag, "w").close()
    out, err = p.communicate(timeout=60)
    assert out == "started\n" and p.returncode == 0, first + err
    d.wait_finished(blocker)


def test_only_the_owner_and_admins_read_a_jobs_log(daemon, users, scratch):
    alice, bob, admin = (users[k].pw_name for k in ("alice", "bob", "admin"))
    flag = os.path.join(scratch, "go")
    job = daemon.submit(*_held(flag, "secret\\n"), user=alice, cwd=_own_dir(scratch, users["alice"]))
    wait_for(lambda: daemon.dispatch("log", str(job), user=alice).stdout == "secret\n",
             what="alice to see her job's output")
    for args in (("log",), ("log", "-f")):
        r = daemon.dispatch(*args, str(job), user=bob)
        assert r.returncode == 3 and "no such job" in r.stderr and r.stdout == "", (args, r)
    r = daemon.dispatch("log", str(job), user=admin)
    assert (r.returncode, r.stdout) == (0, "secret\n")
    open(flag, "w").close()
    daemon.wait_finished(job, user=alice)


def test_log_of_a_finished_job_names_its_log_file_on_stderr(daemon, scratch):
    job = daemon.submit("echo", "done")
    daemon.wait_finished(job)
    for args in (("log",), ("log", "-f")):
        r = daemon.dispatch(*args, str(job))
        assert r.returncode == 0 and r.stdout == "", (args, r)
        assert r.stderr.strip() == f"job {job} finished: exit 0; its output is in {scratch}/output.{job}.log"
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        assert f.read() == "done\n"


def test_log_and_attach_of_a_job_whose_delivery_failed_print_the_kept_buffer(daemon, users, scratch):
    alice = users["alice"]
    # The job puts a directory where its log was to go: delivery fails and the buffer is kept.
    job = daemon.submit("sh", "-c", 'echo kept; log="output.$HPC_BATCH_JOB_ID.log"; rm -f "$log"; mkdir "$log"',
                        user=alice.pw_name, cwd=_own_dir(scratch, alice))
    daemon.wait_finished(job, user=alice.pw_name)
    for verb in (("log",), ("log", "-f"), ("attach",)):
        r = daemon.dispatch(*verb, str(job), user=alice.pw_name)
        assert (r.returncode, r.stdout) == (0, "kept\n"), (verb, r)
        assert "its output was not delivered" in r.stderr and "the output is kept at" in r.stderr, r.stderr


def test_log_pages_a_large_output_whole_and_in_order(daemon, scratch):
    flag = os.path.join(scratch, "go")
    lines = 500_000     # about 3.4 MB: several LOG_PAGE_BYTES pages
    job = daemon.submit("sh", "-c", f"seq 1 {lines}; while [ ! -e {flag} ]; do sleep 0.05; done; echo after")
    expected = "".join(f"{i}\n" for i in range(1, lines + 1))
    assert len(expected) > 3 * LOG_PAGE_BYTES
    r = wait_for(lambda: (lambda r: r if r.stdout.endswith(f"\n{lines}\n") else None)(
        daemon.dispatch("log", str(job))), timeout=60, what="the whole of seq's output in the buffer")
    assert r.returncode == 0 and r.stdout == expected
    open(flag, "w").close()
    daemon.wait_finished(job)


def test_attach_to_a_job_that_has_just_ended_prints_its_output(daemon, scratch):
    job = daemon.submit("sh", "-c", "echo quick; echo also")
    daemon.wait_finished(job)
    r = daemon.dispatch("attach", str(job))
    assert (r.returncode, r.stdout) == (0, "quick\nalso\n")
    assert os.path.join(scratch, f"output.{job}.log") in r.stderr


def test_log_refuses_a_bad_job_reference_before_asking(daemon):
    r = daemon.dispatch("log", "a b")
    assert r.returncode == 2 and "neither a job id nor a job name" in r.stderr
    r = daemon.dispatch("log", "9999")
    assert r.returncode == 3 and "no such job" in r.stderr


def test_log_past_the_buffer_bound_says_where_the_rest_goes(daemon_factory, users, scratch):
    d = daemon_factory("--max-output-buffer", "1")   # MiB
    flag = os.path.join(scratch, "go")
    job = d.submit("sh", "-c", f"head -c 3000000 /dev/zero | tr '\\0' x; while [ ! -e {flag} ]; do sleep 0.05; done")
    r = wait_for(lambda: (lambda r: r if len(r.stdout) >= 1 << 20 else None)(d.dispatch("log", str(job))),
                 timeout=60, what="the buffer to fill")
    assert r.returncode == 0 and r.stdout == "x" * (1 << 20)
    assert r.stderr.strip() == (f"job {job}: the daemon keeps only the first 1M of its output; "
                                f"the rest goes straight to {scratch}/output.{job}.log")
    open(flag, "w").close()
    d.wait_finished(job)

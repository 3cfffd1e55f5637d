"""dispatch attach: streams in order, ends with the job, finished jobs point at the log."""

import os

import pytest

pytestmark = pytest.mark.timeout(120)


def test_attach_gets_every_line_in_order(daemon):
    job = daemon.submit("sh", "-c", "sleep 0.5; i=1; while [ $i -le 10000 ]; do echo line $i; i=$((i+1)); done")
    r = daemon.dispatch("attach", str(job), timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"line {i}" for i in range(1, 10001)]
    assert f"job {job} finished: exit 0" in r.stderr


def test_attach_to_queued_job_waits_and_streams(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    blocker = d.submit("sleep", "2", flags=("--cpu", "2"))
    job = d.submit("sh", "-c", "echo started; exit 4")
    r = d.dispatch("attach", str(job), timeout=60)
    assert r.stdout == "started\n"
    assert "exit 4" in r.stderr
    d.wait_finished(blocker)


def test_attach_short_job_misses_nothing(daemon):
    # The job may start and end before attach looks: the output must still arrive.
    for _ in range(5):
        job = daemon.submit("echo", "quick")
        r = daemon.dispatch("attach", str(job))
        assert r.returncode == 0
        assert r.stdout in ("quick\n", "")
        if r.stdout == "":
            assert "output is in" in r.stderr


def test_attach_finished_job_says_where_output_is(daemon, scratch):
    job = daemon.submit("echo", "done")
    daemon.wait_finished(job)
    r = daemon.dispatch("attach", str(job))
    assert r.returncode == 0
    assert os.path.join(scratch, f"output.{job}.log") in r.stderr


def test_attach_kill_reports_killed(daemon):
    job = daemon.submit("sh", "-c", "echo up; sleep 60")
    import subprocess

    from conftest import DISPATCH
    p = subprocess.Popen([DISPATCH, "attach", str(job)], env={"HPC_BATCH_SOCKET": daemon.socket},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n"
    daemon.ok("kill", str(job))
    out, err = p.communicate(timeout=30)
    assert "exit killed" in err

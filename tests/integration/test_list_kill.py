"""dispatch list and dispatch kill."""

import json
import os
import re
import signal
import time

import pytest
from conftest import exit_of, wait_for

pytestmark = pytest.mark.timeout(120)


def test_list_columns_running_and_queued(daemon_factory, users):
    # reserve-cpu 0 on this 2-core host leaves 2 cores: one 2-core job fills it.
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    running = d.submit("sleep", "30", flags=("--cpu", "2", "--max-time", "1h30m"))
    queued = d.submit("sleep", "30", flags=("--max-mem", "512M"))
    rows = d.rows()
    r = rows[running].split()
    assert r[0] == "root" and r[1] == str(running)
    assert r[2:4] == ["sleep", "30"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d", r[4])          # started today: HH:MM:SS
    assert re.fullmatch(r"\d+:\d\d:\d\d", r[5])           # uptime
    assert r[6] == "1h30m" and r[8] == "no"
    q = rows[queued].split()
    assert q[4:6] == ["-", "queued"] and q[7] == "512M"
    assert "finished" not in rows[running]
    d.ok("kill", str(running))
    d.ok("kill", str(queued))


def test_finished_only_with_flag(daemon):
    job = daemon.submit("true")
    daemon.wait_finished(job)
    assert job not in daemon.rows()
    assert exit_of(daemon.rows("--finished")[job]) == "0"


def test_kill_running_and_queued(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    a = d.submit("sleep", "60", flags=("--cpu", "2"))
    b = d.submit("sleep", "60")
    assert "queued" in d.rows()[b]
    out = d.ok("kill", str(b))
    assert "cancelled" in out and "removed from the queue" in out
    assert b not in d.rows()                                     # out of the queue
    assert exit_of(d.rows("--finished")[b]) == "cancelled"       # and in the history as never run
    d.ok("kill", str(a))
    row = d.wait_finished(a)
    assert exit_of(row) == "killed"


def test_kill_job_that_ignores_sigterm(daemon):
    # The job says when its trap is in place; killing it before then would
    # end it with the SIGTERM and leave the escalation untested.
    ready = os.path.join(daemon.base, "trap-installed")
    job = daemon.submit("sh", "-c", f"trap '' TERM; : > {ready}; while :; do sleep 0.1; done")
    wait_for(lambda: os.path.exists(ready), timeout=30, what="the job's TERM trap")
    daemon.ok("kill", str(job))
    row = daemon.wait_finished(job, timeout=30)
    assert exit_of(row) == "killed"
    shown = json.loads(daemon.ok("show", "--json", str(job)))
    # It outlived the SIGTERM; what ended it was the SIGKILL after the grace.
    assert shown["signal"] == signal.SIGKILL, shown


def test_kill_unknown_and_finished(daemon):
    r = daemon.dispatch("kill", "9999")
    assert r.returncode == 3 and "no such job" in r.stderr
    job = daemon.submit("true")
    daemon.wait_finished(job)
    r = daemon.dispatch("kill", str(job))
    assert r.returncode == 10 and "already finished" in r.stderr
    r = daemon.dispatch("kill", "abc")              # a name no job has
    assert r.returncode == 3 and "no job named 'abc'" in r.stderr
    r = daemon.dispatch("kill", "a b")              # neither an id nor a name
    assert r.returncode == 2


def test_keep_finished_per_user(daemon_factory, users):
    d = daemon_factory("--keep-finished", "2")
    ids = []
    for _ in range(4):
        ids.append(d.submit("true"))
        d.wait_finished(ids[-1])
    wait_for(lambda: sorted(d.jobs("--finished")) == ids[2:], backoff=0.2, what="eviction")
    # Ids are never reused, even after the records are gone.
    assert d.submit("true") == ids[-1] + 1


def test_start_time_format_old_job(daemon):
    from hpc_batch.client.listing import format_start
    now = time.mktime((2026, 11, 30, 12, 0, 0, 0, 0, -1))
    assert format_start(now - 3600, now) == "11:00:00"
    assert format_start(now - 86400 * 2, now) == "2026-11-28 12:00"

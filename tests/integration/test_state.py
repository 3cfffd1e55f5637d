"""Durable state: one daemon per state dir, unreadable state refused, kill -9 loses nothing."""

import json
import os
import subprocess

import pytest
from conftest import Daemon, exit_of, wait_for

pytestmark = pytest.mark.timeout(120)


def test_second_daemon_on_same_state_refuses(daemon, scratch):
    second = Daemon(scratch, ())
    second.socket = os.path.join(scratch, "other.sock")
    r = subprocess.run(second.command(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 78
    assert "already running" in r.stderr and daemon.state_dir in r.stderr


def test_truncated_job_record_is_rebuilt_from_the_journal(daemon_factory, users, scratch):
    d = daemon_factory()
    bad, good = d.submit("sh", "-c", "exit 3"), d.submit("true")
    d.wait_finished(bad)
    d.wait_finished(good)
    d.stop()
    path = os.path.join(d.state_dir, "jobs", str(bad), "job.json")
    with open(path, "r+") as f:
        f.truncate(10)
    d2 = daemon_factory()
    rows = d2.rows("--finished")
    assert exit_of(rows[bad]) in ("3", "lost") and exit_of(rows[good]) == "0"
    wait_for(lambda: "rebuilt 1 job.json files from the journal" in d2.log(), what="the rebuild in the log")
    with open(path, "rb") as f:
        assert json.loads(f.read())["id"] == bad
    assert d2.submit("true") == good + 1


def test_damaged_journal_and_record_are_quarantined_not_fatal(daemon_factory, users, scratch):
    d = daemon_factory()
    bad, good = d.submit("true"), d.submit("true")
    d.wait_finished(bad)
    d.wait_finished(good)
    d.stop()
    journal = os.path.join(d.state_dir, "journal")
    with open(journal, "rb") as f:
        lines = f.read().split(b"\n")
    with open(journal, "wb") as f:        # a damaged line before the last: not a torn append
        f.write(b"\n".join([b"{not json"] + lines))
    path = os.path.join(d.state_dir, "jobs", str(bad), "job.json")
    with open(path, "r+") as f:
        f.truncate(10)
    d2 = daemon_factory()
    # It serves from the job.json files: the readable job is there, the broken one set aside whole.
    rows = d2.rows("--finished")
    assert good in rows and bad not in rows
    names = os.listdir(os.path.join(d.state_dir, "quarantine"))
    assert any(n.startswith("journal.") for n in names)
    moved = [n for n in names if n.startswith(f"{bad}.")]
    assert len(moved) == 1
    with open(os.path.join(d.state_dir, "quarantine", moved[0], "job.json"), "rb") as f:
        assert len(f.read()) == 10
    wait_for(lambda: "quarantine" in d2.log() and f"job {bad}" in d2.log(), what="the log to name them")
    assert d2.submit("true") == good + 1      # its id is never handed out again


def test_state_files_are_root_only(daemon):
    job = daemon.submit("sleep", "30", flags=("--env",), env={"TOKEN": "x"})
    jdir = os.path.join(daemon.state_dir, "jobs", str(job))
    assert os.stat(os.path.join(jdir, "job.json")).st_mode & 0o777 == 0o600
    assert os.stat(daemon.state_dir).st_mode & 0o777 == 0o711
    daemon.ok("kill", str(job))


def test_kill9_then_restart_keeps_running_job_and_its_exit_code(daemon_factory, users, scratch):
    d = daemon_factory()
    flag = os.path.join(scratch, "go")
    job = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 7")
    d.wait_running(job)
    d.kill9()
    d2 = daemon_factory()
    row = d2.rows()[job]
    assert "queued" not in row and "finished" not in d2.rows("--finished")[job]
    open(flag, "w").close()
    assert exit_of(d2.wait_finished(job)) == "7"


def test_job_that_ends_while_daemon_is_down(daemon_factory, users, scratch):
    d = daemon_factory()
    flag = os.path.join(scratch, "go")
    job = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; echo bye; exit 5")
    d.wait_running(job)
    d.kill9()
    open(flag, "w").close()
    wait_for(lambda: os.path.exists(os.path.join(scratch, f"output.{job}.log")), what="output delivered")
    d2 = daemon_factory()
    assert exit_of(d2.wait_finished(job)) == "5"
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        assert f.read() == "bye\n"


def test_ids_never_reused_across_restarts(daemon_factory, users):
    d = daemon_factory("--keep-finished", "0")
    a = d.submit("true")
    wait_for(lambda: a not in d.jobs("--finished"), backoff=0.2, what="record evicted")
    d.stop()
    d2 = daemon_factory("--keep-finished", "0")
    assert d2.submit("true") == a + 1


def test_user_mode_requires_no_cgroups(scratch, users):
    d = Daemon(scratch, ("--cgroups",), as_user=users["alice"].pw_name)
    os.makedirs(os.path.join(scratch, "run"), exist_ok=True)
    os.chown(scratch, users["alice"].pw_uid, -1)
    r = subprocess.run(d.command(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 78 and "--no-cgroups" in r.stderr


def test_user_mode_accepts_only_own_uid(daemon_factory, users, scratch):
    alice, bob = users["alice"], users["bob"]
    os.chown(scratch, alice.pw_uid, -1)
    d = daemon_factory(as_user=alice.pw_name)
    job = d.submit("id", "-u", user=alice.pw_name, cwd=scratch)
    assert exit_of(d.wait_finished(job, user=alice.pw_name)) == "0"
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        assert f.read().strip() == str(alice.pw_uid)
    r = d.dispatch("new", "--", "true", user=bob.pw_name, cwd="/tmp")
    assert r.returncode == 4 and "only accepts" in r.stderr


def test_a_journal_cut_in_half_loses_no_acknowledged_job(daemon_factory, users, scratch):
    """F12: a damaged disk or a bad copy cut the journal; the caches hold what it lost."""
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    journal = os.path.join(d.state_dir, "journal")
    wait_for(lambda: "ready on" in d.log(), what="the daemon's start-up")
    with open(journal, "rb") as f:
        first_batch = f.read()             # the snapshot written at start-up: one whole batch
    blocker = d.submit("sleep", "60", flags=("--exclusive", "--no-output"))
    queued = [d.submit("true", flags=("--no-output", "--env"), env={"TOKEN": f"t{i}"}) for i in range(3)]
    d.kill9()
    with open(journal, "r+b") as f:
        f.truncate(len(first_batch))       # every acknowledged submit's line is gone
    d2 = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    wanted = f"recovered jobs {blocker}-{queued[-1]} from their job.json files"
    wait_for(lambda: wanted in d2.log(), what="the log to name every recovered job")
    rows = d2.rows()
    assert set(rows) == {blocker, *queued}, rows
    d2.ok("kill", str(blocker))
    assert d2.dispatch("wait", f"{queued[0]}-{queued[-1]}").returncode == 0
    assert d2.submit("true", flags=("--no-output",)) == queued[-1] + 1


def _first_line(path):
    with open(path, "rb") as f:
        return f.readline()


def test_a_compaction_begun_by_a_big_submit_ends_with_the_daemon_idle_and_loses_nothing(daemon_factory, users):
    """A 4,000-job submit grows the journal past MIN_COMPACT; the snapshot that replaces it is
    written a slice per turn, so the loop must turn by itself until it is done, and a kill -9
    (during it or after) loses no job."""
    flags = ("--reserve-cpu", "0", "--reserve-mem", "0", "--max-queued-per-user", "5000")
    d = daemon_factory(*flags)
    journal = os.path.join(d.state_dir, "journal")
    wait_for(lambda: "ready on" in d.log(), what="the daemon's start-up")
    before = _first_line(journal)          # the snapshot written at start-up
    gate = d.submit("sleep", "600", flags=("--exclusive", "--no-output"))
    d.ok("new", "--array", "1-4000", "--after-ok", str(gate), "--no-output", "--", "true")
    assert os.path.getsize(journal) > 1 << 20
    wait_for(lambda: _first_line(journal) != before and not os.path.exists(journal + ".tmp"), timeout=60,
             what="the journal's compaction to end with nothing else to do")
    d.kill9()
    d2 = daemon_factory(*flags)
    rows = d2.rows()
    assert len(rows) == 4001 and gate in rows and max(rows) == gate + 4000
    assert "rebuilt" not in d2.log()
    d2.ok("kill", str(gate))

"""Hostile users against the daemon's accounting and reporting (issue 20: F6, F7, F10, F11).

hpcb-alice floods the history and makes delivery fail over and over; hpcb-bob
plants a directory at the metrics file's temporary name and tries to learn
about alice's queued job. Each test checks what the attack got, and that the
other users' records and the daemon held.
"""

import json
import os
import subprocess

import pytest
from conftest import wait_for
from test_hostile import alive, as_user

pytestmark = pytest.mark.timeout(240)
MiB = 1 << 20


def history_ids(d, name):
    """Job ids in a user's history (the archive), oldest first, as the user reads it."""
    r = d.dispatch("history", "--json", "--limit", "100000", user=name if name != "root" else None)
    return [row["id"] for row in json.loads(r.stdout)["jobs"]] if r.returncode == 0 else []


def test_a_history_flood_pushes_out_only_the_flooders_own_records(daemon_factory, users, scratch):
    # F7: 40 jobs with 100 kB commands, ended by a failed dependency (only one job runs).
    d = daemon_factory("--history-per-user", "64K")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    b = d.submit("true", flags=("--no-output",), user=bob)
    r = d.submit("true", flags=("--no-output",))
    wait_for(lambda: history_ids(d, bob) == [b] and history_ids(d, "root") == [r], what="bob's and root's rows")
    # It fails once the array is queued: --after-ok on a job that has already failed is refused.
    gate = os.path.join(scratch, "go")
    fail = d.submit("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; false", flags=("--no-output",),
                    user=alice)
    word = "x" * 100_000
    out = json.loads(d.ok("new", "--json", "--array", "1-40", "--no-output", "--after-ok", str(fail), "--",
                          "true", word, user=alice))
    open(gate, "w").close()
    last = out["last"]
    wait_for(lambda: last in history_ids(d, alice), timeout=120, what="alice's 41 jobs in her history")
    assert history_ids(d, bob) == [b] and history_ids(d, "root") == [r]
    newest = json.loads(d.ok("history", "--json", "--limit", "1", user=alice))["jobs"][-1]
    assert newest["id"] == last and newest["result"] == "dependency-failed"
    assert newest["command_len"] == len(f"true {word}") and len(newest["command"]) == 4096
    # The archive is root's alone.
    assert as_user(bob, "cat", os.path.join(d.state_dir, "history.db")).returncode != 0
    alive(d, bob)


def test_failed_deliveries_stay_under_the_bounds_and_each_drop_is_logged(daemon_factory, users, scratch):
    # F10: each job writes 1 MiB, then makes its own output directory unwritable, so delivery fails.
    d = daemon_factory("--keep-finished", "1", "--undelivered-per-user", "2M", "--undelivered-max", "3M")
    alice, bob = users["alice"], users["bob"]

    def failing_job(user, i):
        out = os.path.join(scratch, f"out-{user.pw_name}-{i}")
        os.mkdir(out, 0o700)
        os.chown(out, user.pw_uid, user.pw_gid)
        job = d.submit("sh", "-c", f"head -c {MiB} /dev/zero; chmod 500 {out}", flags=("--output", out),
                       user=user.pw_name)
        row = d.wait_finished(job, timeout=60, user=user.pw_name)
        assert "not delivered" in row, row
        return job

    bob_job = failing_job(bob, 0)
    d.wait_finished(d.submit("true", flags=("--no-output",), user=bob.pw_name), user=bob.pw_name)  # evicts it
    alice_jobs = [failing_job(alice, i) for i in range(5)]
    d.wait_finished(d.submit("true", flags=("--no-output",), user=alice.pw_name), user=alice.pw_name)
    undelivered = os.path.join(d.state_dir, "undelivered")

    def files():
        return {n: os.path.getsize(os.path.join(undelivered, n)) for n in os.listdir(undelivered)}
    # Alice's five were all evicted (keep-finished 1), and her share holds two of them.
    expect = {f"output.{bob_job}.{bob.pw_name}.log"} | {f"output.{j}.{alice.pw_name}.log" for j in alice_jobs[3:]}
    wait_for(lambda: set(files()) == expect, timeout=30, what=f"undelivered/ to hold {sorted(expect)}")
    assert sum(files().values()) <= 3 * MiB
    for j in alice_jobs[:3]:
        assert f"dropped {undelivered}/output.{j}.{alice.pw_name}.log ({MiB} bytes" in d.log(), d.log()
    assert "past --undelivered-per-user" in d.log()
    alive(d, bob.pw_name)


def test_a_metrics_directory_others_can_write_is_refused_at_start(daemon_factory, users, scratch):
    # F11: in a directory anyone may write, anyone could stop the updates or serve their own *.prom.
    shared = os.path.join(scratch, "textfile")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    d = daemon_factory("--metrics-file", os.path.join(shared, "hpc_batch.prom"), start=False)
    r = subprocess.run(d.command(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 78, r.stderr
    [line] = [x for x in r.stderr.splitlines() if "--metrics-file" in x]
    assert shared in line and "writable by everyone" in line


def test_a_planted_temp_name_cannot_stop_the_updates(daemon_factory, users, scratch):
    # F11: bob cannot plant anything in a root-only directory; a directory at the old, predictable
    # temporary name (as if planted while the directory was still open to him) stops nothing.
    textdir = os.path.join(scratch, "textfile")
    os.mkdir(textdir, 0o755)
    path = os.path.join(textdir, "hpc_batch.prom")
    d = daemon_factory("--metrics-file", path)
    bob = users["bob"].pw_name
    wait_for(lambda: os.path.exists(path), what="the metrics file")
    guess = os.path.join(textdir, f".hpc_batch.prom.{d.proc.pid}.tmp")
    assert as_user(bob, "mkdir", guess).returncode != 0
    os.mkdir(guess)
    d.submit("true", flags=("--no-output",), user=bob)

    def submitted():
        with open(path) as f:
            return "hpc_batch_jobs_submitted_total 1.0" in f.read()
    wait_for(submitted, timeout=30, what="the metrics file to count the submit")
    assert "cannot write the metrics file" not in d.log()


def test_bob_learns_nothing_of_alices_queued_job(daemon_factory, users, scratch):
    # F6, with --list-is-public off: not through status, the dev entries or the metrics file.
    textdir = os.path.join(scratch, "textfile")
    os.mkdir(textdir, 0o755)
    path = os.path.join(textdir, "hpc_batch.prom")
    d = daemon_factory("--metrics-file", path)
    alice, bob, admin = users["alice"].pw_name, users["bob"].pw_name, users["admin"].pw_name
    blocker = d.submit("sleep", "120", flags=("--no-output", "--exclusive"), user=alice)
    wait_for(lambda: json.loads(d.ok("show", str(blocker), "--json", user=alice))["state"] == "running",
             what="the blocker to run")
    secret = d.submit("true", flags=("--no-output", "--name", "secret-project-x"), user=alice)

    head = json.loads(d.ok("status", "--json", user=bob))["head"]
    assert head == {"id": secret, "user": None, "name": None, "why": None}
    text = d.ok("status", user=bob)
    assert alice not in text and "secret" not in text and f"head: job {secret} (another user's)" in text
    for who in (alice, admin):        # the owner and an admin still see it all
        head = json.loads(d.ok("status", "--json", user=who))["head"]
        assert head["user"] == alice and head["name"] == "secret-project-x" and head["why"]

    entry = os.path.join(d.dev_dir, "jobs", str(secret))
    r = as_user(bob, "stat", "-c", "%U", entry)
    assert r.returncode == 0 and r.stdout.strip() == "root", r
    r = as_user(alice, "cat", os.path.join(entry, "info.json"))   # her own entry still works for her
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == secret
    assert as_user(bob, "cat", os.path.join(entry, "info.json")).returncode != 0

    wait_for(lambda: os.path.exists(path) and alice in open(path).read(), what="alice in the metrics file")
    assert os.stat(path).st_mode & 0o777 == 0o640
    r = as_user(bob, "cat", path)
    assert r.returncode != 0 and alice not in r.stdout
    d.ok("kill", str(blocker), user=alice)
    alive(d, bob)

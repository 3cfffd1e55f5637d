"""The second hostile-user review (issue 20): the engine's findings, played by the users.

F1 (an --after-ok fan-out of a failed job), F2 (waiting jobs under the
per-user cap), F5 (a name means the caller's own job, for admins too) and
the lookup half of F6 (another user's job is not found, exactly as a job
that does not exist). Each runs hpcb-alice and hpcb-bob against a real
root hpc-batchd; a second user's ``dispatch list`` must still answer within
a deadline (a liveness check, not a timing measurement).
"""

import json
import os

import pytest
from conftest import wait_for
from test_hostile import alive, wait_running

pytestmark = pytest.mark.timeout(300)


def _flag_job(scratch, name):
    """A command that runs until the file *name* appears under scratch (made world-writable)."""
    flag = os.path.join(scratch, name)
    return flag, ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 1"]


def _states(d, first, last, user):
    out = d.ok("list", "--finished", "--json", f"{first}-{last}", user=user)
    return {j["id"]: (j["state"], (j.get("result") or {}).get("kind")) for j in json.loads(out)["jobs"]}


def _all_dependency_failed(d, first, last, user):
    states = _states(d, first, last, user)
    return len(states) == last - first + 1 and all(s == ("finished", "dependency-failed")
                                                   for s in states.values())


def test_a_failed_prep_fails_its_1500_dependents_and_the_daemon_lives(daemon_factory, users, scratch):
    """F1: once about 500 dependents failed, the old engine hit RecursionError and stalled."""
    d = daemon_factory("--max-queued-per-user", "2000", "--keep-finished", "2000")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    os.chmod(scratch, 0o755)
    flag, cmd = _flag_job(scratch, "go")
    d.submit(*cmd, user=alice, cwd="/tmp", flags=("--no-output", "--name", "prep"))
    bulk = json.loads(d.ok("new", "--json", "--no-output", "--after-ok", "prep", "--array", "1-1500", "--",
                           "true", user=alice, cwd="/tmp"))
    assert bulk["count"] == 1500
    open(flag, "w").close()
    wait_for(lambda: _all_dependency_failed(d, bulk["id"], bulk["last"], alice), timeout=120,
             what="every dependent to end dependency-failed")
    alive(d, bob)
    assert "Traceback" not in d.log() and "RecursionError" not in d.log()


def test_a_restart_over_a_failed_prep_with_1500_dependents_serves(daemon_factory, users, scratch):
    """F1 at start-up: the prep fails while no daemon runs; the next one starts, serves and fails them."""
    d = daemon_factory("--max-queued-per-user", "2000", "--keep-finished", "2000")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    os.chmod(scratch, 0o755)
    flag, cmd = _flag_job(scratch, "go")
    prep = d.submit(*cmd, user=alice, cwd="/tmp", flags=("--no-output", "--name", "prep"))
    bulk = json.loads(d.ok("new", "--json", "--no-output", "--after-ok", "prep", "--array", "1-1500", "--",
                           "true", user=alice, cwd="/tmp"))
    wait_running(d, prep, user=alice)
    d.kill9()
    open(flag, "w").close()       # prep ends, exit 1, with no daemon to see it
    again = daemon_factory("--max-queued-per-user", "2000", "--keep-finished", "2000")
    alive(again, bob)
    wait_for(lambda: _all_dependency_failed(again, bulk["id"], bulk["last"], alice), timeout=120,
             what="every dependent to end dependency-failed after the restart")
    assert "Traceback" not in again.log()


def test_waiting_jobs_count_toward_the_per_user_cap(daemon_factory, users, scratch):
    """F2: the old daemon took 10,000 waiting jobs from one user against a cap of 1,000."""
    d = daemon_factory("--max-queued-per-user", "100")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    os.chmod(scratch, 0o755)
    flag, cmd = _flag_job(scratch, "go")
    d.submit(*cmd, user=alice, cwd="/tmp", flags=("--no-output", "--name", "hold"))
    d.ok("new", "--no-output", "--after", "hold", "--array", "1-100", "--", "true", user=alice, cwd="/tmp")
    for extra in (("--after", "hold", "--array", "1-10"), ("--after", "hold"), ()):
        r = d.dispatch("new", "--no-output", *extra, "--", "true", user=alice, cwd="/tmp")
        assert r.returncode == 7 and "--max-queued-per-user" in r.stderr and "waiting" in r.stderr, r
    # Bob's own cap is his.
    d.submit("true", user=bob, cwd="/tmp", flags=("--no-output",))
    open(flag, "w").close()
    alive(d, bob)


def test_an_admins_name_is_the_admins_own_job(daemon, users, scratch):
    """F5: root's name resolved to bob's newer job of that name: wait, --after-ok and kill were hijacked."""
    bob, admin = users["bob"].pw_name, users["admin"].pw_name
    os.chmod(scratch, 0o755)
    flag, cmd = _flag_job(scratch, "go")
    mine = daemon.submit(*cmd, user=admin, cwd="/tmp", flags=("--no-output", "--name", "nightly-prep"))
    bobs = daemon.submit(*cmd, user=bob, cwd="/tmp", flags=("--no-output", "--name", "nightly-prep"))
    assert bobs > mine       # bob's is the newest job of that name on the machine
    shown = json.loads(daemon.ok("show", "--json", "nightly-prep", user=admin))
    assert shown["id"] == mine
    after = json.loads(daemon.ok("new", "--json", "--no-output", "--after-ok", "nightly-prep", "--name", "nightly",
                                 "--", "true", user=admin, cwd="/tmp"))
    assert after["after"] == [mine]
    # Another user's job is named as such.
    theirs = json.loads(daemon.ok("show", "--json", f"{bob}:nightly-prep", user=admin))
    assert theirs["id"] == bobs
    daemon.ok("kill", "nightly-prep", user=admin)
    assert "killed" in daemon.wait_finished(mine, user=admin)
    assert json.loads(daemon.ok("show", "--json", str(bobs), user=bob))["state"] != "finished"
    open(flag, "w").close()


def test_another_users_job_is_answered_as_not_found(daemon, users, scratch):
    """F6: 'belongs to another user' against 'no such job' told bob which ids were alice's."""
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    os.chmod(scratch, 0o755)
    flag, cmd = _flag_job(scratch, "go")
    job = daemon.submit(*cmd, user=alice, cwd="/tmp", flags=("--no-output", "--name", "secret-project-x"))
    missing = job + 1000
    for verb in ("show", "kill", "attach", "wait"):
        theirs = daemon.dispatch(verb, str(job), user=bob, timeout=30)
        none = daemon.dispatch(verb, str(missing), user=bob, timeout=30)
        assert (theirs.returncode, theirs.stderr.replace(str(job), "N")) == \
            (none.returncode, none.stderr.replace(str(missing), "N")), (verb, theirs, none)
        assert theirs.returncode == 3
    named = daemon.dispatch("show", f"{alice}:secret-project-x", user=bob)
    assert named.returncode == 3 and "no job named" in named.stderr
    open(flag, "w").close()
    alive(daemon, bob)


def _waited(d, job, user, timeout=60):
    """The exit column ``dispatch wait`` gives for *job* (which --keep-finished may have evicted since)."""
    r = d.dispatch("wait", "--json", str(job), user=user, timeout=timeout)
    return json.loads(r.stdout)["jobs"][0]["exit"]


def _finished_ids(d, user):
    out = d.ok("list", "--finished", "--json", user=user)
    return {j["id"] for j in json.loads(out)["jobs"] if j["state"] == "finished"}


def test_a_waiting_job_keeps_no_finished_job_past_keep_finished(daemon_factory, users, scratch):
    """G1 (third review): alice's W names 40 jobs she then cancels, while W waits on a running job.
    The cancelled jobs are evicted at once (--keep-finished 2), W waits on through a kill -9 and a
    new daemon, and runs once its last job ends."""
    args = ("--keep-finished", "2", "--max-queued-per-user", "200")
    d = daemon_factory(*args)
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    os.chmod(scratch, 0o755)
    flag, cmd = _flag_job(scratch, "go")
    hold = d.submit(*cmd, user=alice, cwd="/tmp", flags=("--no-output",))
    wait_running(d, hold, user=alice)
    big = "x" * 20_000      # each a command worth keeping, as the review sent
    deps = [d.submit("true", big, user=alice, cwd="/tmp", flags=("--no-output", "--after", str(hold)))
            for _ in range(40)]
    w = d.submit("true", user=alice, cwd="/tmp",
                 flags=("--no-output", "--after", ",".join(map(str, [hold, *deps]))))
    d.ok("kill", *map(str, deps), user=alice)
    wait_for(lambda: len(_finished_ids(d, alice)) <= 2, timeout=60,
             what="alice's finished jobs to be evicted down to --keep-finished 2")
    assert not set(deps) & _finished_ids(d, alice) or len(_finished_ids(d, alice)) <= 2
    alive(d, bob)
    d.kill9()
    d = daemon_factory(*args)
    assert len(_finished_ids(d, alice)) <= 2
    assert " waiting " in d.rows(str(w), user=alice)[w]
    open(flag, "w").close()      # hold ends (exit 1): W (--after) runs
    assert _waited(d, w, alice) == "0"
    assert "Traceback" not in d.log()


def test_an_after_ok_job_runs_after_its_evicted_jobs_exited_0(daemon_factory, users, scratch):
    """G1: the jobs an --after-ok job names exit 0 and are evicted before its last one ends; what
    it keeps of them outlives a kill -9."""
    args = ("--keep-finished", "1", "--reserve-cpu", "0", "--reserve-mem", "0")
    d = daemon_factory(*args)
    alice = users["alice"].pw_name
    os.chmod(scratch, 0o755)
    hold_flag, go = os.path.join(scratch, "hold"), os.path.join(scratch, "go")
    hold = d.submit("sh", "-c", f"while [ ! -e {hold_flag} ]; do sleep 0.05; done", user=alice, cwd="/tmp",
                    flags=("--no-output",))
    gate = d.submit("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done", user=alice, cwd="/tmp",
                    flags=("--no-output",))
    oks = [d.submit("true", user=alice, cwd="/tmp", flags=("--no-output", "--after", str(gate)))
           for _ in range(3)]
    w = d.submit("true", user=alice, cwd="/tmp",
                 flags=("--no-output", "--after-ok", ",".join(map(str, [hold, *oks]))))
    open(go, "w").close()
    for j in oks:
        assert _waited(d, j, alice) == "0"
    assert _waited(d, d.submit("true", user=alice, cwd="/tmp", flags=("--no-output",)), alice) == "0"
    assert not set(oks) & _finished_ids(d, alice)        # evicted while w waits
    assert " waiting " in d.rows(str(w), user=alice)[w]
    d.kill9()
    d = daemon_factory(*args)
    assert " waiting " in d.rows(str(w), user=alice)[w]
    open(hold_flag, "w").close()
    assert _waited(d, w, alice) == "0"

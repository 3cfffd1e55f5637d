"""Day-two verbs through the real daemon: wait, dependencies, names, show, status, --json, accounting."""

import json
import os
import signal
import subprocess

import pytest
from conftest import DISPATCH, exit_of, wait_for

pytestmark = pytest.mark.timeout(120)


def _json(d, *args, **kw):
    r = d.dispatch(*args, "--json", **kw) if args[0] != "new" else d.dispatch(*args, **kw)
    return r, json.loads(r.stdout)


@pytest.mark.parametrize("cmd,flags,status", [
    (["sh", "-c", "exit 3"], (), 3),
    (["sh", "-c", "kill -SEGV $$"], (), 128 + signal.SIGSEGV),
    (["sleep", "60"], ("--max-time", "1s"), 241),
    (["true"], (), 0),
])
def test_wait_exits_as_the_job_did(daemon, cmd, flags, status):
    job = daemon.submit(*cmd, flags=flags + ("--no-output",))
    r = daemon.dispatch("wait", str(job), timeout=60)
    assert r.returncode == status, r.stderr
    assert r.stdout.startswith(f"job {job} finished: exit ")


def test_wait_for_a_killed_and_a_cancelled_job(daemon_factory, users, scratch):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    running = d.submit("sleep", "60", flags=("--cpu", "2", "--no-output"))
    queued = d.submit("true", flags=("--no-output",))
    waiter = subprocess.Popen([DISPATCH, "wait", str(running)], env={"HPC_BATCH_SOCKET": d.socket},
                              stdout=subprocess.PIPE, text=True)
    d.ok("kill", str(queued))
    assert d.dispatch("wait", str(queued)).returncode == 244
    d.ok("kill", str(running))
    assert waiter.wait(timeout=60) == 240
    # Several jobs: the first, in the order given, that did not exit 0.
    ok = d.submit("true", flags=("--no-output",))
    d.wait_finished(ok)
    assert d.dispatch("wait", str(ok), str(queued), str(running)).returncode == 244


def test_new_wait_survives_a_reload_and_a_restart(daemon_factory, users, scratch):
    d = daemon_factory()
    for how in ("reload", "kill9"):
        flag = os.path.join(scratch, f"go-{how}")
        p = subprocess.Popen([DISPATCH, "new", "--wait", "--no-output", "--", "sh", "-c",
                              f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 5"],
                             env={"HPC_BATCH_SOCKET": d.socket, "PATH": "/usr/bin:/bin"}, cwd=scratch,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        job = int(p.stdout.readline().split()[1])
        d.wait_running(job)
        if how == "reload":
            seen = d.log().count("ready on")
            d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda d=d, seen=seen: d.log().count("ready on") > seen, what="reload")
        else:
            d.kill9()
            d = daemon_factory()
        open(flag, "w").close()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 5, err
        assert f"job {job} finished: exit 5" in out


def test_after_ok_chain_with_a_failing_first_job(daemon, scratch):
    # The first job fails only once the chain is queued: --after-ok a job that has already failed
    # is refused at submit (test_bad_input_daemon.py).
    gate = os.path.join(scratch, "go")
    first = daemon.submit("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 1",
                          flags=("--no-output", "--name", "prep"))
    second = daemon.submit("true", flags=("--no-output", "--after-ok", "prep"))
    third = daemon.submit("true", flags=("--no-output", "--after-ok", str(second)))
    anyway = daemon.submit("sh", "-c", "exit 7", flags=("--no-output", "--after", f"{first},{second}"))
    open(gate, "w").close()
    assert daemon.dispatch("wait", str(third)).returncode == 245
    rows = daemon.rows("--finished")
    assert exit_of(rows[second]) == "dependency-failed" and f"job {first}" in rows[second]
    assert exit_of(rows[third]) == "dependency-failed" and f"job {second}" in rows[third]
    assert daemon.dispatch("wait", str(anyway)).returncode == 7          # --after: however they ended


def test_dependencies_survive_kill9_and_restart(daemon_factory, users, scratch):
    d = daemon_factory()
    flag = os.path.join(scratch, "go")
    first = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done", flags=("--no-output",))
    after = d.submit("sh", "-c", "exit 4", flags=("--no-output", "--after-ok", str(first)))
    assert " waiting " in d.rows()[after]
    d.kill9()
    d2 = daemon_factory()
    assert " waiting " in d2.rows()[after]
    open(flag, "w").close()
    assert d2.dispatch("wait", str(after)).returncode == 4


def test_dependencies_must_be_known_and_yours(daemon, users):
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    r = daemon.dispatch("new", "--after", "4242", "--", "true")
    assert r.returncode == 3 and "no such job: 4242" in r.stderr
    mine = daemon.submit("sleep", "30", user=alice, cwd=users["alice"].pw_dir, flags=("--no-output",))
    # Another user's job is not found, as if it did not exist (the list is not public).
    r = daemon.dispatch("new", "--after-ok", str(mine), "--", "true", user=bob, cwd="/tmp")
    assert r.returncode == 3 and f"no such job: {mine}" in r.stderr
    r = daemon.dispatch("new", "--after", "1", "--after-ok", "1", "--", "true")
    assert r.returncode == 2
    daemon.ok("kill", str(mine))


def test_names_in_list_kill_wait_and_show(daemon):
    job = daemon.submit("sleep", "60", flags=("--no-output", "--name", "train.v2"))
    assert f"{job} [train.v2]sleep 60 " in daemon.ok("list")
    assert daemon.ok("show", "train.v2").splitlines()[0] == f"id: {job}"
    waiter = subprocess.Popen([DISPATCH, "wait", "train.v2"], env={"HPC_BATCH_SOCKET": daemon.socket})
    daemon.ok("kill", "train.v2")
    assert waiter.wait(timeout=60) == 240
    r = daemon.dispatch("new", "--name", "1234", "--", "true")
    assert r.returncode == 2


def test_show_says_why_a_job_waits_and_where(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    big = d.submit("sleep", "60", flags=("--cpu", "2", "--no-output"))
    head = d.submit("true", flags=("--cpu", "2", "--no-output"))
    behind = d.submit("true", flags=("--no-output",))
    show = d.ok("show", str(head)).splitlines()
    assert "place in queue: 1" in show
    assert any(line.startswith("waiting because: it needs 2 cores on one NUMA node") for line in show), show
    r, doc = _json(d, "show", str(behind))
    assert doc["position"] == 2 and "behind job" in doc["why"] and "fifo-strict" in doc["why"]
    r, doc = _json(d, "show", str(big))
    assert doc["state"] == "running" and len(doc["cpus"]) == 2 and doc["numa_nodes"] == [0]
    assert doc["deadline"] == pytest.approx(doc["started"] + doc["max_time"])
    for j in (behind, head, big):     # the queued ones first, so none starts meanwhile
        d.ok("kill", str(j))


def test_json_documents_field_by_field(daemon, scratch):
    r = daemon.dispatch("new", "--json", "--name", "j1", "--max-mem", "256M", "--", "sh", "-c", "exit 2")
    new = json.loads(r.stdout)
    assert r.returncode == 0
    assert set(new) >= {"id", "state", "mem", "mem_assigned", "output", "name", "after", "after_ok"}
    assert (new["name"], new["mem"], new["mem_assigned"], new["after"]) == ("j1", 256 << 20, False, [])
    assert new["output"] == os.path.join(scratch, f"output.{new['id']}.log")
    r, waited = _json(daemon, "wait", str(new["id"]))
    assert r.returncode == 2 and waited["exit"] == 2
    (job,) = waited["jobs"]
    assert (job["id"], job["state"], job["result"], job["exit"], job["wait_status"]) == \
        (new["id"], "finished", "exited", "2", 2)
    r, listing = _json(daemon, "list", "--finished")
    row = next(j for j in listing["jobs"] if j["id"] == new["id"])
    for key in ("user", "command", "state", "submitted", "started", "ended", "max_time", "mem", "exit",
                "gpus", "name", "stats"):
        assert key in row, key
    assert (row["command"], row["exit"], row["name"]) == ("sh -c 'exit 2'", "2", "j1")
    r, shown = _json(daemon, "show", "j1")
    assert shown["argv"] == ["sh", "-c", "exit 2"] and shown["code"] == 2 and shown["wall"] >= 0
    r, st = _json(daemon, "status")
    assert st["policy"] == "fifo-strict" and st["nodes"][0]["cpus"]["total"] >= 1
    assert set(st["nodes"][0]) == {"id", "cpus", "cores", "held_idle", "mem", "gpus"}   # issue 21
    assert set(st["nodes"][0]["mem"]) == {"total", "reserved", "in_use", "free"}
    # Errors are JSON too, with the code and the exit status.
    r = daemon.dispatch("show", "--json", "4242")
    err = json.loads(r.stdout)
    assert r.returncode == 3 and err == {"ok": False, "error": "no such job: 4242", "code": "not_found", "exit": 3}


def test_status_for_people(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "1", "--reserve-mem", "0")
    busy = d.submit("sleep", "60", flags=("--no-output",))
    head = d.submit("true", flags=("--no-output", "--name", "blocked"))
    out = d.ok("status").splitlines()
    assert out[0] == "policy fifo-strict; memory budgeted one machine-wide pool (--no-cgroups)"
    assert out[1].startswith("jobs: 1 running, 1 queued, 0 waiting")
    node = out[3].split()
    assert node[0] == "0" and node[1] == "2/1/1/0"                   # 2 CPUs: 1 reserved, 1 in use, 0 free
    assert out[-1].startswith(f"head: job {head} (root): it needs 1 cores on one NUMA node")
    d.ok("kill", str(busy))
    d.wait_finished(head)


def test_accounting_without_cgroups_and_history(daemon, scratch):
    job = daemon.submit("python3", "-c", "b = bytearray(64 << 20); x = sum(range(3_000_000))",
                        flags=("--no-output",))
    row = daemon.wait_finished(job)
    words = row.split()
    cpu = float(words[words.index("cpu") + 1].rstrip("s"))
    peak = words[words.index("peak") + 1]
    assert cpu > 0.05 and peak.endswith("M") and int(peak[:-1]) >= 64, row
    def row():
        rows = json.loads(daemon.ok("history", "--json", str(job)))["jobs"]
        return rows[0] if rows else None
    line = wait_for(row, what=f"job {job} in the history")
    assert os.stat(os.path.join(daemon.state_dir, "history.db")).st_mode & 0o777 == 0o600
    assert line["id"] == job and line["result"] == "exited" and line["code"] == 0
    assert line["peak_mem"] >= 64 << 20 and line["cpu_s"] > 0.05 and line["wall_s"] > 0

"""Hostile users against the state directory (issue 20: F4 storage, F9, the free-disk reserve).

hpcb-alice attacks a real root hpc-batchd through its state directory: bulk
submits that multiply a large environment, a queue of large records that
made every start of an ``--env`` job rewrite the journal, and a state
filesystem filled to the brim. hpcb-bob's ``dispatch list`` and
``dispatch new`` must keep being answered (a liveness check with a
deadline, not a timing measurement), and each attack's cost is checked
against a bound computed from what the request legitimately stores.
"""

import os
import signal
import stat
import subprocess
import threading
import time

import pytest
from ci_host import require
from conftest import kill_shepherds, wait_for
from test_hostile import alive, raw_as, request

pytestmark = pytest.mark.timeout(240)

MB = 1_000_000
FLAGS = ("--reserve-cpu", "0", "--reserve-mem", "0")


def _written(pid):
    """Bytes the process has passed to write calls so far (files, log, sockets)."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def _hold(d, user):
    """A running job of *user*'s named hold, for others to wait behind."""
    out = d.ok("new", "--name", "hold", "--no-output", "--", "sleep", "300", user=user)
    return int(out.split()[1])


def _new(**args):
    return request("new", cwd="/tmp", no_output=True, **args)


def _files_hold(root, needle):
    """The first regular file under *root* holding *needle* (FIFOs are left alone: opening one blocks)."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                with open(path, "rb") as f:
                    if needle in f.read():
                        return path
            except OSError:
                pass
    return None


def test_a_bulk_of_a_large_environment_is_stored_once(daemon_factory, users, scratch):
    """F4: one 1 MB --env request with --array 1-900 wrote 1.9 GB; it must write its size, once."""
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    d = daemon_factory(*FLAGS)
    _hold(d, alice)
    before = _written(d.proc.pid)
    answers, stop = [], threading.Event()

    def bob_lists():
        while not stop.is_set() or not answers:
            alive(d, bob)
            answers.append(1)
    watcher = threading.Thread(target=bob_lists)
    watcher.start()
    try:
        (reply,) = raw_as(d, alice, [_new(argv=["true"], env={"BIG": "x" * MB}, array=list(range(1, 901)),
                                          after=["hold"])], scratch, timeout=60)
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert reply and reply["ok"], reply
    assert reply["result"]["count"] == 900
    written = _written(d.proc.pid) - before
    # The environment once (its env file), and per element its job.json, journal line, info.json, dev
    # entry and log lines: about 2.5 kB each. 8 KiB per element leaves room for growth of the record.
    bound = MB + 900 * 8192
    used = subprocess.run(["du", "-sb", d.state_dir], capture_output=True, text=True).stdout.split()[0]
    print(f"one 1 MB --env request of 900 elements: the daemon wrote {written / MB:.1f} MB; "
          f"the state directory holds {int(used) / MB:.1f} MB")
    assert written < bound, f"{written} bytes written, more than {bound}"
    env_dir = os.path.join(d.state_dir, "env")
    assert len(os.listdir(env_dir)) == 1
    assert answers, "bob's dispatch list was never answered"
    d.ok("kill", f"{reply['result']['id']}-{reply['result']['last']}", user=alice)
    wait_for(lambda: not os.listdir(env_dir), what="the cancelled bulk's environment to go")


def test_starting_env_jobs_never_rewrites_a_large_journal(daemon_factory, users, scratch):
    """F9: with a large queue parked, each start of an --env job rewrote the whole journal."""
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    d = daemon_factory(*FLAGS)
    _hold(d, alice)
    big = ["true"] + ["A" * 100_000] * 10     # 1 MB, under --max-job-size
    parked = raw_as(d, alice, [_new(argv=big, after=["hold"]) for _ in range(16)], scratch, timeout=60)
    assert all(r and r["ok"] for r in parked), parked
    # A reload starts the journal afresh from one snapshot of all this: whatever follows is appended.
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: d.log().count("ready on") >= 2 and d.ping(), timeout=60, what="the reload")
    journal = os.path.join(d.state_dir, "journal")
    inode, size = os.stat(journal).st_ino, os.path.getsize(journal)
    assert size > 16 * MB
    (reply,) = raw_as(d, alice, [_new(argv=["true"], env={"SECRET": "hunter2"}, job_env={"TOKEN": "hunter3"},
                                      array=list(range(1, 21)))], scratch)
    assert reply and reply["ok"], reply
    first, last = reply["result"]["id"], reply["result"]["last"]
    slowest = [0.0]

    def drained():
        t = time.monotonic()
        alive(d, bob)               # answered all along, while the array starts and ends
        slowest[0] = max(slowest[0], time.monotonic() - t)
        rows = d.rows("--finished", user=alice)
        return all(" finished " in rows.get(j, "") for j in range(first, last + 1))
    wait_for(drained, timeout=120, interval=0.2, what="alice's --env array to drain")
    print(f"bob's slowest dispatch list while 20 --env jobs started beside 16 MB of parked records: "
          f"{slowest[0]:.2f} s")
    assert os.stat(journal).st_ino == inode, "a start rewrote the journal"
    assert os.path.getsize(journal) < size + MB, "the drain appended more than its own records"
    assert not os.listdir(os.path.join(d.state_dir, "env"))
    for secret in (b"hunter2", b"hunter3"):
        assert _files_hold(d.state_dir, secret) is None, _files_hold(d.state_dir, secret)


def test_a_full_state_disk_recovers_once_the_jobs_that_filled_it_are_gone(daemon_factory, users, scratch):
    """F4: alice filled the state filesystem; bob was refused long after she killed her jobs."""
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    state = os.path.join(scratch, "state")
    os.mkdir(state)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0711", "tmpfs", state],
                             capture_output=True, text=True)
    require(mounted.returncode == 0, f"cannot mount a tmpfs for the state directory: {mounted.stderr.strip()}")
    d = None
    try:
        d = daemon_factory(*FLAGS, "--state-reserve", "4M", "--keep-finished", "1")
        _hold(d, alice)
        # Each submit stores 1 MB (one env file); she goes on until the daemon refuses.
        replies = raw_as(d, alice, [_new(argv=["true"], env={"BIG": "x" * MB}, after=["hold"])
                                    for _ in range(30)], scratch)
        taken = [r["result"]["id"] for r in replies if r and r["ok"]]
        refused = [r for r in replies if r and not r["ok"]]
        assert taken and refused, replies
        assert all(r["code"] == "busy" and "--state-reserve" in r["error"] for r in refused), refused
        r = d.dispatch("new", "--no-output", "--", "true", user=bob)
        assert r.returncode == 9 and state in r.stderr and "reserve" in r.stderr, r.stderr
        alive(d, bob)
        d.ok("kill", *map(str, taken), "hold", user=alice)

        def bob_submits():
            return d.dispatch("new", "--no-output", "--", "true", user=bob).returncode == 0
        wait_for(bob_submits, timeout=30, interval=0.2, what="bob's submit to be taken again")
    finally:
        if d is not None:
            d.stop()
        kill_shepherds(scratch)
        subprocess.run(["umount", "-l", state], check=False)

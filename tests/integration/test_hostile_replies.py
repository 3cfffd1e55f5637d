"""Hostile users against the daemon's replies (the second review's F4 reply side and F3).

hpcb-alice queues large commands, holds list replies unread on many
connections, and waits on 100,000 copies of a name; root and hpcb-bob must
still be answered. Liveness is a deadline on another user's ``dispatch
list`` (as in test_hostile.py), memory a bound on the daemon's high-water
mark, never a timing figure.
"""

import base64
import json
import os
import subprocess
import sys

import pytest
from conftest import wait_for
from test_hostile import alive, as_user, raw_as, request, shared_dir

from hpc_batch.core.cut import COMMAND_CUT

pytestmark = pytest.mark.timeout(240)
BIG = 10_000            # characters of one word of alice's commands: past the cut
KNOWN = 4000           # jobs alice has waiting when she waits on a name 100,000 times
BULK = 300              # jobs of alice's bulk: about 1.3 MiB of cut commands, past one list page


def _hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _large_bulk(d, alice, scratch):
    """Alice's job 'hold' runs; BULK jobs with BIG-character commands wait behind it."""
    work = shared_dir(scratch, "alice")
    hold = d.submit("sleep", "600", flags=("--name", "hold", "--no-output"), user=alice, cwd=work)
    out = d.ok("new", "--after", "hold", "--no-output", "--array", f"1-{BULK}", "--", "printf", "x" * BIG,
               user=alice, cwd=work)
    assert out.startswith("jobs "), out
    return hold, work


def test_root_lists_everything_with_a_large_command_bulk_queued(daemon, users, scratch):
    alice = users["alice"].pw_name
    hold, _ = _large_bulk(daemon, alice, scratch)
    rows = daemon.rows("--all")                        # root: every page, as one listing
    assert len(rows) == BULK + 1 and min(rows) == hold
    assert all(len(row) < COMMAND_CUT + 200 for row in rows.values())   # each command cut
    r = daemon.dispatch("list", "--all", "--json")
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout)["jobs"]
    assert len(jobs) == BULK + 1
    bulk = [j for j in jobs if j["id"] != hold]
    assert all(len(j["command"]) == COMMAND_CUT and j["command_len"] == len("printf ") + BIG for j in bulk)
    # The reply came in pages: the first holds part of the list and says where the rest begins.
    (first,) = raw_as(daemon, alice, [request("list", all=False, finished=False, after=0)], scratch)
    assert first["ok"] and first["result"]["more"] is not None, first
    assert 0 < len(first["result"]["jobs"]) < BULK + 1
    with open(os.path.join(daemon.state_dir, "jobs", str(max(rows)), "info.json")) as f:
        info = json.load(f)                            # the /dev/hpc-batch entry's metadata: cut too
    assert len(info["command"]) == COMMAND_CUT and info["command_len"] == len("printf ") + BIG
    shown = daemon.ok("show", str(max(rows)))
    assert "x" * BIG in shown                          # show keeps the whole command
    assert len(daemon.rows(user=alice)) == BULK + 1     # alice's own list too


HOLDER = r"""
import socket, struct, sys, json
path, n = sys.argv[1], int(sys.argv[2])
body = json.dumps({"v": 1, "op": "list", "args": {"all": False, "finished": False, "after": 0}}).encode()
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(struct.pack(">I", len(body)) + body)   # and never read the reply
    socks.append(s)
print(len(socks), flush=True)
for line in sys.stdin:   # each line: how many connections have reply bytes waiting
    answered = 0
    for s in socks:
        s.setblocking(False)
        try:
            answered += bool(s.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            pass
    print(answered, flush=True)
"""


def test_unread_list_replies_are_bounded_per_user(daemon_factory, users, scratch):
    conns = 150
    d = daemon_factory("--max-connections-per-user", str(conns + 10), "--max-reply-bytes-per-user", "2M")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    _large_bulk(d, alice, scratch)
    assert len(d.rows(user=alice)) == BULK + 1          # one page built and read: the baseline
    before = _hwm(d.proc.pid)
    script = os.path.join(scratch, "holder.py")
    with open(script, "w") as f:
        f.write(HOLDER)
    os.chmod(script, 0o644)
    p = subprocess.Popen(["runuser", "-u", alice, "--", sys.executable, "-I", script, d.socket, str(conns)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert int(p.stdout.readline()) == conns

        def answered():
            p.stdin.write("\n")
            p.stdin.flush()
            return int(p.stdout.readline())
        wait_for(answered, what="the daemon to answer some of alice's lists")
        alive(d, bob)                                    # bob is served meanwhile
        grew = _hwm(d.proc.pid) - before
        # Unbounded, 150 replies of about 1 MiB each would be held (150 MiB, and 450 MiB before
        # the commands were cut); the budget holds 2 MiB plus the page that passed it.
        assert grew < 48 << 20, grew
        assert answered() < conns // 4                    # the rest wait, unread, for alice to read
    finally:
        p.stdin.close()        # the holder ends at EOF, and its connections with it
        p.wait(timeout=30)
    alive(d, alice)            # served again once her connections went


def test_a_wait_on_100000_copies_of_a_name_is_one_lookup(daemon_factory, users, scratch):
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    d = daemon_factory("--max-queued-per-user", str(KNOWN + 10))
    work = shared_dir(scratch, "alice")
    go = os.path.join(work, "go")
    d.submit("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done", flags=("--name", "x", "--no-output"),
             user=alice, cwd=work)
    # Many jobs known to the daemon (waiting on one that outlives the test): before, each of the
    # 100,000 names was a scan of all of them.
    d.submit("sleep", "600", flags=("--name", "hold", "--no-output"), user=alice, cwd=work)
    d.ok("new", "--after", "hold", "--no-output", "--array", f"1-{KNOWN}", "--", "true", user=alice, cwd=work)
    (pong,) = raw_as(d, alice, [request("ping")], scratch)   # and wire.py is now in scratch
    assert pong["ok"]
    line = base64.b64encode(request("wait", ids=["x"] * 100_000)).decode() + "\n"
    waits = []
    for _ in range(3):
        w = subprocess.Popen(["runuser", "-u", alice, "--", sys.executable, "-I", os.path.join(scratch, "wire.py"),
                              d.socket, "120"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        w.stdin.write(line)
        w.stdin.close()
        waits.append(w)
    alive(d, bob)                       # answered while three such waits are parsed and held
    alive(d, bob)
    as_user(alice, "touch", go)
    for w in waits:
        reply = json.loads(w.stdout.read())
        assert w.wait(timeout=60) == 0
        assert reply and reply["ok"], reply
        assert [j["name"] for j in reply["result"]["jobs"]] == ["x"]   # one job, however many copies

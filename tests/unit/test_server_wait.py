"""The server's side of ``dispatch wait`` (its streams) and of the reply budget, with a stand-in engine.

A real Server on a socketpair: what is checked is how much work a wait
costs (each distinct ref looked up once, each end a count down, one answer)
and that a user past --max-reply-bytes-per-user is not read until their
replies drain.
"""

import socket
import types

from hpc_batch.core.jobs import FINISHED, RUNNING
from hpc_batch.daemon import access
from hpc_batch.daemon.main import Config
from hpc_batch.daemon.server import Conn, Server
from hpc_batch.wire import framing, protocol


class FakeEngine:
    def __init__(self, n):
        self.jobs = {i: types.SimpleNamespace(id=i, uid=1000, name=f"j{i}", state=RUNNING, output=None,
                                              output_error=None, get_result=lambda: None)
                     for i in range(1, n + 1)}
        self.lookups = 0
        self.store = types.SimpleNamespace(has_pending=False)
        self.to_spawn = []

    def lookup(self, caller, ref):
        self.lookups += 1
        if isinstance(ref, str):
            return self.jobs[int(ref[1:])]
        return self.jobs[ref]

    def run_pending(self, now):
        pass


def server(n, budget=32 << 20):
    cfg = Config(socket="/x", state_dir="/x", dev_dir=None, max_lifetime=60, reserve_cpu=0, reserve_mem=0,
                 min_job_mem=0, keep_finished=1, list_is_public=False, admin_group="root", schedule="fifo-strict",
                 cgroups=False, max_reply_bytes_per_user=budget)
    srv = Server(cfg, socket.socket(socket.AF_UNIX))
    srv.engine = srv.streams.engine = FakeEngine(n)   # type: ignore[assignment]
    return srv


def connect(srv, uid=1000):
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = Conn(ours, access.Caller(uid=uid, gid=uid, pid=1, name="u", is_admin=False))
    srv.conns[ours.fileno()] = conn
    srv.conns_of.setdefault(uid, set()).add(conn)
    srv.sel.register(ours, 1, ("conn", conn))
    return conn, theirs


def read_reply(srv, conn, sock):
    """The client reads while the server sends what is left (the loop's write events)."""
    dec = framing.Decoder(framing.MAX_REPLY)
    sock.settimeout(5)
    while (msg := dec.next()) is None:
        srv._flush(conn)
        dec.feed(sock.recv(1 << 20))
    return msg


def test_a_wait_resolves_each_distinct_ref_once_and_counts_down():
    n = 5000
    srv = server(n)
    conn, peer = connect(srv)
    answers = []
    real = srv.streams.answer_wait
    srv.streams.answer_wait = lambda c: (answers.append(c), real(c))
    srv.streams.wait(conn, protocol.WaitJobs(ids=("j7",) * 100_000 + tuple(range(1, n + 1))), 0.0)
    assert srv.engine.lookups == n + 1          # 100,000 copies of a name: one lookup
    assert conn.wait_left == n and answers == []
    for i in range(1, n + 1):                   # each end: a count down, no rescan
        srv.engine.jobs[i].state = FINISHED
        srv.job_event(i, "finished")
        assert len(answers) == (i == n)
    reply = read_reply(srv, conn, peer)
    assert reply["ok"] and [j["id"] for j in reply["result"]["jobs"]] == [7] + [i for i in range(1, n + 1) if i != 7]


def test_a_user_past_the_reply_budget_is_not_read_until_it_drains():
    srv = server(1, budget=4096)
    hog, hog_peer = connect(srv)
    hog.out += b"x" * (1 << 20)                 # a reply the client does not read (past the kernel's buffer)
    srv._flush(hog)
    assert srv._held_bytes(1000) >= 4096
    asker, asker_peer = connect(srv)
    asker.decoder.feed(framing.encode(protocol.request("ping")))
    srv._requests(asker)
    assert asker.stalled and not asker.out       # not read: backpressure, not an error
    other, other_peer = connect(srv, uid=2000)  # another user is not affected
    other.decoder.feed(framing.encode(protocol.request("ping")))
    srv._requests(other)
    assert not other.stalled and read_reply(srv, other, other_peer)["ok"]
    srv._close(hog)                              # the hog goes: the budget frees, the asker goes on
    assert not asker.stalled and asker in srv.resume
    srv._requests(asker)
    assert read_reply(srv, asker, asker_peer)["ok"]

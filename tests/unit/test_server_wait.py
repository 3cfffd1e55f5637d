"""The server's side of ``dispatch wait`` and an attach's end (its streams) and of the reply budget,
with a stand-in engine.

A real Server on a socketpair: what is checked is how much work a wait
costs (each distinct ref looked up once, each end a count down, one answer)
and that a user past --max-reply-bytes-per-user is not read until their
replies drain.
"""

import os
import socket
import types

import pytest

from hpc_batch.core import waitpages
from hpc_batch.core.jobs import FINISHED, RUNNING
from hpc_batch.daemon import access
from hpc_batch.daemon.conn import Conn
from hpc_batch.daemon.hooks import Hooks
from hpc_batch.daemon.main import Config
from hpc_batch.daemon.server import Server
from hpc_batch.wire import framing, protocol


class FakeEngine:
    def __init__(self, n):
        self.jobs = {i: types.SimpleNamespace(id=i, uid=1000, name=f"j{i}", state=RUNNING, output=None,
                                              output_error=None, result=None)
                     for i in range(1, n + 1)}
        self.lookups = 0
        self.turn = types.SimpleNamespace(holds_replies=False)   # nothing waits for a commit here

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
    srv = Server(cfg, socket.socket(socket.AF_UNIX), FakeEngine(n), Hooks())   # type: ignore[arg-type]
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
    srv.streams.wait(conn, protocol.WaitJobs(ids=("j7",) * 100_000 + tuple(range(1, n + 1)), paged=True), 0.0)
    assert srv.engine.lookups == n + 1          # 100,000 copies of a name: one lookup
    assert srv.streams.states[conn].wait_left == n and answers == []
    for i in range(1, n + 1):                   # each end: a count down, no rescan
        srv.engine.jobs[i].state = FINISHED
        srv.job_event(i, "finished")
        assert len(answers) == (i == n)
    reply = read_reply(srv, conn, peer)
    order = [7] + [i for i in range(1, n + 1) if i != 7]
    page = protocol.WAIT_PAGE_JOBS
    assert reply["ok"] and [j["id"] for j in reply["result"]["jobs"]] == order[:page]
    assert reply["result"]["more"] == order[page:]   # the rest by id, for the client's next waits


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


# -- paged answers ---------------------------------------------------------------------------

def wait_once(srv, ids, paged=True, uid=1000, **more):
    """One wait request as the server's loop handles it; its reply (all the jobs have ended)."""
    conn, peer = connect(srv, uid)
    conn.decoder.feed(framing.encode(protocol.request("wait", ids=list(ids), paged=paged, **more)))
    srv._requests(conn)
    return read_reply(srv, conn, peer)


def finished(n, output=None):
    srv = server(n)
    for job in srv.engine.jobs.values():
        job.state, job.output = FINISHED, output
    return srv


def test_a_paged_wait_comes_in_bounded_replies_that_add_up_to_the_whole_answer():
    n = 3 * protocol.WAIT_PAGE_JOBS + 17
    # An output path of 4000 bytes a job: the bytes cut a page, long before its count does.
    srv = finished(n, output="/" + "o" * 3999)
    refs = [f"j{i}" for i in range(n, 0, -1)] + ["j5"]
    first = wait_once(srv, refs)
    assert first["ok"]
    got = first["result"]["jobs"]
    left = first["result"]["more"]
    assert 0 < len(got) < protocol.WAIT_PAGE_JOBS and len(framing.encode(first, framing.MAX_REPLY)) < 2 << 20
    replies = 1
    while left:
        asked, left = left[:protocol.WAIT_PAGE_JOBS], left[protocol.WAIT_PAGE_JOBS:]
        reply = wait_once(srv, asked)
        assert reply["ok"] and len(framing.encode(reply, framing.MAX_REPLY)) < (1 << 20) + 8192
        entries, again = waitpages.take(asked, reply["result"]["jobs"])
        assert entries
        got += entries
        left[:0] = again
        replies += 1
    assert [j["id"] for j in got] == list(range(n, 0, -1))   # in the order named, each job once
    assert replies > n * 4000 // (1 << 20)


def test_a_wait_without_pages_gets_the_whole_answer_when_it_fits_one():
    srv = finished(protocol.WAIT_PAGE_JOBS)
    reply = wait_once(srv, range(1, protocol.WAIT_PAGE_JOBS + 1), paged=False)
    assert reply["ok"] and len(reply["result"]["jobs"]) == protocol.WAIT_PAGE_JOBS
    assert "more" not in reply["result"]   # as an older dispatch knows it


def test_a_wait_without_pages_naming_more_than_a_page_is_refused_at_once():
    srv = server(protocol.WAIT_PAGE_JOBS + 1)   # none has ended: refused before any waiting
    reply = wait_once(srv, range(1, protocol.WAIT_PAGE_JOBS + 2), paged=False)
    assert not reply["ok"] and "asks for it in pages" in reply["error"]


def test_a_wait_without_pages_whose_answer_is_too_big_is_refused():
    srv = finished(500, output="/" + "o" * 3999)
    reply = wait_once(srv, range(1, 501), paged=False)
    assert not reply["ok"] and "older than hpc-batchd" in reply["error"]


def forgetful(n, forgotten):
    """A server whose engine no longer holds *forgotten*, and whose history cannot answer for it."""
    from hpc_batch.daemon.refusal import Refused
    srv = finished(n)
    eng = srv.engine
    held = eng.lookup
    asked = []

    def lookup(caller, ref):
        if ref == forgotten:
            raise Refused(f"no job {ref}", "not_found")
        return held(caller, ref)

    def ask_archive(conn, query):
        asked.append(query)
        srv.streams.archived_wait(conn, protocol.error(f"job {forgotten} was forgotten", "not_found"))
        return None
    eng.lookup = lookup
    eng.archive_query = lambda caller, kind, ref, now, refs=(): refs
    srv.streams.ask_archive = ask_archive
    return srv, asked


def test_a_pages_rest_says_unknown_of_a_job_forgotten_since_rather_than_refuse_the_page():
    srv, asked = forgetful(3, 2)
    reply = wait_once(srv, [3, 2, 1], rest=True)
    assert asked == [(2,)]   # the history was asked first
    assert reply["ok"] and [(j["id"], j["state"]) for j in reply["result"]["jobs"]] == \
        [(3, FINISHED), (2, "unknown"), (1, FINISHED)]


def test_a_first_wait_naming_a_job_nobody_knows_is_still_refused():
    srv, _ = forgetful(3, 2)
    reply = wait_once(srv, [3, 2, 1])
    assert not reply["ok"] and reply["code"] == "not_found"


def test_a_rest_holds_job_numbers_only():
    srv = finished(1)
    reply = wait_once(srv, ["j1"], rest=True)
    assert not reply["ok"] and reply["code"] == "bad_request"


def _forgotten_while_waited(archive_answers):
    """A wait on jobs 1-4, all running; each ends, then 2 and 3 are let go (``--keep-finished``)
    before the last end answers it. The archive answers with *archive_answers(query)*: a reply,
    or a str (busy: the question not taken). Returns the reply and the questions asked."""
    srv = server(4)
    conn, peer = connect(srv)
    asked = []

    def ask_archive(c, query):
        asked.append(query)
        answer = archive_answers(query)
        if isinstance(answer, str):
            return answer
        srv.streams.archived_wait(c, answer)
        return None
    srv.engine.archive_query = lambda caller, kind, ref, now, refs=(): refs
    srv.streams.ask_archive = ask_archive
    srv.streams.wait(conn, protocol.WaitJobs(ids=(1, 2, 3, 4), paged=True), 0.0)
    for i in (1, 2, 3):
        srv.engine.jobs[i].state = FINISHED
        srv.job_event(i, "finished")
    del srv.engine.jobs[2], srv.engine.jobs[3]   # archived, then forgotten
    srv.engine.jobs[4].state = FINISHED
    srv.job_event(4, "finished")
    return read_reply(srv, conn, peer), asked


def test_jobs_let_go_while_waited_for_are_answered_from_the_archive():
    def archive(refs):
        return protocol.ok(jobs=[{"id": r, "state": FINISHED, "exit": str(r), "wait_status": r} for r in refs])
    reply, asked = _forgotten_while_waited(archive)
    assert asked == [(2, 3)]   # the forgotten ones only, once
    jobs = reply["result"]["jobs"]
    assert [(j["id"], j["state"]) for j in jobs] == [(1, FINISHED), (2, FINISHED), (3, FINISHED), (4, FINISHED)]
    assert [j["wait_status"] for j in jobs[1:3]] == [2, 3] and reply["result"]["more"] is None


@pytest.mark.parametrize("archive", [lambda refs: "the history archive is busy answering others",
                                     lambda refs: protocol.error("job 2 was forgotten after 30 days", "not_found")])
def test_jobs_let_go_while_waited_for_that_the_archive_cannot_answer_for_are_unknown(archive):
    reply, asked = _forgotten_while_waited(archive)
    assert asked == [(2, 3)]
    assert reply["ok"] and [(j["id"], j["state"]) for j in reply["result"]["jobs"]] == \
        [(1, FINISHED), (2, "unknown"), (3, "unknown"), (4, FINISHED)]


def test_an_attach_behind_on_output_ends_as_its_job_did_even_once_the_job_is_let_go(tmp_path):
    from hpc_batch.core.jobs import Result
    from hpc_batch.daemon.streams import CHUNK, AttachState, StreamState
    srv = server(1)
    conn, peer = connect(srv)
    buffer = tmp_path / "output"
    buffer.write_bytes(b"x" * (CHUNK * 8))   # more than one pump sends: the client falls behind
    fd = os.open(buffer, os.O_RDONLY)   # the stream's: it closes it once the end is sent
    attach = AttachState(job=1, fd=fd, offset=0)
    try:
        srv.streams.states[conn] = StreamState(attach=attach)
        srv.streams.attached[1] = {conn}
        job = srv.engine.jobs[1]
        job.state, job.result = FINISHED, Result("exited", code=5)
        srv.job_event(1, "finished")
        assert not attach.done                             # output still to send
        del srv.engine.jobs[1]                             # let go (--keep-finished) meanwhile
        dec = framing.Decoder(framing.MAX_REPLY)
        peer.settimeout(5)
        events = []
        while not events or events[-1]["event"] != "end":
            srv._flush(conn)
            srv.streams.pump(conn)
            dec.feed(peer.recv(1 << 20))
            while (msg := dec.next()) is not None:
                events.append(msg)
    finally:
        if not attach.done:
            os.close(fd)
    assert sum(len(e["data"]) for e in events if e["event"] == "output") == CHUNK * 8
    end = events[-1]
    assert (end["state"], end["exit"], end["wait_status"]) == (FINISHED, "5", 5), end

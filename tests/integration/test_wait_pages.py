"""dispatch wait on more jobs than one reply carries: the answer comes in pages, and adds up to what
one reply would have said (the same lines, the same JSON, the same exit status)."""

import json
import socket
import subprocess

import pytest
from conftest import DISPATCH, USERS, wait_for

from hpc_batch.client.cli import _end_line
from hpc_batch.wire import framing, protocol

pytestmark = pytest.mark.timeout(240)

N = protocol.WAIT_PAGE_JOBS + 500


def _wait_on_a_bulk(daemon):
    """alice's exit-3 job, then a bulk of N held behind a gate, all named in one ``wait --json``
    (the first job twice); the gate is killed, so the bulk ends at once without running.
    Returns what was named, the ids, the answer and the exit status."""
    alice = USERS["alice"]
    three = daemon.submit("sh", "-c", "exit 3", flags=("--no-output",), user=alice)
    daemon.wait_finished(three, user=alice)
    gate = daemon.submit("sleep", "300", flags=("--no-output",), user=alice)
    r = json.loads(daemon.ok("new", "--json", "--array", f"1-{N}", "--after-ok", str(gate), "--no-output",
                             "--", "true", user=alice))
    bulk = list(range(r["id"], r["last"] + 1))
    assert len(bulk) == N
    named = [str(three), f"{bulk[0]}-{bulk[-1]}", str(three)]
    waiting = subprocess.Popen(["runuser", "-u", alice, "--", "env", f"HPC_BATCH_SOCKET={daemon.socket}",
                                DISPATCH, "wait", "--json", *named],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: daemon.jobs(user=alice)[gate]["state"] == "running", what="the gate to run")
    daemon.ok("kill", str(gate), user=alice)
    out, err = waiting.communicate(timeout=180)
    assert err == "", err
    answer = json.loads(out)
    assert [j["id"] for j in answer["jobs"]] == [three, *bulk], "each job once, in the order named"
    assert answer["exit"] == next(j["wait_status"] for j in answer["jobs"] if j["wait_status"]) == waiting.returncode
    return named, three, bulk, answer


def test_a_wait_on_more_jobs_than_a_page_gets_every_end_once_in_order(daemon_factory, users, scratch):
    daemon = daemon_factory("--max-queued-per-user", str(2 * N), "--keep-finished", str(2 * N))
    named, three, bulk, answer = _wait_on_a_bulk(daemon)
    assert answer["jobs"][0]["wait_status"] == 3 and answer["exit"] == 3
    assert all(j["state"] == "finished" and j["wait_status"] != 0 for j in answer["jobs"][1:])
    # Text: one line a job, as a single reply would have printed them.
    text = daemon.dispatch("wait", *named, user=USERS["alice"])
    assert text.returncode == 3
    assert text.stdout.splitlines() == [_end_line(j) for j in answer["jobs"]]


def test_the_later_pages_of_jobs_the_daemon_has_let_go_come_from_the_history(daemon_factory, users, scratch):
    # --keep-finished 50 (the default): by the time all have ended the daemon holds few of them,
    # and the pages after the first ask for the rest by id, which the history answers.
    daemon = daemon_factory("--max-queued-per-user", str(2 * N))
    _, _, bulk, answer = _wait_on_a_bulk(daemon)
    later = answer["jobs"][protocol.WAIT_PAGE_JOBS:]
    assert later and all(j["state"] == "finished" and j["result"] for j in later), later[:3]


def test_a_dispatch_older_than_pages_is_told_why_rather_than_sent_a_giant_reply(daemon, users):
    ids = list(range(1, protocol.WAIT_PAGE_JOBS + 2))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(daemon.socket)
        s.sendall(framing.encode(protocol.request("wait", ids=ids)))   # no "paged": as before paging
        dec = framing.Decoder(framing.MAX_REPLY)
        s.settimeout(30)
        while (reply := dec.next()) is None:
            data = s.recv(1 << 16)
            assert data, "the daemon closed without an answer"
            dec.feed(data)
    assert not reply["ok"] and "use a dispatch of the same version" in reply["error"], reply

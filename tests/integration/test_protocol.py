"""Bad bytes on the socket get an error (or a closed connection); the daemon keeps serving."""

import json
import socket
import struct

import pytest

from hpc_batch.wire import framing, protocol

pytestmark = pytest.mark.timeout(60)


def _conn(d):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(d.socket)
    return s


def _reply(s):
    dec = framing.Decoder()
    while True:
        msg = dec.next()
        if msg is not None:
            return msg
        data = s.recv(65536)
        if not data:
            return None
        dec.feed(data)


def _frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("payload,needle", [
    (struct.pack(">I", 5) + b"nope!", "corrupt"),
    (struct.pack(">I", 2) + b"[]", "not a JSON object"),
    (struct.pack(">I", framing.MAX_FRAME + 1), "exceeds"),
    (_frame({"v": 1, "op": "launch-missiles", "args": {}}), "unknown command"),
    (_frame({"v": 99, "op": "list", "args": {}}), "version"),
    (_frame({"v": 1, "op": "new", "args": {"argv": "sh", "cwd": "/"}}), "wrong type"),
    (_frame({"v": 1, "op": "kill", "args": {"id": True}}), "wrong type"),
    (_frame({"v": 1, "op": "new", "args": {"argv": ["x"], "cwd": "relative"}}), "absolute"),
])
def test_bad_requests_get_error_replies(daemon, payload, needle):
    s = _conn(daemon)
    s.sendall(payload)
    reply = _reply(s)
    assert reply is not None and reply["ok"] is False and needle in reply["error"], reply
    s.close()
    assert daemon.ok("list") == ""


def test_truncated_frame_and_silent_clients_do_not_block_others(daemon):
    stuck = _conn(daemon)
    stuck.sendall(struct.pack(">I", 100) + b"{\"v\":")   # never completed
    idle = _conn(daemon)                                  # never sends anything
    job = daemon.submit("true")                           # others are still served
    daemon.wait_finished(job)
    stuck.close()                                         # EOF mid-frame
    idle.close()
    assert daemon.proc.poll() is None
    assert job in daemon.rows("--finished")


def test_client_that_never_reads_is_not_served_forever(daemon):
    s = _conn(daemon)
    req = framing.encode(protocol.request("list", all=False, finished=True))
    s.sendall(req * 200)   # many requests, never reading replies
    assert daemon.ok("list") == ""
    s.close()


def test_identity_comes_from_the_socket_not_the_message(daemon, users):
    s = _conn(daemon)
    # A "uid" field in the message is ignored (unknown fields are not identity).
    s.sendall(_frame({"v": 1, "op": "ping", "args": {}, "uid": 12345}))
    assert _reply(s)["ok"] is True
    s.close()


def test_list_answers_in_pages_and_an_old_client_still_gets_a_short_list(daemon):
    hold = daemon.submit("sleep", "60", flags=("--name", "hold"))
    out = daemon.ok("new", "--after", "hold", "--array", "1-7", "--", "true")
    first = int(out.split()[1].split("-")[0])
    s = _conn(daemon)
    ids, cursor, pages = [], 0, 0
    while cursor is not None:
        s.sendall(framing.encode(protocol.request("list", all=True, finished=False, after=cursor, limit=3)))
        reply = _reply(s)
        assert reply["ok"], reply
        ids += [j["id"] for j in reply["result"]["jobs"]]
        assert len(reply["result"]["jobs"]) <= 3
        cursor, pages = reply["result"]["more"], pages + 1
    assert ids == [hold, *range(first, first + 7)] and pages == 3
    s.sendall(framing.encode(protocol.request("list", all=True, finished=False)))   # no cursor: one reply
    reply = _reply(s)
    assert "more" not in reply["result"] and len(reply["result"]["jobs"]) == 8
    s.close()
    assert len(daemon.rows("--all")) == 8     # dispatch pages through it as before

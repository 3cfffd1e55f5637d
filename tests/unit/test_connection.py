"""The client's connection: a request's meanwhile runs once the request is sent, before its reply is read."""

import socket
import threading

import pytest

from hpc_batch.client.connection import Connection
from hpc_batch.wire import framing, messages

pytestmark = pytest.mark.timeout(60)


def test_a_calls_meanwhile_runs_after_the_request_is_sent_and_before_its_reply_is_read(tmp_path):
    path = str(tmp_path / "d.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    server.settimeout(30)
    got, go = threading.Event(), threading.Event()
    asked = []

    def answer():   # a stand-in daemon that answers only once the client's meanwhile said so
        conn, _ = server.accept()
        with conn:
            decoder = framing.Decoder()
            while (msg := decoder.next()) is None:
                decoder.feed(conn.recv(1 << 16))
            asked.append(msg["op"])
            got.set()
            if go.wait(30):
                conn.sendall(framing.encode(messages.ok(id=7)))

    daemon = threading.Thread(target=answer, daemon=True)
    daemon.start()
    seen = []

    def meanwhile():
        seen.append(got.wait(30))   # the daemon has the request already
        go.set()
    try:
        reply = Connection(path).call("new", meanwhile=meanwhile, argv=["true"])
    finally:
        go.set()
        daemon.join(30)
        server.close()
    assert seen == [True] and asked == ["new"]
    assert reply["ok"] and reply["result"]["id"] == 7

"""client/joblog.py: what dispatch log and attach say on stderr, and the delivered log read as the user."""

import io
import os
import threading

import pytest

from hpc_batch.client import joblog

END = {"id": 7, "state": "finished", "exit": "0", "wait_status": 0, "note": None,
       "output": "/home/a/output.7.log", "output_error": None}


@pytest.mark.parametrize("end,said", [
    (END, "its output is in /home/a/output.7.log"),
    (dict(END, output_error="no space left; the output is kept at /var/lib/x"),
     "its output was not delivered: no space left; the output is kept at /var/lib/x"),
    (dict(END, output=None), "its output was discarded (--no-output)"),
    (dict(END, exit="cancelled"), "it never ran, so it has no output"),
])
def test_where_output_is(end, said):
    assert joblog.where_output(end) == said


def test_page_notes():
    running = {"id": 7, "state": "running", "size": 10, "buffer_max": 100, "output": "/o.log", "end": None}
    assert joblog.page_note(running) is None
    full = dict(running, size=100)
    assert joblog.page_note(full) == ("job 7: the daemon keeps only the first 100 bytes of its output; "
                                      "the rest goes straight to /o.log")
    assert joblog.page_note(dict(full, output=None)).endswith("the rest is discarded (--no-output)")
    assert joblog.page_note(dict(running, state="queued")) == \
        "job 7 is queued: it has no output yet (dispatch log -f 7 waits for it)"
    assert joblog.page_note(dict(running, state="finished", end=END)) == \
        "job 7 finished: exit 0; its output is in /home/a/output.7.log"


def test_print_delivered_copies_from_the_offset(tmp_path):
    log = tmp_path / "output.7.log"
    log.write_bytes(b"0123456789" * 10_000)
    out = io.BytesIO()
    assert joblog.print_delivered(str(log), 5, out) == 100_000 - 5
    assert out.getvalue() == (b"0123456789" * 10_000)[5:]
    assert joblog.print_delivered(str(log), 200_000, io.BytesIO()) == 0


def test_print_delivered_follows_no_link_and_never_blocks_on_a_fifo(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    link = tmp_path / "output.7.log"
    link.symlink_to(secret)
    out = io.BytesIO()
    assert joblog.print_delivered(str(link), 0, out) == 0 and out.getvalue() == b""
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    got: list = []
    t = threading.Thread(target=lambda: got.append(joblog.print_delivered(str(fifo), 0, io.BytesIO())), daemon=True)
    t.start()
    t.join(timeout=10)
    assert got == [0]
    assert joblog.print_delivered(str(tmp_path / "absent"), 0, io.BytesIO()) == 0


def test_print_delivered_reads_only_the_callers_own_file(tmp_path, monkeypatch):
    log = tmp_path / "output.7.log"
    log.write_text("alice's\n")
    monkeypatch.setattr(joblog.os, "geteuid", lambda: log.stat().st_uid + 1)   # an admin, say
    out = io.BytesIO()
    assert joblog.print_delivered(str(log), 0, out) == 0 and out.getvalue() == b""

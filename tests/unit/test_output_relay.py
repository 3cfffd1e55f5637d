"""The relay past --max-output-buffer (shepherd/output.py), run in-process on real pipes and files.

The relay writes the pipe's part of the log after the buffer's place and copies
the buffer into that place as time allows: whatever the pace of the job, the
log ends up as the buffer followed by the rest, byte for byte; a log that
cannot be written still has the pipe drained; "finish" takes what is there.
"""

import errno
import os
import threading
import time

import pytest

from shepherd import output


def _buffer(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "buffer"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY), data


def _log(tmp_path, base):
    fd = os.open(tmp_path / "job.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.lseek(fd, base, os.SEEK_SET)
    return fd


def _writer(w, pieces, pause=0.0):
    """Write *pieces* into the pipe's write end *w* from a thread, then close it; returns (thread, bytes)."""
    def run():
        try:
            for piece in pieces:
                view = memoryview(piece)
                while view:
                    view = view[os.write(w, view):]
                if pause:
                    time.sleep(pause)
        finally:
            os.close(w)
    t = threading.Thread(target=run)
    t.start()
    return t, b"".join(pieces)


def _relay(pipe_r, log, filler, finish=False, mover=None):
    report_r, report_w = os.pipe()
    state = {"relaying": False, "finish": finish}
    ok = output._relay(pipe_r, log, filler, state, report_w, "/somewhere/job.log", mover)
    os.close(report_w)
    said = os.read(report_r, 4096).decode()
    os.close(report_r)
    return ok, said


@pytest.mark.parametrize("pieces,pause", [
    ([os.urandom(3 << 20)] * 4, 0.0),                         # a stream, faster than the pipe
    ([b"line %d\n" % i for i in range(300)], 0.001),          # a trickle: batched, the buffer copied meanwhile
])
def test_the_log_is_the_buffer_then_the_rest(tmp_path, pieces, pause):
    buf, head = _buffer(tmp_path, (2 << 20) + 12345)
    log = _log(tmp_path, len(head))
    r, w = output.make_pipe()
    t, rest = _writer(w, pieces, pause)
    ok, said = _relay(r, log, output.Filler(buf, log, len(head)))
    t.join()
    assert (ok, said) == (True, "")
    assert (tmp_path / "job.log").read_bytes() == head + rest


def test_the_buffer_is_copied_while_the_job_writes_nothing(tmp_path):
    buf, head = _buffer(tmp_path, 3 << 20)
    log = _log(tmp_path, len(head))
    r, w = output.make_pipe()
    gate = threading.Event()
    done = threading.Event()

    def job():
        os.write(w, b"first\n")
        gate.wait(30)
        os.write(w, b"last\n")
        os.close(w)

    def relay():
        _relay(r, log, output.Filler(buf, log, len(head)))
        done.set()
    threads = [threading.Thread(target=job), threading.Thread(target=relay)]
    for t in threads:
        t.start()
    path = tmp_path / "job.log"
    deadline = time.monotonic() + 30
    while path.read_bytes()[:len(head)] != head:   # the job is still running: the copy did not wait for its end
        assert time.monotonic() < deadline, "the buffer was not copied while the job was quiet"
        assert not done.is_set()
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join()
    assert path.read_bytes() == head + b"first\nlast\n"


def test_finish_takes_what_is_there_and_the_buffer(tmp_path):
    buf, head = _buffer(tmp_path, 100000)
    log = _log(tmp_path, len(head))
    r, w = output.make_pipe()
    os.write(w, b"written before the end\n")   # w stays open: a straggler holds the pipe
    ok, _ = _relay(r, log, output.Filler(buf, log, len(head)), finish=True)
    os.close(w)
    assert ok
    assert (tmp_path / "job.log").read_bytes() == head + b"written before the end\n"


def test_a_log_that_fails_is_reported_and_the_pipe_still_drained(tmp_path):
    buf, head = _buffer(tmp_path, 4096)
    path = tmp_path / "job.log"
    path.write_bytes(b"")
    log = os.open(path, os.O_RDONLY)   # every write to it fails (EBADF)
    r, w = output.make_pipe()
    t, _ = _writer(w, [b"x" * (1 << 20)] * 8)   # more than the pipe holds: it must be read to end
    ok, said = _relay(r, log, output.Filler(buf, log, len(head)))
    t.join()
    assert not ok and "cannot write /somewhere/job.log" in said


def _full():
    """A descriptor every write to fails as a full disk does (ENOSPC): /dev/full."""
    return os.open("/dev/full", os.O_WRONLY)


def test_bytes_a_failed_write_read_go_first_to_the_next_destination(tmp_path):
    r, w = output.make_pipe()
    os.set_blocking(r, False)
    os.write(w, b"a" * 5000 + b"b" * 5000)
    mover, full = output.Mover(), _full()
    with pytest.raises(OSError) as exc:
        mover.move(r, full, 6000)          # read from the pipe, then the write fails
    os.close(full)
    assert exc.value.errno == errno.ENOSPC
    os.write(w, b"c" * 10)
    os.close(w)
    path = tmp_path / "after"
    dst = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    assert mover.drain(r, dst) == (10010, True)
    assert path.read_bytes() == b"a" * 5000 + b"b" * 5000 + b"c" * 10


def test_the_relay_writes_what_the_buffer_could_not_take_before_the_pipe(tmp_path):
    buf, head = _buffer(tmp_path, 70000)
    log = _log(tmp_path, len(head))
    r, w = output.make_pipe()
    os.set_blocking(r, False)
    os.write(w, b"held " * 100)
    mover, full = output.Mover(), _full()
    with pytest.raises(OSError):
        mover.move(r, full)                # the buffer's disk is full: the relay takes over
    os.close(full)
    t, rest = _writer(w, [b"rest of the pipe\n"] * 1000)
    ok, said = _relay(r, log, output.Filler(buf, log, len(head)), mover=mover)
    t.join()
    assert (ok, said) == (True, "")
    assert (tmp_path / "job.log").read_bytes() == head + b"held " * 100 + rest


def test_a_full_pipe_is_read_many_pages_at_a_time():
    r, w = output.make_pipe()
    os.set_blocking(r, False)
    for _ in range(64):                     # what a job writing 4 KiB at a time leaves
        os.write(w, b"x" * 4096)
    with open(os.devnull, "wb") as null:
        assert output.Mover().move(r, null.fileno()) == min(output.READ, 64 * 4096)
    os.close(w)
    os.close(r)


def test_the_buffer_copy_falls_back_to_read_and_write_in_place(tmp_path, monkeypatch):
    def no_sendfile(*args):
        raise OSError(errno.EINVAL, "not here")
    monkeypatch.setattr(os, "sendfile", no_sendfile)
    buf, head = _buffer(tmp_path, (1 << 20) + 7)
    log = _log(tmp_path, len(head))
    os.write(log, b"ta")
    filler = output.Filler(buf, log, len(head))
    filler.step()                                   # a chunk, and the log's position is where it was
    os.write(log, b"il")
    filler.finish()
    assert not filler.pending()
    assert (tmp_path / "job.log").read_bytes() == head + b"tail"


def test_the_pacer_batches_a_trickle_and_not_a_stream():
    hold = output.HOLD_OFF
    pacer = output.Pacer(0.0)
    assert pacer.hold(100, 0.001)                     # little, and no rate known yet: wait
    now = 0.001
    for _ in range(3):                                # a pipe refilled within each hold-off
        now += hold
        pacer.hold(output.CHUNK, now)
    assert not pacer.hold(100, now + hold / 10)       # a stream: a small read does not make it wait
    later = now + 10 * hold
    assert pacer.hold(100, later)                     # it went quiet: batch again
    assert not pacer.hold(output.TRICKLE, later)      # a read of a full batch never waits

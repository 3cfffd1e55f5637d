"""The new image's side of a reload's hand-off, against a real forked child standing in for the old image."""

import os
import signal
import socket
import time

import pytest

from hpc_batch.daemon import handoff

pytestmark = pytest.mark.timeout(30)


def _old_image(behave):
    """Fork a child that runs *behave(sock)* on its end of the pair; (our end's fd, its pid)."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        try:
            behave(theirs)
        finally:
            os._exit(0)
    theirs.close()
    return ours.detach(), pid


def _reaped(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_old_image_lets_go_when_asked_and_its_tally_comes_back():
    def lets_go(sock):
        assert sock.recv(1)
        sock.sendall(b"jobs_started 7\n")

    fd, pid = _old_image(lets_go)
    assert handoff.take_over(fd, pid) == "jobs_started 7\n"
    assert _reaped(pid)


def test_an_old_image_that_holds_on_is_killed_past_the_limit():
    def holds_on(sock):
        signal.pause()   # never lets go: only the kill past the limit ends it

    fd, pid = _old_image(holds_on)
    began = time.monotonic()
    assert handoff.take_over(fd, pid, limit=0.5) == ""
    assert time.monotonic() - began < 20
    assert _reaped(pid)


def test_an_old_image_already_gone_is_no_wait():
    fd, pid = _old_image(lambda sock: None)
    assert handoff.take_over(fd, pid) == ""
    assert _reaped(pid)


def _venv(root, with_handoff):
    """A venv's layout: bin/hpc-batchd, and the hand-off's module in its site-packages or not."""
    os.makedirs(os.path.join(root, "bin"))
    open(os.path.join(root, "bin", "hpc-batchd"), "w").close()
    module = os.path.join(root, "lib", "python3.11", "site-packages", "hpc_batch", "daemon", "handoff.py")
    os.makedirs(os.path.dirname(module))
    if with_handoff:
        open(module, "w").close()
    return module


def test_the_hand_off_is_offered_only_to_an_image_that_knows_it(tmp_path):
    old = str(tmp_path / "old")
    module = _venv(old, True)
    assert handoff.understood_by(os.path.join(old, "bin", "hpc-batchd"), module, old)
    new = str(tmp_path / "new")
    _venv(new, True)
    os.symlink(new, str(tmp_path / "prefix"))   # hpc-batch-install's prefix, a symlink to the venv in use
    assert handoff.understood_by(str(tmp_path / "prefix" / "bin" / "hpc-batchd"), module, old)
    before = str(tmp_path / "before")   # a downgrade to a version from before the hand-off
    _venv(before, False)
    assert not handoff.understood_by(os.path.join(before, "bin", "hpc-batchd"), module, old)
    # Run from a source tree (not under the interpreter's prefix): never offered.
    assert not handoff.understood_by(os.path.join(old, "bin", "hpc-batchd"), module, new)

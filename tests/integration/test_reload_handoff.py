"""A reload's hand-off (hpc_batch/daemon/handoff.py): the old image answers while the new one starts.

The new image is held stopped (SIGSTOP on the daemon's pid, right after the
fork) so that the order is forced rather than raced: whatever is answered
then can only have been answered by the old image, and must be in the new one.
"""

import os
import signal

import pytest
from conftest import descendants, exit_of, wait_for

pytestmark = pytest.mark.timeout(120)


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def _old_image(daemon):
    """The daemon's forked child during a reload: a process with the daemon's own command line."""
    own = _cmdline(daemon.proc.pid)
    for pid in descendants(daemon.proc.pid):
        if _cmdline(pid) == own:
            return pid
    return None


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _hold_new_image(daemon):
    """SIGHUP, then stop the re-executing pid once the old image has forked; the old image's pid."""
    daemon.proc.send_signal(signal.SIGHUP)
    child = wait_for(lambda: _old_image(daemon), what="the old image forked by the reload")
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    return child


def test_the_old_image_answers_while_the_new_one_starts(daemon):
    running = daemon.submit("sleep", "600")
    daemon.wait_running(running)
    child = _hold_new_image(daemon)
    try:
        # The new image cannot answer (it is stopped), so these are the old one's answers.
        meanwhile = daemon.submit("sh", "-c", "exit 6")
        assert meanwhile == running + 1
        assert "queued" in daemon.rows()[meanwhile]
        daemon.dispatch("kill", str(running))
        assert exit_of(daemon.wait_finished(meanwhile)) == "6"
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    wait_for(lambda: daemon.log().count("ready on") >= 2, what="the new image's ready line")
    wait_for(lambda: not _alive(child), what="the old image's exit")
    assert daemon.proc.poll() is None and _old_image(daemon) is None
    # What the old image did is the new one's: no job lost, none duplicated, the ids go on.
    rows = daemon.rows("--finished")
    assert exit_of(rows[meanwhile]) == "6"
    assert " finished " in rows[running] and exit_of(rows[running]) != "0"
    assert daemon.submit("true") == meanwhile + 1


def test_a_new_image_that_dies_stops_the_old_one_with_its_state_committed(daemon_factory, scratch):
    daemon = daemon_factory()
    _hold_new_image(daemon)
    child = _old_image(daemon)
    started = daemon.submit("sleep", "600")   # answered, and started, by the old image alone
    daemon.wait_running(started)
    daemon.kill9()   # the new image, stopped mid-start: its end of the pair closes
    wait_for(lambda: not _alive(child), what="the old image's exit once the new one is gone")
    again = daemon_factory()
    rows = again.rows("--finished")
    assert started in rows and "finished" not in rows[started], rows
    again.dispatch("kill", str(started))
    assert exit_of(again.wait_finished(started)) != "0"


def test_a_start_waits_for_an_old_image_still_committing(daemon_factory):
    daemon = daemon_factory()
    child = _hold_new_image(daemon)
    started = daemon.submit("sleep", "600")
    daemon.wait_running(started)
    os.kill(child, signal.SIGSTOP)   # the old image, slow to let go: it still holds the state's lock
    daemon.kill9()
    again = daemon_factory(start=False)
    again.start(wait=False)
    try:
        wait_for(lambda: "waiting up to" in again.log(), what="the start waiting for the state's lock")
    finally:
        os.kill(child, signal.SIGCONT)   # it sees the new image gone, commits and exits
    wait_for(lambda: again.proc.poll() is not None or again.log().count("ready on") >= 2, timeout=30,
             what="the second daemon's start")
    assert again.proc.poll() is None, again.log()
    assert not _alive(child)
    rows = again.rows("--finished")
    assert started in rows and "finished" not in rows[started], rows

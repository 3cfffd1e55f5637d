"""A reload or a stop asked while the daemon starts is taken once it can be, never fatal.

The socket answers before the daemon's loop has its signal handlers (a client
may connect, and a test's "is it up" is a connect), so a SIGHUP there used to
end the daemon by the default action. The daemon now holds those signals
blocked until its handlers are in place. To send one at a known moment, the
daemon is started through a wrapper that blocks the signal, sends it to itself
and execs the daemon: the signal is pending from the daemon's first
instruction, as one sent during its start would be.
"""

import os
import signal
import sys

import pytest
from conftest import exit_of, wait_for

pytestmark = pytest.mark.timeout(120)

_PENDING = ("import os, signal, sys\n"
            "sig = getattr(signal, sys.argv[1])\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, [sig])\n"
            "os.kill(os.getpid(), sig)\n"
            "os.execv(sys.argv[2], sys.argv[2:])\n")


def _with_pending(name):
    return [sys.executable, "-I", "-c", _PENDING, name]


def _blocked(pid):
    """The signals *pid* has blocked (its SigBlk mask)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no SigBlk line for {pid}")


def _bit(sig):
    return 1 << (sig - 1)


def test_a_sighup_sent_during_the_start_reloads_once_it_is_up(daemon_factory):
    daemon = daemon_factory(wrap=_with_pending("SIGHUP"))
    wait_for(lambda: daemon.proc.poll() is not None or daemon.log().count("ready on") >= 2,
             timeout=30, what="the reload asked during the start")
    assert daemon.proc.poll() is None, daemon.log()
    assert daemon.log().count("reloading: re-executing") == 1, daemon.log()
    # Past its start the daemon takes these again, so a later reload and stop still work.
    assert _blocked(daemon.proc.pid) & (_bit(signal.SIGHUP) | _bit(signal.SIGTERM)) == 0
    job = daemon.submit("sh", "-c", "exit 4")
    assert exit_of(daemon.wait_finished(job)) == "4"


def test_a_sigterm_sent_during_the_start_stops_it_cleanly(daemon_factory):
    daemon = daemon_factory(wrap=_with_pending("SIGTERM"), start=False)
    daemon.start(wait=False)
    wait_for(lambda: daemon.proc.poll() is not None, timeout=30, what="the stop asked during the start")
    assert daemon.proc.returncode == 0, daemon.log()
    log = daemon.log()
    assert "ready on" in log and "stopped; running jobs continue" in log, log
    assert not os.path.exists(daemon.socket)

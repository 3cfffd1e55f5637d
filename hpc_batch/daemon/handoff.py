"""A reload's hand-off: the old image answers while the new one starts.

A reload re-execs the same pid (the README's promise: jobs stay its children),
and the new image spends most of 100 ms in Python's start and its imports
before it can answer anyone. So a reload forks first. The child carries on as
the daemon, with the same state, socket and fork server; the parent, the pid
systemd knows, execs at once. Once the new image has imported and parsed its
flags, it asks the child to let go (:func:`take_over`); the child drops its
clients, commits its last turn, sends its metrics tally and exits
(:meth:`Child.serve_until_released`). Only then does the new image read the state.
Clients wait for that hand-over alone, not for the interpreter.

The pair of sockets between them is the whole protocol: the new image writes
one byte (let go), the child answers with its tally and closes. An end that
dies closes its socket, so a new image that fails to start stops the child
too (the state it commits is then what the next start loads), and a child
that dies leaves the state as its last committed turn, as a ``kill -9`` does.
"""

import logging
import os
import select
import signal
import socket
import sys
import time
from typing import NoReturn

log = logging.getLogger("hpc-batchd")

RELEASE_LIMIT = 30.0   # seconds the new image waits for the old one's last turn before killing it
_GO = b"g"


class Parent:
    """The side that execs (the daemon's pid): its end of the pair, and the child's pid."""

    def __init__(self, sock: socket.socket, child: int):
        self.sock = sock
        self.child = child

    def inherit(self) -> str:
        """Make our end survive the exec; the fds' part of the new image's environment variable."""
        self.sock.set_inheritable(True)
        return f"handoff:{self.sock.fileno()},child:{self.child}"

    def take_over(self) -> str:
        """Have the child let go now, before the exec (for an image that would not ask): its tally."""
        return take_over(self.sock.detach(), self.child)


def understood_by(exe: str, module: str = __file__, prefix: str = sys.prefix) -> bool:
    """Whether the image that *exe* starts knows the hand-off.

    One from before it would never ask the child to let go, and would load
    the state while the child still serves: so the hand-off is offered only
    where this module is, at the same place under the target's prefix (the
    venv that ``bin/`` of *exe* belongs to, its symlinks resolved).
    """
    here = os.path.relpath(os.path.realpath(module), os.path.realpath(prefix))
    if here.startswith(os.pardir):
        return False   # not an installed copy (*module* outside *prefix*): nothing to compare with
    target = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(exe))))
    return os.path.isfile(os.path.join(target, here))


class Child:
    """The side that serves on, the old image, until the new one asks for the state."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def serve_until_released(self, server, finish) -> NoReturn:
        """Serve until the new image asks for the state (or dies), then hand it over and exit.

        *finish* commits the last turn; the tally (``server.metrics``) is sent
        after it, and the exit closes the pair: the new image's sign that the
        state is final.
        """
        code = 0
        try:
            server.stop_reason = None
            server.watch_release(self.sock.fileno())
            server.run()
            server.close_clients()
            finish()
            tally = server.metrics.tally.to_text() if server.metrics is not None else ""
            try:
                self.sock.sendall(tally.encode())
            except OSError:
                pass
        except BaseException:   # whatever it is, the new image must not wait on a child that goes on
            log.exception("the old image failed while handing over a reload")
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)


def fork() -> Parent | Child | None:
    """Fork for a reload: the :class:`Parent` or the :class:`Child` side, or None if no fork could be made.

    The caller has stopped its threads first: a lock one of them held at the
    fork would stay held in the child for ever.
    """
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        log.warning("reloading without a hand-off (%s): clients wait for the new image's start", exc)
        return None
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        log.warning("reloading without a hand-off (%s): clients wait for the new image's start", exc)
        return None
    if pid == 0:
        ours.close()
        return Child(theirs)
    theirs.close()
    return Parent(ours, pid)


def take_over(fd: int, child: int, limit: float = RELEASE_LIMIT) -> str:
    """In the new image: have the old image let go, wait until it has, and return its metrics tally.

    Past *limit* the old image is killed (through a pidfd: it is our own
    child, unreaped, so its pid cannot name another process) and the state is
    what it last committed.
    """
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    try:
        pidfd = os.pidfd_open(child)
    except OSError:
        pidfd = None    # not ours, or gone and reaped: nothing to wait for but the socket
    tally = bytearray()
    try:
        try:
            sock.sendall(_GO)
        except OSError:
            pass        # it has gone already
        until = time.monotonic() + limit
        while True:
            left = until - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                log.warning("the old image did not let go within %.0fs; killed", limit)
                _kill(pidfd)
                break
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            tally += chunk
        _reap(child, pidfd, until)
    finally:
        sock.close()
        if pidfd is not None:
            os.close(pidfd)
    return tally.decode(errors="replace")


def _kill(pidfd: int | None) -> None:
    if pidfd is not None:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass


def _reap(child: int, pidfd: int | None, until: float) -> None:
    """Wait for the old image's exit (its socket closes a moment before), killing it past *until*."""
    if pidfd is None:
        return
    if not select.select([pidfd], [], [], max(0.0, until - time.monotonic()))[0]:
        _kill(pidfd)
        select.select([pidfd], [], [], 5.0)
    try:
        os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        pass

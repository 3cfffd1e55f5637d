"""The record's side tasks: work done in a child process, whose JSON the record waits for within a deadline.

Three kinds: the executable's hash, read as the user (``executable``), and
the GPUs' query at the job's start and again at its end (nvidia-smi,
``gpuquery``). :class:`SideTasks`, which the Recorder inherits, forks each
(``_spawn_side``), reads its pipe in the shepherd's poll loop
(:meth:`SideTasks.on_readable`), cuts it short at :data:`SIDE_LIMIT` unless
it is patient, and collects its result. A program a side task runs
(nvidia-smi) goes through :func:`run`. Standard library only.
"""

import os
import select
import signal
import time

from . import bounds

try:
    from shepherd.base import records, sigs, sysread
except ImportError:  # run as a file: the base is a top-level package
    from base import records, sigs, sysread  # type: ignore[no-redef]

# Not typing.TYPE_CHECKING: typing (and re) would be loaded into the fork server (see delivery.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

SIDE_LIMIT = 30.0            # seconds the side tasks (hash, GPU query) may take after the start
END_GPU_LIMIT = 5.0          # seconds the GPUs' end reading may take
REAP_WAIT = 0.5              # seconds the job's end waits for a finished side task's exit status
END_WAIT = 10.0              # seconds a job's end waits for side tasks still running (within SIDE_LIMIT)


def run(argv: list[str], timeout: float = SIDE_LIMIT / 3) -> tuple[int, str]:
    """In a side task's child: run *argv* (nvidia-smi) with a deadline; ``(status, output)``, -1 if it did not run.

    The output is stdout and stderr together; the status is the exit code, or
    minus the signal that ended it. Spawned with posix_spawn rather than the
    subprocess module, which (with threading, selectors and the rest it loads)
    would be loaded in the fork server for this alone: a megabyte more that
    every shepherd it forks maps.
    """
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            pid = os.posix_spawnp(argv[0], argv, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                                  file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                                (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
        finally:
            os.close(w)
    except OSError as exc:
        os.close(r)
        return -1, f"cannot run {argv[0]}: {sysread.error_text(exc)}"
    chunks, kept = [], 0
    give_up = time.monotonic() + timeout
    poller = select.poll()
    poller.register(r, select.POLLIN)
    try:
        while True:
            left = give_up - time.monotonic()
            if left <= 0 or not poller.poll(int(left * 1000) + 1):
                if time.monotonic() < give_up:
                    continue
                os.kill(pid, signal.SIGKILL)   # our unreaped child: its pid is still ours
                os.waitpid(pid, 0)
                return -1, f"{argv[0]} took longer than {int(timeout)}s"
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            if kept <= 4 * bounds.MAX_BYTES:   # (decoded and cut to MAX_BYTES characters below)
                chunks.append(chunk)
                kept += len(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")[:bounds.MAX_BYTES]


class _Side:
    """A child process whose stdout (JSON or text) the record waits for, within a deadline."""

    def __init__(self, name: str, pid: int, fd: int, patient: bool = False):
        self.name, self.pid, self.fd = name, pid, fd
        self.patient = patient   # idle and in the job's own allocation: it may take as long as the job
        self.chunks: list[bytes] = []
        self.done = False
        self.status: int | None = None

    def read(self) -> bool:
        """Take what the pipe holds; True once it reached EOF (the child is then reaped)."""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return False
            except OSError:
                chunk = b""
            if not chunk or sum(map(len, self.chunks)) > bounds.MAX_BYTES:
                self.finish()
                return True
            self.chunks.append(chunk)

    def finish(self, kill: bool = False) -> None:
        if self.done:
            return
        if kill:   # our unreaped child: its pid is still ours
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.close(self.fd)
        self.done = True
        self.reap(0.0)   # no waiting here: this runs in the shepherd's loop while the job runs

    def reap(self, within: float) -> None:
        """Collect the child's status once it has exited, waiting up to *within* seconds.

        The wait is a poll on the child's pidfd, so it ends the moment the child
        does (a child that closed its pipe is usually still exiting). A child
        stuck in the kernel (a hung filesystem) must not hold the shepherd: it
        is left (its pid stays ours, a zombie, until we exit).
        """
        if self.status is not None:
            return
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if not pid and within > 0:
            try:   # our unreaped child: its pid cannot have been reused
                pidfd = os.pidfd_open(self.pid)
            except OSError:
                pidfd = None
            if pidfd is not None:
                try:
                    poller = select.poll()
                    poller.register(pidfd, select.POLLIN)
                    poller.poll(int(within * 1000) + 1)
                finally:
                    os.close(pidfd)
                pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self.status = status

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")


class SideTasks:
    """The Recorder's side tasks: spawned, watched in the shepherd's poll loop, awaited, read back.

    A side task's failure to fork, or to finish in time, is named in the
    record's ``side_errors``; what it printed is read as JSON.
    """

    # The Recorder's (set in its __init__).
    fork: "Callable[[], int]"     # the shepherd's, which holds its stop signals back from the child
    record: dict
    sides: dict[str, _Side]
    side_deadline: float | None   # when those not patient are cut short (monotonic)

    def on_readable(self, fd: int) -> bool:
        """A side task's pipe is readable; True once that task is done (stop watching *fd*)."""
        for side in self.sides.values():
            if side.fd == fd and not side.done:
                return side.read()
        return True

    def deadline(self) -> float | None:
        """When the side tasks are cut short (monotonic), while any that may be runs."""
        return self.side_deadline if any(not s.done and not s.patient for s in self.sides.values()) else None

    def cut_short(self) -> list[int]:
        """The side tasks' time is up: kill the ones still running (not a patient one); their fds."""
        cut = [s for s in self.sides.values() if not s.done and not s.patient]
        for side in cut:
            side.finish(kill=True)
        return [side.fd for side in cut]

    def _spawn_side(self, name: str, fn, patient: bool = False) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = self.fork()
        except OSError as exc:
            os.close(r)
            os.close(w)
            self.record.setdefault("side_errors", {})[name] = f"cannot fork ({sysread.error_text(exc)})"
            return
        if pid == 0:
            code = 1
            try:
                sigs.set_wakeup_fd(-1)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
                    sigs.signal(sig, sigs.SIG_DFL)
                sigs.pthread_sigmask(sigs.SIG_SETMASK, ())
                os.dup2(w, 1)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 2)
                os.closerange(3, 1 << 16)
                try:
                    out = fn()
                except Exception as exc:
                    out = {"error": sysread.error_text(exc)}
                os.write(1, records.dumps(out).encode())
                code = 0
            except BaseException:
                pass
            os._exit(code)
        os.close(w)
        os.set_blocking(r, False)
        self.sides[name] = _Side(name, pid, r, patient)

    def _await_end(self) -> None:
        """At the job's end: wait for a patient side task up to END_WAIT, the others to their deadline."""
        patient = any(not s.done and s.patient for s in self.sides.values())
        self._await_sides(time.monotonic() + END_WAIT if patient
                          else min(self.side_deadline or 0.0, time.monotonic() + END_WAIT))

    def _await_sides(self, until: float) -> None:
        poller = select.poll()
        live = {s.fd: s for s in self.sides.values() if not s.done}
        for fd in live:
            poller.register(fd, select.POLLIN)
        while live:
            left = until - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(int(left * 1000) + 1):
                if live[fd].read():
                    poller.unregister(fd)
                    del live[fd]
        for side in live.values():
            side.finish(kill=True)
            side.chunks.append(b"")
            self.record.setdefault("side_errors", {})[side.name] = (
                f"not done {int(END_WAIT)}s after the job's end" if side.patient
                else f"took longer than {int(SIDE_LIMIT)}s")

    def _reaped(self, name: str):
        """The side task *name* (None if never spawned), its exit status collected once it is done."""
        side = self.sides.get(name)
        if side is not None and side.done:
            side.reap(REAP_WAIT)
        return side

    def _side_json(self, name: str) -> dict | None:
        side = self._reaped(name)
        if side is None or not side.done or side.status != 0:
            return None
        try:
            value = records.loads(side.text())
        except ValueError:
            return None
        return value if isinstance(value, dict) and "error" not in value else None

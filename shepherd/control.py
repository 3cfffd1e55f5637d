"""The job's control FIFO: how the daemon asks a shepherd to act, s6 style.

The daemon never signals a job's processes: only the shepherd, their
parent, can name them without a race. So the daemon writes one command a
line into ``<job dir>/control`` and the shepherd, which polls the FIFO's
read end, carries it out:

    stop killed     dispatch kill (or an admin): SIGTERM, then SIGKILL
    stop timeout    --max-time ran out (the shepherd also keeps the deadline)
    deadline T      an admin changed the job's max time: stop it at T (epoch s)

This module owns that grammar: the daemon writes with :func:`stop` and
:func:`deadline` (which encode with :func:`encode_stop` and
:func:`encode_deadline`), the shepherd reads with :class:`Reader`, which
decodes each line with :func:`parse`.

A write shorter than PIPE_BUF is atomic, so commands never interleave. The
shepherd holds a write end of its own, so the FIFO never reports EOF
between writers. Opening the FIFO for writing without a reader fails
(ENXIO): the daemon learns the shepherd is gone without touching any pid.
"""

import errno
import os
import stat

try:
    from shepherd.base import records
except ImportError:  # run as a file: siblings are on sys.path
    from base import records  # type: ignore[no-redef]  # the same module, found as a top-level one

STOP = "stop"
DEADLINE = "deadline"


def encode_stop(reason: str) -> str:
    """The line that asks for a stop: *reason* is one of ``records.STOP_REASONS``."""
    if reason not in records.STOP_REASONS:
        raise ValueError(f"not a stop reason: {reason!r}")
    return f"{STOP} {reason}"


def encode_deadline(when: float) -> str:
    """The line that gives the job a new --max-time deadline, *when* in epoch seconds."""
    return f"{DEADLINE} {when:.3f}"


def parse(line: str) -> tuple | None:
    """One line as ``(STOP, reason)`` or ``(DEADLINE, epoch seconds)``; None if it is neither.

    A stop with a reason this shepherd does not know is still a stop
    (``killed``): a request to end a job is never dropped. A deadline that
    is not a finite time is ignored.
    """
    words = line.split()
    if not words:
        return None
    if words[0] == STOP:
        return STOP, words[1] if len(words) > 1 and words[1] in records.STOP_REASONS else records.KILLED
    if words[0] == DEADLINE and len(words) == 2:
        try:
            when = float(words[1])
        except ValueError:
            return None
        if when == when and abs(when) < 1e12:   # finite (NaN is not equal to itself), and a time
            return DEADLINE, when
    return None


def create(job_dir: str):
    """Make the FIFO afresh; returns ``(read_fd, keeper_write_fd)``, both non-blocking."""
    path = os.path.join(job_dir, records.CONTROL)
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:   # a previous shepherd's (the daemon started this job before)
        os.unlink(path)
        os.mkfifo(path, 0o600)
    rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    return rfd, wfd


class Reader:
    """Splits what arrives on the FIFO into commands, each as :func:`parse` gives it."""

    def __init__(self, fd: int):
        self.fd = fd
        self._rest = b""

    def commands(self) -> list:
        """Every complete command waiting on the FIFO (lines that are none are dropped)."""
        data = self._rest
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        *lines, self._rest = data.split(b"\n")
        self._rest = self._rest[-4096:]
        parsed = (parse(line.decode("ascii", "replace")) for line in lines)
        return [command for command in parsed if command is not None]


def stop(job_dir: str, reason: str) -> bool:
    """Ask the job's shepherd to stop it for *reason*; False if no shepherd is reading."""
    return send(job_dir, encode_stop(reason))


def deadline(job_dir: str, when: float) -> bool:
    """Give the job's shepherd a new deadline (epoch seconds); False if no shepherd is reading."""
    return send(job_dir, encode_deadline(when))


def send(job_dir: str, command: str) -> bool:
    """Write one command to a job's FIFO; False if no shepherd is reading it."""
    path = os.path.join(job_dir, records.CONTROL)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # ENOENT: not created yet; ENXIO: nobody reads it; ELOOP: not ours
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
            return False
        os.write(fd, command.encode("ascii") + b"\n")
        return True
    except BlockingIOError:
        return True   # the FIFO is full of unread commands: the shepherd has work queued
    except OSError as exc:
        return exc.errno == errno.EAGAIN
    finally:
        os.close(fd)

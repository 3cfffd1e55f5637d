"""The job's control FIFO: how the daemon asks a shepherd to act, s6 style.

The daemon never signals a job's processes: only the shepherd, their
parent, can name them without a race. So the daemon writes one command a
line into ``<job dir>/control`` and the shepherd, which polls the FIFO's
read end, carries it out:

    stop killed     dispatch kill (or an admin): SIGTERM, then SIGKILL
    stop timeout    --max-time ran out (the shepherd also keeps the deadline)
    deadline T      an admin changed the job's max time: stop it at T (epoch s)

A write shorter than PIPE_BUF is atomic, so commands never interleave. The
shepherd holds a write end of its own, so the FIFO never reports EOF
between writers. Opening the FIFO for writing without a reader fails
(ENXIO): the daemon learns the shepherd is gone without touching any pid.
"""

import errno
import os
import stat

try:
    from shepherd import records
except ImportError:  # run as a file: siblings are on sys.path
    import records  # type: ignore[no-redef]  # the same module, found as a top-level one


def create(job_dir: str):
    """Make the FIFO afresh; returns ``(read_fd, keeper_write_fd)``, both non-blocking."""
    path = os.path.join(job_dir, records.CONTROL)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)
    rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    return rfd, wfd


class Reader:
    """Splits what arrives on the FIFO into commands (lists of words)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._rest = b""

    def commands(self) -> list:
        """Every complete command waiting on the FIFO."""
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
        return [line.decode("ascii", "replace").split() for line in lines if line.strip()]


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

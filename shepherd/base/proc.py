"""Process utilities the daemon, the fork server and the shepherd share: reaping, start times.

Standard library only, like the rest of the base: the shepherd pays for every
import on each job's start.
"""

import os


def reap_children() -> None:
    """Collect every child that has exited, without blocking (none is left a zombie)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def proc_starttime(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat).

    Together with the pid it names one process for the life of the machine,
    which is what makes a pidfile safe against pid reuse.
    """
    try:   # (os.open and one read: a buffered open() costs five more system calls, three times a job)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None

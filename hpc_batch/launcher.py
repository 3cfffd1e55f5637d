"""Starting, finding and signalling shepherds: the daemon's process side effects.

The daemon never waits on a job itself. It spawns one shepherd per job in a
new session (so the shepherd survives the daemon), holds a pidfd for it (the
kernel wakes the daemon when it exits: no polling), and after a restart finds
it again from its pidfile, trusting the pid only when the lock is held and
the /proc start time matches.
"""

import fcntl
import os
import signal
import sys

import shepherd
from shepherd import records

SHEPHERD = "hpc-batch-shepherd"


def shepherd_argv(job_id: int, user: str, job_dir: str) -> tuple:
    """(executable, argv, env) to start a shepherd; ps shows its job and user.

    The shepherd's file is run directly with -S (no site-packages: it needs
    only the standard library and its own directory) and -E -s (ignore the
    environment and the user's site): it starts fast and nothing a user
    controls can change what root runs.
    """
    script = os.path.join(os.path.dirname(os.path.abspath(shepherd.__file__)), SHEPHERD + ".py")
    args = ["--job", str(job_id), "--user", user, job_dir]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    return sys.executable, [sys.executable, "-E", "-s", "-S", script, *args], env


def write_launch(job_dir: str, launch: dict) -> None:
    """Write the shepherd's spec (root-only: it holds the job's environment)."""
    records.write_json(os.path.join(job_dir, records.LAUNCH), launch, 0o600, durable=False)


def spawn(job_id: int, user: str, job_dir: str) -> int:
    """Start the shepherd for a job whose launch spec is written; returns its pid."""
    exe, argv, env = shepherd_argv(job_id, user, job_dir)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        return os.posix_spawn(
            exe, argv, env, setsid=True,
            file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1)],
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGTERM, signal.SIGCHLD))
    finally:
        os.close(null)


def shepherd_alive(job_dir: str) -> bool:
    """True while a shepherd holds the job's lock."""
    try:
        fd = os.open(os.path.join(job_dir, records.PIDFILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def open_pidfd(pid: int, starttime: int | None):
    """A pidfd for *pid* if it is still the process that started at *starttime*."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    # Checked after opening: the pidfd pins this process, so it cannot change under us.
    if starttime is not None and records.proc_starttime(pid) != starttime:
        os.close(fd)
        return None
    return fd


def adopt(job_dir: str):
    """Find a running job's shepherd after a restart: ``(pid, pidfd)`` or None if gone."""
    pf = records.read_pidfile(job_dir)
    if pf is None or not shepherd_alive(job_dir):
        return None
    pid, start = pf
    fd = open_pidfd(pid, start)
    if fd is None:
        return None
    return pid, fd


def reap(pid: int) -> None:
    """Collect a shepherd's zombie if it is our child (it is not after a restart)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def signal_job(job_dir: str, sig: int, cgroup_path: str | None = None) -> bool:
    """Send *sig* to every process of the job; True if anything was signalled."""
    sent = False
    status = records.read_json(os.path.join(job_dir, records.STATUS))
    if status and status.get("job_pid"):
        try:
            os.killpg(status["job_pid"], sig)
            sent = True
        except (ProcessLookupError, PermissionError):
            pass
    if cgroup_path:
        from . import cgroups
        sent = cgroups.signal_all(cgroup_path, sig) or sent
    return sent

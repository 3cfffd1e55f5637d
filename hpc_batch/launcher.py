"""Starting, finding and asking shepherds: the daemon's process side effects.

The daemon never waits on a job itself. It spawns one shepherd per job in a
new session (so the shepherd survives the daemon), holds a pidfd for it (the
kernel wakes the daemon when it exits: no polling), and after a restart finds
it again from its pidfile, trusting the pid only when the lock is held and
the /proc start time matches.

Root never signals a job's processes by number: it asks the shepherd through
the job's control FIFO (:func:`request_stop`). Only when the shepherd itself
is gone does the daemon act, through a pidfd it has checked (or cgroup.kill).
"""

import fcntl
import os
import select
import signal
import sys

import shepherd
from shepherd import control, records

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


def exited(pidfd: int) -> bool:
    """True once the process behind *pidfd* has exited (its pidfd polls readable)."""
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


def request_stop(job_dir: str, reason: str) -> bool:
    """Ask the job's shepherd to stop it ("killed" or "timeout"); False if none is listening."""
    return control.send(job_dir, f"stop {reason}")


def send_deadline(job_dir: str, deadline: float) -> bool:
    """Give the job's shepherd a new --max-time deadline (epoch seconds); False if none is listening."""
    return control.send(job_dir, f"deadline {deadline:.3f}")


def kill_orphaned_job(job_dir: str) -> bool:
    """SIGKILL a job whose shepherd died (no cgroups): only a leader proven alive, by pidfd.

    The leader's pid comes from status.json and is trusted only while a pidfd
    on it shows the same process (start time) not yet exited: a live leader
    pins its process group's id, so the group named by it is still the job's.
    """
    status = records.read_record(os.path.join(job_dir, records.STATUS), records.StatusRecord)
    if status is None or status.job_pid is None or status.job_start is None or status.job_pid <= 1:
        return False
    pid = status.job_pid
    fd = open_pidfd(pid, status.job_start)
    if fd is None:
        return False
    try:
        if exited(fd):
            return False  # it has exited: the number may no longer be its
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)

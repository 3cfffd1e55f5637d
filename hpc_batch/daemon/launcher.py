"""Starting, finding and asking shepherds: the daemon's process side effects.

The daemon never waits on a job itself. It spawns one shepherd per job in a
new session (so the shepherd survives the daemon), holds a pidfd for it (the
kernel wakes the daemon when it exits: no polling), and after a restart finds
it again from its pidfile, trusting the pid only when the lock is held and
the /proc start time matches.

Root never signals a job's processes by number: it asks the shepherd through
the job's control FIFO (:func:`request_stop`). Only when the shepherd itself
is gone does the daemon act, through a pidfd it has checked (or cgroup.kill).

Out of pids (or memory) a start fails with EAGAIN (ENOMEM): :func:`spawn`
raises that as it is, and ``records.not_now`` tells the engine to put the job
back in its queue rather than fail it; the fork server says so too and is
kept, not restarted (which would need yet another process).
"""

import errno
import fcntl
import logging
import os
import select
import signal
import socket
import sys
import time

import shepherd
from shepherd import control, forkserver
from shepherd.base import proc, records

log = logging.getLogger("hpc-batchd")

SHEPHERD = "hpc-batch-shepherd"
SHEPHERD_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}   # and the fork server's


def shepherd_argv(job_id: int, user: str, job_dir: str) -> tuple:
    """(executable, argv, env) to start a shepherd; ps shows its job and user.

    The shepherd's file is run directly with -S (no site-packages: it needs
    only the standard library and its own directory) and -E -s (ignore the
    environment and the user's site): it starts fast and nothing a user
    controls can change what root runs.
    """
    args = ["--job", str(job_id), "--user", user, job_dir]
    return sys.executable, [sys.executable, "-E", "-s", "-S", shepherd_script(), *args], dict(SHEPHERD_ENV)


def shepherd_script() -> str:
    """The shepherd's file, run for an exec'd shepherd and for the fork server alike."""
    return os.path.join(os.path.dirname(os.path.abspath(shepherd.__file__)), SHEPHERD + ".py")


def write_launch(job_dir: str, launch: records.LaunchSpec, durable: bool) -> None:
    """Write the shepherd's spec (root-only: it holds the job's environment).

    A job started before (queued again because its shepherd could not fork
    it) has that shepherd's records: they go first, so that no daemon ever
    reads them as this start's, and their going is flushed (the directory),
    so that no power cut brings them back. No pidfile is made here: the
    shepherd creates it, and its child makes it durable, name and contents,
    before the command may run. After a power cut, a start the journal holds
    whose pidfile is empty or gone never ran its command: it is queued again
    (``recovery``), from its spec when the spec is *durable* (flushed, file
    and directory, before the start's commit: a forwarded environment, which
    the store lets go of at the start), else from the clean environment the
    store keeps until the job ends. Then the start's commit is the only
    flush on the daemon's way to a job.
    """
    removed = False
    for name in (records.EXIT, records.STATUS, records.DELIVERY, records.PIDFILE):
        try:
            os.unlink(os.path.join(job_dir, name))
            removed = True
        except FileNotFoundError:
            pass
    launch.write(os.path.join(job_dir, records.LAUNCH), durable=durable)
    if removed and not durable:
        records.fsync_dir(job_dir)


_SIGDEF = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGTERM, signal.SIGCHLD)


def spawn(job_id: int, user: str, job_dir: str, meanwhile=None) -> tuple[int, int | None]:
    """Start the shepherd for a job whose launch spec is written: ``(pid, start time)``.

    Forked by the fork server when it answers (a few milliseconds, pages
    shared); exec'd afresh when it cannot (start time None: the pid is our
    child, so it cannot be reused under us). Out of pids or memory, the
    OSError (EAGAIN, ENOMEM) is raised and no shepherd exists (``records.not_now``).
    *meanwhile*, if given, is called once while the fork server forks (work
    that needs no pid overlaps the fork instead of following it).
    """
    once = _Once(meanwhile)
    answer = _FORK_SERVER.spawn(job_id, user, job_dir, once)
    if answer is not None:
        return answer
    once()
    exe, argv, env = shepherd_argv(job_id, user, job_dir)
    return _posix_spawn(exe, argv, env), None


class _Once:
    """Calls *fn* the first time it is called, never again; what *fn* raises is logged, not raised
    (a fork server's answer must still be read after it)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            try:
                fn()
            except Exception:
                log.exception("while the shepherd was being forked")


def _posix_spawn(exe: str, argv: list, env: dict, extra=()) -> int:
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        return os.posix_spawn(
            exe, argv, env, setsid=True,
            file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1), *extra],
            setsigdef=_SIGDEF)
    finally:
        os.close(null)


class ForkServer:
    """The daemon's end of shepherd/forkserver.py: started on first use, restarted if it dies.

    It is the daemon's child, reached over a socketpair only the daemon
    holds; a server that does not answer within REPLY_TIMEOUT is killed
    (through its pidfd) and that job's shepherd is exec'd instead.
    """

    REPLY_TIMEOUT = 10.0   # a fork takes milliseconds; this is for a machine (or VM) under heavy load

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.pidfd: int | None = None
        self.failures = 0
        self.wait_s = 0.0   # seconds the loop waited for answers, in all: a slow turn says its share

    def _start(self) -> bool:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = _posix_spawn(sys.executable, forkserver.server_argv(sys.executable, shepherd_script()),
                               dict(SHEPHERD_ENV),
                               extra=[(os.POSIX_SPAWN_DUP2, child.fileno(), 3)])
            self.pidfd = os.pidfd_open(pid)
        except OSError as exc:
            parent.close()
            if records.not_now(exc):   # not the server's fault: nor would an exec'd shepherd start now
                raise
            log.error("cannot start the shepherd fork server (%s); shepherds are exec'd instead", exc)
            return False
        finally:
            child.close()
        parent.settimeout(self.REPLY_TIMEOUT)
        self.sock = parent
        return True

    def start(self) -> None:
        """Start the server now (at the daemon's start), so no job waits for its start-up."""
        try:
            if self.sock is None and self.failures < 3 and not self._start():
                self.failures += 1
        except OSError as exc:   # out of pids: the first job's spawn tries again
            log.warning("cannot start the shepherd fork server yet (%s)", exc)

    def stop(self) -> None:
        """Close our end (the server exits at EOF) and kill it if it is still there."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except OSError:
                pass
            os.close(self.pidfd)
            self.pidfd = None

    def spawn(self, job_id: int, user: str, job_dir: str, meanwhile=None) -> tuple[int, int | None] | None:
        """Ask for a shepherd; None when the server cannot give one (the caller execs it).

        A server found dead (killed, say) is started afresh and asked once more;
        one that dies (or times out) with the request in it is asked again only
        when no shepherd of its forking has taken the job (:func:`claimed`).
        Out of pids or memory, the OSError (EAGAIN, ENOMEM) is raised. *meanwhile*
        (a ``_Once``) is called once a request is sent, before its answer is read.
        """
        for _ in range(2):
            if self.failures >= 3:   # a server that keeps failing is not worth a delay per job
                return None
            if self.sock is None and not self._start():
                self.failures += 1
                return None
            answer = self._ask(job_id, user, job_dir, meanwhile)
            if answer is _UNANSWERED:
                # It failed with our request in it: it may have forked the shepherd first, which
                # may even have run the job to its end by now. That one is the job's; a second
                # would find the launch spec gone and overwrite the real exit record with an error.
                taken = claimed(job_dir)
                if taken is not None:
                    log.warning("job %d: the fork server died before it answered, after forking shepherd "
                                "pid %d: that one is the job's", job_id, taken[0])
                    return taken
                continue
            if answer is not None:
                self.failures = 0
                return answer
        return None

    def _ask(self, job_id: int, user: str, job_dir: str, meanwhile=None):
        """The server's ``(pid, start)``; None if it failed before it had the request, _UNANSWERED after."""
        assert self.sock is not None
        try:
            self.sock.sendall(forkserver.encode_request(job_id, user, job_dir))
        except OSError as exc:   # its newline, the last byte, never reached it: it forked nothing
            log.error("the shepherd fork server failed (%s); starting it afresh", exc)
            self.failures += 1
            self.stop()
            return None
        if meanwhile is not None:
            meanwhile()
        waited = time.monotonic()
        try:
            reply = b""
            while not reply.endswith(b"\n"):
                data = self.sock.recv(256)
                if not data:
                    raise OSError("it exited")
                reply += data
            self.wait_s += time.monotonic() - waited
            try:
                pid, start = forkserver.parse_answer(reply)
            except forkserver.ForkFailed as failed:
                if failed.name in records.NOT_NOW_NAMES:
                    # It could not fork, and is fine: the job waits, the server stays.
                    raise _NotNow(getattr(errno, failed.name), failed.text) from None
                raise OSError(str(failed)) from None
        except _NotNow:
            raise
        except (OSError, ValueError) as exc:
            log.error("the shepherd fork server failed (%s); starting it afresh", exc)
            self.failures += 1
            self.stop()
            return _UNANSWERED
        return pid, start


class _NotNow(OSError):
    """The fork server's fork failed for want of pids or memory."""


_UNANSWERED = object()   # a request the server may have acted on, but never answered


def claimed(job_dir: str, settle: float = 0.5) -> tuple[int, int] | None:
    """``(pid, start)`` of the shepherd that has taken this start of the job, if one has.

    The daemon removed the last start's pidfile (:func:`write_launch`); a
    shepherd creates it and writes its pid in it as soon as it holds its lock, before
    anything else, and keeps it there after it ends. So a pid in it is this
    start's shepherd, alive or not: the caller watches it through a pidfd
    checked against its start time, and collects its exit record (or its
    death) as for any other. A lock held with the pid not yet written is a
    write away from it: waited for *settle* seconds at most. None: no shepherd
    has taken it yet (one still starting is turned away by the lock and the
    pid it finds in the file, shepherd/main.py's ``_take_lock``).
    """
    deadline = time.monotonic() + settle
    while True:
        found = records.read_pidfile(job_dir)
        if found is not None or not shepherd_alive(job_dir) or time.monotonic() >= deadline:
            return found
        time.sleep(0.005)


_FORK_SERVER = ForkServer()


def start_fork_server() -> None:
    """Start the fork server ahead of the first job (its interpreter start-up is paid here)."""
    _FORK_SERVER.start()


def fork_server_wait() -> float:
    """Seconds the loop has waited for the fork server's answers since the daemon started."""
    return _FORK_SERVER.wait_s


def stop_fork_server() -> None:
    """Let the fork server go (before a re-exec or at exit); shepherds it made run on."""
    _FORK_SERVER.stop()


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
    if starttime is not None and proc.proc_starttime(pid) != starttime:
        os.close(fd)
        return None
    return fd


def adopt(job_dir: str):
    """Find a running job's shepherd after a restart: ``(pid, pidfd)`` or None if gone."""
    pf = claimed(job_dir)
    if pf is None or not shepherd_alive(job_dir):
        return None
    pid, start = pf
    fd = open_pidfd(pid, start)
    if fd is None:
        return None
    return pid, fd


def vanished(job_dir: str) -> str:
    """Why a running job has no live shepherd after a restart, for its ``lost`` note.

    A pidfile older than this boot means the machine restarted under the job
    (a power cut, a crash): its command may have run in part.
    """
    try:
        with open("/proc/uptime", "rb") as f:
            boot = time.time() - float(f.read().split()[0])
        written = os.lstat(os.path.join(job_dir, records.PIDFILE)).st_mtime
    except (OSError, ValueError, IndexError):
        written = boot = 0.0
    if written and written < boot:
        return "the machine restarted while it ran (a power cut or a crash); it may have run in part"
    return "its shepherd was killed or vanished while the daemon was down"


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
    return control.stop(job_dir, reason)


def send_deadline(job_dir: str, deadline: float) -> bool:
    """Give the job's shepherd a new --max-time deadline (epoch seconds); False if none is listening."""
    return control.deadline(job_dir, deadline)


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

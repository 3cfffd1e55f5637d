"""The shepherd fork server: one resident interpreter that forks a shepherd per job.

    hpc-batch-shepherd.py --fork-server PADDING   (started by hpc-batchd, fd 3 its socket)

Starting a shepherd by exec costs an interpreter start-up per job, and each
shepherd then holds its own copy of every page. The daemon instead keeps one
of these: it has the shepherd's modules loaded (and frozen out of the
garbage collector, so children do not dirty those pages), reads a request
from the daemon a line at a time, ``JOB_ID USER JOB_DIR``, and for each:

1. forks once; the child starts a new session and is the shepherd. It is
   this server's child, not the daemon's: it survives the daemon and this
   server alike (once the server is gone, init's), and is re-adopted the
   usual way, through its pidfile and start time. The server collects
   each shepherd that exits from its SIGCHLD handler, and holds SIGCHLD
   back until it has read the new one's start time, so the pid it
   answers cannot have been reused;
2. the shepherd renames itself (its argv in place, over this server's
   padding) so that ``ps`` shows ``hpc-batch-shepherd --job ID --user NAME
   JOB_DIR``, then runs the same ``main`` an exec'd shepherd would;
3. the server answers ``PID STARTTIME``, or ``error ERRNO-NAME ...`` when a
   fork fails (``error EAGAIN ...`` when the machine is out of pids): it
   keeps serving, and the daemon puts the job back in its queue.

Only the daemon holds the other end of the socket, so no user can ask for
anything. At EOF (the daemon exited or re-exec'd) the server exits; the
shepherds it made carry on.
"""

import errno
import gc
import os
import signal
import sys

# main imports, at its top, every module a shepherd runs (output, delivery, record, ...):
# loaded here once, before gc.freeze(), so each forked shepherd shares them and loads nothing.
try:
    from shepherd import main as shepherd_main
    from shepherd.base import proc, sigs
except ImportError:  # run as a file: siblings are top-level modules
    import main as shepherd_main  # type: ignore[no-redef]
    from base import proc, sigs  # type: ignore[no-redef]

PADDING = 320     # bytes of argv kept free for a shepherd's own command line
ERROR = "error"   # the first word of an answer that carries no shepherd
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGTERM, signal.SIGCHLD, signal.SIGINT)


def serve(sock_fd: int = 3) -> int:
    """Answer fork requests on *sock_fd* until EOF."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        sigs.signal(sig, sigs.SIG_DFL)
    sigs.signal(signal.SIGCHLD, _reap)   # a shepherd that exits is collected at once
    try:   # specialised code and per-boot facts, shared by every shepherd (see main.warm_up)
        shepherd_main.warm_up()
    except Exception as exc:   # only ever a cost: a shepherd does the same work itself
        sys.stderr.write(f"hpc-batch-shepherd fork server: warm-up failed: {exc!r}\n")
    area = argv_area()   # a forked child's argv lies where this server's does
    gc.collect()
    gc.freeze()       # the modules' objects stay shared with every child
    pending = b""
    while True:
        try:
            data = os.read(sock_fd, 4096)
        except InterruptedError:
            continue
        if not data:
            return 0
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            os.write(sock_fd, (_fork_one(line, sock_fd, area) + "\n").encode())


# -- the line protocol: the daemon's launcher.ForkServer asks, this server answers ------------

def encode_request(job_id: int, user: str, job_dir: str) -> bytes:
    """The daemon's request for one shepherd: ``JOB_ID USER JOB_DIR``, a line."""
    return f"{job_id} {user} {job_dir}\n".encode()


def parse_request(line: bytes) -> tuple[int, str, str] | None:
    """``(job_id, user, job_dir)`` from a request line (without its newline), or None."""
    try:
        job_text, user, job_dir = line.decode().split(" ", 2)
        return int(job_text), user, job_dir
    except ValueError:   # (a UnicodeDecodeError is one too)
        return None


def encode_answer(pid: int, start: int | None) -> str:
    """The answer for a forked shepherd: ``PID STARTTIME`` (``None``: it is already gone)."""
    return f"{pid} {start}"


def fork_error(exc: OSError) -> str:
    """The answer for a fork that failed: ``error ERRNO-NAME text``, e.g. ``error EAGAIN ...``.

    The daemon reads the name: EAGAIN or ENOMEM means "not now" (the job waits
    and is retried), anything else that this server is of no use.
    """
    name = errno.errorcode.get(exc.errno or 0, "EIO")
    return f"{ERROR} {name} cannot fork: {exc.strerror or exc}"


class ForkFailed(Exception):
    """An ``error`` answer: *name* is the errno's name (``EAGAIN``) or "", *text* the rest."""

    def __init__(self, name: str, text: str):
        super().__init__(f"{name} {text}" if name else text)
        self.name, self.text = name, text


def parse_answer(line: bytes) -> tuple[int, int]:
    """The daemon's reading of an answer: ``(pid, starttime)``.

    A start time of ``None`` (the shepherd was gone before it could be read)
    reads as 0, which matches no process. An ``error`` answer raises
    :class:`ForkFailed`; a line that is neither answer, ValueError.
    """
    words = line.decode().split()
    if not words:
        raise ValueError("an empty answer")
    if words[0] == ERROR:
        name = words[1] if len(words) > 1 and words[1].isupper() and words[1].startswith("E") else ""
        raise ForkFailed(name, " ".join(words[2:] if name else words[1:]))
    if len(words) < 2:
        raise ValueError(f"a malformed answer: {line!r}")
    return int(words[0]), 0 if words[1] == "None" else int(words[1])


def _fork_one(line: bytes, sock_fd: int, area: tuple[int, int] | None) -> str:
    request = parse_request(line)
    if request is None:
        return f"{ERROR} malformed request"
    job_id, user, job_dir = request
    # SIGCHLD held back until the shepherd's start time is read: unreaped until then, its pid
    # cannot be another process's, even if it has already exited.
    old = sigs.pthread_sigmask(sigs.SIG_BLOCK, (signal.SIGCHLD,))
    try:
        try:
            pid = os.fork()
        except OSError as exc:   # out of pids (EAGAIN) or memory (ENOMEM): say so, and keep serving
            return fork_error(exc)
        if pid == 0:  # the shepherd: a session of its own, then the shepherd's main
            try:
                sigs.pthread_sigmask(sigs.SIG_SETMASK, old)
                os.close(sock_fd)
                os.setsid()
                _become_shepherd(job_id, user, job_dir, area)
            finally:
                os._exit(1)
        return encode_answer(pid, proc.proc_starttime(pid))
    finally:
        sigs.pthread_sigmask(sigs.SIG_SETMASK, old)


def _reap(signum=None, frame=None) -> None:
    """SIGCHLD's handler: collect every shepherd that has exited."""
    proc.reap_children()


def _become_shepherd(job_id: int, user: str, job_dir: str, area: tuple[int, int] | None) -> None:
    """In the forked child: look and act like an exec'd shepherd, then be one."""
    status = 1
    try:
        for sig in _DEFAULT_SIGNALS:
            sigs.signal(sig, sigs.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        if null > 2:
            os.close(null)
        if area is not None:
            _set_cmdline(["hpc-batch-shepherd", "--job", str(job_id), "--user", user, job_dir], area)
        status = shepherd_main.main(["--job", str(job_id), "--user", user, job_dir])
    except BaseException as exc:  # noqa: B036 - the child must never return into the server's loop
        try:
            sys.stderr.write(f"hpc-batch-shepherd: job {job_id}: {exc!r}\n")
        except Exception:
            pass
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(status if isinstance(status, int) else 1)


def argv_area() -> tuple[int, int] | None:
    """Where this process's argv lies in its memory, ``(arg_start, arg_end)``; None if unreadable.

    Read once by the server: a fork keeps the addresses, so no child reads them again.
    """
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
        fields = stat[stat.rfind(b")") + 2:].split()
        return int(fields[45]), int(fields[46])   # arg_start, arg_end (fields 48 and 49)
    except (OSError, ValueError, IndexError):
        return None


def _set_cmdline(words: list, area: tuple[int, int]) -> None:
    """Overwrite this process's argv, at *area* (:func:`argv_area`), in place: what
    /proc/PID/cmdline and ps show.

    The server was started with PADDING spare bytes of argv for this; a
    longer command line is cut short (ps then shows its start). Written
    through /proc/self/mem, a plain write to our own (writable) stack: ctypes
    would map libffi into the server and dirty about 35 pages of each
    shepherd per call. Where that file cannot be written, ctypes does it.
    """
    start, end = area
    text = b"\0".join(w.encode("utf-8", "surrogateescape") for w in words)[:end - start - 1]
    data = text + b"\0" * (end - start - len(text))
    try:
        fd = os.open("/proc/self/mem", os.O_WRONLY | os.O_CLOEXEC)
        try:
            if os.pwrite(fd, data, start) == len(data):
                return
        finally:
            os.close(fd)
    except OSError:
        pass
    import ctypes
    ctypes.memmove(start, data, len(data))


def server_argv(python: str, script: str) -> list:
    """The command line the daemon starts the server with (its padding included)."""
    return [python, "-E", "-s", "-S", script, "--fork-server", " " * PADDING]

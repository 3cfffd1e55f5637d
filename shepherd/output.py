"""A job's output on its way to the user: the pipe, the buffer, the log file.

The job writes into a pipe; the shepherd moves what arrives into the
buffer (``<job dir>/output``, what ``dispatch attach`` streams) until
``--max-output-buffer`` is reached, so one job can never fill the state
filesystem. Past that bound the rest goes straight to the user's log file,
written by a child running as the user (the buffer's part first, so the
file is whole), or, with no log file, is discarded. At the end the buffer
is copied to the log file, again as the user, and fsynced (with its
directory when the copy created it) before the buffer, the only other copy,
is removed: a power cut never leaves a job that says "delivered" with an
empty log.

Opening the log file is where a hostile user sets traps: a FIFO that never
opens, a symlink to root's files, a file another user planted in a shared
directory, a lease. So it is created with O_EXCL, or else accepted only as
a regular file the user owns, never through a link, and never with a
blocking open.
"""

import errno
import fcntl
import os
import signal
import stat

try:
    from shepherd import identity, records
except ImportError:  # run as a file: siblings are on sys.path
    import identity  # type: ignore[no-redef]  # the same module, found as a top-level one
    import records  # type: ignore[no-redef]

CHUNK = 1 << 20          # bytes moved per splice, and the pipe's size
_SPLICE_FALLBACK = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
_NO_FSYNC = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EROFS)


class Refused(OSError):
    """The log file exists but is not one the user may have written into."""


def make_pipe() -> tuple[int, int]:
    """The job's stdout/stderr pipe ``(read, write)``, 1 MiB deep where allowed."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), CHUNK)
    except OSError:
        pass  # the default 64 KiB still works, just with more wake-ups
    return r, w


def move(src: int, dst: int, count: int, nonblock: bool = False) -> int:
    """Move up to *count* bytes from the pipe *src* to *dst*; 0 at EOF.

    Raises BlockingIOError when *nonblock* and the pipe is empty. splice
    keeps the data in the kernel; a destination that cannot take it (some
    filesystems) gets a plain read and write instead.
    """
    try:
        return os.splice(src, dst, count, flags=os.SPLICE_F_NONBLOCK if nonblock else 0)
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno not in _SPLICE_FALLBACK:
            raise
    data = os.read(src, count)
    view = memoryview(data)
    while view:
        view = view[os.write(dst, view):]
    return len(data)


def drain(src: int, dst: int) -> None:
    """Move whatever the pipe holds now, without waiting for more."""
    os.set_blocking(src, False)
    while True:
        try:
            if move(src, dst, CHUNK, nonblock=True) == 0:
                return
        except BlockingIOError:
            return


def copy_file(src: int, dst: int) -> int:
    """Copy *src* from its start to *dst*'s current position; returns the bytes copied."""
    offset = 0
    while True:
        n = os.sendfile(dst, src, offset, CHUNK)
        if n == 0:
            return offset
        offset += n


def open_destination(path: str) -> tuple[int, bool]:
    """Open the log file for writing, as whoever runs this (the user): ``(fd, created)``.

    A new file is created with O_EXCL (mode 0666 less the umask); an
    existing one is taken only if it is a regular file owned by us, and is
    then truncated. O_NOFOLLOW refuses a symlink; O_NONBLOCK makes a FIFO
    without a reader fail at once and a lease refuse instead of stall.
    """
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
        pass
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(errno.EINVAL, "it exists and is not a regular file")
        if st.st_uid != os.geteuid():
            raise Refused(errno.EPERM, f"it exists and belongs to another user (uid {st.st_uid})")
        os.ftruncate(fd, 0)
        return fd, False
    except BaseException:
        os.close(fd)
        raise


def make_durable(fd: int, path: str, created: bool) -> None:
    """fsync the log (and, if this copy created it, its directory, so the name survives too).

    A filesystem that cannot fsync (EINVAL and the like) is as durable as it
    gets; a directory the user may not open (no read permission) is left to
    the filesystem's own commit.
    """
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_FSYNC:
            raise
    if not created:
        return
    try:
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError as exc:
        if exc.errno not in _NO_FSYNC:
            raise
    finally:
        os.close(dfd)


def describe(path: str, exc: BaseException) -> str:
    """One line saying why *path* could not be written."""
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return f"cannot write {path}: it is a symbolic link, which hpc-batch never follows"
    if isinstance(exc, OSError) and exc.errno in (errno.ENXIO, errno.EWOULDBLOCK):
        return f"cannot write {path}: it is a FIFO or device nobody reads, or is leased"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot write {path}: {exc.strerror} (errno {exc.errno})"
    return f"cannot write {path}: {exc}"


class _Finish(Exception):
    """SIGTERM in the relay: the job has ended, take what is left and stop."""


def deliver_as_user(spec: records.LaunchSpec, buf: int, pipe_r, report: int) -> None:
    """In a forked child: become the user, write the buffer to the log, then relay the pipe.

    With *pipe_r* None this is the final copy. With a pipe it is the relay
    past the buffer bound: it keeps appending until the pipe's EOF, or until
    SIGTERM (the shepherd's "the job has ended") makes it take what is left
    and stop. If the log cannot be written it still drains the pipe, so the
    job is never killed by a broken pipe over it. Never returns; the exit
    status and *report* (a line, on failure) say how it went.
    """
    state = {"relaying": False, "finish": False}

    def on_term(signum, frame):
        state["finish"] = True
        if state["relaying"]:
            raise _Finish

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, on_term)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    dest, code, dst, created = spec.output, 1, None, False
    assert dest is not None   # called only for a job with a log (the caller exits 1 if not)
    try:
        identity.become(spec.user, spec.uid, spec.gid)
        os.umask(spec.umask & 0o777)
        dst, created = open_destination(dest)
        copy_file(buf, dst)
        code = 0
    except BaseException as exc:  # report it; the job must not notice
        _say(report, describe(dest, exc))
    if pipe_r is not None:
        os.set_blocking(pipe_r, True)  # the shepherd polled it non-blocking; here we wait in splice
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        sink = dst if code == 0 and dst is not None else null  # code 0: the log file is open
        while True:
            try:
                state["relaying"] = True
                if state["finish"]:
                    raise _Finish
                while move(pipe_r, sink, CHUNK):
                    pass
                state["relaying"] = False
                break
            except _Finish:
                state["relaying"] = False
                try:
                    drain(pipe_r, sink)
                except OSError as exc:
                    if sink != null:
                        _say(report, describe(dest, exc))
                        code = 1
                break
            except OSError as exc:
                state["relaying"] = False
                if sink == null:
                    break
                _say(report, describe(dest, exc))
                code, sink = 1, null   # keep taking the job's output, into nowhere
    # Durable before this child says it succeeded: the shepherd then removes the buffer, the
    # only other copy (a job's own files get no such care, but they are the job's own business).
    # The job has ended by now and is not kept waiting; its end is what the daemon timestamps.
    # Closed too: a network filesystem reports a failed write there.
    if code == 0 and dst is not None:  # (code 0: the log file is open)
        try:
            make_durable(dst, dest, created)
            os.close(dst)
        except OSError as exc:
            _say(report, describe(dest, exc))
            code = 1
    os._exit(code)


def _say(fd: int, line: str) -> None:
    try:
        os.write(fd, line.encode("utf-8", "surrogateescape")[:4000])
    except OSError:
        pass

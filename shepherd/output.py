"""A job's output on its way to the user: the pipe, the buffer, the log file.

The job writes into a pipe; the shepherd moves what arrives into the
buffer (``<job dir>/output``, what ``dispatch attach`` streams) until
``--max-output-buffer`` is reached, so one job can never fill the state
filesystem. Past that bound the rest goes straight to the user's log file,
written by a child running as the user, or, with no log file, is
discarded. That child writes the pipe's part after the buffer's place in
the log and copies the buffer into that place when the pipe leaves it
time (and the rest at the job's end): a job writing fast never waits on
the copy, and the log is whole before it is made durable. Without a
relay, the buffer is copied to the log file at the end, again as the user.
Either way the log is fsynced (with its directory when the copy created
it) before the buffer, the only other copy, is removed: a power cut never
leaves a job that says "delivered" with an empty log.

Opening the log file is where a hostile user sets traps: a FIFO that never
opens, a symlink to root's files, a file another user planted in a shared
directory, a lease. So it is created with O_EXCL, or else accepted only as
a regular file the user owns, never through a link, and never with a
blocking open.

``OutputPump`` is the shepherd's side of this while the job runs: a mode
machine, "buffer" until the bound, then "relay" (a child copying the pipe
to the log as the user), "discard" (no log file, or the relay could not be
started), or "held" (out of pids: the relay's fork is retried, the pipe
not read meanwhile). ``fork_as_user`` starts every child that writes the
log: the relay, the final copy and the record's copy.
"""

import errno
import fcntl
import mmap
import os
import select
import signal
import stat
import sys
import time

try:
    from shepherd import process
    from shepherd.base import identity, records, sigs, sizes
except ImportError:  # run as a file: siblings are on sys.path
    # The same modules, found as top-level ones: mypy sees each name bound twice.
    import process  # type: ignore[no-redef]
    from base import identity, records, sigs, sizes  # type: ignore[no-redef]

CHUNK = 1 << 20          # the pipe's size, and the bytes the buffer's copy moves at a time
READ = 128 << 10         # the most read from the pipe at once, into a buffer reused for every read
HOLD_OFF = 0.02          # a trickle of output is batched: at most this often a wake-up
HELD = 0.25              # out of pids past the buffer bound: how often the relay's fork is tried again
TRICKLE = 64 << 10       # less than this moved in one wake-up counts as a trickle
STREAM = CHUNK // 2      # this much per HOLD_OFF or more is a stream: a hold-off could fill the pipe
_NO_SENDFILE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
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


class Mover:
    """Moves the job's bytes from the pipe into a file: a read into one reused buffer, then a write.

    Not splice(2): it takes a call per page the job wrote, and a job writing
    4 KiB at a time then ran at two thirds of its speed into a file (the
    1 GiB row of ``bench/run``, with the job and its reader on two CPUs);
    reads of up to READ keep up with it. Bytes read but not written (the
    write failed) are held in *left* and go first to the next destination:
    the state directory filling up loses no output on its way to the log.
    *guarded* holds SIGTERM off from each read to its write (the relay's
    "finish" raises in its handler), so a byte is never lost or written
    twice by it.
    """

    def __init__(self, guarded: bool = False):
        self.guarded = guarded
        # The buffer, made at the first output (a silent job has none); mapped, so that a job
        # writing a line now and then makes the shepherd hold the page it reads into, not READ bytes.
        self.view: memoryview | None = None
        self.left = memoryview(b"")
        self.written = 0                        # bytes written in all, partly written moves included

    def move(self, src: int, dst: int, count: int = READ) -> int:
        """Move up to *count* bytes from the non-blocking pipe *src* to *dst*; 0 at EOF.

        Raises BlockingIOError when the pipe is empty, and the write's
        OSError with what it could not write kept for the next call.
        """
        old = sigs.pthread_sigmask(sigs.SIG_BLOCK, (signal.SIGTERM,)) if self.guarded else None
        try:
            if not self.left:
                if self.view is None:
                    self.view = memoryview(mmap.mmap(-1, READ))
                n = os.readv(src, [self.view[:min(count, READ)]])
                if n == 0:
                    return 0
                self.left = self.view[:n]
            moved = 0
            while self.left:
                n = os.write(dst, self.left)
                self.left, moved, self.written = self.left[n:], moved + n, self.written + n
            return moved
        finally:
            if old is not None:
                sigs.pthread_sigmask(sigs.SIG_SETMASK, old)

    def drain(self, src: int, dst: int) -> tuple[int, bool]:
        """Move whatever the pipe holds now, without waiting for more: ``(bytes moved, reached EOF)``."""
        os.set_blocking(src, False)
        moved = 0
        while True:
            try:
                n = self.move(src, dst)
            except BlockingIOError:
                return moved, False
            if n == 0:
                return moved, True
            moved += n


class Pacer:
    """Tells a trickle of output (batch it: wait HOLD_OFF before reading again) from a stream (read on).

    A hold-off turns many small writes into one wake-up, but a job writing
    fast fills the pipe meanwhile and then waits on us (that halved the rate
    of a 1 GiB stream). So the rate is taken over windows of about HOLD_OFF:
    at STREAM bytes a window or more, the pipe is read whenever it is
    readable. A stream costs at most a hold-off or two before it is seen.
    """

    def __init__(self, now: float):
        self.since, self.bytes, self.stream = now, 0, False

    def hold(self, moved: int, now: float) -> bool:
        """After a read that moved *moved* bytes (at *now*, monotonic): wait HOLD_OFF before the next?"""
        self.bytes += moved
        elapsed = now - self.since
        if elapsed >= HOLD_OFF:
            self.stream = self.bytes * HOLD_OFF >= STREAM * elapsed
            self.since, self.bytes = now, 0
        return moved < TRICKLE and not self.stream


class Filler:
    """The relay's copy of the buffer into the first *size* bytes of the log, a chunk at a time.

    The relay writes the pipe's output after those bytes from the start, so a
    job writing fast never waits while the buffer is copied: the copy takes
    the relay's idle moments, and what is left of it the job's end. A chunk
    goes by sendfile (in the kernel, across filesystems too) at its own place
    and the log's position is put back after it, with SIGTERM (the relay's
    "finish", which writes at that position) held off meanwhile.
    """

    def __init__(self, src: int, dst: int, size: int):
        self.src, self.dst, self.size, self.done = src, dst, size, 0

    def pending(self) -> bool:
        """Is some of the buffer not in the log yet?"""
        return self.done < self.size

    def step(self) -> None:
        """Copy the next chunk."""
        want = min(CHUNK, self.size - self.done)
        old = sigs.pthread_sigmask(sigs.SIG_BLOCK, (signal.SIGTERM,))
        try:
            at = os.lseek(self.dst, 0, os.SEEK_CUR)
            os.lseek(self.dst, self.done, os.SEEK_SET)
            try:
                n = os.sendfile(self.dst, self.src, self.done, want)
            except OSError as exc:
                if exc.errno not in _NO_SENDFILE:
                    raise
                n = _pcopy(self.src, self.dst, want, self.done)
            finally:
                os.lseek(self.dst, at, os.SEEK_SET)
            if n == 0:   # the buffer is shorter than it was: cannot happen, but never loop on it
                raise OSError(errno.EIO, "the output buffer shrank while it was copied")
            self.done += n
        finally:
            sigs.pthread_sigmask(sigs.SIG_SETMASK, old)

    def finish(self) -> None:
        """Copy the rest."""
        while self.pending():
            self.step()


def _pcopy(src: int, dst: int, count: int, offset: int) -> int:
    data = os.pread(src, count, offset)
    view, at = memoryview(data), offset
    while view:
        n = os.pwrite(dst, view, at)
        view, at = view[n:], at + n
    return len(data)


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


def deliver_as_user(spec: records.LaunchSpec, buf: int, pipe_r, report: int,
                    groups: list[int] | None = None, mover: Mover | None = None) -> None:
    """In a forked child: become the user, write the buffer to the log, then relay the pipe.

    With *pipe_r* None this is the final copy. With a pipe it is the relay
    past the buffer bound: it keeps appending until the pipe's EOF, or until
    SIGTERM (the shepherd's "the job has ended") makes it take what is left
    and stop. If the log cannot be written it still drains the pipe, so the
    job is never killed by a broken pipe over it. *mover*: the shepherd's,
    whose held bytes (a write to the buffer failed) come before the pipe's.
    Never returns; the exit status and *report* (a line, on failure) say
    how it went.
    """
    state = {"relaying": False, "finish": False}

    def on_term(signum, frame):
        state["finish"] = True
        if state["relaying"]:
            raise _Finish

    sigs.set_wakeup_fd(-1)
    sigs.signal(signal.SIGTERM, on_term)
    for sig in (signal.SIGINT, signal.SIGHUP):
        sigs.signal(sig, sigs.SIG_DFL)
    sigs.pthread_sigmask(sigs.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    dest, code, dst, created = spec.output, 1, None, False
    assert dest is not None   # called only for a job with a log (the caller exits 1 if not)
    filler = None
    try:
        identity.become(spec.user, spec.uid, spec.gid, groups)
        os.umask(spec.umask & 0o777)
        dst, created = open_destination(dest)
        if pipe_r is None:
            copy_file(buf, dst)
        else:   # the relay: the pipe's part goes after the buffer's, which is copied as time allows
            filler = Filler(buf, dst, os.fstat(buf).st_size)   # (the shepherd buffers no more)
            os.lseek(dst, filler.size, os.SEEK_SET)
        code = 0
    except BaseException as exc:  # report it; the job must not notice
        _say(report, describe(dest, exc))
    if pipe_r is not None:
        ok = _relay(pipe_r, dst if code == 0 else None, filler, state, report, dest, mover)
        code = 0 if ok else 1
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


def _relay(pipe_r: int, log, filler, state: dict, report: int, dest: str, mover: Mover | None = None) -> bool:
    """The relay's loop: the pipe into *log* until EOF or "finish", then the rest of the buffer.

    *log* None (it could not be opened) or a failed write sends the rest of
    the pipe into /dev/null, so the job never dies of a broken pipe. The pipe
    is read as the :class:`Pacer` says: a stream at once, a trickle in
    batches, the buffer's copy (*filler*) taking the waits. True if the log
    got everything.
    """
    mover = mover or Mover()
    mover.guarded = True   # SIGTERM raises _Finish here: never between a read and its write
    ok = log is not None
    filler = filler if ok else None
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    sink = log if ok else null
    os.set_blocking(pipe_r, False)
    poller = select.poll()
    poller.register(pipe_r, select.POLLIN)
    pacer = Pacer(time.monotonic())

    def fail(exc: OSError) -> None:
        nonlocal ok, sink, filler
        _say(report, describe(dest, exc))
        ok, sink, filler = False, null, None   # keep taking the job's output, into nowhere

    while True:
        try:
            state["relaying"] = True
            if state["finish"]:
                raise _Finish
            while True:
                moved, eof = mover.drain(pipe_r, sink)
                if eof:
                    break
                now = time.monotonic()
                if pacer.hold(moved, now):   # a trickle: let it gather
                    until = now + HOLD_OFF
                    while filler is not None and filler.pending() and time.monotonic() < until:
                        filler.step()
                    time.sleep(max(0.0, until - time.monotonic()))
                else:   # a stream: on at once; if it stops, the buffer's copy goes on after HOLD_OFF
                    pending = filler is not None and filler.pending()
                    poller.poll(int(HOLD_OFF * 1000) + 1 if pending else None)
            state["relaying"] = False
            break
        except _Finish:
            state["relaying"] = False
            try:
                mover.drain(pipe_r, sink)
            except OSError as exc:
                if sink != null:
                    fail(exc)
            break
        except OSError as exc:
            state["relaying"] = False
            if sink == null:
                break
            fail(exc)
    if filler is not None:
        try:
            filler.finish()
        except OSError as exc:
            fail(exc)
    os.close(null)
    return ok


def _say(fd: int, line: str) -> None:
    try:
        os.write(fd, line.encode("utf-8", "surrogateescape")[:4000])
    except OSError:
        pass


def fork_as_user(fork, spec: records.LaunchSpec, src: int, pipe_r: int | None = None,
                 groups: list[int] | None = None, mover: Mover | None = None) -> tuple[int, int]:
    """Fork a child that writes *src*, then the pipe *pipe_r* if given, to ``spec.output`` as the user
    (with *groups*, the shepherd's ``identity.groups_of``, so the child makes no lookup of its own;
    and *mover*, whose bytes held from a failed write go before the pipe's).

    *fork* makes the child (the shepherd's fork, or one retried while the
    machine is out of pids); its OSError is the caller's. The child keeps
    only its descriptors and runs :func:`deliver_as_user`. Returns ``(pid,
    report)``: the read end of the pipe on which the child says why it
    failed.
    """
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = fork()
    except OSError:
        os.close(report_r)
        os.close(report_w)
        raise
    if pid == 0:
        try:
            process.keep_only(*(fd for fd in (src, pipe_r, report_w) if fd is not None))
            deliver_as_user(spec, src, pipe_r, report_w, groups, mover)
        finally:
            os._exit(1)
    os.close(report_w)
    return pid, report_r


class OutputPump:
    """The job's output on its way out of the pipe: buffer until the bound, then relay (as the user) or discard.

    The shepherd's poll loop drives it: *watch* and *unwatch* add the pipe
    to and take it from the poll set, *fork* is the shepherd's fork.
    """

    def __init__(self, spec: records.LaunchSpec, buf: int, limit: int, fork_retry: float, fork, watch, unwatch,
                 groups: list[int] | None = None):
        self.spec = spec
        self.groups = groups      # the user's, looked up once by the shepherd
        self.buf = buf            # the output buffer (<job dir>/output)
        self.limit = limit        # --max-output-buffer
        self.fork_retry = fork_retry
        self._fork = fork
        self._watch = watch
        self._unwatch = unwatch
        self.mode = "buffer"
        self.buffered = 0
        self.pipe_r: int | None = None
        self.resume_at: float | None = None   # when a pipe left unwatched (a trickle, or held) is read again
        self.sink: int | None = None
        self.relay: tuple[int, int, int] | None = None  # (pid, pidfd, report_fd) once past the bound
        self.relay_why: str | None = None      # mode "held": why the buffer bound was reached
        self.relay_give_up: float | None = None  # mode "held": when to stop retrying the relay's fork
        self.note: str | None = None           # what became of the output past the bound, for delivery.json
        self.pacer = Pacer(time.monotonic())
        self.mover = Mover()

    def start(self, pipe_r: int) -> None:
        """The job is forked: read its end of the pipe from now on."""
        self.pipe_r = pipe_r
        os.set_blocking(self.pipe_r, False)
        self._watch(self.pipe_r, self.on_output)

    def on_timer(self, now: float) -> None:
        """Past ``resume_at``: read the pipe again (and, held, try the relay's fork again)."""
        if self.resume_at is not None and now >= self.resume_at:
            self.resume_at = None
            if self.mode == "held":
                self.past_bound(self.relay_why)
            if self.pipe_r is not None and self.mode in ("buffer", "discard"):
                self._watch(self.pipe_r, self.on_output)

    def on_output(self, fd: int) -> None:
        """The pipe is readable."""
        moved, eof = self.pump()
        if eof:
            self._unwatch(fd)
        elif self.pacer.hold(moved, time.monotonic()) and self.mode in ("buffer", "discard"):
            # A trickle: wait a moment so many small writes cost one wake-up.
            self._unwatch(fd)
            self.resume_at = time.time() + HOLD_OFF

    def pump(self, budget: int | None = None):
        """Move what the pipe holds now (at most *budget* bytes); returns (bytes moved, reached EOF)."""
        moved = 0
        while self.mode in ("buffer", "discard") and (budget is None or moved < budget):
            if self.mode == "buffer":
                dst, want = self.buf, min(CHUNK, self.limit - self.buffered)
            else:
                assert self.sink is not None  # the discard mode's /dev/null
                dst, want = self.sink, CHUNK
            assert self.pipe_r is not None  # open until the relay takes it over
            written = self.mover.written
            try:
                n = self.mover.move(self.pipe_r, dst, want)
            except BlockingIOError:
                return moved, False
            except OSError as exc:
                if self.mode != "buffer":
                    return moved, False  # /dev/null refusing a write: nothing better to do
                self.buffered += self.mover.written - written   # (what it could not write, the relay writes first)
                self.past_bound(f"the state directory could not hold more ({exc.strerror})")
                continue
            if n == 0:
                return moved, True
            moved += n
            if self.mode == "buffer":
                self.buffered += n
                if self.buffered >= self.limit:
                    self.past_bound(None)
        return moved, False

    def past_bound(self, why) -> None:
        """Stop buffering: relay the rest to the log as the user, or discard it.

        Out of pids, the relay's fork is retried every HELD seconds for up to
        fork_retry (mode "held": the pipe is not read meanwhile, so the job
        waits on it), then the rest is discarded, with a note saying why.
        """
        dest = self.spec.output
        size = sizes.format_size(self.buffered)
        if dest:
            try:
                self._start_relay()
            except OSError as exc:
                now = time.time()
                if self.relay_give_up is None:
                    self.relay_give_up = now + self.fork_retry
                if records.not_now(exc) and now < self.relay_give_up:
                    assert self.pipe_r is not None  # the relay has not taken it
                    self.mode, self.relay_why = "held", why
                    self._unwatch(self.pipe_r)
                    self.resume_at = now + HELD
                    return
                why = f"{why}; " if why else ""
                why += f"the copy to {dest} could not be started ({exc.strerror or exc})"
                dest = None
        if dest:
            self.note = (f"output past the first {size} went straight to {dest}"
                         if why is None else f"{why}: output past the first {size} went straight to {dest}")
        else:
            self.sink = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            self.mode = "discard"
            self.note = (f"output past the first {size} was discarded"
                         if why is None else f"{why}: output past the first {size} was discarded")

    def _start_relay(self) -> None:
        """Fork the child that writes the buffer, then the rest of the pipe, to the log as the user."""
        assert self.pipe_r is not None  # pump calls this only while the pipe is open
        pid, report_r = fork_as_user(self._fork, self.spec, self.buf, self.pipe_r, self.groups, self.mover)
        self._unwatch(self.pipe_r)
        os.close(self.pipe_r)
        self.pipe_r = None
        self.relay = (pid, os.pidfd_open(pid), report_r)
        self.mode = "relay"

    def make_durable(self) -> None:
        """Flush the buffer to disk: called before the exit record, which makes the job's end final.

        After a power cut the daemon names a buffer that outlived its delivery as where the
        output is kept; without this it could be there but empty. Nothing to do when the job
        wrote nothing. A failure is reported and the record still written: an outcome must
        never wait on its output.
        """
        if self.buffered == 0:
            return
        try:
            os.fdatasync(self.buf)
        except OSError as exc:
            sys.stderr.write(f"hpc-batch-shepherd: job {self.spec.id}: cannot flush the output buffer ({exc})\n")

    def finish(self) -> None:
        """The job has ended: take what it wrote before it ended, and tell the relay to finish."""
        if self.mode == "held":   # one last try at the relay, then the rest is discarded
            self.resume_at, self.relay_give_up = None, time.time()
            self.past_bound(self.relay_why)
        if self.pipe_r is not None:
            self._unwatch(self.pipe_r)
            # What the job wrote before it ended; a straggler still writing does not keep us here.
            self.pump(budget=4 * CHUNK)
            if self.pipe_r is not None:   # (past the bound, the relay took it over)
                os.close(self.pipe_r)
                self.pipe_r = None
        if self.relay is not None:
            try:
                os.kill(self.relay[0], signal.SIGTERM)  # our unreaped child: "take what is left"
            except ProcessLookupError:
                pass



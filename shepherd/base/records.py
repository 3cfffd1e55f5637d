"""The job directory as an interface: the files a shepherd reads and writes.

The s6 way: an admin can understand a job with ``cat`` and ``jq``, and the
daemon learns everything it needs after a restart from these files alone.

    launch.json    spec written once by the daemon (:class:`LaunchSpec`; holds
                   the environment, so root-only); the shepherd reads it and
                   deletes it once the job is forked
    shepherd.pid   "<pid> <starttime>"; flock-held for the shepherd's life, so
                   a failed try-lock means the shepherd is alive
    control        a FIFO the shepherd reads: one command a line ("stop
                   killed", "stop timeout", "deadline T"; shepherd/control.py
                   writes and parses them); how the daemon asks for a job to
                   end without ever signalling a process itself
    status.json    the job's pid and start time, replaced atomically
    exit.json      the exit record, written once, atomically, as the job ends
    delivery.json  what became of the output log
    output         the first --max-output-buffer bytes of the job's combined
                   stdout/stderr, for attach; root-owned, readable by the
                   job's user (an ACL) and the admin group
    info.json      the job's summary for its /dev/hpc-batch entry (the daemon's)
    record.json    the reproducibility record (shepherd/record/recorder.py)

Records are root-only (0600): a job's pid, status and exit are its owner's
business, and the daemon answers for them through ``dispatch``.

Imported by the shepherd and the daemon alike, so it stays stdlib-only and
small (the shepherd's import cost is paid per job). That is also why JSON is
read and written with the C scanner and encoder behind the json module
(``_json``) rather than ``json`` itself: importing ``json`` pulls in ``re``,
which would be most of a shepherd's start-up time.
"""

import errno
import os
import stat
import time

from .jsoncodec import dumps, dumps_wire, loads
from .verdicts import VERDICTS as VERDICTS  # (where the words are kept, for those that need no more)

__all__ = ["dumps", "dumps_wire", "loads"]   # re-exported: the codec's users read it from here too


LAUNCH = "launch.json"
PIDFILE = "shepherd.pid"
CONTROL = "control"
STATUS = "status.json"
EXIT = "exit.json"
DELIVERY = "delivery.json"
OUTPUT = "output"
INFO = "info.json"
# Why a shepherd stopped a job (exit.json's "stopped", the control FIFO's "stop REASON"): dispatch
# kill (or its shepherd was killed), and --max-time. The daemon's results of the same names are these.
KILLED = "killed"
TIMEOUT = "timeout"
STOP_REASONS = (KILLED, TIMEOUT)
RECORD = "record.json"     # the reproducibility record (shepherd/record/recorder.py), root's, readable by the user

# A fork that failed with one of these may work later (out of pids, out of memory): the job
# waits and is retried, never failed. An exit record's not_started holds one of these names.
NOT_NOW_NAMES = ("EAGAIN", "ENOMEM")


def not_now(exc: OSError) -> bool:
    """True when *exc* says the machine is out of pids or memory for the moment: retry later."""
    return errno.errorcode.get(exc.errno or 0) in NOT_NOW_NAMES


def write_atomic(path: str, data: bytes, mode: int = 0o600, durable: bool = True, prepare=None,
                 tmp: str | None = None, exclusive: bool = False) -> None:
    """Replace *path* with *data* atomically; on failure the old file is untouched.

    *durable* adds the fsyncs (file, then directory) for records that must
    survive a power cut. *prepare*, if given, is called with the temporary
    file's descriptor before the rename (to set its owner or ACL), so the
    file never appears under its name with the wrong permissions. *tmp*
    names the temporary file (default ``<path>.tmp.<pid>``); *exclusive*
    creates it with O_EXCL (removing a stale one first), for a directory
    others may write in, where a planted hard link must not be truncated.
    """
    tmp = tmp or f"{path}.tmp.{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:
        os.unlink(tmp)   # left by a write that died half way (a pid is reused); unlink never follows
        fd = os.open(tmp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if prepare is not None:
                prepare(fd)
            if durable:
                fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


# Seconds this process has spent in fsync() and fdatasync() (through fsync below): the daemon's
# log of a slow turn says what share of it they took.
_synced = 0.0


def fsync(fd: int, data_only: bool = False) -> None:
    """fsync *fd* (fdatasync with *data_only*), its time counted in :func:`synced_seconds`."""
    global _synced
    t0 = time.monotonic()
    try:
        (os.fdatasync if data_only else os.fsync)(fd)
    finally:
        _synced += time.monotonic() - t0


def synced_seconds() -> float:
    """Seconds this process has spent in :func:`fsync` so far."""
    return _synced


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in *directory* durable."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(dfd)
    finally:
        os.close(dfd)


def unlink(path: str) -> None:
    """Remove *path*; one already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_json(path: str, obj, mode: int = 0o600, durable: bool = True) -> None:
    """Replace *path* atomically with *obj* as JSON (see :func:`write_atomic`)."""
    write_atomic(path, dumps(obj).encode(), mode, durable)


def read_json(path: str):
    """Return the JSON in *path*, or None if it does not exist or is torn."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return loads(_read_all(fd).decode())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _read_all(fd: int, limit: int = 16 << 20) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise ValueError("record is implausibly large")
        chunks.append(chunk)


def read_pidfile(job_dir: str):
    """Return (pid, starttime) from the shepherd's pidfile, or None."""
    try:
        with open(os.path.join(job_dir, PIDFILE), "rb") as f:
            pid, start = f.read().split()[:2]
        return int(pid), int(start)
    except (OSError, ValueError):
        return None


# -- typed records ---------------------------------------------------------------
# status.json, exit.json and delivery.json as classes both sides share. Reading
# trusts nothing: a value of the wrong type (a torn edit, an old version, a
# hand-made file) reads as absent, never as something the daemon acts on.
# Plain classes with __slots__, not dataclasses: the shepherd pays for every
# import at each job's start.

def _int(d: dict, key: str) -> int | None:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(d: dict, key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _text(d: dict, key: str) -> str | None:
    v = d.get(key)
    return v if isinstance(v, str) else None


class _Record:
    __slots__: tuple = ()
    FIELDS: tuple = ()          # what is on disk, in order

    def to_dict(self) -> dict:
        """The JSON object written to disk."""
        return {name: getattr(self, name) for name in self.FIELDS}

    def write(self, path: str, durable: bool = True) -> None:
        """Replace the record at *path* atomically (0600)."""
        write_json(path, self.to_dict(), durable=durable)


class StatusRecord(_Record):
    """status.json: the job's leader, as the shepherd forked it."""

    FIELDS = __slots__ = ("job_pid", "job_start", "started")

    def __init__(self, job_pid: int | None = None, job_start: int | None = None, started: float | None = None):
        self.job_pid, self.job_start, self.started = job_pid, job_start, started

    @classmethod
    def from_dict(cls, d: dict) -> "StatusRecord":
        return cls(_int(d, "job_pid"), _int(d, "job_start"), _num(d, "started"))


class ExitRecord(_Record):
    """exit.json: how the job ended; written once, durably, as the shepherd's last word on the job.

    ``stopped`` is ``"killed"`` or ``"timeout"`` when the shepherd stopped the
    job (the reason it was given), else None. ``old_format`` is True for a
    record from a shepherd that predates ``stopped``. ``not_started`` is the
    errno name (``"EAGAIN"``, ``"ENOMEM"``) when the shepherd could not fork
    the job at all: its command never ran, so the daemon may queue it again
    (``error`` says the same in words, for a daemon that does not know the
    field). ``verdict`` and ``record_digest`` summarise the job's record.json.
    These three are on disk only when set.
    """

    FIELDS = ("status", "ended", "code", "signal", "error", "stopped", "stop_note",
              "oom_kill", "oom_group_kill", "peak_mem", "cpu_time", "not_started", "verdict", "record_digest")
    _OPTIONAL = ("not_started", "verdict", "record_digest")   # on disk only when set
    __slots__ = (*FIELDS, "old_format")    # old_format lives in memory only
    def __init__(self, status: int | None = None, ended: float | None = None, code: int | None = None,
                 signal: int | None = None, error: str | None = None, stopped: str | None = None,
                 stop_note: str | None = None, oom_kill: int = 0, oom_group_kill: int = 0,
                 peak_mem: int | None = None, cpu_time: float | None = None):
        self.status, self.ended, self.code, self.signal = status, ended, code, signal
        self.error, self.stopped, self.stop_note = error, stopped, stop_note
        self.oom_kill, self.oom_group_kill, self.peak_mem, self.cpu_time = oom_kill, oom_group_kill, peak_mem, cpu_time
        self.not_started: str | None = None
        self.verdict: str | None = None         # the reproducibility record's verdict (clean, noisy, unknown)
        self.record_digest: str | None = None   # and its digest ("sha256:...")
        self.old_format = False

    def to_dict(self) -> dict:
        d = super().to_dict()
        for key in self._OPTIONAL:
            if d[key] is None:
                del d[key]   # the usual record stays as it always was
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ExitRecord":
        stopped = _text(d, "stopped")
        rec = cls(_int(d, "status"), _num(d, "ended"), _int(d, "code"), _int(d, "signal"), _text(d, "error"),
                  stopped if stopped in STOP_REASONS else None, _text(d, "stop_note"),
                  _int(d, "oom_kill") or 0, _int(d, "oom_group_kill") or 0, _int(d, "peak_mem"),
                  _num(d, "cpu_time"))
        rec.not_started = _text(d, "not_started")
        verdict = _text(d, "verdict")
        rec.verdict = verdict if verdict in VERDICTS else None
        rec.record_digest = _text(d, "record_digest")
        rec.old_format = "stopped" not in d
        return rec

    def outcome(self) -> tuple:
        """``(result, exit)``: the daemon's result kind and ``list --finished``'s <exit> word for this
        record, as ``Engine._result`` and ``exit_column`` make them (tests/unit/test_notifytext.py holds the
        two together); for a shepherd, which cannot ask the daemon (``--notify``)."""
        if self.error:
            return "error", "error"
        if self.oom_kill:
            return "oom", "oom"
        if self.stopped:
            return self.stopped, self.stopped
        if self.signal:
            # Imported here, not at the top: signal imports enum, and `dispatch list` imports this module.
            import signal
            try:
                return "signalled", signal.Signals(self.signal).name
            except ValueError:
                return "signalled", f"signal{self.signal}"
        return "exited", str(self.code)


class DeliveryRecord(_Record):
    """delivery.json: what became of the output; the buffer is gone only after a complete copy."""

    FIELDS = __slots__ = ("ok", "path", "error", "note")

    def __init__(self, ok: bool = True, path: str | None = None, error: str | None = None,
                 note: str | None = None):
        self.ok, self.path, self.error, self.note = ok, path, error, note

    @classmethod
    def from_dict(cls, d: dict) -> "DeliveryRecord":
        return cls(d.get("ok") is True, _text(d, "path"), _text(d, "error"), _text(d, "note"))


def _list(d: dict, key: str, kind: type) -> list | None:
    v = d.get(key)
    if isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool) for x in v):
        return v
    return None


def _dict(d: dict, key: str) -> dict | None:
    v = d.get(key)
    return v if isinstance(v, dict) else None


class LaunchSpec(_Record):
    """launch.json: everything the shepherd needs, since it can ask the daemon nothing later.

    The daemon builds one per start (``launchspec.build``) and writes it;
    the shepherd reads it back with :meth:`from_dict`. The defaults below are
    the only definition of these values: the daemon writes them into every
    spec, and a spec from an older daemon that lacks a key gets the same.
    ``record`` stays a plain dict: it is the daemon's part of the
    reproducibility record (hpc_batch/daemon/jobrecord.py), handed through
    to shepherd/record/recorder.py as it is; None with ``--records none``.
    """

    KILL_GRACE = 5.0              # seconds between SIGTERM and SIGKILL when a job is stopped
    DELIVERY_LIMIT = 600.0        # seconds the copy of the output to the user's log may take
    FORK_RETRY = 10.0             # seconds a fork failing for want of pids or memory is retried
    MAX_OUTPUT_BUFFER = 256 << 20  # the daemon's --max-output-buffer default (hpc_batch.defaults, "256M")
    UMASK = 0o077                 # a spec without the submitter's umask: the strictest

    FIELDS = __slots__ = ("id", "user", "uid", "gid", "cwd", "argv", "env", "output", "umask", "admin_gid",
                          "cpus", "cgroup", "shepherd_cgroup", "deadline", "kill_grace", "delivery_limit",
                          "max_output_buffer", "fork_retry", "aslr", "thp", "record", "notify")

    def __init__(self, *, user: str, uid: int, gid: int, cwd: str, argv: list, env: dict,
                 id: int | None = None, output: str | None = None, umask: int = UMASK,
                 admin_gid: int | None = None, cpus: list | None = None, cgroup: str | None = None,
                 shepherd_cgroup: str | None = None, deadline: float | None = None,
                 kill_grace: float = KILL_GRACE, delivery_limit: float = DELIVERY_LIMIT,
                 max_output_buffer: int = MAX_OUTPUT_BUFFER, fork_retry: float = FORK_RETRY,
                 aslr: str = "on", thp: str = "on", record: dict | None = None, notify: dict | None = None):
        self.id, self.user, self.uid, self.gid, self.cwd = id, user, uid, gid, cwd
        self.argv, self.env, self.output, self.umask, self.admin_gid = argv, env, output, umask, admin_gid
        self.cpus, self.cgroup, self.shepherd_cgroup = cpus, cgroup, shepherd_cgroup
        self.deadline, self.kill_grace, self.delivery_limit = deadline, kill_grace, delivery_limit
        self.max_output_buffer, self.fork_retry = max_output_buffer, fork_retry
        self.aslr, self.thp, self.record = aslr, thp, record
        # --notify: {"tty": bool, "command": str | None, "limit": seconds, "name": str | None}, or None
        self.notify = notify

    def replace(self, **changes) -> "LaunchSpec":
        """A copy with *changes* (e.g. another ``output`` for the record's delivery)."""
        return LaunchSpec(**{**self.to_dict(), **changes})

    @classmethod
    def from_dict(cls, d: dict) -> "LaunchSpec | None":   # type: ignore[override]
        """The spec in *d*, or None when what a job cannot run without is missing or mistyped."""
        user, uid, gid, cwd = _text(d, "user"), _int(d, "uid"), _int(d, "gid"), _text(d, "cwd")
        argv, env = _list(d, "argv", str), _dict(d, "env")
        if user is None or uid is None or gid is None or cwd is None or not argv or env is None:
            return None
        aslr, thp, grace = _text(d, "aslr"), _text(d, "thp"), _num(d, "kill_grace")
        limit, retry, umask = _num(d, "delivery_limit"), _num(d, "fork_retry"), _int(d, "umask")
        return cls(user=user, uid=uid, gid=gid, cwd=cwd, argv=argv, env=env, id=_int(d, "id"),
                   output=_text(d, "output"), umask=cls.UMASK if umask is None else umask,
                   admin_gid=_int(d, "admin_gid"), cpus=_list(d, "cpus", int), cgroup=_text(d, "cgroup"),
                   shepherd_cgroup=_text(d, "shepherd_cgroup"), deadline=_num(d, "deadline"),
                   kill_grace=cls.KILL_GRACE if grace is None else grace,
                   delivery_limit=cls.DELIVERY_LIMIT if limit is None else limit,
                   max_output_buffer=_int(d, "max_output_buffer") or cls.MAX_OUTPUT_BUFFER,
                   fork_retry=cls.FORK_RETRY if retry is None else retry,
                   aslr=aslr or "on", thp=thp or "on", record=_dict(d, "record"), notify=_dict(d, "notify"))


def read_record(path: str, kind):
    """The typed record at *path* (a StatusRecord, ExitRecord, DeliveryRecord or LaunchSpec class), or None."""
    d = read_json(path)
    return kind.from_dict(d) if isinstance(d, dict) else None

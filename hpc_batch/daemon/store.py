"""Durable state: a journal, one directory per job, and a small daemon record.

Layout under --state-dir (mode 0711: users may reach their own job entry
through /dev/hpc-batch, but cannot list anyone's)::

    daemon.lock          flock held for the daemon's life (one daemon per dir)
    journal              every job record, shared record and id floor, appended
                         and fsynced a batch at a time (see journal.py); the truth
    jobs/<id>/job.json   the job record; a cache of the journal, written without fsyncs
    shared/<id>.json     what the jobs of the submit whose first job is <id> share:
                         an --array's command (stored once, not per element) and the
                         clean environment's PATH and LANG; a cache likewise
    env/<id>             that submit's forwarded environment (--env, NAME=VALUE words),
                         root-only 0600, while any of its jobs has not started yet;
                         never in the journal, which only says that it exists
    daemon.json          the id floor and scheduler state, a cache likewise
    quarantine/          records the daemon could not act on, set aside whole
    gone/<id>            an evicted job's directory, moved here in one rename and deleted
                         by a thread of its own (what was left at a crash: at the next start)

Changes are staged (the cache file is written at once) and made durable by
:meth:`Store.commit`, which the daemon calls once per turn of its loop:
one fdatasync for every submit, start and end of that turn (plus one fsync
per environment file and one of env/ in a turn that stored some). A submit
touches only its own files and a few journal lines, so a long queue does not
make submits slower, and a bulk submit stores what its jobs share once. An
environment file goes once the last job that needs it has started and that
start is durable: dropping a secret costs an unlink, never a rewrite of the
journal. A state directory from before the journal is read from its
job.json files once, then journalled. A record that cannot be read or holds
values no daemon could act on is moved to ``quarantine/`` with a log line
saying where: it never takes the daemon down with it at every start.

Each cache also records the batch (journal commit) that makes it durable.
At start-up, a cache of a job the journal lacks is either the last batch,
cut short by a crash before it was acknowledged (dropped, named in the log),
or proof that the journal lost acknowledged batches (a damaged disk, a bad
copy): then every job the caches still hold is recovered from them, named in
the log, and the damaged journal is set aside in quarantine/.
"""

import errno
import fcntl
import json
import logging
import os
import queue
import shutil
import stat
import threading
import time
import zlib
from collections.abc import Iterable

from shepherd.records import dumps_wire, fsync_dir, write_atomic

from ..bounds import MAX_ID
from ..core.cputopo import format_cpulist
from ..core.jobs import FINISHED, QUEUED, WAITING, Job
from ..core.sizes import format_mem
from . import formats
from .journal import Compaction, Journal, JournalError, end_line, format_line, job_line, line

log = logging.getLogger("hpc-batchd")


class StateError(Exception):
    """The state directory cannot be used; the message says where and how to recover."""


class StateLocked(StateError):
    """Another daemon holds the state directory."""


def _dump(obj) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


# A job.json this daemon writes: ``{"crc":NNNNNNNNNN,"format":...`` (a CRC-32, right-aligned in ten
# places) and the rest of the record in compact JSON, whose checksum it is, then spaces up to the
# file's old length. The checksum is what lets the cache be rewritten in place (no new file per
# change of state): a rewrite cut short (a kill -9 between pages, a power cut) fails it and reads
# as no cache at all. A file in any other form (an older daemon's, one an admin edited and saved
# with other spacing) is read as it is.
_CRC_HEAD = b'{"crc":'
_CRC_BODY = len(_CRC_HEAD) + 11       # where the checksummed bytes begin (after the digits and a comma)
_BLOCK = 4096                         # a rewrite within the blocks a file holds never needs a new one


def _cache_bytes(record: bytes) -> bytes:
    """job.json's content for *record* (the job's compact JSON, as its journal line holds it)."""
    rest = b'"format":%d,' % formats.JOB + record[1:]
    return b'%s%10d,%s' % (_CRC_HEAD, zlib.crc32(rest), rest)


def _checked_cache(raw: bytes) -> bool:
    """False for a job.json in this daemon's checksummed form whose checksum fails (a torn rewrite)."""
    if not (raw.startswith(_CRC_HEAD) and raw[_CRC_BODY - 1:_CRC_BODY + 9] == b',"format":'):
        return True
    digits = raw[len(_CRC_HEAD):_CRC_BODY - 1].lstrip(b" ")
    return digits.isdigit() and zlib.crc32(raw[_CRC_BODY:].rstrip(b" ")) == int(digits)


def _check_meta(data) -> None:
    """Raise ValueError unless *data* is a usable daemon record."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    next_id = data.get("next_id", 1)
    if isinstance(next_id, bool) or not isinstance(next_id, int) or not 1 <= next_id <= MAX_ID:
        raise ValueError("next_id out of range")
    if not isinstance(data.get("policy_state", {}) or {}, dict):
        raise ValueError("policy_state is not an object")


class Shared:
    """What the jobs of one submit share, stored once: see the module docstring."""

    __slots__ = ("key", "argv", "base", "secret", "refs", "unstarted", "pending")

    def __init__(self, key: int, argv: list | None, base: dict, secret: bool, pending: bool = False):
        self.key = key              # the submit's first job id
        self.argv = argv            # an --array's command, the very list its jobs hold; None: each has its own
        self.base = base            # PATH and LANG for the clean environment
        self.secret = secret        # env/<key> holds a forwarded environment
        self.refs = 0               # live job records that refer to it
        self.unstarted = 0          # of them, jobs that have not started (they still need the environment)
        self.pending = pending      # a bulk still being stored, a slice a turn: none of it is acknowledged

    def record(self) -> dict:
        """Its journal and cache form."""
        data = {"id": self.key, "argv": self.argv, "base": self.base, "secret": self.secret}
        if self.pending:
            data["pending"] = True
        return data

    @classmethod
    def from_record(cls, data) -> "Shared":
        """Read a record (ValueError when it is not one)."""
        if not isinstance(data, dict) or isinstance(data.get("id"), bool) or not isinstance(data.get("id"), int):
            raise ValueError("not a shared record")
        argv, base = data.get("argv"), data.get("base") or {}
        if argv is not None and not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise ValueError("its argv is not a list of strings")
        if not isinstance(base, dict) or not all(isinstance(v, str) for v in base.values()):
            raise ValueError("its base environment is not text")
        return cls(data["id"], argv, base, bool(data.get("secret")), data.get("pending") is True)


class Sweeper:
    """Deletes the directories the daemon has let go of, on a thread of its own.

    Freeing a job directory's files is the costliest step of an eviction (on
    ext4, most of a millisecond a file, more with online discard); the loop
    only renames the directory into ``gone/`` and carries on. Nothing reads
    ``gone/``: what a crash leaves there is queued again at the next start.
    """

    def __init__(self, directory: str):
        self.dir = directory
        self._queue: queue.SimpleQueue[str | threading.Event] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def take(self, path: str, name: str) -> None:
        """Move *path* (a directory) here as *name* and have it deleted; deleted at once if it cannot move."""
        dest = os.path.join(self.dir, name)
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            return
        except OSError:     # (a leftover of that name: ids are never reused, but an admin may copy one)
            shutil.rmtree(path, ignore_errors=True)
            return
        self._put(dest)

    def sweep_leftovers(self) -> None:
        """Queue what an earlier daemon left in the directory."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            self._put(os.path.join(self.dir, name))

    def _put(self, path: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sweeper", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def wait(self) -> None:
        """Return once everything queued so far is deleted (for tests and a clean stop)."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(done)
            done.wait()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
            else:
                shutil.rmtree(item, ignore_errors=True)


def shared_key(job: Job) -> int:
    """The id of the submit a job came from (its first job)."""
    return job.array["first"] if job.array is not None else job.id


def _key_of_record(data: dict) -> int | None:
    array = data.get("array")
    key = array.get("first") if isinstance(array, dict) else data.get("id")
    return key if isinstance(key, int) and not isinstance(key, bool) else None


def _ranges(ids) -> str:
    """``1-3, 7`` for [1, 2, 3, 7]: a log line names every job, compactly."""
    return format_cpulist(ids, ", ")


UNSTARTED = (QUEUED, WAITING)
# The journal lines an unfinished job may still write, beyond its submit: a start, an end (or a
# stop, a change of its max time) and its drop. Each is its record without the command (format 2).
LINES_TO_COME = 3
COMPACT_SLICE = 0.005  # seconds of a commit spent on a compaction under way (the rest: next commit)


class _Compacting:
    """A compaction under way: its file, its batch number, and what is still to be read (last first)."""

    def __init__(self, file: Compaction, number: int, shared: Iterable[int], jobs: Iterable[int]):
        self.file = file
        self.number = number
        self.shared = sorted(shared, reverse=True)   # popped from the end: in id order
        self.jobs = sorted(jobs, reverse=True)


class Store:
    """The daemon's view of --state-dir."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.jobs_dir = os.path.join(self.root, "jobs")
        self.shared_dir = os.path.join(self.root, "shared")
        self.env_dir = os.path.join(self.root, "env")
        self.quarantine_dir = os.path.join(self.root, "quarantine")
        self.sweeper = Sweeper(os.path.join(self.root, "gone"))
        self._lock_fd: int | None = None
        self.notes: list = []   # what loading set aside or rebuilt, for the log
        self.journal = Journal(self.root)
        self._pending: list[tuple[int | None, bytes]] = []   # staged lines: (job id or None, line)
        self._seq = 0
        self.batch = 0                     # the last batch the journal holds durably
        self._live: set[int] = set()       # jobs the journal holds a record of
        self._owes: dict[int, int] = {}    # unfinished job -> bytes of journal lines it may still write
        self.owed = 0                      # their sum: what the disk reserve keeps for them
        self._shared: dict[int, Shared] = {}
        self._key_of: dict[int, int] = {}  # live job -> its Shared's key
        self._unstarted: set[int] = set()  # jobs with a Shared that have not started
        self._release: dict[int, Job] = {}   # of them, saved this batch: let go if started once it is durable
        self._unsynced: set[int] = set()   # env files written since the last commit, not yet fsynced
        self._fresh: set[int] = set()      # jobs submitted in the batch not yet committed (cache: renamed)
        self._torn: set[int] = set()       # jobs whose in-place cache rewrite failed half way
        self._meta: dict = {}
        self._loaded: tuple[dict, list] | None = None
        self._compacting: _Compacting | None = None

    # -- set-up -------------------------------------------------------------
    def open(self, inherited_lock: int | None = None) -> None:
        """Create the layout if needed and take the daemon lock.

        *inherited_lock* is the descriptor a reloading daemon passed across its
        re-exec: it already holds the lock, so taking it again would deadlock.
        """
        for d, mode in ((self.root, 0o711), (self.jobs_dir, 0o711), (self.shared_dir, 0o700),
                        (self.env_dir, 0o700), (self.sweeper.dir, 0o700)):
            try:
                os.makedirs(d, mode=mode, exist_ok=True)
            except OSError as exc:
                raise StateError(f"cannot create state directory {d}: {exc.strerror}") from None
            st = os.lstat(d)
            if not os.path.isdir(d) or os.path.islink(d):
                raise StateError(f"state directory {d} is not a directory")
            if st.st_uid != os.geteuid():
                raise StateError(f"state directory {d} is owned by uid {st.st_uid}, "
                                 f"not by the daemon's uid {os.geteuid()}")
            os.chmod(d, mode)
        path = os.path.join(self.root, "daemon.lock")
        if inherited_lock is not None:
            os.set_inheritable(inherited_lock, False)
            self._lock_fd = inherited_lock
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLocked(
                f"another hpc-batchd is already running on state directory {self.root} "
                f"(it holds {path}); stop it first or use a different --state-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    @property
    def lock_fd(self) -> int | None:
        """The held lock's descriptor (kept open across a re-exec on reload)."""
        return self._lock_fd

    def short_of_room(self, reserve: int) -> str | None:
        """Why submits must wait for disk space (None: there is room).

        The state filesystem keeps *reserve* bytes (--state-reserve) plus the
        journal's size free: compaction writes a snapshot no larger than the
        journal it replaces, so it can always run, and ends, evictions and
        environments that go free space until submits are taken again. On
        top, the lines every unfinished job may still journal (``owed``): a
        full disk never stops a start, an end or a cancel from being recorded.
        """
        try:
            st = os.statvfs(self.root)
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize
        need = reserve + self.journal.size + self.owed
        if free >= need:
            return None
        return (f"the state directory {self.root} has {format_mem(free)} free, less than the "
                f"{format_mem(need)} it keeps in reserve (the admin's --state-reserve of {format_mem(reserve)}, "
                f"room to compact its journal, and the {format_mem(self.owed)} the jobs already taken may "
                f"still write); nothing was queued, try again once jobs have ended")

    # -- loading ------------------------------------------------------------------
    def load_meta(self) -> dict:
        """The id floor and scheduler state (empty when the directory is new)."""
        return self._load()[0]

    def load_jobs(self) -> list:
        """Every usable job, in id order; a bad record is quarantined, not fatal."""
        return self._load()[1]

    def _load(self) -> tuple[dict, list]:
        if self._loaded is None:
            self.sweeper.sweep_leftovers()
            meta, jobs = self._read_state()
            self._meta = meta
            try:
                self._snapshot()   # from here on the journal is the truth
            except OSError as exc:
                raise StateError(f"cannot write the journal in {self.root}: {exc.strerror}") from None
            self._loaded = (meta, jobs)
        return self._loaded

    def _read_state(self) -> tuple[dict, list]:
        """Jobs and meta from the journal and the caches, each job.json brought up to date."""
        try:
            contents = self.journal.read()
        except formats.NewerFormat as exc:   # a newer daemon's truth: neither read nor replaced
            raise StateError(str(exc)) from None
        except JournalError as exc:
            self.quarantine(self.journal.path, "the journal", exc,
                            "job records are read from their job.json files instead")
            contents = None
        records: dict[int, tuple[int, dict]] = {}
        shared: dict[int, dict] = {}
        dropped: set[int] = set()
        if contents is not None:
            meta = self._replay(contents.entries, records, shared, dropped)
            self.batch = contents.batch or 0
            meta = self._checked_meta(meta, "the journal's daemon record")
        else:
            meta = self._legacy_meta()
        try:
            names = os.listdir(self.jobs_dir)
        except OSError as exc:
            raise StateError(f"cannot read {self.jobs_dir}: {exc.strerror}") from None
        caches: dict[int, dict | None] = {}
        for job_id in (int(n) for n in names if n.isdigit() and len(n) <= 20):
            try:
                caches[job_id] = self._read_cache(job_id)
            except formats.NewerFormat as exc:
                self.quarantine(self.job_dir(job_id), f"job {job_id}", exc, "that job is no longer tracked")
                records.pop(job_id, None)
        high = max((c["batch"] for c in caches.values() if c is not None and isinstance(c.get("batch"), int)),
                   default=0)
        tail = self.batch + 1
        lost = contents is not None and high > tail     # batches after the journal's last were acknowledged
        chosen: dict[int, dict] = {}
        stale: set[int] = set()
        recovered, unacked = [], []
        # A bulk stored a slice per turn that a crash cut short was never acknowledged: none of it stays.
        cut = {key for key, data in shared.items() if data.get("pending") is True}
        cut_jobs = []
        for job_id in sorted(set(caches) | set(records)):
            cached = caches.get(job_id)
            if cut:
                data = records[job_id][1] if job_id in records else cached
                if data is not None and _key_of_record(data) in cut:
                    cut_jobs.append(job_id)
                    shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
                    continue
            if job_id in records:
                seq, data = records[job_id]
                if cached is not None and isinstance(cached.get("seq"), int) and cached["seq"] >= seq:
                    chosen[job_id] = cached   # written after its last durable record (not fsynced, but there)
                    if lost and isinstance(cached.get("batch"), int) and cached["batch"] > self.batch:
                        recovered.append(job_id)
                else:
                    chosen[job_id] = data
                    stale.add(job_id)
                continue
            if job_id in dropped:          # evicted; its removal was cut short
                shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
                continue
            if cached is None:
                if os.path.exists(os.path.join(self.job_dir(job_id), "job.json")):
                    self.quarantine(self.job_dir(job_id), f"job {job_id}", "its job.json cannot be read",
                                    "that job is no longer tracked")
                else:    # a submit cut short before its first write: it was never acknowledged
                    shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
                continue
            batch = cached.get("batch")
            if contents is None:           # no journal (from before it, or set aside): the caches are all there is
                chosen[job_id] = cached
            elif not isinstance(batch, int) or (batch == tail and not lost):
                unacked.append(job_id)     # the last batch, which a crash cut short before it was acknowledged
                shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
            else:                          # its batch was acknowledged, and the journal lost it
                chosen[job_id] = cached
                recovered.append(job_id)
        if unacked:
            self.notes.append(f"dropped jobs {_ranges(unacked)}: their submit was never acknowledged "
                              f"(a crash cut the journal's last batch short)")
        for key in sorted(cut):
            del shared[key]
            _unlink(os.path.join(self.shared_dir, f"{key}.json"))
            _unlink(os.path.join(self.env_dir, str(key)))
        if cut:
            self.notes.append(f"dropped jobs {_ranges(cut_jobs) or 'none'} of bulk submits from "
                              f"{_ranges(sorted(cut))}: a stop or crash cut their storing short, before "
                              f"they were acknowledged")
        if recovered:
            self.notes.append(f"the journal lost acknowledged records (its last whole batch is {self.batch}, "
                              f"job.json files were written up to batch {high}); recovered jobs "
                              f"{_ranges(recovered)} from their job.json files")
            self._set_aside_journal()
        jobs = self._build(chosen, shared, stale)
        if stale:
            self.notes.append(f"rebuilt {len(stale)} job.json files from the journal")
        self._sweep()
        return meta, jobs

    def _replay(self, entries: list, records: dict, shared: dict, dropped: set) -> dict:
        """Fill *records* (id -> (seq, record)), *shared* and *dropped* from the journal's entries,
        in order; returns the last meta record."""
        meta: dict = {}
        for e in entries:
            self._seq = max(self._seq, e["seq"])
            if isinstance(e.get("job"), dict) and isinstance(e["job"].get("id"), int):
                data = e["job"]
                if e.get("same") == "argv" and "argv" not in data:   # a change: its command is the last line's
                    before = records.get(data["id"])
                    if before is not None and "argv" in before[1]:
                        data["argv"] = before[1]["argv"]
                records[data["id"]] = (e["seq"], data)
                dropped.discard(data["id"])
            elif isinstance(e.get("shared"), dict) and isinstance(e["shared"].get("id"), int):
                shared[e["shared"]["id"]] = e["shared"]
            elif isinstance(e.get("drop"), int):
                records.pop(e["drop"], None)
                dropped.add(e["drop"])
            elif isinstance(e.get("meta"), dict):
                meta = e["meta"]
        return meta

    def _set_aside_journal(self) -> None:
        """Keep a journal shown to have lost records for inspection; the snapshot replaces it."""
        os.makedirs(self.quarantine_dir, mode=0o700, exist_ok=True)
        dest = os.path.join(self.quarantine_dir, f"journal.{int(time.time())}")
        try:
            shutil.copyfile(self.journal.path, dest)
        except OSError as exc:
            self.notes.append(f"cannot keep a copy of the damaged journal ({exc.strerror})")
            return
        self.notes.append(f"the damaged journal was copied to {dest} for inspection")

    def _build(self, chosen: dict, shared: dict, stale: set) -> list:
        """Jobs from their chosen records: argv from their shared record, old environments moved out.

        The caches in *stale* (missing, or older than the journal) are rewritten.
        """
        jobs = []
        for job_id, data in sorted(chosen.items()):
            key = _key_of_record(data)
            sh = self._shared_for(key, shared)
            env = data.pop("env", None)
            if isinstance(env, dict):
                sh = self._migrate_env(key, data, env, sh)
            filled = "argv" not in data and sh is not None and sh.argv is not None
            if filled and sh is not None:
                data["argv"] = sh.argv     # one list, shared by every element of the bulk
            try:
                job = Job.from_dict(data)
                if job.id != job_id:
                    raise ValueError(f"record says job {job.id}")
            except (ValueError, TypeError, KeyError, RecursionError) as exc:
                self.quarantine(self.job_dir(job_id), f"job {job_id}", exc, "that job is no longer tracked")
                continue
            if job_id in stale or env is not None:
                try:
                    self._write_cache(job, {k: v for k, v in data.items() if not (filled and k == "argv")})
                except OSError as exc:
                    raise StateError(f"cannot rewrite {self.job_dir(job_id)}: {exc.strerror}") from None
            if sh is not None:
                self._refer(job, sh)
            if job.state != FINISHED:
                self._owed(job, len(dumps_wire({k: v for k, v in data.items() if k != "argv"})))
            self._live.add(job_id)
            jobs.append(job)
        return jobs

    def _shared_for(self, key: int | None, shared: dict) -> Shared | None:
        """The shared record of a submit: the journal's, else its cache (a journal that lost it)."""
        if key is None:
            return None
        if key in self._shared:
            return self._shared[key]
        data = shared.get(key)
        if data is None:
            data = self._read_json(os.path.join(self.shared_dir, f"{key}.json"))
        if data is None:
            return None
        try:
            sh = Shared.from_record(data)
        except ValueError as exc:
            self.notes.append(f"the shared record of jobs from {key} cannot be used ({exc})")
            return None
        self._shared[key] = sh
        return sh

    def _migrate_env(self, key: int | None, data: dict, env: dict, sh: Shared | None) -> Shared | None:
        """A record from before env files: its environment moves to one (only while it has not started)."""
        if data.get("state") not in UNSTARTED or key is None or sh is not None:
            return sh
        forward, job_env = env.get("forward"), env.get("job_env") or {}
        sh = Shared(key, None, dict(env.get("base") or {}), forward is not None or bool(job_env))
        self._shared[key] = sh
        try:
            if sh.secret:
                self._write_env(key, {"forward": forward, "job_env": job_env})
                self._unsynced.add(key)    # fsynced before the snapshot that drops the old lines
            self._write_shared(sh)
        except OSError as exc:
            raise StateError(f"cannot write {self.env_dir}: {exc.strerror}") from None
        return sh

    def _refer(self, job: Job, sh: Shared) -> None:
        sh.refs += 1
        self._key_of[job.id] = sh.key
        if job.state in UNSTARTED:
            sh.unstarted += 1
            self._unstarted.add(job.id)

    def _sweep(self) -> None:
        """Remove shared records nothing refers to, and environments no unstarted job needs."""
        for key in [k for k, sh in self._shared.items() if not sh.refs or (sh.argv is None and not sh.unstarted)]:
            del self._shared[key]
        for directory, suffix in ((self.shared_dir, ".json"), (self.env_dir, "")):
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                head = name[:-len(suffix)] if suffix and name.endswith(suffix) else name
                sh = self._shared.get(int(head)) if head.isdigit() and len(head) <= 20 else None
                if sh is None or (directory == self.env_dir and (not sh.secret or not sh.unstarted)) or \
                        (suffix and not name.endswith(suffix)):
                    _unlink(os.path.join(directory, name))

    def _read_cache(self, job_id: int) -> dict | None:
        """A job's job.json, less its format key (None when it cannot be read); formats.NewerFormat
        when it is in a format this daemon does not know."""
        path = os.path.join(self.job_dir(job_id), "job.json")
        data = self._read_json(path, _checked_cache)
        if data is not None:
            formats.check(data, formats.JOB, path, "job.json")
            data.pop("format", None)
            data.pop("crc", None)
        return data

    @staticmethod
    def _read_json(path: str, check=None) -> dict | None:
        """A file's JSON object; None when it cannot be read, is not one, or *check*(its bytes) fails."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
            if check is not None and not check(raw):
                return None
            data = json.loads(raw)
        except (OSError, ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) else None

    def _checked_meta(self, data, what: str) -> dict:
        try:
            _check_meta(data)
        except ValueError as exc:
            self.notes.append(f"{what} could not be used ({exc}); job ids continue after the highest one "
                              f"on disk; scheduling state starts afresh")
            return {}
        return data

    def _legacy_meta(self) -> dict:
        """Read daemon.json (empty dict when the directory is new or it had to be set aside)."""
        path = os.path.join(self.root, "daemon.json")
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
            _check_meta(data)
            return data
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            self.quarantine(path, "daemon.json", exc,
                            "job ids continue after the highest one on disk; scheduling state starts afresh")
            return {}

    # -- staging and committing -----------------------------------------------------
    def _stage(self, job_id: int | None, entry: dict) -> None:
        self._pending.append((job_id, line(entry)))

    @property
    def has_pending(self) -> bool:
        """True while staged changes wait for :meth:`commit`."""
        return bool(self._pending)

    def commit(self, now: float | None = None) -> None:
        """Make every staged change durable with one fdatasync; OSError leaves them staged.

        The environment files this batch's submits wrote are fsynced first,
        so no acknowledged submit can lose its environment. Once the batch is
        durable, the environments of jobs it started (or ended) go. The
        journal is compacted when it has grown past twice its last snapshot,
        about COMPACT_SLICE seconds of it per commit.
        """
        if self._pending:
            self._sync_env()
            self._seq += 1
            data = b"".join(data for _, data in self._pending)
            try:
                self.journal.append(data + end_line(self._seq, self.batch + 1, len(self._pending)))
            except OSError:
                # A journal that cannot take a batch cannot be compacted either; the loop must not
                # spin on a compaction it cannot go on with. It begins again once commits succeed.
                if self._compacting is not None:
                    self._compacting.file.abandon()
                    self._compacting = None
                raise
            self.batch += 1
            self._pending.clear()
        self._fresh.clear()
        for job_id, job in self._release.items():
            if job.state in UNSTARTED:     # back in the queue: a start whose record could not be written
                continue
            self._unstarted.discard(job_id)
            sh = self._shared.get(self._key_of.get(job_id, -1))
            if sh is not None:
                sh.unstarted -= 1
                self._let_go(sh)
        self._release.clear()
        if self._compacting is not None or self.journal.wants_compaction():
            try:
                self._compact(time.monotonic() + COMPACT_SLICE)
            except OSError as exc:   # the journal just grows until it can be compacted
                log.error("cannot compact the journal (%s); it will be tried again", exc)

    @property
    def compacting(self) -> bool:
        """True while a compaction is under way (each commit writes a slice of it)."""
        return self._compacting is not None

    def _sync_env(self) -> None:
        """fsync the environment files written since the last commit, then env/ (their names)."""
        if not self._unsynced:
            return
        for key in sorted(self._unsynced):
            if key not in self._shared:
                continue
            fd = os.open(os.path.join(self.env_dir, str(key)), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(self.env_dir)
        self._unsynced.clear()

    def forget(self, job_ids: set) -> None:
        """Unstage the changes of jobs a failed commit refused (they were never acknowledged)."""
        self._pending = [(j, data) for j, data in self._pending if j not in job_ids]
        self._live -= job_ids
        self._fresh -= job_ids
        for job_id in job_ids:
            self.owed -= self._owes.pop(job_id, 0)

    def _snapshot(self) -> None:
        """Replace the journal by one batch, at once (at start-up: nothing appends meanwhile)."""
        self._compact(None)

    def _compact(self, until: float | None) -> None:
        """Write the snapshot that replaces the journal, until monotonic time *until* (None: to the end).

        The snapshot is one batch: every shared record, every live job's
        record (from its cache), the meta. A compaction begun here goes on at
        the next commit; the records read for it are as new as when they were
        read, and the batches appended meanwhile follow it in the new journal.
        """
        c = self._compacting
        if c is None:
            if self._torn:   # a cache that cannot be read now would drop its job from the snapshot
                raise OSError(errno.EAGAIN,
                              f"the job.json of jobs {_ranges(sorted(self._torn))} is still to be rewritten")
            self._seq += 1
            number = self.batch + 1 if until is None else self.batch
            c = self._compacting = _Compacting(self.journal.begin(format_line(self._seq), 1), number,
                                               self._shared, self._live)
        try:
            if self._compact_slice(c, until):
                self._compacting = None
        except BaseException:
            c.file.abandon()
            self._compacting = None
            raise

    def _compact_slice(self, c: _Compacting, until: float | None) -> bool:
        """Write the next slice of *c*; True once it is the journal."""
        lines: list[bytes] = []
        done = 0
        while c.shared or c.jobs:
            done += 1
            if until is not None and done % 32 == 0 and time.monotonic() >= until:
                c.file.add(b"".join(lines), len(lines))
                return False
            if c.shared:
                key = c.shared.pop()
                if key in self._shared:
                    self._seq += 1
                    lines.append(line({"seq": self._seq, "shared": self._shared[key].record()}))
                continue
            job_id = c.jobs.pop()
            if job_id in self._torn:
                raise OSError(errno.EAGAIN, f"the job.json of job {job_id} is still to be rewritten")
            try:
                data = self._read_cache(job_id)
            except formats.NewerFormat:   # not one this daemon wrote (set aside at start-up otherwise)
                data = None
            if data is None:
                continue
            # The record keeps its own seq: a new one would make every cache look stale to the
            # next start, which would then rewrite them all.
            seq = data.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool):
                self._seq += 1
                seq = self._seq
            lines.append(line({"seq": seq, "job": data}))
        self._sync_env()
        self._seq += 1
        lines.append(line({"seq": self._seq, "meta": self._meta}))
        self._seq += 1
        lines.append(end_line(self._seq, c.number, c.file.lines + len(lines)))
        c.file.add(b"".join(lines), len(lines))
        self.journal.finish(c.file)
        self.batch = max(self.batch, c.number)
        return True

    def save_meta(self, meta: dict) -> None:
        """Stage the id floor and scheduler state (daemon.json is its readable cache)."""
        self._meta = dict(meta)
        self._seq += 1
        self._stage(None, {"seq": self._seq, "meta": self._meta})
        write_atomic(os.path.join(self.root, "daemon.json"), _dump(meta), durable=False)

    # -- jobs -----------------------------------------------------------------
    def job_dir(self, job_id: int) -> str:
        """Directory of one job."""
        return os.path.join(self.jobs_dir, str(job_id))

    def create_job_dir(self, job_id: int, gid: int | None) -> str:
        """Make the job's directory: root-owned so no user can plant entries in it.

        Not fsynced: the journal line of the job's first record is what makes
        it durable, and the loader re-creates a directory a crash lost.
        """
        d = self.job_dir(job_id)
        os.mkdir(d, 0o751)
        if os.geteuid() == 0 and gid is not None:
            os.chown(d, -1, gid)
        os.chmod(d, 0o751)
        return d

    def add_jobs(self, jobs: list, env: dict, gid: int | None, argv: list | None = None) -> None:
        """Store the jobs of one submit, staged for this turn's commit; on OSError nothing stays.

        What they share is stored once, in one shared record: *argv* when it
        is the list every job holds (an --array), and the environment, whose
        forwarded part (``forward``, ``job_env``) goes to its own root-only
        file, fsynced by the commit that acknowledges them.
        """
        sh = self.begin_bulk(jobs[0].id, env, argv, pending=False)
        self.add_slice(sh, jobs, gid)

    def begin_bulk(self, key: int, env: dict, argv: list | None, pending: bool = True) -> Shared:
        """Stage the shared record of a submit whose first job is *key*. *pending*: a bulk stored a
        slice per turn (:meth:`add_slice`), acknowledged by :meth:`end_bulk`; a start-up finds a bulk
        still pending cut short, and drops all of it. On OSError nothing stays."""
        forward, job_env = env.get("forward"), env.get("job_env") or {}
        sh = Shared(key, argv, dict(env.get("base") or {}), forward is not None or bool(job_env), pending)
        self._shared[key] = sh
        try:
            if sh.secret:
                self._write_env(key, {"forward": forward, "job_env": job_env})
                self._unsynced.add(key)
            self._write_shared(sh)
            self._seq += 1
            self._stage(key, {"seq": self._seq, "shared": sh.record()})
        except OSError:
            self._drop_shared(sh)
            raise
        return sh

    def add_slice(self, sh: Shared, jobs: list, gid: int | None) -> None:
        """Store jobs of the submit *sh* stands for, staged for this turn's commit. On OSError none
        of them stays, nor (unless it is a pending bulk's, which :meth:`abort_bulk` ends) *sh*."""
        try:
            for job in jobs:
                self.create_job_dir(job.id, gid)
                self._fresh.add(job.id)
                self._refer(job, sh)
                self.save_job(job)
        except OSError:
            ids = {job.id for job in jobs}
            self.forget(ids)
            for job_id in ids:
                self.remove_job(job_id)
            if sh.key in self._shared and not sh.pending:
                self._drop_shared(sh)
            raise

    def end_bulk(self, sh: Shared) -> None:
        """The last slice of a pending bulk is staged: its shared record, no longer pending, goes in
        the same batch, which acknowledges the whole bulk at once."""
        sh.pending = False
        self._write_shared(sh)
        self._seq += 1
        self._stage(sh.key, {"seq": self._seq, "shared": sh.record()})

    def abort_bulk(self, sh: Shared, ids: Iterable[int]) -> None:
        """Give up a pending bulk: the jobs stored of it go (drop lines where the journal holds
        them), and its shared record with them; never acknowledged, so nothing is lost."""
        ids = set(ids)
        self.forget(ids)
        for job_id in sorted(ids):
            self.remove_job(job_id)
        if sh.key in self._shared:
            self._drop_shared(sh)

    def _write_env(self, key: int, env: dict) -> None:
        write_atomic(os.path.join(self.env_dir, str(key)), _dump(env), mode=0o600, durable=False)

    def _write_shared(self, sh: Shared) -> None:
        data = sh.record()
        data["batch"] = self.batch + 1
        write_atomic(os.path.join(self.shared_dir, f"{sh.key}.json"), _dump(data), durable=False)

    def _let_go(self, sh: Shared) -> None:
        """Drop what of a shared record no job needs any more: its environment once every job has
        started, the record itself once no job holds it or, without an argv, once every job has started.

        Its journal line goes at the next compaction.
        """
        if not sh.refs or (sh.argv is None and not sh.unstarted):
            self._drop_shared(sh)
        elif not sh.unstarted:
            self._drop_env(sh)

    def _drop_env(self, sh: Shared) -> None:
        if sh.secret:
            _unlink(os.path.join(self.env_dir, str(sh.key)))
            self._unsynced.discard(sh.key)

    def _drop_shared(self, sh: Shared) -> None:
        self._drop_env(sh)
        _unlink(os.path.join(self.shared_dir, f"{sh.key}.json"))
        del self._shared[sh.key]

    def _write_cache(self, job: Job, data: dict, record: bytes | None = None) -> None:
        """Write job.json: in place over the last one when that is safe, else a new file renamed in.

        In place costs no new inode (on ext4 a create and the free of the file it replaces are
        most of a write's cost). It is safe once the job's submit is durable (a torn rewrite then
        reads as no cache, and the journal's record stands in) and while the record fits in the
        blocks the file already holds (so it cannot run out of room half way). A submit's first
        write is always renamed in: a job the journal lacks is told apart by its cache.
        """
        content = _cache_bytes(record if record is not None else dumps_wire(data).encode("ascii"))
        path = os.path.join(self.job_dir(job.id), "job.json")
        if job.id not in self._fresh and self._rewrite(job.id, path, content):
            return
        try:
            write_atomic(path, content, durable=False)
        except FileNotFoundError:   # its directory is gone (a crash lost it): the loader makes it again
            os.makedirs(self.job_dir(job.id), 0o751, exist_ok=True)
            write_atomic(path, content, durable=False)
        self._torn.discard(job.id)

    def _rewrite(self, job_id: int, path: str, content: bytes) -> bool:
        """Overwrite *path* with *content* (padded with spaces to its length); False: not done."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or \
                    len(content) > -(-st.st_size // _BLOCK) * _BLOCK:
                return False
            view = memoryview(content.ljust(st.st_size, b" "))
            self._torn.add(job_id)
            offset = 0
            while offset < len(view):
                offset += os.pwrite(fd, view[offset:], offset)
            self._torn.discard(job_id)
            return True
        except OSError:
            return False    # renamed in instead (or the write's error is raised from there)
        finally:
            os.close(fd)

    def save_job(self, job: Job, durable: bool = True) -> None:
        """Write one job's record (its cache now; its journal line staged when *durable*).

        A finished job's record may skip the journal (*durable* False): its
        shepherd's exit record is already on disk, and a lost update is
        re-collected from it. A job that started or ended lets go of its
        environment once the commit that records it is durable.
        """
        if job.id in self._unstarted:
            # Whether it started is decided at the commit, from the job as it is then: the commit
            # that makes its start durable lets its environment go, not this write.
            self._release[job.id] = job
        data = job.to_dict()
        sh = self._shared.get(self._key_of.get(job.id, -1))
        if sh is not None and sh.argv is not None and job.argv is sh.argv:
            del data["argv"]               # its submit's shared record holds it
        self._seq += 1
        data["seq"] = self._seq
        data["batch"] = self.batch + 1
        # The journal holds a job's command once: every later line of it says the command is the
        # same, so a start or a cancel of a job with a 1 MiB command costs the journal a small
        # line (the third review's G8). The cache always holds the whole record.
        argv = data.pop("argv", None) if job.id in self._live else None
        delta = dumps_wire(data).encode("ascii")    # once, for the cache and the journal line
        record = delta if argv is None else delta[:-1] + b',"argv":' + dumps_wire(argv).encode("ascii") + b"}"
        self._write_cache(job, data, record)
        self._owed(job, len(delta))
        if durable:
            self._pending.append((job.id, job_line(self._seq, delta, same_argv=argv is not None)))
            self._live.add(job.id)

    def _owed(self, job: Job, size: int) -> None:
        """Count what an unfinished job's journal lines to come may take (*size*: one of them)."""
        self.owed -= self._owes.pop(job.id, 0)
        if job.state != FINISHED:
            self._owes[job.id] = LINES_TO_COME * (size + 64)   # 64: a line's seq and keys
            self.owed += self._owes[job.id]

    def unstart(self, job: Job, env: dict) -> None:
        """A started job goes back to the queue, its command never run (out of pids): it needs an
        environment again. *env* is the one its launch spec held, stored as forwarded.

        The submit's environment may be gone already (it goes once every job has started): then
        it is written again, fsynced by the next commit. Any job's launch environment serves its
        submit: the daemon sets its own variables afresh at each start.
        """
        key = self._key_of.get(job.id, shared_key(job))
        sh = self._shared.get(key)
        if sh is None:   # let go of when every job had started: a record of its own again
            sh = self._shared[key] = Shared(key, None, {}, True)
            sh.refs = sum(1 for k in self._key_of.values() if k == key) + (job.id not in self._key_of)
            self._key_of[job.id] = key
        if not sh.unstarted and (sh.secret or sh.argv is None):
            sh.secret = True
            self._write_env(key, {"forward": env, "job_env": {}})
            self._unsynced.add(key)
            self._write_shared(sh)
            self._seq += 1
            self._stage(key, {"seq": self._seq, "shared": sh.record()})
        self._release.pop(job.id, None)
        if job.id not in self._unstarted:
            self._unstarted.add(job.id)
            sh.unstarted += 1

    def load_env(self, job: Job) -> dict:
        """A job's stored environment: ``base``, and ``forward`` and ``job_env`` while it has not started."""
        sh = self._shared.get(self._key_of.get(job.id, -1))
        if sh is None:
            return {}
        env: dict = {"base": sh.base}
        if sh.secret:
            path = os.path.join(self.env_dir, str(sh.key))
            try:
                with open(path, "rb") as f:
                    stored = json.loads(f.read())
                env.update(forward=stored.get("forward"), job_env=stored.get("job_env") or {})
            except (OSError, ValueError, RecursionError, AttributeError) as exc:
                log.error("job %d: its stored environment %s cannot be read (%s); it starts with a clean one",
                          job.id, path, getattr(exc, "strerror", None) or exc)
        return env

    def remove_job(self, job_id: int) -> None:
        """Delete a job's directory and everything in it (the sweeper's thread does), and forget its record."""
        self.sweeper.take(self.job_dir(job_id), str(job_id))
        self._release.pop(job_id, None)
        self.owed -= self._owes.pop(job_id, 0)
        sh = self._shared.get(self._key_of.pop(job_id, -1))
        if sh is not None:
            sh.refs -= 1
            if job_id in self._unstarted:
                self._unstarted.discard(job_id)
                sh.unstarted -= 1
            self._let_go(sh)
        if job_id in self._live:
            self._seq += 1
            self._stage(job_id, {"seq": self._seq, "drop": job_id})
            self._live.discard(job_id)

    def quarantine(self, path: str, what: str, why, consequence: str) -> str | None:
        """Move *path* into quarantine/ and note it; returns where it went."""
        why = getattr(why, "strerror", None) or why
        os.makedirs(self.quarantine_dir, mode=0o700, exist_ok=True)
        dest = os.path.join(self.quarantine_dir, f"{os.path.basename(path)}.{int(time.time())}")
        try:
            os.rename(path, dest)
        except OSError as exc:
            self.notes.append(f"{what} at {path} cannot be used ({why}) nor moved aside ({exc.strerror}); "
                              f"{consequence}")
            return None
        self.notes.append(f"{what} could not be used ({why}) and was moved to {dest} for inspection; "
                          f"{consequence}")
        return dest

    def highest_quarantined_id(self) -> int:
        """The largest job id among quarantined records (ids below the floor are never reused)."""
        top = 0
        try:
            names = os.listdir(self.quarantine_dir)
        except OSError:
            return 0
        for name in names:
            head = name.split(".", 1)[0]
            if head.isdigit() and len(head) <= 20:
                top = max(top, int(head))
        return top


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

def is_disk_full(exc: OSError) -> bool:
    """True for the errors a full or quota-limited disk gives."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)

"""Durable state: a journal, one directory per job, and a small daemon record.

Layout under --state-dir (mode 0711: users may reach their own job entry
through /dev/hpc-batch, but cannot list anyone's)::

    daemon.lock          flock held for the daemon's life (one daemon per dir)
    journal              every job record and id floor, appended and fsynced a
                         batch at a time (see journal.py); the truth
    jobs/<id>/job.json   the job record, and its environment while it is queued
                         (root-only, 0600: it may hold a forwarded environment);
                         a cache of the journal, written without fsyncs
    daemon.json          the id floor and scheduler state, a cache likewise
    quarantine/          records the daemon could not act on, set aside whole

Changes are staged (the cache file is written at once) and made durable by
:meth:`Store.commit`, which the daemon calls once per turn of its loop:
one fdatasync for every submit, start and end of that turn. A submit touches
only its own job's file and one journal line, so a long queue does not make
submits slower. A state directory from before the journal is read from its
job.json files once, then journalled. A record that cannot be read or holds
values no daemon could act on is moved to ``quarantine/`` with a log line
saying where: it never takes the daemon down with it at every start.
"""

import errno
import fcntl
import json
import logging
import os
import shutil
import time

from shepherd.records import write_atomic

from .bounds import MAX_ID
from .jobs import Job
from .journal import Journal, JournalError, line

log = logging.getLogger("hpc-batchd")


class StateError(Exception):
    """The state directory cannot be used; the message says where and how to recover."""


class StateLocked(StateError):
    """Another daemon holds the state directory."""


def _dump(obj) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def _check_meta(data) -> None:
    """Raise ValueError unless *data* is a usable daemon record."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    next_id = data.get("next_id", 1)
    if isinstance(next_id, bool) or not isinstance(next_id, int) or not 1 <= next_id <= MAX_ID:
        raise ValueError("next_id out of range")
    if not isinstance(data.get("policy_state", {}) or {}, dict):
        raise ValueError("policy_state is not an object")


class Store:
    """The daemon's view of --state-dir."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.jobs_dir = os.path.join(self.root, "jobs")
        self.quarantine_dir = os.path.join(self.root, "quarantine")
        self._lock_fd: int | None = None
        self.notes: list = []   # what loading set aside or rebuilt, for the log
        self.journal = Journal(self.root)
        self._pending: list[tuple[int | None, bytes]] = []   # staged lines: (job id or None, line)
        self._seq = 0
        self._live: set[int] = set()       # jobs the journal holds a record of
        # A forwarded environment (--env) or NAME=VALUE words may hold secrets: they are dropped from
        # the state dir once the job starts, so the journal line that carried them must go too.
        self._secrets: set[int] = set()    # jobs whose journal lines carry such an environment
        self._scrub_at: float | None = None   # when the journal is to be compacted to drop them
        self._last_scrub = 0.0
        self._meta: dict = {}
        self._loaded: tuple[dict, list] | None = None

    # -- set-up -------------------------------------------------------------
    def open(self, inherited_lock: int | None = None) -> None:
        """Create the layout if needed and take the daemon lock.

        *inherited_lock* is the descriptor a reloading daemon passed across its
        re-exec: it already holds the lock, so taking it again would deadlock.
        """
        for d in (self.root, self.jobs_dir):
            try:
                os.makedirs(d, mode=0o711, exist_ok=True)
            except OSError as exc:
                raise StateError(f"cannot create state directory {d}: {exc.strerror}") from None
            st = os.lstat(d)
            if not os.path.isdir(d) or os.path.islink(d):
                raise StateError(f"state directory {d} is not a directory")
            if st.st_uid != os.geteuid():
                raise StateError(f"state directory {d} is owned by uid {st.st_uid}, "
                                 f"not by the daemon's uid {os.geteuid()}")
            os.chmod(d, 0o711)
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

    # -- loading ------------------------------------------------------------------
    def load_meta(self) -> dict:
        """The id floor and scheduler state (empty when the directory is new)."""
        return self._load()[0]

    def load_jobs(self) -> list:
        """Every usable job, in id order; a bad record is quarantined, not fatal."""
        return self._load()[1]

    def _load(self) -> tuple[dict, list]:
        if self._loaded is None:
            try:
                entries, exists = self.journal.read()
            except JournalError as exc:
                self.quarantine(self.journal.path, "the journal", exc,
                                "job records are read from their job.json files instead")
                entries, exists = [], False
            if exists:
                meta, jobs = self._replay(entries)
            else:
                meta, jobs = self._legacy_meta(), self._legacy_jobs()
            self._meta = meta
            try:
                self._snapshot([j.id for j in jobs])   # from here on the journal is the truth
            except OSError as exc:
                raise StateError(f"cannot write the journal in {self.root}: {exc.strerror}") from None
            self._loaded = (meta, jobs)
        return self._loaded

    def _replay(self, entries: list) -> tuple[dict, list]:
        """Jobs and meta as the journal has them, the job.json caches brought up to date."""
        records: dict[int, tuple[int, dict]] = {}
        meta: dict = {}
        for e in entries:
            self._seq = max(self._seq, e["seq"])
            if isinstance(e.get("job"), dict) and isinstance(e["job"].get("id"), int):
                records[e["job"]["id"]] = (e["seq"], e["job"])
            elif isinstance(e.get("drop"), int):
                records.pop(e["drop"], None)
            elif isinstance(e.get("meta"), dict):
                meta = e["meta"]
        meta = self._checked_meta(meta, "the journal's daemon record")
        try:
            names = os.listdir(self.jobs_dir)
        except OSError as exc:
            raise StateError(f"cannot read {self.jobs_dir}: {exc.strerror}") from None
        stale = [n for n in names if n.isdigit() and len(n) <= 20 and int(n) not in records]
        for name in stale:   # evicted, or a submit never acknowledged: the journal has no record of it
            shutil.rmtree(os.path.join(self.jobs_dir, name), ignore_errors=True)
        rebuilt, jobs = 0, []
        for job_id, (seq, data) in sorted(records.items()):
            cached = self._read_cache(job_id)
            if cached is not None and isinstance(cached.get("seq"), int) and cached["seq"] >= seq:
                data = cached          # written after its last durable record (not fsynced, but there)
            else:
                try:
                    os.makedirs(self.job_dir(job_id), 0o751, exist_ok=True)
                    write_atomic(os.path.join(self.job_dir(job_id), "job.json"), _dump(data), durable=False)
                except OSError as exc:
                    raise StateError(f"cannot rewrite {self.job_dir(job_id)}: {exc.strerror}") from None
                rebuilt += 1
            try:
                job = Job.from_dict(data)
                if job.id != job_id:
                    raise ValueError(f"record says job {job.id}")
            except (ValueError, TypeError, KeyError, RecursionError) as exc:
                self.quarantine(self.job_dir(job_id), f"job {job_id}", exc, "that job is no longer tracked")
                continue
            jobs.append(job)
        if rebuilt:
            self.notes.append(f"rebuilt {rebuilt} job.json files from the journal")
        return meta, jobs

    def _read_cache(self, job_id: int) -> dict | None:
        try:
            with open(os.path.join(self.job_dir(job_id), "job.json"), "rb") as f:
                data = json.loads(f.read())
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

        Also compacts the journal when it has grown, or when a started job's
        environment is still in it (at once, then at most once a second).
        """
        if self._pending:
            self.journal.append(b"".join(data for _, data in self._pending))
            self._pending.clear()
        now = time.time() if now is None else now
        scrub = self._scrub_at is not None and now >= self._scrub_at
        if scrub or self.journal.wants_compaction():
            try:
                self._snapshot(sorted(self._live))
                self._last_scrub, self._scrub_at = now, None
            except OSError as exc:   # the journal just grows until it can be compacted
                log.error("cannot compact the journal (%s); it will be tried again", exc)
                if scrub:
                    self._scrub_at = now + 1.0

    @property
    def compact_due(self) -> float | None:
        """When a commit should run to drop started jobs' environments from the journal (None: no need)."""
        return self._scrub_at

    def forget(self, job_ids: set) -> None:
        """Unstage the changes of jobs a failed commit refused (they were never acknowledged)."""
        self._pending = [(j, data) for j, data in self._pending if j not in job_ids]
        self._live -= job_ids

    def _snapshot(self, job_ids: list) -> None:
        """Replace the journal by one record per live job (from its cache) and the meta."""
        lines = []
        live = set()
        for job_id in job_ids:
            data = self._read_cache(job_id)
            if data is None:
                continue
            self._seq += 1
            lines.append(line({"seq": self._seq, "job": data}))
            live.add(job_id)
        self._seq += 1
        lines.append(line({"seq": self._seq, "meta": self._meta}))
        self.journal.replace(b"".join(lines))
        self._live = live
        self._secrets &= live

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

    def create_job_dir(self, job_id: int, gid: int) -> str:
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

    def save_job(self, job: Job, env: dict | None = None, durable: bool = True) -> None:
        """Write one job's record (its cache now; its journal line staged when *durable*).

        Saving without *env* is how the environment is dropped once the job
        has started: the record is rewritten without it. A finished job's
        record may skip the journal (*durable* False): its shepherd's exit
        record is already on disk, and a lost update is re-collected from it.
        """
        data = job.to_dict()
        if env is not None:
            data["env"] = env
        self._seq += 1
        data["seq"] = self._seq
        write_atomic(os.path.join(self.job_dir(job.id), "job.json"), _dump(data), durable=False)
        if durable:
            self._stage(job.id, {"seq": self._seq, "job": data})
            self._live.add(job.id)
            if env is not None and (env.get("forward") or env.get("job_env")):
                self._secrets.add(job.id)
            elif env is None and job.id in self._secrets:
                self._secrets.discard(job.id)   # its environment is gone from its record: from the journal too
                if self._scrub_at is None:
                    self._scrub_at = max(time.time(), self._last_scrub + 1.0)

    def load_env(self, job_id: int) -> dict:
        """Read a queued job's stored environment (empty if none is stored)."""
        with open(os.path.join(self.job_dir(job_id), "job.json"), "rb") as f:
            return json.loads(f.read()).get("env") or {}

    def remove_job(self, job_id: int) -> None:
        """Delete a job's directory and everything in it, and forget its record."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
        if job_id in self._live:
            self._seq += 1
            self._stage(job_id, {"seq": self._seq, "drop": job_id})
            self._live.discard(job_id)

    def _legacy_jobs(self) -> list:
        """Every readable job.json (a state directory from before the journal), in id order."""
        jobs = []
        try:
            names = os.listdir(self.jobs_dir)
        except OSError as exc:
            raise StateError(f"cannot read {self.jobs_dir}: {exc.strerror}") from None
        for name in names:
            if not name.isdigit() or len(name) > 20:
                continue
            path = os.path.join(self.jobs_dir, name, "job.json")
            try:
                with open(path, "rb") as f:
                    data = json.loads(f.read())
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
                job = Job.from_dict(data)
                if job.id != int(name):
                    raise ValueError(f"record says job {job.id}")
            except FileNotFoundError:
                # A crash between mkdir and the first write: nothing was accepted.
                self.remove_job(int(name))
                continue
            except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
                self.quarantine(os.path.join(self.jobs_dir, name), f"job {name}", exc,
                                "that job is no longer tracked")
                continue
            jobs.append(job)
        jobs.sort(key=lambda j: j.id)
        return jobs

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

def is_disk_full(exc: OSError) -> bool:
    """True for the errors a full or quota-limited disk gives."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)

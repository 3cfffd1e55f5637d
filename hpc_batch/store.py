"""Durable state: one directory per job plus a small daemon record.

Layout under --state-dir (mode 0711: users may reach their own job entry
through /dev/hpc-batch, but cannot list anyone's)::

    daemon.lock          flock held for the daemon's life (one daemon per dir)
    daemon.json          id floor and scheduler policy state
    jobs/<id>/job.json   the job record, and its environment while it is queued
                         (root-only, 0600: it may hold a forwarded environment)
    arrays/<id>.json     a bulk submit's every job (--array, --commands), written
                         once, durably, in place of a fsync per job; removed
                         once each of its jobs has a durable record of its own

    quarantine/          records the daemon could not act on, set aside whole

A submit writes only its own job's file, so a long queue does not make
submits slower. Every write is temp + fsync + rename + fsync(dir), so a crash
at any point leaves either the old or the new file, never a torn one. A
record that cannot be read or holds values no daemon could act on is moved
to ``quarantine/`` with a log line saying where: it is never silently
replaced, and never takes the daemon down with it at every start.
"""

import errno
import fcntl
import json
import os
import shutil
import time

from shepherd.records import fsync_dir, write_atomic

from .bounds import MAX_ID
from .jobs import Job


class StateError(Exception):
    """The state directory cannot be used; the message says where and how to recover."""


class StateLocked(StateError):
    """Another daemon holds the state directory."""


def _dump(obj) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


class Store:
    """The daemon's view of --state-dir."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.jobs_dir = os.path.join(self.root, "jobs")
        self.quarantine_dir = os.path.join(self.root, "quarantine")
        self._lock_fd: int | None = None
        self.arrays_dir = os.path.join(self.root, "arrays")
        self.notes: list = []   # what loading set aside, for the log
        self.arrays: dict[int, list[int]] = {}   # array records found by load_jobs: first id -> job ids
        self.restored: list[int] = []            # jobs load_jobs rebuilt from an array record

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

    # -- daemon record --------------------------------------------------------
    def load_meta(self) -> dict:
        """Read daemon.json (empty dict when the directory is new or it had to be set aside)."""
        path = os.path.join(self.root, "daemon.json")
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            next_id = data.get("next_id", 1)
            if isinstance(next_id, bool) or not isinstance(next_id, int) or not 1 <= next_id <= MAX_ID:
                raise ValueError("next_id out of range")
            if not isinstance(data.get("policy_state", {}) or {}, dict):
                raise ValueError("policy_state is not an object")
            return data
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            self.quarantine(path, "daemon.json", exc,
                            "job ids continue after the highest one on disk; scheduling state starts afresh")
            return {}

    def save_meta(self, meta: dict) -> None:
        """Persist daemon.json durably."""
        write_atomic(os.path.join(self.root, "daemon.json"), _dump(meta))

    # -- jobs -----------------------------------------------------------------
    def job_dir(self, job_id: int) -> str:
        """Directory of one job."""
        return os.path.join(self.jobs_dir, str(job_id))

    def create_job_dir(self, job_id: int, gid: int, durable: bool = True) -> str:
        """Make the job's directory: root-owned so no user can plant entries in it."""
        d = self.job_dir(job_id)
        os.mkdir(d, 0o751)
        if os.geteuid() == 0 and gid is not None:
            os.chown(d, -1, gid)
        os.chmod(d, 0o751)
        if durable:
            fsync_dir(self.jobs_dir)
        return d

    def save_array(self, first: int, entries: list) -> None:
        """Durably record a bulk submit: every job's record with its environment, in one file."""
        if not os.path.isdir(self.arrays_dir):
            os.makedirs(self.arrays_dir, mode=0o700, exist_ok=True)
            fsync_dir(self.root)
        write_atomic(os.path.join(self.arrays_dir, f"{first}.json"), _dump({"jobs": entries}))

    def remove_array(self, first: int) -> None:
        """Drop an array record once every job in it has a durable record of its own."""
        try:
            os.unlink(os.path.join(self.arrays_dir, f"{first}.json"))
        except FileNotFoundError:
            return
        fsync_dir(self.arrays_dir)   # a resurrected record would bring back evicted jobs

    def save_job(self, job: Job, env: dict | None = None, durable: bool = True) -> None:
        """Persist one job record, with its environment while queued.

        Saving without *env* is how the environment is dropped once the job
        has started: the record is rewritten without it. A finished job's
        record may skip the fsyncs (*durable* False): its shepherd's exit
        record is already on disk, and a lost update is re-collected from it.
        """
        data = job.to_dict()
        if env is not None:
            data["env"] = env
        write_atomic(os.path.join(self.job_dir(job.id), "job.json"), _dump(data), durable=durable)

    def load_env(self, job_id: int) -> dict:
        """Read a queued job's stored environment (empty if none is stored)."""
        with open(os.path.join(self.job_dir(job_id), "job.json"), "rb") as f:
            return json.loads(f.read()).get("env") or {}

    def remove_job(self, job_id: int) -> None:
        """Delete a job's directory and everything in it."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def load_jobs(self) -> list:
        """Every readable job on disk, in id order; a bad record is quarantined, not fatal."""
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
        jobs += self._restore_from_arrays({j.id for j in jobs})
        jobs.sort(key=lambda j: j.id)
        return jobs

    def _restore_from_arrays(self, loaded: set) -> list:
        """Jobs of array records whose own record a crash lost: rewritten from the array record."""
        restored = []
        try:
            names = sorted(os.listdir(self.arrays_dir))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StateError(f"cannot read {self.arrays_dir}: {exc.strerror}") from None
        for name in names:
            head = name.removesuffix(".json")
            if not head.isdigit() or len(head) > 20 or not name.endswith(".json"):
                continue
            path = os.path.join(self.arrays_dir, name)
            try:
                with open(path, "rb") as f:
                    entries = json.loads(f.read())["jobs"]
                members = []
                for entry in entries:
                    job = Job.from_dict(entry)
                    members.append(job.id)
                    if job.id in loaded or os.path.exists(self.job_dir(job.id)):
                        continue
                    os.mkdir(self.job_dir(job.id), 0o751)
                    write_atomic(os.path.join(self.job_dir(job.id), "job.json"), _dump(entry), durable=False)
                    restored.append(job)
                    loaded.add(job.id)
                    self.restored.append(job.id)
            except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
                self.quarantine(path, f"array record {name}", exc, "its jobs that lost their own records are gone")
                continue
            self.arrays[int(head)] = members
        return restored

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

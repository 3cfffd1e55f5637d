"""Durable state: one directory per job plus a small daemon record.

Layout under --state-dir (mode 0711: users may reach their own job entry
through /dev/hpc-batch, but cannot list anyone's)::

    daemon.lock          flock held for the daemon's life (one daemon per dir)
    daemon.json          id floor and scheduler policy state
    jobs/<id>/job.json   the job record, and its environment while it is queued
                         (root-only, 0600: it may hold a forwarded environment)

A submit writes only its own job's file, so a long queue does not make
submits slower. Every write is temp + fsync + rename + fsync(dir), so a crash
at any point leaves either the old or the new file, never a torn one. A file
that cannot be read stops the daemon with its path rather than being
replaced by an empty queue.
"""

import errno
import fcntl
import json
import os
import shutil

from .jobs import Job


class StateError(Exception):
    """The state directory cannot be used; the message says where and how to recover."""


class StateLocked(StateError):
    """Another daemon holds the state directory."""


def write_atomic(path: str, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Replace *path* with *data* (durably unless told not to); on failure the old file is untouched."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
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
        fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in *directory* durable."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _dump(obj) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


class Store:
    """The daemon's view of --state-dir."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.jobs_dir = os.path.join(self.root, "jobs")
        self._lock_fd = None

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
                raise StateError(f"state directory {d} is owned by uid {st.st_uid}, not by the daemon's uid {os.geteuid()}")
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
    def lock_fd(self):
        """The held lock's descriptor (kept open across a re-exec on reload)."""
        return self._lock_fd

    # -- daemon record --------------------------------------------------------
    def load_meta(self) -> dict:
        """Read daemon.json (empty dict when the directory is new)."""
        path = os.path.join(self.root, "daemon.json")
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StateError(self._corrupt(path, exc)) from None
        if not isinstance(data, dict):
            raise StateError(self._corrupt(path, "not a JSON object"))
        return data

    def save_meta(self, meta: dict) -> None:
        """Persist daemon.json durably."""
        write_atomic(os.path.join(self.root, "daemon.json"), _dump(meta))

    # -- jobs -----------------------------------------------------------------
    def job_dir(self, job_id: int) -> str:
        """Directory of one job."""
        return os.path.join(self.jobs_dir, str(job_id))

    def create_job_dir(self, job_id: int, gid: int) -> str:
        """Make the job's directory: root-owned so no user can plant entries in it."""
        d = self.job_dir(job_id)
        os.mkdir(d, 0o751)
        if os.geteuid() == 0 and gid is not None:
            os.chown(d, -1, gid)
        os.chmod(d, 0o751)
        fsync_dir(self.jobs_dir)
        return d

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
        """Every job on disk, in id order; an unreadable record stops the daemon."""
        jobs = []
        try:
            names = os.listdir(self.jobs_dir)
        except OSError as exc:
            raise StateError(f"cannot read {self.jobs_dir}: {exc.strerror}") from None
        for name in names:
            if not name.isdigit():
                continue
            path = os.path.join(self.jobs_dir, name, "job.json")
            try:
                with open(path, "rb") as f:
                    data = json.loads(f.read())
                job = Job.from_dict(data)
                if job.id != int(name):
                    raise ValueError(f"record says job {job.id}")
            except FileNotFoundError:
                # A crash between mkdir and the first write: nothing was accepted.
                self.remove_job(int(name))
                continue
            except (OSError, ValueError, TypeError) as exc:
                raise StateError(self._corrupt(path, exc)) from None
            jobs.append(job)
        jobs.sort(key=lambda j: j.id)
        return jobs

    @staticmethod
    def _corrupt(path: str, exc) -> str:
        why = exc if isinstance(exc, str) else (getattr(exc, "strerror", None) or exc)
        return (f"state file {path} cannot be read ({why}); refusing to start rather than "
                f"forget the jobs it holds. Inspect or repair it, or move it aside "
                f"(e.g. mv {path} {path}.broken) to drop that record, then start again")


def is_disk_full(exc: OSError) -> bool:
    """True for the errors a full or quota-limited disk gives."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)

"""What the jobs of one submit share (shared/<id>.json) and their forwarded environment (env/<id>).

A submit's shared record holds an --array's command once and the clean
environment's PATH and LANG; its environment file, root-only, holds what
--env forwarded. This room owns those files' life: written at the submit,
fsynced by the commit that acknowledges it (store.py). The environment
file goes once the last job that needs it has started and that start is
durable (the README: a forwarded environment is dropped once the job
starts); the shared record, with the clean environment's PATH and LANG,
once the last job has ended. So a job with a clean environment can always
be started again from the store, and its launch spec need not be flushed
(launcher.write_launch); one with a forwarded environment has only its
flushed launch spec once it has started.
"""

import json
import logging
import os

from shepherd.base.records import fsync, fsync_dir, write_atomic

from ..core.jobs import FINISHED, QUEUED, WAITING, Job
from .statefiles import dump, unlink

log = logging.getLogger("hpc-batchd")

UNSTARTED = (QUEUED, WAITING)


class Shared:
    """What the jobs of one submit share, stored once: see the module docstring."""

    __slots__ = ("key", "argv", "base", "secret", "refs", "unstarted", "unended", "pending")

    def __init__(self, key: int, argv: list | None, base: dict, secret: bool, pending: bool = False):
        self.key = key              # the submit's first job id
        self.argv = argv            # an --array's command, the very list its jobs hold; None: each has its own
        self.base = base            # PATH and LANG for the clean environment
        self.secret = secret        # env/<key> holds a forwarded environment
        self.refs = 0               # live job records that refer to it
        self.unstarted = 0          # of them, jobs that have not started (they still need the environment file)
        self.unended = 0            # of them, jobs that have not ended (they still need the record)
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


def shared_key(job: Job) -> int:
    """The id of the submit a job came from (its first job)."""
    return job.array["first"] if job.array is not None else job.id


def key_of_record(data: dict) -> int | None:
    """The key of the submit a job record came from (None when the record says none)."""
    array = data.get("array")
    key = array.get("first") if isinstance(array, dict) else data.get("id")
    return key if isinstance(key, int) and not isinstance(key, bool) else None


class SharedRecords:
    """The shared records of the live submits and their environment files."""

    def __init__(self, shared_dir: str, env_dir: str):
        self.shared_dir = shared_dir
        self.env_dir = env_dir
        self.records: dict[int, Shared] = {}
        self.key_of: dict[int, int] = {}   # live job -> its Shared's key
        self.unstarted: set[int] = set()   # jobs with a Shared that have not started
        self.unended: set[int] = set()     # jobs with a Shared that have not ended (holds unstarted)
        # Of them, saved this batch (with the state saved): let go of what a start or an end no
        # longer needs once the batch is durable.
        self.release: dict[int, tuple[Job, str]] = {}
        self.unsynced: set[int] = set()    # env files written since the last commit, not yet fsynced

    def write_env(self, key: int, env: dict) -> None:
        """Write env/<key> (root-only; fsynced by the next commit, :meth:`sync`)."""
        write_atomic(os.path.join(self.env_dir, str(key)), dump(env), mode=0o600, durable=False)

    def write_shared(self, sh: Shared, batch: int) -> None:
        """Write *sh*'s cache file, saying the *batch* that makes it durable."""
        data = sh.record()
        data["batch"] = batch
        write_atomic(os.path.join(self.shared_dir, f"{sh.key}.json"), dump(data), durable=False)

    def let_go(self, sh: Shared) -> None:
        """Drop what of a shared record no job needs any more: its environment once every job has
        started, the record itself once no job holds it or, without an argv, once every job has ended.

        Its journal line goes at the next compaction.
        """
        if not sh.refs or (sh.argv is None and not sh.unended):
            self.drop_shared(sh)
        elif not sh.unstarted:
            self.drop_env(sh)

    def drop_env(self, sh: Shared) -> None:
        """Remove *sh*'s environment file."""
        if sh.secret:
            unlink(os.path.join(self.env_dir, str(sh.key)))
            self.unsynced.discard(sh.key)

    def drop_shared(self, sh: Shared) -> None:
        """Remove *sh*'s files and forget it."""
        self.drop_env(sh)
        unlink(os.path.join(self.shared_dir, f"{sh.key}.json"))
        del self.records[sh.key]

    def refer(self, job: Job, sh: Shared) -> None:
        """Count *job* among the jobs that hold *sh*."""
        sh.refs += 1
        self.key_of[job.id] = sh.key
        if job.state in UNSTARTED:
            sh.unstarted += 1
            self.unstarted.add(job.id)
        if job.state != FINISHED:
            sh.unended += 1
            self.unended.add(job.id)

    def sweep(self) -> None:
        """Remove shared records nothing refers to, and environments no unstarted job needs."""
        for key in [k for k, sh in self.records.items() if not sh.refs or (sh.argv is None and not sh.unended)]:
            del self.records[key]
        for directory, suffix in ((self.shared_dir, ".json"), (self.env_dir, "")):
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                head = name[:-len(suffix)] if suffix and name.endswith(suffix) else name
                sh = self.records.get(int(head)) if head.isdigit() and len(head) <= 20 else None
                if sh is None or (directory == self.env_dir and (not sh.secret or not sh.unstarted)) or \
                        (suffix and not name.endswith(suffix)):
                    unlink(os.path.join(directory, name))

    def sync(self) -> None:
        """fsync the environment files written since the last commit, then env/ (their names)."""
        if not self.unsynced:
            return
        for key in sorted(self.unsynced):
            if key not in self.records:
                continue
            fd = os.open(os.path.join(self.env_dir, str(key)), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(self.env_dir)
        self.unsynced.clear()

    def load_env(self, job: Job) -> dict:
        """A job's stored environment: ``base``, and ``forward`` and ``job_env`` while it has not started."""
        sh = self.records.get(self.key_of.get(job.id, -1))
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

    def release_done(self) -> None:
        """Once a batch is durable: let go of what the jobs it started or ended no longer need."""
        for job_id, (job, saved) in self.release.items():
            # Not started after all (a start whose record could not be written), or started since
            # this batch saved it unstarted (the start's own record is in a later batch).
            started = job.state not in UNSTARTED and saved not in UNSTARTED and job_id in self.unstarted
            ended = job.state == FINISHED and saved == FINISHED and job_id in self.unended
            if not (started or ended):
                continue
            sh = self.records.get(self.key_of.get(job_id, -1))
            if started:
                self.unstarted.discard(job_id)
            if ended:
                self.unended.discard(job_id)
            if sh is not None:
                sh.unstarted -= started
                sh.unended -= ended
                self.let_go(sh)
        self.release.clear()

    def forget_job(self, job_id: int) -> None:
        """A job's record is gone: it no longer holds its submit's shared record."""
        self.release.pop(job_id, None)
        sh = self.records.get(self.key_of.pop(job_id, -1))
        if sh is not None:
            sh.refs -= 1
            if job_id in self.unstarted:
                self.unstarted.discard(job_id)
                sh.unstarted -= 1
            if job_id in self.unended:
                self.unended.discard(job_id)
                sh.unended -= 1
            self.let_go(sh)

"""Durable state: a journal, one directory per job, and a small daemon record.

Layout under --state-dir (mode 0711: users may reach their own job entry
through /dev/hpc-batch, but cannot list anyone's)::

    daemon.lock          flock held for the daemon's life (one daemon per dir)
    journal              every job record, shared record and id floor, appended
                         and fsynced a batch at a time (see journal.py); the truth
    jobs/<id>/job.json   the job record; a cache of the journal, written without fsyncs
                         (jobs/ is chattr +T where it can be: statefiles.spread_subdirectories)
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

The rooms, each owning one part, behind this facade (the only one the engine talks to):
stateload.py (loading and recovery at start-up), commit.py (staged lines and batches),
compaction.py (the snapshot that replaces the journal), jobcache.py (job.json),
envfiles.py (shared records and environment files), quarantine.py (quarantine/).
"""

import errno
import fcntl
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterable

from shepherd.base.records import INFO, LAUNCH, OUTPUT, dumps_wire, write_atomic

from ..core.jobs import Job
from ..core.sizes import format_mem
from .commit import Staging
from .compaction import Compactor
from .envfiles import Shared, SharedRecords, shared_key
from .jobcache import JobCache
from .journal import Journal, job_line
from .quarantine import Quarantine
from .statefiles import dump, spread_subdirectories
from .stateload import StateError, StateLoader, StateLocked

log = logging.getLogger("hpc-batchd")


LOCK_WAIT = 5.0   # seconds a start waits for the state's lock: a reload's old image may still be committing


def _lock_within(fd: int, seconds: float) -> bool:
    """Take the exclusive lock on *fd*, waiting up to *seconds* for a holder on its way out.

    A reload's old image (handoff.py) commits its last turn after the new
    image is gone, when a restart or a ``kill -9`` cut the reload short; a
    daemon started then would otherwise refuse, and under systemd stay down.
    """
    until = time.monotonic() + seconds
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= until:
                return False
            if not said:
                log.info("the state directory is locked; waiting up to %.0fs for its holder to let go", seconds)
                said = True
            time.sleep(0.05)


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
        self.staging = Staging(self.journal)
        self.cache = JobCache(self.jobs_dir)
        self.envs = SharedRecords(self.shared_dir, self.env_dir)
        self.quarantine = Quarantine(self.quarantine_dir, self.notes)
        self.compactor = Compactor(self.staging, self.cache, self.envs)
        self._loaded: tuple[dict, list] | None = None
        self._sweep_after_commit: set[int] = set()   # jobs dropped by the next commit (remove_job)

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
        spread_subdirectories(self.jobs_dir)   # a hint to ext4's allocator (statefiles.py says why)
        path = os.path.join(self.root, "daemon.lock")
        if inherited_lock is not None:
            os.set_inheritable(inherited_lock, False)
            self._lock_fd = inherited_lock
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if not _lock_within(fd, LOCK_WAIT):
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
            meta, jobs = StateLoader(self.root, self.staging, self.cache, self.envs, self.quarantine,
                                     self.notes).read()
            self.staging.meta = meta
            try:
                self._snapshot()   # from here on the journal is the truth
            except OSError as exc:
                raise StateError(f"cannot write the journal in {self.root}: {exc.strerror}") from None
            self._loaded = (meta, jobs)
        return self._loaded

    @property
    def owed(self) -> int:
        """Bytes of journal lines the unfinished jobs may still write (the disk reserve keeps them)."""
        return self.staging.owed

    # -- staging and committing -----------------------------------------------------
    @property
    def has_pending(self) -> bool:
        """True while staged changes wait for :meth:`commit`."""
        return self.staging.has_pending

    def commit(self, now: float | None = None) -> None:
        """Make every staged change durable with one fdatasync; OSError leaves them staged.

        The environment files this batch's submits wrote are fsynced first,
        so no acknowledged submit can lose its environment. Once the batch is
        durable, the environments of jobs it started (or ended) go. The
        journal is compacted when it has grown past twice its last snapshot,
        about COMPACT_SLICE seconds of it per commit.
        """
        if self.staging.pending:
            self.envs.sync()
            try:
                self.staging.write_batch()
            except OSError:
                # A journal that cannot take a batch cannot be compacted either; the loop must not
                # spin on a compaction it cannot go on with. It begins again once commits succeed.
                self.compactor.abandon()
                raise
        self._sweep_committed()
        self.cache.fresh.clear()
        self.envs.release_done()
        if self.compactor.due():
            try:
                self.compactor.step()
            except OSError as exc:   # the journal just grows until it can be compacted
                log.error("cannot compact the journal (%s); it will be tried again", exc)

    @property
    def compacting(self) -> bool:
        """True while a compaction is under way (each commit writes a slice of it)."""
        return self.compactor.current is not None

    def forget(self, job_ids: set) -> None:
        """Unstage the changes of jobs a failed commit refused (they were never acknowledged)."""
        self.staging.forget(job_ids)
        self.cache.fresh -= job_ids
        # Their drop lines went with the rest: never journalled, their directories go now.
        for job_id in job_ids & self._sweep_after_commit:
            self._sweep_after_commit.discard(job_id)
            self.sweeper.take(self.job_dir(job_id), str(job_id))

    def _snapshot(self) -> None:
        """Replace the journal by one batch, at once (at start-up: nothing appends meanwhile)."""
        self.compactor.compact(None)

    def save_meta(self, meta: dict) -> None:
        """Stage the id floor and scheduler state (daemon.json is its readable cache)."""
        self.staging.meta = dict(meta)
        self.staging.stage(None, {"seq": self.staging.next_seq(), "meta": self.staging.meta})
        write_atomic(os.path.join(self.root, "daemon.json"), dump(meta), durable=False)

    # -- jobs -----------------------------------------------------------------
    def job_dir(self, job_id: int) -> str:
        """Directory of one job."""
        return self.cache.job_dir(job_id)

    def create_job_dir(self, job_id: int, gid: int | None) -> str:
        """Make the job's directory (see :meth:`JobCache.create_job_dir`)."""
        return self.cache.create_job_dir(job_id, gid)

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
        self.envs.records[key] = sh
        try:
            if sh.secret:
                self.envs.write_env(key, {"forward": forward, "job_env": job_env})
                self.envs.unsynced.add(key)
            self.envs.write_shared(sh, self.staging.batch + 1)
            self.staging.stage(key, {"seq": self.staging.next_seq(), "shared": sh.record()})
        except OSError:
            self.envs.drop_shared(sh)
            raise
        return sh

    def add_slice(self, sh: Shared, jobs: list, gid: int | None) -> None:
        """Store jobs of the submit *sh* stands for, staged for this turn's commit. On OSError none
        of them stays, nor (unless it is a pending bulk's, which :meth:`abort_bulk` ends) *sh*."""
        try:
            for job in jobs:
                self.create_job_dir(job.id, gid)
                self.cache.fresh.add(job.id)
                self.envs.refer(job, sh)
                self.save_job(job)
        except OSError:
            ids = {job.id for job in jobs}
            self.forget(ids)
            for job_id in ids:
                self.remove_job(job_id)
            if sh.key in self.envs.records and not sh.pending:
                self.envs.drop_shared(sh)
            raise

    def end_bulk(self, sh: Shared) -> None:
        """The last slice of a pending bulk is staged: its shared record, no longer pending, goes in
        the same batch, which acknowledges the whole bulk at once."""
        sh.pending = False
        self.envs.write_shared(sh, self.staging.batch + 1)
        self.staging.stage(sh.key, {"seq": self.staging.next_seq(), "shared": sh.record()})

    def abort_bulk(self, sh: Shared, ids: Iterable[int]) -> None:
        """Give up a pending bulk: the jobs stored of it go (drop lines where the journal holds
        them), and its shared record with them; never acknowledged, so nothing is lost."""
        ids = set(ids)
        self.forget(ids)
        for job_id in sorted(ids):
            self.remove_job(job_id)
        if sh.key in self.envs.records:
            self.envs.drop_shared(sh)

    def save_job(self, job: Job, durable: bool = True) -> None:
        """Write one job's record (its cache now; its journal line staged when *durable*).

        A finished job's record may skip the journal (*durable* False): its
        shepherd's exit record is already on disk, and a lost update is
        re-collected from it. A job that started lets go of its forwarded
        environment, and one that ended of its submit's shared record, once
        the commit that records it is durable.
        """
        if job.id in self.envs.unended:
            # Whether it started (or ended) is decided at the commit, from the job as it is then and
            # as this write says: the commit that makes its start durable lets its environment go,
            # not this write, nor a commit of its submit while its start is still to be written.
            self.envs.release[job.id] = (job, job.state)
        data = job.to_dict()
        sh = self.envs.records.get(self.envs.key_of.get(job.id, -1))
        if sh is not None and sh.argv is not None and job.argv is sh.argv:
            del data["argv"]               # its submit's shared record holds it
        seq = data["seq"] = self.staging.next_seq()
        data["batch"] = self.staging.batch + 1
        # The journal holds a job's command once: every later line of it says the command is the
        # same, so a start or a cancel of a job with a 1 MiB command costs the journal a small
        # line (the third review's G8). The cache always holds the whole record.
        argv = data.pop("argv", None) if job.id in self.staging.live else None
        delta = dumps_wire(data).encode("ascii")    # once, for the cache and the journal line
        record = delta if argv is None else delta[:-1] + b',"argv":' + dumps_wire(argv).encode("ascii") + b"}"
        self.cache.write(job, data, record)
        self.staging.owe(job, len(delta))
        if durable:
            self.staging.pending.append((job.id, job_line(seq, delta, same_argv=argv is not None)))
            self.staging.live.add(job.id)

    def keeps_env(self, job: Job) -> bool:
        """True when the store holds *job*'s environment until it ends: a clean one (its submit's
        PATH and LANG). A forwarded one goes at the start, so its launch spec alone holds it then;
        so does a job an older daemon started (it let the whole record go at the start)."""
        sh = self.envs.records.get(self.envs.key_of.get(job.id, -1))
        return sh is not None and not sh.secret and job.id in self.envs.unended

    def unstart(self, job: Job, env: dict) -> None:
        """A started job goes back to the queue, its command never run (out of pids): it needs an
        environment again. *env* is the one its launch spec held, stored as forwarded.

        A forwarded environment went at the start (and an older daemon let the whole record go):
        it is written again, fsynced by the next commit. Any job's launch environment serves its
        submit: the daemon sets its own variables afresh at each start.
        """
        envs = self.envs
        key = envs.key_of.get(job.id, shared_key(job))
        sh = envs.records.get(key)
        if sh is None:   # let go of by an older daemon: a record of its own again
            sh = envs.records[key] = Shared(key, None, {}, True)
            sh.refs = sum(1 for k in envs.key_of.values() if k == key) + (job.id not in envs.key_of)
            envs.key_of[job.id] = key
        if not sh.unstarted and sh.secret:
            envs.write_env(key, {"forward": env, "job_env": {}})
            envs.unsynced.add(key)
            envs.write_shared(sh, self.staging.batch + 1)
            self.staging.stage(key, {"seq": self.staging.next_seq(), "shared": sh.record()})
        envs.release.pop(job.id, None)
        if job.id not in envs.unstarted:
            envs.unstarted.add(job.id)
            sh.unstarted += 1
        if job.id not in envs.unended:
            envs.unended.add(job.id)
            sh.unended += 1

    def load_env(self, job: Job) -> dict:
        """A job's stored environment: ``base``, and ``forward`` and ``job_env`` while it has not started."""
        return self.envs.load_env(job)

    def remove_job(self, job_id: int) -> None:
        """Delete a job's directory and everything in it (the sweeper's thread does), and forget its record.

        A job the journal holds keeps its directory until the commit that drops it is durable: a
        crash before then finds the job still journalled, with its exit record to collect again
        (a finished job's end is often in that file alone), never a job whose files are gone.
        """
        self.staging.owed -= self.staging.owes.pop(job_id, 0)
        self.envs.forget_job(job_id)
        if job_id in self.staging.live:
            self.staging.stage(job_id, {"seq": self.staging.next_seq(), "drop": job_id})
            self.staging.live.discard(job_id)
            self._sweep_after_commit.add(job_id)
        else:
            self.sweeper.take(self.job_dir(job_id), str(job_id))

    def _sweep_committed(self) -> None:
        """Hand the sweeper the directories of jobs whose drop the journal now holds durably."""
        for job_id in self._sweep_after_commit:
            self.sweeper.take(self.job_dir(job_id), str(job_id))
        self._sweep_after_commit.clear()

    def release(self, job_id: int, keep_output: bool) -> None:
        """An ended job's files that served it while it ran go: its /dev info and launch spec, and its
        output buffer unless *keep_output* (its delivery failed: the user reads it there)."""
        jdir = self.job_dir(job_id)
        for name in (INFO, LAUNCH) if keep_output else (INFO, LAUNCH, OUTPUT):
            try:
                os.unlink(os.path.join(jdir, name))
            except OSError:
                pass

    def highest_quarantined_id(self) -> int:
        """The largest job id among quarantined records (ids below the floor are never reused)."""
        return self.quarantine.highest_id()


def is_disk_full(exc: OSError) -> bool:
    """True for the errors a full or quota-limited disk gives."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)

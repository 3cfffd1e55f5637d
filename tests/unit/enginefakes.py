"""In-memory stand-ins for what the engine talks to: its store, the launcher, the server's hooks, passwd.

Shared by the engine's example tests (test_engine.py) and its state-machine
test (test_engine_states.py). Job directories are real (under a scratch
directory): shepherd records live there and the engine reads them.
"""

import json
import os
import pwd
import shutil
import types
from typing import TYPE_CHECKING, Any

from hpc_batch.core import jobs, resources
from hpc_batch.daemon import bulks, launcher
from hpc_batch.daemon import engineparts as parts
from hpc_batch.daemon.access import Caller
from hpc_batch.daemon.engine import Engine
from hpc_batch.daemon.main import Config
from shepherd.base import records

ROOT = Caller(uid=0, gid=0, pid=1, name="root", is_admin=True)
T0 = 1_800_000_000.0


def make_config(state_dir, **overrides) -> Config:
    """A Config for an engine without cgroups, dev dir or socket (what the unit tests change, as keywords)."""
    settings: dict[str, Any] = dict(
        socket="/x", state_dir=str(state_dir), dev_dir=None, max_lifetime=3600, reserve_cpu=0,
        reserve_mem=0, min_job_mem=1 << 20, keep_finished=50, list_is_public=False,
        admin_group="root", schedule="fifo-strict", cgroups=False, max_queued_per_user=3,
        max_job_size=1 << 16, user_name="root", admin_gid=0)
    settings.update(overrides)
    return Config(**settings)


def make_machine(cpus: int = 2, mem: int = 8 << 30) -> tuple[resources.Machine, resources.Limits]:
    """One NUMA node with *cpus* CPUs and no GPUs, and limits that reserve nothing."""
    machine = resources.Machine(nodes=(resources.Node(0, tuple(range(cpus)), mem),))
    limits = resources.Limits(reserve_cpu=0, reserve_mem=0, min_job_mem=1 << 20, per_node_memory=False)
    return machine, limits


class InstantArchive:
    """The history archive as if every job's row were committed the moment it is handed over
    (the real one's threads are tested in test_archive.py and the integration tests)."""

    def __init__(self):
        self.entries: list = []
        self.fd = -1

    def start(self, next_id: int) -> None:
        pass

    def put(self, entry) -> bool:
        self.entries.append(entry)
        return True

    def want_durable(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _turn(name: str):
    """Engine.*name*, then the end of the turn (as the server's loop does)."""
    def call(self, *args, **kw):
        result = getattr(Engine, name)(self, *args, **kw)
        self.end_turn(T0)
        return result
    return call


class TurnEngine(Engine):
    """The engine as the server's loop drives it: each call below is a turn, ended by end_turn()."""

    def __init__(self, *args, **kw):
        kw.setdefault("history", InstantArchive())
        super().__init__(*args, **kw)

    tick = _turn("tick")
    run_pending = _turn("run_pending")
    shepherd_exited = _turn("shepherd_exited")
    schedule = _turn("schedule")
    kill = _turn("kill")
    job_setting = _turn("job_setting")


class MemoryStore:
    """The engine's view of --state-dir, in memory (job dirs are real: shepherd records live there)."""

    def __init__(self, base):
        self.root = str(base)
        self.records = {}
        self.env = {}
        self.meta = {}
        self.notes = []
        self.fail_writes = False
        self.compacting = False   # a journal compaction under way (the real store's; none here)

    def load_meta(self):
        return dict(self.meta)

    def load_jobs(self):
        return [jobs.Job.from_dict(r) for _, r in sorted(self.records.items())]

    def highest_quarantined_id(self):
        return 0

    def save_meta(self, meta):
        self.meta = dict(meta)

    def job_dir(self, job_id):
        return os.path.join(self.root, str(job_id))

    def create_job_dir(self, job_id, gid):
        os.mkdir(self.job_dir(job_id))

    has_pending = False   # every save is "durable" at once here: nothing waits for a commit
    commit_error = None   # set to make the next commits fail

    def short_of_room(self, reserve):
        return None

    def add_jobs(self, new_jobs, env, gid, argv=None):
        try:
            for job in new_jobs:
                self.create_job_dir(job.id, gid)
                self.save_job(job)
                self.env[job.id] = env
        except OSError:   # as the real store: nothing of the submit stays
            for job in new_jobs:
                self.remove_job(job.id)
            raise

    def begin_bulk(self, key, env, argv, pending=True):
        """A bulk stored a slice per turn: its environment, known by its first id."""
        if self.fail_writes:
            raise OSError(28, "No space left on device")
        self.env[key] = env
        return types.SimpleNamespace(key=key, env=env, pending=pending)

    def add_slice(self, sh, new_jobs, gid):
        try:
            for job in new_jobs:
                self.create_job_dir(job.id, gid)
                self.save_job(job)
                self.env[job.id] = sh.env
        except OSError:
            for job in new_jobs:
                self.remove_job(job.id)
            raise

    def end_bulk(self, sh):
        sh.pending = False

    def abort_bulk(self, sh, ids):
        for job_id in list(ids):
            self.remove_job(job_id)
        self.env.pop(sh.key, None)

    def commit(self, now=None):
        if self.commit_error:
            raise self.commit_error

    def forget(self, job_ids):
        pass

    def save_job(self, job, durable=True):
        if self.fail_writes:
            raise OSError(28, "No space left on device")
        # A copy through JSON, as the real store's.
        self.records[job.id] = json.loads(json.dumps(job.to_dict()))

    def load_env(self, job):
        return self.env.get(job.id, {})

    def unstart(self, job, env):
        self.env[job.id] = {"forward": env}

    def keeps_env(self, job):
        # As the real store: a clean environment until the job ends (a forwarded one goes at the
        # start). A job put in records by hand (as an older daemon left it) has none.
        env = self.env.get(job.id)
        return (env is not None and env.get("forward") is None and not env.get("job_env")
                and job.state != jobs.FINISHED)

    def release(self, job_id, keep_output):
        for name in (records.INFO, records.LAUNCH) + (() if keep_output else (records.OUTPUT,)):
            try:
                os.unlink(os.path.join(self.job_dir(job_id), name))
            except OSError:
                pass

    def remove_job(self, job_id):
        # As the real store: the directory goes with the record, so a later job may take the id.
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
        self.records.pop(job_id, None)
        self.env.pop(job_id, None)


class FakeLauncher:
    """Records what the engine asks of shepherds; starts nothing."""

    def __init__(self):
        self.spawned, self.stops, self.orphans_killed, self.deadlines = [], [], [], []
        self.spawn_error = None
        self.stop_error = None
        self.listening = True
        self._next = 40000

    def write_launch(self, job_dir, launch, durable):
        self.last_launch, self.last_durable = launch, durable
        launch.write(os.path.join(job_dir, records.LAUNCH))   # as the real one: it stays there

    def spawn(self, job_id, user, job_dir, meanwhile=None):
        if meanwhile is not None:
            meanwhile()
        if self.spawn_error:
            raise self.spawn_error
        self.spawned.append(job_id)
        self._next += 1
        return self._next, None

    def open_pidfd(self, pid, start):
        return os.open(os.devnull, os.O_RDONLY)   # a real descriptor the engine may close

    def reap(self, pid):
        pass

    adoptable = None   # (pid, pidfd) a live shepherd holding the job's lock, if any
    vanished = staticmethod(launcher.vanished)   # reads only the job's pidfile and /proc/uptime
    shepherd_alive = staticmethod(launcher.shepherd_alive)   # tries the pidfile's lock

    def adopt(self, job_dir):
        found, self.adoptable = self.adoptable, None
        return found

    def send_deadline(self, job_dir, deadline):
        self.deadlines.append((int(os.path.basename(job_dir)), deadline))
        return self.listening

    def request_stop(self, job_dir, reason):
        if self.stop_error:
            raise self.stop_error
        self.stops.append((int(os.path.basename(job_dir)), reason))
        return self.listening

    def kill_orphaned_job(self, job_dir):
        self.orphans_killed.append(int(os.path.basename(job_dir)))
        return True


class Hooks:
    """The server's side: pidfds watched and job events."""

    def __init__(self):
        self.watched, self.events = {}, []

    def watch_pidfd(self, fd, job_id):
        self.watched[fd] = job_id

    def unwatch_pidfd(self, fd):
        self.watched.pop(fd, None)

    def job_event(self, job_id, kind):
        self.events.append((job_id, kind))


class FakePasswd:
    """Stands in for the ``pwd`` module: the users given, and nobody else.

    Lets tests submit as several real-looking users without creating them.
    """

    def __init__(self, users: list[Caller]):
        self.by_uid = {u.uid: pwd.struct_passwd((u.name, "x", u.uid, u.gid, u.name, f"/home/{u.name}", "/bin/sh"))
                       for u in users}

    def getpwuid(self, uid: int):
        try:
            return self.by_uid[uid]
        except KeyError:
            raise KeyError(f"getpwuid(): uid not found: {uid}") from None

    def getpwnam(self, name: str):
        for entry in self.by_uid.values():
            if entry.pw_name == name:
                return entry
        raise KeyError(f"getpwnam(): name not found: {name!r}")


def answered(eng, out, now):
    """What Engine.submit answers, a bulk stored a slice per turn driven to its reply as the
    server's loop drives it (a slice, then the turn's commit); a refusal is raised."""
    if not isinstance(out, bulks.Storing):
        return out
    out.bulk.token = out
    while out.bulk in eng.turn.bulks:
        eng.store_bulks(now)
        eng.commit_turn(now)
    [reply] = [r for token, r in eng.take_bulk_replies() if token is out]
    if isinstance(reply, Exception):
        raise reply
    return reply


if TYPE_CHECKING:   # the stand-ins meet what the engine asks of the real parts (mypy enginefakes.py)
    _store: parts.Store = MemoryStore("")
    _launcher: parts.Launcher = FakeLauncher()
    _hooks: parts.Hooks = Hooks()
    _passwd: parts.Passwd = FakePasswd([])

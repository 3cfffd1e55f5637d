"""The engine as a state machine: random sequences of what the daemon's loop feeds it, checked after every step.

Hypothesis drives the real Engine, with the in-memory store, launcher and
passwd of enginefakes, the way the server's loop does: one event per turn,
each turn ended by the commit and the spawns, and another turn at once
while the engine has work left for now. The events:

- submits: plain, named, arrays with and without %N, --after and --after-ok
  on ids and names, from root, two users and a uid without a passwd entry;
  some must be refused (over the per-user cap, an unknown or someone else's
  dependency, no passwd entry), and a fan-out of FAN_OUT jobs after one job;
- kills of waiting, queued, running and finished jobs, by id and by name;
- job ends with every result: exit 0, exit non-zero, a signal, timeout,
  killed, oom, error, and a shepherd gone without an exit record;
- ticks, with the clock moving on (deadlines fall due);
- restarts: a fresh Engine recovers from the same store, with some running
  jobs ended (or their shepherds gone) while no daemon watched;
- a commit that fails (the store's commit raises ENOSPC) for a turn, and
  shepherds that cannot be started (EAGAIN) for a turn.

After every step (the loop turned until the engine has nothing left to do
at once: no waiting jobs left to look at, nothing to schedule or spawn)
the invariants below hold, against the engine and against a small model of
what it accepted and how each job ended (the model hears each end from the
engine's "finished" event, so it sees jobs evicted in the turn they ended).

Profiles: the default is derandomized and sized for a busy 2-core CI box;
HPC_BATCH_PROPTEST=soak runs a larger random search, and
HPC_BATCH_PROPTEST_EXAMPLES=N sets the number of examples of either.
"""

import errno
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

import pytest
from enginefakes import (
    ROOT,
    T0,
    FakeLauncher,
    FakePasswd,
    Hooks,
    InstantArchive,
    MemoryStore,
    answered,
    make_config,
    make_machine,
)
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hpc_batch.core import scheduler
from hpc_batch.core.jobs import (
    CANCELLED,
    DEPENDENCY_FAILED,
    ERROR,
    EXITED,
    FINISHED,
    KILLED,
    LOST,
    OOM,
    QUEUED,
    RUNNING,
    SIGNALLED,
    TIMEOUT,
    WAITING,
)
from hpc_batch.daemon import bulks, devdir
from hpc_batch.daemon.access import Caller
from hpc_batch.daemon.engine import Engine
from hpc_batch.daemon.refusal import Refused
from hpc_batch.wire.protocol import NewJob
from shepherd.base import records

ALICE = Caller(uid=2001, gid=2001, pid=11, name="alice", is_admin=False)
BOB = Caller(uid=2002, gid=2002, pid=12, name="bob", is_admin=False)
GHOST = Caller(uid=2999, gid=2999, pid=13, name="ghost", is_admin=False)   # no passwd entry
USERS = {"root": ROOT, "alice": ALICE, "bob": BOB, "ghost": GHOST}
PASSWD = FakePasswd([ROOT, ALICE, BOB])
NAMES = ("prep", "step")
NEVER = 999_999          # an id no job ever has
FAN_OUT = 1100           # dependents of one job in a single bulk: past Python's recursion limit

# How a job ends: its exit record (None: the shepherd died without one), and the
# result the engine must give it while it watches / when it finds it after a restart.
ENDS = {
    "exit 0": ({"code": 0}, EXITED, EXITED),
    "exit 3": ({"code": 3}, EXITED, EXITED),
    "signal 11": ({"signal": 11}, SIGNALLED, SIGNALLED),
    "timeout": ({"signal": 15, "stopped": "timeout"}, TIMEOUT, TIMEOUT),
    "killed": ({"signal": 15, "stopped": "killed"}, KILLED, KILLED),
    "oom": ({"signal": 9, "oom_kill": 1}, OOM, OOM),
    "error": ({"code": 127, "error": "failed while entering /nowhere: No such file or directory"}, ERROR, ERROR),
    "gone": (None, KILLED, LOST),
}


# -- the adapter: what the invariants read of the engine, in one place ---------------------------------
@dataclass
class Indexes:
    """What the engine keeps beside its job records, as the invariants read it."""

    queue: list              # queued ids, in the engine's order
    queue_in_order: bool     # whether the engine takes that order to be submission (id) order
    waiting: set             # ids held by --after / --after-ok
    running: set             # ids with a shepherd
    counted: dict            # uid -> the count --max-queued-per-user is checked against
    counted_states: tuple    # the states that count covers
    capped_queued: int | None   # queued elements of arrays with a %N cap, where kept
    strict_queued: int | None   # queued --benchmark=strict jobs, where kept
    names: dict | None       # (uid, name) -> its jobs' ids, ascending, where kept
    finished: dict | None    # uid -> list of its finished jobs' ids kept, where kept
    dependents: dict | None  # job id -> ids of waiting jobs that follow it, where kept
    followers: dict | None   # job id -> how many waiting jobs name it, where kept
    pending: int             # waiting jobs and ended jobs still to be looked at (0 once settled)


def indexes(eng: Engine) -> Indexes:
    """Read the engine's indexes, all kept by its JobTable (follow renames here, nowhere else)."""
    t = eng.table
    return Indexes(queue=list(t.queued), queue_in_order=t.queue_sorted, waiting=set(t.waiting),
                   running=set(t.running), counted=dict(t.held_by_uid), counted_states=(QUEUED, WAITING),
                   capped_queued=t.capped_queued, strict_queued=t.strict_queued,
                   names={k: list(v) for k, v in t.names.items()},
                   finished={u: list(ids) for u, ids in t.finished_by_uid.items()},
                   dependents={k: set(v) for k, v in t.dependents.items()},
                   followers={k: len(v) for k, v in t.followers.items()},
                   pending=len(eng.ending.to_settle) + len(eng.ending.ended_deps))


def has_work(eng: Engine) -> bool:
    """Whether the loop turns again at once: something to schedule, spawn, or waiting jobs to look at."""
    return bool(eng.turn.resched or eng.turn.to_spawn or eng.unsettled)


def caps(cfg) -> list:
    """(states, limit) for each per-user cap: what the issue says each covers."""
    return [((QUEUED, WAITING), cfg.max_queued_per_user)]


# -- the model ------------------------------------------------------------------------------------------
@dataclass
class Known:
    """A job the engine accepted (its submit was committed), as the test saw it."""

    uid: int
    name: str | None
    after: tuple
    after_ok: bool
    first: int | None        # its array's first id, for %N
    limit: int | None
    kind: str | None = None  # how it ended (from the engine's "finished" event), once it has
    code: int | None = None
    ended_step: int | None = None
    evicted: bool = False

    @property
    def ok(self) -> bool:
        return self.kind == EXITED and self.code == 0


class Store(MemoryStore):
    """The memory store, making a job's directory only when a record is written into it (cheap bulks)."""

    def create_job_dir(self, job_id, gid):
        assert not os.path.exists(self.job_dir(job_id)), f"job {job_id}'s directory is left from another job"


class Shepherds(FakeLauncher):
    """The fake launcher, with shepherds that live until the test ends their job (so a restart re-adopts them)."""

    def __init__(self, store: MemoryStore):
        super().__init__()
        self.store = store
        self.alive: set[int] = set()

    def write_launch(self, job_dir, launch, durable):
        os.makedirs(job_dir, exist_ok=True)
        launch.write(os.path.join(job_dir, records.LAUNCH), durable=False)

    def spawn(self, job_id, user, job_dir, meanwhile=None):
        pid, start = super().spawn(job_id, user, job_dir, meanwhile)
        self.alive.add(job_id)
        os.unlink(os.path.join(job_dir, records.LAUNCH))   # as a shepherd does once the command runs
        return pid, start

    def adopt(self, job_dir):
        if int(os.path.basename(job_dir)) in self.alive:
            self._next += 1
            return self._next, os.open(os.devnull, os.O_RDONLY)
        return None

    def end(self, job_id: int, how: str, now: float) -> None:
        """The job ends *how*: its shepherd writes the exit record (or dies without one) and is gone."""
        record = ENDS[how][0]
        if record is not None:
            os.makedirs(self.store.job_dir(job_id), exist_ok=True)
            records.write_json(os.path.join(self.store.job_dir(job_id), records.EXIT),
                               {"stopped": None, **record, "ended": now}, durable=False)
        self.alive.discard(job_id)


class Watcher(Hooks):
    """The server's side, noting each job's end as the engine announces it (before it may evict the job)."""

    def __init__(self):
        super().__init__()
        self.eng: Engine | None = None
        self.ended: list[tuple[int, str, int | None]] = []

    def job_event(self, job_id, kind):
        if kind == "finished":
            result = self.eng.jobs[job_id].result
            self.ended.append((job_id, result.kind, result.code))


class Swallowed(logging.Handler):
    """Collects the exceptions the engine caught and logged itself: each is a bug it survived."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.caught: list[str] = []

    def emit(self, record):
        if record.exc_info:
            self.caught.append(f"{record.getMessage()}: {record.exc_info[0].__name__}: {record.exc_info[1]}")


# Mostly jobs that exist (or did), sometimes a name, now and then an id no job has.
refs = st.one_of(Bundle("jobs"), Bundle("jobs"), st.sampled_from((*NAMES, NEVER)))
users = st.sampled_from(("alice", "bob", "root", "alice", "ghost"))


class EngineStates(RuleBasedStateMachine):
    """The engine driven as the server's loop drives it, with a model of what it accepted."""

    jobs = Bundle("jobs")

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="hpcb-states-")
        self.store = Store(self.dir)
        self.shepherds = Shepherds(self.store)
        self.swallowed = Swallowed()
        logging.getLogger("hpc-batchd").addHandler(self.swallowed)
        self.eng: Engine | None = None
        self.now = T0
        self.step = 0
        self.fail_commit = False
        self.fail_spawn = False
        self.known: dict[int, Known] = {}
        self.unsettled: set[int] = set()   # jobs with dependencies whose outcome may still change
        self.watcher = Watcher()
        self.ends: dict[int, tuple] = {}   # id -> (kind, code), for jobs not yet accepted or refused
        self.followed: set[int] = set()   # ids some accepted job names in --after

    def teardown(self):
        logging.getLogger("hpc-batchd").removeHandler(self.swallowed)
        self._close_pidfds()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- driving the engine as the server does -----------------------------------------------------
    def _start(self) -> None:
        """A daemon start: a fresh Engine on the same store recovers, schedules and commits (daemon.build)."""
        self.watcher = Watcher()
        self.eng = Engine(self.cfg, self.store, self.machine, self.limits, devdir.DevDir(None, 0), self.watcher,
                          history=InstantArchive(), launcher=self.shepherds, passwd=PASSWD)
        self.watcher.eng = self.eng
        self.eng.root_mode = True
        self.eng.recover()
        self._turn(lambda: self.eng.schedule(self.now))

    def _turn(self, event):
        """One turn of the loop: *event*, then the commit and the spawns.

        Returns what *event* returned (or the Refused it raised) and the ids the commit refused.
        """
        eng = self.eng
        if self.fail_commit:
            self.store.commit_error = OSError(errno.ENOSPC, "No space left on device")
        if self.fail_spawn:
            self.shepherds.spawn_error = OSError(errno.EAGAIN, "Resource temporarily unavailable")
        self.fail_commit = self.fail_spawn = False
        try:
            try:
                out = event()
            except Refused as exc:
                out = exc
            refused = eng.end_turn(self.now)
        finally:
            self.store.commit_error = self.shepherds.spawn_error = None
        return out, refused

    def _settle(self) -> None:
        """What the loop does next while the engine has work left for now (tick returns now): tick at once."""
        for _ in range(1000):
            if not has_work(self.eng):
                return
            self._turn(lambda: self.eng.tick(self.now))
        raise AssertionError("the engine never settled (1000 turns)")

    def _close_pidfds(self) -> None:
        if self.eng is not None:
            for handle in self.eng.table.running.values():
                if handle.pidfd is not None:
                    os.close(handle.pidfd)
                    handle.pidfd = None

    # -- the model -----------------------------------------------------------------------------------
    def _resolve(self, caller: Caller, ref) -> tuple:
        """(id, None) for the job *caller* means by *ref*, or (None, the refusal codes that may answer)."""
        if isinstance(ref, str):   # a name: the caller's own newest job of that name, admins too
            own = [i for i, k in self.known.items() if k.uid == caller.uid and k.name == ref and not k.evicted]
            return (max(own), None) if own else (None, {"not_found"})
        k = self.known.get(ref)
        if k is None or k.evicted:
            return None, {"not_found"}
        if k.uid != caller.uid and not caller.is_admin:
            return None, {"forbidden", "not_found"}
        return ref, None

    def _held(self, uid: int, states) -> int:
        return sum(1 for j in self.eng.jobs.values() if j.uid == uid and j.state in states)

    def _observe(self) -> None:
        """Learn what the last step did: the ends the engine announced, the evictions from the jobs that went."""
        self.step += 1
        ended, self.watcher.ended = self.watcher.ended, []
        for job_id, kind, code in ended:
            k = self.known.get(job_id)
            if k is None:
                self.ends[job_id] = (kind, code)   # submitted this step: accepted (or refused) below
                continue
            assert k.kind is None, f"job {job_id} ended twice: {k.kind}, then {kind}"
            k.kind, k.code, k.ended_step = kind, code, self.step
        self._evictions()

    def _evictions(self) -> None:
        for job_id, k in self.known.items():
            if k.evicted or job_id in self.eng.jobs:
                continue
            assert k.kind is not None, f"job {job_id} is gone without having ended (lost)"
            k.evicted = True

    def _accept(self, job_ids, **fields) -> None:
        for job_id in job_ids:
            assert job_id not in self.known, f"job {job_id}'s id was given out twice"
            k = self.known[job_id] = Known(**fields)
            if k.after:
                self.unsettled.add(job_id)
            self.followed.update(k.after)
            end = self.ends.pop(job_id, None)
            if end is not None:
                k.kind, k.code = end
                k.ended_step = self.step
        self._evictions()   # some may have ended and gone already

    # -- rules ---------------------------------------------------------------------------------------
    @initialize(target=jobs, cap=st.sampled_from([2000, 5]), keep=st.sampled_from([3, 50]),
                policy=st.sampled_from(scheduler.POLICIES), cpus=st.sampled_from([2, 4]))
    def boot(self, cap, keep, policy, cpus):
        """A daemon with these flags starts on an empty state dir, and alice submits a job named prep."""
        self.cfg = make_config(self.dir, max_queued_per_user=cap, keep_finished=keep, schedule=policy)
        self.machine, self.limits = make_machine(cpus)
        self._start()
        self._observe()
        return multiple(*self._submit("alice", 0, None, "prep", [], False, None, None))

    def _submit(self, user, count, limit, name, after, after_ok, cpus, max_time) -> list:
        caller = USERS[user]
        after_ok = after_ok and bool(after)
        req = NewJob(argv=("true",), cwd="/tmp", no_output=True, cpus=cpus, max_time=max_time, name=name,
                     after=tuple(after), after_ok=after_ok, array=tuple(range(1, count + 1)),
                     array_limit=limit if count else None)
        n = max(count, 1)
        why = set()    # the refusal codes that may answer, empty if it must be accepted
        for states, limit_ in caps(self.cfg):
            if self._held(caller.uid, states) + n > limit_:
                why.add("queue_full")
        if caller.uid not in PASSWD.by_uid:
            why.add("refused")
        if self.fail_commit and n > bulks.SLICE:
            why.add("busy")   # a bulk is stored over turns: a failed commit refuses it, not its reply
        resolved = []
        for ref in after:
            job_id, codes = self._resolve(caller, ref)
            if codes:
                why |= codes
            else:
                resolved.append(job_id)
                if after_ok and self.known[job_id].kind is not None and not self.known[job_id].ok:
                    why.add("finished")     # it could never start: refused at submit
        before = set(self.eng.jobs)

        def event():
            try:
                return answered(self.eng, self.eng.submit(caller, req, self.now), self.now)
            finally:
                self.eng.run_pending(self.now)     # the decision made while answering, after the reply
        reply, refused = self._turn(event)
        self._settle()
        self._observe()
        if isinstance(reply, Refused):
            assert why, f"refused ({reply.code}: {reply}) though nothing should refuse it"
            assert reply.code in why, f"refused as {reply.code} ({reply}); expected one of {sorted(why)}"
            assert set(self.eng.jobs) <= before, "a refused submit left jobs behind"
            return []
        assert not why, f"accepted, though it should be refused ({sorted(why)}): {reply}"
        ids = list(range(reply["id"], reply.get("last", reply["id"]) + 1))
        assert len(ids) == n, f"asked for {n} jobs, got {len(ids)}"
        if refused & set(ids):
            assert set(ids) <= refused, "part of one submit refused at commit, part kept"
            assert not set(ids) & set(self.eng.jobs), "jobs refused at commit are still there"
            for job_id in ids:
                self.ends.pop(job_id, None)
            return ids[:1]          # an id no job has now: a dependency that must be refused
        self._accept(ids, uid=caller.uid, name=name, after=tuple(sorted(set(resolved))), after_ok=after_ok,
                     first=ids[0] if count else None, limit=limit if count else None)
        for job_id in ids:
            job = self.eng.jobs.get(job_id)
            if job is not None:
                assert (job.uid, job.name, tuple(job.after), job.after_ok) == \
                    (caller.uid, name, tuple(sorted(set(resolved))), after_ok), \
                    f"job {job_id} holds {(job.uid, job.name, job.after, job.after_ok)}"
        return ids if len(ids) <= 3 else [ids[0], ids[-1]]

    @rule(target=jobs, user=users, count=st.sampled_from([0, 0, 1, 3]), limit=st.sampled_from([None, 1, 2]),
          name=st.sampled_from([None, *NAMES]), after=st.lists(refs, max_size=2), after_ok=st.booleans(),
          cpus=st.sampled_from([None, 1, 2]), max_time=st.sampled_from([None, 30]))
    def submit(self, user, count, limit, name, after, after_ok, cpus, max_time):
        """dispatch new [--name] [--array 1-COUNT[%LIMIT]] [--after[-ok] REFS]: COUNT 0 is a plain submit."""
        return multiple(*self._submit(user, count, limit, name, after, after_ok, cpus, max_time))

    @precondition(lambda self: self.eng is not None and len(self.eng.jobs) < FAN_OUT * 3 // 2)   # two at once at most
    @rule(target=jobs, user=users, on=refs, after_ok=st.booleans(), limit=st.sampled_from([None, 2]))
    def fan_out(self, user, on, after_ok, limit):
        """dispatch new --array 1-FAN_OUT[%LIMIT] --after[-ok] ON: many dependents of one job, in one request."""
        return multiple(*self._submit(user, FAN_OUT, limit, None, [on], after_ok, 1, None))

    @rule(user=users, ref=refs)
    def kill(self, user, ref):
        """dispatch kill REF: cancels a waiting or queued job, asks a running one's shepherd to stop it."""
        caller = USERS[user]
        target, codes = self._resolve(caller, ref)
        was = self.eng.jobs[target].state if target is not None else None
        reply, _ = self._turn(lambda: self.eng.kill(caller, ref, self.now))
        self._settle()
        self._observe()
        if codes:
            assert isinstance(reply, Refused) and reply.code in codes, f"kill {ref!r} as {user}: {reply}"
        elif was == FINISHED:
            assert isinstance(reply, Refused) and reply.code == "finished", f"kill of a finished job: {reply}"
        else:
            assert not isinstance(reply, Refused), f"kill {ref!r} as {user} refused: {reply}"
            assert reply == {"id": target, "was": was}, f"kill {ref!r} as {user}: {reply}, expected {target} {was}"
            if was == RUNNING:
                job = self.eng.jobs[target]
                assert job.state == RUNNING and job.stop_reason in (KILLED, TIMEOUT)
            else:
                assert self.known[target].kind == CANCELLED, f"job {target} ended {self.known[target].kind}"

    def _running(self) -> list:
        return sorted(indexes(self.eng).running)

    @precondition(lambda self: self.eng is not None and self._running())
    @rule(pick=st.integers(0, 7), how=st.sampled_from(sorted(ENDS)))
    def end(self, pick, how):
        """A running job ends *how*; its shepherd exits and the server tells the engine."""
        running = self._running()
        job_id = running[pick % len(running)]
        self.shepherds.end(job_id, how, self.now)
        self._turn(lambda: self.eng.shepherd_exited(job_id))
        self._settle()
        self._observe()
        k = self.known[job_id]
        assert k.kind == ENDS[how][1], f"job {job_id} ended {how!r} but was recorded {k.kind}"

    @rule(advance=st.sampled_from([0, 1, 3, 40]))
    def tick(self, advance):
        """The loop wakes (a timer): the clock moves on by ADVANCE seconds."""
        self.now += advance
        self._turn(lambda: self.eng.tick(self.now))
        self._settle()
        self._observe()

    @rule(down=st.lists(st.tuples(st.integers(0, 7), st.sampled_from(sorted(ENDS))), max_size=2))
    def restart(self, down):
        """The daemon restarts (a reload, or a crash and a start); the jobs DOWN pick end while none watches."""
        running = self._running()
        ended: dict[int, str] = {}
        for pick, how in down:
            if running:
                job_id = running[pick % len(running)]
                if job_id not in ended:
                    ended[job_id] = how
                    self.shepherds.end(job_id, how, self.now)
        self._close_pidfds()
        self._start()
        self._settle()
        self._observe()
        for job_id in running:
            if job_id in ended:
                k = self.known[job_id]
                assert k.kind == ENDS[ended[job_id]][2], \
                    f"job {job_id} ended {ended[job_id]!r} while the daemon was down, but was recorded {k.kind}"
            else:
                assert self.eng.jobs[job_id].state == RUNNING, f"running job {job_id} not re-adopted"

    @rule()
    def fail_next_commit(self):
        """The next turn's commit raises ENOSPC (the journal cannot be written)."""
        self.fail_commit = True

    @rule()
    def fail_next_spawn(self):
        """Starting shepherds fails for the next turn (out of processes)."""
        self.fail_spawn = True

    @rule(user=users, ref=refs)
    def look(self, user, ref):
        """dispatch show REF and dispatch status: read only, and never an error."""
        caller = USERS[user]
        try:
            self.eng.show(caller, ref, self.now)
        except Refused:
            pass
        self.eng.status(self.now)

    # -- invariants ----------------------------------------------------------------------------------
    @invariant()
    def check(self):
        """All of them, after every step (one line in a failing example's listing)."""
        assert not self.swallowed.caught, f"the engine caught and logged: {self.swallowed.caught[:3]}"
        by_state = self.jobs_agree_with_indexes_store_and_model()
        self.dependencies_decided()
        self.running_jobs_fit(by_state[RUNNING])
        self.nothing_left_startable()

    def jobs_agree_with_indexes_store_and_model(self) -> dict:
        """One pass over the jobs: indexes, counts, caps, the store's records, the model; returns ids by state."""
        eng = self.eng
        ix = indexes(eng)
        cfg_caps = caps(self.cfg)
        by_state: dict[str, set] = {WAITING: set(), QUEUED: set(), RUNNING: set(), FINISHED: set()}
        counted: dict[int, int] = {}
        held = [dict() for _ in cfg_caps]
        done: dict[int, set] = {}
        named: dict = {}
        capped = strict = 0
        followers: dict[int, int] = {}
        records = self.store.records
        for job_id, job in eng.jobs.items():
            state, uid = job.state, job.uid
            assert job_id == job.id
            by_state[state].add(job_id)
            if state in ix.counted_states:
                counted[uid] = counted.get(uid, 0) + 1
            for (states, _), n in zip(cfg_caps, held):
                if state in states:
                    n[uid] = n.get(uid, 0) + 1
            if state == FINISHED:
                done.setdefault(uid, set()).add(job_id)
            elif state == QUEUED:
                capped += bool(job.array is not None and job.array.get("limit"))
                strict += job.request.benchmark == "strict"
            elif state == WAITING:
                for dep in job.after:
                    followers[dep] = followers.get(dep, 0) + 1
            if job.name is not None:
                named.setdefault((uid, job.name), []).append(job_id)
            # The store holds what the engine holds (a record whose write failed is retried: eng.turn.unsaved).
            assert job_id in records, f"job {job_id} has no record in the store"
            assert records[job_id]["state"] == state or job_id in eng.turn.unsaved, f"job {job_id}'s record is stale"
            # No job lost, none counted twice: every job was accepted once, and is finished iff it ended once.
            k = self.known.get(job_id)
            assert k is not None, f"job {job_id} was never accepted"
            assert not k.evicted, f"job {job_id} came back after it was evicted"
            assert (state == FINISHED) == (k.kind is not None), f"job {job_id} is {state}, its end said {k.kind}"
            if k.kind is not None:
                assert job.result.kind == k.kind, f"job {job_id}: {job.result.kind}, its end said {k.kind}"
        assert len(records) == len(eng.jobs), f"the store keeps records of {set(records) - set(eng.jobs)}"
        assert len(ix.queue) == len(set(ix.queue)), "a job queued twice"
        assert set(ix.queue) == by_state[QUEUED], f"queue index off by {set(ix.queue) ^ by_state[QUEUED]}"
        assert not ix.queue_in_order or ix.queue == sorted(ix.queue), "the queue is not in submission order"
        assert ix.waiting == by_state[WAITING], f"waiting index off by {ix.waiting ^ by_state[WAITING]}"
        assert ix.running == by_state[RUNNING], f"running index off by {ix.running ^ by_state[RUNNING]}"
        assert ix.counted == counted, f"per-user counts {ix.counted}, jobs say {counted}"
        if ix.capped_queued is not None:
            assert ix.capped_queued == capped, f"capped queued {ix.capped_queued}, jobs say {capped}"
        if ix.strict_queued is not None:
            assert ix.strict_queued == strict, f"strict queued {ix.strict_queued}, jobs say {strict}"
        if ix.followers is not None:
            assert ix.followers == followers, f"followers {ix.followers}, waiting jobs say {followers}"
        if ix.names is not None:
            named = {key: sorted(ids) for key, ids in named.items()}
            assert ix.names == named, f"the name index disagrees with the jobs: {ix.names} vs {named}"
        if ix.finished is not None:
            for uid, ids in ix.finished.items():
                assert len(ids) == len(set(ids)), f"user {uid}'s finished jobs indexed twice: {sorted(ids)}"
            finished = {uid: set(ids) for uid, ids in ix.finished.items() if ids}
            assert finished == done, f"the finished index disagrees: {finished} vs {done}"
        assert ix.pending == 0, "the engine settled, yet holds jobs to look at"
        if ix.dependents is not None:
            # Every waiting job is found from each job it still waits for (else its end would never look at it).
            for job_id in by_state[WAITING]:
                for dep in eng.jobs[job_id].after:
                    if dep in eng.jobs and eng.jobs[dep].state != FINISHED:
                        assert job_id in ix.dependents.get(dep, ()), f"job {job_id} is not among job {dep}'s dependents"
            stale = [d for d in ix.dependents if d not in eng.jobs or eng.jobs[d].state == FINISHED]
            assert not stale, f"ended or forgotten jobs keep dependents: {stale}"
        assert not eng.turn.to_spawn and not eng.turn.submitted, "a turn ended with work left in it"
        for (states, limit), n in zip(cfg_caps, held):
            over = {uid: c for uid, c in n.items() if c > limit}
            assert not over, f"users hold more {'+'.join(states)} jobs than the cap of {limit}: {over}"
        # --keep-finished: past it, only jobs others follow may be kept (until their dependents have looked).
        kept = {uid: len(ids - self.followed) for uid, ids in done.items()}
        assert all(n <= self.cfg.keep_finished for n in kept.values()), \
            f"more finished jobs kept than --keep-finished {self.cfg.keep_finished}: {kept}"
        return by_state

    def dependencies_decided(self):
        """Waiting means a followed job has not ended; a failed --after-ok job fails its dependents, only it."""
        settled = []
        for job_id in self.unsettled:
            k = self.known[job_id]
            deps = [self.known.get(d) for d in k.after]
            failed = [d for d, dk in zip(k.after, deps) if dk is not None and dk.kind is not None and not dk.ok]
            unended = [d for d, dk in zip(k.after, deps) if dk is not None and dk.kind is None]
            state = FINISHED if k.kind is not None else self.eng.jobs[job_id].state
            if k.after_ok and failed:
                assert state == FINISHED, f"job {job_id} is still {state} after job {failed[0]} it was to " \
                                          f"follow --after-ok ended {self.known[failed[0]].kind}"
                if k.ended_step >= min(self.known[d].ended_step for d in failed):
                    assert k.kind == DEPENDENCY_FAILED, \
                        f"job {job_id} ended {k.kind}, not dependency-failed, after job {failed[0]} failed"
            if state == WAITING:
                assert unended, f"job {job_id} still waits, though every job it follows has ended"
            if state in (QUEUED, RUNNING) or k.kind in (EXITED, SIGNALLED, TIMEOUT, KILLED, OOM, LOST):
                assert not unended, f"job {job_id} was released before {unended} ended"
                assert not (k.after_ok and failed), f"job {job_id} ran though job {failed} failed"
            if k.kind == DEPENDENCY_FAILED:
                assert k.after_ok and failed, \
                    f"job {job_id} ended dependency-failed, but every job it followed ({list(k.after)}) " \
                    f"exited 0 (evicted since: {[d for d, dk in zip(k.after, deps) if dk and dk.evicted]})"
            if k.kind is not None and not unended:
                settled.append(job_id)     # it and all it follows have ended: nothing here can change
        self.unsettled.difference_update(settled)

    def running_jobs_fit(self, running: set):
        """No CPU given twice, and no array runs more than its %N."""
        cpus: list = []
        per_array: dict[int, int] = {}
        for job_id in running:
            cpus += list(self.eng.table.running[job_id].alloc.cpus)
            k = self.known[job_id]
            if k.limit:
                per_array[k.first] = per_array.get(k.first, 0) + 1
                assert per_array[k.first] <= k.limit, f"more of array {k.first} run than its %{k.limit}"
        assert len(cpus) == len(set(cpus)), "a CPU given to two jobs"

    def nothing_left_startable(self):
        """With no retry pending, the last turn started whatever could start (no stall with CPUs free)."""
        eng = self.eng
        if eng.turn.retry_at is not None or eng.turn.resched:
            return
        decision = eng.plan(self.now)
        starts = decision.starts if decision is not None else []
        assert not starts, f"jobs {[j for j, _ in starts]} could start but were left queued"


def _settings() -> settings:
    soak = os.environ.get("HPC_BATCH_PROPTEST") == "soak"
    examples = int(os.environ.get("HPC_BATCH_PROPTEST_EXAMPLES") or (2000 if soak else 60))
    return settings(max_examples=examples, stateful_step_count=60 if soak else 30, derandomize=not soak,
                    database=None, deadline=None, print_blob=soak, report_multiple_bugs=soak,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@pytest.fixture
def fakes(monkeypatch):
    """The engine's dev-dir files faked for the duration of a test (its launcher and passwd: given to it)."""
    for name in ("create_output", "write_info"):   # a user's view of the job dir: not what is tested here
        monkeypatch.setattr(devdir, name, lambda *args: None)


@pytest.mark.timeout(0 if os.environ.get("HPC_BATCH_PROPTEST") == "soak" else 600)   # room to shrink a failure
def test_engine_state_machine(fakes):
    run_state_machine_as_test(EngineStates, settings=_settings())


# -- what the state machine found, replayed step by step ------------------------------------------------
@pytest.fixture
def machine(fakes):
    m = EngineStates()
    yield m
    m.teardown()


def steps(m: EngineStates, *calls) -> None:
    """Run each (rule, keywords) on *m*, checking the invariants after each, as Hypothesis does."""
    m.check()
    for name, kw in calls:
        getattr(m, name)(**kw)
        m.check()


def new(**kw) -> tuple:
    """A submit step: alice's plain one-CPU job unless *kw* says otherwise."""
    args = dict(user="alice", count=0, limit=None, name=None, after=[], after_ok=False, cpus=1, max_time=None)
    return "submit", {**args, **kw}


def test_a_submit_refused_by_its_commit_leaves_no_finished_job_behind(machine):
    """--after-ok a failed job is refused at submit; the commit the next submit meets refuses that one:
    nothing of either may stay."""
    machine.boot(cap=2000, keep=3, policy="fifo-strict", cpus=4)         # alice's job 1 runs
    steps(machine, ("end", dict(pick=0, how="exit 3")), ("fail_next_commit", {}),
          new(after=[1], after_ok=True),
          *[step for _ in range(4) for step in (new(), ("end", dict(pick=1, how="exit 0")))])


def test_a_bulk_submit_that_meets_a_failed_commit_is_refused_whole(machine):
    """A bulk is stored a slice per turn, so the commit that fails refuses the submit itself (busy)."""
    machine.boot(cap=2000, keep=3, policy="fifo-strict", cpus=2)
    steps(machine, ("fail_next_commit", {}), ("fan_out", dict(user="alice", on=1, after_ok=False, limit=None)))


def test_an_after_ok_job_that_exited_0_still_counts_once_evicted(machine):
    """--after-ok 1,2: job 1 exits 0 and goes past --keep-finished before job 2 ends: the dependent runs."""
    machine.boot(cap=2000, keep=3, policy="fifo-strict", cpus=4)         # alice's job 1 runs
    steps(machine, new(), new(after=[1, 2], after_ok=True), ("end", dict(pick=0, how="exit 0")),
          *[step for _ in range(3) for step in (new(), ("end", dict(pick=1, how="exit 3")))],
          ("end", dict(pick=0, how="exit 0")))

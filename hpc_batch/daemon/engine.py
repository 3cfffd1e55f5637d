"""The daemon's core: the queue, the running jobs and their life cycle.

The engine decides and acts; its ``JobTable`` (core/jobtable.py) records
the jobs, their states and every index derived from them, each change of
state one ``JobTable.move``. The engine does no socket I/O. The server
feeds it requests and kernel events (a shepherd's pidfd became readable, a
timer fired) and the engine persists every change before it is
acknowledged: a submit that cannot be written is refused, never accepted and
then forgotten. Scheduling itself is the pure ``scheduler`` module; starting
shepherds and asking them to stop jobs is ``launcher``; cgroups are
``cgroups``. What the engine composes, each room holding no reference to
it: ``admission`` (a submit's checks and jobs), ``queries`` (the read
models), ``launchspec`` (a job's environment and launch spec),
``outcome`` (how a job ended, from its shepherd's records),
``benchcores`` (benchmark mode's watch and quiet cores), ``bulks`` (bulk
submits stored a slice per turn), ``finished`` (the history archive and
undelivered output), ``starting`` (a job's start: cgroup, launch spec,
spawn, quiet cores, pidfd watching, and the way back to the queue),
``deadlines`` (max times, deadlines and stop requests, and the tick's
check of each running job), ``ending`` (a job's end collected and
recorded, its dependents settled), ``eviction`` (finished jobs past
--keep-finished, records whose write failed) and ``recovery`` (start-up,
given the ending, starting and deadlines rooms); every verb refuses with
``refusal.Refused``. What a turn of the loop changed is kept in its
``Turn`` (turn.py), which is all the server asks of it; launcher,
cgroups and passwd are given to the engine (typed by engineparts.py).

Nothing a user sends can make the engine act on a path they control, wait
on a process they can stop, or signal a process by number: output paths are
only handed to the shepherd (which writes them as the user), and stopping a
job is a line on its shepherd's control FIFO. An error while acting on one
job ends that job (as ``error``, with the reason), never the daemon.
"""

import logging
import os
import pwd
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shepherd.base import records

from ..core import scheduler, views
from ..core.jobs import (
    CANCELLED,
    ERROR,
    FINISHED,
    KILLED,
    QUEUED,
    RUNNING,
    WAITING,
    Job,
    Result,
)
from ..core.jobtable import JobTable, Running
from ..wire.protocol import JobSetting, NewJob
from . import (
    admission,
    archive,
    bulks,
    cgroups,
    devdir,
    launcher,
    queries,
    recovery,
)
from . import engineparts as parts
from .access import Caller
from .benchcores import BenchCores
from .deadlines import Deadlines
from .ending import Ending
from .eviction import Eviction
from .finished import Finished
from .refusal import Refused
from .starting import Starting
from .store import is_disk_full
from .turn import Turn

log = logging.getLogger("hpc-batchd")


class Engine:
    """Queue, running set and finished history, backed by a Store."""

    def __init__(self, cfg, store: parts.Store, machine, limits, dev: devdir.DevDir, hooks: parts.Hooks,
                 history=None, *, launcher: parts.Launcher = launcher, cgroups: parts.Cgroups = cgroups,
                 passwd: parts.Passwd = pwd):
        self.cfg = cfg
        self.store = store
        self.machine = machine
        self.limits = limits
        self.dev = dev
        self.hooks = hooks                  # the loop's hooks (hooks.py): watch/unwatch pidfds, job events
        # The parts that act on the machine, given (engineparts.py): the unit tests give stand-ins.
        self.launcher = launcher
        self.cgroups = cgroups
        self.passwd = passwd
        # The jobs, their states and every index derived from them (queue, running handles, waiting,
        # per-user counts, names, dependencies): changed only through the table (core/jobtable.py).
        self.table = JobTable()
        self.jobs = self.table.jobs         # read here; in id order, all and per user, for list pages
        # What this turn of the loop changed and still owes (turn.py): the server asks it when to
        # turn again, and whether a reply waits for the turn's commit.
        self.turn = Turn(store, bulks.Queue(store, cfg.admin_gid))
        # Benchmark mode: the watch over the machine while strict jobs wait, and the quiet cores.
        self.bench = BenchCores(cfg, machine, limits, store.root)
        # Where a finished job goes (finished.py): the history archive, its undelivered output.
        self.finished = Finished(cfg, store, machine, self.jobs, self.turn, history)
        self.next_id = 1
        self.policy_state: dict[str, Any] = {}
        self.saved_floor = 1                # the next_id daemon.json holds: ids below it are never reused
        self.pending: scheduler.Decision | None = None  # a Decision to carry out after a reply
        self.root_mode = os.geteuid() == 0
        # A job's start (starting.py): cgroup, launch spec, spawn, its quiet cores and pidfd.
        self.starting = Starting(cfg, store, machine, self.table, self.turn, self.bench, launcher, cgroups,
                                 passwd, hooks, move=self._move, finish=lambda *a: self.ending.finish(*a),
                                 collect=lambda *a, **k: self.ending.collect(*a, **k))
        # Max times, deadlines and stop requests (deadlines.py); its recheck is recovery's, below.
        self.deadlines = Deadlines(cfg, store, self.table, self.turn, launcher, self._reset_policy,
                                   lambda job_id: recovery.recheck(self.recovery, job_id))
        # A job's end and the settling of the jobs waiting on it (ending.py).
        self.ending = Ending(store, self.table, self.turn, launcher, cgroups, hooks, dev, self.bench, self.finished,
                             self.starting, move=self._move, not_now=self.starting.not_now,
                             evict=lambda uid: self.eviction.evict(uid))
        # Finished jobs past --keep-finished, and records whose write failed (eviction.py).
        self.eviction = Eviction(cfg, store, self.table, self.turn, self.finished, self.ending.to_settle,
                                 lambda: self.saved_floor, self.save_meta)
        # Start-up and the second look at a shepherd that was starting (recovery.py), given what they act on.
        self.recovery = recovery.Parts(cfg, store, self.table, launcher, cgroups, hooks, self.bench,
                                       self.ending, self.starting, self.deadlines)

    # -- start-up -------------------------------------------------------------
    def recover(self) -> list:
        """Load the state dir, re-adopt running jobs, collect ones that ended meanwhile."""
        loaded = recovery.load(self.store, self.table, self.dev)
        jobs, notes = loaded.jobs, loaded.notes
        self.policy_state, self.saved_floor, self.next_id = loaded.policy_state, loaded.saved_floor, loaded.next_id
        for job in jobs:   # first every benchmark job with changes to undo, so an end hands them over
            if job.state == RUNNING:
                self.bench.readopt_held(job, self.store.job_dir(job.id))
        for job in jobs:
            if job.state == RUNNING:
                try:
                    notes.append(recovery.readopt(self.recovery, job))
                except Exception as exc:  # one record the daemon cannot act on must not stop it
                    log.exception("job %d: cannot re-adopt it", job.id)
                    self.table.detach(job.id)
                    self.ending.fail(job, f"the daemon could not re-adopt it: {exc}", time.time())
        # The jobs they wait for may have ended meanwhile: look at every waiting job again, a
        # bounded number per turn (start-up never works through them all before serving).
        table = self.table
        self.ending.to_settle.extend(sorted(table.waiting))
        self.finished.archive.start(self.next_id)
        for job in jobs:   # what a crash kept from the archive; the writer skips those it has
            if job.state == FINISHED and job.id in self.jobs:
                self.finished.put(job, if_absent=True)
                if job.output_error:   # a kept buffer counts against its owner's share, as before
                    self.finished.hold_output(job, job.ended or time.time())
        self.dev.prune(set(table.queued) | set(table.running) | table.waiting)
        if self.cfg.cgroups:
            gone = self.cgroups.prune(self.cfg.cgroup_root, set(table.running))
            if gone:
                notes.append(f"pruned leftover cgroups: {', '.join(gone)}")
        return [n for n in notes if n]

    # -- queries (queries.py) ---------------------------------------------------
    def reads(self) -> queries.Reads:
        """What the read models (queries.py) read, as it stands now."""
        return queries.Reads(self.table, self.machine, self.limits, self.cfg, self.store.job_dir, self.next_id,
                             self.policy_state, self.bench.watch.hold)

    def summary(self, job: Job) -> dict:
        """What ``dispatch list`` shows of a job (views.summary)."""
        return views.summary(job, self.machine)

    def why(self, job: Job) -> tuple[int | None, str | None]:
        """A job's place in the queue and why it is not running (queries.why)."""
        return queries.why(self.reads(), job)

    def show(self, caller: Caller, ref: int | str, now: float) -> dict[str, Any]:
        """``dispatch show`` (queries.show)."""
        return queries.show(self.reads(), caller, ref, now)

    def status(self, now: float, caller: Caller | None = None) -> dict[str, Any]:
        """``dispatch status`` (queries.status)."""
        return queries.status(self.reads(), now, caller)

    def lookup(self, caller: Caller, ref: int | str) -> Job:
        """The job *caller* names by id, NAME or USER:NAME, or Refused (queries.lookup)."""
        return queries.lookup(self.reads(), caller, ref)

    def array_of(self, caller: Caller, first: int) -> tuple[list[Job], int]:
        """The elements of array *first* the daemon holds and the array's size (queries.array_of)."""
        return queries.array_of(self.reads(), caller, first)

    # -- submit ---------------------------------------------------------------
    def submit(self, caller, req: NewJob, now: float) -> dict | bulks.Storing:
        """Queue a job (and start it if it fits); returns the reply fields, or for a bulk of more
        than bulks.SLICE jobs what the server holds the connection on while it is stored."""
        held = self.table.held_by_uid.get(caller.uid, 0) + self.turn.bulks.held(caller.uid)
        adm = admission.admit(self.cfg, self.machine, self.limits, uid=caller.uid, daemon_uid=os.geteuid(),
                              root_mode=self.root_mode, held=held,
                              short_of_room=self.store.short_of_room(self.cfg.state_reserve), req=req)
        elements, budget, bulk, shared_argv = adm.elements, adm.budget, adm.bulk, adm.shared_argv
        try:
            pw = self.passwd.getpwuid(caller.uid)
        except KeyError:
            raise Refused(f"uid {caller.uid} has no passwd entry; jobs run as a named user") from None
        after = admission.dependencies(req, lambda ref: self.lookup(caller, ref))
        first = self.next_id
        make = admission.Maker(req, adm, caller.uid, pw.pw_gid, pw.pw_name, first, after, now)

        env = {"forward": req.env, "job_env": req.job_env, "base": req.base_env}
        if len(elements) > bulks.SLICE:   # stored a slice per turn, answered once all of it is durable
            b = bulks.Bulk(uid=caller.uid, first=first, count=len(elements), make=make, env=env,
                           shared_argv=shared_argv,
                           reply=views.stored_bulk_reply(first, budget, mem_enforced=self.cfg.cgroups, name=req.name,
                                                         after=sorted(set(after)), after_ok=req.after_ok,
                                                         count=len(elements), limit=req.array_limit))
            self.next_id = first + len(elements)
            self.turn.bulks.add(b)
            log.info("jobs %d-%d from %s: storing %d jobs, a slice per turn", first, b.last, pw.pw_name, b.count)
            return bulks.Storing(b)
        made = [make(k) for k in range(len(elements))]
        self._persist_new(made, env, shared_argv)
        self.next_id = first + len(made)
        # A job it follows may have ended already: then each of them is looked at (in turns);
        # otherwise they wait, and the first end among their dependencies looks at them.
        look = any(self.jobs[dep].state == FINISHED for dep in after)
        for job in made:
            self._enter(job, look)
        if bulk:
            log.info("jobs %d-%d %s for %s (%d in one submit): %s", first, first + len(made) - 1,
                     made[0].state, made[0].user, len(made), made[0].shown[0])
        else:
            log.info("job %d %s for %s: %s", first, made[0].state, made[0].user, made[0].shown[0])
        for job in made:
            self.hooks.job_event(job.id, "submitted")
        # Whatever they wait on is looked at in the next turn, after the commit that acknowledges
        # them: a submit that commit refuses has then ended nothing (no history, no events).
        # Decide now, act after the reply is sent: the client waits neither for the spawn nor for
        # the start's writes (Starting.start puts them off until the reply's commit is done).
        self.pending = self.plan(now)
        starting = {j for j, _ in self.pending.starts} if self.pending is not None else set()
        reply = views.new_reply(made[0], budget, starts=first in starting, mem_enforced=self.cfg.cgroups)
        if bulk:
            reply.update(views.bulk_fields(first, len(made), len(starting), req.array_limit))
        return reply

    def _enter(self, job: Job, look: bool) -> None:
        """A stored new job enters the table, with its output buffer and /dev entry; *look*: one
        of the jobs it follows has ended already, so it is looked at (in turns)."""
        self.table.add(job)
        jdir = self.store.job_dir(job.id)
        try:
            devdir.create_output(jdir, job.uid, self.cfg.admin_gid)
        except OSError:
            pass
        self.turn.info_due.append(job.id)
        self.dev.add(job.id, job.uid, jdir)
        if job.state == WAITING and look:
            self.ending.to_settle.append(job.id)

    # -- bulk submits stored a slice per turn (bulks.py) -------------------------
    def store_bulks(self, now: float) -> None:
        """Give the oldest bulk under way this turn's slice (bulks.Queue.slice)."""
        if self.turn.bulks.slice(self._enter_submitted, lambda dep: dep not in self.jobs
                                 or self.jobs[dep].state == FINISHED):
            self.turn.resched = True

    def _enter_submitted(self, job: Job, look: bool) -> None:
        self._enter(job, look)
        self.hooks.job_event(job.id, "submitted")

    def take_bulk_replies(self) -> list[tuple[Any, dict[str, Any] | Refused]]:
        """Answers to bulk submits (bulks.Queue.take_replies); once."""
        return self.turn.bulks.take_replies()

    def _persist_new(self, made: list, env: dict, shared_argv: list | None) -> None:
        """Write new jobs' records and stage them for this turn's commit; refuse (nothing kept) on failure.

        However many jobs a request (or a turn of the loop) submits, they are
        made durable together, by one fsync, before any of them is acknowledged.
        """
        try:
            self.store.add_jobs(made, env, self.cfg.admin_gid, shared_argv)
        except OSError as exc:
            why = "the state directory's disk is full" if is_disk_full(exc) else exc.strerror
            log.error("job %d refused: cannot persist it: %s", made[0].id, exc)
            raise Refused(f"cannot store the job ({why}); nothing was queued, try again later",
                          "busy") from None
        self.turn.submitted.update(job.id for job in made)

    def run_pending(self, now: float) -> None:
        """Carry out a decision made while answering a request."""
        decision, self.pending = self.pending, None
        if decision is not None:
            self.apply(decision, now)

    def _move(self, job: Job, to: str, now: float, result: Result | None = None,
              running: Running | None = None) -> Running | None:
        """The table records the move; then what the engine does about the queue it leaves behind."""
        was = job.state
        gone = self.table.move(job, to, now, result, running)
        if was == QUEUED:
            self._left_queue()
        return gone

    def _left_queue(self) -> None:
        if not self.table.strict_queued:
            self.bench.forget()   # no strict benchmark job waits: the next starts from fresh readings

    def _info(self, job: Job) -> dict:
        """The job's /dev entry's info.json (views.dev_info)."""
        return views.dev_info(job, self.machine)

    # -- scheduling -----------------------------------------------------------
    def schedule(self, now: float) -> None:
        """Run one scheduling pass and carry out its decision."""
        self.pending = None
        decision = self.plan(now)
        if decision is not None:
            self.apply(decision, now)

    def plan(self, now: float) -> scheduler.Decision | None:
        """One scheduling pass (pure): the Decision, or None with nothing queued."""
        if not self.table.queued:
            return None
        running = [scheduler.RunningJob(jid, r.alloc, (self.jobs[jid].deadline or now))
                   for jid, r in self.table.running.items()]
        return scheduler.schedule(self.cfg.schedule, self._eligible(now), running,
                                  self.machine, self.limits, self.policy_state, now)

    def apply(self, decision: scheduler.Decision, now: float) -> None:
        """Carry out a Decision: persist policy state, fail and start jobs."""
        if decision.state != self.policy_state:
            self.policy_state = decision.state
            self.save_meta()
        for job_id, reason in decision.failures:
            self.ending.finish(self.jobs[job_id], Result(ERROR, note=f"can never start here: {reason}"), now)
        for job_id, alloc in decision.starts:
            job = self.jobs[job_id]
            try:
                self.starting.start(job, alloc, now)
            except Exception as exc:  # one job that cannot start must not stop the others
                log.exception("job %d: cannot start it", job_id)
                self.ending.fail(job, f"the daemon could not start it: {exc}", now)

    def _eligible(self, now: float) -> Iterable[scheduler.QueuedJob]:
        """The queue, less elements of an array already running its %N at once.

        They wait without holding up the jobs behind them, as a Slurm array's
        throttled tasks do. Without capped arrays queued this is the queue as is.
        Lazy: a policy that stops at a blocked head (fifo-strict) reads no
        further, so a pass over 100,000 queued jobs costs what it looks at.
        """
        queue = self.table.in_order()
        # Strict benchmark jobs wait while the machine is not quiet, holding up nobody behind them.
        hold = self.bench.hold(now) if self.table.strict_queued else None
        if not self.table.capped_queued and hold is None:
            return queue.values()
        return self._throttled(queue.values(), hold is not None)

    def _throttled(self, queue: Iterable[scheduler.QueuedJob], hold: bool) -> Iterator[scheduler.QueuedJob]:
        room = queries.array_room(self.table)
        for q in queue:
            if hold and q.request.benchmark == "strict":
                continue
            a = self.jobs[q.id].array
            if a is not None and a.get("limit"):
                left = room.get(a["first"], a["limit"])
                if left <= 0:
                    continue
                room[a["first"]] = left - 1
            yield q

    def _reset_policy(self) -> None:
        self.policy_state = {}

    def save_meta(self) -> bool:
        """Persist the id floor and policy state; on failure retry from the tick."""
        try:
            floor = self.next_id
            self.store.save_meta({"next_id": floor, "policy_state": self.policy_state})
            self.turn.meta_dirty = False
            self.saved_floor = floor
            return True
        except OSError as exc:
            log.error("cannot write daemon.json (%s); will retry", exc)
            self.turn.meta_dirty = True
            return False

    def end_turn(self, now: float, meanwhile: Callable[[set[int]], None] | None = None, *,
                 schedule: bool = False, bulks: bool = False, held: Callable[[], bool] | None = None) -> set[int]:
        """End a turn: commit what it changed (one fsync for all), then spawn what it started.

        The loop's turns first give the oldest bulk under way its slice (*bulks*) and hand out
        what the turn's ends freed (*schedule*), so those starts ride the same commit.
        *meanwhile* (the server's held replies, given the ids of the submits the commit refused)
        is called while the first shepherd forks (:meth:`spawn_turn`); replies the spawns gave
        rise to (*held* says there are some) go after one more commit. Returns the refused ids.
        In a turn that answers submits, the starts it made are written only once those answers
        are out (Starting.write_put_off), and are made durable by a second commit.
        """
        if bulks:
            self.store_bulks(now)
        if schedule:
            self.reschedule(now)
        refused = self.commit_turn(now)
        send = None if meanwhile is None else lambda: meanwhile(refused)
        if self.turn.to_write:
            self.starting.show_put_off()   # a client that reads its job's /dev entry at once finds it
            if send is not None:
                send()
                send = None
            self.starting.write_put_off(now)
            self.commit_turn(now)   # none of it a submit: no reply to void
        # The fork is asked for first, so it is under way while the replies wake their clients;
        # a submit is still answered before its shepherd's answer is read.
        self.spawn_turn(now, send)
        self.turn.shown.clear()
        if meanwhile is not None and held is not None and held():   # spawn_turn committed their cause
            meanwhile(self.commit_turn(now))
        return refused

    def reschedule(self, now: float) -> None:
        """Hand out what this turn's ends freed now, so their starts ride the turn's one commit
        (one fdatasync for an end and the start it makes room for, not one each)."""
        if self.turn.resched:
            self.turn.resched = False
            self.schedule(now)

    def commit_turn(self, now: float) -> set[int]:
        """Make what this turn changed durable, in one fsync.

        Returns the ids of jobs submitted this turn that the commit could not
        make durable: they are gone again, and their submitters must be told.
        """
        refused: set[int] = set()
        due, self.turn.info_due = self.turn.info_due, []
        for job in map(self.jobs.get, due):
            if job is not None and job.state in (QUEUED, WAITING):
                try:
                    devdir.write_info(self.store.job_dir(job.id), self._info(job), job.uid, self.cfg.admin_gid)
                except OSError:
                    pass
        try:
            self.store.commit(now)
        except OSError as exc:
            refused = self._commit_failed(exc, now)
            self.turn.bulks.committed(exc)
        else:
            self.turn.bulks.committed(None)
        self.turn.submitted.clear()
        return refused

    def spawn_turn(self, now: float, meanwhile=None) -> None:
        """Spawn the jobs this turn started (their records are durable by now).

        *meanwhile* (the server's held replies) is called once: while the fork
        server forks the first shepherd, so the fork starts before the clients
        are woken, or at once when there is nothing to spawn.
        """
        pending = meanwhile

        def once() -> None:
            nonlocal pending
            fn, pending = pending, None
            if fn is not None:
                fn()

        while self.turn.to_spawn:
            spawns, self.turn.to_spawn = self.turn.to_spawn, []
            for job, cg in spawns:
                try:
                    self.starting.spawn(job, cg, now, once)
                except Exception as exc:  # one job that cannot start must not stop the others
                    once()   # (the replies go before any end a failure makes: theirs is committed)
                    log.exception("job %d: cannot start it", job.id)
                    self.ending.fail(job, f"the daemon could not start it: {exc}", now)
            once()
            if self.commit_turn(now):   # a spawn that failed ended its job (and may have started another)
                break
        once()

    def _commit_failed(self, exc: OSError, now: float) -> set[int]:
        """Undo what a failed commit would have made durable: new jobs go, starts go back to the queue.

        Anything else staged (ends, evictions) stays staged for the next commit.
        """
        log.error("cannot write the journal (%s); this turn's submits are refused and its starts wait", exc)
        refused = set(self.turn.submitted)
        # In whatever state this turn left them (one may have ended already: a dependency ended).
        withdrawn = [job for job in map(self.jobs.get, refused) if job is not None]
        self.table.forget(withdrawn)
        self._left_queue()
        for job in withdrawn:
            self.dev.remove(job.id)
            self.store.remove_job(job.id)
        self.store.forget(refused)
        for job, cg in self.turn.to_spawn:
            if job.id in refused:
                self.starting.drop_cgroup(cg)
                continue
            self.starting.drop_cgroup(cg)
            self._move(job, QUEUED, now)
            self.starting.unshow(job)
            try:
                os.unlink(os.path.join(self.store.job_dir(job.id), records.LAUNCH))
                self.store.save_job(job)   # queued again: the store keeps its environment
            except OSError:
                self.turn.unsaved.add(job.id)
        self.turn.to_spawn = []
        self.turn.retry_at = now + 2.0
        return refused

    # -- ending (ending.py) -----------------------------------------------------
    def shepherd_exited(self, job_id: int) -> None:
        """A shepherd's pidfd became readable: collect the job."""
        self.ending.exited(job_id)

    @property
    def unsettled(self) -> bool:
        """True while waiting jobs are still to be looked at (the loop then turns again at once)."""
        return self.ending.unsettled

    # -- the history archive (finished.py) --------------------------------------
    def archived(self, ids: list[int]) -> None:
        """The archive made these jobs' rows durable: evict those that waited for it."""
        for job_id in self.finished.archived(ids):
            self.eviction.forget(self.jobs[job_id])

    def archive_query(self, caller: Caller, kind: str, ref: Any, now: float,
                      filters: archive.Filters | None = None, refs: tuple = ()) -> archive.Query:
        """A question for the archive's reader, as *caller* may ask it."""
        return archive.Query(kind=kind, uid=caller.uid, is_admin=caller.is_admin,
                             list_public=self.cfg.list_is_public, token=None, ref=ref, refs=refs,
                             filters=filters, next_id=self.next_id, now=now)

    # -- changing a job ----------------------------------------------------------
    def job_setting(self, caller: Caller, req: JobSetting, now: float) -> dict[str, Any]:
        """``dispatch job ID max-time ...``: the owner reads, only admins change (deadlines.py)."""
        return self.deadlines.setting(caller, self.lookup(caller, req.id), req, now)

    # -- kill and timeouts ------------------------------------------------------
    def kill(self, caller: Caller, ref: int | str, now: float) -> dict[str, Any]:
        """Cancel a queued or waiting job (it never runs: ``cancelled``), or stop a running one (``killed``)."""
        job = self.lookup(caller, ref)
        if job.state in (QUEUED, WAITING):
            was = job.state
            self.ending.finish(job, Result(CANCELLED, note=f"cancelled by {caller.name} before it started"), now)
            self.turn.resched = True
            return views.kill_reply(job.id, was)
        if job.state == FINISHED:
            raise Refused(f"job {job.id} has already finished", "finished")
        self.deadlines.stop(job, KILLED, now)
        return views.kill_reply(job.id, RUNNING)

    def tick(self, now: float) -> float | None:
        """Schedule if needed, enforce --max-time, retry what failed; returns when to call again."""
        if self.turn.retry_at is not None and now >= self.turn.retry_at:
            self.turn.retry_at, self.turn.resched = None, True
        if self.unsettled:
            self.ending.settle(now)
        if self.table.strict_queued and self.bench.look(now):
            self.turn.resched = True   # quiet now (or no longer): strict benchmark jobs are looked at again
        if self.turn.resched:
            self.turn.resched = False
            self.schedule(now)
        wake = self.turn.retry_at
        if self.table.strict_queued:
            wake = self.bench.watch.due(now) if wake is None else min(wake, self.bench.watch.due(now))
        for job_id in list(self.table.running):
            try:
                due = self.deadlines.tick_job(job_id, now)
            except Exception as exc:  # one job's trouble ends that job, not the daemon
                log.exception("job %d: error while checking it", job_id)
                self.ending.fail(self.jobs[job_id], f"the daemon failed while checking it: {exc}", now)
                continue
            if due is not None:
                wake = due if wake is None else min(wake, due)
        if self.starting.stale_cgroups and self.starting.retry_stale_cgroups():
            wake = now + 1 if wake is None else min(wake, now + 1)
        if self.turn.meta_dirty or self.turn.unsaved:
            self.eviction.retry_unsaved()
            wake = now + 2 if wake is None else min(wake, now + 2)
        sweep = self.finished.tick(now)   # undelivered/ past its bounds, every few minutes
        wake = sweep if wake is None else min(wake, sweep)
        if self.unsettled or self.store.compacting:   # more to do: the loop turns again at once
            wake = now
        return wake


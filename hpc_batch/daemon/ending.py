"""How a job ends: its shepherd collected, its end recorded, the jobs waiting on it looked at.

A shepherd's pidfd becoming readable is :meth:`Ending.exited`; the exit
record it left (or its absence) becomes the job's :class:`Result`
(``outcome.py``), and :meth:`Ending.end` records it: the job's files, its
indexes, its quiet cores handed back, its history row. The jobs that wait
on it are then settled (:meth:`Ending.settle`) from a work list, a bounded
number per call, so one end that releases or dooms 10,000 dependents never
holds the loop. Like the engine's other rooms this one holds no reference to
the engine: the two things of the engine's it needs (a state move, which
also tells benchmark mode the queue changed, and the start chain's way back
to the queue) are given as callables, as is eviction (which itself settles).
"""

import logging
import os
import time
from collections import deque
from collections.abc import Callable

from shepherd.base import records

from ..core import dependencies
from ..core.jobs import (
    DEPENDENCY_FAILED,
    ERROR,
    FINISHED,
    KILLED,
    OOM,
    QUEUED,
    RUNNING,
    WAITING,
    Job,
    Result,
    exit_column,
)
from ..core.jobtable import JobTable
from . import devdir, outcome
from . import engineparts as parts
from .benchcores import BenchCores
from .finished import Finished
from .starting import Starting
from .turn import Turn

log = logging.getLogger("hpc-batchd")

SETTLE_BATCH = 100   # waiting jobs settled per call of Ending.settle (the rest: next turn); each may
SETTLE_SLICE = 0.02  # write a record (1 to 20 ms on a busy disk): a call also stops after this long


class Ending:
    """The end of the daemon's jobs and the settling of their dependents."""

    def __init__(self, store: parts.Store, table: JobTable, turn: Turn, launcher: parts.Launcher,
                 cgroups: parts.Cgroups, hooks: parts.Hooks, dev: devdir.DevDir, bench: BenchCores,
                 finished: Finished, starting: Starting, *, move: Callable[..., object],
                 not_now: Callable[[Job, object, str, float], None], evict: Callable[[int], None]):
        self.store = store
        self.table = table
        self.jobs = table.jobs
        self.turn = turn
        self.launcher = launcher
        self.cgroups = cgroups
        self.hooks = hooks
        self.dev = dev
        self.bench = bench
        self.finished = finished
        self.starting = starting
        self.move = move          # the engine's: the table's move, then what a queue change means
        self.not_now = not_now    # the start chain's: a job that could not start goes back to the queue
        self.evict = evict        # eviction.py: finished jobs past --keep-finished
        # Waiting jobs to look at again, and ended jobs whose dependents are still to be looked at:
        # settled a bounded number per turn, so releasing 10,000 dependents never stalls the loop.
        self.to_settle: deque[int] = deque()
        self.ended_deps: deque[int] = deque()

    def exited(self, job_id: int) -> None:
        """A shepherd's pidfd became readable: collect the job."""
        try:
            self.collect(job_id)
        except Exception as exc:
            log.exception("job %d: cannot collect it", job_id)
            self.fail(self.jobs[job_id], f"the daemon could not collect its end: {exc}", time.time())

    def collect(self, job_id: int, shepherd_gone: str | None = None, kind: str = KILLED) -> None:
        handle = self.table.running.get(job_id)
        job = self.jobs[job_id]
        if handle is None:
            return
        if handle.pidfd is not None:
            self.hooks.unwatch_pidfd(handle.pidfd)
            os.close(handle.pidfd)
            handle.pidfd = None
        if handle.pid:
            self.launcher.reap(handle.pid)
        jdir = self.store.job_dir(job_id)
        rec = records.read_record(os.path.join(jdir, records.EXIT), records.ExitRecord)
        cg = handle.cgroup
        now = time.time()
        kept = os.path.join(jdir, records.OUTPUT)
        if rec is None and shepherd_gone is None:
            # Another shepherd holds the job's lock (a fork that answered late, after this one was
            # started in its stead, which then found the job taken): that one is the job's.
            found = self.launcher.adopt(jdir)
            if found is not None:
                log.warning("job %d: its shepherd is pid %d (the one started for it found it taken)",
                            job_id, found[0])
                handle.pid, handle.pidfd = found
                self.hooks.watch_pidfd(found[1], job_id)
                return
        if rec is None:
            # The shepherd died without an exit record: end what is left of the job.
            oom = bool(cg and self.cgroups.oom_killed(cg))
            if cg:
                self.starting.drop_cgroup(cg)
            else:
                self.launcher.kill_orphaned_job(jdir)
            if job.output is not None and os.path.exists(kept):
                job.output_error = f"its shepherd died before delivering it; the output is kept at {kept}"
            note = shepherd_gone or "its shepherd was killed before the job ended"
            self.finish(job, Result(OOM if oom else kind, note=note), now)
            return
        if rec.not_started is not None and job.stop_reason:   # asked to stop while its shepherd retried
            self.starting.drop_cgroup(cg)
            self.finish(job, Result(job.stop_reason, note=f"stopped before it could start: {rec.error}"), now)
            return
        if rec.not_started in records.NOT_NOW_NAMES:
            # Its shepherd could not fork it: it never ran, and goes back to the queue.
            self.not_now(job, cg, rec.error or f"its shepherd could not fork it ({rec.not_started})", now)
            return
        if cg and os.path.isdir(cg):
            self.starting.drop_cgroup(cg)
        job.stats.update(outcome.stats_of(rec))
        self.finish(job, outcome.result_of(job, rec), rec.ended if rec.ended is not None else now)

    def _delivery(self, job: Job) -> None:
        """What became of the output, from delivery.json (or its absence)."""
        jdir = self.store.job_dir(job.id)
        kept = os.path.join(jdir, records.OUTPUT)
        delivery = records.read_record(os.path.join(jdir, records.DELIVERY), records.DeliveryRecord)
        note, error = outcome.delivery_of(job.output, delivery, kept, os.path.exists(kept))
        if note is not None:
            job.output_note = note
        if error is not None:
            job.output_error = error

    def finish(self, job: Job, result: Result, now: float) -> None:
        """End *job* with *result*, then look at the jobs waiting on it (a bounded number now)."""
        self.end(job, result, now)
        self.ended_deps.append(job.id)
        self.settle(now)

    def end(self, job: Job, result: Result, now: float) -> None:
        """End one job: its record, its files, its indexes. Never looks at other jobs' dependencies."""
        if job.state == RUNNING and os.path.exists(os.path.join(self.store.job_dir(job.id), records.EXIT)):
            self._delivery(job)
        if job.bench_start is not None and job.state == RUNNING:
            # What its counters say happened while it ran is added to its shortfalls.
            before, job.bench_start = job.bench_start, None
            shortfalls = self.bench.end_shortfalls(job, before, now)
            if shortfalls is not None:
                job.shortfalls = shortfalls
        handle = self.move(job, FINISHED, now, result)
        if handle is not None:
            self.starting.unquiet(job)
        try:
            # Durable only when no exit record stands behind it (errors decided here).
            has_record = os.path.exists(os.path.join(self.store.job_dir(job.id), records.EXIT))
            self.store.save_job(job, durable=not has_record)
        except OSError as exc:
            log.error("job %d: cannot record its end (%s); will retry", job.id, exc)
            self.turn.unsaved.add(job.id)
        self.store.release(job.id, keep_output=job.output_error is not None)
        if job.output_error is not None:
            self.finished.hold_output(job, now)
        self.dev.remove(job.id)
        log.info("job %d finished: %s%s", job.id, exit_column(result),
                 f" ({result.note})" if result.note else "")
        self.finished.put(job)
        self.hooks.job_event(job.id, "finished")
        self.evict(job.uid)
        if handle is not None:
            self.turn.resched = True  # freed resources: the next tick schedules (never re-entrantly)

    @property
    def unsettled(self) -> bool:
        """True while waiting jobs are still to be looked at (the loop then turns again at once)."""
        return bool(self.to_settle or self.ended_deps)

    def settle(self, now: float, budget: int | None = None) -> None:
        """Look at waiting jobs whose dependencies may have changed: queue the ready, fail the doomed.

        A work list, never recursion: a job failed here adds its own dependents
        to the list, so a failed --after-ok fails any number of dependents, and
        any depth of chains, in bounded stack. Each ended job's dependents come
        from the reverse index, so an end looks only at its own dependents. At
        most *budget* (``SETTLE_BATCH``) jobs and about SETTLE_SLICE seconds a call
        (one job at least); the rest wait for the next turn, so one release of
        10,000 jobs never holds the loop for long.
        """
        budget = SETTLE_BATCH if budget is None else budget
        until = time.monotonic() + SETTLE_SLICE
        while budget > 0 and time.monotonic() < until:
            if not self.to_settle:
                if not self.ended_deps:
                    return
                self.to_settle.extend(sorted(self.table.take_dependents(self.ended_deps.popleft())))
                continue
            job_id = self.to_settle.popleft()
            job = self.jobs.get(job_id)
            if job is None or job.state != WAITING:
                continue
            budget -= 1
            verdict, why = dependencies.evaluate(job, self.jobs.get)
            if verdict == dependencies.FAILED:
                self.end(job, Result(DEPENDENCY_FAILED, note=why), now)
                self.ended_deps.append(job.id)
            elif verdict == dependencies.READY:
                self.move(job, QUEUED, now)
                try:
                    self.store.save_job(job)
                except OSError as exc:
                    log.error("job %d: cannot record that it is queued (%s); will retry", job.id, exc)
                    self.turn.unsaved.add(job.id)
                self.turn.resched = True

    def fail(self, job: Job, why: str, now: float) -> None:
        """End one job as ``error`` after something went wrong acting on it."""
        if job.state == FINISHED:
            return
        handle = self.table.running.get(job.id)
        if handle is not None and handle.pidfd is not None:
            self.hooks.unwatch_pidfd(handle.pidfd)
            os.close(handle.pidfd)
            handle.pidfd = None
        if job.state == RUNNING:
            try:  # best effort: whatever failed may fail again here
                self.launcher.request_stop(self.store.job_dir(job.id), KILLED)
                self.starting.drop_cgroup(handle.cgroup if handle is not None else None)
            except Exception:
                log.exception("job %d: cannot stop it after an error; its shepherd may run on", job.id)
        try:
            self.finish(job, Result(ERROR, note=why), now)
        except Exception:
            log.exception("job %d: cannot even record its failure", job.id)
            self.table.detach(job.id)

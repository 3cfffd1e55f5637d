"""A job's max time and the stop requests to its shepherd: the setting, the deadline, the tick's check.

``dispatch job ID max-time`` reads or changes the terms a job was admitted
under (:meth:`Deadlines.setting`); a running job's new deadline goes to its
shepherd (:meth:`Deadlines.send`), retried until it is heard. A job past its
deadline, or one a user killed, is stopped by a line on its shepherd's
control FIFO (:meth:`Deadlines.stop`), repeated until the shepherd reads it;
the shepherd does the signalling and the grace. :meth:`Deadlines.tick_job`
is the tick's check of one running job. A job's end is the engine's (its
shepherd exits and is collected), so this room never moves a job's state;
like the engine's other rooms it holds no reference to the engine, and is
given the one thing of the engine's it changes (the scheduling policy's
state, forgotten) and recovery's second look at a starting shepherd as
callables.
"""

import logging
from collections.abc import Callable
from typing import Any

from shepherd.base import records

from .. import bounds
from ..core import views
from ..core.durations import format_duration
from ..core.jobs import FINISHED, KILLED, QUEUED, TIMEOUT, Job
from ..core.jobtable import JobTable
from ..wire.protocol import JobSetting
from . import engineparts as parts
from .access import Caller
from .refusal import Refused
from .turn import Turn

log = logging.getLogger("hpc-batchd")

STOP_RETRY = 0.5   # seconds between stop requests while no shepherd reads its FIFO yet


class Deadlines:
    """Max times, deadlines and stop requests of the daemon's jobs."""

    def __init__(self, cfg, store: parts.Store, table: JobTable, turn: Turn, launcher: parts.Launcher,
                 reset_policy: Callable[[], None], recheck: Callable[[int], None]):
        self.cfg = cfg
        self.store = store
        self.table = table
        self.jobs = table.jobs
        self.turn = turn
        self.launcher = launcher
        self.reset_policy = reset_policy   # the engine's: its policy state planned on the old deadlines
        self.recheck = recheck             # recovery.recheck: a second look at a shepherd that was starting

    def setting(self, caller: Caller, job: Job, req: JobSetting, now: float) -> dict[str, Any]:
        """``dispatch job ID max-time ...`` on *job*: the owner reads, only admins change."""
        if req.action != "get":
            if not caller.is_admin:
                raise Refused(f"only members of the admin group may change job {job.id}'s max time "
                              f"(it was admitted with {format_duration(job.max_time)})", "forbidden")
            if job.state == FINISHED:
                raise Refused(f"job {job.id} has already finished", "finished")
            assert req.seconds is not None  # the protocol pairs set and add with seconds
            new = req.seconds if req.action == "set" else job.max_time + req.seconds
            if new > bounds.MAX_SECONDS:
                raise Refused(f"a max time of {format_duration(new)} is past the largest this daemon keeps")
            old, job.max_time = job.max_time, new
            try:
                self.store.save_job(job)
            except OSError as exc:
                job.max_time = old
                raise Refused(f"cannot store the change ({exc.strerror}); nothing changed, try again later",
                              "busy") from None
            if job.state == QUEUED:
                self.table.refresh(job)
            elif job.id in self.table.running:
                self.send(job, now)
            if self.cfg.schedule == "strict-backfill":
                self.reset_policy()   # the head's reserved start rests on every running job's deadline
            self.turn.resched = True
            log.info("job %d: max time %s -> %s by %s", job.id, format_duration(old), format_duration(new),
                     caller.name)
        return views.setting_reply(job)

    def send(self, job: Job, now: float) -> None:
        """Tell the job's shepherd its new deadline; retried from the tick until it is heard."""
        sent = job.deadline is not None and self.launcher.send_deadline(self.store.job_dir(job.id), job.deadline)
        self.table.running[job.id].deadline_resend_at = None if sent else now + STOP_RETRY

    def stop(self, job: Job, reason: str, now: float) -> None:
        """Ask the job's shepherd to stop it; the shepherd does the signalling and the grace."""
        if job.stop_sent is None:
            job.stop_reason, job.stop_sent = reason, now
            try:
                self.store.save_job(job)
            except OSError as exc:
                log.error("job %d: cannot record the stop (%s)", job.id, exc)
            log.info("job %d: %s, asking its shepherd to stop it", job.id, reason)
        heard = self.launcher.request_stop(self.store.job_dir(job.id), job.stop_reason or reason)
        handle = self.table.running.get(job.id)
        if handle is not None:
            handle.stop_heard = heard
            handle.next_stop_at = now + (records.LaunchSpec.KILL_GRACE if heard else STOP_RETRY)

    def tick_job(self, job_id: int, now: float) -> float | None:
        """Deadline and stop bookkeeping for one running job; returns its next due time."""
        handle = self.table.running[job_id]
        if handle.recheck_at is not None:
            if now >= handle.recheck_at:
                self.recheck(job_id)
                return None
            return handle.recheck_at
        if handle.deadline_resend_at is not None and now >= handle.deadline_resend_at:
            self.send(self.jobs[job_id], now)
        due = self.stop_due(job_id, now)
        retry = handle.deadline_resend_at
        return retry if due is None or (retry is not None and retry < due) else due

    def stop_due(self, job_id: int, now: float) -> float | None:
        job = self.jobs[job_id]
        handle = self.table.running[job_id]
        if job.stop_sent is not None:
            # Repeat the request: the shepherd may not have made its FIFO yet.
            again = handle.next_stop_at or now
            if now >= again:
                self.stop(job, job.stop_reason or KILLED, now)
                again = handle.next_stop_at or now
            return again
        deadline = job.deadline
        if deadline is not None and now >= deadline:
            self.stop(job, TIMEOUT, now)
            return handle.next_stop_at
        return deadline

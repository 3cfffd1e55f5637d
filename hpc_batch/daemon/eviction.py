"""Finished jobs forgotten past --keep-finished, and job records whose write failed, retried.

Each user keeps at most --keep-finished finished jobs in the daemon; an end
past that evicts the oldest (:meth:`Eviction.evict`), once its archive row
is durable (finished.py) and once the id floor in daemon.json covers it, so
no id is ever reused. An evicted job's files go, and each waiting job that
names it first keeps how it ended (:meth:`Eviction.forget`). Records whose
write failed (a full disk) are retried from the tick (:meth:`Eviction.retry_unsaved`),
daemon.json's with them, as an eviction's floor is.

Like the engine's other rooms this holds no reference to the engine: it
is given the table, the store, the turn, the finished room and the work
list of waiting jobs to look at, and the engine's id floor (what daemon.json
holds, and its save) as callables.
"""

import logging
from collections import deque
from collections.abc import Callable

from ..core import dependencies
from ..core.jobs import Job
from ..core.jobtable import JobTable
from . import engineparts as parts
from .finished import Finished
from .turn import Turn

log = logging.getLogger("hpc-batchd")


class Eviction:
    """The bound on each user's finished jobs, and the retry of records not yet written."""

    def __init__(self, cfg, store: parts.Store, table: JobTable, turn: Turn, finished: Finished,
                 to_settle: deque[int], saved_floor: Callable[[], int], save_meta: Callable[[], bool]):
        self.cfg = cfg
        self.store = store
        self.table = table
        self.jobs = table.jobs
        self.turn = turn
        self.finished = finished
        self.to_settle = to_settle         # ending.py's work list of waiting jobs to look at
        self.saved_floor = saved_floor     # the next_id daemon.json holds: ids below it are never reused
        self.save_meta = save_meta         # the engine's: persist the id floor and policy state

    def retry_unsaved(self) -> None:
        """Retry records whose write failed (a full disk)."""
        for job_id in list(self.turn.unsaved):
            if job_id not in self.jobs:
                self.turn.unsaved.discard(job_id)
                continue
            try:
                self.store.save_job(self.jobs[job_id])
                self.turn.unsaved.discard(job_id)
            except OSError:
                pass
        if self.turn.meta_dirty:
            self.save_meta()

    def evict(self, uid: int) -> None:
        """Forget the user's oldest finished jobs past --keep-finished (a heap: no scan of all jobs);
        one whose archive row is not durable yet goes once it is (``Engine.archived``)."""
        ids = self.table.take_evictable(uid, self.cfg.keep_finished)
        if not ids:
            return
        # The persisted id floor must outlive the records it replaces; it usually already does.
        if max(ids) >= self.saved_floor() and not self.save_meta():
            self.table.put_back(uid, ids)
            return
        for job in [self.jobs[i] for i in ids]:
            if not self.finished.evict_later(job.id, uid):
                self.forget(job)

    def forget(self, job: Job) -> None:
        """Evict one finished job: its files go, and each waiting job that names it keeps how it
        ended (in the same batch as the drop), so no waiting job holds it past --keep-finished."""
        waiting = self.table.followers.get(job.id, ())
        if waiting:
            entry = dependencies.ended_entry(job)
            try:
                for wid in sorted(waiting):
                    w = self.jobs[wid]
                    if not any(e[0] == job.id for e in w.after_ended):
                        w.after_ended.append(entry)
                    self.store.save_job(w)
            except OSError as exc:   # it stays (past the bound) until a waiting job can keep its end
                log.error("job %d: cannot evict it (%s): a job that waits on it could not record how "
                          "it ended; will try again", job.id, exc)
                self.table.put_back(job.uid, [job.id])
                return
        # Ended and evicted in one turn: the jobs still to look at for its end are looked at now.
        self.to_settle.extend(sorted(self.table.take_dependents(job.id)))
        if job.output_error:
            self.finished.keep_undelivered(job)
        self.store.remove_job(job.id)
        self.table.forget([job])

"""Where a finished job goes: the history archive, and its output if it was not delivered.

Every finished job goes on to the history archive (archive.py, written on
its own thread); its directory is evicted only once its row is durable
there. A job whose output could not be delivered keeps its buffer in its
directory, counted against its owner's --undelivered-per-user
(undelivered.py), and moved to undelivered/ when the job is evicted; a
buffer the bounds drop is noted in its job's record.

The engine calls this room as its jobs end and go; it holds no reference
to the engine, only to what it is given: the store, the job table's jobs
and the turn (whose ``unsaved`` set takes a record it could not write).
"""

import logging
import os
import time

from shepherd.base import records

from ..core import views
from ..core.jobs import Job
from . import archive
from . import engineparts as parts
from .turn import Turn
from .undelivered import Bounds as UndeliveredBounds
from .undelivered import Undelivered

log = logging.getLogger("hpc-batchd")


class Finished:
    """The history archive and the undelivered buffers of the daemon's finished jobs."""

    def __init__(self, cfg, store: parts.Store, machine, jobs: dict[int, Job], turn: Turn,
                 history: archive.Archive | None = None):
        self.store = store
        self.machine = machine
        self.jobs = jobs
        self.turn = turn
        # unarchived: finished, its row not durable yet; evict_archived: evicted, waiting for it.
        self.archive = history if history is not None else archive.Archive(
            store.root, cfg.history_per_user, cfg.history_days)
        self.unarchived: set[int] = set()
        self.evict_archived: dict[int, int] = {}
        self.undelivered = Undelivered(store.root, UndeliveredBounds(
            cfg.undelivered_max, cfg.undelivered_per_user, cfg.undelivered_max_age))

    def put(self, job: Job, if_absent: bool = False) -> None:
        """Hand a finished job to the archive's writer (its record is read there, off the loop)."""
        row = views.history_row(job)
        try:
            doc = views.show(job, self.machine, position=None, why=None, cgroup=None, now=job.ended or 0.0)
        except Exception:   # a record too damaged to describe (its allocation): keep what the row says
            log.exception("job %d: cannot describe it for the history; keeping its summary row", job.id)
            doc = dict(row)
        command, length = job.shown
        if length > len(command):   # a huge command is kept cut, as the listing shows it
            doc.update(command=command, argv=None)
        res = job.result
        rec = os.path.join(self.store.job_dir(job.id), records.RECORD) if job.started is not None else None
        if not self.archive.put(archive.Entry(
                id=job.id, uid=job.uid, user=job.user, name=job.name,
                array_first=job.array.get("first") if isinstance(job.array, dict) else None,
                result=res.kind if res else None, code=res.code if res else None, started=job.started,
                ended=job.ended or 0.0, row=row, show=doc, record_path=rec, if_absent=if_absent)):
            self.unarchived.add(job.id)

    def evict_later(self, job_id: int, uid: int) -> bool:
        """True if *job_id*'s row is not durable yet: it is evicted once it is (:meth:`archived`)."""
        if job_id not in self.unarchived:
            return False
        self.evict_archived[job_id] = uid
        self.archive.want_durable()
        return True

    def archived(self, ids: list[int]) -> list[int]:
        """The archive made these jobs' rows durable: those that waited for it, to evict now."""
        out = []
        for job_id in ids:
            self.unarchived.discard(job_id)
            if self.evict_archived.pop(job_id, None) is not None and job_id in self.jobs:
                out.append(job_id)
        return out

    def keep_undelivered(self, job: Job) -> None:
        """An evicted job's undelivered buffer moves from its directory to undelivered/."""
        self.undelivered.keep(job.id, job.user, os.path.join(self.store.job_dir(job.id), records.OUTPUT), time.time())
        self.note_dropped()

    def hold_output(self, job: Job, when: float) -> None:
        """A job ended with its output undelivered: its buffer, kept in its directory (where its user
        reads it), counts against its owner's --undelivered-per-user from *when*, its end."""
        self.undelivered.hold(job.id, job.user, os.path.join(self.store.job_dir(job.id), records.OUTPUT), when)
        self.note_dropped()

    def note_dropped(self) -> None:
        """Jobs whose kept buffer the undelivered bounds dropped: their records say so."""
        for job_id, why in self.undelivered.take_dropped():
            job = self.jobs.get(job_id)
            if job is None or not job.output_error:
                continue
            job.output_error = f"{job.output_error.split('; the output is kept at ')[0]}; the output was " \
                               f"dropped ({why})"
            try:
                self.store.save_job(job)
            except OSError:
                self.turn.unsaved.add(job.id)

    def tick(self, now: float) -> float:
        """Sweep undelivered/ past its bounds (every few minutes); returns when to sweep again."""
        sweep = self.undelivered.tick(now)
        self.note_dropped()
        return sweep

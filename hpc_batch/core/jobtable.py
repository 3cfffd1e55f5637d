"""Every job the engine knows and every index that follows from their states, with one move.

The rule (h11's, for its state machine): everything that changes a job's
state, or anything derived from it, happens here. The engine decides and
acts (starts shepherds, writes records, asks for stops); the table only
records (Flux's split of a job-manager's update from its actions). Three
writers change what a job is, and nothing else does:

* :meth:`JobTable.add` takes in a job, submitted or loaded, in its state;
* :meth:`JobTable.move` changes a state through ``jobs.move`` (the life-cycle
  table, which refuses a move it does not list before anything changes)
  and every index with it;
* :meth:`JobTable.forget` lets jobs go: evicted, or their submit refused.

The other writers touch one index each, for the engine's actions: the
handles of a running job found at start-up (``attach``) or given up
when the engine can no longer act on it (``detach``), a
queued job's changed max time (``refresh``), and the hand-outs of the
dependents of an ended job and of the finished jobs past ``--keep-finished``.

The indexes, so that no event costs a scan of every job (a daemon may hold
100,000): the queue in submission order with what the scheduler reads of
each job; the running jobs' handles (:class:`Running`); the waiting jobs;
per user the jobs counted against ``--max-queued-per-user`` (queued and
waiting) and the finished ones, oldest first, for ``--keep-finished``; the
counts of queued ``%N``-capped array elements and ``--benchmark=strict``
jobs; the names. The dependency indexes live here too, because each
changes exactly when a job enters or leaves a state: ``followers`` (the
waiting jobs that name a job: when a finished job is evicted, each of them
keeps how it ended, so no waiting job holds a finished one past
``--keep-finished``) and ``dependents`` (the waiting jobs to look at when a
job ends). Only what
the engine still has to *do* about dependencies, its work lists of jobs to
settle, stays in the engine.

The jobs themselves are a :class:`JobsById`: a dict that also keeps the ids
sorted, all together and per user, so a ``list`` page starting after a
cursor costs the page, not a scan of every job (a dict cannot be entered in
the middle). Ids grow, so adding is an append; a removed id stays in the
lists until they are half dead, then they are compacted, which costs each
removal O(1) amortised.
"""

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .jobs import FINISHED, QUEUED, RUNNING, WAITING, BadMove, Job, Result
from .jobs import move as move_state
from .resources import Allocation, Budget
from .scheduler import QueuedJob

COMPACT_FLOOR = 64   # dead ids a list may hold before compaction is considered


class IdList:
    """Sorted job ids, with removals marked dead and swept in bulk."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.dead = 0

    def add(self, job_id: int, alive: Callable[[int], bool]) -> None:
        """Insert *job_id* (usually the largest yet: an append)."""
        ids = self.ids
        if not ids or job_id > ids[-1]:
            ids.append(job_id)
            return
        i = bisect_left(ids, job_id)
        if i < len(ids) and ids[i] == job_id:
            self.dead -= 1        # an id removed (a refused commit) and made again
        else:
            ids.insert(i, job_id)
        if self.dead < 0:         # cannot happen; never let the count mislead compaction
            self.sweep(alive)

    def remove(self, alive: Callable[[int], bool]) -> None:
        """One of its ids is no longer alive."""
        self.dead += 1
        if self.dead > COMPACT_FLOOR and self.dead * 2 > len(self.ids):
            self.sweep(alive)

    def sweep(self, alive: Callable[[int], bool]) -> None:
        """Drop the dead ids (``alive(id)`` says which live)."""
        self.ids = [i for i in self.ids if alive(i)]
        self.dead = 0

    def after(self, cursor: int) -> Iterator[int]:
        """The ids above *cursor*, in order (dead ones included: the caller skips them)."""
        ids = self.ids
        for k in range(bisect_right(ids, cursor), len(ids)):
            yield ids[k]


class JobsById(dict[int, Job]):
    """``dict[int, Job]`` that keeps an IdList of all ids and one per user (written by JobTable only)."""

    def __init__(self) -> None:
        super().__init__()
        self.order = IdList()
        self.by_uid_order: dict[int, IdList] = {}

    def __setitem__(self, job_id: int, job: Job) -> None:
        if job_id not in self:
            self.order.add(job_id, self.__contains__)
            self.by_uid_order.setdefault(job.uid, IdList()).add(job_id, self._of(job.uid))
        super().__setitem__(job_id, job)

    def __delitem__(self, job_id: int) -> None:
        job = self[job_id]
        super().__delitem__(job_id)
        self._removed(job)

    def pop(self, job_id: int, *default: Any) -> Any:
        if job_id not in self:
            if default:
                return default[0]
            raise KeyError(job_id)
        job = super().pop(job_id)
        self._removed(job)
        return job

    def _removed(self, job: Job) -> None:
        self.order.remove(self.__contains__)
        mine = self.by_uid_order.get(job.uid)
        if mine is not None:
            mine.remove(self._of(job.uid))
            if len(mine.ids) == mine.dead:
                del self.by_uid_order[job.uid]

    def _of(self, uid: int) -> Callable[[int], bool]:
        """Whether an id is a live job of *uid* (an id refused at commit may be made again for another)."""
        def alive(job_id: int) -> bool:
            job = self.get(job_id)
            return job is not None and job.uid == uid
        return alive

    def ids_after(self, cursor: int, uid: int | None = None) -> Iterator[int]:
        """Ids above *cursor* in order, of every user or of *uid*; possibly of removed jobs."""
        if uid is None:
            return self.order.after(cursor)
        mine = self.by_uid_order.get(uid)
        return mine.after(cursor) if mine is not None else iter(())

    # What would change the dict behind the lists' back is not offered.
    def _unsupported(self, *args: Any, **kw: Any) -> Any:
        raise TypeError("JobsById: use jobs[id] = job, del, or pop")

    update = setdefault = popitem = clear = _unsupported


@dataclass
class Running:
    """What the daemon holds of a running job beside its record: never persisted.

    A job's allocation is in its record too (as a dict); this is the typed
    one the scheduler reads. The rest are the engine's handles on the job's
    shepherd, and its timers for asking that shepherd things again.
    """

    alloc: Allocation
    cgroup: str | None = None                 # its cgroup, when the daemon makes them
    pid: int | None = None                    # its shepherd; None before the spawn and once collected
    pidfd: int | None = None                  # open (and watched by the loop) until collected
    recheck_at: float | None = None           # recovery found its shepherd not started: look again then
    deadline_resend_at: float | None = None   # a new deadline its shepherd has not heard: send again then
    stop_heard: bool = False                  # the last stop request reached its shepherd's FIFO
    next_stop_at: float | None = None         # when to ask its shepherd to stop it again


def queue_entry(job: Job) -> QueuedJob:
    """What the scheduler reads of a queued job."""
    return QueuedJob(id=job.id, request=job.request.resources,
                     budget=Budget(job.budget["mem"], bool(job.budget.get("assigned"))),
                     max_time=job.max_time)


def _capped(job: Job) -> bool:
    return job.array is not None and bool(job.array.get("limit"))


def _strict(job: Job) -> bool:
    return job.request.benchmark == "strict"


class JobTable:
    """The engine's jobs and every index derived from their states; see the module's header."""

    def __init__(self) -> None:
        self.jobs = JobsById()
        self.queued: dict[int, QueuedJob] = {}   # insertion order = submission order, once sorted
        self.queue_sorted = True                 # False once a job was put back out of id order
        self.running: dict[int, Running] = {}
        self.waiting: set[int] = set()           # jobs held by --after / --after-ok
        # Every job a user holds (queued, %N-held or waiting) counts toward --max-queued-per-user.
        self.held_by_uid: dict[int, int] = {}
        self.capped_queued = 0                   # queued elements of arrays with a %N cap
        self.strict_queued = 0                   # queued --benchmark=strict jobs
        self.finished_by_uid: dict[int, list[int]] = {}   # uid -> heap of its finished jobs' ids
        self.followers: dict[int, set[int]] = {}   # job -> the waiting jobs that name it
        self.dependents: dict[int, set[int]] = {}   # unended job -> the waiting jobs that name it
        self.names: dict[tuple[int, str], list[int]] = {}   # (uid, name) -> its jobs' ids, ascending
        self.user_ids: dict[str, int] = {}       # user name -> uid, for USER:NAME references
        self._taken: set[int] = set()            # finished ids take_evictable gave out, not yet forgotten

    # -- the writers -----------------------------------------------------------------------------
    def add(self, job: Job) -> None:
        """Take in *job* (submitted, or loaded at start-up) and index it by its state.

        A running job gets its handles from :meth:`attach`, once the engine
        has found its shepherd.
        """
        if job.id in self.jobs:
            raise BadMove(f"job {job.id} is in the table already")
        self.jobs[job.id] = job
        self.user_ids[job.user] = job.uid
        if job.name is not None:
            ids = self.names.setdefault((job.uid, job.name), [])
            if ids and ids[-1] > job.id:
                insort(ids, job.id)
            else:
                ids.append(job.id)
        if job.state == QUEUED:
            self._enqueue(job)
        elif job.state == WAITING:
            self._wait_on(job)
        elif job.state == FINISHED:
            heapq.heappush(self.finished_by_uid.setdefault(job.uid, []), job.id)

    def move(self, job: Job, to: str, now: float, result: Result | None = None,
             running: Running | None = None) -> Running | None:
        """Move *job* to state *to* (``jobs.move``) and every index with it.

        A move to RUNNING takes the job's *running* handles (their allocation
        becomes the record's); a move to FINISHED takes its *result*. Returns
        the handles of a job that leaves RUNNING (None if it had none). Raises
        BadMove, with nothing changed, for a move the life-cycle table does
        not list or a job this table does not hold.
        """
        if self.jobs.get(job.id) is not job:
            raise BadMove(f"job {job.id} is not in the table")
        if (to == RUNNING) != (running is not None):
            raise BadMove(f"job {job.id}: a move to running, and only that, takes its handles")
        was = job.state
        move_state(job, to, now, result, alloc=running.alloc if running is not None else None)
        gone = None
        if was == QUEUED:
            self._dequeue(job)
        elif was == WAITING:
            self._unwait(job)
        elif was == RUNNING:
            gone = self.running.pop(job.id, None)
        if to == QUEUED:
            self._enqueue(job)
        elif to == RUNNING:
            assert running is not None
            self.running[job.id] = running
        elif to == FINISHED:
            heapq.heappush(self.finished_by_uid.setdefault(job.uid, []), job.id)
        return gone

    def attach(self, job: Job, running: Running) -> None:
        """The handles of a running job found at start-up (its record already says running)."""
        if job.state != RUNNING or self.jobs.get(job.id) is not job:
            raise BadMove(f"job {job.id} is {job.state}: only a running job in the table has handles")
        self.running[job.id] = running

    def detach(self, job_id: int) -> Running | None:
        """Drop a running job's handles without a move: the engine can no longer act on it at all."""
        return self.running.pop(job_id, None)

    def refresh(self, job: Job) -> None:
        """A queued job's record changed (its max time): its queue entry follows, in its place."""
        if job.id in self.queued:
            self.queued[job.id] = queue_entry(job)

    def take_dependents(self, job_id: int) -> set[int]:
        """The waiting jobs that name *job_id*, for the engine to look at now that it ended; once."""
        return self.dependents.pop(job_id, set())

    def take_evictable(self, uid: int, keep: int) -> list[int]:
        """The user's oldest finished jobs past *keep*, out of the finished index: the engine then
        forgets them, or puts them back (:meth:`put_back`). A waiting job that names one keeps
        how it ended first (the engine does, from ``followers``): none is kept back for it."""
        done = self.finished_by_uid.get(uid)
        if done is None:
            return []
        victims = [heapq.heappop(done) for _ in range(len(done) - keep)]
        self._taken.update(victims)
        return victims

    def put_back(self, uid: int, ids: Iterable[int]) -> None:
        """Finished jobs :meth:`take_evictable` gave out that stay after all."""
        done = self.finished_by_uid.setdefault(uid, [])
        for job_id in ids:
            self._taken.discard(job_id)
            heapq.heappush(done, job_id)

    def forget(self, gone: Iterable[Job]) -> None:
        """Let jobs go, out of every index: evicted (finished, given out by :meth:`take_evictable`),
        or withdrawn (their submit refused at commit, in whatever state their turn left them)."""
        heaps: dict[int, set[int]] = {}   # uid -> finished ids still in its heap: taken out in one pass
        for job in gone:
            self.jobs.pop(job.id, None)
            self.dependents.pop(job.id, None)
            if job.name is not None:
                ids = self.names.get((job.uid, job.name))
                if ids is not None:
                    i = bisect_left(ids, job.id)
                    if i < len(ids) and ids[i] == job.id:
                        del ids[i]
                    if not ids:
                        del self.names[(job.uid, job.name)]
            if job.id in self.queued:
                self._dequeue(job)
            self.running.pop(job.id, None)
            self._unwait(job)
            if job.state == FINISHED:
                if job.id in self._taken:
                    self._taken.discard(job.id)
                else:
                    heaps.setdefault(job.uid, set()).add(job.id)
                if not self.finished_by_uid.get(job.uid, True):
                    del self.finished_by_uid[job.uid]
        for uid, out in heaps.items():
            heap = [i for i in self.finished_by_uid.get(uid, []) if i not in out]
            heapq.heapify(heap)
            self.finished_by_uid[uid] = heap

    # -- what the indexes say --------------------------------------------------------------------
    def in_order(self) -> dict[int, QueuedJob]:
        """The queue in submission (id) order: sorted once after jobs were put back out of order."""
        if not self.queue_sorted:
            self.queued = dict(sorted(self.queued.items()))
            self.queue_sorted = True
        return self.queued

    def allocs(self) -> list[Allocation]:
        """What the running jobs hold."""
        return [r.alloc for r in self.running.values()]

    def ids_after(self, cursor: int, uid: int | None = None) -> Iterator[int]:
        """Job ids above *cursor* in order, of every user or of *uid*; possibly of removed jobs."""
        return self.jobs.ids_after(cursor, uid)

    # -- the indexes' upkeep, for the writers above ----------------------------------------------
    def _hold(self, uid: int, n: int) -> None:
        left = self.held_by_uid.get(uid, 0) + n
        if left > 0:
            self.held_by_uid[uid] = left
        else:
            self.held_by_uid.pop(uid, None)

    def _enqueue(self, job: Job) -> None:
        self._hold(job.uid, 1)
        if _capped(job):
            self.capped_queued += 1
        if _strict(job):
            self.strict_queued += 1
        if self.queued and next(reversed(self.queued)) > job.id:
            self.queue_sorted = False   # its place is its submission order: sorted before the next use
        self.queued[job.id] = queue_entry(job)

    def _dequeue(self, job: Job) -> None:
        del self.queued[job.id]
        if _capped(job):
            self.capped_queued -= 1
        if _strict(job):
            self.strict_queued -= 1
        self._hold(job.uid, -1)

    def _wait_on(self, job: Job) -> None:
        """Hold a job on its --after jobs: the end of each unended one names it (``dependents``)."""
        self.waiting.add(job.id)
        self._hold(job.uid, 1)
        for dep_id in job.after:
            self.followers.setdefault(dep_id, set()).add(job.id)
            dep = self.jobs.get(dep_id)
            if dep is not None and dep.state != FINISHED:   # an ended one is looked at when it settles
                self.dependents.setdefault(dep_id, set()).add(job.id)

    def _unwait(self, job: Job) -> None:
        if job.id not in self.waiting:
            return
        self.waiting.discard(job.id)
        self._hold(job.uid, -1)
        for dep_id in job.after:
            named = self.dependents.get(dep_id)
            if named is not None:
                named.discard(job.id)
                if not named:
                    del self.dependents[dep_id]
            left = self.followers.get(dep_id)   # absent: named twice, and let go at the first
            if left is not None:
                left.discard(job.id)
                if not left:
                    del self.followers[dep_id]

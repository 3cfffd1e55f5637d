"""The read models: what ``list``, ``show``, ``status`` and every job reference read (read-only).

Functions over the engine's table and a few facts beside it, handed in as a
:class:`Reads` taken when the question is asked (``Engine.reads``): none of
them changes a job or holds on to the engine. The visibility rule lives here
once: a user sees their own jobs; an admin, or everyone under
``--list-is-public``, sees all; a job another user may not see is refused as
not found, exactly like one that does not exist.
"""

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shepherd.base import records

from .. import bounds
from ..core import allocator, arrayref, dependencies, machinemap, report, resources, views
from ..core.jobnames import split_ref
from ..core.jobs import FINISHED, QUEUED, WAITING, Job
from ..core.jobtable import JobTable
from .access import Caller
from .refusal import Refused


@dataclass(frozen=True)
class Reads:
    """What a read model reads, as it stands when the question is asked."""

    table: JobTable
    machine: resources.Machine
    limits: resources.Limits
    cfg: Any                          # the daemon's Config: list_is_public, schedule
    job_dir: Callable[[int], str]     # the store's: a job's directory
    next_id: int                      # the id the next submit gets
    policy_state: dict[str, Any]      # the scheduling policy's (a backfill's reservation)
    bench_hold: str | None            # why strict benchmark jobs wait (None: the machine is quiet)


def visible(r: Reads, caller: Caller, all_users: bool, finished: bool,
            after: int = 0) -> Iterator[tuple[int, Job | None]]:
    """The jobs *caller* may list with ids above *after*, in id order, as ``(id, job)``; job is
    None for an id looked at and passed over (gone, or finished without *finished*), so a
    caller can bound what one page looks at. Costs what it yields, not a scan of all jobs."""
    uid = None if all_users else caller.uid
    for job_id in r.table.ids_after(after, uid):
        job = r.table.jobs.get(job_id)
        if job is None or (job.state == FINISHED and not finished) or (uid is not None and job.uid != uid):
            yield job_id, None
        else:
            yield job_id, job


def array_room(table: JobTable) -> dict[int, int]:
    """How many more of each capped array may start now (arrays not named: their whole cap)."""
    room: dict[int, int] = {}
    for jid in table.running:
        a = table.jobs[jid].array
        if a is not None and a.get("limit"):
            room[a["first"]] = room.get(a["first"], a["limit"]) - 1
    return room


def why(r: Reads, job: Job) -> tuple[int | None, str | None]:
    """A job's place in the queue (1 = the head) and why it is not running, for show and status."""
    if job.state == WAITING:
        return None, dependencies.evaluate(job, r.table.jobs.get)[1]
    if job.state != QUEUED:
        return None, None
    order = list(r.table.in_order())
    position = order.index(job.id) + 1
    if job.request.benchmark == "strict" and r.bench_hold is not None:
        return position, r.bench_hold
    if job.array is not None and job.array.get("limit") and \
            array_room(r.table).get(job.array["first"], 1) <= 0:
        return position, (f"{job.array['limit']} of its array (jobs from {job.array['first']}) "
                          f"already run, the most it may run at once (--array ...%{job.array['limit']})")
    free = allocator.Free.of(resources.capacity(r.machine, r.limits), r.table.allocs())
    q = r.table.queued[job.id]
    return position, report.why_waiting(q.request, q.budget, position, order[0], free, r.cfg.schedule,
                                        r.policy_state)


def show(r: Reads, caller: Caller, ref: int | str, now: float) -> dict[str, Any]:
    """``dispatch show``: everything about one job (never its environment; views.show)."""
    job = lookup(r, caller, ref)
    position, reason = why(r, job)
    running = r.table.running.get(job.id)
    return views.show(job, r.machine, position=position, why=reason,
                      cgroup=running.cgroup if running is not None else None, now=now)


def record(r: Reads, caller: Caller, ref: int | str) -> dict[str, Any]:
    """``dispatch show --record``: the job's reproducibility record (partial while it runs)."""
    job = lookup(r, caller, ref)
    if job.state in (QUEUED, WAITING):
        raise Refused(f"job {job.id} has not started: its record is made when it starts")
    data = records.read_json(os.path.join(r.job_dir(job.id), records.RECORD))
    if not isinstance(data, dict):
        reason = ("it ended before it started" if job.started is None else
                  "none was written (the daemon runs with --records none, or an older one started it)")
        raise Refused(f"job {job.id} has no record: {reason}")
    return data


def status(r: Reads, now: float, caller: Caller | None = None) -> dict[str, Any]:
    """``dispatch status``: the machine at a glance (another's head job by id only, unless the list is public)."""
    table = r.table
    head = None
    if table.queued:
        job = table.jobs[next(iter(table.in_order()))]
        head = {"id": job.id, "user": job.user, "name": job.name, "why": why(r, job)[1]}
        if not _shows_whose(r, caller, job):
            head.update(user=None, name=None, why=None)   # its request would say whose it may be
    st = report.status(r.machine, r.limits, table.allocs(),
                       r.cfg.schedule, len(table.queued), len(table.waiting), head)
    holders = []
    for job_id, run in table.running.items():
        job = table.jobs[job_id]
        seen = _shows_whose(r, caller, job)
        holders.append(machinemap.Holder(job_id if seen else None, job.user if seen else None, run.alloc))
    st["map"] = machinemap.build(r.machine, resources.capacity(r.machine, r.limits).reserved_cpus,
                                 holders)
    return st


def _shows_whose(r: Reads, caller: Caller | None, job: Job) -> bool:
    """Whether status names *job* and its user to *caller*: an admin's, the owner's, or a public list."""
    return caller is None or caller.is_admin or caller.uid == job.uid or r.cfg.list_is_public


def lookup(r: Reads, caller: Caller, ref: int | str) -> Job:
    """The job *caller* names by id, NAME or USER:NAME, or Refused.

    A NAME means the caller's own newest job of that name, for admins too;
    an admin names another user's job by id or as USER:NAME. A job the
    caller may not see is refused as not found, exactly like a job that
    does not exist, unless --list-is-public lets everyone see it anyway.
    """
    jobs = r.table.jobs
    if isinstance(ref, str) and (aref := arrayref.parse(ref)) is not None:
        if aref.index is None:
            raise Refused(f"{ref} names a whole array; name one job here, e.g. {aref.first}_1 "
                          f"(dispatch list {ref} lists them)")
        job = _element(r, caller, aref.first, aref.index)
    elif isinstance(ref, str):
        split = split_ref(ref)
        if split is None:
            raise Refused(f"no job named {ref!r}", "not_found")
        user, name = split
        uid = caller.uid if user is None else r.table.user_ids.get(user)
        ids = r.table.names.get((uid, name)) if uid is not None else None
        if not ids:
            raise Refused(f"no job named {ref!r}", "not_found")
        job = jobs[ids[-1]]
    else:
        found = jobs.get(ref)
        if found is None:
            raise Refused(f"no such job: {ref}", "not_found")
        job = found
    if job.uid != caller.uid and not caller.is_admin:
        if not r.cfg.list_is_public:
            raise Refused(f"no such job: {ref}" if isinstance(ref, int) else f"no job named {ref!r}",
                          "not_found")
        raise Refused(f"job {ref} belongs to another user", "forbidden")
    return job


def array_of(r: Reads, caller: Caller, first: int) -> tuple[list[Job], int]:
    """The elements of array *first* that the daemon holds, in id order, and the array's size;
    Refused (as ``lookup`` refuses) when there is none or the caller may not see it.

    O(array size), never O(jobs): its ids are consecutive from *first*. An element forgotten
    (``--keep-finished``) is a gap; an array stored before arrays had a ``count`` is measured
    to the last id it holds.
    """
    jobs = r.table.jobs
    if first >= r.next_id:
        raise Refused(f"no such job: {first}", "not_found")
    head = jobs.get(first)
    if head is not None:
        lookup(r, caller, first)   # (another user's is refused before anything is said of it)
    if head is not None and (head.array is None or head.array["first"] != first):
        where = f"; it is element {arrayref.element_name(head.array['first'], head.array['index'])}" \
            if head.array is not None else ""
        raise Refused(f"job {first} is not an array's first job{where}", "not_found")
    count = head.array.get("count") if head is not None and head.array is not None else None
    elements = [] if head is None else [head]
    last = first + (count or bounds.MAX_ARRAY) - 1
    for job_id in range(first + 1, min(last, r.next_id - 1) + 1):
        job = jobs.get(job_id)
        if job is None:
            continue
        if job.array is None or job.array["first"] != first:
            break   # past its end
        elements.append(job)
        count = count or job.array.get("count")
        if count is not None:
            last = first + count - 1
    if not elements:
        raise Refused(f"no array {first}: the daemon holds none of its jobs (dispatch history "
                      f"--array {first} lists those that ended)", "not_found")
    lookup(r, caller, elements[0].id)   # its user's, or refused as lookup refuses
    return elements, count or elements[-1].id - first + 1


def _element(r: Reads, caller: Caller, first: int, index: int) -> Job:
    """The element of array *first* submitted with *index*: O(1) when its indices run on
    without gaps (each id one more than the last), else O(array size)."""
    jobs = r.table.jobs
    head = jobs.get(first)
    if head is not None:
        lookup(r, caller, first)   # (another user's is refused before anything is said of it)
    if head is not None and head.array is not None and head.array["first"] == first:
        guess = jobs.get(first + index - head.array["index"])
        if guess is not None and guess.array is not None and guess.array["first"] == first \
                and guess.array["index"] == index:
            return guess   # (one submit's: the same user's as its first)
    elements, count = array_of(r, caller, first)
    for job in elements:
        if job.array is not None and job.array["index"] == index:
            return job
    indices = [j.array["index"] for j in elements if j.array is not None]
    held = f"{count} jobs, indices {indices[0]} to {indices[-1]}" if len(elements) == count else \
        f"{count} jobs, of which it still holds {len(elements)} (dispatch history --array {first} lists " \
        f"those that ended)"
    raise Refused(f"array {first} has no element with index {index} ({held})", "not_found")

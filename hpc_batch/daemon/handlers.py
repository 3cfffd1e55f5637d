"""One handler per verb: the daemon's side of each ``dispatch`` command.

Each takes the engine, the caller (from SO_PEERCRED) and the validated
payload, and returns a reply message, a :class:`Submitted` (a reply that
acknowledges new jobs, naming them), or a :class:`Deferred`: a question for
the history archive's reader thread (``history``, and ``show``/``record`` of a
job the daemon no longer holds), whose answer the server sends when it comes.
``attach``, ``wait`` and ``watch`` are not here: they hold their connection
until the daemon has something to say (streams.py, its ``STREAMING`` table).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from shepherd.base.jsoncodec import dumps_wire

from .. import __version__
from ..core import arrayref, views
from ..core.jobs import Job
from ..core.listrows import format_row, table_row
from ..wire import protocol
from ..wire.protocol import History, JobRef, JobSetting, ListJobs, LogPage, NewJob, Ping, Status
from . import joboutput, queries
from .access import Caller
from .archive import Filters, Query
from .bulks import Bulk, Storing
from .engine import Engine
from .refusal import Refused


class Deferred:
    """A reply given later, by the archive's reader (*query*) or by the engine once a bulk is
    stored (*bulk*); the server holds the connection until it comes."""

    def __init__(self, query: Query | None = None, bulk: Bulk | None = None):
        self.query = query
        self.bulk = bulk


class Submitted(NamedTuple):
    """A reply that acknowledges new jobs: void (refused) if this turn's commit fails to store them."""

    reply: dict[str, Any]
    ids: range


# (engine, caller, validated payload of the handler's own verb, now) -> reply message, Submitted or Deferred
Handler = Callable[[Engine, Caller, Any, float], "dict[str, Any] | Submitted | Deferred"]


def new(engine: Engine, caller: Caller, req: NewJob, now: float) -> Submitted | Deferred:
    """``dispatch new``."""
    out = engine.submit(caller, req, now)
    if isinstance(out, Storing):
        return Deferred(bulk=out.bulk)
    return Submitted(protocol.ok(**out), range(out["id"], out.get("last", out["id"]) + 1))


def list_jobs(engine: Engine, caller: Caller, req: ListJobs, now: float) -> dict[str, Any]:
    """``dispatch list [--all] [--finished]``."""
    if req.all and not (caller.is_admin or engine.cfg.list_is_public):
        raise Refused("only members of the admin group may list all users' jobs "
                      "(the admin can allow everyone with --list-is-public)", "forbidden")
    return protocol.ok(**list_page(engine, caller, req), now=now)


def list_page(engine: Engine, caller: Caller, req: ListJobs) -> dict[str, Any]:
    """One page of a listing: ``jobs`` and ``more`` (the next page's cursor, or None at the end).

    Bounded in jobs, bytes and ids looked at (protocol.LIST_PAGE_*), so its cost and
    its reply do not grow with the queue; a client pages with ``after``.
    """
    limit = min(req.limit or protocol.LIST_PAGE_JOBS, protocol.LIST_PAGE_JOBS)
    jobs: list[Any] = []
    size = looked = last = 0
    more = None
    for job_id, job in queries.visible(engine.reads(), caller, req.all, req.finished, req.after or 0):
        if len(jobs) >= limit or size >= protocol.LIST_PAGE_BYTES or looked >= protocol.LIST_PAGE_SCAN:
            more = last
            break
        looked += 1
        last = job_id
        if job is None:
            continue
        row = text_row(engine, job, req.finished) if req.text else None
        if req.table:
            cells, cost = table_cells(engine, job)
            size += cost
            jobs.append(cells)
        elif row is not None:
            size += len(row) + 3
            jobs.append(row)
        else:
            summary = engine.summary(job)
            size += len(dumps_wire(summary)) + 1
            jobs.append(summary)
    if req.after is None:
        if more is not None:
            raise Refused(f"the list is longer than one reply may carry ({len(jobs)} jobs, "
                          f"{protocol.LIST_PAGE_BYTES >> 20} MiB) and this dispatch is older than "
                          f"hpc-batchd: use a dispatch of the same version, which asks for it in pages")
        return {"jobs": jobs}
    return {"rows" if req.text or req.table else "jobs": jobs, "more": more}


def text_row(engine: Engine, job: Job, finished: bool) -> str | None:
    """The ``dispatch list`` row of a job that never started, or None for one that did (its row
    reads the clock and the client's time zone).

    Kept on the job, with the fields it could change by (a state, ``job max-time``, its end's
    notes), so that listing a long queue costs a lookup a job rather than its summary and row.
    """
    if job.started is not None:
        return None
    key = (job.state, job.max_time, job.name, job.output_error, job.output_note, finished)
    kept = job.__dict__.get("_list_row")
    if kept is not None and kept[0] == key:
        return kept[1]
    row = format_row(engine.summary(job), 0.0, finished)
    job.__dict__["_list_row"] = (key, row)
    return row


def table_cells(engine: Engine, job: Job) -> tuple[list[Any], int]:
    """A job's row of the table form (``listrows.table_row``) and its size in a reply.

    Kept on a job that never started, as ``text_row`` is, and for the same fields: a long queue
    costs a lookup a job, not a summary and its encoding.
    """
    if job.started is not None:
        cells = table_row(engine.summary(job))
        return cells, len(dumps_wire(cells)) + 1
    key = (job.state, job.max_time, job.name, job.output_error, job.output_note)
    kept = job.__dict__.get("_table_row")
    if kept is not None and kept[0] == key:
        return kept[1], kept[2]
    cells = table_row(engine.summary(job))
    cost = len(dumps_wire(cells)) + 1
    job.__dict__["_table_row"] = (key, cells, cost)
    return cells, cost


def kill(engine: Engine, caller: Caller, req: JobRef, now: float) -> dict[str, Any]:
    """``dispatch kill ID``."""
    return protocol.ok(**engine.kill(caller, req.id, now))


def log(engine: Engine, caller: Caller, req: LogPage, now: float) -> dict[str, Any]:
    """``dispatch log JOB``: one page of the job's output so far (the same access as attach)."""
    job = queries.lookup(engine.reads(), caller, req.id)
    return protocol.ok(**joboutput.log_page(job, engine.store.job_dir(job.id), req.offset, req.until,
                                            engine.cfg.max_output_buffer))


def job(engine: Engine, caller: Caller, req: JobSetting, now: float) -> dict[str, Any]:
    """``dispatch job ID max-time get|set D|add D``."""
    return protocol.ok(**engine.job_setting(caller, req, now))


def show(engine: Engine, caller: Caller, req: JobRef, now: float) -> dict[str, Any] | Deferred:
    """``dispatch show JOB``: a job the daemon holds, else one from the history; ``show 6_*``: an
    array's document (``views.array_doc``)."""
    aref = arrayref.parse(req.id) if isinstance(req.id, str) else None
    if aref is not None and aref.index is None:
        elements, count = queries.array_of(engine.reads(), caller, aref.first)
        return protocol.ok(array=views.array_doc(aref.first, elements, count), now=now)
    try:
        return protocol.ok(job=queries.show(engine.reads(), caller, req.id, now), now=now)
    except Refused as exc:
        if exc.code != "not_found" or aref is not None:   # (the archive knows no 6_3)
            raise
        return Deferred(engine.archive_query(caller, "show", req.id, now))


def record(engine: Engine, caller: Caller, req: JobRef, now: float) -> dict[str, Any] | Deferred:
    """``dispatch show --record JOB`` and ``dispatch record diff``: one job's record (from the
    history for a job the daemon no longer holds)."""
    try:
        return protocol.ok(record=queries.record(engine.reads(), caller, req.id))
    except Refused as exc:
        if exc.code != "not_found" or (isinstance(req.id, str) and arrayref.looks_like(req.id)):
            raise
        return Deferred(engine.archive_query(caller, "record", req.id, now))


def history(engine: Engine, caller: Caller, req: History, now: float) -> Deferred:
    """``dispatch history`` and ``dispatch report``: a page of finished jobs from the archive."""
    if (req.all or (req.user is not None and req.user != caller.name)) and not caller.is_admin:
        raise Refused("only members of the admin group may read other users' history", "forbidden")
    filters = Filters(user=req.user, all_users=req.all, name=req.name, array=req.array, ids=req.ids,
                      result=req.result, verdict=req.verdict, since=req.since, until=req.until,
                      setup=req.setup, before=req.before, limit=req.limit)
    return Deferred(engine.archive_query(caller, "history", None, now, filters))


def status(engine: Engine, caller: Caller, req: Status, now: float) -> dict[str, Any]:
    """``dispatch status``."""
    return protocol.ok(**queries.status(engine.reads(), now, caller))


def ping(engine: Engine, caller: Caller, req: Ping, now: float) -> dict[str, Any]:
    """Liveness and version."""
    return protocol.ok(version=__version__, protocol=protocol.VERSION)


HANDLERS: dict[str, Handler] = {"new": new, "list": list_jobs, "kill": kill, "show": show, "record": record,
                                 "status": status, "job": job, "ping": ping, "history": history, "log": log}

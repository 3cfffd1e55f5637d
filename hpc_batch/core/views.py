"""The public JSON documents, each built in one place (pure: the caller passes everything in).

README.md calls these field names stable (its JSON passage, and the history
and ``/dev`` passages), so each document is shaped here and nowhere else, and
``tests/unit/test_views.py`` checks each one's keys against the names the
docs give:

- ``summary``: a job as ``dispatch list`` (``--json``) shows it;
- ``show``: ``dispatch show``'s job, the summary and what show adds;
- ``wait_entry``: one of the jobs a ``dispatch wait`` reply names;
- ``watch_job``: the job of a ``watch`` stream's ``job`` event (the summary
  less the command, which can be large); ``end_fields`` and ``forgotten_end``:
  the ``end`` event that closes an ``attach`` stream;
- ``history_row``: a finished job's row in the history archive;
- ``dev_info``: ``info.json`` of the job's ``/dev/hpc-batch/jobs/<id>`` entry;
- ``new_reply`` (with ``bulk_fields``, or ``stored_bulk_reply``), ``kill_reply``
  and ``setting_reply``: the replies of ``new``, ``kill`` and ``job``.

Inputs are plain: the job record (its allocation is ``job.alloc``), the
machine, and what only the daemon knows (a queued job's place, a running
job's cgroup, the time). A document never holds the job's environment.
"""

from __future__ import annotations

from typing import Any

from . import gputopo, report
from .jobs import FINISHED, RUNNING, Job, Result, exit_column, wait_status
from .resources import Budget, Machine

# The summary's fields a watch event carries: all but the command (it can be large) and what a
# follower has no use for.
WATCH_FIELDS = ("id", "name", "state", "submitted", "started", "ended", "exit", "result", "output",
                "output_error")
# The summary's fields in a /dev entry's info.json: what the job is and holds, not how it ended
# (the entry goes when it ends).
INFO_FIELDS = ("id", "user", "command", "command_len", "state", "submitted", "started", "max_time",
               "mem", "mem_assigned", "exclusive", "cpus", "gpus", "output")


def summary(job: Job, machine: Machine) -> dict[str, Any]:
    """What ``dispatch list`` shows of a job (metadata only, never the environment)."""
    alloc, res = job.alloc, job.result
    command, command_len = job.shown
    return {
        "id": job.id, "user": job.user, "command": command, "command_len": command_len,
        "state": job.state,
        "submitted": job.submitted, "started": job.started, "ended": job.ended,
        "max_time": job.max_time, "mem": job.budget.get("mem"),
        "mem_assigned": job.budget.get("assigned", False), "spread": alloc is not None and alloc.spread,
        "exclusive": job.request.resources.exclusive,
        "cpus": list(alloc.cpus) if alloc else None, "gpus": list(alloc.gpus) if alloc else None,
        **report.cpu_fields(machine, alloc),
        "gpu_label": (gputopo.label(machine.topology, alloc.gpus) if alloc is not None
                      else gputopo.label(None, range(job.request.resources.gpus))),
        "exit": exit_column(res) if job.state == FINISHED else None,
        "result": res.to_dict() if res else None, "output": job.output, "output_error": job.output_error,
        "output_note": job.output_note, "name": job.name,
        "stats": job.stats, "verdict": job.stats.get("verdict"), "array": array_fields(job),
    }


ARRAY_FIELDS = ("first", "index", "limit", "count")


def array_fields(job: Job) -> dict[str, Any] | None:
    """A bulk submit's element as every document shows it: ``first`` (the array's id), ``index``,
    ``limit`` (the %N cap, or None) and ``count`` (its size; None for a job stored before it was
    kept); None for a job submitted alone."""
    return None if job.array is None else {k: job.array.get(k) for k in ARRAY_FIELDS}


def array_doc(first: int, elements: list[Job], count: int) -> dict[str, Any]:
    """``dispatch show 6_*``: the array as a whole. *elements* are those the daemon holds (an
    ended one may be forgotten); ``states`` counts them by state, ``ids`` are theirs."""
    states: dict[str, int] = {}
    for job in elements:
        states[job.state] = states.get(job.state, 0) + 1
    head = elements[0]
    limit = head.array.get("limit") if head.array is not None else None
    return {"first": first, "last": first + count - 1, "count": count, "limit": limit, "user": head.user,
            "name": head.name, "states": states, "ids": [job.id for job in elements]}


def show(job: Job, machine: Machine, *, position: int | None, why: str | None, cgroup: str | None,
         now: float) -> dict[str, Any]:
    """``dispatch show``: the summary with the whole command and all else the daemon knows of the job.

    *position* and *why* are its place in the queue and why it waits (``Engine.why``), *cgroup*
    a running job's cgroup, *now* the time its ``wall`` runs to while it runs.
    """
    out = summary(job, machine)
    alloc, res = job.alloc, job.result
    out.update({
        "name": job.name, "command": job.command, "argv": job.argv, "cwd": job.cwd,   # show: the whole command
        "position": position, "why": why,
        "request": job.request.to_dict(), "numa_nodes": list(alloc.mems) if alloc else [],
        "deadline": job.deadline if job.state == RUNNING else None,
        "cgroup": cgroup,
        "wall": (job.ended or now) - job.started if job.started is not None else None,
        "cpu_time": job.stats.get("cpu_time"), "peak_mem": job.stats.get("peak_mem"),
        "after": job.after, "after_ok": job.after_ok, "quiet": job.quiet,
        "notify": job.request.notify,
        **report.bench_fields(job.request, alloc, job.shortfalls),
        **_how_it_ended(res),
    })
    return out


def wait_entry(job_id: int, job: Job | None) -> dict[str, Any]:
    """One job of a ``dispatch wait`` reply; *job* None for one forgotten (``--keep-finished``) while
    waited for that the history cannot answer for either (pruned, busy, or none kept this run),
    which is said rather than guessed (its wait status is that of a lost job)."""
    if job is None:
        return {"id": job_id, "state": "unknown", "exit": None, "wait_status": wait_status(None), "note": None}
    res = job.result
    return {"id": job.id, "name": job.name, "state": job.state, "result": res.kind if res else None,
            "exit": exit_column(res), "wait_status": wait_status(res),
            "note": res.note if res else None, "output": job.output,
            "output_error": job.output_error}


def archived_wait_entry(shown: dict[str, Any]) -> dict[str, Any]:
    """A ``dispatch wait`` entry for a job known only from the history archive (its ``show`` document
    as it ended): the same fields as :func:`wait_entry` gives a finished job."""
    result = shown.get("result")
    res = Result.from_dict(result) if isinstance(result, dict) and "kind" in result else None
    return {"id": shown.get("id"), "name": shown.get("name"), "state": FINISHED,
            "result": res.kind if res else None, "exit": exit_column(res), "wait_status": wait_status(res),
            "note": res.note if res else None, "output": shown.get("output"),
            "output_error": shown.get("output_error")}


def watch_job(job: Job, machine: Machine) -> dict[str, Any]:
    """The job of a ``watch`` stream's ``job`` event: its summary's ``WATCH_FIELDS``."""
    s = summary(job, machine)
    return {k: s[k] for k in WATCH_FIELDS}


def end_fields(job: Job) -> dict[str, Any]:
    """The fields of the ``end`` event that closes an ``attach`` stream (also the whole answer to
    attaching to a job already finished, and a ``log`` page's ``end``); ``wait_status`` is the
    exit status ``dispatch wait`` gives for it, which ``log --follow`` exits with."""
    res = job.result
    return {"id": job.id, "state": job.state, "exit": exit_column(res), "wait_status": wait_status(res),
            "note": res.note if res else None, "output": job.output, "output_error": job.output_error}


def forgotten_end(job_id: int) -> dict[str, Any]:
    """The ``end`` event's fields for an attached job forgotten (``--keep-finished``) while a slow
    client still read its output, when how it ended was not kept (the streams keep it from the
    job's end): as a wait entry says it, ``unknown``."""
    return {"id": job_id, "state": "unknown", "exit": None, "wait_status": wait_status(None), "note": None}


def history_row(job: Job) -> dict[str, Any]:
    """A finished job's row in the history archive (``dispatch history --json``; ``report`` reads it).

    What the job's record adds (the verdict's ``causes`` and ``reasons``, the ``setup_digest``, the
    job's own ``metrics``) is empty here: the archive fills it in when it reads the record.
    """
    res, alloc = job.result, job.alloc
    started, ended = job.started, job.ended
    command, command_len = job.shown
    array = array_fields(job)
    return {
        "id": job.id, "user": job.user, "uid": job.uid, "name": job.name, "array": array,
        "command": command, "command_len": command_len,
        "submitted": job.submitted, "started": started, "ended": ended,
        "wall_s": (ended - started) if started is not None and ended is not None else None,
        "cpu_s": job.stats.get("cpu_time"), "peak_mem": job.stats.get("peak_mem"),
        "state": job.state, "result": res.kind if res else None, "exit": exit_column(res),
        **_how_it_ended(res), "max_time": job.max_time, "mem": job.budget.get("mem"),
        "cpus": list(alloc.cpus) if alloc else None, "gpus": list(alloc.gpus) if alloc else None,
        "output": job.output,
        "output_error": job.output_error,
        "verdict": job.stats.get("verdict"), "record_digest": job.stats.get("record_digest"),
        "causes": [], "reasons": [], "setup_digest": None, "metrics": {},
    }


def dev_info(job: Job, machine: Machine) -> dict[str, Any]:
    """``info.json`` of the job's ``/dev/hpc-batch/jobs/<id>`` entry: its summary's ``INFO_FIELDS``."""
    s = summary(job, machine)
    return {k: s[k] for k in INFO_FIELDS}


def new_reply(job: Job, budget: Budget, *, starts: bool, mem_enforced: bool) -> dict[str, Any]:
    """``dispatch new``'s reply for a submit stored at once: its (first) *job*, *budget* its memory,
    *starts* whether it starts now (the decision made while answering), *mem_enforced* whether
    the budget is a cgroup limit. A bulk submit's reply adds :func:`bulk_fields`."""
    return {"id": job.id, "state": RUNNING if starts else job.state, "mem": budget.mem,
            "mem_assigned": budget.assigned, "mem_enforced": mem_enforced,
            "output": job.output, "name": job.name,
            "after": job.after, "after_ok": job.after_ok,
            "note": result.note if job.state == FINISHED and (result := job.result) else None}


def bulk_fields(first: int, count: int, starting: int, limit: int | None) -> dict[str, Any]:
    """What a bulk submit's ``new`` reply adds: its ids run from *first* for *count* jobs, of which
    *starting* start now; *limit* is its ``%N`` cap (None: none)."""
    return {"last": first + count - 1, "count": count, "starting": starting, "limit": limit}


def stored_bulk_reply(first: int, budget: Budget, *, mem_enforced: bool, name: str | None, after: list[int],
                      after_ok: bool, count: int, limit: int | None) -> dict[str, Any]:
    """``dispatch new``'s reply for a bulk stored a slice per turn, less ``state`` and ``output``,
    which are known once its jobs are in the table (the engine puts them first)."""
    return {"id": first, "mem": budget.mem, "mem_assigned": budget.assigned, "mem_enforced": mem_enforced,
            "name": name, "after": after, "after_ok": after_ok, "note": None,
            **bulk_fields(first, count, 0, limit)}


def kill_reply(job_id: int, was: str) -> dict[str, Any]:
    """``dispatch kill``'s reply: the job, and the state it *was* in (queued, waiting or running)."""
    return {"id": job_id, "was": was}


def setting_reply(job: Job) -> dict[str, Any]:
    """``dispatch job ID max-time``'s reply: the job's max time and deadline as they stand."""
    return {"id": job.id, "max_time": job.max_time, "deadline": job.deadline, "state": job.state}


def _how_it_ended(res: Result | None) -> dict[str, Any]:
    """``note``, ``code`` and ``signal`` of a job's result (all None before it has one)."""
    return {"note": res.note if res else None, "code": res.code if res else None,
            "signal": res.signal if res else None}

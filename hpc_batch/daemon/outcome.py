"""How a job ended, read from what its shepherd wrote (pure: the engine reads the files).

``Ending.collect`` and ``Ending.end`` (ending.py) read ``exit.json`` and
``delivery.json`` and hand the records here; these functions say what the
job's record keeps of them: its ``Result``, its statistics, and what became
of its output. Tested by a table of cases (``tests/unit/test_outcome.py``).
"""

from typing import Any

from shepherd.base import records

from ..core.jobs import ERROR, EXITED, OOM, SIGNALLED, Job, Result


def result_of(job: Job, rec: records.ExitRecord) -> Result:
    """How the job ended, from its exit record (written by the shepherd)."""
    stopped = rec.stopped
    if rec.old_format and job.stop_reason and job.stop_sent:
        stopped = job.stop_reason   # a shepherd from before exit records said so themselves
    if rec.error:
        return Result(ERROR, code=rec.code, note=rec.error)
    if rec.oom_kill:
        return Result(OOM, signal=rec.signal, code=rec.code)
    if stopped:
        return Result(stopped, code=rec.code, signal=rec.signal, note=rec.stop_note)
    if rec.signal:
        return Result(SIGNALLED, signal=rec.signal)
    return Result(EXITED, code=rec.code)


def stats_of(rec: records.ExitRecord) -> dict[str, Any]:
    """What the exit record adds to the job's ``stats``: only the figures it holds."""
    stats: dict[str, Any] = {}
    if rec.peak_mem is not None:
        stats["peak_mem"] = rec.peak_mem
    if rec.cpu_time is not None:
        stats["cpu_time"] = rec.cpu_time
    if rec.verdict is not None:
        stats["verdict"], stats["record_digest"] = rec.verdict, rec.record_digest
    return stats


def delivery_of(output: str | None, delivery: records.DeliveryRecord | None, kept: str,
                buffer_kept: bool) -> tuple[str | None, str | None]:
    """What became of the output, from delivery.json (or its absence): ``(output_note,
    output_error)``, each None where the job's record keeps what it has.

    *output* is where the job's output was to go (None: ``--no-output``), *kept* the path of
    its buffer in the job's directory and *buffer_kept* whether that buffer is still there.
    """
    note = delivery.note if delivery is not None and delivery.note else None
    if delivery is None and not buffer_kept:
        return note, None   # record lost in a crash; the buffer goes only after a full copy
    if output is not None and not (delivery and delivery.ok):
        why = (delivery.error if delivery else None) or "its delivery was interrupted"
        return note, f"{why}; the output is kept at {kept}"
    return note, None

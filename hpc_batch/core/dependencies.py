"""--after and --after-ok: when a waiting job may be queued (pure).

A waiting job names the jobs it starts after. With ``--after`` it is
released once all of them have ended, however they ended; with
``--after-ok`` only if every one exited 0, and it fails as
``dependency-failed`` as soon as one did not (without waiting for the
rest), naming which and how. A job it names that was evicted while it
waited ended as the waiting job's ``after_ended`` says; one no longer known
otherwise (its record gone) counts as ended, and for ``--after-ok`` as not ok.
"""

from collections.abc import Callable

from .jobs import EXITED, FINISHED, Job, Result, exit_column

READY, PENDING, FAILED = "ready", "pending", "failed"


def evaluate(job: Job, find: Callable[[int], Job | None]) -> tuple[str, str | None]:
    """``(READY | PENDING | FAILED, reason)`` for a waiting *job*; *find* looks a job up by id."""
    pending = []
    kept = {e[0]: e for e in job.after_ended} if job.after_ended else {}
    for dep_id in job.after:
        dep = find(dep_id)
        if dep is None and dep_id in kept:
            _, was_ok, column = kept[dep_id]
            if job.after_ok and not was_ok:
                return FAILED, f"job {dep_id} it was to follow ended {column}, not 0"
            continue
        if dep is None:
            if job.after_ok:
                return FAILED, f"job {dep_id} it was to follow is no longer known"
            continue
        if dep.state != FINISHED:
            pending.append(dep_id)
            continue
        result = dep.result
        if job.after_ok and not ok(result):
            return FAILED, f"job {dep_id} it was to follow ended {exit_column(result)}, not 0"
    if pending:
        return PENDING, f"waiting for job{'s' if len(pending) > 1 else ''} {', '.join(map(str, pending))} " \
                        f"to end{' with exit 0' if job.after_ok else ''}"
    return READY, None


def ok(result: Result | None) -> bool:
    """Whether a finished job counts as a success for --after-ok."""
    return result is not None and result.kind == EXITED and result.code == 0


def ended_entry(dep: Job) -> list[int | bool | str]:
    """What a waiting job keeps of a finished job it names, once that one is evicted."""
    result = dep.result
    return [dep.id, ok(result), exit_column(result)]

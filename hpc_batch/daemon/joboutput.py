"""A job's output buffer as the daemon reads it: attach's stream and log's pages.

The buffer (``<job dir>/output``) is written by the job's shepherd while the
job runs, and stays after the job's end only when its delivery failed (the
kept buffer, see undelivered.py). The job directory is root's, but a
user's process can reach the file (through ``--dev-dir``), so it is opened
as a root daemon opens anything near a user: never through a link, never
with an open that could block (a lease), and only if it is a regular file
of the daemon's own. A read is a bounded ``pread`` of a regular file: a
page (``protocol.LOG_PAGE_BYTES``) at most, so no request holds the loop
for longer than that takes.
"""

import os
import stat
from typing import Any

from shepherd.base import records

from ..core import views
from ..core.jobs import FINISHED, Job
from ..wire import protocol

OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def buffer_path(job_dir: str) -> str:
    """Where a job's output buffer lives in its directory."""
    return os.path.join(job_dir, records.OUTPUT)


def open_buffer(path: str) -> int | None:
    """A read-only descriptor of the buffer at *path*, or None (absent, or not one we trust)."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def has_kept_buffer(job: Job, job_dir: str) -> bool:
    """A finished job whose delivery failed, and whose buffer is still in its directory."""
    return job.state == FINISHED and bool(job.output_error) and os.path.lexists(buffer_path(job_dir))


def page_span(offset: int, until: int, size: int, page: int) -> tuple[int, int | None]:
    """How many bytes the page at *offset* holds, and the next page's offset (None: the last).

    Pure. The output asked for ends at *until* (the buffer's size at the first
    page), or at *size* if the buffer is now shorter; a page holds *page* bytes at most.
    """
    end = min(until, size)
    count = max(0, min(end - offset, page))
    more = offset + count if offset + count < end else None
    return count, more


def log_page(job: Job, job_dir: str, offset: int, until: int | None, buffer_max: int) -> dict[str, Any]:
    """The reply fields of one ``log`` page of *job* (the caller may see it; the engine checked).

    ``data`` (the bytes, as attach sends them: UTF-8 with surrogate escapes),
    ``offset`` (where they end), ``until``, ``more`` (the next page's offset,
    or None), ``size`` (the buffer's size now), ``buffer_max`` (the daemon's
    ``--max-output-buffer``: past it the output goes straight to the log file),
    ``output`` (that log file; None with ``--no-output``) and ``end`` (the
    attach ``end`` event's fields for a finished job, else None).
    """
    fd = None
    if job.state != FINISHED or has_kept_buffer(job, job_dir):
        fd = open_buffer(buffer_path(job_dir))
    data = b""
    size = 0
    more = None
    if fd is not None:
        try:
            size = os.fstat(fd).st_size
            if until is None:
                until = size
            count, more = page_span(offset, until, size, protocol.LOG_PAGE_BYTES)
            data = os.pread(fd, count, offset) if count else b""
            if len(data) < count:   # it shrank under us: what was read is all there is
                more = None
        except OSError:
            data, more = b"", None
        finally:
            os.close(fd)
    return {"id": job.id, "state": job.state, "data": data.decode("utf-8", "surrogateescape"),
            "offset": offset + len(data), "until": size if until is None else until, "more": more,
            "size": size, "buffer_max": buffer_max, "output": job.output,
            "end": views.end_fields(job) if job.state == FINISHED else None}

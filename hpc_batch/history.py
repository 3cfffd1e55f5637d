"""The accounting history: one JSON line per finished job, for an admin's tools.

``<state-dir>/history.jsonl`` is append-only and root-only (0600). When it
passes ``MAX_BYTES`` it is renamed to ``history.jsonl.1`` (replacing the
previous one) and a new file begins, so it never grows without bound. It is
a record for people and tools, not the daemon's state: a line lost in a
crash is not re-written, and a full disk skips the line with a log message.

Fields (stable): id, user, uid, name, command (argv), submitted, started,
ended (epoch seconds), wall (s), cpu_time (s), peak_mem (bytes), state,
result, exit (as ``list`` shows it), code, signal, note, max_time, mem,
cpus, gpus, output, output_error.
"""

import json
import logging
import os
from typing import Any

from .jobs import Job, exit_column

log = logging.getLogger("hpc-batchd")
MAX_BYTES = 64 << 20


def line_of(job: Job) -> dict[str, Any]:
    """The history record of a finished job."""
    res = job.get_result()
    alloc = job.alloc or {}
    started, ended = job.started, job.ended
    return {
        "id": job.id, "user": job.user, "uid": job.uid, "name": job.name, "command": job.argv,
        "submitted": job.submitted, "started": started, "ended": ended,
        "wall": (ended - started) if started is not None and ended is not None else None,
        "cpu_time": job.stats.get("cpu_time"), "peak_mem": job.stats.get("peak_mem"),
        "state": job.state, "result": res.kind if res else None, "exit": exit_column(res),
        "code": res.code if res else None, "signal": res.signal if res else None,
        "note": res.note if res else None, "max_time": job.max_time, "mem": job.budget.get("mem"),
        "cpus": alloc.get("cpus"), "gpus": alloc.get("gpus"), "output": job.output,
        "output_error": job.output_error,
    }


class History:
    """Appends finished jobs to the history file, rotating it by size."""

    def __init__(self, path: str, max_bytes: int = MAX_BYTES):
        self.path = path
        self.max_bytes = max_bytes

    def record(self, job: Job) -> None:
        """Append *job*'s line; never raises (accounting must not stop the daemon)."""
        data = (json.dumps(line_of(job), sort_keys=True) + "\n").encode()
        try:
            try:
                if os.stat(self.path).st_size + len(data) > self.max_bytes:
                    os.replace(self.path, self.path + ".1")
            except FileNotFoundError:
                pass
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("cannot append job %d to %s (%s)", job.id, self.path, exc)

"""The job record: what the daemon persists about a job, and its states.

A job moves queued -> running -> finished (or is removed while queued). A
finished job carries a Result that says *how* it ended, separately from the
exit code, so ``dispatch list --finished`` can show ``3`` apart from
``timeout`` apart from ``oom``. Records are plain dicts on disk; unknown keys
are ignored and missing ones take defaults, so older and newer state files
keep loading.
"""

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from . import bounds

QUEUED = "queued"
RUNNING = "running"
FINISHED = "finished"
STATES = (QUEUED, RUNNING, FINISHED)

# How a job ended. EXITED carries an exit code, SIGNALLED a signal number.
EXITED = "exited"
SIGNALLED = "signalled"
TIMEOUT = "timeout"     # --max-time ran out and the daemon stopped it
KILLED = "killed"       # dispatch kill, or its shepherd was killed
ERROR = "error"         # it never ran: exec failed, privileges, confinement
OOM = "oom"             # exceeded its memory budget


@dataclass
class Result:
    """How a finished job ended."""

    kind: str
    code: int | None = None      # exit code when kind == EXITED
    signal: int | None = None    # terminating signal, when there was one
    note: str | None = None      # why, in words (errno text, "shepherd killed")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        return cls(**{k: d[k] for k in ("kind", "code", "signal", "note") if k in d})


@dataclass
class Job:
    """One job as the daemon persists it (``jobs/<id>/job.json``)."""

    id: int
    uid: int
    gid: int
    user: str
    argv: list[str]
    cwd: str
    submitted: float
    max_time: int
    request: dict[str, Any] = field(default_factory=dict)  # cpus, mem, gpus, exclusive, numa_local
    budget: dict[str, Any] = field(default_factory=dict)   # mem (bytes), assigned (bool)
    output: str | None = None                              # final log path; None = --no-output
    state: str = QUEUED
    started: float | None = None
    ended: float | None = None
    alloc: dict[str, Any] | None = None                    # resources.Allocation.to_dict()
    stop_reason: str | None = None                         # TIMEOUT/KILLED once the daemon decided to stop it
    stop_sent: float | None = None                         # when SIGTERM went out (SIGKILL follows after grace)
    result: dict[str, Any] | None = None                   # Result as a dict
    output_error: str | None = None                        # why the log was not delivered
    output_note: str | None = None                         # what happened past --max-output-buffer
    stats: dict[str, Any] = field(default_factory=dict)    # accounting: peak_mem, cpu_time
    umask: int = 0o077                                     # the submitter's, for the job and its log

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form for the state file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Job":
        """Build from a state-file dict, ignoring keys this version does not know."""
        known = {f.name for f in fields(cls)}  # "env" stays on disk, never in memory
        job = cls(**{k: v for k, v in d.items() if k in known})
        job.check()
        return job

    def check(self) -> None:
        """Raise ValueError naming the first field this daemon could not act on.

        A record is written only by the daemon, but a disk, an admin or an
        older bug can leave anything there; one bad record must be set aside,
        not crash every start.
        """
        bounds.check_int(self.id, 1, bounds.MAX_ID, "id")
        bounds.check_int(self.uid, 0, bounds.MAX_UID, "uid")
        bounds.check_int(self.gid, 0, bounds.MAX_UID, "gid")
        bounds.check_int(self.max_time, 1, bounds.MAX_SECONDS, "max_time")
        bounds.check_int(self.umask, 0, bounds.MAX_UMASK, "umask")
        if not isinstance(self.user, str) or not self.user:
            raise ValueError("user must be a name")
        if not isinstance(self.argv, list) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError("argv must be a non-empty list of strings")
        for name in ("cwd", "output", "output_error", "output_note", "stop_reason"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be text")
        bounds.check_time(self.submitted, "submitted", allow_none=False)
        for name in ("started", "ended", "stop_sent"):
            bounds.check_time(getattr(self, name), name)
        if self.state not in STATES:
            raise ValueError(f"unknown job state {self.state!r}")
        for name in ("request", "budget", "stats"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be an object")
        bounds.check_int(self.budget.get("mem"), 1, bounds.MAX_MEM, "budget.mem")
        for name, high in (("cpus", bounds.MAX_CPUS), ("mem", bounds.MAX_MEM)):
            if self.request.get(name) is not None:
                bounds.check_int(self.request[name], 1, high, f"request.{name}")
        bounds.check_int(self.request.get("gpus", 0), 0, bounds.MAX_GPUS, "request.gpus")
        if self.request.get("gpu_link") is not None and not isinstance(self.request["gpu_link"], str):
            raise ValueError("request.gpu_link must be text")
        if self.state == RUNNING and (self.started is None or not isinstance(self.alloc, dict)):
            raise ValueError("a running job needs its start time and allocation")
        if self.result is not None and not (isinstance(self.result, dict) and isinstance(self.result.get("kind"), str)):
            raise ValueError("result must be an object with a kind")

    @property
    def command(self) -> str:
        """The command line as a shell would show it."""
        import shlex
        return shlex.join(self.argv)

    @property
    def deadline(self) -> float | None:
        """When --max-time runs out, for a running job."""
        return None if self.started is None else self.started + self.max_time

    def get_result(self) -> Result | None:
        return None if self.result is None else Result.from_dict(self.result)


def exit_column(result: Result | None) -> str:
    """The ``<exit>`` column: the exit code, or why the job did not exit on its own."""
    if result is None:
        return "-"
    if result.kind == EXITED:
        return str(result.code)
    if result.kind == SIGNALLED:
        import signal as _signal
        try:
            if result.signal is not None:  # Signals(None) is a ValueError too
                return _signal.Signals(result.signal).name
        except ValueError:
            pass
        return f"signal{result.signal}"
    return result.kind

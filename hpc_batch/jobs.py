"""The job record: what the daemon persists about a job, and its states.

A job moves queued -> running -> finished (or is removed while queued). A
finished job carries a Result that says *how* it ended, separately from the
exit code, so ``dispatch list --finished`` can show ``3`` apart from
``timeout`` apart from ``oom``. Records are plain dicts on disk; unknown keys
are ignored and missing ones take defaults, so older and newer state files
keep loading.
"""

from dataclasses import asdict, dataclass, field, fields

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
RESULT_KINDS = (EXITED, SIGNALLED, TIMEOUT, KILLED, ERROR, OOM)


@dataclass
class Result:
    """How a finished job ended."""

    kind: str
    code: int | None = None      # exit code when kind == EXITED
    signal: int | None = None    # terminating signal, when there was one
    note: str | None = None      # why, in words (errno text, "shepherd killed")

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        return cls(**{k: d[k] for k in ("kind", "code", "signal", "note") if k in d})


@dataclass
class Job:
    """One job as the daemon persists it (``jobs/<id>/job.json``)."""

    id: int
    uid: int
    gid: int
    user: str
    argv: list
    cwd: str
    submitted: float
    max_time: int
    request: dict = field(default_factory=dict)   # cpus, mem, gpus, exclusive, numa_local
    budget: dict = field(default_factory=dict)    # mem (bytes), assigned (bool)
    output: str | None = None                     # final log path; None = --no-output
    state: str = QUEUED
    started: float | None = None
    ended: float | None = None
    alloc: dict | None = None                     # resources.Allocation.to_dict()
    stop_reason: str | None = None                # TIMEOUT/KILLED once the daemon decided to stop it
    stop_sent: float | None = None                # when SIGTERM went out (SIGKILL follows after grace)
    result: dict | None = None                    # Result as a dict
    output_error: str | None = None               # why the log was not delivered
    stats: dict = field(default_factory=dict)     # accounting: peak_mem, cpu_time

    def to_dict(self) -> dict:
        """JSON-safe form for the state file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        """Build from a state-file dict, ignoring keys this version does not know."""
        known = {f.name for f in fields(cls)}  # "env" stays on disk, never in memory
        job = cls(**{k: v for k, v in d.items() if k in known})
        if job.state not in STATES:
            raise ValueError(f"unknown job state {job.state!r}")
        return job

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
            return _signal.Signals(result.signal).name
        except ValueError:
            return f"signal{result.signal}"
    return result.kind

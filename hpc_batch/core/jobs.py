"""The job record: what the daemon persists about a job, and its life cycle.

The life cycle is one table (``TRANSITIONS``), and a job moves only through
:func:`move`, which refuses anything the table does not list (the engine
calls it through ``JobTable.move``, which moves the indexes with it)::

    waiting  -- its --after jobs ended ------------------> queued
    waiting  -- cancelled / dependency-failed / error ---> finished
    queued   -- started ---------------------------------> running
    queued   -- cancelled / error (can never start) -----> finished
    running  -- its start could not be written, or its
                command not forked (out of pids) --------> queued
    running  -- exited / signalled / timeout / killed /
                oom / error / lost ----------------------> finished

Each state carries its own data, checked by :meth:`Job.check`: a waiting
job its dependencies, a running one its allocation, start and deadline, a
finished one its Result, which says *how* it ended apart from the exit code,
so ``3`` stands apart from ``timeout`` apart from ``oom``. Records are plain
dicts on disk; unknown keys are ignored and missing ones take defaults, so
older and newer state files keep loading.
"""

from dataclasses import dataclass, field, fields
from typing import Any

from shepherd.base.records import KILLED as KILLED  # the shepherd's stop reasons are these two results
from shepherd.base.records import TIMEOUT as TIMEOUT

from .. import bounds
from .cut import cut_command, join
from .jobnames import stored_name
from .jobrequest import JobRequest
from .resources import Allocation

WAITING = "waiting"     # on its --after / --after-ok jobs
QUEUED = "queued"
RUNNING = "running"
FINISHED = "finished"
STATES = (WAITING, QUEUED, RUNNING, FINISHED)

# How a job ended. EXITED carries an exit code, SIGNALLED a signal number.
EXITED = "exited"
SIGNALLED = "signalled"
# TIMEOUT: --max-time ran out and the shepherd stopped it; KILLED: dispatch kill, or its
# shepherd was killed. Both are the shepherd's stop reasons, defined in shepherd/base/records.py.
ERROR = "error"         # it never ran: exec failed, privileges, confinement, can never fit
OOM = "oom"             # exceeded its memory budget
CANCELLED = "cancelled"                 # dispatch kill before it started
DEPENDENCY_FAILED = "dependency-failed"  # an --after-ok job did not exit 0
LOST = "lost"           # its shepherd vanished while no daemon watched; how it ended is unknown
RESULTS = (EXITED, SIGNALLED, TIMEOUT, KILLED, ERROR, OOM, CANCELLED, DEPENDENCY_FAILED, LOST)

# (from, to) -> the results a move into FINISHED may carry (empty: none is given).
TRANSITIONS: dict[tuple[str, str], frozenset[str]] = {
    (WAITING, QUEUED): frozenset(),
    (WAITING, FINISHED): frozenset({CANCELLED, DEPENDENCY_FAILED, ERROR}),
    (QUEUED, RUNNING): frozenset(),
    (QUEUED, FINISHED): frozenset({CANCELLED, ERROR}),
    (RUNNING, QUEUED): frozenset(),
    (RUNNING, FINISHED): frozenset({EXITED, SIGNALLED, TIMEOUT, KILLED, OOM, ERROR, LOST}),
}

# dispatch wait's exit status for a job that did not exit on its own: a block of
# its own, documented, so a script can tell them from each other (and from 128+N).
WAIT_STATUS = {KILLED: 240, TIMEOUT: 241, OOM: 242, ERROR: 243, CANCELLED: 244, DEPENDENCY_FAILED: 245,
               LOST: 246}


class BadMove(ValueError):
    """A state change the life-cycle table does not allow (a bug, never user input)."""


@dataclass(frozen=True)
class Result:
    """How a finished job ended (frozen: a job and its views share it)."""

    kind: str
    code: int | None = None      # exit code when kind == EXITED
    signal: int | None = None    # terminating signal, when there was one
    note: str | None = None      # why, in words (errno text, "shepherd killed")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        """From its stored form (:meth:`to_dict`); keys it does not know are left out."""
        return cls(**{k: d[k] for k in ("kind", "code", "signal", "note") if k in d})

    def to_dict(self) -> dict[str, Any]:
        """Its stored and wire form: all four keys, None where there is nothing."""
        return {"kind": self.kind, "code": self.code, "signal": self.signal, "note": self.note}


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
    request: JobRequest = field(default_factory=JobRequest)  # its resources and options (stored: its to_dict())
    budget: dict[str, Any] = field(default_factory=dict)   # mem (bytes), assigned (bool)
    output: str | None = None                              # final log path; None = --no-output
    state: str = QUEUED
    started: float | None = None
    ended: float | None = None
    alloc: Allocation | None = None                        # a running or ended job's (stored: its to_dict())
    stop_reason: str | None = None                         # TIMEOUT/KILLED once the daemon decided to stop it
    stop_sent: float | None = None                         # when SIGTERM went out (SIGKILL follows after grace)
    result: Result | None = None                           # a finished job's (stored: its to_dict())
    output_error: str | None = None                        # why the log was not delivered
    output_note: str | None = None                         # what happened past --max-output-buffer
    stats: dict[str, Any] = field(default_factory=dict)    # accounting: peak_mem, cpu_time
    umask: int = 0o077                                     # the submitter's, for the job and its log
    name: str | None = None                                # --name
    after: list[int] = field(default_factory=list)         # --after / --after-ok: jobs it starts after
    after_ok: bool = False                                 # ... and only if they exited 0
    # How the jobs it names ended, kept when they were evicted before it left waiting:
    # [id, ok, exit column] each (dependencies.py reads it as it reads a finished job).
    after_ended: list[list[Any]] = field(default_factory=list)
    # Element of a bulk submit: first (the array's id), index, limit (%N), count (its size; a record
    # from before arrays could be named has none, and its array is measured by its ids: Engine.array_of).
    array: dict[str, Any] | None = None
    quiet: dict[str, Any] | None = None                    # benchmark job: IRQs, cpufreq, partition (quiet.py)
    shortfalls: list[str] = field(default_factory=list)    # --benchmark: every way the machine fell short
    bench_start: dict[str, Any] | None = None              # --benchmark: counters when it started (benchmark.Sample)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form for the state file: a copy, nothing in it shared with the job.

        Every field but the allocation and the result holds JSON data (dicts,
        lists, scalars), so a copy of its containers does what
        ``dataclasses.asdict`` does, at a fraction of its cost: the daemon
        writes a record at every change of state.
        """
        d = {name: _copy(getattr(self, name)) for name in _FIELD_NAMES}
        d["request"] = self.request.to_dict()
        if self.alloc is not None:
            d["alloc"] = self.alloc.to_dict()
        if self.result is not None:
            d["result"] = self.result.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Job":
        """Build from a state-file dict, ignoring keys this version does not know; ValueError names
        the first field this daemon could not act on (:meth:`check`)."""
        known = {f.name for f in fields(cls)}  # "env" stays on disk, never in memory
        data = {k: v for k, v in d.items() if k in known}
        if "request" in data:
            data["request"] = JobRequest.from_dict(data["request"])
        if data.get("alloc") is not None:
            data["alloc"] = _stored_allocation(data["alloc"])
        if data.get("result") is not None:
            data["result"] = _stored_result(data["result"])
        job = cls(**data)
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
        if not isinstance(self.request, JobRequest):
            raise ValueError("request must be an object")
        for name in ("budget", "stats"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be an object")
        bounds.check_int(self.budget.get("mem"), 1, bounds.MAX_MEM, "budget.mem")
        if self.name is not None and not stored_name(self.name):
            raise ValueError("name is not a valid job name")
        if not isinstance(self.after, list) or len(self.after) > MAX_AFTER:
            raise ValueError(f"after must be a list of at most {MAX_AFTER} job ids")
        for dep in self.after:
            bounds.check_int(dep, 1, bounds.MAX_ID, "after")
        if not isinstance(self.after_ended, list) or len(self.after_ended) > MAX_AFTER or not all(
                isinstance(e, list) and len(e) == 3 and isinstance(e[1], bool) and isinstance(e[2], str)
                for e in self.after_ended):
            raise ValueError(f"after_ended must be a list of at most {MAX_AFTER} [id, ok, exit] entries")
        for e in self.after_ended:
            bounds.check_int(e[0], 1, bounds.MAX_ID, "after_ended")
        if self.array is not None:
            if not isinstance(self.array, dict):
                raise ValueError("array must be an object")
            bounds.check_int(self.array.get("first"), 1, self.id, "array.first")
            bounds.check_int(self.array.get("index"), 0, bounds.MAX_ARRAY_INDEX, "array.index")
            if self.array.get("limit") is not None:
                bounds.check_int(self.array["limit"], 1, bounds.MAX_ARRAY, "array.limit")
            if self.array.get("count") is not None:
                bounds.check_int(self.array["count"], self.id - self.array["first"] + 1, bounds.MAX_ARRAY,
                                 "array.count")
        if not isinstance(self.shortfalls, list) or not all(isinstance(n, str) for n in self.shortfalls):
            raise ValueError("shortfalls must be a list of text")
        if self.bench_start is not None and not isinstance(self.bench_start, dict):
            raise ValueError("bench_start must be an object")
        if self.state == RUNNING and (self.started is None or not isinstance(self.alloc, Allocation)):
            raise ValueError("a running job needs its start time and allocation")
        if self.state == FINISHED and self.result is None:
            raise ValueError("a finished job needs its result")
        if self.result is not None and not (isinstance(self.result, Result) and self.result.kind in RESULTS):
            raise ValueError("result must be an object with a known kind")

    @property
    def command(self) -> str:
        """The whole command line as a shell would show it (for show: not kept, it can be 1 MiB)."""
        return join(self.argv)

    @property
    def shown(self) -> tuple[str, int]:
        """``(command, command_len)``: the command line cut for summaries (cut.py), and its full
        length; worked out once (argv never changes), and shared by the elements of a bulk."""
        got = self.__dict__.get("_shown")
        if got is None:
            got = self.__dict__["_shown"] = cut_command(self.argv)
        return got

    @property
    def deadline(self) -> float | None:
        """When --max-time runs out, for a running job."""
        return None if self.started is None else self.started + self.max_time


MAX_AFTER = 64          # dependencies of one job
def move(job: Job, to: str, now: float, result: Result | None = None,
         alloc: Allocation | None = None) -> None:
    """Move *job* to state *to* as the life-cycle table allows, setting that state's data.

    Raises BadMove for a move the table does not list (or a result it does
    not allow): the engine never changes a state any other way.
    """
    allowed = TRANSITIONS.get((job.state, to))
    if allowed is None:
        raise BadMove(f"job {job.id} cannot go from {job.state} to {to}")
    if to == FINISHED:
        if result is None or result.kind not in allowed:
            raise BadMove(f"job {job.id} cannot finish from {job.state} as {result.kind if result else None}")
        job.state, job.ended, job.result = FINISHED, now, result
    elif result is not None:
        raise BadMove(f"job {job.id}: only finishing carries a result")
    elif to == RUNNING:
        if alloc is None:
            raise BadMove(f"job {job.id} cannot run without an allocation")
        job.state, job.started, job.alloc = RUNNING, now, alloc
    else:   # to QUEUED: from waiting (its dependencies ended) or back from a start that failed
        job.state, job.started, job.alloc = QUEUED, None, None


def wait_status(result: Result | None) -> int:
    """dispatch wait's exit status for a finished job: its code, 128+signal, or WAIT_STATUS."""
    if result is None:
        return WAIT_STATUS[LOST]
    if result.kind == EXITED:
        return result.code if isinstance(result.code, int) else 0
    if result.kind == SIGNALLED:
        return 128 + (result.signal or 0)
    return WAIT_STATUS.get(result.kind, WAIT_STATUS[ERROR])


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


_FIELD_NAMES = tuple(f.name for f in fields(Job))


def _stored_allocation(d: Any) -> Allocation:
    """A record's ``alloc``, or ValueError saying it is not one."""
    if not isinstance(d, dict):
        raise ValueError("alloc must be an object")
    try:
        return Allocation.from_dict(d)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"alloc is not an allocation ({type(exc).__name__}: {exc})") from None


def _stored_result(d: Any) -> Result:
    """A record's ``result``, or ValueError saying it is not one."""
    if not (isinstance(d, dict) and d.get("kind") in RESULTS):
        raise ValueError("result must be an object with a known kind")
    for name in ("code", "signal"):
        if d.get(name) is not None:
            bounds.check_int(d[name], -(1 << 31), (1 << 31) - 1, f"result.{name}")
    if d.get("note") is not None and not isinstance(d["note"], str):
        raise ValueError("result.note must be text")
    return Result.from_dict(d)


def _copy(value: Any) -> Any:
    """A copy of JSON data: its dicts and lists anew, its scalars as they are."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value

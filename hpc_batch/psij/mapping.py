"""A PSI/J job in hpc-batch's terms: the pure half of the PSI/J executor.

``submission`` turns a PSI/J ``JobSpec`` into the ``dispatch new`` command
line that runs it, and ``statuses`` turns what the daemon says of a job (the
``list --json`` fields) into PSI/J states. Neither imports psij nor does any
I/O, so both are tested without a daemon; ``psij_executor`` does the rest.
docs/psij.md ("When you outgrow one machine") has the table of what each field
becomes.
"""

import math
import os
from dataclasses import dataclass, field
from typing import Any

from .. import bounds
from ..core import jobnames, jobs
from ..core.jobnames import env_word

EXECUTOR = "hpc-batch"      # the name PSI/J knows the executor by, and the prefix of its custom attributes

# Custom attributes "hpc-batch.<name>": the dispatch new flags PSI/J has no field for.
SWITCHES = ("numa-local", "numa-local-mem", "numa-local-gpu")   # True adds --<name>
VALUED = ("gpu-link",)                                          # a string: --<name> VALUE

# hpc-batch keeps one output (stdout and stderr together); a job whose stdin
# or stderr goes elsewhere runs under this shell, which opens those files as
# the user, in the job's directory, and then execs the command (so its exit
# code and signal are the command's own). $0 signs the shell's own errors.
SHELL = "/bin/sh"
WRAPPER_NAME = "hpc-batch-psij"

# dispatch's refusal codes (messages.REFUSALS, plus the client's own "usage"
# and "unreachable") by what PSI/J makes of them: the job as described can
# never be taken (InvalidJobException), or not now (a transient SubmitException).
INVALID = frozenset({"usage", "bad_request", "never_fits", "too_large", "refused"})
TRANSIENT = frozenset({"busy", "queue_full", "unreachable"})


class Unsupported(ValueError):
    """A job hpc-batch cannot run as described; the message names the field and what to do instead."""


@dataclass(frozen=True)
class Submission:
    """How to submit one job: ``dispatch new --json FLAGS -- COMMAND``, run in *cwd*."""

    flags: tuple[str, ...]
    command: tuple[str, ...]    # NAME=VALUE words (the job's environment), then what the job runs
    cwd: str | None             # the job's directory (dispatch submits from where it runs); None: ours

    def argv(self, dispatch: str) -> list[str]:
        """The command line, given the path of ``dispatch``."""
        return [dispatch, "new", "--json", *self.flags, "--", *self.command]


def submission(spec: Any) -> Submission:
    """The ``dispatch new`` that runs *spec* (a psij.JobSpec); raises Unsupported naming the field at fault."""
    if not spec.executable:
        raise Unsupported("the job has no executable: set JobSpec(executable=...)")
    if spec.launcher not in (None, "single"):
        raise Unsupported(f"launcher {spec.launcher!r} is not available: hpc-batch starts the executable once, "
                          f"as the 'single' launcher does; make mpirun (or the like) the executable instead")
    for script in ("pre_launch", "post_launch"):
        if getattr(spec, script) is not None:
            raise Unsupported(f"{script} is not supported by hpc-batch: make the executable a script that runs it")
    flags = _resources(spec.resources) + _duration(spec.attributes) + _custom(spec.attributes)
    name = job_name(spec.name)
    if name is not None:
        flags += ["--name", name]
    if spec.inherit_environment:
        flags.append("--env")
    out, err = spec.stdout_path, spec.stderr_path
    flags += ["--no-output"] if out is None else ["--output", str(out)]
    # PSI/J sends an unnamed stream to /dev/null; one named like stdout joins it in hpc-batch's output.
    err_to: str | None = None
    if err is None and out is not None:
        err_to = os.devnull
    elif err is not None and err != out:
        err_to = str(err)
    argv = [spec.executable, *(spec.arguments or [])]
    stdin = None if spec.stdin_path is None else str(spec.stdin_path)
    return Submission(tuple(flags), tuple(_environment(spec.environment) + _redirected(argv, stdin, err_to)),
                      None if spec.directory is None else str(spec.directory))


def _resources(res: Any) -> list[str]:
    if res is None:
        return []
    if getattr(res, "version", None) != 1:
        raise Unsupported(f"resource spec version {getattr(res, 'version', None)!r}: hpc-batch reads ResourceSpecV1")
    nodes = res.computed_node_count
    if nodes > 1:
        raise Unsupported(f"the job asks for {nodes} nodes (node_count, or process_count over processes_per_node): "
                          f"hpc-batch runs a job on one machine; submit it with a cluster executor such as slurm")
    procs = res.computed_process_count
    cores, gpus, mem = res.cpu_cores_per_process, res.gpu_cores_per_process, res.memory
    if cores is not None and cores < 1:
        raise Unsupported(f"cpu_cores_per_process {cores}: give at least 1, or leave it unset")
    if gpus is not None and gpus < 0:
        raise Unsupported(f"gpu_cores_per_process {gpus}: give 0 or more, or leave it unset")
    if mem is not None and mem < 1:
        raise Unsupported(f"memory {mem}: give the job's memory in bytes, or leave it unset")
    flags = []
    # One command runs (as with PSI/J's 'single' launcher); it gets every process's share.
    if cores is not None or procs > 1:
        flags += ["--cpu", str((cores or 1) * procs)]
    if gpus:
        flags += ["--gpu-cores", str(gpus * procs)]
    if mem is not None:
        # Bytes, rounded up to whole KiB, and to the least budget a job has (asked less, it gets more).
        flags += ["--max-mem", f"{-(-max(mem, bounds.MIN_JOB_MEM) // 1024)}K"]
    if res.exclusive_node_use:
        flags.append("--exclusive")
    return flags


def _duration(attrs: Any) -> list[str]:
    duration = None if attrs is None else attrs.duration
    if duration is None:
        return []
    seconds = math.ceil(duration.total_seconds())   # rounded up: a job never gets less than it asked for
    if seconds < 1:
        raise Unsupported(f"duration {duration}: give at least one second")
    return ["--max-time", str(seconds)]


def _custom(attrs: Any) -> list[str]:
    flags: list[str] = []
    for key, value in sorted(((attrs.custom_attributes if attrs is not None else None) or {}).items()):
        prefix, _, name = key.partition(".")
        if prefix != EXECUTOR:
            continue    # another executor's (slurm.constraint, ...): the same script runs on both
        if name in SWITCHES:
            if not isinstance(value, bool):
                raise Unsupported(f"custom attribute {key!r} takes True or False, not {value!r}")
            if value:
                flags.append(f"--{name}")
        elif name in VALUED:
            if not isinstance(value, str) or not value:
                raise Unsupported(f"custom attribute {key!r} takes a link class such as 'NV' or 'PIX', not {value!r}")
            flags += [f"--{name}", value]
        else:
            known = ", ".join(f"{EXECUTOR}.{n}" for n in SWITCHES + VALUED)
            raise Unsupported(f"unknown custom attribute {key!r}; hpc-batch knows {known}")
    return flags


def _environment(env: dict[str, str] | None) -> list[str]:
    words = []
    for name, value in (env or {}).items():
        if "=" in name or not env_word(f"{name}="):
            raise Unsupported(f"environment variable {name!r}: a name is letters, digits and '_', "
                              f"not starting with a digit")
        if "\0" in value:
            raise Unsupported(f"environment variable {name!r} holds a NUL byte, which no environment can carry")
        words.append(f"{name}={value}")
    return words


def _redirected(argv: list[str], stdin: str | None, stderr: str | None) -> list[str]:
    """*argv*, under the wrapper shell when its stdin or stderr is to be a file (or it looks like NAME=VALUE)."""
    paths, ops = [], []
    for path, op in ((stdin, "<"), (stderr, "2>")):
        if path is not None:
            paths.append(path)
            ops.append(f'{op}"$r{len(paths)}"')
    if not paths and not env_word(argv[0]):
        return argv
    script = 'exec "$@"'
    if paths:
        names = " ".join(f"r{i}=${i}" for i in range(1, len(paths) + 1))
        script = f'{names}; shift {len(paths)}; exec "$@" {" ".join(ops)}'
    return [SHELL, "-c", script, WRAPPER_NAME, *paths, *argv]


def job_name(name: str | None) -> str | None:
    """A ``--name`` from PSI/J's job name (by default the executable): its last path part, with each
    character a name cannot hold made '_'; None when nothing usable is left."""
    if not name:
        return None
    last = name.rstrip("/").rsplit("/", 1)[-1]
    clean = "".join(c if jobnames.name_char(c) else "_" for c in last)[:jobnames.MAX_NAME]
    if clean.isdigit() or jobnames.is_range(clean):
        clean = f"job-{clean}"[:jobnames.MAX_NAME]
    return clean if jobnames.valid_name(clean) else None


@dataclass(frozen=True)
class Status:
    """One PSI/J state a job has reached (a psij.JobState name), with what PSI/J's JobStatus carries."""

    state: str
    time: float | None = None
    exit_code: int | None = None
    message: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def statuses(job: dict[str, Any]) -> list[Status]:
    """The PSI/J states *job* (the daemon's list/show fields) has reached, in order.

    Waiting and queued are QUEUED, running is ACTIVE; a finished job that
    ran is ACTIVE and then its final state, so PSI/J's callbacks see every
    step even when the start and the end are learned together.
    """
    meta = {"nativeId": str(job.get("id"))}
    out = [Status("QUEUED", job.get("submitted"), metadata=meta)]
    if job.get("started") is not None and job.get("state") in (jobs.RUNNING, jobs.FINISHED):
        out.append(Status("ACTIVE", job.get("started"), metadata=meta))
    if job.get("state") == jobs.FINISHED:
        out.append(_final(job, meta))
    return out


# What a result that is not an exit code means, in words, by its kind.
_WHY = {
    jobs.KILLED: "killed while it ran (dispatch kill)",
    jobs.CANCELLED: "cancelled before it started",
    jobs.TIMEOUT: "ran past its duration and was stopped",
    jobs.OOM: "went over its memory budget and was killed",
    jobs.ERROR: "could not be run",
    jobs.DEPENDENCY_FAILED: "a job it depended on did not succeed",
    jobs.LOST: "its shepherd vanished while no daemon watched; how it ended is unknown",
}


def _final(job: dict[str, Any], meta: dict[str, Any]) -> Status:
    result = job.get("result") or {}
    kind, code, signal, note = result.get("kind"), result.get("code"), result.get("signal"), result.get("note")
    meta = dict(meta, result=kind, exit=job.get("exit"), output=job.get("output"))
    exit_code = None
    message = None
    if kind == jobs.EXITED and isinstance(code, int):
        state, exit_code = ("COMPLETED" if code == 0 else "FAILED"), code
    elif kind == jobs.SIGNALLED and isinstance(signal, int):
        # 128+N, as a shell (and so PSI/J's local and batch launchers) reports it, and as dispatch wait exits.
        state, exit_code, message = "FAILED", 128 + signal, f"killed by {job.get('exit')}"
        meta["signal"] = signal
    elif kind in (jobs.KILLED, jobs.CANCELLED):
        state, message = "CANCELED", _WHY[kind]
    else:
        state, message = "FAILED", _WHY.get(str(kind), f"ended as {kind}")
    if note:   # the daemon's words; a cancelled job's already say what happened (and who did it)
        message = note if kind == jobs.CANCELLED or not message else f"{message}: {note}"
    if job.get("output_error"):
        meta["output_error"] = job["output_error"]
        message = f"{message}; " if message else ""
        message += f"output not delivered: {job['output_error']}"
    return Status(state, job.get("ended"), exit_code, message, meta)


def refusal(code: str | None) -> str:
    """What PSI/J makes of a refused submit: "invalid" (the job itself), "transient" (try later) or "submit"."""
    if code in INVALID:
        return "invalid"
    return "transient" if code in TRANSIENT else "submit"

"""The messages client and daemon exchange: the contract both sides import.

Every request is ``{"v": VERSION, "op": VERB, "args": {...}}``; every reply is
``{"v": VERSION, "ok": true, "result": {...}}`` or ``{"v": VERSION, "ok":
false, "error": "one line the CLI prints"}``. ``attach`` answers with a stream
of ``{"ok": true, "event": ...}`` frames ending in an ``end`` event. Who is
asking never travels in a message: the daemon takes it from SO_PEERCRED.

Requests are parsed into frozen dataclasses validated when built, so a handler
only ever sees well-typed values, and a bad field is the *client's* fault with
a message naming the field.
"""

from dataclasses import dataclass, field

from .messages import VERSION, error, event, ok, request  # noqa: F401  (re-exported)


class ProtocolError(ValueError):
    """A request that is well framed but not a valid message of this version."""


def _get(args: dict, name: str, kinds, default=..., allow_none=False):
    if name not in args:
        if default is ...:
            raise ProtocolError(f"request lacks field {name!r}")
        return default
    value = args[name]
    if value is None and allow_none:
        return None
    # bool is an int subclass; never accept one for the other.
    if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
        raise ProtocolError(f"field {name!r} has the wrong type")
    return value


def _str_list(args: dict, name: str) -> tuple:
    value = _get(args, name, (list,))
    if not all(isinstance(v, str) and "\0" not in v for v in value):
        raise ProtocolError(f"field {name!r} must be a list of strings without NUL")
    return tuple(value)


def _str_map(args: dict, name: str):
    value = _get(args, name, (dict,), default=None, allow_none=True)
    if value is None:
        return None
    for k, v in value.items():
        if not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise ProtocolError(f"field {name!r} has an invalid variable {k!r}")
    return dict(value)


@dataclass(frozen=True)
class NewJob:
    """``dispatch new``: everything the daemon needs to queue a job."""

    argv: tuple
    cwd: str
    cpus: int | None = None
    gpus: int = 0
    mem: int | None = None          # bytes, None = assign the default share
    max_time: int | None = None     # seconds, None = --max-lifetime
    exclusive: bool = False
    numa_local: bool = False
    output: str | None = None       # absolute path as typed (dir or file); None = cwd
    no_output: bool = False
    env: dict | None = None         # the forwarded environment (--env), or None
    job_env: dict = field(default_factory=dict)  # leading NAME=VALUE words
    base_env: dict = field(default_factory=dict)  # the submitter's PATH and LANG for a clean env

    @classmethod
    def from_args(cls, args: dict) -> "NewJob":
        argv = _str_list(args, "argv")
        if not argv or not argv[0]:
            raise ProtocolError("no command given: put it after '--', e.g. dispatch new -- echo hello")
        cwd = _get(args, "cwd", (str,))
        if not cwd.startswith("/") or "\0" in cwd:
            raise ProtocolError("field 'cwd' must be an absolute path")
        output = _get(args, "output", (str,), default=None, allow_none=True)
        if output is not None and (not output.startswith("/") or "\0" in output):
            raise ProtocolError("field 'output' must be an absolute path")
        return cls(
            argv=argv, cwd=cwd,
            cpus=_get(args, "cpus", (int,), default=None, allow_none=True),
            gpus=_get(args, "gpus", (int,), default=0),
            mem=_get(args, "mem", (int,), default=None, allow_none=True),
            max_time=_get(args, "max_time", (int,), default=None, allow_none=True),
            exclusive=_get(args, "exclusive", (bool,), default=False),
            numa_local=_get(args, "numa_local", (bool,), default=False),
            output=output,
            no_output=_get(args, "no_output", (bool,), default=False),
            env=_str_map(args, "env"),
            job_env=_str_map(args, "job_env") or {},
            base_env={k: v for k, v in (_str_map(args, "base_env") or {}).items() if k in ("PATH", "LANG")},
        )


@dataclass(frozen=True)
class ListJobs:
    """``dispatch list``."""

    all: bool = False
    finished: bool = False

    @classmethod
    def from_args(cls, args: dict) -> "ListJobs":
        return cls(all=_get(args, "all", (bool,), default=False),
                   finished=_get(args, "finished", (bool,), default=False))


@dataclass(frozen=True)
class JobRef:
    """``dispatch attach ID`` / ``dispatch kill ID``."""

    id: int

    @classmethod
    def from_args(cls, args: dict) -> "JobRef":
        job_id = _get(args, "id", (int,))
        if job_id <= 0:
            raise ProtocolError("job ids are positive integers")
        return cls(id=job_id)


@dataclass(frozen=True)
class Attach:
    """``dispatch attach ID``; *offset* resumes a stream cut by a daemon reload."""

    id: int
    offset: int = 0

    @classmethod
    def from_args(cls, args: dict) -> "Attach":
        ref = JobRef.from_args(args)
        offset = _get(args, "offset", (int,), default=0)
        if offset < 0:
            raise ProtocolError("field 'offset' must not be negative")
        return cls(id=ref.id, offset=offset)


@dataclass(frozen=True)
class Ping:
    """Liveness probe; answers with the daemon's version."""

    @classmethod
    def from_args(cls, args: dict) -> "Ping":
        return cls()


# One line a verb: the daemon's dispatch table is keyed on the same names.
REQUESTS = {"new": NewJob, "list": ListJobs, "attach": Attach, "kill": JobRef, "ping": Ping}


def parse_request(msg: dict):
    """Validate a decoded frame; return ``(op, payload)`` or raise ProtocolError."""
    version = msg.get("v")
    if version != VERSION:
        raise ProtocolError(
            f"protocol version {version!r} is not supported (daemon speaks {VERSION}); "
            "is dispatch the same version as hpc-batchd?")
    op = msg.get("op")
    if op not in REQUESTS:
        raise ProtocolError(f"unknown command {op!r}; is dispatch the same version as hpc-batchd?")
    args = msg.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError("field 'args' must be an object")
    return op, REQUESTS[op].from_args(args)

"""The messages client and daemon exchange: the contract both sides import.

Every request is ``{"v": VERSION, "op": VERB, "args": {...}}``; every reply is
``{"v": VERSION, "ok": true, "result": {...}}`` or ``{"v": VERSION, "ok":
false, "error": "one line the CLI prints"}``. ``attach`` answers with a stream
of ``{"ok": true, "event": ...}`` frames ending in an ``end`` event. Who is
asking never travels in a message: the daemon takes it from SO_PEERCRED.

Requests are parsed into frozen dataclasses validated when built, so a handler
only ever sees well-typed values within bounds (``bounds``), and a bad field
is the *client's* fault with a message naming the field.
"""

from dataclasses import dataclass, field
from typing import Any

from shepherd.base import notifytext
from shepherd.base.verdicts import VERDICTS

from .. import bounds
from ..core import arrayref

# Re-exported (``protocol.ok(...)`` and the rest): the redundant aliases mark them public.
from ..core.jobnames import NAME_RULE, split_ref, valid_name
from ..core.jobs import MAX_AFTER, RESULTS
from .messages import VERSION as VERSION
from .messages import error as error
from .messages import event as event
from .messages import ok as ok
from .messages import request as request

Args = dict[str, Any]  # a request's decoded "args" object


class ProtocolError(ValueError):
    """A request that is well framed but not a valid message of this version."""


def _get(args: Args, name: str, kinds: tuple[type, ...], default: Any = ..., allow_none: bool = False) -> Any:
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


def _int(args: Args, name: str, low: int, high: int, default: Any = ..., allow_none: bool = False) -> Any:
    value = _get(args, name, (int,), default, allow_none)
    if value is None:
        return value
    if not low <= value <= high:
        raise ProtocolError(f"field {name!r} must be from {low} to {high}")
    return value


def _path(args: Args, name: str, default: Any = ..., allow_none: bool = False) -> Any:
    value = _get(args, name, (str,), default, allow_none)
    if value is None:
        return value
    if not value.startswith("/") or "\0" in value or len(value) > bounds.MAX_PATH:
        raise ProtocolError(f"field {name!r} must be an absolute path of at most {bounds.MAX_PATH} bytes")
    return value


MAX_REFS = bounds.MAX_ARRAY   # jobs one wait may name: a whole bulk submit


def _ref(value: object, field: str) -> int | str:
    """A job reference: an id in range, or a valid --name."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ProtocolError(f"field {field!r} has the wrong type")
    if isinstance(value, int):
        if not 0 < value <= bounds.MAX_ID:
            raise ProtocolError(f"job ids are whole numbers from 1 to {bounds.MAX_ID}")
        return value
    try:
        if arrayref.parse(value) is not None:   # 6_3, 6_*: the engine resolves it
            return value
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if split_ref(value) is None:
        raise ProtocolError(f"{_short(value)} is neither a job id nor a job name (NAME or USER:NAME)")
    return value


def _word(args: Args, name: str) -> str | None:
    value: str | None = _get(args, name, (str,), default=None, allow_none=True)
    if value is not None and not (value.isascii() and value.isalnum() and len(value) <= 16):
        raise ProtocolError(f"field {name!r} must be a short word, e.g. NV4")
    return value


def _choice(args: Args, name: str, choices: tuple[str, ...], default: str | None) -> Any:
    value = _get(args, name, (str,), default=default, allow_none=True)
    if value is not None and value not in choices:
        raise ProtocolError(f"field {name!r} must be one of {', '.join(choices)}")
    return value


def _name(args: Args) -> str | None:
    value: str | None = _get(args, "name", (str,), default=None, allow_none=True)
    if value is not None and not valid_name(value):
        raise ProtocolError(f"field 'name': {NAME_RULE}")
    return value


def _after(args: Args) -> tuple[int | str, ...]:
    refs = _get(args, "after", (list,), default=[])
    if len(refs) > MAX_AFTER:
        raise ProtocolError(f"field 'after' may name at most {MAX_AFTER} jobs")
    return tuple(_ref(r, "after") for r in refs)


def _notify(args: Args) -> dict[str, Any] | None:
    forms = list(_str_list(args, "notify", max_items=len(notifytext.FORMS))) if "notify" in args else []
    command = _get(args, "notify_command", (str,), default=None, allow_none=True)
    if not forms and command is None:
        return None
    notify = {"forms": forms, "command": command}
    try:
        notifytext.check_request(notify)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    return notify


def _str_list(args: Args, name: str, max_items: int | None = None) -> tuple[str, ...]:
    value = _get(args, name, (list,))
    if max_items is not None and len(value) > max_items:
        raise ProtocolError(f"field {name!r} holds more than {max_items} items")
    if not all(isinstance(v, str) and "\0" not in v for v in value):
        raise ProtocolError(f"field {name!r} must be a list of strings without NUL")
    return tuple(value)


def _array(args: Args) -> tuple[int, ...]:
    value = _get(args, "array", (list,), default=[])
    if len(value) > bounds.MAX_ARRAY:
        raise ProtocolError(f"an --array may hold at most {bounds.MAX_ARRAY} indices")
    last = -1
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not last < v <= bounds.MAX_ARRAY_INDEX:
            raise ProtocolError(f"field 'array' must hold increasing indices from 0 to {bounds.MAX_ARRAY_INDEX}")
        last = v
    return tuple(value)


def _str_map(args: Args, name: str) -> dict[str, str] | None:
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

    argv: tuple[str, ...]
    cwd: str
    cpus: int | None = None
    gpus: int = 0
    mem: int | None = None          # bytes, None = assign the default share
    max_time: int | None = None     # seconds, None = --max-lifetime
    exclusive: bool = False
    numa_local: bool = False
    numa_local_gpu: bool = False
    gpu_link: str | None = None     # as typed; checked against the machine's GPUs at submit
    output: str | None = None       # absolute path as typed (dir or file); None = cwd
    no_output: bool = False
    env: dict[str, str] | None = None  # the forwarded environment (--env), or None
    job_env: dict[str, str] = field(default_factory=dict)  # leading NAME=VALUE words
    base_env: dict[str, str] = field(default_factory=dict)  # the submitter's PATH and LANG for a clean env
    output_is_dir: bool = True      # *output* names a directory (the log is output.<id>.log in it)
    name: str | None = None         # --name
    after: tuple[int | str, ...] = ()   # --after / --after-ok: jobs (ids or names) it starts after
    after_ok: bool = False          # ... only if they all exited 0
    umask: int = 0o077              # the submitter's; the job and its log get it
    array: tuple[int, ...] = ()     # --array: one job per index, in increasing order
    array_limit: int | None = None  # --array ...%N: at most N of them run at once
    commands: tuple[str, ...] = ()  # --commands: one job per shell command line
    benchmark: str | None = None    # --benchmark: "warn" or "strict"; None for a plain job
    whole_l3: bool = False          # --whole-l3 (with --benchmark): its last-level caches to itself
    aslr: str = "on"                # --aslr off: the job runs with ADDR_NO_RANDOMIZE
    thp: str = "on"                 # --thp off: the job runs with PR_SET_THP_DISABLE
    record_to: str | None = None    # --record FILE: absolute; the record is written there as the user
    record_is_dir: bool = False     # *record_to* is a directory: record.<id>.json in it
    record_env: bool = False        # --record-env: the record holds the environment's values too
    notify: dict[str, Any] | None = None   # --notify / --notify-command: {"forms": [...], "command": str | None}

    @classmethod
    def from_args(cls, args: Args) -> "NewJob":
        commands = tuple(_str_list(args, "commands", max_items=bounds.MAX_ARRAY) if "commands" in args else ())
        argv = _str_list(args, "argv") if not commands or "argv" in args else ()
        if not commands and (not argv or not argv[0]):
            raise ProtocolError("no command given: put it after '--', e.g. dispatch new -- echo hello")
        if commands and argv:
            raise ProtocolError("give a command or --commands, not both")
        if any(not c.strip() for c in commands):
            raise ProtocolError("field 'commands' holds an empty command line")
        benchmark = _choice(args, "benchmark", ("warn", "strict"), None)
        whole_l3 = _get(args, "whole_l3", (bool,), default=False)
        if whole_l3 and benchmark is None:
            raise ProtocolError("--whole-l3 goes with --benchmark")
        array = _array(args)
        if array and commands:
            raise ProtocolError("give --array or --commands, not both")
        return cls(
            array=array, commands=commands,
            array_limit=_int(args, "array_limit", 1, bounds.MAX_ARRAY, default=None, allow_none=True),
            argv=argv, cwd=_path(args, "cwd"),
            cpus=_int(args, "cpus", 1, bounds.MAX_CPUS, default=None, allow_none=True),
            gpus=_int(args, "gpus", 0, bounds.MAX_GPUS, default=0),
            mem=_int(args, "mem", bounds.MIN_JOB_MEM, bounds.MAX_MEM, default=None, allow_none=True),
            max_time=_int(args, "max_time", 1, bounds.MAX_SECONDS, default=None, allow_none=True),
            exclusive=_get(args, "exclusive", (bool,), default=False),
            numa_local=_get(args, "numa_local", (bool,), default=False),
            numa_local_gpu=_get(args, "numa_local_gpu", (bool,), default=False),
            gpu_link=_word(args, "gpu_link"),
            output=_path(args, "output", default=None, allow_none=True),
            output_is_dir=_get(args, "output_is_dir", (bool,), default=True),
            no_output=_get(args, "no_output", (bool,), default=False),
            env=_str_map(args, "env"),
            job_env=_str_map(args, "job_env") or {},
            base_env={k: v for k, v in (_str_map(args, "base_env") or {}).items() if k in ("PATH", "LANG")},
            umask=_int(args, "umask", 0, bounds.MAX_UMASK, default=0o077),
            name=_name(args),
            after=_after(args),
            after_ok=_get(args, "after_ok", (bool,), default=False),
            benchmark=benchmark, whole_l3=whole_l3,
            aslr=_choice(args, "aslr", ("on", "off"), "on"),
            thp=_choice(args, "thp", ("on", "off"), "on"),
            record_to=_path(args, "record_to", default=None, allow_none=True),
            record_is_dir=_get(args, "record_is_dir", (bool,), default=False),
            record_env=_get(args, "record_env", (bool,), default=False),
            notify=_notify(args),
        )

    def elements(self) -> list[tuple[tuple[str, ...], int | None]]:
        """The jobs this request makes: (argv, array index), one for a plain submit."""
        if self.commands:
            return [(("/bin/sh", "-c", line), i) for i, line in enumerate(self.commands, 1)]
        if self.array:
            return [(self.argv, i) for i in self.array]
        return [(self.argv, None)]

    def size(self) -> int:
        """Bytes of command and environment the largest of its jobs would carry (for --max-job-size)."""
        def n(text: str) -> int:
            return len(text.encode("utf-8", "surrogatepass")) + 1
        total = max(sum(n(a) for a in argv) for argv, _ in self.elements())
        for env in (self.env or {}, self.job_env, self.base_env):
            total += sum(n(k) + n(v) for k, v in env.items())
        return total


# A list reply is one page: at most this many jobs, about this many bytes, and this many ids
# looked at (passed-over ones included), so that building one costs the page, whatever the queue.
LIST_PAGE_JOBS = 1000
LIST_PAGE_BYTES = 1 << 20
LIST_PAGE_SCAN = 8 * LIST_PAGE_JOBS


@dataclass(frozen=True)
class ListJobs:
    """``dispatch list``: one page of the jobs with ids above *after*.

    The reply's ``more`` is the *after* of the next page, or None at the end.
    Without *after* (a client older than paging) the whole list must fit one
    page, or the request is refused with a message saying so.

    With *text* (``dispatch list`` without ``--json``) the reply has ``rows``
    for ``jobs``: a job that never started as its text row (``core/listrows``),
    any other as its summary, for the client to format with its own clock and
    time zone. A daemon before *text* ignores it and answers ``jobs``.

    With *table* (``dispatch list``'s table, on a terminal or with ``--format``) the
    reply has ``rows`` too, each job as the list of ``core/listrows.TABLE_FIELDS``'
    values; a daemon before *table* answers ``jobs``.
    """

    all: bool = False
    finished: bool = False
    after: int | None = None        # the cursor: list jobs with greater ids (0: from the start)
    limit: int | None = None        # at most this many jobs in the page (capped at LIST_PAGE_JOBS)
    text: bool = False              # rows for the text form (above)
    table: bool = False             # rows for the table form (above)

    @classmethod
    def from_args(cls, args: Args) -> "ListJobs":
        return cls(all=_get(args, "all", (bool,), default=False),
                   finished=_get(args, "finished", (bool,), default=False),
                   after=_int(args, "after", 0, bounds.MAX_ID, default=None, allow_none=True),
                   limit=_int(args, "limit", 1, LIST_PAGE_JOBS, default=None, allow_none=True),
                   text=_get(args, "text", (bool,), default=False),
                   table=_get(args, "table", (bool,), default=False))


@dataclass(frozen=True)
class JobRef:
    """``dispatch kill JOB`` / ``show JOB``: a job by id, or by its --name (the caller's newest of that name)."""

    id: int | str

    @classmethod
    def from_args(cls, args: Args) -> "JobRef":
        return cls(id=_ref(_get(args, "id", (int, str)), "id"))


@dataclass(frozen=True)
class Attach:
    """``dispatch attach JOB``; *offset* resumes a stream cut by a daemon reload."""

    id: int | str
    offset: int = 0

    @classmethod
    def from_args(cls, args: Args) -> "Attach":
        ref = JobRef.from_args(args)
        return cls(id=ref.id, offset=_int(args, "offset", 0, bounds.MAX_OFFSET, default=0))


# A log reply is one page of a job's output: at most this many bytes of it.
LOG_PAGE_BYTES = 1 << 20


@dataclass(frozen=True)
class LogPage:
    """``dispatch log JOB``: one page of the job's output buffer, from *offset*.

    The first request leaves *until* out and the reply sets it to the buffer's
    size then: the output "so far". The client asks for the rest with *offset*
    at the reply's ``more`` and the same *until*, so a job writing without end
    cannot keep it paging for ever. Following is ``attach``'s stream.
    """

    id: int | str
    offset: int = 0
    until: int | None = None

    @classmethod
    def from_args(cls, args: Args) -> "LogPage":
        ref = JobRef.from_args(args)
        return cls(id=ref.id, offset=_int(args, "offset", 0, bounds.MAX_OFFSET, default=0),
                   until=_int(args, "until", 0, bounds.MAX_OFFSET, default=None, allow_none=True))


# A wait's answer is paged as a list is: at most this many jobs and about this many bytes a reply.
WAIT_PAGE_JOBS = 1000
WAIT_PAGE_BYTES = 1 << 20


@dataclass(frozen=True)
class WaitJobs:
    """``dispatch wait JOB...``: answered once every one of them has ended.

    With *paged*, the answer is one page (``WAIT_PAGE_*``) and ``more`` the ids
    of the jobs it leaves out (in order, each ended, or None when none are
    left): the client asks for them with more waits, which are answered at
    once, a page each. Without it (a client older than paging) the whole
    answer must fit one page, or the wait is refused with a message saying
    so. A daemon before *paged* ignores it and answers all the jobs at once.

    *rest* marks such a later wait: its ids (numbers only) are ended jobs of
    a ``more``. One the daemon no longer holds and its history cannot answer
    for is then said to be unknown, as the first page would have said it,
    instead of refusing the page.
    """

    ids: tuple[int | str, ...]
    paged: bool = False
    rest: bool = False

    @classmethod
    def from_args(cls, args: Args) -> "WaitJobs":
        refs = _get(args, "ids", (list,))
        if not refs or len(refs) > MAX_REFS:
            raise ProtocolError(f"field 'ids' must name 1 to {MAX_REFS} jobs")
        ids = tuple(_ref(r, "ids") for r in refs)
        rest = _get(args, "rest", (bool,), default=False)
        if rest and not all(isinstance(i, int) for i in ids):
            raise ProtocolError("field 'ids' of a wait's rest must hold job numbers only")
        return cls(ids=ids, paged=_get(args, "paged", (bool,), default=False) or rest, rest=rest)


@dataclass(frozen=True)
class Status:
    """``dispatch status``: the machine at a glance."""

    @classmethod
    def from_args(cls, args: Args) -> "Status":
        return cls()


@dataclass(frozen=True)
class Ping:
    """Liveness probe; answers with the daemon's version."""

    @classmethod
    def from_args(cls, args: Args) -> "Ping":
        return cls()


@dataclass(frozen=True)
class Watch:
    """A stream of the caller's job changes (started, finished), for programs such as the PSI/J executor."""

    @classmethod
    def from_args(cls, args: Args) -> "Watch":
        return cls()


@dataclass(frozen=True)
class JobSetting:
    """``dispatch job ID max-time get|set D|add D``: read or change one of a job's settings."""

    id: int | str
    setting: str                    # "max_time"
    action: str                     # "get", "set" or "add"
    seconds: int | None = None      # for set and add

    SETTINGS = ("max_time",)
    ACTIONS = ("get", "set", "add")

    @classmethod
    def from_args(cls, args: Args) -> "JobSetting":
        ref = JobRef.from_args(args)
        setting = _get(args, "setting", (str,))
        action = _get(args, "action", (str,))
        if setting not in cls.SETTINGS:
            raise ProtocolError(f"field 'setting' must be one of {', '.join(cls.SETTINGS)}")
        if action not in cls.ACTIONS:
            raise ProtocolError(f"field 'action' must be one of {', '.join(cls.ACTIONS)}")
        seconds = _int(args, "seconds", 1, bounds.MAX_SECONDS, default=None, allow_none=True)
        if (seconds is None) != (action == "get"):
            raise ProtocolError("field 'seconds' goes with set and add, and only with them")
        return cls(id=ref.id, setting=setting, action=action, seconds=seconds)


# A history reply is one page, newest first: at most this many rows and about this many bytes.
HISTORY_PAGE_ROWS = 1000
HISTORY_PAGE_BYTES = 1 << 20
HISTORY_ID_RANGES = 64              # id ranges one history request may name
HISTORY_RESULTS = RESULTS + ("failed",)   # "failed": anything but an exit 0
HISTORY_VERDICTS = (*VERDICTS, "none")   # "none": no record
SETUP_PREFIX = "sha256:"
MAX_EPOCH = 1e11                    # seconds since 1970: a bound for since/until


def _epoch(args: Args, name: str) -> float | None:
    value = _get(args, name, (int, float), default=None, allow_none=True)
    if value is not None and not 0 <= value <= MAX_EPOCH:
        raise ProtocolError(f"field {name!r} must be a time in seconds since 1970")
    return None if value is None else float(value)


SETUP_LEN = len(SETUP_PREFIX) + 64   # a whole setup digest; shorter ones are prefixes


def setup_digest(text: str) -> str | None:
    """*text* as a setup digest or a prefix of one (``sha256:`` optional, 8 to 64 hex digits),
    with its ``sha256:``; None if it is neither."""
    digits = text.removeprefix(SETUP_PREFIX)
    if not (8 <= len(digits) <= 64 and all(c in "0123456789abcdef" for c in digits)):
        return None
    return SETUP_PREFIX + digits


def _setup(args: Args) -> str | None:
    value: str | None = _get(args, "setup", (str,), default=None, allow_none=True)
    if value is None:
        return None
    digest = setup_digest(value)
    if digest is None:
        raise ProtocolError("field 'setup' must be a setup digest (sha256:...), or at least its first 8 "
                            "hex digits")
    return digest


def _ranges(args: Args) -> tuple[tuple[int, int], ...]:
    value = _get(args, "ids", (list,), default=[])
    if len(value) > HISTORY_ID_RANGES:
        raise ProtocolError(f"field 'ids' may hold at most {HISTORY_ID_RANGES} ranges")
    out = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and all(
                type(n) is int and 0 < n <= bounds.MAX_ID for n in pair) and pair[0] <= pair[1]):
            raise ProtocolError("field 'ids' must hold [first, last] pairs of job ids, first <= last")
        out.append((pair[0], pair[1]))
    return tuple(out)


@dataclass(frozen=True)
class History:
    """``dispatch history`` and ``dispatch report``: one page of the caller's finished jobs, newest first.

    Every filter is optional. Only admins may name another *user* or ask for
    *all* users. The reply's ``more`` is the *before* of the next page (older
    jobs), or None at the end.
    """

    user: str | None = None
    all: bool = False
    name: str | None = None
    array: int | None = None
    ids: tuple[tuple[int, int], ...] = ()
    result: str | None = None
    verdict: str | None = None
    since: float | None = None
    until: float | None = None
    setup: str | None = None
    before: int | None = None
    limit: int = HISTORY_PAGE_ROWS

    @classmethod
    def from_args(cls, args: Args) -> "History":
        user = _get(args, "user", (str,), default=None, allow_none=True)
        if user is not None and split_ref(f"{user}:x") is None:
            raise ProtocolError("field 'user' must be a login name")
        return cls(user=user, all=_get(args, "all", (bool,), default=False), name=_name(args),
                   array=_int(args, "array", 1, bounds.MAX_ID, default=None, allow_none=True),
                   ids=_ranges(args),
                   result=_choice(args, "result", HISTORY_RESULTS, None),
                   verdict=_choice(args, "verdict", HISTORY_VERDICTS, None),
                   since=_epoch(args, "since"), until=_epoch(args, "until"), setup=_setup(args),
                   before=_int(args, "before", 1, bounds.MAX_ID, default=None, allow_none=True),
                   limit=_int(args, "limit", 1, HISTORY_PAGE_ROWS, default=HISTORY_PAGE_ROWS))


# A validated request, whichever verb it is.
Payload = (NewJob | ListJobs | Attach | LogPage | JobRef | Ping | JobSetting | WaitJobs | Status | Watch
           | History)

# One line a verb: the daemon's dispatch table is keyed on the same names.
REQUESTS: dict[str, type[Payload]] = {"new": NewJob, "list": ListJobs, "attach": Attach, "log": LogPage,
                                      "kill": JobRef,
                                      "wait": WaitJobs, "show": JobRef, "record": JobRef, "status": Status,
                                      "job": JobSetting, "ping": Ping, "watch": Watch, "history": History}


def _short(value: object) -> str:
    """A value from the wire, for an error message: quoted, escaped, and short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_request(msg: dict[str, Any]) -> tuple[str, Payload]:
    """Validate a decoded frame; return ``(op, payload)`` or raise ProtocolError."""
    version = msg.get("v")
    if type(version) is not int or version != VERSION:
        raise ProtocolError(
            f"protocol version {_short(version)} is not supported (daemon speaks {VERSION}); "
            "is dispatch the same version as hpc-batchd?")
    op = msg.get("op")
    if not isinstance(op, str) or op not in REQUESTS:
        raise ProtocolError(f"unknown command {_short(op)}; is dispatch the same version as hpc-batchd?")
    args = msg.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError("field 'args' must be an object")
    return op, REQUESTS[op].from_args(args)

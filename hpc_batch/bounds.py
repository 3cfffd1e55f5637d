"""The largest (and smallest) values a request or a persisted record may carry.

One table for the protocol's validation and the state loader's: a number
outside these cannot come from a real ``dispatch`` and would only make the
daemon overflow or loop, so it is refused at the door (and a record holding
one is quarantined at start-up, never acted on).
"""

TYPE_CHECKING = False
if TYPE_CHECKING:   # dispatch list and kill read id ranges through arrays.py, which imports this
    from typing import Any

MAX_ID = 1 << 53              # job ids: exact in JSON numbers everywhere
MAX_UID = (1 << 32) - 2       # uid_t, less (uid_t)-1
MAX_CPUS = 1 << 16
MAX_GPUS = 1 << 10
MAX_MEM = 1 << 60             # bytes: 1 EiB
# A job's least memory budget (bytes). Under cgroups its memory.max holds the job and the
# shepherd's record helper, which joins the job's cgroup, with swap off: a fresh Python interpreter
# is OOM-killed under 6 MiB and runs under 8 MiB, and a budget near that only fails oddly. Twice it.
MIN_JOB_MEM = 16 << 20
MAX_SECONDS = 100 * 365 * 86400   # durations: a century
MAX_OFFSET = 1 << 62          # attach offsets: far below what pread can take
MAX_PATH = 4096               # PATH_MAX
MAX_UMASK = 0o777
MAX_EPOCH = 1 << 40           # timestamps: seconds since 1970, comfortably past any clock
MAX_ARRAY = 100_000           # elements of one --array or --commands submit (the per-user queue cap bites first)
MAX_ARRAY_INDEX = 10_000_000  # an --array index


SHOWN_CHARS = 40   # of a bad value, quoted back in its error message


def shown(text: str) -> str:
    """*text* quoted for an error message, cut to SHOWN_CHARS: a megabyte of junk is not echoed back."""
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def check_int(value: "Any", low: int, high: int, what: str) -> int:
    """*value* as an int in [low, high], or ValueError naming *what* and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be a whole number from {low} to {high}")
    return value


def check_time(value: "Any", what: str, allow_none: bool = True) -> float | None:
    """A timestamp (seconds since the epoch) in range, or None where allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_EPOCH:
        raise ValueError(f"{what} must be a time in seconds since 1970")
    return value

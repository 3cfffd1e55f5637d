"""The job directory as an interface: the files a shepherd reads and writes.

The s6 way: an admin can understand a job with ``cat`` and ``jq``, and the
daemon learns everything it needs after a restart from these files alone.

    launch.json    spec written once by the daemon (holds the environment, so
                   root-only); the shepherd reads and deletes it before the
                   job runs
    shepherd.pid   "<pid> <starttime>"; flock-held for the shepherd's life, so
                   a failed try-lock means the shepherd is alive
    status.json    the job's pid and start time, replaced atomically
    exit.json      the exit record, written once, atomically, as the job ends
    delivery.json  what became of the output log
    output         the combined stdout/stderr buffer while the job runs

Imported by the shepherd and the daemon alike, so it stays stdlib-only and
small (the shepherd's import cost is paid per job). That is also why JSON is
read and written with the C scanner and encoder behind the json module
(``_json``) rather than ``json`` itself: importing ``json`` pulls in ``re``,
which would be most of a shepherd's start-up time.
"""

import _json
import os


class _Decoding:
    """The settings object the C scanner reads (the json module's defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not valid in a record")


_scan = _json.make_scanner(_Decoding())
_encode = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ": ", ", ",
                             True, False, False)


def dumps(obj) -> str:
    """JSON text of *obj* (dicts, lists, str, int, float, bool, None)."""
    return "".join(_encode(obj, 0))


def loads(text: str):
    """Parse JSON text; raises ValueError on anything malformed or trailing."""
    try:
        obj, end = _scan(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if text[end:].strip():
        raise ValueError("trailing data after JSON")
    return obj

LAUNCH = "launch.json"
PIDFILE = "shepherd.pid"
STATUS = "status.json"
EXIT = "exit.json"
DELIVERY = "delivery.json"
OUTPUT = "output"
INFO = "info.json"


def write_json(path: str, obj, mode: int = 0o644, durable: bool = True) -> None:
    """Replace *path* atomically with *obj* as JSON; *durable* adds the fsyncs.

    Records that must survive a power cut (the exit record) are durable;
    ones only a running daemon reads (status, launch spec) skip the cost.
    """
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, dumps(obj).encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if not durable:
        return
    dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_json(path: str):
    """Return the JSON in *path*, or None if it does not exist or is torn."""
    try:
        with open(path, "rb") as f:
            return loads(f.read().decode())
    except (OSError, ValueError):
        return None


def proc_starttime(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat).

    Together with the pid it names one process for the life of the machine,
    which is what makes a pidfile safe against pid reuse.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def read_pidfile(job_dir: str):
    """Return (pid, starttime) from the shepherd's pidfile, or None."""
    try:
        with open(os.path.join(job_dir, PIDFILE), "rb") as f:
            pid, start = f.read().split()[:2]
        return int(pid), int(start)
    except (OSError, ValueError):
        return None

"""Reading the kernel's files for a job's record, under a root prefix.

Every value in a record says where it came from: a *field* is
``{"value": V, "source": S}``, or ``{"value": None, "source": S, "error": why}``
when S could not be read or parsed. ``Source(root)`` reads ``/proc`` and
``/sys`` paths under *root* ("/" on a machine, a fixture tree in tests), and
sources are always written as the machine path, so a record made from a
fixture reads like one made on the machine.

The files are the kernel's (procfs, sysfs, cgroupfs), never a user's: root
reads them directly. Each read is bounded. Standard library only (the
shepherd loads this).
"""

import os

READ_LIMIT = 1 << 20    # no kernel file a record reads is near this; a larger one is cut


def field(value, source: str, error: str | None = None) -> dict:
    """A record's leaf: *value* and where it came from (with *error* when it could not be had)."""
    if error is not None:
        return {"value": None, "source": source, "error": error}
    return {"value": value, "source": source}


def read_upto(fd: int, most: int) -> bytes:
    """At most *most* bytes of *fd*, from where it stands, in 64 KiB reads (fewer at its end)."""
    chunks, left = [], most
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def error_text(exc: BaseException) -> str:
    """A short reason for a failed read: ``"No such file or directory"``, ``"ValueError: ..."``."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{exc.__class__.__name__}: {exc}"


class Source:
    """The machine's /proc and /sys (or a fixture tree's) seen from *root*."""

    def __init__(self, root: str = "/"):
        self.root = root

    def path(self, path: str) -> str:
        """Where the machine path *path* is under the root."""
        return path if self.root == "/" else os.path.join(self.root, path.lstrip("/"))

    def read(self, path: str, limit: int = READ_LIMIT) -> str:
        """The text of *path* (at most *limit* bytes); raises OSError."""
        fd = os.open(self.path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return read_upto(fd, limit).decode("utf-8", "replace")
        finally:
            os.close(fd)

    def value(self, path: str, parse=None):
        """The stripped text of *path*, through *parse* if given; raises OSError or the parser's error."""
        text = self.read(path).strip()
        return parse(text) if parse is not None else text

    def field(self, path: str, parse=None) -> dict:
        """:meth:`value` as a field: the value and *path*, or null and the reason."""
        try:
            return field(self.value(path, parse), path)
        except Exception as exc:  # a missing or odd file is a reason, never a failed record
            return field(None, path, error_text(exc))

    def exists(self, path: str) -> bool:
        """Whether *path* exists under the root."""
        return os.path.exists(self.path(path))

    def listdir(self, path: str) -> list[str]:
        """The names in directory *path*, sorted; empty when it cannot be listed."""
        try:
            return sorted(os.listdir(self.path(path)))
        except OSError:
            return []


def parse_cpulist(text: str) -> list[int]:
    """The CPUs (or nodes) of a kernel list such as ``"0-3,8,10-11"`` (spaces also separate); sorted."""
    out: set[int] = set()
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"bad range {part!r}")
        out.update(range(first, last + 1))
    return sorted(out)


def format_cpulist(ids, sep: str = ",") -> str:
    """Numbers in the kernel's list format: ``(0, 1, 2, 3, 8)`` -> ``"0-3,8"``.

    The one definition: the shepherd's record and the daemon (``cputopo``) both use it.
    """
    ids = sorted(set(ids))
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return sep.join(parts)

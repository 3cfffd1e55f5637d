"""Reading and writing single-value kernel files (/proc, /sys), with undo records.

Every change hpc-batch makes to the machine for a benchmark job is a
:class:`Write`: the file (relative to a root prefix, so tests use fixture
trees), the value found there and the value written. Undoing a write puts
the old value back only where the file still holds the value hpc-batch
wrote: something else that changed it since (an admin, irqbalance, another
tool) wins. Files several jobs share (IRQ affinities, machine-wide turbo)
are undone through the machine's :mod:`ledger` instead, which keeps the
value from before the first job that changed them.
"""

import errno
import os
from dataclasses import dataclass

from ...core.cputopo import parse_cpulist


@dataclass
class Write:
    """One change to one kernel file; ``kind`` says how values compare."""

    path: str            # relative to the root prefix, e.g. "proc/irq/24/smp_affinity_list"
    old: str
    new: str
    kind: str = "text"   # "cpulist": compared as sets of CPUs; "text": compared stripped

    def to_dict(self) -> dict:
        """JSON-safe form (the job's quiet file)."""
        return {"path": self.path, "old": self.old, "new": self.new, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict) -> "Write":
        """Inverse of to_dict."""
        return cls(path=str(d["path"]), old=str(d["old"]), new=str(d["new"]), kind=str(d.get("kind", "text")))


def join(root: str, rel: str) -> str:
    """*rel* under the root prefix *root* ("/" on a real machine)."""
    return os.path.join(root, rel.lstrip("/"))


def read(root: str, rel: str) -> str | None:
    """The stripped contents of a kernel file, or None when absent or unreadable."""
    return read_why(root, rel)[0]


def read_why(root: str, rel: str) -> tuple[str | None, str | None]:
    """As :func:`read`, with the errno word (ENOENT, EACCES...) when there is no value."""
    try:
        fd = os.open(join(root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return None, why(exc)
    try:
        return os.read(fd, 4096).decode("ascii", "replace").strip(), None
    except OSError as exc:
        return None, why(exc)
    finally:
        os.close(fd)


def write(root: str, rel: str, value: str) -> None:
    """Write *value* to a kernel file in one write(2) (raises OSError as the kernel refuses)."""
    # O_TRUNC: ignored by procfs and sysfs, and what a fixture tree (regular files) needs.
    fd = os.open(join(root, rel), os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        os.write(fd, value.encode("ascii") + b"\n")
    finally:
        os.close(fd)


def same(kind: str, a: str | None, b: str | None) -> bool:
    """Whether two values of a file are the same setting."""
    if a is None or b is None:
        return a is b
    if kind == "cpulist":
        try:
            return set(parse_cpulist(a)) == set(parse_cpulist(b))
        except ValueError:
            return a.strip() == b.strip()
    return a.strip() == b.strip()


def why(exc: OSError) -> str:
    """An errno as a short word for records (EIO, EINVAL, ...)."""
    return errno.errorcode.get(exc.errno or 0, str(exc.errno)) if exc.errno else str(exc)


def apply(root: str, writes: list[Write]) -> tuple[list[Write], list[tuple[Write, OSError]]]:
    """Carry out *writes* in order; returns (done, [(refused, the kernel's error)])."""
    done: list[Write] = []
    refused: list[tuple[Write, OSError]] = []
    for w in writes:
        try:
            write(root, w.path, w.new)
        except OSError as exc:
            refused.append((w, exc))
        else:
            done.append(w)
    return done, refused


def undo(root: str, writes: list[Write]) -> tuple[list[Write], list[tuple[Write, str]]]:
    """Undo *writes*, last first, each only where the file still holds what was written.

    Returns (restored, [(left alone, why)]). A write that never happened (the
    daemon died before it, or the kernel refused it) still reads its old
    value and is passed over: neither restored nor left.
    """
    restored: list[Write] = []
    left: list[tuple[Write, str]] = []
    for w in reversed(writes):
        now = read(root, w.path)
        if now is None:
            left.append((w, "gone"))
        elif same(w.kind, now, w.old):
            continue   # never written (refused, or the daemon died first), or already put back
        elif not same(w.kind, now, w.new):
            left.append((w, f"changed since (holds {now!r})"))
        else:
            try:
                write(root, w.path, w.old)
            except OSError as exc:
                left.append((w, why(exc)))
            else:
                restored.append(w)
    return restored, left

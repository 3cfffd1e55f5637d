"""The machine a run measured: what docs/benchmarks.md prints under "Machine"."""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys

from hpc_batch import __version__


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", errors="replace") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        return m.group(1).strip() if m else platform.processor() or "unknown"
    except OSError:
        return "unknown"


def _memory() -> str:
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemTotal:\s+(\d+) kB", f.read(), re.M)
        return f"{int(m.group(1)) / (1 << 20):.1f} GiB" if m else "unknown"
    except OSError:
        return "unknown"


def _commit(repo: str) -> str:
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return (head or "unknown") + (" with uncommitted changes" if dirty else "")


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (``\\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str, mountinfo: str) -> tuple[str, str, str, str] | None:
    """``(mount point, type, source, major:minor)`` of the mount holding *path* (absolute, resolved),
    from the text of ``/proc/self/mountinfo`` (pure). A later line for the same point is a mount
    stacked over the earlier one, so it wins."""
    best = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        ids, tail = left.split(), right.split()
        if not sep or len(ids) < 5 or len(tail) < 2:
            continue
        point = _unescape(ids[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, tail[0], _unescape(tail[1]), ids[2])
    return best


def _journal(kind: str, devno: str, sys_root: str) -> str:
    """What the file system's journal means for the figures, or "" where there is nothing to say."""
    if kind != "ext4":
        return ""
    try:
        name = os.path.basename(os.path.realpath(os.path.join(sys_root, "dev", "block", devno)))
        with open(os.path.join(sys_root, "fs", "ext4", name, "journal_task")) as f:
            task = f.read().strip()
    except OSError:
        return ""
    if task != "<none>":
        return ", journalled"
    # fs/ext4/ialloc.c: without a journal, find_inode_bit() skips every free inode deleted in the
    # last minutes (recently_deleted()), so a new inode costs more the more files were just removed.
    return (", without a journal: ext4 then passes over each recently deleted inode to find a new "
            "one, so every file a job creates and removes costs more than on a journalled disk")


def file_system(path: str, mountinfo: str = "/proc/self/mountinfo", sys_root: str = "/sys") -> str:
    """The file system under *path* (the benchmark's scratch directory), for the machine's table."""
    try:
        with open(mountinfo) as f:
            found = mount_of(os.path.realpath(path), f.read())
    except OSError:
        found = None
    if found is None:
        return "unknown"
    point, kind, source, devno = found
    return f"{kind} ({source}) mounted at {point}" + _journal(kind, devno, sys_root)


def describe(repo: str, scratch: str | None = None) -> list[tuple[str, str]]:
    """(name, value) pairs: CPU, cores, memory, kernel, python, date, version, load, and the
    scratch directory's file system when *scratch* is given."""
    load = os.getloadavg()
    return [
        ("CPU", _cpu_model()),
        ("cores", f"{os.cpu_count()} online, {len(os.sched_getaffinity(0))} usable by the benchmark"),
        ("memory", _memory()),
        ("kernel", f"{platform.system()} {platform.release()}"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("hpc-batch", f"{__version__}, commit {_commit(repo)}"),
        ("run as", "root" if os.geteuid() == 0 else f"uid {os.geteuid()} (user-mode daemons)"),
        ("load average at the start", f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"),
    ] + ([("scratch file system", file_system(scratch))] if scratch else [])

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


def describe(repo: str) -> list[tuple[str, str]]:
    """(name, value) pairs: CPU, cores, memory, kernel, python, date, version, load."""
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
    ]

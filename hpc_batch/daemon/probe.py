"""Reading the counters that say a machine is not quiet (``benchmark.Sample``).

Everything is read under a root prefix (``/`` on a real machine; a fixture
tree in tests, or the ``HPC_BATCH_PROBE_ROOT`` a test daemon is started
with): ``proc/vmstat`` for pswpin/pswpout, and
``sys/devices/system/cpu/cpu<N>/thermal_throttle/*_throttle_count`` (x86 only;
missing elsewhere, which reads as "no counters", never as an error).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..core.benchmark import Sample

ROOT_ENV = "HPC_BATCH_PROBE_ROOT"
THROTTLE_FILES = ("core_throttle_count", "package_throttle_count")


def root() -> str:
    """The prefix this daemon reads under: ``/``, unless a test set HPC_BATCH_PROBE_ROOT."""
    return os.environ.get(ROOT_ENV) or "/"


def parse_vmstat(text: str) -> tuple[int, int] | None:
    """(pswpin, pswpout) from /proc/vmstat's text, None without both."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("pswpin", "pswpout") and value.strip().isdigit():
            found[key] = int(value)
    return (found["pswpin"], found["pswpout"]) if len(found) == 2 else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return None


def _cpus(prefix: str) -> list[int]:
    base = os.path.join(prefix, "sys/devices/system/cpu")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return sorted(int(n[3:]) for n in names if n.startswith("cpu") and n[3:].isdigit())


def read(now: float, prefix: str = "/", cpus: Iterable[int] | None = None) -> Sample:
    """One reading under ``prefix``: swap counters, and the throttle counters of ``cpus`` (all by default)."""
    text = _read(os.path.join(prefix, "proc/vmstat"))
    swap = parse_vmstat(text) if text is not None else None
    throttle = {}
    for cpu in (_cpus(prefix) if cpus is None else cpus):
        total, seen = 0, False
        for name in THROTTLE_FILES:
            value = _read(os.path.join(prefix, f"sys/devices/system/cpu/cpu{cpu}/thermal_throttle/{name}"))
            if value is not None and value.strip().isdigit():
                total += int(value)
                seen = True
        if seen:
            throttle[cpu] = total
    return Sample(now, swap, throttle)

"""CPU topology: which logical CPUs are threads of one physical core, and which caches they share.

Pure: ``parse_cpu`` turns the text of one CPU's sysfs files (as
``discovery.read_cpu_topology`` read them) into a ``Cpu``, and ``build``
checks that the CPUs agree with each other. The allocator uses
``CpuTopology.core`` to hand out whole cores, so two jobs never run on the
threads of one core (they would share its execution units and caches).

The files, relative to ``/sys/devices/system/cpu/cpu<N>/`` (kernel
``Documentation/ABI/stable/sysfs-devices-system-cpu`` and
``Documentation/ABI/testing/sysfs-devices-system-cpu``):

* ``topology/thread_siblings_list``: the CPUs of this CPU's core, itself
  included (a cpulist: "0,40" on most x86 servers, "0-1" where siblings are
  numbered next to each other);
* ``topology/core_id``, ``topology/physical_package_id``: the core's id
  within its package (not unique across packages, and not contiguous on
  many Xeons), and the socket;
* ``cache/index<i>/level``, ``type`` (Data, Instruction, Unified), ``id``
  (unique among caches of one level; missing on older kernels) and
  ``shared_cpu_list``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shepherd.base import sysread

SIBLINGS = "topology/thread_siblings_list"
CORE_ID = "topology/core_id"
PACKAGE_ID = "topology/physical_package_id"
CACHE_FILES = ("level", "type", "id", "shared_cpu_list")

_INDEX = re.compile(r"^cache/index(\d+)/(level|type|id|shared_cpu_list)$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a kernel cpulist ("0-3,8,10-11") into sorted unique CPU ids.

    An empty list gives (). Raises ValueError on anything else that is not a cpulist.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a cpulist: {text.strip()!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"not a cpulist: {text.strip()!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int], sep: str = ",") -> str:
    """Inverse of parse_cpulist: (0, 1, 2, 3, 8) -> "0-3,8" (also how a log line names many job ids)."""
    return sysread.format_cpulist(cpus, sep)


@dataclass(frozen=True)
class Cache:
    """One cache a CPU uses: its level, type, id (None when the kernel gives none) and the CPUs sharing it."""

    level: int
    type: str
    id: int | None
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Cpu:
    """One logical CPU: its socket, its core's id and threads (``siblings``, itself included), its caches."""

    cpu: int
    package: int | None
    core_id: int | None
    siblings: tuple[int, ...]
    caches: tuple[Cache, ...] = ()

    def cache(self, level: int) -> Cache | None:
        """The data or unified cache of ``level`` this CPU uses, if the kernel described one."""
        return next((c for c in self.caches if c.level == level and c.type != "Instruction"), None)


@dataclass(frozen=True)
class CpuTopology:
    """The CPUs the daemon read, by id. A CPU it knows nothing of is a core of its own."""

    cpus: dict[int, Cpu] = field(default_factory=dict, hash=False)

    def siblings(self, cpu: int) -> tuple[int, ...]:
        """Every thread of ``cpu``'s core (``(cpu,)`` when unknown)."""
        info = self.cpus.get(cpu)
        return info.siblings if info is not None else (cpu,)

    def cores(self, cpus: Iterable[int]) -> tuple[tuple[int, ...], ...]:
        """``cpus`` grouped by physical core, lowest CPU first; each group holds only CPUs from ``cpus``."""
        wanted = set(cpus)
        seen: set[int] = set()
        out = []
        for c in sorted(wanted):
            if c in seen:
                continue
            group = tuple(s for s in self.siblings(c) if s in wanted) or (c,)
            seen.update(group)
            out.append(group)
        return tuple(out)

    @property
    def smt(self) -> bool:
        """True when some core has more than one thread."""
        return any(len(c.siblings) > 1 for c in self.cpus.values())

    def last_level_cache(self, cpu: int) -> Cache | None:
        """The highest-level data or unified cache ``cpu`` uses (the L3 of most servers), if known."""
        info = self.cpus.get(cpu)
        if info is None:
            return None
        caches = [c for c in info.caches if c.type != "Instruction"]
        return max(caches, key=lambda c: c.level, default=None)

    def describe(self) -> str:
        """One line for the startup log: packages, cores, threads per core, how siblings are numbered."""
        if not self.cpus:
            return "CPU topology: unknown; each CPU is treated as a core of its own"
        cores = self.cores(self.cpus)
        widths = sorted({len(c) for c in cores})
        packages = {c.package for c in self.cpus.values() if c.package is not None}
        per = "/".join(map(str, widths))
        text = (f"CPU topology: {len(self.cpus)} CPUs in {len(cores)} cores"
                f"{f' on {len(packages)} packages' if len(packages) > 1 else ''}, {per} thread"
                f"{'s' if widths != [1] else ''} per core")
        pairs = [c for c in cores if len(c) > 1]
        if pairs:
            gaps = {c[1] - c[0] for c in pairs}
            text += (", siblings numbered next to each other" if gaps == {1} else
                     f", siblings numbered N and N+{gaps.pop()}" if len(gaps) == 1 else "")
        llc = {self.last_level_cache(c) for c in self.cpus} - {None}
        if llc:
            top = max(c.level for c in llc if c is not None)
            groups = {c.cpus for c in llc if c is not None and c.level == top}
            text += f"; {len(groups)} L{top} cache{'s' if len(groups) != 1 else ''}"
        return text


def parse_cpu(cpu: int, files: Mapping[str, str | None]) -> Cpu:
    """A ``Cpu`` from the text of its sysfs files, keyed by path relative to ``cpu<N>/`` (None: missing).

    A missing ``thread_siblings_list`` makes the CPU a core of its own. Raises
    ValueError for text that is not in the kernel's format, or a siblings
    list that does not hold the CPU itself.
    """
    text = files.get(SIBLINGS)
    siblings = parse_cpulist(text) if text is not None else (cpu,)
    if cpu not in siblings:
        raise ValueError(f"cpu{cpu}/{SIBLINGS} does not name cpu {cpu} ({text!r})")
    indexes: dict[int, dict[str, str]] = {}
    for path, value in files.items():
        m = _INDEX.match(path)
        if m is not None and value is not None:
            indexes.setdefault(int(m.group(1)), {})[m.group(2)] = value.strip()
    caches = []
    for i in sorted(indexes):
        f = indexes[i]
        if "level" not in f or "shared_cpu_list" not in f:
            continue   # a half-described cache tells the allocator nothing
        caches.append(Cache(_int(f["level"], f"cpu{cpu}/cache/index{i}/level"), f.get("type", "Unified"),
                            _int(f["id"], f"cpu{cpu}/cache/index{i}/id") if "id" in f else None,
                            parse_cpulist(f["shared_cpu_list"])))
    return Cpu(cpu, _opt_int(files.get(PACKAGE_ID), f"cpu{cpu}/{PACKAGE_ID}"),
               _opt_int(files.get(CORE_ID), f"cpu{cpu}/{CORE_ID}"), siblings, tuple(caches))


def build(cpus: Iterable[Cpu]) -> CpuTopology:
    """A ``CpuTopology`` of ``cpus``, checked: the threads of one core must name the same siblings.

    Raises ValueError when two CPUs disagree, since no core could then be
    handed out whole with any confidence.
    """
    by_id = {c.cpu: c for c in cpus}
    for c in by_id.values():
        for s in c.siblings:
            other = by_id.get(s)
            if other is not None and other.siblings != c.siblings:
                raise ValueError(f"cpu {c.cpu} and cpu {s} disagree on their core's threads "
                                 f"({','.join(map(str, c.siblings))} against {','.join(map(str, other.siblings))})")
    return CpuTopology(by_id)


def _int(text: str, what: str) -> int:
    value = text.strip()
    if not (value.isascii() and value.lstrip("-").isdigit()):
        raise ValueError(f"{what}: not a number ({text!r})")
    return int(value)


def _opt_int(text: str | None, what: str) -> int | None:
    return None if text is None else _int(text, what)

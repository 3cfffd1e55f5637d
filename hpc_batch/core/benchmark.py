"""Benchmark mode's judgements (pure): what a machine lacks for a ``--benchmark`` job.

``shortfalls`` lists, in words, every way the machine fell short of what a
benchmark job asked for once it has its allocation: a sibling that could not
be held, a last-level cache shared with other CPUs, no housekeeping CPUs,
no swap or NUMA confinement without cgroups. ``--benchmark`` (warn) runs the
job and records them; ``--benchmark=strict`` waits instead, for cores whose
every thread can be held (the allocator's business) and while the machine
is not quiet: swapping, or a thermal throttle counter rising (``Watch``).

Readings (``Sample``) come from ``probe``, which reads /proc and sysfs under
a root prefix; here they are only compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .cputopo import format_cpulist
from .resources import Allocation, Capacity, Request

MODES = ("warn", "strict")


@dataclass(frozen=True)
class Sample:
    """One reading of the counters that say a machine is not quiet.

    ``swap`` is (pswpin, pswpout) from /proc/vmstat, None where unreadable;
    ``throttle`` maps a CPU to the sum of its ``thermal_throttle/*_throttle_count``.
    """

    when: float
    swap: tuple[int, int] | None = None
    throttle: Mapping[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (kept in a running job's record, compared when it ends)."""
        return {"when": self.when, "swap": list(self.swap) if self.swap else None,
                "throttle": {str(k): v for k, v in sorted(self.throttle.items())}}

    @classmethod
    def from_dict(cls, d: Any) -> Sample | None:
        """Inverse of to_dict; None for anything else."""
        try:
            swap = d.get("swap")
            return cls(float(d["when"]), (int(swap[0]), int(swap[1])) if swap else None,
                       {int(k): int(v) for k, v in (d.get("throttle") or {}).items()})
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            return None


def unquiet(before: Sample, after: Sample, cpus: Iterable[int] | None = None) -> list[str]:
    """Why the machine was not quiet between two readings: swap counters or throttle counters
    (of ``cpus``, or of every CPU) rose. Empty when it was quiet (or nothing could be read)."""
    out = []
    if before.swap is not None and after.swap is not None:
        ins, outs = after.swap[0] - before.swap[0], after.swap[1] - before.swap[1]
        if ins > 0 or outs > 0:
            out.append(f"the machine is swapping ({ins} pages swapped in, {outs} out in "
                       f"{after.when - before.when:.1f}s)")
    wanted = None if cpus is None else set(cpus)
    rose = sorted(c for c, n in after.throttle.items()
                  if (wanted is None or c in wanted) and c in before.throttle and n > before.throttle[c])
    if rose:
        out.append(f"the thermal throttle counters of CPU{'s' if len(rose) > 1 else ''} "
                   f"{format_cpulist(rose)} are rising")
    return out


class Watch:
    """The machine's quiet, judged from two readings at least ``interval`` seconds apart.

    Fed by the engine while strict benchmark jobs wait: ``due`` says when
    the next reading is wanted, ``feed`` takes it and returns True when the
    verdict changed. ``reasons`` is None until two readings exist.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last: Sample | None = None
        self.reasons: list[str] | None = None

    def due(self, now: float) -> float:
        """When the next reading is wanted (now, if there is none yet)."""
        return now if self.last is None else self.last.when + self.interval

    def feed(self, sample: Sample) -> bool:
        """Take a reading; True when the verdict (quiet, not quiet, unknown) changed."""
        old = self.reasons
        if self.last is not None:
            self.reasons = unquiet(self.last, sample)
        self.last = sample
        return (old is None) != (self.reasons is None) or bool(old) != bool(self.reasons)

    def forget(self) -> None:
        """No strict job waits any more: the next one starts from a fresh pair of readings."""
        self.last, self.reasons = None, None

    @property
    def hold(self) -> str | None:
        """Why strict benchmark jobs wait now, or None when the machine is quiet."""
        if self.reasons is None:
            return (f"--benchmark=strict: the machine's swap and throttle counters are being read "
                    f"(a second reading is due {self.interval:g}s after the first)")
        if self.reasons:
            return "--benchmark=strict: " + "; ".join(self.reasons)
        return None


def shortfalls(req: Request, alloc: Allocation, cap: Capacity, cgroups: bool) -> list[str]:
    """Every way the allocation falls short of what the benchmark job asked for, in words."""
    topo = cap.cpu_topology
    held = set(alloc.held)
    offered = set(cap.units)
    notes = []
    for r in alloc.cpus:
        missing = [c for c in topo.siblings(r) if c not in held]
        if missing:
            why = ("in use by another job" if all(c in offered for c in missing)
                   else "not a CPU the daemon gives to jobs")
            notes.append(f"sibling{'s' if len(missing) > 1 else ''} {format_cpulist(missing)} of CPU {r} "
                         f"could not be held ({why})")
    if req.whole_l3:
        shared: set[int] = set()
        for r in alloc.cpus:
            cache = topo.last_level_cache(r)
            if cache is None:
                notes.append(f"the last-level cache of CPU {r} is unknown (no cache/index*/ in sysfs)")
                continue
            shared.update(c for c in cache.cpus if c not in held)
        if shared:
            hk = sorted(shared & cap.housekeeping)
            notes.append(f"its last-level cache is shared with CPUs {format_cpulist(sorted(shared))}"
                         + (f" (housekeeping: {format_cpulist(hk)})" if hk else ""))
    if not cap.housekeeping:
        notes.append("no housekeeping CPUs: the daemon and the shepherds may run on its cores")
    if not cgroups:
        notes.append("swap is not forbidden and memory is not kept on its NUMA node (--no-cgroups)")
    return notes

"""The shepherds' cgroup under ``--housekeeping-cpus none``: every CPU, even while shepherds run.

``none`` wants ``hpc-batch/shepherds/cpuset.cpus`` empty: the cgroup then
inherits its parent's CPUs, and a benchmark partition made beside it takes
its own CPUs out by itself. The kernel refuses to empty the ``cpuset.cpus``
of a populated cpuset (ENOSPC), so a reload or restart from a list to
``none`` while shepherds run cannot write it. The cgroup then gets a
*stand-in*: every CPU its parent has, less those a benchmark partition
beside it claims. Not simply every CPU: a sibling's explicit ``cpuset.cpus``
must not overlap an exclusive or isolated partition (the kernel refuses the
write, or leaves the partition invalid). So the stand-in is shrunk before a
new partition is made (:func:`make_room`) and widened once one has ended
(:func:`settle`); each first tries the empty list again, and the first to
find no shepherd running puts the cgroup back to inheriting.

Why not a fresh shepherds' cgroup per daemon: the running shepherds would
stay in the old one, on the old CPUs, unless the daemon moved them by pid,
and a pid read from ``cgroup.procs`` may be reused before the write: the
root daemon could pull some job's process out of its job's limits.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable, Mapping

from ...core.cputopo import format_cpulist, parse_cpulist
from .. import cgroups
from . import cpupartition, kfiles

log = logging.getLogger("hpc-batchd")

CPUS = "cpuset.cpus"
EFFECTIVE = "cpuset.cpus.effective"
# The partition states that hold CPUs a sibling may not overlap (cpuset.cpus.partition).
VALID_PARTITIONS = ("root", "isolated")


def _cpus(text: str | None) -> set[int]:
    try:
        return set(parse_cpulist(text or ""))
    except ValueError:
        return set()


def claims(children: Iterable[Mapping[str, str | None]]) -> set[int]:
    """The CPUs sibling cgroups hold for themselves (pure).

    Each child maps ``cpuset.cpus.partition``, ``cpuset.cpus.exclusive`` and
    ``cpuset.cpus`` to their text (None: absent). A child claims its exclusive
    CPUs, and all its CPUs while it is a valid partition.
    """
    held: set[int] = set()
    for files in children:
        held |= _cpus(files.get(cpupartition.EXCLUSIVE))
        state, reason = cpupartition.parse_state(files.get(cpupartition.PARTITION))
        if reason is None and state in VALID_PARTITIONS:
            held |= _cpus(files.get(CPUS))
    return held


def stand_in(parent: Iterable[int], claimed: Iterable[int]) -> tuple[int, ...]:
    """The CPUs the shepherds' cgroup gets while it cannot inherit (pure): the parent's, less *claimed*."""
    return tuple(sorted(set(parent) - set(claimed)))


def describe(cpus) -> str:
    """The log line for a stand-in written at start-up."""
    return (f"the shepherds' cgroup cannot inherit its parent's CPUs while shepherds run in it (the kernel "
            f"will not empty a populated cpuset's list): it runs on CPUs {format_cpulist(cpus)}, every CPU "
            f"but benchmark partitions', until a benchmark job starts or ends with no shepherd running")


def _read_children(root: str) -> list[dict[str, str | None]]:
    try:
        names = os.listdir(root)
    except OSError:
        return []
    files = (cpupartition.PARTITION, cpupartition.EXCLUSIVE, CPUS)
    return [{f: kfiles.read(os.path.join(root, name), f) for f in files}
            for name in sorted(names) if cgroups.is_job_name(name)]


def _partitions_possible(root: str) -> bool:
    """Whether a job's cgroup below *root* can become a partition: a remote one needs
    ``cpuset.cpus.exclusive`` (Linux 6.7), a local one a parent that is a partition root."""
    if os.path.exists(os.path.join(root, cpupartition.EXCLUSIVE)):
        return True
    state, reason = cpupartition.parse_state(kfiles.read(root, cpupartition.PARTITION))
    return reason is None and state in VALID_PARTITIONS


def _inherit(root: str, making) -> tuple[int, ...] | None:
    """Empty the shepherds' cgroup's CPU list, else write the stand-in (less *making*, the CPUs of a
    partition about to be made); returns the stand-in, or None once it inherits. Raises OSError."""
    try:
        cgroups.pin_shepherds(root, ())
        return None
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    cpus = stand_in(_cpus(kfiles.read(root, EFFECTIVE)), claims(_read_children(root)) | set(making))
    if not cpus:
        raise OSError(errno.ENOSPC, "benchmark partitions claim every CPU of the parent cgroup")
    path = cgroups.shepherds_path(root)
    if _cpus(kfiles.read(path, CPUS)) != set(cpus):
        kfiles.write(path, CPUS, format_cpulist(cpus))
    return cpus


def confine(root: str, cpus) -> tuple[int, ...] | None:
    """Confine the shepherds' cgroup to *cpus* (the housekeeping CPUs), or with none let it inherit
    its parent's; returns the stand-in written when the kernel would not empty its list (shepherds
    still run), else None. Raises OSError when the kernel refuses otherwise."""
    if cpus:
        cgroups.pin_shepherds(root, cpus)
        return None
    return _inherit(root, ())


def _adjust(root: str, making, when: str) -> None:
    path = cgroups.shepherds_path(root)
    if not _cpus(kfiles.read(path, CPUS)):
        return   # it inherits: a partition takes its CPUs out of it by itself
    # Where no partition can be made, shrinking would only take CPUs from the shepherds.
    making = making if _partitions_possible(root) else ()
    try:
        cpus = _inherit(root, making)
    except OSError as exc:
        log.warning("cannot keep the shepherds' cgroup %s off benchmark partitions %s (%s)",
                    path, when, exc.strerror or exc)
        return
    if cpus is None:
        log.info("the shepherds' cgroup inherits its parent's CPUs again (no shepherd was running)")


def make_room(root: str, cpus) -> None:
    """Before a benchmark partition of *cpus* is made below *root*: take them out of the shepherds'
    stand-in (:func:`confine`), or empty its list if no shepherd runs. Logs, never raises."""
    _adjust(root, cpus, f"before one of CPUs {format_cpulist(cpus)}")


def settle(root: str) -> None:
    """Once a benchmark partition below *root* has ended: widen the shepherds' stand-in to what the
    partitions left, or empty its list if no shepherd runs. Logs, never raises."""
    _adjust(root, (), "after one ended")

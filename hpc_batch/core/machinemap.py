"""The machine map of ``dispatch status``: the hardware's shape, and which job holds what.

Pure: the engine passes the machine, the CPUs held back and the running
jobs. The shape is NUMA nodes, then the groups of CPUs sharing a last-level
cache (the L3 of most servers) within each node, then the physical cores of
a group with their hardware threads. Beside it: the reserved CPUs, one entry
per running job with the CPUs and GPUs it holds, and every GPU with its node.

Bounded by the hardware, not the queue: only running jobs appear, each holds
at least one CPU, and the jobs the caller may not see are merged into one
entry, so a 512-CPU machine answers with at most 512 job entries however many
jobs are queued.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from .resources import Allocation, Machine


class Holder(NamedTuple):
    """A running job as the caller may see it: id and user, or both None (another user's, hidden)."""

    id: int | None
    user: str | None
    alloc: Allocation


def build(machine: Machine, reserved: Iterable[int], holders: Sequence[Holder]) -> dict[str, Any]:
    """The ``map`` of a status reply, JSON-safe.

    ``nodes``: each ``id`` and ``caches``, a list of cache groups, each a list
    of cores, each a list of CPU ids (threads). ``cache_level`` is the level
    the groups share (3 for an L3), or None where the kernel described no
    cache: then each node is one group. ``jobs``: ``id``, ``user`` (None for
    the merged entry of jobs the caller may not see), ``cpus`` (its cpuset),
    ``idle`` (CPUs it holds outside its cpuset: a benchmark job's siblings
    and L3 neighbours) and ``gpus``. ``gpus``: each ``index`` and ``node``.
    """
    topo = machine.cpu_topology
    levels: set[int] = set()
    nodes = []
    for node in sorted(machine.nodes, key=lambda n: n.id):
        groups: dict[tuple[int, ...] | None, list[int]] = {}
        for cpu in sorted(node.cpus):
            llc = topo.last_level_cache(cpu)
            if llc is not None:
                levels.add(llc.level)
            groups.setdefault(llc.cpus if llc is not None else None, []).append(cpu)
        caches = [[list(core) for core in topo.cores(cpus)] for cpus in sorted(groups.values())]
        nodes.append({"id": node.id, "caches": caches})
    return {
        "cache_level": levels.pop() if len(levels) == 1 else None,
        "nodes": nodes,
        "reserved": sorted(set(reserved)),
        "jobs": _jobs(holders),
        "gpus": [{"index": g, "node": machine.topology.numa.get(g) if machine.topology else None}
                 for g in sorted(machine.gpus)],
    }


def _jobs(holders: Sequence[Holder]) -> list[dict[str, Any]]:
    seen = []
    hidden: dict[str, set[int]] = {"cpus": set(), "idle": set(), "gpus": set()}
    for h in sorted(holders, key=lambda h: (h.id is None, h.id or 0)):
        if h.id is None:
            hidden["cpus"].update(h.alloc.cpus)
            hidden["idle"].update(h.alloc.idle)
            hidden["gpus"].update(h.alloc.gpus)
            continue
        seen.append({"id": h.id, "user": h.user, "cpus": list(h.alloc.cpus), "idle": list(h.alloc.idle),
                     "gpus": list(h.alloc.gpus)})
    if any(hidden.values()):
        seen.append({"id": None, "user": None, **{k: sorted(v) for k, v in hidden.items()}})
    return seen

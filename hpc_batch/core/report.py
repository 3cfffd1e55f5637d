"""What ``dispatch status`` and ``dispatch show`` say (pure: the engine passes everything in).

``status`` is the machine at a glance: per NUMA node the CPUs, memory and
GPUs total / reserved / in use / free, the policy, how many jobs wait, run
and are held by dependencies, and the head of the queue with why it waits.
``why_waiting`` is the one place that explains a queued job's wait, in the
terms the scheduler uses: what it needs that is not free, or which policy
holds it behind the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import gputopo
from .allocator import Free
from .jobrequest import JobRequest
from .resources import Allocation, Budget, Limits, Machine, Request, capacity
from .sizes import format_size


def why_waiting(req: Request, budget: Budget, position: int, head: int | None, free: Free, policy: str,
                policy_state: dict[str, Any]) -> str:
    """One line: why a queued job at 1-based *position* (behind *head*, if it is not the head) waits."""
    n = req.cpus or 1
    local = req.numa_local and not free.cap.pool
    lacks = []
    if req.exclusive and free.running:
        lacks.append(f"it runs alone, and {free.running} job{'s are' if free.running > 1 else ' is'} running")
    elif free.exclusive:
        lacks.append("an exclusive job holds the machine")
    if req.benchmark and not req.exclusive:
        if n > free.bench_max(req):
            what = ("whole cores whose every thread is free" if req.benchmark == "strict" else "free cores")
            l3 = " in last-level caches no other job uses" if req.whole_l3 and req.benchmark == "strict" else ""
            lacks.append(f"it needs {n} {what}{l3} on one NUMA node, housekeeping CPUs' cores excluded "
                         f"(--benchmark); the most on one is {free.bench_max(req)}")
    elif not req.exclusive and n > free.max_cpus():
        most = max(free.cpus, key=lambda k: (free.free_cpus(k), -k), default=None)
        units = len(free.free_units(most)) if most is not None else 0
        most_text = (str(free.max_cpus()) if free.cap.widest_unit == 1
                     else free.cap.describe_cpus(free.max_cpus(), units))
        lacks.append(f"it needs {free.cap.describe_cpus(free.cap.held(n))} on one NUMA node; the most free "
                     f"on one is {most_text}")
    if budget.mem > free.mem_max(local):
        where = " on one NUMA node" if local else ""
        lacks.append(f"it needs {format_size(budget.mem)} of memory{where}; "
                     f"{format_size(max(0, free.mem_max(local)))} is free")
    if req.gpus > len(free.gpus):
        lacks.append(f"it needs {req.gpus} GPUs; {len(free.gpus)} are free")
    elif req.gpus and (req.gpu_link or req.numa_local_gpu):
        if gputopo.choose_gpus(free.cap.topology, free.gpus, req.gpus, req.max_link) is None:
            lacks.append(f"no {req.gpus} free GPUs are linked by {req.gpu_link} or better")
        elif req.numa_local_gpu:
            lacks.append(f"no NUMA node has {req.gpus} free GPUs and {n} free cores beside them")
    if lacks and position == 1:
        return "; ".join(lacks)
    if position > 1 and head is not None:
        if policy == "fifo-strict":
            return f"behind job {head}, the head of the queue (fifo-strict: nothing overtakes it)"
        if lacks:
            return f"behind job {head}; and " + "; ".join(lacks)
        if policy == "easy-backfill":
            return f"it does not fit what is left of the backfill budget held for job {head} (easy-backfill)"
        start = policy_state.get("start")
        if isinstance(start, (int, float)):
            return (f"it would still be running when job {head} is due to start (strict-backfill); "
                    f"it fits once --max-time is short enough")
        return f"behind job {head} (strict-backfill: no start time can be promised to the head yet)"
    return "; ".join(lacks) or "it is about to start"


def cpu_fields(machine: Machine, alloc: Allocation | None) -> dict[str, Any]:
    """A job's ``cores`` (held CPUs grouped by physical core) and ``held_cpus``, for list and show.

    A record from a daemon that did not know cores has none: the machine's
    topology groups its CPUs instead.
    """
    if alloc is None:
        return {"cores": None, "held_cpus": None}
    cores = alloc.cores or machine.cpu_topology.cores(alloc.held)
    return {"cores": [list(c) for c in cores], "held_cpus": list(alloc.held)}


def bench_fields(request: JobRequest, alloc: Allocation | None, shortfalls: list[str]) -> dict[str, Any]:
    """What ``show`` says of benchmark mode and the process options: the mode, the CPUs held idle
    (siblings, L3 neighbours), every shortfall recorded, and ``aslr``/``thp`` (recorded either way)."""
    mode = request.benchmark
    return {
        "benchmark": (mode + (", whole L3" if request.resources.whole_l3 else "")) if mode else None,
        "idle_cpus": list(alloc.idle) if alloc is not None and alloc.idle else None,
        "l3_idle": list(alloc.l3_idle) if alloc is not None and alloc.l3_idle else None,
        "shortfalls": list(shortfalls) if mode and alloc is not None else None,
        "aslr": request.aslr, "thp": request.thp,
    }


def status(machine: Machine, limits: Limits, running: Sequence[Allocation], policy: str, queued: int,
           waiting: int, head: dict[str, Any] | None) -> dict[str, Any]:
    """The machine at a glance, as a JSON-safe dict (``dispatch status --json``)."""
    cap = capacity(machine, limits)
    topo = machine.topology
    gpu_node = {g: (topo.numa.get(g) if topo else None) for g in machine.gpus}
    nodes = []
    cpu_in_use: dict[int, int] = {}
    mem_in_use: dict[int, int] = {}
    gpu_in_use: set[int] = set()
    home = {c: n.id for n in machine.nodes for c in n.cpus}
    held: set[int] = set()
    idle: dict[int, int] = {}
    for a in running:
        for c in a.idle:
            if c in home:
                idle[home[c]] = idle.get(home[c], 0) + 1
        for c in a.held:
            held.add(c)
            if c in home:
                cpu_in_use[home[c]] = cpu_in_use.get(home[c], 0) + 1
        for node, b in a.mem_by_node:
            mem_in_use[node] = mem_in_use.get(node, 0) + b
        gpu_in_use.update(a.gpus)
    offered = {n.id: n for n in cap.nodes}
    for n in sorted(machine.nodes, key=lambda n: n.id):
        job_node = offered.get(n.id)
        reserved_cpus = len(n.cpus) - (len(job_node.cpus) if job_node else 0)
        reserved_mem = n.mem - (job_node.mem if job_node else 0)
        gpus = [g for g in machine.gpus if gpu_node[g] == n.id]
        nodes.append({
            "id": n.id,
            "cpus": _quad(len(n.cpus), reserved_cpus, cpu_in_use.get(n.id, 0)),
            "cores": _cores(machine.cpu_topology.cores(n.cpus), set(cap.reserved_cpus), held),
            "held_idle": idle.get(n.id, 0),   # of cpus in use: held idle by benchmark jobs, in no cpuset
            "mem": _quad(n.mem, reserved_mem, mem_in_use.get(n.id, 0)),
            "gpus": _quad(len(gpus), 0, sum(1 for g in gpus if g in gpu_in_use)),
        })
    node_ids = {n.id for n in machine.nodes}
    unplaced = [g for g in machine.gpus if gpu_node[g] not in node_ids]
    return {
        "policy": policy,
        "memory": "per NUMA node" if not cap.pool else "one machine-wide pool (--no-cgroups)",
        "cpu_unit": "core" if limits.whole_cores else "thread",
        "nodes": nodes,
        "gpus_without_node": _quad(len(unplaced), 0, sum(1 for g in unplaced if g in gpu_in_use)),
        "jobs": {"running": len(running), "queued": queued, "waiting": waiting},
        "housekeeping": list(limits.housekeeping),
        "head": head,
    }


def _cores(cores: Sequence[tuple[int, ...]], reserved: set[int], held: set[int]) -> dict[str, int]:
    """Physical cores of a node: total, reserved (a thread held back), in use (a thread held by a job), free."""
    res = sum(1 for c in cores if reserved.intersection(c))
    use = sum(1 for c in cores if held.intersection(c) and not reserved.intersection(c))
    return {"total": len(cores), "reserved": res, "in_use": use, "free": len(cores) - res - use}


def _quad(total: int, reserved: int, in_use: int) -> dict[str, int]:
    return {"total": total, "reserved": reserved, "in_use": in_use, "free": max(0, total - reserved - in_use)}



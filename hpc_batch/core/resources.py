"""Resource model: the machine, what jobs may use of it, and what a job asks for and holds.

Pure: no I/O and no clock. The daemon describes the machine (see
``discovery``); ``capacity`` takes the admin's reserves out of it. Two rooms
stand on this model and it imports neither: ``requestcheck`` decides at
submit whether a ``Request`` can ever fit and fixes its ``Budget``;
``allocator`` places jobs on what is free now and returns an ``Allocation``.

The rules fixed here (from the spec):

* The unit of allocation is the physical core, as Slurm's ``CR_Core``: a
  job asking for N CPUs gets whole cores holding at least N threads, and
  every thread of those cores, so two jobs never share a core's execution
  units and caches. ``Limits.whole_cores=False`` (``--cpu-unit thread``)
  packs single threads as before. A machine without SMT, or whose topology
  is unknown, has one thread per core and behaves the same either way.
* ``--reserve-cpu`` takes the lowest CPU ids of the lowest-numbered node
  that has CPUs (CPU 0 is where the OS and interrupts usually live), in
  whole cores too (N CPUs rounded up, as for a job), and
  ``--reserve-mem`` comes off that same node, never more than half of it.
* Under ``--no-cgroups`` (``Limits.per_node_memory=False``) nothing confines
  a job's memory to a node, so memory is one machine-wide pool
  (``Capacity.pool``).
* Cores touching a housekeeping CPU (``Limits.housekeeping``) are never
  offered to a ``--benchmark`` job (``Capacity.bench_cores``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import cputopo, gputopo
from .sizes import GiB


@dataclass(frozen=True)
class Node:
    """One NUMA node: its CPU ids and the bytes of memory on it."""

    id: int
    cpus: tuple[int, ...]
    mem: int


@dataclass(frozen=True)
class Machine:
    """The machine as discovered: NUMA nodes, GPU indices and (when known) how the GPUs are wired."""

    nodes: tuple[Node, ...]
    gpus: tuple[int, ...] = ()
    topology: gputopo.Topology | None = field(default=None, hash=False)
    gpu_uuids: dict[int, str] = field(default_factory=dict, hash=False)    # index -> UUID (nvidia-smi -L)
    gpu_minors: dict[int, int] = field(default_factory=dict, hash=False)   # index -> /dev/nvidia<minor>
    cpu_topology: cputopo.CpuTopology = field(default_factory=cputopo.CpuTopology, hash=False)  # cores' threads


@dataclass(frozen=True)
class Limits:
    """Admin limits (``hpc-batchd`` flags).

    ``reserve_cpu`` never takes the machine's last core, so a small
    development machine still offers one core to jobs. ``whole_cores``
    makes the physical core the unit of allocation (``--cpu-unit core``).
    """

    reserve_cpu: int = 2
    reserve_mem: int = 2 * GiB
    min_job_mem: int = 2 * GiB
    per_node_memory: bool = True
    whole_cores: bool = True
    housekeeping: tuple[int, ...] = ()   # CPUs benchmark jobs never get (--housekeeping-cpus)


@dataclass(frozen=True)
class Request:
    """What a submission asked for (``dispatch new`` flags)."""

    cpus: int | None = None
    mem: int | None = None
    gpus: int = 0
    exclusive: bool = False
    numa_local: bool = False          # memory on the job's own node only (--numa-local-mem)
    numa_local_gpu: bool = False      # CPUs on the node its GPUs hang off (--numa-local-gpu)
    gpu_link: str | None = None       # worst link class the GPU set may have (--gpu-link)
    benchmark: str | None = None      # "warn" or "strict" (--benchmark), None for a plain job
    whole_l3: bool = False            # --whole-l3: no other job on a CPU sharing its last-level cache

    @property
    def max_link(self) -> gputopo.Link | None:
        """``gpu_link`` as a Link (it was checked at submit)."""
        return gputopo.parse_link_class(self.gpu_link) if self.gpu_link else None


@dataclass(frozen=True)
class Budget:
    """Memory budget fixed at submit time; ``assigned`` = default share used."""

    mem: int
    assigned: bool


@dataclass(frozen=True)
class Allocation:
    """Resources granted to a running job.

    ``mem_by_node`` is sorted by node id; in pool mode it is a single entry
    charged to the node the job's CPUs are on. ``cores`` groups the CPUs
    the job holds by physical core (each group: the threads of that core
    the job holds; all of them unless the daemon packs threads); it is ()
    in a record written by a daemon that did not know cores, and then
    ``Machine.cpu_topology`` groups ``cpus`` instead.

    ``cpus`` is the job's cpuset; it holds more than that when it is a
    benchmark job: the other threads of its cores (in ``cores``) and, with
    ``--whole-l3``, ``l3_idle``, the CPUs sharing its last-level cache. Those
    are in no job's cpuset; ``idle`` names them, ``held`` is everything.
    """

    cpus: tuple[int, ...]
    mem_by_node: tuple[tuple[int, int], ...]
    gpus: tuple[int, ...]
    exclusive: bool
    cores: tuple[tuple[int, ...], ...] = ()
    l3_idle: tuple[int, ...] = ()

    @property
    def held(self) -> tuple[int, ...]:
        """Every CPU the job holds: its cpuset, every thread of its cores, and ``l3_idle``."""
        return tuple(sorted(set(self.cpus).union(*self.cores, self.l3_idle)))

    @property
    def idle(self) -> tuple[int, ...]:
        """The CPUs the job holds outside its cpuset (a benchmark job's siblings and L3 neighbours)."""
        return tuple(sorted(set(self.held) - set(self.cpus)))

    @property
    def mems(self) -> tuple[int, ...]:
        """Node ids the job's memory is charged to (for cpuset.mems)."""
        return tuple(sorted(node for node, _ in self.mem_by_node))

    @property
    def mem(self) -> int:
        """Total memory budget in bytes (for memory.max)."""
        return sum(b for _, b in self.mem_by_node)

    @property
    def spread(self) -> bool:
        """True when the budget spans more than one node (``+`` in list)."""
        return len(self.mem_by_node) > 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form; ``from_dict`` restores an equal Allocation."""
        return {
            "cpus": list(self.cpus),
            "mem_by_node": [[n, b] for n, b in self.mem_by_node],
            "gpus": list(self.gpus),
            "exclusive": self.exclusive,
            "cores": [list(c) for c in self.cores],
            "l3_idle": list(self.l3_idle),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Allocation:
        """Inverse of ``to_dict`` (accepts lists where tuples were).

        A record without ``cores`` (a job started by a daemon that packed
        threads without knowing cores) loads with ``cores=()``.
        """
        return cls(
            cpus=tuple(int(c) for c in d["cpus"]),
            mem_by_node=tuple((int(n), int(b)) for n, b in d["mem_by_node"]),
            gpus=tuple(int(g) for g in d["gpus"]),
            exclusive=bool(d["exclusive"]),
            cores=tuple(tuple(int(c) for c in core) for core in d.get("cores") or ()),
            l3_idle=tuple(int(c) for c in d.get("l3_idle") or ()),
        )


@dataclass(frozen=True)
class Capacity:
    """What jobs may use after the reserves, per node.

    ``nodes`` mirror the machine's nodes with reserved CPUs removed and
    memory reduced by the reserve; ``reserved_*`` record what was held back
    (for the startup log). ``units`` maps each job CPU to the unit it is
    handed out in: the job CPUs of its core, or the CPU alone when threads
    are packed (``Limits.whole_cores`` off) or its core is unknown.
    ``cpu_topology`` is the machine's, for grouping CPUs by physical core
    whatever the unit.
    """

    nodes: tuple[Node, ...]
    gpus: tuple[int, ...]
    reserved_cpus: tuple[int, ...]
    reserved_mem: int
    pool: bool
    topology: gputopo.Topology | None = None
    units: dict[int, tuple[int, ...]] = field(default_factory=dict, hash=False)
    cpu_topology: cputopo.CpuTopology = field(default_factory=cputopo.CpuTopology, hash=False)
    housekeeping: frozenset[int] = frozenset()
    # node -> the cores a benchmark job may run on: (its lowest job CPU, every thread of the core)
    bench_cores: dict[int, tuple[tuple[int, tuple[int, ...]], ...]] = field(default_factory=dict, hash=False)

    def bench_max(self, strict: bool) -> int:
        """Most cores one node offers a benchmark job (strict: cores whose every thread is a job CPU)."""
        offered = set(self.units)
        return max((sum(1 for _, core in cores if not strict or offered.issuperset(core))
                    for cores in self.bench_cores.values()), default=0)

    @property
    def threads_per_core(self) -> int:
        """Most threads a core of the machine has (what a benchmark job holds per core)."""
        return max((len(core) for cores in self.bench_cores.values() for _, core in cores), default=1)

    def unit(self, cpu: int) -> tuple[int, ...]:
        """The CPUs handed out together with ``cpu`` (itself included)."""
        return self.units.get(cpu, (cpu,))

    @property
    def widest_unit(self) -> int:
        """Most threads one unit holds (1 without SMT or when threads are packed)."""
        return max((len(u) for u in self.units.values()), default=1)

    def held(self, n: int) -> int:
        """CPUs a job asking for ``n`` holds once rounded up to whole units.

        Exact where every core has the same number of threads (every server
        we know); on a hybrid part it counts the widest core's.
        """
        w = self.widest_unit
        return max(n, min(-(-n // w) * w, self.max_node_cpus))

    def describe_cpus(self, n: int, cores: int | None = None) -> str:
        """``n`` CPUs in words: "30 cores" with one thread per unit, else "40 CPUs (20 whole cores)".

        ``cores`` defaults to the units ``n`` CPUs round up to.
        """
        if self.widest_unit == 1:
            return f"{n} cores"
        k = -(-n // self.widest_unit) if cores is None else cores
        return f"{n} CPU{'s' if n != 1 else ''} ({k} whole core{'s' if k != 1 else ''})"

    def node_units(self, node: Node) -> int:
        """Units of allocation (cores, or threads when packed) ``node`` offers to jobs."""
        return len({self.unit(c) for c in node.cpus})

    @property
    def total_cpus(self) -> int:
        """CPUs offered to jobs on the whole machine."""
        return sum(len(n.cpus) for n in self.nodes)

    @property
    def total_mem(self) -> int:
        """Bytes offered to jobs on the whole machine."""
        return sum(n.mem for n in self.nodes)

    @property
    def max_node_cpus(self) -> int:
        """CPUs offered to jobs by the widest node (the --cpu ceiling)."""
        return max((len(n.cpus) for n in self.nodes), default=0)

    def max_node_mem(self, min_cpus: int = 0) -> int:
        """Most memory one node with at least ``min_cpus`` job CPUs offers."""
        return max((n.mem for n in self.nodes if len(n.cpus) >= min_cpus), default=0)


def _units(machine: Machine, whole_cores: bool) -> dict[int, tuple[int, ...]]:
    """Each CPU of the machine's nodes mapped to its unit of allocation on its node."""
    units: dict[int, tuple[int, ...]] = {}
    for n in machine.nodes:
        groups = machine.cpu_topology.cores(n.cpus) if whole_cores else tuple((c,) for c in n.cpus)
        for g in groups:
            units.update(dict.fromkeys(g, g))
    return units


# capacity()'s last answer: it is asked several times a submit and a scheduling pass (and costs a
# walk of every CPU), always of the daemon's one machine and limits, which are frozen.
_capacity_of: tuple[Machine, Limits, Capacity] | None = None


def capacity(machine: Machine, limits: Limits) -> Capacity:
    """Return what jobs may use once the reserves are taken out (the same object as long as
    *machine* and *limits* are: no caller changes it)."""
    global _capacity_of
    last = _capacity_of
    if last is not None and last[0] is machine and last[1] is limits:
        return last[2]
    cap = _capacity(machine, limits)
    _capacity_of = (machine, limits, cap)
    return cap


def _capacity(machine: Machine, limits: Limits) -> Capacity:
    nodes = sorted(machine.nodes, key=lambda n: n.id)
    home = next((n for n in nodes if n.cpus), None)
    units = _units(machine, limits.whole_cores)
    reserved: tuple[int, ...] = ()
    reserved_mem = 0
    if home is not None:
        # All of it from the lowest node, so the other nodes keep their full
        # width, in whole units (a job on a reserved core's sibling would share
        # it with the OS); only a machine that would be left with no unit at
        # all keeps one.
        total = len({units[c] for n in nodes for c in n.cpus})
        taken: list[int] = []
        for unit in sorted({units[c] for c in home.cpus}):
            if len(taken) >= limits.reserve_cpu or total <= 1:
                break
            taken += unit
            total -= 1
        reserved = tuple(sorted(taken))
        reserved_mem = max(0, min(limits.reserve_mem, home.mem // 2))
    out = []
    for n in nodes:
        if home is not None and n.id == home.id:
            held = set(reserved)
            cpus = tuple(c for c in sorted(n.cpus) if c not in held)
            out.append(Node(n.id, cpus, n.mem - reserved_mem))
        else:
            out.append(Node(n.id, tuple(sorted(n.cpus)), n.mem))
    return Capacity(
        nodes=tuple(out),
        gpus=tuple(sorted(machine.gpus)),
        reserved_cpus=reserved,
        reserved_mem=reserved_mem,
        pool=not limits.per_node_memory,
        topology=machine.topology,
        units={c: units[c] for n in out for c in n.cpus},
        cpu_topology=machine.cpu_topology,
        housekeeping=frozenset(limits.housekeeping),
        bench_cores=_bench_cores(out, machine.cpu_topology, set(limits.housekeeping)),
    )


BenchCore = tuple[int, tuple[int, ...]]   # (the CPU a benchmark job runs on, the threads of its core)


def _bench_cores(nodes: Iterable[Node], topo: cputopo.CpuTopology,
                 housekeeping: set[int]) -> dict[int, tuple[BenchCore, ...]]:
    """Per node, the cores a benchmark job may run on: none touching a housekeeping CPU."""
    out = {}
    for n in nodes:
        seen: set[int] = set()
        found = []
        for c in n.cpus:   # sorted: c is the lowest job CPU of its core
            if c in seen:
                continue
            core = topo.siblings(c)
            seen.update(core)
            if not housekeeping.intersection(core):
                found.append((c, core))
        out[n.id] = tuple(found)
    return out


def llc_cpus(cap: Capacity, cpu: int) -> tuple[int, ...]:
    """The CPUs sharing ``cpu``'s last-level cache (its core's threads when no cache is described)."""
    cache = cap.cpu_topology.last_level_cache(cpu)
    return cache.cpus if cache is not None else cap.cpu_topology.siblings(cpu)


def describe_unit(machine: Machine, limits: Limits) -> str:
    """One startup log line: the unit CPUs are handed out in, and what the reserve holds back."""
    cap = capacity(machine, limits)
    # Cores whose threads the daemon may hand out, not the kernel's siblings: one outside
    # the daemon's affinity leaves its core a single thread to allocate.
    smt = any(len(g) > 1 for n in machine.nodes for g in machine.cpu_topology.cores(n.cpus))
    if not smt:
        unit = "one thread per core here, so --cpu counts cores"
    elif limits.whole_cores:
        unit = ("whole cores (--cpu-unit core): a job gets every thread of the cores it is given, "
                "its --cpu rounded up, and no two jobs share a core")
    else:
        unit = "single threads (--cpu-unit thread): two jobs may run on the threads of one core"
    held = cputopo.format_cpulist(cap.reserved_cpus) if cap.reserved_cpus else "none"
    return (f"CPU allocation: {unit}; reserved for the OS (--reserve-cpu {limits.reserve_cpu}): CPUs {held}"
            f"{_reserve_note(machine, limits, cap.reserved_cpus)}")


def _reserve_note(machine: Machine, limits: Limits, reserved: tuple[int, ...]) -> str:
    """Why the reserve holds another count of CPUs than ``--reserve-cpu`` asked, in words ("" if it does not).

    The rules are capacity()'s: whole units, never the machine's last one, all from one node.
    """
    asked, got = limits.reserve_cpu, len(reserved)
    if got == asked:
        return ""
    if got > asked:
        return f" ({asked} rounded up to whole cores)"
    units = _units(machine, limits.whole_cores)
    left = len({units[c] for n in machine.nodes for c in n.cpus}) - len({units[c] for c in reserved})
    if left <= 1:
        return f" (only {got} of {asked}: the machine's last {'core' if limits.whole_cores else 'CPU'} is left to jobs)"
    return f" (only {got} of {asked}: the reserve comes from the lowest NUMA node with CPUs, which has no more)"


def default_share(cpus: int, machine: Machine) -> int:
    """Memory ``cpus`` CPUs represent: CPUs/node CPUs x node memory.

    Uses each node's size before the reserve and takes the smallest result
    across nodes, so a default budget fits next to its cores on any node.
    """
    shares = [cpus * n.mem // len(n.cpus) for n in machine.nodes if n.cpus]
    return min(shares, default=0)

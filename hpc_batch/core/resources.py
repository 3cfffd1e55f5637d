"""Resource model and allocator: NUMA nodes, memory budgets and GPUs.

Pure: no I/O and no clock. The daemon describes the machine (see
``discovery``), passes the jobs that are running, and gets back either an
``Allocation`` or ``None`` ("does not fit now").

Placement rules (from the spec):

* The unit of allocation is the physical core, as Slurm's ``CR_Core``: a
  job asking for N CPUs gets whole cores holding at least N threads, and
  every thread of those cores, so two jobs never share a core's execution
  units and caches. ``Limits.whole_cores=False`` (``--cpu-unit thread``)
  packs single threads as before. A machine without SMT, or whose topology
  is unknown, has one thread per core and behaves the same either way.
* A job's CPUs always come from ONE NUMA node and its memory is charged to
  that node. A budget no single node can hold is spread over more nodes,
  never with ``--numa-local``.
* ``--reserve-cpu`` takes the lowest CPU ids of the lowest-numbered node
  that has CPUs (CPU 0 is where the OS and interrupts usually live), in
  whole cores too (N CPUs rounded up, as for a job), and
  ``--reserve-mem`` comes off that same node, never more than half of it.
* Under ``--no-cgroups`` (``Limits.per_node_memory=False``) nothing confines
  a job's memory to a node, so memory is one machine-wide pool.
* An exclusive job waits for an idle machine; while it runs nothing else
  fits.
* ``--benchmark`` (``Request.benchmark``): N physical cores, ONE thread of
  each in the job's cpuset, the other threads held idle (charged to the job,
  in no job's cpuset). Cores touching a housekeeping CPU
  (``Limits.housekeeping``) are never given to it. ``warn`` takes a core
  whose sibling cannot be held (in use by another job, or not the daemon's
  to give) when no better one is free; ``strict`` waits for cores whose
  every thread can be held. ``whole_l3`` also holds every free CPU sharing a
  last-level cache with the job's, and prefers (strict: waits for) caches
  nobody else uses.
* GPUs: the closest-wired free set of the size asked for (judged by its
  worst link; ``gputopo``), never one worse than ``--gpu-link``. The job's
  CPUs come from the NUMA node its GPUs hang off when they fit there, and
  must with ``--numa-local-gpu``. Without a topology, the lowest indices.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import cputopo, gputopo
from .sizes import GiB, format_size

# Key of the single machine-wide memory pool in Free.mem (per_node_memory off).
POOL = -1


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


class RequestError(ValueError):
    """A request that can never fit; the message is one user-facing line."""


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


def _job_cpus(req: Request, cap: Capacity) -> int:
    """Number of cores the request takes (exclusive without --cpu: all)."""
    if req.cpus is not None:
        return req.cpus
    return cap.total_cpus if req.exclusive else 1


def _mem_ceiling(req: Request, n: int, cap: Capacity) -> tuple[int, str]:
    """Most memory the request could ever be given, and what limits it."""
    if req.numa_local and not cap.pool:
        return cap.max_node_mem(n if req.cpus is not None else 0), "the largest NUMA node offers"
    return cap.total_mem, "the machine offers"


def check_request(req: Request, machine: Machine, limits: Limits) -> Budget:
    """Validate ``req`` against the machine and fix its memory budget.

    Raises RequestError for requests that can never fit; otherwise returns
    the requested budget, or the default share (floored at min_job_mem,
    capped at what the machine could ever give it). ``--exclusive`` without
    ``--max-mem`` gets all job memory of the machine (with ``--numa-local``:
    all of the largest node).
    """
    if req.cpus is not None and req.cpus < 1:
        raise RequestError(f"--cpu must be at least 1 (got {req.cpus})")
    if req.mem is not None and req.mem < 1:
        raise RequestError("--max-mem must be a positive amount")
    if req.gpus < 0:
        raise RequestError(f"--gpu-cores cannot be negative (got {req.gpus})")
    if req.gpus > len(machine.gpus):
        have = f"{len(machine.gpus)} GPUs" if machine.gpus else "no GPUs"
        raise RequestError(f"--gpu-cores {req.gpus} can never fit: this machine has {have}")
    cap = capacity(machine, limits)
    n = _job_cpus(req, cap)
    if req.gpu_link is not None or req.numa_local_gpu:
        _check_gpu_placement(req, n, cap)
    if cap.total_cpus == 0:
        raise RequestError("no job can fit: this machine offers no cores to jobs")
    if req.cpus is not None and n > cap.max_node_cpus:
        widest = max(cap.nodes, key=lambda node: len(node.cpus))
        raise RequestError(
            f"--cpu {n} can never fit: the largest NUMA node offers "
            f"{cap.describe_cpus(cap.max_node_cpus, cap.node_units(widest))} to jobs"
        )
    if req.benchmark is not None:
        _check_benchmark(req, n, cap)
    if req.exclusive and req.cpus is None and req.numa_local and not cap.pool \
            and sum(1 for node in cap.nodes if node.cpus) > 1:
        raise RequestError(
            "--exclusive --numa-local needs --cpu on a multi-node machine: "
            "without it the job takes every core of every node"
        )
    ceiling, what = _mem_ceiling(req, n, cap)
    flag = " with --numa-local" if req.numa_local and not cap.pool else ""
    if req.mem is not None:
        if req.mem > ceiling:
            raise RequestError(
                f"--max-mem {format_size(req.mem)}{flag} can never fit: "
                f"{what} {format_size(ceiling)} to jobs"
            )
        return Budget(req.mem, assigned=False)
    if ceiling < 1:
        raise RequestError(f"no job can fit: {what} no memory to jobs")
    if req.exclusive:
        return Budget(ceiling, assigned=True)
    # The share of what the job holds: --cpu 3 on cores of two threads holds 4 CPUs; a benchmark
    # job's --cpu counts cores (its L3 neighbours are held for quiet, not counted).
    held = min(n * cap.threads_per_core, cap.max_node_cpus) if req.benchmark else cap.held(n)
    share = max(default_share(held, machine), limits.min_job_mem)
    # A floor the machine cannot honour would refuse a job that asked for nothing.
    return Budget(min(share, ceiling), assigned=True)


def _check_benchmark(req: Request, n: int, cap: Capacity) -> None:
    """Refuse a benchmark request no node could ever meet, naming the limit."""
    if req.benchmark not in ("warn", "strict"):
        raise RequestError(f"--benchmark {req.benchmark!r}: choose warn or strict")
    strict = req.benchmark == "strict"
    one = len(cap.housekeeping) == 1
    hk = (f" (CPU{'' if one else 's'} {cputopo.format_cpulist(cap.housekeeping)} and "
          f"{'its core is' if one else 'their cores are'} kept for housekeeping)" if cap.housekeeping else "")
    if req.exclusive and req.cpus is None:
        if cap.bench_max(False) == 0:
            raise RequestError(f"--benchmark can never fit: no core here is free of housekeeping CPUs{hk}")
        return
    most = cap.bench_max(strict)
    if n > most:
        every = " with every thread free to hold" if strict else ""
        raise RequestError(f"--benchmark{'=strict' if strict else ''} --cpu {n} can never fit: the largest "
                           f"NUMA node offers {most} whole core{'s' if most != 1 else ''}{every} to benchmark "
                           f"jobs{hk}")
    if req.whole_l3 and strict:
        most = _l3_max(cap)
        if n > most:
            raise RequestError(f"--whole-l3 --benchmark=strict --cpu {n} can never fit: the last-level caches "
                               f"that hold no housekeeping or reserved CPU offer at most {most} whole "
                               f"core{'s' if most != 1 else ''} on one NUMA node{hk}")


def _llc(cap: Capacity, cpu: int) -> tuple[int, ...]:
    """The CPUs sharing ``cpu``'s last-level cache (its core's threads when no cache is described)."""
    cache = cap.cpu_topology.last_level_cache(cpu)
    return cache.cpus if cache is not None else cap.cpu_topology.siblings(cpu)


def _quiet_llc(cap: Capacity, llc: tuple[int, ...], offered: set[int]) -> bool:
    """A cache a strict --whole-l3 job may have: every CPU of it a job CPU, none a housekeeping one."""
    return offered.issuperset(llc) and not cap.housekeeping.intersection(llc)


def _l3_max(cap: Capacity) -> int:
    """Most cores on one node a strict --whole-l3 job could get: in caches whose every CPU is a job CPU."""
    offered = set(cap.units)
    best = 0
    for cores in cap.bench_cores.values():
        best = max(best, sum(1 for r, core in cores
                             if offered.issuperset(core) and _quiet_llc(cap, _llc(cap, r), offered)))
    return best


def _check_gpu_placement(req: Request, n: int, cap: Capacity) -> None:
    """Refuse a --gpu-link or --numa-local-gpu that no set of this machine's GPUs could ever meet."""
    flags = " and ".join(f for f, on in (("--gpu-link", req.gpu_link), ("--numa-local-gpu", req.numa_local_gpu)) if on)
    if req.gpus == 0:
        raise RequestError(f"{flags} asks where GPUs are, but the job asks for none: add --gpu-cores N")
    topo = cap.topology
    if topo is None:
        raise RequestError(f"{flags} can never be met here: how the GPUs are wired is unknown "
                           f"(nvidia-smi topo -m gave nothing when the daemon started)")
    try:
        link = req.max_link
    except gputopo.TopoError as exc:
        raise RequestError(f"--gpu-link: {exc}") from None
    if link is not None and gputopo.choose_gpus(topo, cap.gpus, req.gpus, link) is None:
        best = gputopo.worst_link(topo, gputopo.choose_gpus(topo, cap.gpus, req.gpus) or ())
        raise RequestError(f"--gpu-link {req.gpu_link} can never be met: the closest {req.gpus} GPUs here "
                           f"are linked by {best} at worst")
    if req.numa_local_gpu and not any(
            len(node.cpus) >= n and gputopo.choose_gpus(topo, cap.gpus, req.gpus, link, node.id) is not None
            for node in cap.nodes):
        raise RequestError(f"--numa-local-gpu can never be met: no NUMA node has {req.gpus} GPUs"
                           f"{' linked by ' + str(req.gpu_link) + ' or better' if link else ''} and {n} cores "
                           f"for jobs")


def why_never_fits(req: Request, budget: Budget, machine: Machine, limits: Limits) -> str | None:
    """Reason a queued job (with its fixed budget) can never start, or None.

    Re-checks the request against the machine as it is now, and the budget
    fixed at submit time against what the machine now offers.
    """
    try:
        check_request(req, machine, limits)
    except RequestError as e:
        return str(e)
    cap = capacity(machine, limits)
    ceiling, what = _mem_ceiling(req, _job_cpus(req, cap), cap)
    if budget.mem > ceiling:
        return (
            f"its memory budget of {format_size(budget.mem)} can never fit: "
            f"{what} {format_size(ceiling)} to jobs"
        )
    return None


class Free:
    """Mutable view of what is unallocated, built once per scheduling pass.

    ``cpus`` maps node id to its free job CPUs, ``mem`` maps node id (or
    POOL) to free bytes, ``running`` counts jobs holding resources. Only a
    unit (``Capacity.unit``) whose every CPU is free can be handed out, so a
    core one thread of which is held (by a job a thread-packing daemon
    started) is not offered.
    """

    __slots__ = ("cap", "cpus", "mem", "gpus", "running", "exclusive",
                 "_cpu_node", "_max", "_mem_max", "_failed", "_room")

    def __init__(self, cap: Capacity, cpus: dict[int, set[int]], mem: dict[int, int], gpus: set[int],
                 running: int = 0, exclusive: bool = False, cpu_node: dict[int, int] | None = None) -> None:
        self.cap = cap
        self.cpus: dict[int, set[int]] = cpus
        self.mem: dict[int, int] = mem
        self.gpus: set[int] = gpus
        self.running = running
        self.exclusive = exclusive
        self._cpu_node = cpu_node if cpu_node is not None else {
            c: n.id for n in cap.nodes for c in n.cpus
        }
        self._max: int | None = None
        self._mem_max: tuple[int, int] | None = None
        self._failed: set[tuple[object, ...]] = set()   # shapes that did not fit since the last release
        self._room: dict[int, list[tuple[int, ...]]] = {}   # node -> its whole free units, lowest first

    @classmethod
    def of(cls, cap: Capacity, running: Iterable[Allocation] = ()) -> Free:
        """Free resources of ``cap`` once ``running`` allocations are taken."""
        mem = {POOL: cap.total_mem} if cap.pool else {n.id: n.mem for n in cap.nodes}
        f = cls(cap, {n.id: set(n.cpus) for n in cap.nodes}, mem, set(cap.gpus))
        for a in running:
            f.take(a)
        return f

    def copy(self) -> Free:
        """Independent copy (for what-if simulation)."""
        return Free(self.cap, {k: set(v) for k, v in self.cpus.items()}, dict(self.mem),
                    set(self.gpus), self.running, self.exclusive, self._cpu_node)

    def within(self, budget: Free) -> Free:
        """What is free here AND still inside ``budget`` (easy-backfill)."""
        cpus = {k: v & budget.cpus.get(k, set()) for k, v in self.cpus.items()}
        mem = {k: min(v, budget.mem.get(k, 0)) for k, v in self.mem.items()}
        return Free(self.cap, cpus, mem, self.gpus & budget.gpus, self.running,
                    self.exclusive, self._cpu_node)

    def free_units(self, node: int) -> list[tuple[int, ...]]:
        """The units of ``node`` whose every CPU is free, lowest CPU first."""
        room = self._room.get(node)
        if room is None:
            free = self.cpus.get(node, set())
            units = {self.cap.unit(c) for c in free}
            room = sorted(u for u in units if free.issuperset(u))
            self._room[node] = room
        return room

    def free_cpus(self, node: int) -> int:
        """CPUs of ``node`` a job could be given now: those of its whole free units."""
        return sum(len(u) for u in self.free_units(node))

    def max_cpus(self) -> int:
        """CPUs that could be given on the node with the most of them (whole free units)."""
        if self._max is None:
            self._max = max((self.free_cpus(k) for k in self.cpus), default=0)
        return self._max

    def _pick(self, node: int, n: int) -> list[int]:
        """The lowest free units of ``node`` holding at least ``n`` CPUs (the caller checked they exist)."""
        out: list[int] = []
        for unit in self.free_units(node):
            if len(out) >= n:
                break
            out += unit
        return sorted(out)

    def mem_max(self, local_only: bool) -> int:
        """Largest budget that could fit: one node's free memory, or all of it."""
        if self._mem_max is None:
            vals = [max(v, 0) for v in self.mem.values()]
            self._mem_max = (max(vals, default=0), sum(vals))
        return self._mem_max[0 if local_only else 1]

    def _mem_key(self, node: int) -> int:
        return POOL if self.cap.pool else node

    def _changed(self, a: Allocation) -> None:
        self._max = self._mem_max = None
        for c in a.held:   # only the nodes ``a`` touched have other whole units now
            node = self._cpu_node.get(c)
            if node is not None:
                self._room.pop(node, None)

    def take(self, a: Allocation) -> None:
        """Mark ``a`` as in use. Resources outside capacity are ignored."""
        for c in a.held:
            node = self._cpu_node.get(c)
            if node is not None:
                self.cpus[node].discard(c)
        for node, b in a.mem_by_node:
            key = self._mem_key(node)
            if key in self.mem:
                self.mem[key] -= b  # may go negative if the machine shrank
        self.gpus.difference_update(a.gpus)
        self.running += 1
        self.exclusive = self.exclusive or a.exclusive
        self._changed(a)

    def release(self, a: Allocation) -> None:
        """Give back what ``take(a)`` took."""
        gpus = set(self.cap.gpus)
        for c in a.held:
            node = self._cpu_node.get(c)
            if node is not None:
                self.cpus[node].add(c)
        for node, b in a.mem_by_node:
            key = self._mem_key(node)
            if key in self.mem:
                self.mem[key] += b
        self.gpus.update(g for g in a.gpus if g in gpus)
        self.running -= 1
        if a.exclusive:
            self.exclusive = False  # only one exclusive job can ever run
        self._changed(a)
        self._failed.clear()  # more is free: old failures may fit now

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe snapshot (used for easy-backfill's frozen budget)."""
        return {
            "pool": self.cap.pool,
            "cpus": sorted(c for s in self.cpus.values() for c in s),
            "mem": [[k, v] for k, v in sorted(self.mem.items())],
            "gpus": sorted(self.gpus),
        }

    @classmethod
    def from_dict(cls, cap: Capacity, d: Any) -> Free | None:
        """Restore a ``to_dict`` snapshot; None if it does not match ``cap``."""
        try:
            if bool(d["pool"]) != cap.pool:
                return None  # memory mode changed across a restart
            keys = [POOL] if cap.pool else [n.id for n in cap.nodes]
            f = cls(cap, {n.id: set() for n in cap.nodes}, dict.fromkeys(keys, 0), set())
            for c in d["cpus"]:
                node = f._cpu_node.get(int(c))
                if node is not None:
                    f.cpus[node].add(int(c))
            for k, v in d["mem"]:
                if int(k) in f.mem:
                    f.mem[int(k)] = int(v)
            f.gpus = {int(g) for g in d["gpus"] if int(g) in set(cap.gpus)}
            return f
        except (KeyError, TypeError, ValueError):
            return None

    def fit(self, req: Request, budget: Budget, numa_only: bool = False) -> Allocation | None:
        """Allocation for ``req`` from what is free, or None if it does not fit.

        ``numa_only`` refuses to spread memory, as ``--numa-local`` does.
        """
        if self.exclusive or req.gpus > len(self.gpus):
            return None
        mem = budget.mem
        local_only = req.numa_local or numa_only
        if req.exclusive:
            a = self._fit_exclusive(req, mem, local_only)
            return self._bench_shape(a) if a is not None and req.benchmark else a
        n = req.cpus or 1
        # Cheap rejections first: backfill scans run this on every queued job.
        if n > self.max_cpus() or mem > self.mem_max(local_only):
            return None
        if req.benchmark:
            # As below: a shape that failed keeps failing until something is released.
            bkey = (n, mem, local_only, req.benchmark, req.whole_l3)
            if req.gpus == 0 and bkey in self._failed:
                return None
            a = self._fit_bench(req, n, mem, local_only)
            if a is None and req.gpus == 0:
                self._failed.add(bkey)
            return a
        if req.numa_local_gpu:
            return self._fit_near_gpus(req, n, mem, local_only)
        gpus = self._gpus_for(req)
        if gpus is None:
            return None
        # Free space only shrinks until release(), so a shape that failed
        # once keeps failing: remember it instead of placing it again.
        key = (n, mem, local_only)
        if key in self._failed:
            return None
        prefer = gputopo.gpu_node(self.cap.topology, gpus) if gpus and self.cap.topology else None
        charges = self._place(n, mem, local_only, prefer)
        if charges is None:
            self._failed.add(key)
            return None
        home = next(iter(charges))
        return self._alloc(self._pick(home, n), charges, gpus, False)

    def _gpus_for(self, req: Request, node: int | None = None) -> tuple[int, ...] | None:
        """The GPUs the job would get (closest-wired free set), or None if none will do now."""
        if req.gpus == 0:
            return ()
        return gputopo.choose_gpus(self.cap.topology, self.gpus, req.gpus, req.max_link, node)

    def _fit_near_gpus(self, req: Request, n: int, mem: int, local_only: bool) -> Allocation | None:
        """--numa-local-gpu: the job's CPUs (and memory first) on the node its GPUs hang off."""
        for node in sorted((k for k in self.cpus if self.free_cpus(k) >= n), key=lambda k: (self.free_cpus(k), k)):
            gpus = self._gpus_for(req, node)
            if gpus is None:
                continue
            charges = self._charge(node, mem, local_only)
            if charges is not None:
                return self._alloc(self._pick(node, n), charges, gpus, False)
        return None

    def _charge(self, home: int, mem: int, local_only: bool) -> dict[int, int] | None:
        """Memory charges with ``home`` as the job's node, or None if they do not fit."""
        if self.cap.pool:
            return {home: mem} if self.mem[POOL] >= mem else None
        if self.mem[home] >= mem:
            return {home: mem}
        return None if local_only else self._spread(home, mem)

    def _place(self, n: int, mem: int, local_only: bool, prefer: int | None = None) -> dict[int, int] | None:
        """Memory charges for ``n`` cores and ``mem`` bytes, home node first (*prefer* if it fits there)."""
        cands = [k for k in self.cpus if self.free_cpus(k) >= n]
        if prefer in cands and (self.cap.pool and self.mem[POOL] >= mem or
                                not self.cap.pool and self.mem[prefer] >= mem):
            return {prefer: mem}   # next to the job's GPUs
        if self.cap.pool:
            if self.mem[POOL] < mem:
                return None
            return {min(cands, key=lambda k: (self.free_cpus(k), k)): mem}
        local = [k for k in cands if self.mem[k] >= mem]
        if local:
            # Best fit keeps the emptiest nodes whole for wide jobs.
            return {min(local, key=lambda k: (self.free_cpus(k), self.mem[k], k)): mem}
        if local_only:
            return None
        return self._spread(max(cands, key=lambda k: (self.mem[k], -k)), mem)

    def _spread(self, home: int, mem: int) -> dict[int, int] | None:
        """Charge ``home`` all it has, then the roomiest other nodes."""
        if self.mem[home] <= 0 or sum(max(v, 0) for v in self.mem.values()) < mem:
            return None
        charges = {home: self.mem[home]}
        rest = mem - self.mem[home]
        for k in sorted((k for k in self.mem if k != home and self.mem[k] > 0),
                        key=lambda k: (-self.mem[k], k)):
            if rest <= 0:
                break
            charges[k] = min(self.mem[k], rest)
            rest -= charges[k]
        return charges

    def _fit_exclusive(self, req: Request, mem: int, local_only: bool) -> Allocation | None:
        if self.running:
            return None  # waits for an idle machine
        if req.cpus is None:
            cpus = sorted(c for s in self.cpus.values() for c in s)
            if len(cpus) < self.cap.total_cpus:
                return None  # part of the machine is outside this view
            home = min((k for k, s in self.cpus.items() if s), default=None)
        else:
            cands = [k for k in self.cpus if self.free_cpus(k) >= req.cpus]
            if not cands:
                return None
            # The roomiest node keeps most of the budget local.
            home = min(cands) if self.cap.pool else max(cands, key=lambda k: (self.mem[k], -k))
            cpus = self._pick(home, req.cpus)
        if home is None:
            return None
        gpus = self._gpus_for(req)
        if gpus is None:
            return None
        if self.cap.pool:
            if self.mem[POOL] < mem:
                return None
            charges = {home: mem}
        else:
            # Home node first, then the others in id order, until covered.
            charges, rest = {}, mem
            for k in [home] + sorted(k for k in self.mem if k != home):
                if rest <= 0 or (local_only and k != home):
                    break
                take = min(max(self.mem[k], 0), rest)
                if take:
                    charges[k] = take
                    rest -= take
            if rest > 0:
                return None
        return self._alloc(cpus, charges, gpus, True)

    # -- benchmark jobs -----------------------------------------------------------------
    def _is_free(self, cpu: int) -> bool:
        node = self._cpu_node.get(cpu)
        return node is not None and cpu in self.cpus[node]

    def bench_room(self, node: int, strict: bool) -> list[tuple[int, tuple[int, ...]]]:
        """Cores of ``node`` a benchmark job could run on now, as (CPU for its cpuset, threads it
        would hold): those whose every thread can be held first, then (not ``strict``) the rest."""
        clean: list[BenchCore] = []
        partial: list[BenchCore] = []
        for runner, core in self.cap.bench_cores.get(node, ()):
            if not self._is_free(runner):
                continue
            holdable = tuple(c for c in core if self._is_free(c))
            (clean if len(holdable) == len(core) else partial).append((runner, holdable))
        return clean if strict else clean + partial

    def bench_max(self, req: Request) -> int:
        """Most cores one node could give ``req`` (a benchmark request) now."""
        strict = req.benchmark == "strict"
        best = 0
        for node in self.cpus:
            room = self.bench_room(node, strict)
            if req.whole_l3 and strict:
                room = [rc for rc in room if self._quiet_llc_now(_llc(self.cap, rc[0]))]
            best = max(best, len(room))
        return best

    def _quiet_llc_now(self, llc: tuple[int, ...]) -> bool:
        """Every CPU of the cache is a free job CPU and none is a housekeeping one."""
        return all(self._is_free(c) for c in llc) and not self.cap.housekeeping.intersection(llc)

    def _bench_pick(self, node: int, n: int, strict: bool,
                    whole_l3: bool) -> tuple[list[int], list[tuple[int, ...]], list[int], int] | None:
        """(cpuset, held cores, L3 neighbours held, how many picks fell short) for ``n`` cores on
        ``node``, or None when they are not there now."""
        room = self.bench_room(node, strict)
        if len(room) < n:
            return None
        if not whole_l3:
            chosen = room[:n]
            short = sum(1 for r, held in chosen if len(held) < len(self.cap.cpu_topology.siblings(r)))
            return [r for r, _ in chosen], [h for _, h in chosen], [], short
        groups: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}
        for rc in room:
            groups.setdefault(_llc(self.cap, rc[0]), []).append(rc)
        quiet = {g: cores for g, cores in groups.items() if self._quiet_llc_now(g)}
        fewest = _fewest_groups(quiet, n)
        short = 0
        if fewest is not None:
            chosen = fewest
        elif strict:
            return None
        else:
            chosen, short = room[:n], 1   # no cache is free of others: hold what of them is free
        short += sum(1 for r, held in chosen if len(held) < len(self.cap.cpu_topology.siblings(r)))
        mine = {c for _, held in chosen for c in held}
        neighbours = {c for r, _ in chosen for c in _llc(self.cap, r)
                      if c not in mine and self._is_free(c) and c not in self.cap.housekeeping}
        return [r for r, _ in chosen], [h for _, h in chosen], sorted(neighbours), short

    def _fit_bench(self, req: Request, n: int, mem: int, local_only: bool) -> Allocation | None:
        """A benchmark job: ``n`` cores on one node, one thread of each in its cpuset, the rest held."""
        strict = req.benchmark == "strict"
        gpus = None if req.numa_local_gpu else self._gpus_for(req)
        if gpus is None and not req.numa_local_gpu:
            return None
        prefer = gputopo.gpu_node(self.cap.topology, gpus) if gpus and self.cap.topology else None
        best = None
        for node in sorted(self.cpus):
            pick = self._bench_pick(node, n, strict, req.whole_l3)
            if pick is None:
                continue
            node_gpus = self._gpus_for(req, node) if req.numa_local_gpu else gpus
            if node_gpus is None:
                continue
            charges = self._charge(node, mem, local_only)
            if charges is None:
                continue
            # Fewest shortfalls, then beside its GPUs, then best fit (keeps roomy nodes whole).
            key = (pick[3], node != prefer, len(self.bench_room(node, strict)), node)
            if best is None or key < best[0]:
                best = (key, pick, charges, node_gpus)
        if best is None:
            return None
        _, (cpus, cores, l3, _), charges, gpus = best
        return Allocation(cpus=tuple(sorted(cpus)), mem_by_node=tuple(sorted(charges.items())),
                          gpus=tuple(sorted(gpus)), exclusive=False,
                          cores=tuple(sorted(cores)), l3_idle=tuple(l3))

    def _bench_shape(self, a: Allocation) -> Allocation | None:
        """An exclusive allocation made a benchmark one: one thread of each core (none touching a
        housekeeping CPU) in the cpuset, every other CPU it took held idle."""
        took = set(a.held)
        runners = [r for cores in self.cap.bench_cores.values() for r, _ in cores if r in took]
        if not runners:
            return None
        groups = self.cap.cpu_topology.cores(took)
        return Allocation(cpus=tuple(sorted(runners)), mem_by_node=a.mem_by_node, gpus=a.gpus,
                          exclusive=True, cores=groups)

    def _alloc(self, cpus: list[int], charges: dict[int, int], gpus: tuple[int, ...], exclusive: bool) -> Allocation:
        return Allocation(
            cpus=tuple(cpus),
            mem_by_node=tuple(sorted(charges.items())),
            gpus=tuple(sorted(gpus)),
            exclusive=exclusive,
            cores=self.cap.cpu_topology.cores(cpus),
        )


def _fewest_groups(groups: dict[tuple[int, ...], list[BenchCore]], n: int) -> list[BenchCore] | None:
    """``n`` cores from as few caches as can hold them: the smallest one that holds all ``n``,
    else the roomiest first. None when together they hold fewer."""
    if sum(len(v) for v in groups.values()) < n:
        return None
    fits = [g for g, v in groups.items() if len(v) >= n]
    if fits:
        g = min(fits, key=lambda g: (len(groups[g]), g))
        return groups[g][:n]
    out: list[BenchCore] = []
    for g in sorted(groups, key=lambda g: (-len(groups[g]), g)):
        out += groups[g][: n - len(out)]
        if len(out) >= n:
            break
    return out


def allocate(
    req: Request,
    budget: Budget,
    machine: Machine,
    limits: Limits,
    running: Iterable[Allocation],
    numa_only: bool = False,
) -> Allocation | None:
    """Place ``req`` now, or return None when it does not fit at the moment.

    CPUs come from one node (best fit), memory is charged to that node and
    spread over the roomiest other nodes only when no single node can hold
    it (never with ``--numa-local`` or ``numa_only``). GPUs are the
    closest-wired free set (``gputopo.choose_gpus``), and the job's node is
    the one they hang off when it fits there. Exclusive jobs need an idle
    machine and block everything.
    """
    return Free.of(capacity(machine, limits), running).fit(req, budget, numa_only)

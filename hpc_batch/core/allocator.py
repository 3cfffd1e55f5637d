"""The allocator: which CPUs, memory and GPUs a job gets from what is free now.

Pure: no I/O and no clock. The daemon passes the machine, its limits and the
jobs that are running, and gets back either an ``Allocation`` or ``None``
("does not fit now"); ``Free`` is the free-resource bookkeeping the
scheduler keeps through a pass. Whether a request could ever fit is
``requestcheck``'s question; the unit of allocation, the reserves and the
memory pool are fixed by the model (``resources``).

Placement rules (from the spec):

* A job's CPUs always come from ONE NUMA node and its memory is charged to
  that node. A budget no single node can hold is spread over more nodes,
  never with ``--numa-local``. Housekeeping CPUs a job may have (with
  ``--reserve-cpu 0``) go last: the daemon and the shepherds run there.
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
from typing import Any

from . import gputopo
from .resources import Allocation, BenchCore, Budget, Capacity, Limits, Machine, Request, capacity, llc_cpus

# Key of the single machine-wide memory pool in Free.mem (per_node_memory off).
POOL = -1


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
        self._room: dict[int, list[tuple[int, ...]]] = {}   # node -> its whole free units (free_units order)

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
        """The units of ``node`` whose every CPU is free, lowest CPU first; those touching a
        housekeeping CPU last, so a job shares a CPU with the daemon and the shepherds only when
        nothing else is free (with --reserve-cpu 0: a reserved CPU is no job's anyway)."""
        room = self._room.get(node)
        if room is None:
            free = self.cpus.get(node, set())
            units = {self.cap.unit(c) for c in free}
            hk = self.cap.housekeeping
            room = sorted((u for u in units if free.issuperset(u)), key=lambda u: (not hk.isdisjoint(u), u))
            self._room[node] = room
        return room

    def free_cpus(self, node: int) -> int:
        """CPUs of ``node`` a job could be given now: those of its whole free units."""
        return sum(len(u) for u in self.free_units(node))

    def _needs_housekeeping(self, node: int, n: int) -> bool:
        """Whether ``n`` CPUs of ``node`` can only be had with a housekeeping CPU among them."""
        hk = self.cap.housekeeping
        return bool(hk) and sum(len(u) for u in self.free_units(node) if hk.isdisjoint(u)) < n

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
        # A node where the job fits beside the daemon's CPUs first; then best fit, which keeps the
        # emptiest nodes whole for wide jobs.
        if self.cap.pool:
            if self.mem[POOL] < mem:
                return None
            return {min(cands, key=lambda k: (self._needs_housekeeping(k, n), self.free_cpus(k), k)): mem}
        local = [k for k in cands if self.mem[k] >= mem]
        if local:
            return {min(local, key=lambda k: (self._needs_housekeeping(k, n), self.free_cpus(k), self.mem[k], k)): mem}
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
                room = [rc for rc in room if self._quiet_llc_now(llc_cpus(self.cap, rc[0]))]
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
            groups.setdefault(llc_cpus(self.cap, rc[0]), []).append(rc)
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
        hk, siblings = self.cap.housekeeping, self.cap.cpu_topology.siblings
        # Not a thread of a housekeeping core either: such a core is never a benchmark job's.
        neighbours = {c for r, _ in chosen for c in llc_cpus(self.cap, r)
                      if c not in mine and self._is_free(c) and hk.isdisjoint(siblings(c))}
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

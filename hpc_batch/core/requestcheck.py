"""Whether a job's resource request can ever fit the machine, and its memory budget.

Pure. Admission calls ``check_request`` at submit: a ``RequestError`` is the
refusal, its message the one line the user reads. The scheduler asks
``why_never_fits`` of a queued job that does not fit now, so one the
machine or the limits changed under (a restart with fewer CPUs, a larger
reserve) fails instead of waiting forever. Whether a request fits *now* is
the allocator's question, not this module's.
"""

from __future__ import annotations

from . import cputopo, gputopo
from .resources import Budget, Capacity, Limits, Machine, Request, capacity, default_share, llc_cpus
from .sizes import format_size


class RequestError(ValueError):
    """A request that can never fit; the message is one user-facing line."""


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


def _quiet_llc(cap: Capacity, llc: tuple[int, ...], offered: set[int]) -> bool:
    """A cache a strict --whole-l3 job may have: every CPU of it a job CPU, none a housekeeping one."""
    return offered.issuperset(llc) and not cap.housekeeping.intersection(llc)


def _l3_max(cap: Capacity) -> int:
    """Most cores on one node a strict --whole-l3 job could get: in caches whose every CPU is a job CPU."""
    offered = set(cap.units)
    best = 0
    for cores in cap.bench_cores.values():
        best = max(best, sum(1 for r, core in cores
                             if offered.issuperset(core) and _quiet_llc(cap, llc_cpus(cap, r), offered)))
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

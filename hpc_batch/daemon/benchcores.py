"""Benchmark mode's hold on the machine: the watch, the quiet cores and what is left to undo.

``BenchCores`` owns what the engine knew of ``--benchmark`` jobs beside their
records: the watch over the machine while a ``--benchmark=strict`` job waits
(swap, throttling), the admin's quiet-core settings, the CPUs each running
benchmark job holds with changes to undo, and the CPUs irqbalance was told to
keep interrupts off. It acts on the machine (daemon/benchmode/quiet.py) and returns
what a job's record is to keep; the engine writes the record. It never moves
a job's state.
"""

import logging
import os
from typing import Any

from .. import defaults
from ..core import benchmark, resources
from ..core.jobs import Job
from . import probe
from .benchmode import quiet

log = logging.getLogger("hpc-batchd")


class BenchCores:
    """The quiet-core state of the running benchmark jobs, and the watch over the machine."""

    def __init__(self, cfg, machine: resources.Machine, limits: resources.Limits, state_root: str):
        self.cfg = cfg
        self.machine = machine
        self.limits = limits
        # While any --benchmark=strict job is queued, the machine is watched (swap, throttling).
        self.watch = benchmark.Watch(defaults.BENCH_PROBE_INTERVAL)
        # Benchmark jobs' quiet cores (IRQs, frequency, partition): the admin's flags, and where
        # interrupts go when no housekeeping CPUs are named: the CPUs reserved for the OS.
        self.quiet = quiet.Settings(cpufreq=cfg.cpufreq, allow_turbo_off=cfg.allow_turbo_off,
                                    irqbalance_ban=cfg.irqbalance_ban,
                                    ledger=os.path.join(state_root, quiet.LEDGER),
                                    shepherds_root=cfg.cgroup_root if cfg.cgroups and not cfg.housekeeping else None)
        self.irq_banned: dict[int, set[int]] = {}   # job -> CPUs irqbalance was told to keep IRQs off
        self.held: dict[int, tuple[int, ...]] = {}   # running job with changes to undo -> CPUs it holds
        reserved = resources.capacity(machine, limits).reserved_cpus
        self.housekeeping_default = tuple(reserved) or tuple(
            sorted({c for n in machine.nodes for c in n.cpus}))

    def housekeeping(self) -> tuple[int, ...]:
        """The housekeeping CPUs: the admin's --housekeeping-cpus, else (also for ``none``) the reserve."""
        return self.cfg.housekeeping or self.housekeeping_default

    # -- the watch, while strict benchmark jobs wait ------------------------------
    def look(self, now: float) -> bool:
        """Read the machine if a reading is due; True when that changed whether it is quiet."""
        return now >= self.watch.due(now) and self.watch.feed(probe.read(now, probe.root()))

    def hold(self, now: float) -> str | None:
        """Why strict benchmark jobs wait now (None: the machine is quiet), reading it when due."""
        if now >= self.watch.due(now):
            self.watch.feed(probe.read(now, probe.root()))
        return self.watch.hold

    def forget(self) -> None:
        """No strict benchmark job waits: the next starts from fresh readings."""
        self.watch.forget()

    # -- a benchmark job's start and end -------------------------------------------
    def start_shortfalls(self, job: Job, alloc: resources.Allocation) -> list[str]:
        """How the machine falls short of a starting benchmark job (its record's ``shortfalls``)."""
        cap = resources.capacity(self.machine, self.limits)
        shortfalls = benchmark.shortfalls(job.request.resources, alloc, cap, self.cfg.cgroups)
        if self.watch.reasons:
            shortfalls += self.watch.reasons
        return shortfalls

    @staticmethod
    def start_counters(alloc: resources.Allocation, now: float) -> dict[str, Any]:
        """A starting benchmark job's counters, to compare at its end (its record's ``bench_start``)."""
        return probe.read(now, probe.root(), alloc.held).to_dict()

    def end_shortfalls(self, job: Job, bench_start: dict[str, Any] | None, now: float) -> list[str] | None:
        """A benchmark job's shortfalls with what its counters say happened while it ran added;
        *bench_start* is what :meth:`start_counters` read (None: nothing to compare, and None back)."""
        before = benchmark.Sample.from_dict(bench_start)
        if before is None or job.alloc is None:
            return None
        held = job.alloc.held
        return job.shortfalls + [f"while it ran, {why}" for why in
                                 benchmark.unquiet(before, probe.read(now, probe.root(), held), held)]

    def quiet_cores(self, job_id: int, jdir: str, alloc: resources.Allocation, cg: str | None,
                    running: int) -> dict[str, Any]:
        """Quiet a benchmark job's CPUs; returns what its record keeps as ``quiet`` (``error`` when
        it could not). *running* is how many jobs run now, this one among them."""
        hk = self.housekeeping()   # --housekeeping-cpus none: the reserve
        self.held[job_id] = alloc.held
        try:
            # Machine-wide turbo only for a job alone on the machine: nothing else starts beside it.
            alone = alloc.exclusive and running == 1
            busy = set().union(*(h for i, h in self.held.items() if i != job_id))
            done = quiet.begin(jdir, alloc.cpus, alloc.held, hk, self.quiet, alone,
                               cg if self.cfg.cgroups else None, busy)
            if self.quiet.irqbalance_ban:
                self.irq_banned[job_id] = set(alloc.held)
                done["irqbalance_ban"] = quiet.ban(self.quiet, set().union(*self.irq_banned.values()))
                done["irqbalance_banned"] = list(alloc.held)
        except Exception as exc:  # the machine's settings must never stop the daemon
            log.exception("job %d: cannot quiet its CPUs", job_id)
            done = {"error": str(exc)}
        moved = (done.get("irqs") or {}).get("moved") or []
        log.info("job %d: benchmark: %d IRQs moved to CPUs %s, %s", job_id, len(moved),
                 (done.get("irqs") or {}).get("to"), (done.get("cpufreq") or {}).get("turbo"))
        return done

    def unquiet(self, job_id: int, job_dir) -> dict[str, Any] | None:
        """Undo what :meth:`quiet_cores` changed (where still ours), whichever daemon started the
        job; returns what was undone for its record (None: there was nothing to undo).
        *job_dir* is the store's: a job's directory."""
        self.held.pop(job_id, None)
        others = [(job_dir(i), held) for i, held in self.held.items()]
        try:
            undone = quiet.end(job_dir(job_id), self.quiet, others)
            if self.irq_banned.pop(job_id, None) is not None:
                quiet.ban(self.quiet, set().union(*self.irq_banned.values()))
        except Exception as exc:
            log.exception("job %d: cannot undo its quiet cores", job_id)
            undone = {"restored": 0, "left": [str(exc)]}
        if undone is None:
            return None
        log.info("job %d: quiet cores undone: %d settings restored, %d handed to running benchmark jobs%s",
                 job_id, undone["restored"], undone.get("handed", 0),
                 f"; left alone: {'; '.join(undone['left'])}" if undone["left"] else "")
        return undone

    # -- a restart ------------------------------------------------------------------
    def readopt_held(self, job: Job, jdir: str) -> None:
        """At start-up, before any job is re-adopted: a running job with quiet-core changes to
        undo holds its CPUs again, so an end among them hands them over."""
        if job.alloc is not None and quiet.pending(jdir):
            try:
                self.held[job.id] = job.alloc.held
            except (KeyError, TypeError, ValueError):
                pass   # a record the daemon cannot re-adopt fails in recover, and its end undoes its changes

    def readopt(self, job: Job) -> None:
        """A re-adopted job's irqbalance ban, from its record."""
        if job.quiet and job.quiet.get("irqbalance_banned"):
            self.irq_banned[job.id] = set(job.quiet["irqbalance_banned"])

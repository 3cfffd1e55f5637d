"""What every figure module gets: the sizes of this run, its scratch directory, its daemons."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from .scratchd import ScratchDaemon


@dataclass(frozen=True)
class Plan:
    """How big and how often: one full preset, one smoke preset, flags override fields."""

    runs: int             # interleaved samples of each client figure (new, list, latency, queue)
    wait_runs: int        # jobs timed for dispatch wait
    drain_jobs: int       # jobs in each drain
    drain_runs: int       # drains of each kind
    submit_refs: int      # single submits timed before each loop drain (its 1 / latency)
    shepherd_rounds: int  # rounds of silent jobs whose shepherds are measured
    window: float         # seconds over which wakeups are counted
    queue_list: int       # queued jobs behind `dispatch list`
    queue_new: int        # queued jobs behind `dispatch new`
    out_bytes: int        # bytes the output job writes
    out_runs: int         # runs of each output job
    restart_jobs: int     # jobs the restarted daemon holds
    restart_runs: int     # restarts of each kind
    release_jobs: int     # dependents released at once (the loop's worst stall)
    release_runs: int     # releases, each on a fresh daemon
    release_base: float   # seconds of the ping loop with nothing released
    history_rows: int     # rows in the history archive the queries look through
    history_runs: int     # rounds of queries (each kind once a round)
    bulk_jobs: int        # jobs of the bulk submit others are answered beside
    bulk_runs: int        # such submits


FULL = Plan(runs=15, wait_runs=10, drain_jobs=900, drain_runs=3, submit_refs=5, shepherd_rounds=3, window=5.0,
            queue_list=5000, queue_new=10_000, out_bytes=1 << 30, out_runs=10, restart_jobs=100, restart_runs=3,
            release_jobs=10_000, release_runs=3, release_base=2.0, history_rows=1_000_000, history_runs=5,
            bulk_jobs=100_000, bulk_runs=3)
SMOKE = Plan(runs=3, wait_runs=2, drain_jobs=12, drain_runs=2, submit_refs=2, shepherd_rounds=1, window=1.0,
             queue_list=20, queue_new=40, out_bytes=8 << 20, out_runs=2, restart_jobs=6, restart_runs=2,
             release_jobs=20, release_runs=1, release_base=0.2, history_rows=20_000, history_runs=1,
             bulk_jobs=1000, bulk_runs=1)


@dataclass
class Context:
    """One run: its plan, its scratch directory, the daemons to stop, and notes for the report."""

    plan: Plan
    scratch: str
    install: bool                       # may apt-get install task-spooler
    notes: list[str] = field(default_factory=list)
    daemons: list[ScratchDaemon] = field(default_factory=list)

    def say(self, message: str) -> None:
        """Progress, on stderr."""
        print(f"bench: {message}", file=sys.stderr, flush=True)

    def daemon(self, name: str, cpus: set[int] | None = None, args: tuple[str, ...] = ()) -> ScratchDaemon:
        """A started scratch daemon in ``<scratch>/<name>``, stopped by :meth:`stop_all`."""
        d = ScratchDaemon(os.path.join(self.scratch, name), cpus, args)
        self.daemons.append(d)
        return d.start()

    def stop_all(self) -> None:
        for d in self.daemons:
            d.stop()
        self.daemons.clear()

"""``hpc-batchd --metrics-file PATH``: keep a Prometheus text file current.

node_exporter's textfile collector reads every ``*.prom`` file in its
directory at each scrape, so the file is replaced whole (a temporary file in
the same directory, then a rename) and is never seen half written. It is
rewritten when what it says changes, at most once a second however busy the
queue is, from the event loop's timer: a burst of submits costs one write.
The write is a few kilobytes with no fsync (a file lost in a power cut is
rewritten at the next start), so it never holds up the loop; one that fails
(full disk, a directory gone) keeps the old file, is logged at most once per
interval and is retried.

This module needs only the standard library: ``prometheus_client`` is
imported (through ``metrics``) only once ``--metrics-file`` is given, and
its absence is a refusal to start.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from shepherd import records

from . import __version__
from .ratelog import RateLimited

if TYPE_CHECKING:   # at run time only once --metrics-file is given
    from .engine import Engine
    from .metrics import Snapshot, Tally

log = logging.getLogger("hpc-batchd")
rlog = RateLimited(log)

SUFFIX = ".prom"            # node_exporter's textfile collector reads only these
INTERVAL = 1.0              # seconds between two writes at the most
RETRY = 10.0                # seconds before a failed write is tried again
CARRY_ENV = "HPC_BATCH_METRICS_TALLY"   # the counters, handed across a reload's re-exec
EXTRA = "hpc-batch[metrics]"


class MetricsError(Exception):
    """Why --metrics-file cannot be used, in one line."""


def check(path: str) -> str:
    """The absolute metrics path, or MetricsError: a bad path, or prometheus_client missing."""
    full = os.path.abspath(path)
    directory, name = os.path.split(full)
    where = f"--metrics-file {path}"
    if not name.endswith(SUFFIX) or name == SUFFIX:
        raise MetricsError(f"{where}: the name must end in {SUFFIX} (node_exporter's textfile collector "
                           f"reads only those)")
    if not os.path.isdir(directory):
        raise MetricsError(f"{where}: the directory {directory} does not exist; create it (it is "
                           f"node_exporter's --collector.textfile.directory)")
    if os.path.isdir(full):
        raise MetricsError(f"{where}: that is a directory; name a file in it")
    if not os.access(directory, os.W_OK):
        raise MetricsError(f"{where}: cannot write to {directory}")
    try:
        from . import metrics  # noqa: F401  (prometheus_client, the optional extra)
    except ImportError as exc:
        raise MetricsError(f"{where} needs the prometheus_client package ({exc}); install it with "
                           f"`{sys.executable} -m pip install '{EXTRA}'`") from None
    return full


def write_atomic(path: str, data: bytes) -> None:
    """Replace *path* with *data* in one rename (0644, whatever the umask: node_exporter reads it
    as its own user); raises OSError and leaves the old file on failure."""
    directory, name = os.path.split(path)
    # Not *.prom, so the collector never reads it; the pid keeps two daemons apart.
    records.write_atomic(path, data, 0o644, durable=False, exclusive=True,
                         tmp=os.path.join(directory, f".{name}.{os.getpid()}.tmp"))


class MetricsFile:
    """The metrics file of one daemon: counts the engine's job events, rewrites the file on change."""

    def __init__(self, path: str, engine: Engine, carried: str = ""):
        self.path = path
        self.engine = engine
        self.tally = self._tally(carried)
        log.info("metrics: keeping %s current (counters since %s)", path,
                 time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.tally.start_time)))
        self.written: Snapshot | None = None   # what the file says now
        self.not_before = 0.0           # no write before this (time.time())

    @staticmethod
    def _tally(carried: str) -> Tally:
        from .metrics import Tally
        if carried:
            try:
                return Tally.from_text(carried)
            except ValueError as exc:
                log.warning("metrics: the counters handed over by the last daemon are unusable (%s); "
                            "counting from zero", exc)
        return Tally(start_time=time.time())

    def job_event(self, job_id: int, kind: str) -> None:
        """The engine's job event (submitted, started, finished): count it."""
        job = self.engine.jobs.get(job_id)
        self.tally.note(kind, (job.result or {}).get("kind") if job is not None else None)

    def snapshot(self) -> Snapshot:
        """The engine's state now, as metrics.take sees it."""
        from .metrics import take
        eng = self.engine
        return take(eng.jobs.values(), eng.machine, eng.limits, [r["alloc"] for r in eng.running.values()],
                    self.tally, __version__)

    def tick(self, now: float) -> float | None:
        """Write the file if what it says changed; returns when to look again (None: at the next event).

        Called on every turn of the event loop; never raises. The state is
        looked at (and the file written) at most once per INTERVAL.
        """
        if self.not_before - now > RETRY:
            self.not_before = now          # the clock went back: do not stall until it catches up
        if now < self.not_before:
            return self.not_before         # looked (or failed) a moment ago: look again then
        try:
            snap = self.snapshot()
            if snap == self.written:
                # Looked at most once an interval too: a flood of requests that change nothing costs no more.
                self.not_before = now + INTERVAL
                return None
            from .metrics import render
            write_atomic(self.path, render(snap))
        except OSError as exc:
            rlog.error("metrics-write", "cannot write the metrics file %s (%s); keeping the old one, "
                       "retrying every %ds", self.path, exc.strerror or exc, RETRY)
            self.not_before = now + RETRY
            return self.not_before
        except Exception:   # a bug in the metrics must not take the daemon down
            rlog.exception("metrics-error", "cannot build the metrics for %s", self.path)
            self.not_before = now + RETRY
            return self.not_before
        self.written = snap
        self.not_before = now + INTERVAL
        return None

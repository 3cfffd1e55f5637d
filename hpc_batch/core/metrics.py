"""What ``--metrics-file`` says, as Prometheus metrics (pure: state in, registry out).

:func:`take` turns the daemon's in-memory state into a :class:`Snapshot`
(plain, comparable data: the writer rewrites the file only when it changes),
and :func:`registry` turns a Snapshot into a ``prometheus_client`` registry,
which :func:`render` writes in the text format node_exporter's textfile
collector reads. Only the daemon imports this module, and only when
``--metrics-file`` is given: ``prometheus_client`` is an optional extra.

The counters (:class:`Tally`) count since the daemon started; a reload
re-execs the same process and carries them across (``to_text`` /
``from_text``), so they reset only when the daemon really restarts, which
PromQL's ``rate()`` and ``increase()`` take in their stride. Totals over all
time are the history files' job (``history/<user>.jsonl``), not these counters'.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from . import report
from .jobs import QUEUED, RESULTS, RUNNING, WAITING, Job
from .resources import Allocation, Limits, Machine

PREFIX = "hpc_batch_"
UNKNOWN_NODE = "unknown"    # the node label of GPUs whose NUMA node is not known

# The per-user job gauges, in Snapshot.jobs column order: (state, metric suffix, help).
JOB_GAUGES = (
    (WAITING, "jobs_waiting", "Jobs held by --after/--after-ok, per user."),
    (QUEUED, "jobs_queued", "Jobs in the queue, per user."),
    (RUNNING, "jobs_running", "Jobs running, per user."),
)

# Per-node resources: (key in report.status's node dict, quad field, metric suffix, help).
NODE_GAUGES = (
    ("cpus", "total", "cpus", "CPUs on the NUMA node."),
    ("cpus", "reserved", "cpus_reserved", "CPUs held back for the OS (--reserve-cpu)."),
    ("cpus", "in_use", "cpus_in_use", "CPUs given to running jobs."),
    ("mem", "total", "memory_bytes", "Memory on the NUMA node."),
    ("mem", "reserved", "memory_reserved_bytes", "Memory held back for the OS (--reserve-mem)."),
    ("mem", "in_use", "memory_in_use_bytes", "Memory budgeted to running jobs."),
    ("gpus", "total", "gpus", "GPUs attached to the NUMA node."),
    ("gpus", "in_use", "gpus_in_use", "GPUs given to running jobs."),
)


@dataclass
class Tally:
    """Jobs submitted, started and finished (by result) since the daemon started."""

    start_time: float
    submitted: int = 0
    started: int = 0
    finished: dict[str, int] = field(default_factory=dict)

    def note(self, event: str, result: str | None = None) -> None:
        """Count one engine event: ``submitted``, ``started`` or ``finished`` (with its result kind)."""
        if event == "submitted":
            self.submitted += 1
        elif event == "started":
            self.started += 1
        elif event == "finished" and result in RESULTS:
            self.finished[result] = self.finished.get(result, 0) + 1

    def to_text(self) -> str:
        """The tally as one line of JSON, for the next daemon of a reload."""
        return json.dumps({"start_time": self.start_time, "submitted": self.submitted, "started": self.started,
                           "finished": self.finished}, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> Tally:
        """Inverse of ``to_text``; ValueError names what is wrong with *text*."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        start = data.get("start_time")
        if not isinstance(start, (int, float)) or isinstance(start, bool) or not 0 <= start < 1 << 40:
            raise ValueError("start_time must be a time")
        counts = [data.get("submitted"), data.get("started")]
        finished = data.get("finished")
        if not isinstance(finished, dict) or not set(finished) <= set(RESULTS):
            raise ValueError("finished must map result kinds to counts")
        counts += finished.values()
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 53 for n in counts):
            raise ValueError("counts must be whole numbers")
        return cls(float(start), data["submitted"], data["started"], dict(finished))


@dataclass(frozen=True)
class Snapshot:
    """Everything the metrics file says, as plain data (equal snapshots, equal files)."""

    version: str
    start_time: float
    jobs: tuple[tuple[str, tuple[int, ...]], ...]        # (user, counts in JOB_GAUGES order), by user
    submitted: int
    started: int
    finished: tuple[tuple[str, int], ...]                # (result kind, count) for every kind
    nodes: tuple[tuple[str, str, str, int], ...]         # (node, resource, quad field, value)


def take(jobs: Iterable[Job], machine: Machine, limits: Limits, running: Sequence[Allocation], tally: Tally,
         version: str) -> Snapshot:
    """The Snapshot of a daemon whose job table is *jobs* and whose running jobs hold *running*.

    Every user with a job the daemon remembers (finished ones too) gets a
    row, zeros included, so a user's series do not come and go as their jobs
    do.
    """
    states = [state for state, _, _ in JOB_GAUGES]
    per_user: dict[str, list[int]] = {}
    for job in jobs:
        row = per_user.setdefault(job.user, [0] * len(states))
        if job.state in states:
            row[states.index(job.state)] += 1
    # The per-node figures are the ones `dispatch status` shows: one accounting for both.
    status = report.status(machine, limits, running, "", 0, 0, None)
    nodes = []
    for n in status["nodes"]:
        for key, part, _, _ in NODE_GAUGES:
            nodes.append((str(n["id"]), key, part, int(n[key][part])))
    unplaced = status["gpus_without_node"]
    if unplaced["total"]:
        nodes += [(UNKNOWN_NODE, "gpus", part, int(unplaced[part])) for part in ("total", "in_use")]
    return Snapshot(
        version=version, start_time=tally.start_time,
        jobs=tuple((user, tuple(row)) for user, row in sorted(per_user.items())),
        submitted=tally.submitted, started=tally.started,
        finished=tuple((kind, tally.finished.get(kind, 0)) for kind in RESULTS),
        nodes=tuple(nodes))


class _Families:
    """A collector that hands out a fixed list of metric families."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families

    def describe(self) -> list[Metric]:
        return self.families


def families(snap: Snapshot) -> list[Metric]:
    """The metric families of *snap*, every one named ``hpc_batch_*``."""
    out: list[Metric] = []
    for column, (_, suffix, text) in enumerate(JOB_GAUGES):
        gauge = GaugeMetricFamily(PREFIX + suffix, text, labels=["user"])
        for user, counts in snap.jobs:
            gauge.add_metric([user], counts[column])
        out.append(gauge)
    out.append(CounterMetricFamily(PREFIX + "jobs_submitted", "Jobs accepted since the daemon started.",
                                   value=snap.submitted))
    out.append(CounterMetricFamily(PREFIX + "jobs_started", "Jobs started since the daemon started.",
                                   value=snap.started))
    finished = CounterMetricFamily(PREFIX + "jobs_finished", "Jobs that ended since the daemon started, "
                                   "by how they ended (the result list --finished shows).", labels=["result"])
    for kind, count in snap.finished:
        finished.add_metric([kind], count)
    out.append(finished)
    for key, part, suffix, text in NODE_GAUGES:
        gauge = GaugeMetricFamily(PREFIX + suffix, text, labels=["node"])
        for node, k, p, value in snap.nodes:
            if (k, p) == (key, part):
                gauge.add_metric([node], value)
        out.append(gauge)
    out.append(GaugeMetricFamily(PREFIX + "daemon_start_time_seconds",
                                 "When the daemon started (Unix time); a reload keeps it, with the counters.",
                                 value=snap.start_time))
    out.append(InfoMetricFamily(PREFIX + "daemon", "The daemon's version.", value={"version": snap.version}))
    return out


def registry(snap: Snapshot) -> CollectorRegistry:
    """A registry holding *snap*'s metrics and nothing else (no process or platform collectors)."""
    reg = CollectorRegistry()
    reg.register(_Families(families(snap)))
    return reg


def render(snap: Snapshot) -> bytes:
    """*snap* in the Prometheus text format."""
    return generate_latest(registry(snap))

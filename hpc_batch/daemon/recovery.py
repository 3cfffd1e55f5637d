"""Start-up: the state directory read back, and the jobs it says are running re-adopted.

``load`` puts the stored jobs into the job table (and the queued ones'
/dev entries) and says where the ids go on; ``readopt`` finds each running
job's shepherd again (its pidfile, checked against its start time), or its
end, or looks again shortly (``recheck``, from the engine's tick) when its
shepherd may be starting right now. These are functions over the parts
they use, given as ``Parts``: among them the rooms that end a job
(``ending.py``), put it back in the queue (``starting.py``) and tell its
shepherd its deadline (``deadlines.py``), so nothing here holds the engine.
"""

import os
import time
from dataclasses import dataclass
from typing import Any

from shepherd.base import records

from .. import defaults
from ..core.jobs import LOST, QUEUED, WAITING, Job
from ..core.jobtable import JobTable, Running
from . import devdir
from . import engineparts as parts
from .benchcores import BenchCores
from .deadlines import Deadlines
from .ending import Ending
from .starting import Starting


@dataclass
class Parts:
    """What recovery reads and acts on."""

    cfg: Any
    store: parts.Store
    table: JobTable
    launcher: parts.Launcher
    cgroups: parts.Cgroups
    hooks: parts.Hooks
    bench: BenchCores
    # For a running job it does not simply re-adopt: its end, its way back to the queue, its deadline.
    ending: Ending
    starting: Starting
    deadlines: Deadlines


@dataclass
class Loaded:
    """What ``load`` read: the jobs, notes for the log, and the engine's counters."""

    jobs: list[Job]
    notes: list[str]
    policy_state: dict
    saved_floor: int      # the next_id daemon.json holds: ids below it are never reused
    next_id: int


def load(store: parts.Store, table: JobTable, dev: devdir.DevDir) -> Loaded:
    """Load the state dir into *table* (queued and waiting jobs get their /dev entries)."""
    meta = store.load_meta()
    jobs = store.load_jobs()
    saved_floor = int(meta.get("next_id", 1))
    top = max([j.id for j in jobs] + [store.highest_quarantined_id()])
    notes = list(store.notes)
    for job in jobs:
        table.add(job)
        if job.state in (QUEUED, WAITING):
            dev.add(job.id, job.uid, store.job_dir(job.id))
    return Loaded(jobs, notes, meta.get("policy_state", {}) or {}, saved_floor, max(saved_floor, top + 1))


def readopt(p: Parts, job: Job) -> str:
    """Re-adopt a job the state directory says is running: its shepherd, its end, or a second look."""
    jdir = p.store.job_dir(job.id)
    assert job.alloc is not None  # Job.check: a running job has its allocation
    alloc = job.alloc
    found = p.launcher.adopt(jdir)
    cg = p.cgroups.job_path(p.cfg.cgroup_root, job.id) if p.cfg.cgroups else None
    if found:
        pid, fd = found
        p.table.attach(job, Running(alloc, cgroup=cg, pid=pid, pidfd=fd))
        p.hooks.watch_pidfd(fd, job.id)
        p.bench.readopt(job)
        # A change of max time the last daemon could not pass on before it died.
        p.deadlines.send(job, time.time())
        return f"job {job.id}: re-adopted shepherd pid {pid}"
    running = Running(alloc, cgroup=cg)
    p.table.attach(job, running)
    if os.path.exists(os.path.join(jdir, records.EXIT)):
        p.ending.collect(job.id)
        return f"job {job.id}: ended while the daemon was down; collected its exit record"
    if records.read_pidfile(jdir) is None:
        if os.path.exists(os.path.join(jdir, records.LAUNCH)):
            # Its launch spec is unread: either the shepherd never started, or it
            # is starting right now. Look again shortly before deciding, so a
            # second shepherd is never started beside a first.
            running.recheck_at = time.time() + defaults.SHEPHERD_START_GRACE
            return f"job {job.id}: its shepherd has not started yet; checking again shortly"
        if p.store.keeps_env(job) and not p.launcher.shepherd_alive(jdir):
            # Only a crash of the machine takes a spec the start's commit followed (it is not
            # flushed); no durable pidfile says its command never ran.
            p.starting.not_now(job, cg, "its launch spec did not survive a crash of the machine, "
                               "and its command never ran (its shepherd's pidfile was never written)",
                               time.time())
            return f"job {job.id}: its start did not survive a crash of the machine; queued again"
    return lost(p, job, p.launcher.vanished(jdir))


def recheck(p: Parts, job_id: int) -> None:
    """Second look at a running job whose shepherd had not started at recovery."""
    job = p.table.jobs[job_id]
    jdir = p.store.job_dir(job_id)
    running = p.table.running[job_id]
    running.recheck_at = None
    found = p.launcher.adopt(jdir)
    if found:
        running.pid, running.pidfd = found
        p.hooks.watch_pidfd(found[1], job_id)
    elif os.path.exists(os.path.join(jdir, records.EXIT)):
        p.ending.collect(job_id)
    elif p.launcher.shepherd_alive(jdir):   # its lock taken, its pidfile not written yet: look again
        running.recheck_at = time.time() + defaults.START_RETRY
    elif records.read_pidfile(jdir) is None and os.path.exists(launch := os.path.join(jdir, records.LAUNCH)):
        if records.read_record(launch, records.LaunchSpec) is None and not p.store.keeps_env(job):
            # Cut short by a crash of the machine, and started by an older daemon, which let the
            # stored environment go at the start: nothing is left to start it with.
            lost(p, job, f"its launch spec {launch} did not survive a crash of the machine before "
                         f"its shepherd read it; it is not known to have started")
            return
        # The command cannot have run (the pidfile is durable before it may): it starts afresh
        # from the queue, as after a fork that failed, since after a reboot the spec's cgroup and
        # quieted cores are gone.
        p.starting.not_now(job, running.cgroup, "its shepherd had not started when the last daemon stopped",
                       time.time())
    else:
        lost(p, job, p.launcher.vanished(jdir))


def lost(p: Parts, job: Job, why: str) -> str:
    """End a running job whose shepherd is gone as ``lost``; the note for the log."""
    p.ending.collect(job.id, shepherd_gone=why, kind=LOST)
    return f"job {job.id}: {why}"

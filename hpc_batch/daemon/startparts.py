"""The side parts of a job's start (and of its undoing) that need no engine.

The engine's start chain (``Engine._start``, ``_spawn``, ``_not_now``,
``_requeue``) and the ending (``ending.py``) move the job's state and decide what
comes next; this room does the parts around it that act only on what they
are given: the job's environment and launch spec (with the reproducibility
record's spec), quieting a benchmark job's cores and undoing it, dropping a
job's cgroup (and retrying the busy ones from the tick), and watching a
shepherd's pidfd. Like the engine's other rooms it holds no reference to
the engine: what it acts on is given to it, and the one thing of the
engine's it needs, collecting a job whose shepherd is already gone, as a
callable.
"""

import shutil
from collections.abc import Callable

from shepherd.base import records

from ..core.jobs import Job
from ..core.jobtable import JobTable
from . import engineparts as parts
from . import jobrecord, launchspec, probe
from .benchcores import BenchCores
from .turn import Turn


class StartParts:
    """A start's launch spec, quiet cores, cgroup and pidfd, done for the engine."""

    def __init__(self, cfg, store: parts.Store, machine, table: JobTable, turn: Turn, bench: BenchCores,
                 launcher: parts.Launcher, cgroups: parts.Cgroups, passwd: parts.Passwd, hooks: parts.Hooks,
                 collect: Callable[[int], None]):
        self.cfg = cfg
        self.store = store
        self.machine = machine
        self.table = table
        self.turn = turn
        self.bench = bench
        self.launcher = launcher
        self.cgroups = cgroups
        self.passwd = passwd
        self.hooks = hooks
        self.collect = collect              # the engine's: a job whose shepherd is already gone ends now
        self.stale_cgroups: set[str] = set()  # job cgroups still busy when their job ended
        # The GPU query of a job's record runs the nvidia-smi the daemon found (its PATH, not a user's).
        self.nvidia_smi = shutil.which("nvidia-smi") if machine.gpus else None

    def job_env(self, job: Job) -> dict:
        """The job's environment (launchspec.environment), from its stored one and its user's passwd entry."""
        stored = self.store.load_env(job)   # {} (a clean environment) when it cannot be read
        try:
            pw = self.passwd.getpwuid(job.uid)
            home, shell = pw.pw_dir, pw.pw_shell or "/bin/sh"
        except KeyError:
            home, shell = "/", "/bin/sh"
        return launchspec.environment(job, stored, home, shell, self.cfg.mask_gpus, self.machine.gpu_uuids)

    def quiet(self, job: Job, jdir: str, cg) -> None:
        """Quiet a benchmark job's CPUs (its record is durable as running, so any later daemon
        undoes this when the job ends). A shortfall is recorded, never a reason not to run."""
        job.quiet = self.bench.quiet_cores(job.id, jdir, self.table.running[job.id].alloc, cg,
                                           len(self.table.running))
        try:
            # The cache only: no journal commit (an fdatasync) more per start. What must be undone
            # is in quiet.json; this is what `show` reports, and the job's next durable save keeps it.
            self.store.save_job(job, durable=False)
        except OSError:
            self.turn.unsaved.add(job.id)

    def unquiet(self, job: Job) -> None:
        """Undo what :meth:`quiet` changed (BenchCores.unquiet); the record keeps what was undone."""
        undone = self.bench.unquiet(job.id, self.store.job_dir)
        if undone is not None and job.quiet is not None:
            job.quiet["undone"] = undone

    def launch_spec(self, job: Job, alloc, cg) -> records.LaunchSpec:
        """What the shepherd needs (launchspec.build), with what only the daemon can read."""
        return launchspec.build(
            job, alloc, self.job_env(job), cgroup=cg,
            shepherd_cgroup=self.cgroups.shepherds_path(self.cfg.cgroup_root) if self.cfg.cgroups else None,
            use_cgroups=self.cfg.cgroups, admin_gid=self.cfg.admin_gid, max_output_buffer=self.cfg.max_output_buffer,
            record=self.record_spec(job, alloc) if self.cfg.records == "all" else None)

    def record_spec(self, job: Job, alloc) -> dict:
        """What the shepherd needs from the daemon for the job's reproducibility record."""
        return jobrecord.spec(
            job, alloc, self.machine, {i: r.alloc for i, r in self.table.running.items()},
            housekeeping=self.bench.housekeeping(),
            thresholds=self.cfg.record_thresholds, nvidia_smi=self.nvidia_smi, root=probe.root(),
            cgroups=self.cfg.cgroups, cpu_unit=self.cfg.cpu_unit)

    def drop_cgroup(self, cg) -> None:
        """Kill and remove a job's cgroup without waiting; a busy one is retried from the tick."""
        if cg and not self.cgroups.discard(cg):
            self.stale_cgroups.add(cg)

    def retry_stale_cgroups(self) -> bool:
        """The tick's retry of the busy cgroups :meth:`drop_cgroup` left; True while some are left."""
        self.stale_cgroups = {cg for cg in self.stale_cgroups if not self.cgroups.discard(cg)}
        return bool(self.stale_cgroups)

    def watch(self, job_id: int, pid: int, start: int | None = None) -> None:
        # A forked shepherd is not our child: its start time guards the pid against reuse.
        fd = self.launcher.open_pidfd(pid, start)
        running = self.table.running[job_id]
        running.pid, running.pidfd = pid, fd
        if fd is None:  # already gone and reaped: collect at once
            self.collect(job_id)
        else:
            self.hooks.watch_pidfd(fd, job_id)

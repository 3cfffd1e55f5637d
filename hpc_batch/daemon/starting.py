"""A job's start: its cgroup and launch spec, the record that says running, the spawn.

Flux's start.c, for this daemon. :meth:`Starting.start` is the scheduler's
decision carried out for one job, in the order a crash needs: the launch
spec (the environment: flushed when it is a forwarded one, which the
store lets go of at the start), then the record that says running; the
spawn (:meth:`Starting.spawn`) waits for the turn's commit. In a turn that
answers submits, those writes wait for the commit that answers them and
ride one of their own (:meth:`Starting.write_put_off`). A start that
cannot be written goes back to the queue when the disk is full
(``_requeue``), and one whose shepherd could not fork its command (out of
pids or memory) goes back with its environment (:meth:`Starting.not_now`).
Around that chain are the parts that act only on what they are given: the
job's environment and launch spec (with the reproducibility record's
spec), quieting a benchmark job's cores and undoing it, dropping a job's
cgroup (and retrying the busy ones from the tick), and watching a
shepherd's pidfd. Like the engine's other rooms it holds no reference to
the engine: the three things of the engine's it needs (a state move, a
job's end, and collecting a job whose shepherd is already gone) are given
as callables.
"""

import logging
import os
import shutil
from collections.abc import Callable

from shepherd.base import records

from .. import defaults
from ..core import views
from ..core.jobs import ERROR, QUEUED, RUNNING, Job, Result
from ..core.jobtable import JobTable, Running
from . import cgroups, devdir, jobrecord, launchspec, probe
from . import engineparts as parts
from .benchcores import BenchCores
from .store import is_disk_full
from .turn import Turn

log = logging.getLogger("hpc-batchd")


class Starting:
    """The start of the daemon's jobs, from the scheduler's decision to a watched shepherd."""

    def __init__(self, cfg, store: parts.Store, machine, table: JobTable, turn: Turn, bench: BenchCores,
                 launcher: parts.Launcher, cgroups: parts.Cgroups, passwd: parts.Passwd, hooks: parts.Hooks,
                 *, move: Callable[..., object], finish: Callable[[Job, Result, float], None],
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
        self.move = move                    # the engine's: the table's move, then what a queue change means
        self.finish = finish                # ending.py's: a job that cannot start ends as an error
        self.collect = collect              # ending.py's: a job whose shepherd is already gone ends now
        self.stale_cgroups: set[str] = set()  # job cgroups still busy when their job ended
        # The GPU query of a job's record runs the nvidia-smi the daemon found (its PATH, not a user's).
        self.nvidia_smi = shutil.which("nvidia-smi") if machine.gpus else None

    def start(self, job: Job, alloc, now: float) -> None:
        """Carry out the scheduler's decision to start *job* on *alloc*: it is running from now on.

        Its writes (:meth:`write`) follow at once, unless submits of this turn
        wait for its commit to be answered: then they wait for that commit
        (:meth:`write_put_off`), so that a submit is not answered later for
        the fsyncs of a launch spec, its own job's included.
        """
        running = Running(alloc)
        self.move(job, RUNNING, now, running=running)
        if job.request.benchmark:
            # How the machine fell short of it, and its counters to compare at the end.
            job.shortfalls = self.bench.start_shortfalls(job, alloc)
            job.bench_start = self.bench.start_counters(alloc, now)
        if self.turn.submitted:
            self.turn.to_write.append(job)
            return
        self.write(job, running, now)

    def show_put_off(self) -> None:
        """The /dev entries of the starts :meth:`start` put off say they run, before the answers
        that say so go out (a withdrawn job is skipped); their spawn then leaves info.json be."""
        for job in self.turn.to_write:
            if job.id in self.table.running and job.state == RUNNING and self.show(job):
                self.turn.shown.add(job.id)

    def write_put_off(self, now: float) -> None:
        """Write the starts :meth:`start` put off, once the commit that answers the submits is done.

        One withdrawn meanwhile (a submit that commit refused) or gone back
        to the queue is skipped.
        """
        todo, self.turn.to_write = self.turn.to_write, []
        for job in todo:
            running = self.table.running.get(job.id)
            if running is not None and job.state == RUNNING and running.pid is None:
                self.write(job, running, now)

    def write(self, job: Job, running: Running, now: float) -> None:
        """A start's cgroup, launch spec and record; its spawn waits for the commit that holds them.

        Order matters for crash safety: the launch spec first, then the record
        that says "running", then the spawn, which waits for the commit. A
        crash in between leaves either a queued job or a launch spec the next
        daemon can start; a power cut, a start whose command never ran (no
        durable pidfile), queued again from its flushed spec (a forwarded
        environment) or from the clean environment the store keeps.
        """
        jdir = self.store.job_dir(job.id)
        alloc = running.alloc
        cg = None
        try:
            if self.cfg.cgroups:
                minors = (tuple(self.machine.gpu_minors[g] for g in alloc.gpus)
                          if self.cfg.mask_gpus else None)
                cg = self.cgroups.create_job(self.cfg.cgroup_root, job.id, alloc.cpus, alloc.mems, alloc.mem,
                                        self.cfg.max_pids, minors)
                running.cgroup = cg
            self.launcher.write_launch(jdir, self.launch_spec(job, alloc, cg), durable=not self.store.keeps_env(job))
        except OSError as exc:
            self._requeue(job, cg, exc, now)
            return
        except cgroups.CgroupError as exc:
            log.error("job %d cannot start: %s", job.id, exc)
            self.finish(job, Result(ERROR, note=str(exc)), now)
            return
        try:
            self.store.save_job(job)
        except OSError as exc:
            self._requeue(job, cg, exc, now)
            return
        self.turn.to_spawn.append((job, cg))

    def spawn(self, job: Job, cg, now: float, before=None) -> None:
        jdir = self.store.job_dir(job.id)
        if job.request.benchmark:
            self.quiet(job, jdir, cg)

        def info() -> None:   # needs no pid: done while the fork server forks
            if before is not None:
                before()
            if job.id not in self.turn.shown:   # else written before the answers (show_put_off), as it is now
                self.show(job)

        try:
            pid, start = self.launcher.spawn(job.id, job.user, jdir, info)
        except OSError as exc:
            if before is not None:
                before()   # the replies go before any end this makes: their causes are committed
            if records.not_now(exc):   # out of pids or memory: no shepherd, so the command never ran
                self.not_now(job, cg, f"cannot start its shepherd yet ({exc.strerror or exc})", now)
                return
            log.error("job %d cannot start: %s", job.id, exc)
            self.drop_cgroup(cg)
            self.finish(job, Result(ERROR, note=f"cannot start its shepherd: {exc}"), now)
            return
        self.watch(job.id, pid, start)
        alloc = self.table.running[job.id].alloc
        log.info("job %d started: cpus %s, mem %d, gpus %s", job.id, list(alloc.cpus), alloc.mem, list(alloc.gpus))
        self.hooks.job_event(job.id, "started")

    def _requeue(self, job: Job, cg, exc: OSError, now: float) -> None:
        """A start that could not be written: with a full disk back to the queue, retried soon."""
        self.drop_cgroup(cg)
        if not is_disk_full(exc):
            log.error("job %d cannot start: %s", job.id, exc)
            self.finish(job, Result(ERROR, note=f"cannot start: {exc}"), now)
            return
        log.error("job %d: cannot start it yet (%s); it stays queued and is retried", job.id, exc)
        self.move(job, QUEUED, now)
        self.turn.retry_at = now + 2.0
        self.unshow(job)

    def not_now(self, job: Job, cg, why: str, now: float) -> None:
        """A started job whose command never ran (out of pids, or a crash of the machine): back to
        the queue, retried soon.

        A clean environment the store keeps until the job ends. A forwarded
        one (let go of at the start) comes back from the launch spec, which
        stays until the next start replaces it, so a crash before this turn's
        commit leaves a running job the next daemon queues again
        (``recovery.recheck``).
        """
        env = None
        if not self.store.keeps_env(job):
            spec = records.read_record(os.path.join(self.store.job_dir(job.id), records.LAUNCH),
                                       records.LaunchSpec)
            env = spec.env if spec is not None else None
            if env is None:
                self.drop_cgroup(cg)
                self.finish(job, Result(ERROR, note=f"{why}, and its launch spec is gone"), now)
                return
        self.drop_cgroup(cg)
        if job.id in self.bench.held:
            self.unquiet(job)     # its cores are quieted afresh at its next start
        log.warning("job %d: %s; it is queued again", job.id, why)
        self.move(job, QUEUED, now)
        try:
            if env is not None:
                self.store.unstart(job, env)
            self.store.save_job(job)
        except OSError:
            self.turn.unsaved.add(job.id)
        self.show(job)
        self.turn.retry_at = now + defaults.START_RETRY

    def unshow(self, job: Job) -> None:
        """A start whose /dev entry said it runs (show_put_off) is back in the queue: so is its entry."""
        if job.id in self.turn.shown:
            self.turn.shown.discard(job.id)
            self.show(job)

    def show(self, job: Job) -> bool:
        """(Re)write the job's /dev entry's info.json as the job is now; False if it could not be."""
        try:
            devdir.write_info(self.store.job_dir(job.id), views.dev_info(job, self.machine), job.uid,
                              self.cfg.admin_gid)
        except OSError:
            return False
        return True

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

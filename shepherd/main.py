"""hpc-batch-shepherd: runs one job and outlives the daemon that started it.

    hpc-batch-shepherd --job ID --user NAME JOB_DIR

Like Slurm's slurmstepd, one shepherd sits beside each running job so the
daemon can stop, reload or crash without touching it. The shepherd:

1. closes every descriptor it inherited, takes the lock on
   JOB_DIR/shepherd.pid (created here: the daemon removes the last start's)
   and writes its pid and start time, made durable (and the file's name)
   before the command may run: the proof, after a power cut, that it may
   have;
2. reads launch.json (the daemon's spec), and deletes it once the job is
   forked, so a forwarded environment is in no file while the job runs;
3. makes the control FIFO, then forks the job: it fdatasyncs the pidfile,
   joins its cgroup, pins CPUs, drops to the user (checked), takes the
   submitter's umask, enters the submit directory, waits for the
   shepherd's go (given once the record's start snapshot is taken) and
   execs the command with descriptors 0, 1 and 2 only, its output going
   into a pipe;
4. sleeps in poll() until something happens: output (moved into the
   buffer by ``output.OutputPump``), a command on the FIFO ("stop killed"), the
   --max-time deadline, a signal, or the job's end. It never wakes while
   the job is silent;
5. is the only process that signals the job, and only while the job's
   leader is its unreaped child, so the process group it names cannot be
   anyone else's (or cgroup.kill in cgroup mode);
6. writes exit.json atomically, then delivers the output as the user
   within a time limit (the FIFO can still interrupt it): the log is
   fsynced before the buffer, its only other copy, is removed; and records
   that in delivery.json (``delivery``; a delivery that went well with
   nothing to say of it gets none: the buffer's absence says it);
7. with ``--notify``, forks the notifier (``notify``), which drops to the
   user, and exits without waiting for it.

Out of pids (or memory), fork() fails with EAGAIN (ENOMEM): each fork here
is retried for a bounded time while the poll loop still hears the FIFO and
signals. A job that still cannot be forked is not failed: its exit record
says ``not_started`` (the errno's name), the launch spec stays for the
daemon, and the daemon puts the job back in its queue: its command never
ran.

SIGTERM, SIGINT or SIGHUP to the shepherd stops its job (as ``killed``),
records that, and leaves the output buffer where it is.
"""

import errno
import fcntl
import os
import select
import signal
import sys
import time

try:
    from shepherd import child, control, delivery, notify, output, process
    from shepherd.base import acl, cgroup, identity, proc, records, sigs
    from shepherd.record import recorder
except ImportError:  # run as a file (python -E -s -S .../hpc-batch-shepherd.py): siblings are on sys.path
    # The same modules, found as top-level ones: mypy sees each name bound twice.
    import child  # type: ignore[no-redef]
    import control  # type: ignore[no-redef]
    import delivery  # type: ignore[no-redef]
    import notify  # type: ignore[no-redef]
    import output  # type: ignore[no-redef]
    import process  # type: ignore[no-redef]
    from base import acl, cgroup, identity, proc, records, sigs  # type: ignore[no-redef]
    from record import recorder  # type: ignore[no-redef]



def main(argv=None) -> int:
    """Entry point; returns the shepherd's own exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 5 or args[0] != "--job" or args[2] != "--user":
        sys.stderr.write("usage: hpc-batch-shepherd --job ID --user NAME JOB_DIR\n"
                         "(started by hpc-batchd; not meant to be run by hand)\n")
        return 2
    job_dir = args[4]
    os.closerange(3, process.fd_ceiling())   # whatever the daemon's parent left open is not ours to pass on
    os.umask(0o077)
    locked = _take_lock(job_dir)
    if locked is None:
        return 75
    spec = _read_launch(job_dir)
    if spec is None:
        return 1
    if spec.shepherd_cgroup:
        try:  # beside the job, never inside its limits: an OOM kill must not take us
            cgroup.join(spec.shepherd_cgroup)
        except OSError as exc:
            sys.stderr.write(f"hpc-batch-shepherd: cannot join {spec.shepherd_cgroup}: {exc}\n")
    sup = Supervisor(job_dir, spec, *locked)
    result = sup.run_job()
    sup.out.make_durable()   # before the record that makes the end final (see make_durable)
    _finish(job_dir, result)
    delivery.deliver(sup)
    if sup.pid is not None:   # --notify: only now, the exit record written and the output delivered
        done = sup.delivered
        spec.env.pop(recorder.FIGURES_ENV, None)   # the record's file is gone with the job
        notify.start(spec, result, sup.started, done.path if done is not None and done.ok else None,
                     sup.groups, child.fork)
    return 0


def _take_lock(job_dir: str) -> tuple[int, bool] | None:
    """The pidfile's descriptor, locked and written, and whether it had to be created (so its name
    needs a flush too; an older daemon made it, empty and durable); None when another shepherd
    holds it."""
    path = os.path.join(job_dir, records.PIDFILE)
    try:
        fd, created = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), False
    except FileNotFoundError:
        fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.stderr.write(f"hpc-batch-shepherd: {job_dir} already has a live shepherd\n")
        os.close(fd)
        return None
    if os.pread(fd, 64, 0):
        # The daemon empties it for each start: a pid in it is another shepherd's, which had this
        # start and has ended (one forked by a fork server that died before it answered, say).
        # Its exit record is the job's; running the job again, or failing on its launch spec (gone
        # once that one forked the job), would overwrite it.
        sys.stderr.write(f"hpc-batch-shepherd: {job_dir} was taken by another shepherd\n")
        os.close(fd)
        return None
    os.fchmod(fd, 0o600)
    pid = os.getpid()
    line = f"{pid} {proc.proc_starttime(pid)}\n".encode()

    def write_pidfile() -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line, 0)
    _persist(write_pidfile, "the pidfile")   # made durable by the job's child, before it execs
    return fd, created


def _read_launch(job_dir: str) -> records.LaunchSpec | None:
    path = os.path.join(job_dir, records.LAUNCH)
    spec = records.read_record(path, records.LaunchSpec)
    if spec is None:
        _finish(job_dir, records.ExitRecord(error=f"cannot read the launch spec {path}", ended=time.time()))
        return None
    return spec   # deleted once the job is forked: until then the daemon may need it to queue the job again


class Supervisor:
    """One job from fork to delivery; all waiting is one poll() with deadlines."""

    def __init__(self, job_dir: str, spec: records.LaunchSpec, lock_fd: int, created: bool = False):
        self.job_dir = job_dir
        self.spec = spec
        self.lock_fd = lock_fd
        self.created = created   # the pidfile was made here: its name needs an fsync too
        self.grace = spec.kill_grace
        self.deadline = spec.deadline
        self.delivery_limit = spec.delivery_limit
        self.fork_retry = spec.fork_retry
        self.cgroup = spec.cgroup
        self.stop_reason: str | None = None
        self.stop_note: str | None = None
        self.kill_at: float | None = None
        self.abandon: str | None = None     # why delivery is skipped (the shepherd was told to stop)
        self.pid: int | None = None
        self.started: float | None = None   # when the job was forked (its status record's)
        self.delivered: records.DeliveryRecord | None = None   # what delivery.json says, once written
        self.reaped = False
        self.poller = select.poll()
        self.watched: dict = {}
        self.failure = b""
        self.exec_out = b""                  # what the child wrote before its exec: the file, a failure
        self.launched: dict | None = None   # the file the child exec'd (child.parse_exe_report), once it said
        self.exec_fd: int | None = None       # the child's report pipe until its EOF (its number is then reused)
        # The reproducibility record (shepherd/record/recorder.py), unless the daemon runs with --records none.
        self.groups = identity.groups_of(spec.user, spec.gid)   # for the job and the record's side task
        self.recorder = recorder.Recorder(job_dir, spec, fork=child.fork, groups=self.groups) if spec.record else None
        self.record_fds: list[int] = []
        self.record_pidfd: int | None = None   # the job's pidfd while its record waits for the exec
        ctl_r, self._ctl_keeper = control.create(job_dir)
        self.control = control.Reader(ctl_r)
        self.watch(ctl_r, self._on_control)
        self.sig_r, sig_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        sigs.set_wakeup_fd(sig_w, warn_on_full_buffer=False)
        for sig in process.STOP_SIGNALS:
            sigs.signal(sig, lambda signum, frame: None)  # the wake-up byte carries it
        self.watch(self.sig_r, self._on_signal)

    # -- the poll set (the output pump and delivery run in it too) -------------------
    def watch(self, fd: int, handler) -> None:
        """Call *handler(fd)* from the poll loop whenever *fd* is readable."""
        self.watched[fd] = handler
        self.poller.register(fd, select.POLLIN)

    def unwatch(self, fd: int) -> None:
        """Take *fd* out of the poll set (if it is there)."""
        if self.watched.pop(fd, None) is not None:
            self.poller.unregister(fd)

    def wait(self, until) -> None:
        """One poll() until *until* (epoch seconds, or None: no timeout); run the handlers."""
        timeout = None
        if until is not None:
            timeout = max(0, min(int((until - time.time()) * 1000) + 1, 1 << 30))
        for fd, _ in self.poller.poll(timeout):
            handler = self.watched.get(fd)
            if handler is not None:
                handler(fd)

    # -- running the job -------------------------------------------------------------
    def run_job(self) -> records.ExitRecord:
        """Start the job, supervise it to its end, and return the exit record."""
        spec = self.spec
        # Output: buffer until the bound, then relay (as the user) or discard.
        self.out = output.OutputPump(spec, _open_buffer(os.path.join(self.job_dir, records.OUTPUT), spec),
                                     spec.max_output_buffer, self.fork_retry,
                                     child.fork, self.watch, self.unwatch, self.groups)
        pipe_r, pipe_w = output.make_pipe()
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        # Set here, never forwarded: a value from a job that submitted this one names that job's file.
        spec.env.pop(recorder.FIGURES_ENV, None)
        if self.recorder is not None:
            self.recorder.make_figures_file(spec.env)
        try:
            pid = self.fork_retrying(lambda: self.stop_reason is not None)
        except OSError as exc:
            for fd in (pipe_r, pipe_w, err_r, err_w, go_r, go_w):
                os.close(fd)
            if self.recorder is not None:
                self.recorder.drop_figures_file()
            return self._not_forked(exc)
        if pid == 0:
            try:
                child.run(spec, pipe_w, err_w, self.groups, go_r,
                       (self.lock_fd, self.job_dir if self.created else None))
            finally:
                os._exit(127)
        child.place(pid, spec)
        for fd in (pipe_w, err_w, go_r):
            os.close(fd)
        # The record's start snapshot while the child confines itself and makes the pidfile
        # durable; then the child may exec.
        if self.recorder is not None:
            self.recorder.before_start()
        child.go(go_w)
        self.pid = pid
        records.unlink(os.path.join(self.job_dir, records.LAUNCH))   # the environment is in no file while the job runs
        pidfd = os.pidfd_open(pid)
        status = records.StatusRecord(pid, proc.proc_starttime(pid), time.time())
        self.started = status.started
        _persist(lambda: status.write(os.path.join(self.job_dir, records.STATUS), durable=False),
                 "the status record")
        self.out.start(pipe_r)
        # The record's work while the job runs (a side task's fork, the static sections) waits for
        # the exec: done meanwhile, it took the CPUs the child needs to get there.
        self.record_pidfd = pidfd if self.recorder is not None else None
        self.exec_fd = err_r
        self.watch(err_r, self._on_exec_report)
        ended = []
        self.watch(pidfd, lambda fd: ended.append(True))
        while not ended:
            self.wait(self._next_timer())
            self._timers()
        while self.exec_fd is not None:   # the job ended before its exec was reported: the child is gone
            self._read_exec_report(self.exec_fd)
        self.unwatch(pidfd)
        os.close(pidfd)
        return self._collect()

    def _start_record(self) -> None:
        pidfd, self.record_pidfd = self.record_pidfd, None
        if pidfd is not None:
            self._record_started(pidfd)

    def _record_started(self, pidfd: int) -> None:
        """The record's part while the job runs: static sections now, side tasks in the poll loop."""
        if self.recorder is None:
            return
        try:
            self.record_fds = self.recorder.after_start(lambda: not _readable(pidfd), pid=self.pid,
                                                        launched=self.launched, failed=self.failure)
        except Exception as exc:   # the record must never cost the job anything
            sys.stderr.write(f"hpc-batch-shepherd: job {self.spec.id}: cannot start its record: {exc}\n")
            self.recorder.record["error"] = str(exc)
            return
        for fd in self.record_fds:
            self.watch(fd, self._on_record_side)

    def _on_record_side(self, fd: int) -> None:
        assert self.recorder is not None
        if self.recorder.on_readable(fd):
            self.unwatch(fd)

    def _record_end(self, usage) -> dict | None:
        """The record's end (before the cgroup goes): ``{"verdict", "digest"}``, or None."""
        if self.recorder is None:
            return None
        for fd in self.record_fds:
            self.unwatch(fd)
        try:
            return self.recorder.at_end(usage)
        except Exception as exc:
            sys.stderr.write(f"hpc-batch-shepherd: job {self.spec.id}: cannot finish its record: {exc}\n")
            return None

    def fork_retrying(self, interrupted, limit: float | None = None) -> int:
        """:func:`_fork`, retried while it fails for want of pids or memory.

        For up to *limit* seconds (default fork_retry). Between tries the
        poll loop runs, so the FIFO and signals are heard; *interrupted()*
        true ends the retries early. Raises the last error.
        """
        give_up = time.time() + (self.fork_retry if limit is None else limit)
        delay = 0.05
        while True:
            try:
                return child.fork()
            except OSError as exc:
                if not records.not_now(exc) or time.time() >= give_up:
                    raise
                self.wait(min(time.time() + delay, give_up))
                if interrupted():   # (checked before the next try: a stop must win over a free pid)
                    raise
            delay = min(delay * 2, 1.0)

    def _not_forked(self, exc: OSError) -> records.ExitRecord:
        """The exit record of a job whose command was never forked."""
        name = errno.errorcode.get(exc.errno or 0, "EIO")
        why = f"cannot fork the job ({name}: {exc.strerror or exc})"
        if self.stop_reason is not None:   # stopped while it waited: it ends as asked, never having run
            note = f"it was stopped before it could start ({why})"
            return records.ExitRecord(ended=time.time(), stopped=self.stop_reason, stop_note=note)
        rec = records.ExitRecord(ended=time.time(), error=why)
        # Safe to run again later: the command never started. The daemon queues it again.
        rec.not_started = name
        return rec

    def _next_timer(self):
        times = [t for t in (self.kill_at, self.out.resume_at,
                             self.deadline if self.stop_reason is None else None) if t is not None]
        side = self.recorder.deadline() if self.recorder is not None else None
        if side is not None:   # (monotonic: the record's side tasks' limit)
            times.append(time.time() + side - time.monotonic())
        return min(times) if times else None

    def _timers(self) -> None:
        now = time.time()
        side = self.recorder.deadline() if self.recorder is not None else None
        if side is not None and time.monotonic() >= side:
            for fd in self.recorder.cut_short():   # type: ignore[union-attr]
                self.unwatch(fd)   # (a patient side task, the executable's, goes on)
        if self.stop_reason is None and self.deadline is not None and now >= self.deadline:
            self.stop(records.TIMEOUT)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            self._signal_job(signal.SIGKILL)
        self.out.on_timer(now)

    def stop(self, reason: str, note: str | None = None) -> None:
        """End the job: SIGTERM now, SIGKILL after the grace period (the first reason wins)."""
        if self.stop_reason is not None or self.reaped:
            return
        self.stop_reason, self.stop_note = reason, note
        if self.pid is None:   # not forked yet (the machine is out of pids): it never will be
            return
        self._signal_job(signal.SIGTERM)
        self.kill_at = time.time() + self.grace

    def _signal_job(self, sig: int) -> None:
        # The leader is our unreaped child, so its pid and process group are still ours.
        if not self.reaped:
            assert self.pid is not None  # nothing asks for a stop before the fork
            for send in (os.killpg, os.kill):
                try:
                    send(self.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        if sig == signal.SIGKILL and self.cgroup:
            cgroup.kill(self.cgroup)

    def _on_control(self, fd: int) -> None:
        for kind, value in self.control.commands():
            if kind == control.DEADLINE:
                self.deadline = value
            elif kind == control.STOP:
                self.stop(value)
                if self.reaped:
                    self.abandon = self.abandon or "delivery was interrupted by dispatch kill"

    def _on_signal(self, fd: int) -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        for num in data:
            if num in process.STOP_SIGNALS:
                name = signal.Signals(num).name
                self.stop(records.KILLED, f"its shepherd was killed ({name}); the job was stopped")
                self.abandon = self.abandon or f"its shepherd was stopped by {name} before delivering"

    def _on_exec_report(self, fd: int) -> None:
        self._read_exec_report(fd)

    def _read_exec_report(self, fd: int) -> bool:
        """One read of what the child says before its exec; False at EOF (the exec happened, or the
        child is gone), where the file it exec'd and any failure are taken and the record starts."""
        chunk = os.read(fd, 1 << 14)
        if chunk:
            if len(self.exec_out) < 1 << 15:   # the report (two paths) and a failure's line
                self.exec_out += chunk
            return True
        self.unwatch(fd)
        os.close(fd)
        self.exec_fd = None
        self.launched, failure = child.parse_exe_report(self.exec_out)
        self.failure += failure[:4096]
        self._start_record()
        return False

    # -- the end -------------------------------------------------------------------------
    def _collect(self) -> records.ExitRecord:
        """The leader has exited: finish off the rest of the job, reap it, build the record."""
        stopped = self.stop_reason
        if stopped and not self.cgroup:
            # Still unreaped, the leader pins its process group: take the stragglers with it.
            self._signal_job(signal.SIGKILL)
        assert self.pid is not None  # run_job forked it
        _, status, usage = os.wait4(self.pid, 0)
        self.reaped = True
        self.kill_at = None
        rec = records.ExitRecord(status=status, ended=time.time(), stopped=stopped, stop_note=self.stop_note)
        # Without a cgroup, the job's own account: its CPU time and those of the children it waited
        # for, and the largest resident set among them (what rusage can tell).
        rec.cpu_time = usage.ru_utime + usage.ru_stime
        rec.peak_mem = usage.ru_maxrss * 1024
        if os.WIFEXITED(status):
            rec.code = os.WEXITSTATUS(status)
        elif os.WIFSIGNALED(status):
            rec.signal = os.WTERMSIG(status)
        summary = self._record_end(usage)   # (its end snapshot reads the cgroup: before it goes)
        if summary is not None:
            rec.verdict, rec.record_digest = summary.get("verdict"), summary.get("digest")
        if self.cgroup:
            for key, value in cgroup.collect_and_remove(self.cgroup).items():
                if value is not None:   # the cgroup saw the whole job: prefer it to rusage
                    setattr(rec, key, value)
        self.out.finish()
        if self.failure:
            rec.error = self.failure.decode(errors="replace").strip()
        return rec

    def record_delivery(self, rec: records.DeliveryRecord) -> None:
        """Write delivery.json (retried until it can be: see _persist)."""
        self.delivered = rec
        # Not fsync'd: if a crash loses it, the buffer's presence tells the daemon
        # the same thing (it is deleted only after a complete, durable copy).
        _persist(lambda: rec.write(os.path.join(self.job_dir, records.DELIVERY), durable=False),
                 "the delivery record")


def _readable(fd: int) -> bool:
    """Whether *fd* is readable now (a pidfd: its process has exited)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def warm_up() -> None:
    """Run the shepherd's pure code paths once over (the fork server, before its first fork).

    Reads of /proc and /sys only: no file is written, nothing is forked. See
    ``recorder.warm_up``; the records' codec and types get the same.
    """
    cpu = min(os.sched_getaffinity(0))
    conf = {"cpus": [cpu], "node_cpus": [cpu], "l3_cpus": [cpu], "mems": [], "root": "/", "version": "?"}
    sample = records.LaunchSpec(user="root", uid=0, gid=0, cwd="/", argv=["true"], env={"PATH": os.defpath},
                                id=0, record=conf)
    for _ in range(recorder.WARM_ROUNDS):
        spec = records.LaunchSpec.from_dict(records.loads(records.dumps(sample.to_dict())))
        exit_rec = records.ExitRecord(status=0, ended=time.time(), code=0)
        records.ExitRecord.from_dict(records.loads(records.dumps(exit_rec.to_dict())))
        records.dumps(records.StatusRecord(os.getpid(), proc.proc_starttime(os.getpid()), time.time()).to_dict())
        control.parse("stop killed")
        control.parse("deadline 1.0")
    identity.groups_of("root", 0)   # the NSS set-up (nsswitch.conf read), inherited by every shepherd
    if spec is not None:
        recorder.warm_up(spec)


def _open_buffer(path: str, spec: records.LaunchSpec) -> int:
    """The output buffer: root's, readable by the job's user and the admin group."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o640)
    os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    acl.share_with(fd, spec.uid, spec.admin_gid if spec.admin_gid is not None else -1)
    return fd


def _persist(write, what: str) -> None:
    """Run *write* until it succeeds: a full disk must delay a record, never lose it."""
    delay = 0.05
    while True:
        try:
            write()
            return
        except OSError as exc:
            if delay == 0.05:
                sys.stderr.write(f"hpc-batch-shepherd: cannot write {what} ({exc}); retrying\n")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _finish(job_dir: str, rec: records.ExitRecord) -> None:
    """Write the exit record (the only copy of the job's outcome)."""
    _persist(lambda: rec.write(os.path.join(job_dir, records.EXIT)), "the exit record")


if __name__ == "__main__":
    sys.exit(main())

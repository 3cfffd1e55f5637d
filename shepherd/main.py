"""hpc-batch-shepherd: runs one job and outlives the daemon that started it.

    hpc-batch-shepherd --job ID --user NAME JOB_DIR

Like Slurm's slurmstepd, one shepherd sits beside each running job so the
daemon can stop, reload or crash without touching it. The shepherd:

1. takes the lock on JOB_DIR/shepherd.pid and writes its pid and start time;
2. reads launch.json (the daemon's spec) and deletes it, so a forwarded
   environment is in no file once the job runs;
3. forks the job: joins its cgroup, pins CPUs, drops to the user
   (initgroups, setgid, setuid, each checked), enters the submit directory
   and execs the command with output going straight to JOB_DIR/output;
4. blocks in waitpid (it never wakes while the job is silent);
5. writes exit.json atomically, then copies the output to the user's log file
   as the user, never following a link, and records that in delivery.json.

It enforces nothing itself: timeouts and kills come from the daemon.
"""

import fcntl
import os
import signal
import sys
import time

try:
    from shepherd import cgroup, records
except ImportError:  # run as a file (python -I -S .../hpc-batch-shepherd.py): siblings are on sys.path
    import cgroup
    import records

# An exec failure in the child reaches the shepherd through a close-on-exec
# pipe: EOF means the exec happened, bytes mean it did not (and why).


def main(argv=None) -> int:
    """Entry point; returns the shepherd's own exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 5 or args[0] != "--job" or args[2] != "--user":
        sys.stderr.write("usage: hpc-batch-shepherd --job ID --user NAME JOB_DIR\n"
                         "(started by hpc-batchd; not meant to be run by hand)\n")
        return 2
    job_dir = args[4]
    os.umask(0o022)
    lock_fd = _take_lock(job_dir)
    if lock_fd is None:
        return 75
    launch_path = os.path.join(job_dir, records.LAUNCH)
    try:
        with open(launch_path, "rb") as f:
            spec = records.loads(f.read().decode())
        os.unlink(launch_path)
    except (OSError, ValueError) as exc:
        _finish(job_dir, {"error": f"cannot read the launch spec: {exc}", "ended": time.time()})
        return 1
    if spec.get("shepherd_cgroup"):
        try:  # beside the job, never inside its limits: an OOM kill must not take us
            cgroup.join(spec["shepherd_cgroup"])
        except OSError as exc:
            sys.stderr.write(f"hpc-batch-shepherd: cannot join {spec['shepherd_cgroup']}: {exc}\n")
    result = run_job(job_dir, spec, lock_fd)
    _finish(job_dir, result)
    deliver(job_dir, spec, lock_fd)
    return 0


def _take_lock(job_dir: str):
    path = os.path.join(job_dir, records.PIDFILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.stderr.write(f"hpc-batch-shepherd: {job_dir} already has a live shepherd\n")
        os.close(fd)
        return None
    pid = os.getpid()
    line = f"{pid} {records.proc_starttime(pid)}\n".encode()
    _persist(lambda: (os.ftruncate(fd, 0), os.pwrite(fd, line, 0)), "the pidfile")
    return fd


def run_job(job_dir: str, spec: dict, lock_fd: int) -> dict:
    """Start the job, wait for it, and return the exit record."""
    out_path = os.path.join(job_dir, records.OUTPUT)
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    if os.geteuid() == 0:
        os.fchown(out_fd, spec["uid"], spec.get("admin_gid", -1))
    os.fchmod(out_fd, 0o640)
    rfd, wfd = os.pipe()  # both close-on-exec by default
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.close(lock_fd)
        _child(spec, out_fd, wfd)  # never returns
    os.close(wfd)
    os.close(out_fd)
    started = time.time()
    status = {"job_pid": pid, "job_start": records.proc_starttime(pid), "started": started}
    _persist(lambda: records.write_json(os.path.join(job_dir, records.STATUS), status, durable=False),
             "the status record")
    failure = _drain(rfd)  # returns at the exec (EOF) or with the child's reason
    _, status = os.waitpid(pid, 0)
    rec = {"status": status, "ended": time.time(), "code": None, "signal": None, "error": None}
    if os.WIFEXITED(status):
        rec["code"] = os.WEXITSTATUS(status)
    elif os.WIFSIGNALED(status):
        rec["signal"] = os.WTERMSIG(status)
    if failure:
        rec["error"] = failure.decode(errors="replace")
    if spec.get("cgroup"):
        rec.update(cgroup.collect_and_remove(spec["cgroup"]))
    return rec


def _child(spec: dict, out_fd: int, err_w: int) -> None:
    """In the forked child: confine, drop privileges, exec. Never returns."""
    stage = "setup"
    try:
        os.setsid()  # own process group: the daemon signals the whole job at once
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; jobs must not
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        if spec.get("cgroup"):
            stage = "joining the job's cgroup"
            cgroup.join(spec["cgroup"])
        if spec.get("cpus"):
            stage = "pinning CPUs"
            os.sched_setaffinity(0, spec["cpus"])
        if os.geteuid() == 0:
            stage = f"dropping privileges to {spec['user']}"
            uid, gid = spec["uid"], spec["gid"]
            os.initgroups(spec["user"], gid)
            os.setgid(gid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getegid() != gid:
                raise PermissionError(1, "privileges were not fully dropped")
            if uid != 0:
                try:
                    os.setuid(0)
                except PermissionError:
                    pass
                else:
                    raise PermissionError(1, "could regain root after dropping privileges")
        stage = f"entering {spec['cwd']}"
        os.chdir(spec["cwd"])
        stage = f"running {spec['argv'][0]!r}"
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as exc:  # report everything: the job must never run half-set-up
        if isinstance(exc, OSError) and exc.errno:
            why = f"{exc.strerror} (errno {exc.errno}, {_errname(exc.errno)})"
        else:
            why = str(exc) or exc.__class__.__name__
        msg = f"hpc-batch: job {spec.get('id')} failed while {stage}: {why}\n"
        try:
            os.write(2, msg.encode())
        except OSError:
            pass
        try:
            os.write(err_w, msg.strip().encode())
        except OSError:
            pass
    os._exit(127)


def _drain(fd: int) -> bytes:
    """Everything a child writes to a pipe until it closes (exec or exit), then close it."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


def _errname(num: int) -> str:
    import errno
    return errno.errorcode.get(num, "?")


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


def _finish(job_dir: str, rec: dict) -> None:
    """Write the exit record (the only copy of the job's outcome)."""
    _persist(lambda: records.write_json(os.path.join(job_dir, records.EXIT), rec), "the exit record")


def deliver(job_dir: str, spec: dict, lock_fd: int) -> None:
    """Copy the output buffer to the user's log file as the user, then drop it."""
    out_path = os.path.join(job_dir, records.OUTPUT)
    dest = spec.get("output")
    if dest is None:
        _unlink(out_path)
        _persist(lambda: records.write_json(os.path.join(job_dir, records.DELIVERY), {"ok": True, "path": None},
                                            durable=False), "the delivery record")
        return
    try:
        src = os.open(out_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        src = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.close(lock_fd)
        _copy_as_user(spec, src, dest, wfd)
    os.close(wfd)
    os.close(src)
    err = _drain(rfd)
    _, status = os.waitpid(pid, 0)
    if status == 0 and not err:
        _unlink(out_path)
        rec = {"ok": True, "path": dest}
    else:
        rec = {"ok": False, "path": dest,
               "error": err.decode(errors="replace") or f"copy failed (status {status})"}
    # Not fsync'd: if a crash loses it, the buffer's presence tells the daemon
    # the same thing (it is deleted only after a complete copy).
    _persist(lambda: records.write_json(os.path.join(job_dir, records.DELIVERY), rec, durable=False),
             "the delivery record")


def _copy_as_user(spec: dict, src: int, dest: str, err_w: int) -> None:
    """In a forked child: become the user, create *dest* without following links, copy."""
    try:
        if os.geteuid() == 0:
            os.setgroups([])
            os.initgroups(spec["user"], spec["gid"])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        while True:
            n = os.sendfile(fd, src, None, 1 << 24)
            if n == 0:
                break
        os.fsync(fd)
        os.close(fd)
        os._exit(0)
    except BaseException as exc:
        if isinstance(exc, OSError):
            why = f"cannot write {dest}: {exc.strerror} (errno {exc.errno})"
        else:
            why = f"cannot write {dest}: {exc}"
        try:
            os.write(err_w, why.encode())
        except OSError:
            pass
    os._exit(1)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


if __name__ == "__main__":
    sys.exit(main())

"""The job's side of the shepherd's fork: from fork() to exec, in the child.

:func:`fork` forks with the stop signals held back; :func:`run`, in the
child, confines it (cgroup, CPUs, ASLR and THP settings), makes the
shepherd's pidfile durable, drops to the user, waits for the shepherd's go
and execs the command, having told the shepherd which file that is
(:data:`EXE_REPORT`, read back by :func:`parse_exe_report`). Anything that
fails is written to the job's output and the shepherd's pipe, and the
child exits 127: a job never runs half set up.
"""

import errno
import os
import signal

try:
    from shepherd import process
    from shepherd.base import cgroup, identity, records, sigs, sysread
except ImportError:  # run as a file, as main.py is: siblings are on sys.path
    import process  # type: ignore[no-redef]
    from base import cgroup, identity, records, sigs, sysread  # type: ignore[no-redef]

_POSSIBLE = "/sys/devices/system/cpu/possible"
_ALL_CPUS = 8192         # CPU ids a mask may name (the kernel keeps those of the cpuset)


def _possible_cpus() -> tuple[int, ...]:
    """Every CPU id this machine may ever have (``_POSSIBLE``; ``_ALL_CPUS`` of them if unread).

    Read once, in the fork server (which every shepherd shares it from): a mask of ``_ALL_CPUS``
    ids costs os.sched_setaffinity 0.1 ms a call to build, twice a job under cgroups.
    """
    try:
        cpus = sysread.parse_cpulist(sysread.Source().read(_POSSIBLE).strip())
    except (OSError, ValueError):
        cpus = []
    return tuple(cpus) or tuple(range(_ALL_CPUS))


POSSIBLE_CPUS = _possible_cpus()


def fork() -> int:
    """fork() with the stop signals held back until the child has its own handlers.

    Until then a signal meant for the child would run the shepherd's handler
    in it and write to the wake-up pipe the two still share: the shepherd
    would take the child's SIGTERM for its own. The child unblocks them
    (:func:`run`) once it is ready.
    """
    old = sigs.pthread_sigmask(sigs.SIG_BLOCK, process.STOP_SIGNALS)
    try:
        pid = os.fork()
    except OSError:   # EAGAIN out of pids, ENOMEM: no child, so the signals come back at once
        sigs.pthread_sigmask(sigs.SIG_SETMASK, old)
        raise
    if pid == 0:
        sigs.set_wakeup_fd(-1)
        return 0
    sigs.pthread_sigmask(sigs.SIG_SETMASK, old)
    return pid


def go(go_w: int) -> None:
    """Let the child exec (it may have failed its set-up and gone: that it reported)."""
    try:
        os.write(go_w, b"g")
    except BrokenPipeError:
        pass
    os.close(go_w)


def _join(pid: int, path: str) -> None:
    cgroup.join(path, pid)
    # The shepherd runs on the housekeeping CPUs; a mask it was pinned to would survive the
    # move (the kernel keeps the pinned mask within the new cpuset): widen it to the cpuset.
    os.sched_setaffinity(pid, POSSIBLE_CPUS)


def place(pid: int, spec: records.LaunchSpec) -> None:
    """In the shepherd, right after the fork: its child *pid* into the job's cgroup and onto its CPUs.

    Forked on the housekeeping CPUs, the child would otherwise wait there until the shepherd
    blocks, so its set-up (the pidfile's flush first) followed the shepherd's start snapshot
    instead of overlapping it. The pid is the shepherd's unreaped child: no other process's.
    A failure is left to the child, which places itself again in :func:`run` and reports there.
    """
    try:
        if spec.cgroup:
            _join(pid, spec.cgroup)
        if spec.cpus:
            os.sched_setaffinity(pid, spec.cpus)
    except OSError:
        pass


def run(spec: records.LaunchSpec, pipe_w: int, err_w: int, groups: list[int] | None = None,
           go_r: int | None = None, pidfile: tuple[int, str | None] | None = None) -> None:
    """In the forked child: confine, make the pidfile durable, drop privileges, wait for the
    shepherd's go on *go_r*, exec. Never returns; without the go (the shepherd died first) the
    command is not run.

    *pidfile* is ``(fd, directory)``: the pidfile's data is fdatasynced (its directory too when the
    shepherd created it) before the command may run, so after a power cut a pidfile empty or gone
    proves it never did. Done here, it overlaps the shepherd's start snapshot.
    """
    stage = "setup"
    try:
        if pidfile is not None:
            stage = "making its shepherd's pidfile durable"
            os.fdatasync(pidfile[0])
            if pidfile[1] is not None:
                records.fsync_dir(pidfile[1])
        # Python changed these; jobs must not see it.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, *process.STOP_SIGNALS):
            sigs.signal(sig, sigs.SIG_DFL)
        sigs.pthread_sigmask(sigs.SIG_UNBLOCK, process.STOP_SIGNALS)   # blocked by fork(); exec keeps the mask
        os.setsid()  # its own process group, which the shepherd signals as one
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(pipe_w, 1)
        os.dup2(pipe_w, 2)
        process.keep_only(err_w, *(() if go_r is None else (go_r,)))  # a job starts with 0, 1 and 2 only
        # (err_w and go_r close at exec)
        if spec.cgroup:
            stage = "joining the job's cgroup"
            _join(0, spec.cgroup)
        if spec.cpus:
            stage = "pinning CPUs"
            os.sched_setaffinity(0, spec.cpus)
        if spec.aslr == "off":
            stage = "turning address space randomisation off (--aslr off)"
            process.no_aslr()
        if spec.thp == "off":
            stage = "turning transparent huge pages off (--thp off)"
            process.no_thp()
        stage = f"dropping privileges to {spec.user}"
        identity.become(spec.user, spec.uid, spec.gid, groups)
        os.umask(spec.umask & 0o777)
        stage = f"entering {spec.cwd}"
        os.chdir(spec.cwd)
        if go_r is not None and os.read(go_r, 1) != b"g":
            os._exit(127)   # its shepherd is gone: nobody would supervise the job
        stage = f"running {spec.argv[0]!r}"
        _exec(spec, err_w)
    except BaseException as exc:  # report everything: the job must never run half-set-up
        if isinstance(exc, OSError) and exc.errno:
            why = f"{exc.strerror} (errno {exc.errno}, {errno.errorcode.get(exc.errno, '?')})"
        else:
            why = str(exc) or exc.__class__.__name__
        msg = f"hpc-batch: job {spec.id} failed while {stage}: {why}\n"
        for fd in (2, err_w):
            try:
                os.write(fd, msg.encode("utf-8", "backslashreplace"))
            except OSError:
                pass
    os._exit(127)


def _exec_by_fd() -> bool:
    """Whether exec from a descriptor names the process after its file (comm, ``ps``): from Linux
    6.14; before, it is named after the descriptor's number, which would show in every ``ps``."""
    release = os.uname().release.split(".")
    try:
        return (int(release[0]), int(release[1].split("-")[0])) >= (6, 14)
    except (IndexError, ValueError):
        return False


_FEXEC = _exec_by_fd()
EXE_REPORT = b"\0exe\0"     # what the child tells its shepherd it is about to exec (parse_exe_report)


def resolve(name: str, env: dict) -> str:
    """*name* as the job's PATH gives it: the first entry that is a regular file the user may exec.

    The old side task's rule, now the only one: execvpe would go on past an entry whose exec fails
    (ETXTBSY while someone writes it, ENOEXEC), so the file recorded was not always the one run.
    """
    if "/" in name:
        return name
    for d in (env.get("PATH") or os.defpath).split(os.pathsep):
        candidate = os.path.join(d or ".", name)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _exec(spec: records.LaunchSpec, err_w: int) -> None:
    """Exec the command, having told the shepherd on *err_w* which file that is (its identity).

    A binary is run from the descriptor its identity was read from (when ``ps`` still names it
    right: :func:`_exec_by_fd`), so the record can name no other; a ``#!`` script by its path,
    as the interpreter opens it again by name. Any failure is the job's: no later PATH entry.
    """
    path = resolve(spec.argv[0], spec.env)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except PermissionError:   # execute-only: the user cannot read what the record would hash
        os.write(err_w, EXE_REPORT + b"unreadable\0" * 6 + os.fsencode(path) + b"\0\0")
        os.execve(path, spec.argv, spec.env)
    st = os.fstat(fd)
    kind = b"script" if os.pread(fd, 2, 0) == b"#!" else b"binary"
    real = os.readlink(f"/proc/self/fd/{fd}")   # the kernel's name for the file opened: no second lookup
    fields = b"\0".join((kind, *(b"%d" % v for v in (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                     st.st_ctime_ns)), os.fsencode(path), os.fsencode(real)))
    os.write(err_w, EXE_REPORT + fields + b"\0")
    if kind == b"binary" and _FEXEC:
        os.execve(fd, spec.argv, spec.env)
    os.execve(path, spec.argv, spec.env)


def parse_exe_report(data: bytes) -> tuple[dict | None, bytes]:
    """The child's :data:`EXE_REPORT` at the head of *data* (what it exec'd), and the rest (a failure)."""
    if not data.startswith(EXE_REPORT):
        return None, data
    parts = data[len(EXE_REPORT):].split(b"\0", 8)
    if len(parts) < 9:
        return None, data
    kind = parts[0].decode()
    info: dict = {"kind": kind, "path": os.fsdecode(parts[6]),
                  "realpath": os.fsdecode(parts[7]) if parts[7] else None}
    if kind != "unreadable":
        try:
            info.update(zip(("dev", "ino", "size", "mtime_ns", "ctime_ns"), map(int, parts[1:6])))
        except ValueError:
            return None, data
    return info, parts[8]

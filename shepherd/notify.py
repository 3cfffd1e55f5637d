"""``dispatch new --notify``: told when a job ends, by the shepherd, after its exit record.

The shepherd calls :func:`start` once exit.json is written and the output
delivered, so a notifier that hangs or fails cannot cost the job its exit
code, and the daemon (which learns of the end from the shepherd's exit)
never waits on it: the shepherd forks the notifier and exits at once. The
notifier drops to the user before it touches anything (checked, as the job's
child does), keeps no descriptor of the shepherd's, and then:

- ``tty``: reads utmp (world-readable) for the user's login terminals and
  writes one escaped line to each that is a character device the user owns,
  opened ``O_WRONLY|O_NOCTTY|O_NONBLOCK|O_NOFOLLOW`` and skipped when its
  group-write bit is off (``mesg n``) or it does not take the line within
  ``TTY_WRITE_LIMIT``;
- ``cmd``: runs ``/bin/sh -c COMMAND`` in its own process group, in the submit
  directory, with the job's environment and the ``HPC_BATCH_JOB_*`` variables,
  output discarded; after ``limit`` seconds the group gets SIGTERM, then SIGKILL.

It runs where the shepherd runs (the shepherds' cgroup, on the housekeeping
CPUs): the job's cgroup is gone by then and its CPUs may already be the next
job's.
"""

import os
import select
import signal
import stat
import time

try:
    from shepherd import process
    from shepherd.base import identity, notifytext, sigs
except ImportError:  # run as a file: siblings are on sys.path
    # The same modules, found as top-level ones: mypy sees each name bound twice.
    import process  # type: ignore[no-redef]
    from base import identity, notifytext, sigs  # type: ignore[no-redef]


def start(spec, rec, started: float | None, delivered: str | None, groups, fork) -> int | None:
    """Fork the notifier for *spec*'s ``notify`` (None: nothing to do); its pid, never waited for.

    *rec* is the exit record, *started* when the job began, *delivered* the log
    it was copied to (or None), *groups* the user's groups, *fork* the
    shepherd's fork. A failed fork costs only the notice.
    """
    want = spec.notify
    if not want or (not want.get("tty") and not want.get("command")):
        return None
    try:
        pid = fork()
    except OSError:
        return None
    if pid == 0:
        try:
            _notifier(spec, rec, started, delivered, groups)
        finally:
            os._exit(0)
    return pid


def _notifier(spec, rec, started, delivered, groups) -> None:
    for sig in (signal.SIGPIPE, *process.STOP_SIGNALS):
        sigs.signal(sig, sigs.SIG_DFL)
    sigs.pthread_sigmask(sigs.SIG_UNBLOCK, process.STOP_SIGNALS)
    os.setsid()   # out of the shepherd's session: it outlives the shepherd, reparented to init
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    process.keep_only()
    identity.become(spec.user, spec.uid, spec.gid, groups)   # before anything of the user's is touched
    want = spec.notify
    result, exit_word = rec.outcome()
    wall = rec.ended - started if rec.ended is not None and started is not None else None
    if want.get("tty"):
        text = notifytext.line(spec.id, want.get("name"), spec.argv, exit_word, wall)
        for name in _user_terminals(spec.user)[:notifytext.MAX_TERMINALS]:
            write_line(os.path.join("/dev", name), text, spec.uid)
    command = want.get("command")
    if command:
        env = dict(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ""   # the job's GPUs are no longer its own
        env.update({notifytext.ENV_ID: str(spec.id), notifytext.ENV_NAME: want.get("name") or "",
                    notifytext.ENV_RESULT: result, notifytext.ENV_EXIT: exit_word,
                    notifytext.ENV_CODE: "" if rec.code is None or result != "exited" else str(rec.code),
                    notifytext.ENV_OUTPUT: delivered or "",
                    notifytext.ENV_WALL: "" if wall is None else str(int(wall))})
        run_command(command, env, spec.cwd, float(want.get("limit") or notifytext.LIMIT))


def _user_terminals(user: str) -> list:
    try:
        fd = os.open(notifytext.UTMP_PATH, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = os.read(fd, 1 << 20)   # a utmp of thousands of sessions; more is not one
    except OSError:
        return []
    finally:
        os.close(fd)
    return notifytext.terminals(data, user)


def write_line(path: str, text: bytes, uid: int) -> bool:
    """Write *text* to the terminal *path* if it is a character device owned by *uid* that takes
    messages (``mesg y``: its group-write bit), within ``TTY_WRITE_LIMIT``; True if written whole."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISCHR(st.st_mode) or st.st_uid != uid or not st.st_mode & stat.S_IWGRP:
            return False
        give_up = time.monotonic() + notifytext.TTY_WRITE_LIMIT
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        view = memoryview(text)
        while view:
            left = give_up - time.monotonic()
            if left <= 0 or not poller.poll(int(left * 1000) + 1):
                return False
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def run_command(command: str, env: dict, cwd: str, limit: float) -> int | None:
    """Run ``/bin/sh -c command`` in a process group of its own; SIGTERM to the group after *limit*
    seconds, SIGKILL after ``KILL_GRACE`` more. Its wait status, or None when it could not start."""
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        try:
            os.setpgid(0, 0)
            try:
                os.chdir(cwd)
            except OSError:
                os.chdir(env.get("HOME") or "/")
            os.execve("/bin/sh", ["/bin/sh", "-c", command], env)
        finally:
            os._exit(127)
    try:
        os.setpgid(pid, pid)   # (also in the child: whichever runs first, the group exists before a kill)
    except OSError:
        pass
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)

    def ended_within(seconds: float) -> bool:
        ends = time.monotonic() + seconds
        while True:
            if poller.poll(max(0, int((ends - time.monotonic()) * 1000)) + 1):
                return True
            if time.monotonic() >= ends:
                return False

    if not ended_within(limit):
        _kill_group(pid, signal.SIGTERM)
        if not ended_within(notifytext.KILL_GRACE):
            _kill_group(pid, signal.SIGKILL)
    # While the leader is our unreaped child the group's id is still its: what it left there goes too.
    _kill_group(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    return status


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass

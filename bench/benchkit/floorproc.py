"""The design floor: hpc-batch's shape with nothing else in it (issue 34). Standard library only.

Run by ``benchkit/floor.py`` as ``python -E -s -S floorproc.py MODE DIR ...``, so it
starts as the shepherd's interpreter does. This process plays the warm fork
server: it forks a Python shepherd per job; the shepherd forks the job's
child, which execs the command; the shepherd waits for it, writes an exit
record (``fdatasync``, a rename, a directory ``fsync``) and exits.

    drain DIR N SLOTS      N jobs of `true`, SLOTS at a time; prints the seconds from
                           the first fork to the last shepherd reaped
    silent DIR K           K shepherds whose jobs are `sleep 3600`; prints their pids,
                           one a line, then waits until stdin closes
"""

from __future__ import annotations

import os
import sys


def _which(name: str) -> str:
    # Resolved once, in the server: a shepherd does no PATH lookup of its own.
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    raise SystemExit(f"floorproc: {name} not found on PATH")


def _exit_record(directory: str, job: int, status: int) -> None:
    """The shepherd's durable exit record: written, fdatasynced, renamed in, its directory fsynced."""
    final = os.path.join(directory, f"exit.{job}")
    tmp = final + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b'{"job": %d, "status": %d}\n' % (job, status))
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _shepherd(directory: str, job: int, argv: list[str]) -> None:
    """The forked shepherd's whole life; never returns."""
    try:
        child = os.fork()
        if child == 0:
            try:
                os.execv(argv[0], argv)
            finally:
                os._exit(127)
        _, status = os.waitpid(child, 0)
        _exit_record(directory, job, os.waitstatus_to_exitcode(status))
        code = 0
    except BaseException:  # a shepherd must never fall back into the server's loop
        code = 1
    os._exit(code)


def _spawn(directory: str, job: int, argv: list[str]) -> int:
    pid = os.fork()
    if pid == 0:
        _shepherd(directory, job, argv)
    return pid


def drain(directory: str, n: int, slots: int) -> float:
    """Seconds to run *n* jobs of ``true``, *slots* at a time, each with its exit record."""
    import time

    argv = [_which("true")]
    started = running = 0
    t0 = time.perf_counter()
    while started < n or running:
        while running < slots and started < n:
            _spawn(directory, started, argv)
            started += 1
            running += 1
        _, status = os.wait()
        if status != 0:
            raise SystemExit(f"floorproc: a shepherd failed (wait status {status})")
        running -= 1
    return time.perf_counter() - t0


def silent(directory: str, k: int) -> None:
    """*k* shepherds of silent jobs; their pids on stdout; returns once stdin is closed."""
    argv = [_which("sleep"), "3600"]
    pids = [_spawn(directory, i, argv) for i in range(k)]
    sys.stdout.write("".join(f"{p}\n" for p in pids))
    sys.stdout.flush()
    sys.stdin.read()  # the caller kills our process group when it is done


def main(args: list[str]) -> int:
    if len(args) == 4 and args[0] == "drain":
        print(f"{drain(args[1], int(args[2]), int(args[3])):.6f}")
        return 0
    if len(args) == 3 and args[0] == "silent":
        silent(args[1], int(args[2]))
        return 0
    print("usage: floorproc.py drain DIR N SLOTS | silent DIR K", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

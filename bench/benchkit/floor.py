"""The design floor's figures (issue 34): ``floorproc.py`` run in the shepherd's interpreter.

Every figure it gives is what hpc-batch's own shape costs with nothing else
in it, so the drain and shepherd rows can be judged against it in the same run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from .scratchd import PYTHON, DaemonError

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floorproc.py")
FLAGS = ("-E", "-s", "-S")  # the shepherd's interpreter flags


def _argv(*args: str) -> list[str]:
    return [PYTHON, *FLAGS, SCRIPT, *args]


def _fresh(directory: str) -> str:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    return directory


def drain(directory: str, n: int, slots: int) -> float:
    """Seconds the floor takes to run *n* `true` jobs, *slots* at a time (records under *directory*)."""
    r = subprocess.run(_argv("drain", _fresh(directory), str(n), str(slots)), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise DaemonError(f"the design floor's drain exited {r.returncode}: {r.stderr.strip()}")
    try:
        return float(r.stdout.strip())
    except ValueError:
        raise DaemonError(f"the design floor's drain printed {r.stdout!r}, not seconds") from None


@contextmanager
def silent(directory: str, k: int) -> Iterator[list[int]]:
    """*k* of the floor's shepherds with silent jobs, alive inside the block: their pids."""
    proc = subprocess.Popen(_argv("silent", _fresh(directory), str(k)), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(k)]
        if not all(line.strip().isdigit() for line in lines):
            raise DaemonError(f"the design floor's silent shepherds did not say their pids: {lines}")
        yield [int(line) for line in lines]
    finally:
        # Its own session: the server, its shepherds and their sleeps go together.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.stdout is not None:
            proc.stdout.close()

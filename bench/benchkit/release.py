"""The loop's worst stall while a bulk of dependents is released: a ping loop, with and without the release."""

from __future__ import annotations

import errno
import os
import time

from .context import Context
from .report import Figure
from .scratchd import DaemonError, ScratchDaemon
from .stats import summarize

STATUS_EVERY = 0.05   # seconds between the status requests that tell when the release is over


def _held(ctx: Context, name: str, n: int) -> tuple[ScratchDaemon, str]:
    """A daemon on one CPU: a gate job running, a sleeper queued, *n* jobs waiting on the gate's exit 0."""
    cpu = {sorted(os.sched_getaffinity(0))[0]}
    d = ctx.daemon(name, cpus=cpu, args=("--max-queued-per-user", str(n + 10)))
    fifo = os.path.join(d.dir, "gate")
    os.mkfifo(fifo, 0o600)
    gate = d.submit("--no-output", "--", "sh", "-c", f"read x < {fifo}; exit $x")
    _until(d, {"running": 1, "queued": 0, "waiting": 0}, 60)
    # The sleeper takes the CPU when the gate ends, so the released jobs stay queued: what is timed
    # is the release alone, not the launches that would follow it.
    d.submit("--no-output", "--", "sleep", "3600")
    t0 = time.perf_counter()
    d.dispatch("new", "--array", f"1-{n}", "--after-ok", str(gate), "--no-output", "--", "true")
    ctx.say(f"{n} jobs waiting on job {gate} ({time.perf_counter() - t0:.1f} s to submit)")
    _until(d, {"running": 1, "queued": 1, "waiting": n}, 60)
    _compacted(d, 120)
    return d, fifo


def _compacted(d: ScratchDaemon, timeout: float) -> None:
    """Wait for the journal compaction the bulk submit began (a slice a turn) to end: the baseline
    is the loop with nothing else to do."""
    tmp = os.path.join(d.state, "journal.tmp")
    deadline = time.monotonic() + timeout
    while os.path.exists(tmp):
        if time.monotonic() > deadline:
            raise DaemonError(f"the journal's compaction did not end within {timeout:.0f} s")
        time.sleep(0.01)


def _until(d: ScratchDaemon, want: dict[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while d.counts() != want:
        if time.monotonic() > deadline:
            raise DaemonError(f"expected {want}, have {d.counts()}")
        time.sleep(0.01)


def _open_gate(fifo: str) -> None:
    """Write 0 to the gate job's FIFO once it reads it: the gate exits 0 and its dependents are released."""
    deadline = time.monotonic() + 60
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.005)   # its reader has not opened it yet
    try:
        os.write(fd, b"0\n")
    finally:
        os.close(fd)


def _ping_loop(d: ScratchDaemon, done, min_seconds: float) -> tuple[float, int]:
    """Ping back to back until *done*(counts) holds and *min_seconds* passed: (worst answer, requests).

    The status requests that tell when to stop are timed too: a stall that
    one of them waits out is a stall all the same.
    """
    worst, asked = 0.0, 0
    start = next_status = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        if not d.call("ping").get("ok"):
            raise DaemonError("a ping was refused")
        t1 = time.perf_counter()
        worst, asked = max(worst, t1 - t0), asked + 1
        if t1 >= next_status:
            next_status = t1 + STATUS_EVERY
            now = d.counts()
            worst, asked = max(worst, time.perf_counter() - t1), asked + 1
            if done(now) and t1 - start >= min_seconds:
                return worst, asked


def measure(ctx: Context, figs: dict[str, Figure]) -> None:
    """Row release: per run, a fresh daemon; the ping loop first alone, then across the release."""
    n, plan = ctx.plan.release_jobs, ctx.plan
    stalls, base, spans, counts = [], [], [], []
    released = {"running": 1, "queued": n, "waiting": 0}
    for i in range(plan.release_runs):
        d, fifo = _held(ctx, f"release-{i}", n)
        try:
            worst, _ = _ping_loop(d, lambda c: True, plan.release_base)
            base.append(worst)
            t0 = time.perf_counter()
            _open_gate(fifo)
            worst, asked = _ping_loop(d, lambda c: c == released, 0.0)
            spans.append(time.perf_counter() - t0)
            stalls.append(worst)
            counts.append(asked)
        finally:
            d.stop()
    f = figs["release"]
    f.value, f.baseline = summarize(stalls, "ms"), summarize(base, "ms")
    f.details.append(f"From the gate's release to the daemon reporting all {n:,} queued: "
                     f"{summarize(spans, 's').text()}; requests answered meanwhile: {', '.join(map(str, counts))}.")

"""Client-side figures: `dispatch new` and `list` cost, submit-to-start latency, `dispatch wait`."""

from __future__ import annotations

import json
import os
import subprocess
import time

from . import probe, procs
from .context import Context
from .report import Figure
from .scratchd import DISPATCH, PYTHON, DaemonError, ScratchDaemon, timed
from .stats import summarize


def measure_client(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Rows new and list: each run one python, one submit, one list, in turn."""
    py = [PYTHON, "-c", "pass"]
    timed(py)
    d.timed("list")  # page cache warm for both before the first sample
    base, new, lst = [], [], []
    for _ in range(ctx.plan.runs):
        base.append(timed(py))
        new.append(d.timed("new", "--", "true"))
        d.wait_idle()  # the next sample sees an idle daemon, not a shepherd finishing
        lst.append(d.timed("list"))
    figs["new"].value, figs["new"].baseline = summarize(new, "ms"), summarize(base, "ms")
    figs["list"].value, figs["list"].baseline = summarize(lst, "ms"), figs["new"].baseline


def submit_to_stamp(d: ScratchDaemon, argv: list[str], name: str, *options: str) -> float:
    """Seconds from just before ``dispatch new [OPTIONS] --output NAME -- PROBE`` is forked to the
    probe's clock read (in its log, read once the daemon is idle again)."""
    log = os.path.join(d.work, name)
    t0 = time.time_ns()
    r = subprocess.run([DISPATCH, "new", *options, "--output", log, "--", *argv], env=d.env, cwd=d.work,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise DaemonError(f"dispatch new of the probe exited {r.returncode}: {r.stderr.decode().strip()}")
    d.wait_idle()
    with open(log) as f:
        return (probe.read_stamp(f.read()) - t0) / 1e9


def measure_latency(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Row latency: submit to the probe's clock read, against the probe run directly."""
    argv, what = probe.build(ctx.scratch)
    bare = [PYTHON, "-S", "-c", "pass"]
    timed(bare)
    lat, base, direct = [], [], []
    for i in range(ctx.plan.runs):
        lat.append(submit_to_stamp(d, argv, f"stamp.{i}.log"))
        base.append(timed(bare))
        t0 = time.time_ns()
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=True).stdout
        direct.append((probe.read_stamp(out.decode()) - t0) / 1e9)
    fig = figs["latency"]
    fig.value, fig.baseline = summarize(lat, "ms"), summarize(base, "ms")
    fig.details.append(f"The probe here: {what}; started directly by the benchmark, it reads its clock "
                       f"{summarize(direct, 'ms').text()} after the fork.")


def _ended(d: ScratchDaemon, job: int) -> float:
    shown = json.loads(d.dispatch("show", "--json", str(job)).stdout)
    return float(shown["ended"])


def _await_held(pid: int, timeout: float = 30.0) -> None:
    """Return once *pid* has connected and sleeps waiting for its answer."""
    deadline = time.monotonic() + timeout
    while not (procs.has_socket(pid) and procs.state(pid) == "S"):
        if procs.state(pid) in (None, "Z"):
            raise DaemonError("dispatch wait ended before its job did")
        if time.monotonic() > deadline:
            raise DaemonError(f"dispatch wait did not connect within {timeout:.0f} s")
        time.sleep(0.002)
    time.sleep(0.05)  # connected and asleep; this covers the request's write after the connect


def measure_wait(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Row wait: from a job's end to its waiter's exit, against a list round trip."""
    base, lat = [], []
    for i in range(ctx.plan.wait_runs):
        base.append(d.timed("list"))
        flag = os.path.join(d.work, f"go{i}")
        job = d.submit("--no-output", "--", "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.01; done")
        waiter = subprocess.Popen([DISPATCH, "wait", str(job)], env=d.env, cwd=d.work,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            _await_held(waiter.pid)
            open(flag, "w").close()
            rc = waiter.wait(60)
            returned = time.time()
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        if rc != 0:
            raise DaemonError(f"dispatch wait {job} exited {rc}, not 0")
        lat.append(returned - _ended(d, job))
        d.wait_idle()
    figs["wait"].value, figs["wait"].baseline = summarize(lat, "ms"), summarize(base, "ms")

"""A job that writes a lot to stdout, against the same job writing a file.

A captured stdout is a pipe the shepherd drains into the log; a file is written
straight. So beside the two jobs, the same bytes go through a bare pipe into a
file (``sh -c 'head ... | cat > FILE'``, no hpc-batch) against ``head ... > FILE``,
alternated with them: what the host charges for a pipe, against which the
jobs' ratio is read. Each pair's ratio is kept too, so the spread a ratio of
medians hides is shown (issue 34's "proven to be the host").
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time

from .context import Context
from .report import Figure
from .scratchd import ScratchDaemon
from .stats import summarize


def _run(d: ScratchDaemon, outdir: str, script: str) -> tuple[float, float]:
    """(job wall seconds as the daemon recorded them, seconds until `--wait` returned)."""
    t0 = time.perf_counter()
    out = d.dispatch("new", "--wait", "--output", outdir, "--", "sh", "-c", script).stdout
    waited = time.perf_counter() - t0
    job = out.split()[1]
    shown = json.loads(d.dispatch("show", "--json", job).stdout)
    return float(shown["ended"]) - float(shown["started"]), waited


def _bare(script: str) -> float:
    """Wall seconds of *script* run by sh directly, no daemon."""
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", script], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _pairs(num: list[float], den: list[float]) -> str:
    """Each pair's ratio, as ``median [min-max]`` of them."""
    ratios = [a / b for a, b in zip(num, den)]
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def measure(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Row output: stdout job and file job in turn, their output removed after each run."""
    size = ctx.plan.out_bytes
    outdir = os.path.join(ctx.scratch, "output")
    stdout_wall: list[float] = []
    file_wall: list[float] = []
    stdout_wait: list[float] = []
    file_wait: list[float] = []
    bare_pipe: list[float] = []
    bare_file: list[float] = []
    for _ in range(ctx.plan.out_runs):
        for into, walls, waits in (("stdout", stdout_wall, stdout_wait), ("file", file_wall, file_wait)):
            os.makedirs(outdir)
            target = "" if into == "stdout" else f" > {os.path.join(outdir, 'file')}"
            try:
                wall, waited = _run(d, outdir, f"head -c {size} /dev/zero{target}")
                if into == "stdout":
                    logs = [f for f in os.listdir(outdir) if f.endswith(".log")]
                    got = sum(os.path.getsize(os.path.join(outdir, f)) for f in logs)
                    if got != size:
                        raise RuntimeError(f"the job's log holds {got} bytes, not {size}")
            finally:
                shutil.rmtree(outdir)
            walls.append(wall)
            waits.append(waited)
        target = os.path.join(outdir, "file")
        for pipe, bare in ((" | cat", bare_pipe), ("", bare_file)):
            os.makedirs(outdir)
            try:
                bare.append(_bare(f"head -c {size} /dev/zero{pipe} > {target}"))
            finally:
                shutil.rmtree(outdir)
    figs["output"].value, figs["output"].baseline = summarize(stdout_wall, "s"), summarize(file_wall, "s")
    figs["output"].details.append(
        f"Submit to `dispatch new --wait` returning (the log delivered): to stdout "
        f"{summarize(stdout_wait, 's').text()}, to a file {summarize(file_wait, 's').text()}.")
    figs["output"].details.append(
        f"Paired, run by run ({len(stdout_wall)} pairs): the job's stdout against its file "
        f"{_pairs(stdout_wall, file_wall)}. The host's own price of a pipe, measured between them without "
        f"hpc-batch: `head | cat > FILE` {summarize(bare_pipe, 's').text()} against `head > FILE` "
        f"{summarize(bare_file, 's').text()}, paired {_pairs(bare_pipe, bare_file)}.")

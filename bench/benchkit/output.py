"""A job that writes a lot to stdout, against the same job writing a file."""

from __future__ import annotations

import json
import os
import shutil
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


def measure(ctx: Context, d: ScratchDaemon, figs: dict[str, Figure]) -> None:
    """Row output: stdout job and file job in turn, their output removed after each run."""
    size = ctx.plan.out_bytes
    outdir = os.path.join(ctx.scratch, "output")
    stdout_wall: list[float] = []
    file_wall: list[float] = []
    stdout_wait: list[float] = []
    file_wait: list[float] = []
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
    figs["output"].value, figs["output"].baseline = summarize(stdout_wall, "s"), summarize(file_wall, "s")
    figs["output"].details.append(
        f"Submit to `dispatch new --wait` returning (the log delivered): to stdout "
        f"{summarize(stdout_wait, 's').text()}, to a file {summarize(file_wait, 's').text()}.")

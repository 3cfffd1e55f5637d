"""``bench/run``: measure every figure, write the markdown table (and optionally JSON)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable

import hpc_batch

from . import (
    benchmode,
    bulkrow,
    calibration,
    client,
    drain,
    history,
    machine,
    output,
    queue,
    recordrow,
    release,
    report,
    restart,
    rows,
    scale,
    shepherd,
    vm,
)
from .context import FULL, SMOKE, Context
from .report import Figure
from .scratchd import DAEMON, DISPATCH, ScratchDaemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUTPUT = os.path.join(ROOT, "docs", "benchmarks.md")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/run", description="Measure hpc-batch against its performance targets and write the table "
        "to docs/benchmarks.md. Run as root from a clone (it starts scratch daemons under --no-cgroups).")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes and few runs, only to show every figure is still produced; needs --output")
    p.add_argument("--output", metavar="PATH", help="markdown to write (default docs/benchmarks.md; "
                   "a smoke run must name another file)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--venv", metavar="DIR", help="the venv with this checkout installed (see bench/README.md)")
    p.add_argument("--no-install", action="store_true", help="never apt-get install task-spooler")
    p.add_argument("--scratch", metavar="DIR", help="where the scratch directory goes (default $TMPDIR or /tmp)")
    p.add_argument("--only", metavar="GROUPS", help="measure only these comma-separated groups: "
                   + ", ".join(rows.GROUPS))
    p.add_argument("--runs", type=int, metavar="N", help="samples per client figure (full 15, smoke 3)")
    p.add_argument("--drain-jobs", type=int, metavar="N", help="jobs per drain (full 900)")
    p.add_argument("--scale-json", metavar="PATH",
                   help="add the figures of a run of tests/integration/test_scale.py (the JSON it writes to "
                   "$HPC_BATCH_SCALE_REPORT) as a section")
    p.add_argument("--verdict-json", metavar="PATH",
                   help="add the table of a `bench/verdict --json PATH` run (how often the record's verdict is "
                   "right) as a section")
    p.add_argument("--vm-json", metavar="PATH",
                   help="fill row (12) from the JSON of a `bench/run --in-guest` run in the system tier's guest "
                   "(tests/system/test_bench_guest.py writes it to $HPC_BATCH_VM_BENCH_REPORT)")
    p.add_argument("--in-guest", metavar="OUT", help="run inside the system tier's guest (root, the installed "
                   "service running): measure only row (12)'s figures there and write them as JSON to OUT")
    p.add_argument("--probe", metavar="EXE", help="with --in-guest: the static probe to time (built on the host; "
                   "default: build one here, or fall back to date)")
    p.add_argument("--note", action="append", default=[], metavar="TEXT",
                   help="a line for the report's notes on this run (repeatable), e.g. what else ran")
    return p


def _fail(message: str) -> int:
    print(f"bench/run: {message}", file=sys.stderr)
    return 2


def _installed_matches_checkout() -> str:
    """A note saying whether the venv's hpc_batch and shepherd are this checkout's files."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(hpc_batch.__file__)))
    differ = []
    for pkg in ("hpc_batch", "shepherd"):
        for name in sorted(os.listdir(os.path.join(ROOT, pkg))):
            if not name.endswith(".py"):
                continue
            mine, theirs = os.path.join(ROOT, pkg, name), os.path.join(site, pkg, name)
            try:
                with open(mine, "rb") as a, open(theirs, "rb") as b:
                    same = hashlib.sha256(a.read()).digest() == hashlib.sha256(b.read()).digest()
            except OSError:
                same = False
            if not same:
                differ.append(f"{pkg}/{name}")
    if not differ:
        return "the venv's hpc-batch is this checkout's code"
    return (f"WARNING: the venv's hpc-batch differs from this checkout in {len(differ)} files ("
            f"{', '.join(differ[:5])}{', ...' if len(differ) > 5 else ''}): reinstall it (./scripts/test does)")


def _measurements(ctx: Context) -> list[tuple[str, Callable[[dict[str, Figure]], None]]]:
    """(group, what fills its rows), in the order they run; *a* is started on first use."""
    pinned: dict[str, ScratchDaemon] = {}

    def a() -> ScratchDaemon:  # pinned to 2 CPUs: the drain's 2 slots; the single-daemon figures share it
        if "a" not in pinned:
            cpus = set(sorted(os.sched_getaffinity(0))[:2])
            pinned["a"] = ctx.daemon("a", cpus=cpus)
        return pinned["a"]

    return [
        ("client", lambda figs: client.measure_client(ctx, a(), figs)),
        ("latency", lambda figs: client.measure_latency(ctx, a(), figs)),
        ("wait", lambda figs: client.measure_wait(ctx, a(), figs)),
        ("shepherd", lambda figs: shepherd.measure(ctx, a(), figs)),
        ("many", lambda figs: shepherd.measure_many(ctx, figs)),
        ("output", lambda figs: output.measure(ctx, a(), figs)),
        ("drain", lambda figs: drain.measure(ctx, a(), figs)),
        ("queue", lambda figs: queue.measure(ctx, figs)),
        ("restart", lambda figs: restart.measure(ctx, figs)),
        ("benchmark", lambda figs: benchmode.measure(ctx, figs)),
        ("release", lambda figs: release.measure(ctx, figs)),
        ("record", lambda figs: recordrow.measure(ctx, figs)),
        ("history", lambda figs: history.measure(ctx, figs)),
        ("bulk", lambda figs: bulkrow.measure(ctx, figs)),
    ]


def _in_guest(args: argparse.Namespace, scratch_parent: str) -> int:
    """``--in-guest OUT``: row (12)'s figures, measured in this guest, as JSON (see benchkit/vm.py)."""
    if os.geteuid() != 0:
        return _fail("--in-guest runs as root in the system tier's guest")
    scratch = tempfile.mkdtemp(prefix="hpcb-vmbench-", dir=scratch_parent)
    os.chmod(scratch, 0o755)
    try:
        vm.run_in_guest(scratch, args.runs or FULL.runs, os.path.abspath(args.in_guest), args.probe,
                        lambda m: print(f"bench: {m}", file=sys.stderr, flush=True))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.smoke and not args.output:
        return _fail("--smoke needs --output PATH: a smoke run must not overwrite docs/benchmarks.md")
    out_path = os.path.abspath(args.output or DEFAULT_OUTPUT)
    if args.smoke and out_path == DEFAULT_OUTPUT:
        return _fail("--smoke must not write docs/benchmarks.md: give --output another path")
    only = set(rows.GROUPS)
    if args.only:
        only = {g.strip() for g in args.only.split(",") if g.strip()}
        unknown = only - set(rows.GROUPS)
        if unknown or not only:
            return _fail(f"--only takes group names from {', '.join(rows.GROUPS)}; got {args.only!r}")
    for name, value in (("--runs", args.runs), ("--drain-jobs", args.drain_jobs)):
        if value is not None and value < 1:
            return _fail(f"{name} must be at least 1 (got {value})")
    for exe in (DISPATCH, DAEMON):
        if not os.access(exe, os.X_OK):
            return _fail(f"{exe} is missing: run bench/run with the python of a venv that has this checkout "
                         "installed, or pass --venv DIR")
    scratch_parent = args.scratch or tempfile.gettempdir()
    if not os.path.isdir(scratch_parent):
        return _fail(f"--scratch {scratch_parent}: no such directory")

    if args.in_guest:
        return _in_guest(args, scratch_parent)
    vm_report = None
    if args.vm_json:
        try:
            vm_report = vm.load(args.vm_json)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return _fail(f"--vm-json {args.vm_json}: not a report of bench/run --in-guest ({exc})")
    scale_report, sections = None, None
    if args.scale_json:
        try:
            with open(args.scale_json) as fh:
                scale_report = json.load(fh)
            sections = scale.section(scale_report)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return _fail(f"--scale-json {args.scale_json}: not a report of tests/integration/test_scale.py ({exc})")
    verdict_report = None
    if args.verdict_json:
        try:
            with open(args.verdict_json) as fh:
                verdict_report = json.load(fh)
            sections = (sections or []) + calibration.section(verdict_report)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return _fail(f"--verdict-json {args.verdict_json}: not a report of bench/verdict --json ({exc})")
    plan = SMOKE if args.smoke else FULL
    plan = dataclasses.replace(plan, runs=args.runs or plan.runs, drain_jobs=args.drain_jobs or plan.drain_jobs)
    figures = rows.table(plan)
    figs = {f.key: f for f in figures}
    scratch = tempfile.mkdtemp(prefix="hpcb-bench-", dir=scratch_parent)
    os.chmod(scratch, 0o755)
    ctx = Context(plan, scratch, install=not args.no_install)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally below
    command = "bench/run" + "".join(f" {shlex.quote(a)}" for a in argv)
    where = machine.describe(ROOT, scratch)
    ctx.notes.append(_installed_matches_checkout())
    ctx.notes += args.note
    if vm_report is not None:
        vm.fill(figs["vm"], vm_report)
    errors = 0
    loads = []
    try:
        for group, fill in _measurements(ctx):
            if group not in only:
                for key in rows.GROUPS[group]:
                    figs[key].missing = figs[key].baseline_missing = f"not run: --only {args.only}"
                continue
            ctx.say(f"measuring {group}")
            loads.append(f"{group} {os.getloadavg()[0]:.2f}")
            try:
                fill(figs)
            except Exception as exc:  # one broken figure must not cost the others
                errors += 1
                traceback.print_exc()
                for key in rows.GROUPS[group]:
                    f = figs[key]
                    if f.value is None and not f.missing:
                        f.missing = f"failed: {exc}".splitlines()[0]
    finally:
        ctx.stop_all()
        shutil.rmtree(scratch, ignore_errors=True)
    load = os.getloadavg()
    where.append(("load average at the end", f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"))
    where.append(("1-minute load average as each group began", ", ".join(loads)))
    if args.smoke:
        ctx.notes.insert(0, "A smoke run: tiny sizes and few runs; its figures say nothing about speed.")
    text = report.markdown(figures, where, command, ctx.notes, sections=sections)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as md:
        md.write(text)
    if args.json:
        with open(args.json, "w") as js:
            json.dump({**report.as_json(figures, where, command, ctx.notes), "scale": scale_report,
                       "vm": vm_report,
                       "verdict": None if verdict_report is None else calibration.as_json(
                           calibration.table(verdict_report["runs"], verdict_report.get("not_measured")))},
                      js, indent=1)
    print(text)
    incomplete = [f.key for f in figures if not f.is_complete()]
    if incomplete:
        print(f"bench/run: figures with neither a value nor a reason: {', '.join(incomplete)}", file=sys.stderr)
    return 1 if errors or incomplete else 0

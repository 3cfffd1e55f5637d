"""``bench/verdict``: how often the record's verdict is right, measured with interference injected on purpose.

The method is in docs/record.md ("How often the verdict is right"), the
options in bench/README.md; the arithmetic in ``calibration`` and the runs in
``verdictrun`` (both shared with tests/bench-mode/check-real-host).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from shepherd.record import verdict

from . import calibration, machine, verdictrun
from .scratchd import DAEMON, DISPATCH, DaemonError, ScratchDaemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FULL_RUNS, SMOKE_RUNS = 20, 2
FULL_SECONDS, SMOKE_SECONDS = 1.0, 0.2
# What --no-cgroups takes from the record, said in every report of a scratch daemon.
NO_CGROUPS = ("The scratch daemon runs under `--no-cgroups`: the job's cgroup counters (memory.events, cpu.stat, "
              "cpu.pressure, memory.pressure) are not recorded, so `memory_events`, `cpu_throttled_periods`, "
              "`job_cpu_pressure` and `job_memory_pressure` judge nothing (the verdict's notes say so); others' "
              "CPU time is still judged, with the job's own CPU time from its rusage (`/proc/stat - wait4(2) "
              "rusage`), and so are the involuntary context switches: those two carry the busy-loop case.")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/verdict", description="How often the record's verdict is right: fixed workloads run as "
        "jobs of a scratch daemon, quiet and with each kind of interference injected on purpose; the table "
        "of recall, right cause, false alarms and missed runs. Run as root from a clone.")
    p.add_argument("--runs", type=int, metavar="N", help=f"runs of each workload per kind (default {FULL_RUNS})")
    p.add_argument("--smoke", action="store_true",
                   help=f"{SMOKE_RUNS} runs of each, short workloads: only to show the table is produced")
    p.add_argument("--kinds", metavar="LIST", help="kinds to run, comma-separated, from "
                   + ", ".join(k.name for k in calibration.KINDS) + " (default all; quiet is always run "
                   "unless --verdicts-only)")
    p.add_argument("--workloads", metavar="LIST", default=",".join(verdictrun.WORKLOADS),
                   help="cpu, memory or both (default both)")
    p.add_argument("--seconds", type=float, metavar="S",
                   help=f"each workload's work, sized on the job's CPU (default {FULL_SECONDS}, smoke {SMOKE_SECONDS})")
    p.add_argument("--cpu", type=int, metavar="N", help="the job's CPU (default: the CPU where the disk's "
                   "interrupts land when another CPU reads it, else the highest CPU)")
    p.add_argument("--python", metavar="EXE", help="the jobs' python (default /usr/bin/python3, else this one)")
    p.add_argument("--job-option", action="append", default=[], metavar="WORD",
                   help="a word added to each job's dispatch new (repeatable), e.g. --job-option=--benchmark")
    p.add_argument("--verdicts-only", action="store_true", help="report the share called noisy and the right "
                   "cause per kind, no timing (for a guest whose times mean nothing, such as the SMT guest under TCG)")
    p.add_argument("--output", metavar="PATH", help="write the report as markdown here (it always goes to stdout)")
    p.add_argument("--json", metavar="PATH", help="also write the report, every run with its record's delta, as JSON")
    p.add_argument("--from-json", metavar="PATH", help="no runs: the table of the runs of an earlier --json")
    p.add_argument("--thresholds", metavar="LIST", help="judge every run's delta again with these thresholds "
                   "(NAME=VALUE,..., as --record-thresholds): what a threshold would have changed")
    p.add_argument("--venv", metavar="DIR", help="the venv with this checkout installed (as bench/run)")
    p.add_argument("--scratch", metavar="DIR", default="/var/tmp",
                   help="where the scratch directory and the O_DIRECT file go: a disk, not tmpfs (default /var/tmp)")
    p.add_argument("--note", action="append", default=[], metavar="TEXT", help="a line for the report's notes")
    return p


def _fail(message: str) -> int:
    print(f"bench/verdict: {message}", file=sys.stderr)
    return 2


def _kinds(args: argparse.Namespace) -> list[str]:
    names = [k.name for k in calibration.KINDS]
    if not args.kinds:
        return names
    asked = [w.strip() for w in args.kinds.split(",") if w.strip()]
    bad = [w for w in asked if w not in names]
    if bad or not asked:
        raise ValueError(f"--kinds takes names from {', '.join(names)}; got {args.kinds!r}")
    if not args.verdicts_only and "quiet" not in asked:
        asked.insert(0, "quiet")      # the reference every deviation is taken from
    return [n for n in names if n in asked]


def _python(args: argparse.Namespace) -> str:
    if args.python:
        return str(args.python)
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def _write(args: argparse.Namespace, report: dict[str, Any]) -> None:
    text = "\n".join(calibration.section(report, "# How often the verdict is right")) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**report, "table": calibration.as_json(calibration.table(report["runs"],
                                                                                report.get("not_measured")))},
                      f, indent=1)
    print(text)


def _from_json(args: argparse.Namespace, command: str) -> int:
    """--from-json: the table of an earlier run's report, its notes added to, its runs judged again with
    --thresholds."""
    try:
        with open(args.from_json) as f:
            report = json.load(f)
        runs = report["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _fail(f"--from-json {args.from_json}: not a report of bench/verdict --json ({exc})")
    if args.thresholds:
        try:
            overrides = verdictrun.parse_thresholds(args.thresholds)
        except ValueError as exc:
            return _fail(f"--thresholds: {exc}")
        runs = verdictrun.rejudge(runs, overrides)
        report["setup"] = report.get("setup", []) + [
            f"verdicts judged again from each run's recorded delta (`{command}`), not as the daemon judged "
            "them: the thresholds given, the rest as `shepherd/record/verdict.py` here has them"]
    report.update(runs=runs, words=verdict.CAUSE_WORDS, notes=report.get("notes", []) + args.note)
    if args.verdicts_only:
        report["verdicts_only"] = True
    _write(args, report)
    return 0


def _job_cpu(args: argparse.Namespace, placer: verdictrun.IrqPlacer | None) -> tuple[int, str]:
    """The CPU the jobs run on, and why that one."""
    allowed = sorted(os.sched_getaffinity(0))
    if args.cpu is not None:
        return args.cpu, "given with --cpu"
    if placer is not None:
        for issuer in allowed:
            landing = placer.probe(issuer)
            if landing["cpu"] is not None and landing["cpu"] != issuer and landing["cpu"] in allowed:
                return int(landing["cpu"]), (f"the disk's interrupts land there when CPU {issuer} reads it "
                                             f"({', '.join(landing['irqs'])})")
    return allowed[-1], "the highest CPU (the disk's interrupts land on no other CPU than the reader's)"


def _housekeeping(allowed: list[int], core: list[int]) -> list[int]:
    """The core the scratch daemon keeps for itself (``--reserve-cpu 1`` takes the lowest), so that it and
    its shepherds run off the job's core, as a deployed daemon's do; [] when the job's core is the lowest."""
    below = [c for c in allowed if c < min(core)]
    if not below:
        return []
    return sorted({below[0], *verdictrun.smt_siblings(below[0])} & set(allowed))


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    command = "bench/verdict" + "".join(f" {shlex.quote(a)}" for a in argv)
    if args.from_json:
        return _from_json(args, command)
    if args.thresholds:
        return _fail("--thresholds judges the runs of --from-json again; a new run uses the daemon's thresholds")
    try:
        kinds = _kinds(args)
    except ValueError as exc:
        return _fail(str(exc))
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads or set(workloads) - set(verdictrun.WORKLOADS):
        return _fail(f"--workloads takes cpu and memory; got {args.workloads!r}")
    rounds = args.runs or (SMOKE_RUNS if args.smoke else FULL_RUNS)
    seconds = args.seconds or (SMOKE_SECONDS if args.smoke else FULL_SECONDS)
    if rounds < 1 or seconds <= 0:
        return _fail("--runs must be at least 1 and --seconds more than 0")
    for exe in (DISPATCH, DAEMON):
        if not os.access(exe, os.X_OK):
            return _fail(f"{exe} is missing: run bench/verdict with a venv that has this checkout installed")
    if not os.path.isdir(args.scratch):
        return _fail(f"--scratch {args.scratch}: no such directory")
    python = _python(args)
    scratch = tempfile.mkdtemp(prefix="hpcb-verdict-", dir=args.scratch)
    os.chmod(scratch, 0o755)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # through the finally below
    say = verdictrun.eprint
    daemon: ScratchDaemon | None = None
    not_measured: dict[str, str] = {}
    try:
        placer, irq_why = None, ""
        if "irq" in kinds:
            path, irq_why = verdictrun.scratch_file(scratch)
            if path is not None:
                placer = verdictrun.IrqPlacer(path, sorted(os.sched_getaffinity(0)))
        cpu, why_cpu = _job_cpu(args, placer)
        core = sorted({cpu, *verdictrun.smt_siblings(cpu)} & set(os.sched_getaffinity(0)))
        mib = max(64, 1 << max(0, (2 * verdictrun.l3_mib(cpu) - 1).bit_length()))
        say(f"jobs on CPU {cpu} ({why_cpu}); sizing the workloads to {seconds} s each")
        steps = {w: verdictrun.size(python, w, cpu, seconds, mib) for w in workloads}
        allowed = sorted(os.sched_getaffinity(0))
        where = machine.describe(ROOT)     # before this process keeps off the job's core
        housekeeping = _housekeeping(allowed, core)
        daemon = ScratchDaemon(os.path.join(scratch, "d"), cpus=set(core) | set(housekeeping),
                               args=("--reserve-cpu", "1") if housekeeping else ())
        daemon.start()
        tool_cpus = verdictrun.keep_off(core)    # this process and its dispatch calls stay off the job's core

        def dispatch(*words: str, check: bool = True) -> str:
            try:
                return daemon.dispatch(*words, check=check).stdout
            except DaemonError as exc:
                raise verdictrun.RunError(str(exc)) from exc
        injector = verdictrun.Injector(python, placer, irq_why, allowed)
        for kind in kinds:     # what cannot be placed around the job's CPU is said before any run
            why = injector.why_not(kind, [cpu], core)
            if why:
                not_measured[kind] = why
                say(f"{kind}: not measured: {why}")
        runner = verdictrun.Runner(verdictrun.Client(dispatch), injector, python, daemon.work,
                                   tuple(args.job_option), steps, mib, say)
        load_start = os.getloadavg()
        runs, failures = verdictrun.calibrate(runner, workloads, kinds, rounds, not_measured)
        load_end = os.getloadavg()
    except (verdictrun.RunError, DaemonError, subprocess.CalledProcessError, OSError) as exc:
        return _fail(f"{exc}")
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    placed = {r["kind"]: r.get("placed") for r in runs}
    irq = placed.get("irq") or {}
    setup = [
        f"the jobs: `dispatch new --json --cpu 1 {''.join(o + ' ' for o in args.job_option)}--output LOG -- "
        f"{python} -c WORKLOAD` on a scratch daemon offering CPU{'s' if len(core) > 1 else ''} "
        f"{','.join(map(str, core))}; they ran on CPU {cpu} ({why_cpu}); "
        + (f"the daemon and its shepherds on CPU {','.join(map(str, housekeeping))} (`--reserve-cpu 1`, its "
           "housekeeping CPUs)" if housekeeping else "the daemon and its shepherds on the same CPUs (no lower "
           "core to keep for them)"),
        f"workloads, each sized to about {seconds} s of work on that CPU with nothing injected: "
        + ", ".join(f"{w} {steps[w]:,} steps" for w in workloads)
        + f" (memory: a pointer chase over a {mib} MiB array; the L3 here is {verdictrun.l3_mib(cpu)} MiB)",
        "each run's time is the job's own timing of its work (perf_counter around it, printed by the job), "
        "not the record's `wall_s`, which also holds the interpreter's start, the set-up and the wait for "
        "the release",
        f"this tool and its `dispatch` calls ran on CPU{'s' if len(tool_cpus) > 1 else ''} "
        f"{','.join(map(str, tool_cpus)) or '(all: no other)'}, off the job's; it polls nothing while a job works",
        f"{rounds} runs of each workload per kind, interleaved round by round (every kind in each round); "
        f"interference starts once the job runs and {verdictrun.SETTLE_S} s before it is released",
        "interference placed: " + "; ".join(
            f"{k} on CPU {','.join(map(str, (v or {}).get('on', [])))}" for k, v in placed.items() if v)
        + (f"; the disk's reads from CPU {irq['on'][0]} land on CPU {irq['lands_on']} "
           f"({', '.join(irq.get('irqs', []))}; effective_affinity_list "
           f"{', '.join(f'IRQ {n}: {a}' for n, a in irq.get('effective_affinity', {}).items())})" if irq else ""),
        verdictrun.summary_line(runs) + f"; load average at the start {load_start[0]:.2f} {load_start[1]:.2f} "
        f"{load_start[2]:.2f}, at the end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}",
        "thresholds in force (the daemon's defaults, `shepherd/record/verdict.py`): " + ", ".join(
            f"{k}={'none' if v is None else v}" for k, v in sorted(verdict.THRESHOLDS.items())),
    ]
    notes = [NO_CGROUPS] + [f"the verdict's notes in these records: {n}" for n in verdictrun.notes_seen(runs)[:6]]
    if args.smoke:
        notes.insert(0, f"A smoke run: {rounds} short runs of each; its shares say nothing.")
    report = {"command": command, "date": dict(where).get("date"),
              "machine": where, "setup": setup, "notes": notes + args.note,
              "runs": runs, "not_measured": not_measured, "failures": failures,
              "verdicts_only": args.verdicts_only, "words": verdict.CAUSE_WORDS,
              "settings": {"rounds": rounds, "seconds": seconds, "cpu": cpu, "steps": steps, "mib": mib,
                           "kinds": kinds, "workloads": workloads, "python": python}}
    _write(args, report)
    return 1 if failures else 0

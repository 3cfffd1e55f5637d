"""The scale test's figures as a section of docs/benchmarks.md (pure).

``tests/integration/test_scale.py`` writes its figures as JSON to
``$HPC_BATCH_SCALE_REPORT``; ``bench/run --scale-json PATH`` puts them under
the table, so the one generated file holds both and is never edited by hand.
"""

from __future__ import annotations

from typing import Any

_OPS = ("list", "new")


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 10 else f"{x:.1f} s"


def _cell(fig: dict[str, Any] | None) -> str:
    if not fig:
        return "-"
    return f"{_ms(fig['p50'])} / {_ms(fig['p99'])} / {_ms(fig['max'])} ({fig['n']})"


def _mix(mix: dict[str, int]) -> str:
    return (f"{mix['ran']:,} run to the end, {mix['cancelled']:,} cancelled, {mix['running']} running, "
            f"{mix['front'] + mix['queued']:,} queued, two fan-outs of {mix['fan']:,} and one of {mix['hold']:,} "
            f"waiting on one job each (`--after-ok`), two chains of {mix['chain']:,} single `--after-ok` jobs")


def section(r: dict[str, Any]) -> list[str]:
    """Markdown lines for the report *r* the scale test wrote."""
    size = "the issue's full size" if r.get("full") else "the size CI runs"
    lines = ["## Scale test", "",
             f"From `tests/integration/test_scale.py` at N = {r['n']:,} ({size}), run {r['date']} on this "
             f"machine ({r['cpus']} CPUs; 1-minute load average {r['load_at_start']:.2f} at its start, "
             f"{r.get('load_at_end', float('nan')):.2f} at its end). hpcb-alice holds "
             f"the N jobs: {_mix(r['mix'])}.", "",
             "Answer times are hpcb-bob's, timed by a long-lived client of his (`answer_probe.py`): from "
             "just before the connect to the whole reply read, so no interpreter start-up is in them. Each "
             "`new` is cancelled at once, so bob's own listing stays short. Phases marked with a window "
             "count only the answers that overlap it: from the gate job's exit to the daemon reporting the "
             "fan-out settled.", "",
             "| phase | bob's `list`: p50 / p99 / max (answers) | bob's `new`: p50 / p99 / max (answers) |",
             "|---|---|---|"]
    for name, figs in r["phases"].items():
        lines.append(f"| {name} | {_cell(figs.get('list'))} | {_cell(figs.get('new'))} |")
        if "in_window" in figs:
            w = figs["in_window"]
            lines.append(f"| ... in its {figs['window_s']:.2f} s window | {_cell(w.get('list'))} | "
                         f"{_cell(w.get('new'))} |")
    lines.append("")
    wall = r.get("dispatch_wall_s", {})
    if wall:
        lines.append(f"- The real `dispatch` as bob, run with `runuser` (whole process, median of "
                     f"{wall['list']['n']}): `list` {_ms(wall['list']['p50'])}, `new` {_ms(wall['new']['p50'])}; "
                     f"`runuser -u bob true` alone {_ms(wall['runuser_true']['p50'])}.")
    subs = r.get("submit_s", {})
    if subs:
        lines.append(f"- alice's bulk submits (`dispatch new --array`, whole process): "
                     f"{r['mix']['queued']:,} queued in {subs['queued']:.1f} s, fan-outs of {r['mix']['fan']:,} "
                     f"in {subs['fan_ok']:.1f} s and {subs['fan_fail']:.1f} s; all of the set-up "
                     f"{r['setup_s']:.0f} s. One bulk is one request: the loop answers no one meanwhile.")
    lines.append(f"- The daemon's peak RSS (`VmHWM`): {r['rss_peak_mib']:.1f} MiB; the test's bound "
                 f"{r['rss_bound_mib']:.1f} MiB (64 MiB and 6 KiB per job held).")
    lines.append(f"- Restart after `kill -9`, from starting it to a list request answered: {r['restart_s']:.1f} s "
                 f"(bound {r['restart_bound_s']:g} s); every job then came back once, in the state it had. "
                 f"`dispatch list --all --finished --json` of all of them then took "
                 f"{r['restart_list_all_wall_s']:.1f} s.")
    bad = r.get("violations") or []
    lines.append("- Bounds broken: " + ("; ".join(bad) if bad else "none") + ".")
    return lines + [""]

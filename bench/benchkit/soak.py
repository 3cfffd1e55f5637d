"""The mixed soak's figures as a section of docs/benchmarks.md (pure).

``tests/integration/test_soak_mixed.py`` writes its figures as JSON to
``$HPC_BATCH_SOAK_REPORT``; ``section`` turns one such report into the
markdown of the "Soak" section, so the section is generated, not typed. A
report may carry ``findings``: lines on what the run found, which the test
cannot write itself (it fails instead), added before it is rendered.
"""

from __future__ import annotations

from typing import Any

_MIB = 1 << 20


def _mib(n: float) -> str:
    return f"{n / _MIB:.1f} MiB"


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def _limits(base: dict[str, Any], m: dict[str, Any]) -> dict[str, float]:
    """The most each figure may be at the end, from the baseline and the test's margins."""
    share, floor = m["rss"]
    return {"rss": max(base["rss"] * (1 + share), base["rss"] + floor), "fds": base["fds"] + m["fds"],
            "threads": base["threads"] + m["threads"], "state": base["state"] + m["state"],
            "journal": base["journal"] + m["journal"]}


_KINDS = (("reload", "reloads"), ("restart", "restarts"), ("kill9", "`kill -9`s"))


def _by_kind(each: dict[str, Any] | None) -> str:
    """The answers overlapping events, one clause per kind of event (a report from before has none)."""
    if not each:
        return ""
    parts = [f"{name} p99 {_ms(each[k]['p99'])}, max {_ms(each[k]['max'])} ({each[k]['n']:,})"
             for k, name in _KINDS if each.get(k, {}).get("n")]
    return f"By kind: {'; '.join(parts)}. " if parts else ""


def section(r: dict[str, Any]) -> list[str]:
    """Markdown lines for the report *r* the soak test wrote."""
    base, end, fresh, peaks, m = r["baseline"], r["end"], r["end_fresh"], r["peaks"], r["margins"]
    limit = _limits(base, m)
    a, b, ans = r["alice"], r["bob"], r["answers"]
    steady, around = ans["steady"], ans["around_events"]
    ev = r["events"]
    lines = ["## Soak", "",
             f"From `tests/integration/test_soak_mixed.py` with `HPC_BATCH_SOAK_MINUTES={r['knob']:g}` "
             f"({r['minutes']:.1f} minutes of load, seed {r['seed']}), run {r['date']} on this machine "
             f"({r['cpus']} CPUs, shared: other tests ran on it meanwhile; 1-minute load average "
             f"{r['load_at_start']:.2f} at its start, {r['load_at_end']:.2f} at its end). CI runs the same test "
             "for 3 minutes.", "",
             f"- Load: hpcb-alice ran {a['rounds']:,} rounds, {a['jobs']:,} jobs: {a['array']:,} `--array` "
             f"elements (3 to 8 a submit, `%1` to `%3` caps), {a['chain']:,} links of `--after-ok`/`--after` "
             f"chains with a failing link, {a['killed']:,} jobs killed (waiting, queued or running) and "
             f"{a['benchmark']:,} `--benchmark` jobs. hpcb-bob sat at his limits (`--max-queued-per-user 24`, "
             f"`--max-job-size 64K`, `--max-connections-per-user 8`): {b['jobs']:,} jobs taken, "
             f"{b['large_accepted']:,} of them a command 1 KiB under the size limit; refused "
             f"{b['refused']['queue_full']:,} times `queue_full`, {b['refused']['too_large']:,} `too_large`, "
             f"{b['refused']['busy']:,} `busy` (his ninth connection). hpcb-admin's pinger asked "
             f"`ping` and `list` every 0.1 s.",
             f"- Events: {ev['reload']} reloads (SIGHUP, every 5 minutes), {ev['restart']} restarts (SIGTERM, "
             f"start) and {ev['kill9']} `kill -9`s (then start), the last two at random moments while jobs ran.",
             f"- Jobs: {r['history_rows']:,} in the history at the end, each once; "
             + ("every job a client was told of is there with the end it had to have (exit code, `cancelled`, "
                "`killed`, `dependency-failed`); none ended `lost`; "
                if not r.get("findings") else "what the findings below say of the rest; ")
             + f"{b['extra_in_history']} taken whose answer a `kill -9` cut off.",
             *[f"- Found: {f}" for f in r.get("findings", [])], "",
             "The daemon at rest (its figures' least over 5 s, after a `list`, a `history` and a `status`): the "
             "baseline after a warm-up round and a fresh start; at the end once everything drained (the image "
             "that served since the last reload: a reload re-executes the daemon, so descriptors and threads "
             "live through every one); and once more after a final restart, fresh as the baseline was. The "
             "state directory leaves out the history archive (it keeps finished jobs by design, bounded by "
             "`--history-per-user`) and the journal (compacted when it has doubled since its last snapshot).",
             "",
             "| figure | baseline | end | end, fresh | peak during the run | end may be | within? |",
             "|---|---|---|---|---|---|---|"]

    def row(name: str, key: str, fmt: Any, margin: str) -> None:
        ok = end[key] <= limit[key] and fresh[key] <= limit[key] if key in limit else None
        peak = fmt(peaks[key]) if key in peaks else "-"
        lines.append(f"| {name} | {fmt(base[key])} | {fmt(end[key])} | {fmt(fresh[key])} | {peak} | {margin} "
                     f"| {'-' if ok is None else 'yes' if ok else 'no'} |")

    share, floor = m["rss"]
    row("RSS", "rss", _mib, f"+{share:.0%} or +{_mib(floor)}, whichever is more")
    row("... of it anonymous", "rss_anon", _mib, "-")
    row("open descriptors", "fds", str, f"+{m['fds']}")
    row("threads", "threads", str, f"+{m['threads']}")
    row("state directory", "state", _mib, f"+{_mib(m['state'])}")
    row("journal", "journal", _mib, f"+{_mib(m['journal'])}")
    row("history archive (reported)", "history", _mib, "-")
    lines += ["",
              f"Answers to the pinger, from just before its connect to the whole reply read: away from any "
              f"reload or restart p50 {_ms(steady['p50'])}, p99 {_ms(steady['p99'])}, max {_ms(steady['max'])} "
              f"({steady['n']:,} answers); overlapping one, p99 {_ms(around['p99'])}, max {_ms(around['max'])} "
              f"({around['n']:,}); {ans['unanswered_around_events']} refused while the daemon was down for a "
              f"restart, {ans['unanswered_otherwise']} otherwise. "
              + _by_kind(ans.get("around_each"))
              + "The issue's target is every answer within 100 ms: "
              + ("met." if steady["max"] is not None and steady["max"] <= 0.1 and (around["max"] or 0) <= 0.1
                 else "not met on this loaded host; the test asserts only liveness "
                      f"(every answer within {m['alive_s']:g} s), since no test judges time on a shared machine."),
              ""]
    return lines

"""How often the record's verdict is right: the arithmetic and the table of ``bench/verdict`` (pure).

A *run* is one job of a fixed workload, with or without interference of one
*kind* injected on purpose, as a dict::

    {"workload": "cpu", "kind": "busy", "time_s": 1.03, "verdict": "noisy",
     "causes": ["others_cpu_fraction", "nivcsw_per_cpu_s"], "figures": {...}}

``time_s`` is the job's own timing of its work (None in a verdicts-only
run); ``causes`` is the verdict's list (None when the daemon's verdict has
none). Each run's deviation is its time against the median of the quiet
runs of its workload; from those (issue 30):

- recall: of the runs more than 2 % slower, the share called noisy;
- right cause: of those, the share whose causes name the kind injected;
- false alarms: of the runs within 1 % of the quiet median, the share called
  noisy;
- missed: of the runs called clean or unknown, the share more than 2 % slower.

A share with nothing to count is "n/a", never a division by zero. Kinds the
machine cannot produce are "not measured" with the reason, and count for
nothing. Standard library only: tests/bench-mode/check-real-host loads this
too, with the system python.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

SLOW = 0.02     # a run more than 2 % slower than the quiet median was slowed
SAME = 0.01     # a run within 1 % of it was not
# The targets: (figure, at least / at most, bound).
TARGETS = (("recall", ">=", 0.95), ("right_cause", ">=", 0.90), ("missed", "<=", 0.05))


@dataclass(frozen=True)
class Kind:
    """One kind of interference: its name, what is injected, and the verdict causes that name it."""

    name: str
    what: str
    causes: tuple[str, ...]


KINDS = (
    Kind("quiet", "nothing injected", ()),
    Kind("busy", "a busy loop on the job's CPU", ("others_cpu_fraction", "nivcsw_per_cpu_s", "job_cpu_pressure")),
    Kind("membw", "a memory-bandwidth hog on another CPU of the job's L3",
         ("others_l3_fraction", "others_node_fraction")),
    Kind("irq", "device interrupts on the job's CPU (O_DIRECT reads issued from another CPU)",
         ("device_irqs_per_cpu_s", "device_interrupts")),
    Kind("sibling", "a busy loop on the job's SMT sibling (held idle for it)",
         ("others_held_fraction", "others_l3_fraction", "others_node_fraction")),
    Kind("swap", "swapping (a process over its own cgroup's memory.max, on another CPU)",
         ("swap_pages", "memory_events", "job_memory_pressure")),
    Kind("throttle", "thermal throttling of the job's CPU", ("throttle_events",)),
)
KIND = {k.name: k for k in KINDS}
INJECTED = tuple(k.name for k in KINDS if k.name != "quiet")

# The sentinel figures each run keeps (verdictrun.figures), and their column headings.
FIGURES = (("device_irqs_per_cpu_s", "device IRQs / CPU-s"), ("nivcsw_per_cpu_s", "nivcsw / CPU-s"),
           ("others_cpu_fraction", "others on its CPU"), ("others_l3_fraction", "others on its L3"),
           ("others_held_fraction", "others on its held CPUs"),
           ("ipis_per_cpu_s", "IPIs / CPU-s"), ("swap_pages", "swap pages"))
PERCENT_FIGURES = {"others_cpu_fraction", "others_l3_fraction", "others_held_fraction"}


@dataclass(frozen=True)
class Share:
    """*num* of *den*; "n/a" when *den* is 0."""

    num: int
    den: int

    @property
    def value(self) -> float | None:
        return self.num / self.den if self.den else None

    def text(self) -> str:
        if not self.den:
            return "n/a"
        return f"{100 * self.num / self.den:.0f}% ({self.num}/{self.den})"

    def as_dict(self) -> dict[str, Any]:
        return {"num": self.num, "den": self.den, "value": self.value}


def names_kind(run: dict[str, Any], kind: str) -> bool:
    """Whether the run's causes name the interference *kind*."""
    return bool(set(run.get("causes") or ()) & set(KIND[kind].causes))


def noisy(run: dict[str, Any]) -> bool:
    return run.get("verdict") == "noisy"


def quiet_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per workload, the median time of its quiet runs (workloads without timed quiet runs are left out)."""
    times: dict[str, list[float]] = {}
    for r in runs:
        if r["kind"] == "quiet" and r.get("time_s") is not None:
            times.setdefault(r["workload"], []).append(r["time_s"])
    return {w: statistics.median(t) for w, t in times.items()}


def deviation(run: dict[str, Any], medians: dict[str, float]) -> float | None:
    """How much slower than its workload's quiet median the run was (0.05: 5 % slower); None if untimed."""
    base = medians.get(run["workload"])
    if run.get("time_s") is None or not base:
        return None
    return float(run["time_s"] / base - 1)


def row(runs: list[dict[str, Any]], medians: dict[str, float], kind: str | None) -> dict[str, Any]:
    """The figures of one row over *runs*; *kind* None pools injected kinds (right cause: each its own)."""
    devs = [deviation(r, medians) for r in runs]
    timed = [(r, d) for r, d in zip(runs, devs) if d is not None]
    slow = [r for r, d in timed if d > SLOW]
    slow_noisy = [r for r in slow if noisy(r)]
    judged = [r for r in slow_noisy if r["kind"] != "quiet" and r.get("causes") is not None]
    right = [r for r in judged if names_kind(r, r["kind"])]
    same = [r for r, d in timed if abs(d) <= SAME]
    calm = [(r, d) for r, d in timed if not noisy(r)]
    noisy_all = [r for r in runs if noisy(r)]
    noisy_named = [r for r in noisy_all if r["kind"] != "quiet" and r.get("causes") is not None]
    out: dict[str, Any] = {
        "runs": len(runs),
        "median_slowdown": statistics.median([d for _, d in timed]) if timed else None,
        "called_noisy": Share(len(noisy_all), len(runs)),
        "recall": Share(len(slow_noisy), len(slow)),
        "right_cause": Share(len(right), len(judged)),
        "false_alarms": Share(sum(1 for r in same if noisy(r)), len(same)),
        "missed": Share(sum(1 for _, d in calm if d > SLOW), len(calm)),
        # Verdicts only: of the runs called noisy, the share that named the kind injected.
        "noisy_named": Share(sum(1 for r in noisy_named if names_kind(r, r["kind"])), len(noisy_named)),
        "causes": cause_counts(noisy_all),
        "no_causes": sum(1 for r in runs if r.get("causes") is None),
    }
    if kind == "quiet":
        out["right_cause"] = out["noisy_named"] = Share(0, 0)     # nothing injected: nothing to name
    return out


def cause_counts(runs: list[dict[str, Any]]) -> dict[str, int]:
    """How many of *runs* gave each noisy cause (``unknown:...`` left out), the most frequent first."""
    counts: dict[str, int] = {}
    for r in runs:
        for c in dict.fromkeys(r.get("causes") or ()):
            if not c.startswith("unknown:"):
                counts[c] = counts.get(c, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def targets(r: dict[str, Any]) -> dict[str, bool | None]:
    """Each target of the issue, met or not (None: nothing to judge it on)."""
    out: dict[str, bool | None] = {}
    for name, op, bound in TARGETS:
        v = r[name].value
        out[name] = None if v is None else (v >= bound if op == ">=" else v <= bound)
    return out


def table(runs: list[dict[str, Any]], not_measured: dict[str, str] | None = None) -> dict[str, Any]:
    """Every row: per workload and kind, per workload over the injected kinds, and over everything."""
    medians = quiet_medians(runs)
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    kinds = [k.name for k in KINDS if any(r["kind"] == k.name for r in runs)]
    rows = []
    for w in workloads:
        mine = [r for r in runs if r["workload"] == w]
        for k in kinds:
            of_kind = [r for r in mine if r["kind"] == k]
            if of_kind:
                rows.append({"workload": w, "kind": k, **row(of_kind, medians, k)})
        injected = [r for r in mine if r["kind"] != "quiet"]
        if injected:
            rows.append({"workload": w, "kind": "all injected", **row(injected, medians, None)})
    pooled = row(runs, medians, None) if runs else None
    return {"quiet_medians": medians, "rows": rows, "all": pooled,
            "targets": targets(pooled) if pooled else {}, "not_measured": dict(not_measured or {}),
            "irq_cost_s": irq_cost(runs, medians)}


def irq_cost(runs: list[dict[str, Any]], medians: dict[str, float]) -> dict[str, Any] | None:
    """What one device interrupt cost the job, from the irq runs: the median of slowdown / interrupt rate.

    A run slowed by a fraction *f* while *R* device interrupts per CPU-second
    landed on its CPUs paid about *f* / *R* CPU-seconds for each. None without
    an irq run that was both slowed and interrupted.
    """
    costs = []
    for r in runs:
        d = deviation(r, medians)
        rate = (r.get("figures") or {}).get("device_irqs_per_cpu_s")
        if r["kind"] == "irq" and d is not None and d > 0 and rate:
            costs.append(d / rate)
    if not costs:
        return None
    return {"median": statistics.median(costs), "min": min(costs), "max": max(costs), "n": len(costs)}


# --- the report -------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def _figure(name: str, values: list[float]) -> str:
    if not values:
        return "-"
    if name in PERCENT_FIGURES:
        shown = [f"{v * 100:.1f}%" for v in (statistics.median(values), min(values), max(values))]
    else:
        shown = [f"{v:.3g}" for v in (statistics.median(values), min(values), max(values))]
    return f"{shown[0]} [{shown[1]}-{shown[2]}]"


def _causes(counts: dict[str, int], words: dict[str, str], most: int = 3) -> str:
    listed = [f"{words.get(c, c)} {n}" for c, n in list(counts.items())[:most]]
    return ", ".join(listed) or "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(tab: dict[str, Any], runs: list[dict[str, Any]], words: dict[str, str],
             verdicts_only: bool = False) -> list[str]:
    """The tables as markdown lines: the verdict's record per kind, the sentinels' figures, what was not measured."""
    lines = []
    if verdicts_only:
        head = ["workload", "kind", "runs", "called noisy", "right cause (of noisy)", "causes seen (noisy runs)"]
    else:
        head = ["workload", "kind", "runs", "median slowdown", "called noisy", "recall", "right cause",
                "false alarms", "missed", "causes seen (noisy runs)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in tab["rows"]:
        if verdicts_only:
            cells = [r["workload"], r["kind"], str(r["runs"]), r["called_noisy"].text(), r["noisy_named"].text(),
                     _causes(r["causes"], words)]
        else:
            cells = [r["workload"], r["kind"], str(r["runs"]), _pct(r["median_slowdown"]), r["called_noisy"].text(),
                     r["recall"].text(), r["right_cause"].text(), r["false_alarms"].text(), r["missed"].text(),
                     _causes(r["causes"], words)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for kind, why in tab["not_measured"].items():
        cells = ["all", kind, "0", *([f"not measured: {why}"] + ["-"] * (len(head) - 4))]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines.append("")
    pooled = tab["all"]
    if pooled is not None and not verdicts_only:
        met = tab["targets"]
        said = []
        for name, op, bound in TARGETS:
            word = {True: "met", False: "NOT met", None: "n/a"}[met.get(name)]
            said.append(f"{name.replace('_', ' ')} {pooled[name].text()} (target {op} {bound * 100:.0f}%: {word})")
        lines.append(f"All runs together: {'; '.join(said)}; false alarms {pooled['false_alarms'].text()}.")
        quiet = [r for r in tab["rows"] if r["kind"] == "quiet"]
        if quiet:
            lines.append("False alarms of the quiet runs alone: " + "; ".join(
                f"{r['workload']} {r['false_alarms'].text()}" for r in quiet) + ".")
    elif pooled is not None:
        lines.append(f"All runs together: called noisy {pooled['called_noisy'].text()}; of the injected runs "
                     f"called noisy, naming the kind injected {pooled['noisy_named'].text()}.")
    if any(r.get("causes") is None for r in runs):
        lines.append("Some records had no `causes` (a daemon older than them): their right cause is not counted.")
    cost = tab.get("irq_cost_s")
    if cost and not verdicts_only:
        lines.append(f"One device interrupt cost the job about {cost['median'] * 1e6:.1f} µs (median of slowdown / "
                     f"device IRQs per CPU-second over {cost['n']} slowed irq runs; "
                     f"{cost['min'] * 1e6:.1f}-{cost['max'] * 1e6:.1f} µs).")
    lines += ["", "The sentinels' figures per run, median [min-max]:", ""]
    head = ["workload", "kind"] + [label for _, label in FIGURES]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["workload"], r["kind"]), []).append(r)
    order = {k.name: i for i, k in enumerate(KINDS)}
    workloads = list(dict.fromkeys(w for w, _ in groups))
    for (w, k), got in sorted(groups.items(), key=lambda item: (workloads.index(item[0][0]),
                                                                  order.get(item[0][1], 99))):
        cells = [w, k] + [_figure(name, [r["figures"][name] for r in got
                                         if (r.get("figures") or {}).get(name) is not None])
                          for name, _ in FIGURES]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def as_json(tab: dict[str, Any]) -> dict[str, Any]:
    """The table as JSON-safe data (shares as ``{"num", "den", "value"}``)."""
    def plain(x: Any) -> Any:
        if isinstance(x, Share):
            return x.as_dict()
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list):
            return [plain(v) for v in x]
        return x
    out: dict[str, Any] = plain(tab)
    return out


def section(report: dict[str, Any], title: str = "## How often the verdict is right") -> list[str]:
    """The whole markdown section for a report of ``bench/verdict --json`` (or check-real-host's):
    where and how it ran, the tables, what was not measured and why."""
    runs = report["runs"]
    verdicts_only = bool(report.get("verdicts_only"))
    tab = table(runs, report.get("not_measured"))
    lines = [title, "", f"From `{report['command']}`, {report.get('date', '?')}."
             + (" Verdicts only: the times here mean nothing, so nothing is timed." if verdicts_only else ""), ""]
    lines += [f"- {k}: {v}" for k, v in report.get("machine", [])]
    lines += [f"- {line}" for line in report.get("setup", [])]
    lines.append("")
    lines += markdown(tab, runs, report.get("words") or {}, verdicts_only)
    lines.append("")
    if report.get("failures"):
        lines.append(f"Runs that failed and are not counted: {len(report['failures'])}: "
                     + "; ".join(report["failures"][:5]) + ".")
    for note in report.get("notes", []):
        lines.append(f"- {note}")
    return lines

"""CPU frequency state of a job's CPUs: read it (record), and the writes that pin it (enforce).

Everything takes a root prefix ("/" on a real machine) so tests read fixture
trees in the kernel's formats (Documentation/admin-guide/pm/cpufreq.rst,
intel_pstate.rst, amd-pstate.rst). Deciding is pure (:func:`plan_enforce`,
:func:`plan_turbo`); the writes and their undo are :mod:`kfiles` writes.

A policy (``cpufreq/policy<N>``) may govern several CPUs; hpc-batch changes
only policies whose every CPU the job holds, so a job never changes the
frequency of a CPU it does not own. Turbo is machine-wide with intel_pstate
(``intel_pstate/no_turbo``) and with the global ``cpufreq/boost``; amd-pstate
and newer kernels also have a per-policy ``boost``, which is the job's own.
"""

import os
from typing import Any

from ...core.cputopo import format_cpulist, parse_cpulist
from . import kfiles

CPU = "sys/devices/system/cpu"
CPUFREQ = f"{CPU}/cpufreq"
NO_TURBO = f"{CPU}/intel_pstate/no_turbo"
BOOST = f"{CPUFREQ}/boost"
POLICY_FILES = ("scaling_driver", "scaling_governor", "scaling_min_freq", "scaling_max_freq",
                "cpuinfo_min_freq", "cpuinfo_max_freq", "energy_performance_preference", "boost")


def policies(root: str = "/") -> dict[str, tuple[int, ...]]:
    """Each cpufreq policy directory name and the CPUs it governs (its affected_cpus)."""
    out: dict[str, tuple[int, ...]] = {}
    try:
        names = sorted(os.listdir(kfiles.join(root, CPUFREQ)))
    except OSError:
        return out
    for name in names:
        if name.startswith("policy") and name[6:].isdigit():
            text = kfiles.read(root, f"{CPUFREQ}/{name}/affected_cpus")
            try:
                out[name] = parse_cpulist(text.replace(" ", ",")) if text else ()
            except ValueError:
                continue
    return out


def read_state(root: str, cpus) -> dict[str, Any]:
    """The frequency state of *cpus*: the record a benchmark job keeps under --cpufreq record.

    ``policies`` has one entry per policy that governs any of *cpus* (its
    files as read, absent ones left out, and ``shared`` when it also governs
    CPUs outside *cpus*); ``boost``, ``no_turbo``, ``intel_pstate`` and
    ``amd_pstate`` are the machine-wide switches (None where the driver has
    none); ``epb`` is each CPU's energy_perf_bias. ``turbo`` sums it up:
    "on", "off" or "unknown".
    """
    want = set(cpus)
    state: dict[str, Any] = {"policies": {}, "epb": {}}
    for name, governed in policies(root).items():
        if not want & set(governed):
            continue
        entry: dict[str, Any] = {"cpus": list(governed), "shared": not set(governed) <= want}
        for f in POLICY_FILES:
            value = kfiles.read(root, f"{CPUFREQ}/{name}/{f}")
            if value is not None:
                entry[f] = value
        state["policies"][name] = entry
    for cpu in sorted(want):
        epb = kfiles.read(root, f"{CPU}/cpu{cpu}/power/energy_perf_bias")
        if epb is not None:
            state["epb"][str(cpu)] = epb
    state["boost"] = kfiles.read(root, BOOST)
    state["no_turbo"] = kfiles.read(root, NO_TURBO)
    state["intel_pstate"] = kfiles.read(root, f"{CPU}/intel_pstate/status")
    state["amd_pstate"] = kfiles.read(root, f"{CPU}/amd_pstate/status")
    drivers = sorted({p["scaling_driver"] for p in state["policies"].values() if "scaling_driver" in p})
    state["driver"] = ",".join(drivers) or None
    state["turbo"] = turbo_summary(state)
    return state


def summarize(state: dict[str, Any]) -> dict[str, Any]:
    """A :func:`read_state` record grouped for the job's record (pure): policies with the same
    settings become one entry with their CPUs as a cpulist, and EPB maps each value to its CPUs,
    so a 128-CPU job's record stays a few lines."""
    groups: dict[tuple, list[int]] = {}
    for p in state.get("policies", {}).values():
        key = tuple(sorted((k, v) for k, v in p.items() if k != "cpus"))
        groups.setdefault(key, []).extend(p["cpus"])
    epb: dict[str, list[int]] = {}
    for cpu, value in state.get("epb", {}).items():
        epb.setdefault(value, []).append(int(cpu))
    out = {k: v for k, v in state.items() if k not in ("policies", "epb")}
    out["policies"] = [{"cpus": format_cpulist(cpus), **dict(key)} for key, cpus in groups.items()]
    out["epb"] = {value: format_cpulist(cpus) for value, cpus in epb.items()}
    return out


def turbo_summary(state: dict[str, Any]) -> str:
    """"on", "off" or "unknown" for the job's CPUs, from a :func:`read_state` record."""
    if state.get("no_turbo") is not None:
        return "off" if state["no_turbo"] == "1" else "on"
    per_policy = [p["boost"] for p in state.get("policies", {}).values() if "boost" in p]
    if state.get("boost") == "0" or (per_policy and all(b == "0" for b in per_policy)):
        return "off"
    if state.get("boost") == "1" or any(b == "1" for b in per_policy):
        return "on"
    return "unknown"


def plan_enforce(state: dict[str, Any]) -> tuple[list[kfiles.Write], list[str]]:
    """Governor ``performance`` and min = max on the job's own policies (pure).

    Returns the writes, governor before minimum (undone in the reverse
    order), and notes on the policies left alone.
    """
    writes: list[kfiles.Write] = []
    notes: list[str] = []
    for name, p in sorted(state.get("policies", {}).items()):
        if p.get("shared"):
            notes.append(f"{name}: also governs CPUs the job does not hold; left as it is")
            continue
        base = f"{CPUFREQ}/{name}"
        gov = p.get("scaling_governor")
        if gov is not None and gov != "performance":
            writes.append(kfiles.Write(f"{base}/scaling_governor", gov, "performance"))
        lo, hi = p.get("scaling_min_freq"), p.get("scaling_max_freq")
        if lo is not None and hi is not None and lo != hi:
            writes.append(kfiles.Write(f"{base}/scaling_min_freq", lo, hi))
        if gov is None and lo is None:
            notes.append(f"{name}: no governor or frequency limits to set")
    return writes, notes


def plan_turbo(state: dict[str, Any], allowed: bool, alone: bool) -> tuple[list[kfiles.Write], str]:
    """The writes that turn turbo off for the job, and what the record says (pure).

    Per-policy ``boost`` belongs to the job's CPUs alone and is turned off
    whenever the admin allowed it. The machine-wide switches would slow
    every other job too, and stay off for as long as one benchmark job
    holds them, so they are turned off only for a job *alone* on the
    machine: one that holds it whole (``--exclusive``), so that no other
    job starts until it ends and puts them back.
    """
    if state.get("turbo") == "off":
        return [], "turbo off (as found)"
    if not allowed:
        return [], "turbo on (--allow-turbo-off not given)" if state.get("turbo") == "on" else "turbo unknown"
    writes = [kfiles.Write(f"{CPUFREQ}/{name}/boost", "1", "0")
              for name, p in sorted(state.get("policies", {}).items())
              if p.get("boost") == "1" and not p.get("shared")]
    if writes:
        return writes, "turbo off (per-policy boost)"
    if not alone and (state.get("no_turbo") == "0" or state.get("boost") == "1"):
        return [], "turbo on (the switch is machine-wide: turned off only for an --exclusive job)"
    if state.get("no_turbo") == "0":
        return [kfiles.Write(NO_TURBO, "0", "1")], "turbo off (intel_pstate/no_turbo)"
    if state.get("boost") == "1":
        return [kfiles.Write(BOOST, "1", "0")], "turbo off (cpufreq/boost)"
    return [], "turbo unknown (no switch found)"

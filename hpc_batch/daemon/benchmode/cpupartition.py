"""A benchmark job's cgroup as an isolated cpuset partition, or an exclusive cpuset.

With cgroup v2, ``cpuset.cpus.partition = isolated`` takes the job's CPUs
out of the scheduler's load balancing: no other task is moved onto them.
Job cgroups sit below ``hpc-batch/``, which is no partition root, so the job
becomes a *remote* partition (Linux 6.7 and later): its CPUs must first be in
``cpuset.cpus.exclusive`` of every cgroup between it and the root partition.
hpc-batch adds them to ``hpc-batch/cpuset.cpus.exclusive`` (and takes them
out again when the job ends), then to the job's own, then asks for the
partition and reads its state back: the kernel answers ``isolated``, or
``isolated invalid (<reason>)``.

Where it cannot, the job keeps an exclusive cpuset (the job's
``cpuset.cpus.exclusive``, which no sibling may overlap), or, on kernels
without it, only the allocator's promise that no other job gets its CPUs.
The record says which.
"""

import os
from typing import Any

from ...core.cputopo import format_cpulist, parse_cpulist
from . import kfiles

PARTITION = "cpuset.cpus.partition"
EXCLUSIVE = "cpuset.cpus.exclusive"


def parse_state(text: str | None) -> tuple[str, str | None]:
    """``cpuset.cpus.partition`` as (state, reason): "isolated invalid (Parent is not ...)" gives
    ("isolated invalid", "Parent is not ..."); a missing file gives ("unsupported", None)."""
    if text is None:
        return "unsupported", None
    text = text.strip()
    head, sep, rest = text.partition("(")
    reason = rest.rstrip(")").strip() if sep else None
    return " ".join(head.split()), reason


def _cpus(text: str | None) -> set[int]:
    try:
        return set(parse_cpulist(text or ""))
    except ValueError:
        return set()


def isolate(cg: str, cpus) -> dict[str, Any]:
    """Make cgroup *cg* an isolated partition of *cpus*, or fall back; returns the record.

    The record: ``partition`` ("isolated", or the fallback "exclusive" or
    "allocation-only"), ``state`` (what the kernel read back), ``reason``, and
    ``parent_exclusive_added`` (the CPUs :func:`release` takes out of the
    parent's exclusive list again).
    """
    want = format_cpulist(cpus)
    parent = os.path.dirname(cg)
    rec: dict[str, Any] = {"partition": "allocation-only", "state": None, "reason": None,
                           "parent_exclusive_added": []}
    if not os.path.exists(os.path.join(cg, PARTITION)):
        rec["reason"] = "the kernel has no cpuset partitions (cpuset.cpus.partition)"
        return rec
    if os.path.exists(os.path.join(cg, EXCLUSIVE)):
        if os.path.exists(os.path.join(parent, EXCLUSIVE)):
            had = _cpus(kfiles.read("/", os.path.join(parent, EXCLUSIVE)))
            added = sorted(set(cpus) - had)
            if added:
                try:
                    kfiles.write("/", os.path.join(parent, EXCLUSIVE), format_cpulist(had | set(added)))
                    rec["parent_exclusive_added"] = added
                except OSError as exc:
                    rec["reason"] = f"{parent}/{EXCLUSIVE}: {kfiles.why(exc)}"
        try:
            kfiles.write("/", os.path.join(cg, EXCLUSIVE), want)
            rec["partition"] = "exclusive"
        except OSError as exc:
            rec["reason"] = rec["reason"] or f"{EXCLUSIVE}: {kfiles.why(exc)}"
    try:
        kfiles.write("/", os.path.join(cg, PARTITION), "isolated")
    except OSError as exc:
        rec["reason"] = rec["reason"] or f"{PARTITION}: {kfiles.why(exc)}"
    state, reason = parse_state(kfiles.read("/", os.path.join(cg, PARTITION)))
    rec["state"] = state if reason is None else f"{state} ({reason})"
    if state == "isolated":
        rec["partition"], rec["reason"] = "isolated", None
        return rec
    rec["reason"] = reason or rec["reason"] or f"the kernel left it {state!r}"
    try:   # an invalid partition must not linger: back to a plain member
        kfiles.write("/", os.path.join(cg, PARTITION), "member")
    except OSError:
        pass
    return rec


def release(cg: str, rec: dict[str, Any]) -> str | None:
    """Take the CPUs :func:`isolate` added out of the parent's exclusive list; None or why not.

    Called once the job's cgroup is gone (the kernel refuses while a child
    still claims them); CPUs another job added meanwhile stay.
    """
    added = set(rec.get("parent_exclusive_added") or ())
    if not added:
        return None
    path = os.path.join(os.path.dirname(cg), EXCLUSIVE)
    now = kfiles.read("/", path)
    if now is None:
        return None
    try:
        kfiles.write("/", path, format_cpulist(_cpus(now) - added))
    except OSError as exc:
        return f"{path}: {kfiles.why(exc)}"
    return None

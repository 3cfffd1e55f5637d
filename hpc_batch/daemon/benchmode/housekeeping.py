"""Housekeeping CPUs: where the daemon, its fork server and its shepherds run, and where
interrupts are steered; a benchmark job never gets a thread of their cores.

``choose`` is pure: ``--housekeeping-cpus LIST`` when given (``none``: no
such CPUs), else the CPUs ``--reserve-cpu`` keeps for the OS, else the core
of the lowest CPU the daemon may use (on a one-core machine, none). The
daemon logs which and why. ``pin`` moves the daemon itself there (the fork
server and the shepherds it starts inherit it; under cgroups the shepherds'
cgroup is confined there too, see ``shepherdcpus.confine``).

The CPUs a daemon may give out are its affinity when it starts; pinned, a
re-exec (reload) would see only the housekeeping CPUs, so the first
daemon's set is carried across in ``ALLOWED_ENV``.
"""

from __future__ import annotations

import os

from ...core.cputopo import format_cpulist, parse_cpulist
from ...core.resources import Machine

ALLOWED_ENV = "HPC_BATCH_ALLOWED_CPUS"
AUTO = "auto"
NONE = "none"


def parse_flag(text: str) -> tuple[int, ...] | str:
    """``--housekeeping-cpus``: AUTO, NONE, or a cpulist (raises ValueError)."""
    if text in (AUTO, NONE):
        return text
    cpus = parse_cpulist(text)
    if not cpus:
        raise ValueError(f"--housekeeping-cpus {text!r}: expected a CPU list (0,1 or 0-3), auto or none")
    return cpus


def choose(machine: Machine, reserved: tuple[int, ...], flag: tuple[int, ...] | str) -> tuple[tuple[int, ...], str]:
    """The housekeeping CPUs and why they were chosen (one log line's reason).

    Raises ValueError when ``flag`` names CPUs the daemon may not use.
    """
    allowed = sorted(c for n in machine.nodes for c in n.cpus)
    if flag == NONE:
        return (), "--housekeeping-cpus none: the daemon is not pinned, and benchmark jobs may get any core"
    if isinstance(flag, tuple):
        stray = sorted(set(flag) - set(allowed))
        if stray:
            raise ValueError(f"--housekeeping-cpus names CPUs {format_cpulist(stray)}, which this daemon "
                             f"may not use (it may use {format_cpulist(allowed)})")
        return flag, "as --housekeeping-cpus says"
    if reserved:
        return tuple(sorted(reserved)), "the CPUs --reserve-cpu keeps for the OS"
    if not allowed:
        return (), "the daemon may use no CPU"
    first = allowed[0]
    core = tuple(c for c in machine.cpu_topology.siblings(first) if c in set(allowed))
    if len(machine.cpu_topology.cores(allowed)) <= 1:
        return (), "this machine has one core, and none can be spared"
    return core, f"the core of CPU {first}, the lowest the daemon may use (--reserve-cpu keeps none)"


def describe(cpus: tuple[int, ...], why: str) -> str:
    """The start-up log line."""
    if not cpus:
        return f"housekeeping CPUs: none ({why}); benchmark jobs record that they had none"
    return (f"housekeeping CPUs {format_cpulist(cpus)} ({why}): the daemon, its fork server and its "
            f"shepherds run there, and benchmark jobs never get a thread of their cores")


def allowed_cpus() -> set[int]:
    """The CPUs this daemon may give out: its first start's affinity, carried across re-execs."""
    carried = os.environ.get(ALLOWED_ENV)
    if carried:
        try:
            cpus = set(parse_cpulist(carried)) & set(range(os.cpu_count() or 1 << 12))
            if cpus:
                return cpus
        except ValueError:
            pass
    return set(os.sched_getaffinity(0))


def pin(cpus: tuple[int, ...], allowed: set[int]) -> None:
    """Run the daemon (and what it starts from now on) on ``cpus``, or on all of ``allowed`` when there
    are none; remember ``allowed`` for a re-exec.

    Unpinning matters too: a reload re-execs in place, keeping the last daemon's mask, so a daemon
    reloaded into ``--housekeeping-cpus none`` would otherwise stay on the old housekeeping CPUs.
    """
    os.environ[ALLOWED_ENV] = format_cpulist(allowed)
    os.sched_setaffinity(0, cpus or allowed)

"""Interrupts off a benchmark job's CPUs: plan (pure), read, and irqbalance detection.

At a benchmark job's start every IRQ whose ``/proc/irq/<n>/smp_affinity_list``
touches a CPU the job holds (its cpuset and its held siblings) is pointed at
the housekeeping CPUs. The writes and their undo are :mod:`kfiles` writes;
this module decides which, and says whether irqbalance would undo them.
"""

import os
import socket
import struct

from ...core.cputopo import format_cpulist, parse_cpulist
from . import kfiles

PROC_IRQ = "proc/irq"
# irqbalance's runtime control socket (irqbalance-ui speaks to it): one per daemon pid.
IRQBALANCE_SOCKET_DIR = "run/irqbalance"
IRQBALANCE_UNIT = "irqbalance.service"


# Each IRQ touched has an entry in the record; past this many (a large machine's IRQs all on
# every CPU), moved ones whose effective affinity left the job's CPUs are dropped first.
EACH_CAP = 512
# The kernel makes the file only when built with it (Linux 4.13 on; x86 selects it).
NO_EFFECTIVE = "no effective_affinity_list (a kernel without CONFIG_GENERIC_IRQ_EFFECTIVE_AFF_MASK)"


def affinity_path(irq: int) -> str:
    """The affinity file of one IRQ, relative to the root prefix."""
    return f"{PROC_IRQ}/{irq}/smp_affinity_list"


def effective_path(irq: int) -> str:
    """Where the kernel says which CPUs the IRQ is delivered to now, relative to the root prefix."""
    return f"{PROC_IRQ}/{irq}/effective_affinity_list"


def read_affinities(root: str = "/") -> dict[int, str]:
    """Every IRQ's affinity list as the kernel shows it (IRQs without one are left out)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir(kfiles.join(root, PROC_IRQ))
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            text = kfiles.read(root, affinity_path(int(name)))
            if text:
                out[int(name)] = text
    return out


def plan(affinities: dict[int, str], held, housekeeping, originals: dict[int, str] | None = None) -> list[kfiles.Write]:
    """The writes that move every IRQ touching *held* to *housekeeping* less *held* (pure).

    *originals* maps each IRQ hpc-batch holds changed for other running
    benchmark jobs to its value before that (the ledger's): such an IRQ is
    planned when that value touches *held* too, even if it sits elsewhere
    now, so that it never goes back onto this job's CPUs while it runs. An
    IRQ already where it would go, or whose list cannot be parsed, is left
    out; so is every IRQ when no housekeeping CPU is outside the job.
    """
    held_set, target = set(held), set(housekeeping) - set(held)
    if not target or not held_set:
        return []
    new = format_cpulist(sorted(target))
    originals = originals or {}
    writes = []
    for irq in sorted(affinities):
        try:
            cpus = set(parse_cpulist(affinities[irq]))
            if irq in originals:
                cpus |= set(parse_cpulist(originals[irq]))
        except ValueError:
            continue
        if cpus & held_set:
            writes.append(kfiles.Write(affinity_path(irq), affinities[irq], new, "cpulist"))
    return writes


def irq_of(write: kfiles.Write) -> int:
    """The IRQ number a write of :func:`plan` is for."""
    return int(write.path.split("/")[2])


def outcome(root: str, writes: list[kfiles.Write], refused: dict[str, OSError], held, to: str,
            kept: frozenset[str] = frozenset()) -> dict:
    """What the start did to each IRQ of *writes* (old: the value found; new: the value it was
    left with, or the one tried; *refused* maps a path to the kernel's error; *kept* names the IRQs
    left as they were because no CPU suits every running benchmark job), with the effective
    affinity read back: one read per IRQ, after all the writes.

    ``still_on_job_cpus`` names the IRQs that can still land on a CPU of *held*: by the effective
    affinity, or where the kernel shows none, by the affinity the IRQ kept.
    """
    held_set = set(held)
    moved: list[int] = []
    refused_irqs: list[int] = []
    still: list[int] = []
    each: dict[str, dict] = {}
    for w in writes:
        irq = irq_of(w)
        exc = refused.get(w.path)
        entry: dict = {"result": "moved" if exc is None else "refused"}
        if w.path in kept and exc is None:
            entry["result"] = "kept"
            entry["why"] = "no CPU is off every running benchmark job's CPUs: left as the other jobs had it"
        elif exc is not None:
            entry["errno"] = kfiles.why(exc)
            entry["error"] = os.strerror(exc.errno) if exc.errno else str(exc)
            refused_irqs.append(irq)
        elif w.path not in kept:
            moved.append(irq)
        entry["old"], entry["new"] = w.old, w.new   # new: what was written, or tried
        effective, why = kfiles.read_why(root, effective_path(irq))
        entry["effective"] = effective
        if effective is None:
            entry["effective_error"] = NO_EFFECTIVE if why == "ENOENT" else why
        try:
            lands = set(parse_cpulist(effective if effective is not None else
                                      (w.old if exc is not None else w.new)))
        except ValueError:
            lands = set()
        if lands & held_set:
            still.append(irq)
        each[str(irq)] = entry
    out: dict = {"to": to, "moved": moved, "refused": refused_irqs, "still_on_job_cpus": still, "each": each}
    if len(each) > EACH_CAP:
        plain = {str(irq) for irq in moved} - {str(irq) for irq in still}
        shown = set(sorted(each, key=lambda k: (k in plain, int(k)))[:EACH_CAP])
        out["each"] = {k: v for k, v in each.items() if k in shown}
        out["each_cut"] = len(each) - EACH_CAP
    return out


def irqbalance_pids(root: str = "/") -> list[int]:
    """Pids of running irqbalance daemons, found by a scan of /proc/<pid>/comm (no systemctl)."""
    pids: list[int] = []
    try:
        names = os.listdir(kfiles.join(root, "proc"))
    except OSError:
        return pids
    for name in names:
        if name.isdigit() and kfiles.read(root, f"proc/{name}/comm") == "irqbalance":
            pids.append(int(name))
    return sorted(pids)


def ban_message(cpus) -> bytes:
    """irqbalance's control-socket command that replaces its banned CPU list.

    "NULL" drops the list, and irqbalance goes back to its own choice (its
    environment's IRQBALANCE_BANNED_CPULIST, else isolated and nohz_full CPUs).
    """
    return f"settings cpus {format_cpulist(sorted(cpus)) if cpus else 'NULL'}".encode("ascii")


def send_ban(socket_path: str, cpus, timeout: float = 0.2) -> str | None:
    """Tell irqbalance to keep IRQs off *cpus*; returns None, or why it could not.

    irqbalance takes commands only with the sender's credentials attached
    (SCM_CREDENTIALS, uid 0), as irqbalance-ui sends them.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    creds = struct.pack("iII", os.getpid(), os.getuid(), os.getgid())
    try:
        s.connect(socket_path)
        s.sendmsg([ban_message(cpus)], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
    except OSError as exc:
        return kfiles.why(exc)
    finally:
        s.close()
    return None


def base_banned(root: str = "/") -> set[int]:
    """The CPUs irqbalance bans by its own choice, which a command's list replaces.

    As irqbalance decides: IRQBALANCE_BANNED_CPUS (a hex mask, deprecated) or
    IRQBALANCE_BANNED_CPULIST from its environment file, else the kernel's
    isolated and nohz_full CPUs.
    """
    env: dict[str, str] = {}
    for rel in ("etc/default/irqbalance", "etc/sysconfig/irqbalance"):
        try:
            with open(kfiles.join(root, rel)) as f:
                lines = f.read(65536).splitlines()
        except OSError:
            continue
        for line in lines:
            key, sep, value = line.strip().partition("=")
            if sep and key.startswith("IRQBALANCE_BANNED_CPU"):
                env[key] = value.strip().strip("\"'")
        break
    try:
        if env.get("IRQBALANCE_BANNED_CPUS"):
            mask = int(env["IRQBALANCE_BANNED_CPUS"].replace(",", ""), 16)
            return {bit for bit in range(mask.bit_length()) if mask >> bit & 1}
        if env.get("IRQBALANCE_BANNED_CPULIST"):
            return set(parse_cpulist(env["IRQBALANCE_BANNED_CPULIST"]))
    except ValueError:
        return set()
    out: set[int] = set()
    for name in ("isolated", "nohz_full"):
        try:
            out |= set(parse_cpulist(kfiles.read(root, f"sys/devices/system/cpu/{name}") or ""))
        except ValueError:
            pass
    return out

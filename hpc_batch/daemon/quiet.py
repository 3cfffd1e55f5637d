"""Quiet cores for benchmark jobs: what a job's start changes on the machine, and its undo.

At a benchmark job's start (:func:`begin`, called by the engine just before
its shepherd is spawned, once the job's "running" record is durable):

- every IRQ whose affinity touches a CPU the job holds goes to the
  housekeeping CPUs (:mod:`irqsteer`); each is recorded as moved or refused
  (with the kernel's errno: EIO for managed IRQs, EPERM...), with its
  effective affinity read back, and those still on the job's CPUs named;
- under ``--cpufreq enforce`` the job's own cpufreq policies get governor
  ``performance`` and minimum = maximum frequency, and with
  ``--allow-turbo-off`` turbo goes off (:mod:`cpufreq`); under ``record``
  the state is only read;
- its cgroup becomes an isolated cpuset partition, or falls back
  (:mod:`cpupartition`).

Every planned write is persisted first, in ``<job dir>/quiet.json`` (root
only); once done, the file keeps only the writes the kernel took, and
(``record``) what the job's record copies. Whichever daemon sees the job end
(this one, one started after a reload or a crash) undoes them with
:func:`end`: each value goes back
only where the file still holds what hpc-batch wrote. An undo that would
put interrupts back on another running benchmark job's CPUs (or turbo back
on under it) is handed to that job instead. Nothing here runs while the
job runs.

The file is written without fsync: what it undoes is kernel state, which a
reboot resets anyway, and a daemon that crashes leaves the file in the page
cache for the next one. It carries the boot id, so a file that outlived a
reboot undoes nothing (the values it would compare are the new boot's).
"""

import os
import time
from dataclasses import dataclass
from typing import Any

from shepherd import records

from ..core.cputopo import format_cpulist, parse_cpulist
from . import cpufreq, cpupartition, irqsteer, kfiles

FILE = "quiet.json"
# Switches that act on every CPU: undone by the last benchmark job out.
MACHINE_WIDE = (cpufreq.NO_TURBO, cpufreq.BOOST)


@dataclass
class Settings:
    """The admin's choices (daemon flags) and the root prefix of /proc, /sys, /run and /etc."""

    cpufreq: str = "record"          # --cpufreq
    allow_turbo_off: bool = False    # --allow-turbo-off
    irqbalance_ban: bool = False     # --irqbalance-ban
    root: str = "/"


def irqbalance(root: str = "/") -> dict[str, Any]:
    """Whether irqbalance runs, found cheaply: its systemd unit, its control sockets, else its process.

    Returns {"active": bool, "how": str, "sockets": [paths]}. Never calls
    systemctl; /proc is scanned only on a machine without systemd, and at most once a minute.
    """
    unit = kfiles.join(root, f"run/systemd/units/invocation:{irqsteer.IRQBALANCE_UNIT}")
    sockets = []
    try:
        for name in sorted(os.listdir(kfiles.join(root, irqsteer.IRQBALANCE_SOCKET_DIR))):
            pid = name[len("irqbalance"):-len(".sock")]
            if name.startswith("irqbalance") and name.endswith(".sock") and pid.isdigit() \
                    and kfiles.read(root, f"proc/{pid}/comm") == "irqbalance":
                sockets.append(kfiles.join(root, f"{irqsteer.IRQBALANCE_SOCKET_DIR}/{name}"))
    except OSError:
        pass
    if os.path.lexists(unit):
        return {"active": True, "how": f"systemd unit {irqsteer.IRQBALANCE_UNIT} is active", "sockets": sockets}
    if sockets:
        return {"active": True, "how": "its control socket is open", "sockets": sockets}
    if not os.path.isdir(kfiles.join(root, "run/systemd/system")):
        found = _scanned(root)
        if found is not None:
            return {"active": True, "how": f"process {found} runs", "sockets": []}
    return {"active": False, "how": "not running", "sockets": []}


_SCANS: dict[str, tuple[float, int | None]] = {}   # root -> (when /proc was last scanned, irqbalance's pid)
RESCAN = 60.0   # seconds between scans of /proc for an irqbalance not found last time


def _scanned(root: str) -> int | None:
    """irqbalance's pid from a scan of /proc, at most once a minute (a pid found is checked each time)."""
    now = time.monotonic()
    last = _SCANS.get(root)
    if last is not None:
        when, pid = last
        if pid is not None and kfiles.read(root, f"proc/{pid}/comm") == "irqbalance":
            return pid
        if pid is None and now - when < RESCAN:
            return None
    pids = irqsteer.irqbalance_pids(root)
    _SCANS[root] = (now, pids[0] if pids else None)
    return pids[0] if pids else None


def _persist(jdir: str, data: dict) -> None:
    records.write_json(os.path.join(jdir, FILE), data, mode=0o600, durable=False)


def boot_id(root: str = "/") -> str | None:
    """This boot's id (kernel state from another boot is not ours to undo)."""
    return kfiles.read(root, "proc/sys/kernel/random/boot_id")


def begin(jdir: str, cpus, held, housekeeping, settings: Settings, others_running: bool,
          cgroup: str | None = None) -> dict[str, Any]:
    """Quiet the job's CPUs; returns the job's record of what was found and done.

    *cpus* is the job's cpuset, *held* every CPU it holds (cpuset and held
    siblings), *housekeeping* where interrupts go. *others_running*: another
    job runs, so machine-wide turbo stays as it is.
    """
    root = settings.root
    irq_writes = irqsteer.plan(irqsteer.read_affinities(root), held, housekeeping)
    freq = cpufreq.read_state(root, held)
    freq_rec: dict[str, Any] = {"policy": settings.cpufreq, "state": cpufreq.summarize(freq),
                                "turbo": freq["turbo"]}
    freq_writes: list[kfiles.Write] = []
    if settings.cpufreq == "enforce" and freq["policies"]:
        freq_writes, freq_rec["notes"] = cpufreq.plan_enforce(freq)
        turbo, freq_rec["turbo"] = cpufreq.plan_turbo(freq, settings.allow_turbo_off, others_running)
        freq_writes += turbo
    elif settings.cpufreq == "enforce":
        freq_rec["notes"] = ["no cpufreq on this machine: nothing to set"]
    else:
        freq_rec["turbo"] = f"turbo {freq['turbo']}"
    writes = irq_writes + freq_writes
    saved: dict[str, Any] = {"boot": boot_id(root), "writes": [w.to_dict() for w in writes],
                             "cgroup": cgroup, "partition": None}
    _persist(jdir, saved)   # before the first change: a crash after it can be undone
    done, refused = kfiles.apply(root, writes)
    rec: dict[str, Any] = {
        "housekeeping": format_cpulist(housekeeping),
        "irqs": irqsteer.outcome(root, irq_writes, {w.path: exc for w, exc in refused}, held,
                                 format_cpulist(set(housekeeping) - set(held))),
        "cpufreq": freq_rec,
    }
    freq_rec["changed"] = [w.path.rsplit("/", 2)[-2:] for w in done if w in freq_writes]
    freq_rec["refused"] = {w.path: kfiles.why(exc) for w, exc in refused if w in freq_writes}
    # A refused write changed nothing of ours: it must never be "restored" (the file may hold
    # the value tried by then, written by someone else), nor handed to another job.
    saved["writes"] = [w.to_dict() for w in done]
    ib = irqbalance(root)
    rec["irqbalance"] = ib["how"] if not ib["active"] else (
        f"active ({ib['how']}): it may move the job's IRQs back"
        + ("" if settings.irqbalance_ban else "; the admin may pass --irqbalance-ban"))
    if cgroup:
        part = cpupartition.isolate(cgroup, cpus)
        saved["partition"] = part   # what release() takes back out of the parent's exclusive CPUs
        rec["partition"] = {k: part[k] for k in ("partition", "state", "reason")}
    else:
        rec["partition"] = {"partition": "allocation-only", "state": None, "reason": "no cgroups"}
    saved["record"] = rec   # what the job's record copies (machine.quiet): what was done, not planned
    _persist(jdir, saved)
    return rec


def ban(settings: Settings, banned) -> str:
    """With --irqbalance-ban, tell a running irqbalance to keep IRQs off *banned*, the CPUs of the
    running benchmark jobs, as well as those it bans by its own choice; with none, hand it back
    its own choice. Returns what the job's record says."""
    ib = irqbalance(settings.root)
    if not settings.irqbalance_ban or not ib["active"]:
        return ""
    if not ib["sockets"]:
        return "irqbalance has no control socket: its banned CPUs are unchanged"
    cpus = set(banned) | irqsteer.base_banned(settings.root) if banned else set()
    errs = [e for e in (irqsteer.send_ban(s, cpus) for s in ib["sockets"]) if e]
    if errs:
        return f"irqbalance did not take the banned CPUs ({errs[0]})"
    return f"irqbalance told to ban CPUs {format_cpulist(cpus)}" if cpus else "irqbalance back to its own banned CPUs"



def pending(jdir: str) -> bool:
    """Whether the job has changes still to undo."""
    return os.path.exists(os.path.join(jdir, FILE))


def end(jdir: str, settings: Settings, others=()) -> dict[str, Any] | None:
    """Undo what :func:`begin` changed for the job, where still ours; None if nothing was pending.

    *others* lists the other running benchmark jobs as (job dir, CPUs held).
    A change whose undo would land on one of them (an IRQ whose old affinity
    includes its CPUs, machine-wide turbo) is handed over to that job's file
    instead, so the last job out puts it back. Returns {"restored": n,
    "handed": n, "left": [...]} for the job's record. The file goes once done,
    so a second call (a crash in between, then recovery) does nothing.
    """
    path = os.path.join(jdir, FILE)
    if not os.path.lexists(path):
        return None
    saved = records.read_json(path)
    if not isinstance(saved, dict):
        _unlink(path)
        return {"restored": 0, "handed": 0, "left": ["its quiet record was unreadable: nothing restored"]}
    if saved.get("boot") != boot_id(settings.root):
        _unlink(path)
        return {"restored": 0, "handed": 0, "left": ["the machine rebooted since: nothing to restore"]}
    writes = [kfiles.Write.from_dict(w) for w in saved.get("writes") or ()]
    handed: dict[str, list[kfiles.Write]] = {}
    mine: list[kfiles.Write] = []
    for w in writes:
        heir = _heir(w, others)
        if heir is not None and kfiles.same(w.kind, kfiles.read(settings.root, w.path), w.new):
            handed.setdefault(heir, []).append(w)
        else:
            mine.append(w)
    count = 0
    for heir, ws in handed.items():
        if _hand_over(heir, ws):
            count += len(ws)
        else:
            mine.extend(ws)   # that job's changes are already undone: undo these here
    restored, left = kfiles.undo(settings.root, mine)
    notes = [f"{w.path}: {why}" for w, why in left]
    part = saved.get("partition")
    if part and saved.get("cgroup"):
        why = cpupartition.release(saved["cgroup"], part)
        if why:
            notes.append(why)
    _unlink(path)
    return {"restored": len(restored), "handed": count, "left": notes}


def _heir(w: kfiles.Write, others) -> str | None:
    """The other running benchmark job whose CPUs undoing *w* would disturb, if any."""
    if not others:
        return None
    if w.path in MACHINE_WIDE:
        return others[0][0]
    if w.kind == "cpulist":
        try:
            old = set(parse_cpulist(w.old))
        except ValueError:
            return None
        for other_dir, held in others:
            if old & set(held):
                return other_dir
    return None


def _hand_over(jdir: str, writes: list[kfiles.Write]) -> bool:
    """Add *writes* to another job's quiet file (durably, before ours goes); False if it has none."""
    path = os.path.join(jdir, FILE)
    saved = records.read_json(path)
    if not isinstance(saved, dict):
        return False
    saved["writes"] = list(saved.get("writes") or ()) + [w.to_dict() for w in writes]
    _persist(jdir, saved)
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

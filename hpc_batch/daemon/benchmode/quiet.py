"""Quiet cores for benchmark jobs: what a job's start changes on the machine, and its undo.

At a benchmark job's start (:func:`begin`, called by the engine just before
its shepherd is spawned, once the job's "running" record is durable):

- every IRQ whose affinity touches a CPU the job holds goes to the
  housekeeping CPUs (:mod:`irqsteer`); each is recorded as moved or refused
  (with the kernel's errno: EIO for managed IRQs, EPERM...), with its
  effective affinity read back, and those still on the job's CPUs named;
- under ``--cpufreq enforce`` the job's own cpufreq policies get governor
  ``performance`` and minimum = maximum frequency, and with
  ``--allow-turbo-off`` turbo goes off (:mod:`cpufreq`): per-policy boost
  for any benchmark job, the machine-wide switches only for one that holds
  the machine (``--exclusive``); under ``record`` the state is only read;
- its cgroup becomes an isolated cpuset partition, or falls back
  (:mod:`cpupartition`).

Two kinds of change, two kinds of undo record:

- The job's own (its policies' governor, minimum and boost; its partition)
  are in ``<job dir>/quiet.json`` (root only), persisted before the first
  change and trimmed to the writes the kernel took; :func:`end` puts each
  back only where the file still holds what hpc-batch wrote. It is written
  without fsync: a reboot resets what it undoes, and a daemon that crashes
  leaves it in the page cache for the next one.
- The machine's (IRQ affinities, the machine-wide turbo switches), which
  overlapping jobs share, are in one :mod:`ledger` for the machine,
  ``<state dir>/quiet-ledger.json`` (root only, fsynced at each change, so it
  outlives a kill -9 and a power cut of the daemon alike): the value before
  hpc-batch's first change, put back when the last job that holds it ends,
  and meanwhile the value that suits every job still holding it.

Whichever daemon sees the job end (this one, one started after a reload or
a crash) undoes them. Both files carry the boot id: one that outlived a
reboot undoes nothing (the values it would compare are the new boot's).
Nothing here runs while the job runs.
"""

import os
import time
from dataclasses import dataclass
from typing import Any

from shepherd.base import records

from ...core.cputopo import format_cpulist, parse_cpulist
from . import cpufreq, cpupartition, irqsteer, kfiles, shepherdcpus
from .ledger import Ledger

FILE = "quiet.json"
LEDGER = "quiet-ledger.json"
# Switches that act on every CPU: in the machine's ledger, not the job's file.
MACHINE_WIDE = (cpufreq.NO_TURBO, cpufreq.BOOST)


@dataclass
class Settings:
    """The admin's choices (daemon flags) and the root prefix of /proc, /sys, /run and /etc."""

    cpufreq: str = "record"          # --cpufreq
    allow_turbo_off: bool = False    # --allow-turbo-off
    irqbalance_ban: bool = False     # --irqbalance-ban
    root: str = "/"
    ledger: str | None = None        # the ledger file (the daemon's: in its state dir); None: under *root*
    # The job cgroups' root when the shepherds' cgroup is to inherit its CPUs (--housekeeping-cpus
    # none): a stand-in list there is kept off each partition (shepherdcpus).
    shepherds_root: str | None = None


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


def ledger_path(settings: Settings) -> str:
    """Where the machine's ledger is (see the module's docstring)."""
    return settings.ledger or kfiles.join(settings.root, f"run/hpc-batch/{LEDGER}")


def load_ledger(settings: Settings) -> Ledger:
    """The machine's ledger; an empty one when there is none, it is unreadable, or from another boot."""
    data = records.read_json(ledger_path(settings))
    if not isinstance(data, dict) or data.get("boot") != boot_id(settings.root):
        return Ledger()
    entries = data.get("entries")
    return Ledger.from_dict(entries if isinstance(entries, dict) else {})


def save_ledger(settings: Settings, book: Ledger) -> None:
    """Persist the ledger durably (root only) before and after every change it plans."""
    path = ledger_path(settings)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    records.write_json(path, {"boot": boot_id(settings.root), "entries": book.to_dict()}, mode=0o600, durable=True)


def holder_of(jdir: str) -> str:
    """The name a job holds ledger entries under: its directory (stable across daemons)."""
    return os.path.abspath(jdir)


def begin(jdir, cpus, held, housekeeping, settings: Settings, alone: bool,
          cgroup: str | None = None, busy=()) -> dict[str, Any]:
    """Quiet the job's CPUs; returns the job's record of what was found and done.

    *cpus* is the job's cpuset, *held* every CPU it holds (cpuset and held
    siblings), *housekeeping* where interrupts go (less *held*). *alone*:
    the job holds the whole machine and no other job runs, so the
    machine-wide turbo switches are its to turn off. *busy*: the CPUs of the
    other running benchmark jobs, where no IRQ is sent when another CPU will do.
    """
    root = settings.root
    me = holder_of(jdir)
    book = load_ledger(settings)
    current = irqsteer.read_affinities(root)
    originals = {irq: o for irq in current if (o := book.original(irqsteer.affinity_path(irq))) is not None}
    irq_plan = irqsteer.plan(current, held, housekeeping, originals)
    freq = cpufreq.read_state(root, held)
    freq_rec: dict[str, Any] = {"policy": settings.cpufreq, "state": cpufreq.summarize(freq),
                                "turbo": freq["turbo"]}
    own: list[kfiles.Write] = []
    machine_turbo: list[kfiles.Write] = []
    if settings.cpufreq == "enforce" and freq["policies"]:
        own, freq_rec["notes"] = cpufreq.plan_enforce(freq)
        turbo, freq_rec["turbo"] = cpufreq.plan_turbo(freq, settings.allow_turbo_off, alone)
        own += [w for w in turbo if w.path not in MACHINE_WIDE]
        machine_turbo = [w for w in turbo if w.path in MACHINE_WIDE]
    elif settings.cpufreq == "enforce":
        freq_rec["notes"] = ["no cpufreq on this machine: nothing to set"]
    else:
        freq_rec["turbo"] = f"turbo {freq['turbo']}"
    saved: dict[str, Any] = {"boot": boot_id(root), "writes": [w.to_dict() for w in own],
                             "cgroup": cgroup, "partition": None}
    _persist(jdir, saved)   # before the first change: a crash after it can be undone
    wished = irq_plan + machine_turbo
    shared = book.begin(me, {w.path: (w.kind, w.new) for w in wished}, {w.path: w.old for w in wished}, busy)
    save_ledger(settings, book)   # likewise, and durably: it outlives this job's file
    done, refused = kfiles.apply(root, shared + own)
    book.settle([w for w in done if w in shared], [w for w, _ in refused if w in shared], holder=me)
    save_ledger(settings, book)
    why = {w.path: exc for w, exc in refused}
    # Per IRQ: from its value before hpc-batch's changes to the one it has now (or was tried).
    written = {w.path: w.new for w in shared}
    irq_writes = [kfiles.Write(w.path, book.original(w.path) or w.old, written.get(w.path, w.old), w.kind)
                  for w in irq_plan]
    kept = frozenset(w.path for w in irq_plan if w.path not in written and _touches(w.old, held))
    rec: dict[str, Any] = {
        "housekeeping": format_cpulist(housekeeping),
        "irqs": irqsteer.outcome(root, irq_writes, why, held, format_cpulist(set(housekeeping) - set(held)), kept),
        "cpufreq": freq_rec,
    }
    freq_writes = own + [w for w in shared if w.path in MACHINE_WIDE]
    freq_rec["changed"] = [w.path.rsplit("/", 2)[-2:] for w in done if w in freq_writes]
    freq_rec["refused"] = {w.path: kfiles.why(exc) for w, exc in refused if w in freq_writes}
    # A refused write changed nothing of ours: it must never be "restored" (the file may hold
    # the value tried by then, written by someone else).
    saved["writes"] = [w.to_dict() for w in done if w in own]
    ib = irqbalance(root)
    rec["irqbalance"] = ib["how"] if not ib["active"] else (
        f"active ({ib['how']}): it may move the job's IRQs back"
        + ("" if settings.irqbalance_ban else "; the admin may pass --irqbalance-ban"))
    if cgroup:
        if settings.shepherds_root:
            shepherdcpus.make_room(settings.shepherds_root, cpus)
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


def end(jdir: str, settings: Settings, others=None) -> dict[str, Any] | None:
    """Undo what :func:`begin` changed for the job, where still ours; None if nothing was pending.

    *others* lists the other running benchmark jobs as (job dir, CPUs held);
    a ledger holder not among them (a job whose end was never seen) lets go
    too. None: leave the other holders be. What the job held of the machine
    goes back to its value before hpc-batch's first change once no running
    job holds it; until then it keeps the value that suits those left.
    Returns {"restored": n, "handed": n (machine-wide settings still held by
    running jobs), "left": [...]} for the job's record. The job's file goes
    once done, so a second call (a crash in between, then recovery) does
    nothing more.
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
    root = settings.root
    me = holder_of(jdir)
    gone = {me}
    book = load_ledger(settings)
    if others is not None:
        gone |= book.holders() - {holder_of(d) for d, _ in others}
    ended = book.end(gone, {p: kfiles.read(root, p) for p, e in book.entries.items()
                            if not e.holders or gone & set(e.holders)},
                     set().union(*(held for _, held in others or ())))
    save_ledger(settings, book)   # the writes are pending in it: a crash now is finished by the next end
    done, refused = kfiles.apply(root, ended.writes)
    book.settle(done, [w for w, _ in refused])
    save_ledger(settings, book)
    notes = [f"{p}: {why}" for p, why in ended.left] + [f"{w.path}: {kfiles.why(exc)}" for w, exc in refused]
    restored, left = kfiles.undo(root, [kfiles.Write.from_dict(w) for w in saved.get("writes") or ()])
    notes += [f"{w.path}: {why}" for w, why in left]
    part = saved.get("partition")
    if part and saved.get("cgroup"):
        why = cpupartition.release(saved["cgroup"], part)
        if why:
            notes.append(why)
        if settings.shepherds_root:
            shepherdcpus.settle(settings.shepherds_root)
    _unlink(path)
    back = sum(1 for w in done if w.path in ended.restored)
    return {"restored": back + len(restored), "handed": len(ended.kept), "left": notes}


def _touches(cpulist: str, cpus) -> bool:
    try:
        return bool(set(parse_cpulist(cpulist)) & set(cpus))
    except ValueError:
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

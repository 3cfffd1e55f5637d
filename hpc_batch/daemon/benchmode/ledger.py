"""The ledger of machine-wide settings benchmark jobs change: who holds each, and what to put back.

Some settings a benchmark job changes are not its own: an IRQ's affinity
(``/proc/irq/<n>/smp_affinity_list``) and the machine-wide turbo switches
are one file for the whole machine, and jobs that overlap in time may all
want them changed. Per-job undo records (each job puts back what it found)
break as soon as two jobs change the same file: the one that ends first
finds the other's value, and the value from before either is lost.

So each such file has one :class:`Entry` here: the value before hpc-batch's
first change (``original``), the jobs that hold it now with the value each
wants, and what hpc-batch last wrote. A job's start adds it as a holder and
says what to write (every holder's wish at once: for CPU lists the CPUs
they all accept); its end removes it and, once no holder is left, puts the
original back. This module is pure: the caller reads the files, passes
their values in, carries out the :class:`kfiles.Write` it is given and says
which the kernel took (:meth:`Ledger.settle`); it persists the ledger
between those steps (``to_dict``), so a daemon that dies at any point
leaves a ledger the next one can finish from.

Something else that changed a file since hpc-batch wrote it (an admin,
irqbalance) wins: its value becomes the one to put back, and hpc-batch
does not write over it until a new job's start needs the file changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.cputopo import format_cpulist, parse_cpulist
from .kfiles import Write, same


@dataclass
class Entry:
    """One machine-wide file hpc-batch has changed for running benchmark jobs."""

    kind: str                      # as kfiles.Write.kind: "cpulist" or "text"
    original: str                  # the value before hpc-batch's first change: put back by the last holder
    holders: dict[str, str] = field(default_factory=dict)   # holder -> the value it wants, oldest first
    written: str | None = None     # what hpc-batch last wrote and the kernel took (None: nothing of ours)
    pending: str | None = None     # being written now: a crash leaves either this or the previous value

    def to_dict(self) -> dict:
        """JSON-safe form (holders as a list, to keep their order)."""
        return {"kind": self.kind, "original": self.original, "written": self.written,
                "pending": self.pending, "holders": [[h, v] for h, v in self.holders.items()]}

    @classmethod
    def from_dict(cls, d: dict) -> Entry:
        """Inverse of to_dict (raises KeyError, TypeError or ValueError on a damaged one)."""
        holders = {str(h): str(v) for h, v in d.get("holders") or ()}
        written, pending = d.get("written"), d.get("pending")
        return cls(kind=str(d["kind"]), original=str(d["original"]), holders=holders,
                   written=None if written is None else str(written),
                   pending=None if pending is None else str(pending))

    def ours(self, now: str | None) -> bool:
        """Whether the file holds a value hpc-batch wrote (or was writing when a daemon died)."""
        return any(v is not None and same(self.kind, now, v) for v in (self.written, self.pending))

    def seen(self, now: str | None) -> None:
        """Settle a write a dead daemon left pending, by what the file holds now."""
        if self.pending is not None and same(self.kind, now, self.pending):
            self.written, self.pending = self.pending, None
        elif self.written is not None and same(self.kind, now, self.written):
            self.pending = None

    def wanted(self, avoid: frozenset[int] = frozenset()) -> str | None:
        """The value that suits every holder, or None when none does (or nobody holds it).

        A CPU list: the CPUs every holder accepts (each wants interrupts off
        its own CPUs), less *avoid* (the CPUs of running jobs that do not
        hold it: a job that started after a holder) unless that leaves none.
        Text (a switch): the latest holder's value.
        """
        if not self.holders:
            return None
        if self.kind != "cpulist":
            return list(self.holders.values())[-1]
        common: set[int] | None = None
        for value in self.holders.values():
            try:
                cpus = set(parse_cpulist(value))
            except ValueError:
                continue
            common = cpus if common is None else common & cpus
        if not common:
            return None
        return format_cpulist(sorted(common - avoid or common))


@dataclass
class Ended:
    """What :meth:`Ledger.end` decided: the writes to carry out, and the job's record of it."""

    writes: list[Write] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)   # paths that go back to their original value
    kept: list[str] = field(default_factory=list)       # paths other running jobs still hold
    left: list[tuple[str, str]] = field(default_factory=list)   # (path, why it was left alone)


class Ledger:
    """Every machine-wide file hpc-batch holds changed, by path (see the module's docstring)."""

    def __init__(self, entries: dict[str, Entry] | None = None) -> None:
        self.entries: dict[str, Entry] = dict(entries or {})

    def to_dict(self) -> dict:
        """JSON-safe form."""
        return {path: e.to_dict() for path, e in sorted(self.entries.items())}

    @classmethod
    def from_dict(cls, d: dict) -> Ledger:
        """Inverse of to_dict; a damaged entry is dropped (nothing can be put back from it)."""
        entries = {}
        for path, e in (d or {}).items():
            try:
                entries[str(path)] = Entry.from_dict(e)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        return cls(entries)

    def original(self, path: str) -> str | None:
        """The value *path* had before hpc-batch's first change, if hpc-batch holds it changed."""
        e = self.entries.get(path)
        return e.original if e is not None else None

    def holders(self) -> set[str]:
        """Every holder of any entry."""
        return {h for e in self.entries.values() for h in e.holders}

    def held_by(self, holder: str) -> list[str]:
        """The paths *holder* holds."""
        return [path for path, e in self.entries.items() if holder in e.holders]

    def begin(self, holder: str, wants: dict[str, tuple[str, str]], now: dict[str, str | None],
              avoid=()) -> list[Write]:
        """*holder* starts and wants each path of *wants* ({path: (kind, value)}) changed.

        *now* is each path's value read just before; *avoid*, the CPUs of the
        other running jobs (see :meth:`Entry.wanted`). Returns the writes to
        carry out (old: the value found); the ledger marks them pending
        until :meth:`settle`. A path that cannot be read is left out.
        """
        writes: list[Write] = []
        busy = frozenset(avoid)
        for path, (kind, value) in wants.items():
            found = now.get(path)
            if found is None:
                continue
            e = self.entries.get(path)
            if e is None:
                e = self.entries[path] = Entry(kind=kind, original=found)
            else:
                e.seen(found)
            if not e.ours(found):
                # Nothing of hpc-batch's is in the file (never written, or changed since by
                # someone else, who wins): what is there now is what goes back.
                e.original, e.written, e.pending = found, None, None
            e.holders.pop(holder, None)
            e.holders[holder] = value
            target = e.wanted(busy)
            if target is not None and not same(kind, found, target):
                e.pending = target
                writes.append(Write(path, found, target, kind))
        return writes

    def end(self, gone: set[str], now: dict[str, str | None], avoid=()) -> Ended:
        """The holders in *gone* have ended: what to write, restore, keep and leave.

        *now* is the value of every path they hold, read just before;
        *avoid*, the CPUs of the jobs still running. A path
        still held by others gets the value that suits those left (written
        only where the file still holds hpc-batch's value); a path nobody
        holds any more gets its original value back, where the file still
        holds hpc-batch's. The writes are pending until :meth:`settle`.

        An entry nobody holds (a daemon died between an end and its writes)
        is finished here too: whichever end comes next puts its original back.
        """
        out = Ended()
        busy = frozenset(avoid)
        for path in sorted(self.entries):
            e = self.entries[path]
            if e.holders and not gone & set(e.holders):
                continue
            for h in gone:
                e.holders.pop(h, None)
            found = now.get(path)
            e.seen(found)
            if found is None:
                out.left.append((path, "gone"))
                if not e.holders:
                    del self.entries[path]
                continue
            if e.holders:
                out.kept.append(path)
                if not e.ours(found):
                    e.original, e.written, e.pending = found, None, None
                    continue
                target = e.wanted(busy)
                if target is not None and not same(e.kind, found, target):
                    e.pending = target
                    out.writes.append(Write(path, found, target, e.kind))
                continue
            if e.written is None and e.pending is None or same(e.kind, found, e.original):
                del self.entries[path]   # nothing of ours in the file: nothing to put back
            elif e.ours(found):
                e.pending = e.original
                out.writes.append(Write(path, found, e.original, e.kind))
                out.restored.append(path)
            else:
                out.left.append((path, f"changed since (holds {found!r})"))
                del self.entries[path]
        return out

    def settle(self, done: list[Write], refused: list[Write], holder: str | None = None) -> None:
        """Record what the kernel did with writes of :meth:`begin` or :meth:`end`.

        A write taken becomes ``written``; one put back to the original ends
        the entry once nobody holds it. A refused one changed nothing; at a
        start (*holder* given) the holder lets go of that path, since nothing
        was changed for it.
        """
        for w in done:
            e = self.entries.get(w.path)
            if e is None:
                continue
            e.pending = None
            e.written = w.new
            if not e.holders and same(e.kind, w.new, e.original):
                del self.entries[w.path]
        for w in refused:
            e = self.entries.get(w.path)
            if e is None:
                continue
            e.pending = None
            if holder is not None:
                e.holders.pop(holder, None)
            if not e.holders:
                del self.entries[w.path]   # nobody holds it, and nothing was changed for it

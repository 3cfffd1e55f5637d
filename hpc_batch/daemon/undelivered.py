"""``<state-dir>/undelivered/``: outputs whose delivery failed, bounded in total, per user and in age.

When a finished job's output could not be copied to its log (the user's
directory was gone, full or not writable) the buffer is kept so nothing is
lost at once: in the job's directory while its record is kept (where its
user reads it, through ``--dev-dir``), and here once the record is evicted
(``--keep-finished``), as ``output.<id>.<user>.log`` (root's, 0640, readable
by the admin group; the directory is root-only). It counts against its
owner's share from the job's end, wherever it is (:meth:`Undelivered.hold`;
the third review's G1: buffers kept in job directories until eviction
counted against nothing). Left alone this would let any user fill the
state filesystem, one failed delivery at a time, so the files are bounded:

- a file older than ``--undelivered-max-age`` (counted from when it was
  moved here) is dropped;
- past ``--undelivered-per-user`` bytes, a user's oldest files are dropped
  (a single file larger than the share goes at once);
- past ``--undelivered-max`` bytes in all, or ``UNDELIVERED_MAX_FILES``
  files, the files of the user who holds the most (bytes for the one,
  files for the other) go first, each user's oldest first: one user's
  many files, however small, never push out another's (the third
  review's G2, where 10,000 empty files of one user deleted another's
  only copy of its output).

Every dropped file is named in the log. A file moved in costs what it
makes go, never a pass over the directory: an index of the files, per
owner oldest first, with running totals (:class:`Held`), is built by the
sweep at start-up (the first tick) and again every ``SWEEP_EVERY``
seconds, the one pass that also sees age and what others removed. Files
of earlier versions (``output.<id>.log``) count as one owner of their own.
"""

import logging
import os
import stat
import time
from collections import deque
from dataclasses import dataclass

from shepherd.base.records import fsync_dir

from .. import defaults

log = logging.getLogger("hpc-batchd")
DIRNAME = "undelivered"
SWEEP_EVERY = 300.0      # seconds between two sweeps from the tick


@dataclass(frozen=True)
class Entry:
    """One file in undelivered/: its name, size, when it was kept, and whose (``""``: not known)."""

    name: str
    size: int
    mtime: float
    owner: str


@dataclass(frozen=True)
class Bounds:
    """What undelivered/ may hold."""

    max_total: int
    per_user: int
    max_age: float
    max_files: int = defaults.UNDELIVERED_MAX_FILES


def owner_of(name: str) -> str:
    """The user a file name says it belongs to: ``output.<id>.<user>.log``; ``""`` for any other name."""
    if not (name.startswith("output.") and name.endswith(".log")):
        return ""
    job_id, _, user = name[len("output."):-len(".log")].partition(".")
    return user if job_id.isdigit() else ""


def to_drop(entries: list[Entry], now: float, bounds: Bounds) -> list[tuple[Entry, str]]:
    """The entries to remove, oldest first, each with why: too old, past its owner's share, past the total.

    Pure: sorts once, then one pass per rule (O(n log n) in the files, and the owners once a drop
    past the totals).
    After a cut for the file count a tenth more goes, so a steady trickle
    of small files does not cost a full sweep each.
    """
    drop: list[tuple[Entry, str]] = []
    kept: list[Entry] = []
    for e in sorted(entries, key=lambda e: (e.mtime, e.name)):
        if now - e.mtime > bounds.max_age:
            drop.append((e, "older than --undelivered-max-age"))
        else:
            kept.append(e)
    owned: dict[str, int] = {}
    for e in kept:
        owned[e.owner] = owned.get(e.owner, 0) + e.size
    still: list[Entry] = []
    for e in kept:
        if owned[e.owner] > bounds.per_user:
            owned[e.owner] -= e.size
            drop.append((e, f"{e.owner or 'unknown owner'}'s files past --undelivered-per-user"))
        else:
            still.append(e)
    # Past the totals: the user who holds the most goes first (among equals, the one with the oldest
    # file), so a drop falls on another user's file only once that user holds as much as anyone.
    # Owners are few (users), so a max over them a drop.
    files: dict[str, deque[Entry]] = {}
    for e in still:                       # oldest first, as sorted above
        files.setdefault(e.owner, deque()).append(e)
    held = {owner: sum(e.size for e in q) for owner, q in files.items()}
    total = sum(held.values())
    count = len(still)
    files_after = bounds.max_files - bounds.max_files // 10 if count > bounds.max_files else count
    while files and (total > bounds.max_total or count > files_after):
        if total > bounds.max_total:
            owner = max(files, key=lambda o: (held[o], len(files[o]), -files[o][0].mtime))
            why = "all files past --undelivered-max; its owner holds the most bytes"
        else:
            owner = max(files, key=lambda o: (len(files[o]), held[o], -files[o][0].mtime))
            why = f"more than {bounds.max_files} files; its owner holds the most of them"
        e = files[owner].popleft()
        if not files[owner]:
            del files[owner]
        held[owner] -= e.size
        total -= e.size
        count -= 1
        drop.append((e, why))
    return drop


class Held:
    """What undelivered/ holds, per owner oldest first, with running totals (pure): a file taken in
    is checked against the bounds in the time of what it makes go, whatever the directory holds."""

    def __init__(self, entries: list[Entry]):
        self.files: dict[str, deque[Entry]] = {}
        self.owned: dict[str, int] = {}
        self.total = self.count = 0
        for e in sorted(entries, key=lambda e: (e.mtime, e.name)):
            self.add(e)

    def add(self, e: Entry) -> None:
        """Take in a file, the newest of its owner's."""
        self.files.setdefault(e.owner, deque()).append(e)
        self.owned[e.owner] = self.owned.get(e.owner, 0) + e.size
        self.total += e.size
        self.count += 1

    def _pop(self, owner: str) -> Entry:
        e = self.files[owner].popleft()
        if not self.files[owner]:
            del self.files[owner]
        self.owned[owner] -= e.size
        if not self.owned[owner]:
            del self.owned[owner]
        self.total -= e.size
        self.count -= 1
        return e

    def trim(self, owner: str, bounds: Bounds) -> list[tuple[Entry, str]]:
        """What goes now that *owner* took a file in, by :func:`to_drop`'s rules bar age (the sweep's)."""
        drop: list[tuple[Entry, str]] = []
        while self.owned.get(owner, 0) > bounds.per_user:
            drop.append((self._pop(owner), f"{owner or 'unknown owner'}'s files past --undelivered-per-user"))
        files_after = bounds.max_files - bounds.max_files // 10 if self.count > bounds.max_files else self.count
        while self.files and (self.total > bounds.max_total or self.count > files_after):
            if self.total > bounds.max_total:
                top = max(self.files, key=lambda o: (self.owned.get(o, 0), len(self.files[o]),
                                                     -self.files[o][0].mtime))
                why = "all files past --undelivered-max; its owner holds the most bytes"
            else:
                top = max(self.files, key=lambda o: (len(self.files[o]), self.owned.get(o, 0),
                                                     -self.files[o][0].mtime))
                why = f"more than {bounds.max_files} files; its owner holds the most of them"
            drop.append((self._pop(top), why))
        return drop


class Undelivered:
    """The undelivered/ directory of one daemon: takes buffers in, keeps it within the bounds."""

    def __init__(self, root: str, bounds: Bounds):
        self.dir = os.path.join(root, DIRNAME)
        self.bounds = bounds
        self.next_sweep = 0.0             # the first tick (at start-up) sweeps
        self.held: Held | None = None     # the index, from the last sweep on
        # Buffers still in their job's directory, counted as if here: name here -> (entry, path).
        self.in_jobs: dict[str, tuple[Entry, str]] = {}
        self.dropped: list[tuple[int, str]] = []   # (job id, why) of those dropped: the engine says so

    def hold(self, job_id: int, user: str, src: str, when: float) -> None:
        """Count a finished job's buffer, kept in its directory at *src*, against its owner's share
        from *when* (its end), and drop what that puts past a bound. Never raises."""
        try:
            st = os.lstat(src)
        except OSError:
            return
        if not stat.S_ISREG(st.st_mode):
            return
        e = Entry(os.path.basename(self.path(job_id, user)), st.st_size, when, _owner(user))
        self.in_jobs[e.name] = (e, src)
        if self.held is None:
            self.sweep(when)      # the index, once: it counts this one
        else:
            self.held.add(e)
            self._drop(self.held.trim(e.owner, self.bounds))

    def take_dropped(self) -> list[tuple[int, str]]:
        """Buffers dropped from job directories since the last call: (job id, why); once."""
        out, self.dropped = self.dropped, []
        return out

    def path(self, job_id: int, user: str) -> str:
        """Where a job's undelivered output is kept."""
        owner = _owner(user)
        return os.path.join(self.dir, f"output.{job_id}.{owner}.log" if owner else f"output.{job_id}.log")

    def keep(self, job_id: int, user: str, src: str, now: float) -> str | None:
        """Move a job's undelivered output buffer *src* in, as its record is evicted. One already
        counted (:meth:`hold`) changes place only; one that was not (an earlier version's) is
        counted from *now*, and what that puts past a bound goes. Returns where it is kept (None:
        it could not be, or it went at once, being past its owner's whole share). Never raises.
        """
        dst = self.path(job_id, user)
        held = self.in_jobs.pop(os.path.basename(dst), None)
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            os.rename(src, dst)
            when = held[0].mtime if held is not None else now
            os.utime(dst, (when, when), follow_symlinks=False)   # its age counts from the job's end
            size = os.lstat(dst).st_size
            fsync_dir(self.dir)   # before the eviction's commit drops the directory it came from
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError):
                log.error("job %d: cannot keep its undelivered output in %s (%s)", job_id, self.dir, exc)
            return None
        log.info("job %d: its undelivered output (%d bytes) is kept as %s", job_id, size, dst)
        if held is not None and self.held is not None:
            return dst            # counted since the job's end: it only changed place
        if self.held is None:
            self.sweep(now)    # the index, once: the file just moved in is in it
        else:
            self.held.add(Entry(os.path.basename(dst), size, now, _owner(user)))
            self._drop(self.held.trim(_owner(user), self.bounds))
        return dst if os.path.lexists(dst) else None

    def tick(self, now: float) -> float:
        """Sweep if one is due; returns when the next is."""
        if self.next_sweep - now > SWEEP_EVERY:
            self.next_sweep = now             # the clock went back
        if now >= self.next_sweep:
            self.sweep(now)
        return self.next_sweep

    def sweep(self, now: float) -> None:
        """One pass over the directory: drop what the bounds say, log each file dropped. Never raises."""
        self.next_sweep = now + SWEEP_EVERY
        entries = []
        try:
            with os.scandir(self.dir) as it:
                for d in it:
                    st = d.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        entries.append(Entry(d.name, st.st_size, st.st_mtime, owner_of(d.name)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("cannot look through %s (%s); will try again", self.dir, exc)
            return
        for name, (e, path) in list(self.in_jobs.items()):
            if os.path.lexists(path) and not os.path.lexists(os.path.join(self.dir, name)):
                entries.append(e)
            else:
                del self.in_jobs[name]    # gone with its job, or moved in by another way
        gone = self._drop(to_drop(entries, now, self.bounds))
        self.held = Held([e for e in entries if e.name not in gone])

    def _drop(self, drop: list[tuple[Entry, str]]) -> set[str]:
        """Unlink each file, logging why; returns the names gone (one that would not go is kept)."""
        gone = set()
        for e, why in drop:
            in_job = self.in_jobs.pop(e.name, None)
            path = in_job[1] if in_job is not None else os.path.join(self.dir, e.name)
            if in_job is not None:
                self.dropped.append((int(e.name.split(".")[1]), why))
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("cannot drop %s (%s)", path, exc)
                continue
            gone.add(e.name)
            log.warning("dropped %s (%d bytes, kept since %s): %s", path, e.size,
                        _when(e.mtime), why)
        return gone


def _owner(user: str) -> str:
    """The owner a file name may carry: a user name that is a plain file name part; else none."""
    return user if user and "/" not in user and user not in (".", "..") else ""


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))

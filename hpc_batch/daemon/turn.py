"""One turn of the daemon's loop, as the engine leaves it: what it changed and still owes.

The engine fills this record as it acts (jobs submitted, jobs started and
to spawn, records whose write failed, a schedule due) and empties it at the
turn's end (``Engine.end_turn``). The server reads it through two questions
only, :meth:`Turn.wake` (when the loop must turn again) and
:attr:`Turn.holds_replies` (whether a reply must wait for the commit), so
the loop never reads the engine's own state.
"""

from dataclasses import dataclass, field
from typing import Protocol

from .bulks import Queue


class Staged(Protocol):
    """What the turn asks of the store: whether changes wait for the next commit."""

    @property
    def has_pending(self) -> bool: ...


@dataclass
class Turn:
    """What this turn of the loop changed and what it still owes."""

    store: Staged
    # Bulk submits stored a slice per turn (bulks.py), oldest first: each turn owes the first one a slice.
    bulks: Queue
    # Group commit: what this turn changed is made durable at its end, in one fsync (Store.commit),
    # before replies go out and before started jobs are spawned.
    submitted: set[int] = field(default_factory=set)   # jobs submitted this turn (refused if the commit fails)
    to_spawn: list = field(default_factory=list)       # (job, cgroup) started this turn, spawned after the commit
    # Jobs started in a turn that answers submits: written after the commit that answers them
    # (Starting.write_put_off), so a submit's reply waits for no launch spec's fsyncs.
    to_write: list = field(default_factory=list)
    # Of them, those whose info.json was written before the answers that name them
    # (Starting.show_put_off): their spawn does not write it again.
    shown: set[int] = field(default_factory=set)
    # Jobs submitted this turn whose info.json is written just before the commit: one that
    # starts in the same turn gets its one as it is spawned, not two.
    info_due: list[int] = field(default_factory=list)
    unsaved: set[int] = field(default_factory=set)     # job records whose last write failed (full disk)
    meta_dirty: bool = False                           # daemon.json's last write failed: retried from the tick
    resched: bool = False                              # something freed resources: schedule on the next tick
    retry_at: float | None = None                      # when to retry starts that failed to write

    def wake(self, now: float) -> float | None:
        """When the loop must turn again for this turn's sake: *now* while work is left (a schedule
        due, shepherds to spawn, a bulk to store), else the retry of a start put off, or None."""
        if self.resched or self.to_spawn or self.to_write or self.bulks:
            return now
        return self.retry_at

    @property
    def holds_replies(self) -> bool:
        """True while what a reply reports is not durable yet: it goes out after this turn's commit."""
        return self.store.has_pending or bool(self.to_spawn or self.to_write)

"""A bulk submit stored a slice per turn of the loop, and acknowledged once all of it is durable.

One ``dispatch new --array 1-72000`` used to be stored in the turn that took
it: a directory, a cache and a journal line per job, about a millisecond
each, while nobody else was answered (the third review's G9: bob waited
92 s). A submit of more than ``SLICE`` jobs is stored instead a slice per
turn, each slice at most ``SLICE_SECONDS`` of the loop, the commit of each
turn making its slice durable with the other changes of that turn. Its
shared record says ``pending`` until the batch that holds the last slice,
which says it no more: that batch acknowledges the whole bulk at once, and
a daemon that starts over a journal whose bulk is still pending drops all
of it (store.py), so a crash or a stop mid-way leaves none of it, never a
part. Once durable, the jobs enter the job table, again a slice a turn,
and the submitter is answered when the last one is in.

Meanwhile its ids are taken (no other submit gets them), its jobs count
against its user's ``--max-queued-per-user``, and nothing else sees them:
``list``, ``kill`` and ``--after`` answer "no such job" until the reply.
"""

import gc
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.jobs import Job
from . import engineparts as parts
from .envfiles import Shared
from .refusal import Refused
from .store import is_disk_full

log = logging.getLogger("hpc-batchd")

SLICE = 256              # a submit of more jobs than this is stored a slice per turn
SLICE_SECONDS = 0.02     # the time a turn gives the slice it stores, or puts in the table


@dataclass
class Bulk:
    """A bulk submit under way: what makes its jobs, how far it got, whom to answer."""

    uid: int
    first: int
    count: int
    make: Callable[[int], Job]   # the k-th job of the submit (0-based)
    env: dict[str, Any]
    shared_argv: list[str] | None
    reply: dict[str, Any]         # the answer, but for the fields known once it is in the table
    token: Any = None             # the connection to answer (the server's)
    shared: Shared | None = None  # its shared record, from the first slice on
    made: list[Job] = field(default_factory=list)   # stored so far, in id order
    staged_last: bool = False     # the last slice and the end of the bulk wait for this turn's commit
    durable: bool = False         # all of it is acknowledged by the journal
    added: int = 0                # of ``made``, in the job table

    @property
    def last(self) -> int:
        """The bulk's last job id."""
        return self.first + self.count - 1


class Storing:
    """What ``Engine.submit`` gives for a bulk it stores over several turns: the server holds the
    connection, and the engine answers it (:meth:`Engine.take_bulk_replies`)."""

    def __init__(self, bulk: Bulk):
        self.bulk = bulk


class Queue:
    """The bulk submits under way, oldest first: each turn of the loop owes the first one a slice.

    It stores them through the store it is given and keeps their jobs per
    user (they count against --max-queued-per-user meanwhile) and the answers
    due; the engine enters their jobs into its table (*enter*, given).
    """

    def __init__(self, store: parts.Store, admin_gid: int | None):
        self.store = store
        self.admin_gid = admin_gid
        self.storing: deque[Bulk] = deque()
        self.by_uid: dict[int, int] = {}
        self.replies: list[tuple[Any, dict[str, Any] | Refused]] = []   # (token, reply fields)

    def __len__(self) -> int:
        return len(self.storing)

    def __iter__(self) -> Iterator[Bulk]:
        return iter(self.storing)

    def __contains__(self, b: object) -> bool:
        return b in self.storing

    def held(self, uid: int) -> int:
        """How many jobs of *uid*'s bulks are still to enter the table."""
        return self.by_uid.get(uid, 0)

    def add(self, b: Bulk) -> None:
        """A bulk submit to store, after those under way."""
        self.storing.append(b)
        self.by_uid[b.uid] = self.by_uid.get(b.uid, 0) + b.count

    def slice(self, enter: Callable[[Job, bool], None], gone: Callable[[int], bool]) -> bool:
        """Give the oldest bulk under way this turn's slice: stored, or (once durable) entered.

        *enter(job, look)* puts a stored job in the table (*look*: a job it follows has ended,
        *gone(id)* says so). True once a bulk is all in (the queue grew: schedule).
        """
        if not self.storing:
            return False
        try:
            return self._slice(self.storing[0], enter, gone)
        finally:
            # The slice's jobs live on: out of the collector's generations (an O(1) move), so that the
            # full collections a growing heap triggers do not walk 100,000 jobs, about 1 ms each
            # 300 jobs, while the loop waits. The young ones are collected first.
            gc.collect(1)
            gc.freeze()

    def _slice(self, b: Bulk, enter: Callable[[Job, bool], None], gone: Callable[[int], bool]) -> bool:
        until = time.monotonic() + SLICE_SECONDS
        if not b.durable:
            if b.staged_last:
                return False    # its last slice waits for this turn's commit
            try:
                if b.shared is None:
                    b.shared = self.store.begin_bulk(b.first, b.env, b.shared_argv)
                while len(b.made) < b.count:
                    job = b.make(len(b.made))
                    self.store.add_slice(b.shared, [job], self.admin_gid)
                    b.made.append(job)
                    if time.monotonic() >= until:
                        break
                if len(b.made) == b.count:
                    self.store.end_bulk(b.shared)
                    b.staged_last = True
            except OSError as exc:
                self.abort(b, exc)
            return False
        look = any(gone(dep) for dep in b.reply["after"])
        while b.added < b.count:
            enter(b.made[b.added], look)
            b.added += 1
            self.by_uid[b.uid] -= 1
            if time.monotonic() >= until:
                return False
        self.storing.popleft()
        if not self.by_uid.get(b.uid):
            self.by_uid.pop(b.uid, None)
        first = b.made[0]
        log.info("jobs %d-%d %s for %s (%d in one submit): %s", b.first, b.last, first.state, first.user,
                 b.count, first.shown[0])
        self.replies.append((b.token, {"state": first.state, "output": first.output, **b.reply}))
        return True

    def abort(self, b: Bulk, exc: OSError) -> None:
        """A bulk that cannot be stored goes, all of it, and its submitter is told."""
        log.error("jobs %d-%d refused: cannot store them: %s", b.first, b.last, exc)
        if b.shared is not None:
            self.store.abort_bulk(b.shared, (job.id for job in b.made))
        self.storing.remove(b)
        left = self.by_uid.get(b.uid, 0) - b.count
        if left > 0:
            self.by_uid[b.uid] = left
        else:
            self.by_uid.pop(b.uid, None)
        why = "the state directory's disk is full" if is_disk_full(exc) else exc.strerror
        self.replies.append((b.token, Refused(
            f"cannot store the jobs ({why}); nothing was queued, try again later", "busy")))

    def committed(self, exc: OSError | None) -> None:
        """This turn's commit: the bulks whose last slice it made durable are (*exc* None), or those
        not yet durable go (its error)."""
        if exc is not None:
            for b in [b for b in self.storing if not b.durable]:
                self.abort(b, exc)
        else:
            for b in self.storing:
                b.durable = b.durable or b.staged_last

    def take_replies(self) -> list[tuple[Any, dict[str, Any] | Refused]]:
        """Answers to bulk submits (reply fields, or why it was refused), each with the token
        (the connection) it was given to; once."""
        out, self.replies = self.replies, []
        return out

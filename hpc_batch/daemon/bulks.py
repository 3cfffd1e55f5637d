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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.jobs import Job
from .envfiles import Shared

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

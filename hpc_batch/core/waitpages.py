"""The pages of a ``dispatch wait`` answer (pure): the daemon's cut, the client's reassembly.

A wait may name 100,000 jobs (``protocol.MAX_REFS``); its answer is cut like a
list's, so that no reply, and no buffer the daemon holds for one, grows with
it. The first answer comes once every job has ended, with the first page and
the ids of the jobs it leaves out; the client then waits on those, a page at a
time, and each such wait is answered at once. Every reply carries at least one
job, so the client always gets to the end.
"""

from collections.abc import Callable, Sequence
from typing import Any

from shepherd.base.jsoncodec import dumps_wire


def cut(items: Sequence[Any], entry_of: Callable[[Any], dict[str, Any]], jobs: int, size: int
        ) -> tuple[list[dict[str, Any]], int]:
    """The entries of the first page of *items* and how many items it holds: at most *jobs* of
    them, and no more once their encoded size reaches *size* bytes (one always). Entries are
    built only for the page: a wait on a whole bulk costs a page's worth of work per reply."""
    entries: list[dict[str, Any]] = []
    used = 0
    for item in items:
        if entries and (len(entries) >= jobs or used >= size):
            break
        entry = entry_of(item)
        used += len(dumps_wire(entry)) + 1
        entries.append(entry)
    return entries, len(entries)


def take(asked: Sequence[int], got: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    """The client's side of a follow-up page: the entries for *asked*, in its order, and the ids
    of *asked* the page left out (to ask again).

    The daemon answers the distinct jobs of a wait once each, a prefix of them; an id named twice
    (two names of one job the history answered for) gets its entry twice, as the first answer
    would have given it.
    """
    by_id = {entry.get("id"): entry for entry in got}
    entries: list[dict[str, Any]] = []
    for n, job_id in enumerate(asked):
        entry = by_id.get(job_id)
        if entry is None:
            return entries, list(asked[n:])
        entries.append(entry)
    return entries, []

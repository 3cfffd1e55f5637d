"""The engine's jobs by id, with the order a paged ``list`` reads them in.

``JobTable`` is the engine's ``jobs`` dict (id -> Job) that also keeps the ids
sorted, all together and per user, so a ``list`` page starting after a cursor
costs the page, not a scan of every job (a dict cannot be entered in the
middle). Ids grow, so adding is an append; a removed id stays in the lists
until they are half dead, then they are compacted, which costs each removal
O(1) amortised.
"""

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Any

COMPACT_FLOOR = 64   # dead ids a list may hold before compaction is considered


class IdList:
    """Sorted job ids, with removals marked dead and swept in bulk."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.dead = 0

    def add(self, job_id: int, alive: Any) -> None:
        """Insert *job_id* (usually the largest yet: an append)."""
        ids = self.ids
        if not ids or job_id > ids[-1]:
            ids.append(job_id)
            return
        i = bisect_left(ids, job_id)
        if i < len(ids) and ids[i] == job_id:
            self.dead -= 1        # an id removed (a refused commit) and made again
        else:
            ids.insert(i, job_id)
        if self.dead < 0:         # cannot happen; never let the count mislead compaction
            self.sweep(alive)

    def remove(self, alive: Any) -> None:
        """One of its ids is no longer alive."""
        self.dead += 1
        if self.dead > COMPACT_FLOOR and self.dead * 2 > len(self.ids):
            self.sweep(alive)

    def sweep(self, alive: Any) -> None:
        """Drop the dead ids (``alive(id)`` says which live)."""
        self.ids = [i for i in self.ids if alive(i)]
        self.dead = 0

    def after(self, cursor: int) -> Iterator[int]:
        """The ids above *cursor*, in order (dead ones included: the caller skips them)."""
        ids = self.ids
        for k in range(bisect_right(ids, cursor), len(ids)):
            yield ids[k]


class JobTable(dict[int, Any]):
    """``dict[int, Job]`` that keeps an IdList of all ids and one per user."""

    def __init__(self) -> None:
        super().__init__()
        self.order = IdList()
        self.by_uid_order: dict[int, IdList] = {}

    def __setitem__(self, job_id: int, job: Any) -> None:
        if job_id not in self:
            self.order.add(job_id, self.__contains__)
            self.by_uid_order.setdefault(job.uid, IdList()).add(job_id, self._of(job.uid))
        super().__setitem__(job_id, job)

    def __delitem__(self, job_id: int) -> None:
        job = self[job_id]
        super().__delitem__(job_id)
        self._removed(job)

    def pop(self, job_id: int, *default: Any) -> Any:
        if job_id not in self:
            if default:
                return default[0]
            raise KeyError(job_id)
        job = super().pop(job_id)
        self._removed(job)
        return job

    def _removed(self, job: Any) -> None:
        self.order.remove(self.__contains__)
        mine = self.by_uid_order.get(job.uid)
        if mine is not None:
            mine.remove(self._of(job.uid))
            if len(mine.ids) == mine.dead:
                del self.by_uid_order[job.uid]

    def _of(self, uid: int) -> Any:
        """Whether an id is a live job of *uid* (an id refused at commit may be made again for another)."""
        def alive(job_id: int) -> bool:
            job = self.get(job_id)
            return job is not None and job.uid == uid
        return alive

    def ids_after(self, cursor: int, uid: int | None = None) -> Iterator[int]:
        """Ids above *cursor* in order, of every user or of *uid*; possibly of removed jobs."""
        if uid is None:
            return self.order.after(cursor)
        mine = self.by_uid_order.get(uid)
        return mine.after(cursor) if mine is not None else iter(())

    # What would change the dict behind the lists' back is not offered.
    def _unsupported(self, *args: Any, **kw: Any) -> Any:
        raise TypeError("JobTable: use job_table[id] = job, del, or pop")

    update = setdefault = popitem = clear = _unsupported

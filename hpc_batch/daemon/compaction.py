"""Compaction: the snapshot that replaces the journal once it has grown, written a slice per commit.

The snapshot is one batch: every shared record, every live job's record
(from its cache), the meta. At start-up it is written whole (nothing
appends meanwhile); later each commit spends about COMPACT_SLICE seconds
on it, and the batches appended meanwhile follow it in the new journal.
"""

import errno
import time
from collections.abc import Iterable

from . import formats
from .commit import Staging
from .envfiles import SharedRecords
from .jobcache import JobCache
from .journal import Compaction, end_line, format_line, line
from .statefiles import ranges

COMPACT_SLICE = 0.005  # seconds of a commit spent on a compaction under way (the rest: next commit)


class _Compacting:
    """A compaction under way: its file, its batch number, and what is still to be read (last first)."""

    def __init__(self, file: Compaction, number: int, shared: Iterable[int], jobs: Iterable[int]):
        self.file = file
        self.number = number
        self.shared = sorted(shared, reverse=True)   # popped from the end: in id order
        self.jobs = sorted(jobs, reverse=True)


class Compactor:
    """Writes the journal's snapshot from the staged counters, the job caches and the shared records."""

    def __init__(self, staging: Staging, cache: JobCache, envs: SharedRecords):
        self.staging = staging
        self.cache = cache
        self.envs = envs
        self.current: _Compacting | None = None

    def due(self) -> bool:
        """True when a commit should write a slice: one is under way, or the journal has grown."""
        return self.current is not None or self.staging.journal.wants_compaction()

    def step(self) -> None:
        """Write about COMPACT_SLICE seconds of the compaction (begun here if none is under way)."""
        self.compact(time.monotonic() + COMPACT_SLICE)

    def abandon(self) -> None:
        """Give up the compaction under way, if any."""
        if self.current is not None:
            self.current.file.abandon()
            self.current = None

    def compact(self, until: float | None) -> None:
        """Write the snapshot that replaces the journal, until monotonic time *until* (None: to the end).

        The snapshot is one batch: every shared record, every live job's
        record (from its cache), the meta. A compaction begun here goes on at
        the next commit; the records read for it are as new as when they were
        read, and the batches appended meanwhile follow it in the new journal.
        """
        c = self.current
        if c is None:
            if self.cache.torn:   # a cache that cannot be read now would drop its job from the snapshot
                raise OSError(errno.EAGAIN,
                              f"the job.json of jobs {ranges(sorted(self.cache.torn))} is still to be rewritten")
            seq = self.staging.next_seq()
            number = self.staging.batch + 1 if until is None else self.staging.batch
            c = self.current = _Compacting(self.staging.journal.begin(format_line(seq), 1), number,
                                           self.envs.records, self.staging.live)
        try:
            if self._slice(c, until):
                self.current = None
        except BaseException:
            c.file.abandon()
            self.current = None
            raise

    def _slice(self, c: _Compacting, until: float | None) -> bool:
        """Write the next slice of *c*; True once it is the journal."""
        lines: list[bytes] = []
        done = 0
        while c.shared or c.jobs:
            done += 1
            if until is not None and done % 32 == 0 and time.monotonic() >= until:
                c.file.add(b"".join(lines), len(lines))
                return False
            if c.shared:
                key = c.shared.pop()
                if key in self.envs.records:
                    lines.append(line({"seq": self.staging.next_seq(), "shared": self.envs.records[key].record()}))
                continue
            job_id = c.jobs.pop()
            if job_id in self.cache.torn:
                raise OSError(errno.EAGAIN, f"the job.json of job {job_id} is still to be rewritten")
            try:
                data = self.cache.read(job_id)
            except formats.NewerFormat:   # not one this daemon wrote (set aside at start-up otherwise)
                data = None
            if data is None:
                continue
            # The record keeps its own seq: a new one would make every cache look stale to the
            # next start, which would then rewrite them all.
            seq = data.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool):
                seq = self.staging.next_seq()
            lines.append(line({"seq": seq, "job": data}))
        self.envs.sync()
        lines.append(line({"seq": self.staging.next_seq(), "meta": self.staging.meta}))
        lines.append(end_line(self.staging.next_seq(), c.number, c.file.lines + len(lines)))
        c.file.add(b"".join(lines), len(lines))
        self.staging.journal.finish(c.file)
        self.staging.batch = max(self.staging.batch, c.number)
        return True

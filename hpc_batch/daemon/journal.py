"""The state directory's write-ahead journal: group commit for job records.

Every change the daemon must not lose (a submit, a start, an end, the id
floor) is appended here as one line of JSON, and a batch of them, however
many jobs and requests it covers, is made durable by one ``fdatasync``: the
daemon acknowledges a batch's submits, and spawns its started jobs, only
after that. The per-job ``job.json`` files are then written without fsyncs;
they are a readable cache of the journal, and after a crash the loader
rewrites any the journal shows to be stale or missing.

Lines::

    {"seq": N, "format": F}         the first line: the journal's format (formats.JOURNAL)
    {"seq": N, "job": {record}}     argv left out where its submit's shared record holds it
    {"seq": N, "job": {record}, "same": "argv"}
                                    a later change of a job: its argv is the one of its line
                                    before (format 2: a job's command is journalled once)
    {"seq": N, "shared": {...}}     what the jobs of one submit share (envfiles.py)
    {"seq": N, "drop": ID}          the job was evicted: forget it
    {"seq": N, "meta": {...}}       the id floor and scheduler state
    {"seq": N, "commit": C, "lines": K}   the end of batch C, which holds the K lines before it

*seq* grows by one per line, and the cache files carry the seq of the
record they hold, so the newer of the two wins; they also carry the batch
that makes them durable, which is how the loader tells a journal that lost
acknowledged batches (a damaged disk, a bad copy) from one whose last batch
was cut short by a crash. Lines after the last ``commit`` were never
acknowledged and are dropped, damaged or not; any damage before it is an
error. A journal from before batches (no ``commit`` lines) is read as it
always was: only a torn last line may be dropped.

When the journal has grown past twice its last snapshot, it is compacted: a
snapshot of every live record, itself one batch, replaces it (temp file,
fsync, rename, fsync of the directory). Compaction therefore costs the live
state, once per doubling: amortised, a constant per change. The daemon
writes the snapshot a slice per turn (:class:`Compaction`), so 100,000 live
jobs never hold its loop; the batches appended meanwhile are copied after
the snapshot when it is done, and replay after it, so each is newer than
whatever the snapshot holds of the same record.

Every snapshot begins with the format line, so the format is known from the
first line alone, before the rest is parsed: a newer journal is refused
(formats.NewerFormat), never taken for a damaged one and set aside. A journal
without it is from before formats were numbered (format 1).
"""

from __future__ import annotations

import errno
import os
from typing import NamedTuple

from shepherd.base.records import dumps_wire, fsync, fsync_dir, loads

from . import formats

NAME = "journal"
MIN_COMPACT = 1 << 20      # never compact a journal smaller than this
SYNC_EVERY = 1 << 20       # a snapshot's bytes flushed as it grows, so its last fsync has little left


class JournalError(Exception):
    """A journal line inside an acknowledged batch cannot be read (the disk, or someone, damaged it)."""


class Contents(NamedTuple):
    """What a journal holds."""

    entries: list[dict]     # the entries of its whole batches (every whole line, in the old format)
    good: int               # bytes of it those take
    batch: int | None       # the last whole batch's number; None for a journal without batches
    dropped: int            # lines after the last whole batch (never acknowledged), dropped


def _entry(raw: bytes) -> dict | None:
    try:
        entry = loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("seq"), int) else None


def _is_end(entry: dict | None) -> bool:
    return entry is not None and isinstance(entry.get("commit"), int) and isinstance(entry.get("lines"), int)


def read_contents(data: bytes) -> Contents:
    """Parse a journal: its whole batches, or for the old format its whole lines.

    Raises JournalError for damage no crash can leave: an unreadable line, or
    a batch whose line count is wrong, before the last batch's end.
    """
    lines = data.split(b"\n")
    tail = lines.pop()            # b"" after a final newline; else a line the append cut short
    parsed = [_entry(raw) for raw in lines]
    end = max((i for i, e in enumerate(parsed) if _is_end(e)), default=None)
    if end is None:               # the old format: whole lines, only the last may be torn
        old: list[dict] = []
        good = 0
        for i, (raw, entry) in enumerate(zip(lines, parsed)):
            if entry is None and raw:
                if all(not rest for rest in lines[i + 1:]) and not tail:
                    return Contents(old, good, None, 1)
                raise JournalError(f"line {i + 1} cannot be read (not a journal entry)")
            if entry is not None:
                old.append(entry)
            good += len(raw) + 1
        return Contents(old, good, None, 1 if tail else 0)
    entries: list[dict] = []
    good, batch, count = 0, 0, 0
    for i in range(end + 1):
        entry = parsed[i]
        if entry is None:
            if not lines[i]:
                good += 1
                continue
            raise JournalError(f"line {i + 1} cannot be read, and a later batch was acknowledged")
        good += len(lines[i]) + 1
        if _is_end(entry):
            if entry["lines"] != count:
                raise JournalError(f"batch {entry['commit']} ending at line {i + 1} holds {count} lines, "
                                   f"not the {entry['lines']} it was written with")
            batch, count = entry["commit"], 0
            continue
        entries.append(entry)
        count += 1
    return Contents(entries, good, batch, len(lines) - end - 1 + (1 if tail else 0))


def parse(data: bytes) -> tuple[list[dict], int]:
    """The entries of a journal, and how many bytes of it are whole (see :func:`read_contents`)."""
    c = read_contents(data)
    return c.entries, c.good


def check_format(data: bytes, path: str) -> None:
    """Raise formats.NewerFormat when the journal *data* (at *path*) is in a format this daemon does not know.

    Only the first line is read: a newer format may change everything after it.
    """
    first = _entry(data.split(b"\n", 1)[0])
    if first is not None and "format" in first:
        formats.check(first, formats.JOURNAL, path, "journal")


def format_line(seq: int) -> bytes:
    """The line that opens a snapshot: the format it is written in."""
    return line({"seq": seq, "format": formats.JOURNAL})


def end_line(seq: int, batch: int, lines: int) -> bytes:
    """The line that closes batch *batch* of *lines* lines."""
    return line({"seq": seq, "commit": batch, "lines": lines})


def line(entry: dict) -> bytes:
    """One entry as a journal line."""
    return dumps_wire(entry).encode("ascii") + b"\n"


def job_line(seq: int, record: bytes, same_argv: bool = False) -> bytes:
    """What ``line({"seq": seq, "job": data})`` gives, for *data* already encoded (dumps_wire) as
    *record*: the store encodes a job once, for its cache and for this line. *same_argv*: the
    record leaves its command out, which is the one of the job's line before it."""
    if same_argv:
        return b'{"seq":%d,"job":%s,"same":"argv"}\n' % (seq, record)
    return b'{"seq":%d,"job":%s}\n' % (seq, record)


class Journal:
    """The open journal file: append batches durably, replace it by a snapshot."""

    def __init__(self, directory: str):
        self.dir = directory
        self.path = os.path.join(directory, NAME)
        self.fd: int | None = None
        self.size = 0
        self.snapshot_size = 0

    def read(self) -> Contents | None:
        """What it holds (None when there is no journal at all); formats.NewerFormat for a newer one."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        check_format(data, self.path)
        return read_contents(data)

    def append(self, data: bytes) -> None:
        """Write *data* (whole lines) and make it durable; on failure the file is as it was."""
        assert self.fd is not None, "open the journal with replace() first"
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
            fsync(self.fd, data_only=True)
        except OSError:
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                pass
            raise
        self.size += len(data)

    def wants_compaction(self) -> bool:
        """True once it has grown past twice its last snapshot (and past MIN_COMPACT)."""
        return self.size > max(MIN_COMPACT, 2 * self.snapshot_size)

    def replace(self, data: bytes) -> None:
        """Make *data* (a snapshot) the whole journal, durably, and append after it from now on."""
        self.finish(self.begin(data, 0))

    def begin(self, head: bytes, lines: int) -> Compaction:
        """Start writing a snapshot that opens with *head* (*lines* lines) into the temp file."""
        return Compaction(self, head, lines)

    def finish(self, c: Compaction) -> None:
        """Copy after snapshot *c* (whole, its end line written) what was appended since it began,
        and make that the journal: fsync, rename, fsync of the directory. On OSError *c* is abandoned
        and the journal is as it was, unless only the directory's fsync failed: the new one stands."""
        try:
            c.add(self._appended_since(c.start), 0)
            c.sync()
            c.close()
            # Opened before the rename: appends go to the new file once it is the journal, whatever fails after.
            new = os.open(c.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            c.abandon()
            raise
        try:
            os.rename(c.path, self.path)
        except OSError:
            os.close(new)
            c.abandon()
            raise
        if self.fd is not None:
            os.close(self.fd)
        self.fd = new
        self.size = self.snapshot_size = c.size
        fsync_dir(self.dir)

    def _appended_since(self, start: int) -> bytes:
        """The journal's bytes from *start* to its end: whole batches, each already durable."""
        if self.fd is None or self.size <= start:
            return b""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.pread(fd, self.size - start, start)
        finally:
            os.close(fd)
        if len(data) != self.size - start:
            raise OSError(errno.EIO, f"the journal is shorter than the {self.size} bytes written to it")
        return data


class Compaction:
    """A snapshot being written into ``journal.tmp`` (see :meth:`Journal.begin`).

    It counts its lines, for the batch end that closes it, and flushes every
    SYNC_EVERY bytes, so that finishing a large one costs a small fsync.
    """

    def __init__(self, journal: Journal, head: bytes, lines: int):
        self.path = journal.path + ".tmp"
        self.start = journal.size       # what the journal holds now is what the snapshot replaces
        self.lines = 0
        self.size = 0
        self._unsynced = 0
        self.fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                                      0o600)
        try:
            self.add(head, lines)
        except OSError:
            self.abandon()
            raise

    def add(self, data: bytes, lines: int) -> None:
        """Append *data*, *lines* whole lines of the snapshot (the caller abandons it on OSError)."""
        assert self.fd is not None, "a finished or abandoned compaction"
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.size += len(data)
        self.lines += lines
        self._unsynced += len(data)
        if self._unsynced >= SYNC_EVERY:
            fsync(self.fd, data_only=True)
            self._unsynced = 0

    def sync(self) -> None:
        """fsync what it holds."""
        assert self.fd is not None, "a finished or abandoned compaction"
        fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def abandon(self) -> None:
        """Give it up: the temp file goes, the journal stays as it is."""
        self.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

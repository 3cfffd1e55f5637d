"""The state directory's write-ahead journal: group commit for job records.

Every change the daemon must not lose (a submit, a start, an end, the id
floor) is appended here as one line of JSON, and a batch of them, however
many jobs and requests it covers, is made durable by one ``fdatasync``: the
daemon acknowledges a batch's submits, and spawns its started jobs, only
after that. The per-job ``job.json`` files are then written without fsyncs;
they are a readable cache of the journal, and after a crash the loader
rewrites any the journal shows to be stale or missing.

Lines::

    {"seq": N, "job": {record, "env": ... while queued}}
    {"seq": N, "drop": ID}        the job was evicted: forget it
    {"seq": N, "meta": {...}}     the id floor and scheduler state

*seq* grows by one per line, and the cache files carry the seq of the
record they hold, so the newer of the two wins. When the journal has grown
past twice its last snapshot, it is compacted: a snapshot of every live
record replaces it (temp file, fsync, rename, fsync of the directory).
A crash mid-append leaves at most a torn last line, which was never
acknowledged, and is dropped.
"""

from __future__ import annotations

import os

from shepherd.records import dumps_wire, fsync_dir, loads

NAME = "journal"
MIN_COMPACT = 1 << 20      # never compact a journal smaller than this


class JournalError(Exception):
    """A journal line other than the last cannot be read (the disk, or someone, damaged it)."""


def parse(data: bytes) -> tuple[list[dict], int]:
    """The entries of a journal, and how many bytes of it are whole lines.

    A torn or unreadable last line is left out (a crash cut it short); an
    unreadable line before the last raises JournalError.
    """
    entries: list[dict] = []
    good = 0
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if not line:
            if not last:
                good += 1
            continue
        try:
            entry = loads(line.decode("utf-8"))
            if not isinstance(entry, dict) or not isinstance(entry.get("seq"), int):
                raise ValueError("not a journal entry")
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            if last or all(not rest for rest in lines[i + 1:]):
                break
            raise JournalError(f"line {i + 1} cannot be read ({exc})") from None
        if last:
            break          # no newline: the append was cut short
        entries.append(entry)
        good += len(line) + 1
    return entries, good


def line(entry: dict) -> bytes:
    """One entry as a journal line."""
    return dumps_wire(entry).encode("ascii") + b"\n"


class Journal:
    """The open journal file: append batches durably, replace it by a snapshot."""

    def __init__(self, directory: str):
        self.dir = directory
        self.path = os.path.join(directory, NAME)
        self.fd: int | None = None
        self.size = 0
        self.snapshot_size = 0

    def read(self) -> tuple[list[dict], bool]:
        """Its entries, and whether it exists at all."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return [], False
        entries, _ = parse(data)
        return entries, True

    def append(self, data: bytes) -> None:
        """Write *data* (whole lines) and make it durable; on failure the file is as it was."""
        assert self.fd is not None, "open the journal with replace() first"
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
            os.fdatasync(self.fd)
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
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, self.path)
        fsync_dir(self.dir)
        new = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        if self.fd is not None:
            os.close(self.fd)
        self.fd = new
        self.size = self.snapshot_size = len(data)

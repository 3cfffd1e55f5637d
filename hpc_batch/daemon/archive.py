"""The history archive: every finished job, with its record, for as long as the admin keeps them.

``--keep-finished`` bounds what the live daemon holds; a job goes on from
there to ``<state-dir>/history.db``, where ``dispatch history``, ``report``,
``show``, ``show --record`` and ``record diff`` still find it. The archive is
SQLite in WAL mode (the standard library's; docs/how-it-works.md says why),
root's and 0600, and it is never touched by the event loop:

- a *writer* thread takes the jobs the loop hands it (:meth:`Archive.put`:
  an append to a list), reads each job's ``record.json``, and writes them
  in batches, a transaction each. It tells the loop which jobs are safe
  once their rows are durable: a finished job's directory is evicted only
  then, so a crash, a ``kill -9`` or a power cut never loses a job between
  the two (the loader hands every finished job to the archive again at
  start-up; a job already there is skipped without reading its record).
  Until the loop needs to evict one the journal holds the job anyway, so
  rows are made durable (one fsync of the WAL for all of them) only when
  the loop asks (:meth:`Archive.want_durable`), when the daemon stops, or
  ``SYNC_AFTER`` seconds after they were written: a job that ends within
  ``--keep-finished`` costs the archive no fsync of its own;
- a *reader* thread answers queries on a connection of its own (WAL lets
  it read while the writer writes), so a query over a million rows delays
  nobody else's request. Each answer goes back to the loop through the
  same pipe.

Each user's rows are bounded by ``--history-per-user`` bytes (compressed, as
stored) and all rows by ``--history-days``: past either, the user's *own*
oldest rows go, never another user's (the principle of the second review's
F7). What went is remembered per user as a floor (the highest id pruned), so
a job past the retention is answered "forgotten after ...", not "no such
job".

A damaged archive (not a database, or malformed) is moved aside whole,
named in the log, and a new one begun; a full disk keeps the batch in memory
and retries it (the jobs stay live meanwhile). Neither stops the daemon. An
archive of a newer format is left untouched and the daemon runs without one,
saying so: its rows are the newer version's truth.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..core import views
from ..core.durations import format_duration
from ..core.sizes import format_size
from ..wire import protocol
from . import archivedb as adb
from .archivedb import Entry as Entry
from .archivedb import Filters as Filters
from .ratelog import RateLimited

log = logging.getLogger("hpc-batchd")
rlog = RateLimited(log)

FILE = "history.db"
LEGACY_DIR = "history"             # the per-user JSON-lines files of 0.x, migrated once
SHARED_LEGACY = "history.jsonl"    # 0.1.0's one shared file: left alone (its command is a word list)
BATCH = 256                        # jobs one transaction writes at most
RETRY = 5.0                        # seconds before a failed batch is tried again
PRUNE_EVERY = 3600.0               # seconds between two sweeps for rows past --history-days
SYNC_AFTER = 30.0                  # seconds a written row waits to be made durable when nobody asks sooner
QUERIES_MAX = 64                   # queries waiting for the reader, all users together
QUERIES_PER_USER = 4               # ... one user's



@dataclass
class Query:
    """One question for the reader: a lookup (``show``, ``record``) or a listing (``history``)."""

    kind: str                       # "show", "record", "wait" or "history"
    uid: int
    is_admin: bool
    list_public: bool
    token: Any                      # the loop's: which connection the answer is for
    ref: int | str | None = None
    refs: tuple[int | str, ...] = ()  # a wait's jobs that the daemon no longer holds
    filters: Filters | None = None
    next_id: int = 0                # ids from here on were never given out (for "no such job")
    now: float = 0.0


@dataclass
class _Pending:
    """What the threads have for the loop, taken by :meth:`Archive.take`."""

    archived: list[int] = field(default_factory=list)
    answers: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)


class Archive:
    """The archive's two threads, and the loop's side of them (put, ask, take)."""

    def __init__(self, root: str, per_user: int, days: int):
        self.path = os.path.join(root, FILE)
        self.root = root
        self.per_user = per_user
        self.days = days
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)      # the writer's queue changed
        self._asked = threading.Condition(self._lock)     # the reader's queue changed
        self._entries: deque[Entry] = deque()
        self._queries: deque[Query] = deque()
        self._asking: dict[int, int] = {}                 # uid -> its queries waiting
        self._out = _Pending()
        self._stopping = False
        self._sync_wanted = False                         # the loop waits on rows not yet durable
        self._ready = threading.Event()                   # the writer has opened (or given up on) the file
        self.usable = True                                # False: no archive this run (said in the log)
        self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._threads: list[threading.Thread] = []
        self.began = 0                                    # the first id the archive has seen go by

    # -- the loop's side ------------------------------------------------------------
    @property
    def fd(self) -> int:
        """Readable when the threads have something for the loop (:meth:`take`)."""
        return self._rfd

    def start(self, next_id: int) -> None:
        """Open (or make, migrating the 0.x history files) and start both threads."""
        self.began = next_id
        for name, run in (("archive-writer", self._write_loop), ("archive-reader", self._read_loop)):
            t = threading.Thread(target=run, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def put(self, entry: Entry) -> bool:
        """Hand a finished job to the writer (never blocks, never fails). False: it is not archived
        yet (:meth:`take` says when it is); an archive that writes at once would answer True."""
        with self._lock:
            self._entries.append(entry)
            self._work.notify()
        return False

    def want_durable(self) -> None:
        """The loop waits to evict jobs handed over: make what is written durable now (one fsync)."""
        with self._lock:
            self._sync_wanted = True
            self._work.notify()

    def ask(self, query: Query) -> str | None:
        """Hand a query to the reader; None, or why it was not taken (too many waiting: try later)."""
        with self._lock:
            if self._stopping:   # a reload's old image, answering while the new one starts
                return "the history archive is being reloaded; try again in a moment"
            if len(self._queries) >= QUERIES_MAX:
                return "the history archive is busy answering others; try again in a moment"
            if self._asking.get(query.uid, 0) >= QUERIES_PER_USER:
                return (f"you already have {QUERIES_PER_USER} history queries under way; "
                        f"wait for their answers")
            self._asking[query.uid] = self._asking.get(query.uid, 0) + 1
            self._queries.append(query)
            self._asked.notify()
        return None

    def take(self) -> _Pending:
        """What the threads have finished since the last call: jobs archived, answers to send."""
        try:
            while self._rfd >= 0 and os.read(self._rfd, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            out, self._out = self._out, _Pending()
        return out

    def stop(self, within: float = 2.0) -> bool:
        """Stop both threads (before a re-exec or an exit); jobs not yet written are handed again
        at the next start, so waiting is only a courtesy. False: a thread is still busy."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
            self._asked.notify_all()
        until = time.monotonic() + within
        for t in self._threads:
            t.join(max(0.0, until - time.monotonic()))
        with self._lock:    # once only: a second close could hit a descriptor reused since
            fds, self._rfd, self._wfd = (self._rfd, self._wfd), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        return not any(t.is_alive() for t in self._threads)

    def _post(self, archived: list[int] | None = None, answer: tuple[Any, dict[str, Any]] | None = None) -> None:
        with self._lock:
            if archived:
                self._out.archived.extend(archived)
            if answer is not None:
                self._out.answers.append(answer)
            try:
                if self._wfd >= 0:      # (under the lock: stop() may close it)
                    os.write(self._wfd, b"!")
            except OSError:
                pass    # the pipe is full: the loop has a wake-up waiting already

    # -- the file ---------------------------------------------------------------------
    def _connect(self, readonly: bool = False) -> sqlite3.Connection:
        if readonly:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30, check_same_thread=True)
        else:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA busy_timeout = 30000")
        return db

    def _open(self) -> sqlite3.Connection | None:
        """The writer's connection, the file checked and its schema made; None: no archive this run."""
        for attempt in (1, 2):
            try:
                adb.check_file(self.path)
                db = self._connect()
                found = adb.format_of(db)     # before anything that writes: a newer archive stays as it is
                if found is not None and found > adb.FORMAT:
                    log.error("history: %s is of format %d, newer than this hpc-batchd's %d; it is left "
                              "as it is and no history is kept this run (run the newer version, or move "
                              "the file aside)", self.path, found, adb.FORMAT)
                    db.close()
                    return None
                os.chmod(self.path, 0o600)
                self.began = adb.prepare(db, self.began)
                self._migrate(db)
                return db
            except sqlite3.DatabaseError as exc:
                if attempt == 2 or isinstance(exc, sqlite3.OperationalError) and not adb.damaged(exc):
                    log.error("history: cannot open %s (%s); no history is kept this run", self.path, exc)
                    return None
                self._set_aside(exc)
            except OSError as exc:
                log.error("history: cannot use %s (%s); no history is kept this run", self.path, exc)
                return None
        return None

    def _set_aside(self, why: Exception) -> None:
        """Move a damaged archive (and its WAL) aside, named in the log, so a new one can begin."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        aside = f"{self.path}.damaged-{stamp}"
        for suffix in ("", "-wal", "-shm"):
            try:
                os.rename(self.path + suffix, aside + suffix)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("history: cannot move %s aside (%s)", self.path + suffix, exc)
        log.error("history: %s is damaged (%s); moved aside to %s and a new archive begun: the jobs "
                  "it held are forgotten", self.path, why, aside)

    # -- the writer -------------------------------------------------------------------
    def _write_loop(self) -> None:
        db = self._open()
        if db is None:
            self.usable = False
        self._ready.set()
        next_prune = 0.0
        unsynced: list[int] = []        # committed, not yet durable: not yet told to the loop
        sync_by = float("inf")          # when they are made durable even if nobody waits for them
        while True:
            with self._lock:
                while (not self._entries and not self._stopping and not (self._sync_wanted and unsynced)
                       and time.monotonic() < min(next_prune, sync_by)):
                    until = min(next_prune, sync_by)
                    self._work.wait(None if until == float("inf") else max(0.0, until - time.monotonic()))
                stopping, wanted = self._stopping, self._sync_wanted
                self._sync_wanted = False
                batch = [self._entries.popleft() for _ in range(min(BATCH, len(self._entries)))]
            if db is None:      # no archive: every job may go (its loss was said once, at the start)
                self._post(archived=[e.id for e in batch])
                next_prune = float("inf")
                if stopping:
                    break
                continue
            try:
                if batch:
                    adb.write(db, batch, self.per_user)
                    if not unsynced:
                        sync_by = time.monotonic() + SYNC_AFTER
                    unsynced += [e.id for e in batch]
                if unsynced and (wanted or stopping or time.monotonic() >= sync_by):
                    adb.sync(db)
                    self._post(archived=unsynced)
                    unsynced, sync_by = [], float("inf")
                if time.monotonic() >= next_prune and not stopping:
                    cutoff = time.time() - self.days * 86400
                    while not self._stopping and not adb.prune_old(db, cutoff):
                        pass
                    adb.analyse(db)
                    next_prune = time.monotonic() + PRUNE_EVERY
            except sqlite3.DatabaseError as exc:
                with self._lock:
                    self._entries.extendleft(reversed(batch))   # tried again, in order
                    self._sync_wanted = self._sync_wanted or wanted
                if adb.damaged(exc):
                    db.close()
                    self._set_aside(exc)
                    db = self._open()
                    if db is None:
                        self.usable = False
                    continue
                rlog.error("archive-write", "history: cannot write %d jobs to %s (%s); trying again in %gs",
                           len(batch), self.path, exc, RETRY)
                with self._lock:
                    if not self._stopping:
                        self._work.wait(RETRY)
                    if self._stopping:
                        break
                continue
            if stopping and not self._entries:
                break
        if db is not None:
            db.close()

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Bring the 0.x per-user history files (``history/<user>.jsonl`` and rotations) in, once;
        the directory is then renamed ``history.migrated`` for the admin to keep or delete."""
        if os.path.lexists(os.path.join(self.root, SHARED_LEGACY)):
            log.info("history: the shared %s of 0.1.0 is left as it was (not migrated); keep it with your "
                     "archives or delete it", os.path.join(self.root, SHARED_LEGACY))
        legacy = os.path.join(self.root, LEGACY_DIR)
        try:
            st = os.lstat(legacy)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            log.error("history: %s is not a directory of the daemon's own; not migrating it", legacy)
            return
        moved_in = bad = 0
        for name in sorted(os.listdir(legacy)):   # a file at a time: a quarter of --history-per-user at most
            if ".jsonl" not in name:
                continue
            entries, skipped = adb.legacy_lines(os.path.join(legacy, name))
            for start in range(0, len(entries), BATCH):
                adb.write(db, entries[start:start + BATCH], self.per_user)
            moved_in += len(entries)
            bad += skipped
        moved = legacy + ".migrated"
        try:
            os.rename(legacy, moved)
        except OSError as exc:
            log.error("history: migrated %s but cannot rename it (%s); it would be read again", legacy, exc)
            return
        log.info("history: %d jobs of %s migrated into %s (%d lines skipped); the old files are kept in %s",
                 moved_in, legacy, self.path, bad, moved)

    # -- the reader -------------------------------------------------------------------
    def _read_loop(self) -> None:
        self._ready.wait()
        db = None
        while True:
            with self._lock:
                while not self._queries and not self._stopping:
                    self._asked.wait()
                if self._stopping:
                    break
                q = self._queries.popleft()
            try:
                if not self.usable:
                    raise _NoArchive()
                if db is None:
                    db = self._connect(readonly=True)
                answer = self._answer(db, q)
            except _NoArchive:
                answer = self._missing(q, q.ref if q.kind != "wait" else q.refs[0],
                                       "the daemon keeps no history this run (see its log)")
            except sqlite3.DatabaseError as exc:
                rlog.error("archive-read", "history: cannot read %s (%s)", self.path, exc)
                if db is not None:
                    db.close()
                    db = None
                answer = protocol.error(f"the history archive cannot be read now ({exc}); "
                                        f"the admin will find it in the daemon's log", "busy")
            except Exception:
                rlog.exception("archive-query", "history: internal error answering a %s query", q.kind)
                answer = protocol.error("internal error in hpc-batchd reading the history; see the daemon's log",
                                        "internal")
            with self._lock:
                left = self._asking.get(q.uid, 1) - 1
                if left > 0:
                    self._asking[q.uid] = left
                else:
                    self._asking.pop(q.uid, None)
            self._post(answer=(q.token, answer))
        if db is not None:
            db.close()

    def _answer(self, db: sqlite3.Connection, q: Query) -> dict[str, Any]:
        if q.kind == "history":
            assert q.filters is not None
            rows, more = adb.page(db, q.filters, q.uid, q.is_admin, min(q.filters.limit, protocol.HISTORY_PAGE_ROWS),
                                  protocol.HISTORY_PAGE_BYTES)
            return protocol.ok(jobs=rows, more=more, began=self.began)
        if q.kind == "wait":
            entries = []
            for ref in q.refs:
                found = self._visible(db, q, ref)
                if isinstance(found, dict):
                    return found        # the first job it cannot answer for refuses the wait, as a live one does
                entries.append(views.archived_wait_entry(found[0]))
            return protocol.ok(jobs=entries)
        assert q.ref is not None
        found = self._visible(db, q, q.ref)
        if isinstance(found, dict):
            return found
        show, record, row = found
        if q.kind == "show":
            return protocol.ok(job={**show, "archived": True}, now=q.now)
        if record is None:
            why = row.get("record_note") or ("it ended before it started, the daemon ran with --records none, "
                                             "or it came from an older version's history")
            return protocol.error(f"job {show.get('id', q.ref)} has no record: {why}", "refused")
        return protocol.ok(record=record)

    def _visible(self, db: sqlite3.Connection, q: Query, ref: int | str):
        """The archived job *ref* names as *q*'s caller may see it: (show, record, row), or the
        refusal to answer with (a dict)."""
        hit = adb.find(db, ref, q.uid, q.is_admin)
        if hit is None:
            return self._missing(q, ref, None, db)
        job_id, uid = hit
        if uid != q.uid and not q.is_admin:
            if q.list_public:
                return protocol.error(f"job {ref} belongs to another user", "forbidden")
            return self._missing(q, ref, None, db)
        found = adb.docs(db, job_id)
        return found if found is not None else self._missing(q, ref, None, db)

    def _missing(self, q: Query, ref: int | str | None, why: str | None,
                 db: sqlite3.Connection | None = None) -> dict[str, Any]:
        """The answer for a job neither live nor archived: forgotten, or no such job."""
        if q.kind == "history" or ref is None:
            return protocol.error(f"no history: {why}", "refused")
        if isinstance(ref, str):
            return protocol.error(f"no job named {ref!r} among your jobs or in your history"
                                  + (f" ({why})" if why else ""), "not_found")
        if why is None and ref < q.next_id and self._forgotten(db, q.uid, q.is_admin, ref):
            return protocol.error(self.forgotten_text(ref), "not_found")
        return protocol.error(f"no such job: {ref}" + (f" ({why})" if why else ""), "not_found")

    def _forgotten(self, db: sqlite3.Connection | None, uid: int, is_admin: bool, job_id: int) -> bool:
        """Whether *job_id* is below what the archive began with, or below a floor of pruned rows."""
        if job_id < self.began:
            return True
        return db is not None and job_id <= adb.floor(db, uid, is_admin)

    def forgotten_text(self, job_id: int) -> str:
        """What a user is told of a job past the retention: when jobs go, and how to keep a record longer."""
        return (f"job {job_id} is forgotten: finished jobs are forgotten after "
                f"{format_duration(self.days * 86400)}, or once their user's history passes "
                f"{format_size(self.per_user)} (the admin's --history-days and --history-per-user); to keep "
                f"a job's record as long as you like, submit it with --record PATH")

class _NoArchive(Exception):
    """No archive this run."""



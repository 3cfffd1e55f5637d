"""The history archive's file: its schema, its rows, and every SQL statement run on it.

Called only from the archive's threads (``archive.py``), each with its own
connection; nothing here runs on the event loop. A row is split in two
tables: ``jobs`` holds the columns that queries filter on (small, so that a
scan of a million rows stays in the page cache), ``docs`` the compressed
JSON blobs a reply carries (the history row, the ``show`` document, the
record). ``users`` holds each user's bytes and the highest id pruned from
their rows (their *floor*, below which a job is "forgotten").
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
import zlib
from dataclasses import dataclass
from typing import Any

from ..core import setup as setupdigest
from ..wire import protocol

FORMAT = 1
ROW_OVERHEAD = 128                 # bytes a row costs beyond its blobs (its columns and index entries)
RECORD_MAX = 1 << 20               # record.json bytes read (the shepherd bounds a record at 256 KiB)
REASONS_KEPT = 5                   # verdict reasons a row carries (the record has them all)
REASON_CUT = 300                   # characters of each
PRUNE_SLICE = 1000                 # rows one transaction of the age sweep deletes at most
ANALYSIS_LIMIT = 2000              # rows ANALYZE samples an index

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY, uid INTEGER NOT NULL, user TEXT NOT NULL, name TEXT,
    array_first INTEGER, result TEXT, code INTEGER, failed INTEGER NOT NULL, verdict TEXT, started REAL,
    ended REAL NOT NULL, setup TEXT, bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, row BLOB NOT NULL, show BLOB NOT NULL, record BLOB);
CREATE TABLE IF NOT EXISTS users (uid INTEGER PRIMARY KEY, bytes INTEGER NOT NULL, floor INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_uid ON jobs (uid, id);
CREATE INDEX IF NOT EXISTS jobs_uid_name ON jobs (uid, name, id);
CREATE INDEX IF NOT EXISTS jobs_name ON jobs (name, id);
CREATE INDEX IF NOT EXISTS jobs_array ON jobs (array_first, id);
CREATE INDEX IF NOT EXISTS jobs_setup ON jobs (setup, id);
CREATE INDEX IF NOT EXISTS jobs_uid_verdict ON jobs (uid, verdict, id);
CREATE INDEX IF NOT EXISTS jobs_verdict ON jobs (verdict, id);
CREATE INDEX IF NOT EXISTS jobs_uid_result ON jobs (uid, result, id);
CREATE INDEX IF NOT EXISTS jobs_uid_failed ON jobs (uid, failed, id);
CREATE INDEX IF NOT EXISTS jobs_uid_ended ON jobs (uid, ended);
CREATE INDEX IF NOT EXISTS jobs_ended ON jobs (ended);
"""
# Every filter of a user's history has an index that starts with the uid, so that a query which
# matches little or nothing never walks all of a user's rows; ANALYZE's statistics (refreshed at
# each start and hourly, sampled: see analyse) let the planner choose between the filter's index
# and walking jobs_uid newest first when the filter matches much.


@dataclass
class Entry:
    """A finished job for the archive, built on the loop from what the daemon holds (no file read)."""

    id: int
    uid: int
    user: str
    name: str | None
    array_first: int | None
    result: str | None
    code: int | None                # the exit code, when it exited
    started: float | None
    ended: float
    row: dict[str, Any]             # views.history_row: what the record adds is filled in by the writer
    show: dict[str, Any]            # views.show as the job ended
    record_path: str | None         # its record.json, read by the writer (None: it has none)
    if_absent: bool = False         # handed again at start-up: skip it when the archive has it


@dataclass(frozen=True)
class Filters:
    """What ``dispatch history`` and ``report`` select; None is "any"."""

    user: str | None = None         # admins: one user's jobs (all users' with all_users)
    all_users: bool = False
    name: str | None = None
    array: int | None = None        # the first id of a bulk submit
    ids: tuple[tuple[int, int], ...] = ()   # ranges, inclusive
    result: str | None = None       # a result kind, or "failed": anything but exit 0
    verdict: str | None = None      # clean, noisy, unknown, or "none" (no record)
    since: float | None = None      # ended at or after
    until: float | None = None      # ended before
    setup: str | None = None        # a setup digest, or a prefix of one (at least 8 hex digits)
    before: int | None = None       # a page's cursor: ids below this
    limit: int = 100


# -- opening ----------------------------------------------------------------------------
def check_file(path: str) -> None:
    """The archive (when it exists) must be a plain file of the daemon's own: never a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{path} is not a plain file of the daemon's own")


def format_of(db: sqlite3.Connection) -> int | None:
    """The file's format (None: a new file, no meta table yet)."""
    try:
        hit = db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
    except sqlite3.OperationalError:
        return None
    return int(hit[0]) if hit and str(hit[0]).isdigit() else None


def prepare(db: sqlite3.Connection, began: int) -> int:
    """WAL, the schema and the meta rows; returns the id the archive began at.

    Commits are ``synchronous = NORMAL``: in WAL mode one may be lost to a power cut but never
    damages the file; :func:`sync` makes them durable when that matters (before an eviction)."""
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.executescript(SCHEMA)
    with transaction(db):
        db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(FORMAT),))
        db.execute("INSERT OR IGNORE INTO meta VALUES ('began', ?)", (str(began),))
    return int(db.execute("SELECT value FROM meta WHERE key = 'began'").fetchone()[0])


def sync(db: sqlite3.Connection) -> None:
    """Make every transaction committed so far durable: one small commit at ``synchronous = FULL``,
    whose fsync of the WAL covers the frames of the commits before it."""
    db.execute("PRAGMA synchronous = FULL")
    try:
        with transaction(db):
            db.execute("INSERT OR REPLACE INTO meta VALUES ('synced', ?)", (repr(time.time()),))
    finally:
        db.execute("PRAGMA synchronous = NORMAL")


def analyse(db: sqlite3.Connection) -> None:
    """Refresh the planner's statistics, sampling at most ANALYSIS_LIMIT rows an index (so that it
    costs the same at a million rows as at a thousand)."""
    db.execute(f"PRAGMA analysis_limit = {ANALYSIS_LIMIT}")
    db.execute("ANALYZE")


def damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether an error says the file itself is bad (rather than full, locked or unwritable)."""
    text = str(exc).lower()
    return not isinstance(exc, sqlite3.OperationalError) or "malformed" in text or "not a database" in text


class transaction:
    """``with transaction(db):`` BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an error."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.db.execute("COMMIT")
        else:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass


# -- writing ----------------------------------------------------------------------------
def write(db: sqlite3.Connection, batch: list[Entry], per_user: int) -> None:
    """*batch* in one transaction: each job's row (replacing one of the same id), then each user
    touched pruned back under *per_user* bytes, oldest rows first."""
    with transaction(db):
        touched: set[int] = set()
        for e in batch:
            if e.if_absent and db.execute("SELECT 1 FROM jobs WHERE id = ?", (e.id,)).fetchone():
                continue
            row, show, rec = blobs(e)
            size = len(row) + len(show) + len(rec or b"") + ROW_OVERHEAD
            old = db.execute("SELECT uid, bytes FROM jobs WHERE id = ?", (e.id,)).fetchone()
            if old is not None:
                _charge(db, old[0], -old[1])
            failed = int(not (e.result == "exited" and e.code == 0))
            db.execute("INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (e.id, e.uid, e.user, e.name, e.array_first, e.result, e.code, failed,
                        e.row.get("verdict"), e.started, e.ended, e.row.get("setup_digest"), size))
            db.execute("INSERT OR REPLACE INTO docs VALUES (?,?,?,?)", (e.id, row, show, rec))
            _charge(db, e.uid, size)
            touched.add(e.uid)
        for uid in touched:
            _prune_user(db, uid, per_user)


def blobs(e: Entry) -> tuple[bytes, bytes, bytes | None]:
    """The row, show and record blobs of *e*: its record read, and what the row takes from it."""
    record, text, why = read_record(e.record_path) if e.record_path else (None, None, None)
    e.row.update(record_fields(record))
    if why:
        e.row["record_note"] = why
    # The text as read, parsed above: encoding the record again was the writer's largest cost (its
    # spaces add about 2% compressed).
    rec = zlib.compress(text) if text is not None else None
    return pack(e.row), pack(e.show), rec


def _charge(db: sqlite3.Connection, uid: int, size: int) -> None:
    db.execute("INSERT INTO users VALUES (?, MAX(?, 0), 0) ON CONFLICT(uid) DO UPDATE SET bytes = MAX(bytes + ?, 0)",
               (uid, size, size))


def _prune_user(db: sqlite3.Connection, uid: int, per_user: int) -> None:
    """The user's oldest rows while the user is over *per_user* bytes."""
    while True:
        held = db.execute("SELECT bytes FROM users WHERE uid = ?", (uid,)).fetchone()
        if held is None or held[0] <= per_user:
            return
        over = held[0] - per_user
        rows = db.execute("SELECT id, bytes FROM jobs WHERE uid = ? ORDER BY id LIMIT 64", (uid,)).fetchall()
        if not rows:
            db.execute("UPDATE users SET bytes = 0 WHERE uid = ?", (uid,))
            return
        gone, freed = [], 0
        for job_id, size in rows:
            gone.append(job_id)
            freed += size
            if freed >= over:
                break
        _delete(db, uid, gone, freed)


def prune_old(db: sqlite3.Connection, cutoff: float) -> bool:
    """One slice of the rows that ended before *cutoff*, deleted; True when none is left."""
    with transaction(db):
        rows = db.execute("SELECT id, uid, bytes FROM jobs WHERE ended < ? ORDER BY ended LIMIT ?",
                          (cutoff, PRUNE_SLICE)).fetchall()
        by_user: dict[int, tuple[list[int], int]] = {}
        for job_id, uid, size in rows:
            ids, freed = by_user.get(uid, ([], 0))
            ids.append(job_id)
            by_user[uid] = (ids, freed + size)
        for uid, (ids, freed) in by_user.items():
            _delete(db, uid, ids, freed)
    return len(rows) < PRUNE_SLICE


def _delete(db: sqlite3.Connection, uid: int, ids: list[int], freed: int) -> None:
    marks = ",".join("?" * len(ids))
    db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", ids)
    db.execute(f"DELETE FROM docs WHERE id IN ({marks})", ids)
    db.execute("UPDATE users SET bytes = MAX(bytes - ?, 0), floor = MAX(floor, ?) WHERE uid = ?",
               (freed, max(ids), uid))


# -- reading ----------------------------------------------------------------------------
def find(db: sqlite3.Connection, ref: int | str, uid: int, is_admin: bool) -> tuple[int, int] | None:
    """The archived job *ref* names (an id, NAME: *uid*'s newest, or USER:NAME for admins): (id, uid)."""
    if isinstance(ref, int):
        hit = db.execute("SELECT id, uid FROM jobs WHERE id = ?", (ref,)).fetchone()
    else:
        user, _, name = ref.rpartition(":")
        if user:
            hit = db.execute("SELECT id, uid FROM jobs WHERE user = ? AND name = ? ORDER BY id DESC LIMIT 1",
                             (user, name)).fetchone() if is_admin else None
        else:
            hit = db.execute("SELECT id, uid FROM jobs WHERE uid = ? AND name = ? ORDER BY id DESC LIMIT 1",
                             (uid, name)).fetchone()
    return (hit[0], hit[1]) if hit else None


def docs(db: sqlite3.Connection, job_id: int) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]] | None:
    """A job's show document, record (None without one) and history row; None if it is not there."""
    hit = db.execute("SELECT show, record, row FROM docs WHERE id = ?", (job_id,)).fetchone()
    if hit is None:
        return None
    record = json.loads(zlib.decompress(hit[1])) if hit[1] is not None else None
    return unpack(hit[0]), record, unpack(hit[2])


def floor(db: sqlite3.Connection, uid: int, is_admin: bool) -> int:
    """The highest id pruned from *uid*'s rows (from anyone's, for an admin); 0 if none."""
    sql = "SELECT MAX(floor) FROM users" if is_admin else "SELECT floor FROM users WHERE uid = ?"
    hit = db.execute(sql, () if is_admin else (uid,)).fetchone()
    return int(hit[0]) if hit and hit[0] is not None else 0


def page(db: sqlite3.Connection, f: Filters, uid: int, is_admin: bool, limit: int,
         max_bytes: int) -> tuple[list[dict[str, Any]], int | None]:
    """One page of history rows, newest first: at most *limit* rows and about *max_bytes*; and the
    cursor of the next (older) page, or None at the end."""
    where, args = where_clause(f, uid, is_admin)
    ids = [r[0] for r in db.execute(f"SELECT j.id FROM jobs j WHERE {where} ORDER BY j.id DESC LIMIT ?",
                                    (*args, limit + 1))]
    more = ids[limit - 1] if len(ids) > limit else None
    out: list[dict[str, Any]] = []
    size = 0
    for job_id in ids[:limit]:
        hit = db.execute("SELECT row FROM docs WHERE id = ?", (job_id,)).fetchone()
        if hit is None:
            continue
        raw = zlib.decompress(hit[0])
        if out and size + len(raw) > max_bytes:
            more = out[-1]["id"]
            break
        size += len(raw)
        out.append(json.loads(raw))
    return out, more


def where_clause(f: Filters, uid: int, is_admin: bool) -> tuple[str, list[Any]]:
    """The SQL condition and its arguments for *f*, as *uid* may see (pure: tested by a table)."""
    parts: list[str] = []
    args: list[Any] = []
    if not is_admin or not (f.all_users or f.user is not None):
        parts.append("j.uid = ?")
        args.append(uid)
    elif f.user is not None:
        parts.append("j.user = ?")
        args.append(f.user)
    for column, value in (("j.name", f.name), ("j.array_first", f.array)):
        if value is not None:
            parts.append(f"{column} = ?")
            args.append(value)
    if f.ids:
        parts.append("(" + " OR ".join("j.id BETWEEN ? AND ?" for _ in f.ids) + ")")
        args += [n for pair in f.ids for n in pair]
    if f.result == "failed":
        parts.append("j.failed = 1")
    elif f.result is not None:
        parts.append("j.result = ?")
        args.append(f.result)
    if f.verdict == "none":
        parts.append("j.verdict IS NULL")
    elif f.verdict is not None:
        parts.append("j.verdict = ?")
        args.append(f.verdict)
    if f.since is not None:
        parts.append("j.ended >= ?")
        args.append(f.since)
    if f.until is not None:
        parts.append("j.ended < ?")
        args.append(f.until)
    if f.setup is not None:
        if len(f.setup) == protocol.SETUP_LEN:
            parts.append("j.setup = ?")
            args.append(f.setup)
        else:       # a prefix: the index's range from it to just past it
            parts.append("j.setup >= ? AND j.setup < ?")
            args += [f.setup, f.setup + "\U0010ffff"]
    if f.before is not None:
        parts.append("j.id < ?")
        args.append(f.before)
    return " AND ".join(parts) or "1", args


# -- what a row holds ---------------------------------------------------------------------
def record_fields(record: dict[str, Any] | None) -> dict[str, Any]:
    """What a history row takes from the job's record: verdict, causes, reasons, setup digest, metrics."""
    if not isinstance(record, dict):
        return {"causes": [], "reasons": [], "setup_digest": None, "metrics": {}}
    found = record.get("verdict")
    verdict: dict[str, Any] = found if isinstance(found, dict) else {}
    reasons = [r[:REASON_CUT] for r in verdict.get("reasons") or () if isinstance(r, str)][:REASONS_KEPT]
    causes = [c for c in verdict.get("causes") or () if isinstance(c, str)][:REASONS_KEPT]
    figures = record.get("metrics")     # a field: {"value": {"names": {NAME: {...}}, ...}, "source": path}
    value = figures.get("value") if isinstance(figures, dict) else None
    names = value.get("names") if isinstance(value, dict) else None
    return {"verdict": verdict.get("verdict"), "causes": causes, "reasons": reasons,
            "setup_digest": setupdigest.setup_digest(record),
            "metrics": names if isinstance(names, dict) else {}}


def read_record(path: str) -> tuple[dict[str, Any] | None, bytes | None, str | None]:
    """A job's record.json (the shepherd's, in root's job directory): the record and the JSON text
    it was read from, or why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return None, None, f"its record could not be opened: {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None, None, "its record is not a plain file of the daemon's own"
        data = os.read(fd, RECORD_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > RECORD_MAX:
        return None, None, f"its record is over {RECORD_MAX} bytes"
    try:
        record = json.loads(data)
    except ValueError:
        return None, None, "its record is not JSON (the job ended while it was written)"
    if not isinstance(record, dict):
        return None, None, "its record is not a JSON object"
    return record, data, None


def legacy_lines(path: str) -> tuple[list[Entry], int]:
    """The entries of one 0.x history file (root's, 0600), and how many lines were skipped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return [], 0
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return [], 0
        out, bad = [], 0
        for raw in f:
            try:
                out.append(legacy_entry(json.loads(raw)))
            except (ValueError, KeyError, TypeError):
                bad += 1
    return out, bad


def legacy_entry(line: dict[str, Any]) -> Entry:
    """An :class:`Entry` from a 0.x history line (no record: those lines held its digest only)."""
    row = {**line, "wall_s": line.get("wall"), "cpu_s": line.get("cpu_time"), "array": None,
           "causes": [], "reasons": [], "setup_digest": None, "metrics": {}}
    for old in ("wall", "cpu_time"):
        row.pop(old, None)
    show = {**line, "state": "finished", "archived": True, "migrated": True}
    return Entry(id=int(line["id"]), uid=int(line["uid"]), user=str(line["user"]), name=line.get("name"),
                 array_first=None, result=line.get("result"), code=line.get("code"),
                 started=line.get("started"), ended=float(line["ended"]), row=row, show=show,
                 record_path=None, if_absent=True)


def pack(doc: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode())


def unpack(blob: bytes) -> dict[str, Any]:
    data = json.loads(zlib.decompress(blob))
    return data if isinstance(data, dict) else {}

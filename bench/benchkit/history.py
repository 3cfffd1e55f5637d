"""The history archive at scale: queries over a million rows, and the loop's answers meanwhile.

The archive is filled before the daemon starts, straight into its
``history.db`` in the daemon's own schema (the daemon checks its format and
uses it as it would its own): writing a million rows through a million jobs
would take hours and measure the drain, not the archive.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import zlib
from typing import Any

from hpc_batch.daemon import archive, archivedb

from .context import Context
from .report import Figure
from .scratchd import DaemonError, ScratchDaemon
from .stats import summarize

DAY = 86400.0
NAMES = 100          # one row in NAMES has the name "bench"
NOISY = 20           # one in NOISY is noisy
FAILED = 1000        # one in FAILED exited 1
SERIES = 5000        # rows per setup digest and per array


def fill(state: str, rows: int, uid: int, user: str, now: float) -> None:
    """*rows* finished jobs of *uid* in ``<state>/history.db``, one a minute back from *now*."""
    os.makedirs(state, mode=0o700, exist_ok=True)
    db = sqlite3.connect(os.path.join(state, archive.FILE), isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript(archivedb.SCHEMA)
    db.execute("BEGIN")
    db.execute("INSERT INTO meta VALUES ('format', ?), ('began', '1')", (str(archivedb.FORMAT),))
    show = zlib.compress(json.dumps({"state": "finished", "command": "./bench --size 4096", "archived": True}).encode())
    total = 0

    def jobs():
        nonlocal total
        for i in range(1, rows + 1):
            ended = now - (rows - i) * 60.0
            failed = i % FAILED == 0
            verdict = "noisy" if i % NOISY == 0 else "clean"
            setup = f"sha256:{i // SERIES:064x}"
            name = "bench" if i % NAMES == 0 else f"run{i % 7}"
            row = zlib.compress(json.dumps({
                "id": i, "user": user, "uid": uid, "name": name, "command": "./bench --size 4096",
                "started": ended - 1.0, "ended": ended, "wall_s": 1.0 + (i % 13) / 1000, "cpu_s": 0.99,
                "result": "exited", "exit": "1" if failed else "0", "code": 1 if failed else 0,
                "verdict": verdict, "causes": ["device_interrupts"] if verdict == "noisy" else [],
                "reasons": [], "setup_digest": setup, "metrics": {},
                "array": {"first": (i // SERIES) * SERIES + 1, "index": i % SERIES, "limit": None}}).encode())
            size = len(row) + len(show) + archivedb.ROW_OVERHEAD
            total += size
            yield ((i, uid, user, name, (i // SERIES) * SERIES + 1, "exited", 1 if failed else 0, int(failed),
                    verdict, ended - 1.0, ended, setup, size), (i, row, show, None))

    batch: list[Any] = []
    for pair in jobs():
        batch.append(pair)
        if len(batch) == 10_000:
            db.executemany("INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", [j for j, _ in batch])
            db.executemany("INSERT INTO docs VALUES (?,?,?,?)", [d for _, d in batch])
            batch = []
    if batch:
        db.executemany("INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", [j for j, _ in batch])
        db.executemany("INSERT INTO docs VALUES (?,?,?,?)", [d for _, d in batch])
    db.execute("INSERT INTO users VALUES (?, ?, 0)", (uid, total))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def queries(rows: int, now: float) -> list[tuple[str, dict[str, Any]]]:
    """(what, the history request's fields): each a page of 100, as ``dispatch history`` asks."""
    mid = now - rows * 30.0
    return [
        ("the newest 100", {}),
        ("--name bench", {"name": "bench"}),
        ("--verdict noisy", {"verdict": "noisy"}),
        ("--state failed (1 in 1000)", {"result": "failed"}),
        ("--setup (a series of 5000)", {"setup": f"sha256:{(rows // SERIES) // 2:064x}"[:23]}),
        ("--array (a series of 5000)", {"array": (rows // SERIES // 2) * SERIES + 1}),
        ("--since/--until, one day in the middle", {"since": mid - DAY, "until": mid}),
        ("--state oom: nothing matches", {"result": "oom"}),
    ]


def _timed(d: ScratchDaemon, fields: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    reply = d.call("history", limit=100, **fields)
    took = time.perf_counter() - t0
    if not reply.get("ok"):
        raise DaemonError(f"history {fields} refused: {reply.get('error')}")
    return took


def _pinging(d: ScratchDaemon, stop: threading.Event, worst: list[float]) -> None:
    """Another client's pings, back to back, until *stop*: the slowest answer goes in *worst*."""
    while not stop.is_set():
        t0 = time.perf_counter()
        if not d.call("ping").get("ok"):
            raise DaemonError("a ping was refused")
        worst[0] = max(worst[0], time.perf_counter() - t0)


def measure(ctx: Context, figs: dict[str, Figure]) -> None:
    """Rows history_query and history_loop."""
    plan = ctx.plan
    now = time.time()
    d = ScratchDaemon(os.path.join(ctx.scratch, "history"), None, ("--history-per-user", "64G"))
    t0 = time.perf_counter()
    fill(d.state, plan.history_rows, os.geteuid(), "root", now)
    ctx.say(f"history: {plan.history_rows:,} rows written in {time.perf_counter() - t0:.1f} s")
    ctx.daemons.append(d)
    d.start()
    small = ScratchDaemon(os.path.join(ctx.scratch, "history-small"), None, ())
    fill(small.state, 1000, os.geteuid(), "root", now)
    ctx.daemons.append(small)
    small.start()
    asked = queries(plan.history_rows, now)
    big_times: dict[str, list[float]] = {what: [] for what, _ in asked}
    small_times: list[float] = []
    loop_worst, loop_base = [], []
    for _ in range(plan.history_runs):
        base = [0.0]
        stop = threading.Event()
        t = threading.Thread(target=_pinging, args=(d, stop, base), daemon=True)
        t.start()
        time.sleep(0.2)           # the baseline: the loop with nothing but pings to answer
        stop.set()
        t.join()
        loop_base.append(base[0])
        worst = [0.0]
        stop = threading.Event()
        t = threading.Thread(target=_pinging, args=(d, stop, worst), daemon=True)
        t.start()
        for what, fields in asked:
            big_times[what].append(_timed(d, fields))
        stop.set()
        t.join()
        loop_worst.append(worst[0])
        small_times += [_timed(small, fields) for _, fields in asked[:3]]
    everything = [x for xs in big_times.values() for x in xs]
    f = figs["history_query"]
    f.value, f.baseline = summarize([max(xs) for xs in zip(*big_times.values())], "ms"), \
        summarize(small_times, "ms")
    f.details.append(f"Over {plan.history_rows:,} rows, each query's median (min-max) of {plan.history_runs}: "
                     + "; ".join(f"{what}: {summarize(xs, 'ms').text()}" for what, xs in big_times.items())
                     + f". All queries: {summarize(everything, 'ms').text()}.")
    g = figs["history_loop"]
    g.value, g.baseline = summarize(loop_worst, "ms"), summarize(loop_base, "ms")
    d.stop()
    small.stop()

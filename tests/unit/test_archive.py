"""The history archive (daemon/archive.py): its threads on a real SQLite file in a scratch directory.

The writer's batches, the per-user bound (one user's flood never pushes out
another's rows), the floor that makes a pruned job "forgotten", the reader's
answers and their visibility rules, a damaged file moved aside, a newer
format left alone, and the 0.x history files migrated. The SQL condition of
every filter is a table of cases. The integration tests (test_history.py)
drive the same through a real daemon.
"""

import json
import os
import sqlite3
import time
import zlib

import pytest

from hpc_batch.daemon import archive, archivedb
from hpc_batch.daemon.archive import Archive, Entry, Filters, Query
from hpc_batch.daemon.archivedb import where_clause
from shepherd.base import records

ALICE, BOB = 2001, 2002


def entry(job_id, uid=ALICE, user="alice", name=None, record=None, root=None, ended=None, verdict=None,
          array=None, result="exited", code=0):
    path = None
    if record is not None:
        path = os.path.join(root, f"record.{job_id}.json")
        with open(path, "w") as f:
            json.dump(record, f)
    now = time.time() if ended is None else ended
    row = {"id": job_id, "user": user, "uid": uid, "name": name, "verdict": verdict, "exit": str(code),
           "array": None if array is None else {"first": array, "index": job_id - array, "limit": None},
           "causes": [], "reasons": [], "setup_digest": None, "metrics": {}}
    show = {"id": job_id, "user": user, "name": name, "state": "finished", "command": "true"}
    return Entry(id=job_id, uid=uid, user=user, name=name, array_first=array, result=result, code=code,
                 started=now - 1, ended=now, row=row, show=show, record_path=path)


def drain(arc, until, what, timeout=10.0, durable=True):
    """Take what the threads post until *until(taken)* holds; the accumulated (archived, answers).
    *durable*: ask for the rows to be made durable, as the loop does when it waits to evict them."""
    archived, answers = [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if durable:
            arc.want_durable()
        got = arc.take()
        archived += got.archived
        answers += got.answers
        if until(archived, answers):
            return archived, answers
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}: archived {archived}, answers {answers}")


def ask(arc, kind, uid=ALICE, ref=None, admin=False, public=False, next_id=1000, **filters):
    q = Query(kind=kind, uid=uid, is_admin=admin, list_public=public, token=object(), ref=ref,
              filters=Filters(**filters) if kind == "history" else None, next_id=next_id, now=1.0)
    assert arc.ask(q) is None
    _, answers = drain(arc, lambda a, ans: any(t is q.token for t, _ in ans), f"the answer to {kind}",
                       durable=False)
    return next(reply for token, reply in answers if token is q.token)


@pytest.fixture
def arc(tmp_path):
    made = []

    def make(per_user=1 << 20, days=365, began=1):
        a = Archive(str(tmp_path), per_user, days)
        a.start(began)
        made.append(a)
        return a
    yield make
    for a in made:
        a.stop()


RECORD = {"schema": 1, "verdict": {"verdict": "noisy", "reasons": ["12 device interrupts " + "x" * 500],
                                   "causes": ["device_interrupts"]},
          "metrics": {"value": {"names": {"t": {"unit": "s", "values": [1.5], "count": 1, "last": 1.5}}},
                      "source": "/tmp/m"}}


def test_a_job_handed_over_is_committed_then_found_with_its_record(arc, tmp_path):
    a = arc()
    assert a.put(entry(1, name="prep", record=RECORD, root=tmp_path)) is False   # not yet: the writer says when
    drain(a, lambda done, _: done == [1], "job 1 archived")
    shown = ask(a, "show", ref=1)
    assert shown["ok"] and shown["result"]["job"]["archived"] is True and shown["result"]["job"]["name"] == "prep"
    rec = ask(a, "record", ref="prep")
    assert rec["ok"] and rec["result"]["record"] == RECORD
    rows = ask(a, "history")["result"]["jobs"]
    assert [r["id"] for r in rows] == [1]
    # What the row takes from the record: the verdict's causes and (cut) reasons, the job's figures.
    assert rows[0]["causes"] == ["device_interrupts"] and len(rows[0]["reasons"][0]) == archivedb.REASON_CUT
    assert rows[0]["metrics"]["t"]["last"] == 1.5
    assert oct(os.stat(tmp_path / archive.FILE).st_mode & 0o777) == "0o600"


def test_a_record_is_stored_as_the_text_its_shepherd_wrote_and_read_back_the_same(arc, tmp_path):
    # The writer parses the record for the row, then compresses the text it read, not a new encoding.
    rec = dict(RECORD, software={"argv": ["./b\u00e9nch", "--\"q\""]}, nan_free=[1.5, 2])
    e = entry(1, record=rec, root=tmp_path)
    with open(e.record_path, "wb") as f:
        f.write(records.dumps(rec).encode())     # as shepherd/record/recorder.py writes it
    a = arc()
    a.put(e)
    drain(a, lambda done, _: done == [1], "job 1 archived")
    assert ask(a, "record", ref=1)["result"]["record"] == rec
    with sqlite3.connect(tmp_path / archive.FILE) as db:
        blob = db.execute("SELECT record FROM docs WHERE id = 1").fetchone()[0]
    with open(e.record_path, "rb") as f:
        assert zlib.decompress(blob) == f.read()


def test_a_row_is_told_to_the_loop_only_once_durable(arc, tmp_path):
    a = arc()
    a.put(entry(1))
    # Written (a query finds it) but not yet durable: the loop is not told, so it keeps the job.
    deadline = time.monotonic() + 10
    while not ask(a, "show", ref=1)["ok"]:
        assert time.monotonic() < deadline, "job 1 never written"
        time.sleep(0.01)
    assert a.take().archived == []
    drain(a, lambda done, _: done == [1], "job 1 made durable")   # the loop asks: one sync, then told
    a.put(entry(2))
    a.stop()                      # a stop makes what was written durable too
    db = sqlite3.connect(tmp_path / archive.FILE)
    assert db.execute("SELECT id FROM jobs ORDER BY id").fetchall() == [(1,), (2,)]


def test_another_users_job_is_no_such_job_unless_the_list_is_public_and_admins_see_it(arc):
    a = arc()
    a.put(entry(1, uid=BOB, user="bob"))
    drain(a, lambda done, _: done == [1], "job 1 archived")
    hidden = ask(a, "show", ref=1)
    assert not hidden["ok"] and hidden["code"] == "not_found" and hidden["error"] == "no such job: 1"
    public = ask(a, "show", ref=1, public=True)
    assert public["code"] == "forbidden"
    assert ask(a, "show", ref=1, admin=True)["ok"]
    assert ask(a, "history")["result"]["jobs"] == []
    assert [r["id"] for r in ask(a, "history", admin=True, all_users=True)["result"]["jobs"]] == [1]
    assert [r["id"] for r in ask(a, "history", admin=True, user="bob")["result"]["jobs"]] == [1]


def test_a_flood_pushes_out_only_the_flooders_own_oldest_rows_and_they_are_forgotten(arc):
    a = arc(per_user=64 << 10)
    a.put(entry(1, uid=BOB, user="bob"))
    for i in range(2, 402):
        a.put(entry(i))
    drain(a, lambda done, _: 401 in done, "the flood archived")
    assert ask(a, "show", uid=BOB, ref=1)["ok"]                  # bob's one row stands
    kept = [r["id"] for r in ask(a, "history", limit=1000)["result"]["jobs"]]
    assert kept and kept[0] == 401 and len(kept) < 400            # alice's newest stay, her oldest went
    gone = min(kept) - 1
    forgotten = ask(a, "show", ref=gone)
    assert forgotten["code"] == "not_found" and f"job {gone} is forgotten" in forgotten["error"]
    assert "forgotten after 365d" in forgotten["error"] and "passes 64K" in forgotten["error"]
    assert "--record PATH" in forgotten["error"]
    never = ask(a, "show", ref=5000, next_id=1000)                # never given out: no such job
    assert never["error"] == "no such job: 5000"


def test_rows_past_the_retention_go_at_the_sweep(arc, tmp_path):
    a = arc(days=1)
    a.put(entry(1, ended=time.time() - 3 * 86400))
    a.put(entry(2))
    drain(a, lambda done, _: 2 in done, "both archived")
    a.stop()
    b = arc(days=1)     # a start sweeps at once
    assert [r["id"] for r in ask(b, "history")["result"]["jobs"]] == [2]
    assert "forgotten" in ask(b, "show", ref=1)["error"]


def test_ids_below_where_the_archive_began_are_forgotten(arc):
    a = arc(began=50)
    assert "job 7 is forgotten" in ask(a, "show", ref=7)["error"]


def test_a_job_handed_again_at_start_up_is_not_read_twice(arc, tmp_path):
    a = arc()
    a.put(entry(1, record=RECORD, root=tmp_path))
    drain(a, lambda done, _: done == [1], "job 1")
    again = entry(1, record={"schema": 1, "different": True}, root=tmp_path)
    again.if_absent = True
    a.put(again)
    drain(a, lambda done, _: done == [1], "job 1 again")
    assert ask(a, "record", ref=1)["result"]["record"] == RECORD


@pytest.mark.parametrize("filters, ids", [
    ({}, [6, 5, 4, 3, 2, 1]),
    ({"name": "bench"}, [4, 3]),
    ({"array": 5}, [6, 5]),
    ({"ids": ((1, 2), (6, 6))}, [6, 2, 1]),
    ({"verdict": "noisy"}, [3]),
    ({"verdict": "none"}, [6, 5, 2, 1]),
    ({"result": "killed"}, [2]),
    ({"result": "failed"}, [2, 1]),
    ({"before": 4, "limit": 2}, [3, 2]),
])
def test_each_filter_selects_its_jobs(arc, filters, ids):
    a = arc()
    a.put(entry(1, code=3))
    a.put(entry(2, result="killed", code=None))
    a.put(entry(3, name="bench", verdict="noisy"))
    a.put(entry(4, name="bench", verdict="clean"))
    a.put(entry(5, array=5))
    a.put(entry(6, array=5))
    drain(a, lambda done, _: 6 in done, "six jobs")
    assert [r["id"] for r in ask(a, "history", **filters)["result"]["jobs"]] == ids


def test_a_page_says_where_the_next_begins(arc):
    a = arc()
    for i in range(1, 8):
        a.put(entry(i))
    drain(a, lambda done, _: 7 in done, "seven jobs")
    page = ask(a, "history", limit=3)["result"]
    assert [r["id"] for r in page["jobs"]] == [7, 6, 5] and page["more"] == 5
    last = ask(a, "history", limit=5, before=3)["result"]
    assert [r["id"] for r in last["jobs"]] == [2, 1] and last["more"] is None


def test_a_damaged_archive_is_moved_aside_and_a_new_one_begun(arc, tmp_path, caplog):
    (tmp_path / archive.FILE).write_bytes(b"this is not a database " * 100)
    a = arc()
    a.put(entry(1))
    drain(a, lambda done, _: done == [1], "job 1")
    aside = [n for n in os.listdir(tmp_path) if n.startswith(archive.FILE + ".damaged-")]
    assert aside, os.listdir(tmp_path)
    assert any(aside[0] in r.getMessage() for r in caplog.records)
    assert ask(a, "show", ref=1)["ok"]


def test_an_archive_of_a_newer_format_is_left_alone_and_no_history_is_kept(arc, tmp_path):
    db = sqlite3.connect(tmp_path / archive.FILE)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('format', '99')")
    db.commit()
    db.close()
    before = (tmp_path / archive.FILE).read_bytes()
    a = arc()
    a.put(entry(1))
    drain(a, lambda done, _: done == [1], "job 1 let go")   # the job may still be evicted
    assert (tmp_path / archive.FILE).read_bytes() == before
    answer = ask(a, "show", ref=1)
    assert not answer["ok"] and "keeps no history" in answer["error"]


def test_the_history_files_of_0x_are_migrated_once(arc, tmp_path):
    legacy = tmp_path / "history"
    legacy.mkdir(mode=0o700)
    t = time.time() - 86400       # within the retention (older lines go at the first sweep)
    line = {"id": 3, "user": "alice", "uid": ALICE, "name": "old", "command": "true", "command_len": 4,
            "submitted": t, "started": t, "ended": t + 1, "wall": 1.0, "cpu_time": 0.5, "state": "finished",
            "result": "exited", "exit": "0", "code": 0, "verdict": "clean", "record_digest": "sha256:ab"}
    (legacy / "alice.jsonl").write_text(json.dumps(line) + "\nnot json\n")
    (legacy / "alice.jsonl.1").write_text(json.dumps({**line, "id": 2}) + "\n")
    a = arc(began=10)
    rows = ask(a, "history")["result"]["jobs"]
    assert [r["id"] for r in rows] == [3, 2] and rows[0]["wall_s"] == 1.0 and rows[0]["verdict"] == "clean"
    assert not legacy.exists() and (tmp_path / "history.migrated" / "alice.jsonl").exists()
    shown = ask(a, "show", ref=3)
    assert shown["ok"] and shown["result"]["job"]["migrated"] is True, shown
    assert "no record" in ask(a, "record", ref=3)["error"]


def test_queries_are_bounded_per_user(tmp_path):
    a = Archive(str(tmp_path), 1 << 20, 365)      # not started: nothing answers, so they pile up
    queries = [Query(kind="history", uid=ALICE, is_admin=False, list_public=False, token=i,
                     filters=Filters()) for i in range(archive.QUERIES_PER_USER + 1)]
    said = [a.ask(q) for q in queries]
    assert said[:-1] == [None] * archive.QUERIES_PER_USER and "queries under way" in said[-1]
    assert a.ask(Query(kind="history", uid=BOB, is_admin=False, list_public=False, token="b",
                       filters=Filters())) is None


WHERE = [
    (Filters(), ALICE, False, "j.uid = ?", [ALICE]),
    (Filters(all_users=True), ALICE, False, "j.uid = ?", [ALICE]),          # only admins see all
    (Filters(all_users=True), 0, True, "1", []),
    (Filters(user="bob"), 0, True, "j.user = ?", ["bob"]),
    (Filters(user="bob"), ALICE, False, "j.uid = ?", [ALICE]),
    (Filters(setup="sha256:abcdef12"), ALICE, False, "j.uid = ? AND j.setup >= ? AND j.setup < ?",
     [ALICE, "sha256:abcdef12", "sha256:abcdef12\U0010ffff"]),
    (Filters(since=5.0, until=9.0), ALICE, False, "j.uid = ? AND j.ended >= ? AND j.ended < ?",
     [ALICE, 5.0, 9.0]),
]


@pytest.mark.parametrize("f, uid, admin, sql, args", WHERE)
def test_the_sql_condition_of_each_filter(f, uid, admin, sql, args):
    assert where_clause(f, uid, admin) == (sql, args)

"""Bounded replies: the cut command, the id-ordered job table, and list pages."""

import dataclasses
import pwd
import shlex

import pytest
from test_engine import ROOT, T0, start_pending, submit, world  # noqa: F401 (world is a fixture)

from hpc_batch.client.listing import format_rows
from hpc_batch.core.cut import COMMAND_CUT, MARK, cut_command
from hpc_batch.core.jobtable import COMPACT_FLOOR, JobsById
from hpc_batch.core.listrows import TABLE_FIELDS, format_row, table_row
from hpc_batch.daemon import handlers
from hpc_batch.daemon.access import Caller
from hpc_batch.wire import protocol
from hpc_batch.wire.protocol import JobSetting, ListJobs, ProtocolError

NOBODY = pwd.getpwnam("nobody")
OTHER = Caller(uid=NOBODY.pw_uid, gid=NOBODY.pw_gid, pid=2, name="nobody", is_admin=False)


# -- the cut ---------------------------------------------------------------------------

def test_a_short_command_is_whole():
    assert cut_command(["echo", "a b"]) == ("echo 'a b'", len("echo 'a b'"))


def test_a_long_command_is_cut_with_its_length():
    argv = ["printf", "x" * 100_000, "y"]
    text, full = cut_command(argv)
    assert full == len(shlex.join(argv))
    assert len(text) == COMMAND_CUT and text.endswith(MARK)
    assert shlex.join(argv).startswith(text[:-len(MARK)])


def test_the_memo_never_answers_for_another_argv():
    a = ["a"] * 3000
    b = ["b"] * 3000
    assert cut_command(a)[0].startswith("a a")
    assert cut_command(b)[0].startswith("b b")
    assert cut_command(list(a)) == cut_command(a)


# -- the id-ordered jobs ----------------------------------------------------------------

class J:
    def __init__(self, uid):
        self.uid = uid


def test_table_ids_after_a_cursor_all_and_per_user():
    t = JobsById()
    for i in range(1, 11):
        t[i] = J(i % 2)
    assert list(t.ids_after(4)) == [5, 6, 7, 8, 9, 10]
    assert list(t.ids_after(4, uid=1)) == [5, 7, 9]
    assert list(t.ids_after(0, uid=7)) == []
    del t[5]
    assert t.pop(7).uid == 1 and t.pop(7, None) is None
    assert [i for i in t.ids_after(0, uid=1) if i in t] == [1, 3, 9]


def test_table_sweeps_dead_ids_so_removal_is_amortised():
    t = JobsById()
    n = 10 * COMPACT_FLOOR
    for i in range(1, n + 1):
        t[i] = J(0)
    for i in range(1, n):
        del t[i]
    assert len(t.order.ids) <= 2 * COMPACT_FLOOR + 2   # not n: the dead were swept
    assert [i for i in t.ids_after(0) if i in t] == [n]
    del t[n]
    assert 0 not in t.by_uid_order


def test_table_an_id_refused_and_made_again_is_listed_once():
    t = JobsById()
    t[1], t[2] = J(0), J(0)
    t.pop(2)
    t[2] = J(5)                      # the same id, made again for another user
    assert [i for i in t.ids_after(0) if i in t] == [1, 2]
    assert list(t.ids_after(0, uid=5)) == [2]


def test_table_refuses_bulk_changes():
    with pytest.raises(TypeError):
        JobsById().update({1: J(0)})


# -- the protocol ----------------------------------------------------------------------

def test_list_cursor_and_limit_are_checked():
    assert ListJobs.from_args({}) == ListJobs(False, False, None, None)
    assert ListJobs.from_args({"after": 0, "limit": 5}).after == 0
    for bad in ({"after": -1}, {"after": "3"}, {"limit": 0}, {"limit": protocol.LIST_PAGE_JOBS + 1},
                {"after": True}):
        with pytest.raises(ProtocolError):
            ListJobs.from_args(bad)


# -- pages -----------------------------------------------------------------------------

@pytest.fixture
def eng(world):  # noqa: F811
    e = world[0]
    e.cfg = dataclasses.replace(e.cfg, max_queued_per_user=10_000)
    return e


def pages(e, caller, **kw):
    """Every page of a listing, as a client reads them."""
    out, cursor = [], 0
    while cursor is not None:
        page = handlers.list_page(e, caller, ListJobs(after=cursor, **kw))
        out.append(page["rows" if kw.get("text") or kw.get("table") else "jobs"])
        assert page["more"] is None or page["more"] > cursor
        cursor = page["more"]
    return out


def test_pages_add_up_to_the_whole_list_in_order(eng):
    submit(eng, argv=("sleep", "9"), array=tuple(range(25)), cpus=2)
    got = pages(eng, ROOT, all=True, limit=4)
    assert [len(p) for p in got] == [4] * 6 + [1]
    assert [j["id"] for p in got for j in p] == sorted(eng.jobs)


def test_a_page_is_bounded_in_bytes(eng, monkeypatch):
    monkeypatch.setattr(protocol, "LIST_PAGE_BYTES", 3 * COMMAND_CUT)
    submit(eng, argv=("echo", "z" * 20_000), array=tuple(range(10)), cpus=2)
    got = pages(eng, ROOT, all=True)
    assert len(got) > 2 and all(len(p) <= 4 for p in got)
    assert sum(len(p) for p in got) == 10
    job = got[0][0]
    assert len(job["command"]) == COMMAND_CUT and job["command_len"] == len(shlex.join(["echo", "z" * 20_000]))


def test_show_and_info_keep_and_cut_the_command(eng):
    argv = ("echo", "w" * 9000)
    first = submit(eng, argv=argv)["id"]
    assert eng.show(ROOT, first, 0)["command"] == shlex.join(argv)
    info = eng._info(eng.jobs[first])
    assert len(info["command"]) == COMMAND_CUT and info["command_len"] == len(shlex.join(argv))


def test_own_list_pages_skip_other_users_without_scanning_them(eng):
    submit(eng, argv=("true",), array=tuple(range(300)), cpus=2)
    mine = eng.submit(OTHER, protocol.NewJob(argv=("true",), cwd="/tmp", no_output=True, cpus=2), 0)["id"]
    looked = []
    real_get = eng.jobs.get
    eng.jobs.get = lambda i, *d: looked.append(i) or real_get(i, *d)
    got = pages(eng, OTHER)
    assert [[j["id"] for j in p] for p in got] == [[mine]]
    assert looked == [mine]          # the per-user order: root's 300 jobs were never looked at


def test_an_old_client_gets_a_short_list_whole_and_a_long_one_refused(eng):
    submit(eng, argv=("true",), array=tuple(range(3)), cpus=2)
    assert "more" not in handlers.list_page(eng, ROOT, ListJobs(all=True))
    assert len(handlers.list_page(eng, ROOT, ListJobs(all=True))["jobs"]) == 3
    submit(eng, argv=("true",), array=tuple(range(protocol.LIST_PAGE_JOBS)), cpus=2)
    with pytest.raises(handlers.Refused, match="older than"):
        handlers.list_page(eng, ROOT, ListJobs(all=True))


# -- the text form ---------------------------------------------------------------------

def _client_lines(rows, now, finished):
    """What dispatch list prints from text rows: the daemon's strings, the rest formatted here."""
    return [r if isinstance(r, str) else format_row(r, now, finished) for r in rows]


@pytest.mark.parametrize("finished", [False, True])
def test_text_rows_print_what_the_summaries_print(eng, finished):
    submit(eng, argv=("sleep", "9"), cpus=2)                              # runs
    submit(eng, argv=("echo", "a b", "\x1b[2J"), array=tuple(range(5)), cpus=2, name="tab")   # queued
    start_pending(eng)
    kill = eng.jobs[max(eng.jobs)].id
    eng.kill(ROOT, kill, T0 + 1)                                          # cancelled: never started
    now = T0 + 30
    summaries = [j for p in pages(eng, ROOT, all=True, finished=finished, limit=3) for j in p]
    rows = [r for p in pages(eng, ROOT, all=True, finished=finished, limit=3, text=True) for r in p]
    assert _client_lines(rows, now, finished) == format_rows(summaries, now, finished)
    kinds = [isinstance(r, str) for r in rows]
    assert kinds[0] is False and all(kinds[1:])   # only the running job is left to the client
    assert len(rows) == (6 if finished else 5)


def test_a_kept_text_row_follows_the_job(eng):
    first = submit(eng, argv=("sleep", "9"), cpus=2)["id"]
    queued = submit(eng, argv=("true",), cpus=2)["id"]
    start_pending(eng)

    def row():
        return handlers.list_page(eng, ROOT, ListJobs(after=first, all=True, text=True))["rows"][0]

    before = row()
    assert row() is before                                              # kept: not formatted again
    eng.job_setting(ROOT, JobSetting(id=queued, setting="max_time", action="set", seconds=60), T0)
    assert row() != before and row() == format_row(eng.summary(eng.jobs[queued]), 0.0, False)
    eng.kill(ROOT, queued, T0 + 1)                                      # cancelled: finished, never started
    cancelled = handlers.list_page(eng, ROOT, ListJobs(after=first, all=True, finished=True, text=True))["rows"][0]
    assert " finished cancelled (cancelled by root" in cancelled


# -- the table form --------------------------------------------------------------------

def test_table_rows_are_the_summaries_table_rows_and_pages_stay_bounded(eng, monkeypatch):
    submit(eng, argv=("sleep", "9"), cpus=2)                              # runs
    submit(eng, argv=("echo", "a b", "\x1b[2J"), array=tuple(range(5)), cpus=2, name="tab")   # queued
    start_pending(eng)
    eng.kill(ROOT, max(eng.jobs), T0 + 1)                                 # cancelled: never started
    summaries = [j for p in pages(eng, ROOT, all=True, finished=True, limit=3) for j in p]
    rows = [r for p in pages(eng, ROOT, all=True, finished=True, limit=3, table=True) for r in p]
    assert rows == [table_row(s) for s in summaries] and len(rows) == 6
    assert all(len(r) == len(TABLE_FIELDS) for r in rows)
    # A page of table rows is bounded in bytes as one of summaries is.
    monkeypatch.setattr(protocol, "LIST_PAGE_BYTES", 3 * COMMAND_CUT)
    submit(eng, argv=("echo", "z" * 20_000), array=tuple(range(10)), cpus=2)
    got = pages(eng, ROOT, all=True, table=True)
    big = [sum(len(r[TABLE_FIELDS.index("command")]) == COMMAND_CUT for r in p) for p in got]
    assert len(got) > 3 and max(big) <= 4 and sum(big) == 10 and sum(len(p) for p in got) == 15


def test_a_kept_table_row_follows_the_job(eng):
    first = submit(eng, argv=("sleep", "9"), cpus=2)["id"]
    queued = submit(eng, argv=("true",), cpus=2)["id"]
    start_pending(eng)

    def row():
        return handlers.list_page(eng, ROOT, ListJobs(after=first, all=True, finished=True, table=True))["rows"][0]

    before = row()
    assert row() is before                                              # kept: not made again
    eng.job_setting(ROOT, JobSetting(id=queued, setting="max_time", action="set", seconds=60), T0)
    assert row() != before and row() == table_row(eng.summary(eng.jobs[queued]))
    eng.kill(ROOT, queued, T0 + 1)
    cancelled = dict(zip(TABLE_FIELDS, row()))
    assert cancelled["state"] == "finished" and cancelled["exit"] == "cancelled"


# -- wait pages --------------------------------------------------------------------------

def test_a_wait_page_is_cut_by_its_count_and_its_bytes_and_holds_at_least_one():
    from hpc_batch.core.waitpages import cut
    built = []

    def entry(i):
        built.append(i)
        return {"id": i, "note": "n" * 100}
    entries, n = cut(range(10_000), entry, 50, 1 << 20)
    assert n == 50 and [e["id"] for e in entries] == list(range(50)) and built == list(range(50))
    entries, n = cut(range(10_000), entry, 1000, 1000)    # about 115 bytes each: the bytes cut it
    assert 8 <= n <= 10 and [e["id"] for e in entries] == list(range(n))
    entries, n = cut([7], lambda i: {"id": i, "note": "x" * 5000}, 1000, 1000)
    assert n == 1   # one entry larger than a page still goes: every reply makes progress
    assert cut([], entry, 10, 10) == ([], 0)


def test_the_client_takes_a_follow_up_page_in_its_own_order_and_asks_again_for_the_rest():
    from hpc_batch.core.waitpages import take
    asked = [4, 9, 4, 2, 8]
    entries, again = take(asked, [{"id": 4}, {"id": 9}])          # the daemon's page: distinct jobs, a prefix
    assert [e["id"] for e in entries] == [4, 9, 4] and again == [2, 8]
    entries, again = take(again, [{"id": 2}, {"id": 8}])
    assert [e["id"] for e in entries] == [2, 8] and again == []
    assert take([3], []) == ([], [3])

"""The turn record's two questions, and the loop's soonest-of helper."""

import types

import pytest

from hpc_batch.daemon.server import soonest
from hpc_batch.daemon.turn import Turn

NOW = 1000.0


def turn(pending=False, **fields):
    t = Turn(types.SimpleNamespace(has_pending=pending), [])   # no bulk under way: a list will do
    for k, v in fields.items():
        setattr(t, k, v)
    return t


def test_an_empty_turn_sleeps_without_a_deadline_and_holds_no_reply():
    t = turn()
    assert t.wake(NOW) is None and not t.holds_replies


@pytest.mark.parametrize("fields", [{"resched": True}, {"to_spawn": [("job", None)]}, {"bulks": [object()]}])
def test_work_left_in_the_turn_turns_the_loop_again_at_once(fields):
    assert turn(retry_at=NOW + 5, **fields).wake(NOW) == NOW


def test_a_start_put_off_is_retried_when_due():
    assert turn(retry_at=NOW + 2).wake(NOW) == NOW + 2


@pytest.mark.parametrize("pending, to_spawn, held", [(False, [], False), (True, [], True), (False, [1], True)])
def test_replies_wait_while_the_store_has_staged_changes_or_shepherds_are_to_spawn(pending, to_spawn, held):
    assert turn(pending, to_spawn=to_spawn).holds_replies is held


def test_soonest_leaves_out_the_sources_with_nothing_to_wait_for():
    assert soonest() is None and soonest(None, None) is None
    assert soonest(None, 3.0, 2.0, None) == 2.0


def test_a_slow_turn_is_logged_with_where_its_time_went(monkeypatch, caplog):
    from hpc_batch.daemon import server
    monkeypatch.setattr(server, "rlog", server.RateLimited(server.log))   # nothing suppressed by earlier tests
    kinds = {"conn": 3, "pidfd": 1}
    with caplog.at_level("WARNING", logger="hpc-batchd"):
        server.Server._slow_turn(server.time.monotonic() - 0.01, kinds, 0.004, 0.003, 0.002, [0.009, 0.0, 0.0])
        assert not caplog.records, "a quick turn is not logged"
        server.Server._slow_turn(server.time.monotonic() - 0.25, kinds, 0.2, 0.03, 0.015, [0.04, 0.12, 0.07])
    (rec,) = caplog.records
    assert rec.getMessage().startswith("a turn of the loop took 25")
    assert "200 ms on its events (3 conn, 1 pidfd), 30 ms committing and spawning after them, 15 ms on timers" \
        in rec.getMessage()
    assert "of it, 40 ms on the loop's CPU, 120 ms in fsyncs, 70 ms waiting for the fork server" \
        in rec.getMessage()


def test_the_clocks_a_slow_turn_reads_count_every_fsync(tmp_path):
    from hpc_batch.daemon.journal import Journal
    from shepherd.base import records
    j = Journal(str(tmp_path))
    j.replace(b"")
    before = records.synced_seconds()
    j.append(b'{"seq":1}\n')
    after_journal = records.synced_seconds()
    assert after_journal > before, "the journal's fdatasync is counted"
    records.write_json(str(tmp_path / "launch.json"), {"argv": ["true"]}, durable=True)
    assert records.synced_seconds() > after_journal, "a durable write's fsyncs (file, directory) are counted"

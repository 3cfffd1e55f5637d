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

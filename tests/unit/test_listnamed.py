"""dispatch list JOB...: which named jobs the listing lacks, and the line that says why (pure)."""

import pytest

from hpc_batch.client.listnamed import listed, unlisted_range, unmatched, why_unlisted

JOBS = [{"id": 5, "name": "prep", "user": "alice"}, {"id": 9, "name": None, "user": "bob"}]


def test_words_no_listed_job_answers_to_are_the_unmatched_ones_in_order():
    refs = [("5", 5), ("7", 7), ("prep", "prep"), ("bob:prep", "bob:prep"), ("8-9", [8, 9]), ("1-3", [1, 2, 3])]
    assert unmatched(refs, JOBS) == [("7", 7), ("bob:prep", "bob:prep"), ("1-3", [1, 2, 3])]
    assert listed(JOBS[0], "alice:prep", "alice:prep")


@pytest.mark.parametrize("reply,finished,all_users,message,code,status", [
    ({"ok": False, "error": "no such job: 99999", "code": "not_found"}, False, False,
     "no such job: 99999", "not_found", 3),
    ({"ok": True, "result": {"job": {"id": 5, "uid": 1000, "user": "alice", "state": "finished"}}}, False, False,
     "job 5 has ended: add --finished to list it", "finished", 10),
    ({"ok": True, "result": {"job": {"id": 5, "uid": 1001, "user": "bob", "state": "running"}}}, False, False,
     "job 5 is bob's: add --all to list it", "forbidden", 4),
    ({"ok": True, "result": {"job": {"id": 5, "uid": 1000, "user": "alice", "state": "finished"}}}, True, False,
     "job 5 has ended and left the list: dispatch show 5 or dispatch history 5 has it", "finished", 10),
])
def test_why_a_named_job_is_not_listed(reply, finished, all_users, message, code, status):
    u = why_unlisted("5", reply, finished, all_users, uid=1000)
    assert (u.message, u.code, u.status) == (message, code, status)
    assert u.doc() == {"job": "5", "error": message, "code": code, "exit": status}


def test_a_range_that_matches_nothing_is_not_found_and_says_about_finished():
    assert "--finished" in unlisted_range("3-4", False).message and unlisted_range("3-4", True).status == 3

"""The per-user accounting history (history.py); its lines carry the command as cut.py cuts it."""

import json
import logging
import os
import stat

import pytest

from hpc_batch.core.cut import COMMAND_CUT
from hpc_batch.core.jobs import Job, Result, move
from hpc_batch.daemon import history

T0 = 1_800_000_000.0


def finished(job_id, user, argv=("true",), uid=None):
    j = Job(id=job_id, uid=uid if uid is not None else 1000 + len(user), gid=100, user=user, argv=list(argv),
            cwd="/", submitted=T0, max_time=60, budget={"mem": 1 << 30}, state="queued")
    move(j, "finished", T0 + 1, Result("cancelled"))
    return j


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_each_user_has_a_file_and_a_flood_pushes_out_only_their_own(tmp_path):
    h = history.History(str(tmp_path), per_user=64 << 10)      # 16 KiB a file, 4 generations
    h.record(finished(1, "bob"))
    h.record(finished(2, "root", uid=0))
    huge = ["x" * 100_000] * 10                                  # 1 MB commands, as in the report's attack
    for i in range(3, 300):
        h.record(finished(i, "alice", huge))
    d = tmp_path / "history"
    assert [r["id"] for r in lines(d / "bob.jsonl")] == [1]
    assert [r["id"] for r in lines(d / "root.jsonl")] == [2]
    names = sorted(os.listdir(d))
    assert names == ["alice.jsonl", "alice.jsonl.1", "alice.jsonl.2", "alice.jsonl.3", "bob.jsonl", "root.jsonl"]
    alice = sum(os.path.getsize(d / n) for n in names if n.startswith("alice"))
    assert alice <= 64 << 10
    newest = lines(d / "alice.jsonl")[-1]
    assert newest["id"] == 299 and newest["command_len"] == len(" ".join(huge))
    assert len(newest["command"]) == COMMAND_CUT and newest["command"].endswith("...")
    # The generations are in order: .3 oldest, then .2, .1, the current file.
    ids = [r["id"] for n in ("alice.jsonl.3", "alice.jsonl.2", "alice.jsonl.1", "alice.jsonl") for r in lines(d / n)]
    assert ids == sorted(ids) and ids[-1] == 299
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(d / n).st_mode) for n in names} == {0o600}


def test_odd_user_names_are_filed_by_uid():
    assert history.file_name("alice", 1001) == "alice.jsonl"
    assert history.file_name("a.b-c_d", 7) == "a.b-c_d.jsonl"
    for odd in (".hidden", "a/b", "x y", "é", ""):
        assert history.file_name(odd, 42) == "uid=42.jsonl"


def test_a_planted_link_is_not_followed_and_nothing_raises(tmp_path, caplog):
    h = history.History(str(tmp_path), per_user=1 << 20)
    h.record(finished(1, "bob"))
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    os.symlink(target, tmp_path / "history" / "alice.jsonl")
    with caplog.at_level(logging.ERROR, "hpc-batchd"):
        h.record(finished(2, "alice"))
    assert target.read_text() == "keep" and "cannot append job 2" in caplog.text
    os.unlink(tmp_path / "history" / "alice.jsonl")
    os.link(tmp_path / "history" / "bob.jsonl", tmp_path / "history" / "alice.jsonl")  # a second name: refused
    h.record(finished(3, "alice"))
    assert [r["id"] for r in lines(tmp_path / "history" / "bob.jsonl")] == [1]


def test_the_legacy_shared_file_is_left_alone_and_said(tmp_path, caplog):
    (tmp_path / "history.jsonl").write_text('{"id": 1}\n')
    with caplog.at_level(logging.INFO, "hpc-batchd"):
        h = history.History(str(tmp_path), per_user=1 << 20)
    h.record(finished(2, "bob"))
    assert (tmp_path / "history.jsonl").read_text() == '{"id": 1}\n'
    assert "left as it was" in caplog.text


@pytest.mark.parametrize("per_user", [64 << 10, 1 << 20])
def test_the_longest_commands_land_at_the_smallest_share(tmp_path, per_user):
    # 4 KiB of command in each line: every line lands, even at the smallest share the flag allows.
    h = history.History(str(tmp_path), per_user=per_user)
    for i in range(1, 4):
        h.record(finished(i, "carol", ["y" * 1_000_000]))
    assert [r["id"] for r in lines(tmp_path / "history" / "carol.jsonl")][-1] == 3

"""The journal: parsing (torn tails, damage), appends that fail cleanly, compaction."""

import os

import pytest

from hpc_batch.daemon import journal


def _lines(*entries):
    return b"".join(journal.line(e) for e in entries)


def test_whole_lines_are_read_in_order():
    data = _lines({"seq": 1, "job": {"id": 1}}, {"seq": 2, "drop": 1}, {"seq": 3, "meta": {"next_id": 2}})
    entries, good = journal.parse(data)
    assert [e["seq"] for e in entries] == [1, 2, 3] and good == len(data)


@pytest.mark.parametrize("tail", [b'{"seq": 4, "job": {"id"', b'{"seq": 4}', b"\xff\xfe", b"garbage\n"])
def test_a_torn_last_line_is_dropped(tail):
    data = _lines({"seq": 1, "job": {"id": 1}})
    entries, good = journal.parse(data + tail)
    assert [e["seq"] for e in entries] == [1] and good == len(data)


def test_damage_before_the_last_line_is_an_error():
    data = b"{not json\n" + _lines({"seq": 1, "job": {"id": 1}})
    with pytest.raises(journal.JournalError, match="line 1"):
        journal.parse(data)


def test_a_line_without_seq_is_damage():
    with pytest.raises(journal.JournalError):
        journal.parse(b'{"job": {}}\n' + _lines({"seq": 2, "drop": 1}))


def test_append_replace_and_a_failed_append_leaves_the_file_as_it_was(tmp_path):
    j = journal.Journal(str(tmp_path))
    j.replace(_lines({"seq": 1, "meta": {}}))
    j.append(_lines({"seq": 2, "job": {"id": 7}}))
    assert [e["seq"] for e in j.read()[0]] == [1, 2]
    size = os.path.getsize(j.path)
    os.close(j.fd)
    j.fd = os.open(os.devnull, os.O_RDONLY)   # writes now fail
    with pytest.raises(OSError):
        j.append(_lines({"seq": 3, "drop": 7}))
    assert os.path.getsize(j.path) == size and j.size == size


def test_compaction_is_wanted_past_twice_the_snapshot(tmp_path):
    j = journal.Journal(str(tmp_path))
    j.replace(b"x\n" * (journal.MIN_COMPACT // 2))
    assert not j.wants_compaction()
    j.append(b"y\n" * (journal.MIN_COMPACT // 2 + 1))
    assert j.wants_compaction()


def _batch(number, *entries, seq=100):
    return _lines(*entries) + journal.end_line(seq + number, number, len(entries))


def test_only_whole_batches_are_read_and_a_damaged_unacknowledged_tail_is_dropped():
    data = _batch(1, {"seq": 1, "job": {"id": 1}}) + _batch(2, {"seq": 2, "job": {"id": 2}}, {"seq": 3, "drop": 1})
    tail = _lines({"seq": 4, "job": {"id": 3}}) + b"\x00\x00garbage\n" + b'{"seq": 5'
    c = journal.read_contents(data + tail)
    assert [e["seq"] for e in c.entries] == [1, 2, 3] and c.batch == 2 and c.good == len(data)
    assert c.dropped == 3


def test_damage_inside_an_acknowledged_batch_is_an_error():
    with pytest.raises(journal.JournalError, match="line 1"):
        journal.read_contents(b"garbage\n" + _batch(1, {"seq": 1, "job": {"id": 1}}))


def test_a_batch_that_lost_lines_is_an_error():
    whole = _batch(1, {"seq": 1, "job": {"id": 1}}, {"seq": 2, "job": {"id": 2}})
    cut = whole.split(b"\n", 1)[1]              # its first line gone
    with pytest.raises(journal.JournalError, match="holds 1 lines, not the 2"):
        journal.read_contents(cut)


def test_a_journal_without_batches_has_no_batch_number():
    c = journal.read_contents(_lines({"seq": 1, "job": {"id": 1}}))
    assert c.batch is None and [e["seq"] for e in c.entries] == [1]


def test_a_job_line_from_its_encoded_record_is_the_line_of_the_entry():
    from shepherd.base.jsoncodec import dumps_wire
    data = {"id": 7, "argv": ["echo", "é\n"], "alloc": {"cpus": [0, 1]}, "note": None}
    record = dumps_wire(data).encode("ascii")
    assert journal.job_line(12, record) == journal.line({"seq": 12, "job": data})


def test_a_compaction_keeps_the_batches_appended_while_it_was_written(tmp_path):
    j = journal.Journal(str(tmp_path))
    j.replace(_batch(1, {"seq": 1, "job": {"id": 1}}))
    c = j.begin(journal.format_line(10), 1)
    j.append(_batch(2, {"seq": 11, "job": {"id": 2}}))        # a batch committed meanwhile
    c.add(_lines({"seq": 1, "job": {"id": 1}}), 1)
    j.append(_batch(3, {"seq": 12, "drop": 1}))
    c.add(journal.end_line(13, 1, c.lines), 0)
    j.finish(c)
    contents = j.read()
    assert [e["seq"] for e in contents.entries] == [10, 1, 11, 12] and contents.batch == 3
    assert not os.path.exists(c.path) and j.size == os.path.getsize(j.path) == j.snapshot_size
    j.append(_batch(4, {"seq": 14, "meta": {}}))               # appends go to the new file
    assert j.read().batch == 4


def test_an_abandoned_or_failed_compaction_leaves_the_journal_as_it_was(tmp_path, monkeypatch):
    j = journal.Journal(str(tmp_path))
    j.replace(_batch(1, {"seq": 1, "job": {"id": 1}}))
    before = j.read()
    c = j.begin(journal.format_line(10), 1)
    c.abandon()
    assert not os.path.exists(c.path) and j.read() == before
    c = j.begin(journal.format_line(10), 1)

    def refused(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", refused)
    with pytest.raises(OSError):
        c.add(journal.end_line(11, 1, c.lines), 0)
        j.finish(c)
    monkeypatch.undo()
    assert not os.path.exists(c.path) and j.read() == before
    j.append(_batch(2, {"seq": 12, "job": {"id": 2}}))
    assert j.read().batch == 2

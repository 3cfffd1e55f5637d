"""The job-directory records: the re-free JSON codec and the pidfile parser."""

import json
import os

import pytest

from shepherd.base import proc, records


@pytest.mark.parametrize("obj", [
    {}, {"a": 1}, {"argv": ["sh", "-c", "echo 'x' \"y\""], "env": {"K": "v=1", "U": "\u00e9\u4e2d"}},
    {"n": None, "t": True, "f": False, "x": -3, "y": 2.5, "big": 1 << 62, "nested": [[], {}, [1, [2]]]},
    {"surrogate": "\udcff\udc80"},
])
def test_round_trip_and_agrees_with_json(obj):
    text = records.dumps(obj)
    assert records.loads(text) == obj
    assert json.loads(text) == obj
    assert records.loads(json.dumps(obj)) == obj


@pytest.mark.parametrize("bad", ["", "{", '{"a": 1} x', "NaN", '{"a": Infinity}', "[1,]"])
def test_malformed_is_value_error(bad):
    with pytest.raises(ValueError):
        records.loads(bad)


def test_read_json_tolerates_torn_files(tmp_path):
    p = tmp_path / "exit.json"
    p.write_text('{"code": 3')
    assert records.read_json(str(p)) is None
    records.write_json(str(p), {"code": 3})
    assert records.read_json(str(p)) == {"code": 3}
    assert not os.path.exists(str(p) + ".tmp")


def test_proc_starttime_and_pidfile(tmp_path):
    me = os.getpid()
    assert isinstance(proc.proc_starttime(me), int)
    assert proc.proc_starttime(0x7FFFFFF0) is None
    (tmp_path / records.PIDFILE).write_text(f"{me} {proc.proc_starttime(me)}\n")
    assert records.read_pidfile(str(tmp_path)) == (me, proc.proc_starttime(me))
    (tmp_path / records.PIDFILE).write_text("garbage")
    assert records.read_pidfile(str(tmp_path)) is None


@pytest.mark.parametrize("kind,good", [
    (records.StatusRecord, {"job_pid": 12, "job_start": 345, "started": 1.5}),
    (records.ExitRecord, {"status": 768, "ended": 2.0, "code": 3, "signal": None, "error": None, "stopped": "killed",
                          "stop_note": "n", "oom_kill": 0, "oom_group_kill": 0, "peak_mem": 10, "cpu_time": 0.5}),
    (records.DeliveryRecord, {"ok": False, "path": "/x", "error": "why", "note": None}),
])
def test_typed_records_round_trip(tmp_path, kind, good):
    path = str(tmp_path / "r.json")
    kind.from_dict(good).write(path)
    assert records.read_json(path) == good
    assert records.read_record(path, kind).to_dict() == good


def test_typed_records_trust_no_value():
    rec = records.ExitRecord.from_dict({"code": "3", "signal": True, "stopped": "exploded", "ended": [1],
                                        "error": 5, "oom_kill": None})
    assert (rec.code, rec.signal, rec.stopped, rec.ended, rec.error, rec.oom_kill) == (None, None, None, None, None, 0)
    assert rec.old_format is False
    assert records.ExitRecord.from_dict({"code": 0}).old_format is True     # from a shepherd before "stopped"
    assert records.DeliveryRecord.from_dict({"ok": 1}).ok is False          # only a real true is success
    assert records.StatusRecord.from_dict({"job_pid": 1.5}).job_pid is None


def test_read_record_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert records.read_record(str(tmp_path / "fifo"), records.ExitRecord) is None   # no blocking open
    os.symlink("/etc/hostname", tmp_path / "link")
    assert records.read_record(str(tmp_path / "link"), records.ExitRecord) is None

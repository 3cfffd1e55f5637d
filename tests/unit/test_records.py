"""The job-directory records: the re-free JSON codec and the pidfile parser."""

import json
import os

import pytest

from shepherd import records


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
    assert isinstance(records.proc_starttime(me), int)
    assert records.proc_starttime(0x7FFFFFF0) is None
    (tmp_path / records.PIDFILE).write_text(f"{me} {records.proc_starttime(me)}\n")
    assert records.read_pidfile(str(tmp_path)) == (me, records.proc_starttime(me))
    (tmp_path / records.PIDFILE).write_text("garbage")
    assert records.read_pidfile(str(tmp_path)) is None

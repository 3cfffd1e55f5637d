"""hpc_batch/wire/plainjson.py: plain requests written as the codec writes them, anything else refused."""

import os
import subprocess
import sys

import pytest

from hpc_batch.wire import framing, messages, plainjson
from shepherd.base.jsoncodec import dumps_wire, loads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLAIN = [
    {}, [], "", 0, -1, 1 << 70, -(1 << 70), 0.5, -2e-300, 1e300, 3.0, True, False, None,
    {"a": 1, "b": [1, 2, {"c": None}], "d": {"e": [], "f": {}}},
    "".join(chr(i) for i in range(128)),                    # every ASCII character, the escaped ones too
    {"\t\"key\\\n": "\x00\x1f\x7f /"},
    ["x" * 10000, ("tuple", 1)],
    messages.request("new", argv=["python", "train.py", "--lr", "3e-4"], cwd="/home/a b/c",
                     base_env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cpus=2, mem=None, no_output=True,
                     job_env={"A": "1"}, umask=0o022),
]


@pytest.mark.parametrize("obj", PLAIN)
def test_plain_data_is_written_as_the_codec_writes_it(obj):
    assert plainjson.dumps(obj) == dumps_wire(obj)


@pytest.mark.parametrize("obj", [
    "é", "\udcff", {"k": "日本"}, {"é": 1}, {1: "x"}, {None: 1}, float("nan"), float("inf"), -float("inf"),
    {1.5}, b"bytes", object(), [[["deep", "é"]]], ["x"] * (plainjson.MAX_ITEMS + 1),
])
def test_anything_else_is_left_to_the_codec(obj):
    with pytest.raises(plainjson.Unplain):
        plainjson.dumps(obj)


@pytest.mark.parametrize("obj", [*PLAIN, {"env": {"X": "é\udcff"}}, {"argv": ["x"] * 10000}])
def test_a_request_frame_is_the_frame_either_way(obj):
    msg = {"v": 1, "op": "new", "args": {"payload": obj}}
    assert framing.encode_request(msg) == framing.encode(msg)
    decoder = framing.Decoder()
    decoder.feed(framing.encode_request(msg))
    assert decoder.next() == loads(dumps_wire(msg))


def test_a_plain_request_goes_out_before_the_codec_is_loaded():
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from hpc_batch.wire import framing, messages; "
            "frame = framing.encode_request(messages.request('new', argv=['true'], cwd='/tmp')); "
            "print('_json' in sys.modules, 'shepherd.base.jsoncodec' in sys.modules, frame[4:].decode())")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(" ", 2)[:2] == ["False", "False"]
    assert loads(r.stdout.split(" ", 2)[2]) == messages.request("new", argv=["true"], cwd="/tmp")


def _random_plain(rng, depth=0):
    kind = rng.randrange(8 if depth < 4 else 6)
    if kind == 0:
        return "".join(chr(rng.randrange(128)) for _ in range(rng.randrange(12)))
    if kind == 1:
        return rng.randrange(-(1 << 80), 1 << 80)
    if kind == 2:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-300, 300)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.randrange(-5, 5)
    if kind == 5:
        return ""
    if kind == 6:
        return [_random_plain(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {"".join(chr(rng.randrange(128)) for _ in range(rng.randrange(6))): _random_plain(rng, depth + 1)
            for _ in range(rng.randrange(5))}


def test_random_plain_data_is_written_as_the_codec_writes_it():
    import random
    rng = random.Random(53)
    for _ in range(2000):
        obj = _random_plain(rng)
        assert plainjson.dumps(obj) == dumps_wire(obj), obj

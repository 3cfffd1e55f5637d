"""Sans-io framing: frames split, joined, oversized and corrupt (h11-style tables)."""

import json
import struct

import pytest

from hpc_batch.wire import framing

HEADER = struct.Struct(">I")


def raw(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


MSG = {"v": 1, "op": "list", "args": {"all": False}}
FRAME = framing.encode(MSG)


@pytest.mark.parametrize("pieces", [
    [FRAME],                                        # whole
    [FRAME[:1], FRAME[1:]],                         # header split
    [FRAME[:4], FRAME[4:]],                         # header, then body
    [FRAME[:6], FRAME[6:10], FRAME[10:]],           # body split
    [bytes([b]) for b in FRAME],                    # a byte at a time
])
def test_split_frames_reassemble(pieces):
    dec = framing.Decoder()
    got = []
    for piece in pieces:
        dec.feed(piece)
        msg = dec.next()
        if msg is not None:
            got.append(msg)
    assert got == [MSG] and dec.pending == 0 and dec.expected == 0


def test_joined_frames_come_out_one_by_one():
    dec = framing.Decoder()
    other = {"v": 1, "op": "ping", "args": {}}
    dec.feed(FRAME + framing.encode(other) + FRAME[:5])
    assert dec.next() == MSG
    assert dec.next() == other
    assert dec.next() is None
    assert dec.pending == 5 and dec.expected == len(FRAME)


def test_expected_counts_the_frame_being_received():
    dec = framing.Decoder()
    dec.feed(b"\x00")
    assert dec.expected == 4
    dec.feed(FRAME[1:4])
    assert dec.expected == len(FRAME)


@pytest.mark.parametrize("data,needle", [
    (HEADER.pack(framing.MAX_FRAME + 1), "exceeds"),
    (raw(b"nope!"), "not JSON"),
    (raw(b"[]"), "not a JSON object"),
    (raw(b'"text"'), "not a JSON object"),
    (raw(b"\xff\xfe{}"), "not JSON"),
    (raw(b"[" * 100_000), "not JSON"),             # deep nesting: a RecursionError inside json
    (raw(b'{"a": 1} trailing'), "not JSON"),
])
def test_corrupt_and_oversized_frames(data, needle):
    dec = framing.Decoder()
    dec.feed(data)
    with pytest.raises(framing.FrameError, match=needle):
        dec.next()


def test_oversized_refused_from_the_header_alone():
    dec = framing.Decoder(max_frame=10)
    dec.feed(HEADER.pack(11))       # no body sent at all
    with pytest.raises(framing.FrameError):
        dec.next()


def test_encode_limit_and_surrogates():
    with pytest.raises(framing.FrameError):
        framing.encode({"x": "y" * 100}, limit=50)
    msg = {"data": "bytes \udcff kept"}
    dec = framing.Decoder()
    dec.feed(framing.encode(msg))
    assert dec.next() == msg
    assert json.loads(framing.encode(msg)[4:]) == msg

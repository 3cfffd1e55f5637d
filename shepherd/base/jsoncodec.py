"""JSON through the C scanner and encoder behind the json module.

Importing ``json`` pulls in ``re``, which would be most of a shepherd's
start-up and a good part of a ``dispatch new``; this needs only ``_json``.
Shared by the shepherd (records), the daemon and the client (the framing).
"""

import _json


class _Decoding:
    """The settings object the C scanner reads (the json module's defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not valid in a record")


# typeshed wants a make_scanner as the context, but the C scanner only reads the
# attributes _Decoding has (typeshed's own TODO says so); and a None *default*
# is what the C encoder takes for "no fallback", which typeshed does not allow.
_scan = _json.make_scanner(_Decoding())  # type: ignore[arg-type]
_encode = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ": ", ", ",  # type: ignore[arg-type]
                             True, False, False)
# The wire form (hpc_batch.wire.framing): compact, in insertion order. The client
# uses it too, so dispatch never imports json (and with it re).
_encode_wire = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ":", ",",  # type: ignore[arg-type]
                                  False, False, False)
# The canonical form a record's digest is taken of: compact, keys sorted.
_encode_canonical = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ":", ",",  # type: ignore[arg-type]
                                       True, False, False)
_SPACE = " \t\n\r"


def dumps(obj) -> str:
    """JSON text of *obj* (dicts, lists, str, int, float, bool, None)."""
    return "".join(_encode(obj, 0))


def dumps_wire(obj) -> str:
    """Compact JSON text of *obj*, keys in insertion order (a protocol frame's body)."""
    return "".join(_encode_wire(obj, 0))


def dumps_canonical(obj) -> str:
    """Compact JSON text of *obj* with keys sorted: the same object always gives the same text."""
    return "".join(_encode_canonical(obj, 0))


def loads(text: str):
    """Parse JSON text; raises ValueError on anything malformed or trailing."""
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration:
        raise ValueError("not JSON") from None
    if text[end:].strip():
        raise ValueError("trailing data after JSON")
    return obj


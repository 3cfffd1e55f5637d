"""A request's JSON written without the C codec, for plain data only, byte for byte as the codec writes it.

``_json`` is a shared library: loading it (with the ``shepherd`` packages
around ``jsoncodec``) is about half a millisecond of every ``dispatch``
call, before its request can go out. A request is nearly always plain data:
ASCII text, integers, finite floats, booleans, null, lists and text-keyed
dicts, not too many of them. :func:`dumps` writes those exactly as
``shepherd.base.jsoncodec.dumps_wire`` does (compact, keys in insertion
order, the same escapes) and raises :class:`Unplain` for anything else
(non-ASCII text, a big ``--commands`` or ``--env``), which the caller then
gives to the codec (``framing.encode_request``). The codec itself is loaded
while the daemon commits, to read its reply.
"""

import math  # (built into Debian's python3.11: no library to load)

TYPE_CHECKING = False   # typing is for the checker only: this is on the path of every dispatch
if TYPE_CHECKING:
    from collections.abc import Callable

MAX_ITEMS = 4096    # values written here at most: past that the C codec is the faster of the two

# What json's ASCII encoder writes for the characters it escapes (the rest of ASCII is itself).
_ESCAPES = {i: "\\u%04x" % i for i in (*range(0x20), 0x7f)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
                 ord("\b"): "\\b", ord("\f"): "\\f"})


class Unplain(ValueError):
    """*obj* holds something this module does not write: hand it to the codec."""


def dumps(obj: object) -> str:
    """Compact JSON text of plain *obj*, as ``dumps_wire`` gives it; raises :class:`Unplain` otherwise."""
    parts: list[str] = []
    _write(obj, parts.append, [MAX_ITEMS])
    return "".join(parts)


def _text(s: str) -> str:
    if not s.isascii():
        raise Unplain("non-ASCII text")
    return '"' + s.translate(_ESCAPES) + '"'


def _write(obj: object, out: "Callable[[str], None]", budget: "list[int]") -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise Unplain("too many values")
    if isinstance(obj, str):
        out(_text(obj))
    elif obj is None:
        out("null")
    elif obj is True:
        out("true")
    elif obj is False:
        out("false")
    elif isinstance(obj, int):
        out(int.__repr__(obj))
    elif isinstance(obj, float):
        if not math.isfinite(obj):
            raise Unplain("a float that is not finite")
        out(float.__repr__(obj))
    elif isinstance(obj, (list, tuple)):
        out("[")
        for i, item in enumerate(obj):
            if i:
                out(",")
            _write(item, out, budget)
        out("]")
    elif isinstance(obj, dict):
        out("{")
        for i, (key, value) in enumerate(obj.items()):
            if not isinstance(key, str):
                raise Unplain("a key that is not text")
            if i:
                out(",")
            out(_text(key))
            out(":")
            _write(value, out, budget)
        out("}")
    else:
        raise Unplain(f"a {type(obj).__name__}")

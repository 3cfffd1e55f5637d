"""Sans-io framing for the unix-socket protocol.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8
JSON holding one object. The size cap is checked from the header alone, so an
oversized frame is refused before its body is buffered. Nothing here touches a
socket: callers feed bytes in and take frames out (the h11 way), which keeps
the daemon's event loop and the client's blocking calls on one codec.
"""

from . import plainjson

# Annotations are strings and typing is imported for the checker only: this is on the
# path of every dispatch, where typing (and __future__, and struct) would cost start-up time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

HEADER_SIZE = 4           # the length, big-endian
MAX_FRAME = 4 << 20       # requests: a forwarded environment plus a long argv fits
MAX_REPLY = 256 << 20     # replies: a wait on a whole bulk fits (list answers in ~1 MiB pages)


class FrameError(Exception):
    """The peer sent bytes that are not a valid frame (corrupt or oversized)."""


_codec = None


def codec() -> "ModuleType":
    """The JSON codec (``shepherd.base.jsoncodec``), loaded on first use: a client loads it to read
    the reply, after its request has gone out (:func:`encode_request`); the daemon at start-up."""
    global _codec
    if _codec is None:
        from shepherd.base import jsoncodec
        _codec = jsoncodec
    return _codec


def _frame(text: str, limit: int) -> bytes:
    body = text.encode("ascii")
    if len(body) > limit:
        raise FrameError(f"message of {len(body)} bytes exceeds the {limit}-byte frame limit")
    return len(body).to_bytes(HEADER_SIZE, "big") + body


def encode(obj: "dict[str, Any]", limit: int = MAX_FRAME) -> bytes:
    """Serialise one message as a frame; lone surrogates survive (output bytes)."""
    return _frame(codec().dumps_wire(obj), limit)


def encode_request(obj: "dict[str, Any]", limit: int = MAX_FRAME) -> bytes:
    """:func:`encode` for a client's request: the same bytes, written without loading the codec
    when the request is plain data (``plainjson``), so it goes out sooner."""
    try:
        text = plainjson.dumps(obj)
    except plainjson.Unplain:
        text = codec().dumps_wire(obj)
    return _frame(text, limit)


class Decoder:
    """Accumulates received bytes and yields complete messages."""

    def __init__(self, max_frame: int = MAX_FRAME):
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> None:
        """Add bytes received from the peer."""
        self._buf += data

    @property
    def expected(self) -> int:
        """Bytes of the frame being received (header included), or 0 between frames."""
        if len(self._buf) < HEADER_SIZE:
            return HEADER_SIZE if self._buf else 0
        return HEADER_SIZE + int.from_bytes(self._buf[:HEADER_SIZE], "big")

    @property
    def pending(self) -> int:
        """Bytes buffered but not yet returned as a message (a truncated frame at EOF)."""
        return len(self._buf)

    def next(self) -> "dict[str, Any] | None":
        """Return the next complete message, or None if more bytes are needed."""
        if len(self._buf) < HEADER_SIZE:
            return None
        size = int.from_bytes(self._buf[:HEADER_SIZE], "big")
        if size > self._max:
            raise FrameError(f"frame of {size} bytes exceeds the {self._max}-byte limit")
        end = HEADER_SIZE + size
        if len(self._buf) < end:
            return None
        body = bytes(self._buf[HEADER_SIZE:end])
        del self._buf[:end]
        try:
            obj = codec().loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise FrameError(f"corrupt frame: not JSON ({exc.__class__.__name__})") from None
        if not isinstance(obj, dict):
            raise FrameError("corrupt frame: not a JSON object")
        return obj

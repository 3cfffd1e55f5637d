"""One client connection of the daemon: its socket, its frames in and out, its backpressure flags.

The server owns the connections and their I/O; what a held connection (an
attach, a wait, a watch) streams is kept by streams.py, keyed by the
connection, so neither reaches into the other's state.
"""

import socket
import time

from ..wire import framing
from . import access

HELD_REPLY_BYTES = 1 << 18   # replies one connection may have waiting for a commit (pipelined requests)


class Conn:
    """One client connection."""

    def __init__(self, sock: socket.socket, caller: access.Caller):
        self.sock = sock
        self.caller = caller
        self.decoder = framing.Decoder()
        self.out = bytearray()
        self.closing = False
        self.last = time.monotonic()          # last request bytes, or last reply bytes taken
        self.partial_since: float | None = None   # when the unfinished frame in decoder began
        self.stalled = False                      # its user is over --max-reply-bytes-per-user: not read
        self.unsent = False                       # a reply held until this turn's commit
        self.submitted: set[int] = set()          # the jobs its unsent replies acknowledge: void if refused
        self.deferred = False                     # its reply comes from the history archive's reader

    def may_take_request(self) -> bool:
        """Backpressure: no new request while a reply is unsent (or still to come from the archive),
        unless that reply only waits for this turn's commit (then pipelined requests share the
        commit, up to a bound)."""
        return not self.deferred and (not self.out or (self.unsent and len(self.out) < HELD_REPLY_BYTES))

    def open(self) -> bool:
        """False once the connection has been closed."""
        return self.sock.fileno() >= 0

"""The client's side of the socket: connect, send one request, read replies.

Blocking and minimal: it is on the path of every ``dispatch`` call.
"""

# _socket, not socket: socket.py imports enum, a few ms of every dispatch start-up.
import _socket

from .. import defaults
from ..wire import framing, messages
from .posixcalls import getenv


class Unreachable(Exception):
    """The daemon's socket cannot be reached; the message says which and why."""


class Connection:
    """One connection to hpc-batchd."""

    def __init__(self, path: str | None = None):
        self.path = path or getenv(defaults.SOCKET_ENV) or defaults.SOCKET
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self.sock.connect(self.path)
        except OSError as exc:
            self.sock.close()
            why = {2: "no such socket", 111: "connection refused", 13: "permission denied"}.get(
                exc.errno or 0, exc.strerror)  # 0: no errno, never a key
            raise Unreachable(
                f"cannot reach hpc-batchd at {self.path} ({why}): the service may not be running "
                f"(systemctl status hpc-batch), or set ${defaults.SOCKET_ENV} to its --socket") from None
        self.decoder = framing.Decoder(framing.MAX_REPLY)

    def send(self, op: str, **args) -> None:
        """Send one request."""
        self.sock.sendall(framing.encode_request(messages.request(op, **args)))

    def receive(self):
        """The next message, or None when the daemon closed the connection."""
        while True:
            msg = self.decoder.next()
            if msg is not None:
                return msg
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.decoder.feed(data)

    def call(self, op: str, meanwhile=None, **args) -> dict:
        """Send a request and return its single reply (raises Unreachable on EOF).

        *meanwhile*, if given, is called between the two: work the client has to do anyway (imports
        for printing the reply) overlaps the daemon's, whose reply waits for a commit's fsync.
        """
        try:
            self.send(op, **args)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered and hung up first (it is refusing us): read why below
        framing.codec()   # loaded while the daemon works on the request: the reply needs it
        if meanwhile is not None:
            meanwhile()
        msg = self.receive()
        if msg is None:
            raise Unreachable(f"hpc-batchd at {self.path} closed the connection without answering "
                              f"(it may be restarting); try again")
        return msg

    def close(self) -> None:
        self.sock.close()

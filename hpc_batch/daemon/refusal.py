"""``Refused``: the one way a handler, the server or a stream turns a request down.

Its own room so that refusing needs no import of the engine (handlers.py,
server.py and streams.py raise and catch it; the engine's satellites too).
"""


class Refused(Exception):
    """A request the daemon will not carry out; the message goes to the user."""

    def __init__(self, message: str, code: str = "refused"):
        super().__init__(message)
        self.code = code

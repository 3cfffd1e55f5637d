"""What the engine tells the loop: shepherd pidfds to watch, and job events.

Built before the engine and the server, so each is built whole: the engine
is given these hooks, the server shares their selector and listens to their
job events, and neither holds a reference to the other for them.
"""

import selectors
from collections.abc import Callable


class Hooks:
    """The loop's selector, the pidfds registered on it, and who hears of job events."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.pidfds: dict[int, int] = {}      # pidfd -> job id
        self.listeners: list[Callable[[int, str], None]] = []

    def watch_pidfd(self, fd: int, job_id: int) -> None:
        """Wake the loop when *job_id*'s shepherd exits (its pidfd becomes readable)."""
        self.pidfds[fd] = job_id
        self.sel.register(fd, selectors.EVENT_READ, ("pidfd", fd))

    def unwatch_pidfd(self, fd: int) -> None:
        """Stop watching *fd* (before it is closed)."""
        if self.pidfds.pop(fd, None) is not None:
            self.sel.unregister(fd)

    def job_event(self, job_id: int, kind: str) -> None:
        """A job was submitted, started or finished: tell each listener, in the order they came."""
        for listener in self.listeners:
            listener(job_id, kind)

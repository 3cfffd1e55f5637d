"""Log lines a user can provoke, at most once per interval per kind.

A client that sends garbage in a loop, or a flood of connections, must not
turn into megabytes of log: the first line of a kind is written, repeats
within the interval are counted, and the next line says how many were
suppressed.
"""

import logging
import time


class RateLimited:
    """Wraps a logger; ``warning(key, msg, *args)`` etc. write at most once per *interval* per key."""

    def __init__(self, log: logging.Logger, interval: float = 10.0, clock=time.monotonic):
        self.log = log
        self.interval = interval
        self.clock = clock
        self._last: dict = {}
        self._suppressed: dict = {}

    def _emit(self, level: int, key: str, msg: str, args, exc_info=False) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._suppressed.pop(key, 0)
        if dropped:
            msg += f" ({dropped} similar message{'s' if dropped > 1 else ''} suppressed)"
        self.log.log(level, msg, *args, exc_info=exc_info)
        if len(self._last) > 4096:   # keys are few; never let them grow without end
            self._last.clear()
        return True

    def warning(self, key: str, msg: str, *args) -> bool:
        """A rate-limited warning; True if it was written."""
        return self._emit(logging.WARNING, key, msg, args)

    def error(self, key: str, msg: str, *args) -> bool:
        """A rate-limited error; True if it was written."""
        return self._emit(logging.ERROR, key, msg, args)

    def exception(self, key: str, msg: str, *args) -> bool:
        """A rate-limited error with the current traceback; True if it was written."""
        return self._emit(logging.ERROR, key, msg, args, exc_info=True)

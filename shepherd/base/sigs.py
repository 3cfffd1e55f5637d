"""The shepherd's signal calls, with plain ints: ``signal``'s own functions without its enum layer.

``signal.signal`` and ``signal.pthread_sigmask`` wrap the C functions of
``_signal`` and turn every signal number and handler they are given or
return into an enum member. Every object that conversion touches is a page
a freshly forked process copies: for the dozen calls of a job's start, a
shepherd forked from the fork server spent about 250 us and 75 page faults
on it (docs/performance.md, "A ninth look"). These are the C functions
themselves; they take the enum members too (as ints), and give back ints.
Standard library only.
"""

try:
    import _signal as _c  # CPython's implementation module, which ``signal`` re-exports and wraps
except ImportError:   # another implementation: the wrapped functions do the same, only slower
    import signal as _c  # type: ignore[no-redef]

SIG_DFL = _c.SIG_DFL
SIG_IGN = _c.SIG_IGN
SIG_BLOCK = _c.SIG_BLOCK
SIG_UNBLOCK = _c.SIG_UNBLOCK
SIG_SETMASK = _c.SIG_SETMASK

signal = _c.signal                      # (signum, handler) -> the previous handler
pthread_sigmask = _c.pthread_sigmask    # (how, signals) -> the previous mask, a set of ints
set_wakeup_fd = _c.set_wakeup_fd        # (already unwrapped in ``signal``)

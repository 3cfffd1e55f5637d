"""``dispatch status`` on a terminal: which view to print, and ``--watch``'s full-screen redraw.

The side effects of the status view live here (is this a terminal, its size,
its modes, the keys typed); what is drawn is ``statusview``'s, and the plain
format of a piped ``dispatch status`` is ``listing.format_status``'s.

``--watch`` works like watch(1) and top: the alternate screen, so the shell's
scrollback comes back as it was; keys read one at a time without echo; a
redraw every interval, at once on a key or a resize. ``q`` and Ctrl-C leave
with status 0, SIGTERM and SIGHUP too, and every way out restores the
terminal's modes and screen. A daemon that is away (a reload) is said on the
screen and asked again next time, as top keeps going.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from ..defaults import STATUS_INTERVAL
from . import statusview

# The alternate screen with the cursor hidden, and back (xterm's private modes 1049 and 25).
ENTER = "\x1b[?1049h\x1b[?25l"
LEAVE = "\x1b[?25h\x1b[?1049l"
QUIT_KEYS = b"qQ"


def colour_wanted(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set and not empty (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def _unicode(stream: TextIO) -> bool:
    return (getattr(stream, "encoding", "") or "").lower().replace("-", "") == "utf8"


def _size(stream: TextIO) -> tuple[int, int]:
    """(columns, rows) of the terminal *stream* is on; 100 x 40 when it is not one (--map into a pipe)
    or says nothing."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):
        return 100, 40
    return size.columns or 100, size.lines or 40   # a pty nobody sized says 0 x 0


def show(st: dict[str, Any], want_map: bool) -> None:
    """Print a status reply: the readable view with its map on a terminal (or with --map), else the
    plain lines scripts read, unchanged."""
    out = sys.stdout
    if want_map or out.isatty():
        width, _ = _size(out)
        for line in statusview.render(st, width, colour_wanted(out), _unicode(out)):
            print(line)
        return
    from .listing import format_status
    for line in format_status(st):
        print(line)


def check_watch(interval: str | None) -> float:
    """The seconds between redraws, once ``--watch`` can run here; ValueError with the line to show if not."""
    seconds = statusview.parse_interval(interval or STATUS_INTERVAL)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ValueError("--watch needs a terminal on stdin and stdout (it reads q to quit); "
                         "piped, run dispatch status --map instead")
    return seconds


def watch(conn, seconds: float) -> int:
    """Redraw the status view every *seconds* until q, Ctrl-C, SIGTERM or SIGHUP; returns 0."""
    import select
    import signal
    import termios
    import time
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP)}
    old_wakeup = signal.set_wakeup_fd(wake_w)

    def leave(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGWINCH, lambda signum, frame: None)   # only to wake the select (wakeup fd)
    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGHUP, leave)
    try:
        tty.setcbreak(fd, termios.TCSANOW)
        _write(ENTER)
        while True:
            _draw(_fetch(conn), seconds, time.strftime("%H:%M:%S"))
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([fd, wake_r], [], [], left)
                if wake_r in ready:
                    _drain(wake_r)
                    break                 # a resize: draw again at the new size
                if fd in ready:
                    keys = os.read(fd, 64)
                    if not keys or any(k in QUIT_KEYS for k in keys):
                        return 0
                    break                 # any other key: draw again now
    except KeyboardInterrupt:
        return 0
    finally:
        # A terminal already gone (SIGHUP) cannot be restored; the rest is still undone.
        try:
            _write(LEAVE)
        except OSError:
            pass
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        except (OSError, termios.error):
            pass
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.close(wake_r)
        os.close(wake_w)


def _fetch(conn) -> dict[str, Any] | str:
    """The status reply's result, or the one line that says why there is none this time."""
    from .connection import Unreachable
    try:
        c = conn()
    except Unreachable as exc:
        return f"{exc}; asking again"
    try:
        reply = c.call("status")
    except Unreachable as exc:
        return f"{exc}; asking again"
    finally:
        c.close()
    if not reply.get("ok"):
        return f"status refused: {reply.get('error') or 'no reason given'}"
    result: dict[str, Any] = reply["result"]
    return result


def _draw(st: dict[str, Any] | str, seconds: float, clock: str) -> None:
    width, rows = _size(sys.stdout)
    colour, uni = colour_wanted(sys.stdout), _unicode(sys.stdout)
    title = f"dispatch status --watch: every {seconds:g}s; q quits"
    title_line: statusview.Line = [(title, "head"), (clock.rjust(max(width - len(title), 0)), None)]
    body: list[statusview.Line] = statusview.view(st, width) if isinstance(st, dict) else [[(st, "busy")]]
    lines = [title_line, *statusview.frame(body, rows)]
    text = "\x1b[K\r\n".join(statusview.paint(statusview.cut(line, width, uni), colour) for line in lines)
    _write("\x1b[H" + text + "\x1b[K\x1b[J")   # home, each line's rest cleared, then below the last


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass

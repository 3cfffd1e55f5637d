"""dispatch log and dispatch attach: a job's output, so far or as it comes.

``log`` asks for the output so far a page at a time (the ``log`` request,
each reply at most ``protocol.LOG_PAGE_BYTES``); ``log --follow`` and
``attach`` read the daemon's ``attach`` stream, which sends the output, then
what comes, then the job's end. The job's output goes to stdout and
anything about the job to stderr, one line, so ``dispatch log 7 > out``
keeps only the output.

A finished job's output is no longer the daemon's once it was delivered:
``attach`` then reads what it had not yet shown from the delivered log
itself, as the user running dispatch, and only from a regular file that
user owns (never through a link, never blocking on a FIFO).
"""

import os
import stat
import sys

from .cli import EX_UNAVAILABLE, Out, _connect, _end_line

CHUNK = 1 << 16   # bytes copied at a time from a delivered log


# -- what is said on stderr (pure) -----------------------------------------------------
def where_output(end: dict) -> str:
    """Where a finished job's output is, from its ``end`` fields."""
    if end.get("exit") in ("cancelled", "dependency-failed"):
        return "it never ran, so it has no output"
    if end.get("output_error"):
        return f"its output was not delivered: {end['output_error']}"
    if end.get("output"):
        return f"its output is in {end['output']}"
    return "its output was discarded (--no-output)"


def page_note(page: dict) -> str | None:
    """The stderr line after ``dispatch log`` printed its pages (the last one's fields), or None.

    A running job whose output is all in the buffer needs none; one past the buffer's bound says
    where the rest goes; a job that has not started says so; a finished one says how it ended
    and where its output is.
    """
    from shepherd.base.sizes import format_size
    job = page.get("id")
    state = page.get("state")
    end = page.get("end")
    if end:
        return f"{_end_line(end)}; {where_output(end)}"
    if state in ("queued", "waiting"):
        return f"job {job} is {state}: it has no output yet (dispatch log -f {job} waits for it)"
    limit = page.get("buffer_max")
    if state == "running" and limit and page.get("size", 0) >= limit:
        rest = (f"goes straight to {page['output']}" if page.get("output")
                else "is discarded (--no-output)")
        return f"job {job}: the daemon keeps only the first {format_size(limit)} of its output; the rest {rest}"
    return None


# -- dispatch log ----------------------------------------------------------------------
def cmd_log(conn, a) -> int:
    """``dispatch log [-f] JOB``."""
    from .cli import job_ref
    ref = job_ref(a["<job>"])
    if a["--follow"]:
        end = follow(conn, ref, read_delivered=False, verb="log -f")
        return end if isinstance(end, int) else int(end.get("wait_status") or 0)
    out = sys.stdout.buffer
    c = conn()
    try:
        args: dict = {"id": ref, "offset": 0}
        while True:
            reply = c.call("log", **args)
            if not reply.get("ok"):
                return Out(False).refused(reply, "log failed")
            page = reply["result"]
            out.write(page["data"].encode("utf-8", "surrogateescape"))
            if page.get("more") is None:
                break
            # By id from here: a name could come to mean a newer job while we page.
            args = {"id": page["id"], "offset": page["more"], "until": page["until"]}
    finally:
        c.close()
    out.flush()
    note = page_note(page)
    if note:
        print(note, file=sys.stderr)
    return 0


# -- the attach stream, for attach and log --follow ---------------------------------------------
def follow(conn, ref, read_delivered: bool, verb: str = "attach"):
    """Stream a job's output to stdout until it ends; returns the ``end`` event, or the exit status
    of a failure already reported. Reconnects across a daemon reload or restart, resuming at the
    offset it had. The part of a delivered log not yet shown is printed from the log itself: always
    with *read_delivered* (attach), else only for a job followed while it ran (log -f; one that had
    ended when asked is told by its log's path, as ``dispatch log`` tells it)."""
    import time

    from .connection import Unreachable
    offset, out = 0, sys.stdout.buffer
    deadline = None
    while True:
        try:
            c = _connect(conn, deadline)
        except Unreachable as exc:
            return Out(False).fail(f"{exc}" if deadline is None else
                                   f"hpc-batchd restarted and is not back; job {ref} may still be running: "
                                   f"run dispatch {verb} {ref} again later", EX_UNAVAILABLE)
        c.send("attach", id=ref, offset=offset)
        ended_before = True   # the job had ended when the daemon answered: nothing was seen live
        while True:
            msg = c.receive()
            if msg is None:
                break
            if not msg.get("ok"):
                c.close()
                return Out(False).refused(msg, "attach failed")
            ev = msg.get("event")
            if ev == "attached":
                ended_before = msg.get("state") == "finished"
                ref = msg.get("id", ref)   # by id from here, across a reconnect too
                if msg.get("state") in ("queued", "waiting") and offset == 0:
                    print(f"job {ref} is {msg['state']}; waiting for it to start", file=sys.stderr)
            elif ev == "output":
                data = msg["data"].encode("utf-8", "surrogateescape")
                out.write(data)
                out.flush()
                offset = msg.get("offset", offset + len(data))
            elif ev == "end":
                c.close()
                shown = 0
                # Followed live, the buffer may have been delivered and gone before the daemon
                # could open it (a job that ends at once): the rest is in the log.
                if ((read_delivered or not ended_before) and msg.get("state") == "finished"
                        and msg.get("output") and not msg.get("output_error")):
                    shown = print_delivered(msg["output"], offset, out)
                out.flush()
                line = _end_line(msg)
                if (ended_before or shown) and msg.get("state") == "finished":
                    line += f"; {where_output(msg)}"
                print(line, file=sys.stderr)
                return msg
        c.close()
        # The daemon went away mid-stream (reload or restart): reconnect and resume.
        print(f"dispatch: hpc-batchd restarted; reconnecting to job {ref}", file=sys.stderr)
        deadline = time.monotonic() + 30


def print_delivered(path: str, offset: int, out) -> int:
    """Copy the delivered log at *path* from *offset* to *out*; returns the bytes copied.

    Read as the user running dispatch, and only a regular file of theirs (an admin following
    another user's job is told the path instead): no link is followed, and a FIFO planted there
    cannot block us. Copies what the file held when opened, no more.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return 0
    copied = 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return 0
        while offset + copied < info.st_size:
            data = os.pread(fd, min(CHUNK, info.st_size - offset - copied), offset + copied)
            if not data:
                break
            out.write(data)
            copied += len(data)
    except OSError:
        pass
    finally:
        os.close(fd)
    return copied

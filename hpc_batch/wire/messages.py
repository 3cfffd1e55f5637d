"""The message envelope: what every request and reply looks like on the wire.

Kept apart from ``protocol`` (the validated payload types the daemon uses) so
the client, which runs on every submit, imports only this and ``framing``.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:   # the client imports this on every submit; typing would cost it several ms
    from typing import Any

VERSION = 1

# Why a request was refused: the fixed set of codes an error reply carries,
# each with the exit status dispatch gives it, so a script can branch on why.
REFUSALS = {
    "refused": 1,       # anything else the daemon will not do (the message says what)
    "not_found": 3,     # no such job (id or name)
    "forbidden": 4,     # not yours, or admins only
    "bad_request": 5,   # invalid request: a field out of bounds, a corrupt frame
    "never_fits": 6,    # the request can never fit on this machine
    "queue_full": 7,    # --max-queued-per-user
    "too_large": 8,     # --max-job-size
    "busy": 9,          # the daemon cannot take it now (connections, full disk): try again
    "finished": 10,     # the job has already ended
    "internal": 70,     # a bug in hpc-batchd (EX_SOFTWARE)
}

# dispatch's own failures, which never reach the daemon: with REFUSALS (and 0, success), every
# status dispatch exits with for a request; docs and usage texts are checked against both.
CLIENT_FAILURES = {
    "usage": 2,         # a bad command line (docopt's, EX_USAGE)
    "no_input": 66,     # record diff: a record cannot be had (a missing file, not a record) (EX_NOINPUT)
    "unreachable": 69,  # the daemon cannot be reached (EX_UNAVAILABLE)
}


def request(op: str, **args: "Any") -> "dict[str, Any]":
    """Build a request message."""
    return {"v": VERSION, "op": op, "args": args}


def ok(**result: "Any") -> "dict[str, Any]":
    """Build a success reply."""
    return {"v": VERSION, "ok": True, "result": result}


def error(message: str, code: str = "refused") -> "dict[str, Any]":
    """Build an error reply; *message* is shown to the user as is, *code* is one of REFUSALS."""
    return {"v": VERSION, "ok": False, "error": message, "code": code}


def event(kind: str, **data: "Any") -> "dict[str, Any]":
    """Build one frame of a streamed reply (attach)."""
    return {"v": VERSION, "ok": True, "event": kind, **data}

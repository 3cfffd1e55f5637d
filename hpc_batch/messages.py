"""The message envelope: what every request and reply looks like on the wire.

Kept apart from ``protocol`` (the validated payload types the daemon uses) so
the client, which runs on every submit, imports only this and ``framing``.
"""

from typing import Any

VERSION = 1


def request(op: str, **args: Any) -> dict[str, Any]:
    """Build a request message."""
    return {"v": VERSION, "op": op, "args": args}


def ok(**result: Any) -> dict[str, Any]:
    """Build a success reply."""
    return {"v": VERSION, "ok": True, "result": result}


def error(message: str, code: str = "error") -> dict[str, Any]:
    """Build an error reply; *message* is shown to the user as is."""
    return {"v": VERSION, "ok": False, "error": message, "code": code}


def event(kind: str, **data: Any) -> dict[str, Any]:
    """Build one frame of a streamed reply (attach)."""
    return {"v": VERSION, "ok": True, "event": kind, **data}

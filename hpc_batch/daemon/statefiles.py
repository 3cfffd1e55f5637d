"""Small file helpers every part of the state directory (store.py and its rooms) shares."""

import json
import os

from ..core.cputopo import format_cpulist


def dump(obj) -> bytes:
    """The readable JSON form of the state directory's own files (daemon.json, shared/, env/)."""
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def read_json(path: str, check=None) -> dict | None:
    """A file's JSON object; None when it cannot be read, is not one, or *check*(its bytes) fails."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if check is not None and not check(raw):
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def unlink(path: str) -> None:
    """Remove *path*; one already gone is no error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass



def ranges(ids) -> str:
    """``1-3, 7`` for [1, 2, 3, 7]: a log line names every job, compactly."""
    return format_cpulist(ids, ", ")

"""What ``dispatch`` asks of the system on every submit, from ``posix`` rather than ``os``.

Importing ``os`` (with ``_collections_abc``, ``posixpath`` and ``genericpath``)
takes about a millisecond of a ``dispatch new`` that takes eleven or twelve
(bench row 1), and a submit needs only a handful of its calls: its
directory, a few environment variables, its umask, the output directory's
checks. ``posix`` is the C module ``os`` wraps, already loaded by the
interpreter, so these are the same calls. The environment is decoded as
``os.environ`` decodes it. What only some commands need (``--output``'s
``~``, a listing's terminal size) imports ``os`` where it is used.
"""

import posix
import stat
import sys

# The calls themselves, as os has them (os re-exports these very functions).
access = posix.access
getcwd = posix.getcwd
geteuid = posix.geteuid
getuid = posix.getuid
lstat = posix.lstat
umask = posix.umask
W_OK = posix.W_OK
X_OK = posix.X_OK
exit_now = posix._exit
stat_of = posix.stat

_ENCODING = sys.getfilesystemencoding()


def _decode(value: bytes) -> str:
    return value.decode(_ENCODING, "surrogateescape")


def getenv(name: str) -> str | None:
    """The environment variable *name* as ``os.environ.get`` gives it, or None."""
    value = posix.environ.get(name.encode(_ENCODING, "surrogateescape"))
    return None if value is None else _decode(value)


def environ() -> dict[str, str]:
    """The whole environment, as ``dict(os.environ)`` gives it."""
    return {_decode(k): _decode(v) for k, v in posix.environ.items()}


def dirname(path: str) -> str:
    """``os.path.dirname`` of a text path: everything before its last ``/``, less trailing ones."""
    head = path[:path.rfind("/") + 1]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head


def is_dir(path: str) -> bool:
    """``os.path.isdir``: whether *path* names a directory (through links); False when it cannot be read."""
    try:
        return stat.S_ISDIR(posix.stat(path).st_mode)
    except (OSError, ValueError):
        return False

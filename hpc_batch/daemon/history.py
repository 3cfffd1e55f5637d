"""The accounting history: one JSON line per finished job, kept per user, for an admin's tools.

Each user's lines go to ``<state-dir>/history/<user>.jsonl`` (the directory
root-only, 0700; the files 0600). A user's files are bounded by
``--history-per-user`` bytes in all: the current file and ``GENERATIONS``
older ones (``<user>.jsonl.1`` the newest of them, ``.3`` the oldest), each
at most a quarter of the share. When the current file would pass its
quarter the generations move down one and the oldest is dropped, so a
user who ends many jobs only ever pushes out their own oldest lines, never
another user's. A line's ``command`` is cut to ``cut.COMMAND_CUT`` characters (``command_len``
is its full length), so even the largest jobs leave thousands of lines per
user.

A user name outside ``[A-Za-z0-9._-]`` (or starting with a dot) is filed
as ``uid=<uid>.jsonl``, which no real name can collide with.

The shared ``history.jsonl`` (and ``.1``) of earlier versions is neither
written nor removed: it stays as it was, for the admin to keep or delete.

It is a record for people and tools, not the daemon's state: a line lost in a
crash is not re-written, and a full disk skips the line with a log message.

The line itself is ``core.views.history_line`` (its fields are stable and
documented in README.md, "Accounting").
"""

import json
import logging
import os
import re
import stat

from ..core import views
from ..core.jobs import Job

log = logging.getLogger("hpc-batchd")
GENERATIONS = 3          # older files kept per user, besides the current one
DIRNAME = "history"
LEGACY = "history.jsonl"  # the one shared file of earlier versions: left alone
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def file_name(user: str, uid: int) -> str:
    """The name of a user's current history file (in the history directory)."""
    return f"{user}.jsonl" if _PLAIN.fullmatch(user) else f"uid={uid}.jsonl"


class History:
    """Appends finished jobs to their user's history file, rotating it by size."""

    def __init__(self, root: str, per_user: int):
        self.dir = os.path.join(root, DIRNAME)
        self.per_file = max(per_user // (GENERATIONS + 1), 1)
        self.ready = False           # the directory checked (made at the first record, retried after a failure)
        if os.path.lexists(os.path.join(root, LEGACY)):
            log.info("history: the shared %s of an earlier version is left as it was; lines now go to %s/<user>.jsonl",
                     os.path.join(root, LEGACY), self.dir)

    def _setup(self) -> None:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        st = os.lstat(self.dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"{self.dir} is not a directory of the daemon's own")
        os.chmod(self.dir, 0o700)
        self.ready = True

    def record(self, job: Job) -> None:
        """Append *job*'s line to its user's file; never raises (accounting must not stop the daemon)."""
        data = (json.dumps(views.history_line(job), sort_keys=True) + "\n").encode()
        path = os.path.join(self.dir, file_name(job.user, job.uid))
        try:
            if not self.ready:
                self._setup()
            fd = self._open(path)
            try:
                size = os.fstat(fd).st_size
                if size and size + len(data) > self.per_file:
                    os.close(fd)
                    fd = -1
                    self._rotate(path)
                    fd = self._open(path)
                os.write(fd, data)
            finally:
                if fd >= 0:
                    os.close(fd)
        except OSError as exc:
            self.ready = False
            log.error("cannot append job %d to %s (%s)", job.id, path, exc)

    @staticmethod
    def _open(path: str) -> int:
        # The directory is root-only, but check anyway: append only to a plain file of our own.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            os.close(fd)
            raise OSError(f"{path} is not a plain file of the daemon's own; not appending to it")
        return fd

    @staticmethod
    def _rotate(path: str) -> None:
        """``.2`` -> ``.3`` (the old ``.3`` goes), ``.1`` -> ``.2``, current -> ``.1``."""
        for n in range(GENERATIONS, 0, -1):
            older = f"{path}.{n - 1}" if n > 1 else path
            try:
                os.replace(older, f"{path}.{n}")
            except FileNotFoundError:
                pass
